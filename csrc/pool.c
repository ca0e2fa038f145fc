/* pool.c: reference-counted pool of batch buffers (see pool.h). */
#include "pool.h"

#include <pthread.h>
#include <stdlib.h>

struct fl_pool {
    pthread_mutex_t mu;
    size_t nbytes;
    int refs;        /* owner + buffers handed out */
    int max_free;
    int nfree;
    int nalloc;      /* buffers alive (idle + handed out) */
    void **free;     /* max_free slots */
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
    return p;
}

static void
pool_destroy(fl_pool *p)
{
    for (int i = 0; i < p->nfree; i++)
        free(p->free[i]);
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
    if (posix_memalign(&data, 64, p->nbytes) != 0) {
        fl_pool_unref(p);
        return NULL;
    }
    pthread_mutex_lock(&p->mu);
    p->nalloc++;
    pthread_mutex_unlock(&p->mu);
    return data;
}

void
fl_pool_put(void *pool, void *data)
{
    fl_pool *p = pool;
    int last;
    pthread_mutex_lock(&p->mu);
    if (p->nfree < p->max_free && p->refs > 1) {
        p->free[p->nfree++] = data;
        data = NULL;
    } else {
        p->nalloc--;
    }
    last = --p->refs == 0;
    pthread_mutex_unlock(&p->mu);
    free(data);
    if (last)
        pool_destroy(p);
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
