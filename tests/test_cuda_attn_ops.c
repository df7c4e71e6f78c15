/* test_cuda_attn_ops.c - the CUDA backend's kv_write, attention, Gated
 * DeltaNet and MoE ops against the CPU backend on the same random inputs.
 *
 * Every test creates both backends, fills identical inputs on each (never
 * zeros), poisons the outputs with NaN first, runs the op on both and
 * compares. Without a usable GPU each test skips with the reason.
 *
 * Attention batches mix sequences on purpose: tokens dealt round-robin,
 * block tables that are a shuffled permutation of the pool, decoding tokens
 * next to prefill chunks, a chunk that continues a sequence at position 37,
 * and one sequence at ~3000 positions so that the split (flash-decoding)
 * path and its combine kernel run. Head widths 64, 80, 128, 256; GQA
 * ratios 1, 3, 4, 8, 16; a sliding window with softcap.
 *
 * The recurrent ops run over two calls per configuration so that state is
 * carried: a sequence that starts at position 0 in a slot full of garbage
 * (which must be ignored), one that continues from a saved state, one
 * decoding a single token, one that restarts at position 0 in the second
 * call, and a slot no sequence uses (which must not change).
 *
 * Tolerances (|gpu - cpu| / max(|cpu|, floor)): kv_write exact;
 * attention 1e-4 (floor 0.05; f32 on both sides, ~1e-6 expected);
 * conv1d_state, delta_gates, rms_norm_gated 1e-5 (floor 1); gated_delta
 * 1e-4 (floor 1; the CPU runs several tokens in the chunked form, the GPU
 * token by token); moe 1e-4 (floor 1; the matmuls of both backends). */
#include "lm_test.h"

#include "backend/lm_backend.h"
#include "backend/lm_dtype.h"
#include "engine/lm_kv_cache.h"
#include "model/lm_blocks.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---------------------------------------------------------------- */

static float ca_rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x800000 - 1.0f; /* [-1, 1) */
}

static void ca_fill(float *p, size_t n, uint64_t *s, float lo, float hi) {
    for (size_t i = 0; i < n; i++) p[i] = lo + (hi - lo) * 0.5f * (ca_rnd(s) + 1.0f);
}

static float *ca_host(size_t n, uint64_t *s, float lo, float hi) {
    float *p = malloc(n * sizeof(float));
    ca_fill(p, n, s, lo, hi);
    return p;
}

/* Both backends: [0] CPU (the reference), [1] CUDA. */
typedef struct ca_be {
    lm_backend *b[2];
} ca_be;

static bool ca_open(ca_be *be, char *why, size_t n) {
    lm_err e;
    memset(be, 0, sizeof *be);
    be->b[0] = lm_cpu_backend_create(0, LM_ISA_AUTO, &e);
    if (be->b[0]) be->b[1] = lm_cuda_backend_create(0, &e);
    if (!be->b[0] || !be->b[1]) {
        snprintf(why, n, "%.200s", e.msg);
        lm_backend_destroy(be->b[0]);
        return false;
    }
    return true;
}

/* Skips without a GPU; opens both backends or fails the test. */
#define CA_OPEN(be)                                                  \
    char why_[256];                                                  \
    if (!lm_cuda_available(why_, sizeof why_)) LM_SKIP("%s", why_);  \
    ca_be be;                                                        \
    if (!ca_open(&be, why_, sizeof why_)) {                          \
        LM_CHECK_MSG(0, "%s", why_);                                 \
        return;                                                      \
    }

static void ca_close(ca_be *be) {
    lm_backend_destroy(be->b[1]);
    lm_backend_destroy(be->b[0]);
}

static lm_tensor ca_tensor(lm_backend *be, int64_t rows, int64_t cols, const float *host) {
    lm_tensor t;
    LM_ASSERT(lm_tensor_alloc(be, &t, rows, cols) == 0);
    if (host) be->ops->write(be, t.data, host, (size_t)(rows * cols) * sizeof(float));
    return t;
}

/* An output tensor full of NaN. */
static lm_tensor ca_poisoned(lm_backend *be, int64_t rows, int64_t cols) {
    size_t n = (size_t)(rows * cols);
    float *nan = malloc(LM_MAX(n, (size_t)1) * sizeof(float));
    for (size_t i = 0; i < n; i++) nan[i] = NAN;
    lm_tensor t = ca_tensor(be, rows, cols, nan);
    free(nan);
    return t;
}

static float *ca_read(lm_backend *be, const void *src, size_t n) {
    float *p = malloc(LM_MAX(n, (size_t)1) * sizeof(float));
    be->ops->read(be, p, src, n * sizeof(float));
    return p;
}

/* Reads n floats at p[0] / p[1] from each backend and returns lm_tu_rel_err. */
static double ca_cmp(const ca_be *be, void *const p[2], size_t n, double floor) {
    float *ref = ca_read(be->b[0], p[0], n), *got = ca_read(be->b[1], p[1], n);
    double e = lm_tu_rel_err(got, ref, n, floor);
    free(ref);
    free(got);
    return e;
}

static void ca_release(const ca_be *be, lm_tensor t[2]) {
    for (int i = 0; i < 2; i++) lm_tensor_release(be->b[i], &t[i]);
}

/* Tokens of S sequences dealt round-robin: sequence s has n[s] tokens from
 * position pos0[s]. */
typedef struct ca_batch {
    int T;
    int32_t *pos, *seq;
} ca_batch;

static ca_batch ca_batch_make(int S, const int *n, const int *pos0) {
    ca_batch d = { 0, NULL, NULL };
    for (int s = 0; s < S; s++) d.T += n[s];
    d.pos = malloc((size_t)LM_MAX(d.T, 1) * sizeof(int32_t));
    d.seq = malloc((size_t)LM_MAX(d.T, 1) * sizeof(int32_t));
    lm_tu_round_robin(S, n, pos0, d.pos, d.seq);
    return d;
}

static void ca_batch_free(ca_batch *d) {
    free(d->pos);
    free(d->seq);
}

/* ---- paged KV pools ----------------------------------------------------------- */

enum { CA_BS = 16, CA_LAYERS = 2, CA_LAYER = 1, CA_MAXS = 8 };

/* The same pool on both backends (layer CA_LAYER filled with random K and
 * V) and block tables that deal a shuffled permutation of the blocks to the
 * sequences, enough for positions [0, pos0[s] + n[s]). */
typedef struct ca_pool {
    lm_kv_cache *kc[2];
    int n_blocks;
    int64_t kv_width;
    int32_t *perm, *tables[CA_MAXS];
} ca_pool;

/* Bytes of one layer's K or V rows in format t (a multiple of 4 here). */
static size_t ca_pool_bytes(const ca_pool *p, lm_kv_type t) {
    return (size_t)p->n_blocks * CA_BS * lm_kv_row_bytes(t, p->kv_width);
}

/* types NULL: f32 rows; else rows in those formats (rot: LM_KV_Q4R's). The
 * pool's bytes are random either way. */
static bool ca_pool_make_typed(ca_pool *p, const ca_be *be, int64_t kv_width, const lm_kv_types *types, int rot, int S,
                               const int *n, const int *pos0, uint64_t *rng) {
    memset(p, 0, sizeof *p);
    LM_ASSERT(S <= CA_MAXS);
    int nb[CA_MAXS], total = 0;
    for (int s = 0; s < S; s++) {
        nb[s] = (pos0[s] + n[s] - 1) / CA_BS + 1;
        total += nb[s];
    }
    p->n_blocks = total + 5;
    p->kv_width = kv_width;
    p->perm = malloc((size_t)p->n_blocks * sizeof(int32_t));
    for (int i = 0; i < p->n_blocks; i++) p->perm[i] = i;
    for (int i = p->n_blocks - 1; i > 0; i--) {
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        int j = (int)((*rng >> 33) % (uint64_t)(i + 1));
        int32_t x = p->perm[i];
        p->perm[i] = p->perm[j];
        p->perm[j] = x;
    }
    for (int s = 0, at = 0; s < S; at += nb[s], s++) p->tables[s] = p->perm + at;
    lm_err e;
    for (int b = 0; b < 2; b++) {
        const int rc = types ? lm_kv_cache_create_typed(&p->kc[b], be->b[b], CA_LAYERS, kv_width, NULL, *types, rot,
                                                        CA_BS, p->n_blocks, NULL, &e)
                             : lm_kv_cache_create(&p->kc[b], be->b[b], CA_LAYERS, kv_width, CA_BS, p->n_blocks, NULL, &e);
        if (rc != 0) {
            fprintf(stderr, "  kv cache: %s\n", e.msg);
            return false;
        }
    }
    const lm_kv_types t = types ? *types : (lm_kv_types){ LM_KV_F32, LM_KV_F32 };
    const size_t kb = ca_pool_bytes(p, t.k), vb = ca_pool_bytes(p, t.v);
    float *k = ca_host(kb / sizeof(float), rng, -1, 1), *v = ca_host(vb / sizeof(float), rng, -1, 1);
    for (int b = 0; b < 2; b++) {
        be->b[b]->ops->write(be->b[b], p->kc[b]->pool.k[CA_LAYER], k, kb);
        be->b[b]->ops->write(be->b[b], p->kc[b]->pool.v[CA_LAYER], v, vb);
    }
    free(k);
    free(v);
    return true;
}

