/* render.c: fl_render, the one responsibility of this unit: map a sample's
 * plan onto the decoded buffer (geometry), lay out the scratch, and produce
 * each output row: the resample passes in Pillow's order (resample.c),
 * flip, window with zero padding, and the conversion to the output dtype
 * and layout (convert.c).  Also fl_plan_source_window, which asks the same
 * geometry what a render reads, and fl_scratch_free.
 *
 * No Python, no GIL: everything per call comes from the caller's
 * fl_scratch, grown with malloc/free only.
 *
 * - Crop then resize (RandomResizedCrop) means the filter sees only the box;
 *   Resize + CenterCrop means the box is the whole image and the window is
 *   cut afterwards.  Both are "resample the box, then take a window".
 * - Region views: at full scale the filter is set up on the box alone (as
 *   Pillow sees the cropped image), whatever part of it the buffer holds, so
 *   a buffer holding fl_plan_source_window's rectangle renders exactly as
 *   the whole image.  Scaled views (libjpeg DCT scaling): the box is mapped
 *   into buffer coordinates, possibly fractional; the same code then
 *   resamples the mapped interval with the filter clipped at the pixels it
 *   touches.
 * - Rows are planar between the passes, so the finished row is CHW-shaped:
 *   uint8 CHW rows are stored with memcpy, other dtypes through the table.
 */
#include "image/imgops.h"
#include "image/imgops_internal.h"
#include "image/resample.h"
#include "image/augment.h"
#include "core/rng.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef FL_X86_SIMD
#include <immintrin.h>
#endif

/* ------------------------------------------------------------------------ */
/* Scratch                                                                  */
/* ------------------------------------------------------------------------ */

/* Contract: imgops.h. */
void
fl_scratch_free(fl_scratch *s)
{
    if (s == NULL)
        return;
    free(s->p);
    free(s->aux);
    s->p = NULL;
    s->cap = 0;
    s->aux = NULL;
    s->aux_cap = 0;
}

/* Bump allocator over one scratch block; sizes are summed first (with
 * overflow checks), then the block is grown and carved. */
typedef struct {
    size_t total;
    int overflow;
} fl_layout;

/* Reserve n elements of elsize bytes at the next 64-byte boundary; returns
 * their offset, or 0 with L->overflow set when the sum overflows. */
static size_t
fl_reserve(fl_layout *L, size_t n, size_t elsize)
{
    size_t off = (L->total + 63) & ~(size_t)63;
    if (elsize && n > (SIZE_MAX - off - 64) / elsize) {
        L->overflow = 1;
        return 0;
    }
    L->total = off + n * elsize;
    return off;
}

/* Grow s to at least n bytes.  Its contents need not survive: plain
 * malloc, no copy.  Returns 0, or -1 when out of memory (s is then empty). */
static int
fl_scratch_grow(fl_scratch *s, size_t n)
{
    if (s->cap >= n)
        return 0;
    free(s->p);
    s->p = malloc(n);
    s->cap = s->p ? n : 0;
    return s->p != NULL ? 0 : -1;
}

/* ------------------------------------------------------------------------ */
/* Geometry: the plan mapped onto a buffer                                  */
/* ------------------------------------------------------------------------ */

typedef struct {
    int out_w, out_h;
    int cx0, cx1, cy0, cy1;    /* output window ∩ resized image, resized coordinates */
    int empty;                 /* the window misses the image */
    fl_axis ax, ay;
} fl_geom;

/* The filter a render of plan under t uses: the spec's, or the plan's draw
 * when the spec says FL_INTERP_RANDOM.  Returns FL_INTERP_BILINEAR or
 * FL_INTERP_BICUBIC, or -1 when that value is neither.  Pure. */
static int
fl_geom_interp(const fl_tspec *t, const fl_plan *plan)
{
    int interp = t->interp == FL_INTERP_RANDOM ? plan->interp : t->interp;
    return interp == FL_INTERP_BILINEAR || interp == FL_INTERP_BICUBIC ? interp : -1;
}

/* Check the plan and map it onto a vw x vh buffer at origin (ox, oy) and
 * scale (sx, sy), with the filter fl_geom_interp picks.  Returns 0, -1 for
 * an invalid plan (its filter included), -2 when the box misses the
 * buffer. */
static int
fl_geom_setup(const fl_tspec *t, const fl_plan *plan, int vw, int vh, double ox, double oy, double sx, double sy,
              fl_geom *g)
{
    memset(g, 0, sizeof *g);
    g->out_w = t->out_w ? t->out_w : plan->out_w;
    g->out_h = t->out_w ? t->out_h : plan->out_h;
    const int out_w = g->out_w, out_h = g->out_h;
    const int interp = fl_geom_interp(t, plan);
    if (interp < 0 || plan->box_w <= 0 || plan->box_h <= 0 || plan->rs_w <= 0 || plan->rs_h <= 0 || plan->rs_w > FL_MAX_DIM
        || plan->rs_h > FL_MAX_DIM || out_w <= 0 || out_h <= 0 || out_w > FL_MAX_DIM || out_h > FL_MAX_DIM
        || plan->box_w > FL_MAX_DIM || plan->box_h > FL_MAX_DIM || plan->box_x < -FL_MAX_DIM
        || plan->box_x > FL_MAX_DIM || plan->box_y < -FL_MAX_DIM || plan->box_y > FL_MAX_DIM
        || plan->win_x < -FL_MAX_DIM || plan->win_x > FL_MAX_DIM || plan->win_y < -FL_MAX_DIM
        || plan->win_y > FL_MAX_DIM)
        return -1;
    g->cx0 = plan->win_x > 0 ? plan->win_x : 0;
    g->cx1 = plan->win_x + out_w < plan->rs_w ? plan->win_x + out_w : plan->rs_w;
    g->cy0 = plan->win_y > 0 ? plan->win_y : 0;
    g->cy1 = plan->win_y + out_h < plan->rs_h ? plan->win_y + out_h : plan->rs_h;
    g->empty = g->cx1 <= g->cx0 || g->cy1 <= g->cy0;
    if (g->empty)
        return 0;
    double bx0 = plan->box_x * sx - ox;
    double bx1 = (plan->box_x + (double)plan->box_w) * sx - ox;
    double by0 = plan->box_y * sy - oy;
    double by1 = (plan->box_y + (double)plan->box_h) * sy - oy;
    if (fl_axis_setup(&g->ax, interp, bx0, bx1, vw, plan->rs_w, g->cx0, g->cx1) < 0
        || fl_axis_setup(&g->ay, interp, by0, by1, vh, plan->rs_h, g->cy0, g->cy1) < 0)
        return -2;
    return 0;
}

