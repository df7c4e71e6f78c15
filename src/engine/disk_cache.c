/* disk_cache.c - the disk tier's index: the lock, the rebuild at start,
 * packs, lookups, reads, LRU eviction under the byte budget
 * (lm_disk_cache.h).
 *
 * The index lives in memory only: entries (hash, kind, pack, where their
 * payload lies, its checksum, state) in a growable array found through
 * hash buckets and linked into one LRU list (head = most recently used),
 * and packs (the files) each listing its entries in file order. Puts build
 * a pack (lm_dcache_batch_begin/end: a chain's blocks go into one file,
 * its checkpoints into another);
 * its entries are PENDING until the writer reports the file in place
 * (READY) or failed (removed); only READY entries are read or evicted.
 *
 * Eviction is by entry, LRU: an entry evicted from the end of its pack
 * truncates the file there, the last one of a pack deletes it. A chain's
 * pack holds its blocks in chain order and chains are touched leaf first,
 * so the LRU takes a pack from its end and truncation frees the space
 * without rewriting a byte; an entry evicted inside a pack keeps its bytes
 * (counted against the budget) until the entries after it go. That is
 * cheaper and safer than compaction (no rewrite of live data, no second
 * copy on the disk), and the cost is bounded: a pack holds at most
 * PACK_BYTES.
 *
 * A read takes a span of its pack (whole entries, up to SPAN_BYTES from
 * the entry on) into a buffer in one read, and the reads of the entries
 * that follow in the same pack come from it: a restore of thousands of blocks is tens of
 * large reads. Every entry's checksum is verified on every read.
 *
 * At start the directory is scanned and each pack's header and table read
 * and checked (payloads are checked on read), oldest modification time at
 * the LRU tail. One mutex guards the index; the engine thread and the
 * writer thread both take it briefly; a second one the read buffer. */
#include "disk_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define WRITER_JOBS 4096                  /* packs the writer may have queued */
#define WRITER_BYTES ((size_t)256 << 20)  /* and bytes */
#define PACK_BYTES ((size_t)8 << 20)      /* a pack is sealed once its payloads reach this */
#define SPAN_BYTES ((size_t)16 << 20)     /* a read takes up to this much of a pack: one of entries <= 8 MiB whole */

typedef enum { E_FREE, E_PENDING, E_READY } e_state;

typedef struct dc_entry {
    uint64_t hash, parent;   /* the prefix it ends, and the one before it */
    uint64_t offset, bytes;  /* its payload in its pack's file */
    uint64_t xxh3;           /* the payload's checksum (from the pack's table) */
    lm_dc_kind kind;
    e_state state;
    uint32_t n_tokens;
    int32_t pack;            /* its pack's slot */
    int32_t hnext, pnext, prev, next, kprev, knext; /* hash bucket, parent bucket, LRU, its pack in file order */
} dc_entry;

typedef struct dc_pack {
    uint64_t id;             /* the file's number */
    e_state state;
    uint64_t size;           /* READY: the file's bytes */
    int32_t first, last;     /* its entries in file order */
    double ftime;            /* lm_now() when its file's time was last set (written, read, touched) */
} dc_pack;

/* A pack being built: its slot (-1: none), records and payloads. */
typedef struct dc_build {
    int32_t pack;
    lm_dc_record *rec;
    int n_rec, cap_rec;
    uint8_t *body;
    size_t body_len, body_cap;
} dc_build;

struct lm_disk_cache {
    pthread_mutex_t mu;
    char *dir;
    int dirfd, lockfd;
    uint64_t ident[2];
    dc_entry *e;
    int cap, n_ready;
    int32_t *free_e;         /* [cap] stack */
    int n_free;
    int32_t *bucket;         /* [nb] by (hash, kind) */
    int32_t *pbucket;        /* [nb] by parent: a prefix's children (a hit ending mid-block) */
    size_t nb;
    int32_t lru_head, lru_tail;
    dc_pack *p;
    int p_cap;
    int32_t *free_p;         /* [p_cap] stack */
    int n_free_p;
    uint64_t next_id;        /* the next pack's number: above every one in the directory */
    size_t bytes;            /* of READY packs' files */
    int batch_depth;
    dc_build build[2];       /* by kind - 1: a restore reads KV blocks, with no checkpoints between them */
    uint64_t write_failures; /* packs: the log's cadence */
    lm_dc_stats st;
    lm_dc_faults faults;
    lm_dc_writer *writer;
    double touch_every_s;    /* a touch sets the file's time at most this often */
    /* reads: a span of one pack, [rlo, rhi) of pack rpack (rhi == rlo: none) */
    pthread_mutex_t rmu;
    uint8_t *rbuf;           /* [SPAN_BYTES] once used */
    uint64_t rpack, rlo, rhi;
};

/* The file times carry the LRU order across a restart (the index is rebuilt
 * in their order): a write and a read set them; an entry used from RAM is
 * touched, and the writer sets its pack's file time, at most once a minute. */
#define TOUCH_EVERY_S 60.0

/* ---- the table ---- */

static size_t bucket_of(const lm_disk_cache *dc, uint64_t hash, lm_dc_kind kind) {
    return (size_t)((hash ^ (uint64_t)kind * 0x9e3779b97f4a7c15ull) & (dc->nb - 1));
}

