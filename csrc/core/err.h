/* err.h: the one error record of the core, and how a function fills it.
 *
 * Every core function that can fail (sources, decoders, plan and render,
 * the engine, the pool and ring, CUDA and the device pool) takes an
 * `fl_err *` and fills it; binding/py_errors.c is the one place that turns
 * the record into a Python exception, so the same failure has the same
 * type whichever path met it.  No CPython API here; any thread, no GIL.
 */
#ifndef FL_ERR_H
#define FL_ERR_H

#include <stdarg.h>
#include <stdio.h>

/* `code` is one of FL_ERR_*, `msg` a NUL-terminated reason without the
 * file name or sample index (the binding adds those), `errnum` the errno
 * of an FL_ERR_IO failure (0 when there is none).  errnum is last so that
 * `{code, "msg"}` initialisers work.  msg holds a CUDA loader's whole list
 * of tried libraries. */
#define FL_ERR_MSG_MAX 1024 /* bytes of msg; records that copy a reason whole use it too */

typedef struct {
    int code;
    char msg[FL_ERR_MSG_MAX];
    int errnum;
} fl_err;

#define FL_ERR_DECODE 1   /* malformed, truncated or unsupported data  -> DecodeError */
#define FL_ERR_NOMEM 2    /* an allocation failed                       -> MemoryError */
#define FL_ERR_LIMIT 3    /* the image exceeds a configured limit       -> DecodeError */
#define FL_ERR_IO 4       /* reading the bytes failed                   -> OSError (subclass by errnum) */
#define FL_ERR_INDEX 5    /* a sample index outside the dataset         -> IndexError */
#define FL_ERR_INVALID 6  /* invalid parameters (plan, region, spec)    -> ValueError */
#define FL_ERR_RUNTIME 7  /* a failure of the runtime (CUDA, threads)   -> RuntimeError */
#define FL_ERR_EXPORT 8   /* memory cannot be exported as asked (DLPack) -> BufferError */

/* An empty record (no error yet) without clearing all of msg: the per-sample
 * paths start one for every sample, and only a failure writes the message. */
static inline void
fl_err_clear(fl_err *err)
{
    err->code = 0;
    err->errnum = 0;
    err->msg[0] = '\0';
}

/* Fill *err (a no-op when err is NULL: a caller that only wants the return
 * code passes NULL).  The message is cut to fit. */
static inline void fl_err_set(fl_err *err, int code, int errnum, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static inline void
fl_err_set(fl_err *err, int code, int errnum, const char *fmt, ...)
{
    if (err == NULL)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    err->code = code;
    err->errnum = errnum;
}

#endif
