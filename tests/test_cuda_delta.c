/* test_cuda_delta.c - the CUDA backend's chunked Gated DeltaNet forward and
 * the token-parallel causal convolution against the CPU backend.
 *
 * Three backends see the same inputs: the CPU (the reference, which runs
 * several tokens of a sequence in its own chunked form and one token in the
 * recurrent form), the GPU as configured by default (sequences of at least
 * 32 tokens in the chunked kernel, shorter ones in the recurrent kernel, both
 * in one batch), and the GPU with LUMEN_CUDA_DELTA_CHUNK_MIN=1 (every
 * sequence in the chunked kernel, a decoding token too). Every case
 * compares the outputs and every state slot (used or not) after the call.
 *
 * Cases: one sequence of 1, 15, 16, 17, 63, 64, 65, 200 and 1000 tokens,
 * fresh (position 0 in a slot full of garbage) and continuing a saved state;
 * five sequences of mixed lengths interleaved in one batch, a decoding token
 * among them, over two calls so that states pass between the forms; strong
 * (g in [-20, -5]: whole chunks decay to zero) and weak (g in [-0.01, 0])
 * decay; heads of the fixtures (16, 64), odd widths (48 x 40), Qwen3.5's
 * 128 (the 27B head counts too) and 256. The convolution runs sequences
 * longer than its 64-token blocks next to short and decoding ones.
 *
 * Tolerances (|gpu - cpu| / max(|cpu|, 1)): gated_delta outputs and states
 * 1e-4 (f32 sums in other orders on both sides; observed errors are
 * printed per case), conv1d_state 1e-5. The fused-gates form is checked bit
 * for bit against delta_gates + gated_delta on the chunked path.
 * Without a usable GPU every test skips with the reason, except
 * cuda_delta_chunked_kernel_on_the_cpu: the kernel compiled as host C++
 * (tests/host/cuda_delta_check.cpp). */
#include "lm_test.h"

#include "backend/lm_backend.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

/* ---- the kernel on the CPU ----------------------------------------------------- */

/* The chunked kernel compiled for the CPU (tests/host/cuda_delta_check.cpp)
 * against the double recurrence: runs without a GPU. */
LM_TEST(cuda_delta_chunked_kernel_on_the_cpu) {
#ifdef LUMEN_DELTA_CHECK_BIN
    /* a run on the GPU machine carries lumen_tests alone (tools/device/pack.sh):
     * the check ran where the binary was built */
    if (getenv("LUMEN_FIXTURES_PARTIAL") && access(LUMEN_DELTA_CHECK_BIN, X_OK) != 0)
        LM_SKIP("cuda_delta_check is not carried to this machine (LUMEN_FIXTURES_PARTIAL); it runs on the build machine");
    char *out = NULL, *err = NULL;
    const int rc = lm_tu_run("'" LUMEN_DELTA_CHECK_BIN "'", &out, &err);
    printf("%s", out ? out : "");
    LM_CHECK_MSG(rc == 0, "cuda_delta_check exit %d: %s%s", rc, out ? out : "", err ? err : "");
    LM_CHECK(out && strstr(out, "chunked delta kernel: all within 2e-5") != NULL);
    free(out), free(err);
#else
    LM_SKIP("built without a C++ compiler: cuda_delta_check not built");
#endif
}

/* ---- helpers ------------------------------------------------------------------ */

enum { CD_NB = 3 }; /* [0] CPU, [1] GPU default, [2] GPU all chunked */

typedef struct cd_be {
    lm_backend *b[CD_NB];
} cd_be;

static float cd_rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x800000 - 1.0f; /* [-1, 1) */
}

