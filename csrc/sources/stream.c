/* stream.c: one shard as a pull byte stream (contracts in stream.h).
 *
 * Why one file of ~1,100 lines: the three kinds share the stream object,
 * the sliced wait (cancel, stall clock) and the error wording; http alone is
 * half of it (libcurl's multi interface, pause/resume of the bounded buffer,
 * retries with Range resume and the checks on 206/200 answers), and split
 * out it would need the stream's private struct in a header.
 *
 * Three kinds share one object and one read loop shape: wait in slices of at
 * most 100 ms (poll() for a pipe, curl_multi_poll() for http), checking the
 * cancel flag and the stall clock after each slice.
 *
 * http: the reading thread drives libcurl's multi interface itself.  The
 * write callback appends the body to buf[rpos..wpos) and returns
 * CURL_WRITEFUNC_PAUSE when a chunk does not fit; fl_stream_read copies out
 * and un-pauses once half the buffer is free (or all of it, so a chunk larger
 * than half still gets in: the buffer only grows when a single chunk is
 * larger than the whole buffer).  `pos` counts the body bytes accepted into
 * the buffer, so it is where a resumed attempt starts.  Callbacks never fail
 * the stream themselves: they record a cause (fatal or not) and abort the
 * transfer; the read loop decides, in one place (attempt_finished), whether
 * to retry.
 */
#include "sources/stream.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <dlfcn.h>

#include <curl/curl.h> /* types and constants only: libcurl itself is loaded on first use (below) */

extern char **environ;

#define SLICE_MS 100                /* the longest wait between cancel checks */
#define MIN_BUFFER ((size_t)128 << 10)
#define CURL_CHUNK 65536            /* CURLOPT_BUFFERSIZE: the largest usual write callback */

enum { ST_OPEN = 0, ST_END = 1, ST_FAILED = 2 };

struct fl_stream {
    int kind;                    /* FL_STREAM_* */
    char *url;                   /* as given (owned) */
    char urlmsg[168];            /* shortened, redacted: for messages */
    fl_stream_opts o;            /* a copy; o.cancel is borrowed, o.ca_file points to ca_file */
    char *ca_file;               /* owned copy of the option, or NULL */
    int state;                   /* ST_*: once not ST_OPEN, reads repeat the outcome... */
    fl_err final;                /* ...this error, for ST_FAILED */

    /* counters (atomics: fl_stream_get_stats may run on another thread) */
    _Atomic uint64_t bytes, wait_ns, retries, range_resumes, skipped;

    /* file and pipe */
    int fd;                      /* -1 when closed */
    pid_t pid;                   /* pipe: the shell, 0 once reaped */

    /* http */
    CURLM *multi;
    CURL *easy;
    uint8_t *buf;                /* body bytes not yet read: buf[rpos..wpos) */
    size_t cap, rpos, wpos;
    int paused;                  /* the write callback returned CURL_WRITEFUNC_PAUSE */
    int active;                  /* easy is in multi (an attempt is running) */
    int finishing;               /* ST_END or ST_FAILED is decided; deliver buf first */
    uint64_t pos;                /* body bytes accepted so far: the next attempt's Range start */
    int64_t total;               /* the body's size once a server said it, else -1 */
    char etag[128];              /* the first response's ETag ("" if none) */
    int fails;                   /* retryable failures in a row without progress */
    uint64_t next_attempt_ns;    /* back-off: no attempt before this time */
    uint64_t last_activity_ns;   /* the stall clock: last byte (header or body), or un-pause */
    char cause[200];             /* why the last attempt failed */
    int cause_fatal;             /* set by a callback: the failure is not retryable */
    int cause_code;              /* FL_ERR_* of a fatal cause */

    /* the current attempt */
    uint64_t attempt_pos;        /* pos when it started */
    char range[48];
    int status;                  /* status code of the last status line */
    int validated;               /* the final response's headers have been checked */
    uint64_t skip;               /* body bytes still to drop (a 200 answer to a Range request) */
    int64_t clen;                /* Content-Length of the last response, -1 if none */
    int64_t cr_start, cr_total;  /* Content-Range of the last response (-1: none / '*') */
    int have_cr;
    char a_etag[128];            /* ETag of the last response */
    char errbuf[CURL_ERROR_SIZE];
};

/* ------------------------------------------------------------------------ */
/* small helpers */

