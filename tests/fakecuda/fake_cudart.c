/* fake_cudart.c: a stand-in for libcudart used by the CPU tests
 * (tests/test_devcopy.py), loaded by fastloader through FASTLOADER_CUDART.
 *
 * It implements the runtime entry points fastloader resolves, with "device"
 * memory in ordinary host memory and each stream run by a thread of its own
 * that executes queued work in order: copies (optionally slowed down),
 * event records, waits on events, and sleeps standing in for kernels.  No
 * stream is ever ordered with another one except through events, so a
 * missing cudaStreamWaitEvent or a buffer reused too early shows up as
 * wrong bytes.  As in CUDA: streams and events belong to the device current
 * when they were made, an event is recorded only on a stream of its own
 * device, the handles 0 and 0x1 name the legacy default stream of the
 * calling thread's current device and 0x2 the calling thread's own
 * per-thread default stream, the legacy stream and the per-thread streams
 * of a device are ordered with each other (created streams, all made
 * non-blocking by fastloader and these tests, are not), an event may be
 * destroyed while records of it are still queued, every failing call leaves
 * its error as the thread's last error until cudaGetLastError takes it, and
 * a call that needs a context creates the current device's primary context
 * (cudaSetDevice too, as since CUDA 12), which cuDevicePrimaryCtxGetState
 * reports.
 *
 * Test hooks (called with ctypes): fakecuda_set_copy_delay_us (slows down
 * host-to-device copies),
 * fakecuda_sleep_on, fakecuda_set_fail_malloc_after, fakecuda_counter,
 * fakecuda_device_bytes, fakecuda_live_streams, fakecuda_watch_free_host
 * (a slow cudaFreeHost that finishes early only if a Python thread runs).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

enum { OK = 0, E_INVALID_VALUE = 1, E_MEMORY = 2, E_INVALID_DEVICE = 101, E_NO_DEVICE = 100,
       E_INVALID_HANDLE = 400, E_NOT_READY = 600 };

enum { OP_COPY, OP_RECORD, OP_WAIT, OP_SLEEP };

typedef struct fake_event {
    uint64_t recorded, completed; /* generations */
    double t;                     /* when the last record completed */
    int timing;
    int dev;
    int pending;                  /* queued operations that use it */
    int destroyed;                /* freed when pending drops to 0 */
} fake_event;

typedef struct op {
    int kind;
    void *dst;
    const void *src;
    size_t n;
    fake_event *ev;
    uint64_t gen;
    long us;
    struct op *next;
} op;

enum { S_CREATED, S_LEGACY, S_PER_THREAD };

typedef struct fake_stream {
    pthread_t th;
    op *head, *tail;
    int busy, quit;
    int dev, kind;
    struct fake_stream *next_all;
} fake_stream;

typedef struct alloc {
    void *p;
    size_t n;
    struct alloc *next;
} alloc;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
#define MAX_DEV 8
static fake_stream *all_streams;
static fake_stream *legacy[MAX_DEV];
static __thread fake_stream *per_thread[MAX_DEV];
static alloc *dev_allocs;
static long copy_delay_us;
static long fail_malloc_after = -1;
static long counters[9]; /* see fakecuda_counter */
static const volatile long *watch_counter; /* see fakecuda_watch_free_host */
static long watch_need, watch_timeout_us;
static __thread int cur_device;
static __thread int last_error;
static unsigned contexts; /* bit d: device d has a primary context */

enum { C_STREAM_SYNC, C_EVENT_SYNC, C_MALLOC, C_FREE, C_HOST_ALLOC, C_HOST_FREE, C_WAIT_EVENT, C_COPY,
       C_HOST_FREE_STALLED };

static double
now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int
device_count(void)
{
    const char *e = getenv("FAKECUDA_DEVICES");
    int n = e ? atoi(e) : 1;
    return n < 0 ? 0 : n > MAX_DEV ? MAX_DEV : n;
}

/* The current device's primary context, created on first need. */
static void
need_context(void)
{
    __atomic_or_fetch(&contexts, 1u << cur_device, __ATOMIC_SEQ_CST);
}

/* Return `rc`, remembering a failure as the thread's last error. */
static int
ret(int rc)
{
    if (rc != OK)
        last_error = rc;
    return rc;
}

/* ---- streams --------------------------------------------------------------- */

