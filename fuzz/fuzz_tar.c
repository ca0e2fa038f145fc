/* fuzz_tar.c: libFuzzer target "tar" -- fl_tar_open + fl_tar_next_sample
 * over a shard held in a memfd (opened by its /proc/self/fd path, so the
 * real file stream reads it).
 *
 * Input: byte 0 is a mode, the rest is the shard.  Mode bit 0 set: the
 * harness rewrites the checksum of every 512-byte block of the shard before
 * reading it, so that the mutator reaches the code behind the checksum check
 * (long names, pax records, sizes, grouping); clear: the shard as given.
 * Mode bits 1-2 pick max_fields (1, 2, 1024) and bit 3 a 4 KiB member limit.
 *
 * Contracts checked (besides ASan/UBSan and LeakSanitizer):
 * - -1 comes with a known FL_ERR_* code and a message that starts with the
 *   shard's URL and is under 300 characters; later calls repeat it, and 0
 *   (the end) repeats too;
 * - each sample: a non-empty key; 1..max_fields fields; each field's name
 *   starts with the key, its extension is lower-case, not "__key__" or
 *   "__url__", and unique in the sample; data[size] == 0; size within the
 *   member limit; `bytes` is the sum of the sizes; offsets increase;
 * - all the data handed out fits in the shard (no byte invented).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "sources/tar.h"

static void
fix_checksums(uint8_t *d, size_t n)
{
    for (size_t off = 0; off + 512 <= n; off += 512) {
        uint8_t *b = d + off;
        memset(b + 148, ' ', 8);
        unsigned sum = 0;
        for (int i = 0; i < 512; i++)
            sum += b[i];
        char f[9];
        snprintf(f, sizeof f, "%06o", sum & 0777777);
        memcpy(b + 148, f, 6);
        b[154] = 0;
        b[155] = ' ';
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t mode = data[0];
    size_t n = size - 1;
    uint8_t *shard = malloc(n ? n : 1);
    if (!shard)
        abort();
    memcpy(shard, data + 1, n);
    if (mode & 1)
        fix_checksums(shard, n);
    int fd = memfd_create("shard", MFD_CLOEXEC);
    if (fd < 0)
        abort();
    if (n && write(fd, shard, n) != (ssize_t)n)
        abort();
    free(shard);
    char url[64];
    snprintf(url, sizeof url, "/proc/self/fd/%d", fd);

    fl_tar_opts to;
    fl_tar_opts_init(&to);
    static const int fields[4] = {1024, 1, 2, 1024};
    to.max_fields = fields[(mode >> 1) & 3];
    if (mode & 8)
        to.max_member_bytes = 4096;
    fl_err err = {0, "", 0};
    fl_tar *t = fl_tar_open(url, NULL, &to, &err);
    if (!t)
        FZ_FAIL("open failed: %s", err.msg);
    uint64_t total = 0, last_off = 0;
    int first = 1, rc;
    fl_wds_sample *s;
    while ((rc = fl_tar_next_sample(t, &s, &err)) == 1) {
        if (!s || !s->key || !s->key[0])
            FZ_FAIL("sample without a key");
        if (s->nfields < 1 || s->nfields > to.max_fields)
            FZ_FAIL("sample '%s' has %d fields", s->key, s->nfields);
        if (!first && s->offset <= last_off)
            FZ_FAIL("offsets do not increase: %llu after %llu", (unsigned long long)s->offset,
                    (unsigned long long)last_off);
        first = 0;
        last_off = s->offset;
        size_t sum = 0, klen = strlen(s->key);
        for (int i = 0; i < s->nfields; i++) {
            const fl_wds_field *f = &s->fields[i];
            if (strncmp(f->name, s->key, klen) != 0)
                FZ_FAIL("member '%s' does not start with key '%s'", f->name, s->key);
            for (const char *c = f->ext; *c; c++)
                if (*c >= 'A' && *c <= 'Z')
                    FZ_FAIL("extension '%s' not lower-case", f->ext);
            if (!strcmp(f->ext, "__key__") || !strcmp(f->ext, "__url__"))
                FZ_FAIL("reserved extension '%s'", f->ext);
            for (int j = 0; j < i; j++)
                if (!strcmp(s->fields[j].ext, f->ext))
                    FZ_FAIL("duplicate extension '%s'", f->ext);
            if (f->data[f->size] != 0)
                FZ_FAIL("data[size] != 0");
            if (f->size > to.max_member_bytes)
                FZ_FAIL("member over the limit");
            if (fl_wds_sample_field(s, f->ext) != f)
                FZ_FAIL("field lookup");
            sum += f->size;
        }
        if (sum != s->bytes)
            FZ_FAIL("bytes %zu != sum %zu", s->bytes, sum);
        total += sum;
        fl_wds_sample_free(s);
    }
    if (total > n)
        FZ_FAIL("%llu data bytes from a %zu-byte shard", (unsigned long long)total, n);
    if (rc == -1) {
        if (err.code < FL_ERR_DECODE || err.code > FL_ERR_RUNTIME || !err.msg[0])
            FZ_FAIL("bad error record: code %d msg '%s'", err.code, err.msg);
        if (strncmp(err.msg, url, strlen(url)) != 0)
            FZ_FAIL("message does not name the shard: %s", err.msg);
        if (strlen(err.msg) >= 300)
            FZ_FAIL("message of %zu characters", strlen(err.msg));
        fl_err again = {0, "", 0};
        if (fl_tar_next_sample(t, &s, &again) != -1 || s || again.code != err.code || strcmp(again.msg, err.msg))
            FZ_FAIL("the error is not repeated");
    } else if (rc == 0) {
        if (fl_tar_next_sample(t, &s, &err) != 0 || s)
            FZ_FAIL("the end is not repeated");
    } else {
        FZ_FAIL("rc %d", rc);
    }
    if (fz_verbose())
        fprintf(stderr, "tar: rc %d, %llu bytes%s%s\n", rc, (unsigned long long)total, rc < 0 ? ": " : "",
                rc < 0 ? err.msg : "");
    fl_tar_close(t);
    close(fd);
    return 0;
}
