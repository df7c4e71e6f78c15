/* disk_cache.c - the disk tier's index: the lock, the rebuild at start,
 * lookups, reads, LRU eviction under the byte budget (lm_disk_cache.h).
 *
 * The index lives in memory only: entries (hash, kind, bytes, state) in a
 * growable array found through hash buckets and linked into one LRU list
 * (head = most recently used). A put marks its entry PENDING until the
 * writer reports the file in place (READY) or failed (removed); only READY
 * entries are read or evicted. At start the directory is scanned and each
 * entry's header read and checked (payloads are checked on read), oldest
 * modification time at the LRU tail. One mutex guards it all; the engine
 * thread and the writer thread both take it briefly. */
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

#define WRITER_JOBS 4096             /* entries the writer may have queued */
#define WRITER_BYTES ((size_t)256 << 20) /* and bytes */

typedef enum { E_FREE, E_PENDING, E_READY } e_state;

typedef struct dc_entry {
    uint64_t hash, parent;   /* the prefix it ends, and the one before it */
    lm_dc_kind kind;
    e_state state;
    size_t bytes;            /* file size */
    double ftime;            /* lm_now() when its file's time was last set (written, read, touched) */
    int32_t hnext, pnext, prev, next; /* next in its hash bucket, in its parent bucket; LRU */
} dc_entry;

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
    size_t bytes;            /* of READY entries */
    lm_dc_stats st;
    lm_dc_faults faults;
    lm_dc_writer *writer;
    double touch_every_s;    /* a touch sets the file's time at most this often */
};

/* The file times carry the LRU order across a restart (the index is rebuilt
 * in their order): a write and a read set them; an entry used from RAM is
 * touched, and the writer sets its file's time, at most once a minute. */
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

/* A new entry at the LRU head (the table grows as needed). */
static int32_t add(lm_disk_cache *dc, uint64_t hash, uint64_t parent, lm_dc_kind kind, e_state state, size_t bytes) {
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
    dc->e[i] = (dc_entry){ .hash = hash, .parent = parent, .kind = kind, .state = state, .bytes = bytes,
                           .ftime = -1e300, .prev = -1, .next = -1 };
    link_buckets(dc, i);
    lru_push_front(dc, i);
    if (state == E_READY) dc->bytes += bytes, dc->n_ready++;
    return i;
}

static void drop(lm_disk_cache *dc, int32_t i) {
    dc_entry *x = &dc->e[i];
    int32_t *link = &dc->bucket[bucket_of(dc, x->hash, x->kind)];
    while (*link != i) link = &dc->e[*link].hnext;
    *link = x->hnext;
    link = &dc->pbucket[pbucket_of(dc, x->parent)];
    while (*link != i) link = &dc->e[*link].pnext;
    *link = x->pnext;
    lru_unlink(dc, i);
    if (x->state == E_READY) dc->bytes -= x->bytes, dc->n_ready--;
    x->state = E_FREE;
    dc->free_e[dc->n_free++] = i;
}

/* Deletes entry i's file and forgets it. */
static void remove_file(lm_disk_cache *dc, int32_t i) {
    char name[LM_DC_NAME_MAX];
    lm_dc_entry_name(name, dc->e[i].hash, dc->e[i].kind);
    unlinkat(dc->dirfd, name, 0);
    drop(dc, i);
}

