/* source.c: reading a sample's bytes (contracts in source.h). */
#include "sources/source.h"

#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int
fl_bytes_reserve(fl_bytes *b, size_t need)
{
    if (need <= b->cap)
        return 0;
    size_t n = b->cap ? b->cap : (size_t)1 << 16;
    while (n < need) {
        if (n > SIZE_MAX / 2)
            return -1;
        n *= 2;
    }
    /* free + malloc, not realloc: the old contents need not survive */
    uint8_t *p = malloc(n);
    if (p == NULL)
        return -1;
    free(b->data);
    b->data = p;
    b->cap = n;
    return 0;
}

void
fl_bytes_trim(fl_bytes *b, size_t keep)
{
    if (b != NULL && b->cap > keep)
        fl_bytes_free(b);
}

void
fl_bytes_free(fl_bytes *b)
{
    if (b == NULL)
        return;
    free(b->data);
    b->data = NULL;
    b->cap = 0;
}

static const char *
file_kind(mode_t m)
{
    return S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket" : S_ISCHR(m) ? "a character device"
           : S_ISBLK(m) ? "a block device" : "not a regular file";
}

/* Fill err for an I/O failure with errno e.  Returns -1. */
static long long
io_error(fl_err *err, int e, const char *what)
{
    err->code = FL_ERR_IO;
    err->errnum = e;
    snprintf(err->msg, sizeof err->msg, "%s: %s", what, strerror(e));
    return -1;
}

long long
fl_source_read_file(const char *path, fl_bytes *buf, size_t max_bytes, fl_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return io_error(err, errno, "cannot open");
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return io_error(err, e, "cannot stat");
    }
    if (!S_ISREG(st.st_mode)) {
        err->code = FL_ERR_IO;
        err->errnum = S_ISDIR(st.st_mode) ? EISDIR : 0;
        snprintf(err->msg, sizeof err->msg, "%s, not a regular file",
                 S_ISDIR(st.st_mode) ? "a directory" : file_kind(st.st_mode));
        close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    if (max_bytes && size > max_bytes) {
        err->code = FL_ERR_LIMIT;
        snprintf(err->msg, sizeof err->msg, "file of %zu bytes exceeds the limit of %zu bytes", size, max_bytes);
        close(fd);
        return -1;
    }
    if (fl_bytes_reserve(buf, size + 1) < 0) {
        err->code = FL_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg, "out of memory reading %zu bytes", size);
        close(fd);
        return -1;
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = pread(fd, buf->data + got, size - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            return io_error(err, e, "read failed");
        }
        if (r == 0) {
            err->code = FL_ERR_IO;
            err->errnum = 0;
            snprintf(err->msg, sizeof err->msg, "read failed: the file shrank from %zu to %zu bytes while read",
                     size, got);
            close(fd);
            return -1;
        }
        got += (size_t)r;
    }
    close(fd);
    return (long long)got;
}

/* ---- sources ----------------------------------------------------------------- */

void
fl_source_init(fl_source *s, const fl_source_ops *ops, int64_t n)
{
    s->ops = ops;
    s->n = n;
    atomic_init(&s->refs, 1);
}

fl_source *
fl_source_ref(fl_source *s)
{
    if (s)
        atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    return s;
}

void
fl_source_unref(fl_source *s)
{
    if (s && atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1)
        s->ops->destroy(s);
}

typedef struct {
    fl_source head;
    char **paths;   /* n entries, owned */
} files_source;

static int
files_get(fl_source *s, void *tls, int64_t index, uint64_t epoch, fl_bytes *buf, size_t max_bytes,
          fl_sample_bytes *out, fl_err *err)
{
    (void)tls;
    (void)epoch;
    files_source *f = (files_source *)s;
    long long len = fl_source_read_file(f->paths[index], buf, max_bytes, err);
    if (len < 0)
        return -1;
    memset(out, 0, sizeof *out);
    out->data = buf->data;
    out->len = (size_t)len;
    return 0;
}

static void
files_destroy(fl_source *s)
{
    files_source *f = (files_source *)s;
    for (int64_t i = 0; i < s->n; i++)
        free(f->paths[i]);
    free(f->paths);
    free(f);
}

static const fl_source_ops files_ops = {.kind = "files", .get = files_get, .destroy = files_destroy};

fl_source *
fl_source_files_new(char **paths, int64_t n)
{
    files_source *f = calloc(1, sizeof *f);
    if (!f) {
        for (int64_t i = 0; i < n; i++)
            free(paths[i]);
        free(paths);
        return NULL;
    }
    fl_source_init(&f->head, &files_ops, n);
    f->paths = paths;
    return &f->head;
}

const char *
fl_source_files_path(const fl_source *s, int64_t i)
{
    if (!s || s->ops != &files_ops || i < 0 || i >= s->n)
        return NULL;
    return ((const files_source *)s)->paths[i];
}

int
fl_source_maybe_other_image(const uint8_t *d, size_t n)
{
    if (n >= 8 && memcmp(d, "\x89PNG\r\n\x1a\n", 8) == 0)
        return 1;
    if (n >= 6 && (memcmp(d, "GIF87a", 6) == 0 || memcmp(d, "GIF89a", 6) == 0))
        return 1;
    if (n >= 2 && d[0] == 'B' && d[1] == 'M')
        return 1;
    if (n >= 4 && (memcmp(d, "II*\0", 4) == 0 || memcmp(d, "MM\0*", 4) == 0))
        return 1;
    if (n >= 12 && memcmp(d, "RIFF", 4) == 0 && memcmp(d + 8, "WEBP", 4) == 0)
        return 1;
    if (n >= 2 && d[0] == 'P' && d[1] >= '1' && d[1] <= '6')
        return 1;
    return 0;
}

int
fl_source_pillow_only(const uint8_t *d, size_t n)
{
    if (!fl_source_maybe_other_image(d, n))
        return 0;
    if (n >= 8 && memcmp(d, "\x89PNG\r\n\x1a\n", 8) == 0)
        return 0;
    if (n >= 12 && memcmp(d, "RIFF", 4) == 0 && memcmp(d + 8, "WEBP", 4) == 0)
        /* VP8X's flags byte, bit 1: animation (libwebp's has_animation) */
        return n >= 21 && memcmp(d + 12, "VP8X", 4) == 0 && (d[20] & 0x02);
    return 1;
}
