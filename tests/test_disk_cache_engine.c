/* test_disk_cache_engine.c - the disk tier under the engine: after a
 * restart (a new engine on the same --cache-dir) a prompt served from disk
 * gives exactly the tokens of a cold run, on attention models (llama,
 * qwen3, gemma3 and gemma4 with sliding windows) and on the hybrids (demo,
 * qwen3.5, qwen3-next: the recurrent-state checkpoint comes from disk too), and
 * every damaged or unreadable entry, or another format's, is recomputed
 * instead of served. A hit that ends inside a block is exact too (an
 * attention model copies the shared rows from disk; a hybrid resumes at
 * its checkpoint). Under a real server (tests/data/disk_cache_faults.sh):
 * each I/O fault, a cache directory that cannot be used, a tmpfs that
 * fills up - the server starts, answers exactly and reports it. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/disk_internal.h"
#include "engine/lm_disk_cache.h"
#include "engine/lm_engine.h"
#include "engine/lm_model_identity.h"
#include "lm_test.h"
#include "test_util.h"

#define DK_N 100  /* prompt tokens: six full blocks and four more */
#define DK_GEN 8

/* Submits one greedy request; NULL when refused. */
static lm_request *dk_submit(lm_engine *en, const int32_t *ids, int n, lm_tu_collect *c) {
    lm_tu_collect_init(c);
    lm_gen_params p = { 0 };
    p.sampling.top_p = 1;
    p.repetition_penalty = 1;
    p.max_tokens = DK_GEN;
    lm_request *r = NULL;
    return lm_engine_submit(en, ids, n, &p, lm_tu_collect_on_token, c, &r, NULL) == LM_ENGINE_OK ? r : NULL;
}

static void dk_wait(lm_request *r, lm_tu_collect *c) {
    lm_tu_collect_wait(c);
    lm_request_release(r);
    lm_tu_collect_destroy(c);
}

/* One greedy request to its end. */
static int dk_generate(lm_engine *en, const int32_t *ids, int n, lm_tu_collect *c) {
    lm_request *r = dk_submit(en, ids, n, c);
    if (!r) return -1;
    dk_wait(r, c);
    return 0;
}

typedef struct dk_fix {
    lm_backend *be;
    lm_model *m;
    char *dir;
    int32_t prompt[DK_N];
    int32_t cold[DK_GEN];
    lm_kv_types kvt;
} dk_fix;

/* name: a fixture model, or "demo"; false (why filled) when it is missing. */
static bool dk_open(dk_fix *f, const char *name, const char *tag, char *why, size_t n_why) {
    memset(f, 0, sizeof *f);
    if (!lm_tu_load_named(name, &f->be, &f->m, why, n_why)) return false;
    uint32_t s = 11;
    for (int i = 0; i < DK_N; i++) {
        s = s * 1103515245u + 12345u;
        f->prompt[i] = 3 + (int32_t)((s >> 8) % (uint32_t)(f->m->cfg.vocab - 3));
    }
    f->dir = lm_tu_mkdir(tag);
    return lm_tu_greedy_alone(f->m, f->prompt, DK_N, DK_GEN, f->cold) == 0;
}

static void dk_close(dk_fix *f) {
    lm_model_free(f->m);
    lm_backend_destroy(f->be);
    free(f->dir);
}

#define DK_OPEN_OR_SKIP(f, name, tag)                 \
    dk_fix f;                                         \
    do {                                              \
        char why_[600] = "";                          \
        if (!dk_open(&f, name, tag, why_, sizeof why_)) { \
            dk_close(&f);                             \
            LM_SKIP("%s", why_);                      \
        }                                             \
    } while (0)

static lm_engine *dk_engine(lm_test_ctx *lm_t_, dk_fix *f) {
    lm_engine *en = NULL;
    lm_err e = { { 0 } };
    lm_engine_opts o = { .ctx = 256, .parallel = 2, .step_tokens = 64, .cache_ram = 32u << 20,
                         .cache_dir = f->dir, .cache_disk = 64u << 20, .kv_type = f->kvt };
    LM_CHECK_MSG(lm_engine_create(&en, f->m, &o, &e) == 0, "%s", e.msg);
    return en;
}