static bool ca_pool_make(ca_pool *p, const ca_be *be, int64_t kv_width, int S, const int *n, const int *pos0,
                         uint64_t *rng) {
    return ca_pool_make_typed(p, be, kv_width, NULL, 0, S, n, pos0, rng);
}

static void ca_pool_free(ca_pool *p) {
    for (int b = 0; b < 2; b++) lm_kv_cache_free(p->kc[b]);
    free(p->perm);
}

/* ---- attention ------------------------------------------------------------------- */

/* One batch on one head configuration, compared. */
static void ca_attn_case(lm_test_ctx *lm_t_, const ca_be *be, const char *name, int H, int Hkv, int Dh,
                         int window, float softcap, int S, const int *n, const int *pos0, uint64_t seed) {
    const int64_t kvw = (int64_t)Hkv * Dh + 32, qc = (int64_t)H * Dh + 8, oc = (int64_t)H * Dh;
    ca_pool pool;
    bool ok = ca_pool_make(&pool, be, kvw, S, n, pos0, &seed);
    LM_CHECK_MSG(ok, "%s: pool", name);
    if (!ok) {
        ca_pool_free(&pool);
        return;
    }
    ca_batch d = ca_batch_make(S, n, pos0);
    lm_attn_batch ab = { .n_tokens = d.T, .pos = d.pos, .seq = d.seq, .n_seqs = S,
                         .block_tables = (const int32_t *const *)pool.tables, .state_slot = NULL };
    lm_attn_params ap = { .n_heads = H, .n_kv_heads = Hkv, .head_dim = Dh, .scale = 1.0f / sqrtf((float)Dh),
                          .window = window, .softcap = softcap };
    float *qh = ca_host((size_t)d.T * (size_t)qc, &seed, -3, 3); /* peaky enough that errors show */
    lm_tensor q[2], out[2];
    for (int b = 0; b < 2; b++) {
        q[b] = ca_tensor(be->b[b], d.T, qc, qh);
        out[b] = ca_poisoned(be->b[b], d.T, oc);
        be->b[b]->ops->attention(be->b[b], &out[b], &q[b], &pool.kc[b]->pool, CA_LAYER, &ab, &ap);
    }
    void *po[2] = { out[0].data, out[1].data };
    double err = ca_cmp(be, po, (size_t)d.T * (size_t)oc, 0.05);
    LM_CHECK_MSG(err <= 1e-4, "%s: H %d Hkv %d Dh %d window %d softcap %g: err %.3g", name, H, Hkv, Dh, window,
                 (double)softcap, err);
    ca_release(be, q);
    ca_release(be, out);
    free(qh);
    ca_batch_free(&d);
    ca_pool_free(&pool);
}

/* Head configurations: {H, Hkv, Dh, window, softcap x 100}. */
static const int ca_heads[][5] = {
    { 8, 8, 64, 0, 0 },   /* MHA */
    { 16, 4, 128, 0, 0 }, /* GQA 4 */
    { 16, 2, 256, 0, 0 }, /* GQA 8, Gemma / Qwen3.5 width */
    { 6, 2, 80, 0, 0 },   /* GQA 3, width not a power of two */
    { 32, 2, 64, 0, 0 },  /* GQA 16 */
    { 8, 1, 256, 50, 200 }, /* sliding window and softcap */
    { 8, 2, 512, 0, 0 },  /* Gemma 4 global width: the per-token kernel, 2 heads a block */
};

static void ca_attn_all(lm_test_ctx *lm_t_, const char *name, int S, const int *n, const int *pos0) {
    char why[256];
    ca_be be;
    if (!ca_open(&be, why, sizeof why)) {
        LM_CHECK_MSG(0, "%s", why);
        return;
    }
    for (size_t i = 0; i < LM_COUNT(ca_heads); i++) {
        const int *h = ca_heads[i];
        ca_attn_case(lm_t_, &be, name, h[0], h[1], h[2], h[3], (float)h[4] / 100.0f, S, n, pos0, 1234 + i);
    }
    ca_close(&be);
}

LM_TEST(cuda_attention_decode) {
    char why[256];
    if (!lm_cuda_available(why, sizeof why)) LM_SKIP("%s", why);
    /* one token each; the long one goes through the split path */
    const int n[] = { 1, 1, 1, 1, 1 }, pos0[] = { 0, 37, 700, 3001, 16 };
    ca_attn_all(lm_t_, "decode", 5, n, pos0);
}

LM_TEST(cuda_attention_prefill) {
    char why[256];
    if (!lm_cuda_available(why, sizeof why)) LM_SKIP("%s", why);
    /* from position 0; 70 tokens cross several tiles and blocks */
    const int n[] = { 70, 19, 1 }, pos0[] = { 0, 0, 0 };
    ca_attn_all(lm_t_, "prefill", 3, n, pos0);
}

LM_TEST(cuda_attention_chunk) {
    char why[256];
    if (!lm_cuda_available(why, sizeof why)) LM_SKIP("%s", why);
    /* a chunk continuing a sequence already in the cache, alone and beside
     * a long prefill */
    const int n1[] = { 45 }, p1[] = { 37 };
    ca_attn_all(lm_t_, "chunk", 1, n1, p1);
    const int n2[] = { 45, 300 }, p2[] = { 37, 0 };
    ca_attn_all(lm_t_, "chunk+prefill", 2, n2, p2);
}

LM_TEST(cuda_attention_long_prefill) {
    char why[256];
    if (!lm_cuda_available(why, sizeof why)) LM_SKIP("%s", why);
    /* many key tiles a block, splits over one sequence's keys, a chunk
     * reading 700 cached keys */
    const int n1[] = { 1000 }, p1[] = { 0 };
    ca_attn_all(lm_t_, "long prefill", 1, n1, p1);
    const int n2[] = { 300, 5 }, p2[] = { 700, 0 };
    ca_attn_all(lm_t_, "long chunk", 2, n2, p2);
}

/* The tiled attention on CUDA cores (LUMEN_CUDA_ATT_TC=0, read at backend
 * creation): the fallback for rows 16-byte loads cannot read. */
LM_TEST(cuda_attention_cuda_cores) {
    char why[256];
    if (!lm_cuda_available(why, sizeof why)) LM_SKIP("%s", why);
    setenv("LUMEN_CUDA_ATT_TC", "0", 1);
    const int n[] = { 70, 19, 1 }, pos0[] = { 0, 0, 0 };
    ca_attn_all(lm_t_, "prefill (cuda cores)", 3, n, pos0);
    const int n2[] = { 1, 40, 100, 1, 2 }, p2[] = { 2990, 37, 0, 10, 500 };
    ca_attn_all(lm_t_, "mixed (cuda cores)", 5, n2, p2);
    unsetenv("LUMEN_CUDA_ATT_TC");
}

LM_TEST(cuda_attention_mixed) {
    char why[256];
    if (!lm_cuda_available(why, sizeof why)) LM_SKIP("%s", why);
    /* decoding at ~3000 and at 10, a chunk at 37, a prefill from 0, a
     * two-token draft: one call */
    const int n[] = { 1, 40, 100, 1, 2 }, pos0[] = { 2990, 37, 0, 10, 500 };
    ca_attn_all(lm_t_, "mixed", 5, n, pos0);
}

/* ---- kv_write ---------------------------------------------------------------------- */

