/* shards.c: tar shards in the WebDataset layout as an fl_source (contracts
 * in shards.h).
 *
 * Why ~850 lines in one file: the reader thread, the ring, the shuffle
 * buffer, the stashes and the fl_source ops all work under one mutex on one
 * struct; the parts make sense only together.
 *
 * Locking: one mutex guards the ring, the shuffle buffer's hand-off, the
 * epoch and the fault state; `more` wakes workers waiting for a position,
 * `room` wakes the reader waiting for a free slot.  The reader reads and
 * parses with the mutex released; it takes it only to publish a record.
 */
#include "sources/shards.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "sources/tar.h"

/* One sample of the stream: its image bytes and label, or why it has none. */
typedef struct {
    char *name;           /* "URL: KEY" for messages (malloc'd) */
    fl_wds_sample *smp;   /* the tar sample (owned); NULL in a stash copy */
    uint8_t *image;       /* the image member's bytes: inside smp, or owned when smp is NULL;
                             NULL when `error` is set */
    size_t len;
    int64_t label;
    int has_label;
    uint64_t key;         /* FL_SHARDS_KEY of the sample (shards.h) */
    const fl_wds_field *extra[FL_SHARDS_MAX_EXTS];  /* the requested extra members (inside smp), or NULL */
    int nkept;            /* a fields stash copy: kept[0..nkept) owned (NULL: member missing) */
    uint8_t *kept[FL_SHARDS_MAX_EXTS];
    size_t kept_len[FL_SHARDS_MAX_EXTS];
    int error;            /* 1: no usable image / label: get fails with `msg` */
    int code;
    char msg[200];
} shard_rec;

typedef struct {
    char url[512];
    char reason[320];
} skipped_shard;

typedef struct {
    fl_source head;
    fl_shards_opts o;
    char *ca_file;        /* o.stream.ca_file's copy (owned), or NULL */
    pthread_mutex_t mu;
    pthread_cond_t more, room;
    /* the current epoch, guarded by mu */
    uint64_t epoch;
    int running;          /* a reader thread exists (joined by begin / cancel / destroy) */
    pthread_t reader;
    char **urls;
    int nurls;
    fl_shards_keep *keep; /* per url (owned bits), or NULL: every sample of every shard */
    int64_t *ids;         /* per url: its shard id (owned) */
    int64_t nominal;      /* this epoch's length (o.nominal unless begin said otherwise) */
    shard_rec **ring;     /* o.ring slots, position p in slot p % ring */
    int64_t produced;     /* positions [0, produced) exist */
    int64_t skip;         /* positions below this are dropped when made (a resume) */
    int failed;           /* positions >= produced fail with fail_err */
    fl_err fail_err;
    atomic_int cancel;    /* stops the reader (and its stream) */
    int stopping;         /* waiters give up: "cancelled" */
    /* the fix-up stash: non-JPEG images kept for the binding's Pillow pass */
    int64_t *discard;     /* future positions nobody will get (their batch failed): dropped when made */
    int ndiscard, capdiscard;
    int64_t *stash_pos;   /* position * 2 + kind (STASH_IMAGE, STASH_FIELDS) */
    shard_rec **stash;
    int nstash, capstash;
    skipped_shard *skipped;
    int nskipped, capskipped;
    /* counters (atomics: read by stats from any thread) */
    _Atomic uint64_t bytes, wait_ns, retries, samples, shards, shards_skipped, passes;
} shards_source;

typedef struct {
    shard_rec *cur;       /* the record the last get handed out (owned) */
    int64_t cur_pos;
} shards_tls;

static void
rec_free(shard_rec *r)
{
    if (!r)
        return;
    free(r->name);
    for (int i = 0; i < r->nkept; i++)
        free(r->kept[i]);
    if (r->smp)
        fl_wds_sample_free(r->smp);
    else
        free(r->image);
    free(r);
}

/* ---- the reader thread -------------------------------------------------------- */

/* Parse a label: ASCII decimal (optional sign, surrounding whitespace), or
 * the top-level integer `field` of a JSON object.  0, or -1. */
