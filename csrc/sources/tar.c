/* tar.c: streaming tar members and WebDataset samples (contracts in tar.h).
 *
 * Why ~800 lines in one file: the header formats (ustar, GNU long names,
 * pax), the read-ahead buffer and the sample grouping share the reader's
 * state member by member; tarfile's rules are followed case by case.
 *
 * Reading: a 64 KiB read-ahead buffer serves the 512-byte headers; member
 * bodies of 64 KiB or more go from the stream straight into the sample's
 * allocation (for a local file that is the only copy: read() into place).
 *
 * One member is read in two steps: next_member() consumes its headers (the
 * extension headers before it included) and leaves it "pending"; the sample
 * loop then either reads its body into a new field, skips it, or -- when the
 * member starts a new sample -- leaves it pending for the next call.
 */
#include "sources/tar.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 512
#define RBUF ((size_t)64 << 10)
#define DRAIN_MAX ((uint64_t)1 << 20)

enum { T_READING = 0, T_END = 1, T_FAILED = 2 };

struct fl_tar {
    fl_stream *s;            /* owned */
    fl_tar_opts o;
    char urlmsg[168];        /* the URL for messages (fl_stream_url_for_message) */
    uint8_t *rbuf;           /* read-ahead: rbuf[rpos..rlen) not consumed yet */
    size_t rpos, rlen;
    uint64_t off;            /* shard bytes consumed */
    int state;               /* T_*; after T_FAILED calls return `final` */
    fl_err final;
    int end_seen;            /* the end of the archive was reached (and drained) */

    /* the pending member (headers consumed, body not) */
    int pending;
    char *name;              /* its name (owned, grows) */
    size_t namecap;
    uint64_t size;           /* body bytes */
    uint64_t body;           /* bytes on the stream after the header: size rounded up to blocks, or 0 */
    uint64_t hdr_off;        /* offset of its first header (extension headers included) */
    int regular;             /* a file: a sample field; else skipped */

    char *gpath;             /* path= of the last global pax header (owned), or NULL */
    char *prev;              /* the last member's name, for "after member ..." (owned), or NULL */
};

/* ------------------------------------------------------------------------ */
/* the webdataset name rules */

int
fl_wds_skip_name(const char *name)
{
    size_t n = strlen(name);
    /* tar_file_iterator: "/" not in fname and it starts and ends with "__" */
    if (strchr(name, '/') == NULL && n >= 2 && strncmp(name, "__", 2) == 0 && strcmp(name + n - 2, "__") == 0)
        return 1;
    /* skip_meta: re.match(r"__[^/]*__($|/)", fname) */
    if (n < 4 || strncmp(name, "__", 2) != 0)
        return 0;
    size_t lim = strcspn(name, "/"); /* [^/]* stops at the first '/' */
    for (size_t j = 2; j + 2 <= lim; j++) {
        if (name[j] != '_' || name[j + 1] != '_')
            continue;
        size_t e = j + 2;
        /* '$' matches at the end or before a final newline */
        if (e == n || name[e] == '/' || (name[e] == '\n' && e + 1 == n))
            return 1;
    }
    return 0;
}

int
fl_wds_split(const char *name, size_t *keylen, const char **ext)
{
    /* ^((?:.*\/|)[^.]+)[.]([^/]*)$ : the prefix alternative ".*\/" is tried
     * first, greedy (the last '/' that no newline precedes, then earlier
     * ones), then the empty one.  From a start p, [^.]+ runs to the first
     * '.', which must not be at p, and everything after that '.' must be
     * free of '/' ([^/]* to the end; it may hold a final newline). */
    size_t i = strcspn(name, "\n");
    for (;;) {
        while (i > 0 && name[i - 1] != '/')
            i--;
        size_t p = i; /* just after a '/', or 0: the empty alternative */
        const char *dot = strchr(name + p, '.');
        if (dot != NULL && (size_t)(dot - name) > p && strchr(dot + 1, '/') == NULL) {
            *keylen = (size_t)(dot - name);
            *ext = dot + 1;
            return 1;
        }
        if (p == 0)
            return 0;
        i = p - 1; /* the next '/' to the left */
    }
}

/* ------------------------------------------------------------------------ */
/* errors */