/* Contract: imgops.h. */
void
fl_plan_source_window(const fl_tspec *t, const fl_plan *plan, int src_w, int src_h, int *x0, int *y0, int *x1,
                      int *y1)
{
    fl_geom g;
    int rc = src_w > 0 && src_h > 0 ? fl_geom_setup(t, plan, src_w, src_h, 0.0, 0.0, 1.0, 1.0, &g) : -1;
    if (rc < 0) {   /* nothing to narrow down: fl_render reports the error */
        *x0 = *y0 = 0;
        *x1 = src_w > 0 ? src_w : 0;
        *y1 = src_h > 0 ? src_h : 0;
    } else if (g.empty) {   /* all padding: any one pixel will do */
        *x0 = plan->box_x < 0 ? 0 : plan->box_x >= src_w ? src_w - 1 : plan->box_x;
        *y0 = plan->box_y < 0 ? 0 : plan->box_y >= src_h ? src_h - 1 : plan->box_y;
        *x1 = *x0 + 1;
        *y1 = *y0 + 1;
    } else {
        *x0 = g.ax.in_lo;
        *x1 = g.ax.in_hi;
        *y0 = g.ay.in_lo;
        *y1 = g.ay.in_hi;
    }
}

/* ------------------------------------------------------------------------ */
/* Render                                                                   */
/* ------------------------------------------------------------------------ */

/* d[x] = s[n - 1 - x] for x < n (d and s do not overlap). */
static void
fl_reverse_bytes(uint8_t *d, const uint8_t *s, int n)
{
    for (int x = 0; x < n; x++)
        d[x] = s[n - 1 - x];
}

/* One fl_render call: the sizes and pass order derived from the spec, the
 * plan and the view (fl_render_shape), then pointers into the scratch. */
typedef struct {
    const fl_tspec *t;
    const fl_plan *plan;
    fl_geom g;
    int out_w, out_h;
    int wc;                    /* working channels */
    int to_gray;               /* RGB view, 1 output channel: convert("L") before resizing */
    int simd;                  /* fl_use_avx2(), asked once per call */
    int nh, nv;                /* resized columns / rows computed */
    int sx0, sw, sy0, sh;      /* source columns / rows read */
    int vfirst;                /* vertical pass first */
    int hneed;                 /* the horizontal pass runs */
    int htmp;                  /* horizontal pass over all rows up front */
    int nhp;                   /* plane stride of horizontally resampled rows */
    size_t ips;                /* plane stride of split source rows */
    int vlen;                  /* width in bytes of the rows the vertical pass combines */
    int ox_lo;                 /* first output column that comes from the image */
    /* in the scratch */
    uint8_t *line;             /* one output row in output order (window + padding) */
    void *lut;
    fl_emit_fn emit;
    const uint8_t **rows;      /* the vertical pass's input rows (fl_render_source) */
    int32_t *acc;
    uint8_t *vrow, *hrow, *prow;
    fl_hrow_plan hp;           /* the horizontal pass (hneed only) */
} fl_rctx;

/* Scratch offsets of one call's pieces (fl_render_layout). */
typedef struct {
    size_t line, lut, hk, hlo, hcnt, htab, hoff, planes, tmp, hrow, prow;
    size_t vk, vlo, vcnt, acc, vrow, work, gray, rows;
} fl_offsets;

/* Derive r's sizes and pass order from r->g (set up) and the view. */
static void
fl_render_shape(fl_rctx *r, const fl_view *src)
{
    const fl_geom *g = &r->g;
    const fl_axis *ax = &g->ax, *ay = &g->ay;
    const fl_plan *plan = r->plan;
    const int empty = g->empty;
    const int gray_in = src->channels == 1;
    r->out_w = g->out_w;
    r->out_h = g->out_h;
    r->to_gray = src->channels == 3 && r->t->out_channels == 1;
    r->wc = gray_in || r->to_gray ? 1 : 3;
    r->simd = fl_use_avx2();
    r->nh = empty ? 0 : g->cx1 - g->cx0;
    r->nv = empty ? 0 : g->cy1 - g->cy0;
    r->sx0 = ax->in_lo;
    r->sw = empty ? 0 : ax->in_hi - ax->in_lo;
    r->sy0 = ay->in_lo;
    r->sh = empty ? 0 : ay->in_hi - ay->in_lo;
    /* Pass order, as Pillow >= 12 chooses it: vertical first when the height
     * shrinks by more than twice as many pixels as the width (older Pillow
     * always ran horizontal first).  Only matters when both axes resample. */
    const int both = !empty && ax->need && ay->need;
    r->vfirst = both && (ay->insize - plan->rs_h) > 0
                && (ay->insize - plan->rs_h) > (ax->insize - plan->rs_w) * 2;
    r->hneed = !empty && ax->need;
    r->htmp = r->hneed && !r->vfirst;
    /* Plane stride of horizontally resampled rows (the AVX2 kernel writes
     * whole blocks of 8); every byte of it is written. */
    r->nhp = r->hneed && r->simd ? (r->nh + 7) & ~7 : r->nh;
    r->ips = ((size_t)r->sw + 31) / 32 * 32 + 32;   /* split source planes, 16+ bytes of slack */
    r->vlen = r->hneed ? (r->vfirst ? r->sw * r->wc : r->nhp * r->wc) : r->nh * r->wc;
    r->ox_lo = plan->flip ? r->out_w - (g->cx1 - plan->win_x) : g->cx0 - plan->win_x;
}