LM_TEST(cuda_kv_write) {
    CA_OPEN(be);
    uint64_t seed = 99;
    /* Written width below the pool width; positions across block edges. */
    const int S = 3, n[] = { 20, 1, 33 }, pos0[] = { 0, 47, 14 };
    const int64_t kvw = 2 * 128 + 64, cols = 2 * 128;
    ca_pool pool;
    bool ok = ca_pool_make(&pool, &be, kvw, S, n, pos0, &seed);
    LM_CHECK(ok);
    ca_batch d = ca_batch_make(S, n, pos0);
    lm_attn_batch ab = { .n_tokens = d.T, .pos = d.pos, .seq = d.seq, .n_seqs = S,
                         .block_tables = (const int32_t *const *)pool.tables, .state_slot = NULL };
    float *kh = ca_host((size_t)d.T * cols, &seed, -1, 1), *vh = ca_host((size_t)d.T * cols, &seed, -1, 1);
    lm_tensor k[2], v[2];
    for (int b = 0; ok && b < 2; b++) {
        k[b] = ca_tensor(be.b[b], d.T, cols, kh);
        v[b] = ca_tensor(be.b[b], d.T, cols, vh);
        be.b[b]->ops->kv_write(be.b[b], &pool.kc[b]->pool, CA_LAYER, &k[b], &v[b], &ab);
    }
    if (ok) {
        size_t nf = (size_t)pool.n_blocks * CA_BS * (size_t)kvw;
        for (int kind = 0; kind < 2; kind++) {
            void *p[2];
            for (int b = 0; b < 2; b++) p[b] = kind ? pool.kc[b]->pool.v[CA_LAYER] : pool.kc[b]->pool.k[CA_LAYER];
            float *ref = ca_read(be.b[0], p[0], nf), *got = ca_read(be.b[1], p[1], nf);
            LM_CHECK_MSG(memcmp(ref, got, nf * sizeof(float)) == 0, "%s pool differs", kind ? "V" : "K");
            /* and the rows landed where the tables say */
            for (int t = 0; t < d.T; t++) {
                int32_t blk = pool.tables[d.seq[t]][d.pos[t] / CA_BS];
                const float *row = got + ((size_t)blk * CA_BS + (size_t)(d.pos[t] % CA_BS)) * (size_t)kvw;
                LM_CHECK(memcmp(row, (kind ? vh : kh) + (size_t)t * cols, (size_t)cols * sizeof(float)) == 0);
            }
            free(ref);
            free(got);
        }
        ca_release(&be, k);
        ca_release(&be, v);
    }
    free(kh);
    free(vh);
    ca_batch_free(&d);
    ca_pool_free(&pool);
    ca_close(&be);
}

/* A paged pool and batch of S sequences for the rope + KV write tests, with
 * rope parameters over rot dims (q and k share one frequency array unless
 * split_freq; rq and rk point into the struct, which must stay put). */
typedef struct ca_rope_case {
    ca_pool pool;
    ca_batch d;
    lm_attn_batch ab;
    float fq[128], fk[128];
    lm_rope_params rq, rk;
    int64_t kvw, qc, kc; /* pool width, q and k columns */
} ca_rope_case;

/* KV formats the fused rope tests write: written by the kernel (f32, bf16),
 * a quantised side (the kernel's rope, then the format's kv_write), and
 * mixes. LM_KV_Q4R rotates by CA_KV_ROT: it divides every head width and
 * the pool width there. */
#define CA_KV_ROT 32
static const lm_kv_types ca_rope_formats[] = {
    { LM_KV_F32, LM_KV_F32 }, { LM_KV_BF16, LM_KV_BF16 }, { LM_KV_BF16, LM_KV_F32 },
    { LM_KV_Q8, LM_KV_BF16 }, { LM_KV_Q4R, LM_KV_Q4 },
};

static bool ca_rope_case_make(ca_rope_case *r, const ca_be *be, int Hq, int Hkv, int Dh, int rot, bool inter,
                              float factor, bool split_freq, const lm_kv_types *types, int S, const int *n,
                              const int *pos0, uint64_t *seed) {
    LM_ASSERT(rot / 2 <= 128);
    r->kvw = (int64_t)Hkv * Dh + 32, r->qc = (int64_t)Hq * Dh, r->kc = (int64_t)Hkv * Dh;
    if (!ca_pool_make_typed(&r->pool, be, r->kvw, types, CA_KV_ROT, S, n, pos0, seed)) return false;
    r->d = ca_batch_make(S, n, pos0);
    r->ab = (lm_attn_batch){ .n_tokens = r->d.T, .pos = r->d.pos, .seq = r->d.seq, .n_seqs = S,
                             .block_tables = (const int32_t *const *)r->pool.tables, .state_slot = NULL };
    for (int i = 0; i < rot / 2; i++) r->fq[i] = r->fk[i] = powf(10000.0f, -2.0f * (float)i / (float)rot);
    r->rq = (lm_rope_params){ Hq, Dh, rot, inter, r->fq, factor };
    r->rk = r->rq;
    r->rk.n_heads = Hkv;
    if (split_freq) r->rk.inv_freq = r->fk;
    return true;
}

static void ca_rope_case_free(ca_rope_case *r) {
    ca_batch_free(&r->d);
    ca_pool_free(&r->pool);
}

/* The GPU's K and V pools of layer CA_LAYER (formats t), read back. */
static void ca_read_pools(const ca_be *be, const ca_pool *p, lm_kv_types t, float **K, float **V) {
    lm_backend *g = be->b[1];
    *K = ca_read(g, p->kc[1]->pool.k[CA_LAYER], ca_pool_bytes(p, t.k) / sizeof(float));
    *V = ca_read(g, p->kc[1]->pool.v[CA_LAYER], ca_pool_bytes(p, t.v) / sizeof(float));
}

/* Whether the composed (c*) and fused (f*) GPU runs left the same q, k (nq,
 * nk floats) and K, V pools, bit for bit; says so on the case's line. */
static bool ca_fused_same(const float *cq, const float *fq, size_t nq, const float *ck, const float *fk, size_t nk,
                          const float *cK, const float *fK, const float *cV, const float *fV, const ca_pool *p,
                          lm_kv_types t, size_t ci) {
    const bool same = !memcmp(cq, fq, nq * sizeof(float)) && !memcmp(ck, fk, nk * sizeof(float)) &&
                      !memcmp(cK, fK, ca_pool_bytes(p, t.k)) && !memcmp(cV, fV, ca_pool_bytes(p, t.v));
    printf("  config %zu, K %s V %s: fused %s the composed GPU ops", ci, lm_kv_type_name(t.k), lm_kv_type_name(t.v),
           same ? "bitwise equal to" : "DIFFERS from");
    return same;
}

/* The fused rope of q and k + KV write: on the GPU bit for bit against
 * rope, rope, kv_write on the GPU (q, k and both pools) in every KV format
 * of ca_rope_formats, and for f32 against the same on the CPU: full and
 * partial rotary, both pair layouts, a yarn-like attention factor, and q
 * and k with different frequency arrays (the fallback). */
