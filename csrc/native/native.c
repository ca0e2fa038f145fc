/* native.c: one batch of the native image pipeline (see native.h).
 *
 * Per sample: read the file into the worker's buffer; plan the sample's
 * random decisions from (seed, epoch, index) on the full-size geometry
 * (so the plan never depends on how we decode); decode only the region the
 * plan needs, at a reduced libjpeg scale when dct_scaling allows it; render
 * into the sample's slot.  Nothing here allocates per sample once the
 * worker's buffers have grown to the largest image seen.
 */
#include "native/native.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/engine.h"
#include "sources/source.h"
#include "core/rng.h"

/* A worker keeps its file and region buffers between samples up to this
 * size; a larger one (an outsized image) is freed after its sample, so one
 * such file does not hold memory for the worker's life. */
#define FL_KEEP_BYTES ((size_t)64 << 20)

void
fl_native_ds_clear(fl_native_ds *ds)
{
    fl_source_unref(ds->src);
    free(ds->labels);
    ds->src = NULL;
    ds->labels = NULL;
}

void
fl_native_sample_shape(const fl_tspec *t, int64_t shape[3])
{
    if (t->layout == FL_LAYOUT_CHW) {
        shape[0] = t->out_channels;
        shape[1] = t->out_h;
        shape[2] = t->out_w;
    } else {
        shape[0] = t->out_h;
        shape[1] = t->out_w;
        shape[2] = t->out_channels;
    }
}

DLDataType
fl_native_sample_dltype(const fl_tspec *t)
{
    DLDataType d = {kDLUInt, 8, 1};
    switch (t->dtype) {
    case FL_DT_F16: d.code = kDLFloat; d.bits = 16; break;
    case FL_DT_BF16: d.code = kDLBfloat; d.bits = 16; break;
    case FL_DT_F32: d.code = kDLFloat; d.bits = 32; break;
    default: break;
    }
    return d;
}

fl_native_worker *
fl_native_worker_new(const fl_native_ds *ds)
{
    fl_native_worker *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->jpeg = fl_jpeg_new();
    w->imgdec = fl_imgdec_new();
    if (!w->jpeg || !w->imgdec) {
        fl_jpeg_free(w->jpeg);
        fl_imgdec_free(w->imgdec);
        free(w);
        return NULL;
    }
    if (ds->max_pixels) {
        fl_jpeg_set_limits(w->jpeg, ds->max_pixels, FL_JPEG_DEFAULT_MAX_SCANS);
        fl_imgdec_set_max_pixels(w->imgdec, ds->max_pixels);
    }
    w->src = fl_source_ref(ds->src);
    return w;
}

void
fl_native_worker_free(fl_native_worker *w)
{
    if (!w)
        return;
    fl_jpeg_free(w->jpeg);
    fl_imgdec_free(w->imgdec);
    if (w->src_open && w->src->ops->thread_close)
        w->src->ops->thread_close(w->src, w->src_tls);
    fl_source_unref(w->src);
    fl_bytes_free(&w->file);
    fl_bytes_free(&w->pix);
    fl_scratch_free(&w->scratch);
    free(w);
}

int
fl_native_choose_scale(int box_w, int box_h, int rs_w, int rs_h)
{
    /* Only 1/8, 2/8 and 4/8 have fast (SIMD or trivial) inverse DCTs in
     * libjpeg-turbo 2.1; 3/8, 5/8, 6/8 and 7/8 are plain C and measured
     * slower than a full-size decode (benchmarks/bench_decode_scale.py). */
    static const int fast[] = {1, 2, 4};
    for (int i = 0; i < 3; i++) {
        int m = fast[i];
        if ((int64_t)box_w * m >= (int64_t)rs_w * 8 && (int64_t)box_h * m >= (int64_t)rs_h * 8)
            return m;
    }
    return 8;
}

/* Free the worker's file and region buffers when an outsized sample grew
 * them past FL_KEEP_BYTES (the next sample grows them again as needed). */
static void
release_outsized(fl_native_worker *w)
{
    fl_bytes_trim(&w->file, FL_KEEP_BYTES);
    fl_bytes_trim(&w->pix, FL_KEEP_BYTES);
    fl_imgdec_trim(w->imgdec, FL_KEEP_BYTES);
}

/* Render already-decoded HWC uint8 pixels (a source that stores images
 * decoded, such as an array of images): plan on their size and render the
 * plan's window; no decode.  0, or -1 with err filled.  No GIL. */
