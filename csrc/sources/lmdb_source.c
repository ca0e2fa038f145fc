/* lmdb_source.c: the LMDB kind of fl_source and the converter's writer
 * (contracts and the layout in lmdb_source.h). */
#include "sources/lmdb_source.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FL_LMDB_PAGE 4096

/* Fill err for LMDB return code rc while doing `what`.  rc > 0 is an errno
 * (LMDB passes the OS's through), rc < 0 one of LMDB's own codes.
 * Returns -1. */
static int
mdb_error(fl_err *err, int rc, const char *what)
{
    err->code = rc == ENOMEM ? FL_ERR_NOMEM : FL_ERR_IO;
    err->errnum = rc > 0 ? rc : 0;
    if (rc == MDB_INVALID || rc == MDB_VERSION_MISMATCH)
        snprintf(err->msg, sizeof err->msg, "%s: not an LMDB environment (%s)", what, mdb_strerror(rc));
    else if (rc == MDB_READERS_FULL)
        snprintf(err->msg, sizeof err->msg, "%s: %s (all %d reader slots of the lock file are taken)", what,
                 mdb_strerror(rc), FL_LMDB_MAX_READERS);
    else if (rc == MDB_MAP_RESIZED)
        snprintf(err->msg, sizeof err->msg, "%s: %s (another process grew the environment while it was open; "
                 "open the dataset again)", what, mdb_strerror(rc));
    else
        snprintf(err->msg, sizeof err->msg, "%s: %s", what, mdb_strerror(rc));
    return -1;
}

static int
plain_error(fl_err *err, int errnum, const char *msg)
{
    err->code = FL_ERR_IO;
    err->errnum = errnum;
    snprintf(err->msg, sizeof err->msg, "%s", msg);
    return -1;
}

int
fl_lmdb_sample_key(int64_t i, char *key)
{
    return snprintf(key, 24, "%0*" PRId64, FL_LMDB_KEY_DIGITS, i);
}

/* Open the environment at `path` read-only with the flags lmdb_source.h
 * explains.  0 and *out set, or -1 with err filled. */
static int
env_open_ro(const char *path, const fl_lmdb_options *opt, MDB_env **out, fl_err *err)
{
    fl_lmdb_options dflt = {0, 1};
    if (opt == NULL)
        opt = &dflt;
    struct stat st;
    if (stat(path, &st) != 0) {
        int e = errno;
        char m[128];
        snprintf(m, sizeof m, "cannot open: %s", strerror(e));
        return plain_error(err, e, m);
    }
    unsigned flags = MDB_RDONLY | MDB_NOTLS;
    if (S_ISDIR(st.st_mode)) {
        /* an environment directory: without data.mdb, LMDB's own error
         * would be a bare ENOENT that names no file */
        size_t len = strlen(path) + sizeof "/data.mdb";
        char *data = malloc(len);
        if (data == NULL) {
            err->code = FL_ERR_NOMEM;
            err->errnum = 0;
            snprintf(err->msg, sizeof err->msg, "out of memory");
            return -1;
        }
        snprintf(data, len, "%s/data.mdb", path);
        int missing = access(data, F_OK) != 0;
        free(data);
        if (missing)
            return plain_error(err, 0, "a directory without data.mdb, not an LMDB environment");
    } else if (S_ISREG(st.st_mode)) {
        if (st.st_size == 0)  /* LMDB says ENOENT for it */
            return plain_error(err, 0, "an empty file, not an LMDB environment");
        flags |= MDB_NOSUBDIR;
    } else {
        return plain_error(err, 0, "neither a directory nor a regular file, not an LMDB environment");
    }
    if (!opt->lock)
        flags |= MDB_NOLOCK;
    if (!opt->readahead)
        flags |= MDB_NORDAHEAD;
    MDB_env *env = NULL;
    int rc = mdb_env_create(&env);
    if (rc != 0)
        return mdb_error(err, rc, "cannot create an LMDB handle");
    if (opt->lock && (rc = mdb_env_set_maxreaders(env, FL_LMDB_MAX_READERS)) != 0) {
        mdb_env_close(env);
        return mdb_error(err, rc, "cannot set the reader slots");
    }
    /* mode 0644: only used for a lock file created with lock = 1 */
    rc = mdb_env_open(env, path, flags, 0644);
    if (rc != 0) {
        mdb_env_close(env);
        return mdb_error(err, rc, "cannot open the LMDB environment");
    }
    *out = env;
    return 0;
}

