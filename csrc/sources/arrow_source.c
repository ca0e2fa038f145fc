/* arrow_source.c: the "arrow" kind of fl_source (contracts and the layout
 * in arrow_source.h). */
#include "sources/arrow_source.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FL_ARROW_PAGE 4096

typedef struct {
    fl_source head;
    fl_arrow_chunk *chunks;   /* nchunks, owned (the memory they point to is lent) */
    int64_t *starts;          /* nchunks + 1: the first row of each chunk, then the column's rows; owned */
    int64_t nchunks;
    int64_t *rows;            /* head.n row numbers, owned; NULL: sample i is row i */
    void (*release)(void *ctx);
    void *ctx;
} arrow_source;

static int
fail(fl_err *err, int code, const char *msg)
{
    err->code = code;
    err->errnum = 0;
    snprintf(err->msg, sizeof err->msg, "%s", msg);
    return -1;
}

/* Whether bit i of bitmap bm is set (NULL: every bit is). */
static int
valid(const uint8_t *bm, int64_t i)
{
    return bm == NULL || ((bm[i >> 3] >> (i & 7)) & 1);
}

/* Check that a bitmap of `len` bytes covers bits [0, end).  0 or -1. */
static int
check_bitmap(const uint8_t *bm, size_t len, int64_t end, const char *what, int64_t c, fl_err *err)
{
    if (bm == NULL || (uint64_t)end <= (uint64_t)len * 8)
        return 0;
    snprintf(err->msg, sizeof err->msg, "chunk %lld: the %s validity bitmap of %zu bytes does not cover %lld rows",
             (long long)c, what, len, (long long)end);
    err->code = FL_ERR_INVALID;
    err->errnum = 0;
    return -1;
}

/* Check one field's buffers against `length` rows of chunk c.  0 or -1. */
static int
check_binary(const fl_arrow_binary *b, int64_t length, const char *what, int64_t c, fl_err *err)
{
    if (b->offset_width != 4 && b->offset_width != 8) {
        snprintf(err->msg, sizeof err->msg, "chunk %lld: the %s offsets are %d bytes wide, not 4 or 8",
                 (long long)c, what, b->offset_width);
        err->code = FL_ERR_INVALID;
        err->errnum = 0;
        return -1;
    }
    if (b->offset < 0 || b->offset > INT64_MAX - length - 1)
        return fail(err, FL_ERR_INVALID, "a negative or overflowing array offset");
    uint64_t entries = (uint64_t)(b->offset + length + 1);
    if (entries > (uint64_t)SIZE_MAX / 8 || b->offsets_len < entries * (uint64_t)b->offset_width) {
        snprintf(err->msg, sizeof err->msg, "chunk %lld: the %s offsets buffer of %zu bytes is too small for %llu "
                 "entries", (long long)c, what, b->offsets_len, (unsigned long long)entries);
        err->code = FL_ERR_INVALID;
        err->errnum = 0;
        return -1;
    }
    if (b->data == NULL && b->data_len > 0)
        return fail(err, FL_ERR_INVALID, "a data buffer without an address");
    return check_bitmap(b->validity, b->validity_len, b->offset + length, what, c, err);
}

/* The value at element j of field b: *p and *len, in place.  0, or -1
 * with err filled when the offsets point outside the data (a damaged
 * file). */
static int
value_of(const fl_arrow_binary *b, int64_t j, const uint8_t **p, size_t *len, fl_err *err)
{
    int64_t k = b->offset + j, start, end;
    if (b->offset_width == 4) {
        int32_t o[2];
        memcpy(o, (const uint8_t *)b->offsets + (size_t)k * 4, sizeof o);  /* memcpy: no alignment assumed */
        start = o[0];
        end = o[1];
    } else {
        int64_t o[2];
        memcpy(o, (const uint8_t *)b->offsets + (size_t)k * 8, sizeof o);
        start = o[0];
        end = o[1];
    }
    if (start < 0 || end < start || (uint64_t)end > (uint64_t)b->data_len) {
        err->code = FL_ERR_IO;
        err->errnum = 0;
        snprintf(err->msg, sizeof err->msg, "damaged Arrow data: offsets [%lld, %lld) outside the data buffer of "
                 "%zu bytes", (long long)start, (long long)end, b->data_len);
        return -1;
    }
    *p = b->data ? b->data + start : (const uint8_t *)"";
    *len = (size_t)(end - start);
    return 0;
}

