/* fuzz_render.c: libFuzzer target "render" -- the transform path with
 * arbitrary parameters: an fl_tspec built from the input, then
 *   modes 0, 1: fl_native_load_one (and, with a flag, fl_native_load_batch)
 *               on the JPEG, which runs fl_plan_sample +
 *               fl_plan_source_window + the region/DCT-scaled fl_jpeg_decode +
 *               fl_render exactly as a native worker does (the file is
 *               handed over through a memfd path);
 *   mode 2:     fastloader._C._render with plan=None: the decoded image (or,
 *               when the JPEG does not decode, pixels made from the input) as
 *               an fl_view with a view_scale / view_origin from the input,
 *               fl_plan_sample, fl_render;
 *   mode 3:     fastloader._C._render with an explicit plan dict: a plan of
 *               arbitrary integers from the input, straight to fl_render.
 *
 * What the Python layer enforces, mirrored here (everything else reaches C):
 * the spec dict goes through fl_tspec_from_pydict, which ends with
 * fl_tspec_check (so any spec that passes fl_tspec_check is reachable), plus
 * "mean/std with 3 values need 3 channels" (irrelevant to C: only the first
 * out_channels values are read); NativeDataset also needs out_w/out_h > 0;
 * render() needs view_scale > 0 on both axes, an image of 1..FL_MAX_DIM rows
 * and columns with 1 or 3 channels, and an output size in 1..FL_MAX_DIM.
 * Specs that fail fl_tspec_check are still fed to fl_plan_sample and
 * fl_native_load_one, which must refuse them; they are never fed to
 * fl_render directly (its callers always check first; see docs/hardening.md).
 *
 * Input: FZ_RENDER_PARAMS (64) parameter bytes, then the JPEG file; the
 * parameter bytes are read in the order of build_spec() and the mode code,
 * and the last 12 of them may also add a timm RandAugment policy
 * (build_policy), the 4 before them a ColorJitter, the 4 before those a
 * RandomAffine and the 4 before those a GaussianBlur, so their draws and
 * the augmented render path meet the same contracts (a drawn blur sigma is
 * a float32 value in the spec's range, always there for p 1).
 *
 * Contracts checked (besides ASan/UBSan): errors carry a known code and a
 * message; an invalid spec is refused by fl_plan_sample and
 * fl_native_load_one; a plan from fl_plan_sample renders from the whole
 * image at scale 1; fl_plan_source_window lies inside the image and is not
 * empty for such a plan; a view holding exactly that window renders the same
 * bytes as the whole image; and without DCT scaling and without decoder
 * warnings fl_native_load_one gives the same bytes as decoding the whole
 * image and rendering it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "image/augment.h"
#include "image/imgops.h"
#include "image/jpeg.h"
#include "native/native.h"
#include "core/pool.h"

static fl_native_worker *worker;   /* a native worker, fresh per input (see below) */
static fl_native_ds ds;
static char path[64];
static int64_t labels[1] = {7};
static int memfd = -1;
static fl_scratch scratch;          /* render scratch, reused across inputs as a worker's is */

static void *
xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        abort();
    return p;
}

static const int wild_ints[16] = {0, -1, -7, 1, 2, 3, 4, 100, 65535, FL_MAX_DIM, FL_MAX_DIM + 1, INT_MAX, INT_MIN,
                                  -FL_MAX_DIM, 5, 1 << 16};

static int
wild_int(fz_bytes *p)
{
    return wild_ints[fz_u8(p) % 16];
}

static double
wild_double(fz_bytes *p)
{
    static const double v[12] = {0.0, -0.0, -1.0, 1.0, 2.0, 1e308, 5e-324, 1e-9, 1.0000001, 1e6, 0.5, 3.0};
    uint8_t b = fz_u8(p) % 16;
    if (b == 12)
        return NAN;
    if (b == 13)
        return INFINITY;
    if (b == 14)
        return -INFINITY;
    if (b == 15)
        return -NAN;
    return v[b];
}

/* A size: mostly small, sometimes up to 512 or 8192. */
static int
fz_dim(fz_bytes *p)
{
    uint16_t v = fz_u16(p);
    switch (v >> 13) {
    case 0: case 1: case 2: case 3: return 1 + (v & 0x1f);
    case 4: case 5: return 1 + (v & 0x7f);
    case 6: return 1 + (v & 0x1ff);
    default: return 1 + (v & 0x1fff);
    }
}

/* A real in [lo, hi] from 16 bits. */
static double
fz_real(fz_bytes *p, double lo, double hi)
{
    return lo + (hi - lo) * (double)fz_u16(p) / 65535.0;
}

/* Build a spec as fastloader.transforms.compile_transform does for one of
 * its pipeline shapes, then (when the `corrupt` byte is below 0x34, about 1 in
 * 5) overwrite one field with an out-of-range or special value.  Consumes a
 * fixed 24 bytes. */
