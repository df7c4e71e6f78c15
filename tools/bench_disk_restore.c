/* bench_disk_restore.c - a restore's reads from the disk, three ways, and
 * the same bytes read sequentially, in the same rounds.
 *
 *   bench_disk_restore DIR [ENTRIES] [ENTRY_KIB] [ROUNDS]
 *
 * Fills DIR (which must not exist yet) with ENTRIES entries (default 2048:
 * a 32,768-token prompt of the demo model) of ENTRY_KIB KiB (default 16),
 * and one plain file of the same total size. Each round, for each way,
 * drops the page cache (/proc/sys/vm/drop_caches: needs root) and reads
 * every entry (open, read, checksum, compare):
 *   serial    lm_dcache_get one after another
 *   willneed  POSIX_FADV_WILLNEED on every file first, then serial (the
 *             disk tier's restore)
 *   threads   lm_dcache_get on 16 threads taking the entries in turn
 *             (tried in the tier and dropped: see the #31 history page)
 *   willneed+threads  both
 *   seq       the plain file, read(2) in 4 MiB pieces: the disk's
 *             sequential rate for the same bytes
 * and prints MiB/s per way and round, then each way's median. */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/engine/disk_internal.h"

static const uint64_t k_ident[2] = { 1, 2 };
enum { W_SERIAL, W_WILLNEED, W_THREADS, W_WN_THREADS, W_SEQ, N_WAYS, READERS = 16 };
static const char *const k_way[N_WAYS] = { "serial", "willneed", "threads", "willneed+threads", "seq" };

static int drop_caches(void) {
    sync();
    FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
    if (!f) return -1;
    int rc = fputs("3\n", f) < 0 ? -1 : 0;
    return fclose(f) || rc ? -1 : 0;
}

static void entry_tokens(int k, int32_t *toks) {
    for (int i = 0; i < 16; i++) toks[i] = k + i;
}

typedef struct readers {
    lm_disk_cache *dc;
    uint8_t *buf;           /* [READERS][bytes] */
    size_t bytes;
    int n;
    atomic_int next, ok;
} readers;

typedef struct reader_arg {
    readers *r;
    int id;
} reader_arg;

static void *reader(void *p) {
    reader_arg *a = p;
    readers *r = a->r;
    int32_t toks[16];
    for (int k; (k = atomic_fetch_add(&r->next, 1)) < r->n;) {
        entry_tokens(k, toks);
        if (lm_dcache_get(r->dc, 1000 + (uint64_t)k, 999 + (uint64_t)k, LM_DC_KV, toks, 16,
                          r->buf + (size_t)a->id * r->bytes, r->bytes) == 0)
            atomic_fetch_add(&r->ok, 1);
    }
    return NULL;
}

/* Entries read back by READERS threads; how many were. */
static int read_threads(lm_disk_cache *dc, int n, size_t bytes, uint8_t *buf) {
    readers r = { .dc = dc, .buf = buf, .bytes = bytes, .n = n };
    atomic_init(&r.next, 0);
    atomic_init(&r.ok, 0);
    pthread_t t[READERS];
    reader_arg a[READERS];
    int nt = 0;
    for (; nt < READERS; nt++) {
        a[nt] = (reader_arg){ &r, nt };
        if (pthread_create(&t[nt], NULL, reader, &a[nt]) != 0) break;
    }
    for (int i = 0; i < nt; i++) pthread_join(t[i], NULL);
    return nt ? atomic_load(&r.ok) : 0;
}