static size_t pbucket_of(const lm_disk_cache *dc, uint64_t parent) {
    return (size_t)((parent * 0x9e3779b97f4a7c15ull) >> 17 & (dc->nb - 1));
}

static int32_t find(const lm_disk_cache *dc, uint64_t hash, lm_dc_kind kind) {
    for (int32_t i = dc->bucket[bucket_of(dc, hash, kind)]; i >= 0; i = dc->e[i].hnext)
        if (dc->e[i].hash == hash && dc->e[i].kind == kind) return i;
    return -1;
}

static void lru_unlink(lm_disk_cache *dc, int32_t i) {
    dc_entry *x = &dc->e[i];
    if (x->prev >= 0) dc->e[x->prev].next = x->next;
    else dc->lru_head = x->next;
    if (x->next >= 0) dc->e[x->next].prev = x->prev;
    else dc->lru_tail = x->prev;
    x->prev = x->next = -1;
}

static void lru_push_front(lm_disk_cache *dc, int32_t i) {
    dc_entry *x = &dc->e[i];
    x->prev = -1;
    x->next = dc->lru_head;
    if (dc->lru_head >= 0) dc->e[dc->lru_head].prev = i;
    dc->lru_head = i;
    if (dc->lru_tail < 0) dc->lru_tail = i;
}

/* Links entry i into its two buckets. */
static void link_buckets(lm_disk_cache *dc, int32_t i) {
    size_t b = bucket_of(dc, dc->e[i].hash, dc->e[i].kind), p = pbucket_of(dc, dc->e[i].parent);
    dc->e[i].hnext = dc->bucket[b];
    dc->bucket[b] = i;
    dc->e[i].pnext = dc->pbucket[p];
    dc->pbucket[p] = i;
}

static void rehash(lm_disk_cache *dc, size_t nb) {
    free(dc->bucket);
    free(dc->pbucket);
    dc->nb = nb;
    dc->bucket = lm_xmalloc(nb * sizeof(int32_t));
    dc->pbucket = lm_xmalloc(nb * sizeof(int32_t));
    for (size_t b = 0; b < nb; b++) dc->bucket[b] = dc->pbucket[b] = -1;
    for (int32_t i = 0; i < dc->cap; i++)
        if (dc->e[i].state != E_FREE) link_buckets(dc, i);
}

/* A new pack slot with no entries. */
static int32_t pack_new(lm_disk_cache *dc, uint64_t id, e_state state) {
    if (dc->n_free_p == 0) {
        int old = dc->p_cap, cap = old ? old * 2 : 64;
        dc->p = lm_xrealloc(dc->p, (size_t)cap * sizeof *dc->p);
        dc->free_p = lm_xrealloc(dc->free_p, (size_t)cap * sizeof(int32_t));
        for (int i = cap - 1; i >= old; i--) dc->free_p[dc->n_free_p++] = i;
        dc->p_cap = cap;
    }
    int32_t k = dc->free_p[--dc->n_free_p];
    dc->p[k] = (dc_pack){ .id = id, .state = state, .first = -1, .last = -1, .ftime = -1e300 };
    return k;
}

static void pack_free(lm_disk_cache *dc, int32_t k) {
    dc->p[k].state = E_FREE;
    dc->free_p[dc->n_free_p++] = k;
}

/* A new entry of pack k at the LRU head, at the end of the pack's list (at
 * its start when first: the rebuild adds a pack's entries last to first). */
static int32_t add(lm_disk_cache *dc, const lm_dc_record *r, int32_t k, e_state state, bool first) {
    if (dc->n_free == 0) {
        int old = dc->cap, cap = old ? old * 2 : 1024;
        dc->e = lm_xrealloc(dc->e, (size_t)cap * sizeof *dc->e);
        dc->free_e = lm_xrealloc(dc->free_e, (size_t)cap * sizeof(int32_t));
        for (int i = cap - 1; i >= old; i--) {
            dc->e[i].state = E_FREE;
            dc->free_e[dc->n_free++] = i;
        }
        dc->cap = cap;
        rehash(dc, (size_t)cap * 2);
    }
    int32_t i = dc->free_e[--dc->n_free];
    dc->e[i] = (dc_entry){ .hash = r->hash, .parent = r->parent, .offset = r->offset, .bytes = r->bytes,
                           .xxh3 = r->payload_xxh3, .kind = (lm_dc_kind)r->kind, .state = state,
                           .n_tokens = r->n_tokens, .pack = k, .prev = -1, .next = -1, .kprev = -1, .knext = -1 };
    link_buckets(dc, i);
    lru_push_front(dc, i);
    dc_pack *p = &dc->p[k];
    if (p->first < 0) p->first = p->last = i;
    else if (first) dc->e[i].knext = p->first, dc->e[p->first].kprev = i, p->first = i;
    else dc->e[i].kprev = p->last, dc->e[p->last].knext = i, p->last = i;
    if (state == E_READY) dc->n_ready++;
    return i;
}