static void
build_spec(fz_bytes *p, fl_tspec *t)
{
    memset(t, 0, sizeof *t);
    t->scale_lo = 0.08;
    t->scale_hi = 1.0;
    t->ratio_lo = 3.0 / 4.0;
    t->ratio_hi = 4.0 / 3.0;
    t->std[0] = t->std[1] = t->std[2] = 1.0f;
    const uint8_t form = fz_u8(p), opts = fz_u8(p);
    const int a = fz_dim(p), b = fz_dim(p), c = fz_dim(p), d = fz_dim(p);
    const double s0 = fz_real(p, 0.0, 1.2), s1 = fz_real(p, 0.0, 1.2);
    const double r0 = exp(fz_real(p, -3.0, 3.0)), r1 = exp(fz_real(p, -3.0, 3.0));
    const uint8_t flip = fz_u8(p), dt = fz_u8(p);
    const uint8_t mean = fz_u8(p), stdv = fz_u8(p);
    const uint8_t corrupt = fz_u8(p), field = fz_u8(p);
    t->out_channels = (opts & 1) ? 1 : 3;
    t->layout = (opts >> 1) & 1 ? FL_LAYOUT_HWC : FL_LAYOUT_CHW;
    const int crop = (opts >> 2) & 1;
    t->interp = ((opts >> 4) & 3) % 3;   /* FL_INTERP_*: bilinear (3 too), bicubic, random */
    switch (form % 8) {
    case 0:   /* no geometry: natural size */
        t->geom = FL_GEOM_NONE;
        break;
    case 1:   /* RandomResizedCrop((a, b), scale, ratio) */
        t->geom = FL_GEOM_RRC;
        t->out_h = a;
        t->out_w = b;
        if (opts & 8) {
            t->scale_lo = s0;
            t->scale_hi = s1;
            t->ratio_lo = r0;
            t->ratio_hi = r1;
        }
        break;
    case 2:   /* Resize((a, b)) [+ CenterCrop((c, d))] */
        t->geom = FL_GEOM_RESIZE_CROP;
        t->resize_h = a;
        t->resize_w = b;
        t->out_h = a;
        t->out_w = b;
        break;
    case 3: case 4:   /* Resize(a) [+ CenterCrop] */
        t->geom = FL_GEOM_RESIZE_CROP;
        t->resize_short = a;
        break;
    case 5:   /* Resize(a, max_size=a + b) [+ CenterCrop] */
        t->geom = FL_GEOM_RESIZE_CROP;
        t->resize_short = a;
        t->max_size = a + b;
        break;
    case 6:   /* Resize(None, max_size=a) [+ CenterCrop] */
        t->geom = FL_GEOM_RESIZE_CROP;
        t->max_size = a;
        break;
    default:  /* CenterCrop((c, d)) alone */
        t->geom = FL_GEOM_RESIZE_CROP;
        break;
    }
    if (t->geom == FL_GEOM_RESIZE_CROP && (crop || form % 8 == 7)) {
        t->crop_h = c;
        t->crop_w = d;
        t->out_h = c;
        t->out_w = d;
    }
    if (flip & 1)
        t->flip_p = (flip & 2) ? 0.5 : (double)(flip >> 2) / 63.0;
    if (opts & 0x40)
        t->vflip_p = (opts & 0x80) ? 1.0 : 0.5;
    if (mean & 0x40)
        t->gray_p = (mean & 0x80) ? 1.0 : 0.5;
    if (stdv & 0x40) {   /* RandomRotation: a range from the two wild bytes, nearest or bilinear */
        t->rotate = 1;
        t->rot_lo = -(double)(corrupt % 181);
        t->rot_hi = (double)(field % 181);
        t->rot_interp = (mean >> 5) & 1;
    }
    t->dtype = dt % 4;
    t->scale_to_unit = (dt >> 2) % 3;
    if (t->dtype != FL_DT_U8 && (dt & 0x10)) {
        t->normalize = 1;
        for (int k = 0; k < 3; k++) {
            t->mean[k] = (float)((int)((mean >> (2 * k)) & 3) - 1) * 0.45f + 0.01f * (float)k;
            t->std[k] = (float)(((stdv >> (2 * k)) & 3) + 1) * 0.22f * ((stdv & 0x80) ? -1.0f : 1.0f);
        }
    }
    if (corrupt >= 0x34)
        return;
    /* one field out of range or special */
    const uint8_t chan = (uint8_t)(field / 24);   /* mean/std channel */
    fz_bytes w = {&chan, 1, 0};
    fz_bytes v = {&corrupt, 1, 0};                /* the special value: corrupt % 16 */
    switch (field % 24) {
    case 0: t->geom = wild_int(&v); break;
    case 1: t->out_h = wild_int(&v); break;
    case 2: t->out_w = wild_int(&v); break;
    case 3: t->scale_lo = wild_double(&v); break;
    case 4: t->scale_hi = wild_double(&v); break;
    case 5: t->ratio_lo = wild_double(&v); break;
    case 6: t->ratio_hi = wild_double(&v); break;
    case 7: t->resize_short = wild_int(&v); break;
    case 8: t->resize_h = wild_int(&v); break;
    case 9: t->resize_w = wild_int(&v); break;
    case 10: t->max_size = wild_int(&v); break;
    case 11: t->crop_h = wild_int(&v); break;
    case 12: t->crop_w = wild_int(&v); break;
    case 13: t->flip_p = wild_double(&v); break;
    case 14: t->out_channels = wild_int(&v); break;
    case 15: t->dtype = wild_int(&v); break;
    case 16: t->scale_to_unit = wild_int(&v); break;
    case 17: t->normalize = 1; break;
    case 18: t->mean[fz_u8(&w) % 3] = (float)wild_double(&v); break;
    case 19: t->std[fz_u8(&w) % 3] = (float)wild_double(&v); break;
    case 20: t->layout = wild_int(&v); break;
    case 21: t->out_h = t->out_w = 0; break;
    case 22: t->crop_h = t->crop_w = wild_int(&v); t->out_h = t->crop_h; t->out_w = t->crop_w; break;
    default: t->resize_h = t->resize_w = wild_int(&v); break;
    }
}

/* The memfd the native path reads "the file" from, and a fresh worker per
 * input, so that a finding reproduces from its input alone (a real worker
 * keeps its state across files; fuzz_decode.c checks that decoder reuse
 * changes nothing). */
