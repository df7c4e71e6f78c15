/* test_disk_cache.c - the disk tier's files on their own (lm_disk_cache.h):
 * entries survive a close and reopen; one process owns a directory; every
 * injected I/O fault (ENOSPC on write, fsync, rename, EIO on read and on
 * the header reads at start, also from a text spec) and every
 * damaged file (bit flip, truncation, another model's, another version's,
 * a temp file left by a killed write) is detected, counted and never
 * served; the byte budget holds by counting files and bytes. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "engine/disk_internal.h"
#include "engine/lm_disk_cache.h"
#include "lm_test.h"
#include "test_util.h"

#define DT_BS 16
#define DT_DATA 4000

static const uint64_t k_ident[2] = { 0x1234, 0x5678 };

/* Entry k: tokens and data derived from k. */
static void dt_entry(int k, int32_t *toks, uint8_t *data) {
    for (int i = 0; i < DT_BS; i++) toks[i] = k * 100 + i;
    for (int i = 0; i < DT_DATA; i++) data[i] = (uint8_t)(k * 7 + i);
}

static uint64_t dt_hash(int k) { return 0xabc000ull + (uint64_t)k; }

/* Puts entries [0, n) and waits for the writer; how many were queued. */
static int dt_put(lm_disk_cache *dc, int n) {
    int32_t toks[DT_BS];
    uint8_t data[DT_DATA];
    int queued = 0;
    for (int k = 0; k < n; k++) {
        dt_entry(k, toks, data);
        queued += lm_dcache_put(dc, dt_hash(k), k ? dt_hash(k - 1) : 1, LM_DC_KV, toks, DT_BS, data, DT_DATA) == 0;
        lm_dcache_flush(dc); /* one at a time: the test is about the files, not the queue */
    }
    return queued;
}

/* 0 when entry k reads back exactly. */
static int dt_get(lm_disk_cache *dc, int k) {
    int32_t toks[DT_BS];
    uint8_t want[DT_DATA], got[DT_DATA];
    dt_entry(k, toks, want);
    if (lm_dcache_get(dc, dt_hash(k), k ? dt_hash(k - 1) : 1, LM_DC_KV, toks, DT_BS, got, DT_DATA)) return -1;
    return memcmp(want, got, DT_DATA) == 0 ? 0 : -2;
}

/* Files in dir: packs, temp files, and their bytes. */
static void dt_count(const char *dir, int *packs, int *temps, size_t *bytes) {
    *packs = *temps = 0;
    *bytes = 0;
    DIR *d = opendir(dir);
    for (struct dirent *de; d && (de = readdir(d));) {
        uint64_t id;
        char path[512];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (strncmp(de->d_name, "tmp-", 4) == 0) (*temps)++;
        if (!lm_dc_pack_parse(de->d_name, &id) || stat(path, &sb) != 0) continue;
        (*packs)++;
        *bytes += (size_t)sb.st_size;
    }
    if (d) closedir(d);
}

/* The path of the pack holding entry k, and its record there (NULL when
 * no pack lists it). */
static char *dt_find(const char *dir, int k, lm_dc_record *out) {
    DIR *d = opendir(dir);
    char *found = NULL;
    for (struct dirent *de; d && !found && (de = readdir(d));) {
        uint64_t id;
        if (!lm_dc_pack_parse(de->d_name, &id)) continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        size_t n;
        char *b = lm_tu_read(path, &n);
        const lm_dc_pack_header *h = (const lm_dc_pack_header *)b;
        for (uint32_t j = 0; b && n >= lm_dc_head_bytes((int)h->n_entries) && j < h->n_entries && !found; j++) {
            const lm_dc_record *r = (const lm_dc_record *)(b + sizeof *h) + j;
            if (r->hash == dt_hash(k)) found = strdup(path), *out = *r;
        }
        free(b);
    }
    if (d) closedir(d);
    return found;
}

static char *dt_file(const char *dir, int k) {
    lm_dc_record r;
    return dt_find(dir, k, &r);
}

/* Bytes of a pack holding n of the test's entries. */
static size_t dt_pack_bytes(int n) { return lm_dc_head_bytes(n) + (size_t)n * (DT_BS * 4 + DT_DATA); }

