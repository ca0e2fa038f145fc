/* jpeg.c: JPEG header parsing and region / scaled decoding with libjpeg-turbo
 * (libjpeg API; no TurboJPEG).  Pure C: no Python, callable without the GIL.
 *
 * Why one file of ~1,000 lines: every way into libjpeg here (header, region
 * and scaled decode, the check of the rest of a single-scan file) shares
 * one handle, its error manager and the setjmp rules below, all file-static
 * so that no other unit can break them.  If it grows, the seams are the
 * byte-level marker walk (fl_markers_to_eoi and its helpers, which need no
 * libjpeg state) and the EXIF/XMP orientation reader.
 *
 * Design
 * - One fl_jpeg per thread holds a jpeg_decompress_struct, its error
 *   manager, a progress monitor that enforces the scan limit, and scratch
 *   rows that grow with malloc (we run without the GIL, so no PyMem_*).  The
 *   struct is destroyed and created again at the start of every file (see
 *   fl_start): libjpeg would otherwise carry quantization and Huffman tables
 *   from one file into the next.
 * - libjpeg reports fatal errors through error_exit, which we turn into a
 *   longjmp back to the public entry point (never exit()).  setjmp lives in
 *   small wrappers (fl_guarded for every entry that reads a file, and
 *   fl_create) whose locals are never modified after setjmp, so nothing
 *   is clobbered; the real work is in functions that may longjmp out.
 * - Output equals Pillow 13 bit for bit at full size: JDCT_ISLOW and fancy
 *   upsampling (libjpeg's defaults, which Pillow also uses), RGB straight
 *   from libjpeg, "L" from color computed from RGB with Pillow's fixed-point
 *   rgb2l (L24), CMYK/YCCK decoded as CMYK, inverted as Pillow's "CMYK;I"
 *   rawmode does (Pillow assumes Adobe conventions for every 4-component
 *   JPEG) and converted with Pillow's cmyk2rgb.
 * - Regions: rows above the region are skipped with jpeg_skip_scanlines,
 *   columns are cropped with jpeg_crop_scanline, and decoding stops after the
 *   last needed row.  jpeg_crop_scanline starts at an iMCU boundary and treats
 *   the crop edges as image edges for fancy upsampling, which changes the
 *   outermost columns; we therefore ask it for one extra pixel on each side
 *   (CROP_MARGIN) so that the requested columns are interior and equal a full
 *   decode, and copy them out of a scratch row.  The crop is also kept at
 *   least two iMCUs wide, and for progressive files it starts two iMCUs
 *   further left (fl_imcu_width tells why).  When the region spans full
 *   rows and libjpeg's output format is the caller's, scanlines go straight
 *   into the caller's rows, several per jpeg_read_scanlines call.
 *
 * Corrupt data: the outcome is Pillow's, and never depends on the region
 * - A file must start with FF D8 FF, as Pillow requires (libjpeg would skip
 *   bytes between SOI and the first marker).
 * - Progressive and other multi-scan files are read through EOI by
 *   jpeg_start_decompress, as in Pillow.  A single-scan file is read only up
 *   to the last row a region needs; fl_check_rest then finds, without
 *   Huffman decoding, what a full decode would meet in the rest of the file:
 *   a scan that runs to the end of the data is an error ("Premature end of
 *   JPEG file"), and so is a marker after the scan that libjpeg rejects
 *   (unknown, a second SOI/SOF/SOS, a bad DHT/DQT/DRI/DAC); data that ends
 *   after the scan, with or without EOI, is not.  One known difference from
 *   Pillow: it accepts a scan that runs to the end of the file when its
 *   decoder happens not to need the missing bytes (tests/
 *   test_corrupt_vs_pillow.py, EXCEPTIONS).
 *
 * Warnings (libjpeg emit_message with level -1)
 * - "Premature end of JPEG file" (JWRN_JPEG_EOF) is an error: Pillow raises
 *   OSError "image file is truncated" for truncated files (unless
 *   ImageFile.LOAD_TRUNCATED_IMAGES), and libjpeg would otherwise pad the
 *   image with gray.
 * - Every other warning (extraneous bytes before a marker, corrupt Huffman
 *   data, premature end of a data segment, ...) is counted and ignored, as
 *   Pillow ignores them and returns the image.  fl_jpeg_set_strict(j, 1)
 *   turns them into errors too.
 * - Nothing is ever printed (output_message is a no-op).
 *
 * Limits (untrusted input): the pixel limit is checked right after the header
 * is parsed, before libjpeg allocates anything image-sized; the scan limit is
 * checked by the progress monitor while libjpeg consumes the input; regions
 * and scales are validated; trailing bytes after EOI are never read.
 */
#include "image/jpeg.h"

#include <limits.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

/* Extra columns asked of jpeg_crop_scanline on each side of a region (see the
 * header comment). */
#ifndef CROP_MARGIN
#define CROP_MARGIN 1
#endif
/* Most rows handed to one jpeg_read_scanlines call. */
#define MAX_ROWS_PER_READ 16

/* libjpeg error manager extended with our jump buffer and the error record
 * of the call in progress. */
typedef struct {
    struct jpeg_error_mgr pub;    /* libjpeg's part; must be first */
    jmp_buf jump;                 /* where error_exit returns to */
    fl_err *err;                  /* the record of the call in progress (borrowed) */
    int strict;                   /* every warning is an error */
    int warnings;                 /* warnings seen in the call in progress */
} fl_jerr;

/* libjpeg progress manager extended with the scan limit. */
typedef struct {
    struct jpeg_progress_mgr pub; /* libjpeg's part; must be first */
    fl_jerr *jerr;                /* for the jump (borrowed from the fl_jpeg) */
    int max_scans;                /* 0 = no limit */
} fl_jprog;