static void
setup(void)
{
    if (memfd < 0) {
        memfd = memfd_create("fuzz_render", 0);
        if (memfd < 0)
            abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", memfd);
        char **owned = calloc(1, sizeof(char *));
        if (!owned || !(owned[0] = strdup(path)))
            abort();
        ds.src = fl_source_files_new(owned, 1);   /* kept for the process's life */
        if (!ds.src)
            abort();
        ds.labels = labels;
        ds.n = 1;
        ds.max_pixels = FZ_MAX_PIXELS;
        ds.timing = 1;
    }
    worker = fl_native_worker_new(&ds);
    if (!worker)
        abort();
}

static void
put_file(const uint8_t *file, size_t len)
{
    if (ftruncate(memfd, 0) != 0)
        abort();
    size_t done = 0;
    while (done < len) {
        ssize_t n = pwrite(memfd, file + done, len - done, (off_t)done);
        if (n <= 0)
            abort();
        done += (size_t)n;
    }
}

/* Decode the whole JPEG at full size with `ch` channels.  Returns a malloc'd
 * w x h x ch buffer, or NULL (and *warn = -1) when it does not decode. */
static uint8_t *
decode_all(const uint8_t *file, size_t len, int ch, int *w, int *h, int *warn)
{
    fl_jpeg_info info;
    fl_err err = {0, ""};
    *warn = -1;
    fl_jpeg *dec = fl_jpeg_new();
    if (!dec)
        abort();
    fl_jpeg_set_limits(dec, FZ_MAX_PIXELS, FL_JPEG_DEFAULT_MAX_SCANS);
    if (fl_jpeg_read_header(dec, file, len, &info, &err) < 0
        || (uint64_t)info.width * (uint64_t)info.height > ((uint64_t)1 << 20)) {
        fl_jpeg_free(dec);
        return NULL;
    }
    const size_t n = (size_t)info.width * (size_t)info.height * (size_t)ch;
    uint8_t *buf = fz_guarded_alloc(n);
    fl_jpeg_region r = {ch, 8, 0, 0, info.width, info.height};
    int rc = fl_jpeg_decode(dec, file, len, &r, buf, (size_t)info.width * (size_t)ch, &err);
    fz_guard_check(buf, n, "fl_jpeg_decode(reference)");
    *warn = fl_jpeg_last_warnings(dec);
    fl_jpeg_free(dec);
    if (rc < 0) {
        fz_check_err(&err, "fl_jpeg_decode(reference)");
        free(buf);
        *warn = -1;
        return NULL;
    }
    *w = info.width;
    *h = info.height;
    return buf;
}

static size_t
out_bytes(const fl_tspec *t, int ow, int oh)
{
    static const size_t es[4] = {1, 2, 2, 4};
    return (size_t)ow * (size_t)oh * (size_t)t->out_channels * es[t->dtype];
}

/* Modes 0, 1: the native worker path. */
static void
native_mode(fz_bytes *p, const fl_tspec *t, int spec_ok, const uint8_t *file, size_t len)
{
    const uint8_t f = fz_u8(p);
    const uint64_t seed = fz_u32(p), epoch = fz_u8(p);
    ds.spec = *t;
    ds.dct_scaling = f & 1;
    ds.sample_bytes = fl_tspec_sample_bytes(t);
    ds.on_error = (f >> 1) % 3;
    put_file(file, len);
    fl_err err = {0, ""};
    if (!spec_ok) {   /* NativeDataset refuses it; the core must too */
        uint8_t dummy[16];
        int rc = fl_native_load_one(worker, &ds, 0, seed, epoch, dummy, &err);
        if (rc == 1)   /* not a JPEG: left to Pillow before any planning */
            return;
        if (rc != -1)
            FZ_FAIL("fl_native_load_one accepted a spec that fl_tspec_check refuses");
        fz_check_err(&err, "fl_native_load_one(invalid spec)");
        FZ_LOG("native: invalid spec refused: %s", err.msg);
        return;
    }
    if (t->out_w <= 0 || ds.sample_bytes == 0 || ds.sample_bytes > FZ_MAX_OUT_BYTES)
        return;   /* NativeDataset needs a fixed size; or too big for the harness */
    if (f & 8) {  /* the batch loop around it: events, skip/replace, a bad index */
        fl_pool *pool = fl_pool_new(ds.sample_bytes, 1);
        if (!pool)
            abort();
        int64_t idx[2] = {0, (f & 16) ? ((f & 32) ? 1 : -1) : 0};
        fl_native_batch *bt = fl_native_load_batch(worker, &ds, pool, idx, (f & 16) ? 2 : 1, seed, epoch, NULL);
        if (!bt)
            abort();
        if (bt->n < 0 || bt->n > 1 || (bt->failed && bt->nevents < 1))
            FZ_FAIL("batch: n=%d failed=%d nevents=%d", bt->n, bt->failed, bt->nevents);
        for (int i = 0; i < bt->nevents; i++) {
            const fl_native_event *e = &bt->events[i];
            if (bt->event_kind[i] == FL_EV_FIXUP)
                continue;
            if (e->code < FL_ERR_DECODE || e->code > FZ_ERR_LAST || memchr(e->msg, '\0', sizeof e->msg) == NULL
                || e->msg[0] == '\0')
                FZ_FAIL("batch event %d (kind %d): code %d, message '%.80s'", i, bt->event_kind[i], e->code, e->msg);
        }
        FZ_LOG("native batch: n %d failed %d events %d", bt->n, bt->failed, bt->nevents);
        fl_native_batch_free(bt);
        fl_pool_unref(pool);
        return;
    }
    void *out = xmalloc(ds.sample_bytes);   /* exact size */
    int rc = fl_native_load_one(worker, &ds, 0, seed, epoch, out, &err);
    FZ_LOG("native: geom %d out %dx%d ch %d dtype %d dct %d: rc %d%s%s", t->geom, t->out_w, t->out_h,
           t->out_channels, t->dtype, ds.dct_scaling, rc, rc < 0 ? ": " : "", rc < 0 ? err.msg : "");
    if (rc < 0)
        fz_check_err(&err, "fl_native_load_one");
    else if (rc != 0 && rc != 1)
        FZ_FAIL("fl_native_load_one returned %d", rc);
    if (rc == 0 && !ds.dct_scaling && fl_jpeg_last_warnings(worker->jpeg) == 0) {
        /* same bytes as decoding the whole image and rendering it */
        int w, h, warn;
        uint8_t *img = decode_all(file, len, t->out_channels == 1 ? 1 : 3, &w, &h, &warn);
        if (img && warn == 0) {
            fl_plan plan;
            fl_err ferr = {0};
            if (fl_plan_sample(t, w, h, seed, epoch, 0, &plan, &ferr) < 0)
                FZ_FAIL("plan refused on the reference path: %s", ferr.msg);
            fl_view v = {img, w, h, (size_t)w * (size_t)(t->out_channels == 1 ? 1 : 3), t->out_channels == 1 ? 1 : 3,
                         0.0, 0.0, 1.0, 1.0};
            void *ref = xmalloc(ds.sample_bytes);
            if (fl_render(t, &plan, &v, ref, &scratch, &ferr) < 0)
                FZ_FAIL("reference render failed: %s", ferr.msg);
            if (memcmp(ref, out, ds.sample_bytes) != 0)
                FZ_FAIL("fl_native_load_one differs from decode-all + render (%dx%d, box %d,%d %dx%d -> %dx%d)", w, h,
                        plan.box_x, plan.box_y, plan.box_w, plan.box_h, plan.rs_w, plan.rs_h);
            free(ref);
        }
        free(img);
    }
    free(out);
}