/* Lay out the scratch r needs into *o.  Returns 0 with the total bytes in
 * *total, or -1 when the sizes overflow a size_t. */
static int
fl_render_layout(const fl_rctx *r, fl_offsets *o, size_t *total)
{
    const fl_axis *ax = &r->g.ax, *ay = &r->g.ay;
    const int wc = r->wc, nh = r->nh, nv = r->nv, nhp = r->nhp;
    fl_layout L = {0, 0};
    memset(o, 0, sizeof *o);
    o->line = fl_reserve(&L, (size_t)r->out_w * wc, 1);
    o->lut = fl_reserve(&L, 3 * 256, fl_convert_elsize(r->t));
    if (!r->g.empty) {
        if (ax->need) {
            o->hk = fl_reserve(&L, (size_t)nh * ax->ksize, sizeof(int32_t));
            o->hlo = fl_reserve(&L, (size_t)nh, sizeof(int));
            o->hcnt = fl_reserve(&L, (size_t)nh, sizeof(int));
            if (r->simd) {
                o->htab = fl_reserve(&L, (size_t)nhp / 8 * ax->ksize, FL_HTAB_TAP);
                o->hoff = fl_reserve(&L, (size_t)nhp / 8 * 2 * ax->ksize, sizeof(int32_t));   /* per tap group */
            }
            o->planes = fl_reserve(&L, r->ips * wc, 1);
            if (r->htmp)
                o->tmp = fl_reserve(&L, (size_t)r->sh * nhp * wc, 1);
            else
                o->hrow = fl_reserve(&L, (size_t)nhp * wc, 1);
        } else {
            o->prow = fl_reserve(&L, (size_t)nh * wc, 1);
        }
        if (ay->need) {
            o->vk = fl_reserve(&L, (size_t)nv * ay->ksize, sizeof(int32_t));
            o->vlo = fl_reserve(&L, (size_t)nv, sizeof(int));
            o->vcnt = fl_reserve(&L, (size_t)nv, sizeof(int));
            if (!r->simd)
                o->acc = fl_reserve(&L, (size_t)r->vlen, sizeof(int32_t));
            o->vrow = fl_reserve(&L, (size_t)r->vlen, 1);
        }
        o->work = fl_reserve(&L, (size_t)(ax->ksize > ay->ksize ? ax->ksize : ay->ksize), sizeof(double));
        if (r->to_gray)
            o->gray = fl_reserve(&L, (size_t)r->sh * r->sw, 1);
        o->rows = fl_reserve(&L, (size_t)r->sh, sizeof(uint8_t *));
    }
    *total = L.total;
    return L.overflow ? -1 : 0;
}

/* Coefficients (once per call) into the scratch S, horizontal ones in
 * output order (reversed for a flip), and the horizontal kernel's choice.
 * Needs a window that meets the image. */
static void
fl_render_coeffs(fl_rctx *r, uint8_t *S, const fl_offsets *o)
{
    fl_axis *ax = &r->g.ax, *ay = &r->g.ay;
    double *work = (double *)(void *)(S + o->work);
    if (ax->need) {
        ax->k = (int32_t *)(void *)(S + o->hk);
        ax->lo = (int *)(void *)(S + o->hlo);
        ax->cnt = (int *)(void *)(S + o->hcnt);
        fl_axis_fill(ax, work);
        if (r->plan->flip)
            fl_axis_reverse(ax);
        r->hp.wc = r->wc;
        r->hp.sw = r->sw;
        r->hp.nh = r->nh;
        r->hp.nhp = r->nhp;
        r->hp.planes = S + o->planes;
        r->hp.ips = r->ips;
        r->hp.off = r->simd ? (int32_t *)(void *)(S + o->hoff) : NULL;
        r->hp.tab = r->simd ? S + o->htab : NULL;
        fl_hrow_prepare(&r->hp, ax, r->simd);
    }
    if (ay->need) {
        ay->k = (int32_t *)(void *)(S + o->vk);
        ay->lo = (int *)(void *)(S + o->vlo);
        ay->cnt = (int *)(void *)(S + o->vcnt);
        fl_axis_fill(ay, work);
    }
}

/* r->rows[y]: the vertical pass's input row for source row sy0 + y, either
 * the horizontally resampled row (planar; horizontal first: the pass runs
 * here over all sh rows) or the working source row (interleaved: the view's
 * rows from column sx0, or their convert("L") in the scratch). */