/* Least recently used READY entries go until the bytes fit the budget. */
static void evict_to(lm_disk_cache *dc, size_t bytes) {
    int32_t i = dc->lru_tail;
    while (dc->bytes > bytes && i >= 0) {
        int32_t prev = dc->e[i].prev;
        if (dc->e[i].state == E_READY) {
            remove_file(dc, i);
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

typedef struct found { uint64_t hash, parent; lm_dc_kind kind; size_t bytes; double mtime; } found;

static int by_mtime(const void *a, const void *b) {
    double x = ((const found *)a)->mtime, y = ((const found *)b)->mtime;
    return (x > y) - (x < y);
}

/* Reads the header of one file; what it is decides what happens to it. */
static void scan_one(lm_disk_cache *dc, const char *name, found **list, int *n, int *cap) {
    uint64_t hash;
    lm_dc_kind kind;
    if (strncmp(name, LM_DC_TMP_PREFIX, strlen(LM_DC_TMP_PREFIX)) == 0) {
        if (unlinkat(dc->dirfd, name, 0) == 0) dc->st.temp_cleaned++;
        return;
    }
    if (!lm_dc_entry_parse(name, &hash, &kind)) return;
    int fd = openat(dc->dirfd, name, O_RDONLY | O_CLOEXEC);
    int err = fd < 0 ? errno : lm_dc_fault(&dc->faults, LM_DC_OP_SCAN);
    lm_dc_header h;
    struct stat sb;
    if (!err && fstat(fd, &sb) != 0) err = errno;
    ssize_t got_n = err ? 0 : pread(fd, &h, sizeof h, 0);
    if (got_n < 0) err = errno;
    if (fd >= 0) close(fd);
    if (err == ENOENT) return;
    if (err) { /* unreadable (EIO, EACCES): never served, and deleted as a bad entry is */
        fprintf(stderr, "lumen: disk cache: %s/%s cannot be read: %s; deleted\n", dc->dir, name, strerror(err));
        unlinkat(dc->dirfd, name, 0);
        dc->st.read_errors++;
        return;
    }
    bool got = got_n == (ssize_t)sizeof h;
    lm_dc_check c = got ? lm_dc_header_check(&h, dc->ident, (uint64_t)sb.st_size) : LM_DC_CORRUPT;
    if (c == LM_DC_OK && (h.hash != hash || h.kind != (uint32_t)kind)) c = LM_DC_CORRUPT;
    if (c == LM_DC_FOREIGN) {
        dc->st.foreign++;
        return;
    }
    if (c == LM_DC_CORRUPT) {
        fprintf(stderr, "lumen: disk cache: %s/%s is torn or corrupt; deleted\n", dc->dir, name);
        unlinkat(dc->dirfd, name, 0);
        dc->st.corrupt++;
        return;
    }
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 1024;
        *list = lm_xrealloc(*list, (size_t)*cap * sizeof **list);
    }
    (*list)[(*n)++] = (found){ hash, h.parent, kind, (size_t)sb.st_size, (double)sb.st_mtim.tv_sec + 1e-9 * (double)sb.st_mtim.tv_nsec };
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
    for (int i = 0; i < n; i++) add(dc, list[i].hash, list[i].parent, list[i].kind, E_READY, list[i].bytes);
    free(list);
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
    dc->st.budget = budget;
    dc->touch_every_s = TOUCH_EVERY_S;
    pthread_mutex_init(&dc->mu, NULL);
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

void lm_dcache_close(lm_disk_cache *dc) {
    if (!dc) return;
    lm_dc_writer_free(dc->writer);
    if (dc->lockfd >= 0) close(dc->lockfd); /* closing drops the flock */
    if (dc->dirfd >= 0) close(dc->dirfd);
    pthread_mutex_destroy(&dc->mu);
    free(dc->e);
    free(dc->free_e);
    free(dc->bucket);
    free(dc->pbucket);
    free(dc->dir);
    free(dc);
}

/* ---- writes ---- */

static void on_written(void *user, const lm_dc_job *job, int err) {
    lm_disk_cache *dc = user;
    pthread_mutex_lock(&dc->mu);
    int32_t i = find(dc, job->hash, job->kind);
    if (err) {
        /* one line for the 1st, 2nd, 4th, 8th ... failure: a full disk fails every write */
        uint64_t n = ++dc->st.write_errors;
        if ((n & (n - 1)) == 0)
            fprintf(stderr, "lumen: disk cache: writing an entry to %s failed: %s; it is not kept (%llu so far)\n",
                    dc->dir, strerror(err), (unsigned long long)n);
        if (i >= 0 && dc->e[i].state == E_PENDING) drop(dc, i);
        /* the disk is fuller than the budget allows for: newer entries take the place of the oldest eighth */
        if (err == ENOSPC) evict_to(dc, dc->bytes - dc->bytes / 8);
    } else if (i >= 0 && dc->e[i].state == E_PENDING) {
        dc->e[i].state = E_READY;
        dc->e[i].bytes = job->blob.len;
        dc->e[i].ftime = lm_now();
        dc->bytes += job->blob.len;
        dc->n_ready++;
        dc->st.writes++;
        evict_to_budget(dc);
    }
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

int lm_dcache_put(lm_disk_cache *dc, uint64_t hash, uint64_t parent, lm_dc_kind kind, const int32_t *tokens,
                  int n_tokens, const void *data, size_t n) {
    pthread_mutex_lock(&dc->mu);
    int32_t i = find(dc, hash, kind);
    if (i >= 0) {
        lru_unlink(dc, i);
        lru_push_front(dc, i);
    } else {
        add(dc, hash, parent, kind, E_PENDING, 0);
    }
    pthread_mutex_unlock(&dc->mu);
    if (i >= 0) return 1;
    lm_dc_header h = { .kind = (uint32_t)kind, .n_tokens = (uint32_t)n_tokens, .ident = { dc->ident[0], dc->ident[1] },
                       .hash = hash, .parent = parent };
    lm_dc_job job = { .hash = hash, .kind = kind };
    lm_dc_blob_make(&job.blob, &h, tokens, data, n);
    if (lm_dc_writer_push(dc->writer, &job)) return 0;
    free(job.blob.buf);
    pthread_mutex_lock(&dc->mu);
    dc->st.dropped++;
    if ((i = find(dc, hash, kind)) >= 0 && dc->e[i].state == E_PENDING) drop(dc, i);
    pthread_mutex_unlock(&dc->mu);
    return -1;
}

void lm_dcache_touch(lm_disk_cache *dc, uint64_t hash, lm_dc_kind kind) {
    pthread_mutex_lock(&dc->mu);
    int32_t i = find(dc, hash, kind);
    bool stale = false;
    if (i >= 0) {
        lru_unlink(dc, i);
        lru_push_front(dc, i);
        double now = lm_now();
        if ((stale = dc->e[i].state == E_READY && now - dc->e[i].ftime >= dc->touch_every_s)) dc->e[i].ftime = now;
    }
    pthread_mutex_unlock(&dc->mu);
    /* the writer sets the file's time (no blob: a touch); a busy writer skips it */
    lm_dc_job job = { .hash = hash, .kind = kind };
    if (stale) (void)lm_dc_writer_push(dc->writer, &job);
}

void lm_dcache_set_touch_interval(lm_disk_cache *dc, double seconds) {
    pthread_mutex_lock(&dc->mu);
    dc->touch_every_s = seconds;
    pthread_mutex_unlock(&dc->mu);
}

void lm_dcache_flush(lm_disk_cache *dc) { lm_dc_writer_flush(dc->writer); }

/* ---- reads ---- */

/* A failed read: counted, logged, and the entry (ours, but bad) deleted. */
static void read_failed(lm_disk_cache *dc, uint64_t hash, lm_dc_kind kind, const char *what, bool corrupt) {
    char name[LM_DC_NAME_MAX];
    lm_dc_entry_name(name, hash, kind);
    pthread_mutex_lock(&dc->mu);
    if (corrupt) dc->st.corrupt++;
    else dc->st.read_errors++;
    int32_t i = find(dc, hash, kind);
    if (i >= 0 && dc->e[i].state == E_READY) remove_file(dc, i);
    pthread_mutex_unlock(&dc->mu);
    fprintf(stderr, "lumen: disk cache: %s/%s: %s; deleted, the prefix is computed again\n", dc->dir, name, what);
}

int lm_dcache_get(lm_disk_cache *dc, uint64_t hash, uint64_t parent, lm_dc_kind kind, const int32_t *tokens,
                  int n_tokens, void *data, size_t n) {
    if (!lm_dcache_ready(dc, hash, kind)) return -1;
    char name[LM_DC_NAME_MAX];
    lm_dc_entry_name(name, hash, kind);
    size_t tb = (size_t)n_tokens * sizeof(int32_t), n_head = sizeof(lm_dc_header) + tb;
    uint8_t *head = lm_xmalloc(n_head);
    int err = lm_dc_entry_read(dc->dirfd, name, head, n_head, data, n, &dc->faults);
    const lm_dc_header *h = (const lm_dc_header *)head;
    const char *bad = NULL;
    if (err == EBADMSG) bad = "wrong size (torn or truncated)";
    else if (err == ENOENT) { /* evicted by the writer since the index said ready: a plain miss */
        pthread_mutex_lock(&dc->mu);
        int32_t i = find(dc, hash, kind);
        if (i >= 0 && dc->e[i].state == E_READY) drop(dc, i);
        pthread_mutex_unlock(&dc->mu);
        free(head);
        return -1;
    } else if (err) {
        read_failed(dc, hash, kind, strerror(err), false);
        free(head);
        return -1;
    } else if (lm_dc_header_check(h, dc->ident, n_head + n) != LM_DC_OK) bad = "bad header (corrupt, or another model's)";
    else if (!lm_dc_payload_ok(head, n_head, data, n)) bad = "checksum mismatch";
    else if (h->hash != hash || h->parent != parent || h->kind != (uint32_t)kind || h->n_tokens != (uint32_t)n_tokens ||
             memcmp(head + sizeof *h, tokens, tb) != 0)
        bad = "holds another prefix";
    free(head);
    if (bad) {
        read_failed(dc, hash, kind, bad, true);
        return -1;
    }
    pthread_mutex_lock(&dc->mu);
    dc->st.reads++;
    int32_t i = find(dc, hash, kind);
    if (i >= 0) {
        lru_unlink(dc, i);
        lru_push_front(dc, i);
        dc->e[i].ftime = lm_now(); /* the read set the file's time */
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
    if (!lm_dcache_ready(dc, hash, kind)) return -1;
    char name[LM_DC_NAME_MAX];
    lm_dc_entry_name(name, hash, kind);
    size_t tb = (size_t)n_tokens * sizeof(int32_t), n_head = sizeof(lm_dc_header) + tb;
    uint8_t *head = lm_xmalloc(n_head);
    int fd = openat(dc->dirfd, name, O_RDONLY | O_CLOEXEC);
    int err = fd < 0 ? errno : lm_dc_fault(&dc->faults, LM_DC_OP_READ);
    struct stat sb;
    if (!err && fstat(fd, &sb) != 0) err = errno;
    if (!err) {
        ssize_t r = pread(fd, head, n_head, 0);
        err = r < 0 ? errno : (size_t)r != n_head ? EBADMSG : 0;
    }
    if (fd >= 0) close(fd);
    const lm_dc_header *h = (const lm_dc_header *)head;
    int rc = -1;
    if (err == ENOENT) { /* evicted since: a plain miss */
    } else if (err == EBADMSG) read_failed(dc, hash, kind, "too short (torn or truncated)", true);
    else if (err) read_failed(dc, hash, kind, strerror(err), false);
    else if (lm_dc_header_check(h, dc->ident, (uint64_t)sb.st_size) != LM_DC_OK || h->hash != hash ||
             h->parent != parent || h->kind != (uint32_t)kind || h->n_tokens != (uint32_t)n_tokens)
        read_failed(dc, hash, kind, "bad header (corrupt, or another prefix's)", true);
    else {
        memcpy(tokens, head + sizeof *h, tb);
        rc = 0;
    }
    free(head);
    return rc;
}

void lm_dcache_willneed(lm_disk_cache *dc, const uint64_t *hash, int n, lm_dc_kind kind) {
    char name[LM_DC_NAME_MAX];
    for (int i = 0; i < n; i++) {
        lm_dc_entry_name(name, hash[i], kind);
        int fd = openat(dc->dirfd, name, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED); /* advice: its failure changes nothing */
        close(fd);
    }
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
