/* source.h: the bytes of one sample, wherever they live (no Python).
 *
 * The one place where the core reads a sample's encoded bytes, with one set
 * of error rules for every caller (the native pipeline's workers and
 * decode_jpeg).  A map-style dataset's bytes come from an fl_source (below):
 * files on disk (fl_source_files_new), LMDB values (lmdb_source.h), rows of
 * memory-mapped arrays; every kind returns the same error records, so the
 * pipeline (native.c) has one path whatever the storage.
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

#include "core/err.h"

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

/* ---- sources: sample index -> bytes ------------------------------------------ */

typedef struct fl_source fl_source;

/* What fl_source_get hands back for one sample.  `data` points either into
 * the caller's fl_bytes (a copy) or into memory the source owns (a view,
 * e.g. an LMDB page or a memory map), valid until the next get on the same
 * thread state or until that state is closed.  With pixels = 1 the bytes
 * are already-decoded HWC uint8 pixels of width x height x channels (1 or
 * 3), rows packed, and the pipeline renders them without a decode.  With
 * has_label = 1 the sample carries its own label (a stream's records),
 * which the pipeline uses instead of the dataset's label table.  With
 * has_key = 1 the sample's random draws are keyed by `key` instead of its
 * index (a stream's record: which sample of which shard it is, so a sample
 * gets the same augmentation wherever a topology puts it). */
typedef struct {
    const uint8_t *data;
    size_t len;
    int pixels;
    int width, height, channels;
    int has_label;
    int64_t label;
    int has_key;
    uint64_t key;
} fl_sample_bytes;

typedef struct {
    const char *kind;   /* "files", "lmdb", "array": for messages and stats */
    /* Per-thread state (a read transaction, a cursor); *tls may be left
     * NULL when the kind needs none, and the op itself may be NULL (as may
     * thread_close).  0, or -1 with err filled.  Each state
     * is used by one thread at a time.  No GIL. */
    int (*thread_open)(fl_source *s, void **tls, fl_err *err);
    void (*thread_close)(fl_source *s, void *tls);   /* NULL-safe tls; no GIL */
    /* The bytes of sample `index` (0 <= index < s->n, checked by the
     * caller) for the loader's epoch `epoch` (a stream refuses a stale
     * epoch's request rather than hand it the next epoch's sample; other
     * kinds ignore it), copied into `buf` (grown as needed, at most
     * max_bytes) or viewed in place; `out` filled (zero what you do not
     * set).  0, or -1 with err filled by the rules at the top of this file
     * (the message holds the reason only).  No GIL; any thread, with that
     * thread's state. */
    int (*get)(fl_source *s, void *tls, int64_t index, uint64_t epoch, fl_bytes *buf, size_t max_bytes,
               fl_sample_bytes *out, fl_err *err);
    /* Optional (may be NULL): what messages call the sample the last get on
     * this thread state returned (for a stream: "SHARD_URL: KEY"), written
     * to buf (NUL-terminated, cut to n).  Returns 1 when written, 0 when
     * the caller names the sample itself (files: the binding knows the
     * path).  No GIL. */
    int (*describe)(fl_source *s, void *tls, int64_t index, char *buf, size_t n);
    /* Optional: the pipeline will never get `index` for `epoch` (its batch
     * stopped at an earlier sample's failure), so a stream can drop it
     * instead of holding it for ever.  No GIL; any thread. */
    void (*discard)(fl_source *s, int64_t index, uint64_t epoch);
    /* Free everything the source owns (called by the last fl_source_unref). */
    void (*destroy)(fl_source *s);
} fl_source_ops;

/* The common head of every source kind (a kind embeds it first). */
struct fl_source {
    const fl_source_ops *ops;
    int64_t n;            /* samples */
    _Atomic long refs;    /* fl_source_ref / fl_source_unref */
};

/* Initialise the head of a new source with one reference.  Pure. */
void fl_source_init(fl_source *s, const fl_source_ops *ops, int64_t n);

/* Take / drop a reference (any thread, no GIL); the last unref destroys
 * the source.  NULL-safe.  fl_source_ref returns s. */
fl_source *fl_source_ref(fl_source *s);
void fl_source_unref(fl_source *s);

/* A source over n files on disk: takes ownership of `paths` (n malloc'd
 * NUL-terminated strings in a malloc'd array; freed by the source, also
 * when this fails).  Each get is fl_source_read_file.  NULL when out of
 * memory.  No GIL. */
fl_source *fl_source_files_new(char **paths, int64_t n);

/* The path of sample i of a files source, or NULL for another kind.  Pure. */
const char *fl_source_files_path(const fl_source *s, int64_t i);

/* Another image format Pillow may read (PNG, GIF, BMP, TIFF, WebP, PPM),
 * judged by its first bytes?  Pure.  Here, not in image/, because the
 * shard reader asks it of a member before any decoder sees it. */
int fl_source_maybe_other_image(const uint8_t *d, size_t n);

/* Of those, one the native decoders leave to Pillow (not a PNG, not a still
 * WebP: GIF, BMP, TIFF, PPM, a WebP whose VP8X header says "animated"),
 * judged by its first bytes as image/codecs.c judges it?  Pure.  The shard
 * reader keeps a copy only of these, for the Pillow fix-up to read back. */
int fl_source_pillow_only(const uint8_t *d, size_t n);

#endif
