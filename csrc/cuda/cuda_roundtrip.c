/* cuda_roundtrip.c: copies through page-locked host memory and a device
 * and back, for the tests of the CUDA layer (_C._cuda_pinned_roundtrip,
 * _C._cuda_device_roundtrip; contracts in cuda.h).  No Python in here.
 */
#include "cuda/cuda.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Host memory that is page-locked either by cudaHostAlloc or by
 * cudaHostRegister of page-aligned malloc memory. */
typedef struct {
    void *ptr;
    int registered;
} pinned;

static int
pinned_alloc(pinned *h, int device, size_t n, int reg, fl_err *err)
{
    h->ptr = NULL;
    h->registered = 0;
    if (!reg)
        return fl_cuda_host_alloc(device, n, &h->ptr, err);
    long page = sysconf(_SC_PAGESIZE);
    size_t align = page > 0 ? (size_t)page : 4096;
    size_t len = (n + align - 1) / align * align;
    void *p = NULL;
    if (posix_memalign(&p, align, len) != 0) {
        fl_err_set(err, FL_ERR_RUNTIME, 0, "out of memory (%zu bytes)", len);
        return -1;
    }
    int rc = fl_cuda_host_register(device, p, len, err);
    if (rc != FL_CUDA_OK) {
        free(p);
        return rc;
    }
    h->ptr = p;
    h->registered = 1;
    return FL_CUDA_OK;
}

/* Release h; keeps the first error in err (when *rc is still 0). */
static void
pinned_free(pinned *h, int *rc, fl_err *err)
{
    if (!h->ptr)
        return;
    int r;
    if (h->registered) {
        r = fl_cuda_host_unregister(-1, h->ptr, *rc ? NULL : err);
        free(h->ptr);
    } else {
        r = fl_cuda_host_free(-1, h->ptr, *rc ? NULL : err);
    }
    if (!*rc)
        *rc = r;
    h->ptr = NULL;
}

int
fl_cuda_pinned_roundtrip(int device, const void *src, void *dst, size_t n, int reg, fl_err *err)
{
    pinned h;
    int rc = pinned_alloc(&h, device, n, reg, err);
    if (rc == FL_CUDA_OK) {
        memcpy(h.ptr, src, n);
        memcpy(dst, h.ptr, n);
    }
    pinned_free(&h, &rc, err);
    return rc;
}

int
fl_cuda_device_roundtrip(int device, const void *src, void *dst, size_t n, int two_streams, int reg,
                         fl_err *err)
{
    pinned hsrc = {0}, hdst = {0};
    void *dbuf = NULL;
    fl_cudaStream_t sa = NULL, sb = NULL;
    fl_cudaEvent_t ea = NULL, eb = NULL;
    int rc;

    if ((rc = pinned_alloc(&hsrc, device, n, reg, err)) ||
        (rc = pinned_alloc(&hdst, device, n, 0, err)) ||
        (rc = fl_cuda_malloc(device, n, &dbuf, err)) ||
        (rc = fl_cuda_stream_create(device, &sa, err)) ||
        (rc = fl_cuda_event_create(device, 0, &ea, err)) ||
        (rc = fl_cuda_event_create(device, 1, &eb, err)))
        goto done;
    if (two_streams && (rc = fl_cuda_stream_create(device, &sb, err)))
        goto done;
    memcpy(hsrc.ptr, src, n);
    for (size_t i = 0; i < n; i++)
        ((unsigned char *)hdst.ptr)[i] = (unsigned char)~((const unsigned char *)src)[i];
    /* Prefill the device buffer with the complement and wait for it. */
    if ((rc = fl_cuda_memcpy_h2d_async(device, dbuf, hdst.ptr, n, sa, err)) ||
        (rc = fl_cuda_stream_synchronize(device, sa, err)))
        goto done;
    memset(hdst.ptr, 0, n);
    fl_cudaStream_t sd = two_streams ? sb : sa;
    if ((rc = fl_cuda_memcpy_h2d_async(device, dbuf, hsrc.ptr, n, sa, err)) ||
        (rc = fl_cuda_event_record(device, ea, sa, err)))
        goto done;
    if (two_streams && (rc = fl_cuda_stream_wait_event(device, sb, ea, err)))
        goto done;
    if ((rc = fl_cuda_memcpy_d2h_async(device, hdst.ptr, dbuf, n, sd, err)) ||
        (rc = fl_cuda_event_record(device, eb, sd, err)) ||
        (rc = fl_cuda_event_synchronize(device, eb, err)))
        goto done;
    /* Both events have completed now: a query must say so. */
    int qa = fl_cuda_event_query(device, ea, err), qb = fl_cuda_event_query(device, eb, err);
    if (qa != FL_CUDA_OK || qb != FL_CUDA_OK) {
        if (qa == FL_CUDA_ERR_NOT_READY || qb == FL_CUDA_ERR_NOT_READY)
            fl_err_set(err, FL_ERR_RUNTIME, 0,
                       "cudaEventQuery reported pending work after cudaEventSynchronize");
        rc = qa != FL_CUDA_OK ? qa : qb;
        goto done;
    }
    memcpy(dst, hdst.ptr, n);
done:;
    /* Release everything; keep the first error. */
    int r;
#define FL_KEEP(call)                                                                              \
    do {                                                                                           \
        r = (call);                                                                                \
        if (!rc)                                                                                   \
            rc = r;                                                                                \
    } while (0)
    if (sa)
        FL_KEEP(fl_cuda_stream_synchronize(device, sa, rc ? NULL : err));
    if (sb)
        FL_KEEP(fl_cuda_stream_synchronize(device, sb, rc ? NULL : err));
    FL_KEEP(fl_cuda_event_destroy(device, ea, rc ? NULL : err));
    FL_KEEP(fl_cuda_event_destroy(device, eb, rc ? NULL : err));
    FL_KEEP(fl_cuda_stream_destroy(device, sa, rc ? NULL : err));
    FL_KEEP(fl_cuda_stream_destroy(device, sb, rc ? NULL : err));
    FL_KEEP(fl_cuda_free(device, dbuf, rc ? NULL : err));
#undef FL_KEEP
    pinned_free(&hsrc, &rc, err);
    pinned_free(&hdst, &rc, err);
    return rc;
}
