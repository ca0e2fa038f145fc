/* cuda.c: the CUDA runtime loaded with dlopen (see cuda.h for contracts).
 *
 * Why one file of ~800 lines: loading the library, finding it (the nvidia-*
 * wheel directories) and the ~20 thin wrappers all use the process-wide
 * state below (handle, entry points, load outcome), which is written only
 * here, under one lock, and read elsewhere only through fl_cuda_get_api.
 * The wrappers are short and alike on purpose (device entered and
 * restored, errors formatted one way): each is one FL_CALL_ON[_OUT], or
 * calls call_enter/call_leave itself.
 *
 * Process-wide state.  The dlopen handle, the table of entry points and the
 * load outcome are C statics: a shared library is loaded once per process
 * whatever the number of interpreters or module objects, so this is the one
 * place where a global is the honest model (no Python object is held).
 * pthread_once cannot take the caller's search paths, so a mutex guards the
 * one-time load and an atomic flag publishes the result (release/acquire):
 * readers after a successful load take no lock.
 */
#include "cuda/cuda.h"

#include <dirent.h>
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* We copy dlsym's void * into function-pointer fields; POSIX guarantees
 * the sizes match. */
_Static_assert(sizeof(void *) == sizeof(void (*)(void)), "function pointers must fit in void *");

#define FL_CUDA_MSG 4096 /* paths and labels (PATH_MAX) */

/* The load failure, "no CUDA runtime library found (tried: <list>)": the
 * list is cut (ending in "...") so that the whole message, ")" included,
 * fits an fl_err's msg. */
#define LOAD_ERR_HEAD "no CUDA runtime library found (tried: "
#define LOAD_ERR_TAIL ")"
#define TRIED_MAX (FL_ERR_MSG_MAX - (sizeof LOAD_ERR_HEAD - 1) - (sizeof LOAD_ERR_TAIL - 1))

enum { LOAD_UNTRIED = 0, LOAD_OK = 1, LOAD_FAILED = -1 };

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int g_state = LOAD_UNTRIED; /* written once, under g_lock */
static void *g_handle;                    /* never dlclose()d */
static fl_cuda_api g_api;
static char g_path[FL_CUDA_MSG];          /* the library's path (link map) */
static char g_load_err[FL_ERR_MSG_MAX];   /* why the load failed */

/* ---- small string helpers ---------------------------------------------- */

/* Append s to buf[cap] (length *len), ending in "..." once full. */
static void
buf_append(char *buf, size_t cap, size_t *len, const char *s)
{
    if (*len + 1 >= cap)
        return;
    size_t room = cap - *len - 1, n = strlen(s);
    if (n > room) {
        memcpy(buf + *len, s, room);
        *len += room;
        if (cap >= 4)
            memcpy(buf + cap - 4, "...", 3);
    } else {
        memcpy(buf + *len, s, n);
        *len += n;
    }
    buf[*len] = '\0';
}

int
fl_cuda_format_error(fl_err *err, const char *what, int code)
{
    const fl_cuda_api *api = fl_cuda_get_api();
    if (api && code > 0)
        (void)api->GetLastError(); /* reported to our caller: clear it for torch */
    if (!err)
        return code;
    if (code == FL_CUDA_ERR_NO_LIBRARY) {
        fl_err_set(err, FL_ERR_RUNTIME, 0, "%s failed (CUDA runtime library not loaded)", what);
        return code;
    }
    const char *name = api ? api->GetErrorName(code) : NULL;
    const char *desc = api ? api->GetErrorString(code) : NULL;
    if (name && desc)
        fl_err_set(err, FL_ERR_RUNTIME, 0, "%s failed (%s: %s)", what, name, desc);
    else
        fl_err_set(err, FL_ERR_RUNTIME, 0, "%s failed (CUDA error %d)", what, code);
    return code;
}

/* ---- loading ------------------------------------------------------------ */

/* Resolve every entry point of `h` into *api.  Returns NULL, or the name
 * of the first missing symbol. */
