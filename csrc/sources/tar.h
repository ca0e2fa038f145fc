/* tar.h: a streaming tar reader over an fl_stream, and WebDataset samples
 * (no Python).
 *
 * fl_tar_open(url) reads one shard front to back, never seeking, and
 * fl_tar_next_sample hands out its samples one by one, each in memory the
 * caller owns: the member bytes are read from the stream straight into the
 * sample's own allocations (no staging buffer, no second copy), so a sample
 * can sit in a shuffle buffer, move between threads and be freed later with
 * fl_wds_sample_free.
 *
 * Members, as Python's tarfile reads them (Python 3.11; webdataset reads
 * shards with tarfile.open(mode="r|*")):
 *   - ustar, GNU and v7 headers; the checksum (unsigned or signed sum) is
 *     verified; numbers in octal or base-256; the ustar prefix field is
 *     joined to the name ("prefix/name") whatever the magic, as tarfile does.
 *   - GNU long names ('L'; 'K' long link names are read and dropped), pax
 *     extended headers ('x', 'X': path= and size= override the header; 'g':
 *     a global path= applies to every later member without its own name).
 *     When several name sources precede one member the first in the file
 *     wins, then a global path, then the header's own name, as in tarfile.
 *   - Regular members ('0', '\0', '7') are returned; directories, links,
 *     devices and FIFOs are skipped (their size field is ignored, as tarfile
 *     does); other unknown types are skipped with their data.  An '\0'
 *     member whose header name ends in '/' is a directory (v7).  GNU sparse
 *     members ('S', or GNU.sparse.* pax records) are refused (FL_ERR_DECODE).
 *   - The archive ends at the first all-zero block, or at a clean end of the
 *     stream on a block boundary (no end-of-archive blocks, as tarfile
 *     accepts).  After that the stream is read on to its end (at most 1 MiB
 *     more is read), so that a pipe command's exit status and an http
 *     transfer's completeness are checked.
 *   Stricter than tarfile, which stops silently at a cut or damaged header
 *   after the first: here a header cut short, a bad checksum, an empty
 *   stream or a body cut short is an error.
 *
 * Samples, as webdataset 1.0's tar_file_iterator + group_by_keys (defaults):
 *   - A member is dropped when its name has no '/' and starts and ends with
 *     "__" ("__meta__"), or its first path component starts and ends with
 *     "__" ("__dir__/x.jpg", skip_meta), or the name does not split into
 *     key + extension.
 *   - Split (webdataset's base_plus_ext, the regex
 *     ^((?:.*\/|)[^.]+)[.]([^/]*)$ reproduced exactly): normally key = the
 *     name up to the first '.' of its base name, directory included, and
 *     extension = the rest ("d/a.seg.png" -> "d/a", "seg.png").  A base name
 *     that starts with '.' takes the regex's other branch ("d/.x.jpg" ->
 *     "d/", "x.jpg"); a base name without '.' is dropped.  The extension is
 *     lower-cased (ASCII letters only: Python's str.lower() also lowers
 *     non-ASCII letters).
 *   - Consecutive members with the same key form one sample; a new key
 *     starts a new one (a key that comes back later makes a second sample,
 *     as in webdataset).  The same extension twice in one sample, or the
 *     extension "__key__" or "__url__" (webdataset's own fields), is an
 *     error (webdataset raises ValueError).
 *
 * Errors (fl_err, jpeg.h).  Every message names the shard URL (shortened as
 * fl_stream_url_for_message does) and the member when there is one, in
 * under 300 characters:
 *   FL_ERR_DECODE   not a tar archive, a bad or cut header, a body cut short,
 *                   a duplicate extension, unsupported member
 *   FL_ERR_LIMIT    a member over opts.max_member_bytes, a long name or pax
 *                   header over opts.max_header_bytes, more than
 *                   opts.max_fields members in one sample
 *   FL_ERR_IO, ...  the stream's own errors (stream.h), with the member
 *   FL_ERR_NOMEM    an allocation failed
 * After an error the reader is finished: later calls return -1 with the
 * same record.  The sample being assembled when an error hits is dropped
 * (it may lack members); the samples returned before it are complete.
 *
 * Threads: no GIL; any thread; an fl_tar belongs to one thread at a time.
 * Samples are plain memory: any thread may free them.
 */
