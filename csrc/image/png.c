/* png.c: PNG decoding with libspng, to Pillow's pixels (see codecs.h).
 *
 * Pillow's rules (Pillow 13: PngImagePlugin's modes, Convert.c), followed
 * here and tested in tests/test_codecs.py:
 *   - the file's mode: gray 1-bit "1" (0/255 inside Pillow, bool in NumPy:
 *     FL_IMG_NATIVE gives 0/1), gray 2/4-bit "L" scaled (x85, x17), gray
 *     8 "L", gray 16 "I;16"; RGB 8/16 "RGB" (a 16-bit sample's high byte);
 *     palette "P" (indices); gray+alpha 8 "LA", 16 "RGBA" (L, L, L, A);
 *     RGBA 8/16 "RGBA".
 *   - "I;16" to L, RGB or RGBA clips at 255.
 *   - a palette index past PLTE's entries is black; to L a palette entry
 *     goes through rgb2l; to RGBA its alpha is tRNS's (255 past its end).
 *   - tRNS of a gray or RGB file: alpha 0 where Pillow's pixel equals the
 *     chunk's raw value (for 1-bit: 255 when it is non-zero), so a 2-, 4-bit
 *     gray or 16-bit RGB file's tRNS matches only where Pillow's scaled or high-byte
 *     pixel happens to equal the raw value, as in Pillow; for 16-bit gray
 *     ("I;16" to RGBA) Pillow compares the pixel clipped to 255 with the
 *     low byte of the raw value.
 *   - checks: the CRC of every chunk before the first IDAT (Pillow refuses
 *     the file); not the CRCs of IDAT and later chunks (Pillow does not
 *     read them); the zlib stream's Adler-32 (Pillow's zlib does).
 * Gamma, ICC profiles and sBIT are ignored, as Pillow's convert ignores them.
 *
 * Two paths to the same pixels.  A non-interlaced file whose chunks' CRCs
 * are right (nearly every PNG in a dataset) is inflated whole by libdeflate
 * and unfiltered here (fast_decode: 2.6x libspng's speed on photographs,
 * which inflates with zlib and unfilters a byte at a time; RESULTS §19b).  Everything else, and any file the fast path finds anything wrong
 * with (a bad zlib stream or Adler-32, a short or long stream, an unknown
 * filter), is decoded by libspng from the start, which reports what is
 * wrong as it always has: the fast path never reports a file's fault.
 *
 * Pure C, no GIL.  The input is borrowed; spng's context lives for one call.
 */
#include "image/codecs_internal.h"

#include <libdeflate.h>
#include <spng.h>
#include <stdio.h>
#include <string.h>
#include <zlib.h>
#if defined(__SSE2__) && defined(__x86_64__)
#include <emmintrin.h>
#endif

/* libspng's limits on ancillary chunks (text, ICC, EXIF): one chunk and all
 * kept together, as Pillow's MAX_TEXT_CHUNK (1 MiB) / MAX_TEXT_MEMORY (64 MiB)
 * bound what a compressed text chunk may expand to: a zTXt bomb fails, it
 * does not fill memory.  libspng refuses a chunk that inflates past half
 * of chunk_size, so 2 MiB puts the boundary at Pillow's 1 MiB (measured:
 * 1.00 MiB of text decodes in both, 1.01 MiB fails in both). */
#define FL_PNG_CHUNK_LIMIT ((size_t)2 << 20)
#define FL_PNG_CACHE_LIMIT ((size_t)64 << 20)