static uint64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void
sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void
add(_Atomic uint64_t *c, uint64_t v)
{
    atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

static int
cancelled(const fl_stream *s)
{
    return s->o.cancel != NULL && atomic_load_explicit(s->o.cancel, memory_order_relaxed) != 0;
}

/* Fill err: code, errnum and "<url>: <formatted reason>".  Returns -1. */
static int
fail_msg(const fl_stream *s, fl_err *err, int code, int errnum, const char *fmt, ...)
{
    char why[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    err->code = code;
    err->errnum = errnum;
    /* under 300 characters: the URL is at most 160 */
    snprintf(err->msg, sizeof err->msg, "%s: %.*s", s->urlmsg, (int)(297 - strlen(s->urlmsg)), why);
    return -1;
}

/* Make the stream fail for good with *err (later reads repeat it). */
static long long
fail_final(fl_stream *s, const fl_err *err)
{
    s->state = ST_FAILED;
    s->final = *err;
    return -1;
}

static long long
cancel_error(fl_stream *s, fl_err *err)
{
    fail_msg(s, err, FL_ERR_IO, ECANCELED, "cancelled");
    return fail_final(s, err);
}

void
fl_stream_opts_init(fl_stream_opts *o)
{
    memset(o, 0, sizeof *o);
    o->retries = 5;
    o->backoff_ms = 200;
    o->backoff_max_ms = 10000;
    o->stall_timeout_ms = 30000;
    o->connect_timeout_ms = 30000;
    o->buffer_bytes = (size_t)1 << 20;
    o->cancel = NULL;
}

/* ------------------------------------------------------------------------ */
/* URLs in messages */

static int
starts_with_ci(const char *s, const char *prefix)
{
    return strncasecmp(s, prefix, strlen(prefix)) == 0;
}

void
fl_stream_url_for_message(const char *url, char *out, size_t cap)
{
    if (cap == 0)
        return;
    size_t n = strlen(url);
    char *red = malloc(n + 8);
    if (red == NULL) {
        snprintf(out, cap, "<url>");
        return;
    }
    if (starts_with_ci(url, "http://") || starts_with_ci(url, "https://")) {
        /* drop user:password@ of the authority, and the query (a presigned
         * URL's signature); the fragment goes with it */
        const char *auth = strstr(url, "//") + 2;
        const char *auth_end = auth + strcspn(auth, "/?#");
        const char *at = memchr(auth, '@', (size_t)(auth_end - auth));
        size_t k = 0;
        memcpy(red, url, (size_t)(auth - url));
        k = (size_t)(auth - url);
        if (at != NULL) {
            memcpy(red + k, "...@", 4);
            k += 4;
            auth = at + 1;
        }
        size_t rest = strcspn(auth, "?#");
        memcpy(red + k, auth, rest);
        k += rest;
        if (auth[rest] != '\0') {
            memcpy(red + k, "?...", 4);
            k += 4;
        }
        red[k] = '\0';
    } else {
        memcpy(red, url, n + 1);
    }
    /* at most 160 characters: the head (scheme, host) and the tail (the
     * shard's name) are what a reader needs */
    size_t len = strlen(red), lim = cap - 1 < 160 ? cap - 1 : 160;
    if (len <= lim) {
        memcpy(out, red, len + 1);
    } else {
        size_t head = (lim - 3) * 2 / 5, tail = lim - 3 - head;
        memcpy(out, red, head);
        memcpy(out + head, "...", 3);
        memcpy(out + head + 3, red + len - tail, tail);
        out[lim] = '\0';
    }
    free(red);
}

/* ------------------------------------------------------------------------ */
/* files */

static const char *
file_kind(mode_t m)
{
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket"
           : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device" : "not a regular file";
}

static int
file_open(fl_stream *s, const char *path, fl_err *err)
{
    s->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (s->fd < 0)
        return fail_msg(s, err, FL_ERR_IO, errno, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(s->fd, &st) != 0)
        return fail_msg(s, err, FL_ERR_IO, errno, "cannot stat: %s", strerror(errno));
    if (!S_ISREG(st.st_mode))
        return fail_msg(s, err, FL_ERR_IO, S_ISDIR(st.st_mode) ? EISDIR : 0, "%s, not a regular file",
                        file_kind(st.st_mode));
    return 0;
}

static long long
file_read(fl_stream *s, void *buf, size_t n, fl_err *err)
{
    for (;;) {
        if (cancelled(s))
            return cancel_error(s, err);
        uint64_t t0 = now_ns();
        ssize_t r = read(s->fd, buf, n);
        add(&s->wait_ns, now_ns() - t0);
        if (r > 0)
            return r;
        if (r == 0) {
            s->state = ST_END;
            return 0;
        }
        if (errno == EINTR)
            continue;
        fail_msg(s, err, FL_ERR_IO, errno, "read failed: %s", strerror(errno));
        return fail_final(s, err);
    }
}

/* ------------------------------------------------------------------------ */
/* pipe:COMMAND */

static const char *
signal_name(int sig)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
    const char *a = sigabbrev_np(sig);
    return a != NULL ? a : "?";
#else
    (void)sig;
    return "?";
#endif
}

static int
pipe_open(fl_stream *s, const char *cmd, fl_err *err)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return fail_msg(s, err, FL_ERR_IO, errno, "cannot create a pipe: %s", strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    int rc = posix_spawn_file_actions_init(&fa);
    if (rc != 0) {
        close(p[0]);
        close(p[1]);
        return fail_msg(s, err, FL_ERR_NOMEM, 0, "cannot start the command: %s", strerror(rc));
    }
    rc = posix_spawnattr_init(&at);
    if (rc != 0) {
        posix_spawn_file_actions_destroy(&fa);
        close(p[0]);
        close(p[1]);
        return fail_msg(s, err, FL_ERR_NOMEM, 0, "cannot start the command: %s", strerror(rc));
    }
    /* stdin from /dev/null (a loader's worker has no input to give), stdout
     * the pipe, stderr inherited so that the command's complaints are seen;
     * every other fd closed (ours are O_CLOEXEC; this covers the ones other
     * code in the process opened without it) */
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    /* Python ignores SIGPIPE and SIGXFSZ; an ignored signal stays ignored
     * across exec, so restore them as subprocess does */
    sigaddset(&defaults, SIGPIPE);
    sigaddset(&defaults, SIGXFSZ);
    if ((rc = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0)) == 0 &&
        (rc = posix_spawn_file_actions_adddup2(&fa, p[1], 1)) == 0 &&
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
        (rc = posix_spawn_file_actions_addclosefrom_np(&fa, 3)) == 0 &&
#endif
        /* its own process group, so that close can kill a whole pipeline */
        (rc = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                                POSIX_SPAWN_SETSIGDEF)) == 0 &&
        (rc = posix_spawnattr_setpgroup(&at, 0)) == 0 && (rc = posix_spawnattr_setsigmask(&at, &none)) == 0 &&
        (rc = posix_spawnattr_setsigdefault(&at, &defaults)) == 0) {
        char *argv[] = {"sh", "-c", (char *)cmd, NULL};
        rc = posix_spawn(&s->pid, "/bin/sh", &fa, &at, argv, environ);
    }
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    close(p[1]);
    if (rc != 0) {
        s->pid = 0;
        close(p[0]);
        return fail_msg(s, err, FL_ERR_IO, rc, "cannot start /bin/sh: %s", strerror(rc));
    }
    s->fd = p[0];
    return 0;
}