LM_TEST(cuda_rope_kv_write_fused) {
    CA_OPEN(be);
    LM_REQUIRE(be.b[1]->ops->rope_kv_write != NULL);
    static const struct { int Hq, Hkv, Dh, rot; bool inter; float factor; bool split_freq; } cfgs[] = {
        { 4, 2, 64, 64, false, 1.0f, false }, { 4, 1, 128, 32, true, 0.8f, false },
        { 6, 2, 128, 64, false, 1.0f, false }, { 4, 2, 64, 64, false, 1.0f, true },
    };
    uint64_t seed = 4242;
    const int S = 3, n[] = { 20, 1, 33 }, pos0[] = { 0, 47, 14 };
    for (size_t ci = 0; ci < LM_COUNT(cfgs); ci++) {
        for (size_t fi = 0; fi < LM_COUNT(ca_rope_formats); fi++) {
            const lm_kv_types ft = ca_rope_formats[fi];
            const bool f32 = ft.k == LM_KV_F32 && ft.v == LM_KV_F32;
            ca_rope_case rc;
            LM_REQUIRE(ca_rope_case_make(&rc, &be, cfgs[ci].Hq, cfgs[ci].Hkv, cfgs[ci].Dh, cfgs[ci].rot, cfgs[ci].inter,
                                         cfgs[ci].factor, cfgs[ci].split_freq, &ft, S, n, pos0, &seed));
            const size_t nq = (size_t)rc.d.T * rc.qc, nk = (size_t)rc.d.T * rc.kc;
            float *qh = ca_host(nq, &seed, -1, 1), *kh = ca_host(nk, &seed, -1, 1), *vh = ca_host(nk, &seed, -1, 1);
            lm_backend *g = be.b[1];
            lm_kv_pool *gp = &rc.pool.kc[1]->pool;
            /* the composed GPU ops first, from the pools' first bytes */
            float *K0, *V0, *cK, *cV;
            ca_read_pools(&be, &rc.pool, ft, &K0, &V0);
            lm_tensor cq = ca_tensor(g, rc.d.T, rc.qc, qh), ck = ca_tensor(g, rc.d.T, rc.kc, kh);
            lm_tensor cv = ca_tensor(g, rc.d.T, rc.kc, vh);
            g->ops->rope(g, &cq, rc.ab.pos, &rc.rq);
            g->ops->rope(g, &ck, rc.ab.pos, &rc.rk);
            g->ops->kv_write(g, gp, CA_LAYER, &ck, &cv, &rc.ab);
            ca_read_pools(&be, &rc.pool, ft, &cK, &cV);
            g->ops->write(g, gp->k[CA_LAYER], K0, ca_pool_bytes(&rc.pool, ft.k));
            g->ops->write(g, gp->v[CA_LAYER], V0, ca_pool_bytes(&rc.pool, ft.v));
            lm_tensor q[2], k[2], v[2];
            for (int b = 0; b < 2; b++) {
                lm_backend *x = be.b[b];
                q[b] = ca_tensor(x, rc.d.T, rc.qc, qh), k[b] = ca_tensor(x, rc.d.T, rc.kc, kh);
                v[b] = ca_tensor(x, rc.d.T, rc.kc, vh);
                /* the GPU's fused op; the CPU (no such op) composes rope, rope, kv_write */
                lm_op_rope_kv_write(x, &q[b], &k[b], &v[b], &rc.rq, &rc.rk, &rc.pool.kc[b]->pool, CA_LAYER, &rc.ab);
            }
            float *fK, *fV;
            ca_read_pools(&be, &rc.pool, ft, &fK, &fV);
            float *a1 = ca_read(g, cq.data, nq), *a2 = ca_read(g, q[1].data, nq);
            float *b1 = ca_read(g, ck.data, nk), *b2 = ca_read(g, k[1].data, nk);
            LM_CHECK(ca_fused_same(a1, a2, nq, b1, b2, nk, cK, fK, cV, fV, &rc.pool, ft, ci));
            if (f32) {
                void *pq[2] = { q[0].data, q[1].data }, *pk[2] = { k[0].data, k[1].data };
                void *pK[2] = { rc.pool.kc[0]->pool.k[CA_LAYER], gp->k[CA_LAYER] };
                void *pV[2] = { rc.pool.kc[0]->pool.v[CA_LAYER], gp->v[CA_LAYER] };
                const size_t nf = (size_t)rc.pool.n_blocks * CA_BS * (size_t)rc.kvw;
                double eq = ca_cmp(&be, pq, nq, 1.0), ek = ca_cmp(&be, pk, nk, 1.0);
                double eK = ca_cmp(&be, pK, nf, 1.0), eV = ca_cmp(&be, pV, nf, 1.0); /* absolute */
                printf("; against the CPU: q %.2g, k %.2g, K pool %.2g, V pool %.2g", eq, ek, eK, eV);
                LM_CHECK(eq <= 1e-6 && ek <= 1e-6 && eK <= 1e-6 && eV == 0);
            }
            printf("\n");
            free(K0), free(V0), free(cK), free(cV), free(fK), free(fV), free(a1), free(a2), free(b1), free(b2);
            lm_tensor_release(g, &cq), lm_tensor_release(g, &ck), lm_tensor_release(g, &cv);
            ca_release(&be, q), ca_release(&be, k), ca_release(&be, v);
            free(qh), free(kh), free(vh);
            ca_rope_case_free(&rc);
        }
    }
    ca_close(&be);
}

/* The fused per-head norms + rope + KV write on the GPU against the same
 * three steps on the GPU (bit for bit: qn, kn and the whole pool, in every
 * KV format of ca_rope_formats) and, for f32, on the CPU (1e-6): head
 * widths 64, 80, 128 and 256, full and partial rotary, both pair layouts,
 * norm weight offsets 0 and 1 (Qwen3.5's 1 + w), and different frequency
 * arrays for q and k (the composed fallback). */
LM_TEST(cuda_norm_rope_kv_write_fused) {
    CA_OPEN(be);
    LM_REQUIRE(be.b[1]->ops->norm_rope_kv_write != NULL);
    static const struct { int Hq, Hkv, Dh, rot; bool inter; float off; bool split_freq; } cfgs[] = {
        { 4, 2, 64, 64, false, 0.0f, false }, { 6, 2, 80, 80, false, 0.0f, false },
        { 8, 2, 128, 128, true, 0.0f, false }, { 6, 2, 256, 64, false, 1.0f, false },
        { 4, 2, 64, 64, false, 1.0f, true },
    };
    uint64_t seed = 5151;
    const int S = 3, n[] = { 9, 1, 17 }, pos0[] = { 0, 47, 14 };
    for (size_t ci = 0; ci < LM_COUNT(cfgs); ci++) {
        for (size_t fi = 0; fi < LM_COUNT(ca_rope_formats); fi++) {
            const lm_kv_types ft = ca_rope_formats[fi];
            const bool f32 = ft.k == LM_KV_F32 && ft.v == LM_KV_F32;
            const int Dh = cfgs[ci].Dh;
            ca_rope_case rc;
            LM_REQUIRE(ca_rope_case_make(&rc, &be, cfgs[ci].Hq, cfgs[ci].Hkv, Dh, cfgs[ci].rot, cfgs[ci].inter, 1.0f,
                                         cfgs[ci].split_freq, &ft, S, n, pos0, &seed));
            const size_t nq = (size_t)rc.d.T * rc.qc, nk = (size_t)rc.d.T * rc.kc;
            float *qh = ca_host(nq, &seed, -2, 2), *kh = ca_host(nk, &seed, -2, 2), *vh = ca_host(nk, &seed, -1, 1);
            float *wqh = ca_host((size_t)Dh, &seed, 0.5f, 1.5f), *wkh = ca_host((size_t)Dh, &seed, -0.5f, 0.5f);
            lm_tensor q[2], k[2], v[2], qn[2], kn[2], wq[2], wk[2];
            for (int b = 0; b < 2; b++) {
                lm_backend *x = be.b[b];
                q[b] = ca_tensor(x, rc.d.T, rc.qc, qh), k[b] = ca_tensor(x, rc.d.T, rc.kc, kh);
                v[b] = ca_tensor(x, rc.d.T, rc.kc, vh);
                qn[b] = ca_poisoned(x, rc.d.T, rc.qc), kn[b] = ca_poisoned(x, rc.d.T, rc.kc);
                wq[b] = ca_tensor(x, 1, Dh, wqh), wk[b] = ca_tensor(x, 1, Dh, wkh);
                x->ops->rms_norm(x, &qn[b], &q[b], &wq[b], 1e-6f, cfgs[ci].off);
                x->ops->rms_norm(x, &kn[b], &k[b], &wk[b], 1e-6f, cfgs[ci].off);
                lm_op_rope_kv_write(x, &qn[b], &kn[b], &v[b], &rc.rq, &rc.rk, &rc.pool.kc[b]->pool, CA_LAYER, &rc.ab);
            }
            lm_backend *g = be.b[1];
            lm_kv_pool *gp = &rc.pool.kc[1]->pool;
            float *cq = ca_read(g, qn[1].data, nq), *ck = ca_read(g, kn[1].data, nk), *cK, *cV;
            ca_read_pools(&be, &rc.pool, ft, &cK, &cV);
            g->ops->norm_rope_kv_write(g, &qn[1], &q[1], &kn[1], &k[1], &v[1], &wq[1], &wk[1], 1e-6f, cfgs[ci].off,
                                       &rc.rq, &rc.rk, gp, CA_LAYER, &rc.ab);
            float *fq2 = ca_read(g, qn[1].data, nq), *fk2 = ca_read(g, kn[1].data, nk), *fK, *fV;
            ca_read_pools(&be, &rc.pool, ft, &fK, &fV);
            LM_CHECK(ca_fused_same(cq, fq2, nq, ck, fk2, nk, cK, fK, cV, fV, &rc.pool, ft, ci));
            if (f32) {
                const size_t nf = (size_t)rc.pool.n_blocks * CA_BS * (size_t)rc.kvw;
                void *pq[2] = { qn[0].data, qn[1].data }, *pk[2] = { kn[0].data, kn[1].data };
                void *pK[2] = { rc.pool.kc[0]->pool.k[CA_LAYER], gp->k[CA_LAYER] };
                void *pV[2] = { rc.pool.kc[0]->pool.v[CA_LAYER], gp->v[CA_LAYER] };
                double eq = ca_cmp(&be, pq, nq, 1.0), ek = ca_cmp(&be, pk, nk, 1.0);
                double eK = ca_cmp(&be, pK, nf, 1.0), eV = ca_cmp(&be, pV, nf, 1.0);
                printf("; against the CPU: qn %.2g, kn %.2g, K %.2g, V %.2g", eq, ek, eK, eV);
                LM_CHECK(eq <= 1e-6 && ek <= 1e-6 && eK <= 1e-6 && eV == 0);
            }
            printf("\n");
            free(cq), free(ck), free(cK), free(cV), free(fq2), free(fk2), free(fK), free(fV);
            ca_release(&be, q), ca_release(&be, k), ca_release(&be, v), ca_release(&be, qn), ca_release(&be, kn);
            ca_release(&be, wq), ca_release(&be, wk);
            free(qh), free(kh), free(vh), free(wqh), free(wkh);
            ca_rope_case_free(&rc);
        }
    }
    ca_close(&be);
}

