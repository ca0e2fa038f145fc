/* shmring.c: the shared-memory slot ring of process workers (see shmring.h
 * for the contract: who writes a slot, who counts its references, why the
 * file has no name and why it is sparse). */
#include "core/shmring.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>


/* The claim table, the file's first hdr_bytes, shared by every process that
 * maps it: one atomic int per slot.  0: free; CLAIM_OWNER: the owner holds it
 * (acquired, or adopted from a worker, and referenced); w + 1: worker w took
 * it for the batch it is laying out (fl_shmring_arena_claim) and the owner
 * has not adopted it yet.  Only the owner turns a slot free again (its last
 * reference, or fl_shmring_reclaim for a worker that died). */
#define CLAIM_FREE 0
#define CLAIM_OWNER (-1)
#define ARENA_LAZY (-2) /* arena_slot: claim a slot at the first allocation */

struct fl_shmring {
    pthread_mutex_t mu;
    _Atomic int *claims;   /* nslots entries at the start of the mapping */
    size_t hdr_bytes;      /* the claim table's pages; slot 0 starts after them */
    int refs;              /* creator + views handed out */
    int fd;                /* the shared file, owned */
    char *base;            /* this process's mapping of nslots * slot_bytes */
    size_t map_bytes;
    int nslots;
    size_t slot_bytes;
    int owner;             /* 1: created here; slot references are counted here */
    pid_t owner_pid;       /* the creator's process: a child forked from it keeps a copy of this
                            * struct and the shared mapping, and must never write the claim table */
    int *slot_refs;        /* owner: nslots entries, 0 = free */
    int in_use, peak;      /* owner: slots referenced now / at most */
    size_t *pinned;        /* nslots entries: bytes page-locked at the slot's start */
    int *pinned_dev;       /* nslots entries: the device each lock was made for */
    const fl_pinner *pinner; /* who made the locks (the first fl_shmring_pin's); not owned */
    int arena_slot;        /* the slot being filled, -1 before arena_begin / without one, ARENA_LAZY */
    int arena_worker;      /* the worker id claims are made for (ARENA_LAZY) */
    size_t arena_used;
};

static void
set_err(fl_err *err, int code, int errnum, const char *what)
{
    if (!err)
        return;
    err->code = code;
    err->errnum = errnum;
    if (errnum)
        snprintf(err->msg, sizeof err->msg, "%s: %s", what, strerror(errnum));
    else
        snprintf(err->msg, sizeof err->msg, "%s", what);
}

/* A new anonymous shared file, close-on-exec (spawned workers get it passed
 * explicitly).  memfd_create first: it has no name and lives in no mounted
 * file system, so a small /dev/shm (containers) does not limit it.  Where it
 * is refused (old kernels, seccomp filters), a file created in /dev/shm or
 * $TMPDIR and unlinked at once.  Returns the descriptor or -1 with errno. */
static int
anon_file(void)
{
#ifdef MFD_CLOEXEC
    int fd = memfd_create("fastloader-batches", MFD_CLOEXEC);
    if (fd >= 0)
        return fd;
#endif
    const char *dirs[3] = {"/dev/shm", getenv("TMPDIR"), "/tmp"};
    int saved = errno;
    for (int i = 0; i < 3; i++) {
        if (!dirs[i] || !*dirs[i])
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/fastloader-batches-XXXXXX", dirs[i]);
        int fd = mkostemp(path, O_CLOEXEC);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        unlink(path); /* nameless from here on */
        return fd;
    }
    errno = saved;
    return -1;
}

/* Bytes of the claim table for nslots slots, whole pages. */
static size_t
header_bytes(int nslots)
{
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0)
        page = 4096;
    size_t n = (size_t)nslots * sizeof(_Atomic int);
    return (n + (size_t)page - 1) / (size_t)page * (size_t)page;
}