/* Read the file a row names (bytes null) into buf.  0 with out filled, or
 * -1 with err filled. */
static int
read_path(const uint8_t *p, size_t len, fl_bytes *buf, size_t max_bytes, fl_sample_bytes *out, fl_err *err)
{
    if (len == 0)
        return fail(err, FL_ERR_IO, "no image: bytes is null and path is empty");
    if (memchr(p, '\0', len) != NULL)
        return fail(err, FL_ERR_IO, "no image: bytes is null and path holds a NUL byte");
    char *path = malloc(len + 1);
    if (path == NULL)
        return fail(err, FL_ERR_NOMEM, "out of memory");
    memcpy(path, p, len);
    path[len] = '\0';
    if (strstr(path, "://") != NULL) {
        err->code = FL_ERR_IO;
        err->errnum = 0;
        snprintf(err->msg, sizeof err->msg, "bytes is null and path '%.150s' is remote: only local files are read "
                 "(embed the images, e.g. save_to_disk after loading, or download the files)", path);
        free(path);
        return -1;
    }
    long long got = fl_source_read_file(path, buf, max_bytes, err);
    if (got < 0) {
        char reason[sizeof err->msg];
        memcpy(reason, err->msg, sizeof reason);
        snprintf(err->msg, sizeof err->msg, "bytes is null; its path '%.120s': %.160s", path, reason);
        free(path);
        return -1;
    }
    free(path);
    memset(out, 0, sizeof *out);
    out->data = buf->data;
    out->len = (size_t)got;
    return 0;
}

static int
arrow_get(fl_source *s, void *tls, int64_t index, uint64_t epoch, fl_bytes *buf, size_t max_bytes,
          fl_sample_bytes *out, fl_err *err)
{
    (void)tls;    /* no per-thread state: the buffers are plain memory */
    (void)epoch;  /* indexable: any epoch reads the same row */
    arrow_source *a = (arrow_source *)s;
    int64_t row = a->rows ? a->rows[index] : index;
    int64_t lo = 0, hi = a->nchunks;  /* starts[lo] <= row < starts[hi] */
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (a->starts[mid] <= row)
            lo = mid;
        else
            hi = mid;
    }
    const fl_arrow_chunk *c = &a->chunks[lo];
    int64_t j = row - a->starts[lo];
    if (!valid(c->validity, c->validity_offset + j))
        return fail(err, FL_ERR_IO, "no image: the row's image is null");
    const uint8_t *p;
    size_t len;
    if (valid(c->bytes.validity, c->bytes.offset + j)) {
        if (value_of(&c->bytes, j, &p, &len, err) < 0)
            return -1;
        if (max_bytes && len > max_bytes) {
            err->code = FL_ERR_LIMIT;
            err->errnum = 0;
            snprintf(err->msg, sizeof err->msg, "value of %zu bytes exceeds the limit of %zu bytes", len, max_bytes);
            return -1;
        }
        /* Fault the value's pages in here, not in the decoder (arrow_source.h):
         * one read per page; the sum keeps the loads from being optimised away. */
        const volatile uint8_t *v = p;
        uint8_t sum = 0;
        for (size_t off = 0; off < len; off += FL_ARROW_PAGE)
            sum ^= v[off];
        (void)sum;
        memset(out, 0, sizeof *out);
        out->data = p;
        out->len = len;
        return 0;
    }
    if (c->path.offsets == NULL || !valid(c->path.validity, c->path.offset + j))
        return fail(err, FL_ERR_IO, c->path.offsets ? "no image: bytes and path are both null"
                                                    : "no image: the row's bytes are null");
    if (value_of(&c->path, j, &p, &len, err) < 0)
        return -1;
    return read_path(p, len, buf, max_bytes, out, err);
}

