/* shards.h: tar shards in the WebDataset layout as an fl_source (no Python).
 *
 * A shard source turns one rank's list of shards into one ordered stream
 * of samples for one epoch, and hands sample p of that stream to whichever
 * worker asks for index p.  So batch k holds positions [k*B, (k+1)*B) of
 * the rank's stream whatever num_workers is, and no sample is read twice.
 *
 *   reader thread (one per source, started by fl_shards_begin):
 *       for each shard URL in order (stream.h: a file, pipe:CMD, http(s)),
 *       for each sample (tar.h: members grouped by key): pick the image
 *       member by the preferred extensions, parse the label, make a record
 *       -> shuffle buffer of `shuffle` records (drawing from 100 on, growing
 *       to full size as it goes, as webdataset's) -> output position p gets the
 *       record drawn by fl_rng(seed, epoch, p) (deterministic given the
 *       shard order, which the caller shuffles by (seed, epoch)); each
 *       record carries its key, FL_SHARDS_KEY(shard id, place in the shard),
 *       by which the pipeline draws its augmentation (source.h has_key)
 *       -> ring slot p % ring (the reader waits while that slot is still
 *       full: memory stays bounded by `ring` records)
 *   workers: get(p) waits until position p exists, takes its record (the
 *       image bytes are handed out in place) and frees the slot; copies of
 *       the extra members asked for wait for the binding under key p
 *       (fl_shards_take_fields), as do non-JPEG images for Pillow.
 *
 * The nominal length.  Every epoch yields exactly `nominal` positions (the
 * caller makes them equal on every rank, so DistributedDataParallel never
 * waits for a rank that ran out): a rank whose shards hold fewer samples
 * goes round its list again (a new pass, the same shard order, the shuffle
 * buffer drawing on), and the rest of a longer list is not read that epoch.
 *
 * Faults.  A shard that cannot be read (404 after the stream's retries, a
 * truncated or corrupt tar) is, with on_shard_error = FL_SHARDS_RAISE, the
 * error of every position from the first one not yet produced (the batch
 * holding it raises it, naming the shard URL and member); with
 * FL_SHARDS_SKIP the samples already read from it are kept, the rest of the
 * shard is dropped, and (URL, reason) is listed for fl_shards_skipped.  A
 * sample without an image member, with an unparsable label, or too large
 * is that sample's error (the dataset's on_error then applies).  A whole
 * pass that yields no sample is an error (FL_ERR_IO, "no samples").
 *
 * Epochs.  fl_shards_begin stops the reader of the previous epoch, drops
 * its records and starts the new one; a get for another epoch than the
 * current one fails at once (FL_ERR_RUNTIME "stale") instead of taking a
 * sample of the new epoch.  fl_shards_cancel wakes every waiter.
 *
 * Threads: every function runs without the GIL; any thread.
 */
#ifndef FL_SHARDS_H
#define FL_SHARDS_H

#include <stdint.h>

#include "sources/source.h"
#include "sources/stream.h"

enum { FL_SHARDS_RAISE = 0, FL_SHARDS_SKIP = 1 };

#define FL_SHARDS_MAX_EXTS 8

typedef struct {
    int64_t nominal;          /* positions per epoch (> 0), unless fl_shards_begin_keep says otherwise */
    int64_t capacity;         /* positions any epoch may have: the source's n (0: nominal; else >= nominal) */
    int shuffle;              /* shuffle buffer, in samples (0 or 1: stream order) */
    int ring;                 /* produced-but-not-taken records kept at most (>= 1) */
    uint64_t seed;
    int on_shard_error;       /* FL_SHARDS_RAISE / FL_SHARDS_SKIP */
    char image_exts[FL_SHARDS_MAX_EXTS][16];  /* the image member: the first of these present */
    int nexts;
    char label_ext[32];       /* member holding the label as ASCII decimal ("cls"); "" : no label (-1) */
    char label_field[64];     /* when set, label_ext is JSON and this top-level integer field is the label */
    char extra_exts[FL_SHARDS_MAX_EXTS][32];  /* other members handed to the binding as bytes */
    int nextras;
    fl_stream_opts stream;    /* for every shard (cancel is set by the source itself; ca_file copied) */
} fl_shards_opts;

/* Counters of the current epoch (reset by fl_shards_begin; a snapshot). */
typedef struct {
    uint64_t bytes;           /* shard bytes read */
    uint64_t wait_ns;         /* reader time blocked on disk / network / pipe (stream.h's wait_ns) */
    uint64_t retries;         /* http retries */
    uint64_t samples;         /* samples produced */
    uint64_t shards;          /* shards read to the end */
    uint64_t shards_skipped;
    uint64_t passes;          /* extra passes over a rank's list to reach the nominal length */
} fl_shards_stats;

/* A new shard source (kind "shards", n = o->nominal), idle until
 * fl_shards_begin.  NULL with err filled (FL_ERR_INVALID for bad options,
 * FL_ERR_NOMEM). */
