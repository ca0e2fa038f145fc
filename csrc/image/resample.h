/* resample.h: the resampler behind fl_render (private to the imgops units;
 * implemented in resample.c).
 *
 * Pillow's separable antialiased resample in fixed point, with its BILINEAR
 * or BICUBIC filter (imgops.h FL_INTERP_BILINEAR / FL_INTERP_BICUBIC), one axis
 * at a time: fl_axis describes one axis (the box, the wanted outputs and
 * their coefficients), fl_hrow runs the horizontal pass on one row
 * (fl_hrows on many) and fl_vrow the vertical pass for one output row.  Rows between the passes are
 * planar: a row of n pixels with wc channels is wc planes of n bytes at a
 * plane stride, so both passes work on runs of single-channel bytes.
 *
 * Kernel choice: fl_use_avx2() (imgops_internal.h) says whether the AVX2 kernels run; fl_render
 * asks once per call and passes the answer on (fl_hrow_prepare, fl_vrow,
 * fl_split3).  Portable and AVX2 kernels compute the same integer sums
 * (signed 32-bit weights and accumulators, arithmetic shift, clip to
 * 0..255), so they give the same bytes, negative bicubic lobes included.
 *
 * No Python, no GIL: every function here works on caller-owned memory only,
 * allocates nothing and is re-entrant.
 */
#ifndef FL_RESAMPLE_H
#define FL_RESAMPLE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "image/imgops_internal.h"

/* The AVX2 kernels are compiled on x86-64 Linux with GCC or clang. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__linux__)
#define FL_X86_SIMD 1
#define FL_AVX2 __attribute__((target("avx2")))
#endif

#define FL_HTAB_TAP 96   /* AVX2 horizontal table: bytes per (block, tap pair); reserved per tap */

/* One axis of the resample: the box [in0, in1) relative to buffer index
 * `base` (which may lie outside the buffer), `insize` pixels from base form
 * the filter's domain (Pillow's input size), resized to out_size; outputs
 * [o0, o1) are wanted. */
typedef struct {
    double in0, in1;
    int base, insize, out_size;
    int o0, o1;
    int need;                  /* 0: this axis is not resampled (identity) */
    int interp;                /* FL_INTERP_BILINEAR or FL_INTERP_BICUBIC */
    double scale, support, filterscale;
    int ksize;                 /* taps stride in the coefficient table */
    int kmax;                  /* largest tap count of a wanted output */
    int fixed;                 /* every output has exactly ksize taps (see fl_axis_make_fixed) */
    int in_lo, in_hi;          /* buffer pixels read by outputs [o0, o1) */
    int *lo, *cnt;             /* per wanted output: first buffer pixel (relative to in_lo), taps */
    int32_t *k;                /* per wanted output: ksize fixed-point weights */
} fl_axis;


/* Map the box [b0, b1) (buffer coordinates) of one axis onto a buffer of
 * `len` pixels, resized to out_size with the filter `interp`
 * (FL_INTERP_BILINEAR: support 1, FL_INTERP_BICUBIC: support 2, times the
 * downscale factor), outputs [o0, o1) wanted (o0 < o1).  Sets everything
 * but lo/cnt/k/kmax (those are set to NULL / 0); in_lo/in_hi cover the
 * wanted outputs' taps for that filter.  Returns 0, or -1 when the box
 * misses the buffer or interp is not one of those two.  Exactness rules:
 * resample.c. */
int fl_axis_setup(fl_axis *a, int interp, double b0, double b1, int len, int out_size, int o0, int o1);

/* Fill a->lo, a->cnt (caller-owned arrays of o1 - o0 ints) and a->k
 * ((o1 - o0) * ksize int32) exactly as Pillow computes and rounds them for
 * the axis' filter (bicubic weights can be negative), and kmax; w is
 * caller-owned work space of ksize doubles.  Needs a set-up axis with
 * need = 1. */
void fl_axis_fill(fl_axis *a, double *w);

/* Reverse the order of the wanted outputs of a filled axis (a horizontal
 * flip computed by the resample itself: every output is independent of the
 * others). */
void fl_axis_reverse(fl_axis *a);

/* A portable horizontal kernel (see resample.c: fl_hpass_c*). */
typedef void (*fl_hpass_fn)(const fl_axis *, const uint8_t *, size_t, int, uint8_t *, size_t, int);

/* The horizontal pass as it runs on every row of one fl_render call. */
typedef struct {
    const fl_axis *ax;         /* the filled horizontal axis */
    int wc;                    /* working channels, 1 or 3 */
    int sw;                    /* source pixels a row holds (the axis' read span) */
    int nh;                    /* outputs per row (ax->o1 - ax->o0) */
    int nhp;                   /* output plane stride (>= nh; whole blocks of 8 with AVX2) */
    uint8_t *planes;           /* wc planes of ips bytes: the split source row */
    size_t ips;
    int simd;                  /* 1: the AVX2 kernel runs, with off/tab/gs */
    int gs;                    /* AVX2: taps per group (each group loads its own 16 bytes) */
    fl_hpass_fn c;             /* else this portable kernel */
    int32_t *off;
    uint8_t *tab;
} fl_hrow_plan;