static fl_shmring *
ring_new(int fd, int nslots, size_t slot_bytes, int owner, fl_err *err)
{
    fl_shmring *r = calloc(1, sizeof *r);
    if (r) {
        r->pinned = calloc((size_t)nslots, sizeof *r->pinned);
        r->pinned_dev = calloc((size_t)nslots, sizeof *r->pinned_dev);
        r->slot_refs = owner ? calloc((size_t)nslots, sizeof *r->slot_refs) : NULL;
    }
    if (!r || !r->pinned || !r->pinned_dev || (owner && !r->slot_refs)) {
        if (r) {
            free(r->pinned);
            free(r->pinned_dev);
            free(r->slot_refs);
            free(r);
        }
        set_err(err, FL_ERR_NOMEM, 0, "out of memory for the shared-memory ring");
        return NULL;
    }
    size_t hdr = header_bytes(nslots);
    size_t map_bytes = hdr + (size_t)nslots * slot_bytes;
    /* MAP_NORESERVE: the reservation is address space; pages come as written */
    void *base = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (base == MAP_FAILED) {
        set_err(err, FL_ERR_IO, errno, "mmap of the shared-memory batch ring");
        free(r->pinned);
        free(r->pinned_dev);
        free(r->slot_refs);
        free(r);
        return NULL;
    }
    pthread_mutex_init(&r->mu, NULL);
    r->refs = 1;
    r->fd = fd;
    r->base = base;
    r->claims = (_Atomic int *)base; /* zero-filled by the file: every slot free */
    r->hdr_bytes = hdr;
    r->map_bytes = map_bytes;
    r->nslots = nslots;
    r->slot_bytes = slot_bytes;
    r->owner = owner;
    r->owner_pid = getpid();
    r->arena_slot = -1;
    return r;
}

static int
check_sizes(int nslots, size_t *slot_bytes, fl_err *err)
{
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0)
        page = 4096;
    if (nslots < 1 || nslots > FL_SHMRING_MAX_SLOTS || *slot_bytes == 0) {
        set_err(err, FL_ERR_INVALID, 0, "a shared-memory ring needs 1..4096 slots of at least one byte");
        return -1;
    }
    size_t rounded = (*slot_bytes + (size_t)page - 1) / (size_t)page * (size_t)page;
    if (rounded < *slot_bytes || rounded > (SIZE_MAX / 4) / (size_t)nslots) {
        set_err(err, FL_ERR_INVALID, 0, "shared-memory ring too large for the address space");
        return -1;
    }
    *slot_bytes = rounded;
    return 0;
}

fl_shmring *
fl_shmring_create(int nslots, size_t slot_bytes, fl_err *err)
{
    if (check_sizes(nslots, &slot_bytes, err) < 0)
        return NULL;
    int fd = anon_file();
    if (fd < 0) {
        set_err(err, FL_ERR_IO, errno, "creating the shared-memory batch ring (memfd_create)");
        return NULL;
    }
    if (ftruncate(fd, (off_t)(header_bytes(nslots) + (size_t)nslots * slot_bytes)) != 0) {
        set_err(err, FL_ERR_IO, errno, "sizing the shared-memory batch ring (ftruncate)");
        close(fd);
        return NULL;
    }
    fl_shmring *r = ring_new(fd, nslots, slot_bytes, 1, err);
    if (!r)
        close(fd);
    return r;
}

fl_shmring *
fl_shmring_attach(int fd, int nslots, size_t slot_bytes, fl_err *err)
{
    if (check_sizes(nslots, &slot_bytes, err) < 0)
        return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        set_err(err, FL_ERR_IO, errno, "the shared-memory batch ring's descriptor");
        return NULL;
    }
    if ((size_t)st.st_size < header_bytes(nslots) + (size_t)nslots * slot_bytes) {
        set_err(err, FL_ERR_INVALID, 0, "the shared-memory batch ring is smaller than its slots");
        return NULL;
    }
    return ring_new(fd, nslots, slot_bytes, 0, err);
}

int
fl_shmring_fd(const fl_shmring *r)
{
    return r->fd;
}

int
fl_shmring_nslots(const fl_shmring *r)
{
    return r->nslots;
}

size_t
fl_shmring_slot_bytes(const fl_shmring *r)
{
    return r->slot_bytes;
}

int
fl_shmring_is_owner(const fl_shmring *r)
{
    return r->owner;
}

char *
fl_shmring_slot_base(const fl_shmring *r, int slot)
{
    return r->base + r->hdr_bytes + (size_t)slot * r->slot_bytes;
}

