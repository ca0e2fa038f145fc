/* stream.h: a pull byte stream over one shard (no Python).
 *
 * fl_stream_open(url) gives the bytes of one shard, read in order with
 * fl_stream_read, whatever the URL names:
 *
 *   PATH, file:URL       a local regular file (read(); a FIFO, socket or
 *                        device is refused without blocking, as source.c
 *                        does).  A file: URL's path is found as webdataset's
 *                        gopen does: authority, query and fragment dropped,
 *                        %XX decoded ("file:///a%20b" is "/a b").
 *   pipe:COMMAND         /bin/sh -c COMMAND (posix_spawn, its own process
 *                        group, stdin from /dev/null, stderr inherited); the
 *                        stream is its stdout.  A non-zero exit status or a
 *                        death by signal is an FL_ERR_IO error, reported by
 *                        the read that would have returned 0 (end).  Closing
 *                        early kills the process group with SIGKILL and reaps
 *                        the shell: no zombie, no leaked fd (O_CLOEXEC on
 *                        ours; the child gets only 0, 1 and 2).
 *   http://, https://    a GET with libcurl (multi interface, driven by the
 *                        reading thread: there is no background thread).  The
 *                        body lands in a bounded buffer (opts.buffer_bytes);
 *                        the transfer is paused while it is full, so a slow
 *                        reader never makes memory grow.  Redirects followed
 *                        (10 at most); TLS peers verified; proxies from the
 *                        usual environment variables.
 *
 * HTTP faults.  Fatal at once: a 4xx status other than 408 and 429 (404 and
 * 403 name the status), a malformed URL, a TLS verification failure, a
 * resume answered with the wrong Content-Range, or a resource whose size or
 * ETag changed between attempts.  Retried: 5xx, 408, 429, a refused, reset
 * or timed-out connection, a DNS failure, a body shorter than its
 * Content-Length, and a stall (no byte for opts.stall_timeout_ms while we
 * were not the ones pausing).  Each retry waits opts.backoff_ms * 2^(k-1)
 * (k = failures in a row, capped at opts.backoff_max_ms, then scaled by a
 * factor in [0.5, 1] so that many readers do not retry in step), then
 * resumes at the first byte not yet received with "Range: bytes=POS-": a 206
 * must start at POS, a 200 (server ignores Range) has its first POS bytes
 * dropped.  So no byte is delivered twice and none is lost.  The retry
 * budget (opts.retries) counts failures in a row: an attempt that delivered
 * at least one new byte resets it, so a long shard over a flaky link still
 * completes, while a dead server fails after retries + 1 attempts.  The
 * final error names the URL, the byte offset and the last cause.
 *
 * Errors (fl_err, jpeg.h).  Messages name the URL (the stream has no sample
 * index) and stay under 300 characters: a long URL is shortened in the
 * middle, and the query string and user:password of an http(s) URL are
 * replaced by "..." (presigned URLs carry a signature there).
 *   FL_ERR_IO, errnum 0       HTTP failures, a failing pipe command, not a
 *                             regular file
 *   FL_ERR_IO, errnum E       open/read/spawn failed with errno E (ENOENT...)
 *   FL_ERR_IO, ECANCELED      *opts.cancel turned non-zero (message
 *                             "cancelled")
 *   FL_ERR_INVALID            a bad URL or bad options
 *   FL_ERR_NOMEM              an allocation failed
 *
 * Threads.  Every function runs without the GIL and may be called from any
 * thread; a stream belongs to one thread at a time (no locking inside),
 * except fl_stream_get_stats, which may be called from any thread while the
 * stream is alive (its counters are atomics).  libcurl is initialised once
 * per process (pthread_once) on the first http(s) open.
 */
#ifndef FL_STREAM_H
#define FL_STREAM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

typedef struct fl_stream fl_stream;

enum { FL_STREAM_FILE = 1, FL_STREAM_PIPE = 2, FL_STREAM_HTTP = 3 };

typedef struct {
    int retries;              /* http: failures in a row allowed before giving up (default 5; 0: none) */
    int backoff_ms;           /* http: first back-off (default 200) */
    int backoff_max_ms;       /* http: back-off cap (default 10000) */
    int stall_timeout_ms;     /* http and pipe: no byte for this long is a stall (default 30000; 0: never).
                                 http retries a stall; a pipe cannot resume, so it fails */
    int connect_timeout_ms;   /* http: connect + TLS handshake (default 30000) */
    size_t buffer_bytes;      /* http: the bounded body buffer (default 1 MiB, at least 128 KiB) */
    const char *ca_file;      /* https: a PEM bundle of CAs to trust instead of the system's (a private
                                 object store's own CA); NULL: the system's.  Copied by open. */
    const atomic_int *cancel; /* polled (relaxed) at least every 100 ms while waiting; non-zero
                                 stops the read with FL_ERR_IO/ECANCELED.  May be NULL.
                                 Must outlive the stream. */
} fl_stream_opts;

/* Fill *o with the defaults above.  Callers start from this and change
 * fields, so that a new option never needs a change in old callers. */
void fl_stream_opts_init(fl_stream_opts *o);

/* Counters of one stream (a snapshot: fl_stream_get_stats). */
typedef struct {
    uint64_t bytes;           /* bytes returned by fl_stream_read */
    uint64_t wait_ns;         /* time fl_stream_read spent blocked on the disk, pipe or network,
                                 back-off sleeps included (copying out of our buffer excluded) */
    uint64_t retries;         /* http attempts started after a retryable fault */
    uint64_t range_resumes;   /* of those, resumed by a 206 answer to a Range request */
    uint64_t skipped_bytes;   /* bytes received again and dropped (a 200 answer to a Range request) */
} fl_stream_stats;

/* Open the stream named by `url` (rules at the top).  `o` may be NULL (the
 * defaults); it is copied, except o->cancel, which is kept.  For a file the
 * open checks the file; for a pipe it starts the command; for http(s) it
 * only prepares the transfer: the connection is made by the first read, so
 * that a read error and an open error look the same to the caller.
 * Returns the stream (the caller owns it; fl_stream_close frees it), or
 * NULL with err filled. */
fl_stream *fl_stream_open(const char *url, const fl_stream_opts *o, fl_err *err);

/* Read up to n (> 0) bytes into buf.  Returns the count (> 0), 0 at the end
 * of the stream (for a pipe: the command exited with status 0; for http: the
 * whole body, Content-Length checked when the server sent one), or -1 with
 * err filled.  Blocks until at least one byte, the end, an error, or a
 * cancel.  After -1 or 0 every later call returns the same again (the same
 * error record). */
long long fl_stream_read(fl_stream *s, void *buf, size_t n, fl_err *err);

/* Copy the counters into *out.  Safe from any thread while s is alive. */
void fl_stream_get_stats(const fl_stream *s, fl_stream_stats *out);

/* FL_STREAM_FILE / _PIPE / _HTTP. */
int fl_stream_kind(const fl_stream *s);

/* The URL as given to fl_stream_open (owned by the stream). */
const char *fl_stream_url(const fl_stream *s);

/* Write a shortened, redacted form of url into out (cap bytes, NUL
 * terminated; at most 160 characters): the form every message of this unit
 * and of tar.c uses. */
void fl_stream_url_for_message(const char *url, char *out, size_t cap);

/* Close and free s: a running pipe command is killed (its process group,
 * SIGKILL) and reaped; an http transfer is aborted.  NULL is a no-op. */
void fl_stream_close(fl_stream *s);

#endif