static int
render_pixels(fl_native_worker *w, const fl_native_ds *ds, int64_t index, uint64_t seed, uint64_t epoch,
              const fl_sample_bytes *sb, void *out, fl_err *err, uint64_t t1)
{
    /* 1 or 3 channels, whatever the transform makes: fl_render converts as
     * Pillow's convert("L") / convert("RGB") would (as for render_array) */
    if (sb->width <= 0 || sb->height <= 0 || (sb->channels != 1 && sb->channels != 3) ||
        sb->len < (size_t)sb->width * (size_t)sb->height * (size_t)sb->channels) {
        err->code = FL_ERR_INVALID;
        snprintf(err->msg, sizeof err->msg, "pixels of %dx%dx%d do not fit %zu bytes (or channels not 1 or 3)",
                 sb->width, sb->height, sb->channels, sb->len);
        return -1;
    }
    fl_plan plan;
    if (fl_plan_sample(&ds->spec, sb->width, sb->height, seed, epoch, (uint64_t)index, &plan, err) < 0)
        return -1;
    size_t stride = (size_t)sb->width * (size_t)sb->channels;
    fl_view view = {sb->data, sb->width, sb->height, stride, sb->channels, 0.0, 0.0, 1.0, 1.0};
    if (fl_render(&ds->spec, &plan, &view, out, &w->scratch, err) < 0)
        return -1;
    if (ds->timing)
        w->render_ns += fl_now_ns() - t1;
    w->samples++;
    return 0;
}

/* A PNG or still WebP: decode the whole image (1 or 3 channels, as the
 * spec's output) into the worker's pixel buffer, then plan and render as
 * render_pixels does.  Returns 0, 1 for an animated WebP (Pillow's: the
 * first frame; fl_source_pillow_only reads the same VP8X flag as libwebp's
 * has_animation), or -1 with err filled.  No GIL. */
static int
decode_other(fl_native_worker *w, const fl_native_ds *ds, const uint8_t *data, size_t len, int64_t index,
             uint64_t seed, uint64_t epoch, void *out, fl_err *err, uint64_t t1)
{
    /* an animated WebP is Pillow's (the rule the shard reader keeps copies by) */
    if (fl_source_pillow_only(data, len))
        return 1;
    fl_img_info info;
    if (fl_imgdec_info(w->imgdec, data, len, &info, err) < 0)
        goto fail;
    int ch = ds->spec.out_channels == 1 ? 1 : 3;
    /* the pixel limit (the worker's decoder has the dataset's) before the buffer grows */
    if (fl_imgdec_check_limit(w->imgdec, &info, err) < 0)
        goto fail;
    size_t stride = (size_t)info.width * (size_t)ch;
    if (fl_bytes_reserve(&w->pix, stride * (size_t)info.height) < 0) {
        err->code = FL_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg, "out of memory for a %dx%d image", info.width, info.height);
        goto fail;
    }
    if (fl_imgdec_decode(w->imgdec, data, len, ch == 1 ? FL_IMG_L : FL_IMG_RGB, w->pix.data, stride, err) < 0)
        goto fail;
    uint64_t t2 = ds->timing ? fl_now_ns() : 0;
    w->decode_ns += t2 - t1;
    fl_sample_bytes sb;
    memset(&sb, 0, sizeof sb);
    sb.data = w->pix.data;
    sb.len = stride * (size_t)info.height;
    sb.pixels = 1;
    sb.width = info.width;
    sb.height = info.height;
    sb.channels = ch;
    return render_pixels(w, ds, index, seed, epoch, &sb, out, err, t2);
fail:
    if (ds->timing)
        w->decode_ns += fl_now_ns() - t1;
    return -1;
}

static int decode_render(fl_native_worker *w, const fl_native_ds *ds, const uint8_t *data, long long len,
                         int64_t index, uint64_t seed, uint64_t epoch, void *out, fl_err *err, uint64_t t1);

/* fl_native_load_one without the buffer trim. */
static int
load_one(fl_native_worker *w, const fl_native_ds *ds, int64_t index, uint64_t seed, uint64_t epoch, void *out,
         fl_err *err)
{
    const int timing = ds->timing;
    uint64_t t0 = timing ? fl_now_ns() : 0;
    fl_source *src = ds->src;
    if (!w->src_open) {
        if (src->ops->thread_open && src->ops->thread_open(src, &w->src_tls, err) < 0)
            return -1;
        w->src_open = 1;
    }
    fl_sample_bytes sb;
    memset(&sb, 0, sizeof sb);
    w->has_label = 0;
    int grc = src->ops->get(src, w->src_tls, index, epoch, &w->file, FL_SOURCE_MAX_FILE_BYTES, &sb, err);
    if (grc == 0) {
        w->bytes_read += (uint64_t)sb.len;
        w->has_label = sb.has_label;
        w->label = sb.label;
    }
    uint64_t t1 = timing ? fl_now_ns() : 0;
    w->read_ns += t1 - t0;
    if (grc < 0)
        return -1;
    /* the random draws' key: the index, or the sample's own (a stream's record) */
    int64_t key = sb.has_key ? (int64_t)sb.key : index;
    if (sb.pixels)
        return render_pixels(w, ds, key, seed, epoch, &sb, out, err, t1);
    return decode_render(w, ds, sb.data, (long long)sb.len, key, seed, epoch, out, err, t1);
}