/* The command's output ended: reap it (waiting in slices, cancellable) and
 * turn its status into the stream's end or error. */
static long long
pipe_finish(fl_stream *s, fl_err *err)
{
    uint64_t t0 = now_ns(), slice = 1000000; /* 1 ms, doubling to SLICE_MS */
    int status = 0;
    for (;;) {
        pid_t r = waitpid(s->pid, &status, WNOHANG);
        if (r == s->pid)
            break;
        if (r < 0 && errno != EINTR) {
            s->pid = 0;
            fail_msg(s, err, FL_ERR_IO, errno, "cannot wait for the command: %s", strerror(errno));
            return fail_final(s, err);
        }
        if (cancelled(s)) {
            add(&s->wait_ns, now_ns() - t0);
            return cancel_error(s, err);
        }
        if (s->o.stall_timeout_ms > 0 && now_ns() - t0 > (uint64_t)s->o.stall_timeout_ms * 1000000u) {
            add(&s->wait_ns, now_ns() - t0);
            fail_msg(s, err, FL_ERR_IO, 0, "the command closed its output but did not exit within %d ms",
                     s->o.stall_timeout_ms);
            return fail_final(s, err);
        }
        sleep_ns(slice);
        if (slice < (uint64_t)SLICE_MS * 1000000u / 2)
            slice *= 2;
    }
    add(&s->wait_ns, now_ns() - t0);
    s->pid = 0;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        s->state = ST_END;
        return 0;
    }
    if (WIFEXITED(status))
        fail_msg(s, err, FL_ERR_IO, 0, "the command failed with exit status %d", WEXITSTATUS(status));
    else
        fail_msg(s, err, FL_ERR_IO, 0, "the command was killed by signal %d (SIG%s)", WTERMSIG(status),
                 signal_name(WTERMSIG(status)));
    return fail_final(s, err);
}

static long long
pipe_read(fl_stream *s, void *buf, size_t n, fl_err *err)
{
    uint64_t t0 = now_ns();
    for (;;) {
        if (cancelled(s)) {
            add(&s->wait_ns, now_ns() - t0);
            return cancel_error(s, err);
        }
        struct pollfd pfd = {s->fd, POLLIN, 0};
        int pr = poll(&pfd, 1, SLICE_MS);
        if (pr < 0 && errno != EINTR) {
            add(&s->wait_ns, now_ns() - t0);
            fail_msg(s, err, FL_ERR_IO, errno, "poll failed: %s", strerror(errno));
            return fail_final(s, err);
        }
        if (pr > 0) {
            ssize_t r = read(s->fd, buf, n);
            if (r > 0) {
                add(&s->wait_ns, now_ns() - t0);
                return r;
            }
            if (r == 0) {
                add(&s->wait_ns, now_ns() - t0);
                close(s->fd);
                s->fd = -1;
                return pipe_finish(s, err);
            }
            if (errno != EINTR && errno != EAGAIN) {
                add(&s->wait_ns, now_ns() - t0);
                fail_msg(s, err, FL_ERR_IO, errno, "read failed: %s", strerror(errno));
                return fail_final(s, err);
            }
        }
        if (s->o.stall_timeout_ms > 0 && now_ns() - t0 > (uint64_t)s->o.stall_timeout_ms * 1000000u) {
            add(&s->wait_ns, now_ns() - t0);
            fail_msg(s, err, FL_ERR_IO, 0, "the command wrote nothing for %d ms (stalled)", s->o.stall_timeout_ms);
            return fail_final(s, err);
        }
    }
}

static void
pipe_close(fl_stream *s)
{
    if (s->pid > 0) {
        /* the shell leads its own group: kill the whole pipeline */
        kill(-s->pid, SIGKILL);
        kill(s->pid, SIGKILL);
    }
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    if (s->pid > 0) {
        while (waitpid(s->pid, NULL, 0) < 0 && errno == EINTR) {
        }
        s->pid = 0;
    }
}

/* ------------------------------------------------------------------------ */
/* http(s) */

/* libcurl, loaded with dlopen by the first http(s) stream of the process:
 * a process that never reads over http does not map libcurl and the
 * TLS / Kerberos / LDAP libraries it links (~0.6 MiB of relocated data in
 * every process that imports fastloader, when it was linked).  The table is
 * written once, under pthread_once, and only read afterwards. */
typedef struct {
    CURLcode (*global_init)(long flags);
    const char *(*easy_strerror)(CURLcode rc);
    const char *(*multi_strerror)(CURLMcode rc);
    CURLM *(*multi_init)(void);
    CURL *(*easy_init)(void);
    CURLcode (*easy_setopt)(CURL *e, CURLoption opt, ...);
    CURLcode (*easy_getinfo)(CURL *e, CURLINFO info, ...);
    CURLcode (*easy_pause)(CURL *e, int bitmask);
    void (*easy_cleanup)(CURL *e);
    CURLMcode (*multi_add_handle)(CURLM *m, CURL *e);
    CURLMcode (*multi_remove_handle)(CURLM *m, CURL *e);
    CURLMsg *(*multi_info_read)(CURLM *m, int *left);
    CURLMcode (*multi_perform)(CURLM *m, int *running);
    CURLMcode (*multi_poll)(CURLM *m, struct curl_waitfd extra[], unsigned int n, int timeout_ms, int *ret);
    CURLMcode (*multi_cleanup)(CURLM *m);
} curl_api;