/* Modes 2, 3: fastloader._C._render. */
static void
render_mode(fz_bytes *p, int mode, const fl_tspec *t, int spec_ok, const uint8_t *file, size_t len)
{
    const uint8_t f = fz_u8(p), vs = fz_u8(p), vo = fz_u8(p);
    const uint64_t seed = fz_u32(p), epoch = fz_u8(p), index = fz_u8(p);
    fl_err ferr = {0};
    fl_plan plan;
    if (!spec_ok) {   /* fl_tspec_from_pydict refuses it; plan_sample must too */
        if (fl_plan_sample(t, 16, 16, seed, epoch, index, &plan, &ferr) == 0)
            FZ_FAIL("fl_plan_sample accepted a spec that fl_tspec_check refuses");
        fz_check_err(&ferr, "fl_plan_sample(invalid spec)");
        FZ_LOG("render: invalid spec refused: %s", ferr.msg);
        return;
    }
    /* the image: the decoded JPEG, else pixels made from the input */
    const int ich = (f & 1) ? 1 : 3;
    int w = 0, h = 0, warn;
    uint8_t *img = decode_all(file, len, ich, &w, &h, &warn);
    if (!img) {
        w = 1 + fz_u8(p) % 48;
        h = 1 + fz_u8(p) % 48;
        size_t n = (size_t)w * (size_t)h * (size_t)ich;
        img = xmalloc(n);
        for (size_t i = 0; i < n; i++)
            img[i] = len ? file[i % len] : (uint8_t)(i * 37);
    }
    fl_view v = {img, w, h, (size_t)w * (size_t)ich, ich, 0.0, 0.0, 1.0, 1.0};
    const int full_view = (vs & 3) == 0 && (vo & 3) == 0;
    if ((vs & 3) == 1) {          /* a DCT-scaled view: scale m/8 */
        v.scale_x = v.scale_y = (double)(1 + (vs >> 2) % 16) / 8.0;
    } else if ((vs & 3) == 2) {   /* arbitrary positive scales */
        v.scale_x = 0.01 + (double)(vs >> 2) / 8.0;
        v.scale_y = 0.01 + (double)(vo >> 2) / 8.0;
    } else if ((vs & 3) == 3) {   /* special values (render() passes anything > 0) */
        fz_bytes q = {&vs, 1, 0};
        double x = wild_double(&q);
        if (!(x > 0))
            x = 1e-300;
        v.scale_x = x;
        v.scale_y = (vs & 4) ? x : 1.0;
    }
    if ((vo & 3) == 1) {
        v.origin_x = (double)(vo >> 2);
        v.origin_y = (double)(vo >> 4);
    } else if ((vo & 3) == 2) {
        v.origin_x = -(double)(vo >> 2) / 3.0;
        v.origin_y = (double)(vo >> 2) / 7.0;
    } else if ((vo & 3) == 3) {
        fz_bytes q = {&vo, 1, 0};
        v.origin_x = wild_double(&q);
        v.origin_y = (vo & 8) ? v.origin_x : 0.0;
    }
#ifdef FZ_SKIP_KNOWN
    /* known finding (docs/hardening.md): fl_render converts NaN / infinite / huge
     * view origins and scales to int (undefined behaviour) */
    if (!(fabs(v.origin_x) <= 1e6 && fabs(v.origin_y) <= 1e6 && v.scale_x <= 1e6 && v.scale_y <= 1e6)) {
        v.origin_x = v.origin_y = 0.0;
        v.scale_x = v.scale_y = 1.0;
    }
#endif
    if (mode == 2) {
        /* render()'s default src_size: (image size + origin) / scale, rounded
         * (the binding computes it in double and converts to int) */
        double sx = (w + v.origin_x) / v.scale_x + 0.5, sy = (h + v.origin_y) / v.scale_y + 0.5;
        if (!(sx > INT_MIN && sx < INT_MAX && sy > INT_MIN && sy < INT_MAX))
            goto done;   /* see docs/hardening.md: the binding's int conversion is undefined here */
        int src_w = (int)sx, src_h = (int)sy;
        if (fl_plan_sample(t, src_w, src_h, seed, epoch, index, &plan, &ferr) < 0) {
            fz_check_err(&ferr, "fl_plan_sample");
            goto done;
        }
        if (plan.out_w < 1 || plan.out_h < 1 || plan.box_w < 1 || plan.box_h < 1 || plan.box_x < 0
            || plan.box_y < 0 || plan.box_x + plan.box_w > src_w || plan.box_y + plan.box_h > src_h)
            FZ_FAIL("fl_plan_sample made a bad plan: box %d,%d %dx%d of %dx%d, out %dx%d", plan.box_x, plan.box_y,
                    plan.box_w, plan.box_h, src_w, src_h, plan.out_w, plan.out_h);
        if (plan.blur != 0.0 && (t->blur.p == 0.0 || plan.blur != (double)(float)plan.blur
                                 || !(plan.blur >= (double)(float)t->blur.lo && plan.blur <= (double)(float)t->blur.hi)))
            FZ_FAIL("fl_plan_sample drew blur sigma %.17g for the range [%g, %g] (p %g)", plan.blur, t->blur.lo,
                    t->blur.hi, t->blur.p);
        if (t->blur.p == 1.0 && plan.blur == 0.0)
            FZ_FAIL("fl_plan_sample left out a GaussianBlur of p 1");
    } else {
        /* an explicit plan: any integers render() parses */
        fz_bytes *q = p;
        const uint8_t k = fz_u8(q);
        plan.box_x = (k & 1) ? wild_int(q) : fz_u8(q) % (w + 2) - 1;
        plan.box_y = (k & 2) ? wild_int(q) : fz_u8(q) % (h + 2) - 1;
        plan.box_w = (k & 4) ? wild_int(q) : 1 + fz_u8(q) % (w + 1);
        plan.box_h = (k & 8) ? wild_int(q) : 1 + fz_u8(q) % (h + 1);
        plan.rs_w = (k & 16) ? wild_int(q) : fz_dim(q);
        plan.rs_h = (k & 16) ? wild_int(q) : fz_dim(q);
        plan.win_x = (k & 32) ? wild_int(q) : (int)(int8_t)fz_u8(q);
        plan.win_y = (k & 32) ? wild_int(q) : (int)(int8_t)fz_u8(q);
        plan.flip = (k >> 6) & 1;
        const uint8_t fv = fz_u8(q);
        plan.vflip = fv & 1;
        plan.gray = (fv >> 1) & 1;
        /* a blur sigma as render() parses any float: none, realistic, or out of range / NaN / negative */
        plan.blur = (double[]){0.0, 0.0, 0.0, 0.0, 0.7, 1.9, 1e-7, NAN, -1.0, 1e7, 0.3, 5.0, 0.0, 1e6, 1e-6,
                               INFINITY}[(fv >> 2) % 16];
        if (k & 128) {
            plan.out_w = fz_dim(q);
            plan.out_h = fz_dim(q);
        } else {   /* render()'s default "out" */
            plan.out_w = t->out_w ? t->out_w : plan.rs_w;
            plan.out_h = t->out_w ? t->out_h : plan.rs_h;
        }
    }
    {
        const int ow = t->out_w ? t->out_w : plan.out_w, oh = t->out_w ? t->out_h : plan.out_h;
        if (ow <= 0 || oh <= 0 || ow > FL_MAX_DIM || oh > FL_MAX_DIM)
            goto done;   /* render() refuses the output size */
        const size_t nb = out_bytes(t, ow, oh);
        if (nb > FZ_MAX_OUT_BYTES)
            goto done;
        void *out = xmalloc(nb);   /* exact size */
        int rc = fl_render(t, &plan, &v, out, &scratch, &ferr);
        FZ_LOG("render mode %d: image %dx%dx%d scale %g,%g origin %g,%g box %d,%d %dx%d rs %dx%d win %d,%d "
               "out %dx%d: rc %d%s%s", mode, w, h, ich, v.scale_x, v.scale_y, v.origin_x, v.origin_y, plan.box_x,
               plan.box_y, plan.box_w, plan.box_h, plan.rs_w, plan.rs_h, plan.win_x, plan.win_y, ow, oh, rc,
               rc < 0 ? ": " : "", rc < 0 ? ferr.msg : "");
        if (rc < 0)
            fz_check_err(&ferr, "fl_render");
        if (mode == 2 && full_view) {
            if (rc < 0)
                FZ_FAIL("a plan from fl_plan_sample failed to render from the whole %dx%d image: %s", w, h, ferr.msg);
            int x0, y0, x1, y1;
            fl_plan_source_window(t, &plan, w, h, &x0, &y0, &x1, &y1);
            if (x0 < 0 || y0 < 0 || x1 > w || y1 > h || x1 <= x0 || y1 <= y0)
                FZ_FAIL("fl_plan_source_window [%d, %d) x [%d, %d) outside / empty in %dx%d", x0, x1, y0, y1, w, h);
            /* a view holding exactly the window renders the same bytes */
            fl_view sub = {img + (size_t)y0 * v.stride + (size_t)x0 * (size_t)ich, x1 - x0, y1 - y0, v.stride, ich,
                           (double)x0, (double)y0, 1.0, 1.0};
            void *out2 = xmalloc(nb);
            if (fl_render(t, &plan, &sub, out2, &scratch, &ferr) < 0)
                FZ_FAIL("render from the source window [%d, %d) x [%d, %d) failed: %s", x0, x1, y0, y1, ferr.msg);
            if (memcmp(out, out2, nb) != 0)
                FZ_FAIL("render from the source window [%d, %d) x [%d, %d) of %dx%d differs from the whole image",
                        x0, x1, y0, y1, w, h);
            free(out2);
        }
        free(out);
    }
done:
    free(img);
}