/* ---- Gated DeltaNet ------------------------------------------------------------------ */

/* One state tensor per backend with n_slots slots: the conv window
 * [K-1][C] at offset 0, then the delta state [Hv][Dk][Dv]. */
typedef struct ca_state {
    lm_kv_pool kv[2];
    int64_t floats;
    float *st[2];
} ca_state;

/* gated_delta_gates on the GPU against delta_gates + gated_delta there,
 * bit for bit (output and every state slot), from the pool's current
 * state, which is put back afterwards; gh and bh are the raw gates. */
static void ca_delta_fused_check(lm_test_ctx *lm_t_, lm_backend *bk, ca_state *ps, const lm_tensor *y,
                                 const float *gh, const float *bh, const lm_tensor *al, const lm_tensor *dt,
                                 const lm_attn_batch *ab, const lm_delta_params *dp, int call) {
    LM_REQUIRE(bk->ops->gated_delta_gates != NULL);
    const int T = ab->n_tokens, Hv = dp->n_v_heads;
    const size_t O = (size_t)T * Hv * dp->v_dim, nst = (size_t)ps->kv[1].n_state_slots * (size_t)ps->floats;
    float *st0 = ca_read(bk, ps->st[1], nst);
    lm_tensor g = ca_tensor(bk, T, Hv, gh), beta = ca_tensor(bk, T, Hv, bh), out = ca_poisoned(bk, T, (int64_t)O / T);
    bk->ops->delta_gates(bk, &g, &beta, al, dt);
    bk->ops->gated_delta(bk, &out, y, &g, &beta, &ps->kv[1], ab, dp);
    float *o_composed = ca_read(bk, out.data, O), *st_composed = ca_read(bk, ps->st[1], nst);
    bk->ops->write(bk, ps->st[1], st0, nst * sizeof(float));
    bk->ops->write(bk, g.data, gh, (size_t)T * Hv * sizeof(float));
    bk->ops->write(bk, beta.data, bh, (size_t)T * Hv * sizeof(float));
    bk->ops->gated_delta_gates(bk, &out, y, &g, &beta, al, dt, &ps->kv[1], ab, dp);
    float *o_fused = ca_read(bk, out.data, O), *st_fused = ca_read(bk, ps->st[1], nst);
    LM_CHECK_MSG(memcmp(o_fused, o_composed, O * sizeof(float)) == 0, "call %d: gated_delta_gates output differs", call);
    LM_CHECK_MSG(memcmp(st_fused, st_composed, nst * sizeof(float)) == 0, "call %d: gated_delta_gates state differs",
                 call);
    bk->ops->write(bk, ps->st[1], st0, nst * sizeof(float));
    free(st0), free(o_composed), free(st_composed), free(o_fused), free(st_fused);
    lm_tensor_release(bk, &g), lm_tensor_release(bk, &beta), lm_tensor_release(bk, &out);
}

/* Both ops over one batch, compared; the state is carried in the pool. */
static void ca_delta_call(lm_test_ctx *lm_t_, const ca_be *be, ca_state *ps, int Hk, int Hv, int Dk, int Dv, int K,
                          bool tiled, int S, const int *n, const int *pos0, const int32_t *slot, uint64_t seed,
                          int call) {
    const int64_t C = 2 * (int64_t)Hk * Dk + (int64_t)Hv * Dv, O = (int64_t)Hv * Dv;
    ca_batch d = ca_batch_make(S, n, pos0);
    lm_attn_batch ab = { .n_tokens = d.T, .pos = d.pos, .seq = d.seq, .n_seqs = S, .block_tables = NULL,
                         .state_slot = slot };
    const int T = d.T;
    float *xh = ca_host((size_t)T * C, &seed, -1, 1), *wh = ca_host((size_t)C * K, &seed, -0.6f, 0.6f);
    float *gh = ca_host((size_t)T * Hv, &seed, -2, 2), *bh = ca_host((size_t)T * Hv, &seed, -3, 3);
    float *alh = ca_host((size_t)Hv, &seed, -3, -1), *dth = ca_host((size_t)Hv, &seed, -1, 1);
    float *zh = ca_host((size_t)T * O, &seed, -2, 2), *nwh = ca_host((size_t)Dv, &seed, 0.5f, 1.5f);
    lm_tensor x[2], w[2], y[2], g[2], beta[2], al[2], dt[2], out[2], z[2], nw[2], yn[2];
    lm_state_ref conv_ref = { 0, 0 };
    lm_delta_params dp = { .n_k_heads = Hk, .n_v_heads = Hv, .k_dim = Dk, .v_dim = Dv,
                           .state = { 0, (int64_t)(K - 1) * C }, .v_tiled = tiled };
    for (int b = 0; b < 2; b++) {
        lm_backend *bk = be->b[b];
        x[b] = ca_tensor(bk, T, C, xh);
        w[b] = ca_tensor(bk, C, K, wh);
        y[b] = ca_poisoned(bk, T, C);
        g[b] = ca_tensor(bk, T, Hv, gh);
        beta[b] = ca_tensor(bk, T, Hv, bh);
        al[b] = ca_tensor(bk, 1, Hv, alh);
        dt[b] = ca_tensor(bk, 1, Hv, dth);
        out[b] = ca_poisoned(bk, T, O);
        z[b] = ca_tensor(bk, T, O, zh);
        nw[b] = ca_tensor(bk, 1, Dv, nwh);
        yn[b] = ca_poisoned(bk, T, O);
        bk->ops->conv1d_state(bk, &y[b], &x[b], &w[b], &ps->kv[b], conv_ref, &ab, true);
        bk->ops->delta_gates(bk, &g[b], &beta[b], &al[b], &dt[b]);
    }
    void *p[2];
    p[0] = y[0].data, p[1] = y[1].data;
    double e = ca_cmp(be, p, (size_t)T * C, 1.0);
    LM_CHECK_MSG(e <= 1e-5, "call %d: conv1d_state err %.3g", call, e);
    p[0] = g[0].data, p[1] = g[1].data;
    e = ca_cmp(be, p, (size_t)T * Hv, 1.0);
    LM_CHECK_MSG(e <= 1e-5, "call %d: delta_gates g err %.3g", call, e);
    p[0] = beta[0].data, p[1] = beta[1].data;
    e = ca_cmp(be, p, (size_t)T * Hv, 1.0);
    LM_CHECK_MSG(e <= 1e-5, "call %d: delta_gates beta err %.3g", call, e);
    /* gated_delta on identical inputs: the CPU's conv output and gates */
    float *yref = ca_read(be->b[0], y[0].data, (size_t)T * C);
    float *gref = ca_read(be->b[0], g[0].data, (size_t)T * Hv), *bref = ca_read(be->b[0], beta[0].data, (size_t)T * Hv);
    be->b[1]->ops->write(be->b[1], y[1].data, yref, (size_t)T * C * sizeof(float));
    be->b[1]->ops->write(be->b[1], g[1].data, gref, (size_t)T * Hv * sizeof(float));
    be->b[1]->ops->write(be->b[1], beta[1].data, bref, (size_t)T * Hv * sizeof(float));
    free(yref);
    free(gref);
    free(bref);
    for (int b = 0; b < 2; b++) {
        lm_backend *bk = be->b[b];
        bk->ops->gated_delta(bk, &out[b], &y[b], &g[b], &beta[b], &ps->kv[b], &ab, &dp);
    }
    p[0] = out[0].data, p[1] = out[1].data;
    e = ca_cmp(be, p, (size_t)T * O, 1.0);
    LM_CHECK_MSG(e <= 1e-4, "call %d: gated_delta out err %.3g (Dk %d Dv %d)", call, e, Dk, Dv);
    /* rms_norm_gated over the CPU's delta output */
    float *oref = ca_read(be->b[0], out[0].data, (size_t)T * O);
    be->b[1]->ops->write(be->b[1], out[1].data, oref, (size_t)T * O * sizeof(float));
    free(oref);
    for (int b = 0; b < 2; b++) be->b[b]->ops->rms_norm_gated(be->b[b], &yn[b], &out[b], &z[b], &nw[b], 1e-6f);
    p[0] = yn[0].data, p[1] = yn[1].data;
    e = ca_cmp(be, p, (size_t)T * O, 1.0);
    LM_CHECK_MSG(e <= 1e-5, "call %d: rms_norm_gated err %.3g", call, e);
    /* every slot, used or not: conv windows and delta states */
    p[0] = ps->st[0], p[1] = ps->st[1];
    e = ca_cmp(be, p, (size_t)ps->kv[0].n_state_slots * (size_t)ps->floats, 1.0);
    LM_CHECK_MSG(e <= 1e-4, "call %d: state err %.3g", call, e);
    ca_delta_fused_check(lm_t_, be->b[1], ps, &y[1], gh, bh, &al[1], &dt[1], &ab, &dp, call);

    lm_tensor *all[] = { x, w, y, g, beta, al, dt, out, z, nw, yn };
    for (size_t i = 0; i < LM_COUNT(all); i++) ca_release(be, all[i]);
    float *hs[] = { xh, wh, gh, bh, alh, dth, zh, nwh };
    for (size_t i = 0; i < LM_COUNT(hs); i++) free(hs[i]);
    ca_batch_free(&d);
}

