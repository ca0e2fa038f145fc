/* cuda.h: the CUDA runtime, loaded at run time (no Python in here).
 *
 * The extension never links against CUDA and never includes
 * cuda_runtime.h: libcudart is dlopen()ed on first use, so fastloader
 * builds, imports and runs its CPU paths on machines without CUDA
 * (ARCHITECTURE.md, invariant 8).  The few types and constants we need are
 * declared below with the values of the CUDA runtime ABI, which has kept
 * them stable from CUDA 11 to 13.
 *
 * Error convention.  Every fl_cuda_* function that can fail returns an
 * int: 0 (FL_CUDA_OK) on success, the cudaError_t code (> 0) the runtime
 * returned, or FL_CUDA_ERR_NO_LIBRARY (< 0) when the runtime is not loaded.
 * On failure it fills the core's error record (core/err.h; err may be
 * NULL) with code FL_ERR_RUNTIME and one line:
 *     "what failed (cudaErrorName: error string)"
 * e.g. "cudaGetDeviceCount failed (cudaErrorInsufficientDriver: CUDA driver
 * version is insufficient for CUDA runtime version)".  Success leaves *err
 * untouched.
 *
 * Threads.  None of these functions needs or touches the GIL; all are safe
 * to call from any thread once fl_cuda_load() has succeeded.  Functions
 * taking a `device` make it current for the call only (the runtime would
 * otherwise act on, and may create a context for, the thread's current
 * device) and restore the calling thread's previous device afterwards, so
 * they never change the device a user (torch) selected on that thread.  The
 * one exception follows torch: a thread whose previous device has no
 * primary context (a fresh worker thread reports device 0) stays on
 * `device`, because switching back would create a context, about half a
 * GiB, on a GPU the process does not use.  device < 0 leaves the current
 * device alone.
 *
 * Errors handled here (returned as codes) are also cleared from the
 * runtime's per-thread "last error", which torch checks after every kernel
 * launch: a failure fastloader reported, or an event that is merely not
 * ready yet, must not surface later as an error in an unrelated torch op.
 *
 * Ownership.  Pointers, streams and events created here belong to the
 * caller, who releases them with the matching fl_cuda_*_free/destroy.
 */
#ifndef FL_CUDA_H
#define FL_CUDA_H

#include <stddef.h>

#include "core/err.h"
#include "core/pin.h"

/* ---- the subset of the CUDA runtime ABI that we use ------------------- */

typedef int fl_cudaError_t;       /* cudaError_t (an enum, int-sized) */
typedef void *fl_cudaStream_t;    /* cudaStream_t (CUstream_st *) */
typedef void *fl_cudaEvent_t;     /* cudaEvent_t (CUevent_st *) */

enum {
    FL_CUDA_OK = 0,                       /* cudaSuccess */
    FL_CUDA_ERR_STUB_LIBRARY = 34,        /* cudaErrorStubLibrary: libcuda is a stub */
    FL_CUDA_ERR_INSUFFICIENT_DRIVER = 35, /* cudaErrorInsufficientDriver: no driver, or too old */
    FL_CUDA_ERR_NO_DEVICE = 100,          /* cudaErrorNoDevice */
    FL_CUDA_ERR_INVALID_DEVICE = 101,     /* cudaErrorInvalidDevice */
    FL_CUDA_ERR_NOT_READY = 600,          /* cudaErrorNotReady: work still pending */
    FL_CUDA_ERR_SYSTEM_DRIVER_MISMATCH = 803, /* cudaErrorSystemDriverMismatch */
    FL_CUDA_ERR_NO_LIBRARY = -1,          /* ours: libcudart not loaded */
};

/* enum cudaMemcpyKind */
enum {
    FL_CUDA_MEMCPY_H2H = 0,
    FL_CUDA_MEMCPY_H2D = 1,
    FL_CUDA_MEMCPY_D2H = 2,
    FL_CUDA_MEMCPY_D2D = 3,
    FL_CUDA_MEMCPY_DEFAULT = 4,
};

#define FL_CUDA_HOST_ALLOC_DEFAULT 0x00u    /* cudaHostAllocDefault */
#define FL_CUDA_HOST_ALLOC_PORTABLE 0x01u   /* cudaHostAllocPortable */
#define FL_CUDA_HOST_REGISTER_DEFAULT 0x00u /* cudaHostRegisterDefault */
#define FL_CUDA_HOST_REGISTER_PORTABLE 0x01u /* cudaHostRegisterPortable */
#define FL_CUDA_STREAM_NON_BLOCKING 0x01u   /* cudaStreamNonBlocking */
#define FL_CUDA_EVENT_DEFAULT 0x00u         /* cudaEventDefault */
#define FL_CUDA_EVENT_BLOCKING_SYNC 0x01u   /* cudaEventBlockingSync */
#define FL_CUDA_EVENT_DISABLE_TIMING 0x02u  /* cudaEventDisableTiming */