static int
parse_label(const uint8_t *d, size_t n, const char *field, int64_t *out)
{
    char buf[4096];
    if (n >= sizeof buf)
        n = sizeof buf - 1;
    memcpy(buf, d, n);
    buf[n] = 0;
    const char *p = buf;
    if (field && *field) {
        char pat[80];
        snprintf(pat, sizeof pat, "\"%s\"", field);
        const char *k = strstr(buf, pat);
        if (!k)
            return -1;
        p = k + strlen(pat);
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        if (*p != ':')
            return -1;
        p++;
    }
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (end == p || errno)
        return -1;
    if (!(field && *field)) {
        while (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')
            end++;
        if (*end)
            return -1;
    }
    *out = v;
    return 0;
}

/* A record for one tar sample (the image member chosen by the preferred
 * extensions; the label parsed), taking ownership of t (also when it fails).
 * NULL when out of memory. */
static shard_rec *
make_rec(shards_source *ss, const char *url, fl_wds_sample *t)
{
    shard_rec *r = calloc(1, sizeof *r);
    if (!r) {
        fl_wds_sample_free(t);
        return NULL;
    }
    r->smp = t;
    char shown[200];
    fl_stream_url_for_message(url, shown, sizeof shown);
    size_t nl = strlen(shown) + strlen(t->key) + 3;
    r->name = malloc(nl);
    if (!r->name) {
        rec_free(r);
        return NULL;
    }
    snprintf(r->name, nl, "%s: %s", shown, t->key);
    r->label = -1;
    const fl_wds_field *img = NULL;
    for (int e = 0; e < ss->o.nexts && !img; e++)
        img = fl_wds_sample_field(t, ss->o.image_exts[e]);
    if (!img) {
        r->error = 1;
        r->code = FL_ERR_DECODE;
        int k = snprintf(r->msg, sizeof r->msg, "no image member (");
        for (int e = 0; e < ss->o.nexts && k < (int)sizeof r->msg; e++)
            k += snprintf(r->msg + k, sizeof r->msg - (size_t)k, "%s.%s", e ? ", " : "", ss->o.image_exts[e]);
        if (k < (int)sizeof r->msg)
            k += snprintf(r->msg + k, sizeof r->msg - (size_t)k, ") among the sample's members:");
        for (int i = 0; i < t->nfields && k < (int)sizeof r->msg; i++)
            k += snprintf(r->msg + k, sizeof r->msg - (size_t)k, " .%s", t->fields[i].ext);
        return r;
    }
    for (int e = 0; e < ss->o.nextras; e++)
        r->extra[e] = fl_wds_sample_field(t, ss->o.extra_exts[e]);
    if (ss->o.label_ext[0]) {
        const fl_wds_field *lf = fl_wds_sample_field(t, ss->o.label_ext);
        if (!lf || parse_label(lf->data, lf->size, ss->o.label_field, &r->label) < 0) {
            r->error = 1;
            r->code = FL_ERR_DECODE;
            if (!lf)
                snprintf(r->msg, sizeof r->msg, "no .%s member for the label", ss->o.label_ext);
            else if (ss->o.label_field[0])
                snprintf(r->msg, sizeof r->msg, "no integer field \"%s\" in the .%s member", ss->o.label_field,
                         ss->o.label_ext);
            else
                snprintf(r->msg, sizeof r->msg, "the .%s member is not an integer", ss->o.label_ext);
            return r;
        }
        r->has_label = 1;
    }
    r->image = img->data;   /* in place: the sample stays whole until the record is freed */
    r->len = img->size;
    return r;
}

/* Is position p in the discard list?  Remove it if so.  Caller holds mu. */
static int
discard_take(shards_source *ss, int64_t p)
{
    for (int i = 0; i < ss->ndiscard; i++)
        if (ss->discard[i] == p) {
            ss->discard[i] = ss->discard[--ss->ndiscard];
            return 1;
        }
    return 0;
}

/* Publish `r` at the next position, after the shuffle buffer: returns 0, 1
 * when that was the epoch's last position (the reader is done), or -1 when
 * the reader must stop (cancelled; r is then freed).  Called without mu. */
static int
emit(shards_source *ss, shard_rec *r, uint64_t epoch)
{
    pthread_mutex_lock(&ss->mu);
    int64_t p = ss->produced;
    if (p < ss->skip || discard_take(ss, p)) {   /* nobody will get this position: drop the record */
        ss->produced = p + 1;
        pthread_mutex_unlock(&ss->mu);
        rec_free(r);
        return p + 1 >= ss->nominal ? 1 : 0;
    }
    while (!ss->stopping && p < ss->nominal && ss->ring[p % ss->o.ring] != NULL)
        pthread_cond_wait(&ss->room, &ss->mu);
    if (ss->stopping || ss->epoch != epoch || p >= ss->nominal) {
        pthread_mutex_unlock(&ss->mu);
        rec_free(r);
        return -1;
    }
    ss->ring[p % ss->o.ring] = r;
    ss->produced = p + 1;
    atomic_fetch_add(&ss->samples, 1);   /* counted before any worker can take it */
    pthread_cond_broadcast(&ss->more);
    pthread_mutex_unlock(&ss->mu);
    return p + 1 >= ss->nominal ? 1 : 0;
}

/* Mark every position from the next one failed with err (the reader stops). */
static void
fail_from_here(shards_source *ss, const fl_err *err)
{
    pthread_mutex_lock(&ss->mu);
    if (!ss->failed) {
        ss->failed = 1;
        ss->fail_err = *err;
    }
    pthread_cond_broadcast(&ss->more);
    pthread_mutex_unlock(&ss->mu);
}

static void
add_skipped(shards_source *ss, const char *url, const fl_err *err)
{
    pthread_mutex_lock(&ss->mu);
    if (ss->nskipped == ss->capskipped) {
        int cap = ss->capskipped ? 2 * ss->capskipped : 8;
        skipped_shard *n = realloc(ss->skipped, (size_t)cap * sizeof *n);
        if (n) {
            ss->skipped = n;
            ss->capskipped = cap;
        }
    }
    if (ss->nskipped < ss->capskipped) {
        skipped_shard *k = &ss->skipped[ss->nskipped++];
        fl_stream_url_for_message(url, k->url, sizeof k->url);
        snprintf(k->reason, sizeof k->reason, "%.*s", (int)sizeof k->reason - 1, err->msg); /* a skip reason is cut to its field */
    }
    pthread_mutex_unlock(&ss->mu);
    atomic_fetch_add(&ss->shards_skipped, 1);
}

/* Samples in the shuffle buffer before its first draw (webdataset's
 * `initial`); it then grows to the full `shuffle` size as the epoch goes. */
#define SHUFFLE_INITIAL 100

typedef struct {
    shards_source *ss;
    uint64_t epoch;
} reader_arg;

/* The shuffle's schedule, one pair of functions for the reader and for
 * fl_shards_order (which must give the reader's order without reading).
 *
 * shuffle_draws: after a sample entered the buffer (now nbuf of S; the
 * reads-th sample of the epoch), is a position drawn?  As webdataset's
 * shuffle: the first draw once INITIAL samples are in (not a whole buffer:
 * the epoch's first batch does not wait for `shuffle` samples to be read),
 * then one draw for every two samples read while the buffer grows to S,
 * and one per sample once it is full.
 * shuffle_pick: the buffer slot the draw of position `drawn` takes
 * (uniform, keyed by (seed, epoch, position)). */
static int
shuffle_draws(int nbuf, int S, int64_t reads)
{
    const int initial = S < SHUFFLE_INITIAL ? S : SHUFFLE_INITIAL;
    return !(nbuf < S && (nbuf < initial || reads % 2 != 0));
}

static int
shuffle_pick(uint64_t seed, uint64_t epoch, int64_t drawn, int nbuf)
{
    fl_rng g;
    fl_rng_init(&g, seed ^ 0x5ad5ad5ad5ad5adull, epoch, (uint64_t)drawn);
    return (int)fl_rng_below(&g, (uint64_t)nbuf);
}

/* Is sample k (tar order) of shard u kept this epoch? */
static int
keep_sample(const fl_shards_keep *keep, int u, int64_t k)
{
    if (!keep || !keep[u].bits)
        return 1;
    return k < keep[u].nbits && ((keep[u].bits[k >> 3] >> (k & 7)) & 1);
}

/* Draw the record for the next position from the shuffle buffer and
 * publish it; emit's return value. */
static int
draw_and_emit(shards_source *ss, shard_rec **buf, int *nbuf, int64_t *drawn, uint64_t epoch)
{
    int j = shuffle_pick(ss->o.seed, epoch, *drawn, *nbuf);
    shard_rec *out = buf[j];
    buf[j] = buf[--*nbuf];
    ++*drawn;
    return emit(ss, out, epoch);
}

static void *
reader_main(void *argp)
{
    reader_arg a = *(reader_arg *)argp;
    free(argp);
    shards_source *ss = a.ss;
    const int S = ss->o.shuffle > 1 ? ss->o.shuffle : 1;
    shard_rec **buf = calloc((size_t)S, sizeof *buf);
    int nbuf = 0;
    int64_t drawn = 0;   /* positions drawn from the shuffle buffer */
    int64_t reads = 0;   /* samples read (and kept) this epoch */
    fl_err err = {0, "", 0};
    if (!buf) {
        err.code = FL_ERR_NOMEM;
        snprintf(err.msg, sizeof err.msg, "out of memory for a shuffle buffer of %d samples", S);
        fail_from_here(ss, &err);
        return NULL;
    }
    fl_stream_opts so = ss->o.stream;
    so.cancel = &ss->cancel;
    int stop = 0;
    for (uint64_t pass = 0; !stop; pass++) {
        uint64_t got_this_pass = 0;
        if (pass > 0)
            atomic_fetch_add(&ss->passes, 1);
        for (int u = 0; u < ss->nurls && !stop; u++) {
            const char *url = ss->urls[u];
            fl_tar *t = fl_tar_open(url, &so, NULL, &err);
            int rc = t ? 1 : -1;
            fl_wds_sample *smp = NULL;
            int64_t k = 0;   /* the sample's place in its shard, in tar order */
            while (t && !stop && (rc = fl_tar_next_sample(t, &smp, &err)) == 1) {
                if (!keep_sample(ss->keep, u, k++)) {   /* delivered before a re-deal, or another rank's */
                    fl_wds_sample_free(smp);
                    continue;
                }
                shard_rec *r = make_rec(ss, url, smp);
                if (r)
                    r->key = FL_SHARDS_KEY(ss->ids[u], k - 1);
                if (!r) {
                    err.code = FL_ERR_NOMEM;
                    snprintf(err.msg, sizeof err.msg, "out of memory for a sample of %s", url);
                    rc = -1;
                    break;
                }
                got_this_pass++;
                reads++;
                buf[nbuf++] = r;   /* there is room: a draw follows whenever it fills */
                if (!shuffle_draws(nbuf, S, reads))
                    continue;
                if (draw_and_emit(ss, buf, &nbuf, &drawn, a.epoch) != 0)
                    stop = 1;   /* the epoch is complete, or cancelled */
            }
            if (t) {
                fl_stream_stats st;
                fl_stream_get_stats(fl_tar_stream(t), &st);
                atomic_fetch_add(&ss->bytes, st.bytes);
                atomic_fetch_add(&ss->wait_ns, st.wait_ns);
                atomic_fetch_add(&ss->retries, st.retries);
                fl_tar_close(t);
            }
            if (stop || atomic_load(&ss->cancel))
                break;
            if (rc == 0 && ss->keep && ss->keep[u].count >= 0 && k != ss->keep[u].count) {
                char shown[200];
                fl_stream_url_for_message(url, shown, sizeof shown);
                err.code = FL_ERR_IO;
                err.errnum = 0;
                snprintf(err.msg, sizeof err.msg,
                         "%s holds %lld samples, but the counts this epoch was dealt by (index.json) say %lld: "
                         "rewrite index.json for these shards",
                         shown, (long long)k, (long long)ss->keep[u].count);
                fail_from_here(ss, &err);
                stop = 1;
                break;
            }
            if (rc == 0) {
                atomic_fetch_add(&ss->shards, 1);
                continue;
            }
            /* rc < 0: the shard failed */
            if (ss->o.on_shard_error == FL_SHARDS_SKIP) {
                add_skipped(ss, url, &err);
                continue;
            }
            fail_from_here(ss, &err);
            stop = 1;
        }
        /* the end of a pass: empty the shuffle buffer first, so the next
         * pass (a rank short of its nominal length) repeats no sample
         * before every sample of this one was produced */
        while (!stop && nbuf > 0)
            if (draw_and_emit(ss, buf, &nbuf, &drawn, a.epoch) != 0)
                stop = 1;
        if (!stop && got_this_pass == 0 && !atomic_load(&ss->cancel)) {
            err.code = FL_ERR_IO;
            err.errnum = 0;
            snprintf(err.msg, sizeof err.msg, "no samples in the %d shard%s of this rank (all empty or skipped)",
                     ss->nurls, ss->nurls == 1 ? "" : "s");
            fail_from_here(ss, &err);
            stop = 1;
        }
        if (atomic_load(&ss->cancel))
            stop = 1;
    }
    /* what is left in the shuffle buffer (the epoch completed mid-pass, a
     * failure, a cancel) is dropped */
    for (int i = 0; i < nbuf; i++)
        rec_free(buf[i]);
    free(buf);
    return NULL;
}

/* fl_shards_order's draw_and_emit: the buffer slot for position *p into
 * the outputs, the slot refilled from the buffer's end. */
static void
order_draw(uint64_t seed, uint64_t epoch, int32_t *bs, int64_t *bk, int *nbuf, int64_t *drawn, int32_t *shard_out,
           int64_t *sample_out, int64_t *p)
{
    int j = shuffle_pick(seed, epoch, *drawn, *nbuf);
    shard_out[*p] = bs[j];
    sample_out[*p] = bk[j];
    bs[j] = bs[*nbuf - 1];
    bk[j] = bk[*nbuf - 1];
    --*nbuf;
    ++*drawn;
    ++*p;
}

int64_t
fl_shards_order(const int64_t *counts, const fl_shards_keep *keep, int n, int shuffle, uint64_t seed,
                uint64_t epoch, int64_t nominal, int64_t npos, int32_t *shard_out, int64_t *sample_out, fl_err *err)
{
    /* reader_main's loop with sample numbers for records: keep the two in step */
    const int S = shuffle > 1 ? shuffle : 1;
    int32_t *bs = malloc((size_t)S * sizeof *bs);
    int64_t *bk = malloc((size_t)S * sizeof *bk);
    if (!bs || !bk) {
        free(bs);
        free(bk);
        err->code = FL_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg, "out of memory for a shuffle buffer of %d samples", S);
        return -1;
    }
    int64_t limit = npos < nominal ? npos : nominal;
    int64_t p = 0, drawn = 0, reads = 0;
    int nbuf = 0;
    while (p < limit) {
        int64_t got = 0;
        for (int u = 0; u < n && p < limit; u++) {
            /* past a mask's end nothing is kept: stop there (a shard's count may be huge) */
            int64_t end = keep && keep[u].bits && keep[u].nbits < counts[u] ? keep[u].nbits : counts[u];
            for (int64_t k = 0; k < end && p < limit; k++) {
                if (!keep_sample(keep, u, k))
                    continue;
                got++;
                reads++;
                bs[nbuf] = u;
                bk[nbuf] = k;
                nbuf++;
                if (shuffle_draws(nbuf, S, reads))
                    order_draw(seed, epoch, bs, bk, &nbuf, &drawn, shard_out, sample_out, &p);
            }
        }
        while (p < limit && nbuf > 0)
            order_draw(seed, epoch, bs, bk, &nbuf, &drawn, shard_out, sample_out, &p);
        if (p < limit && got == 0) {
            free(bs);
            free(bk);
            err->code = FL_ERR_IO;
            err->errnum = 0;
            snprintf(err->msg, sizeof err->msg, "no samples in the %d shard%s of this rank (all empty or skipped)",
                     n, n == 1 ? "" : "s");
            return -1;
        }
    }
    free(bs);
    free(bk);
    return p;
}