static uint32_t
be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Walk the chunks: verify the CRC of each one before the first IDAT (as
 * Pillow's open does); with idat_crc_ok non-NULL, go on through the IDATs
 * and say there whether every IDAT's CRC is right (libspng is then told to
 * check them, and with them the zlib stream's Adler-32), else stop at the
 * first IDAT (a header read needs no more).  Stops at the first chunk after
 * the IDATs, or where the file ends (a truncated IDAT is libspng's to
 * report).  0, or -1 with err filled. */
static int
prepass(const uint8_t *d, size_t n, int *idat_crc_ok, fl_err *err)
{
    size_t pos = 8;
    int seen_idat = 0;
    if (idat_crc_ok)
        *idat_crc_ok = 1;
    for (;;) {
        if (pos + 8 > n) {
            if (seen_idat)
                return 0;
            fl_err_set(err, FL_ERR_DECODE, 0, "PNG: truncated before the image data (%zu bytes)", n);
            return -1;
        }
        uint32_t len = be32(d + pos);
        const uint8_t *type = d + pos + 4;
        int is_idat = memcmp(type, "IDAT", 4) == 0;
        if (len > 0x7fffffffu) {
            if (seen_idat) { /* past the image data: libspng reports it, after the pixel limit's check */
                if (is_idat)
                    *idat_crc_ok = 0;
                return 0;
            }
            fl_err_set(err, FL_ERR_DECODE, 0, "PNG: chunk length %u at byte %zu is invalid", len, pos);
            return -1;
        }
        if ((seen_idat && !is_idat) || (is_idat && !idat_crc_ok))
            return 0;
        if (pos + 12 + (size_t)len > n) {
            if (seen_idat || is_idat)
                return 0; /* libspng reports the cut */
            fl_err_set(err, FL_ERR_DECODE, 0, "PNG: truncated in chunk '%.4s' at byte %zu", (const char *)type,
                       pos);
            return -1;
        }
        uint32_t want = be32(d + pos + 8 + len);
        uint32_t got = libdeflate_crc32(0, type, 4 + (size_t)len);
        if (is_idat) {
            seen_idat = 1;
            if (got != want)
                *idat_crc_ok = 0;
        } else if (got != want) {
            fl_err_set(err, FL_ERR_DECODE, 0, "PNG: broken file (bad CRC in chunk '%.4s' at byte %zu)",
                       (const char *)type, pos);
            return -1;
        } else if (memcmp(type, "IEND", 4) == 0) {
            fl_err_set(err, FL_ERR_DECODE, 0, "PNG: no image data (IEND before any IDAT)");
            return -1;
        }
        pos += 12 + (size_t)len;
    }
}

/* The zlib stream of the IDAT chunks inflated to nowhere, to check its
 * Adler-32 when libspng was told not to (a file with a wrong IDAT CRC:
 * libspng's "ignore CRCs" also skips the Adler-32).  0, or -1 with err
 * filled (FL_ERR_DECODE "broken data stream", or FL_ERR_NOMEM). */
static int
check_adler(const uint8_t *d, size_t n, fl_err *err)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit(&z) != Z_OK) {
        fl_err_set(err, FL_ERR_NOMEM, 0, "PNG: zlib could not start");
        return -1;
    }
    uint8_t sink[16384];
    int rc = Z_OK;
    size_t pos = 8;
    while (rc == Z_OK && pos + 12 <= n) {
        uint32_t len = be32(d + pos);
        if (memcmp(d + pos + 4, "IDAT", 4) == 0 && pos + 12 + (size_t)len <= n) {
            z.next_in = (Bytef *)(d + pos + 8);
            z.avail_in = len;
            while (rc == Z_OK && z.avail_in > 0) {
                z.next_out = sink;
                z.avail_out = sizeof sink;
                rc = inflate(&z, Z_NO_FLUSH);
                if (rc == Z_BUF_ERROR)
                    rc = Z_OK;
            }
        }
        pos += 12 + (size_t)len;
    }
    inflateEnd(&z);
    if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT) {
        fl_err_set(err, FL_ERR_DECODE, 0, "PNG: broken data stream (%s)", z.msg ? z.msg : "zlib error");
        return -1;
    }
    return 0;
}

static void
spng_error(int rc, fl_err *err)
{
    int code = FL_ERR_DECODE;
    if (rc == SPNG_EMEM)
        code = FL_ERR_NOMEM;
    else if (rc == SPNG_ECHUNK_LIMITS || rc == SPNG_EUSER_WIDTH || rc == SPNG_EUSER_HEIGHT)
        code = FL_ERR_LIMIT;
    const char *why = rc == SPNG_IO_EOF || rc == SPNG_EOI ? "truncated" : spng_strerror(rc);
    fl_err_set(err, code, 0, "PNG: %s", why);
}