static void
fl_render_source(fl_rctx *r, uint8_t *S, const fl_offsets *o, const fl_view *src)
{
    const uint8_t *wsrc;
    size_t wstride;
    if (r->to_gray) {
        uint8_t *gr = S + o->gray;
        fl_rgb_to_luma(src->data + (size_t)r->sy0 * src->stride + (size_t)r->sx0 * 3, src->stride, r->sw, r->sh, gr);
        wsrc = gr;
        wstride = (size_t)r->sw;
    } else {
        wsrc = src->data + (size_t)r->sy0 * src->stride + (size_t)r->sx0 * r->wc;
        wstride = src->stride;
    }
    const uint8_t **rows = (const uint8_t **)(void *)(S + o->rows);
    if (r->htmp) {
        fl_hrows(&r->hp, wsrc, wstride, r->sh, S + o->tmp, rows);
    } else {
        for (int y = 0; y < r->sh; y++)
            rows[y] = wsrc + (size_t)y * wstride;
    }
    r->rows = rows;
}

/* Output row oy as zeros (padding). */
static void
fl_render_blank(const fl_rctx *r, int oy, void *out)
{
    memset(r->line, 0, (size_t)r->out_w * r->wc);
    r->emit(r->t, r->lut, r->line, (size_t)r->out_w, r->wc, r->out_w, r->out_h, oy, out);
}

/* A row the horizontal pass skipped (nh interleaved pixels) as planes of
 * nh bytes, flipped when the plan says so.  Returns the row to use: prow,
 * or row itself (gray, not flipped). */
static const uint8_t *
fl_render_unresampled(const fl_rctx *r, const uint8_t *row)
{
    const int nh = r->nh;
    uint8_t *prow = r->prow;
    if (r->wc == 3) {
        fl_split3(r->simd, row, nh, prow, (size_t)nh);
        if (r->plan->flip)
            for (int c = 0; c < 3; c++) {
                uint8_t *p = prow + (size_t)c * nh;
                for (int a = 0, b = nh - 1; a < b; a++, b--) {
                    uint8_t v = p[a];
                    p[a] = p[b];
                    p[b] = v;
                }
            }
        return prow;
    }
    if (r->plan->flip) {
        fl_reverse_bytes(prow, row, nh);
        return prow;
    }
    return row;
}

/* Output row oy from the finished row (planar: wc planes of nh pixels in
 * output order at plane stride ps): straight when it fills the row, else
 * through r->line with zero padding outside the image. */
static void
fl_render_window(const fl_rctx *r, const uint8_t *row, size_t ps, int oy, void *out)
{
    const int out_w = r->out_w, nh = r->nh, ox_lo = r->ox_lo;
    if (r->plan->gray && r->wc == 3) {   /* RandomGrayscale: Pillow's convert("L") in every plane */
        uint8_t *d = r->line;
        memset(d, 0, (size_t)out_w * 3);   /* padding is black, gray or not */
        const uint8_t *s0 = row, *s1 = row + ps, *s2 = row + 2 * ps;
        for (int x = 0; x < nh; x++) {
            const uint8_t l = (uint8_t)((s0[x] * 19595u + s1[x] * 38470u + s2[x] * 7471u + 0x8000u) >> 16);
            d[ox_lo + x] = d[out_w + ox_lo + x] = d[2 * out_w + ox_lo + x] = l;
        }
        r->emit(r->t, r->lut, d, (size_t)out_w, 3, out_w, r->out_h, oy, out);
        return;
    }
    if (ox_lo == 0 && nh == out_w) {   /* no horizontal padding: emit straight from the row */
        r->emit(r->t, r->lut, row, ps, r->wc, out_w, r->out_h, oy, out);
        return;
    }
    for (int c = 0; c < r->wc; c++) {
        uint8_t *d = r->line + (size_t)c * out_w;
        if (ox_lo > 0)
            memset(d, 0, (size_t)ox_lo);
        if (ox_lo + nh < out_w)
            memset(d + ox_lo + nh, 0, (size_t)(out_w - ox_lo - nh));
        memcpy(d + ox_lo, row + (size_t)c * ps, (size_t)nh);
    }
    r->emit(r->t, r->lut, r->line, (size_t)out_w, r->wc, out_w, r->out_h, oy, out);
}

/* Output row oy of a window that meets the image: vertical pass, then the
 * horizontal pass when it runs second (or split and flip when it does not
 * run), then window and conversion, written to row oy of out, or to row
 * out_h - 1 - oy for a vertical flip. */
static void
fl_render_row(const fl_rctx *r, int oy, void *out)
{
    const fl_geom *g = &r->g;
    const fl_axis *ay = &g->ay;
    const int ry = r->plan->win_y + oy;
    const int dy = r->plan->vflip ? r->out_h - 1 - oy : oy;
    if (ry < g->cy0 || ry >= g->cy1) {
        fl_render_blank(r, dy, out);
        return;
    }
    const uint8_t *row;   /* the finished row: planar, nh pixels in output order */
    size_t ps;            /* its plane stride */
    if (ay->need) {
        const int i = ry - g->cy0;
        fl_vrow(r->simd, ay->k + (size_t)i * ay->ksize, ay->cnt[i], r->rows + ay->lo[i], r->acc, r->vrow, r->vlen);
        row = r->vrow;
    } else {
        row = r->rows[ry - g->cy0];
    }
    if (r->hneed) {
        if (!r->htmp) {   /* vertical first: now the horizontal pass */
            fl_hrow(&r->hp, row, r->hrow);
            row = r->hrow;
        }
        ps = (size_t)r->nhp;
    } else {              /* no horizontal resample: split and flip here */
        row = fl_render_unresampled(r, row);
        ps = (size_t)r->nh;
    }
    fl_render_window(r, row, ps, dy, out);
}