static void *
stream_main(void *arg)
{
    fake_stream *s = arg;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (!s->head && !s->quit)
            pthread_cond_wait(&cv, &mu);
        if (!s->head)
            break;
        op *o = s->head;
        s->busy = 1;
        if (o->kind == OP_WAIT) {
            while (o->ev->completed < o->gen)
                pthread_cond_wait(&cv, &mu);
        }
        pthread_mutex_unlock(&mu);
        if (o->kind == OP_COPY) {
            if (o->us && copy_delay_us > 0) /* host-to-device copies only */
                usleep((useconds_t)copy_delay_us);
            memcpy(o->dst, o->src, o->n);
        } else if (o->kind == OP_SLEEP) {
            usleep((useconds_t)o->us);
        }
        pthread_mutex_lock(&mu);
        if (o->kind == OP_RECORD) {
            if (o->ev->completed < o->gen)
                o->ev->completed = o->gen;
            o->ev->t = now_s();
        }
        if (o->ev && --o->ev->pending == 0 && o->ev->destroyed)
            free(o->ev);
        s->head = o->next;
        if (!s->head)
            s->tail = NULL;
        s->busy = 0;
        free(o);
        pthread_cond_broadcast(&cv);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

static fake_stream *
stream_new_locked(int kind)
{
    fake_stream *s = calloc(1, sizeof *s);
    s->dev = cur_device;
    s->kind = kind;
    s->next_all = all_streams;
    all_streams = s;
    pthread_create(&s->th, NULL, stream_main, s);
    return s;
}

static fake_stream *
resolve_locked(void *handle)
{
    uintptr_t h = (uintptr_t)handle;
    if (h == 0 || h == 1) {
        if (!legacy[cur_device])
            legacy[cur_device] = stream_new_locked(S_LEGACY);
        return legacy[cur_device];
    }
    if (h == 2) {
        if (!per_thread[cur_device])
            per_thread[cur_device] = stream_new_locked(S_PER_THREAD);
        return per_thread[cur_device];
    }
    return handle;
}

static void
push_raw_locked(fake_stream *s, op *o)
{
    if (o->ev)
        o->ev->pending++;
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    pthread_cond_broadcast(&cv);
}

/* Make `s` wait for everything queued on `other` so far (an internal
 * event, freed when both operations are done). */
static void
order_after_locked(fake_stream *s, fake_stream *other)
{
    fake_event *e = calloc(1, sizeof *e);
    e->destroyed = 1;
    op *rec = calloc(1, sizeof *rec), *wait = calloc(1, sizeof *wait);
    rec->kind = OP_RECORD;
    rec->ev = e;
    rec->gen = ++e->recorded;
    wait->kind = OP_WAIT;
    wait->ev = e;
    wait->gen = e->recorded;
    push_raw_locked(other, rec);
    push_raw_locked(s, wait);
}

/* Queue work from the API: the legacy stream of a device follows every
 * per-thread stream of that device, and those follow the legacy stream. */
static void
push_locked(fake_stream *s, op *o)
{
    if (s->kind == S_LEGACY) {
        for (fake_stream *t = all_streams; t; t = t->next_all)
            if (t->kind == S_PER_THREAD && t->dev == s->dev && (t->head || t->busy))
                order_after_locked(s, t);
    } else if (s->kind == S_PER_THREAD && legacy[s->dev] &&
               (legacy[s->dev]->head || legacy[s->dev]->busy)) {
        order_after_locked(s, legacy[s->dev]);
    }
    push_raw_locked(s, o);
}

static void
drain_locked(fake_stream *s)
{
    while (s->head || s->busy)
        pthread_cond_wait(&cv, &mu);
}

static void
drain_all_locked(void)
{
    for (fake_stream *s = all_streams; s; s = s->next_all)
        drain_locked(s);
}

static alloc *
find_alloc_locked(const void *p, size_t n)
{
    for (alloc *a = dev_allocs; a; a = a->next)
        if ((const char *)p >= (const char *)a->p && (const char *)p + n <= (const char *)a->p + a->n)
            return a;
    return NULL;
}

/* ---- the runtime API --------------------------------------------------------- */

API int cudaGetDeviceCount(int *c) { *c = device_count(); return ret(*c ? OK : E_NO_DEVICE); }
API int cudaRuntimeGetVersion(int *v) { *v = 13000; return OK; }
API int cudaDriverGetVersion(int *v) { *v = 13000; return OK; }

API const char *
cudaGetErrorName(int e)
{
    switch (e) {
    case OK: return "cudaSuccess";
    case E_INVALID_VALUE: return "cudaErrorInvalidValue";
    case E_MEMORY: return "cudaErrorMemoryAllocation";
    case E_NO_DEVICE: return "cudaErrorNoDevice";
    case E_INVALID_DEVICE: return "cudaErrorInvalidDevice";
    case E_INVALID_HANDLE: return "cudaErrorInvalidResourceHandle";
    case E_NOT_READY: return "cudaErrorNotReady";
    default: return "cudaErrorUnknown";
    }
}

API const char *
cudaGetErrorString(int e)
{
    switch (e) {
    case OK: return "no error";
    case E_INVALID_VALUE: return "invalid argument";
    case E_MEMORY: return "out of memory";
    case E_NO_DEVICE: return "no CUDA-capable device is detected";
    case E_INVALID_DEVICE: return "invalid device ordinal";
    case E_INVALID_HANDLE: return "invalid resource handle";
    case E_NOT_READY: return "device not ready";
    default: return "unknown error";
    }
}

API int
cudaSetDevice(int d)
{
    if (d < 0 || d >= device_count())
        return ret(E_INVALID_DEVICE);
    cur_device = d;
    need_context();
    return OK;
}

API int cudaGetDevice(int *d) { *d = cur_device; return OK; }

API int
cudaHostAlloc(void **p, size_t n, unsigned flags)
{
    need_context();
    (void)flags;
    *p = malloc(n ? n : 1);
    pthread_mutex_lock(&mu);
    counters[C_HOST_ALLOC]++;
    pthread_mutex_unlock(&mu);
    return ret(*p ? OK : E_MEMORY);
}

/* A slow cudaFreeHost (fakecuda_watch_free_host): wait until the watched
 * counter has advanced by watch_need, or watch_timeout_us passed (counted
 * as a stall).  Outside the lock: other calls go on meanwhile. */
static void
free_host_watch(void)
{
    pthread_mutex_lock(&mu);
    const volatile long *c = watch_counter;
    long need = watch_need, timeout_us = watch_timeout_us;
    pthread_mutex_unlock(&mu);
    if (!c)
        return;
    long start = __atomic_load_n(c, __ATOMIC_RELAXED);
    double end = now_s() + timeout_us * 1e-6;
    while (__atomic_load_n(c, __ATOMIC_RELAXED) - start < need) {
        if (now_s() > end) {
            pthread_mutex_lock(&mu);
            counters[C_HOST_FREE_STALLED]++;
            pthread_mutex_unlock(&mu);
            return;
        }
        usleep(1000);
    }
}

API int
cudaFreeHost(void *p)
{
    need_context();
    free_host_watch();
    pthread_mutex_lock(&mu);
    drain_all_locked(); /* like the real one, it synchronises */
    counters[C_HOST_FREE]++;
    pthread_mutex_unlock(&mu);
    free(p);
    return OK;
}

API int cudaHostRegister(void *p, size_t n, unsigned f) { (void)p; (void)n; (void)f; return OK; }
API int cudaHostUnregister(void *p) { (void)p; return OK; }

API int
cudaMalloc(void **p, size_t n)
{
    need_context();
    *p = NULL;
    pthread_mutex_lock(&mu);
    if (fail_malloc_after == 0) {
        pthread_mutex_unlock(&mu);
        return ret(E_MEMORY);
    }
    if (fail_malloc_after > 0)
        fail_malloc_after--;
    alloc *a = calloc(1, sizeof *a);
    a->p = malloc(n ? n : 1);
    memset(a->p, 0xEE, n); /* "uninitialised device memory" */
    a->n = n;
    a->next = dev_allocs;
    dev_allocs = a;
    counters[C_MALLOC]++;
    *p = a->p;
    pthread_mutex_unlock(&mu);
    return OK;
}

API int
cudaFree(void *p)
{
    need_context();
    if (!p)
        return OK;
    pthread_mutex_lock(&mu);
    drain_all_locked(); /* cudaFree synchronises the device */
    for (alloc **pp = &dev_allocs; *pp; pp = &(*pp)->next) {
        if ((*pp)->p == p) {
            alloc *a = *pp;
            *pp = a->next;
            free(a->p);
            free(a);
            counters[C_FREE]++;
            pthread_mutex_unlock(&mu);
            return OK;
        }
    }
    pthread_mutex_unlock(&mu);
    return ret(E_INVALID_VALUE);
}

API int
cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream)
{
    need_context();
    pthread_mutex_lock(&mu);
    /* 1 = host to device, 2 = device to host: the device side must lie in
     * one allocation, the host side must not. */
    int bad = (kind == 1 && (!find_alloc_locked(dst, n) || find_alloc_locked(src, 1))) ||
              (kind == 2 && (!find_alloc_locked(src, n) || find_alloc_locked(dst, 1))) ||
              (kind != 1 && kind != 2);
    if (bad) {
        pthread_mutex_unlock(&mu);
        return ret(E_INVALID_VALUE);
    }
    op *o = calloc(1, sizeof *o);
    o->kind = OP_COPY;
    o->dst = dst;
    o->src = src;
    o->n = n;
    o->us = kind == 1;
    counters[C_COPY]++;
    push_locked(resolve_locked(stream), o);
    pthread_mutex_unlock(&mu);
    return OK;
}