static void
fill_info(const struct spng_ihdr *h, int has_trns, fl_img_info *info)
{
    memset(info, 0, sizeof *info);
    info->format = FL_IMG_PNG;
    info->width = (int)h->width;
    info->height = (int)h->height;
    info->bit_depth = h->bit_depth;
    info->color_type = h->color_type;
    info->interlaced = h->interlace_method != 0;
    info->bytes = 1;
    info->has_alpha = has_trns || h->color_type == 4 || h->color_type == 6;
    const char *mode = "L";
    int ch = 1;
    switch (h->color_type) {
    case 0:
        mode = h->bit_depth == 1 ? "1" : h->bit_depth == 16 ? "I;16" : "L";
        if (h->bit_depth == 16)
            info->bytes = 2;
        break;
    case 2: mode = "RGB"; ch = 3; break;
    case 3: mode = "P"; break;
    case 4:
        mode = h->bit_depth == 16 ? "RGBA" : "LA";
        ch = h->bit_depth == 16 ? 4 : 2;
        break;
    default: mode = "RGBA"; ch = 4; break;
    }
    snprintf(info->mode, sizeof info->mode, "%s", mode);
    info->channels = ch;
}

/* A new libspng context on data (CRC actions per prepass), its header read
 * into *ihdr and its tRNS into *t (*has_trns: whether there is one).
 * Reading tRNS reads every chunk before the image data, so an ancillary
 * chunk over the limits (a zTXt bomb) fails here, with its reason.  NULL
 * with err filled. */
static spng_ctx *
open_ctx(const uint8_t *data, size_t len, int idat_crc_ok, struct spng_ihdr *ihdr, struct spng_trns *t,
         int *has_trns, fl_err *err)
{
    spng_ctx *ctx = spng_ctx_new(0);
    if (!ctx) {
        fl_err_set(err, FL_ERR_NOMEM, 0, "PNG: out of memory for a decoder");
        return NULL;
    }
    int rc = spng_set_crc_action(ctx, idat_crc_ok ? SPNG_CRC_ERROR : SPNG_CRC_USE, SPNG_CRC_USE);
    if (rc == 0)
        rc = spng_set_chunk_limits(ctx, FL_PNG_CHUNK_LIMIT, FL_PNG_CACHE_LIMIT);
    if (rc == 0)
        rc = spng_set_png_buffer(ctx, data, len);
    if (rc == 0)
        rc = spng_get_ihdr(ctx, ihdr);
    if (rc == 0) {
        memset(t, 0, sizeof *t);
        rc = spng_get_trns(ctx, t);
        *has_trns = rc == 0;
        if (rc == SPNG_ECHUNKAVAIL)
            rc = 0;
    }
    if (rc != 0) {
        spng_error(rc, err);
        spng_ctx_free(ctx);
        return NULL;
    }
    return ctx;
}

int
fl_png_info(const uint8_t *data, size_t len, fl_img_info *info, fl_err *err)
{
    if (prepass(data, len, NULL, err) < 0)
        return -1;
    struct spng_ihdr h;
    struct spng_trns t;
    int has_trns;
    spng_ctx *ctx = open_ctx(data, len, 1, &h, &t, &has_trns, err);
    if (!ctx)
        return -1;
    spng_ctx_free(ctx);
    fill_info(&h, has_trns, info);
    return 0;
}

/* Sample i of a row in libspng's SPNG_FMT_PNG layout: packed MSB first below
 * 8 bits, host-endian 16-bit.  Pure. */
static inline unsigned
sample_at(const uint8_t *row, int depth, size_t i)
{
    if (depth == 8)
        return row[i];
    if (depth == 16) {
        uint16_t v;
        memcpy(&v, row + 2 * i, 2);
        return v;
    }
    size_t bit = i * (size_t)depth;
    return (row[bit >> 3] >> (8 - depth - (int)(bit & 7))) & ((1u << depth) - 1u);
}