/* A cold run that leaves its blocks on disk; the engine is gone after. */
static void dk_fill(lm_test_ctx *lm_t_, dk_fix *f) {
    lm_engine *en = dk_engine(lm_t_, f);
    if (!en) return;
    lm_tu_collect r;
    LM_CHECK(dk_generate(en, f->prompt, DK_N, &r) == 0);
    LM_CHECK(r.n_cached == 0 && memcmp(r.toks, f->cold, DK_GEN * sizeof(int32_t)) == 0);
    lm_engine_free(en); /* writes what is queued */
}

/* The records of dir's packs, in file order within each pack, and the
 * packs' total bytes; how many records. */
static int dk_records(const char *dir, lm_dc_record *out, int max, size_t *bytes, int *packs) {
    int n = 0;
    *bytes = 0, *packs = 0;
    DIR *d = opendir(dir);
    for (struct dirent *de; d && (de = readdir(d));) {
        uint64_t id;
        if (!lm_dc_pack_parse(de->d_name, &id)) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        size_t len = 0;
        char *b = lm_tu_read(path, &len);
        const lm_dc_pack_header *h = (const lm_dc_pack_header *)b;
        *bytes += len, (*packs)++;
        for (uint32_t j = 0; b && len >= lm_dc_head_bytes((int)h->n_entries) && j < h->n_entries && n < max; j++)
            out[n++] = ((const lm_dc_record *)(b + sizeof *h))[j];
        free(b);
    }
    if (d) closedir(d);
    return n;
}

/* Entries in dir's packs of kind. */
static int dk_files(const char *dir, lm_dc_kind kind) {
    lm_dc_record rec[256];
    size_t bytes;
    int packs, n = dk_records(dir, rec, 256, &bytes, &packs), k = 0;
    for (int i = 0; i < n; i++) k += rec[i].kind == (uint32_t)kind;
    return k;
}

/* After a restart the repeat is served from disk, token for token. */
static void dk_restart(lm_test_ctx *lm_t_, const char *name, const char *tag) {
    DK_OPEN_OR_SKIP(f, name, tag);
    dk_fill(lm_t_, &f);
    bool hybrid = lm_model_state_spec(f.m, (int64_t[64]){ 0 }, 64) > 0;
    LM_CHECK_MSG(dk_files(f.dir, LM_DC_KV) >= DK_N / 16 && (!hybrid || dk_files(f.dir, LM_DC_STATE) >= 1),
                 "%d kv, %d st entries", dk_files(f.dir, LM_DC_KV), dk_files(f.dir, LM_DC_STATE));
    lm_engine *en = dk_engine(lm_t_, &f);
    LM_REQUIRE(en);
    lm_tu_collect r;
    LM_CHECK(dk_generate(en, f.prompt, DK_N, &r) == 0);
    LM_CHECK_MSG(memcmp(r.toks, f.cold, DK_GEN * sizeof(int32_t)) == 0, "%s: a disk hit changed the tokens", name);
    LM_CHECK_MSG(r.n_cached == 96 && r.n_cached_disk == 96, "%s: %d cached, %d from disk", name, r.n_cached,
                 r.n_cached_disk);
    lm_engine_stats st;
    lm_engine_get_stats(en, &st);
    LM_CHECK(st.cache_disk_hit_tokens == 96 && st.disk_on && st.disk.reads >= 6 && st.disk.corrupt == 0);
    /* the same again: RAM serves it now */
    LM_CHECK(dk_generate(en, f.prompt, DK_N, &r) == 0);
    LM_CHECK(r.n_cached == 96 && r.n_cached_disk == 0 && memcmp(r.toks, f.cold, DK_GEN * sizeof(int32_t)) == 0);
    lm_engine_free(en);
    dk_close(&f);
}