/* The part of load_one after the read: check the bytes are a JPEG (or
 * hand a PNG or WebP to decode_other), plan,
 * decode the region, render.  Same returns as fl_native_load_one; t1 is
 * when the read ended (for the stage clocks).  No GIL. */
static int
decode_render(fl_native_worker *w, const fl_native_ds *ds, const uint8_t *data, long long len, int64_t index,
              uint64_t seed, uint64_t epoch, void *out, fl_err *err, uint64_t t1)
{
    const int timing = ds->timing;
    if (len == 0) {
        err->code = FL_ERR_DECODE;
        snprintf(err->msg, sizeof err->msg, "empty file (0 bytes)");
        return -1;
    }
    if (len < 2 || data[0] != 0xFF || data[1] != 0xD8) {
        int fmt = fl_img_format(data, (size_t)len);
        if (fmt == FL_IMG_PNG || fmt == FL_IMG_WEBP)
            return decode_other(w, ds, data, (size_t)len, index, seed, epoch, out, err, t1);
        if (fl_source_maybe_other_image(data, (size_t)len))
            return 1;
        err->code = FL_ERR_DECODE;
        snprintf(err->msg, sizeof err->msg, "not a JPEG file (starts with 0x%02x 0x%02x)", data[0],
                 len > 1 ? data[1] : 0);
        return -1;
    }
    fl_jpeg_info info;
    fl_err jerr;
    fl_err_clear(&jerr);
    if (fl_jpeg_read_header(w->jpeg, data, (size_t)len, &info, &jerr) < 0)
        goto jpeg_error;
    /* the pixel limit, before anything image-sized is allocated */
    if (fl_jpeg_check_limits(w->jpeg, &info, &jerr) < 0)
        goto jpeg_error;
    fl_plan plan;
    if (fl_plan_sample(&ds->spec, info.width, info.height, seed, epoch, (uint64_t)index, &plan, err) < 0)
        return -1;
    /* region in source pixels: exactly what the render reads (the crop box
     * for RandomResizedCrop, the filter support of the centre window for
     * Resize + CenterCrop), so nothing else is decoded */
    int m = 8;
    if (ds->dct_scaling)
        m = fl_native_choose_scale(plan.box_w, plan.box_h, plan.rs_w, plan.rs_h);
    int wx0, wy0, wx1, wy1;
    fl_plan_source_window(&ds->spec, &plan, info.width, info.height, &wx0, &wy0, &wx1, &wy1);
    int sw, sh;
    fl_jpeg_scaled_size(&info, m, &sw, &sh);
    double fx = (double)sw / info.width, fy = (double)sh / info.height;
    int x0 = (int)floor(wx0 * fx), y0 = (int)floor(wy0 * fy);
    int x1 = (int)ceil(wx1 * fx), y1 = (int)ceil(wy1 * fy);
    if (x1 > sw)
        x1 = sw;
    if (y1 > sh)
        y1 = sh;
    if (x1 <= x0)
        x1 = x0 + 1;
    if (y1 <= y0)
        y1 = y0 + 1;
    int ch = ds->spec.out_channels == 1 ? 1 : 3;
    fl_jpeg_region reg = {ch, m, x0, y0, x1 - x0, y1 - y0};
    /* rows as wide as the scaled image: libjpeg's cropped window lands in
     * them as it is, and the view starts at the region's column in it */
    size_t stride = (size_t)sw * (size_t)ch, col = 0;
    if (fl_bytes_reserve(&w->pix, stride * (size_t)reg.h) < 0) {
        err->code = FL_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg, "out of memory for a %dx%d region", reg.w, reg.h);
        return -1;
    }
    if (fl_jpeg_decode_wide(w->jpeg, data, (size_t)len, &reg, w->pix.data, stride, &col, &jerr) < 0)
        goto jpeg_error;
    uint64_t t2 = timing ? fl_now_ns() : 0;
    w->decode_ns += t2 - t1;
    fl_view view = {w->pix.data + col * (size_t)ch, reg.w, reg.h, stride, ch, (double)x0, (double)y0,
                    m == 8 ? 1.0 : fx, m == 8 ? 1.0 : fy};
    if (fl_render(&ds->spec, &plan, &view, out, &w->scratch, err) < 0)
        return -1;
    if (timing)
        w->render_ns += fl_now_ns() - t2;
    w->samples++;
    return 0;