_Static_assert(sizeof(void *) == sizeof(void (*)(void)), "function pointers must fit in void *");

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static curl_api lc;                 /* valid when curl_load_error is "" */
static char curl_load_error[200] = "libcurl was not loaded";
static CURLcode curl_init_rc = CURLE_FAILED_INIT;

/* The entry points of `h` into lc.  NULL, or the first missing symbol. */
static const char *
curl_resolve(void *h)
{
#define FL_CURL_SYM(field, name)                \
    do {                                        \
        void *s_ = dlsym(h, name);              \
        if (!s_)                                \
            return name;                        \
        memcpy(&lc.field, &s_, sizeof s_);      \
    } while (0)
    FL_CURL_SYM(global_init, "curl_global_init");
    FL_CURL_SYM(easy_strerror, "curl_easy_strerror");
    FL_CURL_SYM(multi_strerror, "curl_multi_strerror");
    FL_CURL_SYM(multi_init, "curl_multi_init");
    FL_CURL_SYM(easy_init, "curl_easy_init");
    FL_CURL_SYM(easy_setopt, "curl_easy_setopt");
    FL_CURL_SYM(easy_getinfo, "curl_easy_getinfo");
    FL_CURL_SYM(easy_pause, "curl_easy_pause");
    FL_CURL_SYM(easy_cleanup, "curl_easy_cleanup");
    FL_CURL_SYM(multi_add_handle, "curl_multi_add_handle");
    FL_CURL_SYM(multi_remove_handle, "curl_multi_remove_handle");
    FL_CURL_SYM(multi_info_read, "curl_multi_info_read");
    FL_CURL_SYM(multi_perform, "curl_multi_perform");
    FL_CURL_SYM(multi_poll, "curl_multi_poll");
    FL_CURL_SYM(multi_cleanup, "curl_multi_cleanup");
#undef FL_CURL_SYM
    return NULL;
}

/* Once per process (pthread_once): load libcurl (its soname, then the
 * unversioned name), resolve it and run curl_global_init.  On failure
 * curl_load_error says why; the handle stays open for the process's life. */
static void
curl_init_once(void)
{
    const char *names[] = {"libcurl.so.4", "libcurl.so"};
    void *h = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !h; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        snprintf(curl_load_error, sizeof curl_load_error,
                 "cannot load libcurl (libcurl.so.4, from libcurl4 / libcurl4-openssl-dev): %.120s",
                 why ? why : "not found");
        return;
    }
    const char *missing = curl_resolve(h);
    if (missing) {
        snprintf(curl_load_error, sizeof curl_load_error, "the libcurl found lacks %s (too old)", missing);
        return;
    }
    curl_load_error[0] = '\0';
    curl_init_rc = lc.global_init(CURL_GLOBAL_DEFAULT);
}