LM_TEST(disk_cache_restart_exact_llama) { dk_restart(lm_t_, "llama", "dk_llama"); }
LM_TEST(disk_cache_restart_exact_demo_hybrid) { dk_restart(lm_t_, "demo", "dk_demo"); }
LM_TEST(disk_cache_restart_exact_qwen35_hybrid) { dk_restart(lm_t_, "qwen3.5", "dk_qwen35"); }
LM_TEST(disk_cache_restart_exact_qwen3_next_hybrid) { dk_restart(lm_t_, "qwen3-next", "dk_qwen3next"); }
LM_TEST(disk_cache_restart_exact_qwen3) { dk_restart(lm_t_, "qwen3", "dk_qwen3"); }
LM_TEST(disk_cache_restart_exact_gemma3_sliding) { dk_restart(lm_t_, "gemma3", "dk_gemma3"); }
LM_TEST(disk_cache_restart_exact_gemma4) { dk_restart(lm_t_, "gemma4", "dk_gemma4"); }

/* Damage on disk between two runs: the second is still exact, hits less,
 * and counts what it found. */
static void dk_damage(lm_test_ctx *lm_t_, const char *tag, int mode) {
    DK_OPEN_OR_SKIP(f, "llama", tag);
    dk_fill(lm_t_, &f);
    /* mode 0: EIO on the first read; 1: a flipped payload byte in the 4th
     * block, in the middle of the prompt's pack; 2: the restarted engine
     * keeps KV in another format */
    if (mode == 2) f.kvt = (lm_kv_types){ LM_KV_BF16, LM_KV_BF16 }; /* another KV format: foreign */
    lm_engine *en = dk_engine(lm_t_, &f);
    LM_REQUIRE(en);
    lm_disk_cache *dc = lm_engine_disk_cache(en);
    LM_REQUIRE(dc);
    if (mode == 0) lm_dcache_inject(dc, LM_DC_OP_READ, EIO, 0, 1); /* the read of the prompt's pack fails */
    if (mode == 1) {
        DIR *d = opendir(f.dir);
        int flipped = 0;
        for (struct dirent *de; d && (de = readdir(d));) {
            uint64_t id;
            if (!lm_dc_pack_parse(de->d_name, &id)) continue;
            char path[1024];
            snprintf(path, sizeof path, "%s/%s", f.dir, de->d_name);
            size_t n;
            char *b = lm_tu_read(path, &n);
            const lm_dc_pack_header *h = (const lm_dc_pack_header *)b;
            const lm_dc_record *rec = (const lm_dc_record *)(b + sizeof *h);
            for (uint32_t j = 0; j < h->n_entries; j++)
                if (rec[j].kind == LM_DC_KV && rec[j].n_tokens == 16 &&
                    memcmp(b + rec[j].offset, f.prompt + 48, 16 * sizeof(int32_t)) == 0) /* block 3's tokens */
                    b[rec[j].offset + rec[j].bytes - 1] ^= 0x40, flipped++;
            lm_tu_write(path, b, n);
            free(b);
        }
        if (d) closedir(d);
        LM_REQUIRE(flipped == 1);
    }
    int32_t want[DK_GEN];
    LM_REQUIRE(lm_tu_greedy_alone_kv(f.m, f.kvt, f.prompt, DK_N, DK_GEN, want) == 0);
    lm_tu_collect r;
    LM_CHECK(dk_generate(en, f.prompt, DK_N, &r) == 0);
    LM_CHECK_MSG(memcmp(r.toks, want, DK_GEN * sizeof(int32_t)) == 0, "mode %d: tokens differ from a cold run", mode);
    lm_engine_stats st;
    lm_engine_get_stats(en, &st);
    if (mode == 0)
        LM_CHECK_MSG(r.n_cached == 0 && st.disk.read_errors == 1, "EIO: %d cached, %llu read errors", r.n_cached,
                     (unsigned long long)st.disk.read_errors);
    /* the three blocks before it still serve, from the same pack */
    if (mode == 1)
        LM_CHECK_MSG(r.n_cached == 48 && r.n_cached_disk == 48 && st.disk.corrupt == 1, "flip: %d cached", r.n_cached);
    if (mode == 2) LM_CHECK_MSG(r.n_cached == 0 && st.disk.foreign >= 6, "foreign: %d cached", r.n_cached);
    lm_engine_free(en);
    dk_close(&f);
}