/* Everything a row conversion needs besides the rows. */
typedef struct {
    int ct, depth, width, mode;
    int has_trns;
    unsigned tg, tr, tgr, tb;        /* tRNS gray / RGB, raw */
    uint8_t pal[256][3], palpha[256];
} conv;

/* One row from libspng's layout to the output mode (see the rules at the
 * top).  Pure. */
static void
convert_row(const conv *c, const uint8_t *src, uint8_t *dst)
{
    const int d = c->depth, w = c->width;
    for (int x = 0; x < w; x++) {
        unsigned r = 0, g = 0, b = 0, a = 255, raw = 0;
        int native_gray16 = 0;
        switch (c->ct) {
        case 0: {
            raw = sample_at(src, d, (size_t)x);
            unsigned p = d == 1 ? (raw ? 255u : 0u) : d == 2 ? raw * 85u : d == 4 ? raw * 17u : raw;
            unsigned tv = d == 1 ? (c->tg ? 255u : 0u) : d == 16 ? (c->tg & 0xffu) : c->tg;
            /* 16-bit: Pillow compares the clipped 8-bit pixel with the low byte of the raw value */
            if (c->has_trns && (d == 16 ? (p > 255 ? 255 : p) : p) == tv)
                a = 0;
            if (d == 16) {
                native_gray16 = 1;
                p = p > 255 ? 255 : p;
            }
            r = g = b = p;
            if (c->mode == FL_IMG_NATIVE) {
                if (native_gray16) {
                    uint16_t v = (uint16_t)raw;
                    memcpy(dst + 2 * (size_t)x, &v, 2);
                } else {
                    dst[x] = (uint8_t)(d == 1 ? raw : r);
                }
                continue;
            }
            break;
        }
        case 2: {
            unsigned s0 = sample_at(src, d, 3 * (size_t)x), s1 = sample_at(src, d, 3 * (size_t)x + 1),
                     s2 = sample_at(src, d, 3 * (size_t)x + 2);
            int sh = d == 16 ? 8 : 0;
            r = s0 >> sh;
            g = s1 >> sh;
            b = s2 >> sh;
            if (c->has_trns && r == c->tr && g == c->tgr && b == c->tb)
                a = 0;
            if (c->mode == FL_IMG_NATIVE) {
                uint8_t *q = dst + 3 * (size_t)x;
                q[0] = (uint8_t)r, q[1] = (uint8_t)g, q[2] = (uint8_t)b;
                continue;
            }
            break;
        }
        case 3: {
            unsigned i = sample_at(src, d, (size_t)x);
            if (c->mode == FL_IMG_NATIVE) {
                dst[x] = (uint8_t)i;
                continue;
            }
            r = c->pal[i][0], g = c->pal[i][1], b = c->pal[i][2];
            a = c->palpha[i];
            break;
        }
        case 4: {
            int sh = d == 16 ? 8 : 0;
            r = g = b = sample_at(src, d, 2 * (size_t)x) >> sh;
            a = sample_at(src, d, 2 * (size_t)x + 1) >> sh;
            if (c->mode == FL_IMG_NATIVE) {
                if (d == 16) {
                    uint8_t *q = dst + 4 * (size_t)x;
                    q[0] = q[1] = q[2] = (uint8_t)r, q[3] = (uint8_t)a;
                } else {
                    dst[2 * x] = (uint8_t)r, dst[2 * x + 1] = (uint8_t)a;
                }
                continue;
            }
            break;
        }
        default: {
            int sh = d == 16 ? 8 : 0;
            r = sample_at(src, d, 4 * (size_t)x) >> sh;
            g = sample_at(src, d, 4 * (size_t)x + 1) >> sh;
            b = sample_at(src, d, 4 * (size_t)x + 2) >> sh;
            a = sample_at(src, d, 4 * (size_t)x + 3) >> sh;
            if (c->mode == FL_IMG_NATIVE) {
                uint8_t *q = dst + 4 * (size_t)x;
                q[0] = (uint8_t)r, q[1] = (uint8_t)g, q[2] = (uint8_t)b, q[3] = (uint8_t)a;
                continue;
            }
            break;
        }
        }
        switch (c->mode) {
        case FL_IMG_L:
            dst[x] = (c->ct == 0 || c->ct == 4) ? (uint8_t)r : fl_img_luma((uint8_t)r, (uint8_t)g, (uint8_t)b);
            break;
        case FL_IMG_RGB: {
            uint8_t *q = dst + 3 * (size_t)x;
            q[0] = (uint8_t)r, q[1] = (uint8_t)g, q[2] = (uint8_t)b;
            break;
        }
        default: {
            uint8_t *q = dst + 4 * (size_t)x;
            q[0] = (uint8_t)r, q[1] = (uint8_t)g, q[2] = (uint8_t)b, q[3] = (uint8_t)a;
            break;
        }
        }
    }
}