/* A timm RandAugment policy (imgops.h FL_POLICY_TIMM_RA) from the last 12
 * parameter bytes, read with their own cursor so the other fields keep
 * their places: byte 0 bit 0 turns it on; rounds 0..3, interp 0..3
 * (FL_AUG_RANDOM included), weights on bit 7, timm's AutoAugment (sub-policies
 * of those ops) instead on bit 6; 1..15 ops, each an
 * (op, level) pair from a table holding a few pairs fl_tspec_check must
 * refuse, with its prob, magnitude, noise (none, 0.5, 1, infinite) and
 * bound; the fill.  With bit 6 and byte 11's bit 7: torchvision's AugMix
 * (0..3 chains, depth -1..3, four alphas, tensor ops with 0..3 magnitude
 * bins from a table holding values some ops must refuse, and an
 * occasional fill, which it must refuse too). */
static void
build_policy(const uint8_t *params, size_t n, fl_tspec *t)
{
    static const int pairs[][2] = {
        {FL_AUG_AUTOCONTRAST, FL_LEVEL_NONE}, {FL_AUG_EQUALIZE, FL_LEVEL_NONE}, {FL_AUG_INVERT, FL_LEVEL_NONE},
        {FL_AUG_ROTATE, FL_LEVEL_ROTATE}, {FL_AUG_POSTERIZE, FL_LEVEL_POSTERIZE},
        {FL_AUG_POSTERIZE, FL_LEVEL_POSTERIZE_INC}, {FL_AUG_POSTERIZE, FL_LEVEL_POSTERIZE_ORIG},
        {FL_AUG_SOLARIZE, FL_LEVEL_SOLARIZE}, {FL_AUG_SOLARIZE, FL_LEVEL_SOLARIZE_INC},
        {FL_AUG_SOLARIZE_ADD, FL_LEVEL_SOLARIZE_ADD}, {FL_AUG_BRIGHTNESS_FACTOR, FL_LEVEL_ENHANCE},
        {FL_AUG_COLOR_FACTOR, FL_LEVEL_ENHANCE_INC}, {FL_AUG_CONTRAST_FACTOR, FL_LEVEL_ENHANCE},
        {FL_AUG_SHARPNESS_FACTOR, FL_LEVEL_ENHANCE_INC}, {FL_AUG_AFFINE_SHEAR_X, FL_LEVEL_SHEAR},
        {FL_AUG_AFFINE_SHEAR_Y, FL_LEVEL_SHEAR}, {FL_AUG_AFFINE_TRANSLATE_X, FL_LEVEL_TRANSLATE_ABS},
        {FL_AUG_AFFINE_TRANSLATE_Y, FL_LEVEL_TRANSLATE_REL}, {FL_AUG_AFFINE_TRANSLATE_X, FL_LEVEL_TRANSLATE_REL},
        {FL_AUG_COLOR_FACTOR, FL_LEVEL_DESATURATE}, {FL_AUG_GAUSSIAN_BLUR, FL_LEVEL_BLUR},
        {FL_AUG_GAUSSIAN_BLUR, FL_LEVEL_BLUR_RAND},
        /* refused: */ {FL_AUG_GAUSSIAN_BLUR, FL_LEVEL_ROTATE}, {FL_AUG_ROTATE, FL_LEVEL_DESATURATE},
        {FL_AUG_POSTERIZE, FL_LEVEL_ROTATE}, {FL_AUG_SOLARIZE_ADD, FL_LEVEL_NONE}, {FL_AUG_NOPS, FL_LEVEL_NONE},
        {FL_AUG_ROTATE, FL_LEVEL_COUNT},
    };
    const int npairs = (int)(sizeof pairs / sizeof pairs[0]);
    static const double stds[4] = {0.0, 0.5, 1.0, INFINITY}, maxes[4] = {0.0, 10.0, 15.0, 5.0};
    if (n < FZ_RENDER_PARAMS)
        return;
    const uint8_t *b = params + FZ_RENDER_PARAMS - 12;
    if (!(b[0] & 1))
        return;
    fl_policy *P = &t->policy;
    memset(P, 0, sizeof *P);
    P->kind = FL_POLICY_TIMM_RA;
    P->rounds = (b[0] >> 1) % 4;
    P->interp = (b[0] >> 3) % 4;
    P->has_weights = b[0] >> 7;
    P->nops = P->ntimm = 1 + b[1] % 15;
    for (int c = 0; c < 3; c++)
        P->fill[c] = b[2 + c];
    for (int i = 0; i < P->nops; i++) {
        fl_timm_op *o = &P->timm[i];
        uint8_t x = b[2 + i % 10], y = b[2 + (i + 3) % 10], z = b[2 + (i + 7) % 10];
        o->op = pairs[(x + i) % npairs][0];
        o->level = pairs[(x + i) % npairs][1];
        o->prob = (y % 5) / 4.0;
        o->m = z == 255 ? 1e300 : (double)(z % 11) + (y >> 5) / 8.0;
        o->mstd = stds[(z >> 4) % 4];
        o->mmax = maxes[(y >> 3) % 4];
        o->hparam = o->level == FL_LEVEL_TRANSLATE_ABS ? 100.0 : 0.45;
        P->weight[i] = (double)((x >> 4) % 4);
    }
    if ((b[0] & 0x40) && (b[11] & 0x80)) {   /* torchvision's AugMix instead: chains of tensor ops */
        static const int ops[] = {FL_AUG_T_SHEAR_X, FL_AUG_T_SHEAR_Y, FL_AUG_T_TRANSLATE_X, FL_AUG_T_TRANSLATE_Y,
                                  FL_AUG_T_ROTATE, FL_AUG_T_SHEAR_X_V2, FL_AUG_T_TRANSLATE_Y_V2, FL_AUG_T_ROTATE_V2,
                                  FL_AUG_T_BRIGHTNESS, FL_AUG_T_COLOR, FL_AUG_T_COLOR_V2, FL_AUG_T_CONTRAST,
                                  FL_AUG_T_CONTRAST_V2, FL_AUG_T_SHARPNESS, FL_AUG_T_SHARPNESS_V2,
                                  FL_AUG_T_AUTOCONTRAST, FL_AUG_T_AUTOCONTRAST_V2, FL_AUG_POSTERIZE, FL_AUG_SOLARIZE,
                                  FL_AUG_EQUALIZE, /* refused: */ FL_AUG_INVERT, FL_AUG_NOPS};
        static const double mags[] = {0.0, 0.3, -0.3, 0.9, 4.0, 30.0, 180.0, 255.0, -1.0, 1e6, -2.0, 9.0};
        static const double alphas[4] = {1.0, 0.3, 1e-3, 50.0};
        memset(P, 0, sizeof *P);
        P->kind = FL_POLICY_AUGMIX;
        P->rounds = (b[0] >> 1) % 4;   /* 0: no policy */
        P->interp = (b[0] >> 3) % 3;   /* 2 (bicubic): fl_tspec_check refuses it for AugMix */
        P->depth = (int)(b[11] % 5) - 1;
        P->alpha = alphas[(b[11] >> 3) % 4];
        P->nops = 1 + b[1] % 13;
        if (b[11] & 0x40)
            P->fill[0] = b[2];   /* a fill: refused unless 0 */
        for (int i = 0; i < P->nops; i++) {
            fl_policy_op *o = &P->ops[i];
            uint8_t x = b[2 + i % 10], y = b[2 + (i + 3) % 10];
            o->op = ops[(x + i) % (int)(sizeof ops / sizeof ops[0])];
            o->is_signed = y & 1;
            o->nbins = (y >> 1) % 4;
            for (int k = 0; k < o->nbins; k++)
                o->mag[k] = mags[(y + 5 * k + x) % (int)(sizeof mags / sizeof mags[0])];
        }
        return;
    }
    if ((b[0] & 0x40) && (b[11] & 0x40)) {   /* timm's AugMix instead: chains of the same ops, mixed and blended */
        static const double alphas[4] = {1.0, 0.3, 1e-3, 50.0};
        P->kind = FL_POLICY_TIMM_AUGMIX;
        P->has_weights = 0;
        P->depth = (int)(b[11] % 5) - 1;   /* -1 and 0: 1..3 a chain */
        P->alpha = b[11] & 0x20 ? alphas[(b[11] >> 3) % 4] : -1.0;   /* -1: refused */
        if (P->alpha < 0 && (b[11] & 0x10))
            P->alpha = 1.0;
        return;
    }
    if (b[0] & 0x40) {   /* timm's AutoAugment instead: sub-policies of 1..2 of these ops (index ntimm refused) */
        P->kind = FL_POLICY_TIMM_AA;
        P->has_weights = 0;
        P->nsub = 1 + b[11] % 8;
        for (int k = 0; k < P->nsub; k++) {
            P->sub_len[k] = 1 + ((b[2 + k % 10] >> 6) & 1);
            for (int j = 0; j < P->sub_len[k]; j++) {
                P->sub[k][j].op = (b[2 + (k + j) % 10] + k) % (P->ntimm + (b[11] == 255));
                P->sub[k][j].bin = -1;
                P->sub[k][j].p = 1.0;
            }
        }
    }
}