static const char *
resolve(void *h, fl_cuda_api *api)
{
#define FL_SYM(field, name)                                                                        \
    do {                                                                                           \
        void *s_ = dlsym(h, name);                                                                 \
        if (!s_)                                                                                   \
            return name;                                                                           \
        memcpy(&api->field, &s_, sizeof s_);                                                       \
    } while (0)
    FL_SYM(GetDeviceCount, "cudaGetDeviceCount");
    FL_SYM(RuntimeGetVersion, "cudaRuntimeGetVersion");
    FL_SYM(DriverGetVersion, "cudaDriverGetVersion");
    FL_SYM(GetErrorName, "cudaGetErrorName");
    FL_SYM(GetErrorString, "cudaGetErrorString");
    FL_SYM(SetDevice, "cudaSetDevice");
    FL_SYM(GetDevice, "cudaGetDevice");
    FL_SYM(HostAlloc, "cudaHostAlloc");
    FL_SYM(FreeHost, "cudaFreeHost");
    FL_SYM(HostRegister, "cudaHostRegister");
    FL_SYM(HostUnregister, "cudaHostUnregister");
    FL_SYM(Malloc, "cudaMalloc");
    FL_SYM(Free, "cudaFree");
    FL_SYM(MemcpyAsync, "cudaMemcpyAsync");
    FL_SYM(StreamCreateWithFlags, "cudaStreamCreateWithFlags");
    FL_SYM(StreamDestroy, "cudaStreamDestroy");
    FL_SYM(StreamWaitEvent, "cudaStreamWaitEvent");
    FL_SYM(StreamSynchronize, "cudaStreamSynchronize");
    FL_SYM(EventCreateWithFlags, "cudaEventCreateWithFlags");
    FL_SYM(EventRecord, "cudaEventRecord");
    FL_SYM(EventQuery, "cudaEventQuery");
    FL_SYM(EventSynchronize, "cudaEventSynchronize");
    FL_SYM(EventDestroy, "cudaEventDestroy");
    FL_SYM(EventElapsedTime, "cudaEventElapsedTime");
    FL_SYM(GetLastError, "cudaGetLastError");
#undef FL_SYM
    return NULL;
}

/* Try one candidate.  On success fills g_handle/g_api/g_path and returns 1.
 * Otherwise appends the candidate (and why, when that says more than "not
 * there") to tried[] and returns 0.  `label` is printed instead of the path
 * when not NULL; `always_why` adds dlerror() even for missing files. */
static int
try_open(const char *path, int flags, const char *label, int always_why, char *tried,
         size_t *tlen, int *ntried)
{
    void *h = dlopen(path, flags);
    if (h) {
        fl_cuda_api api;
        const char *missing = resolve(h, &api);
        if (!missing) {
            struct link_map *lm = NULL;
            const char *name = path;
            if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
                name = lm->l_name;
            /* torch loads it as ".../torch/lib/../../nvidia/...": report the
             * canonical path. */
            char *real = realpath(name, NULL);
            snprintf(g_path, sizeof g_path, "%s", real ? real : name);
            free(real);
            g_api = api;
            g_handle = h;
            return 1;
        }
        dlclose(h);
        if (flags & RTLD_NOLOAD)
            return 0;
        buf_append(tried, TRIED_MAX, tlen, *ntried ? ", " : "");
        buf_append(tried, TRIED_MAX, tlen, label ? label : path);
        buf_append(tried, TRIED_MAX, tlen, ": lacks ");
        buf_append(tried, TRIED_MAX, tlen, missing);
        (*ntried)++;
        return 0;
    }
    const char *why = dlerror();
    if (flags & RTLD_NOLOAD)
        return 0;
    buf_append(tried, TRIED_MAX, tlen, *ntried ? ", " : "");
    buf_append(tried, TRIED_MAX, tlen, label ? label : path);
    /* A missing file needs no explanation; a file that exists but does not
     * load (wrong architecture, missing dependency) does. */
    if (why && (always_why || (strchr(path, '/') && access(path, F_OK) == 0))) {
        buf_append(tried, TRIED_MAX, tlen, " (");
        buf_append(tried, TRIED_MAX, tlen, why);
        buf_append(tried, TRIED_MAX, tlen, ")");
    }
    (*ntried)++;
    return 0;
}

static const char *const sonames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
#define N_SONAMES (sizeof sonames / sizeof sonames[0])