/* ---- the source ---------------------------------------------------------------- */

typedef struct {
    fl_source head;
    MDB_env *env;     /* owned; closed by destroy, after every transaction ended */
    MDB_dbi dbi;      /* the main database */
} lmdb_source;

static int
lmdb_thread_open(fl_source *s, void **tls, fl_err *err)
{
    lmdb_source *l = (lmdb_source *)s;
    MDB_txn *txn = NULL;
    int rc = mdb_txn_begin(l->env, NULL, MDB_RDONLY, &txn);
    if (rc != 0)
        return mdb_error(err, rc, "cannot begin a read transaction");
    *tls = txn;
    return 0;
}

static void
lmdb_thread_close(fl_source *s, void *tls)
{
    (void)s;
    if (tls)
        mdb_txn_abort((MDB_txn *)tls);  /* MDB_NOTLS: any thread may end it */
}

static int
lmdb_get(fl_source *s, void *tls, int64_t index, uint64_t epoch, fl_bytes *buf, size_t max_bytes,
         fl_sample_bytes *out, fl_err *err)
{
    (void)epoch; /* an LMDB is indexable: any epoch reads the same value */
    (void)buf;   /* values are views: nothing is copied */
    lmdb_source *l = (lmdb_source *)s;
    char key[24];
    MDB_val k = {(size_t)fl_lmdb_sample_key(index, key), key}, v;
    int rc = mdb_get((MDB_txn *)tls, l->dbi, &k, &v);
    if (rc == MDB_NOTFOUND) {
        err->code = FL_ERR_IO;
        err->errnum = 0;
        snprintf(err->msg, sizeof err->msg, "no value under key '%s' (the LMDB says it holds %lld samples: it is "
                 "damaged, or not in fastloader's layout)", key, (long long)s->n);
        return -1;
    }
    if (rc != 0)
        return mdb_error(err, rc, "LMDB read failed");
    if (max_bytes && v.mv_size > max_bytes) {
        err->code = FL_ERR_LIMIT;
        err->errnum = 0;
        snprintf(err->msg, sizeof err->msg, "value of %zu bytes exceeds the limit of %zu bytes", v.mv_size,
                 max_bytes);
        return -1;
    }
    /* Fault the value's pages in here, not in the decoder (lmdb_source.h):
     * one read per page; the sum keeps the loads from being optimised away. */
    const volatile uint8_t *p = v.mv_data;
    uint8_t sum = 0;
    for (size_t off = 0; off < v.mv_size; off += FL_LMDB_PAGE)
        sum ^= p[off];
    (void)sum;
    memset(out, 0, sizeof *out);
    out->data = v.mv_data;
    out->len = v.mv_size;
    return 0;
}

static void
lmdb_destroy(fl_source *s)
{
    lmdb_source *l = (lmdb_source *)s;
    mdb_env_close(l->env);
    free(l);
}

static const fl_source_ops lmdb_ops = {
    .kind = "lmdb",
    .thread_open = lmdb_thread_open,
    .thread_close = lmdb_thread_close,
    .get = lmdb_get,
    .destroy = lmdb_destroy,  /* describe: the binding names a sample by its index; discard: nothing held */
};

/* Open the environment at `path` read-only and begin a read transaction on
 * its main database: *env, *txn and *dbi set.  0, or -1 with err filled
 * and nothing left open.  No GIL. */
