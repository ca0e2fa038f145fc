/* native.c: one batch of the native image pipeline (see native.h).
 *
 * Per sample: read the file into the worker's buffer; plan the sample's
 * random decisions from (seed, epoch, index) on the full-size geometry
 * (so the plan never depends on how we decode); decode only the region the
 * plan needs, at a reduced libjpeg scale when dct_scaling allows it; render
 * into the sample's slot.  Nothing here allocates per sample once the
 * worker's buffers have grown to the largest image seen.
 */
#include "native.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"
#include "rng.h"

/* Files larger than this are refused rather than read (no JPEG that passes
 * the pixel limit needs more). */
#define FL_MAX_FILE_BYTES ((size_t)1 << 30)
/* How many other samples "replace" tries before giving up. */
#define FL_REPLACE_TRIES 16

fl_native_worker *
fl_native_worker_new(const fl_native_ds *ds)
{
    fl_native_worker *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->jpeg = fl_jpeg_new();
    if (!w->jpeg) {
        free(w);
        return NULL;
    }
    if (ds->max_pixels)
        fl_jpeg_set_limits(w->jpeg, ds->max_pixels, FL_JPEG_DEFAULT_MAX_SCANS);
    return w;
}

void
fl_native_worker_free(fl_native_worker *w)
{
    if (!w)
        return;
    fl_jpeg_free(w->jpeg);
    free(w->file);
    free(w->pix);
    fl_scratch_free(&w->scratch);
    free(w);
}

static int
grow(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 1 << 16;
    while (n < need)
        n *= 2;
    uint8_t *p = realloc(*buf, n);
    if (!p)
        return -1;
    *buf = p;
    *cap = n;
    return 0;
}

/* Read a whole file into w->file.  Returns its length, or -1 with err set. */
static long long
read_file(fl_native_worker *w, const char *path, fl_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        err->code = FL_ERR_IO;
        snprintf(err->msg, sizeof err->msg, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        err->code = FL_ERR_IO;
        snprintf(err->msg, sizeof err->msg, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    if (size > FL_MAX_FILE_BYTES) {
        err->code = FL_ERR_LIMIT;
        snprintf(err->msg, sizeof err->msg, "%s: file of %zu bytes exceeds the 1 GiB limit", path, size);
        close(fd);
        return -1;
    }
    if (grow(&w->file, &w->file_cap, size + 1) < 0) {
        err->code = FL_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg, "%s: out of memory reading %zu bytes", path, size);
        close(fd);
        return -1;
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = pread(fd, w->file + got, size - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            err->code = FL_ERR_IO;
            snprintf(err->msg, sizeof err->msg, "%s: read failed: %s", path, r < 0 ? strerror(errno) : "file shrank");
            close(fd);
            return -1;
        }
        got += (size_t)r;
    }
    close(fd);
    w->bytes_read += got;
    return (long long)got;
}

/* Another image format Pillow may read (PNG, GIF, BMP, TIFF, WebP, PPM)? */
static int
maybe_other_image(const uint8_t *d, size_t n)
{
    if (n >= 8 && memcmp(d, "\x89PNG\r\n\x1a\n", 8) == 0)
        return 1;
    if (n >= 6 && (memcmp(d, "GIF87a", 6) == 0 || memcmp(d, "GIF89a", 6) == 0))
        return 1;
    if (n >= 2 && d[0] == 'B' && d[1] == 'M')
        return 1;
    if (n >= 4 && (memcmp(d, "II*\0", 4) == 0 || memcmp(d, "MM\0*", 4) == 0))
        return 1;
    if (n >= 12 && memcmp(d, "RIFF", 4) == 0 && memcmp(d + 8, "WEBP", 4) == 0)
        return 1;
    if (n >= 2 && d[0] == 'P' && d[1] >= '1' && d[1] <= '6')
        return 1;
    return 0;
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

int
fl_native_load_one(fl_native_worker *w, const fl_native_ds *ds, int64_t index, uint64_t seed, uint64_t epoch,
                   void *out, fl_err *err)
{
    const char *path = ds->paths[index];
    const int timing = ds->timing;
    uint64_t t0 = timing ? fl_now_ns() : 0;
    long long len = read_file(w, path, err);
    uint64_t t1 = timing ? fl_now_ns() : 0;
    w->read_ns += t1 - t0;
    if (len < 0)
        return -1;
    const uint8_t *data = w->file;
    if (len == 0) {
        err->code = FL_ERR_DECODE;
        snprintf(err->msg, sizeof err->msg, "%s: empty file (0 bytes)", path);
        return -1;
    }
    if (len < 2 || data[0] != 0xFF || data[1] != 0xD8) {
        if (maybe_other_image(data, (size_t)len))
            return 1;
        err->code = FL_ERR_DECODE;
        snprintf(err->msg, sizeof err->msg, "%s: not a JPEG file (starts with 0x%02x 0x%02x)", path, data[0],
                 len > 1 ? data[1] : 0);
        return -1;
    }
    fl_jpeg_info info;
    fl_err jerr = {0, ""};
    if (fl_jpeg_read_header(w->jpeg, data, (size_t)len, &info, &jerr) < 0)
        goto jpeg_error;
    fl_plan plan;
    char msg[256];
    if (fl_plan_sample(&ds->spec, info.width, info.height, seed, epoch, (uint64_t)index, &plan, msg, sizeof msg) < 0) {
        err->code = FL_ERR_DECODE;
        snprintf(err->msg, sizeof err->msg, "%s: %s", path, msg);
        return -1;
    }
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
    size_t stride = (size_t)reg.w * (size_t)ch;
    if (grow(&w->pix, &w->pix_cap, stride * (size_t)reg.h) < 0) {
        err->code = FL_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg, "%s: out of memory for a %dx%d region", path, reg.w, reg.h);
        return -1;
    }
    if (fl_jpeg_decode(w->jpeg, data, (size_t)len, &reg, w->pix, stride, &jerr) < 0)
        goto jpeg_error;
    uint64_t t2 = timing ? fl_now_ns() : 0;
    w->decode_ns += t2 - t1;
    fl_view view = {w->pix, reg.w, reg.h, stride, ch, (double)x0, (double)y0, m == 8 ? 1.0 : fx, m == 8 ? 1.0 : fy};
    if (fl_render(&ds->spec, &plan, &view, out, &w->scratch, msg, sizeof msg) < 0) {
        err->code = FL_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg, "%s: %s", path, msg);
        return -1;
    }
    if (timing)
        w->render_ns += fl_now_ns() - t2;
    w->samples++;
    return 0;
jpeg_error:
    err->code = jerr.code ? jerr.code : FL_ERR_DECODE;
    /* path and reason may not both fit: the path is cut first, then the
     * reason (a truncated message is still a clear one) */
    if (snprintf(err->msg, sizeof err->msg, "%.*s: %s", (int)(sizeof err->msg / 2), path, jerr.msg) >=
        (int)sizeof err->msg)
        err->msg[sizeof err->msg - 1] = '\0';
    if (timing)
        w->decode_ns += fl_now_ns() - t1;
    return -1;
}

