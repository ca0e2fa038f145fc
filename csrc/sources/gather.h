/* gather.h: row-major arrays in read-only memory, and the gather that
 * copies the rows a batch names into the batch's buffer (no Python).
 *
 * A region is the memory of one array: a file mapped read-only with mmap
 * (the data of an .npy: nothing is read until a row is first copied, and
 * the pages are the page cache's, shared by every process that maps the
 * file), or memory another owner lends (an array already in memory; the
 * owner's release function runs when the last reference goes).  Regions
 * are reference-counted: the array source (array_source.h) and the binding
 * object that made it each hold one, so the memory stays valid while any
 * worker may read it.
 *
 * Every function here runs without the GIL, on any thread.
 */
#ifndef FL_GATHER_H
#define FL_GATHER_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

typedef struct fl_region fl_region;

/* Map bytes [offset, offset + nbytes) of the file at `path` read-only
 * (PROT_READ, MAP_SHARED: a write through the mapping is a fault, never a
 * change to the file).  The whole file is mapped and the region starts at
 * `offset` (which need not be page-aligned).  Nothing is read here.
 * Returns a region with one reference, or NULL with err filled:
 *   FL_ERR_IO with errnum  open, fstat or mmap failed
 *   FL_ERR_IO, errnum 0    not a regular file
 *   FL_ERR_INVALID         the file is shorter than offset + nbytes (the
 *                          message gives both sizes)
 *   FL_ERR_NOMEM           out of memory
 * nbytes 0 maps nothing (a region of no bytes). */
fl_region *fl_region_map_file(const char *path, uint64_t offset, uint64_t nbytes, fl_err *err);

/* A region over memory someone else owns: `data` [0, nbytes) must stay
 * valid and unchanged in place until release(ctx) is called, exactly once,
 * by whichever thread drops the last reference (so release must take any
 * lock it needs itself; it may be NULL).  NULL when out of memory: then
 * release is not called and the caller still owns the memory. */
fl_region *fl_region_wrap(const void *data, size_t nbytes, void (*release)(void *ctx), void *ctx);

/* The region's first byte and size.  Pure. */
const uint8_t *fl_region_data(const fl_region *r);
size_t fl_region_size(const fl_region *r);

/* Take / drop a reference; the last unref unmaps (or calls release) and
 * frees the region.  NULL-safe.  fl_region_ref returns r. */
fl_region *fl_region_ref(fl_region *r);
void fl_region_unref(fl_region *r);

/* Copy rows indices[0..count) of the array at `base` (nrows rows of
 * row_bytes bytes each, row-major, base[0 .. nrows * row_bytes) readable)
 * to out[k * row_bytes], in the order given; out has room for
 * count * row_bytes bytes and does not overlap base.  Every index is
 * checked before anything is copied: returns 0, or -1 with err filled
 * (FL_ERR_INDEX naming the first index outside [0, nrows)) and out
 * untouched.  Pure memory, no allocation.  A row not yet in memory (a
 * mapped file) is read by the page fault of its first copy, on the
 * calling thread. */
int fl_gather_rows(const uint8_t *base, int64_t nrows, size_t row_bytes, const int64_t *indices, int64_t count,
                   uint8_t *out, fl_err *err);

#endif