static int
begin_read(const char *path, const fl_lmdb_options *opt, MDB_env **env, MDB_txn **txn, MDB_dbi *dbi, fl_err *err)
{
    *env = NULL;
    *txn = NULL;
    if (env_open_ro(path, opt, env, err) < 0)
        return -1;
    int rc = mdb_txn_begin(*env, NULL, MDB_RDONLY, txn);
    if (rc != 0) {
        mdb_error(err, rc, "cannot begin a read transaction");
        *txn = NULL;
    } else if ((rc = mdb_dbi_open(*txn, NULL, 0, dbi)) != 0) {
        mdb_error(err, rc, "cannot open the main database");
        mdb_txn_abort(*txn);
        *txn = NULL;
    }
    if (rc != 0) {
        mdb_env_close(*env);
        *env = NULL;
        return -1;
    }
    return 0;
}

fl_source *
fl_source_lmdb_open(const char *path, int64_t n, const fl_lmdb_options *opt, fl_err *err)
{
    MDB_env *env = NULL;
    if (n < 0) {
        err->code = FL_ERR_INVALID;
        err->errnum = 0;
        snprintf(err->msg, sizeof err->msg, "negative sample count %lld", (long long)n);
        return NULL;
    }
    MDB_txn *txn = NULL;
    MDB_dbi dbi;
    int rc;
    if (begin_read(path, opt, &env, &txn, &dbi, err) < 0)
        return NULL;
    if (n > 0) {
        char key[24];
        MDB_val k = {(size_t)fl_lmdb_sample_key(n - 1, key), key}, v;
        rc = mdb_get(txn, dbi, &k, &v);
        if (rc == MDB_NOTFOUND) {
            err->code = FL_ERR_IO;
            err->errnum = 0;
            snprintf(err->msg, sizeof err->msg, "the LMDB says it holds %lld samples, but the last one's key '%s' "
                     "is missing (an incomplete or damaged file)", (long long)n, key);
            goto fail;
        }
        if (rc != 0) {
            mdb_error(err, rc, "LMDB read failed");
            goto fail;
        }
    }
    /* commit, not abort: a handle opened in a read transaction stays valid
     * for later transactions only once that transaction commits */
    rc = mdb_txn_commit(txn);
    txn = NULL;
    if (rc != 0) {
        mdb_error(err, rc, "cannot end a read transaction");
        goto fail;
    }
    lmdb_source *l = calloc(1, sizeof *l);
    if (l == NULL) {
        err->code = FL_ERR_NOMEM;
        err->errnum = 0;
        snprintf(err->msg, sizeof err->msg, "out of memory");
        goto fail;
    }
    fl_source_init(&l->head, &lmdb_ops, n);
    l->env = env;
    l->dbi = dbi;
    return &l->head;
fail:
    if (txn)
        mdb_txn_abort(txn);
    mdb_env_close(env);
    return NULL;
}

int
fl_lmdb_read_keys(const char *path, const fl_lmdb_options *opt, size_t nkeys, const char *const *keys,
                  const size_t *klens, uint8_t **vals, size_t *vlens, fl_err *err)
{
    for (size_t i = 0; i < nkeys; i++) {
        vals[i] = NULL;
        vlens[i] = 0;
    }
    MDB_env *env = NULL;
    MDB_txn *txn = NULL;
    MDB_dbi dbi;
    int rc;
    if (begin_read(path, opt, &env, &txn, &dbi, err) < 0)
        return -1;
    for (size_t i = 0; i < nkeys; i++) {
        MDB_val k = {klens[i], (void *)keys[i]}, v;
        rc = mdb_get(txn, dbi, &k, &v);
        if (rc == MDB_NOTFOUND)
            continue;
        if (rc != 0) {
            mdb_error(err, rc, "LMDB read failed");
            goto fail;
        }
        vals[i] = malloc(v.mv_size ? v.mv_size : 1);
        if (vals[i] == NULL) {
            err->code = FL_ERR_NOMEM;
            err->errnum = 0;
            snprintf(err->msg, sizeof err->msg, "out of memory copying a value of %zu bytes", v.mv_size);
            goto fail;
        }
        memcpy(vals[i], v.mv_data, v.mv_size);
        vlens[i] = v.mv_size;
    }
    mdb_txn_abort(txn);
    mdb_env_close(env);
    return 0;
fail:
    for (size_t i = 0; i < nkeys; i++) {
        free(vals[i]);
        vals[i] = NULL;
        vlens[i] = 0;
    }
    if (txn)
        mdb_txn_abort(txn);
    mdb_env_close(env);
    return -1;
}

