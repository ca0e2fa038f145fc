/* devpool.c: pooled device buffers, copies on the loader's stream, and
 * stream-ordered release (contracts in devpool.h).
 *
 * Locking: one mutex per pool guards the idle list, the counters and every
 * buffer's user list.  CUDA calls that only queue work or query an event
 * (cudaEventQuery, cudaStreamWaitEvent) may run under it; nothing that can
 * block on the device (cudaFree, synchronisation) does.
 */
#include "cuda/devpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct fl_devbuf {
    fl_devpool *pool;      /* a pool reference while the buffer is out */
    void *ptr;             /* device memory, cap bytes (owned) */
    size_t cap, bytes;     /* capacity; bytes of the current copy */
    int device;
    fl_cudaEvent_t start, ready;                   /* timed, on the copy stream */
    fl_cudaEvent_t released[FL_DEVBUF_MAX_USERS];  /* created on first need */
    fl_cudaStream_t users[FL_DEVBUF_MAX_USERS];    /* streams of this lease */
    int nusers;
    int npending;          /* released[0, npending) recorded, maybe not passed yet */
    atomic_int refs;
    int tracked;           /* counted in a size class of the pool */
    fl_devbuf *next;       /* idle list link */
};

/* Buffers are counted per size class: the cap applies to each class, so the
 * images and the labels of a batch (or a short last batch) never evict each
 * other.  A bounded table keeps the most recently used classes; a class is
 * dropped (its idle buffers freed) only when all its buffers are idle and a
 * new class needs the slot.  Past that a buffer is untracked: freed when it
 * comes back. */
#define FL_DEVPOOL_CLASSES 16
typedef struct {
    size_t cap;
    int alive, idle;
    uint64_t last_use;
} size_cls;

struct fl_devpool {
    pthread_mutex_t lock;
    atomic_int refs;
    int device, max_buffers;
    fl_cudaStream_t stream;
    fl_devbuf *idle;       /* most recently released first */
    fl_devpool_stats st;   /* under lock */
    size_cls cls[FL_DEVPOOL_CLASSES];
    int ncls;
    uint64_t seq;          /* copies started, for LRU */
};

/* Count a buffer of `cap` bytes out of the pool's counters for good (it is
 * about to be destroyed), and out of its class c's live buffers (c NULL:
 * untracked, or a class being dropped).  An idle buffer's caller also takes
 * it off the idle counts.  Under the lock. */
static void
count_freed_locked(fl_devpool *p, size_cls *c, size_t cap)
{
    if (c)
        c->alive--;
    p->st.buffers--;
    p->st.device_bytes -= cap;
    p->st.freed++;
}

/* The class record for `cap`, adding one (and evicting a wholly idle least
 * recently used class into *victims) if needed; NULL when every slot is in
 * use by buffers that are out.  Under the lock. */
static size_cls *
class_for(fl_devpool *p, size_t cap, fl_devbuf **victims)
{
    for (int i = 0; i < p->ncls; i++)
        if (p->cls[i].cap == cap)
            return &p->cls[i];
    size_cls *c = NULL;
    if (p->ncls < FL_DEVPOOL_CLASSES) {
        c = &p->cls[p->ncls++];
    } else {
        for (int i = 0; i < p->ncls; i++)
            if (p->cls[i].alive == p->cls[i].idle && (!c || p->cls[i].last_use < c->last_use))
                c = &p->cls[i];
        if (!c)
            return NULL;
        for (fl_devbuf **pp = &p->idle; *pp;) {
            fl_devbuf *b = *pp;
            if (b->cap != c->cap) {
                pp = &b->next;
                continue;
            }
            *pp = b->next;
            b->next = *victims;
            *victims = b;
            p->st.idle--;
            count_freed_locked(p, NULL, b->cap); /* the class is reset below */
        }
    }
    memset(c, 0, sizeof *c);
    c->cap = cap;
    return c;
}

/* The class record for `cap`, or NULL (untracked).  Under the lock. */
static size_cls *
class_find(fl_devpool *p, size_t cap)
{
    for (int i = 0; i < p->ncls; i++)
        if (p->cls[i].cap == cap)
            return &p->cls[i];
    return NULL;
}

/* Buffers are reused by size class so that a batch of a slightly different
 * size (the last one of an epoch) still finds a home: powers of two up to
 * 1 MiB, then multiples of 2 MiB (at most 2 MiB of slack on a large batch). */