#ifndef FL_TAR_H
#define FL_TAR_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "sources/stream.h"

typedef struct fl_tar fl_tar;

typedef struct {
    size_t max_member_bytes;  /* a kept member larger than this: FL_ERR_LIMIT (default 1 GiB) */
    size_t max_header_bytes;  /* GNU long name / pax header data (default 1 MiB) */
    int max_fields;           /* members in one sample (default 1024) */
} fl_tar_opts;

/* Fill *o with the defaults above. */
void fl_tar_opts_init(fl_tar_opts *o);

/* One member of a sample.  All three pointers point into one allocation
 * owned by the sample (do not free them yourself). */
typedef struct {
    const char *ext;   /* lower-cased extension, NUL-terminated ("jpg", "seg.png") */
    const char *name;  /* the member's name in the shard, NUL-terminated (for messages) */
    uint8_t *data;     /* the member's bytes, size of them, then one NUL byte (data[size] == 0,
                          so a text field can be parsed in place); 16-byte aligned; writable */
    size_t size;
} fl_wds_field;

/* One sample.  Owned by whoever fl_tar_next_sample handed it to; freed with
 * fl_wds_sample_free. */
typedef struct {
    char *key;             /* NUL-terminated (bytes as in the shard; UTF-8 in practice) */
    int nfields;
    fl_wds_field *fields;  /* nfields members, in shard order */
    uint64_t offset;       /* byte offset in the shard of the header that starts the sample */
    size_t bytes;          /* sum of the fields' sizes (for a memory budget) */
} fl_wds_sample;

/* Open the shard at `url` (any fl_stream URL; sopts and topts may be NULL
 * for the defaults; sopts->cancel is kept, so it must outlive the reader).
 * Nothing of the shard is read yet.  Returns the reader (the caller owns
 * it; fl_tar_close frees it), or NULL with err filled (the stream's open
 * errors). */
fl_tar *fl_tar_open(const char *url, const fl_stream_opts *sopts, const fl_tar_opts *topts, fl_err *err);

/* The next sample of the shard.  Returns 1 and sets *out to a new sample
 * (the caller owns it), 0 at the end of the shard (*out = NULL), or -1 with
 * err filled (*out = NULL).  After 0 or -1 every later call returns the
 * same. */
int fl_tar_next_sample(fl_tar *t, fl_wds_sample **out, fl_err *err);

/* The field with extension `ext` (compared exactly; extensions are
 * lower-case), or NULL. */
const fl_wds_field *fl_wds_sample_field(const fl_wds_sample *s, const char *ext);

/* Free a sample and all its fields.  NULL is a no-op.  Any thread. */
void fl_wds_sample_free(fl_wds_sample *s);

/* The underlying stream (owned by t), for fl_stream_get_stats. */
fl_stream *fl_tar_stream(fl_tar *t);

/* Shard bytes consumed so far (headers, data and padding). */
uint64_t fl_tar_offset(const fl_tar *t);

/* Close the shard (fl_stream_close: a pipe command is killed) and free t.
 * Samples already handed out stay valid.  NULL is a no-op. */
void fl_tar_close(fl_tar *t);

/* The webdataset rules, exposed for tests and for callers that list member
 * names themselves:
 * fl_wds_skip_name(name): 1 if webdataset drops the member before grouping
 * (the "__...__" rules above), else 0.
 * fl_wds_split(name, &keylen, &ext): 1 and the key's length (the key is
 * name[0..keylen)) and a pointer to the extension inside name, or 0 when
 * the name has no key + extension (the member is dropped).  The extension
 * is not lower-cased here. */
int fl_wds_skip_name(const char *name);
int fl_wds_split(const char *name, size_t *keylen, const char **ext);

#endif
