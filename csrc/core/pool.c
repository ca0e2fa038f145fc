/* pool.c: reference-counted pool of batch buffers (see pool.h, which also
 * explains why a buffer goes back in two steps: the freeing may block on
 * the device, so it happens in fl_pool_put_end, outside the caller's
 * locks). */
#include "core/pool.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/pin.h"

struct fl_pool {
    pthread_mutex_t mu;
    size_t nbytes;
    int refs;        /* owner + buffers handed out */
    int max_free;
    int nfree;
    int nalloc;      /* buffers alive (idle + handed out) */
    void **free;     /* max_free slots */
    int pinned_device; /* >= 0: page-locked through `pinner`; -1: malloc */
    const fl_pinner *pinner; /* who page-locks (set with pinned_device); not owned */
    int pin_failed;    /* a pinned allocation failed; later ones use malloc */
    char pin_error[FL_ERR_MSG_MAX];
};

fl_pool *
fl_pool_new(size_t nbytes, int max_free)
{
    fl_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->free = calloc((size_t)(max_free > 0 ? max_free : 1), sizeof(void *));
    if (!p->free) {
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    p->nbytes = nbytes ? nbytes : 1;
    p->refs = 1;
    p->max_free = max_free;
    p->pinned_device = -1;
    return p;
}

void
fl_pool_set_pinned(fl_pool *p, int device, const fl_pinner *pinner)
{
    pthread_mutex_lock(&p->mu);
    p->pinned_device = pinner ? device : -1;
    p->pinner = pinner;
    pthread_mutex_unlock(&p->mu);
}

const char *
fl_pool_pin_error(fl_pool *p)
{
    return p->pin_failed ? p->pin_error : NULL;
}

/* Every buffer carries a 64-byte header in front of what callers see (so
 * their pointer stays 64-byte aligned) recording how it was allocated:
 * page-locked buffers (device + 1) go back to the pool's pinner, the others
 * (0) to free.  A pool's pinner never changes once a pinned buffer exists
 * (the binding sets it before the first fl_pool_get). */
#define FL_POOL_HDR 64

static int
buf_pinned(const void *data)
{
    return *(const int *)((const char *)data - FL_POOL_HDR) != 0;
}

int
fl_pool_is_pinned(const void *data)
{
    return buf_pinned(data);
}

static void
buf_free(const fl_pool *p, void *data)
{
    char *base = (char *)data - FL_POOL_HDR;
    if (*(int *)base) { /* page-locked for device (value - 1) */
        /* nothing to report to: the buffer is gone either way */
        (void)p->pinner->free_host(*(int *)base - 1, base, NULL);
    } else {
        free(base);
    }
}

/* glibc's malloc serves a block of at least its mmap threshold (128 KiB at
 * start) with a fresh mmap, which is faulted in page by page and unmapped
 * again on free.  It adapts: freeing such a block raises the threshold to
 * the block's size (at most 32 MiB, DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
 * and the trim threshold to twice that, so a program that frees large
 * blocks gets its next large temporaries from the heap, already faulted in.
 * A batch collated into a pool buffer is never freed, so without the pool
 * the first freed batch raises the threshold and with it nothing does:
 * every large temporary of a Python __getitem__ (a NumPy array per step)
 * then costs an mmap, its page faults and an munmap, 2.6x slower in
 * benchmarks/bench_python.py's numpy dataset.  So a new pooled buffer of n
 * bytes frees one ordinary block of that size (up to the 32 MiB cap),
 * which is what the first batch of that size would have done without the
 * pool.  Once per size raised (settled_to): a block below the threshold
 * never was an mmap, and its free changes nothing.  Any thread, no GIL;
 * a no-op for other allocators (the block just comes and goes). */
#define FL_MMAP_SETTLE_MAX (((size_t)32 << 20) - 65536) /* a block glibc's cap still admits */

static void
settle_mmap_threshold(size_t nbytes)
{
    static size_t settled_to; /* accessed atomically */
    size_t n = nbytes < FL_MMAP_SETTLE_MAX ? nbytes : FL_MMAP_SETTLE_MAX;
    if (n <= __atomic_load_n(&settled_to, __ATOMIC_RELAXED))
        return;
    __atomic_store_n(&settled_to, n, __ATOMIC_RELAXED);
    volatile char *block = malloc(n); /* volatile: the pair must not be optimised away */
    if (block) {
        block[0] = 0;
        free((void *)block);
    }
}

static void *
buf_alloc(fl_pool *p)
{
    void *base = NULL;
    int pinned = 0;
    if (p->pinned_device >= 0 && !p->pin_failed) {
        fl_err err = {0};
        if (p->pinner->alloc_host(p->pinned_device, p->nbytes + FL_POOL_HDR, &base, &err) == 0) {
            pinned = 1;
        } else {
            /* pinned memory ran out (or the driver refused): carry on with
             * ordinary memory; the binding reports the reason once */
            pthread_mutex_lock(&p->mu);
            p->pin_failed = 1;
            snprintf(p->pin_error, sizeof p->pin_error, "%s", err.msg);
            pthread_mutex_unlock(&p->mu);
            base = NULL;
        }
    }
    if (!base && posix_memalign(&base, 64, p->nbytes + FL_POOL_HDR) != 0)
        return NULL;
    settle_mmap_threshold(p->nbytes); /* page-locked buffers are not malloc's either */
    *(int *)base = pinned ? p->pinned_device + 1 : 0;
    return (char *)base + FL_POOL_HDR;
}

static void
pool_destroy(fl_pool *p)
{
    for (int i = 0; i < p->nfree; i++)
        buf_free(p, p->free[i]);
    free(p->free);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

void *
fl_pool_get(fl_pool *p)
{
    void *data = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->nfree > 0)
        data = p->free[--p->nfree];
    p->refs++;
    pthread_mutex_unlock(&p->mu);
    if (data)
        return data;
    data = buf_alloc(p);
    if (!data) {
        fl_pool_unref(p);
        return NULL;
    }
    pthread_mutex_lock(&p->mu);
    p->nalloc++;
    pthread_mutex_unlock(&p->mu);
    return data;
}

unsigned
fl_pool_put_begin(fl_pool *p, void *data)
{
    unsigned todo = 0;
    pthread_mutex_lock(&p->mu);
    if (p->nfree < p->max_free && p->refs > 1) {
        p->free[p->nfree++] = data;
    } else {
        p->nalloc--;
        todo |= FL_POOL_FREE_BUF;
        if (buf_pinned(data))
            todo |= FL_POOL_BLOCKS;
    }
    if (--p->refs == 0) {
        todo |= FL_POOL_FREE_POOL;
        for (int i = 0; i < p->nfree; i++)
            if (buf_pinned(p->free[i]))
                todo |= FL_POOL_BLOCKS;
    }
    pthread_mutex_unlock(&p->mu);
    return todo;
}

void
fl_pool_put_end(fl_pool *p, void *data, unsigned todo)
{
    if (todo & FL_POOL_FREE_BUF)
        buf_free(p, data);
    if (todo & FL_POOL_FREE_POOL)
        pool_destroy(p);
}

void
fl_pool_put(void *pool, void *data)
{
    unsigned todo = fl_pool_put_begin(pool, data);
    if (todo)
        fl_pool_put_end(pool, data, todo);
}

size_t
fl_pool_nbytes(const fl_pool *p)
{
    return p->nbytes;
}

size_t
fl_pool_bytes_in_use(fl_pool *p)
{
    pthread_mutex_lock(&p->mu);
    size_t n = (size_t)p->nalloc * p->nbytes;
    pthread_mutex_unlock(&p->mu);
    return n;
}

size_t
fl_pool_bytes_out(fl_pool *p)
{
    pthread_mutex_lock(&p->mu);
    size_t n = (size_t)(p->nalloc - p->nfree) * p->nbytes;
    pthread_mutex_unlock(&p->mu);
    return n;
}

void
fl_pool_ref(fl_pool *p)
{
    pthread_mutex_lock(&p->mu);
    p->refs++;
    pthread_mutex_unlock(&p->mu);
}

void
fl_pool_unref(fl_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    int last = --p->refs == 0;
    pthread_mutex_unlock(&p->mu);
    if (last)
        pool_destroy(p);
}
