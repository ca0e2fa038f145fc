/* rng.h: counter-based random numbers keyed by (seed, epoch, sample index).
 *
 * Every random decision of a sample (crop box, flip, ...) is drawn from a
 * stream that depends only on (seed, epoch, index), never on which thread
 * runs the sample or in what order, so the output is identical for any
 * num_workers and any scheduling.
 *
 * Generator: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy
 * as 1, 2, 3", SC'11).  The 128-bit counter is
 *   { block number, epoch bits 0..31, index bits 0..31, index bits 32..63 }
 * and the 64-bit key is the seed, XORed with a mix of the epoch's high 32
 * bits when those are nonzero.  For epochs below 2^32 distinct
 * (seed, epoch, index) triples therefore map to disjoint streams exactly.
 * Each Philox block gives 128 bits, i.e. two 64-bit outputs.
 *
 * Header-only, no allocation, no globals; all functions are thread-safe on
 * distinct fl_rng objects and need no GIL.
 */
#ifndef FL_RNG_H
#define FL_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct {
    uint32_t key[2];   /* Philox key (from the seed, see above) */
    uint32_t ctr[4];   /* ctr[0] = next block number; ctr[1..3] fixed by epoch/index */
    uint32_t out[4];   /* the current block's output words */
    int avail;         /* 64-bit outputs left in out[] (0, 1 or 2) */
} fl_rng;

/* SplitMix64's finalizer: a bijective 64-bit mixer. */
static inline uint64_t
fl_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* One Philox4x32 round on ctr with key k. */
static inline void
fl_philox_round(uint32_t c[4], const uint32_t k[2])
{
    uint64_t p0 = (uint64_t)0xD2511F53u * c[0];
    uint64_t p1 = (uint64_t)0xCD9E8D57u * c[2];
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k[0];
    uint32_t n1 = (uint32_t)p1;
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k[1];
    uint32_t n3 = (uint32_t)p0;
    c[0] = n0; c[1] = n1; c[2] = n2; c[3] = n3;
}

/* Philox4x32-10: out = bijection_key(ctr).  Pure function. */
static inline void
fl_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k[2] = {key[0], key[1]};
    for (int r = 0; r < 10; r++) {
        if (r) {
            k[0] += 0x9E3779B9u;
            k[1] += 0xBB67AE85u;
        }
        fl_philox_round(c, k);
    }
    out[0] = c[0]; out[1] = c[1]; out[2] = c[2]; out[3] = c[3];
}

/* Start the stream of sample `index` in `epoch` under `seed`. */
static inline void
fl_rng_init(fl_rng *r, uint64_t seed, uint64_t epoch, uint64_t index)
{
    uint64_t k = seed;
    if (epoch >> 32)
        k ^= fl_mix64(epoch >> 32);
    r->key[0] = (uint32_t)k;
    r->key[1] = (uint32_t)(k >> 32);
    r->ctr[0] = 0;
    r->ctr[1] = (uint32_t)epoch;
    r->ctr[2] = (uint32_t)index;
    r->ctr[3] = (uint32_t)(index >> 32);
    r->avail = 0;
}

/* Next 64 uniformly distributed bits of the stream. */
static inline uint64_t
fl_rng_next(fl_rng *r)
{
    if (r->avail == 0) {
        fl_philox4x32_10(r->ctr, r->key, r->out);
        r->ctr[0]++;   /* 2^32 blocks per sample is far more than any plan draws */
        r->avail = 2;
    }
    r->avail--;
    const uint32_t *w = r->out + (r->avail ? 0 : 2);
    return (uint64_t)w[0] | ((uint64_t)w[1] << 32);
}

/* A double uniform in [lo, hi) (lo when hi == lo) with 53 random bits. */
static inline double
fl_rng_uniform(fl_rng *r, double lo, double hi)
{
    double u = (double)(fl_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return lo + (hi - lo) * u;
}

/* An integer uniform in [0, n), without modulo bias (rejection).  n > 0;
 * returns 0 for n == 0. */
static inline uint64_t
fl_rng_below(fl_rng *r, uint64_t n)
{
    if (n == 0)
        return 0;
    uint64_t threshold = (0 - n) % n;   /* 2^64 mod n: reject the short last bucket */
    for (;;) {
        uint64_t x = fl_rng_next(r);
        if (x >= threshold)
            return x % n;
    }
}

/* A standard normal draw: Box-Muller on two uniforms, u1 in (0, 1] so the
 * log stays finite; the second value of the pair is dropped. */
static inline double
fl_rng_normal(fl_rng *r)
{
    double u1 = 1.0 - fl_rng_uniform(r, 0.0, 1.0), u2 = fl_rng_uniform(r, 0.0, 1.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* A Gamma(a, 1) draw, a > 0: Marsaglia and Tsang's method, with the
 * U^(1/a) boost for a < 1 (MixUp's Beta and AugMix's Dirichlet weights). */
static inline double
fl_rng_gamma(fl_rng *r, double a)
{
    double boost = 1.0;
    if (a < 1.0) {
        boost = pow(1.0 - fl_rng_uniform(r, 0.0, 1.0), 1.0 / a);
        a += 1.0;
    }
    double d = a - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double z = fl_rng_normal(r), v = 1.0 + c * z;
        if (v <= 0.0)
            continue;
        v = v * v * v;
        double u = 1.0 - fl_rng_uniform(r, 0.0, 1.0);
        if (log(u) < 0.5 * z * z + d - d * v + d * log(v))
            return d * v * boost;
    }
}

#endif