/* Calls 1 and 2 below; with n_slots > 4 a third: every slot's sequence
 * decoding one token (batched decode, some of them fresh). tiled: value
 * heads in GGUF's tiled order (lm_delta_params.v_tiled). */
static void ca_delta_config(lm_test_ctx *lm_t_, const ca_be *be, int Hk, int Hv, int Dk, int Dv, int K, bool tiled,
                            int n_slots, uint64_t seed) {
    const int64_t C = 2 * (int64_t)Hk * Dk + (int64_t)Hv * Dv;
    ca_state ps;
    memset(&ps, 0, sizeof ps);
    ps.floats = (int64_t)(K - 1) * C + (int64_t)Hv * Dk * Dv;
    size_t nf = (size_t)n_slots * (size_t)ps.floats;
    float *garbage = ca_host(nf, &seed, -1, 1);
    for (int b = 0; b < 2; b++) {
        ps.st[b] = be->b[b]->ops->alloc(be->b[b], nf * sizeof(float));
        LM_ASSERT(ps.st[b]);
        be->b[b]->ops->write(be->b[b], ps.st[b], garbage, nf * sizeof(float));
        ps.kv[b] = (lm_kv_pool){ .n_state = 1, .n_state_slots = n_slots, .state_floats = &ps.floats,
                                 .state = &ps.st[b] };
    }
    free(garbage);
    /* call 1: a fresh sequence in a garbage slot, one continuing a saved
     * state, one decoding; slot 1 unused throughout */
    const int32_t slot1[] = { 2, 0, 3 };
    const int n1[] = { 5, 7, 1 }, p1[] = { 0, 10, 3 };
    ca_delta_call(lm_t_, be, &ps, Hk, Hv, Dk, Dv, K, tiled, 3, n1, p1, slot1, seed + 1, 1);
    /* call 2: the first decodes, the second runs 70 tokens (past the CPU's
     * 64-token chunk), the third starts over at 0 */
    const int n2[] = { 1, 70, 3 }, p2[] = { 5, 17, 0 };
    ca_delta_call(lm_t_, be, &ps, Hk, Hv, Dk, Dv, K, tiled, 3, n2, p2, slot1, seed + 2, 2);
    if (n_slots > 4) {
        int32_t *slot3 = malloc((size_t)n_slots * sizeof *slot3);
        int *n3 = malloc((size_t)n_slots * sizeof *n3), *p3 = malloc((size_t)n_slots * sizeof *p3);
        for (int i = 0; i < n_slots; i++) slot3[i] = n_slots - 1 - i, n3[i] = 1, p3[i] = i % 5 ? 20 + i : 0;
        ca_delta_call(lm_t_, be, &ps, Hk, Hv, Dk, Dv, K, tiled, n_slots, n3, p3, slot3, seed + 3, 3);
        free(slot3), free(n3), free(p3);
    }
    for (int b = 0; b < 2; b++) be->b[b]->ops->free(be->b[b], ps.st[b]);
}

LM_TEST(cuda_gated_delta_ops) {
    CA_OPEN(be);
    ca_delta_config(lm_t_, &be, 2, 4, 128, 128, 4, false, 4, 7); /* Qwen3.5 head shape */
    ca_delta_config(lm_t_, &be, 2, 4, 128, 128, 4, true, 4, 8);  /* the same, value heads tiled (GGUF) */
    ca_delta_config(lm_t_, &be, 1, 3, 48, 40, 3, false, 4, 11);  /* odd widths: a partial warp */
    /* Qwen3.5-27B's 48 value heads for 12 sequences: 576 blocks, the
     * many-blocks form of the delta-rule kernel on an H200 (>= 4 a
     * multiprocessor) */
    ca_delta_config(lm_t_, &be, 16, 48, 128, 128, 4, false, 12, 13);
    ca_close(&be);
}

/* ---- moe ----------------------------------------------------------------------------- */

enum { CA_E = 8, CA_K = 2, CA_D = 64, CA_F = 96 };

/* One expert matrix [rows][cols] of random values in f32 or bf16, uploaded
 * to both backends as w[0] (CPU) and w[1] (GPU); returns its host data
 * (the CPU uses it in place: free it after both backends are done). */
static void *ca_expert(const ca_be *be, lm_tensor *w0, lm_tensor *w1, int64_t rows, int64_t cols, bool bf,
                       uint64_t *seed, bool *ok) {
    float *h = ca_host((size_t)(rows * cols), seed, -0.3f, 0.3f);
    void *data = h;
    if (bf) {
        uint16_t *hb = malloc((size_t)(rows * cols) * sizeof *hb);
        for (int64_t i = 0; i < rows * cols; i++) hb[i] = lm_f32_to_bf16(h[i]);
        free(h);
        data = hb;
    }
    lm_tensor *w[2] = { w0, w1 };
    for (int b = 0; b < 2; b++) {
        lm_err err;
        *w[b] = (lm_tensor){ .type = bf ? LM_BF16 : LM_F32, .rows = rows, .cols = cols, .data = NULL };
        if (be->b[b]->ops->upload_weight(be->b[b], w[b], data, &err) != 0) {
            fprintf(stderr, "  upload: %s\n", err.msg);
            *ok = false;
        }
    }
    return data;
}

