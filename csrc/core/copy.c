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
    if (run == (int64_t)itemsize && (itemsize == 1 || itemsize == 2 || itemsize == 4 || itemsize == 8)) {
        /* the innermost dimension itself is strided (a permuted view: PILToTensor's
         * CHW of an HWC image, which ConvertImageDtype and Normalize keep): one
         * element at a time would be a memcpy call and an index walk per
         * element, so copy each row with a typed loop instead */
        int last = d - 1;
        int64_t n = shape[last], st = strides[last];
        for (int i = 0; i < d; i++)
            if (shape[i] == 0)
                return;
        int64_t row[FL_MAX_NDIM] = {0};
        for (;;) {
            const char *p = src;
            for (int i = 0; i < last; i++)
                p += row[i] * strides[i];
#define FL_ROW(T)                                                      \
    do {                                                               \
        for (int64_t j = 0; j < n; j++) {                              \
            T v;                                                       \
            memcpy(&v, p + j * st, sizeof v);                          \
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
            dst += n * (int64_t)itemsize;
            int i = last - 1;
            while (i >= 0 && ++row[i] == shape[i]) {
                row[i] = 0;
                i--;
            }
            if (i < 0)
                break;
        }
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