static size_t
size_class(size_t bytes)
{
    const size_t MiB = (size_t)1 << 20;
    if (bytes <= 512)
        return 512;
    if (bytes <= MiB) {
        size_t c = 1024;
        while (c < bytes)
            c <<= 1;
        return c;
    }
    return (bytes + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
}

/* Free a buffer's memory and events (no pool bookkeeping).  May block: the
 * runtime synchronises the device in cudaFree. */
static void
devbuf_destroy(fl_devbuf *b)
{
    if (!b)
        return;
    for (int i = 0; i < FL_DEVBUF_MAX_USERS; i++)
        fl_cuda_event_destroy(b->device, b->released[i], NULL);
    fl_cuda_event_destroy(b->device, b->start, NULL);
    fl_cuda_event_destroy(b->device, b->ready, NULL);
    fl_cuda_free(b->device, b->ptr, NULL);
    free(b);
}

/* A new buffer of `cap` bytes with its two timed events; NULL with err. */
static fl_devbuf *
devbuf_alloc(int device, size_t cap, int *rc, fl_err *err)
{
    fl_devbuf *b = calloc(1, sizeof *b);
    if (!b) {
        fl_err_set(err, FL_ERR_RUNTIME, 0, "out of host memory for a device buffer record");
        *rc = 2; /* cudaErrorMemoryAllocation */
        return NULL;
    }
    b->cap = cap;
    b->device = device;
    if ((*rc = fl_cuda_malloc(device, cap, &b->ptr, err)) ||
        (*rc = fl_cuda_event_create_timed(device, &b->start, err)) ||
        (*rc = fl_cuda_event_create_timed(device, &b->ready, err))) {
        devbuf_destroy(b);
        return NULL;
    }
    return b;
}

fl_devpool *
fl_devpool_new(int device, int max_buffers, fl_err *err)
{
    fl_devpool *p = calloc(1, sizeof *p);
    if (!p) {
        fl_err_set(err, FL_ERR_RUNTIME, 0, "out of host memory for a device pool");
        return NULL;
    }
    if (fl_cuda_stream_create(device, &p->stream, err) != FL_CUDA_OK) {
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->lock, NULL);
    atomic_init(&p->refs, 1);
    p->device = device;
    p->max_buffers = max_buffers < 1 ? 1 : max_buffers;
    return p;
}

/* Free the pool when its last reference went (any thread, no GIL): wait for
 * queued copies and for idle buffers' consumers, then free everything.
 * Errors are ignored: nobody is left to report them to. */
static void
pool_destroy(fl_devpool *p)
{
    /* No buffer is out (each holds a reference), so only idle ones remain. */
    fl_cuda_stream_synchronize(p->device, p->stream, NULL);
    for (fl_devbuf *b = p->idle, *next; b; b = next) {
        next = b->next;
        for (int i = 0; i < b->npending; i++)
            fl_cuda_event_synchronize(p->device, b->released[i], NULL);
        devbuf_destroy(b);
    }
    fl_cuda_stream_destroy(p->device, p->stream, NULL);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

void
fl_devpool_ref(fl_devpool *p)
{
    atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
}

void
fl_devpool_unref(fl_devpool *p)
{
    if (p && atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) == 1)
        pool_destroy(p);
}

fl_cudaStream_t
fl_devpool_stream(const fl_devpool *p)
{
    return p->stream;
}

static int64_t
mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Poll `ev` until its work is done, the query fails, or about timeout_ms
 * passed (FL_CUDA_ERR_NOT_READY).  Sleeps between queries, 20 us at first
 * and doubling to 1 ms.  No locks held; no GIL. */
static int
event_wait_ms(int device, fl_cudaEvent_t ev, int timeout_ms, fl_err *err)
{
    const int64_t end = mono_ns() + (int64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000;
    long nap_ns = 20000;
    for (;;) {
        int rc = fl_cuda_event_query(device, ev, err);
        if (rc != FL_CUDA_ERR_NOT_READY)
            return rc;
        int64_t left = end - mono_ns();
        if (left <= 0)
            return FL_CUDA_ERR_NOT_READY;
        struct timespec ts = {0, left < nap_ns ? (long)left : nap_ns};
        nanosleep(&ts, NULL); /* a signal cutting it short only means an early query */
        if (nap_ns < 1000000)
            nap_ns *= 2;
    }
}

int
fl_devpool_mark(fl_devpool *p, fl_cudaEvent_t *mark, fl_err *err)
{
    int rc = fl_cuda_event_create(p->device, 0, mark, err);
    if (rc == FL_CUDA_OK)
        rc = fl_cuda_event_record(p->device, *mark, p->stream, err);
    if (rc != FL_CUDA_OK) {
        fl_cuda_event_destroy(p->device, *mark, NULL);
        *mark = NULL;
    }
    return rc;
}

int
fl_devpool_mark_wait(fl_devpool *p, fl_cudaEvent_t mark, int timeout_ms, fl_err *err)
{
    return event_wait_ms(p->device, mark, timeout_ms, err);
}

void
fl_devpool_mark_free(fl_devpool *p, fl_cudaEvent_t mark)
{
    fl_cuda_event_destroy(p->device, mark, NULL); /* a pending record still completes */
}

void
fl_devpool_get_stats(fl_devpool *p, fl_devpool_stats *out)
{
    pthread_mutex_lock(&p->lock);
    *out = p->st;
    pthread_mutex_unlock(&p->lock);
}

/* 1 when every released event of idle buffer b has completed (or failed:
 * a failed query is treated as "not passed", so the buffer is waited on). */
static int
released_passed(fl_devbuf *b)
{
    for (int i = 0; i < b->npending; i++)
        if (fl_cuda_event_query(b->device, b->released[i], NULL) != FL_CUDA_OK)
            return 0;
    return 1;
}

int
fl_devpool_copy(fl_devpool *p, const void *host, size_t bytes, fl_devbuf **out, fl_err *err)
{
    *out = NULL;
    const size_t cap = size_class(bytes);
    enum { TAKE_READY, TAKE_WAIT, ALLOCATE } how = ALLOCATE;
    fl_devbuf *pick = NULL, *victims = NULL;

    pthread_mutex_lock(&p->lock);
    size_cls *cls = class_for(p, cap, &victims);
    if (cls)
        cls->last_use = ++p->seq;
    fl_devbuf **oldest = NULL;
    for (fl_devbuf **pp = &p->idle; *pp; pp = &(*pp)->next) {
        if ((*pp)->cap != cap)
            continue;
        if (released_passed(*pp)) {
            pick = *pp;
            *pp = pick->next;
            how = TAKE_READY;
            break;
        }
        oldest = pp;
    }
    if (!pick && cls && cls->alive >= p->max_buffers) {
        if (oldest) { /* at the cap: wait on the GPU for the least recent user */
            pick = *oldest;
            *oldest = pick->next;
            how = TAKE_WAIT;
        } else {
            p->st.over_cap++; /* the consumer holds every buffer of this size */
        }
    }
    if (pick) {
        p->st.idle--;
        cls->idle--; /* an idle buffer always has its class */
    } else {
        p->st.buffers++; /* reserve; undone below on failure */
        p->st.device_bytes += cap;
        p->st.allocations++;
        if (cls)
            cls->alive++;
    }
    pthread_mutex_unlock(&p->lock);

    while (victims) {
        fl_devbuf *v = victims;
        victims = v->next;
        for (int i = 0; i < v->npending; i++)
            fl_cuda_event_synchronize(v->device, v->released[i], NULL);
        devbuf_destroy(v);
    }
    int rc = FL_CUDA_OK;
    if (!pick) {
        pick = devbuf_alloc(p->device, cap, &rc, err);
        if (!pick) {
            pthread_mutex_lock(&p->lock);
            p->st.buffers--;
            p->st.device_bytes -= cap;
            p->st.allocations--;
            if (cls && (cls = class_find(p, cap)))
                cls->alive--;
            pthread_mutex_unlock(&p->lock);
            return rc;
        }
        pick->tracked = cls != NULL;
    }
    /* Order the overwrite after every consumer stream's release point. */
    if (how == TAKE_WAIT)
        for (int i = 0; i < pick->npending && rc == FL_CUDA_OK; i++)
            rc = fl_cuda_stream_wait_event(p->device, p->stream, pick->released[i], err);
    pick->npending = 0;
    pick->nusers = 0;
    pick->bytes = bytes;
    if (rc == FL_CUDA_OK)
        rc = fl_cuda_event_record(p->device, pick->start, p->stream, err);
    if (rc == FL_CUDA_OK)
        rc = fl_cuda_memcpy_h2d_async(p->device, pick->ptr, host, bytes, p->stream, err);
    if (rc == FL_CUDA_OK)
        rc = fl_cuda_event_record(p->device, pick->ready, p->stream, err);
    if (rc != FL_CUDA_OK) {
        /* The buffer's state is unknown: free it rather than pool it. */
        pthread_mutex_lock(&p->lock);
        count_freed_locked(p, pick->tracked ? class_find(p, pick->cap) : NULL, pick->cap);
        pthread_mutex_unlock(&p->lock);
        devbuf_destroy(pick);
        return rc;
    }
    pthread_mutex_lock(&p->lock);
    p->st.copies++;
    p->st.bytes_copied += bytes;
    if (how == TAKE_READY)
        p->st.reused_ready++;
    else if (how == TAKE_WAIT)
        p->st.reused_waiting++;
    pthread_mutex_unlock(&p->lock);
    atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed); /* the buffer's */
    pick->pool = p;
    atomic_init(&pick->refs, 1);
    pick->next = NULL;
    *out = pick;
    return FL_CUDA_OK;
}

void *
fl_devbuf_ptr(const fl_devbuf *b)
{
    return b->ptr;
}

size_t
fl_devbuf_bytes(const fl_devbuf *b)
{
    return b->bytes;
}

int
fl_devbuf_copy_query(fl_devbuf *b, fl_err *err)
{
    return fl_cuda_event_query(b->device, b->ready, err);
}

int
fl_devbuf_copy_wait(fl_devbuf *b, fl_err *err)
{
    return fl_cuda_event_synchronize(b->device, b->ready, err);
}

int
fl_devbuf_copy_wait_ms(fl_devbuf *b, int timeout_ms, fl_err *err)
{
    return event_wait_ms(b->device, b->ready, timeout_ms, err);
}

int
fl_devbuf_copy_ms(fl_devbuf *b, float *ms, fl_err *err)
{
    return fl_cuda_event_elapsed_ms(b->device, ms, b->start, b->ready, err);
}

int
fl_devbuf_export(fl_devbuf *b, fl_cudaStream_t stream, int no_wait, fl_err *err)
{
    fl_devpool *p = b->pool;
    /* The release is recorded later on whatever thread drops the last
     * reference, where cudaStreamPerThread would name that thread's stream,
     * not the importer's.  The legacy default stream is ordered after every
     * thread's per-thread default stream (CUDA's stream semantics), so the
     * release of a per-thread import is recorded there. */
    fl_cudaStream_t release_on = stream == FL_CUDA_STREAM_PER_THREAD ? FL_CUDA_STREAM_LEGACY : stream;
    pthread_mutex_lock(&p->lock);
    int known = 0;
    for (int i = 0; i < b->nusers; i++)
        known |= b->users[i] == release_on;
    if (!known) {
        if (b->nusers == FL_DEVBUF_MAX_USERS) {
            pthread_mutex_unlock(&p->lock);
            /* a refusal of the export protocol, not a CUDA failure */
            fl_err_set(err, FL_ERR_EXPORT, 0,
                       "a fastloader device batch can be imported on at most %d different streams",
                       FL_DEVBUF_MAX_USERS);
            return -2;
        }
        b->users[b->nusers++] = release_on;
    }
    pthread_mutex_unlock(&p->lock);
    if (!no_wait) {
        int rc = fl_cuda_stream_wait_event(p->device, stream, b->ready, err);
        if (rc != FL_CUDA_OK)
            return rc; /* the stream stays listed: harmless, release orders after it */
    }
    fl_devbuf_ref(b);
    return FL_CUDA_OK;
}

void
fl_devbuf_ref(fl_devbuf *b)
{
    atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
}

void
fl_devbuf_unref(fl_devbuf *b)
{
    if (!b || atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) != 1)
        return;
    fl_devpool *p = b->pool;
    /* Last holder; no other thread can touch b now.  Decide first whether
     * it goes back to the pool: only then are release points recorded.  Its
     * class cannot be evicted meanwhile (b is counted alive, not idle). */
    pthread_mutex_lock(&p->lock);
    size_cls *c = b->tracked ? class_find(p, b->cap) : NULL;
    int ok = c && c->alive <= p->max_buffers;
    pthread_mutex_unlock(&p->lock);
    /* Mark the release point on every stream that used it. */
    for (int i = 0; i < b->nusers && ok; i++) {
        if (!b->released[i] && fl_cuda_event_create(p->device, 0, &b->released[i], NULL))
            ok = 0;
        else if (fl_cuda_event_record(p->device, b->released[i], b->users[i], NULL))
            ok = 0;
    }
    b->npending = ok ? b->nusers : 0;
    b->nusers = 0;
    b->pool = NULL;
    pthread_mutex_lock(&p->lock);
    if (ok) {
        b->next = p->idle;
        p->idle = b;
        p->st.idle++;
        c->idle++;
    } else {
        count_freed_locked(p, c, b->cap);
    }
    pthread_mutex_unlock(&p->lock);
    if (!ok)
        devbuf_destroy(b); /* cudaFree synchronises: safe even without the events */
    fl_devpool_unref(p);
}