jpeg_error:
    err->code = jerr.code ? jerr.code : FL_ERR_DECODE;
    snprintf(err->msg, sizeof err->msg, "%s", jerr.msg);
    if (timing)
        w->decode_ns += fl_now_ns() - t1;
    return -1;
}

int
fl_native_load_one(fl_native_worker *w, const fl_native_ds *ds, int64_t index, uint64_t seed, uint64_t epoch,
                   void *out, fl_err *err)
{
    int rc = load_one(w, ds, index, seed, epoch, out, err);
    release_outsized(w);
    return rc;
}

int
fl_native_render_encoded(fl_native_worker *w, const fl_native_ds *ds, const uint8_t *data, size_t len,
                         int64_t index, uint64_t seed, uint64_t epoch, void *out, fl_err *err)
{
    int rc = decode_render(w, ds, data, (long long)len, index, seed, epoch, out, err,
                           ds->timing ? fl_now_ns() : 0);
    release_outsized(w);
    return rc;
}

int
fl_native_render_decoded(fl_native_worker *w, const fl_native_ds *ds, const uint8_t *pixels, int width,
                         int height, int channels, int64_t index, uint64_t seed, uint64_t epoch, void *out,
                         fl_err *err)
{
    fl_sample_bytes sb;
    memset(&sb, 0, sizeof sb);
    sb.data = pixels;
    sb.len = (size_t)width * (size_t)height * (size_t)channels;
    sb.pixels = 1;
    sb.width = width;
    sb.height = height;
    sb.channels = channels;
    return render_pixels(w, ds, index, seed, epoch, &sb, out, err, ds->timing ? fl_now_ns() : 0);
}

/* Append an event.  Returns 0, or -1 when out of memory: the batch is then
 * marked failed and events_lost, since a lost fix-up or error event would
 * deliver a wrong batch (the binding raises MemoryError for it). */
int
fl_native_replacements(const fl_native_ds *ds, int64_t index, uint64_t seed, uint64_t epoch, int64_t *out)
{
    fl_rng r;
    int n = 0;
    fl_rng_init(&r, seed ^ 0x5eed5eed5eed5eedull, epoch, (uint64_t)index);
    for (int t = 0; t < FL_NATIVE_REPLACE_TRIES; t++) {
        int64_t alt = (int64_t)fl_rng_below(&r, (uint64_t)ds->n);
        if (alt != index)
            out[n++] = alt;
    }
    return n;
}

static int
add_event(fl_native_batch *b, int kind, int64_t index, int64_t by, const fl_err *err)
{
    int n = b->nevents + 1;
    fl_native_event *ev = realloc(b->events, (size_t)n * sizeof *ev);
    if (!ev)
        goto nomem;
    b->events = ev;
    int *k = realloc(b->event_kind, (size_t)n * sizeof *k);
    if (!k)
        goto nomem;
    b->event_kind = k;
    fl_native_event *e = &b->events[n - 1];
    memset(e, 0, sizeof *e);
    e->index = index;
    e->by = by;
    if (err) {
        e->code = err->code;
        e->errnum = err->errnum;
        snprintf(e->msg, sizeof e->msg, "%s", err->msg);
    }
    b->event_kind[n - 1] = kind;
    b->nevents = n;
    return 0;
nomem:
    b->failed = 1;
    b->events_lost = 1;
    return -1;
}

/* The label of the sample the worker just loaded: its own (a stream's
 * record) or the dataset's table entry.  No GIL. */
static int64_t
sample_label(const fl_native_worker *w, const fl_native_ds *ds, int64_t idx)
{
    return w->has_label ? w->label : ds->labels[idx];
}

/* Prefix err's message with the source's name for the sample just loaded,
 * when the source names its samples (a stream: shard and key); files are
 * named by the binding from the index.  No GIL. */
static void
name_sample(fl_native_worker *w, const fl_native_ds *ds, int64_t idx, fl_err *err)
{
    char name[256];
    if (!ds->src->ops->describe || !ds->src->ops->describe(ds->src, w->src_tls, idx, name, sizeof name))
        return;
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg, "%s: %.*s", name, (int)(sizeof msg - 1 - strlen(name) - 2), err->msg);
    memcpy(err->msg, msg, sizeof msg);
}

/* Tell a stream source that indices[from, count) will not be asked for
 * (the batch stopped early), so it drops them rather than hold them.  No
 * GIL. */
