/* arrow_source.h: the "arrow" kind of fl_source: images stored in an Apache
 * Arrow column, as Hugging Face `datasets` keeps them (no Python).
 *
 * A `datasets` Image column is a chunked Arrow array of type
 * struct<bytes: binary, path: string>: each row holds the encoded file
 * (bytes), or only where the file is (path, bytes null: what
 * Dataset.from_dict and the imagefolder builder store for local files).
 * `datasets` memory-maps its Arrow files (save_to_disk, the cache of
 * load_dataset), so the bytes are already in this process's address space.
 *
 * The binding hands every chunk's buffers to fl_source_arrow_new once (the
 * Arrow columnar layout: validity bitmaps, offsets, data), and a get is
 * then pure pointer arithmetic:
 *   - sample i is row rows[i] of the column (rows NULL: row i), the table
 *     position after `datasets`' indices mapping (select, shuffle, filter);
 *     the row falls in the chunk found by a binary search of the chunks'
 *     first rows;
 *   - bytes not null: a view of the value in place (the mapped file; no
 *     copy before the decode).  As lmdb_source.c does, get touches one byte
 *     per page so the disk read is counted as read time in stats();
 *   - bytes null, path not null: the file at path is read into the
 *     caller's buffer with fl_source_read_file (a path is used as written,
 *     relative to the working directory as `datasets` would open it;
 *     a URL such as hf:// or https:// is refused: only local files);
 *   - the row null, or both fields null: an error (nothing to read).
 * A plain binary or large_binary column (no struct: path.offsets NULL and
 * no row validity beyond the bytes') works the same.
 *
 * Offsets are int32 (binary, string) or int64 (large_binary, large_string),
 * chosen per field.  Every buffer's size is checked against the chunk's
 * length when the source is made; each value's offsets are checked
 * against its data buffer when it is read (a damaged file gives an error,
 * never a read outside the buffer).
 *
 * Ownership: the source does not own the Arrow memory.  The caller lends
 * it with a release function, called once, on whichever thread drops the
 * last reference (a worker closing, the binding object's dealloc), after
 * which the source touches none of it.
 *
 * Error rules (fl_err, as source.h):
 *   FL_ERR_IO with errnum  the path fallback's open/read failed (ENOENT...)
 *   FL_ERR_IO, errnum 0    a null row, a row whose bytes and path are both
 *                          null, a remote path, offsets outside the data
 *                          (the storage holds no image for the row: as a
 *                          missing file, it follows on_error)
 *   FL_ERR_LIMIT           a value or file larger than the caller's max_bytes
 *   FL_ERR_NOMEM           out of memory
 *   FL_ERR_INVALID         fl_source_arrow_new only: a buffer too small for
 *                          its chunk, a bad offset width, a row number out
 *                          of range
 * Messages hold the reason only; the caller names the dataset and row.
 *
 * Every function here runs without the GIL and may be called from any
 * thread.
 */
#ifndef FL_ARROW_SOURCE_H
#define FL_ARROW_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include "sources/source.h"

/* One Arrow variable-length binary or UTF-8 array (one field of a chunk),
 * borrowed.  Element j of the array is entry (offset + j) of the offsets
 * and bit (offset + j) of the validity bitmap (LSB first). */
typedef struct {
    const uint8_t *validity;  /* NULL: no nulls */
    size_t validity_len;      /* bytes of the bitmap */
    const void *offsets;      /* NULL: the field is absent (path of a plain binary column) */
    size_t offsets_len;       /* bytes of the offsets buffer */
    int offset_width;         /* 4 (binary, string) or 8 (large_binary, large_string) */
    const uint8_t *data;      /* may be NULL when data_len is 0 */
    size_t data_len;
    int64_t offset;           /* the array's offset in elements (a slice) */
} fl_arrow_binary;

/* One chunk of the column: `length` rows, the struct's own validity (rows
 * that are null as a whole) and its two fields. */
typedef struct {
    int64_t length;
    const uint8_t *validity;  /* the struct's bitmap; NULL: no null rows */
    size_t validity_len;
    int64_t validity_offset;  /* the struct array's offset */
    fl_arrow_binary bytes;    /* required (offsets not NULL) */
    fl_arrow_binary path;     /* offsets NULL: no path field */
} fl_arrow_chunk;

/* A source over n samples of a column of `nchunks` chunks (the array is
 * copied; the memory it points to is borrowed, see Ownership above).
 * rows: n row numbers into the column (copied), or NULL for rows 0..n-1
 * (then n must equal the column's rows).  release(ctx) is called once when
 * the last reference goes, and also when this fails (then before it
 * returns), so the caller hands the memory over either way; release may be
 * NULL.  Returns a source with one reference, or NULL with err filled
 * (FL_ERR_INVALID with the reason, FL_ERR_NOMEM). */
fl_source *fl_source_arrow_new(const fl_arrow_chunk *chunks, int64_t nchunks, const int64_t *rows, int64_t n,
                               void (*release)(void *ctx), void *ctx, fl_err *err);

#endif