static void
arrow_free(arrow_source *a)
{
    if (a->release)
        a->release(a->ctx);
    free(a->chunks);
    free(a->starts);
    free(a->rows);
    free(a);
}

static void
arrow_destroy(fl_source *s)
{
    arrow_free((arrow_source *)s);
}

static const fl_source_ops arrow_ops = {
    .kind = "arrow",
    .get = arrow_get,
    .destroy = arrow_destroy,  /* no thread state; describe: the binding names rows; discard: nothing held */
};

fl_source *
fl_source_arrow_new(const fl_arrow_chunk *chunks, int64_t nchunks, const int64_t *rows, int64_t n,
                    void (*release)(void *ctx), void *ctx, fl_err *err)
{
    arrow_source *a = calloc(1, sizeof *a);
    if (a == NULL) {
        if (release)
            release(ctx);
        fail(err, FL_ERR_NOMEM, "out of memory");
        return NULL;
    }
    a->release = release;  /* from here on arrow_free calls it */
    a->ctx = ctx;
    if (nchunks < 0 || n < 0 || (uint64_t)nchunks > SIZE_MAX / sizeof *chunks - 1 || (uint64_t)n > SIZE_MAX / 8) {
        fail(err, FL_ERR_INVALID, "a negative or impossible chunk or sample count");
        goto error;
    }
    a->chunks = malloc((size_t)(nchunks ? nchunks : 1) * sizeof *chunks);
    a->starts = malloc((size_t)(nchunks + 1) * sizeof *a->starts);
    if (a->chunks == NULL || a->starts == NULL) {
        fail(err, FL_ERR_NOMEM, "out of memory");
        goto error;
    }
    if (nchunks)
        memcpy(a->chunks, chunks, (size_t)nchunks * sizeof *chunks);
    a->nchunks = nchunks;
    int64_t total = 0;
    for (int64_t c = 0; c < nchunks; c++) {
        const fl_arrow_chunk *k = &a->chunks[c];
        if (k->length < 0 || k->length > INT64_MAX - total || k->validity_offset < 0 ||
            k->validity_offset > INT64_MAX - k->length) {
            fail(err, FL_ERR_INVALID, "a negative or overflowing chunk length or offset");
            goto error;
        }
        if (k->bytes.offsets == NULL) {
            fail(err, FL_ERR_INVALID, "a chunk without a bytes field");
            goto error;
        }
        if (check_bitmap(k->validity, k->validity_len, k->validity_offset + k->length, "row", c, err) < 0 ||
            check_binary(&k->bytes, k->length, "bytes", c, err) < 0 ||
            (k->path.offsets && check_binary(&k->path, k->length, "path", c, err) < 0))
            goto error;
        a->starts[c] = total;
        total += k->length;
    }
    a->starts[nchunks] = total;
    if (rows == NULL) {
        if (n != total) {
            snprintf(err->msg, sizeof err->msg, "%lld samples asked of a column of %lld rows", (long long)n,
                     (long long)total);
            err->code = FL_ERR_INVALID;
            err->errnum = 0;
            goto error;
        }
    } else {
        a->rows = malloc((size_t)(n ? n : 1) * sizeof *a->rows);
        if (a->rows == NULL) {
            fail(err, FL_ERR_NOMEM, "out of memory");
            goto error;
        }
        for (int64_t i = 0; i < n; i++) {
            if (rows[i] < 0 || rows[i] >= total) {
                snprintf(err->msg, sizeof err->msg, "sample %lld maps to row %lld, outside the column's %lld rows",
                         (long long)i, (long long)rows[i], (long long)total);
                err->code = FL_ERR_INVALID;
                err->errnum = 0;
                goto error;
            }
            a->rows[i] = rows[i];
        }
    }
    fl_source_init(&a->head, &arrow_ops, n);
    return &a->head;
error:
    arrow_free(a);
    return NULL;
}