LM_TEST(disk_cache_reopen_keeps_entries) {
    char *dir = lm_tu_mkdir("dc_reopen");
    lm_disk_cache *dc;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_dcache_open(&dc, dir, 1 << 20, k_ident, &e) == 0);
    LM_CHECK(dt_put(dc, 20) == 20);
    LM_CHECK(dt_put(dc, 20) == 0); /* already there */
    lm_dcache_close(dc);
    LM_REQUIRE(lm_dcache_open(&dc, dir, 1 << 20, k_ident, &e) == 0);
    lm_dc_stats st;
    lm_dcache_get_stats(dc, &st);
    LM_CHECK(st.entries == 20 && st.corrupt == 0 && st.foreign == 0);
    for (int k = 0; k < 20; k++) LM_CHECK(dt_get(dc, k) == 0);
    /* the wrong parent or tokens never read as a hit */
    int32_t toks[DT_BS];
    uint8_t data[DT_DATA];
    dt_entry(3, toks, data);
    LM_CHECK(lm_dcache_get(dc, dt_hash(3), 999, LM_DC_KV, toks, DT_BS, data, DT_DATA) == -1);
    LM_CHECK(!lm_dcache_ready(dc, dt_hash(3), LM_DC_KV)); /* and the entry is gone */
    dt_entry(4, toks, data);
    toks[15]++;
    LM_CHECK(lm_dcache_get(dc, dt_hash(4), dt_hash(3), LM_DC_KV, toks, DT_BS, data, DT_DATA) == -1);
    LM_CHECK(!lm_dcache_ready(dc, dt_hash(4), LM_DC_KV));
    lm_dcache_close(dc);
    free(dir);
}

LM_TEST(disk_cache_lock_refuses_second_owner) {
    char *dir = lm_tu_mkdir("dc_lock");
    lm_disk_cache *a, *b;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_dcache_open(&a, dir, 1 << 20, k_ident, &e) == 0);
    LM_CHECK(lm_dcache_open(&b, dir, 1 << 20, k_ident, &e) == LM_DC_REFUSED);
    LM_CHECK_MSG(strstr(e.msg, "in use by another lumen process") && strstr(e.msg, dir), "%s", e.msg);
    lm_dcache_close(a);
    LM_CHECK(lm_dcache_open(&b, dir, 1 << 20, k_ident, &e) == 0); /* free again once the owner closes */
    lm_dcache_close(b);
    free(dir);
}

LM_TEST(disk_cache_budget_evicts_lru) {
    char *dir = lm_tu_mkdir("dc_budget");
    size_t one = dt_pack_bytes(1);
    lm_disk_cache *dc;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_dcache_open(&dc, dir, 3 * one, k_ident, &e) == 0);
    dt_put(dc, 2);
    LM_CHECK(dt_get(dc, 0) == 0); /* 0 becomes more recent than 1 */
    int32_t toks[DT_BS];
    uint8_t data[DT_DATA];
    for (int k = 2; k < 10; k++) {
        dt_entry(k, toks, data);
        lm_dcache_put(dc, dt_hash(k), dt_hash(k - 1), LM_DC_KV, toks, DT_BS, data, DT_DATA);
        lm_dcache_flush(dc);
        if (k == 2) LM_CHECK(dt_get(dc, 0) == 0);
    }
    int n, t;
    size_t bytes;
    dt_count(dir, &n, &t, &bytes);
    lm_dc_stats st;
    lm_dcache_get_stats(dc, &st);
    LM_CHECK_MSG(n == 3 && bytes == 3 * one && st.entries == 3 && st.bytes == bytes && st.evicted == 7,
                 "files %d bytes %zu entries %d evicted %llu", n, bytes, st.entries, (unsigned long long)st.evicted);
    LM_CHECK(dt_get(dc, 9) == 0 && dt_get(dc, 8) == 0 && dt_get(dc, 1) == -1);
    lm_dcache_close(dc);
    /* a smaller budget at the next start evicts there */
    LM_REQUIRE(lm_dcache_open(&dc, dir, one, k_ident, &e) == 0);
    dt_count(dir, &n, &t, &bytes);
    LM_CHECK(n == 1);
    lm_dcache_close(dc);
    free(dir);
}

/* Each write-side fault: the write fails, is counted, leaves no file (and
 * ENOSPC deletes the oldest eighth of the entries: here entry 0). */