/* The runtime entry points we resolve with dlsym.  Signatures as in
 * cuda_runtime_api.h, with our own opaque types. */
typedef struct {
    fl_cudaError_t (*GetDeviceCount)(int *count);
    fl_cudaError_t (*RuntimeGetVersion)(int *version);
    fl_cudaError_t (*DriverGetVersion)(int *version);
    const char *(*GetErrorName)(fl_cudaError_t error);
    const char *(*GetErrorString)(fl_cudaError_t error);
    fl_cudaError_t (*SetDevice)(int device);
    fl_cudaError_t (*GetDevice)(int *device);
    fl_cudaError_t (*HostAlloc)(void **ptr, size_t size, unsigned int flags);
    fl_cudaError_t (*FreeHost)(void *ptr);
    fl_cudaError_t (*HostRegister)(void *ptr, size_t size, unsigned int flags);
    fl_cudaError_t (*HostUnregister)(void *ptr);
    fl_cudaError_t (*Malloc)(void **ptr, size_t size);
    fl_cudaError_t (*Free)(void *ptr);
    fl_cudaError_t (*MemcpyAsync)(void *dst, const void *src, size_t count, int kind,
                                  fl_cudaStream_t stream);
    fl_cudaError_t (*StreamCreateWithFlags)(fl_cudaStream_t *stream, unsigned int flags);
    fl_cudaError_t (*StreamDestroy)(fl_cudaStream_t stream);
    fl_cudaError_t (*StreamWaitEvent)(fl_cudaStream_t stream, fl_cudaEvent_t event,
                                      unsigned int flags);
    fl_cudaError_t (*StreamSynchronize)(fl_cudaStream_t stream);
    fl_cudaError_t (*EventCreateWithFlags)(fl_cudaEvent_t *event, unsigned int flags);
    fl_cudaError_t (*EventRecord)(fl_cudaEvent_t event, fl_cudaStream_t stream);
    fl_cudaError_t (*EventQuery)(fl_cudaEvent_t event);
    fl_cudaError_t (*EventSynchronize)(fl_cudaEvent_t event);
    fl_cudaError_t (*EventDestroy)(fl_cudaEvent_t event);
    fl_cudaError_t (*EventElapsedTime)(float *ms, fl_cudaEvent_t start, fl_cudaEvent_t end);
    fl_cudaError_t (*GetLastError)(void);
} fl_cuda_api;

/* ---- loading ---------------------------------------------------------- */

/* Load libcudart once per process; thread-safe (concurrent callers wait
 * for the first one, and every later call returns the first outcome,
 * success or failure, whatever paths it passes).  Search order:
 *   1. $FASTLOADER_CUDART when set and non-empty, and then nothing else
 *      (an explicit choice is never second-guessed);
 *   2. a libcudart already loaded in the process (e.g. by torch), so one
 *      process does not end up with two CUDA runtimes;
 *   3. paths[0..n) in order (the binding passes the nvidia-* wheel copies
 *      it finds on sys.path); NULL entries are skipped;
 *   4. $CUDA_HOME/lib64, then /usr/local/cuda/lib64 (libcudart.so.13,
 *      .so.12, .so);
 *   5. dlopen("libcudart.so.13"), ("libcudart.so.12"), ("libcudart.so")
 *      through the system search path.
 * A library that opens but lacks one of the entry points is skipped.
 * Returns 0, or FL_CUDA_ERR_NO_LIBRARY with *err set (FL_ERR_RUNTIME) to
 *   "no CUDA runtime library found (tried: a, b: <dlerror>, ...)",
 * whole: a list too long for err->msg ends in "..." before the ")".
 * The library is never unloaded (the process keeps it until exit). */
int fl_cuda_load(const char *const *paths, size_t n, fl_err *err);

/* The resolved entry points, or NULL before a successful fl_cuda_load.
 * Borrowed, valid until process exit. */
const fl_cuda_api *fl_cuda_get_api(void);

/* Path of the loaded library (from the dynamic loader's link map), or NULL
 * before a successful fl_cuda_load.  Borrowed, valid until process exit. */
const char *fl_cuda_library_path(void);