/* Fill err with "<url>: [member '<name>': ]<reason>" (name may be NULL) and
 * make the reader fail for good.  Returns -1. */
static int
tar_fail(fl_tar *t, fl_err *err, int code, const char *member, const char *fmt, ...)
{
    char why[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    err->code = code;
    err->errnum = 0;
    int used;
    if (member != NULL)
        used = snprintf(err->msg, sizeof err->msg, "%s: member '%.100s': ", t->urlmsg, member);
    else
        used = snprintf(err->msg, sizeof err->msg, "%s: ", t->urlmsg);
    snprintf(err->msg + used, sizeof err->msg - (size_t)used, "%.*s", 298 - used, why);
    t->state = T_FAILED;
    t->final = *err;
    return -1;
}

/* The stream failed (err filled by it, naming the URL): add the member and
 * make the reader fail for good.  Returns -1. */
static int
stream_fail(fl_tar *t, fl_err *err, const char *member)
{
    if (member != NULL) {
        char tail[128];
        int k = snprintf(tail, sizeof tail, " (member '%.100s')", member);
        size_t keep = strlen(err->msg);
        if (keep > (size_t)(298 - k))
            keep = (size_t)(298 - k);
        memcpy(err->msg + keep, tail, (size_t)k + 1);
    }
    t->state = T_FAILED;
    t->final = *err;
    return -1;
}

/* ------------------------------------------------------------------------ */
/* reading */

/* Consume exactly n bytes into dst (NULL: discard).  Returns the count
 * consumed: n, or fewer at the end of the stream; -1 with err filled by the
 * stream on its failure. */
static long long
tread(fl_tar *t, uint8_t *dst, uint64_t n, fl_err *err)
{
    uint64_t got = 0;
    while (got < n) {
        if (t->rpos < t->rlen) {
            size_t m = t->rlen - t->rpos;
            if (m > n - got)
                m = (size_t)(n - got);
            if (dst != NULL)
                memcpy(dst + got, t->rbuf + t->rpos, m);
            t->rpos += m;
            got += m;
            continue;
        }
        long long r;
        if (dst != NULL && n - got >= RBUF) {
            r = fl_stream_read(t->s, dst + got, (size_t)(n - got), err);
            if (r > 0)
                got += (uint64_t)r;
        } else {
            r = fl_stream_read(t->s, t->rbuf, RBUF, err);
            t->rpos = 0;
            t->rlen = r > 0 ? (size_t)r : 0;
        }
        if (r < 0) {
            t->off += got;
            return -1;
        }
        if (r == 0)
            break;
    }
    t->off += got;
    return (long long)got;
}

static uint64_t
blocks(uint64_t n)
{
    return (n + BLOCK - 1) / BLOCK * BLOCK;
}

/* tarfile's nti(): octal text (NUL-terminated, blanks around) or base-256
 * (first byte 0x80 positive, 0xff negative).  0, or -1 when invalid. */
static int
parse_number(const uint8_t *f, size_t n, int64_t *out)
{
    if (f[0] == 0x80 || f[0] == 0xff) {
        uint64_t v = 0;
        for (size_t i = 1; i < n; i++) {
            if (v >> 56)
                return -1;
            v = (v << 8) | f[i];
        }
        if (f[0] == 0xff) {
            /* -(256**(n-1) - v): negative; only a size or checksum here, so invalid */
            return -1;
        }
        if (v > (uint64_t)INT64_MAX)
            return -1;
        *out = (int64_t)v;
        return 0;
    }
    size_t end = 0;
    while (end < n && f[end] != 0)
        end++;
    size_t i = 0;
    while (i < end && isspace(f[i]))
        i++;
    while (end > i && isspace(f[end - 1]))
        end--;
    uint64_t v = 0;
    for (; i < end; i++) {
        if (f[i] < '0' || f[i] > '7' || (v >> 60))
            return -1;
        v = v * 8 + (uint64_t)(f[i] - '0');
    }
    if (v > (uint64_t)INT64_MAX)
        return -1;
    *out = (int64_t)v;
    return 0;
}

static int
checksum_ok(const uint8_t *b)
{
    int64_t want;
    if (parse_number(b + 148, 8, &want) < 0)
        return 0;
    int64_t u = 0, sg = 0;
    for (int i = 0; i < BLOCK; i++) {
        uint8_t c = (i >= 148 && i < 156) ? ' ' : b[i];
        u += c;
        sg += (signed char)c;
    }
    return want == u || want == sg;
}

static const char *
compressed_kind(const uint8_t *b, size_t n)
{
    if (n >= 2 && b[0] == 0x1f && b[1] == 0x8b)
        return "gzip";
    if (n >= 3 && memcmp(b, "BZh", 3) == 0)
        return "bzip2";
    if (n >= 6 && memcmp(b, "\xfd" "7zXZ\0", 6) == 0)
        return "xz";
    if (n >= 4 && memcmp(b, "\x28\xb5\x2f\xfd", 4) == 0)
        return "zstd";
    return NULL;
}

/* Set *dst to a copy of [p, p+n) cut at its first NUL (tarfile's nts).
 * 0, or -1 when out of memory (*dst unchanged). */
static int
set_str(char **dst, const void *p, size_t n)
{
    const char *z = memchr(p, '\0', n);
    if (z != NULL)
        n = (size_t)(z - (const char *)p);
    char *c = malloc(n + 1);
    if (c == NULL)
        return -1;
    memcpy(c, p, n);
    c[n] = '\0';
    free(*dst);
    *dst = c;
    return 0;
}

/* Remove trailing '/' (tarfile strips them from pax paths). */
static void
rstrip_slash(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && s[n - 1] == '/')
        s[--n] = '\0';
}