/* The search itself (cuda.h, fl_cuda_load); called once, under g_lock. */
static int
load_locked(const char *const *paths, size_t n)
{
    char tried[TRIED_MAX];
    size_t tlen = 0;
    int ntried = 0;
    const int flags = RTLD_NOW | RTLD_LOCAL;
    tried[0] = '\0';

    const char *env = getenv("FASTLOADER_CUDART");
    if (env && env[0]) {
        char label[FL_CUDA_MSG];
        snprintf(label, sizeof label, "FASTLOADER_CUDART=%s", env);
        if (try_open(env, flags, label, 1, tried, &tlen, &ntried))
            return 0;
        goto fail;
    }
    /* Already in the process (torch imported first): share it. */
    for (size_t i = 0; i < N_SONAMES; i++)
        if (try_open(sonames[i], flags | RTLD_NOLOAD, NULL, 0, tried, &tlen, &ntried))
            return 0;
    for (size_t i = 0; i < n; i++)
        if (paths && paths[i] && paths[i][0] &&
            try_open(paths[i], flags, NULL, 0, tried, &tlen, &ntried))
            return 0;
    const char *home = getenv("CUDA_HOME");
    const char *prefixes[2] = {home && home[0] ? home : NULL, "/usr/local/cuda"};
    if (prefixes[0] && strcmp(prefixes[0], prefixes[1]) == 0)
        prefixes[0] = NULL;
    for (size_t p = 0; p < 2; p++) {
        if (!prefixes[p])
            continue;
        for (size_t i = 0; i < N_SONAMES; i++) {
            char path[FL_CUDA_MSG];
            int len = snprintf(path, sizeof path, "%s/lib64/%s", prefixes[p], sonames[i]);
            if (len < 0 || (size_t)len >= sizeof path)
                continue;
            if (try_open(path, flags, NULL, 0, tried, &tlen, &ntried))
                return 0;
        }
    }
    for (size_t i = 0; i < N_SONAMES; i++)
        if (try_open(sonames[i], flags, NULL, 0, tried, &tlen, &ntried))
            return 0;
fail:
    snprintf(g_load_err, sizeof g_load_err, "%s%s%s", LOAD_ERR_HEAD, tried, LOAD_ERR_TAIL);
    return -1;
}

int
fl_cuda_load(const char *const *paths, size_t n, fl_err *err)
{
    int st = atomic_load_explicit(&g_state, memory_order_acquire);
    if (st == LOAD_UNTRIED) {
        pthread_mutex_lock(&g_lock);
        st = atomic_load_explicit(&g_state, memory_order_relaxed);
        if (st == LOAD_UNTRIED) {
            st = load_locked(paths, n) == 0 ? LOAD_OK : LOAD_FAILED;
            atomic_store_explicit(&g_state, st, memory_order_release);
        }
        pthread_mutex_unlock(&g_lock);
    }
    if (st == LOAD_OK)
        return FL_CUDA_OK;
    fl_err_set(err, FL_ERR_RUNTIME, 0, "%s", g_load_err);
    return FL_CUDA_ERR_NO_LIBRARY;
}

const fl_cuda_api *
fl_cuda_get_api(void)
{
    return atomic_load_explicit(&g_state, memory_order_acquire) == LOAD_OK ? &g_api : NULL;
}

const char *
fl_cuda_library_path(void)
{
    return fl_cuda_get_api() ? g_path : NULL;
}

/* ---- finding the runtime: the nvidia-* wheel copies ---------------------- */

/* A growable list of malloc'ed C strings. */
typedef struct {
    char **v;
    size_t n, cap;
} strv;

/* Append a copy of str.  0, or -1 when out of memory. */
static int
strv_push(strv *s, const char *str)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        char **v = realloc(s->v, cap * sizeof *v);
        if (!v)
            return -1;
        s->v = v;
        s->cap = cap;
    }
    char *d = strdup(str);
    if (!d)
        return -1;
    s->v[s->n++] = d;
    return 0;
}

/* Append "a/b" (a = "" means "."). */
static int
strv_push_join(strv *s, const char *a, const char *b)
{
    size_t len = strlen(a) + 1 + strlen(b) + 2;
    char *p = malloc(len);
    if (!p)
        return -1;
    snprintf(p, len, "%s/%s", a[0] ? a : ".", b);
    int rc = strv_push(s, p);
    free(p);
    return rc;
}

static void
strv_free(strv *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->v[i]);
    free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
}