/* A ColorJitter (maybe in RandomApply) at one of its three places, from
 * the 4 bytes before the policy's 12 (no sequential reader gets that far):
 * each adjustment present or not, its range from the ones the recipes use
 * or, now and then, one fl_tspec_check must refuse. */
static void
build_jitter(const uint8_t *params, size_t n, fl_tspec *t)
{
    static const double lo[8] = {0.6, 0.0, 0.9, 1.0, 0.2, 0.0, 2.5, -0.1};
    static const double hi[8] = {1.4, 2.0, 1.1, 1.0, 0.2, 0.0, 1.0, 3.0};   /* 6 and 7: refused */
    static const double hue[8] = {0.1, 0.5, 0.02, 0.0, 0.25, 0.4999, 0.6, -0.1};   /* 6: out of range, 7: lo > hi */
    if (n < FZ_RENDER_PARAMS)
        return;
    const uint8_t *b = params + FZ_RENDER_PARAMS - 16;
    if (!(b[0] & 1))
        return;
    fl_jitter *J = &t->jitter;
    J->p = (b[0] & 2) ? 1.0 : (double)(b[0] >> 2) / 63.0;
    J->pos = b[1] % 4;   /* 3: refused */
    for (int k = 0; k < 3; k++) {
        J->has[k] = (b[2] >> k) & 1;
        int r = (b[3] >> (2 * k)) & 7;
        J->lo[k] = lo[r];
        J->hi[k] = hi[r];
    }
    J->has[FL_JITTER_HUE] = (b[2] >> 3) & 1;
    const int r = (b[2] >> 4) & 7;
    J->lo[FL_JITTER_HUE] = r == 7 ? 0.1 : -hue[r];
    J->hi[FL_JITTER_HUE] = hue[r];
}