typedef struct {
    char *path;       /* path= (owned) or NULL */
    int64_t size;     /* size= or -1 */
    int sparse;       /* a GNU.sparse.* record */
    int bad;          /* a zero-length record (tarfile: "invalid header") or a bad size */
} pax_info;

/* Parse pax records the way tarfile 3.11 does: at pos, "(\d+) ([^=]+)=",
 * the value up to pos + length - 1, then pos += length; stop at the first
 * place that does not match.  Returns 0, or -1 when out of memory. */
static int
pax_parse(const uint8_t *buf, size_t n, pax_info *out)
{
    size_t pos = 0;
    while (pos < n) {
        size_t q = pos;
        uint64_t len = 0;
        while (q < n && isdigit(buf[q])) {
            if (len > ((uint64_t)1 << 40)) {
                out->bad = 1;
                return 0;
            }
            len = len * 10 + (uint64_t)(buf[q] - '0');
            q++;
        }
        if (q == pos || q >= n || buf[q] != ' ')
            break;
        size_t k0 = q + 1;
        const uint8_t *eq = k0 < n ? memchr(buf + k0, '=', n - k0) : NULL;
        if (eq == NULL || (size_t)(eq - buf) == k0)
            break;
        size_t kend = (size_t)(eq - buf);
        if (len == 0) {
            out->bad = 1;
            return 0;
        }
        size_t vstart = kend + 1;
        uint64_t ve = (uint64_t)pos + len - 1;
        size_t vend = ve > n ? n : (size_t)ve;
        if (vend < vstart)
            vend = vstart;
        const char *kw = (const char *)buf + k0;
        size_t kwlen = kend - k0;
        if (kwlen == 4 && memcmp(kw, "path", 4) == 0) {
            if (set_str(&out->path, buf + vstart, vend - vstart) < 0)
                return -1;
            /* a pax value may hold a NUL; tarfile keeps it, a C name cannot */
            rstrip_slash(out->path);
        } else if (kwlen == 4 && memcmp(kw, "size", 4) == 0) {
            int64_t v = 0;
            size_t i = vstart;
            if (i == vend)
                out->bad = 1;
            for (; i < vend; i++) {
                if (!isdigit(buf[i]) || v > (INT64_MAX - 9) / 10) {
                    out->bad = 1;
                    break;
                }
                v = v * 10 + (buf[i] - '0');
            }
            out->size = v;
        } else if (kwlen > 11 && memcmp(kw, "GNU.sparse.", 11) == 0) {
            out->sparse = 1;
        }
        pos += (size_t)len;
    }
    return 0;
}