static int
cmp_desc(const void *a, const void *b)
{
    return strcmp(*(char *const *)b, *(char *const *)a);
}

/* Append dir/libcudart.so* to out, newest version first ("libcudart.so.13"
 * sorts after "libcudart.so.12" and "libcudart.so").  A missing directory
 * adds nothing.  Returns -1 on out of memory. */
static int
scan_dir(const char *dir, strv *out)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    strv names = {0};
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        if (strncmp(nm, "libcudart.so", 12) == 0 && (nm[12] == '\0' || nm[12] == '.'))
            if (strv_push(&names, nm) < 0) {
                rc = -1;
                break;
            }
    }
    closedir(d);
    if (names.n > 1)
        qsort(names.v, names.n, sizeof *names.v, cmp_desc);
    for (size_t i = 0; rc == 0 && i < names.n; i++)
        rc = strv_push_join(out, dir, names.v[i]);
    strv_free(&names);
    return rc;
}

/* Where the nvidia-* wheels keep libcudart under a sys.path entry. */
static const char *const wheel_dirs[] = {"nvidia/cu13/lib", "nvidia/cuda_runtime/lib"};

int
fl_cuda_probe(const char *const *files, size_t nfiles, const char *const *roots, size_t nroots,
              fl_cuda_probe_result *p)
{
    strv cand = {0}, dir = {0};
    int oom = 0;
    memset(p, 0, sizeof *p);
    for (size_t i = 0; i < nfiles && !oom; i++)
        oom = files[i] && strv_push(&cand, files[i]) < 0;
    for (size_t i = 0; i < nroots && !oom && !fl_cuda_get_api(); i++) {
        for (size_t k = 0; roots[i] && k < sizeof wheel_dirs / sizeof wheel_dirs[0] && !oom; k++) {
            oom = strv_push_join(&dir, roots[i], wheel_dirs[k]) < 0;
            if (!oom)
                oom = scan_dir(dir.v[dir.n - 1], &cand) < 0;
        }
    }
    if (!oom) {
        p->loaded = fl_cuda_load((const char *const *)cand.v, cand.n, &p->load_err) == FL_CUDA_OK;
        if (p->loaded) {
            p->vers_rc = fl_cuda_versions(&p->runtime, &p->driver, &p->vers_err);
            p->count_rc = fl_cuda_device_count(&p->count, &p->count_err);
        }
    } else {
        fl_err_set(&p->load_err, FL_ERR_NOMEM, 0, "out of memory while looking for the CUDA runtime");
    }
    strv_free(&cand);
    strv_free(&dir);
    return oom ? -1 : 0;
}

/* ---- helpers ------------------------------------------------------------ */

/* The loaded table, or NULL with err set. */
static const fl_cuda_api *
api_or_err(const char *what, fl_err *err)
{
    const fl_cuda_api *api = fl_cuda_get_api();
    if (!api)
        fl_cuda_format_error(err, what, FL_CUDA_ERR_NO_LIBRARY);
    return api;
}

/* The driver's cuDevicePrimaryCtxGetState, to tell whether switching a
 * thread back to a device would create a context there.  Looked up once:
 * in the runtime library itself (a stand-in runtime may provide it), else
 * in the already-loaded libcuda.so.1.  NULL when neither has it. */
typedef int (*fl_ctx_state_fn)(int dev, unsigned int *flags, int *active);
static _Atomic(fl_ctx_state_fn) g_ctx_state;
static atomic_int g_ctx_state_tried;

static fl_ctx_state_fn
ctx_state_fn(void)
{
    if (!atomic_load_explicit(&g_ctx_state_tried, memory_order_acquire)) {
        void *s = dlsym(g_handle, "cuDevicePrimaryCtxGetState");
        if (!s) {
            void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
            if (drv)
                s = dlsym(drv, "cuDevicePrimaryCtxGetState"); /* drv stays open: it is the loaded driver */
        }
        fl_ctx_state_fn f;
        memcpy(&f, &s, sizeof f);
        atomic_store_explicit(&g_ctx_state, f, memory_order_relaxed);
        atomic_store_explicit(&g_ctx_state_tried, 1, memory_order_release);
    }
    return atomic_load_explicit(&g_ctx_state, memory_order_relaxed);
}