/* Seconds to read all n entries one way; -1 when one failed. */
static double read_all(lm_disk_cache *dc, const char *dir, int way, int n, size_t bytes, uint8_t *buf, const char *seq) {
    double t0 = lm_now();
    if (way == W_SEQ) {
        int fd = open(seq, O_RDONLY);
        size_t total = 0, piece = (size_t)4 << 20;
        for (ssize_t r; fd >= 0 && (r = read(fd, buf, piece)) > 0;) total += (size_t)r;
        if (fd >= 0) close(fd);
        return total == (size_t)n * bytes ? lm_now() - t0 : -1;
    }
    if (way == W_WILLNEED || way == W_WN_THREADS) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY);
        char name[LM_DC_NAME_MAX];
        for (int k = 0; k < n; k++) {
            lm_dc_entry_name(name, 1000 + (uint64_t)k, LM_DC_KV);
            int fd = openat(dfd, name, O_RDONLY);
            if (fd >= 0) posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED), close(fd);
        }
        close(dfd);
    }
    int ok = 0;
    if (way == W_THREADS || way == W_WN_THREADS) {
        ok = read_threads(dc, n, bytes, buf);
    } else {
        int32_t toks[16];
        for (int k = 0; k < n; k++) {
            entry_tokens(k, toks);
            ok += lm_dcache_get(dc, 1000 + (uint64_t)k, 999 + (uint64_t)k, LM_DC_KV, toks, 16, buf, bytes) == 0;
        }
    }
    return ok == n ? lm_now() - t0 : -1;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_disk_restore DIR [ENTRIES] [ENTRY_KIB] [ROUNDS]\n");
        return 2;
    }
    const char *dir = argv[1];
    int n = argc > 2 ? atoi(argv[2]) : 2048, rounds = argc > 4 ? atoi(argv[4]) : 5;
    size_t bytes = (size_t)(argc > 3 ? atoi(argv[3]) : 16) << 10;
    if (n <= 0 || rounds <= 0 || rounds > 64 || bytes == 0) return 2;
    lm_err e = { { 0 } };
    lm_disk_cache *dc;
    if (lm_dcache_open(&dc, dir, (size_t)1 << 40, k_ident, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    size_t buf_bytes = (size_t)READERS * bytes > ((size_t)4 << 20) ? (size_t)READERS * bytes : (size_t)4 << 20;
    uint8_t *buf = lm_xmalloc(buf_bytes);
    int32_t toks[16];
    for (int k = 0; k < n; k++) {
        entry_tokens(k, toks);
        memset(buf, k & 0xff, bytes);
        while (lm_dcache_put(dc, 1000 + (uint64_t)k, 999 + (uint64_t)k, LM_DC_KV, toks, 16, buf, bytes) < 0)
            lm_dcache_flush(dc); /* the queue is full: this benchmark wants every entry */
    }
    lm_dcache_flush(dc);
    char seq[4096];
    snprintf(seq, sizeof seq, "%s.seq", dir);
    FILE *f = fopen(seq, "wb");
    for (int k = 0; f && k < n; k++) fwrite(buf, 1, bytes, f);
    if (f) fclose(f);
    double mib = (double)n * (double)bytes / (1 << 20), rate[N_WAYS][64];
    printf("%d entries of %zu KiB (%.1f MiB), %d rounds, page cache dropped before each read%s\n", n, bytes >> 10, mib,
           rounds, drop_caches() ? " (FAILED: not root?)" : "");
    for (int r = 0; r < rounds; r++) {
        printf("round %d:", r + 1);
        for (int w = 0; w < N_WAYS; w++) {
            drop_caches();
            double s = read_all(dc, dir, w, n, bytes, buf, seq);
            rate[w][r] = s > 0 ? mib / s : 0;
            printf("  %s %.0f MiB/s", k_way[w], rate[w][r]);
        }
        printf("\n");
        fflush(stdout);
    }
    printf("median:");
    for (int w = 0; w < N_WAYS; w++) {
        qsort(rate[w], (size_t)rounds, sizeof(double), cmp_d);
        printf("  %s %.0f MiB/s", k_way[w], rate[w][rounds / 2]);
    }
    printf("\n");
    unlink(seq);
    free(buf);
    lm_dcache_close(dc);
    return 0;
}