/* Fill *err (err may be NULL) with FL_ERR_RUNTIME and "what failed
 * (cudaErrorName: error string)" for `code`, and clear the thread's last
 * CUDA error.  Works without a loaded library ("CUDA error N").  Returns
 * `code` so callers can `return fl_cuda_format_error(...)`. */
int fl_cuda_format_error(fl_err *err, const char *what, int code);

/* ---- finding the runtime and describing it (cuda_info, cuda_require) ---- */

typedef struct {
    int loaded;      /* libcudart is loaded (by this call or an earlier one) */
    int vers_rc;     /* fl_cuda_versions result; set when loaded */
    int runtime, driver;
    int count_rc;    /* fl_cuda_device_count result; set when loaded */
    int count;
    fl_err load_err;  /* why nothing is loaded */
    fl_err vers_err;  /* set when vers_rc != 0 */
    fl_err count_err; /* set when count_rc != 0 */
} fl_cuda_probe_result;

/* Load libcudart unless an earlier call has tried, then query the versions
 * and the device count.  The candidates handed to fl_cuda_load (which
 * tries them after FASTLOADER_CUDART and an already loaded runtime, and
 * before CUDA_HOME and the system) are, in order:
 *   files[0, nfiles), as given (the caller's search_paths);
 *   for each of roots[0, nroots) (sys.path entries; "" is the current
 *   directory), the copies the nvidia-* wheels installed with torch keep:
 *   <root>/nvidia/cu13/lib/libcudart.so* (CUDA 13 wheels), then
 *   <root>/nvidia/cuda_runtime/lib/libcudart.so* (CUDA 12 wheels), newest
 *   version first in each directory.  Missing directories add nothing, and
 *   the roots are not scanned at all once a runtime is loaded.
 * Later calls get the first load's outcome whatever they pass.  Returns 0
 * with *out filled (whatever CUDA's state), or -1 when out of memory
 * (*out then says nothing is loaded, with load_err FL_ERR_NOMEM).  No
 * GIL: directory scans and the driver's initialisation may take seconds. */
int fl_cuda_probe(const char *const *files, size_t nfiles, const char *const *roots, size_t nroots,
                  fl_cuda_probe_result *out);

/* ---- queries ----------------------------------------------------------- */

/* *count = number of visible devices (0 on failure).  Returns 0 or the
 * cudaGetDeviceCount error (35 without a usable driver, 100 when the driver
 * sees no device). */
int fl_cuda_device_count(int *count, fl_err *err);

/* *runtime and *driver as CUDA encodes them (1000*major + 10*minor, e.g.
 * 13000); *driver is 0 when no driver is installed.  Either pointer may be
 * NULL.  Returns 0 or the first error. */
int fl_cuda_versions(int *runtime, int *driver, fl_err *err);

/* ---- memory ------------------------------------------------------------ */

/* Page-locked host memory of `bytes` (> 0) bytes, portable across devices
 * (cudaHostAllocPortable), with `device`'s context current for the call.
 * On success *ptr is owned by the caller: release with fl_cuda_host_free.
 * On failure *ptr is NULL. */
int fl_cuda_host_alloc(int device, size_t bytes, void **ptr, fl_err *err);
/* Release memory from fl_cuda_host_alloc.  NULL is a no-op. */
int fl_cuda_host_free(int device, void *ptr, fl_err *err);

/* Page-lock the caller's memory [ptr, ptr + bytes) in place (portable).
 * The caller keeps owning ptr and must fl_cuda_host_unregister it before
 * freeing it.  Page-aligned memory avoids locking neighbouring data. */
int fl_cuda_host_register(int device, void *ptr, size_t bytes, fl_err *err);
int fl_cuda_host_unregister(int device, void *ptr, fl_err *err);

/* The host functions above as the core's fl_pinner (core/pin.h), for the
 * pinned pools and ring slots the binding creates.  A static table: never
 * freed.  Each entry is the function above: 0, or a code with *err filled. */
const fl_pinner *fl_cuda_pinner(void);

/* Device memory of `bytes` (> 0) bytes on `device`.  On success *ptr is
 * owned by the caller: release with fl_cuda_free.  On failure *ptr is NULL. */
int fl_cuda_malloc(int device, size_t bytes, void **ptr, fl_err *err);
/* Release memory from fl_cuda_malloc (implicitly synchronises the device,
 * so pool device buffers instead of freeing them per batch).  NULL is a
 * no-op. */
int fl_cuda_free(int device, void *ptr, fl_err *err);

/* ---- streams and events ------------------------------------------------ */

/* A non-blocking stream (cudaStreamNonBlocking: no implicit ordering with
 * the legacy default stream) on `device`.  Owned by the caller: release with
 * fl_cuda_stream_destroy.  *stream is NULL on failure. */
