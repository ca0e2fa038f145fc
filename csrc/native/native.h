/* native.h: the native image pipeline for one batch (no Python).
 *
 * A worker thread turns a list of sample indices into a finished batch:
 * get each sample's bytes from the dataset's source (source.h: a file read
 * into the worker's buffer, or a view of an LMDB value), decode the JPEG region
 * the sample needs (jpeg.c), render crop/resize/flip/normalize straight into
 * the sample's slot of the batch buffer (imgops.h: render.c), write its label.  Bad
 * files are handled by the dataset's on_error policy.  PNG and WebP files
 * are decoded whole (codecs.h) and rendered as JPEG's are; other formats
 * Pillow may read (GIF, BMP, TIFF, an animated WebP) are left for the
 * binding to decode with Pillow (a "fix-up"), since that needs Python.
 */
#ifndef FL_NATIVE_H
#define FL_NATIVE_H

#include <stdatomic.h>
#include <stdint.h>

#include "core/dlpack.h"
#include "image/codecs.h"
#include "image/imgops.h"
#include "image/jpeg.h"
#include "core/pool.h"
#include "sources/source.h"

enum { FL_ON_ERROR_RAISE = 0, FL_ON_ERROR_SKIP = 1, FL_ON_ERROR_REPLACE = 2 };

typedef struct {
    fl_source *src;       /* where the samples' bytes live (one reference owned) */
    int64_t *labels;      /* n labels (owned) */
    int64_t n;            /* == src->n */
    fl_tspec spec;
    int on_error;         /* FL_ON_ERROR_* */
    int dct_scaling;      /* may decode at a reduced libjpeg scale (M/8) */
    uint64_t max_pixels;
    size_t sample_bytes;  /* fl_tspec_sample_bytes(&spec) */
    int timing;           /* keep per-stage clocks for stats() (on unless FASTLOADER_STATS=0) */
} fl_native_ds;

/* Drop ds->src's reference and free ds->labels, and set them to NULL; the
 * rest of *ds is left as it is.  No GIL. */
void fl_native_ds_clear(fl_native_ds *ds);

/* The shape of one output sample: (C, H, W) or (H, W, C) as the spec's
 * layout says, written to shape[0..3).  Pure. */
void fl_native_sample_shape(const fl_tspec *t, int64_t shape[3]);

/* The DLPack dtype of the spec's output (uint8, float16, bfloat16,
 * float32).  Pure. */
DLDataType fl_native_sample_dltype(const fl_tspec *t);

/* Per-worker state: decoder, source state, byte and decode buffers, render
 * scratch.  Tied to one dataset (its source) and used by one thread at a time. */
typedef struct {
    fl_jpeg *jpeg;
    fl_imgdec *imgdec; /* PNG and WebP */
    fl_source *src;  /* a reference to the dataset's source */
    void *src_tls;   /* its per-thread state, opened at the first sample */
    int src_open;    /* 1 once thread_open succeeded */
    int has_label;   /* the last sample came with its own label (a stream's record) */
    int64_t label;
    fl_bytes file;   /* the sample's encoded bytes (source.h) */
    fl_bytes pix;    /* the decoded region */
    fl_scratch scratch;
    /* stage counters (ns, bytes), for stats() */
    uint64_t read_ns, decode_ns, render_ns, bytes_read, samples;
} fl_native_worker;

/* Create / destroy worker state (free closes the source state on the
 * calling thread).  NULL on out-of-memory.  No GIL. */
fl_native_worker *fl_native_worker_new(const fl_native_ds *ds);
void fl_native_worker_free(fl_native_worker *w);

typedef struct {
    int64_t index;        /* sample index that failed (or was replaced / needs Python) */
    int64_t by;           /* replacement index, or the batch slot for a fix-up; -1 otherwise */
    int code;             /* FL_ERR_* */
    int errnum;           /* errno of an FL_ERR_IO failure, else 0 */
    char msg[FL_ERR_MSG_MAX]; /* the reason, without the file name (the binding adds it from the index:
                           * a long or non-UTF-8 path can then never cut or garble the reason) */
} fl_native_event;