static void dt_write_fault(lm_test_ctx *lm_t_, const char *tag, lm_dc_op op, int err) {
    const bool full = err == ENOSPC;
    char *dir = lm_tu_mkdir(tag);
    lm_disk_cache *dc;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_dcache_open(&dc, dir, 1 << 20, k_ident, &e) == 0);
    lm_dcache_inject(dc, op, err, 1, 2); /* entry 0 is written, 1 and 2 fail, 3 is written */
    dt_put(dc, 4);
    lm_dc_stats st;
    lm_dcache_get_stats(dc, &st);
    int n, t;
    size_t bytes;
    dt_count(dir, &n, &t, &bytes);
    LM_CHECK_MSG(st.write_errors == 2 && st.writes == 2 && n == 2 - full && t == 0,
                 "errors %llu writes %llu files %d temps %d", (unsigned long long)st.write_errors,
                 (unsigned long long)st.writes, n, t);
    LM_CHECK(dt_get(dc, 0) == (full ? -1 : 0) && dt_get(dc, 1) == -1 && dt_get(dc, 2) == -1 && dt_get(dc, 3) == 0);
    /* written again later, once the disk has room */
    LM_CHECK(dt_put(dc, 4) == 2 + full && dt_get(dc, 1) == 0);
    lm_dcache_close(dc);
    free(dir);
}

LM_TEST(disk_cache_fault_enospc_write) { dt_write_fault(lm_t_, "dc_enospc", LM_DC_OP_WRITE, ENOSPC); }

/* A disk full before the budget: each ENOSPC deletes the oldest eighth of
 * the entries, so that newer ones can take their place. */
LM_TEST(disk_cache_enospc_makes_room) {
    char *dir = lm_tu_mkdir("dc_full");
    lm_disk_cache *dc;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_dcache_open(&dc, dir, 1 << 20, k_ident, &e) == 0);
    dt_put(dc, 16);
    lm_dcache_inject(dc, LM_DC_OP_WRITE, ENOSPC, 0, 1);
    int32_t toks[DT_BS];
    uint8_t data[DT_DATA];
    dt_entry(16, toks, data);
    LM_CHECK(lm_dcache_put(dc, dt_hash(16), dt_hash(15), LM_DC_KV, toks, DT_BS, data, DT_DATA) == 0);
    lm_dcache_flush(dc);
    lm_dc_stats st;
    lm_dcache_get_stats(dc, &st);
    LM_CHECK_MSG(st.write_errors == 1 && st.evicted == 2 && st.entries == 14, "errors %llu evicted %llu entries %d",
                 (unsigned long long)st.write_errors, (unsigned long long)st.evicted, st.entries);
    LM_CHECK(dt_get(dc, 0) == -1 && dt_get(dc, 1) == -1 && dt_get(dc, 2) == 0 && dt_get(dc, 16) == -1);
    /* the disk has room again: the entry that failed is written the next time */
    LM_CHECK(lm_dcache_put(dc, dt_hash(16), dt_hash(15), LM_DC_KV, toks, DT_BS, data, DT_DATA) == 0);
    lm_dcache_flush(dc);
    LM_CHECK(dt_get(dc, 16) == 0);
    lm_dcache_close(dc);
    free(dir);
}
LM_TEST(disk_cache_fault_eio_fsync) { dt_write_fault(lm_t_, "dc_fsync", LM_DC_OP_FSYNC, EIO); }
LM_TEST(disk_cache_fault_rename) { dt_write_fault(lm_t_, "dc_rename", LM_DC_OP_RENAME, EIO); }

LM_TEST(disk_cache_fault_eio_read) {
    char *dir = lm_tu_mkdir("dc_eio");
    lm_disk_cache *dc;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_dcache_open(&dc, dir, 1 << 20, k_ident, &e) == 0);
    dt_put(dc, 3);
    lm_dcache_inject(dc, LM_DC_OP_READ, EIO, 1, 1);
    LM_CHECK(dt_get(dc, 0) == 0 && dt_get(dc, 1) == -1 && dt_get(dc, 2) == 0);
    lm_dc_stats st;
    lm_dcache_get_stats(dc, &st);
    LM_CHECK(st.read_errors == 1 && st.reads == 2 && st.entries == 2);
    lm_dcache_close(dc);
    free(dir);
}

/* Damages entry 1's file with f, then reopens: never served, counted. */
static void dt_damaged(lm_test_ctx *lm_t_, const char *tag, void (*f)(const char *path), bool at_start) {
    char *dir = lm_tu_mkdir(tag);
    lm_disk_cache *dc;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_dcache_open(&dc, dir, 1 << 20, k_ident, &e) == 0);
    dt_put(dc, 3);
    lm_dcache_close(dc);
    char *p = dt_file(dir, 1);
    LM_REQUIRE(p);
    f(p);
    LM_REQUIRE(lm_dcache_open(&dc, dir, 1 << 20, k_ident, &e) == 0);
    lm_dc_stats st;
    lm_dcache_get_stats(dc, &st);
    LM_CHECK_MSG(st.corrupt == (at_start ? 1u : 0u) && st.entries == (at_start ? 2 : 3), "corrupt %llu entries %d",
                 (unsigned long long)st.corrupt, st.entries);
    LM_CHECK(dt_get(dc, 0) == 0 && dt_get(dc, 1) == -1 && dt_get(dc, 2) == 0);
    lm_dcache_get_stats(dc, &st);
    LM_CHECK(st.corrupt == 1 && st.entries == 2 && access(p, F_OK) != 0); /* deleted */
    lm_dcache_close(dc);
    free(p);
    free(dir);
}