static void ca_moe_case(lm_test_ctx *lm_t_, const ca_be *be, lm_tensor ws[2][3][CA_E], int T, bool norm,
                        bool scaled, uint64_t seed) {
    float *xh = ca_host((size_t)T * CA_D, &seed, -1, 1), *lh = ca_host((size_t)T * CA_E, &seed, -2, 2);
    float *sh = ca_host(CA_E, &seed, 0.5f, 1.5f);
    if (T > 3) { /* exact ties: lowest index first */
        lh[3 * CA_E + 2] = lh[3 * CA_E + 5] = 3.0f;
        for (int e = 0; e < CA_E; e++) lh[1 * CA_E + e] = 0.25f;
    }
    lm_tensor x[2], l[2], y[2], sc[2];
    for (int b = 0; b < 2; b++) {
        x[b] = ca_tensor(be->b[b], T, CA_D, xh);
        l[b] = ca_tensor(be->b[b], T, CA_E, lh);
        sc[b] = ca_tensor(be->b[b], 1, CA_E, sh);
        y[b] = ca_poisoned(be->b[b], T, CA_D);
        lm_moe_params mp = { .n_experts = CA_E, .top_k = CA_K, .norm_topk = norm, .gate = ws[b][0],
                             .up = ws[b][1], .down = ws[b][2], .expert_scale = scaled ? &sc[b] : NULL };
        be->b[b]->ops->moe(be->b[b], &y[b], &x[b], &l[b], &mp);
    }
    void *p[2] = { y[0].data, y[1].data };
    double e = ca_cmp(be, p, (size_t)T * CA_D, 1.0);
    LM_CHECK_MSG(e <= 1e-4, "moe T %d norm %d scale %d: err %.3g", T, norm, scaled, e);
    ca_release(be, x);
    ca_release(be, l);
    ca_release(be, y);
    ca_release(be, sc);
    free(xh);
    free(lh);
    free(sh);
}

/* The GPU's moe on T tokens' rows, for the bitwise check of its paths
 * (pairs for up to 8 tokens, grouped on the device up to 128, on the host
 * above). */
static float *ca_moe_gpu(const ca_be *be, lm_tensor ws[2][3][CA_E], const float *xh, const float *lh, int T) {
    lm_backend *g = be->b[1];
    lm_tensor x = ca_tensor(g, T, CA_D, xh), l = ca_tensor(g, T, CA_E, lh), y = ca_poisoned(g, T, CA_D);
    lm_moe_params mp = { .n_experts = CA_E, .top_k = CA_K, .norm_topk = true, .gate = ws[1][0], .up = ws[1][1],
                         .down = ws[1][2], .expert_scale = NULL };
    g->ops->moe(g, &y, &x, &l, &mp);
    float *r = ca_read(g, y.data, (size_t)T * CA_D);
    lm_tensor_release(g, &x), lm_tensor_release(g, &l), lm_tensor_release(g, &y);
    return r;
}

/* Experts in f32 (the host-grouped path only) and in bf16 (up to 8 tokens
 * take a GEMV a pair, up to 128 the grouping on the device, more the host's:
 * decode batches with no host round trip), against the CPU; in bf16 also 4
 * tokens alone against the same 4 inside 7 (pairs), 13, 40 and 100
 * (grouped on the device; at 40 an expert has about 10 tokens, two chunks):
 * bitwise equal. */
LM_TEST(cuda_moe) {
    CA_OPEN(be);
    for (int bf = 0; bf < 2; bf++) {
        uint64_t seed = 5;
        /* [backend][gate, up, down][expert]; the host data outlives both backends */
        static lm_tensor ws[2][3][CA_E];
        void *host[3][CA_E];
        bool ok = true;
        for (int m = 0; m < 3; m++)
            for (int e = 0; e < CA_E; e++)
                host[m][e] = ca_expert(&be, &ws[0][m][e], &ws[1][m][e], m == 2 ? CA_D : CA_F, m == 2 ? CA_F : CA_D,
                                       bf, &seed, &ok);
        LM_CHECK(ok);
        if (ok) {
            ca_moe_case(lm_t_, &be, ws, 13, false, true, 21);
            ca_moe_case(lm_t_, &be, ws, 13, true, true, 22);
            ca_moe_case(lm_t_, &be, ws, 13, true, false, 23);
            ca_moe_case(lm_t_, &be, ws, 1, true, true, 24);   /* decode */
            ca_moe_case(lm_t_, &be, ws, 4, false, true, 26);  /* a few tokens */
            ca_moe_case(lm_t_, &be, ws, 40, true, true, 27);  /* a decode batch: several chunks an expert */
            ca_moe_case(lm_t_, &be, ws, 200, false, false, 25); /* prefill: GEMM-sized expert batches */
        }
        if (ok && bf) {
            uint64_t s2 = 77;
            float *xh = ca_host(100 * CA_D, &s2, -1, 1), *lh = ca_host(100 * CA_E, &s2, -2, 2);
            float *a = ca_moe_gpu(&be, ws, xh, lh, 4);
            static const int Ts[] = { 7, 13, 40, 100 };
            for (size_t c = 0; c < sizeof Ts / sizeof Ts[0]; c++) {
                const int T = Ts[c];
                float *b = ca_moe_gpu(&be, ws, xh, lh, T);
                const bool same = !memcmp(a, b, 4 * CA_D * sizeof(float));
                printf("  bf16 experts: 4 tokens (a GEMV a pair) vs the same 4 of %d: %s\n", T,
                       same ? "bitwise equal" : "DIFFERENT");
                LM_CHECK(same);
                free(b);
            }
            free(xh), free(lh), free(a);
        }
        for (int m = 0; m < 3; m++) /* the GPU's copies (the CPU uses the host data in place) */
            for (int e = 0; e < CA_E; e++) be.b[1]->ops->free(be.b[1], ws[1][m][e].data);
        for (int m = 0; m < 3; m++)
            for (int e = 0; e < CA_E; e++) free(host[m][e]);
    }
    ca_close(&be);
}

/* The device grouping with more experts than a warp (its scans cross
 * warps) and up to its 128-token limit: 72 bf16 experts, 4 a token, against
 * the CPU at 33 and 128 tokens (and 129, grouped on the host), and 4 tokens
 * alone bitwise equal to the same 4 inside 33 and 128. */
LM_TEST(cuda_moe_device_grouping_many_experts) {
    CA_OPEN(be);
    enum { E = 72, K = 4, D = 64, F = 32 };
    uint64_t seed = 9;
    lm_tensor *ws[2][3];
    void *host[3][E];
    bool ok = true;
    for (int b = 0; b < 2; b++)
        for (int m = 0; m < 3; m++) ws[b][m] = calloc(E, sizeof(lm_tensor));
    for (int m = 0; m < 3; m++)
        for (int e = 0; e < E; e++)
            host[m][e] = ca_expert(&be, &ws[0][m][e], &ws[1][m][e], m == 2 ? D : F, m == 2 ? F : D, true, &seed, &ok);
    LM_CHECK(ok);
    float *xh = ca_host(129 * D, &seed, -1, 1), *lh = ca_host(129 * E, &seed, -2, 2);
    float *four = NULL;
    static const int Ts[] = { 4, 33, 128, 129 };
    for (size_t c = 0; ok && c < sizeof Ts / sizeof Ts[0]; c++) {
        const int T = Ts[c];
        lm_tensor x[2], l[2], y[2];
        for (int b = 0; b < 2; b++) {
            x[b] = ca_tensor(be.b[b], T, D, xh);
            l[b] = ca_tensor(be.b[b], T, E, lh);
            y[b] = ca_poisoned(be.b[b], T, D);
            lm_moe_params mp = { .n_experts = E, .top_k = K, .norm_topk = true, .gate = ws[b][0], .up = ws[b][1],
                                 .down = ws[b][2], .expert_scale = NULL };
            be.b[b]->ops->moe(be.b[b], &y[b], &x[b], &l[b], &mp);
        }
        void *p[2] = { y[0].data, y[1].data };
        const double err = ca_cmp(&be, p, (size_t)T * D, 1.0);
        LM_CHECK_MSG(err <= 1e-4, "moe %d experts, T %d: err %.3g", E, T, err);
        float *got = ca_read(be.b[1], y[1].data, (size_t)T * D);
        if (T == 4) {
            four = got;
        } else {
            if (T <= 128) {
                const bool same = !memcmp(four, got, 4 * D * sizeof(float));
                printf("  %d experts: 4 tokens a GEMV a pair vs the same 4 of %d grouped on the device: %s\n", E, T,
                       same ? "bitwise equal" : "DIFFERENT");
                LM_CHECK(same);
            }
            free(got);
        }
        ca_release(&be, x);
        ca_release(&be, l);
        ca_release(&be, y);
    }
    free(four), free(xh), free(lh);
    for (int m = 0; m < 3; m++)
        for (int e = 0; e < E; e++) {
            be.b[1]->ops->free(be.b[1], ws[1][m][e].data);
            free(host[m][e]);
        }
    for (int b = 0; b < 2; b++)
        for (int m = 0; m < 3; m++) free(ws[b][m]);
    ca_close(&be);
}