/* Forgets entry i (its file is the caller's business). */
static void drop(lm_disk_cache *dc, int32_t i) {
    dc_entry *x = &dc->e[i];
    int32_t *link = &dc->bucket[bucket_of(dc, x->hash, x->kind)];
    while (*link != i) link = &dc->e[*link].hnext;
    *link = x->hnext;
    link = &dc->pbucket[pbucket_of(dc, x->parent)];
    while (*link != i) link = &dc->e[*link].pnext;
    *link = x->pnext;
    lru_unlink(dc, i);
    dc_pack *p = &dc->p[x->pack];
    if (x->kprev >= 0) dc->e[x->kprev].knext = x->knext;
    else p->first = x->knext;
    if (x->knext >= 0) dc->e[x->knext].kprev = x->kprev;
    else p->last = x->kprev;
    if (x->state == E_READY) dc->n_ready--;
    x->state = E_FREE;
    dc->free_e[dc->n_free++] = i;
}

/* Pack k's file cut to end bytes (its entries past end are gone), or
 * deleted when end is 0; the bytes counted follow what the disk holds. */
static void pack_shrink(lm_disk_cache *dc, int32_t k, uint64_t end) {
    dc_pack *p = &dc->p[k];
    char name[LM_DC_NAME_MAX];
    lm_dc_pack_name(name, p->id);
    if (end == 0) {
        unlinkat(dc->dirfd, name, 0);
        dc->bytes -= p->size;
        pack_free(dc, k);
        return;
    }
    int fd = openat(dc->dirfd, name, O_WRONLY | O_CLOEXEC);
    /* a truncation that fails leaves valid entries no one indexes: counted
     * until the pack goes; a crash before it reaches the disk, the same */
    if (fd >= 0 && ftruncate(fd, (off_t)end) == 0) {
        dc->bytes -= p->size - end;
        p->size = end;
    }
    if (fd >= 0) close(fd);
}

/* Forgets READY entry i and gives back what its file then no longer needs. */
static void forget(lm_disk_cache *dc, int32_t i) {
    int32_t k = dc->e[i].pack;
    bool last = dc->p[k].last == i;
    drop(dc, i);
    const dc_pack *p = &dc->p[k];
    if (p->first < 0) pack_shrink(dc, k, 0);
    else if (last) pack_shrink(dc, k, dc->e[p->last].offset + dc->e[p->last].bytes);
}

/* Least recently used READY entries go until the bytes fit the budget. */
static void evict_to(lm_disk_cache *dc, size_t bytes) {
    int32_t i = dc->lru_tail;
    while (dc->bytes > bytes && i >= 0) {
        int32_t prev = dc->e[i].prev;
        if (dc->e[i].state == E_READY) {
            forget(dc, i);
            dc->st.evicted++;
        }
        i = prev;
    }
}

static void evict_to_budget(lm_disk_cache *dc) { evict_to(dc, dc->st.budget); }

/* ---- open: lock, clean, rebuild ---- */