static void flip_payload(const char *path) {
    size_t n;
    char *b = lm_tu_read(path, &n);
    b[n - 5] ^= 0x10;
    lm_tu_write(path, b, n);
    free(b);
}

static void flip_header(const char *path) {
    size_t n;
    char *b = lm_tu_read(path, &n);
    b[20] ^= 1; /* inside the identity */
    lm_tu_write(path, b, n);
    free(b);
}

static void truncate_file(const char *path) {
    size_t n;
    char *b = lm_tu_read(path, &n);
    lm_tu_write(path, b, n - 100);
    free(b);
}

LM_TEST(disk_cache_bit_flip_payload) { dt_damaged(lm_t_, "dc_flip", flip_payload, false); }
LM_TEST(disk_cache_bit_flip_header) { dt_damaged(lm_t_, "dc_fliph", flip_header, true); }
LM_TEST(disk_cache_truncated) { dt_damaged(lm_t_, "dc_trunc", truncate_file, true); }

LM_TEST(disk_cache_foreign_and_temp_files) {
    char *dir = lm_tu_mkdir("dc_foreign");
    lm_disk_cache *dc;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_dcache_open(&dc, dir, 1 << 20, k_ident, &e) == 0);
    dt_put(dc, 3);
    lm_dcache_close(dc);
    /* a kill -9 in the middle of a write leaves a temp file */
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s/tmp-0000000000abc003.kv", dir);
    LM_REQUIRE(lm_tu_write(tmp, "torn", 4) == 0);
    /* another model's view of the same directory: all three are foreign */
    const uint64_t other[2] = { 0x1234, 0x5679 };
    LM_REQUIRE(lm_dcache_open(&dc, dir, 1 << 20, other, &e) == 0);
    lm_dc_stats st;
    lm_dcache_get_stats(dc, &st);
    LM_CHECK(st.foreign == 3 && st.entries == 0 && st.temp_cleaned == 1 && access(tmp, F_OK) != 0);
    int32_t toks[DT_BS];
    uint8_t data[DT_DATA];
    dt_entry(0, toks, data);
    LM_CHECK(lm_dcache_get(dc, dt_hash(0), 1, LM_DC_KV, toks, DT_BS, data, DT_DATA) == -1);
    lm_dcache_close(dc);
    /* left alone: the owner still finds them */
    LM_REQUIRE(lm_dcache_open(&dc, dir, 1 << 20, k_ident, &e) == 0);
    lm_dcache_get_stats(dc, &st);
    LM_CHECK(st.entries == 3 && dt_get(dc, 2) == 0);
    lm_dcache_close(dc);
    free(dir);
}

LM_TEST(disk_cache_other_version_is_foreign) {
    char *dir = lm_tu_mkdir("dc_version");
    lm_disk_cache *dc;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_dcache_open(&dc, dir, 1 << 20, k_ident, &e) == 0);
    dt_put(dc, 1);
    lm_dcache_close(dc);
    /* the same entry as a later format version would write it */
    char *p = dt_file(dir, 0);
    LM_REQUIRE(p);
    size_t n;
    char *b = lm_tu_read(p, &n);
    lm_dc_pack_header *h = (lm_dc_pack_header *)b;
    h->version = LM_DC_VERSION + 1;
    h->header_xxh3 = XXH3_64bits(h, offsetof(lm_dc_pack_header, header_xxh3));
    lm_tu_write(p, b, n);
    LM_REQUIRE(lm_dcache_open(&dc, dir, 1 << 20, k_ident, &e) == 0);
    lm_dc_stats st;
    lm_dcache_get_stats(dc, &st);
    LM_CHECK(st.foreign == 1 && st.entries == 0 && st.corrupt == 0 && dt_get(dc, 0) == -1);
    lm_dcache_close(dc);
    free(b);
    free(p);
    free(dir);
}

/* A header read that fails while the index is rebuilt (EIO): that entry is
 * counted, deleted and never served; the others are. */