/* ---- control ----------------------------------------------------------------- */

/* Stop and join the reader, drop every record and the stash.  Caller does
 * not hold mu. */
static void
stop_reader(shards_source *ss)
{
    atomic_store(&ss->cancel, 1);
    pthread_mutex_lock(&ss->mu);
    ss->stopping = 1;
    pthread_cond_broadcast(&ss->more);
    pthread_cond_broadcast(&ss->room);
    int running = ss->running;
    ss->running = 0;
    pthread_mutex_unlock(&ss->mu);
    if (running)
        pthread_join(ss->reader, NULL);
    pthread_mutex_lock(&ss->mu);
    for (int i = 0; i < ss->o.ring; i++) {
        rec_free(ss->ring[i]);
        ss->ring[i] = NULL;
    }
    for (int i = 0; i < ss->nstash; i++)
        rec_free(ss->stash[i]);
    ss->nstash = 0;
    ss->ndiscard = 0;
    pthread_mutex_unlock(&ss->mu);
}

void
fl_shards_cancel(fl_source *s)
{
    stop_reader((shards_source *)s);
}

static void
keep_free(fl_shards_keep *keep, int n)
{
    for (int i = 0; keep && i < n; i++)
        free((void *)keep[i].bits);
    free(keep);
}

/* A copy of keep[0..n) (bits owned), or NULL with *ok = 0 when out of memory. */
static fl_shards_keep *
keep_copy(const fl_shards_keep *keep, int n, int *ok)
{
    if (!keep)
        return NULL;
    fl_shards_keep *c = calloc((size_t)n, sizeof *c);
    if (!c) {
        *ok = 0;
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        c[i].count = keep[i].count;
        if (!keep[i].bits)
            continue;
        size_t nb = (size_t)((keep[i].nbits + 7) / 8);
        uint8_t *b = malloc(nb ? nb : 1);
        if (!b) {
            keep_free(c, n);
            *ok = 0;
            return NULL;
        }
        memcpy(b, keep[i].bits, nb);
        c[i].bits = b;
        c[i].nbits = keep[i].nbits;
    }
    return c;
}