/* Read the data of an extension header ('L', 'K', 'x', 'g') of `size`
 * bytes into a new NUL-terminated buffer (*out), consuming its padding.
 * 0, or -1 with err filled (reader failed). */
static int
read_ext_data(fl_tar *t, int64_t size, uint64_t hoff, char type, uint8_t **out, fl_err *err)
{
    if ((uint64_t)size > t->o.max_header_bytes)
        return tar_fail(t, err, FL_ERR_LIMIT, t->prev, "a '%c' header of %" PRId64 " bytes at byte %" PRIu64
                        " exceeds the limit of %zu bytes", type, size, hoff, t->o.max_header_bytes);
    uint8_t *b = malloc((size_t)blocks((uint64_t)size) + 1);
    if (b == NULL)
        return tar_fail(t, err, FL_ERR_NOMEM, NULL, "out of memory reading a '%c' header", type);
    long long r = tread(t, b, blocks((uint64_t)size), err);
    if (r < 0) {
        free(b);
        return stream_fail(t, err, t->prev);
    }
    if ((uint64_t)r < blocks((uint64_t)size)) {
        free(b);
        return tar_fail(t, err, FL_ERR_DECODE, t->prev,
                        "truncated shard: the '%c' header at byte %" PRIu64 " is cut short", type, hoff);
    }
    b[size] = '\0';
    *out = b;
    return 0;
}

/* Consume the headers of the next member.  Returns 1 (t->pending set), 0 at
 * the end of the archive, or -1 with err filled (reader failed). */
