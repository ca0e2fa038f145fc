/* gather.c: mapped and lent array regions, and the row gather (contracts
 * in gather.h). */
#include "sources/gather.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct fl_region {
    const uint8_t *data;          /* first byte of the array */
    size_t size;                  /* bytes of the array */
    void *map;                    /* the whole mapping (munmap'ed at the end), or NULL */
    size_t map_len;
    void (*release)(void *ctx);   /* a lent region's owner, or NULL */
    void *ctx;
    _Atomic long refs;
};

static fl_region *
io_fail(fl_err *err, int e, const char *what)
{
    err->code = FL_ERR_IO;
    err->errnum = e;
    snprintf(err->msg, sizeof err->msg, "%s: %s", what, strerror(e));
    return NULL;
}

fl_region *
fl_region_map_file(const char *path, uint64_t offset, uint64_t nbytes, fl_err *err)
{
    fl_region *r = calloc(1, sizeof *r);
    if (!r) {
        err->code = FL_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return NULL;
    }
    atomic_init(&r->refs, 1);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        free(r);
        return io_fail(err, errno, "cannot open");
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        free(r);
        return io_fail(err, e, "cannot stat");
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        free(r);
        err->code = FL_ERR_IO;
        err->errnum = S_ISDIR(st.st_mode) ? EISDIR : 0;
        snprintf(err->msg, sizeof err->msg, "not a regular file");
        return NULL;
    }
    uint64_t fsize = (uint64_t)st.st_size;
    if (offset > fsize || nbytes > fsize - offset) {
        close(fd);
        free(r);
        err->code = FL_ERR_INVALID;
        err->errnum = 0;
        snprintf(err->msg, sizeof err->msg,
                 "truncated: the header says %llu bytes of data from byte %llu, the file has %llu bytes",
                 (unsigned long long)nbytes, (unsigned long long)offset, (unsigned long long)fsize);
        return NULL;
    }
    if (nbytes > 0) {
        size_t len = (size_t)(offset + nbytes);
        void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            free(r);
            return io_fail(err, e, "cannot map");
        }
        r->map = m;
        r->map_len = len;
        r->data = (const uint8_t *)m + offset;
        r->size = (size_t)nbytes;
    }
    close(fd); /* the mapping keeps the file */
    return r;
}

fl_region *
fl_region_wrap(const void *data, size_t nbytes, void (*release)(void *ctx), void *ctx)
{
    fl_region *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    atomic_init(&r->refs, 1);
    r->data = data;
    r->size = nbytes;
    r->release = release;
    r->ctx = ctx;
    return r;
}

const uint8_t *
fl_region_data(const fl_region *r)
{
    return r->data;
}

size_t
fl_region_size(const fl_region *r)
{
    return r->size;
}

fl_region *
fl_region_ref(fl_region *r)
{
    if (r)
        atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
    return r;
}

void
fl_region_unref(fl_region *r)
{
    if (!r || atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) != 1)
        return;
    if (r->map)
        munmap(r->map, r->map_len);
    if (r->release)
        r->release(r->ctx);
    free(r);
}

int
fl_gather_rows(const uint8_t *base, int64_t nrows, size_t row_bytes, const int64_t *indices, int64_t count,
               uint8_t *out, fl_err *err)
{
    for (int64_t k = 0; k < count; k++) {
        if (indices[k] < 0 || indices[k] >= nrows) {
            err->code = FL_ERR_INDEX;
            err->errnum = 0;
            snprintf(err->msg, sizeof err->msg, "index %lld is out of range for %lld rows",
                     (long long)indices[k], (long long)nrows);
            return -1;
        }
    }
    /* fixed sizes let the compiler turn the copy into a load and a store */
    switch (row_bytes) {
    case 0: /* empty rows (a 0 in the row shape): base may be NULL, nothing to copy */
        return 0;
    case 4:
        for (int64_t k = 0; k < count; k++)
            memcpy(out + 4 * (size_t)k, base + 4 * (size_t)indices[k], 4);
        return 0;
    case 8:
        for (int64_t k = 0; k < count; k++)
            memcpy(out + 8 * (size_t)k, base + 8 * (size_t)indices[k], 8);
        return 0;
    default:
        for (int64_t k = 0; k < count; k++)
            memcpy(out + row_bytes * (size_t)k, base + row_bytes * (size_t)indices[k], row_bytes);
        return 0;
    }
}
