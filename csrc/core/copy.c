/* copy.c: batch memory without Python (contracts in copy.h). */
#include "core/copy.h"

#include <stdlib.h>
#include <string.h>

void
fl_aligned_free(void *ctx, void *data)
{
    (void)ctx;
    free(data);
}

void *
fl_aligned_alloc(size_t nbytes)
{
    void *p = NULL;
    /* 64-byte alignment for SIMD stores; malloc-family because buffers are
     * filled and may be freed by threads that do not hold the GIL. */
    if (posix_memalign(&p, 64, nbytes ? nbytes : 1) != 0)
        return NULL;
    return p;
}

void
fl_copy_strided(char *dst, const char *src, int ndim, const int64_t *shape, const int64_t *strides,
                size_t itemsize)
{
    /* find the innermost compact run */
    int64_t run = (int64_t)itemsize;
    int d = ndim;
    while (d > 0 && strides[d - 1] == run) {
        run *= shape[d - 1];
        d--;
    }
    if (d == 0) {
        memcpy(dst, src, (size_t)run);
        return;
    }
    int64_t idx[FL_MAX_NDIM] = {0};
    for (;;) {
        const char *p = src;
        for (int i = 0; i < d; i++)
            p += idx[i] * strides[i];
        memcpy(dst, p, (size_t)run);
        dst += run;
        int i = d - 1;
        while (i >= 0 && ++idx[i] == shape[i]) {
            idx[i] = 0;
            i--;
        }
        if (i < 0)
            break;
    }
}