static void
discard_rest(const fl_native_ds *ds, const int64_t *indices, int from, int count, uint64_t epoch)
{
    if (!ds->src->ops->discard)
        return;
    for (int j = from; j < count; j++)
        if (indices[j] >= 0 && indices[j] < ds->n)
            ds->src->ops->discard(ds->src, indices[j], epoch);
}

fl_native_batch *
fl_native_load_batch(fl_native_worker *w, const fl_native_ds *ds, fl_pool *pool, const int64_t *indices, int count,
                     uint64_t seed, uint64_t epoch, const atomic_int *cancelled)
{
    fl_native_batch *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    /* The pool first: fl_native_batch_free gives `images` back to it. */
    b->pool = pool;
    b->labels = malloc(sizeof(int64_t) * (size_t)(count > 0 ? count : 1));
    b->images = fl_pool_get(pool);
    if (!b->labels || !b->images) {
        fl_err e = {FL_ERR_NOMEM, "out of memory allocating a batch"};
        b->failed = 1;
        add_event(b, FL_EV_ERROR, count > 0 ? indices[0] : -1, -1, &e);
        discard_rest(ds, indices, 0, count, epoch);
        return b;
    }
    size_t sb = ds->sample_bytes;
    int k = 0;
    int attempted = 0;   /* indices[0, attempted) were asked of the source */
    for (int i = 0; i < count && !b->failed; i++) {
        if (cancelled && atomic_load_explicit(cancelled, memory_order_relaxed)) {
            b->cancelled = 1;
            break;
        }
        int64_t idx = indices[i];
        attempted = i + 1;
        void *slot = (char *)b->images + sb * (size_t)k;
        fl_err err;
        fl_err_clear(&err);
        if (idx < 0 || idx >= ds->n) {
            err.code = FL_ERR_INDEX;
            snprintf(err.msg, sizeof err.msg, "sample index %lld out of range for a dataset of %lld",
                     (long long)idx, (long long)ds->n);
            b->failed = 1;
            add_event(b, FL_EV_ERROR, idx, -1, &err);
            break;
        }
        int rc = fl_native_load_one(w, ds, idx, seed, epoch, slot, &err);
        if (rc == 1) { /* another format: the binding decodes it with Pillow */
            memset(slot, 0, sb);
            add_event(b, FL_EV_FIXUP, idx, k, NULL);
            b->labels[k++] = sample_label(w, ds, idx);
            continue;
        }
        if (rc == 0) {
            b->labels[k++] = sample_label(w, ds, idx);
            continue;
        }
        name_sample(w, ds, idx, &err);
        /* an index outside the dataset is the sampler's bug, never a bad
         * file to skip; anything else (out of memory for one outsized
         * image too) follows on_error */
        if (ds->on_error == FL_ON_ERROR_RAISE || err.code == FL_ERR_INDEX) {
            b->failed = 1;
            add_event(b, FL_EV_ERROR, idx, -1, &err);
            break;
        }
        if (ds->on_error == FL_ON_ERROR_SKIP) {
            add_event(b, FL_EV_SKIPPED, idx, -1, &err);
            continue;
        }
        /* replace: deterministic substitutes keyed by (seed, epoch, idx) */
        int64_t alts[FL_NATIVE_REPLACE_TRIES];
        int nalt = fl_native_replacements(ds, idx, seed, epoch, alts);
        int done = 0;
        for (int t = 0; t < nalt && !done; t++) {
            int64_t alt = alts[t];
            fl_err aerr = {0, ""};
            int arc = fl_native_load_one(w, ds, alt, seed, epoch, slot, &aerr);
            if (arc == 0 || arc == 1) {
                add_event(b, FL_EV_REPLACED, idx, alt, &err);
                if (arc == 1) {
                    memset(slot, 0, sb);
                    add_event(b, FL_EV_FIXUP, alt, k, NULL);
                }
                b->labels[k++] = sample_label(w, ds, alt);
                done = 1;
            }
        }
        if (!done) {
            snprintf(err.msg + strlen(err.msg), sizeof err.msg - strlen(err.msg),
                     " (and %d replacement candidates failed too)", nalt);
            b->failed = 1;
            add_event(b, FL_EV_ERROR, idx, -1, &err);
            break;
        }
    }
    b->n = k;
    discard_rest(ds, indices, attempted, count, epoch);
    return b;
}

void
fl_native_batch_free(fl_native_batch *b)
{
    if (!b)
        return;
    if (b->images)
        fl_pool_put(b->pool, b->images);
    free(b->labels);
    free(b->events);
    free(b->event_kind);
    free(b);
}