/* Choose the horizontal kernel for a filled axis and set up *h (all other
 * fields are set by the caller first).  With simd (fl_use_avx2()) the AVX2
 * table is built into h->off (at most 2 * ksize * nhp / 8 int32: 2 per
 * block and tap group) and h->tab (nhp / 8 * ksize * FL_HTAB_TAP bytes),
 * the taps in groups of h->gs that each fit the kernel's 16-byte window
 * (one group when all of them do); when not even single taps fit (an
 * output's 4-block spreads over 16 or more pixels: a downscale by more
 * than about 5), or without simd, the axis is made fixed-length where it
 * can be and a portable kernel is picked.  Zeroes the
 * planes' slack (bytes sw..ips of each), which the AVX2 loads may read. */
void fl_hrow_prepare(fl_hrow_plan *h, fl_axis *ax, int simd);

/* The kernels.  fl_render reaches them through the inline dispatchers
 * below, once per row: the AVX2 kernels directly; the portable ones
 * through the *_portable functions, since those kernels are target_clones
 * (FL_HOT) and stay static in resample.c (GCC exports the resolver of a
 * non-static one from the shared object, whatever its visibility). */

/* Split n interleaved RGB pixels s into three planes at d (stride ps),
 * portable kernel. */
void fl_split3_portable(const uint8_t *s, int n, uint8_t *d, size_t ps);

/* Portable vertical pass for one output row: n taps (weights k) of the rows
 * rows[0..n) (len bytes each) -> d; acc is len int32 of scratch. */
void fl_vrow_portable(const int32_t *k, int n, const uint8_t *const *rows, int32_t *acc, uint8_t *d, int len);

/* fl_hrow (below) with a portable kernel (h->simd == 0). */
void fl_hrow_portable(const fl_hrow_plan *h, const uint8_t *s, uint8_t *d);

#ifdef FL_X86_SIMD
/* fl_split3_portable with AVX2. */
FL_AVX2 void fl_split3_avx2(const uint8_t *s, int n, uint8_t *d, size_t ps);

/* The inverse: n pixels of the planes s0, s1, s2 interleaved into d (3 * n
 * bytes, not aliasing them), 16 pixels at a time.  Pure; any thread. */
FL_AVX2 void fl_merge3_avx2(const uint8_t *s0, const uint8_t *s1, const uint8_t *s2, uint8_t *d, int n);

/* AVX2 horizontal pass of wc planes (stride ips, pixels from the axis'
 * in_lo) -> out planes (stride ops), nh outputs each, through the table
 * (off, tab) that fl_hrow_prepare builds for kb = the axis' kmax taps in
 * groups of gs.  Writes 8 * ceil(nh / 8) bytes per output plane. */
FL_AVX2 void fl_hpass_avx2(const uint8_t *planes, size_t ips, int wc, int nh, int kb, int gs, const int32_t *off,
                           const uint8_t *tab, uint8_t *out, size_t ops);

/* fl_vrow_portable with AVX2 (no acc needed). */
FL_AVX2 void fl_vpass_avx2(const int32_t *k, int n, const uint8_t *const *rows, uint8_t *d, int len);
#endif

/* Horizontal pass of one interleaved row s (h->sw pixels, h->wc channels)
 * into d (h->wc planes at stride h->nhp, h->nh outputs each; the AVX2
 * kernel writes whole blocks of 8, up to nhp).  Uses h->planes as work
 * space, so one fl_hrow_plan serves one thread. */
static inline void
fl_hrow(const fl_hrow_plan *h, const uint8_t *s, uint8_t *d)
{
#ifdef FL_X86_SIMD
    if (h->simd) {
        if (h->wc == 3)
            fl_split3_avx2(s, h->sw, h->planes, h->ips);
        else
            memcpy(h->planes, s, (size_t)h->sw);
        fl_hpass_avx2(h->planes, h->ips, h->wc, h->nh, h->ax->kmax, h->gs, h->off, h->tab, d, (size_t)h->nhp);
        return;
    }
#endif
    fl_hrow_portable(h, s, d);
}

/* fl_hrow over n rows (the horizontal pass first, over every source row):
 * row y (at src + y * sstride) into dst + y * h->nhp * h->wc, and rows[y]
 * points at that output. */
void fl_hrows(const fl_hrow_plan *h, const uint8_t *src, size_t sstride, int n, uint8_t *dst, const uint8_t **rows);

/* Vertical pass for one output row: n taps (weights k) of the rows
 * rows[0..n) (len bytes each) -> d (len bytes).  acc is len int32 of work
 * space, used by the portable kernel only. */
static inline void
fl_vrow(int simd, const int32_t *k, int n, const uint8_t *const *rows, int32_t *acc, uint8_t *d, int len)
{
#ifdef FL_X86_SIMD
    if (simd) {
        fl_vpass_avx2(k, n, rows, d, len);
        return;
    }
#else
    (void)simd;
#endif
    fl_vrow_portable(k, n, rows, acc, d, len);
}

/* fl_split3_portable or fl_split3_avx2, as simd says. */
static inline void
fl_split3(int simd, const uint8_t *s, int n, uint8_t *d, size_t ps)
{
#ifdef FL_X86_SIMD
    if (simd) {
        fl_split3_avx2(s, n, d, ps);
        return;
    }
#else
    (void)simd;
#endif
    fl_split3_portable(s, n, d, ps);
}

#endif
