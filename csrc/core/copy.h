/* copy.h: batch memory without Python: 64-byte aligned allocations, and the
 * strided copy default collation (_C.stack) uses to put one array into its
 * slot of a batch.
 *
 * None of these functions needs the GIL; all may run on any thread.
 */
#ifndef FL_COPY_H
#define FL_COPY_H

#include <stddef.h>
#include <stdint.h>

/* Most dimensions an array handed to fl_copy_strided may have. */
#define FL_MAX_NDIM 16

/* Copy the array at `src` (ndim <= FL_MAX_NDIM dimensions of shape[i]
 * elements, strides[i] bytes apart, possibly negative or 0; elements of
 * `itemsize` bytes) into `dst` in row-major order, compact: dst receives
 * itemsize * prod(shape) bytes and must have room for them.  Every
 * shape[i] must be >= 1: the caller skips empty arrays (a 0 would make the
 * loop run forever).  The innermost dimensions that are already compact are
 * copied with one memcpy per run; a strided innermost dimension of 1, 2, 4
 * or 8-byte items with a typed loop per row.  The two ranges must not overlap.  Pure
 * memory; no allocation. */
void fl_copy_strided(char *dst, const char *src, int ndim, const int64_t *shape, const int64_t *strides,
                     size_t itemsize);

/* nbytes (0 counts as 1) of 64-byte aligned memory (for SIMD stores) from
 * the malloc family, so that threads without the GIL may fill and free it.
 * NULL when out of memory.  Release with free() or fl_aligned_free. */
void *fl_aligned_alloc(size_t nbytes);

/* free(data); `ctx` is ignored (the signature of a Buffer's free function,
 * py_buffer.h). */
void fl_aligned_free(void *ctx, void *data);

#endif