/* A RandomAffine (v1 or v2 matrix) in RandomRotation's place, from the 4
 * bytes before the ColorJitter's: translate, scale, 2 or 4 shears, a
 * centre, bicubic; sometimes a range fl_tspec_check must refuse. */
static void
build_affine(const uint8_t *params, size_t n, fl_tspec *t)
{
    static const double fr[8] = {0.0, 0.1, 0.3, 1.0, 0.05, 0.5, 1.5, -0.1};   /* 6, 7: refused */
    static const double sc[8][2] = {{0, 0}, {0.8, 1.2}, {0.5, 2.0}, {1.0, 1.0}, {0.05, 0.1}, {3.0, 8.0},
                                    {0.0, 1.0}, {1.2, 0.8}};   /* 6, 7: refused */
    if (n < FZ_RENDER_PARAMS || !t->rotate)
        return;
    const uint8_t *b = params + FZ_RENDER_PARAMS - 20;
    if (!(b[0] & 1))
        return;
    t->rotate = (b[0] & 2) ? FL_ROT_AFFINE_V2 : FL_ROT_AFFINE;
    t->rot_interp = (b[0] >> 2) % 3;
    t->aff_tx = fr[b[1] % 8];
    t->aff_ty = fr[(b[1] >> 3) % 8];
    t->aff_scale_lo = sc[b[2] % 8][0];
    t->aff_scale_hi = sc[b[2] % 8][1];
    t->aff_nshear = (b[2] >> 3) % 3 * 2;
    for (int k = 0; k < 4; k++)
        t->aff_shear[k] = (k % 2 ? 1.0 : -1.0) * (double)((b[3] >> (2 * k)) & 3) * 15.0;
    if (b[0] & 0x10) {
        t->aff_center = 1;
        t->aff_cx = (double)(int8_t)b[3];
        t->aff_cy = (double)(b[1] % 64) - 8.5;
    }
}