/* The routing kernel against lm_moe_route, bitwise: the picks (each
 * token's k in ascending expert order on the GPU) and their weights, for
 * expert counts around the warp size and up to 1,024 (the ranks), past it
 * (one warp's passes), k from 1 to 64, normalised or not, with a scale,
 * with exact ties, infinities and NaN logits (the passes' fallback). */
LM_TEST(cuda_moe_route_bits) {
    char why[256];
    if (!lm_cuda_available(why, sizeof why)) LM_SKIP("%s", why);
    lm_err e;
    lm_backend *g = lm_cuda_backend_create(0, &e);
    LM_CHECK_MSG(g != NULL, "%s", e.msg);
    if (!g) return;
    static const int cases[][2] = { { 1, 1 },    { 3, 2 },    { 8, 2 },    { 31, 4 },   { 32, 8 },
                                    { 33, 8 },   { 60, 4 },   { 64, 64 },  { 128, 8 },  { 128, 40 },
                                    { 256, 8 },  { 512, 10 }, { 1024, 8 }, { 1100, 8 }, { 2048, 16 } };
    enum { T = 12 };
    uint64_t seed = 31;
    int n_diff = 0, n_cases = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int E = cases[c][0], k = cases[c][1];
        float *l = ca_host((size_t)T * E, &seed, -3, 3), *sc = ca_host((size_t)E, &seed, 0.5f, 1.5f);
        /* token 1: coarse values (many exact ties); 2: every logit equal;
         * 3: +inf and -inf; 4: a NaN at expert 0; 5: a NaN elsewhere */
        for (int i = 0; i < E; i++) l[1 * E + i] = (float)((i * 7) % 5), l[2 * E + i] = 0.5f;
        l[3 * E + E / 2] = INFINITY, l[3 * E + E - 1] = -INFINITY;
        l[4 * E] = NAN;
        l[5 * E + E - 1] = NAN;
        for (int v = 0; v < 4; v++) {
            const bool norm = v & 1, scaled = v & 2;
            int32_t *sg = malloc((size_t)T * k * sizeof *sg), *sh = malloc((size_t)k * sizeof *sh);
            float *wg = malloc((size_t)T * k * sizeof *wg), *wh = malloc((size_t)k * sizeof *wh);
            LM_CHECK(lm_cuda_moe_route(g, l, scaled ? sc : NULL, T, E, k, norm, sg, wg));
            for (int t = 0; t < T; t++) {
                lm_moe_route(l + (size_t)t * E, scaled ? sc : NULL, E, k, norm, sh, wh);
                bool same = true;
                for (int j = 0; j < k; j++) { /* the host's pick j sits at its rank by expert id */
                    int pos = 0;
                    for (int i = 0; i < k; i++) pos += sh[i] < sh[j];
                    same &= sg[t * k + pos] == sh[j] && !memcmp(&wg[t * k + pos], &wh[j], sizeof(float));
                }
                if (!same && n_diff++ < 5)
                    printf("  E %d k %d norm %d scale %d token %d: the GPU's routing differs\n", E, k, norm, scaled, t);
                n_cases++;
            }
            free(sg), free(sh), free(wg), free(wh);
        }
        free(l), free(sc);
    }
    printf("  %d routings, %d differ from lm_moe_route\n", n_cases, n_diff);
    LM_CHECK(n_diff == 0);
    lm_backend_destroy(g);
}

/* moe_add (the combine adds into the residual and its last blocks norm the
 * new rows) against moe, add and rms_norm on the GPU, bitwise, on every
 * path (pairs at 1 and 4 tokens, the device grouping at 40, the host's at
 * 200) and for both norm kernels (64 wide: a warp a row; 1,280: a block);
 * and against the CPU, which composes the same ops. */
LM_TEST(cuda_moe_add) {
    CA_OPEN(be);
    enum { E = 8, K = 2, F = 32 };
    static const int Ds[] = { 64, 1280 }, Ts[] = { 1, 4, 40, 200 };
    for (size_t di = 0; di < 2; di++) {
        const int D = Ds[di];
        uint64_t seed = 41 + di;
        lm_tensor ws[2][3][E];
        void *host[3][E];
        bool ok = true;
        for (int m = 0; m < 3; m++)
            for (int x = 0; x < E; x++)
                host[m][x] = ca_expert(&be, &ws[0][m][x], &ws[1][m][x], m == 2 ? D : F, m == 2 ? F : D, true, &seed,
                                       &ok);
        LM_CHECK(ok);
        float *nw = ca_host((size_t)D, &seed, 0.5f, 1.5f);
        for (size_t ti = 0; ok && ti < sizeof Ts / sizeof Ts[0]; ti++) {
            const int T = Ts[ti];
            float *xh = ca_host((size_t)T * D, &seed, -1, 1), *rh = ca_host((size_t)T * D, &seed, -1, 1);
            float *lh = ca_host((size_t)T * E, &seed, -2, 2);
            lm_tensor x[2], l[2], r[2], o[2], n[2], w[2], r2, n2;
            for (int b = 0; b < 2; b++) {
                x[b] = ca_tensor(be.b[b], T, D, xh), l[b] = ca_tensor(be.b[b], T, E, lh);
                r[b] = ca_tensor(be.b[b], T, D, rh), w[b] = ca_tensor(be.b[b], 1, D, nw);
                o[b] = ca_poisoned(be.b[b], T, D), n[b] = ca_poisoned(be.b[b], T, D);
                lm_moe_params mp = { .n_experts = E, .top_k = K, .norm_topk = true, .gate = ws[b][0], .up = ws[b][1],
                                     .down = ws[b][2], .expert_scale = NULL };
                const lm_norm_out no = { &n[b], &w[b], 1e-6f, 0.0f };
                lm_op_moe_add(be.b[b], &r[b], &x[b], &l[b], &mp, &o[b], &no);
            }
            /* the GPU's unfused ops on the same inputs */
            lm_backend *g = be.b[1];
            r2 = ca_tensor(g, T, D, rh), n2 = ca_poisoned(g, T, D);
            lm_moe_params mp = { .n_experts = E, .top_k = K, .norm_topk = true, .gate = ws[1][0], .up = ws[1][1],
                                 .down = ws[1][2], .expert_scale = NULL };
            g->ops->moe(g, &o[1], &x[1], &l[1], &mp);
            g->ops->add(g, &r2, &o[1]);
            g->ops->rms_norm(g, &n2, &r2, &w[1], 1e-6f, 0.0f);
            float *fr = ca_read(g, r[1].data, (size_t)T * D), *fn = ca_read(g, n[1].data, (size_t)T * D);
            float *ur = ca_read(g, r2.data, (size_t)T * D), *un = ca_read(g, n2.data, (size_t)T * D);
            const bool same = !memcmp(fr, ur, (size_t)T * D * sizeof(float)) &&
                              !memcmp(fn, un, (size_t)T * D * sizeof(float));
            printf("  D %d, %d tokens: moe_add vs moe + add + rms_norm: %s\n", D, T, same ? "bitwise equal" : "DIFFERENT");
            LM_CHECK(same);
            void *pr[2] = { r[0].data, r[1].data }, *pn[2] = { n[0].data, n[1].data };
            const double er = ca_cmp(&be, pr, (size_t)T * D, 1.0), en = ca_cmp(&be, pn, (size_t)T * D, 1.0);
            LM_CHECK_MSG(er <= 1e-4 && en <= 1e-4, "moe_add D %d T %d against the CPU: residual %.3g, norm %.3g", D,
                         T, er, en);
            free(fr), free(fn), free(ur), free(un), free(xh), free(rh), free(lh);
            ca_release(&be, x), ca_release(&be, l), ca_release(&be, r), ca_release(&be, o), ca_release(&be, n);
            ca_release(&be, w);
            lm_tensor_release(g, &r2), lm_tensor_release(g, &n2);
        }
        free(nw);
        for (int m = 0; m < 3; m++)
            for (int x = 0; x < E; x++) {
                be.b[1]->ops->free(be.b[1], ws[1][m][x].data);
                free(host[m][x]);
            }
    }
    ca_close(&be);
}