LM_TEST(disk_cache_fault_eio_scan) {
    char *dir = lm_tu_mkdir("dc_scan");
    lm_disk_cache *dc;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_dcache_open(&dc, dir, 1 << 20, k_ident, &e) == 0);
    dt_put(dc, 3);
    lm_dcache_close(dc);
    LM_REQUIRE(lm_dcache_open_with_faults(&dc, dir, 1 << 20, k_ident, "scan:EIO:1:1", &e) == 0);
    lm_dc_stats st;
    lm_dcache_get_stats(dc, &st);
    int n, t, ok = 0;
    size_t bytes;
    dt_count(dir, &n, &t, &bytes);
    for (int k = 0; k < 3; k++) ok += dt_get(dc, k) == 0;
    LM_CHECK_MSG(st.read_errors == 1 && st.entries == 2 && n == 2 && ok == 2, "errors %llu entries %d files %d read %d",
                 (unsigned long long)st.read_errors, st.entries, n, ok);
    lm_dcache_close(dc);
    free(dir);
}

/* The fault spec a server takes from LUMEN_DISK_FAULTS: each op and errno
 * by name or number, skip and times; a malformed one refuses to open. */
LM_TEST(disk_cache_fault_spec) {
    char *dir = lm_tu_mkdir("dc_spec");
    lm_disk_cache *dc;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_dcache_open_with_faults(&dc, dir, 1 << 20, k_ident, "write:EIO:1:1,read:5:0:1", &e) == 0);
    dt_put(dc, 3); /* entry 1's write fails */
    LM_CHECK(dt_get(dc, 0) == -1 && dt_get(dc, 1) == -1 && dt_get(dc, 2) == 0); /* the first read fails (EIO, 5) */
    lm_dc_stats st;
    lm_dcache_get_stats(dc, &st);
    LM_CHECK_MSG(st.write_errors == 1 && st.read_errors == 1 && st.reads == 1, "write errors %llu read errors %llu",
                 (unsigned long long)st.write_errors, (unsigned long long)st.read_errors);
    lm_dcache_close(dc);
    static const char *bad[] = { "write", "wrote:EIO", "read:EWHAT", "read:EIO:-1", "fsync:0" };
    for (size_t i = 0; i < LM_COUNT(bad); i++) {
        e.msg[0] = 0;
        LM_CHECK_MSG(lm_dcache_open_with_faults(&dc, dir, 1 << 20, k_ident, bad[i], &e) == LM_DC_REFUSED &&
                         strstr(e.msg, "OP:ERR"),
                     "'%s' accepted: %s", bad[i], e.msg);
    }
    free(dir);
}

/* A --cache-dir that is a regular file: -1 (the directory cannot be used;
 * the engine then runs without a disk tier), not LM_DC_REFUSED. */
LM_TEST(disk_cache_dir_is_a_file) {
    char *dir = lm_tu_mkdir("dc_notdir"), path[1024];
    snprintf(path, sizeof path, "%s/file", dir);
    lm_tu_write(path, "x", 1);
    lm_disk_cache *dc;
    lm_err e = { { 0 } };
    LM_CHECK(lm_dcache_open(&dc, path, 1 << 20, k_ident, &e) == -1 && !dc && strstr(e.msg, "Not a directory"));
    free(dir);
}

/* Puts entries [0, n) with file times a clear step apart (the kernel's
 * file clock is coarse: entries written in one tick would tie). */
static void dt_put_spaced(lm_disk_cache *dc, int n) {
    int32_t toks[DT_BS];
    uint8_t data[DT_DATA];
    for (int k = 0; k < n; k++) {
        usleep(20000);
        dt_entry(k, toks, data);
        lm_dcache_put(dc, dt_hash(k), k ? dt_hash(k - 1) : 1, LM_DC_KV, toks, DT_BS, data, DT_DATA);
        lm_dcache_flush(dc);
    }
    usleep(20000);
}

/* The LRU order survives a restart for entries that were read: a read
 * refreshes the file's time, by which the next start orders the index, so
 * an entry read after newer ones were written outlives them. */
LM_TEST(disk_cache_read_keeps_entry_recent_across_restart) {
    char *dir = lm_tu_mkdir("dc_lru_restart");
    size_t one = dt_pack_bytes(1);
    lm_disk_cache *dc;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_dcache_open(&dc, dir, 8 * one, k_ident, &e) == 0);
    dt_put_spaced(dc, 3);
    LM_CHECK(dt_get(dc, 0) == 0);
    lm_dcache_close(dc);
    /* a budget of two: the start keeps the two most recent, 0 (read) and 2 */
    LM_REQUIRE(lm_dcache_open(&dc, dir, 2 * one, k_ident, &e) == 0);
    LM_CHECK_MSG(dt_get(dc, 0) == 0 && dt_get(dc, 2) == 0 && dt_get(dc, 1) == -1, "0: %d, 1: %d, 2: %d",
                 dt_get(dc, 0), dt_get(dc, 1), dt_get(dc, 2));
    lm_dcache_close(dc);
    free(dir);
}

