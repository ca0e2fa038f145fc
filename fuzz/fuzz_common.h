/* fuzz_common.h: helpers shared by the libFuzzer harnesses in fuzz/.
 *
 * Layout of the harnesses: one binary per target (fuzz_decode, fuzz_region,
 * fuzz_render, fuzz_augment, fuzz_mix, fuzz_tar, fuzz_codecs), each built with -fsanitize=fuzzer,address,undefined against
 * the real csrc/ sources (scripts/fuzz.sh).  Separate binaries rather than
 * one with a mode byte, so that each target keeps its own corpus and its
 * coverage feedback is not diluted by the others, and a crash file names the
 * target it belongs to.
 *
 * Input format
 * - fuzz_decode: the whole input is the JPEG file.
 * - fuzz_codecs: the whole input is the PNG or WebP file.
 * - fuzz_region, fuzz_render: the first FZ_REGION_PARAMS / FZ_RENDER_PARAMS
 *   bytes are parameters (region, scale, transform spec, ...), the rest is
 *   the JPEG file.  An input shorter than the parameter block reads zeros for
 *   the missing parameters and an empty file.  Parameters in front (not in a
 *   trailer) keep them at fixed offsets whatever the mutator does to the
 *   JPEG, and scripts/make_fuzz_corpus.py writes the seeds the same way.
 * - fuzz_augment: FZ_AUGMENT_PARAMS parameter bytes (op, magnitude,
 *   interpolation, channels, size, fill), then raw pixel bytes.
 * - fuzz_mix: FZ_MIX_PARAMS parameter bytes (timm's Mixup or torchvision's
 *   MixUp / CutMix, the batch shape, seed, the spec, labels), then pixel bytes.
 *
 * Findings: anything the sanitizers report, and every broken contract, which
 * the harness turns into abort() with a line on stderr ("FUZZ CONTRACT: ...")
 * so that libFuzzer saves the input as a crash.
 */
#ifndef FL_FUZZ_COMMON_H
#define FL_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image/jpeg.h"

/* Pixel limit set on every decoder in the harnesses (FL_JPEG_DEFAULT_MAX_PIXELS
 * is 179 Mpx, whose buffers would exceed libFuzzer's 2 GB RSS limit and take
 * seconds per input under ASan).  Larger declared sizes exercise the limit
 * refusal instead. */
#define FZ_MAX_PIXELS ((uint64_t)1 << 22)
/* Largest output buffer (bytes) a harness allocates; a bigger valid request
 * is skipped (the API would need that much memory from its caller). */
#define FZ_MAX_OUT_BYTES ((size_t)32 << 20)

#define FZ_REGION_PARAMS 16
#define FZ_RENDER_PARAMS 64
#define FZ_AUGMENT_PARAMS 17
#define FZ_MIX_PARAMS 32

/* Report a broken contract and abort (libFuzzer saves the input). */
#define FZ_FAIL(...)                                                   \
    do {                                                               \
        fprintf(stderr, "FUZZ CONTRACT: " __VA_ARGS__);                \
        fputc('\n', stderr);                                           \
        abort();                                                       \
    } while (0)

/* FZ_VERBOSE=1 in the environment: one line per input on stderr saying what
 * the harness did (to check that seeds reach the paths they are meant for). */
static inline int
fz_verbose(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("FZ_VERBOSE");
        v = e != NULL && e[0] != '\0' && e[0] != '0';
    }
    return v;
}
#define FZ_LOG(...)                                                    \
    do {                                                               \
        if (fz_verbose()) {                                            \
            fprintf(stderr, "fz: " __VA_ARGS__);                       \
            fputc('\n', stderr);                                       \
        }                                                              \
    } while (0)

/* A cursor over the parameter bytes: reads past the end give 0. */
typedef struct {
    const uint8_t *p;
    size_t n, i;
} fz_bytes;

static inline uint8_t
fz_u8(fz_bytes *b)
{
    return b->i < b->n ? b->p[b->i++] : (b->i++, 0);
}

static inline uint16_t
fz_u16(fz_bytes *b)
{
    uint16_t hi = fz_u8(b);
    return (uint16_t)(hi << 8 | fz_u8(b));
}

static inline uint32_t
fz_u32(fz_bytes *b)
{
    uint32_t hi = fz_u16(b);
    return hi << 16 | fz_u16(b);
}

/* Split data into the parameter block and the file that follows it. */
static inline void
fz_split(const uint8_t *data, size_t size, size_t nparams, fz_bytes *params, const uint8_t **file,
         size_t *file_len)
{
    params->p = data;
    params->n = size < nparams ? size : nparams;
    params->i = 0;
    *file = data + params->n;
    *file_len = size - params->n;
}

/* An fl_err after a call that returned -1 must carry a known code and a
 * NUL-terminated, non-empty message (the Python binding maps the code to an
 * exception and raises SystemError "this is a bug" for any other code). */
#define FZ_ERR_LAST FL_ERR_EXPORT

static inline void
fz_check_err(const fl_err *e, const char *what)
{
    if (e->code < FL_ERR_DECODE || e->code > FZ_ERR_LAST)
        FZ_FAIL("%s failed with unknown error code %d", what, e->code);
    if (memchr(e->msg, '\0', sizeof e->msg) == NULL)
        FZ_FAIL("%s: error message not NUL-terminated", what);
    if (e->msg[0] == '\0')
        FZ_FAIL("%s failed with an empty message (code %d)", what, e->code);
}

/* libjpeg is not instrumented, so ASan does not see its writes into our
 * buffers (jpeg.c lets jpeg_read_scanlines write straight into the caller's
 * rows).  Output buffers therefore get FZ_CANARY guard bytes after their n
 * bytes, checked after every call. */
#define FZ_CANARY 64

static inline uint8_t *
fz_guarded_alloc(size_t n)
{
    uint8_t *p = malloc(n + FZ_CANARY);
    if (!p)
        abort();
    memset(p + n, 0xA5, FZ_CANARY);
    return p;
}

static inline void
fz_guard_check(const uint8_t *p, size_t n, const char *what)
{
    for (size_t i = 0; i < FZ_CANARY; i++)
        if (p[n + i] != 0xA5)
            FZ_FAIL("%s wrote past the end of its %zu-byte output (guard byte %zu)", what, n, i);
}

/* Pillow's rgb2l, to check the 1-channel decode against the 3-channel one. */
static inline uint8_t
fz_luma(const uint8_t *rgb)
{
    return (uint8_t)(((uint32_t)rgb[0] * 19595 + (uint32_t)rgb[1] * 38470 + (uint32_t)rgb[2] * 7471 + 0x8000) >> 16);
}

#endif