/* A stand-in for torch's exp (GaussianBlur v1's fl_gblur.vexp; torch is
 * not here): libm's. */
static void
fz_vexp(void *ctx, const float *in, float *out, int n)
{
    (void)ctx;
    for (int i = 0; i < n; i++)
        out[i] = expf(in[i]);
}

/* A GaussianBlur (maybe in RandomApply) before or after RandomGrayscale,
 * from the 4 bytes before the RandomAffine's: kernel sides 1..31 (square
 * or not), a sigma range from the recipes' and the extremes, v1 (SLEEF's
 * exp or a stand-in for torch's) or v2, 8 or 16 lanes; now and then a
 * field fl_tspec_check must refuse (an even or oversized side, a sigma
 * range, the position, lanes; a padding not below the output side comes
 * by itself with small outputs). */
static void
build_blur(const uint8_t *params, size_t n, fl_tspec *t)
{
    static const double lo[8] = {0.1, 1.0, 0.5, 1e-6, 1e6, 3.0, 0.0, 0.1};
    static const double hi[8] = {2.0, 1.0, 5.0, 1e-6, 1e6, 1.0, 1.0, 2e6};   /* 5, 6, 7: refused */
    if (n < FZ_RENDER_PARAMS)
        return;
    const uint8_t *b = params + FZ_RENDER_PARAMS - 24;
    if (!(b[0] & 1))
        return;
    fl_blur *B = &t->blur;
    B->p = (b[0] & 2) ? 1.0 : (double)(b[0] >> 2) / 63.0;
    B->pos = (b[1] >> 5) % 3;   /* 2: refused */
    B->k.kx = b[1] == 0xFF ? 4 : 1 + 2 * (b[1] % 16);
    B->k.ky = (b[2] & 0x80) ? B->k.kx : b[2] == 0x7F ? FL_GBLUR_MAX_K + 2 : 1 + 2 * (b[2] % 16);
    B->lo = lo[b[3] % 8];
    B->hi = hi[b[3] % 8];
    B->k.v2 = (b[3] >> 3) & 1;
    B->k.lanes = (b[3] & 0x30) == 0x30 ? 4 : (b[3] & 0x10) ? 16 : 8;
    B->k.vexp = !B->k.v2 && (b[3] & 0x40) ? fz_vexp : NULL;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_bytes p;
    const uint8_t *file;
    size_t len;
    fz_split(data, size, FZ_RENDER_PARAMS, &p, &file, &len);
    setup();
    const int mode = fz_u8(&p) % 4;
    fl_tspec t;
    build_spec(&p, &t);
    build_policy(p.p, p.n, &t);
    build_jitter(p.p, p.n, &t);
    build_affine(p.p, p.n, &t);
    build_blur(p.p, p.n, &t);
    /* a blur costs kx * ky fused multiply-adds per output value: on the largest outputs (up to 10^7 pixels
       here) that is minutes under ASan, and nothing the smaller ones do not reach; those go without it */
    if (t.blur.p != 0.0 && (double)t.out_w * t.out_h * t.out_channels * t.blur.k.kx * t.blur.k.ky > 5e7)
        t.blur.p = 0.0;
    if (t.rotate && t.policy.rounds > 0)   /* one fill for the augmented render (fl_tspec_check) */
        memcpy(t.rot_fill, t.policy.fill, sizeof t.rot_fill);
    fl_err ferr = {0};
    const int spec_ok = fl_tspec_check(&t, &ferr) == 0;
    if (!spec_ok)
        fz_check_err(&ferr, "fl_tspec_check");
    if (mode <= 1)
        native_mode(&p, &t, spec_ok, file, len);
    else
        render_mode(&p, mode, &t, spec_ok, file, len);
    fl_native_worker_free(worker);
    worker = NULL;
    return 0;
}