/* The fused render (geometry, window, flip, conversion in one pass over the
 * output rows), without the policy ops or erasing.  Contract as fl_render,
 * for a spec fl_render has checked (fl_tspec_check sizes the tables and
 * rows below). */
static int
fl_render_fused(const fl_tspec *t, const fl_plan *plan, const fl_view *src, void *out, fl_scratch *scratch,
                fl_err *err)
{
    /* origin and scale bounded (NaN fails every comparison), so no double
     * below converts to an int out of range */
    if (src == NULL || src->data == NULL || src->w <= 0 || src->h <= 0
        || (src->channels != 1 && src->channels != 3) || src->stride < (size_t)src->w * src->channels
        || !(src->scale_x > 1e-6 && src->scale_x <= 16.0) || !(src->scale_y > 1e-6 && src->scale_y <= 16.0)
        || !(fabs(src->origin_x) <= FL_MAX_DIM) || !(fabs(src->origin_y) <= FL_MAX_DIM)) {
        fl_err_set(err, FL_ERR_INVALID, 0, "render: invalid source view");
        return -1;
    }
    fl_rctx r;
    memset(&r, 0, sizeof r);
    r.t = t;
    r.plan = plan;
    int grc = fl_geom_setup(t, plan, src->w, src->h, src->origin_x, src->origin_y, src->scale_x, src->scale_y,
                            &r.g);
    if (grc == -1) {
        fl_err_set(err, FL_ERR_INVALID, 0,
                   "render: invalid plan (box %d x %d, resized %d x %d, out %d x %d, interp %d)", plan->box_w,
                   plan->box_h, plan->rs_w, plan->rs_h, r.g.out_w, r.g.out_h,
                   t->interp == FL_INTERP_RANDOM ? plan->interp : t->interp);
        return -1;
    }
    if (grc == -2) {
        fl_err_set(err, FL_ERR_INVALID, 0, "render: crop box (%d, %d, %d, %d) lies outside the decoded %d x %d buffer",
                      plan->box_x, plan->box_y, plan->box_w, plan->box_h, src->w, src->h);
        return -1;
    }
    fl_render_shape(&r, src);

    fl_offsets o;
    size_t total;
    if (fl_render_layout(&r, &o, &total) < 0) {
        fl_err_set(err, FL_ERR_NOMEM, 0, "render: scratch size overflows");
        return -1;
    }
    if (fl_scratch_grow(scratch, total) < 0) {
        fl_err_set(err, FL_ERR_NOMEM, 0, "render: out of memory (%zu bytes of scratch)", total);
        return -1;
    }
    uint8_t *S = (uint8_t *)scratch->p;
    r.line = S + o.line;
    r.lut = S + o.lut;
    r.emit = fl_convert_table(t, r.lut);

    if (r.g.empty) {   /* the window misses the image: all padding */
        for (int oy = 0; oy < r.out_h; oy++)
            fl_render_blank(&r, oy, out);
        return 0;
    }
    r.acc = (int32_t *)(void *)(S + o.acc);
    r.vrow = S + o.vrow;
    r.hrow = S + o.hrow;
    r.prow = S + o.prow;
    fl_render_coeffs(&r, S, &o);
    fl_render_source(&r, S, &o, src);
    for (int oy = 0; oy < r.out_h; oy++)
        fl_render_row(&r, oy, out);
    return 0;
}

/* Op i of the plan on img: fl_aug_apply, or fl_aug_affine with the plan's
 * RandomAffine parameters.  Returns 0, or -1 with err filled. */
static int
fl_render_op(const fl_plan *plan, int i, const uint8_t *fill, uint8_t *img, int w, int h, int C, uint8_t *tmp,
             fl_err *err)
{
    const int op = plan->aug_op[i];
    if (op == FL_AUG_TV_AFFINE || op == FL_AUG_TV_AFFINE_V2)
        return fl_aug_affine(plan->aff, op == FL_AUG_TV_AFFINE_V2, plan->aug_interp[i], fill, img, w, h, C, tmp, err);
    return fl_aug_apply(op, plan->aug_mag[i], plan->aug_interp[i], fill, img, w, h, C, tmp, err);
}

/* The plan's ops on the w x h uint8 HWC image img (C channels), in place:
 * the ops before the AugMix chains in order, then, for an AugMix plan,
 * each chain on a copy of that image, mixed in float32 with the plan's
 * weights (augment.h fl_augmix_*).  tmp: fl_aug_tmp_bytes scratch; mix:
 * for an AugMix plan, 8-byte aligned room for w * h * C floats (rounded up
 * to 8 bytes) then as many bytes, else unused.  Returns 0, or -1 with err
 * filled (an op's error; FL_ERR_INVALID for chain lengths that do not fit
 * the plan's ops). */