static int
add_event(fl_native_batch *b, int kind, int64_t index, int64_t by, const fl_err *err)
{
    int n = b->nevents + 1;
    fl_native_event *ev = realloc(b->events, (size_t)n * sizeof *ev);
    if (!ev)
        return -1;
    b->events = ev;
    int *k = realloc(b->event_kind, (size_t)n * sizeof *k);
    if (!k)
        return -1;
    b->event_kind = k;
    fl_native_event *e = &b->events[n - 1];
    memset(e, 0, sizeof *e);
    e->index = index;
    e->by = by;
    if (err) {
        e->code = err->code;
        snprintf(e->msg, sizeof e->msg, "%s", err->msg);
    }
    b->event_kind[n - 1] = kind;
    b->nevents = n;
    return 0;
}

fl_native_batch *
fl_native_load_batch(fl_native_worker *w, const fl_native_ds *ds, fl_pool *pool, const int64_t *indices, int count,
                     uint64_t seed, uint64_t epoch, const atomic_int *cancelled)
{
    fl_native_batch *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->labels = malloc(sizeof(int64_t) * (size_t)(count > 0 ? count : 1));
    b->images = fl_pool_get(pool);
    if (!b->labels || !b->images) {
        fl_err e = {FL_ERR_NOMEM, "out of memory allocating a batch"};
        b->failed = 1;
        add_event(b, FL_EV_ERROR, count > 0 ? indices[0] : -1, -1, &e);
        return b;
    }
    b->pool = pool;
    size_t sb = ds->sample_bytes;
    int k = 0;
    for (int i = 0; i < count; i++) {
        if (cancelled && atomic_load_explicit(cancelled, memory_order_relaxed)) {
            b->cancelled = 1;
            break;
        }
        int64_t idx = indices[i];
        void *slot = (char *)b->images + sb * (size_t)k;
        fl_err err = {0, ""};
        if (idx < 0 || idx >= ds->n) {
            err.code = FL_ERR_DECODE;
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
            b->labels[k++] = ds->labels[idx];
            continue;
        }
        if (rc == 0) {
            b->labels[k++] = ds->labels[idx];
            continue;
        }
        if (ds->on_error == FL_ON_ERROR_RAISE || err.code == FL_ERR_NOMEM) {
            b->failed = 1;
            add_event(b, FL_EV_ERROR, idx, -1, &err);
            break;
        }
        if (ds->on_error == FL_ON_ERROR_SKIP) {
            add_event(b, FL_EV_SKIPPED, idx, -1, &err);
            continue;
        }
        /* replace: deterministic substitutes keyed by (seed, epoch, idx) */
        fl_rng r;
        fl_rng_init(&r, seed ^ 0x5eed5eed5eed5eedull, epoch, (uint64_t)idx);
        int done = 0;
        for (int t = 0; t < FL_REPLACE_TRIES && !done; t++) {
            int64_t alt = (int64_t)fl_rng_below(&r, (uint64_t)ds->n);
            if (alt == idx)
                continue;
            fl_err aerr = {0, ""};
            int arc = fl_native_load_one(w, ds, alt, seed, epoch, slot, &aerr);
            if (arc == 0 || arc == 1) {
                add_event(b, FL_EV_REPLACED, idx, alt, &err);
                if (arc == 1) {
                    memset(slot, 0, sb);
                    add_event(b, FL_EV_FIXUP, alt, k, NULL);
                }
                b->labels[k++] = ds->labels[alt];
                done = 1;
            }
        }
        if (!done) {
            snprintf(err.msg + strlen(err.msg), sizeof err.msg - strlen(err.msg),
                     " (and %d replacement candidates failed too)", FL_REPLACE_TRIES);
            b->failed = 1;
            add_event(b, FL_EV_ERROR, idx, -1, &err);
            break;
        }
    }
    b->n = k;
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
