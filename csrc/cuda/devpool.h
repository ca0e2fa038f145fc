/* devpool.h: device buffers for batches copied to a GPU (no Python).
 *
 * One fl_devpool per loader and device owns a non-blocking CUDA stream (the
 * loader's copy stream) and a pool of device buffers.  fl_devpool_copy
 * queues host -> device into a pooled buffer on that stream and records a
 * "ready" event after it; the host does not wait.
 *
 *   consumer import  fl_devbuf_export(b, S): stream S waits on `ready`
 *                    (cudaStreamWaitEvent: GPU-side, no host or device-wide
 *                    synchronisation) and S is remembered as a user.
 *   consumer release last fl_devbuf_unref: a "released" event is recorded on
 *                    every user stream, and the buffer goes back to the pool.
 *   reuse            a free buffer whose released events have completed is
 *                    taken at once; otherwise, under the pool's buffer cap,
 *                    a new one is allocated, and at the cap the copy stream
 *                    waits (GPU-side) on the released events before the
 *                    copy overwrites the buffer.  So a buffer is rewritten
 *                    only after every stream that used it has passed the
 *                    point where it was released (ARCHITECTURE.md, 5).
 *
 * The host side of a copy must stay valid and unmodified until
 * fl_devbuf_copy_query says the copy is done; keeping the host batch alive
 * until then is the caller's job (the binding holds it).
 *
 * Ownership and lifetime.  Both objects are reference counted and usable
 * from any thread; nothing here needs the GIL.  The pool holds one reference
 * for its creator and one per buffer that is out (handed to a caller), so a
 * buffer may come back after the loader is gone; the stream and the idle
 * buffers are freed when the last reference goes.  A buffer out of the pool
 * holds one reference per holder (the binding's DeviceTensor, every DLPack
 * export).
 *
 * Errors: functions returning int give 0 or a CUDA error code (cuda.h) and
 * fill the core's error record (core/err.h; err may be NULL) with
 * FL_ERR_RUNTIME and "what failed (cudaErrorName: text)".  A failed host
 * allocation is FL_ERR_RUNTIME too (RuntimeError, as it has always been).
 */
#ifndef FL_DEVPOOL_H
#define FL_DEVPOOL_H

#include <stddef.h>
#include <stdint.h>

#include "cuda/cuda.h"

typedef struct fl_devpool fl_devpool;
typedef struct fl_devbuf fl_devbuf;

/* The most distinct streams one buffer may be exported to. */
#define FL_DEVBUF_MAX_USERS 8

/* Stream handles with a special meaning in the CUDA runtime API. */
#define FL_CUDA_STREAM_LEGACY ((fl_cudaStream_t)(uintptr_t)0x1)     /* cudaStreamLegacy */
#define FL_CUDA_STREAM_PER_THREAD ((fl_cudaStream_t)(uintptr_t)0x2) /* cudaStreamPerThread */

/* A pool on `device` with its own non-blocking stream.  Buffers are
 * pooled by size class (powers of two to 1 MiB, then 2 MiB steps), and
 * max_buffers caps the buffers of one class (out + idle) before copies start
 * to reuse idle buffers whose consumers have not finished with them (see
 * above).  Buffers still held by the consumer are never reused, so a
 * consumer that keeps every batch makes the pool allocate past the cap
 * (counted in stats.over_cap; such buffers are freed when they come back).
 * At most 16 classes are kept; a wholly idle least recently used class makes
 * room for a new one.  max_buffers < 1 means 1.  Returns the caller's
 * reference, or NULL with *err set (CUDA not loaded, bad device, stream
 * creation failed, out of memory).  Runs without the GIL (the first CUDA
 * call may initialise the driver). */
fl_devpool *fl_devpool_new(int device, int max_buffers, fl_err *err);

/* Take one more reference (a caller about to use the pool without the GIL,
 * while another thread could drop the last one). */
void fl_devpool_ref(fl_devpool *p);

/* Drop a reference (NULL is ignored).  The last one synchronises the copy
 * stream, waits for idle buffers' released events, frees them and destroys
 * the stream; errors there are ignored (nobody is left to tell). */
void fl_devpool_unref(fl_devpool *p);

/* The copy stream (borrowed; valid while the caller holds a reference). */
fl_cudaStream_t fl_devpool_stream(const fl_devpool *p);

/* Synchronising with the copy stream in slices, so that the caller can stay
 * interruptible (the binding checks for signals between slices).
 * fl_devpool_mark records a new event after every copy queued so far into
 * *mark, owned by the caller (NULL on failure).  fl_devpool_mark_wait waits
 * at most about timeout_ms for it, polling as fl_devbuf_copy_wait_ms does:
 * 0 once those copies have finished, FL_CUDA_ERR_NOT_READY when they still
 * run (*err untouched), another code on failure.  fl_devpool_mark_free releases the event,
 * whether it has completed or not (NULL is ignored).  None of them blocks
 * longer than timeout_ms; call the wait without the GIL. */
