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
 * Who does what.  A worker takes the lowest free slot when its batch's
 * first array is laid out (fl_shmring_arena_claim, then the slot's bump
 * allocator fl_shmring_arena_alloc), not when the job is sent: a slot is held
 * from collation to the training loop's last view, as torch's per-batch
 * shared memory is, and not while the job waits in a queue or runs the
 * dataset's __getitem__, so the slots ever written (the ring's resident
 * memory: a written page stays until the ring goes) are the most batches
 * alive at once, not the whole prefetch window.  Only a small descriptor
 * (slot, offsets, shapes) goes back over the pipe; the owner adopts the
 * slot (fl_shmring_adopt), exports views of it, each holding a slot
 * reference, and the slot is free again when the job's reference and every
 * view are gone.  (The owner may also take a slot itself,
 * fl_shmring_acquire, and name it to the worker: fl_shmring_arena_begin.)
 *
 * Which process holds a slot is in a claim table of atomic ints at the
 * start of the file, shared by every process that maps it (one page for up
 * to 1024 slots): free, taken by worker w, or the owner's.  Workers only
 * take free slots; only the owner frees them (its last reference, or
 * fl_shmring_reclaim for the slots of a worker that died before handing
 * them over), and only in the process that created the ring: a child forked
 * from it inherits the ring but never frees, adopts or acquires a slot.  Slot references are the owner's alone (a worker's ring
 * keeps none): a slot is written only by the worker that took it, and read
 * only after that worker said it is done, so the memory itself needs no
 * lock.
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

/* The owner takes over `slot`, which worker `worker` took and filled (its
 * result names it): the slot now holds one reference (the job's).  0, or -1
 * when the claim table does not say the worker holds it (a protocol error:
 * the caller must not read the slot). */
int fl_shmring_adopt(fl_shmring *r, int slot, int worker);

/* Free every slot worker `worker` took and the owner never adopted (the
 * worker died, or will never report them).  Returns how many.  Owner only
 * (0 otherwise). */
int fl_shmring_reclaim(fl_shmring *r, int worker);

/* The claim table's entry for `slot`: 0 free, -1 the owner's, w + 1 worker
 * w's (for tests and diagnostics; another process may change it at once). */
int fl_shmring_claim_of(const fl_shmring *r, int slot);

/* One more / one less reference to `slot`; at zero the slot is free again.
 * No-ops on a worker's ring and for slots out of range. */
void fl_shmring_slot_ref(fl_shmring *r, int slot);
void fl_shmring_slot_unref(fl_shmring *r, int slot);

/* Slots in use (referenced), and the most ever in use at once. */
int fl_shmring_slots_in_use(fl_shmring *r);
int fl_shmring_slots_peak(fl_shmring *r);

/* ---- the arena: laying one batch out in a slot (the worker's side) ------- */

/* Start filling `slot` (one the owner acquired for this job) from its first
 * byte. */
void fl_shmring_arena_begin(fl_shmring *r, int slot);

/* Start a batch for worker `worker` (>= 0) without a slot yet: the first
 * fl_shmring_arena_alloc takes the lowest free slot in the claim table for
 * it (none free: that and every later allocation of the batch returns
 * NULL). */
void fl_shmring_arena_claim(fl_shmring *r, int worker);

/* The slot the current batch is laid out in, or -1 (none taken yet, or none
 * was free). */
int fl_shmring_arena_slot(fl_shmring *r);

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