static int
fl_render_policy_ops(const fl_plan *plan, const uint8_t *fill, uint8_t *img, int w, int h, int C, uint8_t *tmp,
                     uint8_t *mix, fl_err *err)
{
    int chained = 0;
    if (plan->mix_chains < 0 || plan->mix_chains > FL_POLICY_MAX_ROUNDS || (plan->mix_chains > 0 && mix == NULL)) {
        fl_err_set(err, FL_ERR_INVALID, 0, "render: invalid AugMix plan (%d chains)", plan->mix_chains);
        return -1;
    }
    for (int c = 0; c < plan->mix_chains; c++) {
        if (plan->mix_len[c] < !plan->mix_timm || plan->mix_len[c] > plan->naug - chained) {
            fl_err_set(err, FL_ERR_INVALID, 0, "render: AugMix chain %d has %d ops, beyond the plan's", c,
                       plan->mix_len[c]);
            return -1;
        }
        chained += plan->mix_len[c];
    }
    const int first = plan->naug - chained;
    for (int i = 0; i < first; i++)
        if (fl_render_op(plan, i, fill, img, w, h, C, tmp, err) < 0)
            return -1;
    if (plan->mix_chains == 0)
        return 0;
    const size_t n = (size_t)w * h * C, n8 = (n + 7) & ~(size_t)7;
    float *acc = (float *)(void *)mix;
    uint8_t *chain = mix + n8 * sizeof(float);
    /* torchvision: acc = m0 * image + sum w_i * chain_i; timm: acc = sum w_i * chain_i
     * (np.zeros + ..., the first sum exact), then blended into the image */
    if (!plan->mix_timm)
        fl_augmix_accumulate(acc, img, n, plan->mix_w0, 1);
    for (int c = 0, i = first; c < plan->mix_chains; c++) {
        memcpy(chain, img, n);
        for (int k = 0; k < plan->mix_len[c]; k++, i++)
            if (fl_render_op(plan, i, fill, chain, w, h, C, tmp, err) < 0)
                return -1;
        fl_augmix_accumulate(acc, chain, n, plan->mix_w[c], plan->mix_timm && c == 0);
    }
    if (!plan->mix_timm) {
        fl_augmix_store(acc, img, n);
        return 0;
    }
    fl_augmix_store(acc, chain, n);   /* np.clip(mixed, 0, 255).astype(uint8) */
    fl_aug_blend(img, chain, n, plan->mix_w0);
    return 0;
}

/* The policy path: render the geometry to a uint8 HWC image in scratch->aux,
 * apply the plan's ops in order (augment.h), RandomGrayscale and
 * GaussianBlur (in the spec's blur.pos order), then convert its rows to the
 * output through the spec's table.  Its tmp is the larger of fl_aug_tmp_bytes
 * and, for a spec with a blur, fl_gblur_tmp_bytes.  Contract as fl_render; needs a plan whose
 * out_w x out_h is the spec's fixed size (fl_tspec_check). */
static int
fl_render_augmented(const fl_tspec *t, const fl_plan *plan, const fl_view *src, void *out, fl_scratch *scratch,
                    fl_err *err)
{
    const int w = plan->out_w, h = plan->out_h, C = t->out_channels;
    if (w != t->out_w || h != t->out_h) {
        fl_err_set(err, FL_ERR_INVALID, 0, "render: plan size %d x %d differs from the spec's %d x %d", w, h,
                   t->out_w, t->out_h);
        return -1;
    }
    const size_t lutb = 3 * 256 * 4, imgb = (size_t)w * h * C, rowb = (size_t)w * C;
    size_t tmpb = fl_aug_tmp_bytes(w, h, C);
    if (tmpb == 0 || imgb / C / w != (size_t)h) {
        fl_err_set(err, FL_ERR_NOMEM, 0, "render: a %d x %d policy image overflows", w, h);
        return -1;
    }
    if (t->blur.p > 0) {   /* the blur's scratch (its padded float rows) when larger; by the spec, so it stays put */
        const size_t bb = fl_gblur_tmp_bytes(w, h, C, t->blur.k.kx, t->blur.k.ky);
        if (bb == 0) {
            fl_err_set(err, FL_ERR_NOMEM, 0, "render: a %d x %d blur scratch overflows", w, h);
            return -1;
        }
        tmpb = bb > tmpb ? bb : tmpb;
    }
    /* tmp must be 8-byte aligned (fl_aug_apply keeps an int table in it): the parts before it rounded up */
    const size_t imgb8 = (imgb + 7) & ~(size_t)7, rowb8 = (rowb + 7) & ~(size_t)7;
    /* AugMix: a float32 accumulator and the chain's image, after tmp (both multiples of 8 bytes) */
    const size_t mixb = plan->mix_chains > 0 ? imgb8 * (sizeof(float) + 1) : 0;
    if (mixb && imgb8 > (SIZE_MAX - lutb - rowb8 - tmpb - 8) / (sizeof(float) + 2)) {
        fl_err_set(err, FL_ERR_NOMEM, 0, "render: a %d x %d AugMix image overflows", w, h);
        return -1;
    }
    const size_t tmpb8 = (tmpb + 7) & ~(size_t)7;
    size_t total = lutb + imgb8 + rowb8 + tmpb8 + mixb;
    if (total > scratch->aux_cap) {
        void *q = realloc(scratch->aux, total);
        if (q == NULL) {
            fl_err_set(err, FL_ERR_NOMEM, 0, "render: out of memory (%zu bytes for the policy image)", total);
            return -1;
        }
        scratch->aux = q;
        scratch->aux_cap = total;
    }
    uint8_t *lut = (uint8_t *)scratch->aux, *img = lut + lutb, *row = img + imgb8, *tmp = row + rowb8;

    fl_tspec u = *t;   /* the geometry alone, as uint8 HWC: valid, being t's with fields cleared */
    u.dtype = FL_DT_U8;
    u.layout = FL_LAYOUT_HWC;
    u.scale_to_unit = FL_SCALE_NONE;
    u.normalize = 0;
    memset(&u.policy, 0, sizeof u.policy);
    memset(&u.jitter, 0, sizeof u.jitter);
    memset(&u.blur, 0, sizeof u.blur);
    memset(&u.erase, 0, sizeof u.erase);
    fl_plan g = *plan;
    g.naug = 0;
    g.nerase = 0;
    g.gray = 0;   /* after the ops, below */
    g.blur = 0.0;
    if (fl_render_fused(&u, &g, src, img, scratch, err) < 0)
        return -1;
    /* one fill: the policy's, or RandomRotation's (fl_tspec_check: equal when both) */
    const int *fv = t->policy.rounds > 0 ? t->policy.fill : t->rot_fill;
    uint8_t fill[3] = {(uint8_t)fv[0], (uint8_t)fv[1], (uint8_t)fv[2]};
    if (fl_render_policy_ops(plan, fill, img, w, h, C, tmp, mixb ? tmp + tmpb8 : NULL, err) < 0)
        return -1;
    /* GaussianBlur, before or after the gray as the Compose has it */
    const int blur = plan->blur > 0, blur_pos = t->blur.pos;
    const float sigma = (float)plan->blur;
    if (blur && blur_pos == FL_BLUR_BEFORE_GRAY && fl_gblur_apply(&t->blur.k, sigma, img, w, h, C, tmp, err) < 0)
        return -1;
    if (plan->gray && C == 3) {   /* RandomGrayscale after the ops: Pillow's convert("L") in every channel */
        for (size_t i = 0; i < (size_t)w * h; i++) {
            uint8_t *q = img + 3 * i;
            q[0] = q[1] = q[2] = (uint8_t)((q[0] * 19595u + q[1] * 38470u + q[2] * 7471u + 0x8000u) >> 16);
        }
    }
    if (blur && blur_pos == FL_BLUR_AFTER_GRAY && fl_gblur_apply(&t->blur.k, sigma, img, w, h, C, tmp, err) < 0)
        return -1;
    fl_emit_fn emit = fl_convert_table(t, lut);
    const int simd = fl_use_avx2();
    for (int oy = 0; oy < h; oy++) {
        const uint8_t *s = img + (size_t)oy * w * C;
        if (C == 1) {
            emit(t, lut, s, (size_t)w, 1, w, h, oy, out);
            continue;
        }
        fl_split3(simd, s, w, row, (size_t)w);   /* interleaved -> planar, as the emitters take rows */
        emit(t, lut, row, (size_t)w, 3, w, h, oy, out);
    }
    return 0;
}