/* Whether libspng's SPNG_FMT_PNG rows are already the output (no
 * conversion): 8-bit files in their own mode, or the converted mode that
 * equals it with nothing to apply.  Pure. */
static int
as_stored(const struct spng_ihdr *h, int mode)
{
    if (h->bit_depth != 8)
        return 0;
    switch (h->color_type) {
    case 0: return mode == FL_IMG_NATIVE || mode == FL_IMG_L;
    case 2: return mode == FL_IMG_NATIVE || mode == FL_IMG_RGB;
    case 3: return mode == FL_IMG_NATIVE;
    case 4: return mode == FL_IMG_NATIVE;
    case 6: return mode == FL_IMG_NATIVE || mode == FL_IMG_RGBA;
    default: return 0;
    }
}

/* The row conversion's tables for this file and output mode: c filled.
 * Pure but for reading ctx's PLTE. */
static void
setup_conv(spng_ctx *ctx, const struct spng_ihdr *h, const struct spng_trns *t, int has_trns, int mode, conv *c)
{
    memset(c, 0, sizeof *c);
    c->ct = h->color_type, c->depth = h->bit_depth, c->width = (int)h->width, c->mode = mode;
    c->has_trns = has_trns && (h->color_type == 0 || h->color_type == 2);
    c->tg = t->gray, c->tr = t->red, c->tgr = t->green, c->tb = t->blue;
    if (h->color_type == 3) {
        struct spng_plte p;
        memset(&p, 0, sizeof p);
        if (spng_get_plte(ctx, &p) != 0)
            p.n_entries = 0; /* no PLTE: every index is black, as Pillow's empty palette */
        memset(c->palpha, 255, sizeof c->palpha);
        for (uint32_t i = 0; i < p.n_entries && i < 256; i++) {
            c->pal[i][0] = p.entries[i].red;
            c->pal[i][1] = p.entries[i].green;
            c->pal[i][2] = p.entries[i].blue;
        }
        if (has_trns)
            for (uint32_t i = 0; i < t->n_type3_entries && i < 256; i++)
                c->palpha[i] = t->type3_alpha[i];
    }
}

/* PNG's Paeth predictor of one byte from its left (a), upper (b) and
 * upper-left (c) neighbours.  Pure. */
static inline uint8_t
paeth(int a, int b, int c)
{
    int pa = b - c, pb = a - c, pc = pa + pb;
    pa = pa < 0 ? -pa : pa;
    pb = pb < 0 ? -pb : pb;
    pc = pc < 0 ? -pc : pc;
    return (uint8_t)(pa <= pb && pa <= pc ? a : pb <= pc ? b : c);
}

#if defined(__SSE2__) && defined(__x86_64__)
/* One pixel of bpp (3, 4, 6 or 8) bytes as the low bytes of a word, and
 * back: fixed-size loads and stores only (a 3-byte memcpy into a word went
 * through the stack and stalled on store forwarding).  Pure. */