LM_TEST(disk_cache_engine_eio_recomputes) { dk_damage(lm_t_, "dk_eio", 0); }
LM_TEST(disk_cache_engine_bit_flip_recomputes) { dk_damage(lm_t_, "dk_flip", 1); }
LM_TEST(disk_cache_engine_other_kv_format_ignored) { dk_damage(lm_t_, "dk_foreign", 2); }

LM_TEST(disk_cache_engine_needs_ram_cache) {
    DK_OPEN_OR_SKIP(f, "llama", "dk_noram");
    lm_engine *en = NULL;
    lm_err e = { { 0 } };
    lm_engine_opts o = { .ctx = 256, .parallel = 1, .cache_dir = f.dir, .cache_disk = 1 << 20 };
    LM_CHECK(lm_engine_create(&en, f.m, &o, &e) == -1 && strstr(e.msg, "--cache-ram"));
    /* and a second engine on a directory in use is refused */
    lm_engine *a = dk_engine(lm_t_, &f);
    o.cache_ram = 1 << 20;
    LM_CHECK(lm_engine_create(&en, f.m, &o, &e) == -1 && strstr(e.msg, "in use"));
    lm_engine_free(a);
    dk_close(&f);
}

/* The identity follows the bytes, not the path: a copy elsewhere keeps it,
 * a RoPE override (--rope-*) changes it,
 * one changed weight byte or another KV format changes it. */
LM_TEST(disk_cache_identity_follows_weights) {
    char *src = lm_test_fixture_path("models/llama");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    char *copy = lm_tu_mkdir("dk_ident_copy"), *edit = lm_tu_mkdir("dk_ident_edit");
    static const char *files[] = { "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json" };
    for (size_t i = 0; i < LM_COUNT(files); i++) {
        char a[1024], b[1024], c[1024];
        snprintf(a, sizeof a, "%s/%s", src, files[i]);
        snprintf(b, sizeof b, "%s/%s", copy, files[i]);
        snprintf(c, sizeof c, "%s/%s", edit, files[i]);
        size_t n;
        char *d = lm_tu_read(a, &n);
        LM_REQUIRE(d);
        lm_tu_write(b, d, n);
        if (i == 1) d[n - 3] ^= 1; /* the last tensor's last bytes */
        lm_tu_write(c, d, n);
        free(d);
    }
    const char *dirs[3] = { src, copy, edit };
    uint64_t id[5][2];
    lm_err e = { { 0 } };
    lm_backend *be = lm_tu_model_backend(1, &e);
    LM_REQUIRE(be);
    for (int i = 0; i < 3; i++) {
        lm_model *m = NULL;
        LM_REQUIRE(lm_model_load(&m, dirs[i], be, &e) == 0);
        int kv = 0;
        lm_model_identity(m, &kv, sizeof kv, id[i], NULL);
        if (i == 0) {
            kv = 1;
            lm_model_identity(m, &kv, sizeof kv, id[3], NULL);
            /* what --rope-scale 2 makes of the same files (it only sets cfg.rope) */
            kv = 0;
            LM_REQUIRE(lm_rope_override_apply(&m->cfg, &(lm_rope_override){ .scaling = LM_ROPE_SET_LINEAR, .factor = 2 },
                                              &e) == 0);
            lm_model_identity(m, &kv, sizeof kv, id[4], NULL);
        }
        lm_model_free(m);
    }
    LM_CHECK(id[0][0] == id[1][0] && id[0][1] == id[1][1]);
    LM_CHECK(id[0][0] != id[2][0] && id[0][1] != id[2][1]);
    LM_CHECK(id[0][0] != id[3][0]);
    LM_CHECK_MSG(id[0][0] != id[4][0] || id[0][1] != id[4][1], "a RoPE override keeps the identity");
    lm_backend_destroy(be);
    free(src);
    free(copy);
    free(edit);
}