int
fl_shards_begin(fl_source *s, uint64_t epoch, int64_t skip, const char *const *urls, int n, fl_err *err)
{
    return fl_shards_begin_keep(s, epoch, skip, urls, NULL, NULL, n, 0, err);
}

int
fl_shards_begin_keep(fl_source *s, uint64_t epoch, int64_t skip, const char *const *urls, const int64_t *ids,
                     const fl_shards_keep *keep, int n, int64_t nominal, fl_err *err)
{
    shards_source *ss = (shards_source *)s;
    if (n < 1) {
        err->code = FL_ERR_INVALID;
        snprintf(err->msg, sizeof err->msg, "no shards for this rank");
        return -1;
    }
    if (nominal > ss->head.n) {
        err->code = FL_ERR_INVALID;
        snprintf(err->msg, sizeof err->msg, "an epoch of %lld positions for a source of %lld",
                 (long long)nominal, (long long)ss->head.n);
        return -1;
    }
    for (int i = 0; keep && i < n; i++)
        if (keep[i].bits && keep[i].nbits < 0) {
            err->code = FL_ERR_INVALID;
            snprintf(err->msg, sizeof err->msg, "a keep mask of %lld samples", (long long)keep[i].nbits);
            return -1;
        }
    for (int i = 0; ids && i < n; i++)
        if (ids[i] < 0 || ids[i] > 0x7fffffff) {
            err->code = FL_ERR_INVALID;
            snprintf(err->msg, sizeof err->msg, "shard id %lld (ids go from 0 to 2^31 - 1)", (long long)ids[i]);
            return -1;
        }
    char **copy = calloc((size_t)n, sizeof *copy);
    int64_t *idc = malloc((size_t)n * sizeof *idc);
    reader_arg *arg = malloc(sizeof *arg);
    int ok = copy && arg && idc;
    for (int i = 0; ok && i < n; i++)
        idc[i] = ids ? ids[i] : i;
    for (int i = 0; ok && i < n; i++)
        ok = (copy[i] = strdup(urls[i])) != NULL;
    fl_shards_keep *kc = ok ? keep_copy(keep, n, &ok) : NULL;
    if (!ok) {
        for (int i = 0; copy && i < n; i++)
            free(copy[i]);
        free(copy);
        free(idc);
        free(arg);
        err->code = FL_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg, "out of memory for the shard list");
        return -1;
    }
    stop_reader(ss);
    pthread_mutex_lock(&ss->mu);
    for (int i = 0; i < ss->nurls; i++)
        free(ss->urls[i]);
    free(ss->urls);
    keep_free(ss->keep, ss->nurls);
    free(ss->ids);
    ss->urls = copy;
    ss->keep = kc;
    ss->ids = idc;
    ss->nurls = n;
    ss->nominal = nominal > 0 ? nominal : ss->o.nominal;
    ss->epoch = epoch;
    ss->produced = 0;
    ss->skip = skip > 0 ? skip : 0;
    atomic_store(&ss->bytes, 0);
    atomic_store(&ss->wait_ns, 0);
    atomic_store(&ss->retries, 0);
    atomic_store(&ss->samples, 0);
    atomic_store(&ss->shards, 0);
    atomic_store(&ss->shards_skipped, 0);
    atomic_store(&ss->passes, 0);
    ss->failed = 0;
    ss->stopping = 0;
    atomic_store(&ss->cancel, 0);
    if (ss->skip >= ss->nominal) {   /* nothing left to produce this epoch */
        ss->produced = ss->nominal;
        pthread_mutex_unlock(&ss->mu);
        free(arg);
        return 0;
    }
    arg->ss = ss;
    arg->epoch = epoch;
    int rc = pthread_create(&ss->reader, NULL, reader_main, arg);
    if (rc == 0)
        ss->running = 1;
    pthread_mutex_unlock(&ss->mu);
    if (rc != 0) {
        free(arg);
        err->code = FL_ERR_RUNTIME;
        err->errnum = rc;
        snprintf(err->msg, sizeof err->msg, "cannot start the shard reader thread: %s", strerror(rc));
        return -1;
    }
    return 0;
}