/* An entry used from RAM only (touched, never read from disk) stays recent
 * across a restart too: the writer sets its file's time, at most once per
 * interval (0 here). */
LM_TEST(disk_cache_touch_keeps_entry_recent_across_restart) {
    char *dir = lm_tu_mkdir("dc_touch_restart");
    size_t one = dt_pack_bytes(1);
    lm_disk_cache *dc;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_dcache_open(&dc, dir, 8 * one, k_ident, &e) == 0);
    dt_put_spaced(dc, 3);
    lm_dcache_set_touch_interval(dc, 0);
    lm_dcache_touch(dc, dt_hash(0), LM_DC_KV);
    lm_dcache_flush(dc);
    lm_dcache_close(dc);
    LM_REQUIRE(lm_dcache_open(&dc, dir, 2 * one, k_ident, &e) == 0);
    int g0 = dt_get(dc, 0), g1 = dt_get(dc, 1), g2 = dt_get(dc, 2);
    LM_CHECK_MSG(g0 == 0 && g2 == 0 && g1 == -1, "0: %d, 1: %d, 2: %d", g0, g1, g2);
    lm_dcache_close(dc);
    free(dir);
}

/* ---- packs: entries written together share a file ---- */

/* Puts entries [0, n) as one batch (one pack) and waits for the writer. */
static void dt_put_pack(lm_disk_cache *dc, int n) {
    int32_t toks[DT_BS];
    uint8_t data[DT_DATA];
    lm_dcache_batch_begin(dc);
    for (int k = 0; k < n; k++) {
        dt_entry(k, toks, data);
        lm_dcache_put(dc, dt_hash(k), k ? dt_hash(k - 1) : 1, LM_DC_KV, toks, DT_BS, data, DT_DATA);
    }
    lm_dcache_batch_end(dc);
    lm_dcache_flush(dc);
}

/* Flips one byte of entry k's payload in its pack. */
static void dt_flip_entry(const char *dir, int k) {
    lm_dc_record r;
    char *p = dt_find(dir, k, &r);
    size_t n;
    char *b = lm_tu_read(p, &n);
    b[r.offset + r.bytes / 2] ^= 0x08;
    lm_tu_write(p, b, n);
    free(b);
    free(p);
}

/* Eight entries in one file, each read back on its own after a reopen;
 * then, for each entry in turn, a byte flipped in it (a fresh pack each
 * time): exactly that entry is refused, the seven around it still serve. */
LM_TEST(disk_cache_pack_each_entry_verified) {
    for (int bad = 0; bad < 8; bad++) {
        char tag[32];
        snprintf(tag, sizeof tag, "dc_pack%d", bad);
        char *dir = lm_tu_mkdir(tag);
        lm_disk_cache *dc;
        lm_err e = { { 0 } };
        LM_REQUIRE(lm_dcache_open(&dc, dir, 1 << 20, k_ident, &e) == 0);
        dt_put_pack(dc, 8);
        lm_dcache_close(dc);
        int n, t;
        size_t bytes;
        dt_count(dir, &n, &t, &bytes);
        LM_CHECK_MSG(n == 1 && bytes == dt_pack_bytes(8), "%d packs, %zu bytes", n, bytes);
        dt_flip_entry(dir, bad);
        LM_REQUIRE(lm_dcache_open(&dc, dir, 1 << 20, k_ident, &e) == 0);
        int served = 0, refused = -1;
        for (int k = 0; k < 8; k++) {
            int rc = dt_get(dc, k);
            served += rc == 0;
            if (rc) refused = k;
        }
        lm_dc_stats st;
        lm_dcache_get_stats(dc, &st);
        LM_CHECK_MSG(served == 7 && refused == bad && st.corrupt == 1 && st.entries == 7 && st.reads == 7,
                     "flip in %d: %d served, %d refused, corrupt %llu", bad, served, refused,
                     (unsigned long long)st.corrupt);
        lm_dcache_close(dc);
        free(dir);
    }
}

/* A pack cut inside its sixth entry (a file torn or truncated under its
 * name): the five before it serve, the cut one is counted, the file is cut
 * back to what is whole; a write that fails half-way (a kill or a full
 * disk) leaves no entry of its pack served and no file. */
