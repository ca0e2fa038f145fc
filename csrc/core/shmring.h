/* shmring.h: a ring of shared-memory batch slots for process workers (no
 * Python).
 *
 * One anonymous shared file (memfd_create; where that is refused, a file in
 * /dev/shm or $TMPDIR unlinked at once) holds `nslots` slots of `slot_bytes`
 * each, mapped MAP_SHARED in the loader's process (the owner, which creates
 * it) and in every worker process (which attaches to the same file by its
 * descriptor: inherited across fork, passed over a pipe otherwise).  The file
 * has no name, so nothing outlives the last process that maps it: a crash or
 * a SIGKILL of any of them leaks no shared memory.
 *
 * The file is sparse: a slot's pages exist only once written, so slot_bytes
 * is a reservation (address space), not memory; the memory used is the bytes
 * the batches actually wrote, at most once per slot.
 *
 * Who does what.  The owner hands a free slot to each job
 * (fl_shmring_acquire), the worker lays the batch's arrays out in it with
 * the slot's bump allocator (fl_shmring_arena_*), and only a small
 * descriptor (slot, offsets, shapes) goes back over the pipe; the owner then
 * exports views of the slot, each holding a slot reference, and the slot is
 * free again when the job's reference and every view are gone.  Slot
 * references are the owner's alone (a worker's ring keeps none): a slot is
 * written only by the one worker its job went to, and read only after that
 * worker said it is done, so the memory itself needs no lock.
 *
 * Lifetime: the ring is reference counted (the creator's reference, plus one
 * per view handed out), so views may outlive the loader.  Freeing the last
 * reference unmaps the file and closes it; page-locked ranges are
 * unregistered first, which may block on the device, so the last unref only
 * says so and the caller runs fl_shmring_destroy where blocking is allowed.
 *
 * Threads: every function may be called from any thread, without the GIL;
 * the slot table and the counters are guarded by the ring's mutex.  The
 * arena functions are meant for one thread of a worker process at a time
 * (they share the mutex, so concurrent use is safe but interleaves
 * allocations).
 */
#ifndef FL_SHMRING_H
#define FL_SHMRING_H

#include <stddef.h>

#include "core/err.h"
#include "core/pin.h"

typedef struct fl_shmring fl_shmring;

#define FL_SHMRING_ALIGN 64 /* every arena allocation starts on this boundary */
#define FL_SHMRING_MAX_SLOTS 4096

/* Create a ring of nslots (1..FL_SHMRING_MAX_SLOTS) slots of slot_bytes
 * (> 0, rounded up to a multiple of the page size) and map it.  The caller
 * owns the returned reference and the slot accounting.  NULL on failure,
 * with err filled (FL_ERR_IO with errno for the file and the mapping,
 * FL_ERR_NOMEM, FL_ERR_INVALID for bad sizes). */
fl_shmring *fl_shmring_create(int nslots, size_t slot_bytes, fl_err *err);

/* Map the ring behind descriptor `fd` (a worker's side).  The ring takes
 * ownership of fd on success (closed when the ring is freed); on failure fd
 * is left open for the caller.  nslots and slot_bytes must be what the
 * creator used: the file must be at least that large.  NULL with err. */
fl_shmring *fl_shmring_attach(int fd, int nslots, size_t slot_bytes, fl_err *err);

int fl_shmring_fd(const fl_shmring *r);
int fl_shmring_nslots(const fl_shmring *r);
size_t fl_shmring_slot_bytes(const fl_shmring *r);
int fl_shmring_is_owner(const fl_shmring *r);

/* First byte of slot `slot` in this process's mapping (slot in range). */
char *fl_shmring_slot_base(const fl_shmring *r, int slot);

/* The slot `p` (an address inside this process's mapping) lies in, or -1. */
int fl_shmring_slot_of(const fl_shmring *r, const void *p);

/* ---- slots (the owner's side) ------------------------------------------- */

/* A free slot, now holding one reference (the job's), or -1 when every slot
 * is in use (or the ring is not the owner). */
int fl_shmring_acquire(fl_shmring *r);

/* One more / one less reference to `slot`; at zero the slot is free again.
 * No-ops on a worker's ring and for slots out of range. */
void fl_shmring_slot_ref(fl_shmring *r, int slot);
void fl_shmring_slot_unref(fl_shmring *r, int slot);

/* Slots in use (referenced), and the most ever in use at once. */
int fl_shmring_slots_in_use(fl_shmring *r);
int fl_shmring_slots_peak(fl_shmring *r);

/* ---- the arena: laying one batch out in a slot (the worker's side) ------- */

/* Start filling `slot` from its first byte. */
void fl_shmring_arena_begin(fl_shmring *r, int slot);

/* nbytes of the current slot, FL_SHMRING_ALIGN-aligned; *offset (may be
 * NULL) gets its offset in the slot.  NULL when it does not fit (the slot
 * keeps what was allocated so far) or no slot was begun. */
void *fl_shmring_arena_alloc(fl_shmring *r, size_t nbytes, size_t *offset);

/* Bytes of the current slot allocated so far (including alignment). */
size_t fl_shmring_arena_used(fl_shmring *r);

/* ---- page-locking (the owner's side, pin_memory) ------------------------- */

/* Page-lock the first nbytes (rounded up to pages) of `slot` for device
 * `device` with pinner->lock (core/pin.h: the CUDA layer's cudaHostRegister,
 * borrowed: it must outlive the ring, and every slot of a ring uses the same
 * one; fl_shmring_destroy unlocks through it), once: a slot already locked over at least
 * nbytes is left alone; a shorter lock is not extended (returns 0, so a
 * batch larger than the first ones is simply not page-locked past the lock).
 * The pages are created by the registration.  Blocks on the driver: no
 * locks held.  0, or -1 with err filled (the pinner's error). */
int fl_shmring_pin(fl_shmring *r, int slot, size_t nbytes, int device, const fl_pinner *pinner, fl_err *err);

/* Bytes of `slot` page-locked (0: none). */
size_t fl_shmring_pinned_bytes(fl_shmring *r, int slot);

/* ---- references ------------------------------------------------------------ */

void fl_shmring_ref(fl_shmring *r);

/* Drop a reference.  Returns 1 when it was the last one: the caller must
 * then call fl_shmring_destroy(r) (which may block on the device when
 * ranges are page-locked); 0 otherwise.  NULL is ignored (returns 0). */
int fl_shmring_unref(fl_shmring *r);

/* Unregister page-locked ranges, unmap, close the file, free the ring. */
void fl_shmring_destroy(fl_shmring *r);

#endif