struct fl_jpeg {
    struct jpeg_decompress_struct cinfo; /* reused across images */
    fl_jerr jerr;                        /* cinfo.err points here */
    fl_jprog prog;                       /* cinfo.progress points here */
    uint64_t max_pixels;                 /* 0 = no limit */
    uint8_t *scratch;                    /* scratch rows (malloc, owned) */
    size_t scratch_cap;                  /* bytes allocated at scratch */
    size_t scan_start;                   /* offset of the first scan's entropy-coded data */
};

/* ------------------------------------------------------------------------ */
/* libjpeg callbacks (run inside libjpeg calls, on the caller's thread) */

static void
fl_set_msg(fl_err *err, int code, const char *msg)
{
    if (err == NULL)
        return;
    err->code = code;
    snprintf(err->msg, sizeof(err->msg), "%s", msg);
}

/* Fatal libjpeg error: record libjpeg's message and jump back. */
static void
fl_error_exit(j_common_ptr cinfo)
{
    fl_jerr *je = (fl_jerr *)cinfo->err;
    char buf[JMSG_LENGTH_MAX];
    (*cinfo->err->format_message)(cinfo, buf);
    fl_set_msg(je->err, je->pub.msg_code == JERR_OUT_OF_MEMORY ? FL_ERR_NOMEM : FL_ERR_DECODE, buf);
    longjmp(je->jump, 1);
}

/* Warnings (level -1) and trace messages (level >= 0).  See the header
 * comment for which warnings are errors. */
static void
fl_emit_message(j_common_ptr cinfo, int msg_level)
{
    fl_jerr *je = (fl_jerr *)cinfo->err;
    if (msg_level >= 0)
        return;
    je->pub.num_warnings++;
    je->warnings++;
    if (je->pub.msg_code == JWRN_JPEG_EOF || je->strict) {
        char buf[JMSG_LENGTH_MAX];
        (*cinfo->err->format_message)(cinfo, buf);
        fl_set_msg(je->err, FL_ERR_DECODE, buf);
        longjmp(je->jump, 1);
    }
}

/* Never print anything. */
static void
fl_output_message(j_common_ptr cinfo)
{
    (void)cinfo;
}

/* Called by libjpeg while it consumes input; enforces the scan limit. */
static void
fl_progress(j_common_ptr cinfo)
{
    fl_jprog *p = (fl_jprog *)cinfo->progress;
    j_decompress_ptr d;
    if (!cinfo->is_decompressor || p->max_scans <= 0)
        return;
    d = (j_decompress_ptr)cinfo;
    if (d->input_scan_number > p->max_scans) {
        if (p->jerr->err != NULL) {
            p->jerr->err->code = FL_ERR_LIMIT;
            snprintf(p->jerr->err->msg, sizeof(p->jerr->err->msg),
                     "JPEG has more than %d scans (the scan limit)", p->max_scans);
        }
        longjmp(p->jerr->jump, 1);
    }
}

/* ------------------------------------------------------------------------ */
/* lifecycle */

/* jpeg_create_decompress behind a setjmp: it fails only on out-of-memory.
 * Returns 0 or -1. */
static int
fl_create(fl_jpeg *j)
{
    if (setjmp(j->jerr.jump))
        return -1;
    jpeg_create_decompress(&j->cinfo);
    return 0;
}

fl_jpeg *
fl_jpeg_new(void)
{
    fl_jpeg *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return NULL;
    j->cinfo.err = jpeg_std_error(&j->jerr.pub);
    j->jerr.pub.error_exit = fl_error_exit;
    j->jerr.pub.emit_message = fl_emit_message;
    j->jerr.pub.output_message = fl_output_message;
    j->prog.pub.progress_monitor = fl_progress;
    j->prog.jerr = &j->jerr;
    j->prog.max_scans = FL_JPEG_DEFAULT_MAX_SCANS;
    j->max_pixels = FL_JPEG_DEFAULT_MAX_PIXELS;
    if (fl_create(j) < 0) {
        free(j);
        return NULL;
    }
    j->cinfo.progress = &j->prog.pub;
    return j;
}

void
fl_jpeg_free(fl_jpeg *j)
{
    if (j == NULL)
        return;
    jpeg_destroy_decompress(&j->cinfo);
    free(j->scratch);
    free(j);
}

void
fl_jpeg_set_limits(fl_jpeg *j, uint64_t max_pixels, int max_scans)
{
    j->max_pixels = max_pixels;
    j->prog.max_scans = max_scans < 0 ? 0 : max_scans;
}

void
fl_jpeg_set_strict(fl_jpeg *j, int strict)
{
    j->jerr.strict = strict != 0;
}

int
fl_jpeg_last_warnings(const fl_jpeg *j)
{
    return j->jerr.warnings;
}

