/* source.h: the bytes of one sample, wherever they live (no Python).
 *
 * The one place where the core reads a sample's encoded bytes, with one set
 * of error rules for every caller (the native pipeline's workers and
 * decode_jpeg).  Today the bytes live in files; LMDB values, tar members and
 * HTTP ranges are meant to plug in here, returning the same error records.
 *
 * Error rules (fl_err, see jpeg.h):
 *   FL_ERR_IO with errnum  open/stat/read failed (ENOENT, EACCES, ELOOP...),
 *                          or a directory (EISDIR)
 *   FL_ERR_IO, errnum 0    not a regular file (FIFO, socket, device), or the
 *                          file shrank while it was read (a truncated read is
 *                          an error, never a shorter image)
 *   FL_ERR_LIMIT           larger than the caller's max_bytes
 *   FL_ERR_NOMEM           the buffer could not grow
 * Messages hold the reason only; the caller names the file.
 *
 * Every function here runs without the GIL and may be called from any
 * thread; an fl_bytes belongs to one thread at a time.
 */
#ifndef FL_SOURCE_H
#define FL_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include "jpeg.h"   /* fl_err */

/* Files larger than this are refused rather than read (no JPEG that passes
 * the pixel limit needs more). */
#define FL_SOURCE_MAX_FILE_BYTES ((size_t)1 << 30)

/* A growable byte buffer owned by its user (a worker keeps one and reuses
 * it for every sample).  Zero-initialise; free with fl_bytes_free. */
typedef struct {
    uint8_t *data;
    size_t cap;
} fl_bytes;

/* Make b hold at least `need` bytes (contents not kept).  0, or -1 when out
 * of memory (b unchanged). */
int fl_bytes_reserve(fl_bytes *b, size_t need);

/* Release b's memory when it holds more than `keep` bytes (so one outsized
 * sample does not pin memory for a worker's life).  NULL-safe. */
void fl_bytes_trim(fl_bytes *b, size_t keep);

/* Release b's memory and reset it to empty.  NULL-safe. */
void fl_bytes_free(fl_bytes *b);

/* Read the whole regular file at `path` into buf->data[0..len).  Returns
 * len (>= 0), or -1 with err filled (rules above).  Never blocks on a FIFO:
 * the file is opened non-blocking and refused by its type before anything
 * is read.  A file that grows while read is read up to its size at open.
 * buf->data has one spare byte after len. */
long long fl_source_read_file(const char *path, fl_bytes *buf, size_t max_bytes, fl_err *err);

#endif