API int
cudaStreamCreateWithFlags(void **s, unsigned flags)
{
    need_context();
    (void)flags;
    pthread_mutex_lock(&mu);
    *s = stream_new_locked(S_CREATED);
    pthread_mutex_unlock(&mu);
    return OK;
}

API int
cudaStreamDestroy(void *handle)
{
    need_context();
    pthread_mutex_lock(&mu);
    fake_stream *s = resolve_locked(handle);
    if (s->kind != S_CREATED) {
        pthread_mutex_unlock(&mu);
        return ret(E_INVALID_HANDLE);
    }
    drain_locked(s);
    s->quit = 1;
    pthread_cond_broadcast(&cv);
    for (fake_stream **pp = &all_streams; *pp; pp = &(*pp)->next_all)
        if (*pp == s) {
            *pp = s->next_all;
            break;
        }
    pthread_mutex_unlock(&mu);
    pthread_join(s->th, NULL);
    free(s);
    return OK;
}

API int
cudaStreamWaitEvent(void *stream, void *event, unsigned flags)
{
    need_context();
    (void)flags;
    fake_event *e = event;
    pthread_mutex_lock(&mu);
    counters[C_WAIT_EVENT]++;
    if (e->recorded) {
        op *o = calloc(1, sizeof *o);
        o->kind = OP_WAIT;
        o->ev = e;
        o->gen = e->recorded;
        push_locked(resolve_locked(stream), o);
    }
    pthread_mutex_unlock(&mu);
    return OK;
}