/* A budget of the prompt's pack cut to four blocks: the directory never
 * holds more bytes than it, the index agrees with the files, eviction takes
 * the chain from its end by truncating the pack, and what is left still
 * serves exactly. */
LM_TEST(disk_cache_engine_small_budget) {
    DK_OPEN_OR_SKIP(f, "llama", "dk_budget");
    size_t entry = 16 * 4 + (size_t)2 * (size_t)f.m->n_kv_layers * 16 * (size_t)f.m->kv_width * sizeof(float);
    size_t budget = lm_dc_head_bytes(DK_N / 16) + 4 * entry; /* one pack of the six blocks, four left */
    lm_engine *en = NULL;
    lm_err e = { { 0 } };
    lm_engine_opts o = { .ctx = 256, .parallel = 1, .cache_ram = 32u << 20, .cache_dir = f.dir, .cache_disk = budget };
    LM_REQUIRE(lm_engine_create(&en, f.m, &o, &e) == 0);
    lm_tu_collect r;
    LM_CHECK(dk_generate(en, f.prompt, DK_N, &r) == 0 && memcmp(r.toks, f.cold, DK_GEN * sizeof(int32_t)) == 0);
    lm_dcache_flush(lm_engine_disk_cache(en));
    lm_dc_stats st;
    lm_dcache_get_stats(lm_engine_disk_cache(en), &st);
    lm_engine_free(en);
    size_t bytes;
    int packs;
    lm_dc_record rec[16];
    int n = dk_records(f.dir, rec, 16, &bytes, &packs);
    /* the prefill's pack may be written and cut before the request ends
     * (a fast writer): the end then writes the two blocks cut again, and
     * they go too; either way all but four are evicted */
    LM_CHECK_MSG(packs == 1 && n == DK_N / 16 && bytes == budget && st.entries == 4 && st.bytes == bytes &&
                     (st.writes == 6 || st.writes == 8) && st.evicted == st.writes - 4,
                 "%d packs of %d records, %zu bytes (budget %zu), %d entries, %llu written, evicted %llu", packs, n,
                 bytes, budget, st.entries, (unsigned long long)st.writes, (unsigned long long)st.evicted);
    /* the chain's end went first: its first four blocks still serve */
    LM_REQUIRE(lm_engine_create(&en, f.m, &o, &e) == 0);
    LM_CHECK(dk_generate(en, f.prompt, DK_N, &r) == 0 && memcmp(r.toks, f.cold, DK_GEN * sizeof(int32_t)) == 0);
    LM_CHECK_MSG(r.n_cached == 64 && r.n_cached_disk == 64, "%d cached, %d from disk", r.n_cached, r.n_cached_disk);
    lm_engine_free(en);
    dk_close(&f);
}

/* kill -9 at random moments while the server writes its cache (8 rounds of
 * tests/data/disk_cache_kill9.sh): the next server starts, deletes the
 * torn temp files and answers exactly, from the cache. */
LM_TEST(disk_cache_kill9_while_writing) {
    if (lm_tu_run("command -v curl >/dev/null && command -v python3 >/dev/null", NULL, NULL) != 0)
        LM_SKIP("needs curl and python3");
    char *work = lm_tu_mkdir("dk_kill9"), cmd[4096], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "bash '%s/tests/data/disk_cache_kill9.sh' '%s' '%s/models/demo' '%s' 8", LUMEN_SOURCE_DIR,
             lm_test_lumen_bin(), LUMEN_SOURCE_DIR, work);
    int rc = lm_tu_run(cmd, &out, &err);
    int cached = -1, temps = -1;
    LM_CHECK_MSG(rc == 0 && out && sscanf(out, "ok %d %d", &cached, &temps) == 2, "rc %d: %s %s", rc, out ? out : "",
                 err ? err : "");
    LM_CHECK_MSG(cached >= 1024, "%d prompt tokens cached after the kills", cached);
    free(out);
    free(err);
    free(work);
}

/* The disk entries of a request queued behind a running one are read
 * while it waits (the only running slot busy, a hybrid's state slot too):
 * it is still served from disk, exactly. */
