/* lmdb_source.h: samples stored as values of an LMDB environment (no Python).
 *
 * Layout (fastloader-lmdb, version 1; written by fastloader.pack_lmdb, and
 * by anyone with the `lmdb` package who follows it):
 *   - the main (unnamed) database only;
 *   - sample i: key = i as ASCII decimal, zero-padded to 10 digits
 *     (b"0000000042"), value = the encoded image, unchanged (JPEG, PNG and
 *     WebP decode natively; the other formats Pillow reads go through the
 *     Pillow fix-up, as files do);
 *   - reserved keys start with "__" (they sort after every sample key):
 *       __fastloader__  JSON {"format": "fastloader-lmdb", "version": 1, "count": N}   required
 *       __labels__      N little-endian int64                                      required
 *       __classes__     JSON list of class names (index = label)                   optional
 *       __names__       JSON list of each sample's original relative path          optional
 *   The metadata is read by fastloader/lmdb_dataset.py; this file serves the
 *   sample keys 0..N-1.
 *
 * Reading: the environment is opened MDB_RDONLY | MDB_NOTLS, with
 *   - MDB_NOTLS always: a read transaction is tied to its MDB_txn, not to
 *     the thread.  Each worker keeps one transaction for its life (opened
 *     by thread_open), the num_workers=0 path's state is used by whichever
 *     Python thread loads a batch and may be closed on another, and
 *     Source.read opens a second transaction on a thread that may hold one
 *     already: all three are errors (MDB_BAD_RSLOT) under LMDB's default
 *     one-reader-per-thread rule.
 *   - MDB_NOLOCK unless `lock` is asked for: a packed dataset is immutable
 *     (pack_lmdb writes a temporary file and renames it), so readers need no
 *     reader table.  Without it, opening needs no write access next to the
 *     data (no lock file is created, so read-only mounts and shared
 *     directories work), there is no reader-slot limit however many
 *     workers and ranks open the dataset, and no stale slot survives a
 *     killed process.  The price: a process WRITING to the environment
 *     while we read could reuse pages under our transactions.  When
 *     something may write concurrently, open with lock = 1: readers then
 *     register in the lock file (mdb_env_set_maxreaders FL_LMDB_MAX_READERS,
 *     enough for many workers in many processes), as LMDB's own writers
 *     expect.  A writer that grows the map while we read still fails our
 *     next transaction (MDB_MAP_RESIZED): open the dataset again.
 *   - MDB_NORDAHEAD only when readahead = 0: the OS's read-around brings a
 *     whole image value in with its first page fault, which suits values
 *     of tens of kilobytes; turning it off helps random reads of a
 *     dataset much larger than RAM whose values are small.
 *   A path that is a directory is an environment directory (data.mdb in
 *   it); a regular file is a single-file environment (MDB_NOSUBDIR).
 *
 * Values are views: fl_sample_bytes.data points into LMDB's read-only
 * memory map, valid while the worker's transaction is open (for its life),
 * and nothing is copied before the decode.  get() touches one byte of
 * every page of the value so that a value not yet in memory is read from
 * disk inside get (counted as read time in stats()) rather than page by
 * page inside the decoder.
 *
 * Error rules (fl_err, as source.h):
 *   FL_ERR_IO with errnum  an OS failure: the path is missing (ENOENT), not
 *                          readable (EACCES), ... (opening or reading)
 *   FL_ERR_IO, errnum 0    not an LMDB (a directory without data.mdb, an
 *                          empty file, MDB_INVALID, a version mismatch),
 *                          fewer samples than the caller says, LMDB's own
 *                          failures (MDB_CORRUPTED, MDB_PAGE_NOTFOUND,
 *                          MDB_READERS_FULL, MDB_MAP_RESIZED: the message
 *                          holds mdb_strerror), and a missing sample key
 *                          (the environment is damaged or not in this
 *                          layout: the storage failed, not the image, so it
 *                          is an I/O error as a missing file is; errnum 0
 *                          keeps the message naming the key)
 *   FL_ERR_LIMIT           a value larger than the caller's max_bytes
 *   FL_ERR_NOMEM           out of memory
 * Messages hold the reason only; the caller names the path and the sample.
 *
 * Every function here runs without the GIL and may be called from any
 * thread (an fl_lmdb_writer by one thread at a time).
 */