/* Make `device` current on this thread for one call; *prev remembers the
 * thread's device so leave_device restores it.  device < 0: no change. */
static int
enter_device(const fl_cuda_api *api, int device, int *prev, fl_err *err)
{
    *prev = device;
    if (device < 0)
        return FL_CUDA_OK;
    int cur = 0;
    int rc = api->GetDevice(&cur);
    if (rc != FL_CUDA_OK)
        return fl_cuda_format_error(err, "cudaGetDevice", rc);
    *prev = cur;
    if (cur != device) {
        rc = api->SetDevice(device);
        if (rc != FL_CUDA_OK) {
            char what[64];
            snprintf(what, sizeof what, "cudaSetDevice(%d)", device);
            return fl_cuda_format_error(err, what, rc);
        }
    }
    return FL_CUDA_OK;
}

static void
leave_device(const fl_cuda_api *api, int device, int prev)
{
    if (prev == device)
        return;
    /* Switching back to a device without a primary context would create
     * one (cudaSetDevice initialises it since CUDA 12): such a thread never
     * really used `prev`, so it stays on `device`, as torch does.  A
     * restore that fails cannot be acted on by the caller. */
    fl_ctx_state_fn state = ctx_state_fn();
    unsigned int flags = 0;
    int active = 1;
    if (state && state(prev, &flags, &active) == 0 && !active)
        return;
    (void)api->SetDevice(prev);
}

/* One runtime call with `device` current on this thread, in two halves
 * around the call itself.  No GIL needed; any thread.
 *
 * call_enter: the loaded table, with `device` made current (enter_device)
 * and *prev set for call_leave.  Or NULL with *rc the code to return and
 * err set ("<name> failed (CUDA runtime library not loaded)", or the
 * cudaGetDevice/cudaSetDevice failure); nothing is left to undo then.
 *
 * call_leave: restores the caller's device (leave_device) and returns rc,
 * the call's code.  When rc is a failure, err gets "<what> failed (name:
 * text)", what being printf(fmt, ...) (formatted only then), the thread's
 * last error is cleared (fl_cuda_format_error), and *out, when out is not
 * NULL, is set to NULL: a caller never sees what a failed call left in
 * its output. */
static const fl_cuda_api *
call_enter(int device, const char *name, int *prev, int *rc, fl_err *err)
{
    const fl_cuda_api *api = api_or_err(name, err);
    if (!api) {
        *rc = FL_CUDA_ERR_NO_LIBRARY;
        return NULL;
    }
    *rc = enter_device(api, device, prev, err);
    return *rc == FL_CUDA_OK ? api : NULL;
}

static int call_leave(const fl_cuda_api *api, int device, int prev, int rc, void **out, fl_err *err,
                      const char *fmt, ...) __attribute__((format(printf, 7, 8)));