API int
cudaStreamSynchronize(void *stream)
{
    need_context();
    pthread_mutex_lock(&mu);
    counters[C_STREAM_SYNC]++;
    drain_locked(resolve_locked(stream));
    pthread_mutex_unlock(&mu);
    return OK;
}

API int
cudaEventCreateWithFlags(void **event, unsigned flags)
{
    need_context();
    fake_event *e = calloc(1, sizeof *e);
    e->timing = !(flags & 0x02u);
    e->dev = cur_device;
    *event = e;
    return OK;
}

API int
cudaEventRecord(void *event, void *stream)
{
    need_context();
    fake_event *e = event;
    pthread_mutex_lock(&mu);
    fake_stream *s = resolve_locked(stream);
    if (s->dev != e->dev) { /* as the real runtime: one device for both */
        pthread_mutex_unlock(&mu);
        return ret(E_INVALID_HANDLE);
    }
    op *o = calloc(1, sizeof *o);
    o->kind = OP_RECORD;
    o->ev = e;
    o->gen = ++e->recorded;
    push_locked(s, o);
    pthread_mutex_unlock(&mu);
    return OK;
}

API int
cudaEventQuery(void *event)
{
    need_context();
    fake_event *e = event;
    pthread_mutex_lock(&mu);
    int rc = e->completed >= e->recorded ? OK : E_NOT_READY;
    pthread_mutex_unlock(&mu);
    return ret(rc);
}