/* ---- the fl_source ops --------------------------------------------------------- */

static int
shards_thread_open(fl_source *s, void **tls, fl_err *err)
{
    (void)s;
    shards_tls *t = calloc(1, sizeof *t);
    if (!t) {
        err->code = FL_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return -1;
    }
    *tls = t;
    return 0;
}

static void
shards_thread_close(fl_source *s, void *tlsp)
{
    (void)s;
    shards_tls *t = tlsp;
    if (!t)
        return;
    rec_free(t->cur);
    free(t);
}

/* Make room for more discard entries.  0, or -1 when out of memory (the
 * position is then produced and waits in the ring until begin/cancel).
 * Caller holds mu. */
static int
grow_discard(shards_source *ss)
{
    int cap = ss->capdiscard ? 2 * ss->capdiscard : 64;
    int64_t *d = realloc(ss->discard, (size_t)cap * sizeof *d);
    if (!d)
        return -1;
    ss->discard = d;
    ss->capdiscard = cap;
    return 0;
}

/* Keep a non-JPEG image for the binding's Pillow pass (read(index) takes
 * it).  Caller holds mu.  0, or -1 when out of memory (the record is then
 * left to the caller). */
static int
stash_put(shards_source *ss, int64_t pos, shard_rec *r)
{
    if (ss->nstash == ss->capstash) {
        int cap = ss->capstash ? 2 * ss->capstash : 16;
        int64_t *p = realloc(ss->stash_pos, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        ss->stash_pos = p;
        shard_rec **q = realloc(ss->stash, (size_t)cap * sizeof *q);
        if (!q)
            return -1;
        ss->stash = q;
        ss->capstash = cap;
    }
    ss->stash_pos[ss->nstash] = pos;
    ss->stash[ss->nstash++] = r;
    return 0;
}

enum { STASH_IMAGE = 0, STASH_FIELDS = 1 };

/* Take the stashed record of key pos * 2 + kind (caller holds mu), or NULL. */
static shard_rec *
stash_take(shards_source *ss, int64_t pos)
{
    for (int i = 0; i < ss->nstash; i++)
        if (ss->stash_pos[i] == pos) {
            shard_rec *r = ss->stash[i];
            ss->stash_pos[i] = ss->stash_pos[ss->nstash - 1];
            ss->stash[i] = ss->stash[--ss->nstash];
            return r;
        }
    return NULL;
}

static int
shards_get(fl_source *s, void *tlsp, int64_t index, uint64_t epoch, fl_bytes *buf, size_t max_bytes,
           fl_sample_bytes *out, fl_err *err)
{
    (void)buf;   /* records are handed out in place */
    shards_source *ss = (shards_source *)s;
    shards_tls *t = tlsp;
    memset(out, 0, sizeof *out);
    rec_free(t->cur);
    t->cur = NULL;
    pthread_mutex_lock(&ss->mu);
    shard_rec *r = NULL;
    for (;;) {
        if (ss->epoch != epoch) {
            err->code = FL_ERR_RUNTIME;
            snprintf(err->msg, sizeof err->msg, "a stale request for epoch %llu (the stream is at epoch %llu)",
                     (unsigned long long)epoch, (unsigned long long)ss->epoch);
            break;
        }
        if (index >= ss->nominal) {
            err->code = FL_ERR_INDEX;
            snprintf(err->msg, sizeof err->msg, "position %lld is past this epoch's %lld of the shard stream",
                     (long long)index, (long long)ss->nominal);
            break;
        }
        if (index < ss->produced) {
            r = ss->ring[index % ss->o.ring];
            ss->ring[index % ss->o.ring] = NULL;
            if (!r) {
                err->code = FL_ERR_RUNTIME;
                snprintf(err->msg, sizeof err->msg, "sample %lld of the shard stream was already taken",
                         (long long)index);
            }
            pthread_cond_broadcast(&ss->room);
            break;
        }
        if (ss->failed) {
            *err = ss->fail_err;
            break;
        }
        if (ss->stopping) {
            err->code = FL_ERR_RUNTIME;
            snprintf(err->msg, sizeof err->msg, "cancelled");
            break;
        }
        pthread_cond_wait(&ss->more, &ss->mu);
    }
    if (r && !r->error && r->len >= 2 && !(r->image[0] == 0xFF && r->image[1] == 0xD8) &&
        fl_source_pillow_only(r->image, r->len)) {
        /* the pipeline hands this one to Pillow, which reads it back by index
         * (PNG and still WebP are decoded natively: nothing to keep) */
        shard_rec *keep = malloc(sizeof *keep);
        if (keep) {
            *keep = *r;
            keep->smp = NULL;
            keep->image = malloc(r->len);
            keep->name = NULL;
            if (keep->image) {
                memcpy(keep->image, r->image, r->len);
                if (stash_put(ss, index * 2 + STASH_IMAGE, keep) < 0)
                    rec_free(keep);
            } else {
                free(keep);
            }
        }
    }
    if (r && !r->error && ss->o.nextras > 0) {
        /* the extra members asked for, kept for the binding (fl_shards_take_fields) */
        shard_rec *f = calloc(1, sizeof *f);
        int ok = f != NULL;
        for (int e = 0; ok && e < ss->o.nextras; e++) {
            f->nkept = e + 1;
            if (r->extra[e]) {
                f->kept_len[e] = r->extra[e]->size;
                ok = (f->kept[e] = malloc(r->extra[e]->size ? r->extra[e]->size : 1)) != NULL;
                if (ok)
                    memcpy(f->kept[e], r->extra[e]->data, r->extra[e]->size);
            }
        }
        if (!ok || stash_put(ss, index * 2 + STASH_FIELDS, f) < 0)
            rec_free(f);   /* the binding then finds nothing and says so */
    }
    pthread_mutex_unlock(&ss->mu);
    if (!r)
        return -1;
    t->cur = r;
    t->cur_pos = index;
    if (r->error) {
        err->code = r->code;
        err->errnum = 0;
        snprintf(err->msg, sizeof err->msg, "%s", r->msg);
        return -1;
    }
    if (max_bytes && r->len > max_bytes) {
        err->code = FL_ERR_LIMIT;
        snprintf(err->msg, sizeof err->msg, "image member of %zu bytes exceeds the limit of %zu bytes", r->len,
                 max_bytes);
        return -1;
    }
    out->data = r->image;
    out->len = r->len;
    out->has_label = r->has_label;
    out->label = r->label;
    out->has_key = 1;
    out->key = r->key;
    return 0;
}

long long
fl_shards_read_kept(fl_source *s, int64_t index, fl_bytes *buf, fl_err *err)
{
    shards_source *ss = (shards_source *)s;
    pthread_mutex_lock(&ss->mu);
    shard_rec *r = stash_take(ss, index * 2 + STASH_IMAGE);
    pthread_mutex_unlock(&ss->mu);
    if (!r) {
        err->code = FL_ERR_INDEX;
        snprintf(err->msg, sizeof err->msg,
                 "sample %lld of the shard stream is not kept (only non-JPEG images of batches in flight are)",
                 (long long)index);
        return -1;
    }
    long long rc = (long long)r->len;
    if (fl_bytes_reserve(buf, r->len + 1) < 0) {
        err->code = FL_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg, "out of memory");
        rc = -1;
    } else {
        memcpy(buf->data, r->image, r->len);
    }
    rec_free(r);
    return rc;
}