#if defined(FL_X86_SIMD) && defined(__GLIBC__)
/* glibc's libmvec: logf, sinf, cosf on 8 floats (AVX2 variants, x86_64 vector ABI). */
__attribute__((target("avx2"))) __m256 _ZGVdN8v_logf(__m256 x);
__attribute__((target("avx2"))) __m256 _ZGVdN8v_sinf(__m256 x);
__attribute__((target("avx2"))) __m256 _ZGVdN8v_cosf(__m256 x);

/* fl_erase_normals' first (n / 16) * 16 values, 8 pairs a step: the same
 * draws and uniforms in the same order, logf / sinf / cosf from libmvec
 * (within 4 ulp of libm's, so the last bits of a value may differ from the
 * portable loop's; the draws and their use do not).  Returns the values
 * written.  Pure but for rng; no GIL. */
__attribute__((target("avx2"))) static int
fl_erase_normals_avx2(fl_rng *rng, float *z, int n)
{
    const __m256 m24 = _mm256_set1_ps(0x1p-24f), two_pi = _mm256_set1_ps(6.28318530717958647692f);
    const __m256 m2 = _mm256_set1_ps(-2.0f);
    const __m256i one = _mm256_set1_epi32(1);
    int k = 0;
    for (; k + 16 <= n; k += 16) {
        uint32_t w1[8], w2[8];
        for (int p = 0; p < 8; p++) {
            const uint64_t b = fl_rng_next(rng);
            w1[p] = (uint32_t)b >> 8;
            w2[p] = (uint32_t)(b >> 32) >> 8;
        }
        __m256 u1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(const void *)w1), one)), m24);
        __m256 u2 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(const void *)w2)), m24);
        __m256 r = _mm256_sqrt_ps(_mm256_mul_ps(m2, _ZGVdN8v_logf(u1)));
        __m256 a = _mm256_mul_ps(two_pi, u2);
        __m256 c = _mm256_mul_ps(r, _ZGVdN8v_cosf(a)), s = _mm256_mul_ps(r, _ZGVdN8v_sinf(a));
        /* (c0 s0 c1 s1 ...): unpack within the 128-bit lanes, then put the lanes in order */
        __m256 lo = _mm256_unpacklo_ps(c, s), hi = _mm256_unpackhi_ps(c, s);
        _mm256_storeu_ps(z + k, _mm256_permute2f128_ps(lo, hi, 0x20));
        _mm256_storeu_ps(z + k + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
    }
    return k;
}
#endif

/* n N(0, 1) values into z, from rng: Box-Muller in float (as torch's
 * normal_ on a float tensor), on 24-bit uniforms, u1 in (0, 1] and u2 in
 * [0, 1), each Philox block (two fl_rng_next) giving two pairs, both
 * values of each pair used in turn.  |z| < 5.8 (u1 >= 2^-24).  Pure but
 * for rng; no GIL. */