LM_TEST(disk_cache_pack_torn_serves_nothing_torn) {
    char *dir = lm_tu_mkdir("dc_pack_torn");
    lm_disk_cache *dc;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_dcache_open(&dc, dir, 1 << 20, k_ident, &e) == 0);
    dt_put_pack(dc, 8);
    lm_dcache_close(dc);
    lm_dc_record r;
    char *p = dt_find(dir, 5, &r);
    LM_REQUIRE(p);
    size_t n;
    char *b = lm_tu_read(p, &n);
    lm_tu_write(p, b, r.offset + 10);
    free(b);
    LM_REQUIRE(lm_dcache_open(&dc, dir, 1 << 20, k_ident, &e) == 0);
    lm_dc_stats st;
    lm_dcache_get_stats(dc, &st);
    int ok = 0;
    for (int k = 0; k < 8; k++) ok += dt_get(dc, k) == 0 ? 1 << k : 0;
    LM_CHECK_MSG(ok == 0x1f && st.corrupt == 1 && st.entries == 5, "served %#x, corrupt %llu, entries %d", ok,
                 (unsigned long long)st.corrupt, st.entries);
    free(lm_tu_read(p, &n));
    LM_CHECK_MSG(n == r.offset, "the file is %zu bytes, its fifth entry ends at %llu", n, (unsigned long long)r.offset);
    lm_dcache_close(dc);
    free(p);
    /* a write cut half-way through a pack of eight: none of them, no file */
    char *dir2 = lm_tu_mkdir("dc_pack_cut");
    LM_REQUIRE(lm_dcache_open_with_faults(&dc, dir2, 1 << 20, k_ident, "write:EIO:0:1", &e) == 0);
    dt_put_pack(dc, 8);
    lm_dcache_get_stats(dc, &st);
    int served = 0, np, nt;
    size_t bytes;
    for (int k = 0; k < 8; k++) served += dt_get(dc, k) == 0;
    dt_count(dir2, &np, &nt, &bytes);
    LM_CHECK_MSG(served == 0 && st.write_errors == 8 && st.writes == 0 && np == 0 && nt == 0,
                 "served %d, write errors %llu, packs %d, temps %d", served, (unsigned long long)st.write_errors, np,
                 nt);
    lm_dcache_close(dc);
    free(dir2);
    free(dir);
}

/* A kill -9 while a pack is written leaves its temp file, whatever part of
 * it was out: the next start deletes it and serves none of its entries. */
LM_TEST(disk_cache_pack_kill_leaves_temp_only) {
    char *dir = lm_tu_mkdir("dc_pack_kill"), *src = lm_tu_mkdir("dc_pack_kill_src");
    lm_disk_cache *dc;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_dcache_open(&dc, src, 1 << 20, k_ident, &e) == 0);
    dt_put_pack(dc, 8);
    lm_dcache_close(dc);
    lm_dc_record r;
    char *p = dt_find(src, 0, &r);
    LM_REQUIRE(p);
    size_t n;
    char *b = lm_tu_read(p, &n);
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s/" LM_DC_TMP_PREFIX "%s", dir, strrchr(p, '/') + 1);
    lm_tu_write(tmp, b, n - 1); /* all but its last byte */
    LM_REQUIRE(lm_dcache_open(&dc, dir, 1 << 20, k_ident, &e) == 0);
    lm_dc_stats st;
    lm_dcache_get_stats(dc, &st);
    int served = 0;
    for (int k = 0; k < 8; k++) served += dt_get(dc, k) == 0;
    LM_CHECK(st.temp_cleaned == 1 && st.entries == 0 && served == 0 && access(tmp, F_OK) != 0);
    lm_dcache_close(dc);
    free(b);
    free(p);
    free(src);
    free(dir);
}

/* Eviction of part of a pack: a budget for five of its eight entries cuts
 * the file after the fifth (the chain's end goes first: the root was used
 * last), the bytes counted are the file's, and after a restart the five
 * still serve; one evicted inside the pack is forgotten but its bytes stay
 * counted until the entries after it go. */