int
fl_shards_take_fields(fl_source *s, int64_t index, uint8_t **data, size_t *len)
{
    shards_source *ss = (shards_source *)s;
    pthread_mutex_lock(&ss->mu);
    shard_rec *r = stash_take(ss, index * 2 + STASH_FIELDS);
    pthread_mutex_unlock(&ss->mu);
    if (!r)
        return -1;
    int n = r->nkept;
    for (int i = 0; i < n; i++) {
        data[i] = r->kept[i];   /* handed over */
        len[i] = r->kept_len[i];
        r->kept[i] = NULL;
    }
    r->nkept = 0;
    rec_free(r);
    return n;
}

static void
shards_discard(fl_source *s, int64_t index, uint64_t epoch)
{
    shards_source *ss = (shards_source *)s;
    pthread_mutex_lock(&ss->mu);
    if (ss->epoch == epoch && index >= 0 && index < ss->nominal) {
        if (index < ss->produced) {
            rec_free(ss->ring[index % ss->o.ring]);
            ss->ring[index % ss->o.ring] = NULL;
            pthread_cond_broadcast(&ss->room);
        } else if (ss->ndiscard < ss->capdiscard || grow_discard(ss) == 0) {
            ss->discard[ss->ndiscard++] = index;
        }
    }
    pthread_mutex_unlock(&ss->mu);
}