static int
call_leave(const fl_cuda_api *api, int device, int prev, int rc, void **out, fl_err *err,
           const char *fmt, ...)
{
    leave_device(api, device, prev);
    if (rc == FL_CUDA_OK)
        return rc;
    if (out)
        *out = NULL;
    char what[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return fl_cuda_format_error(err, what, rc);
}

/* The whole body of a wrapper around one runtime call api->call: returns
 * its code from the enclosing function (which has an `fl_err *err` parameter),
 * with call_enter's and call_leave's contracts.  out: NULL, or the
 * caller's void ** that the call writes its result into; it is NULL on
 * every failure (set before the call, reset after a failed one).  The
 * failure names `name` when the library is not loaded, else printf(...)
 * (the arguments after `call`, e.g. the size asked for). */
#define FL_CALL_ON_OUT(device, out, name, call, ...)                                               \
    do {                                                                                           \
        void **out_ = (out);                                                                       \
        if (out_)                                                                                  \
            *out_ = NULL;                                                                          \
        int prev_, rc_;                                                                            \
        const fl_cuda_api *api_ = call_enter((device), name, &prev_, &rc_, err);                   \
        if (!api_)                                                                                 \
            return rc_;                                                                            \
        rc_ = api_->call;                                                                          \
        return call_leave(api_, (device), prev_, rc_, out_, err, __VA_ARGS__);                     \
    } while (0)

/* The same with no output and the failure named `name`. */
#define FL_CALL_ON(device, name, call) FL_CALL_ON_OUT(device, NULL, name, call, "%s", name)

/* ---- queries ------------------------------------------------------------- */

int
fl_cuda_device_count(int *count, fl_err *err)
{
    *count = 0;
    const fl_cuda_api *api = api_or_err("cudaGetDeviceCount", err);
    if (!api)
        return FL_CUDA_ERR_NO_LIBRARY;
    int c = 0;
    int rc = api->GetDeviceCount(&c);
    if (rc != FL_CUDA_OK)
        return fl_cuda_format_error(err, "cudaGetDeviceCount", rc);
    *count = c;
    return FL_CUDA_OK;
}

int
fl_cuda_versions(int *runtime, int *driver, fl_err *err)
{
    if (runtime)
        *runtime = 0;
    if (driver)
        *driver = 0;
    const fl_cuda_api *api = api_or_err("cudaRuntimeGetVersion", err);
    if (!api)
        return FL_CUDA_ERR_NO_LIBRARY;
    int v = 0, rc;
    if (runtime) {
        if ((rc = api->RuntimeGetVersion(&v)) != FL_CUDA_OK)
            return fl_cuda_format_error(err, "cudaRuntimeGetVersion", rc);
        *runtime = v;
    }
    if (driver) {
        v = 0;
        if ((rc = api->DriverGetVersion(&v)) != FL_CUDA_OK)
            return fl_cuda_format_error(err, "cudaDriverGetVersion", rc);
        *driver = v;
    }
    return FL_CUDA_OK;
}

/* ---- memory ------------------------------------------------------------- */

int
fl_cuda_host_alloc(int device, size_t bytes, void **ptr, fl_err *err)
{
    /* on success ownership of *ptr passes to the caller */
    FL_CALL_ON_OUT(device, ptr, "cudaHostAlloc", HostAlloc(ptr, bytes, FL_CUDA_HOST_ALLOC_PORTABLE),
                   "cudaHostAlloc(%zu bytes)", bytes);
}

int
fl_cuda_host_free(int device, void *ptr, fl_err *err)
{
    if (!ptr)
        return FL_CUDA_OK;
    FL_CALL_ON(device, "cudaFreeHost", FreeHost(ptr));
}

int
fl_cuda_host_register(int device, void *ptr, size_t bytes, fl_err *err)
{
    FL_CALL_ON_OUT(device, NULL, "cudaHostRegister",
                   HostRegister(ptr, bytes, FL_CUDA_HOST_REGISTER_PORTABLE), "cudaHostRegister(%zu bytes)",
                   bytes);
}

int
fl_cuda_host_unregister(int device, void *ptr, fl_err *err)
{
    FL_CALL_ON(device, "cudaHostUnregister", HostUnregister(ptr));
}

int
fl_cuda_malloc(int device, size_t bytes, void **ptr, fl_err *err)
{
    /* on success ownership of *ptr passes to the caller */
    FL_CALL_ON_OUT(device, ptr, "cudaMalloc", Malloc(ptr, bytes), "cudaMalloc(%zu bytes) on device %d",
                   bytes, device);
}

int
fl_cuda_free(int device, void *ptr, fl_err *err)
{
    if (!ptr)
        return FL_CUDA_OK;
    FL_CALL_ON(device, "cudaFree", Free(ptr));
}

/* ---- streams and events ------------------------------------------------- */

int
fl_cuda_stream_create(int device, fl_cudaStream_t *stream, fl_err *err)
{
    FL_CALL_ON_OUT(device, stream, "cudaStreamCreateWithFlags",
                   StreamCreateWithFlags(stream, FL_CUDA_STREAM_NON_BLOCKING), "cudaStreamCreateWithFlags");
}

int
fl_cuda_stream_destroy(int device, fl_cudaStream_t stream, fl_err *err)
{
    if (!stream)
        return FL_CUDA_OK;
    FL_CALL_ON(device, "cudaStreamDestroy", StreamDestroy(stream));
}

int
fl_cuda_stream_synchronize(int device, fl_cudaStream_t stream, fl_err *err)
{
    FL_CALL_ON(device, "cudaStreamSynchronize", StreamSynchronize(stream));
}

int
fl_cuda_stream_wait_event(int device, fl_cudaStream_t stream, fl_cudaEvent_t event, fl_err *err)
{
    FL_CALL_ON(device, "cudaStreamWaitEvent", StreamWaitEvent(stream, event, 0));
}

static int
event_create(int device, unsigned flags, fl_cudaEvent_t *event, fl_err *err)
{
    FL_CALL_ON_OUT(device, event, "cudaEventCreateWithFlags", EventCreateWithFlags(event, flags),
                   "cudaEventCreateWithFlags");
}

int
fl_cuda_event_create(int device, int blocking_sync, fl_cudaEvent_t *event, fl_err *err)
{
    return event_create(device,
                        FL_CUDA_EVENT_DISABLE_TIMING | (blocking_sync ? FL_CUDA_EVENT_BLOCKING_SYNC : 0u),
                        event, err);
}

int
fl_cuda_event_create_timed(int device, fl_cudaEvent_t *event, fl_err *err)
{
    /* blocking sync: a host waiting on it sleeps instead of spinning a core */
    return event_create(device, FL_CUDA_EVENT_BLOCKING_SYNC, event, err);
}

int
fl_cuda_event_elapsed_ms(int device, float *ms, fl_cudaEvent_t start, fl_cudaEvent_t end, fl_err *err)
{
    *ms = 0.0f;
    FL_CALL_ON(device, "cudaEventElapsedTime", EventElapsedTime(ms, start, end));
}

int
fl_cuda_event_destroy(int device, fl_cudaEvent_t event, fl_err *err)
{
    if (!event)
        return FL_CUDA_OK;
    FL_CALL_ON(device, "cudaEventDestroy", EventDestroy(event));
}

int
fl_cuda_event_record(int device, fl_cudaEvent_t event, fl_cudaStream_t stream, fl_err *err)
{
    FL_CALL_ON(device, "cudaEventRecord", EventRecord(event, stream));
}

int
fl_cuda_event_query(int device, fl_cudaEvent_t event, fl_err *err)
{
    int prev, rc;
    const fl_cuda_api *api = call_enter(device, "cudaEventQuery", &prev, &rc, err);
    if (!api)
        return rc;
    rc = api->EventQuery(event);
    if (rc != FL_CUDA_ERR_NOT_READY)
        return call_leave(api, device, prev, rc, NULL, err, "cudaEventQuery");
    /* "not ready" is an answer, not an error: do not leave it as the
     * thread's last error for torch to raise later */
    (void)api->GetLastError();
    leave_device(api, device, prev);
    return rc;
}

int
fl_cuda_event_synchronize(int device, fl_cudaEvent_t event, fl_err *err)
{
    FL_CALL_ON(device, "cudaEventSynchronize", EventSynchronize(event));
}

/* ---- copies ------------------------------------------------------------- */

static int
memcpy_async(int device, void *dst, const void *src, size_t bytes, int kind,
             fl_cudaStream_t stream, const char *name, fl_err *err)
{
    if (bytes == 0)
        return FL_CUDA_OK;
    FL_CALL_ON_OUT(device, NULL, "cudaMemcpyAsync", MemcpyAsync(dst, src, bytes, kind, stream),
                   "cudaMemcpyAsync(%s, %zu bytes)", name, bytes);
}

int
fl_cuda_memcpy_h2d_async(int device, void *dst_device, const void *src_host, size_t bytes,
                         fl_cudaStream_t stream, fl_err *err)
{
    return memcpy_async(device, dst_device, src_host, bytes, FL_CUDA_MEMCPY_H2D, stream,
                        "host to device", err);
}

int
fl_cuda_memcpy_d2h_async(int device, void *dst_host, const void *src_device, size_t bytes,
                         fl_cudaStream_t stream, fl_err *err)
{
    return memcpy_async(device, dst_host, src_device, bytes, FL_CUDA_MEMCPY_D2H, stream,
                        "device to host", err);
}

/* ---- the core's pinner (core/pin.h) ------------------------------------------ */

/* The host functions already have the pinner's signatures and contract. */
static const fl_pinner cuda_pinner = {fl_cuda_host_alloc, fl_cuda_host_free, fl_cuda_host_register,
                                      fl_cuda_host_unregister};

const fl_pinner *
fl_cuda_pinner(void)
{
    return &cuda_pinner;
}