LM_TEST(disk_cache_pack_evicts_its_end) {
    char *dir = lm_tu_mkdir("dc_pack_evict");
    size_t budget = lm_dc_head_bytes(8) + 5 * (DT_BS * 4 + DT_DATA);
    lm_disk_cache *dc;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_dcache_open(&dc, dir, budget, k_ident, &e) == 0);
    int32_t toks[DT_BS];
    uint8_t data[DT_DATA];
    lm_dcache_batch_begin(dc);
    for (int k = 0; k < 8; k++) {
        dt_entry(k, toks, data);
        lm_dcache_put(dc, dt_hash(k), k ? dt_hash(k - 1) : 1, LM_DC_KV, toks, DT_BS, data, DT_DATA);
    }
    for (int k = 7; k >= 0; k--) lm_dcache_touch(dc, dt_hash(k), LM_DC_KV); /* as the tier does: leaf first */
    lm_dcache_batch_end(dc);
    lm_dcache_flush(dc);
    lm_dc_stats st;
    lm_dcache_get_stats(dc, &st);
    int n, t;
    size_t bytes;
    dt_count(dir, &n, &t, &bytes);
    LM_CHECK_MSG(n == 1 && bytes == budget && st.bytes == bytes && st.entries == 5 && st.evicted == 3,
                 "%d packs, %zu bytes (budget %zu), entries %d, evicted %llu", n, bytes, budget, st.entries,
                 (unsigned long long)st.evicted);
    lm_dcache_close(dc);
    LM_REQUIRE(lm_dcache_open(&dc, dir, budget, k_ident, &e) == 0);
    int ok = 0;
    for (int k = 0; k < 8; k++) ok += dt_get(dc, k) == 0 ? 1 << k : 0;
    LM_CHECK_MSG(ok == 0x1f, "served %#x after a restart", ok);
    /* entry 2 refused (another prefix asked under its hash): forgotten, the file unchanged */
    dt_entry(2, toks, data);
    LM_CHECK(lm_dcache_get(dc, dt_hash(2), 999, LM_DC_KV, toks, DT_BS, data, DT_DATA) == -1);
    lm_dcache_get_stats(dc, &st);
    dt_count(dir, &n, &t, &bytes);
    LM_CHECK(st.entries == 4 && st.bytes == budget && bytes == budget && dt_get(dc, 3) == 0);
    lm_dcache_close(dc);
    free(dir);
}

/* Files of cache format 1 (one entry a file, "<hash>.kv" / ".st"): deleted
 * at start and counted, never read; a pack of a later version is foreign
 * and left alone (disk_cache_other_version_is_foreign). */
LM_TEST(disk_cache_v1_files_deleted) {
    char *dir = lm_tu_mkdir("dc_v1");
    char a[512], b[512], c[512];
    snprintf(a, sizeof a, "%s/0000000000abc000.kv", dir);
    snprintf(b, sizeof b, "%s/0000000000abc001.st", dir);
    snprintf(c, sizeof c, "%s/notes.kv", dir);
    static const char v1[72] = "LDPC"; /* a version-1 header's magic; the rest does not matter */
    LM_REQUIRE(lm_tu_write(a, v1, sizeof v1) == 0 && lm_tu_write(b, v1, sizeof v1) == 0 &&
               lm_tu_write(c, "x", 1) == 0);
    lm_disk_cache *dc;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_dcache_open(&dc, dir, 1 << 20, k_ident, &e) == 0);
    lm_dc_stats st;
    lm_dcache_get_stats(dc, &st);
    LM_CHECK(st.old_format == 2 && st.entries == 0 && st.corrupt == 0 && access(a, F_OK) != 0 &&
             access(b, F_OK) != 0 && access(c, F_OK) == 0);
    dt_put(dc, 2); /* and the directory works on */
    LM_CHECK(dt_get(dc, 1) == 0);
    lm_dcache_close(dc);
    free(dir);
}

/* A restore reads a pack once: the first entry's read takes the pack's
 * entries after it too, and they are served (each checked) from that
 * read; a read failing after the first would refuse one of them. */
LM_TEST(disk_cache_pack_one_read) {
    char *dir = lm_tu_mkdir("dc_pack_once");
    lm_disk_cache *dc;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_dcache_open(&dc, dir, 1 << 20, k_ident, &e) == 0);
    dt_put_pack(dc, 8);
    lm_dcache_close(dc);
    LM_REQUIRE(lm_dcache_open_with_faults(&dc, dir, 1 << 20, k_ident, "read:EIO:1", &e) == 0);
    int ok = 0;
    for (int k = 0; k < 8; k++) ok += dt_get(dc, k) == 0;
    lm_dc_stats st;
    lm_dcache_get_stats(dc, &st);
    LM_CHECK_MSG(ok == 8 && st.reads == 8 && st.read_errors == 0, "%d served, %llu read errors", ok,
                 (unsigned long long)st.read_errors);
    lm_dcache_close(dc);
    free(dir);
}