static float *cd_host(size_t n, uint64_t *s, float lo, float hi) {
    float *p = malloc(LM_MAX(n, (size_t)1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = lo + (hi - lo) * 0.5f * (cd_rnd(s) + 1.0f);
    return p;
}

static lm_backend *cd_gpu_with(const char *var, const char *value, lm_err *e) {
    const char *old = getenv(var);
    char *saved = old ? strdup(old) : NULL;
    if (value) setenv(var, value, 1);
    else unsetenv(var);
    lm_backend *g = lm_cuda_backend_create(0, e);
    if (saved) setenv(var, saved, 1);
    else unsetenv(var);
    free(saved);
    return g;
}

static bool cd_open(cd_be *be, char *why, size_t n) {
    lm_err e;
    memset(be, 0, sizeof *be);
    be->b[0] = lm_cpu_backend_create(0, LM_ISA_AUTO, &e);
    if (be->b[0]) be->b[1] = cd_gpu_with("LUMEN_CUDA_DELTA_CHUNK_MIN", NULL, &e);
    if (be->b[1]) be->b[2] = cd_gpu_with("LUMEN_CUDA_DELTA_CHUNK_MIN", "1", &e);
    if (!be->b[0] || !be->b[1] || !be->b[2]) {
        snprintf(why, n, "%.200s", e.msg);
        for (int i = CD_NB - 1; i >= 0; i--)
            if (be->b[i]) lm_backend_destroy(be->b[i]);
        return false;
    }
    return true;
}

#define CD_OPEN(be)                                                  \
    char why_[256];                                                  \
    if (!lm_cuda_available(why_, sizeof why_)) LM_SKIP("%s", why_);  \
    cd_be be;                                                        \
    if (!cd_open(&be, why_, sizeof why_)) {                          \
        LM_CHECK_MSG(0, "%s", why_);                                 \
        return;                                                      \
    }

static void cd_close(cd_be *be) {
    for (int i = CD_NB - 1; i >= 0; i--) lm_backend_destroy(be->b[i]);
}

static lm_tensor cd_tensor(lm_backend *be, int64_t rows, int64_t cols, const float *host) {
    lm_tensor t;
    LM_ASSERT(lm_tensor_alloc(be, &t, rows, cols) == 0);
    if (host) be->ops->write(be, t.data, host, (size_t)(rows * cols) * sizeof(float));
    return t;
}

static lm_tensor cd_poisoned(lm_backend *be, int64_t rows, int64_t cols) {
    size_t n = (size_t)(rows * cols);
    float *nan = malloc(LM_MAX(n, (size_t)1) * sizeof(float));
    for (size_t i = 0; i < n; i++) nan[i] = NAN;
    lm_tensor t = cd_tensor(be, rows, cols, nan);
    free(nan);
    return t;
}

static float *cd_read(lm_backend *be, const void *src, size_t n) {
    float *p = malloc(LM_MAX(n, (size_t)1) * sizeof(float));
    be->ops->read(be, p, src, n * sizeof(float));
    return p;
}

/* Tokens of S sequences dealt round-robin: sequence s has n[s] tokens from
 * position pos0[s]. */
typedef struct cd_batch {
    int T;
    int32_t *pos, *seq;
} cd_batch;

static cd_batch cd_batch_make(int S, const int *n, const int *pos0) {
    cd_batch d = { 0, NULL, NULL };
    for (int s = 0; s < S; s++) d.T += n[s];
    d.pos = malloc((size_t)LM_MAX(d.T, 1) * sizeof(int32_t));
    d.seq = malloc((size_t)LM_MAX(d.T, 1) * sizeof(int32_t));
    lm_tu_round_robin(S, n, pos0, d.pos, d.seq);
    return d;
}

static void cd_batch_free(cd_batch *d) {
    free(d->pos);
    free(d->seq);
}

/* One state tensor per backend, n_slots slots of `floats`, the same random
 * contents everywhere (garbage to a sequence that starts at position 0). */
typedef struct cd_state {
    lm_kv_pool kv[CD_NB];
    int64_t floats;
    float *st[CD_NB];
    int n_slots;
} cd_state;

static void cd_state_make(cd_state *ps, const cd_be *be, int n_slots, int64_t floats, uint64_t *seed) {
    memset(ps, 0, sizeof *ps);
    ps->floats = floats;
    ps->n_slots = n_slots;
    const size_t nf = (size_t)n_slots * (size_t)floats;
    float *h = cd_host(nf, seed, -1, 1);
    for (int b = 0; b < CD_NB; b++) {
        ps->st[b] = be->b[b]->ops->alloc(be->b[b], nf * sizeof(float));
        LM_ASSERT(ps->st[b]);
        be->b[b]->ops->write(be->b[b], ps->st[b], h, nf * sizeof(float));
        ps->kv[b] = (lm_kv_pool){ .n_state = 1, .n_state_slots = n_slots, .state_floats = &ps->floats,
                                  .state = &ps->st[b] };
    }
    free(h);
}

static void cd_state_free(cd_state *ps, const cd_be *be) {
    for (int b = 0; b < CD_NB; b++) be->b[b]->ops->free(be->b[b], ps->st[b]);
}

/* ---- gated_delta ------------------------------------------------------------------ */

typedef struct cd_shape {
    int Hk, Hv, Dk, Dv;
    bool tiled;
} cd_shape;

/* gated_delta over one batch on every backend from the pool's current
 * state (which is carried: the pool holds each backend's state after the
 * call); g in [glo, ghi]. Checks outputs and every slot; errors in *eo, *es
 * (the larger of the two GPU backends). skip_default: the default GPU
 * backend cannot run the shape (the recurrent kernel takes Dv ceil(Dk / 32)
 * <= 512) and is left out. */
static void cd_delta_call(lm_test_ctx *lm_t_, const cd_be *be, cd_state *ps, cd_shape sh, int S, const int *n,
                          const int *pos0, const int32_t *slot, float glo, float ghi, uint64_t seed,
                          bool skip_default, const char *what) {
    const int Hk = sh.Hk, Hv = sh.Hv, Dk = sh.Dk, Dv = sh.Dv;
    const int64_t C = 2 * (int64_t)Hk * Dk + (int64_t)Hv * Dv, O = (int64_t)Hv * Dv;
    cd_batch d = cd_batch_make(S, n, pos0);
    lm_attn_batch ab = { .n_tokens = d.T, .pos = d.pos, .seq = d.seq, .n_seqs = S, .block_tables = NULL,
                         .state_slot = slot };
    const int T = d.T;
    float *xh = cd_host((size_t)T * C, &seed, -1, 1);
    float *gh = cd_host((size_t)T * Hv, &seed, glo, ghi), *bh = cd_host((size_t)T * Hv, &seed, 0.05f, 1.0f);
    lm_delta_params dp = { .n_k_heads = Hk, .n_v_heads = Hv, .k_dim = Dk, .v_dim = Dv, .state = { 0, 0 },
                           .v_tiled = sh.tiled };
    float *o[CD_NB], *st[CD_NB];
    const size_t nst = (size_t)ps->n_slots * (size_t)ps->floats;
    for (int b = 0; b < CD_NB; b++) {
        o[b] = st[b] = NULL;
        if (b == 1 && skip_default) continue;
        lm_backend *bk = be->b[b];
        lm_tensor x = cd_tensor(bk, T, C, xh), g = cd_tensor(bk, T, Hv, gh), beta = cd_tensor(bk, T, Hv, bh);
        lm_tensor out = cd_poisoned(bk, T, O);
        bk->ops->gated_delta(bk, &out, &x, &g, &beta, &ps->kv[b], &ab, &dp);
        o[b] = cd_read(bk, out.data, (size_t)T * O);
        st[b] = cd_read(bk, ps->st[b], nst);
        lm_tensor_release(bk, &x), lm_tensor_release(bk, &g), lm_tensor_release(bk, &beta);
        lm_tensor_release(bk, &out);
    }
    for (int b = 1; b < CD_NB; b++) {
        if (!o[b]) continue;
        const double eo = lm_tu_rel_err(o[b], o[0], (size_t)T * O, 1.0), es = lm_tu_rel_err(st[b], st[0], nst, 1.0);
        printf("  %s, %s GPU: out %.2g, state %.2g\n", what, b == 1 ? "default" : "all-chunked", eo, es);
        LM_CHECK_MSG(eo <= 1e-4 && es <= 1e-4, "%s (%s GPU): out err %.3g, state err %.3g", what,
                     b == 1 ? "default" : "all-chunked", eo, es);
    }
    for (int b = 0; b < CD_NB; b++) free(o[b]), free(st[b]);
    free(xh), free(gh), free(bh);
    cd_batch_free(&d);
}

static const cd_shape cd_shapes[] = {
    { 2, 4, 128, 128, false }, /* Qwen3.5's head width */
    { 2, 4, 16, 16, true },    /* the qwen3.5 / qwen3-next fixtures */
    { 2, 4, 64, 64, true },    /* the qwen3.5-g256 GGUF fixture */
    { 1, 3, 48, 40, false },   /* odd widths */
};

/* One sequence of each length, fresh and continuing a saved state. */
LM_TEST(cuda_delta_chunked_lengths) {
    CD_OPEN(be);
    static const int lens[] = { 1, 15, 16, 17, 63, 64, 65, 200, 1000 };
    uint64_t seed = 3401;
    for (size_t si = 0; si < LM_COUNT(cd_shapes); si++) {
        const cd_shape sh = cd_shapes[si];
        cd_state ps;
        cd_state_make(&ps, &be, 2, (int64_t)sh.Hv * sh.Dk * sh.Dv, &seed);
        for (size_t li = 0; li < LM_COUNT(lens); li++)
            for (int cont = 0; cont < 2; cont++) {
                const int n[] = { lens[li] }, pos0[] = { cont ? 50 : 0 };
                const int32_t slot[] = { 1 };
                char what[128];
                snprintf(what, sizeof what, "Dk %d Dv %d, %d tokens from %d", sh.Dk, sh.Dv, n[0], pos0[0]);
                cd_delta_call(lm_t_, &be, &ps, sh, 1, n, pos0, slot, -1.0f, 0.0f, seed++, false, what);
            }
        cd_state_free(&ps, &be);
    }
    cd_close(&be);
}

/* Five sequences in one batch (interleaved, slots out of order, slot 4
 * unused), then each continued in a second batch with other lengths, so
 * that states pass chunked -> recurrent -> chunked. */
static void cd_mixed(lm_test_ctx *lm_t_, const cd_be *be, cd_shape sh, const int *n1, const int *n2, float glo,
                     float ghi, uint64_t seed) {
    cd_state ps;
    cd_state_make(&ps, be, 6, (int64_t)sh.Hv * sh.Dk * sh.Dv, &seed);
    const int32_t slot[] = { 3, 0, 5, 1, 2 };
    const int p1[] = { 37, 0, 100, 5, 3 };
    int p2[5];
    for (int s = 0; s < 5; s++) p2[s] = p1[s] + n1[s];
    char what[160];
    snprintf(what, sizeof what, "Hv %d Dk %d Dv %d, g in [%g, %g], call 1 (%d %d %d %d %d tokens)", sh.Hv, sh.Dk,
             sh.Dv, glo, ghi, n1[0], n1[1], n1[2], n1[3], n1[4]);
    cd_delta_call(lm_t_, be, &ps, sh, 5, n1, p1, slot, glo, ghi, seed + 1, false, what);
    snprintf(what, sizeof what, "Hv %d Dk %d Dv %d, g in [%g, %g], call 2 (%d %d %d %d %d tokens)", sh.Hv, sh.Dk,
             sh.Dv, glo, ghi, n2[0], n2[1], n2[2], n2[3], n2[4]);
    cd_delta_call(lm_t_, be, &ps, sh, 5, n2, p2, slot, glo, ghi, seed + 2, false, what);
    cd_state_free(&ps, be);
}

LM_TEST(cuda_delta_chunked_mixed) {
    CD_OPEN(be);
    const int n1[] = { 1, 200, 65, 15, 1000 }, n2[] = { 64, 1, 17, 200, 2 };
    for (size_t si = 0; si < LM_COUNT(cd_shapes); si++) cd_mixed(lm_t_, &be, cd_shapes[si], n1, n2, -2.0f, 0.0f, 77);
    /* Qwen3.5-27B's head counts (16 key, 48 value heads), tiled */
    const cd_shape q27 = { 16, 48, 128, 128, true };
    const int m1[] = { 1, 100, 65, 15, 300 }, m2[] = { 70, 1, 17, 3, 1 };
    cd_mixed(lm_t_, &be, q27, m1, m2, -1.0f, 0.0f, 78);
    cd_close(&be);
}

/* Strong decay (whole chunks decay to zero: e^{G} underflows, nothing may
 * overflow), weak decay (the state accumulates over 1000 tokens). */
LM_TEST(cuda_delta_chunked_decay) {
    CD_OPEN(be);
    const int n1[] = { 1, 300, 64, 20, 1000 }, n2[] = { 65, 1, 130, 1, 16 };
    cd_mixed(lm_t_, &be, cd_shapes[0], n1, n2, -20.0f, -5.0f, 91);
    cd_mixed(lm_t_, &be, cd_shapes[0], n1, n2, -0.01f, 0.0f, 92);
    cd_mixed(lm_t_, &be, cd_shapes[3], n1, n2, -0.01f, 0.0f, 93);
    cd_close(&be);
}

/* 256-wide heads: key width 256 with 64-wide values runs on both kernels;
 * 256 x 256 only chunked (the recurrent kernel's thread per (column, 32
 * rows) needs Dv ceil(Dk / 32) <= 512), so its default-GPU run is left
 * out. */
LM_TEST(cuda_delta_chunked_wide) {
    CD_OPEN(be);
    uint64_t seed = 5501;
    const cd_shape w64 = { 1, 2, 256, 64, false }, w256 = { 1, 2, 256, 256, false };
    const int n1[] = { 1, 130, 65, 15, 64 }, n2[] = { 3, 1, 70, 16, 1 };
    cd_mixed(lm_t_, &be, w64, n1, n2, -1.0f, 0.0f, seed++);
    cd_state ps;
    cd_state_make(&ps, &be, 2, (int64_t)w256.Hv * w256.Dk * w256.Dv, &seed);
    const int32_t slot[] = { 1, 0 };
    const int a1[] = { 130, 1 }, q1[] = { 0, 9 }, a2[] = { 65, 200 }, q2[] = { 130, 10 };
    cd_delta_call(lm_t_, &be, &ps, w256, 2, a1, q1, slot, -1.0f, 0.0f, seed++, true, "Dk 256 Dv 256, call 1");
    cd_delta_call(lm_t_, &be, &ps, w256, 2, a2, q2, slot, -1.0f, 0.0f, seed++, true, "Dk 256 Dv 256, call 2");
    cd_state_free(&ps, &be);
    cd_close(&be);
}

/* gated_delta_gates against delta_gates + gated_delta on the all-chunked
 * GPU, bit for bit (outputs and state), a long sequence beside a decoding
 * one. */
LM_TEST(cuda_delta_chunked_fused_gates) {
    CD_OPEN(be);
    lm_backend *g = be.b[2];
    LM_REQUIRE(g->ops->gated_delta_gates != NULL);
    uint64_t seed = 6601;
    const int Hk = 2, Hv = 4, Dk = 128, Dv = 128, S = 2;
    const int n[] = { 150, 1 }, pos0[] = { 0, 12 };
    const int32_t slot[] = { 0, 1 };
    cd_batch d = cd_batch_make(S, n, pos0);
    lm_attn_batch ab = { .n_tokens = d.T, .pos = d.pos, .seq = d.seq, .n_seqs = S, .block_tables = NULL,
                         .state_slot = slot };
    const int T = d.T;
    const int64_t C = 2 * (int64_t)Hk * Dk + (int64_t)Hv * Dv, O = (int64_t)Hv * Dv;
    int64_t floats = (int64_t)Hv * Dk * Dv;
    const size_t nst = 2 * (size_t)floats;
    float *xh = cd_host((size_t)T * C, &seed, -1, 1), *sth = cd_host(nst, &seed, -1, 1);
    float *ah = cd_host((size_t)T * Hv, &seed, -2, 2), *bh = cd_host((size_t)T * Hv, &seed, -3, 3);
    float *alh = cd_host((size_t)Hv, &seed, -3, -1), *dth = cd_host((size_t)Hv, &seed, -1, 1);
    float *st = g->ops->alloc(g, nst * sizeof(float));
    LM_ASSERT(st);
    lm_kv_pool kv = { .n_state = 1, .n_state_slots = 2, .state_floats = &floats, .state = &st };
    lm_delta_params dp = { .n_k_heads = Hk, .n_v_heads = Hv, .k_dim = Dk, .v_dim = Dv, .state = { 0, 0 } };
    lm_tensor x = cd_tensor(g, T, C, xh), al = cd_tensor(g, 1, Hv, alh), dt = cd_tensor(g, 1, Hv, dth);
    lm_tensor ga = cd_tensor(g, T, Hv, ah), gb = cd_tensor(g, T, Hv, bh), out = cd_poisoned(g, T, O);
    g->ops->write(g, st, sth, nst * sizeof(float));
    g->ops->delta_gates(g, &ga, &gb, &al, &dt);
    g->ops->gated_delta(g, &out, &x, &ga, &gb, &kv, &ab, &dp);
    float *oc = cd_read(g, out.data, (size_t)T * O), *sc = cd_read(g, st, nst);
    g->ops->write(g, st, sth, nst * sizeof(float));
    g->ops->write(g, ga.data, ah, (size_t)T * Hv * sizeof(float));
    g->ops->write(g, gb.data, bh, (size_t)T * Hv * sizeof(float));
    g->ops->gated_delta_gates(g, &out, &x, &ga, &gb, &al, &dt, &kv, &ab, &dp);
    float *of = cd_read(g, out.data, (size_t)T * O), *sf = cd_read(g, st, nst);
    LM_CHECK_MSG(memcmp(oc, of, (size_t)T * O * sizeof(float)) == 0, "fused gates: outputs differ");
    LM_CHECK_MSG(memcmp(sc, sf, nst * sizeof(float)) == 0, "fused gates: states differ");
    free(oc), free(sc), free(of), free(sf), free(xh), free(sth), free(ah), free(bh), free(alh), free(dth);
    lm_tensor_release(g, &x), lm_tensor_release(g, &al), lm_tensor_release(g, &dt);
    lm_tensor_release(g, &ga), lm_tensor_release(g, &gb), lm_tensor_release(g, &out);
    g->ops->free(g, st);
    cd_batch_free(&d);
    cd_close(&be);
}

/* ---- conv1d_state --------------------------------------------------------------- */

/* Sequences longer than the kernel's 64-token blocks beside short and
 * decoding ones, two calls (the window carried), widths 4 and 2. */
LM_TEST(cuda_conv_token_parallel) {
    CD_OPEN(be);
    uint64_t seed = 7701;
    static const int Ks[] = { 4, 2 };
    const int64_t C = 300;
    for (size_t ki = 0; ki < LM_COUNT(Ks); ki++) {
        const int K = Ks[ki];
        cd_state ps;
        cd_state_make(&ps, &be, 6, (int64_t)(K - 1) * C, &seed);
        const int32_t slot[] = { 3, 0, 5, 1, 2 };
        const int n1[] = { 1, 200, 65, 2, 1000 }, p1[] = { 37, 0, 100, 5, 3 }, n2[] = { 64, 1, 129, 1, 3 };
        int p2[5];
        for (int s = 0; s < 5; s++) p2[s] = p1[s] + n1[s];
        for (int call = 0; call < 2; call++) {
            cd_batch d = cd_batch_make(5, call ? n2 : n1, call ? p2 : p1);
            lm_attn_batch ab = { .n_tokens = d.T, .pos = d.pos, .seq = d.seq, .n_seqs = 5, .block_tables = NULL,
                                 .state_slot = slot };
            float *xh = cd_host((size_t)d.T * C, &seed, -1, 1), *wh = cd_host((size_t)C * K, &seed, -0.6f, 0.6f);
            float *y[CD_NB], *st[CD_NB];
            const size_t nst = (size_t)ps.n_slots * (size_t)ps.floats;
            for (int b = 0; b < CD_NB; b++) {
                lm_backend *bk = be.b[b];
                lm_tensor x = cd_tensor(bk, d.T, C, xh), w = cd_tensor(bk, C, K, wh), yt = cd_poisoned(bk, d.T, C);
                bk->ops->conv1d_state(bk, &yt, &x, &w, &ps.kv[b], (lm_state_ref){ 0, 0 }, &ab, true);
                y[b] = cd_read(bk, yt.data, (size_t)d.T * C);
                st[b] = cd_read(bk, ps.st[b], nst);
                lm_tensor_release(bk, &x), lm_tensor_release(bk, &w), lm_tensor_release(bk, &yt);
            }
            const double ey = lm_tu_rel_err(y[1], y[0], (size_t)d.T * C, 1.0), es = lm_tu_rel_err(st[1], st[0], nst, 1.0);
            printf("  K %d call %d: y %.2g, window %.2g\n", K, call + 1, ey, es);
            LM_CHECK_MSG(ey <= 1e-5 && es <= 1e-5, "conv K %d call %d: y err %.3g, window err %.3g", K, call + 1, ey,
                         es);
            for (int b = 0; b < CD_NB; b++) free(y[b]), free(st[b]);
            free(xh), free(wh);
            cd_batch_free(&d);
        }
        cd_state_free(&ps, &be);
    }
    cd_close(&be);
}