LM_TEST(disk_cache_prefetch_while_busy_demo) {
    DK_OPEN_OR_SKIP(f, "demo", "dk_busy");
    dk_fill(lm_t_, &f);
    int32_t other[DK_N];
    for (int i = 0; i < DK_N; i++) other[i] = 3 + (f.prompt[i] * 7 + 11) % (f.m->cfg.vocab - 3);
    int32_t other_cold[DK_GEN];
    LM_REQUIRE(lm_tu_greedy_alone(f.m, other, DK_N, DK_GEN, other_cold) == 0);
    lm_engine *en = NULL;
    lm_err e = { { 0 } };
    lm_engine_opts o = { .ctx = 256, .parallel = 1, .step_tokens = 16, .cache_ram = 32u << 20,
                         .cache_dir = f.dir, .cache_disk = 64u << 20 };
    LM_REQUIRE(lm_engine_create(&en, f.m, &o, &e) == 0);
    lm_tu_collect a, b;
    lm_request *ra = dk_submit(en, other, DK_N, &a), *rb = dk_submit(en, f.prompt, DK_N, &b);
    LM_REQUIRE(ra && rb);
    dk_wait(ra, &a);
    dk_wait(rb, &b);
    LM_CHECK(a.n_cached == 0 && memcmp(a.toks, other_cold, DK_GEN * sizeof(int32_t)) == 0);
    LM_CHECK_MSG(b.n_cached == 96 && b.n_cached_disk == 96 && memcmp(b.toks, f.cold, DK_GEN * sizeof(int32_t)) == 0,
                 "queued behind a running request: %d cached, %d from disk", b.n_cached, b.n_cached_disk);
    lm_engine_free(en);
    dk_close(&f);
}

/* ---- a disk hit that ends inside a block ---- */

/* tokens: the fixture's prompt up to `shared`, then tokens of its own (each
 * differing from the prompt's there) up to n. */
static void dk_fork(const dk_fix *f, int shared, int n, int32_t *out) {
    for (int i = 0; i < n; i++) /* shifted by 1 to 7 ids, wrapping past the vocabulary's end */
        out[i] = i < shared ? f->prompt[i] : 3 + (f->prompt[i] - 3 + 1 + i % 7) % (f->m->cfg.vocab - 3);
}

/* A new engine on f's directory (a restart) serves ids exactly as a cold
 * run does, want_cached of its tokens from the cache, all of them from disk. */
static void dk_serve_after_restart(lm_test_ctx *lm_t_, dk_fix *f, const int32_t *ids, int n, int want_cached,
                                   const char *what) {
    int32_t cold[DK_GEN];
    LM_REQUIRE(lm_tu_greedy_alone(f->m, ids, n, DK_GEN, cold) == 0);
    lm_engine *en = dk_engine(lm_t_, f);
    LM_REQUIRE(en);
    lm_tu_collect r;
    LM_CHECK(dk_generate(en, ids, n, &r) == 0);
    LM_CHECK_MSG(memcmp(r.toks, cold, DK_GEN * sizeof(int32_t)) == 0, "%s: the disk hit changed the tokens", what);
    LM_CHECK_MSG(r.n_cached == want_cached && r.n_cached_disk == want_cached, "%s: %d cached, %d from disk, want %d",
                 what, r.n_cached, r.n_cached_disk, want_cached);
    lm_engine_free(en);
}

/* Attention: after a restart, a prompt that leaves the cached one inside a
 * block reuses that block's shared rows from disk (copy-on-write), as a RAM
 * hit does: diverging at 90 (block 5 of 6), being the first 90 tokens (the
 * hit stops at 89: the last token is computed), diverging at 10 (inside
 * the first block). Each after its own restart, so RAM holds nothing. */
LM_TEST(disk_cache_mid_block_exact_llama) {
    DK_OPEN_OR_SKIP(f, "llama", "dk_mid_llama");
    dk_fill(lm_t_, &f);
    int32_t ids[DK_N];
    dk_fork(&f, 90, DK_N, ids);
    dk_serve_after_restart(lm_t_, &f, ids, DK_N, 90, "diverging at 90");
    dk_serve_after_restart(lm_t_, &f, f.prompt, 90, 89, "the first 90 tokens");
    dk_fork(&f, 10, DK_N, ids);
    dk_serve_after_restart(lm_t_, &f, ids, DK_N, 10, "diverging at 10");
    dk_close(&f);
}