static int
shards_describe(fl_source *s, void *tlsp, int64_t index, char *buf, size_t n)
{
    (void)s;
    shards_tls *t = tlsp;
    if (!t || !t->cur || t->cur_pos != index || !t->cur->name)
        return 0;
    snprintf(buf, n, "%s", t->cur->name);
    return 1;
}

static void
shards_destroy(fl_source *s)
{
    shards_source *ss = (shards_source *)s;
    stop_reader(ss);
    for (int i = 0; i < ss->nurls; i++)
        free(ss->urls[i]);
    free(ss->urls);
    keep_free(ss->keep, ss->nurls);
    free(ss->ids);
    free(ss->ring);
    free(ss->stash);
    free(ss->stash_pos);
    free(ss->discard);
    free(ss->ca_file);
    free(ss->skipped);
    pthread_mutex_destroy(&ss->mu);
    pthread_cond_destroy(&ss->more);
    pthread_cond_destroy(&ss->room);
    free(ss);
}

static const fl_source_ops shards_ops = {
    .kind = "shards",
    .thread_open = shards_thread_open,
    .thread_close = shards_thread_close,
    .get = shards_get,
    .describe = shards_describe,
    .discard = shards_discard,
    .destroy = shards_destroy,
};

int
fl_shards_is(const fl_source *s)
{
    return s && s->ops == &shards_ops;
}

