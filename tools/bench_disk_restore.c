/* bench_disk_restore.c - a restore's reads from the disk, as one-entry
 * files and as packs, and the same bytes read sequentially, in the same
 * rounds.
 *
 *   bench_disk_restore DIR [ENTRIES] [ENTRY_KIB] [ROUNDS] [PACK]
 *
 * Fills DIR (which must not exist yet) with ENTRIES entries (default 2048:
 * a 32,768-token prompt of the demo model) of ENTRY_KIB KiB (default 16)
 * twice: once a pack per entry (the layout of cache format 1, one file an
 * entry), once PACK entries a pack (default 32: what a 512-token prefill
 * chunk writes); and one plain file of the same total size. Each round,
 * for each way, drops the page cache (/proc/sys/vm/drop_caches: needs
 * root) and reads every entry the way the tier restores a prompt
 * (lm_dcache_willneed on all, then lm_dcache_get one after another: read,
 * checksum, compare):
 *   single    the one-entry packs
 *   packs     the PACK-entry packs
 *   seq       the plain file, read(2) in 4 MiB pieces: the disk's
 *             sequential rate for the same bytes
 * and prints MiB/s per way and round, then each way's median. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/engine/disk_internal.h"

static const uint64_t k_ident[2] = { 1, 2 };
enum { W_SINGLE, W_PACKS, W_SEQ, N_WAYS };
static const char *const k_way[N_WAYS] = { "single", "packs", "seq" };
static const uint64_t k_base[2] = { 1000, 1u << 30 }; /* the two layouts' hashes */

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

/* Seconds to read all n entries one way; -1 when one failed. */
static double read_all(lm_disk_cache *dc, int way, int n, size_t bytes, uint8_t *buf, const char *seq) {
    double t0 = lm_now();
    if (way == W_SEQ) {
        int fd = open(seq, O_RDONLY);
        size_t total = 0, piece = (size_t)4 << 20;
        for (ssize_t r; fd >= 0 && (r = read(fd, buf, piece)) > 0;) total += (size_t)r;
        if (fd >= 0) close(fd);
        return total == (size_t)n * bytes ? lm_now() - t0 : -1;
    }
    uint64_t *h = lm_xmalloc((size_t)n * sizeof *h);
    for (int k = 0; k < n; k++) h[k] = k_base[way] + (uint64_t)k;
    lm_dcache_willneed(dc, h, n, LM_DC_KV);
    int ok = 0;
    int32_t toks[16];
    for (int k = 0; k < n; k++) {
        entry_tokens(k, toks);
        ok += lm_dcache_get(dc, h[k], k ? h[k - 1] : 1, LM_DC_KV, toks, 16, buf, bytes) == 0;
    }
    free(h);
    return ok == n ? lm_now() - t0 : -1;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_disk_restore DIR [ENTRIES] [ENTRY_KIB] [ROUNDS] [PACK]\n");
        return 2;
    }
    const char *dir = argv[1];
    int n = argc > 2 ? atoi(argv[2]) : 2048, rounds = argc > 4 ? atoi(argv[4]) : 5, pack = argc > 5 ? atoi(argv[5]) : 32;
    size_t bytes = (size_t)(argc > 3 ? atoi(argv[3]) : 16) << 10;
    if (n <= 0 || rounds <= 0 || rounds > 64 || bytes == 0 || pack <= 0) return 2;
    lm_err e = { { 0 } };
    lm_disk_cache *dc;
    if (lm_dcache_open(&dc, dir, (size_t)1 << 40, k_ident, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    uint8_t *buf = lm_xmalloc(LM_MAX(bytes, (size_t)4 << 20));
    int32_t toks[16];
    for (int way = W_SINGLE; way <= W_PACKS; way++) {
        int per = way == W_SINGLE ? 1 : pack;
        size_t queued = 0;
        for (int k = 0; k < n; k++) {
            entry_tokens(k, toks);
            memset(buf, k & 0xff, bytes);
            if (k % per == 0) lm_dcache_batch_begin(dc);
            uint64_t h = k_base[way] + (uint64_t)k;
            lm_dcache_put(dc, h, k ? h - 1 : 1, LM_DC_KV, toks, 16, buf, bytes);
            if (k % per == per - 1 || k == n - 1) {
                lm_dcache_batch_end(dc);
                /* this benchmark wants every entry: the writer's queue must never fill */
                if ((queued += (size_t)per * bytes) >= (size_t)64 << 20) lm_dcache_flush(dc), queued = 0;
            }
        }
        lm_dcache_flush(dc);
    }
    char seq[4096];
    snprintf(seq, sizeof seq, "%s.seq", dir);
    FILE *f = fopen(seq, "wb");
    for (int k = 0; f && k < n; k++) fwrite(buf, 1, bytes, f);
    if (f) fclose(f);
    double mib = (double)n * (double)bytes / (1 << 20), rate[N_WAYS][64];
    printf("%d entries of %zu KiB (%.1f MiB), packs of %d, %d rounds, page cache dropped before each read%s\n", n,
           bytes >> 10, mib, pack, rounds, drop_caches() ? " (FAILED: not root?)" : "");
    for (int r = 0; r < rounds; r++) {
        printf("round %d:", r + 1);
        for (int w = 0; w < N_WAYS; w++) {
            drop_caches();
            double s = read_all(dc, w, n, bytes, buf, seq);
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