/* Make sure the scratch buffer holds n bytes.  0, or -1 with err filled. */
static int
fl_scratch_reserve(fl_jpeg *j, size_t n, fl_err *err)
{
    uint8_t *p;
    if (n <= j->scratch_cap)
        return 0;
    p = malloc(n);
    if (p == NULL) {
        fl_set_msg(err, FL_ERR_NOMEM, "out of memory allocating JPEG scratch rows");
        return -1;
    }
    free(j->scratch);
    j->scratch = p;
    j->scratch_cap = n;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* EXIF / XMP orientation */

static unsigned
rd16(const uint8_t *p, int be)
{
    return be ? (unsigned)p[0] << 8 | p[1] : (unsigned)p[1] << 8 | p[0];
}

static uint32_t
rd32(const uint8_t *p, int be)
{
    return be ? (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]
              : (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

/* Orientation tag (0x0112) of IFD0 in the TIFF structure tiff[0..n).
 * Returns its value, or -1 when the structure is malformed or the tag is
 * absent or not a single SHORT/LONG.  Every read is bounds-checked. */
static long
fl_tiff_orientation(const uint8_t *tiff, size_t n)
{
    int be;
    uint32_t ifd;
    unsigned count, i;
    if (n < 8)
        return -1;
    if (tiff[0] == 'I' && tiff[1] == 'I')
        be = 0;
    else if (tiff[0] == 'M' && tiff[1] == 'M')
        be = 1;
    else
        return -1;
    if (rd16(tiff + 2, be) != 42)
        return -1;
    ifd = rd32(tiff + 4, be);
    if (ifd > n || n - ifd < 2)
        return -1;
    count = rd16(tiff + ifd, be);
    for (i = 0; i < count; i++) {
        size_t off = (size_t)ifd + 2 + (size_t)i * 12;
        const uint8_t *e;
        unsigned tag, type;
        if (off > n || n - off < 12)
            return -1;
        e = tiff + off;
        tag = rd16(e, be);
        if (tag != 0x0112)
            continue;
        type = rd16(e + 2, be);
        if (rd32(e + 4, be) != 1)
            return -1;
        if (type == 3) /* SHORT, left-justified in the value field */
            return (long)rd16(e + 8, be);
        if (type == 4) /* LONG */
            return (long)rd32(e + 8, be);
        return -1;
    }
    return -1;
}

/* Pillow's XMP fallback: the first match of tiff:Orientation(="|>)([0-9]).
 * Returns the digit, or -1. */
static long
fl_xmp_orientation(const uint8_t *p, size_t n)
{
    static const char key[] = "tiff:Orientation";
    const size_t klen = sizeof(key) - 1;
    size_t i;
    for (i = 0; i + klen < n; i++) {
        size_t k;
        if (p[i] != 't' || memcmp(p + i, key, klen) != 0)
            continue;
        k = i + klen;
        if (k + 2 < n && p[k] == '=' && p[k + 1] == '"' && p[k + 2] >= '0' && p[k + 2] <= '9')
            return p[k + 2] - '0';
        if (k + 1 < n && p[k] == '>' && p[k + 1] >= '0' && p[k + 1] <= '9')
            return p[k + 1] - '0';
    }
    return -1;
}

/* Orientation from the saved APP1 markers, as Pillow's getexif() finds it:
 * IFD0 of the first "Exif\0\0" segment; if that has no orientation tag, the
 * last XMP packet.  Returns 1..8, or 1 when absent or out of range. */
static int
fl_orientation_from_markers(j_decompress_ptr cinfo)
{
    static const char xmp_id[] = "http://ns.adobe.com/xap/1.0/";   /* + NUL */
    const size_t xmp_len = sizeof(xmp_id);                           /* includes the NUL */
    jpeg_saved_marker_ptr m, xmp = NULL;
    int seen_exif = 0;
    long v = -1;
    for (m = cinfo->marker_list; m != NULL; m = m->next) {
        if (m->marker != JPEG_APP0 + 1)
            continue;
        if (m->data_length >= 6 && memcmp(m->data, "Exif\0\0", 6) == 0) {
            if (!seen_exif)
                v = fl_tiff_orientation(m->data + 6, m->data_length - 6);
            seen_exif = 1;
        } else if (m->data_length >= xmp_len && memcmp(m->data, xmp_id, xmp_len) == 0) {
            xmp = m;
        }
    }
    if (v < 0 && xmp != NULL)
        v = fl_xmp_orientation(xmp->data + xmp_len, xmp->data_length - xmp_len);
    return (v >= 1 && v <= 8) ? (int)v : 1;
}

/* ------------------------------------------------------------------------ */
/* header */

/* Pillow opens a file as JPEG only when it starts with FF D8 FF (SOI and the
 * first byte of the next marker); libjpeg would skip anything between SOI
 * and the first marker.  Refuse such a file as Pillow does (libjpeg itself
 * reports a file that does not start with FF D8, and one that ends there).
 * Returns 0, or -1 with err filled. */
static int
fl_check_signature(const uint8_t *data, size_t len, fl_err *err)
{
    if (len < 3 || data[0] != 0xFF || data[1] != 0xD8 || data[2] == 0xFF)
        return 0;
    err->code = FL_ERR_DECODE;
    snprintf(err->msg, sizeof(err->msg),
             "Not a JPEG file: starts with 0xff 0xd8 0x%02x (a JPEG file starts with 0xff 0xd8 0xff)", data[2]);
    return -1;
}

/* Start reading data: give the file a fresh decompressor, attach the source
 * and parse the header.  May longjmp.
 *
 * Fresh, because libjpeg keeps quantization and Huffman tables in the
 * decompress struct from one image to the next (allocated in its permanent
 * pool; jpeg_abort_decompress keeps them, for abbreviated datastreams): a
 * file without DQT would decode with its predecessor's tables instead of
 * failing, and a file without DHT would get them instead of the standard
 * tables libjpeg-turbo supplies only to empty slots.  There is no API to
 * drop the tables, so the struct is destroyed and created again: a few small
 * allocations, about 0.13 us (measured with libjpeg-turbo 2.1.5). */
static void
fl_start(fl_jpeg *j, const uint8_t *data, size_t len, int save_app1)
{
    j_decompress_ptr cinfo = &j->cinfo;
    jpeg_destroy_decompress(cinfo);
    jpeg_create_decompress(cinfo);   /* keeps cinfo->err; zeroes the rest */
    cinfo->progress = &j->prog.pub;
    if (len > ULONG_MAX)
        len = ULONG_MAX;   /* never on LP64; libjpeg takes unsigned long */
    jpeg_save_markers(cinfo, JPEG_APP0 + 1, save_app1 ? 0xFFFF : 0);
    jpeg_mem_src(cinfo, data, (unsigned long)len);
    jpeg_read_header(cinfo, TRUE);
    /* jpeg_read_header stops right after the first SOS segment */
    j->scan_start = (size_t)(cinfo->src->next_input_byte - data);
}

static void
fl_fill_info(j_decompress_ptr cinfo, fl_jpeg_info *info)
{
    info->width = (int)cinfo->image_width;
    info->height = (int)cinfo->image_height;
    info->components = cinfo->num_components;
    info->colorspace = (int)cinfo->jpeg_color_space;
    info->orientation = 1;
    info->progressive = cinfo->progressive_mode ? 1 : 0;
    info->arithmetic = cinfo->arith_code ? 1 : 0;
}

/* What a public entry does with one file behind fl_guarded: reads
 * data[0, len) with j's decompressor, `arg` being the entry's own
 * arguments.  May longjmp out on a libjpeg error.  Returns 0, or -1 with
 * err filled for an error found outside libjpeg. */
typedef int (*fl_body_fn)(fl_jpeg *j, const uint8_t *data, size_t len, void *arg, fl_err *err);

/* Every public entry that reads a file goes through here: the signature
 * checked, the error manager armed for this call (err, warnings reset),
 * body run behind setjmp, and then, whatever happened, the decompressor
 * aborted (never finished: a region decode stops after its last row, and
 * fl_check_rest has looked at the rest of the file) and err disarmed.
 * Returns body's result, or -1 with err filled when libjpeg raised an
 * error.  rc, set after setjmp, is never read after a longjmp.  No GIL
 * needed. */
static int
fl_guarded(fl_jpeg *j, const uint8_t *data, size_t len, fl_body_fn body, void *arg, fl_err *err)
{
    int rc;
    if (fl_check_signature(data, len, err) < 0)
        return -1;
    j->jerr.err = err;
    j->jerr.warnings = 0;
    if (setjmp(j->jerr.jump)) {
        jpeg_abort_decompress(&j->cinfo);
        j->jerr.err = NULL;
        return -1;
    }
    rc = body(j, data, len, arg, err);
    jpeg_abort_decompress(&j->cinfo);
    j->jerr.err = NULL;
    return rc;
}

/* Body of fl_jpeg_read_header (an fl_body_fn; arg: the fl_jpeg_info to
 * fill); may longjmp. */
static int
fl_read_header_body(fl_jpeg *j, const uint8_t *data, size_t len, void *arg, fl_err *err)
{
    fl_jpeg_info *info = arg;
    (void)err;
    fl_start(j, data, len, 1);
    fl_fill_info(&j->cinfo, info);
    info->orientation = fl_orientation_from_markers(&j->cinfo);
    return 0;
}

int
fl_jpeg_read_header(fl_jpeg *j, const uint8_t *data, size_t len, fl_jpeg_info *info, fl_err *err)
{
    return fl_guarded(j, data, len, fl_read_header_body, info, err);
}

int
fl_jpeg_check_limits(const fl_jpeg *j, const fl_jpeg_info *info, fl_err *err)
{
    uint64_t px = (uint64_t)(unsigned)info->width * (uint64_t)(unsigned)info->height;
    if (j->max_pixels && px > j->max_pixels) {
        err->code = FL_ERR_LIMIT;
        snprintf(err->msg, sizeof(err->msg),
                 "image is %dx%d = %llu pixels, above the limit of %llu pixels "
                 "(possible decompression bomb)",
                 info->width, info->height, (unsigned long long)px,
                 (unsigned long long)j->max_pixels);
        return -1;
    }
    return 0;
}

void
fl_jpeg_scaled_size(const fl_jpeg_info *info, int scale_num, int *w, int *h)
{
    uint64_t s = (uint64_t)(scale_num < 1 ? 1 : scale_num > 16 ? 16 : scale_num);
    *w = (int)(((uint64_t)info->width * s + 7) / 8);
    *h = (int)(((uint64_t)info->height * s + 7) / 8);
}

/* ------------------------------------------------------------------------ */
/* pixel conversions (Pillow's formulas, libImaging/Convert.c) */

/* Pillow's rgb2l: L = (R*19595 + G*38470 + B*7471 + 0x8000) >> 16. */
static void
fl_rgb_to_l(const uint8_t *in, uint8_t *out, int n)
{
    for (int i = 0; i < n; i++, in += 3)
        out[i] = (uint8_t)(((uint32_t)in[0] * 19595 + (uint32_t)in[1] * 38470 +
                            (uint32_t)in[2] * 7471 + 0x8000) >> 16);
}

/* Pillow's MULDIV255: a*b/255 rounded, for a, b in 0..255. */
static inline int
fl_muldiv255(int a, int b)
{
    int t = a * b + 128;
    return ((t >> 8) + t) >> 8;
}

/* libjpeg CMYK output (Adobe inverted: the stored value is 255 - ink) to
 * RGB, as Pillow does: rawmode "CMYK;I" inverts, then cmyk2rgb computes
 * R = (255-K) - (255-K)*C/255 with C, K the inverted values. */
static void
fl_cmyk_to_rgb(const uint8_t *in, uint8_t *out, int n)
{
    for (int i = 0; i < n; i++, in += 4, out += 3) {
        int nk = in[3];                 /* 255 - K where K = 255 - in[3] */
        out[0] = (uint8_t)(nk - fl_muldiv255(255 - in[0], nk));
        out[1] = (uint8_t)(nk - fl_muldiv255(255 - in[1], nk));
        out[2] = (uint8_t)(nk - fl_muldiv255(255 - in[2], nk));
    }
}

/* CMYK to L through RGB, as Pillow's convert("L") from CMYK. */
static void
fl_cmyk_to_l(const uint8_t *in, uint8_t *out, int n)
{
    for (int i = 0; i < n; i++, in += 4) {
        uint8_t rgb[3];
        fl_cmyk_to_rgb(in, rgb, 1);
        fl_rgb_to_l(rgb, out + i, 1);
    }
}

/* ------------------------------------------------------------------------ */
/* the rest of a single-scan file
 *
 * fl_jpeg_decode stops after the last row it needs, so libjpeg never reads
 * the rest of a single-scan file.  A full decode (Pillow) does: its entropy
 * decoder reads to the marker that ends the scan, and jpeg_finish_decompress
 * then reads the markers that follow, up to EOI.  The functions below give
 * the outcome of that reading without Huffman-decoding anything, from the
 * bytes alone, so that the outcome of a file never depends on the region
 * asked for.  They follow libjpeg-turbo's jdmarker.c: next_marker,
 * read_restart_marker with jpeg_resync_to_restart, and read_markers in a
 * file whose only scan has been read.  As in Pillow (whose data source
 * suspends at the end of the data, and which ignores a suspension in
 * jpeg_finish_decompress once every row is out):
 * - data that ends inside the scan (no marker ends it) is an error,
 *   "Premature end of JPEG file" as libjpeg reports it in a full decode;
 * - a marker after the scan that libjpeg rejects is an error;
 * - data that ends after the scan, even without EOI, is not. */

/* The next marker at or after d[*pos] in d[0..n), found as
 * libjpeg's next_marker finds it: bytes other than 0xFF are skipped (entropy-
 * coded data or garbage), 0xFF 0x00 is a stuffed data byte, extra 0xFF bytes
 * are fill.  Returns the marker code (never 0x00 or 0xFF) with *pos just
 * past it, or -1 when the data ends first.  memchr does the skipping. */
static int
fl_next_marker(const uint8_t *d, size_t n, size_t *pos)
{
    size_t i = *pos;
    for (;;) {
        const uint8_t *ff = i < n ? memchr(d + i, 0xFF, n - i) : NULL;
        if (ff == NULL)
            return -1;
        i = (size_t)(ff - d) + 1;
        while (i < n && d[i] == 0xFF)
            i++;
        if (i >= n)
            return -1;
        if (d[i] != 0x00) {
            *pos = i + 1;
            return d[i];
        }
        i++;
    }
}

#define FL_RST(k) (0xD0 + (int)((k) & 7u))

/* The marker that ends the scan whose entropy-coded data starts at d[pos],
 * as libjpeg's decoder meets it: with restart_interval > 0, each of the
 * ceil(mcus / restart_interval) - 1 restart boundaries consumes one marker
 * with read_restart_marker's rules (the expected RSTn is swallowed; any
 * other marker goes through jpeg_resync_to_restart: one that is not a valid
 * marker code is skipped, one of the next two RSTs or any other valid marker
 * stays unread, an older RST is skipped, a far one is dropped); the marker
 * met after that ends the scan.  Without restarts the first marker does.
 * Returns the marker code with *pos just past it, or -1 when the data ends
 * inside the scan. */
static int
fl_scan_end(const uint8_t *d, size_t n, size_t *pos, unsigned restart_interval, uint64_t mcus)
{
    uint64_t boundaries = restart_interval ? (mcus + restart_interval - 1) / restart_interval - 1 : 0;
    unsigned expected = 0;   /* number of the next RSTn */
    int pending = -1;        /* a marker left unread by the resync */
    for (; boundaries > 0; boundaries--, expected++) {
        int m = pending >= 0 ? pending : fl_next_marker(d, n, pos);
        pending = -1;
        for (;;) {
            if (m < 0)
                return -1;
            if (m == FL_RST(expected))
                break;                            /* swallowed */
            if (m < 0xC0) {                       /* not a marker code: skip to the next */
                m = fl_next_marker(d, n, pos);
                continue;
            }
            if (m < 0xD0 || m > 0xD7)             /* a valid marker: the scan ends there */
                return m;
            if (m == FL_RST(expected + 1) || m == FL_RST(expected + 2)) {
                pending = m;                      /* a later restart: kept for its boundary */
                break;
            }
            if (m == FL_RST(expected - 1) || m == FL_RST(expected - 2)) {
                m = fl_next_marker(d, n, pos);    /* an earlier restart: skip ahead */
                continue;
            }
            break;                                /* too far away: dropped */
        }
    }
    return pending >= 0 ? pending : fl_next_marker(d, n, pos);
}

/* One table of a DHT, DQT or DAC segment at d[*pos], checked as libjpeg's
 * get_dht, get_dqt and get_dac check it; *pos and *length (the bytes left
 * in the segment) move past it.  Returns 1, 0 when the data ends first
 * (libjpeg accepts that: the decode is over), or -1 with *why set. */
typedef int (*fl_table_fn)(const uint8_t *d, size_t n, size_t *pos, long *length, const char **why);

static int
fl_dht_table(const uint8_t *d, size_t n, size_t *pos, long *length, const char **why)
{
    int index, count = 0;
    if (n - *pos < 17)
        return 0;
    index = d[*pos];
    for (int i = 1; i <= 16; i++)
        count += d[*pos + i];
    *pos += 17;
    *length -= 17;
    if (count > 256 || count > *length) {
        *why = "a bad DHT segment";
        return -1;
    }
    if (n - *pos < (size_t)count)
        return 0;
    *pos += (size_t)count;
    *length -= count;
    if ((index & 0x10 ? index - 0x10 : index) >= 4) {
        *why = "a bad DHT table index";
        return -1;
    }
    return 1;
}

static int
fl_dqt_table(const uint8_t *d, size_t n, size_t *pos, long *length, const char **why)
{
    int v;
    size_t size;
    if (n - *pos < 1)
        return 0;
    v = d[(*pos)++];
    if ((v & 0x0F) >= 4) {
        *why = "a bad DQT table index";
        return -1;
    }
    size = v >> 4 ? 128 : 64;
    if (n - *pos < size)
        return 0;
    *pos += size;
    *length -= 1 + (long)size;
    return 1;
}

static int
fl_dac_table(const uint8_t *d, size_t n, size_t *pos, long *length, const char **why)
{
    int index, val;
    if (n - *pos < 2)
        return 0;
    index = d[*pos];
    val = d[*pos + 1];
    *pos += 2;
    *length -= 2;
    if (index >= 32 || (index < 16 && (val & 0x0F) > val >> 4)) {
        *why = "a bad DAC segment";
        return -1;
    }
    return 1;
}

/* A DHT, DQT or DAC segment (marker m) whose length field is at d[*pos]:
 * `length` is that field, or -1 when the data ends inside it.  Its tables
 * are read while more bytes are left than the smallest table could leave
 * unread (DHT: 16), and must then fill the segment exactly.  Returns 1
 * with *pos past the segment, 0 when the data ends first, or -1 with *why
 * set.  No libjpeg state; any thread. */
static int
fl_table_segment(const uint8_t *d, size_t n, size_t *pos, int m, long length, const char **why)
{
    fl_table_fn table = m == 0xC4 ? fl_dht_table : m == 0xDB ? fl_dqt_table : fl_dac_table;
    long tail = m == 0xC4 ? 16 : 0;
    int r;
    if (length < 0)
        return 0;
    *pos += 2;
    length -= 2;
    while (length > tail)
        if ((r = table(d, n, pos, &length, why)) <= 0)
            return r;
    if (length != 0) {
        *why = m == 0xC4 ? "a bad DHT segment length"
               : m == 0xDB ? "a bad DQT segment length" : "a bad DAC segment length";
        return -1;
    }
    return 1;
}

/* Read the markers from marker m (d[*pos] is just past it) to EOI, as
 * read_markers does after the only scan.  Returns 0 when libjpeg would
 * accept them, which includes data that ends first; or -1 with err filled. */
static int
fl_markers_to_eoi(const uint8_t *d, size_t n, size_t pos, int m, fl_err *err)
{
    const char *why;
    for (;; m = fl_next_marker(d, n, &pos)) {
        size_t at = pos - 2;     /* offset of this marker, for the message */
        size_t left;
        long length;
        if (m < 0 || m == 0xD9)  /* end of data, or EOI */
            return 0;
        left = n - pos;
        length = left >= 2 ? (long)(d[pos] << 8 | d[pos + 1]) : -1;
        switch (m) {
        case 0x01:                                           /* TEM */
        case 0xD0: case 0xD1: case 0xD2: case 0xD3:          /* RSTn */
        case 0xD4: case 0xD5: case 0xD6: case 0xD7:
            continue;                                        /* no parameters */
        case 0xD8:
            why = "a second SOI marker";
            goto bad;
        case 0xC0: case 0xC1: case 0xC2: case 0xC3: case 0xC5: case 0xC6: case 0xC7:
        case 0xC8: case 0xC9: case 0xCA: case 0xCB: case 0xCD: case 0xCE: case 0xCF:
            why = "a second SOF marker";   /* or an unsupported one: an error either way */
            goto bad;
        case 0xDA: {                                         /* SOS */
            int ncomp;
            if (left < 3)
                return 0;
            ncomp = d[pos + 2];
            if (length != ncomp * 2 + 6 || ncomp < 1 || ncomp > 4) {
                why = "a bad SOS segment";
                goto bad;
            }
            if (left < (size_t)length)
                return 0;
            why = "a second scan in a single-scan file";
            goto bad;
        }
        case 0xC4: case 0xDB: case 0xCC: {                   /* DHT, DQT, DAC */
            int r = fl_table_segment(d, n, &pos, m, length, &why);
            if (r < 0)
                goto bad;
            if (r == 0)
                return 0;
            continue;
        }
        case 0xDD:                                           /* DRI */
            if (length < 0)
                return 0;
            if (length != 4) {
                why = "a bad DRI segment length";
                goto bad;
            }
            if (left < 4)
                return 0;
            pos += 4;
            continue;
        case 0xDC:                                           /* DNL: skipped */
        case 0xE0: case 0xE1: case 0xE2: case 0xE3: case 0xE4: case 0xE5: case 0xE6: case 0xE7:
        case 0xE8: case 0xE9: case 0xEA: case 0xEB: case 0xEC: case 0xED: case 0xEE: case 0xEF:
        case 0xFE:                                           /* APPn, COM */
            if (length < 0)
                return 0;
            pos += 2;
            if (length > 2) {
                if (n - pos < (size_t)length - 2)
                    return 0;
                pos += (size_t)length - 2;
            }
            continue;
        default:                                             /* DHP, EXP, JPGn, reserved */
            why = "an unknown marker";
            goto bad;
        }
    bad:
        err->code = FL_ERR_DECODE;
        snprintf(err->msg, sizeof(err->msg),
                 "Corrupt JPEG data after the image scan: %s (0xff 0x%02x at byte %zu)", why, m, at);
        return -1;
    }
}

/* Called after the needed rows of a region: the outcome of the rest of the
 * file (see above).  Multi-scan files (progressive, or one scan per
 * component) were read through EOI by jpeg_start_decompress already.
 * Returns 0, or -1 with err filled. */
static int
fl_check_rest(fl_jpeg *j, const uint8_t *data, size_t len, fl_err *err)
{
    j_decompress_ptr cinfo = &j->cinfo;
    size_t pos = j->scan_start;
    int m;
    if (jpeg_has_multiple_scans(cinfo))
        return 0;
    m = fl_scan_end(data, len, &pos, cinfo->restart_interval,
                    (uint64_t)cinfo->MCUs_per_row * cinfo->MCU_rows_in_scan);
    if (m < 0) {
        fl_set_msg(err, FL_ERR_DECODE, "Premature end of JPEG file");
        return -1;
    }
    return fl_markers_to_eoi(data, len, pos, m, err);
}

/* ------------------------------------------------------------------------ */
/* decode */

/* Width in output pixels of one iMCU column (the unit jpeg_crop_scanline
 * aligns to).  A progressive file whose scans leave coefficients unknown
 * (scans missing, or cut short by damage) is decoded with block smoothing, which
 * reads the DC values of two blocks on each side; libjpeg-turbo takes the
 * first block column of a crop for the image's edge, so the blocks near it
 * come out different from a full decode.  Cropping two iMCUs (at least two
 * blocks of every component) further left keeps the region away from that. */
static JDIMENSION
fl_imcu_width(j_decompress_ptr cinfo)
{
#if JPEG_LIB_VERSION >= 70
    return (JDIMENSION)(cinfo->max_h_samp_factor * cinfo->min_DCT_h_scaled_size);
#else
    return (JDIMENSION)(cinfo->max_h_samp_factor * cinfo->min_DCT_scaled_size);
#endif
}

/* Body of fl_jpeg_decode and fl_jpeg_decode_wide (col_out non-NULL: rows of
 * out_stride bytes hold libjpeg's whole cropped window, the region from
 * column *col_out).  Returns 0, or -1 with err filled for errors found
 * here; libjpeg errors longjmp out of it. */
static int
fl_decode_body(fl_jpeg *j, const uint8_t *data, size_t len, const fl_jpeg_region *r,
               uint8_t *out, size_t out_stride, size_t *col_out, fl_err *err)
{
    j_decompress_ptr cinfo = &j->cinfo;
    J_COLOR_SPACE want;
    int nc;                 /* libjpeg output components */
    JDIMENSION ow, oh, xoff, cw;
    size_t col;             /* first region column within a cropped scanline */
    int direct;
    JSAMPROW rows[MAX_ROWS_PER_READ];
    size_t row_bytes;       /* one cropped scanline as libjpeg writes it */
    int nrows;              /* most rows per jpeg_read_scanlines call */
    int done;

    fl_start(j, data, len, 0);

    {
        fl_jpeg_info info;
        fl_fill_info(cinfo, &info);
        if (fl_jpeg_check_limits(j, &info, err) < 0)
            return -1;
    }
    switch (cinfo->jpeg_color_space) {
    case JCS_GRAYSCALE:
        want = r->out_channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
        break;
    case JCS_YCbCr:
    case JCS_RGB:
        want = JCS_RGB;
        break;
    case JCS_CMYK:
    case JCS_YCCK:
        want = JCS_CMYK;
        break;
    default:
        err->code = FL_ERR_DECODE;
        snprintf(err->msg, sizeof(err->msg), "unsupported JPEG color space (%d components)",
                 cinfo->num_components);
        return -1;
    }
    cinfo->out_color_space = want;
    cinfo->scale_num = (unsigned)r->scale_num;
    cinfo->scale_denom = 8;
    cinfo->dct_method = JDCT_ISLOW;
    cinfo->do_fancy_upsampling = TRUE;
    jpeg_calc_output_dimensions(cinfo);
    ow = cinfo->output_width;
    oh = cinfo->output_height;
    nc = cinfo->output_components;
    if (r->x < 0 || r->y < 0 || r->w < 1 || r->h < 1 || (JDIMENSION)r->x > ow ||
        (JDIMENSION)r->w > ow - (JDIMENSION)r->x || (JDIMENSION)r->y > oh ||
        (JDIMENSION)r->h > oh - (JDIMENSION)r->y) {
        err->code = FL_ERR_DECODE;
        snprintf(err->msg, sizeof(err->msg),
                 "region x=%d y=%d w=%d h=%d is outside the %ux%u image at scale %d/8",
                 r->x, r->y, r->w, r->h, (unsigned)ow, (unsigned)oh, r->scale_num);
        return -1;
    }

    jpeg_start_decompress(cinfo);

    xoff = 0;
    cw = ow;
    if (r->x > 0 || (JDIMENSION)r->w < ow) {
        JDIMENSION left = CROP_MARGIN;
        if (cinfo->progressive_mode)
            left += 2 * fl_imcu_width(cinfo);   /* see fl_imcu_width */
        JDIMENSION x0 = (JDIMENSION)r->x > left ? (JDIMENSION)r->x - left : 0;
        JDIMENSION x1 = (JDIMENSION)r->x + (JDIMENSION)r->w + CROP_MARGIN;
        JDIMENSION minw = 2 * fl_imcu_width(cinfo) + 1;
        if (x1 > ow)
            x1 = ow;
        /* A crop of 2 columns or so leaves a subsampled component with a
         * one-sample row, which libjpeg-turbo upsamples differently from the
         * full image (seen with 4:2:0, region x=0 w=1): crop at least two
         * iMCUs and a pixel, which keeps every component's row 3+ samples. */
        if (x1 - x0 < minw) {
            x1 = ow - x0 >= minw ? x0 + minw : ow;
            if (x1 - x0 < minw)
                x0 = x1 >= minw ? x1 - minw : 0;
        }
        xoff = x0;
        cw = x1 - x0;
        jpeg_crop_scanline(cinfo, &xoff, &cw);
    }
    col = (size_t)((JDIMENSION)r->x - xoff);
    direct = col == 0 && cw == (JDIMENSION)r->w && nc == r->out_channels;
    if (col_out != NULL) {
        /* wide: libjpeg's window straight into the caller's rows, which
         * hold it (out_stride >= the scaled width), the region at col;
         * else *col_out stays fl_jpeg_decode_wide's 0 */
        if (nc == r->out_channels && out_stride >= (size_t)cw * (size_t)nc) {
            direct = 1;
            *col_out = col;
        }
    }

    if (r->y > 0)
        jpeg_skip_scanlines(cinfo, (JDIMENSION)r->y);

    /* direct: libjpeg writes straight into the caller's rows, several per
     * call; otherwise into scratch rows (as many as libjpeg fills at once),
     * cropped and converted into the caller's. */
    row_bytes = (size_t)cw * (size_t)nc;
    nrows = MAX_ROWS_PER_READ;
    if (!direct) {
        nrows = cinfo->rec_outbuf_height > 0 ? cinfo->rec_outbuf_height : 1;
        if (nrows > MAX_ROWS_PER_READ)
            nrows = MAX_ROWS_PER_READ;
        if (fl_scratch_reserve(j, row_bytes * (size_t)nrows, err) < 0)
            return -1;
    }
    for (done = 0; done < r->h;) {
        int n = r->h - done;
        JDIMENSION got;
        if (n > nrows)
            n = nrows;
        for (int i = 0; i < n; i++)
            rows[i] = direct ? out + (size_t)(done + i) * out_stride : j->scratch + (size_t)i * row_bytes;
        got = jpeg_read_scanlines(cinfo, rows, (JDIMENSION)n);
        if (got == 0) {
            fl_set_msg(err, FL_ERR_DECODE, "libjpeg returned no scanlines");
            return -1;
        }
        for (JDIMENSION i = 0; !direct && i < got; i++) {
            const uint8_t *src = rows[i] + col * (size_t)nc;
            uint8_t *dst = out + (size_t)(done + (int)i) * out_stride;
            if (nc == r->out_channels)
                memcpy(dst, src, (size_t)r->w * (size_t)nc);
            else if (nc == 3)        /* RGB -> L */
                fl_rgb_to_l(src, dst, r->w);
            else if (r->out_channels == 3)  /* CMYK -> RGB */
                fl_cmyk_to_rgb(src, dst, r->w);
            else                     /* CMYK -> L */
                fl_cmyk_to_l(src, dst, r->w);
        }
        done += (int)got;
    }
    return fl_check_rest(j, data, len, err);
}

/* fl_jpeg_decode's own arguments, for fl_decode_guarded. */
typedef struct {
    const fl_jpeg_region *region;
    uint8_t *out;
    size_t out_stride;
    size_t *col_out;        /* NULL: fl_jpeg_decode; else fl_jpeg_decode_wide */
} fl_decode_args;

/* fl_decode_body as an fl_body_fn (arg: an fl_decode_args); may longjmp. */
static int
fl_decode_guarded(fl_jpeg *j, const uint8_t *data, size_t len, void *arg, fl_err *err)
{
    const fl_decode_args *a = arg;
    return fl_decode_body(j, data, len, a->region, a->out, a->out_stride, a->col_out, err);
}

/* fl_jpeg_decode and fl_jpeg_decode_wide (col_out non-NULL). */
static int
fl_decode_checked(fl_jpeg *j, const uint8_t *data, size_t len, const fl_jpeg_region *region, uint8_t *out,
                  size_t out_stride, size_t *col_out, fl_err *err)
{
    fl_decode_args args;
    if (region->out_channels != 1 && region->out_channels != 3) {
        fl_set_msg(err, FL_ERR_DECODE, "out_channels must be 1 or 3");
        return -1;
    }
    if (region->scale_num < 1 || region->scale_num > 16) {
        fl_set_msg(err, FL_ERR_DECODE, "scale_num must be in 1..16");
        return -1;
    }
    if (region->w > 0 && out_stride < (size_t)region->w * (size_t)region->out_channels) {
        fl_set_msg(err, FL_ERR_DECODE, "out_stride is smaller than a region row");
        return -1;
    }
    args.region = region;
    args.out = out;
    args.out_stride = out_stride;
    args.col_out = col_out;
    return fl_guarded(j, data, len, fl_decode_guarded, &args, err);
}

int
fl_jpeg_decode(fl_jpeg *j, const uint8_t *data, size_t len, const fl_jpeg_region *region,
               uint8_t *out, size_t out_stride, fl_err *err)
{
    return fl_decode_checked(j, data, len, region, out, out_stride, NULL, err);
}

int
fl_jpeg_decode_wide(fl_jpeg *j, const uint8_t *data, size_t len, const fl_jpeg_region *region,
                    uint8_t *out, size_t out_stride, size_t *col, fl_err *err)
{
    *col = 0;
    return fl_decode_checked(j, data, len, region, out, out_stride, col, err);
}

/* ------------------------------------------------------------------------ */
/* orientation */

void
fl_apply_orientation(const uint8_t *src, int w, int h, int c, int orientation, uint8_t *dst)
{
    size_t cs = (size_t)c;
    size_t row = (size_t)w * cs;
    if (orientation < 2 || orientation > 8) {
        memcpy(dst, src, row * (size_t)h);
        return;
    }
    if (orientation <= 4) {
        /* dst is w x h.  2: mirror columns; 3: rotate 180; 4: mirror rows. */
        for (int y = 0; y < h; y++) {
            int sy = orientation == 2 ? y : h - 1 - y;
            const uint8_t *s = src + (size_t)sy * row;
            uint8_t *d = dst + (size_t)y * row;
            if (orientation == 4) {
                memcpy(d, s, row);
                continue;
            }
            for (int x = 0; x < w; x++)
                memcpy(d + (size_t)x * cs, s + (size_t)(w - 1 - x) * cs, cs);
        }
        return;
    }
    /* dst is h wide and w tall; dst(x, y) = src(sx, sy) with:
     * 5 TRANSPOSE (sx=y, sy=x), 6 ROTATE_270 (sx=y, sy=h-1-x),
     * 7 TRANSVERSE (sx=w-1-y, sy=h-1-x), 8 ROTATE_90 (sx=w-1-y, sy=x). */
    {
        size_t drow = (size_t)h * cs;
        for (int y = 0; y < w; y++) {
            int sx = (orientation == 5 || orientation == 6) ? y : w - 1 - y;
            uint8_t *d = dst + (size_t)y * drow;
            for (int x = 0; x < h; x++) {
                int sy = (orientation == 5 || orientation == 8) ? x : h - 1 - x;
                memcpy(d + (size_t)x * cs, src + (size_t)sy * row + (size_t)sx * cs, cs);
            }
        }
    }
}