static int
next_member(fl_tar *t, fl_err *err)
{
    uint8_t b[BLOCK];
    char *name_src = NULL;      /* the first 'L' name or pax path= before the member */
    int64_t size_src = -1;      /* the first pax size= */
    int chain = 0;              /* extension headers read for this member */
    uint64_t first = t->off;
    int rc = -1;
    for (;;) {
        uint64_t hoff = t->off;
        long long r = tread(t, b, BLOCK, err);
        if (r < 0) {
            rc = stream_fail(t, err, t->prev);
            goto out;
        }
        if (r == 0 && chain == 0) {
            if (hoff == 0) {
                rc = tar_fail(t, err, FL_ERR_DECODE, NULL, "empty shard, not a tar archive");
                goto out;
            }
            rc = 0; /* a clean end on a block boundary: the archive ends */
            goto out;
        }
        if (r < BLOCK) {
            if (hoff == 0 && (r < 2 || compressed_kind(b, (size_t)r) == NULL))
                rc = tar_fail(t, err, FL_ERR_DECODE, NULL, "not a tar archive (%lld bytes)", r);
            else if (hoff == 0)
                rc = tar_fail(t, err, FL_ERR_DECODE, NULL, "a %s-compressed file, not a tar archive "
                              "(decompress it, or read it as pipe:%s -dc FILE)", compressed_kind(b, (size_t)r),
                              compressed_kind(b, (size_t)r));
            else
                rc = tar_fail(t, err, FL_ERR_DECODE, t->prev,
                              "truncated shard: the header at byte %" PRIu64 " is cut short (%lld of 512 bytes)%s",
                              hoff, r, t->prev != NULL ? " after this member" : "");
            goto out;
        }
        int zero = 1;
        for (int i = 0; i < BLOCK && zero; i++)
            zero = b[i] == 0;
        if (zero && chain == 0) {
            rc = 0;
            goto out;
        }
        if (zero) {
            rc = tar_fail(t, err, FL_ERR_DECODE, t->prev, "an extension header at byte %" PRIu64
                          " is not followed by a member", first);
            goto out;
        }
        if (!checksum_ok(b)) {
            const char *z = hoff == 0 ? compressed_kind(b, BLOCK) : NULL;
            if (z != NULL)
                rc = tar_fail(t, err, FL_ERR_DECODE, NULL, "a %s-compressed file, not a tar archive "
                              "(decompress it, or read it as pipe:%s -dc FILE)", z, z);
            else if (hoff == 0)
                rc = tar_fail(t, err, FL_ERR_DECODE, NULL, "not a tar archive (bad header checksum at byte 0)");
            else
                rc = tar_fail(t, err, FL_ERR_DECODE, t->prev, "bad header checksum at byte %" PRIu64 "%s", hoff,
                              t->prev != NULL ? " after this member" : "");
            goto out;
        }
        int64_t size;
        if (parse_number(b + 124, 12, &size) < 0) {
            rc = tar_fail(t, err, FL_ERR_DECODE, t->prev, "invalid size field in the header at byte %" PRIu64, hoff);
            goto out;
        }
        char type = (char)b[156];
        if (type == 'L' || type == 'K' || type == 'x' || type == 'X' || type == 'g') {
            uint8_t *data = NULL;
            if (read_ext_data(t, size, hoff, type, &data, err) < 0)
                goto out;
            if (type == 'L') {
                if (name_src == NULL && set_str(&name_src, data, (size_t)size) < 0) {
                    free(data);
                    rc = tar_fail(t, err, FL_ERR_NOMEM, NULL, "out of memory");
                    goto out;
                }
            } else if (type != 'K') {
                pax_info px = {NULL, -1, 0, 0};
                if (pax_parse(data, (size_t)size, &px) < 0) {
                    free(data);
                    free(px.path);
                    rc = tar_fail(t, err, FL_ERR_NOMEM, NULL, "out of memory");
                    goto out;
                }
                if (px.bad || (px.sparse && type != 'g')) {
                    free(data);
                    rc = tar_fail(t, err, FL_ERR_DECODE, px.path != NULL ? px.path : t->prev,
                                  px.bad ? "invalid pax header at byte %" PRIu64
                                         : "GNU sparse member (pax header at byte %" PRIu64 ") not supported",
                                  hoff);
                    free(px.path);
                    goto out;
                }
                if (type == 'g') {
                    if (px.path != NULL) {
                        free(t->gpath);
                        t->gpath = px.path;
                        px.path = NULL;
                    }
                } else {
                    if (name_src == NULL && px.path != NULL) {
                        name_src = px.path;
                        px.path = NULL;
                    }
                    if (size_src < 0 && px.size >= 0)
                        size_src = px.size;
                }
                free(px.path);
            }
            free(data);
            chain++;
            continue;
        }
        /* the member's own header */
        char hname[101];
        memcpy(hname, b, 100);
        hname[100] = '\0';
        size_t hlen = strlen(hname);
        char prefix[156];
        memcpy(prefix, b + 345, 155);
        prefix[155] = '\0';
        if (type == 'S') {
            rc = tar_fail(t, err, FL_ERR_DECODE, name_src != NULL ? name_src : hname,
                          "GNU sparse member not supported");
            goto out;
        }
        int regular = type == '0' || type == '\0' || type == '7';
        if (type == '\0' && hlen > 0 && hname[hlen - 1] == '/')
            regular = 0; /* v7 directory */
        int supported_other = type >= '1' && type <= '6';
        if (name_src == NULL && t->gpath != NULL) {
            name_src = strdup(t->gpath);
            if (name_src == NULL) {
                rc = tar_fail(t, err, FL_ERR_NOMEM, NULL, "out of memory");
                goto out;
            }
        }
        if (name_src == NULL) {
            size_t plen = strlen(prefix);
            name_src = malloc(plen + 1 + hlen + 1);
            if (name_src == NULL) {
                rc = tar_fail(t, err, FL_ERR_NOMEM, NULL, "out of memory");
                goto out;
            }
            if (plen > 0)
                snprintf(name_src, plen + 1 + hlen + 1, "%s/%s", prefix, hname);
            else
                memcpy(name_src, hname, hlen + 1);
        }
        uint64_t msize = size_src >= 0 ? (uint64_t)size_src : (uint64_t)size;
        free(t->name);
        t->name = name_src;
        name_src = NULL;
        t->size = msize;
        t->body = (regular || !supported_other) ? blocks(msize) : 0;
        t->regular = regular;
        t->hdr_off = first;
        t->pending = 1;
        rc = 1;
        goto out;
    }
out:
    free(name_src);
    return rc;
}

/* The pending member is done with (its body consumed): it becomes "prev". */
static void
member_done(fl_tar *t)
{
    free(t->prev);
    t->prev = t->name;
    t->name = NULL;
    t->pending = 0;
}