static inline __attribute__((always_inline)) uint64_t
px_load(const uint8_t *p, const size_t bpp)
{
    uint64_t v8;
    uint32_t v4;
    uint16_t v2;
    switch (bpp) {
    case 8: memcpy(&v8, p, 8); return v8;
    case 6: memcpy(&v4, p, 4); memcpy(&v2, p + 4, 2); return v4 | (uint64_t)v2 << 32;
    case 4: memcpy(&v4, p, 4); return v4;
    default: return p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16;
    }
}

static inline __attribute__((always_inline)) void
px_store(uint8_t *p, uint64_t v, const size_t bpp)
{
    uint32_t v4 = (uint32_t)v;
    uint16_t v2 = (uint16_t)(v >> 32);
    switch (bpp) {
    case 8: memcpy(p, &v, 8); return;
    case 6: memcpy(p, &v4, 4); memcpy(p + 4, &v2, 2); return;
    case 4: memcpy(p, &v4, 4); return;
    default: p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16); return;
    }
}

/* Paeth for rows of 3-, 4-, 6- or 8-byte pixels (8-bit RGB/RGBA, 16-bit
 * RGB/RGBA), a pixel at a time with each byte in a 16-bit lane (the same
 * choice as paeth() per byte).  cur may equal raw; prev is the unfiltered
 * row above.  Inlined with a constant bpp.  Pure. */
static inline __attribute__((always_inline)) void
paeth_sse2(uint8_t *cur, const uint8_t *raw, const uint8_t *prev, size_t rb, const size_t bpp)
{
    const __m128i zero = _mm_setzero_si128();
    __m128i a = zero, c = zero;
    for (size_t i = 0; i + bpp <= rb; i += bpp) {
        __m128i b = _mm_unpacklo_epi8(_mm_cvtsi64_si128((long long)px_load(prev + i, bpp)), zero);
        __m128i pa = _mm_sub_epi16(b, c), pb = _mm_sub_epi16(a, c);
        __m128i pc = _mm_add_epi16(pa, pb);
        pa = _mm_max_epi16(pa, _mm_sub_epi16(zero, pa));
        pb = _mm_max_epi16(pb, _mm_sub_epi16(zero, pb));
        pc = _mm_max_epi16(pc, _mm_sub_epi16(zero, pc));
        /* pb <= pc ? b : c, then pa <= min(pb, pc) ? a : that */
        __m128i use_c = _mm_cmpgt_epi16(pb, pc);
        __m128i bc = _mm_or_si128(_mm_and_si128(use_c, c), _mm_andnot_si128(use_c, b));
        __m128i not_a = _mm_cmpgt_epi16(pa, _mm_min_epi16(pb, pc));
        __m128i pred = _mm_or_si128(_mm_and_si128(not_a, bc), _mm_andnot_si128(not_a, a));
        __m128i x = _mm_unpacklo_epi8(_mm_cvtsi64_si128((long long)px_load(raw + i, bpp)), zero);
        a = _mm_and_si128(_mm_add_epi16(x, pred), _mm_set1_epi16(0xff));
        px_store(cur + i, (uint64_t)_mm_cvtsi128_si64(_mm_packus_epi16(a, zero)), bpp);
        c = b;
    }
}
#endif

/* Undo one row's filter (ft 0-4): cur = raw + its prediction from cur's
 * left bytes and prev (the unfiltered row above; NULL for the first row,
 * which reads as zeros).  rb: the row's bytes, bpp: bytes per pixel (1 for
 * fewer than 8 bits).  cur may equal raw (in place), else they do not
 * overlap.  Pure. */