static void
fl_erase_normals(fl_rng *rng, float *z, int n)
{
    int k = 0;
#if defined(FL_X86_SIMD) && defined(__GLIBC__)
    if (fl_use_avx2())
        k = fl_erase_normals_avx2(rng, z, n);
#endif
    for (; k < n; k += 4) {
        const uint64_t b0 = fl_rng_next(rng), b1 = fl_rng_next(rng);
        const uint32_t w[4] = {(uint32_t)b0, (uint32_t)(b0 >> 32), (uint32_t)b1, (uint32_t)(b1 >> 32)};
        for (int p = 0; p < 2 && k + 2 * p < n; p++) {
            const float u1 = (float)((w[2 * p] >> 8) + 1u) * 0x1p-24f;
            const float u2 = (float)(w[2 * p + 1] >> 8) * 0x1p-24f;
            const float r = sqrtf(-2.0f * logf(u1));
            float sn, cs;
            sincosf(6.28318530717958647692f * u2, &sn, &cs);
            z[k + 2 * p] = r * cs;
            if (k + 2 * p + 1 < n)
                z[k + 2 * p + 1] = r * sn;
        }
    }
}

/* RandomErasing: write each of the plan's boxes, in order, into the
 * finished out_w x out_h sample at out (t's dtype and layout): the spec's
 * constant, or N(0, 1) values (one per element, FL_ERASE_NORMAL, channel-
 * major as torch's normal_([C, h, w]), fl_erase_normals along each row;
 * or one per channel and box, FL_ERASE_CHANNEL) drawn from rng.h keyed by
 * the plan's erase_key.
 * Returns 0, or -1 with err filled (FL_ERR_INVALID) for a box outside the
 * sample. */
static int
fl_render_erase(const fl_tspec *t, const fl_plan *plan, void *out, fl_err *err)
{
    const int W = plan->out_w, H = plan->out_h, C = t->out_channels;
    const size_t es = fl_convert_elsize(t);
    uint8_t *o = (uint8_t *)out;
    fl_rng rng;
    fl_rng_init(&rng, plan->erase_key, 0, 0);
    for (int b = 0; b < plan->nerase; b++) {
        const int *box = plan->erase_box[b];
        const int x0 = box[0], y0 = box[1], ew = box[2], eh = box[3];
        if (x0 < 0 || y0 < 0 || ew < 0 || eh < 0 || x0 > W - ew || y0 > H - eh) {
            fl_err_set(err, FL_ERR_INVALID, 0, "render: erase box (%d, %d, %d, %d) lies outside the %d x %d sample",
                       x0, y0, ew, eh, W, H);
            return -1;
        }
        if (t->erase.mode == FL_ERASE_NORMAL) {   /* one value per element, channel-major, in pairs */
            float noise[256];
            for (int c = 0; c < C; c++)
                for (int y = y0; y < y0 + eh; y++)
                    for (int x1 = x0; x1 < x0 + ew; x1 += 256) {
                        int n = x0 + ew - x1 < 256 ? x0 + ew - x1 : 256;
                        fl_erase_normals(&rng, noise, n);
                        if (t->layout == FL_LAYOUT_CHW && t->dtype == FL_DT_F32) {
                            memcpy(o + (((size_t)c * H + y) * W + x1) * es, noise, (size_t)n * sizeof(float));
                            continue;
                        }
                        for (int k = 0; k < n; k++) {
                            size_t idx = t->layout == FL_LAYOUT_CHW ? ((size_t)c * H + y) * W + x1 + k
                                                                    : ((size_t)y * W + x1 + k) * C + c;
                            fl_convert_store(t, noise[k], o + idx * es);
                        }
                    }
            continue;
        }
        for (int c = 0; c < C; c++) {
            uint8_t cval[4];
            float v = t->erase.mode == FL_ERASE_CONST ? t->erase.value[c] : (float)fl_rng_normal(&rng);
            fl_convert_store(t, v, cval);
            for (int y = y0; y < y0 + eh; y++) {
                for (int x = x0; x < x0 + ew; x++) {
                    size_t idx = t->layout == FL_LAYOUT_CHW ? ((size_t)c * H + y) * W + x
                                                            : ((size_t)y * W + x) * C + c;
                    memcpy(o + idx * es, cval, es);
                }
            }
        }
    }
    return 0;
}

/* Contract: imgops.h. */
int
fl_render(const fl_tspec *t, const fl_plan *plan, const fl_view *src, void *out, fl_scratch *scratch,
          fl_err *err)
{
    if (plan == NULL || plan->naug < 0 || plan->naug > FL_PLAN_MAX_AUG || plan->nerase < 0
        || plan->nerase > FL_ERASE_MAX_BOXES) {
        fl_err_set(err, FL_ERR_INVALID, 0, "render: invalid plan");
        return -1;
    }
    if (fl_tspec_check(t, err) < 0)   /* once per call: both paths rely on it */
        return -1;
    if (!(plan->blur >= 0)) {   /* fl_gblur_apply checks its range */
        fl_err_set(err, FL_ERR_INVALID, 0, "render: the plan's blur sigma %g is not a sigma", plan->blur);
        return -1;
    }
    if (plan->blur > 0 && t->blur.p == 0) {
        fl_err_set(err, FL_ERR_INVALID, 0, "render: the plan blurs (sigma %g) but the spec has no GaussianBlur",
                   plan->blur);
        return -1;
    }
    int rc = plan->naug > 0 || plan->blur > 0 ? fl_render_augmented(t, plan, src, out, scratch, err)
                                              : fl_render_fused(t, plan, src, out, scratch, err);
    if (rc == 0 && plan->nerase)
        rc = fl_render_erase(t, plan, out, err);
    fl_convert_fence();   /* the float rows' streamed stores, before the caller publishes out */
    return rc;
}