/* ---- the writer ------------------------------------------------------------------ */

#define FL_LMDB_GROW_STEP ((size_t)1 << 40)   /* the map grows by at most 1 TiB at a time */
#define FL_LMDB_MAP_LIMIT ((size_t)1 << 46)   /* and never past 64 TiB */

struct fl_lmdb_writer {
    MDB_env *env;
    MDB_dbi dbi;
    size_t map_size;
    uint8_t *last;      /* the greatest key committed so far (malloc'd), NULL before the first */
    size_t last_len;
};

/* LMDB's default key order: bytes, then length (mdb_cmp_memn).  <0, 0, >0. */
static int
key_cmp(const void *a, size_t alen, const void *b, size_t blen)
{
    int d = memcmp(a, b, alen < blen ? alen : blen);
    if (d)
        return d;
    return alen < blen ? -1 : alen > blen;
}

static size_t
round_mib(size_t n)
{
    size_t mib = (size_t)1 << 20;
    return (n + mib - 1) / mib * mib;
}

fl_lmdb_writer *
fl_lmdb_writer_open(const char *path, size_t map_size, fl_err *err)
{
    /* create the file exclusively: LMDB would open an existing one */
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        char m[128];
        snprintf(m, sizeof m, "cannot create: %s", strerror(e));
        plain_error(err, e, m);
        return NULL;
    }
    close(fd);
    fl_lmdb_writer *w = calloc(1, sizeof *w);
    if (w == NULL) {
        unlink(path);
        err->code = FL_ERR_NOMEM;
        err->errnum = 0;
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return NULL;
    }
    w->map_size = round_mib(map_size ? map_size : (size_t)1 << 30);
    MDB_txn *txn;
    int rc = mdb_env_create(&w->env);
    if (rc != 0) {
        mdb_error(err, rc, "cannot create an LMDB handle");
        goto fail;
    }
    if ((rc = mdb_env_set_mapsize(w->env, w->map_size)) != 0) {
        mdb_error(err, rc, "cannot set the map size");
        goto fail;
    }
    rc = mdb_env_open(w->env, path, MDB_NOSUBDIR | MDB_NOLOCK | MDB_NOSYNC | MDB_NOMETASYNC, 0644);
    if (rc != 0) {
        mdb_error(err, rc, "cannot open the LMDB environment for writing");
        goto fail;
    }
    if ((rc = mdb_txn_begin(w->env, NULL, 0, &txn)) != 0) {
        mdb_error(err, rc, "cannot begin a write transaction");
        goto fail;
    }
    if ((rc = mdb_dbi_open(txn, NULL, 0, &w->dbi)) != 0) {
        mdb_txn_abort(txn);
        mdb_error(err, rc, "cannot open the main database");
        goto fail;
    }
    if ((rc = mdb_txn_commit(txn)) != 0) {  /* frees txn, also when it fails */
        mdb_error(err, rc, "cannot open the main database");
        goto fail;
    }
    return w;
fail:
    fl_lmdb_writer_abandon(w);
    unlink(path);  /* the file this call created */
    return NULL;
}

/* One attempt at the batch.  0, MDB_MAP_FULL (nothing written: retry
 * with a larger map), or another LMDB code. */