static void
unfilter_row(int ft, uint8_t *cur, const uint8_t *raw, const uint8_t *prev, size_t rb, size_t bpp)
{
    size_t i;
    if (!prev) { /* above the image is zero: Up is None, Paeth is Sub */
        if (ft == 2)
            ft = 0;
        else if (ft == 4)
            ft = 1;
    }
    switch (ft) {
    case 0:
        if (cur != raw)
            memcpy(cur, raw, rb);
        return;
    case 1:
        for (i = 0; i < bpp && i < rb; i++)
            cur[i] = raw[i];
        for (; i < rb; i++)
            cur[i] = (uint8_t)(raw[i] + cur[i - bpp]);
        return;
    case 2:
        for (i = 0; i < rb; i++)
            cur[i] = (uint8_t)(raw[i] + prev[i]);
        return;
    case 3:
        if (!prev) {
            for (i = 0; i < bpp && i < rb; i++)
                cur[i] = raw[i];
            for (; i < rb; i++)
                cur[i] = (uint8_t)(raw[i] + (cur[i - bpp] >> 1));
            return;
        }
        for (i = 0; i < bpp && i < rb; i++)
            cur[i] = (uint8_t)(raw[i] + (prev[i] >> 1));
        for (; i < rb; i++)
            cur[i] = (uint8_t)(raw[i] + ((cur[i - bpp] + prev[i]) >> 1));
        return;
    default:
#if defined(__SSE2__) && defined(__x86_64__)
        switch (bpp) { /* rb is a whole number of pixels when bpp >= 1 byte */
        case 3: paeth_sse2(cur, raw, prev, rb, 3); return;
        case 4: paeth_sse2(cur, raw, prev, rb, 4); return;
        case 6: paeth_sse2(cur, raw, prev, rb, 6); return;
        case 8: paeth_sse2(cur, raw, prev, rb, 8); return;
        default: break;
        }
#endif
        for (i = 0; i < bpp && i < rb; i++)
            cur[i] = (uint8_t)(raw[i] + prev[i]);
        for (; i < rb; i++)
            cur[i] = (uint8_t)(raw[i] + paeth(cur[i - bpp], prev[i], prev[i - bpp]));
        return;
    }
}

/* The fast path (see the top): a non-interlaced file whose CRCs the
 * prepass found right, inflated whole by libdeflate
 * into dec's scratch and unfiltered straight into out (direct: the stored
 * rows are the output) or in place and converted by c.  0 when out holds
 * the image; 1 when the file is not one the fast path decodes in full (its
 * IDAT chunks cut short, a zlib stream that is bad, shorter or longer than
 * the image, or does not end with the IDATs, an unknown filter type): the
 * caller decodes it with libspng, which says what is wrong (out may have
 * been written); -1 with err filled (FL_ERR_NOMEM).  Pure C, no GIL. */