fl_source *
fl_shards_new(const fl_shards_opts *o, fl_err *err)
{
    if (o->nominal <= 0 || o->capacity < 0 || (o->capacity && o->capacity < o->nominal) || o->ring < 1 ||
        o->shuffle < 0 || o->nexts < 1 || o->nexts > FL_SHARDS_MAX_EXTS ||
        o->nextras < 0 || o->nextras > FL_SHARDS_MAX_EXTS) {
        err->code = FL_ERR_INVALID;
        snprintf(err->msg, sizeof err->msg,
                 "bad shard options (nominal length %lld, ring %d, shuffle %d, %d image extensions)",
                 (long long)o->nominal, o->ring, o->shuffle, o->nexts);
        return NULL;
    }
    shards_source *ss = calloc(1, sizeof *ss);
    if (ss)
        ss->ring = calloc((size_t)o->ring, sizeof *ss->ring);
    if (!ss || !ss->ring) {
        free(ss);
        err->code = FL_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg, "out of memory for a shard source");
        return NULL;
    }
    fl_source_init(&ss->head, &shards_ops, o->capacity ? o->capacity : o->nominal);
    ss->o = *o;
    ss->nominal = o->nominal;
    ss->o.stream.cancel = NULL;
    if (o->stream.ca_file && !(ss->o.stream.ca_file = ss->ca_file = strdup(o->stream.ca_file))) {
        free(ss->ring);
        free(ss);
        err->code = FL_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg, "out of memory for a shard source");
        return NULL;
    }
    pthread_mutex_init(&ss->mu, NULL);
    pthread_cond_init(&ss->more, NULL);
    pthread_cond_init(&ss->room, NULL);
    ss->stopping = 1;   /* idle until the first begin */
    atomic_init(&ss->cancel, 0);
    return &ss->head;
}

void
fl_shards_stats_get(fl_source *s, fl_shards_stats *out)
{
    shards_source *ss = (shards_source *)s;
    out->bytes = atomic_load(&ss->bytes);
    out->wait_ns = atomic_load(&ss->wait_ns);
    out->retries = atomic_load(&ss->retries);
    out->samples = atomic_load(&ss->samples);
    out->shards = atomic_load(&ss->shards);
    out->shards_skipped = atomic_load(&ss->shards_skipped);
    out->passes = atomic_load(&ss->passes);
}

int
fl_shards_take_skipped(fl_source *s, char (*urls)[512], char (*reasons)[320], int max)
{
    shards_source *ss = (shards_source *)s;
    pthread_mutex_lock(&ss->mu);
    int n = ss->nskipped < max ? ss->nskipped : max;
    for (int i = 0; i < n; i++) {
        memcpy(urls[i], ss->skipped[i].url, 512);
        memcpy(reasons[i], ss->skipped[i].reason, 320);
    }
    if (n > 0) {   /* (an empty list has no array: memmove's pointers must not be NULL) */
        memmove(ss->skipped, ss->skipped + n, (size_t)(ss->nskipped - n) * sizeof *ss->skipped);
        ss->nskipped -= n;
    }
    pthread_mutex_unlock(&ss->mu);
    return n;
}