static int take_lock(lm_disk_cache *dc, lm_err *e) {
    dc->lockfd = openat(dc->dirfd, "lock", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (dc->lockfd < 0) return lm_errf(e, "--cache-dir %s: cannot open its lock file: %s", dc->dir, strerror(errno));
    if (flock(dc->lockfd, LOCK_EX | LOCK_NB) != 0) {
        char pid[32] = "";
        ssize_t n = pread(dc->lockfd, pid, sizeof pid - 1, 0);
        pid[n > 0 ? n : 0] = 0;
        pid[strcspn(pid, "\n")] = 0;
        lm_errf(e, "--cache-dir %s is in use by another lumen process%s%s%s; give each server its own directory",
                dc->dir, *pid ? " (pid " : "", pid, *pid ? ")" : "");
        return LM_DC_REFUSED;
    }
    /* the pid only serves the message a second process prints: failing to write it is harmless */
    char line[32];
    int n = snprintf(line, sizeof line, "%ld\n", (long)getpid());
    bool told = ftruncate(dc->lockfd, 0) == 0 && pwrite(dc->lockfd, line, (size_t)n, 0) == n;
    (void)told;
    return 0;
}

/* A pack found at start: its table, until the index takes it in mtime order. */
typedef struct found {
    uint64_t id, size;
    double mtime;
    lm_dc_record *rec;
    int n;
} found;

static int by_mtime(const void *a, const void *b) {
    double x = ((const found *)a)->mtime, y = ((const found *)b)->mtime;
    return (x > y) - (x < y);
}

/* A pack that cannot be used: counted as n entries of why, logged, deleted. */
static void scan_discard(lm_disk_cache *dc, const char *name, int err, uint64_t n) {
    if (err) {
        fprintf(stderr, "lumen: disk cache: %s/%s cannot be read: %s; deleted\n", dc->dir, name, strerror(err));
        dc->st.read_errors += n;
    } else {
        fprintf(stderr, "lumen: disk cache: %s/%s is torn or corrupt; deleted\n", dc->dir, name);
        dc->st.corrupt += n;
    }
    unlinkat(dc->dirfd, name, 0);
}

/* Reads the header and table of one file; what it is decides what happens
 * to it. */
static void scan_one(lm_disk_cache *dc, const char *name, found **list, int *n, int *cap) {
    uint64_t id;
    if (strncmp(name, LM_DC_TMP_PREFIX, strlen(LM_DC_TMP_PREFIX)) == 0) {
        if (unlinkat(dc->dirfd, name, 0) == 0) dc->st.temp_cleaned++;
        return;
    }
    if (lm_dc_v1_name(name)) { /* one entry a file: no reader of this version reads it, nor counts its bytes */
        if (unlinkat(dc->dirfd, name, 0) == 0) dc->st.old_format++;
        return;
    }
    if (!lm_dc_pack_parse(name, &id)) return;
    if (id >= dc->next_id) dc->next_id = id + 1;
    int fd = openat(dc->dirfd, name, O_RDONLY | O_CLOEXEC);
    int err = fd < 0 ? errno : lm_dc_fault(&dc->faults, LM_DC_OP_SCAN);
    lm_dc_pack_header h;
    struct stat sb;
    if (!err && fstat(fd, &sb) != 0) err = errno;
    ssize_t got_n = err ? 0 : pread(fd, &h, sizeof h, 0);
    if (got_n < 0) err = errno;
    lm_dc_check c = got_n == (ssize_t)sizeof h ? lm_dc_header_check(&h, dc->ident, (uint64_t)sb.st_size) : LM_DC_CORRUPT;
    lm_dc_record *rec = NULL;
    if (!err && c == LM_DC_OK) {
        size_t tb = (size_t)h.n_entries * sizeof *rec;
        rec = lm_xmalloc(tb);
        ssize_t r = pread(fd, rec, tb, sizeof h);
        if (r < 0) err = errno;
        else if ((size_t)r != tb || !lm_dc_table_ok(&h, rec)) c = LM_DC_CORRUPT;
    }
    if (fd >= 0) close(fd);
    if (err == ENOENT) {
    } else if (err || c == LM_DC_CORRUPT) { /* unreadable (EIO, EACCES) or bad: never served, deleted */
        scan_discard(dc, name, err, rec ? h.n_entries : 1); /* a bad table costs its entries */
    } else if (c == LM_DC_FOREIGN) {
        dc->st.foreign += h.n_entries;
    } else {
        if (*n == *cap) {
            *cap = *cap ? *cap * 2 : 256;
            *list = lm_xrealloc(*list, (size_t)*cap * sizeof **list);
        }
        double mtime = (double)sb.st_mtim.tv_sec + 1e-9 * (double)sb.st_mtim.tv_nsec;
        (*list)[(*n)++] = (found){ id, (uint64_t)sb.st_size, mtime, rec, (int)h.n_entries };
        return;
    }
    free(rec);
}

/* Pack f into the index, its first entry the most recent; entries that
 * another pack holds already are left out, one cut short by the file's
 * end is counted corrupt, the file cut to what is indexed. */
static void take_pack(lm_disk_cache *dc, const found *f) {
    int32_t k = pack_new(dc, f->id, E_READY);
    dc->p[k].size = f->size;
    dc->bytes += f->size;
    uint64_t prev_end = lm_dc_head_bytes(f->n);
    int n_ok = 0;
    for (int j = 0; j < f->n; j++) { /* records out of order or overlapping: the pack is not ours to trust */
        if (!lm_dc_record_ok(&f->rec[j], prev_end)) break;
        prev_end = f->rec[j].offset + f->rec[j].bytes;
        n_ok++;
    }
    if (n_ok < f->n) dc->st.corrupt += (uint64_t)(f->n - n_ok);
    for (int j = n_ok - 1; j >= 0; j--) {
        const lm_dc_record *r = &f->rec[j];
        if (r->offset + r->bytes > f->size) { /* past the end: cut by an eviction, or torn when cut inside */
            if (r->offset < f->size) dc->st.corrupt++;
            continue;
        }
        if (find(dc, r->hash, (lm_dc_kind)r->kind) < 0) add(dc, r, k, E_READY, true);
    }
    const dc_pack *p = &dc->p[k];
    uint64_t end = p->last >= 0 ? dc->e[p->last].offset + dc->e[p->last].bytes : 0;
    if (end < f->size) pack_shrink(dc, k, end);
}

static int rebuild(lm_disk_cache *dc, lm_err *e) {
    int fd = dup(dc->dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return lm_errf(e, "--cache-dir %s: %s", dc->dir, strerror(errno));
    }
    found *list = NULL;
    int n = 0, cap = 0;
    for (struct dirent *de; (de = readdir(d));) scan_one(dc, de->d_name, &list, &n, &cap);
    closedir(d);
    if (n) qsort(list, (size_t)n, sizeof *list, by_mtime);
    for (int i = 0; i < n; i++) {
        take_pack(dc, &list[i]);
        free(list[i].rec);
    }
    free(list);
    if (dc->st.old_format)
        fprintf(stderr, "lumen: disk cache: %llu entries of an older cache format in %s deleted\n",
                (unsigned long long)dc->st.old_format, dc->dir);
    evict_to_budget(dc);
    return 0;
}

static void on_written(void *user, const lm_dc_job *job, int err);

int lm_dcache_open(lm_disk_cache **out, const char *dir, size_t budget, const uint64_t ident[2], lm_err *e) {
    return lm_dcache_open_with_faults(out, dir, budget, ident, NULL, e);
}

int lm_dcache_open_with_faults(lm_disk_cache **out, const char *dir, size_t budget, const uint64_t ident[2],
                               const char *faults, lm_err *e) {
    *out = NULL;
    double t0 = lm_now();
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return lm_errf(e, "--cache-dir %s: %s", dir, strerror(errno));
    lm_disk_cache *dc = lm_xcalloc(1, sizeof *dc);
    dc->dir = lm_xstrdup(dir);
    dc->lockfd = -1;
    dc->ident[0] = ident[0], dc->ident[1] = ident[1];
    dc->lru_head = dc->lru_tail = -1;
    dc->build[0].pack = dc->build[1].pack = -1;
    dc->next_id = 1;
    dc->st.budget = budget;
    dc->touch_every_s = TOUCH_EVERY_S;
    pthread_mutex_init(&dc->mu, NULL);
    pthread_mutex_init(&dc->rmu, NULL);
    rehash(dc, 16);
    dc->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = lm_dcache_inject_spec(dc, faults, e) ? LM_DC_REFUSED : 0;
    if (!rc) rc = dc->dirfd < 0 ? lm_errf(e, "--cache-dir %s: %s", dir, strerror(errno)) : take_lock(dc, e);
    if (!rc) rc = rebuild(dc, e);
    if (rc) {
        lm_dcache_close(dc);
        return rc;
    }
    dc->writer = lm_dc_writer_create(dc->dirfd, WRITER_JOBS, WRITER_BYTES, &dc->faults, on_written, dc);
    dc->st.open_s = lm_now() - t0;
    *out = dc;
    return 0;
}

static int seal(lm_disk_cache *dc, dc_build *b);

void lm_dcache_close(lm_disk_cache *dc) {
    if (!dc) return;
    if (dc->writer) {
        pthread_mutex_lock(&dc->mu);
        for (int k = 0; k < 2; k++) /* a batch left open is written too */
            if (dc->build[k].pack >= 0) seal(dc, &dc->build[k]);
        pthread_mutex_unlock(&dc->mu);
    }
    lm_dc_writer_free(dc->writer);
    if (dc->lockfd >= 0) close(dc->lockfd); /* closing drops the flock */
    if (dc->dirfd >= 0) close(dc->dirfd);
    pthread_mutex_destroy(&dc->mu);
    pthread_mutex_destroy(&dc->rmu);
    free(dc->e);
    free(dc->free_e);
    free(dc->bucket);
    free(dc->pbucket);
    free(dc->p);
    free(dc->free_p);
    for (int k = 0; k < 2; k++) free(dc->build[k].rec), free(dc->build[k].body);
    free(dc->rbuf);
    free(dc->dir);
    free(dc);
}

/* ---- writes ---- */

static void on_written(void *user, const lm_dc_job *job, int err) {
    lm_disk_cache *dc = user;
    pthread_mutex_lock(&dc->mu);
    dc_pack *p = &dc->p[job->slot];
    LM_ASSERT(p->state == E_PENDING && p->id == job->pack);
    uint64_t n = 0;
    for (int32_t i = p->first; i >= 0; i = dc->e[i].knext) n++;
    if (err) {
        /* one line for the 1st, 2nd, 4th, 8th ... failure: a full disk fails every write */
        uint64_t f = ++dc->write_failures;
        dc->st.write_errors += n;
        if ((f & (f - 1)) == 0)
            fprintf(stderr, "lumen: disk cache: writing %llu entries to %s failed: %s; they are not kept (%llu so far)\n",
                    (unsigned long long)n, dc->dir, strerror(err), (unsigned long long)dc->st.write_errors);
        while (p->first >= 0) drop(dc, p->first);
        pack_free(dc, job->slot);
        /* the disk is fuller than the budget allows for: newer entries take the place of the oldest eighth */
        if (err == ENOSPC) evict_to(dc, dc->bytes - dc->bytes / 8);
    } else {
        p->state = E_READY;
        p->size = job->blob.head_len + job->blob.body_len;
        p->ftime = lm_now();
        for (int32_t i = p->first; i >= 0; i = dc->e[i].knext) dc->e[i].state = E_READY;
        dc->bytes += p->size;
        dc->n_ready += (int)n;
        dc->st.writes += n;
        evict_to_budget(dc);
    }
    pthread_mutex_unlock(&dc->mu);
}

/* Hands the pack being built to the writer (under mu). 0, or -1 when its
 * queue is full: the entries are dropped. */
static int seal(lm_disk_cache *dc, dc_build *b) {
    int32_t k = b->pack;
    b->pack = -1;
    lm_dc_job job = { .pack = dc->p[k].id, .slot = k, .blob = { .body = b->body, .body_len = b->body_len } };
    b->body = NULL;
    b->body_len = b->body_cap = 0;
    lm_dc_pack_seal(&job.blob, dc->ident, b->rec, b->n_rec);
    b->n_rec = 0;
    for (int32_t i = dc->p[k].first; i >= 0; i = dc->e[i].knext) dc->e[i].offset += job.blob.head_len;
    if (lm_dc_writer_push(dc->writer, &job)) return 0;
    free(job.blob.head);
    free(job.blob.body);
    while (dc->p[k].first >= 0) {
        drop(dc, dc->p[k].first);
        dc->st.dropped++;
    }
    pack_free(dc, k);
    return -1;
}

void lm_dcache_batch_begin(lm_disk_cache *dc) {
    pthread_mutex_lock(&dc->mu);
    dc->batch_depth++;
    pthread_mutex_unlock(&dc->mu);
}

void lm_dcache_batch_end(lm_disk_cache *dc) {
    pthread_mutex_lock(&dc->mu);
    LM_ASSERT(dc->batch_depth > 0);
    if (--dc->batch_depth == 0)
        for (int k = 0; k < 2; k++)
            if (dc->build[k].pack >= 0) seal(dc, &dc->build[k]);
    pthread_mutex_unlock(&dc->mu);
}

bool lm_dcache_has(lm_disk_cache *dc, uint64_t hash, lm_dc_kind kind) {
    pthread_mutex_lock(&dc->mu);
    bool has = find(dc, hash, kind) >= 0;
    pthread_mutex_unlock(&dc->mu);
    return has;
}

bool lm_dcache_ready(lm_disk_cache *dc, uint64_t hash, lm_dc_kind kind) {
    pthread_mutex_lock(&dc->mu);
    int32_t i = find(dc, hash, kind);
    bool ready = i >= 0 && dc->e[i].state == E_READY;
    pthread_mutex_unlock(&dc->mu);
    return ready;
}

/* n bytes at the end of pack being built. */
static uint8_t *body_append(dc_build *b, size_t n) {
    if (b->body_len + n > b->body_cap) {
        b->body_cap = LM_MAX(b->body_len + n, b->body_cap * 2);
        b->body = lm_xrealloc(b->body, b->body_cap);
    }
    b->body_len += n;
    return b->body + b->body_len - n;
}

int lm_dcache_put(lm_disk_cache *dc, uint64_t hash, uint64_t parent, lm_dc_kind kind, const int32_t *tokens,
                  int n_tokens, const void *data, size_t n) {
    pthread_mutex_lock(&dc->mu);
    int32_t i = find(dc, hash, kind);
    if (i >= 0) {
        lru_unlink(dc, i);
        lru_push_front(dc, i);
        pthread_mutex_unlock(&dc->mu);
        return 1;
    }
    dc_build *b = &dc->build[kind - 1];
    if (b->pack < 0) b->pack = pack_new(dc, dc->next_id++, E_PENDING);
    size_t tb = (size_t)n_tokens * sizeof(int32_t);
    uint64_t at = b->body_len; /* from the body's start until the pack is sealed */
    uint8_t *dst = body_append(b, tb + n);
    memcpy(dst, tokens, tb);
    memcpy(dst + tb, data, n);
    if (b->n_rec == b->cap_rec) {
        b->cap_rec = b->cap_rec ? b->cap_rec * 2 : 64;
        b->rec = lm_xrealloc(b->rec, (size_t)b->cap_rec * sizeof *b->rec);
    }
    lm_dc_record *r = &b->rec[b->n_rec++];
    *r = (lm_dc_record){ .hash = hash, .parent = parent, .offset = at, .bytes = tb + n,
                         .payload_xxh3 = XXH3_64bits(dst, tb + n), .kind = (uint32_t)kind,
                         .n_tokens = (uint32_t)n_tokens };
    add(dc, r, b->pack, E_PENDING, false);
    int rc = dc->batch_depth == 0 || b->body_len >= PACK_BYTES || b->n_rec >= (int)LM_DC_PACK_MAX ? seal(dc, b) : 0;
    pthread_mutex_unlock(&dc->mu);
    return rc;
}

void lm_dcache_touch(lm_disk_cache *dc, uint64_t hash, lm_dc_kind kind) {
    pthread_mutex_lock(&dc->mu);
    int32_t i = find(dc, hash, kind);
    bool stale = false;
    lm_dc_job job = { .slot = -1 };
    if (i >= 0) {
        lru_unlink(dc, i);
        lru_push_front(dc, i);
        dc_pack *p = &dc->p[dc->e[i].pack];
        double now = lm_now();
        if ((stale = p->state == E_READY && now - p->ftime >= dc->touch_every_s)) p->ftime = now, job.pack = p->id;
    }
    pthread_mutex_unlock(&dc->mu);
    /* the writer sets the pack's file time (no blob: a touch); a busy writer skips it */
    if (stale) (void)lm_dc_writer_push(dc->writer, &job);
}

void lm_dcache_set_touch_interval(lm_disk_cache *dc, double seconds) {
    pthread_mutex_lock(&dc->mu);
    dc->touch_every_s = seconds;
    pthread_mutex_unlock(&dc->mu);
}

void lm_dcache_flush(lm_disk_cache *dc) { lm_dc_writer_flush(dc->writer); }

/* ---- reads ---- */

/* What a read needs of a READY entry, copied under the lock. */
typedef struct where {
    uint64_t hash, pack, offset, bytes, xxh3, parent;
    lm_dc_kind kind;
    uint32_t n_tokens;
} where;

static bool locate(lm_disk_cache *dc, uint64_t hash, lm_dc_kind kind, where *w) {
    pthread_mutex_lock(&dc->mu);
    int32_t i = find(dc, hash, kind);
    bool ok = i >= 0 && dc->e[i].state == E_READY;
    if (ok) {
        const dc_entry *x = &dc->e[i];
        *w = (where){ hash, dc->p[x->pack].id, x->offset, x->bytes, x->xxh3, x->parent, kind, x->n_tokens };
    }
    pthread_mutex_unlock(&dc->mu);
    return ok;
}

/* A failed read: counted, logged, and the entry (ours, but bad) dropped
 * from the index and, at its pack's end, from the file. */
static void read_failed(lm_disk_cache *dc, uint64_t hash, lm_dc_kind kind, const char *what, bool corrupt) {
    pthread_mutex_lock(&dc->mu);
    if (corrupt) dc->st.corrupt++;
    else dc->st.read_errors++;
    int32_t i = find(dc, hash, kind);
    if (i >= 0 && dc->e[i].state == E_READY) forget(dc, i);
    pthread_mutex_unlock(&dc->mu);
    fprintf(stderr, "lumen: disk cache: %s: entry %016llx.%s: %s; dropped, the prefix is computed again\n", dc->dir,
            (unsigned long long)hash, kind == LM_DC_KV ? "kv" : "st", what);
}

/* After a read of w failed with err: a plain miss (0) when the entry went
 * meanwhile (evicted, its file cut or deleted), else counted as bad. */
static void read_error(lm_disk_cache *dc, uint64_t hash, lm_dc_kind kind, const where *w, int err) {
    where now;
    if (!locate(dc, hash, kind, &now) || now.pack != w->pack) return;
    if (err == EBADMSG) read_failed(dc, hash, kind, "its file ends early (torn or truncated)", true);
    else read_failed(dc, hash, kind, strerror(err), false);
}

/* The payload of w in the read buffer: from it when it is there, else read
 * with the entries that follow it in the pack, whole, up to SPAN_BYTES
 * (under rmu). NULL with *err on failure. */
static const uint8_t *span(lm_disk_cache *dc, const where *w, int *err) {
    if (w->pack == dc->rpack && w->offset >= dc->rlo && w->offset + w->bytes <= dc->rhi)
        return dc->rbuf + (w->offset - dc->rlo);
    if (!dc->rbuf) dc->rbuf = lm_xmalloc(SPAN_BYTES);
    /* the entries after it in its pack that fit whole (none cut in two: it would be read twice) */
    uint64_t end = w->offset + w->bytes;
    pthread_mutex_lock(&dc->mu);
    int32_t i = find(dc, w->hash, w->kind);
    for (int32_t j = i >= 0 && dc->e[i].offset == w->offset ? dc->e[i].knext : -1;
         j >= 0 && dc->e[j].offset + dc->e[j].bytes - w->offset <= SPAN_BYTES; j = dc->e[j].knext)
        end = dc->e[j].offset + dc->e[j].bytes;
    pthread_mutex_unlock(&dc->mu);
    size_t len = (size_t)(end - w->offset);
    struct iovec iov = { dc->rbuf, len };
    dc->rhi = dc->rlo;
    if ((*err = lm_dc_pack_read(dc->dirfd, w->pack, w->offset, &iov, 1, &dc->faults))) return NULL;
    dc->rpack = w->pack, dc->rlo = w->offset, dc->rhi = w->offset + len;
    return dc->rbuf;
}

static uint64_t sum2(const void *a, size_t na, const void *b, size_t nb) {
    XXH3_state_t *s = XXH3_createState();
    LM_ASSERT(s);
    XXH3_64bits_reset(s);
    XXH3_64bits_update(s, a, na);
    XXH3_64bits_update(s, b, nb);
    uint64_t h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h;
}

int lm_dcache_get(lm_disk_cache *dc, uint64_t hash, uint64_t parent, lm_dc_kind kind, const int32_t *tokens,
                  int n_tokens, void *data, size_t n) {
    where w;
    if (!locate(dc, hash, kind, &w)) return -1;
    size_t tb = (size_t)n_tokens * sizeof(int32_t);
    if (w.parent != parent || w.n_tokens != (uint32_t)n_tokens || w.bytes != tb + n) {
        read_failed(dc, hash, kind, "holds another prefix", true);
        return -1;
    }
    int err = 0;
    const char *bad = NULL;
    pthread_mutex_lock(&dc->rmu);
    if (w.bytes > SPAN_BYTES) { /* larger than a span: straight into data, no copy */
        int32_t *got = lm_xmalloc(tb + 1);
        struct iovec iov[2] = { { got, tb }, { data, n } };
        if (!(err = lm_dc_pack_read(dc->dirfd, w.pack, w.offset, iov, 2, &dc->faults))) {
            if (sum2(got, tb, data, n) != w.xxh3) bad = "checksum mismatch";
            else if (memcmp(got, tokens, tb) != 0) bad = "holds another prefix";
        }
        free(got);
    } else {
        const uint8_t *p = span(dc, &w, &err);
        if (p) {
            if (sum2(p, tb, p + tb, n) != w.xxh3) bad = "checksum mismatch";
            else if (memcmp(p, tokens, tb) != 0) bad = "holds another prefix";
            else memcpy(data, p + tb, n);
        }
    }
    pthread_mutex_unlock(&dc->rmu);
    if (err || bad) {
        if (err) read_error(dc, hash, kind, &w, err);
        else read_failed(dc, hash, kind, bad, true);
        return -1;
    }
    pthread_mutex_lock(&dc->mu);
    dc->st.reads++;
    int32_t i = find(dc, hash, kind);
    if (i >= 0) {
        lru_unlink(dc, i);
        lru_push_front(dc, i);
        dc->p[dc->e[i].pack].ftime = lm_now(); /* the read set the file's time */
    }
    pthread_mutex_unlock(&dc->mu);
    return 0;
}

int lm_dcache_children(lm_disk_cache *dc, uint64_t parent, lm_dc_kind kind, uint64_t *out, int max) {
    int n = 0;
    pthread_mutex_lock(&dc->mu);
    for (int32_t i = dc->pbucket[pbucket_of(dc, parent)]; i >= 0 && n < max; i = dc->e[i].pnext)
        if (dc->e[i].parent == parent && dc->e[i].kind == kind && dc->e[i].state == E_READY) out[n++] = dc->e[i].hash;
    pthread_mutex_unlock(&dc->mu);
    return n;
}

int lm_dcache_peek(lm_disk_cache *dc, uint64_t hash, uint64_t parent, lm_dc_kind kind, int32_t *tokens, int n_tokens) {
    where w;
    if (!locate(dc, hash, kind, &w)) return -1;
    size_t tb = (size_t)n_tokens * sizeof(int32_t);
    if (w.parent != parent || w.n_tokens != (uint32_t)n_tokens) {
        read_failed(dc, hash, kind, "holds another prefix", true);
        return -1;
    }
    /* the tokens only: lm_dcache_get checks them with the payload */
    int err = 0;
    pthread_mutex_lock(&dc->rmu);
    if (w.pack == dc->rpack && w.offset >= dc->rlo && w.offset + tb <= dc->rhi) {
        memcpy(tokens, dc->rbuf + (w.offset - dc->rlo), tb);
    } else {
        struct iovec iov = { tokens, tb };
        err = lm_dc_pack_read(dc->dirfd, w.pack, w.offset, &iov, 1, &dc->faults);
    }
    pthread_mutex_unlock(&dc->rmu);
    if (err) read_error(dc, hash, kind, &w, err);
    return err ? -1 : 0;
}

void lm_dcache_willneed(lm_disk_cache *dc, const uint64_t *hash, int n, lm_dc_kind kind) {
    /* the entries' byte ranges, merged per pack: one advice per run of a pack */
    typedef struct { uint64_t pack, lo, hi; } range;
    range *r = lm_xmalloc((size_t)LM_MAX(n, 1) * sizeof *r);
    int nr = 0;
    pthread_mutex_lock(&dc->mu);
    for (int k = 0; k < n; k++) {
        int32_t i = find(dc, hash[k], kind);
        if (i < 0 || dc->e[i].state != E_READY) continue;
        const dc_entry *x = &dc->e[i];
        uint64_t id = dc->p[x->pack].id;
        if (nr && r[nr - 1].pack == id && x->offset >= r[nr - 1].lo && x->offset <= r[nr - 1].hi + SPAN_BYTES)
            r[nr - 1].hi = LM_MAX(r[nr - 1].hi, x->offset + x->bytes);
        else
            r[nr++] = (range){ id, x->offset, x->offset + x->bytes };
    }
    pthread_mutex_unlock(&dc->mu);
    char name[LM_DC_NAME_MAX];
    for (int k = 0; k < nr; k++) {
        lm_dc_pack_name(name, r[k].pack);
        int fd = openat(dc->dirfd, name, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        (void)posix_fadvise(fd, (off_t)r[k].lo, (off_t)(r[k].hi - r[k].lo), POSIX_FADV_WILLNEED); /* advice */
        close(fd);
    }
    free(r);
}

void lm_dcache_get_stats(lm_disk_cache *dc, lm_dc_stats *s) {
    pthread_mutex_lock(&dc->mu);
    *s = dc->st;
    s->bytes = dc->bytes;
    s->entries = dc->n_ready;
    pthread_mutex_unlock(&dc->mu);
}

void lm_dcache_inject(lm_disk_cache *dc, lm_dc_op op, int err, int skip, int times) {
    atomic_store(&dc->faults.err[op], err);
    atomic_store(&dc->faults.skip[op], skip);
    atomic_store(&dc->faults.times[op], times);
}

int lm_dcache_inject_spec(lm_disk_cache *dc, const char *spec, lm_err *e) {
    static const char *const ops[LM_DC_OP_N] = { "write", "fsync", "rename", "read", "scan" };
    static const struct { const char *name; int err; } errs[] = {
        { "ENOSPC", ENOSPC }, { "EIO", EIO }, { "EACCES", EACCES }, { "EROFS", EROFS }, { "EDQUOT", EDQUOT },
        { "ENOENT", ENOENT },
    };
    for (const char *p = spec; p && *p;) {
        size_t len = strcspn(p, ",");
        char item[64], op[16] = "", er[16] = "";
        int skip = 0, times = INT_MAX, k = -1, err = 0;
        snprintf(item, sizeof item, "%.*s", (int)LM_MIN(len, sizeof item - 1), p);
        int n = sscanf(item, "%15[a-z]:%15[A-Z0-9]:%d:%d", op, er, &skip, &times);
        for (int i = 0; i < LM_DC_OP_N; i++)
            if (strcmp(op, ops[i]) == 0) k = i;
        for (size_t i = 0; i < LM_COUNT(errs); i++)
            if (strcmp(er, errs[i].name) == 0) err = errs[i].err;
        if (!err && er[0] >= '0' && er[0] <= '9') err = atoi(er);
        if (n < 2 || k < 0 || err <= 0 || skip < 0 || times < 0)
            return lm_errf(e, "disk cache faults: '%s' is not OP:ERR[:SKIP[:TIMES]] (OP write, fsync, rename, read "
                              "or scan; ERR ENOSPC, EIO, ... or a number)", item);
        lm_dcache_inject(dc, (lm_dc_op)k, err, skip, times);
        p += len + (p[len] == ',');
    }
    return 0;
}