API int
cudaEventSynchronize(void *event)
{
    need_context();
    fake_event *e = event;
    pthread_mutex_lock(&mu);
    counters[C_EVENT_SYNC]++;
    uint64_t g = e->recorded;
    while (e->completed < g)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    return OK;
}

API int
cudaEventDestroy(void *event)
{
    need_context();
    fake_event *e = event;
    pthread_mutex_lock(&mu);
    /* as the real runtime: queued records of it still complete */
    e->destroyed = 1;
    if (e->pending == 0)
        free(e);
    pthread_mutex_unlock(&mu);
    return OK;
}

API int
cudaEventElapsedTime(float *ms, void *start, void *end)
{
    need_context();
    fake_event *a = start, *b = end;
    pthread_mutex_lock(&mu);
    int rc = OK;
    if (!a->timing || !b->timing)
        rc = E_INVALID_HANDLE;
    else if (a->completed < a->recorded || b->completed < b->recorded)
        rc = E_NOT_READY;
    else
        *ms = (float)((b->t - a->t) * 1e3);
    pthread_mutex_unlock(&mu);
    return ret(rc);
}

API int
cudaGetLastError(void)
{
    int e = last_error;
    last_error = OK;
    return e;
}

/* The driver API call fastloader uses to avoid creating contexts. */
API int
cuDevicePrimaryCtxGetState(int dev, unsigned *flags, int *active)
{
    *flags = 0;
    *active = (__atomic_load_n(&contexts, __ATOMIC_SEQ_CST) >> dev) & 1u;
    return 0;
}

/* ---- test hooks ---------------------------------------------------------------- */

API void fakecuda_set_copy_delay_us(long us) { copy_delay_us = us; }

/* Bit d set: device d has a primary context.  fakecuda_forget_contexts
 * starts counting afresh. */
API unsigned fakecuda_contexts(void) { return __atomic_load_n(&contexts, __ATOMIC_SEQ_CST); }
API void fakecuda_forget_contexts(void) { __atomic_store_n(&contexts, 0u, __ATOMIC_SEQ_CST); }

API void
fakecuda_set_fail_malloc_after(long n)
{
    pthread_mutex_lock(&mu);
    fail_malloc_after = n;
    pthread_mutex_unlock(&mu);
}

/* Queue `us` microseconds of "kernel" on a stream. */
API void
fakecuda_sleep_on(void *stream, long us)
{
    pthread_mutex_lock(&mu);
    op *o = calloc(1, sizeof *o);
    o->kind = OP_SLEEP;
    o->us = us;
    push_locked(resolve_locked(stream), o);
    pthread_mutex_unlock(&mu);
}

/* Make every cudaFreeHost slow: it returns only once *counter (a long that
 * a Python thread keeps incrementing) has advanced by `need`, or after
 * timeout_us (counted in counter 8, "stalled").  A caller that holds the GIL
 * while it frees stalls, because the counting thread cannot run.  NULL
 * turns the watch off. */
API void
fakecuda_watch_free_host(const long *counter, long need, long timeout_us)
{
    pthread_mutex_lock(&mu);
    watch_counter = counter;
    watch_need = need;
    watch_timeout_us = timeout_us;
    pthread_mutex_unlock(&mu);
}

/* Created streams not yet destroyed. */
API long
fakecuda_live_streams(void)
{
    pthread_mutex_lock(&mu);
    long n = 0;
    for (fake_stream *s = all_streams; s; s = s->next_all)
        n += s->kind == S_CREATED;
    pthread_mutex_unlock(&mu);
    return n;
}

/* 0 stream syncs, 1 event syncs, 2 mallocs, 3 frees, 4 host allocs,
 * 5 host frees, 6 stream-waits-on-event, 7 copies, 8 host frees that
 * stalled (fakecuda_watch_free_host). */
API long
fakecuda_counter(int which)
{
    pthread_mutex_lock(&mu);
    long v = which >= 0 && which < 9 ? counters[which] : -1;
    pthread_mutex_unlock(&mu);
    return v;
}

/* Live device allocations; *bytes gets their total. */
API long
fakecuda_device_bytes(size_t *bytes)
{
    pthread_mutex_lock(&mu);
    long n = 0;
    size_t b = 0;
    for (alloc *a = dev_allocs; a; a = a->next) {
        n++;
        b += a->n;
    }
    pthread_mutex_unlock(&mu);
    if (bytes)
        *bytes = b;
    return n;
}