int
fl_shmring_slot_of(const fl_shmring *r, const void *p)
{
    const char *c = p;
    if (c < r->base + r->hdr_bytes || c >= r->base + r->map_bytes)
        return -1;
    return (int)((size_t)(c - r->base - r->hdr_bytes) / r->slot_bytes);
}

/* ---- slots ---------------------------------------------------------------- */

/* The owner's ring, in the owner's process: a process forked from the loader
 * inherits the ring (and the file, shared) but is not the owner: its
 * copies of the references die with its copies of the views, and freeing
 * a slot there would hand the loader's slot, still in use, to a worker. */
static int
owner_here(const fl_shmring *r)
{
    return r->owner && getpid() == r->owner_pid;
}

int
fl_shmring_acquire(fl_shmring *r)
{
    if (!owner_here(r))
        return -1;
    int got = -1;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->nslots; i++) {
        int expect = CLAIM_FREE;
        if (r->slot_refs[i] == 0 && atomic_compare_exchange_strong(&r->claims[i], &expect, CLAIM_OWNER)) {
            r->slot_refs[i] = 1;
            got = i;
            if (++r->in_use > r->peak)
                r->peak = r->in_use;
            break;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return got;
}

int
fl_shmring_adopt(fl_shmring *r, int slot, int worker)
{
    if (!owner_here(r) || slot < 0 || slot >= r->nslots || worker < 0)
        return -1;
    int expect = worker + 1;
    int rc = -1;
    pthread_mutex_lock(&r->mu);
    if (r->slot_refs[slot] == 0 && atomic_compare_exchange_strong(&r->claims[slot], &expect, CLAIM_OWNER)) {
        r->slot_refs[slot] = 1;
        if (++r->in_use > r->peak)
            r->peak = r->in_use;
        rc = 0;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int
fl_shmring_reclaim(fl_shmring *r, int worker)
{
    if (!owner_here(r) || worker < 0)
        return 0;
    int n = 0;
    for (int i = 0; i < r->nslots; i++) {
        int expect = worker + 1;
        if (atomic_compare_exchange_strong(&r->claims[i], &expect, CLAIM_FREE))
            n++;
    }
    return n;
}

int
fl_shmring_claim_of(const fl_shmring *r, int slot)
{
    if (slot < 0 || slot >= r->nslots)
        return CLAIM_FREE;
    return atomic_load(&r->claims[slot]);
}

void
fl_shmring_slot_ref(fl_shmring *r, int slot)
{
    if (!r->owner || slot < 0 || slot >= r->nslots)
        return;
    pthread_mutex_lock(&r->mu);
    if (r->slot_refs[slot]++ == 0 && ++r->in_use > r->peak)
        r->peak = r->in_use;
    pthread_mutex_unlock(&r->mu);
}

void
fl_shmring_slot_unref(fl_shmring *r, int slot)
{
    if (!r->owner || slot < 0 || slot >= r->nslots)
        return;
    pthread_mutex_lock(&r->mu);
    if (r->slot_refs[slot] > 0 && --r->slot_refs[slot] == 0) {
        r->in_use--;
        if (owner_here(r))
            atomic_store(&r->claims[slot], CLAIM_FREE); /* workers may take it from here */
    }
    pthread_mutex_unlock(&r->mu);
}

int
fl_shmring_slots_in_use(fl_shmring *r)
{
    pthread_mutex_lock(&r->mu);
    int n = r->in_use;
    pthread_mutex_unlock(&r->mu);
    return n;
}

int
fl_shmring_slots_peak(fl_shmring *r)
{
    pthread_mutex_lock(&r->mu);
    int n = r->peak;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* ---- arena ---------------------------------------------------------------- */

void
fl_shmring_arena_begin(fl_shmring *r, int slot)
{
    pthread_mutex_lock(&r->mu);
    r->arena_slot = slot >= 0 && slot < r->nslots ? slot : -1;
    r->arena_used = 0;
    pthread_mutex_unlock(&r->mu);
}

void
fl_shmring_arena_claim(fl_shmring *r, int worker)
{
    pthread_mutex_lock(&r->mu);
    r->arena_slot = worker >= 0 ? ARENA_LAZY : -1;
    r->arena_worker = worker;
    r->arena_used = 0;
    pthread_mutex_unlock(&r->mu);
}

/* ARENA_LAZY: take the lowest free slot for arena_worker (so the slots in use
 * stay the low ones and a ring's resident memory is the most slots ever in use
 * at once), or none (-1) when every slot is taken.  Mutex held. */
static void
claim_now(fl_shmring *r)
{
    r->arena_slot = -1;
    for (int i = 0; i < r->nslots; i++) {
        int expect = CLAIM_FREE;
        if (atomic_compare_exchange_strong(&r->claims[i], &expect, r->arena_worker + 1)) {
            r->arena_slot = i;
            return;
        }
    }
}

int
fl_shmring_arena_slot(fl_shmring *r)
{
    pthread_mutex_lock(&r->mu);
    int s = r->arena_slot >= 0 ? r->arena_slot : -1;
    pthread_mutex_unlock(&r->mu);
    return s;
}

void *
fl_shmring_arena_alloc(fl_shmring *r, size_t nbytes, size_t *offset)
{
    void *p = NULL;
    pthread_mutex_lock(&r->mu);
    if (r->arena_slot == ARENA_LAZY)
        claim_now(r);
    if (r->arena_slot >= 0) {
        size_t start = (r->arena_used + FL_SHMRING_ALIGN - 1) / FL_SHMRING_ALIGN * FL_SHMRING_ALIGN;
        if (start <= r->slot_bytes && nbytes <= r->slot_bytes - start) {
            p = fl_shmring_slot_base(r, r->arena_slot) + start;
            r->arena_used = start + nbytes;
            if (offset)
                *offset = start;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return p;
}

size_t
fl_shmring_arena_used(fl_shmring *r)
{
    pthread_mutex_lock(&r->mu);
    size_t n = r->arena_slot >= 0 ? r->arena_used : 0;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* ---- page-locking ----------------------------------------------------------- */

int
fl_shmring_pin(fl_shmring *r, int slot, size_t nbytes, int device, const fl_pinner *pinner, fl_err *err)
{
    if (slot < 0 || slot >= r->nslots || nbytes == 0)
        return 0;
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0)
        page = 4096;
    size_t want = (nbytes + (size_t)page - 1) / (size_t)page * (size_t)page;
    if (want > r->slot_bytes)
        want = r->slot_bytes;
    pthread_mutex_lock(&r->mu);
    size_t have = r->pinned[slot];
    const fl_pinner *had = r->pinner;
    pthread_mutex_unlock(&r->mu);
    if (have) /* locked once; a later, larger batch is not re-locked */
        return 0;
    if (had && had != pinner) {
        set_err(err, FL_ERR_INVALID, 0, "the ring's slots are page-locked by another pinner");
        return -1;
    }
    if (pinner->lock(device, fl_shmring_slot_base(r, slot), want, err) != 0)
        return -1;
    pthread_mutex_lock(&r->mu);
    r->pinner = pinner;
    r->pinned[slot] = want;
    r->pinned_dev[slot] = device;
    pthread_mutex_unlock(&r->mu);
    return 0;
}

size_t
fl_shmring_pinned_bytes(fl_shmring *r, int slot)
{
    if (slot < 0 || slot >= r->nslots)
        return 0;
    pthread_mutex_lock(&r->mu);
    size_t n = r->pinned[slot];
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* ---- references -------------------------------------------------------------- */

void
fl_shmring_ref(fl_shmring *r)
{
    pthread_mutex_lock(&r->mu);
    r->refs++;
    pthread_mutex_unlock(&r->mu);
}

int
fl_shmring_unref(fl_shmring *r)
{
    if (!r)
        return 0;
    pthread_mutex_lock(&r->mu);
    int last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    return last;
}

void
fl_shmring_destroy(fl_shmring *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->nslots; i++) {
        if (r->pinned[i]) /* nothing to report to: the memory goes away next either way */
            (void)r->pinner->unlock(r->pinned_dev[i], fl_shmring_slot_base(r, i), NULL);
    }
    munmap(r->base, r->map_bytes);
    close(r->fd);
    pthread_mutex_destroy(&r->mu);
    free(r->pinned);
    free(r->pinned_dev);
    free(r->slot_refs);
    free(r);
}
