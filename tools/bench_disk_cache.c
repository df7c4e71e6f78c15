/* bench_disk_cache.c - the disk tier's start time and read speed.
 *
 *   bench_disk_cache DIR [ENTRIES] [ENTRY_KIB]
 *
 * Fills DIR (which must not exist yet) with ENTRIES entries (default
 * 12000) of ENTRY_KIB KiB (default 16: one 16-token block of the demo
 * model in bf16), 32 to a pack (a 512-token prefill chunk), closes it,
 * then reports how long reopening takes (the index rebuild: every pack's
 * header and table read and checked), and the read throughput of
 * lm_dcache_get (read, checksum, compare) over all entries. Last,
 * one 256 MiB entry is written and read back, and its path printed so that
 * `dd if=PATH of=/dev/null bs=1M` can read the same bytes for comparison.
 * Numbers are with the page cache as it is (warm after the writes), and
 * for the large entry also from the disk. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/engine/disk_internal.h"

static const uint64_t k_ident[2] = { 1, 2 };

/* The path of the pack in dir with the highest number: the last written. */
static void newest_pack(const char *dir, char *path, size_t cap) {
    uint64_t best = 0, id;
    DIR *d = opendir(dir);
    for (struct dirent *de; d && (de = readdir(d));)
        if (lm_dc_pack_parse(de->d_name, &id) && id > best) best = id;
    if (d) closedir(d);
    char name[LM_DC_NAME_MAX];
    lm_dc_pack_name(name, best);
    snprintf(path, cap, "%s/%s", dir, name);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_disk_cache DIR [ENTRIES] [ENTRY_KIB]\n");
        return 2;
    }
    const char *dir = argv[1];
    int n = argc > 2 ? atoi(argv[2]) : 12000;
    size_t kib = argc > 3 ? (size_t)atoi(argv[3]) : 16, bytes = kib << 10;
    lm_err e = { { 0 } };
    lm_disk_cache *dc;
    if (lm_dcache_open(&dc, dir, (size_t)1 << 40, k_ident, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    uint8_t *data = lm_xmalloc(bytes);
    int32_t toks[16];
    double t0 = lm_now();
    for (int k = 0; k < n; k++) {
        for (int i = 0; i < 16; i++) toks[i] = k + i;
        memset(data, k & 0xff, bytes);
        if (k % 32 == 0) lm_dcache_batch_begin(dc);
        lm_dcache_put(dc, 1000 + (uint64_t)k, 999 + (uint64_t)k, LM_DC_KV, toks, 16, data, bytes);
        if (k % 32 == 31 || k == n - 1) {
            lm_dcache_batch_end(dc);
            lm_dcache_flush(dc); /* this benchmark wants every entry: the queue never fills */
        }
    }
    lm_dcache_flush(dc);
    double t_write = lm_now() - t0;
    lm_dcache_close(dc);
    if (lm_dcache_open(&dc, dir, (size_t)1 << 40, k_ident, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    lm_dc_stats st;
    lm_dcache_get_stats(dc, &st);
    t0 = lm_now();
    int ok = 0;
    for (int k = 0; k < n; k++) {
        for (int i = 0; i < 16; i++) toks[i] = k + i;
        ok += lm_dcache_get(dc, 1000 + (uint64_t)k, 999 + (uint64_t)k, LM_DC_KV, toks, 16, data, bytes) == 0;
    }
    double t_read = lm_now() - t0;
    size_t big = (size_t)256 << 20;
    uint8_t *b = lm_xmalloc(big);
    memset(b, 7, big);
    lm_dcache_put(dc, 1, 0, LM_DC_KV, toks, 16, b, big);
    lm_dcache_flush(dc);
    char path[4096];
    newest_pack(dir, path, sizeof path);
    t0 = lm_now();
    int big_ok = lm_dcache_get(dc, 1, 0, LM_DC_KV, toks, 16, b, big) == 0;
    double t_big = lm_now() - t0;
    /* the same from the disk: the file dropped from the page cache first */
    int fd = open(path, O_RDONLY);
    if (fd >= 0) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), close(fd);
    t0 = lm_now();
    big_ok &= lm_dcache_get(dc, 1, 0, LM_DC_KV, toks, 16, b, big) == 0;
    double t_cold = lm_now() - t0;
    printf("entries %d of %zu KiB: written (packs of 32, fsync each) in %.2f s (%.0f entries/s)\n", n, kib, t_write,
           n / t_write);
    printf("reopen: %d entries indexed in %.1f ms\n", st.entries, st.open_s * 1e3);
    printf("read back %d/%d: %.2f s, %.0f MiB/s\n", ok, n, t_read, (double)n * (double)bytes / (1 << 20) / t_read);
    printf("one 256 MiB entry read %s: page cache %.0f MiB/s, disk (POSIX_FADV_DONTNEED first) %.0f MiB/s; "
           "compare: dd if=%s of=/dev/null bs=1M\n", big_ok ? "and checked" : "FAILED", 256 / t_big, 256 / t_cold,
           path);
    free(b);
    free(data);
    lm_dcache_close(dc);
    return ok == n && big_ok ? 0 : 1;
}