#ifndef FL_LMDB_SOURCE_H
#define FL_LMDB_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include "sources/source.h"

#define FL_LMDB_KEY_DIGITS 10          /* sample keys: "%010lld" */
#define FL_LMDB_MAX_READERS 4096       /* reader slots with lock = 1 (64 bytes each in the lock file) */

typedef struct {
    int lock;        /* 1: register readers in the lock file (see above); 0: MDB_NOLOCK */
    int readahead;   /* 0: MDB_NORDAHEAD */
} fl_lmdb_options;

/* Write sample i's key (FL_LMDB_KEY_DIGITS digits, NUL-terminated) into
 * key, which holds at least 24 bytes.  Returns the key's length (10, more
 * only for i >= 10^10).  Pure. */
int fl_lmdb_sample_key(int64_t i, char *key);

/* A source over samples 0..n-1 of the environment at `path` (directory or
 * single file, detected).  Checks that it opens and holds the key of
 * sample n-1.  Returns a source with one reference, or NULL with err
 * filled.  `opt` NULL: lock 0, readahead 1.  No GIL. */
fl_source *fl_source_lmdb_open(const char *path, int64_t n, const fl_lmdb_options *opt, fl_err *err);

/* Read `nkeys` keys (keys[i] of klens[i] bytes, borrowed) of the
 * environment at `path` in one read transaction.  For each: vals[i] a
 * malloc'd copy of vlens[i] bytes (the caller frees it), or NULL with
 * vlens[i] 0 when the key is absent.  0, or -1 with err filled and every
 * vals[i] NULL.  No GIL. */
int fl_lmdb_read_keys(const char *path, const fl_lmdb_options *opt, size_t nkeys, const char *const *keys,
                      const size_t *klens, uint8_t **vals, size_t *vlens, fl_err *err);

/* ---- writing (the converter) -------------------------------------------------- */

/* A writer of a new single-file environment (MDB_NOSUBDIR), for one thread
 * at a time.  It is opened MDB_NOLOCK | MDB_NOSYNC: the converter writes a
 * temporary file nobody else opens, and fl_lmdb_writer_close syncs once. */
typedef struct fl_lmdb_writer fl_lmdb_writer;

/* Create the environment file at `path` (refused with EEXIST when it
 * exists) with an initial map size of map_size bytes (0: 1 GiB).  Returns
 * the writer (the caller owns it: fl_lmdb_writer_close or _abandon), or
 * NULL with err filled (and no file left behind).  No GIL. */
fl_lmdb_writer *fl_lmdb_writer_open(const char *path, size_t map_size, fl_err *err);

/* Put n (key, value) pairs (borrowed) in one write transaction: all of
 * them, or none.  A key greater than every key written before goes in with
 * MDB_APPEND (packed pages; keys in order are the fast case), any other is
 * an ordinary put (an existing key is overwritten).  When the map is full
 * the transaction is retried with the map doubled (at least enough for the
 * batch), up to 1 TiB per step.  0, or -1 with err filled (nothing of this
 * batch written).  No GIL. */
int fl_lmdb_writer_put(fl_lmdb_writer *w, size_t n, const void *const *keys, const size_t *klens,
                       const void *const *vals, const size_t *vlens, fl_err *err);

/* The current map size in bytes (grows as fl_lmdb_writer_put needs).  Pure. */
size_t fl_lmdb_writer_map_size(const fl_lmdb_writer *w);

/* Flush everything to disk (fsync), close the environment and free w.
 * 0, or -1 with err filled (w is freed either way).  No GIL. */
int fl_lmdb_writer_close(fl_lmdb_writer *w, fl_err *err);

/* Close without syncing and free w (the caller deletes the file).
 * NULL-safe.  No GIL. */
void fl_lmdb_writer_abandon(fl_lmdb_writer *w);

#endif