static int
put_once(fl_lmdb_writer *w, size_t n, const void *const *keys, const size_t *klens, const void *const *vals,
         const size_t *vlens)
{
    MDB_txn *txn = NULL;
    int rc = mdb_txn_begin(w->env, NULL, 0, &txn);
    if (rc != 0)
        return rc;
    const void *last = w->last;
    size_t last_len = w->last_len;
    for (size_t i = 0; i < n; i++) {
        MDB_val k = {klens[i], (void *)keys[i]}, v = {vlens[i], (void *)vals[i]};
        int append = last == NULL || key_cmp(keys[i], klens[i], last, last_len) > 0;
        rc = mdb_put(txn, w->dbi, &k, &v, append ? MDB_APPEND : 0);
        if (rc != 0) {
            mdb_txn_abort(txn);
            return rc;
        }
        if (append) {
            last = keys[i];
            last_len = klens[i];
        }
    }
    rc = mdb_txn_commit(txn);  /* frees txn either way */
    if (rc != 0)
        return rc;
    if (last != w->last) {  /* keep a copy of the new greatest key */
        uint8_t *copy = malloc(last_len ? last_len : 1);
        if (copy != NULL)
            memcpy(copy, last, last_len);
        free(w->last);
        /* out of memory: forget it; later puts are then ordinary (correct, only less packed) */
        w->last = copy;
        w->last_len = copy ? last_len : 0;
    }
    return 0;
}

int
fl_lmdb_writer_put(fl_lmdb_writer *w, size_t n, const void *const *keys, const size_t *klens,
                   const void *const *vals, const size_t *vlens, fl_err *err)
{
    size_t batch = 0;
    for (size_t i = 0; i < n; i++) {
        if (klens[i] == 0 || klens[i] > (size_t)mdb_env_get_maxkeysize(w->env)) {
            err->code = FL_ERR_INVALID;
            err->errnum = 0;
            snprintf(err->msg, sizeof err->msg, "an LMDB key must have 1 to %d bytes, got %zu",
                     mdb_env_get_maxkeysize(w->env), klens[i]);
            return -1;
        }
        batch += klens[i] + vlens[i] + 2 * FL_LMDB_PAGE;  /* overflow pages round up; branch pages */
    }
    for (;;) {
        int rc = put_once(w, n, keys, klens, vals, vlens);
        if (rc == 0)
            return 0;
        if (rc != MDB_MAP_FULL)
            return mdb_error(err, rc, "LMDB write failed");
        size_t grow = w->map_size < FL_LMDB_GROW_STEP ? w->map_size : FL_LMDB_GROW_STEP;
        if (grow < 2 * batch)
            grow = 2 * batch;
        size_t next = round_mib(w->map_size + grow);
        if (next > FL_LMDB_MAP_LIMIT || next <= w->map_size) {
            err->code = FL_ERR_IO;
            err->errnum = 0;
            snprintf(err->msg, sizeof err->msg, "LMDB write failed: the map would exceed %zu bytes",
                     FL_LMDB_MAP_LIMIT);
            return -1;
        }
        /* no transaction is active here, as mdb_env_set_mapsize requires */
        if ((rc = mdb_env_set_mapsize(w->env, next)) != 0)
            return mdb_error(err, rc, "cannot grow the LMDB map");
        w->map_size = next;
    }
}

size_t
fl_lmdb_writer_map_size(const fl_lmdb_writer *w)
{
    return w->map_size;
}

int
fl_lmdb_writer_close(fl_lmdb_writer *w, fl_err *err)
{
    int rc = mdb_env_sync(w->env, 1);
    int ret = 0;
    if (rc != 0)
        ret = mdb_error(err, rc, "cannot flush the LMDB to disk");
    fl_lmdb_writer_abandon(w);
    return ret;
}

void
fl_lmdb_writer_abandon(fl_lmdb_writer *w)
{
    if (w == NULL)
        return;
    if (w->env)
        mdb_env_close(w->env);
    free(w->last);
    free(w);
}