int fl_cuda_stream_create(int device, fl_cudaStream_t *stream, fl_err *err);
/* NULL is a no-op.  Pending work still completes. */
int fl_cuda_stream_destroy(int device, fl_cudaStream_t stream, fl_err *err);
/* Block the calling thread until all work queued on `stream` is done.
 * Call without the GIL: it may wait for a long time. */
int fl_cuda_stream_synchronize(int device, fl_cudaStream_t stream, fl_err *err);
/* Make future work on `stream` wait until `event`'s last recorded work is
 * done; the host does not block.  `device` is made current for the call:
 * the special handles (0, cudaStreamLegacy, cudaStreamPerThread) name the
 * default stream of the *current* device, so pass the device they are
 * meant on. */
int fl_cuda_stream_wait_event(int device, fl_cudaStream_t stream, fl_cudaEvent_t event, fl_err *err);

/* An event on `device` with timing disabled (cheaper to record and query).
 * blocking_sync != 0 makes fl_cuda_event_synchronize sleep instead of
 * spin.  Owned by the caller: release with fl_cuda_event_destroy.  *event is
 * NULL on failure. */
int fl_cuda_event_create(int device, int blocking_sync, fl_cudaEvent_t *event, fl_err *err);
/* Like fl_cuda_event_create with blocking_sync, with timing enabled (for
 * fl_cuda_event_elapsed_ms; a little dearer to record). */
int fl_cuda_event_create_timed(int device, fl_cudaEvent_t *event, fl_err *err);
/* *ms = time between two completed timed events recorded on one stream. */
int fl_cuda_event_elapsed_ms(int device, float *ms, fl_cudaEvent_t start, fl_cudaEvent_t end,
                             fl_err *err);
/* NULL is a no-op. */
int fl_cuda_event_destroy(int device, fl_cudaEvent_t event, fl_err *err);
/* Capture the work queued on `stream` so far in `event`; both must be on
 * `device`, which is made current for the call (see
 * fl_cuda_stream_wait_event on the special stream handles). */
int fl_cuda_event_record(int device, fl_cudaEvent_t event, fl_cudaStream_t stream, fl_err *err);
/* Returns 0 when the recorded work is done (or nothing was recorded),
 * FL_CUDA_ERR_NOT_READY while it is pending (*err untouched: not an error),
 * another code on failure.  Never blocks. */
int fl_cuda_event_query(int device, fl_cudaEvent_t event, fl_err *err);
/* Block the calling thread until the recorded work is done.  Call without
 * the GIL. */
int fl_cuda_event_synchronize(int device, fl_cudaEvent_t event, fl_err *err);

/* ---- copies ------------------------------------------------------------ */

/* Queue a copy of `bytes` bytes on `stream` of `device`, host to device or
 * device to host; returns at once.  The copy is asynchronous with respect
 * to the host only when the host side is page-locked: the host buffer must
 * stay valid and unmodified (H2D) or unread (D2H) until an event recorded
 * after it has completed.  bytes == 0 is a no-op. */
int fl_cuda_memcpy_h2d_async(int device, void *dst_device, const void *src_host, size_t bytes,
                             fl_cudaStream_t stream, fl_err *err);
int fl_cuda_memcpy_d2h_async(int device, void *dst_host, const void *src_device, size_t bytes,
                             fl_cudaStream_t stream, fl_err *err);

/* ---- round trips for tests (cuda_roundtrip.c) -------------------------- */

/* Copy src (n > 0 bytes) into page-locked host memory and from there into
 * dst.  reg: page-lock page-aligned malloc memory with cudaHostRegister
 * instead of cudaHostAlloc.  Returns 0 or a code as above (*err set;
 * -1 when the aligned malloc fails). */
int fl_cuda_pinned_roundtrip(int device, const void *src, void *dst, size_t n, int reg, fl_err *err);

/* Copy src (n > 0 bytes) to `device` and back into dst, through page-locked
 * buffers.  The device buffer is first filled with the complement of src,
 * so a device-to-host copy that does not wait for the host-to-device one
 * returns wrong bytes.  two_streams: the H2D runs on stream A, stream B
 * waits on A's event and runs the D2H.  reg as above, for the source
 * buffer.  Both events must report done afterwards.  Returns 0 or a code
 * (*err set).  Call without the GIL: it synchronises. */
int fl_cuda_device_roundtrip(int device, const void *src, void *dst, size_t n, int two_streams, int reg,
                             fl_err *err);

#endif