fl_source *fl_shards_new(const fl_shards_opts *o, fl_err *err);

/* Start epoch `epoch` over `urls` (n >= 1, copied) in that order: stops the
 * previous epoch's reader (joins it), drops its records, starts a new
 * reader thread.  Positions below `skip` (a resume mid-epoch: batches the
 * training loop had already received) are made as usual -- their shards
 * read and parsed, the shuffle buffer drawn from, so every later position
 * gets the record it gets in an uninterrupted epoch -- and dropped at once,
 * never handed to a worker nor decoded; with skip >= nominal no reader is
 * started.  0, or -1 with err filled. */
int fl_shards_begin(fl_source *s, uint64_t epoch, int64_t skip, const char *const *urls, int n, fl_err *err);

/* Which samples of one shard the reader keeps: every one (bits NULL), or
 * sample k (0-based, in tar order) iff k < nbits and bit k of bits (least
 * significant bit first) is set.  The others are read past, never
 * published: they take no position and no shuffle draw.  count >= 0: the
 * samples the shard holds by the counts the caller dealt by (index.json);
 * a shard read to its end that holds another number is the error of every
 * position from there (FL_ERR_IO naming the shard and both numbers), never
 * a silently different epoch.  -1: not checked. */
typedef struct {
    const uint8_t *bits;
    int64_t nbits;
    int64_t count;
} fl_shards_keep;

/* A sample's key for its random draws: sample k (tar order) of the shard
 * whose id is `id` (its index in the dataset's whole shard list), the same
 * on every rank and every topology. */
#define FL_SHARDS_KEY(id, k) (((uint64_t)(id) << 32) | ((uint64_t)(k) & 0xffffffffu))

/* fl_shards_begin with shard ids (ids NULL: urls[i]'s id is i; else
 * ids[i] >= 0, copied), a keep mask per shard (keep NULL: every sample;
 * else keep[i] for urls[i]; copied) and this epoch's length (nominal <= 0:
 * opts.nominal; at most the capacity).  An elastic resume
 * (fastloader/webdataset.py) gives a rank the samples no rank received,
 * some shards split between ranks.  0, or -1 with err filled
 * (FL_ERR_INVALID, FL_ERR_NOMEM). */
int fl_shards_begin_keep(fl_source *s, uint64_t epoch, int64_t skip, const char *const *urls, const int64_t *ids,
                         const fl_shards_keep *keep, int n, int64_t nominal, fl_err *err);

/* The stream's order without reading a byte: for shards of counts[i]
 * samples (each shard's count as its tar holds them, keep as in
 * fl_shards_begin_keep), the shuffle, seed and epoch of a source and an
 * epoch of `nominal` positions, which sample of which shard each position
 * p < npos gets: shard_out[p] (an index into counts), sample_out[p] (tar
 * order), as the reader of fl_shards_begin_keep publishes them when every
 * shard reads whole (the reader and this share the shuffle's schedule).
 * Returns the positions filled (min(npos, nominal)), or -1 with err
 * (FL_ERR_IO when a pass keeps no sample, as the reader; FL_ERR_NOMEM).
 * Pure (no source); any thread, no GIL. */
int64_t fl_shards_order(const int64_t *counts, const fl_shards_keep *keep, int n, int shuffle, uint64_t seed,
                        uint64_t epoch, int64_t nominal, int64_t npos, int32_t *shard_out, int64_t *sample_out,
                        fl_err *err);

/* Stop the reader and wake every waiting get (they fail with "cancelled").
 * Idempotent; fl_shards_begin starts again. */
void fl_shards_cancel(fl_source *s);

void fl_shards_stats_get(fl_source *s, fl_shards_stats *out);

/* Copy out and forget the shards skipped so far: up to max entries of
 * (url, reason) into caller buffers of 512 and 320 bytes each.  Returns
 * how many. */
int fl_shards_take_skipped(fl_source *s, char (*urls)[512], char (*reasons)[320], int max);

/* The bytes of position `index` when its image is not a JPEG (the pipeline
 * leaves those to the binding's Pillow pass, and the source keeps them
 * until read here once), copied into buf.  Returns the length, or -1 with
 * err (FL_ERR_INDEX when not kept). */
long long fl_shards_read_kept(fl_source *s, int64_t index, fl_bytes *buf, fl_err *err);

/* The extra members (opts.extra_exts) of position `index`, kept when a
 * worker took it: data[i], len[i] for i < the returned count, each a
 * malloc'd copy the caller frees (data[i] NULL: the sample has no such
 * member).  Returns the count, or -1 when nothing is kept for `index`
 * (not taken yet, already taken, or the sample was an error).  Each
 * position's fields can be taken once. */
int fl_shards_take_fields(fl_source *s, int64_t index, uint8_t **data, size_t *len);

/* True when s is a shard source. */
int fl_shards_is(const fl_source *s);

#endif