/* Parse a decimal number at *p (after spaces); -1 if none. */
static int64_t
parse_num(const char **p, const char *end)
{
    const char *q = *p;
    while (q < end && (*q == ' ' || *q == '\t'))
        q++;
    if (q >= end || !isdigit((unsigned char)*q))
        return -1;
    int64_t v = 0;
    while (q < end && isdigit((unsigned char)*q)) {
        if (v > (INT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (*q - '0');
        q++;
    }
    *p = q;
    return v;
}

/* The value of header line [p, end) if its name is `name` (case-insensitive),
 * trimmed; NULL otherwise. */
static const char *
header_value(const char *p, const char *end, const char *name, const char **vend)
{
    size_t k = strlen(name);
    if ((size_t)(end - p) <= k || strncasecmp(p, name, k) != 0 || p[k] != ':')
        return NULL;
    const char *v = p + k + 1;
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    const char *e = end;
    while (e > v && (e[-1] == '\r' || e[-1] == '\n' || e[-1] == ' ' || e[-1] == '\t'))
        e--;
    *vend = e;
    return v;
}

static size_t
on_header(char *data, size_t size, size_t nmemb, void *ud)
{
    fl_stream *s = ud;
    size_t n = size * nmemb;
    const char *p = data, *end = data + n, *v, *ve;
    s->last_activity_ns = now_ns();
    if (n >= 5 && strncmp(p, "HTTP/", 5) == 0) {
        /* a new response (a redirect, a 100 Continue, or the final one) */
        const char *q = memchr(p, ' ', n);
        s->status = 0;
        if (q != NULL) {
            int64_t c = parse_num(&q, end);
            s->status = c > 0 && c < 1000 ? (int)c : 0;
        }
        s->clen = -1;
        s->have_cr = 0;
        s->cr_start = s->cr_total = -1;
        s->a_etag[0] = '\0';
    } else if ((v = header_value(p, end, "content-length", &ve)) != NULL) {
        const char *q = v;
        s->clen = parse_num(&q, ve);
    } else if ((v = header_value(p, end, "content-range", &ve)) != NULL) {
        /* "bytes START-END/TOTAL", TOTAL may be '*' */
        const char *q = v;
        s->have_cr = 1;
        s->cr_start = s->cr_total = -1;
        if ((size_t)(ve - q) > 6 && strncasecmp(q, "bytes ", 6) == 0) {
            q += 6;
            s->cr_start = parse_num(&q, ve);
            const char *slash = memchr(q, '/', (size_t)(ve - q));
            if (slash != NULL) {
                q = slash + 1;
                s->cr_total = parse_num(&q, ve);
            }
        }
    } else if ((v = header_value(p, end, "etag", &ve)) != NULL) {
        size_t k = (size_t)(ve - v);
        if (k >= sizeof s->a_etag)
            k = sizeof s->a_etag - 1;
        memcpy(s->a_etag, v, k);
        s->a_etag[k] = '\0';
    }
    return n;
}

/* Record a fatal cause (a callback's or the read loop's). */
static void
set_fatal(fl_stream *s, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->cause, sizeof s->cause, fmt, ap);
    va_end(ap);
    s->cause_fatal = 1;
    s->cause_code = code;
}

/* Check the final response of the attempt before its first body byte (or at
 * its end, for an empty body).  Returns 0, or -1 with a fatal cause set. */
static int
validate(fl_stream *s)
{
    s->validated = 1;
    if (s->status == 206) {
        if (!s->have_cr || s->cr_start < 0) {
            set_fatal(s, FL_ERR_IO, "HTTP 206 without a valid Content-Range");
            return -1;
        }
        if ((uint64_t)s->cr_start != s->pos) {
            set_fatal(s, FL_ERR_IO, "asked for bytes from %" PRIu64 ", the server sent from %" PRId64,
                      s->pos, s->cr_start);
            return -1;
        }
        if (s->cr_total >= 0) {
            if (s->total >= 0 && s->cr_total != s->total) {
                set_fatal(s, FL_ERR_IO, "the resource changed size from %" PRId64 " to %" PRId64 " bytes",
                          s->total, s->cr_total);
                return -1;
            }
            s->total = s->cr_total;
        }
        if (s->pos > 0)
            add(&s->range_resumes, 1);
    } else if (s->status == 200) {
        s->skip = s->pos; /* the server ignored Range: drop what we have */
        if (s->clen >= 0) {
            if (s->total >= 0 && s->clen != s->total) {
                set_fatal(s, FL_ERR_IO, "the resource changed size from %" PRId64 " to %" PRId64 " bytes",
                          s->total, s->clen);
                return -1;
            }
            s->total = s->clen;
        }
    } else {
        set_fatal(s, FL_ERR_IO, "unexpected HTTP status %d", s->status);
        return -1;
    }
    if (s->a_etag[0] != '\0') {
        if (s->etag[0] == '\0') {
            memcpy(s->etag, s->a_etag, sizeof s->etag);
        } else if (strcmp(s->etag, s->a_etag) != 0) {
            set_fatal(s, FL_ERR_IO, "the resource changed while read (ETag %.40s, then %.40s)", s->etag,
                      s->a_etag);
            return -1;
        }
    }
    return 0;
}

static size_t
on_body(char *data, size_t size, size_t nmemb, void *ud)
{
    fl_stream *s = ud;
    size_t n = size * nmemb;
    s->last_activity_ns = now_ns();
    if (!s->validated && validate(s) < 0)
        return 0; /* aborts the transfer (CURLE_WRITE_ERROR); the cause is set */
    size_t drop = s->skip < n ? (size_t)s->skip : n;
    size_t m = n - drop;
    if (m > s->cap - s->wpos) {
        if (s->rpos > 0) {
            memmove(s->buf, s->buf + s->rpos, s->wpos - s->rpos);
            s->wpos -= s->rpos;
            s->rpos = 0;
        }
        if (m > s->cap - s->wpos) {
            if (s->wpos > 0) {
                /* full: curl keeps this chunk and hands it over again after
                 * the reader un-pauses (nothing of it was taken, not even
                 * the bytes to drop) */
                s->paused = 1;
                return CURL_WRITEFUNC_PAUSE;
            }
            uint8_t *nb = realloc(s->buf, m); /* one chunk larger than the whole buffer */
            if (nb == NULL) {
                set_fatal(s, FL_ERR_NOMEM, "out of memory for a %zu-byte chunk", m);
                return 0;
            }
            s->buf = nb;
            s->cap = m;
        }
    }
    s->skip -= drop;
    if (drop > 0)
        add(&s->skipped, drop);
    memcpy(s->buf + s->wpos, data + drop, m);
    s->wpos += m;
    s->pos += m;
    return n;
}

static int
http_open(fl_stream *s, fl_err *err)
{
    pthread_once(&curl_once, curl_init_once);
    if (curl_load_error[0])
        return fail_msg(s, err, FL_ERR_RUNTIME, 0, "%s", curl_load_error);
    if (curl_init_rc != CURLE_OK)
        return fail_msg(s, err, FL_ERR_RUNTIME, 0, "libcurl failed to initialise: %s",
                        lc.easy_strerror(curl_init_rc));
    s->cap = s->o.buffer_bytes < MIN_BUFFER ? MIN_BUFFER : s->o.buffer_bytes;
    s->buf = malloc(s->cap);
    s->multi = lc.multi_init();
    s->easy = lc.easy_init();
    if (s->buf == NULL || s->multi == NULL || s->easy == NULL)
        return fail_msg(s, err, FL_ERR_NOMEM, 0, "out of memory starting the transfer");
    s->total = -1;
    CURL *e = s->easy;
    CURLcode rc = CURLE_OK;
#define SETOPT(opt, val)                            \
    do {                                            \
        if (rc == CURLE_OK)                         \
            rc = lc.easy_setopt(e, opt, val);     \
    } while (0)
    SETOPT(CURLOPT_URL, s->url);
    SETOPT(CURLOPT_NOSIGNAL, 1L);      /* threads: no SIGALRM for DNS timeouts */
    SETOPT(CURLOPT_FAILONERROR, 1L);   /* >= 400 ends the transfer with CURLE_HTTP_RETURNED_ERROR */
    SETOPT(CURLOPT_FOLLOWLOCATION, 1L);
    SETOPT(CURLOPT_MAXREDIRS, 10L);
#if LIBCURL_VERSION_NUM >= 0x075500
    SETOPT(CURLOPT_PROTOCOLS_STR, "http,https");
    SETOPT(CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
    SETOPT(CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
    SETOPT(CURLOPT_REDIR_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    SETOPT(CURLOPT_CONNECTTIMEOUT_MS, (long)s->o.connect_timeout_ms);
    SETOPT(CURLOPT_TCP_KEEPALIVE, 1L);
    SETOPT(CURLOPT_BUFFERSIZE, (long)CURL_CHUNK);
    SETOPT(CURLOPT_USERAGENT, "fastloader");
    SETOPT(CURLOPT_ERRORBUFFER, s->errbuf);
    if (s->ca_file != NULL)
        SETOPT(CURLOPT_CAINFO, s->ca_file);
    SETOPT(CURLOPT_HEADERFUNCTION, on_header);
    SETOPT(CURLOPT_HEADERDATA, s);
    SETOPT(CURLOPT_WRITEFUNCTION, on_body);
    SETOPT(CURLOPT_WRITEDATA, s);
#undef SETOPT
    if (rc != CURLE_OK)
        return fail_msg(s, err, rc == CURLE_OUT_OF_MEMORY ? FL_ERR_NOMEM : FL_ERR_INVALID, 0,
                        "cannot set up the transfer: %s", lc.easy_strerror(rc));
    return 0;
}

/* Start an attempt at s->pos.  0, or -1 with err filled (final). */
static int
start_attempt(fl_stream *s, fl_err *err)
{
    s->attempt_pos = s->pos;
    s->status = 0;
    s->validated = 0;
    s->skip = 0;
    s->clen = -1;
    s->have_cr = 0;
    s->cr_start = s->cr_total = -1;
    s->a_etag[0] = '\0';
    s->errbuf[0] = '\0';
    s->cause[0] = '\0';
    s->cause_fatal = 0;
    s->paused = 0;
    CURLcode rc;
    if (s->pos > 0) {
        snprintf(s->range, sizeof s->range, "%" PRIu64 "-", s->pos);
        rc = lc.easy_setopt(s->easy, CURLOPT_RANGE, s->range);
    } else {
        rc = lc.easy_setopt(s->easy, CURLOPT_RANGE, (char *)NULL);
    }
    CURLMcode mc = rc == CURLE_OK ? lc.multi_add_handle(s->multi, s->easy) : CURLM_OK;
    if (rc != CURLE_OK || mc != CURLM_OK) {
        fail_msg(s, err, FL_ERR_RUNTIME, 0, "cannot start the transfer: %s",
                 rc != CURLE_OK ? lc.easy_strerror(rc) : lc.multi_strerror(mc));
        return (int)fail_final(s, err);
    }
    s->active = 1;
    s->last_activity_ns = now_ns();
    return 0;
}

static void
stop_attempt(fl_stream *s)
{
    if (s->active) {
        lc.multi_remove_handle(s->multi, s->easy);
        s->active = 0;
    }
    s->paused = 0;
}

static int
retryable_curl(CURLcode rc)
{
    switch (rc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
#if LIBCURL_VERSION_NUM >= 0x074a00
    case CURLE_HTTP3:
#endif
        return 1;
    default:
        return 0;
    }
}

/* The attempt ended (curl's result rc, or our stall abort with a cause
 * already set: rc = CURLE_OPERATION_TIMEDOUT).  Decide: the end, a retry
 * after a back-off, or the final error.  Returns 0 (decided without
 * failing: end or retry scheduled) or -1 (final error decided; it is
 * reported once the buffer is drained). */
static int
attempt_finished(fl_stream *s, CURLcode rc, int stalled)
{
    stop_attempt(s);
    int retry = 0;
    if (s->cause_fatal) {
        /* set by a callback (bad Content-Range, changed resource, no memory) */
    } else if (stalled) {
        retry = 1;
    } else if (rc == CURLE_OK) {
        if (!s->validated && validate(s) < 0) {
            /* cause set */
        } else if (s->skip > 0) {
            set_fatal(s, FL_ERR_IO, "the resource shrank below %" PRIu64 " bytes", s->pos);
        } else if (s->total >= 0 && s->pos < (uint64_t)s->total) {
            snprintf(s->cause, sizeof s->cause, "connection closed after %" PRIu64 " of %" PRId64 " bytes",
                     s->pos, s->total);
            retry = 1;
        } else {
            s->finishing = ST_END;
            return 0;
        }
    } else if (rc == CURLE_HTTP_RETURNED_ERROR) {
        long code = 0;
        lc.easy_getinfo(s->easy, CURLINFO_RESPONSE_CODE, &code);
        snprintf(s->cause, sizeof s->cause, "HTTP %ld", code);
        retry = code >= 500 || code == 408 || code == 429;
        if (!retry) {
            s->cause_fatal = 1;
            s->cause_code = FL_ERR_IO;
        }
    } else {
        snprintf(s->cause, sizeof s->cause, "%s%s%.150s", lc.easy_strerror(rc), s->errbuf[0] ? ": " : "",
                 s->errbuf);
        retry = retryable_curl(rc);
        if (!retry) {
            s->cause_fatal = 1;
            s->cause_code = rc == CURLE_URL_MALFORMAT || rc == CURLE_UNSUPPORTED_PROTOCOL ? FL_ERR_INVALID
                            : rc == CURLE_OUT_OF_MEMORY                                   ? FL_ERR_NOMEM
                                                                                          : FL_ERR_IO;
        }
    }
    if (retry) {
        s->fails = s->pos > s->attempt_pos ? 1 : s->fails + 1;
        if (s->fails <= s->o.retries) {
            uint64_t d = (uint64_t)(s->o.backoff_ms > 0 ? s->o.backoff_ms : 0);
            for (int k = 1; k < s->fails && d < (uint64_t)s->o.backoff_max_ms; k++)
                d *= 2;
            if (d > (uint64_t)s->o.backoff_max_ms)
                d = (uint64_t)s->o.backoff_max_ms;
            /* scaled by [0.5, 1]: readers that failed together retry apart */
            uint64_t h = (uint64_t)(uintptr_t)s * 0x9E3779B97F4A7C15u + (uint64_t)s->fails * 0xBF58476D1CE4E5B9u;
            h ^= h >> 31;
            d = d / 2 + (d / 2) * (h % 1024) / 1023;
            s->next_attempt_ns = now_ns() + d * 1000000u;
            add(&s->retries, 1);
            return 0;
        }
    }
    /* the final error: remembered, reported once the buffer is drained */
    s->finishing = ST_FAILED;
    if (s->cause_fatal && !retry)
        fail_msg(s, &s->final, s->cause_code, 0, "%s at byte %" PRIu64, s->cause, s->pos);
    else
        fail_msg(s, &s->final, FL_ERR_IO, 0, "gave up at byte %" PRIu64 " after %d failed attempt%s in a row: %s",
                 s->pos, s->fails, s->fails == 1 ? "" : "s", s->cause);
    return -1;
}

/* Collect finished transfers from the multi handle. */
static void
drain_messages(fl_stream *s)
{
    CURLMsg *msg;
    int left;
    while ((msg = lc.multi_info_read(s->multi, &left)) != NULL) {
        if (msg->msg == CURLMSG_DONE && msg->easy_handle == s->easy && s->active)
            attempt_finished(s, msg->data.result, 0);
    }
}

static long long
http_read(fl_stream *s, void *out, size_t n, fl_err *err)
{
    uint64_t t0 = 0;
    for (;;) {
        size_t avail = s->wpos - s->rpos;
        if (avail > 0) {
            if (t0)
                add(&s->wait_ns, now_ns() - t0);
            size_t m = n < avail ? n : avail;
            memcpy(out, s->buf + s->rpos, m);
            s->rpos += m;
            if (s->rpos == s->wpos)
                s->rpos = s->wpos = 0;
            if (s->paused && (s->wpos - s->rpos) <= s->cap / 2) {
                /* may call on_body at once, which may pause again */
                s->paused = 0;
                s->last_activity_ns = now_ns();
                lc.easy_pause(s->easy, CURLPAUSE_CONT);
            }
            return (long long)m;
        }
        if (t0 == 0)
            t0 = now_ns();
        if (s->finishing == ST_END) {
            add(&s->wait_ns, now_ns() - t0);
            s->state = ST_END;
            return 0;
        }
        if (s->finishing == ST_FAILED) {
            add(&s->wait_ns, now_ns() - t0);
            *err = s->final;
            return fail_final(s, err);
        }
        if (cancelled(s)) {
            add(&s->wait_ns, now_ns() - t0);
            stop_attempt(s);
            return cancel_error(s, err);
        }
        if (s->paused) {
            /* cannot happen (reads un-pause before the buffer empties), but
             * an empty buffer must never wait on a paused transfer */
            s->paused = 0;
            s->last_activity_ns = now_ns();
            lc.easy_pause(s->easy, CURLPAUSE_CONT);
            continue;
        }
        uint64_t now = now_ns();
        if (!s->active) {
            if (now < s->next_attempt_ns) {
                uint64_t d = s->next_attempt_ns - now;
                sleep_ns(d < (uint64_t)SLICE_MS * 1000000u ? d : (uint64_t)SLICE_MS * 1000000u);
                continue;
            }
            if (start_attempt(s, err) < 0) {
                add(&s->wait_ns, now_ns() - t0);
                return -1;
            }
        }
        int running = 0;
        CURLMcode mc = lc.multi_perform(s->multi, &running);
        if (mc != CURLM_OK) {
            stop_attempt(s);
            add(&s->wait_ns, now_ns() - t0);
            fail_msg(s, err, FL_ERR_RUNTIME, 0, "libcurl failed: %s", lc.multi_strerror(mc));
            return fail_final(s, err);
        }
        drain_messages(s);
        if (s->wpos > s->rpos || s->finishing || !s->active)
            continue;
        now = now_ns();
        if (!s->paused && s->o.stall_timeout_ms > 0 &&
            now - s->last_activity_ns > (uint64_t)s->o.stall_timeout_ms * 1000000u) {
            snprintf(s->cause, sizeof s->cause, "no data for %d ms (stalled)", s->o.stall_timeout_ms);
            attempt_finished(s, CURLE_OPERATION_TIMEDOUT, 1);
            continue;
        }
        int wait_ms = SLICE_MS;
        if (!s->paused && s->o.stall_timeout_ms > 0) {
            uint64_t left = s->last_activity_ns + (uint64_t)s->o.stall_timeout_ms * 1000000u - now;
            if (left / 1000000u + 1 < (uint64_t)wait_ms)
                wait_ms = (int)(left / 1000000u) + 1;
        }
        lc.multi_poll(s->multi, NULL, 0, wait_ms, NULL);
    }
}

static void
http_close(fl_stream *s)
{
    if (s->multi != NULL && s->easy != NULL && s->active)
        lc.multi_remove_handle(s->multi, s->easy);
    if (s->easy != NULL)
        lc.easy_cleanup(s->easy);
    if (s->multi != NULL)
        lc.multi_cleanup(s->multi);
    free(s->buf);
}

/* ------------------------------------------------------------------------ */
/* the public face */

static int
hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The path of a file:// URL as webdataset's gopen finds it
 * (url2pathname(urlparse(url).path)): the authority dropped, the query and
 * fragment dropped, %XX decoded.  A new string, or NULL when out of memory. */
static char *
file_url_path(const char *url)
{
    const char *p = url + 5; /* after "file:" */
    if (p[0] == '/' && p[1] == '/')
        p += 2 + strcspn(p + 2, "/?#");
    size_t n = strcspn(p, "?#");
    char *out = malloc(n + 1), *o = out;
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        int hi, lo;
        if (p[i] == '%' && i + 2 < n && (hi = hexval(p[i + 1])) >= 0 && (lo = hexval(p[i + 2])) >= 0) {
            *o++ = (char)(hi * 16 + lo);
            i += 2;
        } else {
            *o++ = p[i];
        }
    }
    *o = '\0';
    return out;
}

/* The URL's scheme if it has one ("s3" for "s3://b/k"), else "". */
static void
url_scheme(const char *url, char *out, size_t cap)
{
    size_t i = 0;
    out[0] = '\0';
    if (!isalpha((unsigned char)url[0]))
        return;
    while (isalnum((unsigned char)url[i]) || url[i] == '+' || url[i] == '-' || url[i] == '.')
        i++;
    /* "file:" needs no "//" (file:/a/b) */
    int file = i == 4 && strncasecmp(url, "file", 4) == 0 && url[4] == ':';
    if ((!file && strncmp(url + i, "://", 3) != 0) || i >= cap)
        return;
    memcpy(out, url, i);
    out[i] = '\0';
}

fl_stream *
fl_stream_open(const char *url, const fl_stream_opts *o, fl_err *err)
{
    fl_stream *s = calloc(1, sizeof *s);
    if (s == NULL || (s->url = strdup(url)) == NULL) {
        free(s);
        err->code = FL_ERR_NOMEM;
        err->errnum = 0;
        snprintf(err->msg, sizeof err->msg, "out of memory opening a stream");
        return NULL;
    }
    s->fd = -1;
    if (o != NULL)
        s->o = *o;
    else
        fl_stream_opts_init(&s->o);
    if (s->o.ca_file != NULL && (s->ca_file = strdup(s->o.ca_file)) == NULL) {
        free(s->url);
        free(s);
        err->code = FL_ERR_NOMEM;
        err->errnum = 0;
        snprintf(err->msg, sizeof err->msg, "out of memory opening a stream");
        return NULL;
    }
    s->o.ca_file = s->ca_file;
    fl_stream_url_for_message(url, s->urlmsg, sizeof s->urlmsg);
    int rc;
    char scheme[16];
    url_scheme(url, scheme, sizeof scheme);
    if (s->o.retries < 0 || s->o.backoff_ms < 0 || s->o.backoff_max_ms < 0 || s->o.stall_timeout_ms < 0 ||
        s->o.connect_timeout_ms < 0) {
        rc = fail_msg(s, err, FL_ERR_INVALID, 0, "negative stream option");
    } else if (url[0] == '\0') {
        rc = fail_msg(s, err, FL_ERR_INVALID, 0, "empty URL");
    } else if (strncmp(url, "pipe:", 5) == 0) {
        s->kind = FL_STREAM_PIPE;
        rc = url[5] == '\0' ? fail_msg(s, err, FL_ERR_INVALID, 0, "empty pipe: command") : pipe_open(s, url + 5, err);
    } else if (strcasecmp(scheme, "http") == 0 || strcasecmp(scheme, "https") == 0) {
        s->kind = FL_STREAM_HTTP;
        rc = http_open(s, err);
    } else if (strcasecmp(scheme, "file") == 0) {
        s->kind = FL_STREAM_FILE;
        char *path = file_url_path(url);
        rc = path == NULL ? fail_msg(s, err, FL_ERR_NOMEM, 0, "out of memory") : file_open(s, path, err);
        free(path);
    } else if (scheme[0] != '\0') {
        rc = fail_msg(s, err, FL_ERR_INVALID, 0,
                      "unsupported URL scheme '%s' (use a local path, http(s):// or pipe:COMMAND, "
                      "for example pipe:aws s3 cp URL -)", scheme);
    } else {
        s->kind = FL_STREAM_FILE;
        rc = file_open(s, url, err);
    }
    if (rc < 0) {
        fl_stream_close(s);
        return NULL;
    }
    return s;
}

long long
fl_stream_read(fl_stream *s, void *buf, size_t n, fl_err *err)
{
    if (s->state == ST_END)
        return 0;
    if (s->state == ST_FAILED) {
        *err = s->final;
        return -1;
    }
    if (n == 0) {
        fail_msg(s, err, FL_ERR_INVALID, 0, "read of 0 bytes");
        return -1;
    }
    if (n > ((size_t)1 << 30))
        n = (size_t)1 << 30;
    long long r = s->kind == FL_STREAM_FILE ? file_read(s, buf, n, err)
                  : s->kind == FL_STREAM_PIPE ? pipe_read(s, buf, n, err)
                                              : http_read(s, buf, n, err);
    if (r > 0)
        add(&s->bytes, (uint64_t)r);
    return r;
}

void
fl_stream_get_stats(const fl_stream *s, fl_stream_stats *out)
{
    fl_stream *m = (fl_stream *)s; /* atomics: loads do not modify */
    out->bytes = atomic_load_explicit(&m->bytes, memory_order_relaxed);
    out->wait_ns = atomic_load_explicit(&m->wait_ns, memory_order_relaxed);
    out->retries = atomic_load_explicit(&m->retries, memory_order_relaxed);
    out->range_resumes = atomic_load_explicit(&m->range_resumes, memory_order_relaxed);
    out->skipped_bytes = atomic_load_explicit(&m->skipped, memory_order_relaxed);
}

int
fl_stream_kind(const fl_stream *s)
{
    return s->kind;
}

const char *
fl_stream_url(const fl_stream *s)
{
    return s->url;
}

void
fl_stream_close(fl_stream *s)
{
    if (s == NULL)
        return;
    if (s->kind == FL_STREAM_PIPE)
        pipe_close(s);
    else if (s->fd >= 0)
        close(s->fd);
    if (s->kind == FL_STREAM_HTTP)
        http_close(s);
    free(s->ca_file);
    free(s->url);
    free(s);
}
