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

/* n items of itemsize bytes (1, 2, 4 or 8), st bytes apart in src, packed
 * into dst.  Pure. */
static void
copy_row(char *dst, const char *src, int64_t n, int64_t st, size_t itemsize)
{
#define FL_ROW(T)                                                      \
    do {                                                               \
        for (int64_t j = 0; j < n; j++) {                              \
            T v;                                                       \
            memcpy(&v, src + j * st, sizeof v);                        \
            memcpy(dst + (size_t)j * sizeof v, &v, sizeof v);          \
        }                                                              \
    } while (0)
    switch (itemsize) {
    case 1: FL_ROW(uint8_t); break;
    case 2: FL_ROW(uint16_t); break;
    case 4: FL_ROW(uint32_t); break;
    default: FL_ROW(uint64_t); break;
    }
#undef FL_ROW
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
    /* Each step of the walk writes one unit: the compact run with a memcpy,
     * or, when the innermost dimension itself is strided (a permuted view:
     * PILToTensor's CHW of an HWC image, which ConvertImageDtype and
     * Normalize keep), a whole row of it with a typed loop, since a memcpy
     * call and an index step per element cost more than the copy. */
    int typed_row = run == (int64_t)itemsize && (itemsize == 1 || itemsize == 2 || itemsize == 4 || itemsize == 8);
    int walk = typed_row ? d - 1 : d;
    int64_t n = shape[d - 1], st = strides[d - 1];
    int64_t unit = typed_row ? n * (int64_t)itemsize : run;
    int64_t idx[FL_MAX_NDIM] = {0};
    for (;;) {
        const char *p = src;
        for (int i = 0; i < walk; i++)
            p += idx[i] * strides[i];
        if (typed_row)
            copy_row(dst, p, n, st, itemsize);
        else
            memcpy(dst, p, (size_t)run);
        dst += unit;
        int i = walk - 1;
        while (i >= 0 && ++idx[i] == shape[i]) {
            idx[i] = 0;
            i--;
        }
        if (i < 0)
            break;
    }
}