/* Skip the pending member's body.  0, or -1 with err filled. */
static int
skip_body(fl_tar *t, fl_err *err)
{
    long long r = tread(t, NULL, t->body, err);
    if (r < 0)
        return stream_fail(t, err, t->name);
    if ((uint64_t)r < t->body)
        return tar_fail(t, err, FL_ERR_DECODE, t->name, "truncated shard: the body is cut short (%lld of %" PRIu64
                        " bytes)", r, t->body);
    member_done(t);
    return 0;
}

/* The end of the archive: read the rest of the stream (bounded) so that a
 * failing pipe command or an incomplete http body is seen.  0, or -1. */
static int
drain(fl_tar *t, fl_err *err)
{
    uint64_t total = 0;
    while (total < DRAIN_MAX) {
        long long r = tread(t, NULL, RBUF, err);
        if (r < 0)
            return stream_fail(t, err, NULL);
        if (r < (long long)RBUF)
            break;
        total += (uint64_t)r;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* samples */

void
fl_tar_opts_init(fl_tar_opts *o)
{
    o->max_member_bytes = (size_t)1 << 30;
    o->max_header_bytes = (size_t)1 << 20;
    o->max_fields = 1024;
}

void
fl_wds_sample_free(fl_wds_sample *s)
{
    if (s == NULL)
        return;
    for (int i = 0; i < s->nfields; i++)
        free(s->fields[i].data); /* the field's one block starts with its data */
    free(s->fields);
    free(s->key);
    free(s);
}

const fl_wds_field *
fl_wds_sample_field(const fl_wds_sample *s, const char *ext)
{
    for (int i = 0; i < s->nfields; i++)
        if (strcmp(s->fields[i].ext, ext) == 0)
            return &s->fields[i];
    return NULL;
}

static char
ascii_lower(char c)
{
    return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

/* 1 if a[0..n) lower-cased (ASCII) equals b[0..n) (already lower-case). */
static int
lower_eq(const char *a, const char *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ascii_lower(a[i]) != b[i])
            return 0;
    return 1;
}

/* Read the pending member into a new field of smp with extension
 * ext[0..extlen).  0, or -1 with err filled. */
static int
add_field(fl_tar *t, fl_wds_sample *smp, int *cap, const char *ext, size_t extlen, fl_err *err)
{
    /* extensions compare lower-cased (ext is not yet; the stored ones are) */
    for (int i = 0; i < smp->nfields; i++)
        if (strlen(smp->fields[i].ext) == extlen && lower_eq(ext, smp->fields[i].ext, extlen))
            return tar_fail(t, err, FL_ERR_DECODE, t->name,
                            "duplicate extension '%.40s' in sample '%.80s' (webdataset refuses it too)",
                            smp->fields[i].ext, smp->key);
    if (extlen == 7 && (lower_eq(ext, "__key__", 7) || lower_eq(ext, "__url__", 7)))
        return tar_fail(t, err, FL_ERR_DECODE, t->name,
                        "the extension '%.7s' is reserved by webdataset for the sample's key and URL", ext);
    if (smp->nfields >= t->o.max_fields)
        return tar_fail(t, err, FL_ERR_LIMIT, t->name, "sample '%.80s' has more than %d members", smp->key,
                        t->o.max_fields);
    if (t->size > t->o.max_member_bytes)
        return tar_fail(t, err, FL_ERR_LIMIT, t->name, "a member of %" PRIu64 " bytes exceeds the limit of %zu bytes",
                        t->size, t->o.max_member_bytes);
    if (smp->nfields == *cap) {
        int ncap = *cap ? *cap * 2 : 4;
        fl_wds_field *nf = realloc(smp->fields, (size_t)ncap * sizeof *nf);
        if (nf == NULL)
            return tar_fail(t, err, FL_ERR_NOMEM, t->name, "out of memory");
        smp->fields = nf;
        *cap = ncap;
    }
    size_t size = (size_t)t->size, nlen = strlen(t->name);
    /* one block: data, NUL, name, NUL, ext, NUL */
    uint8_t *blk = malloc(size + 1 + nlen + 1 + extlen + 1);
    if (blk == NULL)
        return tar_fail(t, err, FL_ERR_NOMEM, t->name, "out of memory for a member of %zu bytes", size);
    long long r = tread(t, blk, size, err);
    if (r < 0) {
        free(blk);
        return stream_fail(t, err, t->name);
    }
    if ((size_t)r < size) {
        free(blk);
        return tar_fail(t, err, FL_ERR_DECODE, t->name,
                        "truncated shard: the body is cut short (%lld of %zu bytes)", r, size);
    }
    uint64_t pad = t->body - size;
    if (pad > 0) {
        r = tread(t, NULL, pad, err);
        if (r < 0) {
            free(blk);
            return stream_fail(t, err, t->name);
        }
        if ((uint64_t)r < pad) {
            free(blk);
            return tar_fail(t, err, FL_ERR_DECODE, t->name, "truncated shard: the padding after the body is cut short");
        }
    }
    char *nm = (char *)blk + size + 1, *ex = nm + nlen + 1;
    blk[size] = 0;
    memcpy(nm, t->name, nlen + 1);
    for (size_t i = 0; i < extlen; i++)
        ex[i] = ascii_lower(ext[i]);
    ex[extlen] = '\0';
    fl_wds_field *f = &smp->fields[smp->nfields++];
    f->ext = ex;
    f->name = nm;
    f->data = blk;
    f->size = size;
    smp->bytes += size;
    member_done(t);
    return 0;
}

fl_tar *
fl_tar_open(const char *url, const fl_stream_opts *sopts, const fl_tar_opts *topts, fl_err *err)
{
    fl_tar *t = calloc(1, sizeof *t);
    uint8_t *rb = malloc(RBUF);
    if (t == NULL || rb == NULL) {
        free(t);
        free(rb);
        err->code = FL_ERR_NOMEM;
        err->errnum = 0;
        snprintf(err->msg, sizeof err->msg, "out of memory opening a shard");
        return NULL;
    }
    t->rbuf = rb;
    if (topts != NULL)
        t->o = *topts;
    else
        fl_tar_opts_init(&t->o);
    fl_stream_url_for_message(url, t->urlmsg, sizeof t->urlmsg);
    t->s = fl_stream_open(url, sopts, err);
    if (t->s == NULL) {
        fl_tar_close(t);
        return NULL;
    }
    return t;
}

int
fl_tar_next_sample(fl_tar *t, fl_wds_sample **out, fl_err *err)
{
    *out = NULL;
    if (t->state == T_END)
        return 0;
    if (t->state == T_FAILED) {
        *err = t->final;
        return -1;
    }
    fl_wds_sample *smp = NULL;
    int cap = 0;
    for (;;) {
        if (!t->pending) {
            int r = next_member(t, err);
            if (r < 0)
                goto fail;
            if (r == 0) {
                if (drain(t, err) < 0)
                    goto fail;
                t->state = T_END;
                *out = smp;
                return smp != NULL;
            }
        }
        size_t keylen;
        const char *ext;
        if (!t->regular || fl_wds_skip_name(t->name) || !fl_wds_split(t->name, &keylen, &ext)) {
            if (skip_body(t, err) < 0)
                goto fail;
            continue;
        }
        if (smp != NULL && (strlen(smp->key) != keylen || strncmp(smp->key, t->name, keylen) != 0)) {
            *out = smp; /* the pending member starts the next sample */
            return 1;
        }
        if (smp == NULL) {
            smp = calloc(1, sizeof *smp);
            if (smp == NULL || (smp->key = strndup(t->name, keylen)) == NULL) {
                tar_fail(t, err, FL_ERR_NOMEM, t->name, "out of memory");
                goto fail;
            }
            smp->offset = t->hdr_off;
        }
        if (add_field(t, smp, &cap, ext, strlen(ext), err) < 0)
            goto fail;
    }
fail:
    fl_wds_sample_free(smp);
    return -1;
}

fl_stream *
fl_tar_stream(fl_tar *t)
{
    return t->s;
}

uint64_t
fl_tar_offset(const fl_tar *t)
{
    return t->off;
}

void
fl_tar_close(fl_tar *t)
{
    if (t == NULL)
        return;
    fl_stream_close(t->s);
    free(t->rbuf);
    free(t->name);
    free(t->gpath);
    free(t->prev);
    free(t);
}
