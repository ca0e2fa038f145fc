/* imgops_internal.h: what the imgops units share and nobody else uses.
 *
 * The per-sample transform stage (public interface: imgops.h) is four
 * units, one responsibility each:
 *   plan.c      spec checks and one sample's decisions (torchvision's rules)
 *   resample.c  Pillow's fixed-point antialiased resample, portable + AVX2
 *               (its own private header: resample.h)
 *   convert.c   RGB -> L, and uint8 rows -> output rows of the spec's dtype,
 *               Normalize and layout through a per-channel table
 *   render.c    fl_render: geometry, scratch layout, the passes in order,
 *               window, flip and padding
 * This header declares what crosses between them (besides resample.h).
 *
 * No Python, no GIL: everything declared here runs without the GIL on
 * caller-owned memory and is re-entrant.
 */
#ifndef FL_IMGOPS_INTERNAL_H
#define FL_IMGOPS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "image/imgops.h"

/* Hot loops are also compiled for AVX2 (32-bit vector multiplies; baseline
 * x86-64 has none) and picked at load time by the dynamic loader.  Integer
 * arithmetic only, so every clone gives identical results. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define FL_HOT __attribute__((target_clones("avx2", "default")))
#else
#define FL_HOT
#endif


/* resample.c: 1 when the AVX2 kernels run: the CPU has AVX2 and
 * FASTLOADER_NO_AVX2 is unset (or "0"); the variable exists to test the
 * portable kernels.  Read once per process (the first call), then cached.
 * Thread-safe.  Asked by fl_render (the resampler) and by augment.c (the
 * nearest affine's gathers). */
int fl_use_avx2(void);

/* convert.c: Pillow's convert("L") (ITU-R 601-2 luma, 16-bit fixed point)
 * of h rows of w interleaved RGB pixels (row i at src + i * stride) into
 * dst, h packed rows of w bytes. */
void fl_rgb_to_luma(const uint8_t *src, size_t stride, int w, int h, uint8_t *dst);

/* convert.c: a row emitter: the finished uint8 row `row` (output order,
 * planar: wc planes of out_w bytes at plane stride ps; a gray row, wc 1,
 * serves every channel) -> output row oy of the out_w x out_h sample at
 * out, in t's dtype and layout, through lut (from fl_convert_table). */
typedef void (*fl_emit_fn)(const fl_tspec *t, const void *lut, const uint8_t *row, size_t ps, int wc, int out_w,
                           int out_h, int oy, void *out);

/* convert.c: make the emitters' non-temporal stores (float32 rows on AVX2
 * machines) visible to other threads: an sfence, called once a sample is
 * written and before anything publishes it.  No GIL needed; a no-op
 * elsewhere. */
void fl_convert_fence(void);

/* convert.c: store v as one element of t's dtype at dst (float16 and
 * bfloat16 rounded to nearest even; uint8 by truncation, for v a whole
 * number in 0..255 as fl_tspec_check requires of erase values). */
void fl_convert_store(const fl_tspec *t, float v, void *dst);

/* convert.c: bytes of one table entry for t's dtype (1, 2 or 4); the table
 * is 3 x 256 entries. */
size_t fl_convert_elsize(const fl_tspec *t);

/* convert.c: fill the conversion table lut (3 x 256 entries of
 * fl_convert_elsize(t) bytes, caller-owned; float entries are exactly what
 * torch computes for ToTensor / ToDtype then Normalize, float16/bfloat16
 * rounded to nearest even from that float32) and return the row emitter
 * for t's dtype. */
fl_emit_fn fl_convert_table(const fl_tspec *t, void *lut);

#endif