enum { FL_EV_ERROR = 0, FL_EV_SKIPPED = 1, FL_EV_REPLACED = 2, FL_EV_FIXUP = 3 };

typedef struct {
    void *images;         /* from ds pool: n * sample_bytes used; owned until handed to a Buffer */
    fl_pool *pool;        /* pool `images` came from (NULL if images is NULL) */
    int64_t *labels;      /* malloc'd, n entries */
    int n;                /* samples in the batch (fewer than asked when skipping) */
    int failed;           /* 1: the batch failed; the last event says why, unless events_lost */
    int events_lost;      /* 1: out of memory while recording an event (the batch failed) */
    int cancelled;        /* 1: stopped early because the epoch was abandoned */
    int nevents;
    int *event_kind;      /* nevents entries */
    fl_native_event *events;
} fl_native_batch;

/* Load a batch of `count` samples.  Returns a new batch (never NULL unless
 * out of memory); its `failed` flag and events report problems.  `pool` gives
 * the image buffer (size >= count * sample_bytes).  Polls *cancelled between
 * samples.  No GIL. */
fl_native_batch *fl_native_load_batch(fl_native_worker *w, const fl_native_ds *ds, fl_pool *pool,
                                      const int64_t *indices, int count, uint64_t seed, uint64_t epoch,
                                      const atomic_int *cancelled);

/* Free a batch and everything it still owns (images go back to the pool).
 * NULL ok.  No GIL. */
void fl_native_batch_free(fl_native_batch *b);

/* Load one sample into `out` (sample_bytes).  Returns 0, 1 when the file is
 * not a JPEG, PNG or (still) WebP but might be another image format that
 * Pillow reads (nothing written), or -1 with
 * err filled (the reason; the caller names the file).  No GIL. */
int fl_native_load_one(fl_native_worker *w, const fl_native_ds *ds, int64_t index, uint64_t seed,
                       uint64_t epoch, void *out, fl_err *err);

/* One sample from bytes the caller holds rather than from ds->src (which
 * these two never touch; it may be NULL): the native call of a custom
 * dataset (py_native_call.c).  Same plan, region decode and render as
 * fl_native_load_one gives sample `index`, written to `out` (sample_bytes).
 * render_encoded takes encoded bytes (a JPEG, PNG or WebP): 0, 1 when they
 * are another image format Pillow may read (nothing written), or -1 with err
 * filled (the reason; the caller names the input).  render_decoded takes
 * HWC uint8 pixels, rows packed, 1 or 3 channels (converted as Pillow's
 * convert("L") / convert("RGB") would): 0, or -1 with err filled.  The
 * caller keeps the bytes alive for the call.  No GIL. */
int fl_native_render_encoded(fl_native_worker *w, const fl_native_ds *ds, const uint8_t *data, size_t len,
                             int64_t index, uint64_t seed, uint64_t epoch, void *out, fl_err *err);
int fl_native_render_decoded(fl_native_worker *w, const fl_native_ds *ds, const uint8_t *pixels, int width,
                             int height, int channels, int64_t index, uint64_t seed, uint64_t epoch, void *out,
                             fl_err *err);

/* How many other samples on_error="replace" tries before giving up. */
#define FL_NATIVE_REPLACE_TRIES 16

/* The substitutes on_error="replace" tries for a bad sample `index`, in
 * order: up to FL_NATIVE_REPLACE_TRIES indices (never `index` itself) drawn
 * from the counter-based RNG keyed by (seed, epoch, index), written to out
 * (caller-owned, FL_NATIVE_REPLACE_TRIES entries).  Returns how many.  The
 * one rule for every replacement, native or Pillow fix-up.  Pure; no GIL. */
int fl_native_replacements(const fl_native_ds *ds, int64_t index, uint64_t seed, uint64_t epoch, int64_t *out);

/* Choose the libjpeg scale (M over 8) for decoding `box` (source pixels)
 * that is then resized to rs_w x rs_h: the smallest fast M (1, 2 or 4; else
 * 8) with box * M / 8 >= the resized size on both axes.  Pure. */
int fl_native_choose_scale(int box_w, int box_h, int rs_w, int rs_h);

#endif