int fl_devpool_mark(fl_devpool *p, fl_cudaEvent_t *mark, fl_err *err);
int fl_devpool_mark_wait(fl_devpool *p, fl_cudaEvent_t mark, int timeout_ms, fl_err *err);
void fl_devpool_mark_free(fl_devpool *p, fl_cudaEvent_t mark);

typedef struct {
    uint64_t copies;        /* fl_devpool_copy calls that succeeded */
    uint64_t bytes_copied;
    uint64_t allocations;   /* cudaMalloc calls */
    uint64_t reused_ready;  /* copies into an idle buffer nobody was using any more */
    uint64_t reused_waiting;/* copies that had to wait (GPU-side) for a consumer stream */
    uint64_t over_cap;      /* allocations past max_buffers (consumer held them all) */
    uint64_t freed;         /* buffers freed before the pool ended (cap, failed event record) */
    int buffers;            /* device buffers alive: out + idle */
    int idle;               /* of which idle in the pool */
    size_t device_bytes;    /* bytes of the buffers alive */
} fl_devpool_stats;

void fl_devpool_get_stats(fl_devpool *p, fl_devpool_stats *out);

/* Queue a copy of host[0, bytes) into a device buffer of at least `bytes`
 * bytes (bytes may be 0) on the pool's stream.  On success *out is a new
 * buffer reference owned by the caller.  Does not wait for the device,
 * with two exceptions: a pageable `host` makes the CUDA runtime stage it
 * synchronously (pinned memory does not), and evicting a size class (only
 * when more than 16 sizes are in use) frees memory, which synchronises the
 * device.  Call without the GIL. */
int fl_devpool_copy(fl_devpool *p, const void *host, size_t bytes, fl_devbuf **out, fl_err *err);

void *fl_devbuf_ptr(const fl_devbuf *b);
size_t fl_devbuf_bytes(const fl_devbuf *b);

/* 0 when the copy into b has finished, FL_CUDA_ERR_NOT_READY while it runs
 * (*err untouched), another code on failure.  Never blocks. */
int fl_devbuf_copy_query(fl_devbuf *b, fl_err *err);
/* Block until the copy has finished, however long it takes.  Call without
 * the GIL. */
int fl_devbuf_copy_wait(fl_devbuf *b, fl_err *err);
/* Wait at most about timeout_ms for the copy: 0 once it has finished,
 * FL_CUDA_ERR_NOT_READY when it still runs (*err untouched), another code on
 * failure.  Polls the copy's event, sleeping 20 us at first and doubling to
 * 1 ms between queries (a short wait costs little latency, a long one
 * little CPU); timeout_ms <= 0 queries once.  For waits that must stay
 * interruptible: wait in slices, check for signals in between.  Call
 * without the GIL. */
int fl_devbuf_copy_wait_ms(fl_devbuf *b, int timeout_ms, fl_err *err);
/* Milliseconds the copy took on the device (call after it finished). */
int fl_devbuf_copy_ms(fl_devbuf *b, float *ms, fl_err *err);

/* Hand b to a consumer working on `stream` (a handle, FL_CUDA_STREAM_LEGACY
 * or FL_CUDA_STREAM_PER_THREAD, meant on the pool's device whatever the
 * calling thread's current device): unless no_wait, future work on `stream`
 * waits for the copy; the stream is remembered so that the release is
 * ordered after its work (a per-thread import's release is recorded on the
 * legacy stream, which follows every thread's per-thread stream).  The
 * consumer's stream must outlive its use of b: the release is recorded on
 * it.  Takes a new reference for the consumer (drop it
 * with fl_devbuf_unref).  Returns 0, a CUDA error, or -2 when b already has
 * FL_DEVBUF_MAX_USERS other streams (*err says so, FL_ERR_EXPORT: a refusal
 * of the export, not a CUDA failure, which the translator makes DLPack's
 * BufferError). */
int fl_devbuf_export(fl_devbuf *b, fl_cudaStream_t stream, int no_wait, fl_err *err);

void fl_devbuf_ref(fl_devbuf *b);
/* Drop a reference; the last one releases the buffer to its pool as
 * described above.  A buffer past its class's cap, or whose release event
 * cannot be recorded, is freed instead of pooled (cudaFree synchronises the
 * device, which makes that safe, and is why it is kept to those cases).
 * Any thread, no GIL needed; NULL is ignored. */
void fl_devbuf_unref(fl_devbuf *b);

#endif