/* A hybrid cannot resume inside a block (its recurrent state exists only
 * at checkpoints): after a restart, a prompt diverging at 90 from a cached
 * 100-token turn resumes from the checkpoint at 48 (an earlier 50-token
 * turn's end), read from disk, and gives exactly a cold run's tokens. */
LM_TEST(disk_cache_mid_block_exact_demo_hybrid) {
    DK_OPEN_OR_SKIP(f, "demo", "dk_mid_demo");
    lm_engine *en = dk_engine(lm_t_, &f);
    LM_REQUIRE(en);
    lm_tu_collect r;
    LM_CHECK(dk_generate(en, f.prompt, 50, &r) == 0);
    LM_CHECK(dk_generate(en, f.prompt, DK_N, &r) == 0 && memcmp(r.toks, f.cold, DK_GEN * sizeof(int32_t)) == 0);
    lm_engine_free(en);
    int32_t ids[DK_N];
    dk_fork(&f, 90, DK_N, ids);
    dk_serve_after_restart(lm_t_, &f, ids, DK_N, 48, "diverging at 90");
    dk_serve_after_restart(lm_t_, &f, f.prompt, 90, 48, "the first 90 tokens");
    dk_close(&f);
}

/* ---- faults under a real server (tests/data/disk_cache_faults.sh) ---- */

/* One case of the script: the server starts, answers exactly, and its log
 * and /metrics say what it discarded. A case the machine cannot run (a
 * tmpfs mount refused, permissions as root) is a skip that says why. */
static void dk_server_fault(lm_test_ctx *lm_t_, const char *c) {
    if (lm_tu_run("command -v curl >/dev/null && command -v python3 >/dev/null", NULL, NULL) != 0)
        LM_SKIP("needs curl and python3");
    char tag[64], *work, cmd[4096], *out = NULL, *err = NULL;
    snprintf(tag, sizeof tag, "dk_fault_%s", c);
    work = lm_tu_mkdir(tag);
    snprintf(cmd, sizeof cmd, "bash '%s/tests/data/disk_cache_faults.sh' '%s' '%s/models/demo' '%s' %s",
             LUMEN_SOURCE_DIR, lm_test_lumen_bin(), LUMEN_SOURCE_DIR, work, c);
    int rc = lm_tu_run(cmd, &out, &err);
    free(work);
    if (rc == 0 && out && strncmp(out, "skip: ", 6) == 0) {
        out[strcspn(out, "\n")] = 0;
        char why[512];
        snprintf(why, sizeof why, "%s", out + 6);
        free(out);
        free(err);
        LM_SKIP("%s", why);
    }
    LM_CHECK_MSG(rc == 0 && out && strncmp(out, "ok", 2) == 0, "%s: rc %d: %s %s", c, rc, out ? out : "",
                 err ? err : "");
    free(out);
    free(err);
}

LM_TEST(disk_cache_server_fault_enospc_write) { dk_server_fault(lm_t_, "write"); }
LM_TEST(disk_cache_server_fault_fsync) { dk_server_fault(lm_t_, "fsync"); }
LM_TEST(disk_cache_server_fault_rename) { dk_server_fault(lm_t_, "rename"); }
LM_TEST(disk_cache_server_fault_eio_read) { dk_server_fault(lm_t_, "read"); }
LM_TEST(disk_cache_server_fault_eio_scan) { dk_server_fault(lm_t_, "scan"); }
LM_TEST(disk_cache_server_dir_is_a_file) { dk_server_fault(lm_t_, "notdir"); }
LM_TEST(disk_cache_server_dir_unreadable) { dk_server_fault(lm_t_, "unreadable"); }
LM_TEST(disk_cache_server_tmpfs_fills_up) { dk_server_fault(lm_t_, "tmpfs"); }