static int
fast_decode(fl_imgdec *dec, const uint8_t *d, size_t n, const struct spng_ihdr *h, const conv *c, int direct,
            uint8_t *out, size_t stride, fl_err *err)
{
    size_t pos = 8, first = 0, total = 0, count = 0;
    while (pos + 12 <= n) {
        size_t len = be32(d + pos);
        int is_idat = memcmp(d + pos + 4, "IDAT", 4) == 0;
        if (count && !is_idat)
            break; /* what follows the image data is not read, as Pillow does not */
        if (pos + 12 + len > n)
            return 1;
        if (is_idat) {
            if (!count++)
                first = pos;
            total += len;
        }
        pos += 12 + len;
    }
    if (!count || total == 0)
        return 1; /* no image data at all: libspng says so (and a 0-byte join would be no buffer) */
    const uint8_t *z = d + first + 8;
    if (count > 1) { /* libdeflate inflates one buffer: join the chunks' data */
        uint8_t *joined = fl_imgdec_grow(&dec->idat, &dec->idat_cap, total, err);
        if (!joined)
            return -1;
        size_t at = 0;
        for (pos = first; at < total; pos += 12 + be32(d + pos)) {
            size_t len = be32(d + pos);
            memcpy(joined + at, d + pos + 8, len);
            at += len;
        }
        z = joined;
    }
    static const int channels[7] = {1, 0, 3, 1, 2, 0, 4};
    size_t bits = (size_t)channels[h->color_type] * h->bit_depth;
    size_t rb = ((size_t)h->width * bits + 7) / 8, bpp = bits >= 8 ? bits / 8 : 1;
    size_t rows = h->height, need = rows * (rb + 1);
    /* 16-bit rows are unfiltered as stored (big-endian) and converted from
     * a host-order copy of the row, kept after the image in the scratch */
    const int swap16 = h->bit_depth == 16 && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
    uint8_t *buf = fl_imgdec_scratch(dec, need + (swap16 ? rb : 0), err);
    if (!buf)
        return -1;
    if (!dec->inflater && !(dec->inflater = libdeflate_alloc_decompressor())) {
        fl_err_set(err, FL_ERR_NOMEM, 0, "PNG: out of memory for an inflater");
        return -1;
    }
    size_t used = 0, got = 0;
    if (libdeflate_zlib_decompress_ex(dec->inflater, z, total, buf, need, &used, &got) != LIBDEFLATE_SUCCESS ||
        got != need || used != total)
        return 1;
    const uint8_t *prev = NULL;
    for (size_t y = 0; y < rows; y++) {
        uint8_t *raw = buf + y * (rb + 1);
        int ft = raw[0];
        if (ft > 4)
            return 1;
        raw++;
        uint8_t *cur = direct ? out + y * stride : raw;
        unfilter_row(ft, cur, raw, prev, rb, bpp);
        if (swap16) {
            uint8_t *host = buf + need;
            for (size_t i = 0; i + 1 < rb; i += 2)
                host[i] = cur[i + 1], host[i + 1] = cur[i];
            convert_row(c, host, out + y * stride);
        } else if (!direct) {
            convert_row(c, cur, out + y * stride);
        }
        prev = cur;
    }
    return 0;
}

int
fl_png_decode(fl_imgdec *dec, const uint8_t *data, size_t len, int mode, uint8_t *out, size_t stride,
              fl_err *err)
{
    int ok;
    if (prepass(data, len, &ok, err) < 0)
        return -1;
    struct spng_ihdr h;
    struct spng_trns t;
    int has_trns;
    spng_ctx *ctx = open_ctx(data, len, ok, &h, &t, &has_trns, err);
    if (!ctx)
        return -1;
    int rc = -1;
    fl_img_info info;
    fill_info(&h, has_trns, &info);
    if (fl_imgdec_check_limit(dec, &info, err) < 0)
        goto done;
    size_t need = 0;
    int src = spng_decoded_image_size(ctx, SPNG_FMT_PNG, &need);
    if (src != 0) {
        spng_error(src, err);
        goto done;
    }
    size_t rows = (size_t)h.height, src_row = need / rows;
    size_t out_row = fl_img_row_bytes(&info, mode);
    int direct = as_stored(&h, mode) && src_row == out_row;
    conv c;
    setup_conv(ctx, &h, &t, has_trns, mode, &c);
    if (ok && !h.interlace_method && !dec->png_libspng_only) {
        int fast = fast_decode(dec, data, len, &h, &c, direct, out, stride, err);
        if (fast <= 0) {
            rc = fast;
            goto done;
        }
    }
    uint8_t *buf = direct && stride == out_row ? out : fl_imgdec_scratch(dec, need, err);
    if (!buf)
        goto done;
    /* libspng puts an interlaced pass's packed (sub-byte) pixels into place
     * by OR-ing their bits into the row: the rows must start at zero */
    if (h.interlace_method && h.bit_depth < 8)
        memset(buf, 0, need);
    src = spng_decode_image(ctx, buf, need, SPNG_FMT_PNG, 0);
    if (src != 0) {
        spng_error(src, err);
        goto done;
    }
    if (!ok && check_adler(data, len, err) < 0)
        goto done;
    if (direct) {
        if (buf != out)
            for (size_t y = 0; y < rows; y++)
                memcpy(out + y * stride, buf + y * src_row, out_row);
        rc = 0;
        goto done;
    }
    for (size_t y = 0; y < rows; y++)
        convert_row(&c, buf + y * src_row, out + y * stride);
    rc = 0;
done:
    spng_ctx_free(ctx);
    return rc;
}
