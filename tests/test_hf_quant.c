/* test_hf_quant.c - Hugging Face FP8 and MLX affine checkpoints (issue #26).
 *
 * Three levels. Known answers for the e4m3 code and the repacked block types
 * (hand-built values: subnormals, NaN codes, 448). The repacker on tiny
 * hand-written checkpoints: every repacked value equals the checkpoint's own
 * formula (FP8 tile, row and tensor scales; MLX 4 and 8 bits, groups of 32
 * to 128, per-module overrides), and a missing or misshapen scale tensor is
 * a one-line error naming it. Whole models: the llama-g256 fixture written as
 * FP8 and MLX checkpoints by tests/hf_quant_gen.c, which must give the logits
 * of their F32 dequantised twins (same arithmetic, so within float rounding)
 * and stay within a stated quantisation error of transformers' bf16 logits. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kern.h"
#include "backend/dtype_hf.h"
#include "base/lm_file.h"
#include "engine/lm_parity.h"
#include "engine/lm_runner.h"
#include "format/lm_weights.h"
#include "hf_quant_gen.h"
#include "lm_test.h"
#include "model/lm_model.h"
#include "test_util.h"

/* ---- known answers ---------------------------------------------------------- */

LM_TEST(hf_quant_e4m3_known_values) {
    LM_CHECK(lm_e4m3_to_f32(0x00) == 0.0f && !signbit(lm_e4m3_to_f32(0x00)));
    LM_CHECK(lm_e4m3_to_f32(0x80) == 0.0f && signbit(lm_e4m3_to_f32(0x80)));
    LM_CHECK(lm_e4m3_to_f32(0x01) == 0x1p-9f);       /* smallest subnormal */
    LM_CHECK(lm_e4m3_to_f32(0x07) == 7 * 0x1p-9f);   /* largest subnormal */
    LM_CHECK(lm_e4m3_to_f32(0x08) == 0x1p-6f);       /* smallest normal */
    LM_CHECK(lm_e4m3_to_f32(0x38) == 1.0f);
    LM_CHECK(lm_e4m3_to_f32(0x3c) == 1.5f);
    LM_CHECK(lm_e4m3_to_f32(0x40) == 2.0f);
    LM_CHECK(lm_e4m3_to_f32(0x7e) == 448.0f);        /* largest finite */
    LM_CHECK(lm_e4m3_to_f32(0xfe) == -448.0f);
    LM_CHECK(lm_e4m3_to_f32(0x7d) == 416.0f);
    LM_CHECK(lm_e4m3_to_f32(0x78) == 256.0f);        /* exponent 15 is finite but for m = 7 */
    LM_CHECK(isnan(lm_e4m3_to_f32(0x7f)));
    LM_CHECK(isnan(lm_e4m3_to_f32(0xff)));
    LM_CHECK(lm_e4m3_to_f32(0x81) == -0x1p-9f);
    /* every code against the test writer's own table, and strictly increasing */
    for (int c = 0; c < 256; c++) {
        float a = lm_e4m3_to_f32((uint8_t)c), b = hqg_e4m3_value((uint8_t)c);
        LM_CHECK_MSG((isnan(a) && isnan(b)) || a == b, "code 0x%02x: %g vs %g", c, a, b);
        if (c > 0 && c < 0x7f) LM_CHECK(lm_e4m3_to_f32((uint8_t)c) > lm_e4m3_to_f32((uint8_t)(c - 1)));
    }
    LM_CHECK(hqg_e4m3_encode(1000.0f) == 0x7e && hqg_e4m3_encode(-0.0f) == 0x80);
}

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

LM_TEST(hf_quant_fp8_block_known_values) {
    uint8_t blk[2 * LM_FP8_BLOCK_BYTES];
    float s0 = 0.5f, s1 = -3.0f, y[2 * LM_FP8_BLOCK];
    memcpy(blk, &s0, 4);
    memcpy(blk + LM_FP8_BLOCK_BYTES, &s1, 4);
    for (int j = 0; j < LM_FP8_BLOCK; j++) {
        blk[4 + j] = (uint8_t)j;                         /* 0 .. 127: subnormals .. NaN */
        blk[LM_FP8_BLOCK_BYTES + 4 + j] = (uint8_t)(0x80 | j);
    }
    lm_dequant_row(LM_FP8_B128, blk, y, 2 * LM_FP8_BLOCK);
    LM_CHECK(y[0] == 0.0f && y[1] == 0x1p-10f && y[0x38] == 0.5f && y[0x7e] == 224.0f && isnan(y[0x7f]));
    LM_CHECK(y[128 + 0x38] == 3.0f && y[128 + 0x7e] == 1344.0f && y[128 + 0x07] == 21 * 0x1p-9f);
}

LM_TEST(hf_quant_affine_known_values) {
    uint8_t a4[20], a8[36];
    float y[32];
    /* A4_BF16: scale 0.25, bias -1; byte j holds q = j (low) and 15 - j (high) */
    put16(a4, 0x3e80);
    put16(a4 + 2, 0xbf80);
    for (int j = 0; j < 16; j++) a4[4 + j] = (uint8_t)(j | ((15 - j) << 4));
    lm_dequant_row(LM_A4_BF16, a4, y, 32);
    for (int j = 0; j < 16; j++) {
        LM_CHECK(y[j] == 0.25f * (float)j - 1.0f);
        LM_CHECK(y[16 + j] == 0.25f * (float)(15 - j) - 1.0f);
    }
    /* A4_F16: scale 0.5, bias 2 */
    put16(a4, 0x3800);
    put16(a4 + 2, 0x4000);
    lm_dequant_row(LM_A4_F16, a4, y, 32);
    LM_CHECK(y[0] == 2.0f && y[15] == 9.5f && y[16] == 9.5f && y[31] == 2.0f);
    /* A8: q = 8j + 3 up to 251, scale 1/64, bias -2 (bf16) and scale 2, bias 0.5 (f16) */
    put16(a8, 0x3c80);
    put16(a8 + 2, 0xc000);
    for (int j = 0; j < 32; j++) a8[4 + j] = (uint8_t)(8 * j + 3);
    lm_dequant_row(LM_A8_BF16, a8, y, 32);
    for (int j = 0; j < 32; j++) LM_CHECK(y[j] == (float)(8 * j + 3) / 64.0f - 2.0f);
    put16(a8, 0x4000);
    put16(a8 + 2, 0x3800);
    lm_dequant_row(LM_A8_F16, a8, y, 32);
    LM_CHECK(y[0] == 6.5f && y[31] == 502.5f);
}

/* ---- the repacker on hand-written checkpoints ------------------------------------ */

/* A folder with config.json (NULL: none) and model.safetensors of n tensors. */
static char *hq_folder(const char *tag, const char *config, hqg_tensor *t, int n) {
    char *dir = lm_tu_mkdir(tag);
    if (config) {
        char *p = lm_path_join(dir, "config.json");
        lm_tu_write(p, config, strlen(config));
        free(p);
    }
    char *p = lm_path_join(dir, "model.safetensors");
    int rc = hqg_write_safetensors(p, t, n);
    free(p);
    if (rc) {
        free(dir);
        return NULL;
    }
    return dir;
}

/* Row r of tensor name in the opened folder, widened. */
static bool hq_row(const lm_weight_source *ws, const char *name, lm_dtype type, int64_t r, float *out) {
    const lm_file_tensor *t = lm_weights_find(ws, name, NULL);
    if (!t || t->type != type || t->n_dims != 2) return false;
    lm_dequant_row(t->type, t->data + (size_t)r * lm_dtype_row_bytes(t->type, t->shape[1]), out, t->shape[1]);
    return true;
}

enum { HQ_O = 130, HQ_I = 256 }; /* two row tiles (the second partial), two column tiles */

static uint8_t hq_code(int r, int c) {
    uint8_t v = (uint8_t)((r * 37 + c * 11) & 0xff);
    return (v & 0x7f) == 0x7f ? 0x30 : v; /* no NaN codes */
}

LM_TEST(hf_quant_repack_fp8_scales) {
    static uint8_t w[HQ_O * HQ_I];
    for (int r = 0; r < HQ_O; r++)
        for (int c = 0; c < HQ_I; c++) w[r * HQ_I + c] = hq_code(r, c);
    float tile[4] = { 0.5f, 2.0f, -0.25f, 3.0f }; /* [2][2] */
    uint16_t tensor = lm_f32_to_bf16(0.125f);
    float rows[HQ_O];
    for (int r = 0; r < HQ_O; r++) rows[r] = 0.01f * (float)(r + 1);
    hqg_tensor t[] = {
        { "a.weight", "F8_E4M3", 2, { HQ_O, HQ_I }, w, sizeof w },
        { "a.weight_scale_inv", "F32", 2, { 2, 2 }, tile, sizeof tile },
        { "b.weight", "F8_E4M3", 2, { HQ_O, HQ_I }, w, sizeof w },
        { "b.weight_scale", "BF16", 0, { 0, 0 }, &tensor, 2 },
        { "c.weight", "F8_E4M3", 2, { HQ_O, HQ_I }, w, sizeof w },
        { "c.weight_scale", "F32", 2, { HQ_O, 1 }, rows, sizeof rows },
    };
    char *dir = hq_folder("fp8", "{\"quantization_config\": {\"quant_method\": \"fp8\", "
                                 "\"weight_block_size\": [128, 128]}}", t, LM_COUNT(t));
    LM_REQUIRE(dir);
    lm_weight_source ws;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_weights_open_hf(&ws, dir, &e) == 0);
    float y[HQ_I];
    int bad = 0;
    for (int r = 0; r < HQ_O; r++) {
        LM_REQUIRE(hq_row(&ws, "a.weight", LM_FP8_B128, r, y));
        for (int c = 0; c < HQ_I; c++) bad += y[c] != hqg_e4m3_value(hq_code(r, c)) * tile[(r / 128) * 2 + c / 128];
        LM_REQUIRE(hq_row(&ws, "b.weight", LM_FP8_B128, r, y));
        for (int c = 0; c < HQ_I; c++) bad += y[c] != hqg_e4m3_value(hq_code(r, c)) * 0.125f;
        LM_REQUIRE(hq_row(&ws, "c.weight", LM_FP8_B128, r, y));
        for (int c = 0; c < HQ_I; c++) bad += y[c] != hqg_e4m3_value(hq_code(r, c)) * rows[r];
    }
    LM_CHECK_MSG(bad == 0, "%d values differ from e4m3 * scale", bad);
    /* counted at their repacked size: 3 x 130 rows of 2 blocks of 132 bytes */
    size_t scales = sizeof tile + 2 + sizeof rows;
    LM_CHECK(lm_weights_bytes(&ws) == scales + 3 * sizeof w - ws.repacked_from + 3 * HQ_O * 2 * 132);
    lm_weights_close(&ws);
    free(dir);
}

/* A row of an MLX checkpoint: q[i] = (3i + 5r) mod 2^bits packed as MLX does. */
static void hq_mlx_pack(uint32_t *words, int rows, int cols, int bits) {
    int k = 32 / bits;
    memset(words, 0, (size_t)rows * (size_t)cols / (size_t)k * 4);
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < cols; i++) {
            uint32_t q = (uint32_t)(3 * i + 5 * r) & ((1u << bits) - 1);
            words[(r * cols + i) / k] |= q << (bits * (i % k));
        }
}

LM_TEST(hf_quant_repack_mlx_groups) {
    enum { O = 3, I = 256 };
    static uint32_t w4[O * I / 8], w8[O * I / 4];
    hq_mlx_pack(w4, O, I, 4);
    hq_mlx_pack(w8, O, I, 8);
    /* module "p": 4 bits, groups of 128 (default), bf16; "q": 8 bits, groups of 32 (override), f16 */
    uint16_t ps[O * 2], pb[O * 2], qs[O * 8], qb[O * 8];
    for (int i = 0; i < O * 2; i++) ps[i] = lm_f32_to_bf16(0.01f * (float)(i + 1)), pb[i] = lm_f32_to_bf16(-0.5f + i);
    for (int i = 0; i < O * 8; i++) qs[i] = lm_f32_to_f16(0.001f * (float)(i + 1)), qb[i] = lm_f32_to_f16(0.25f * i);
    hqg_tensor t[] = {
        { "m.p.weight", "U32", 2, { O, I / 8 }, w4, sizeof w4 },
        { "m.p.scales", "BF16", 2, { O, 2 }, ps, sizeof ps },
        { "m.p.biases", "BF16", 2, { O, 2 }, pb, sizeof pb },
        { "m.q.weight", "U32", 2, { O, I / 4 }, w8, sizeof w8 },
        { "m.q.scales", "F16", 2, { O, 8 }, qs, sizeof qs },
        { "m.q.biases", "F16", 2, { O, 8 }, qb, sizeof qb },
        { "m.norm.weight", "BF16", 1, { O, 0 }, ps, O * 2 },
    };
    char *dir = hq_folder("mlx", "{\"quantization\": {\"group_size\": 128, \"bits\": 4, "
                                 "\"m.q\": {\"group_size\": 32, \"bits\": 8}}}", t, LM_COUNT(t));
    LM_REQUIRE(dir);
    lm_weight_source ws;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_weights_open_hf(&ws, dir, &e) == 0);
    float y[I];
    int bad = 0;
    for (int r = 0; r < O; r++) {
        LM_REQUIRE(hq_row(&ws, "m.p.weight", LM_A4_BF16, r, y));
        for (int i = 0; i < I; i++) {
            int g = r * 2 + i / 128;
            float want = lm_bf16_to_f32(ps[g]) * (float)((3 * i + 5 * r) & 15) + lm_bf16_to_f32(pb[g]);
            bad += y[i] != want;
        }
        LM_REQUIRE(hq_row(&ws, "m.q.weight", LM_A8_F16, r, y));
        for (int i = 0; i < I; i++) {
            int g = r * 8 + i / 32;
            float want = lm_f16_to_f32(qs[g]) * (float)((3 * i + 5 * r) & 255) + lm_f16_to_f32(qb[g]);
            bad += y[i] != want;
        }
    }
    LM_CHECK_MSG(bad == 0, "%d values differ from scale * q + bias", bad);
    const lm_file_tensor *norm = lm_weights_find(&ws, "m.norm.weight", NULL);
    LM_CHECK(norm && norm->type == LM_BF16); /* not a packed weight: left as it is */
    lm_weights_close(&ws);
    free(dir);
}

/* Opening a folder of these tensors fails with one line holding want. */
static void hq_expect_error(lm_test_ctx *lm_t_, const char *tag, const char *config, hqg_tensor *t, int n,
                            const char *want) {
    char *dir = hq_folder(tag, config, t, n);
    LM_REQUIRE(dir);
    lm_weight_source ws;
    lm_err e = { { 0 } };
    int rc = lm_weights_open_hf(&ws, dir, &e);
    LM_CHECK_MSG(rc != 0 && strstr(e.msg, want) && strstr(e.msg, "model.safetensors: ") && !strchr(e.msg, '\n'),
                 "%s: got \"%s\", want \"%s\"", tag, e.msg, want);
    if (rc == 0) lm_weights_close(&ws);
    free(dir);
}

LM_TEST(hf_quant_bad_scales) {
    static uint8_t w[HQ_O * HQ_I];
    float s[4] = { 1, 1, 1, 1 };
    const char *fp8 = "{\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]}}";
    hqg_tensor missing[] = { { "x.weight", "F8_E4M3", 2, { HQ_O, HQ_I }, w, sizeof w } };
    hq_expect_error(lm_t_, "fp8-missing", fp8, missing, 1,
                    "tensor \"x.weight\" (F8_E4M3) has no scale tensor \"x.weight_scale_inv\"");
    hqg_tensor shape[] = { { "x.weight", "F8_E4M3", 2, { HQ_O, HQ_I }, w, sizeof w },
                           { "x.weight_scale_inv", "F32", 2, { 1, 4 }, s, sizeof s } };
    hq_expect_error(lm_t_, "fp8-shape", fp8, shape, 2,
                    "tensor \"x.weight_scale_inv\" has shape [1, 4], expected [2, 2]");
    hqg_tensor type[] = { { "x.weight", "F8_E4M3", 2, { HQ_O, HQ_I }, w, sizeof w },
                          { "x.weight_scale_inv", "U8", 2, { 2, 2 }, s, 4 } };
    hq_expect_error(lm_t_, "fp8-type", fp8, type, 2, "tensor \"x.weight_scale_inv\" has type U8");
    hqg_tensor rows[] = { { "x.weight", "F8_E4M3", 2, { 4, 96 }, w, 4 * 96 },
                          { "x.weight_scale_inv", "F32", 2, { 1, 1 }, s, 4 } };
    hq_expect_error(lm_t_, "fp8-rows", fp8, rows, 2, "tensor \"x.weight\" has rows of 96 FP8 values");

    const char *mlx = "{\"quantization\": {\"group_size\": 64, \"bits\": 4}}";
    static uint32_t q[4 * 32];
    uint16_t h[4 * 4] = { 0 };
    hqg_tensor no_bias[] = { { "y.weight", "U32", 2, { 4, 32 }, q, sizeof q },
                             { "y.scales", "BF16", 2, { 4, 4 }, h, sizeof h } };
    hq_expect_error(lm_t_, "mlx-missing", mlx, no_bias, 2,
                    "missing tensor \"y.biases\" (the biases of MLX-quantised \"y.weight\")");
    hqg_tensor bad_shape[] = { { "y.weight", "U32", 2, { 4, 32 }, q, sizeof q },
                               { "y.scales", "BF16", 2, { 4, 2 }, h, 16 },
                               { "y.biases", "BF16", 2, { 4, 4 }, h, sizeof h } };
    hq_expect_error(lm_t_, "mlx-shape", mlx, bad_shape, 3,
                    "tensor \"y.scales\" has shape [4, 2], expected [4, 4] (4-bit groups of 64)");
    hq_expect_error(lm_t_, "mlx-bits", "{\"quantization\": {\"group_size\": 64, \"bits\": 7}}", bad_shape, 3,
                    "tensor \"y.weight\" is quantised to 7 bits");
    hq_expect_error(lm_t_, "mlx-3bit-words", "{\"quantization\": {\"group_size\": 64, \"bits\": 3}}", bad_shape, 3,
                    "tensor \"y.weight\" has rows of 32 words, not a whole number of 3-bit values");
    /* a stack of experts (switch_mlp) needs stacked scales */
    hqg_tensor stack[] = { { "z.weight", "U32", 3, { 2, 2, 32 }, q, sizeof q },
                           { "z.scales", "BF16", 2, { 4, 4 }, h, sizeof h },
                           { "z.biases", "BF16", 2, { 4, 4 }, h, sizeof h } };
    hq_expect_error(lm_t_, "mlx-stack", mlx, stack, 3,
                    "tensor \"z.scales\" has shape [4, 4], expected [2, 2, 4] (4-bit groups of 64)");
}

/* ---- whole models ------------------------------------------------------------------- */

typedef struct hq_model_case {
    const char *tag;
    const char *fixture;
    hqg_scheme scheme;
    /* measured max |logit - transformers'| over the parity prompts and greedy
     * steps (the twin gives the same: it is the quantisation error of the
     * test writer's rounding); the tolerance is about 1.5 to 2 times that */
    double measured, tol;
    /* max |logit| change of the default decode path (int8 activations for
     * the affine types; FP8 has no int8 kernel, so only f32 order) */
    double tol_decode;
} hq_model_case;

/* Logits of every position of tokens on the model in dir, on backend be:
 * all at once (GEMM) or one token a step (GEMV); *vocab gets its vocabulary. */
static float *hq_run(lm_backend *be, const char *dir, const int32_t *tokens, int n, bool stepwise, int *vocab,
                     lm_err *e) {
    lm_model *m = NULL;
    lm_runner *r = NULL;
    float *out = NULL;
    if (!lm_model_load(&m, dir, be, e) && !lm_runner_create(&r, m, 256, 0, e)) {
        *vocab = m->cfg.vocab;
        out = malloc((size_t)n * (size_t)*vocab * sizeof *out);
        int rc = stepwise ? 0 : lm_runner_eval(r, tokens, n, true, out, e);
        for (int i = 0; stepwise && i < n && !rc; i++)
            rc = lm_runner_eval(r, tokens + i, 1, false, out + (size_t)i * (size_t)*vocab, e);
        if (rc) {
            free(out);
            out = NULL;
        }
    }
    lm_runner_free(r);
    lm_model_free(m);
    return out;
}

/* The same on the CPU: exact (quantised rows widened to f32) or with the
 * int8-activation GEMV. */
static float *hq_logits(const char *dir, const int32_t *tokens, int n, bool exact, bool stepwise, int *vocab,
                        lm_err *e) {
    lm_backend *be = lm_cpu_backend_create(2, LM_ISA_AUTO, e);
    if (!be) return NULL;
    lm_cpu_backend_quant_exact(be, exact);
    float *out = hq_run(be, dir, tokens, n, stepwise, vocab, e);
    lm_backend_destroy(be);
    return out;
}

static double hq_max_diff(const float *a, const float *b, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
    return worst;
}

static void hq_model(lm_test_ctx *lm_t_, const hq_model_case *c) {
    char rel[128];
    snprintf(rel, sizeof rel, "%s/model.safetensors", c->fixture);
    char *src = lm_test_fixture_path(c->fixture);
    if (!src || !lm_test_have_fixture(rel)) {
        free(src);
        LM_SKIP("%s", lm_test_fixtures_why());
    }
    char tag[64], why[512];
    char *q = lm_tu_mkdir(c->tag);
    snprintf(tag, sizeof tag, "%s-twin", c->tag);
    char *twin = lm_tu_mkdir(tag);
    LM_REQUIRE(hqg_convert(src, c->scheme, q, twin, why, sizeof why) == 0);
    /* 1. the quantised checkpoint computes what its dequantised twin does */
    enum { N = 48 };
    int32_t tokens[N];
    for (int i = 0; i < N; i++) tokens[i] = (int32_t)((i * 131 + 7) % 1000 + 3);
    lm_err e = { { 0 } };
    int V = 0, V2 = 0, V3 = 0;
    float *lq = hq_logits(q, tokens, N, true, false, &V, &e);
    LM_CHECK_MSG(lq, "%s", e.msg);
    float *lt = hq_logits(twin, tokens, N, true, false, &V2, &e);
    LM_CHECK_MSG(lt, "%s", e.msg);
    float *l8 = hq_logits(q, tokens, N, false, true, &V3, &e);
    LM_CHECK_MSG(l8, "%s", e.msg);
    if (lq && lt && V == V2) {
        double worst = hq_max_diff(lq, lt, (size_t)N * (size_t)V);
        fprintf(stderr, "  %s: max |logit(quantised) - logit(twin)| = %.3g\n", c->tag, worst);
        LM_CHECK(worst <= 1e-4);
    }
    /* 1b. decoding step by step (GEMV; int8 activations where the type has
     * a kernel) stays within the int8 rounding of the exact logits */
    if (lq && l8 && V == V3) {
        double worst = hq_max_diff(lq, l8, (size_t)N * (size_t)V);
        fprintf(stderr, "  %s: max |logit(decode, default path) - logit(exact)| = %.3g (tolerance %.3g)\n",
                c->tag, worst, c->tol_decode);
        LM_CHECK(worst <= c->tol_decode);
    }
    free(lq);
    free(lt);
    free(l8);
    /* 2. and stays within the quantisation error of transformers' bf16 logits */
    lm_backend *be = lm_cpu_backend_create(2, LM_ISA_AUTO, &e);
    LM_REQUIRE(be);
    lm_cpu_backend_quant_exact(be, true); /* parity's cached decoding must match its full forward */
    lm_parity_result res;
    int rc = lm_parity_run(q, be, c->tol, &res, &e);
    LM_CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc == 0) {
        fprintf(stderr, "  %s: max |logit - transformers'| = %.4g (measured %.3g, tolerance %.3g), ok %d\n",
                c->tag, res.max_abs_err, c->measured, c->tol, res.ok);
        LM_CHECK(res.ok && res.max_abs_err <= c->tol);
    }
    lm_backend_destroy(be);
    free(q);
    free(twin);
    free(src);
}

/* llama-g256: rows of 256 and 512, two 128x128 tiles and more per matrix;
 * qwen3: tied embeddings, so the MLX embedding is the output head too;
 * qwen3-moe: per-expert matrices and the router quantised, and (switch)
 * the experts as mlx-lm's stacks, quantised as stacks, against a twin with
 * one tensor per expert. */
static const hq_model_case HQ_MODELS[] = {
    { "fp8-block", "gguf/llama-g256", HQG_FP8_BLOCK, 0.516, 1.0, 1e-4 },
    { "fp8-tensor", "gguf/llama-g256", HQG_FP8_TENSOR, 0.496, 1.0, 1e-4 },
    { "mlx4-g64", "gguf/llama-g256", HQG_MLX4_G64, 2.50, 4.0, 0.3 },   /* decode measured 0.105 */
    { "mlx8-g32", "gguf/llama-g256", HQG_MLX8_G32, 0.132, 0.25, 0.3 }, /* 0.106 */
    { "mlx4-g64-tied", "models/qwen3", HQG_MLX4_G64, 0.964, 2.0, 0.1 }, /* 0.034 */
    { "mlx8-moe", "models/qwen3-moe", HQG_MLX8_G32, 0.529, 1.0, 1.0 }, /* 0.378: int8 rounding can move a routing choice */
    { "mlx4-switch", "models/qwen3-moe", HQG_MLX4_SWITCH, 1.007, 2.0, 1.0 }, /* decode 0.363 */
    { "mlx3-g64", "gguf/llama-g256", HQG_MLX3_G64, 4.365, 6.5, 0.3 }, /* decode 0.103 */
    { "mlx6-g64", "gguf/llama-g256", HQG_MLX6_G64, 0.566, 1.0, 0.3 }, /* 0.114 */
    { "mlx2-g32", "gguf/llama-g256", HQG_MLX2_G32, 5.684, 8.5, 0.3 }, /* 0.119 */
    { "mlx5-g32", "gguf/llama-g256", HQG_MLX5_G32, 0.879, 1.5, 0.3 }, /* 0.107 */
};

LM_TEST(hf_quant_model_fp8_block) { hq_model(lm_t_, &HQ_MODELS[0]); }
LM_TEST(hf_quant_model_fp8_tensor) { hq_model(lm_t_, &HQ_MODELS[1]); }
LM_TEST(hf_quant_model_mlx4_g64) { hq_model(lm_t_, &HQ_MODELS[2]); }
LM_TEST(hf_quant_model_mlx8_g32) { hq_model(lm_t_, &HQ_MODELS[3]); }
LM_TEST(hf_quant_model_mlx4_tied) { hq_model(lm_t_, &HQ_MODELS[4]); }
LM_TEST(hf_quant_model_mlx8_moe) { hq_model(lm_t_, &HQ_MODELS[5]); }
/* mlx-community's MoE layout: experts as switch_mlp stacks, quantised as stacks */
LM_TEST(hf_quant_model_mlx4_switch_mlp) { hq_model(lm_t_, &HQ_MODELS[6]); }
/* the other MLX widths, held exactly in 4- (2, 3 bits) or 8-bit (5, 6) blocks */
LM_TEST(hf_quant_model_mlx3_g64) { hq_model(lm_t_, &HQ_MODELS[7]); }
LM_TEST(hf_quant_model_mlx6_g64) { hq_model(lm_t_, &HQ_MODELS[8]); }
LM_TEST(hf_quant_model_mlx2_g32) { hq_model(lm_t_, &HQ_MODELS[9]); }
LM_TEST(hf_quant_model_mlx5_g32) { hq_model(lm_t_, &HQ_MODELS[10]); }

/* transformers 5 saves a MoE layer's experts fused (mlp.experts.gate_up_proj
 * [E][2F][D], down_proj [E][D][F]); its fine-grained FP8 checkpoints keep
 * them fused with per-expert tiles (experts.gate_up_proj_scale_inv
 * [E][tiles][tiles]). No fixture MoE is wide enough for 128-value FP8
 * blocks, so a random one is written here (2 layers of width 128, 4
 * experts of 128): its FP8 checkpoint computes what its dequantised twin
 * does. */
LM_TEST(hf_quant_fp8_fused_experts) {
    enum { D = 128, F = 128, E = 4, V = 256, L = 2, HD = 64 };
    static const char cfg[] =
        "{\"model_type\": \"qwen3_moe\", \"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 128, "
        "\"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 64, "
        "\"intermediate_size\": 256, \"moe_intermediate_size\": 128, \"num_experts\": 4, \"num_experts_per_tok\": 2, "
        "\"norm_topk_prob\": true, \"vocab_size\": 256, \"rms_norm_eps\": 1e-6, \"max_position_embeddings\": 512, "
        "\"rope_parameters\": {\"rope_theta\": 1000000.0, \"rope_type\": \"default\"}, \"tie_word_embeddings\": false, "
        "\"hidden_act\": \"silu\"}";
    struct { char name[96]; int nd; int64_t shape[3]; } spec[4 + 11 * L];
    int n = 0;
#define HQ_T(nm, d, a, b, c) (snprintf(spec[n].name, sizeof spec[n].name, "%s", nm), spec[n].nd = d, \
                              spec[n].shape[0] = a, spec[n].shape[1] = b, spec[n].shape[2] = c, n++)
    HQ_T("model.embed_tokens.weight", 2, V, D, 0);
    HQ_T("model.norm.weight", 1, D, 0, 0);
    HQ_T("lm_head.weight", 2, V, D, 0);
    for (int l = 0; l < L; l++) {
        static const struct { const char *suffix; int nd; int64_t a, b, c; } parts[] = {
            { "input_layernorm.weight", 1, D, 0, 0 }, { "post_attention_layernorm.weight", 1, D, 0, 0 },
            { "self_attn.q_proj.weight", 2, 2 * HD, D, 0 }, { "self_attn.k_proj.weight", 2, HD, D, 0 },
            { "self_attn.v_proj.weight", 2, HD, D, 0 }, { "self_attn.o_proj.weight", 2, D, 2 * HD, 0 },
            { "self_attn.q_norm.weight", 1, HD, 0, 0 }, { "self_attn.k_norm.weight", 1, HD, 0, 0 },
            { "mlp.gate.weight", 2, E, D, 0 }, { "mlp.experts.gate_up_proj", 3, E, 2 * F, D },
            { "mlp.experts.down_proj", 3, E, D, F },
        };
        for (size_t i = 0; i < LM_COUNT(parts); i++) {
            char nm[96];
            snprintf(nm, sizeof nm, "model.layers.%d.%s", l, parts[i].suffix);
            HQ_T(nm, parts[i].nd, parts[i].a, parts[i].b, parts[i].c);
        }
    }
#undef HQ_T
    hqg_tensor *t = calloc((size_t)n, sizeof *t);
    uint64_t st = 0x2545F4914F6CDD1Dull;
    for (int i = 0; i < n; i++) {
        size_t numel = 1;
        for (int d = 0; d < spec[i].nd; d++) numel *= (size_t)spec[i].shape[d];
        uint16_t *v = malloc(numel * 2);
        const bool norm = spec[i].nd == 1;
        /* experts of different magnitudes, so that their tiles' scales differ */
        const size_t per = spec[i].nd == 3 ? numel / (size_t)spec[i].shape[0] : numel;
        for (size_t k = 0; k < numel; k++) {
            st ^= st << 13, st ^= st >> 7, st ^= st << 17;
            float u = (float)(st >> 40) / (float)(1 << 24) - 0.5f; /* [-0.5, 0.5) */
            v[k] = lm_f32_to_bf16(norm ? 1.0f + 0.2f * u : 0.2f * u * (float)(1 + k / per));
        }
        snprintf(t[i].name, sizeof t[i].name, "%.95s", spec[i].name);
        t[i].dtype = "BF16", t[i].n_dims = spec[i].nd, t[i].data = v, t[i].nbytes = numel * 2;
        for (int d = 0; d < spec[i].nd; d++) t[i].shape[d] = spec[i].shape[d];
    }
    char *src = hq_folder("fp8-fused-src", cfg, t, n);
    for (int i = 0; i < n; i++) free((void *)t[i].data);
    free(t);
    LM_REQUIRE(src != NULL);
    char *q = lm_tu_mkdir("fp8-fused"), *twin = lm_tu_mkdir("fp8-fused-twin"), why[512] = "";
    LM_REQUIRE(hqg_convert(src, HQG_FP8_BLOCK, q, twin, why, sizeof why) == 0);
    int32_t tokens[24];
    for (int i = 0; i < 24; i++) tokens[i] = (int32_t)((i * 37 + 11) % V);
    lm_err e = { { 0 } };
    int va = 0, vb = 0;
    float *a = hq_logits(q, tokens, 24, true, false, &va, &e);
    LM_CHECK_MSG(a, "%s", e.msg);
    float *b = hq_logits(twin, tokens, 24, true, false, &vb, &e);
    LM_CHECK_MSG(b, "%s", e.msg);
    if (a && b && va == vb) {
        double worst = hq_max_diff(a, b, (size_t)24 * (size_t)va);
        fprintf(stderr, "  fp8 fused experts: max |logit(quantised) - logit(twin)| = %.3g\n", worst);
        LM_CHECK(worst <= 1e-4); /* as hq_model's: the FP8 and f32 rows take different kernels (1.2e-6 measured) */
    }
    free(a), free(b), free(q), free(twin), free(src);
}

/* A model whose FP8 rows are not whole 128-value blocks (qwen3's width is
 * 64) is refused at load with the tensor named, not run wrongly. */
LM_TEST(hf_quant_model_fp8_short_rows) {
    char *src = lm_test_fixture_path("models/qwen3");
    if (!src || !lm_test_have_fixture("models/qwen3/model.safetensors")) {
        free(src);
        LM_SKIP("%s", lm_test_fixtures_why());
    }
    char why[512];
    char *q = lm_tu_mkdir("fp8-short");
    LM_REQUIRE(hqg_convert(src, HQG_FP8_BLOCK, q, NULL, why, sizeof why) == 0);
    lm_err e = { { 0 } };
    lm_backend *be = lm_cpu_backend_create(1, LM_ISA_AUTO, &e);
    LM_REQUIRE(be);
    lm_model *m = NULL;
    int rc = lm_model_load(&m, q, be, &e);
    LM_CHECK_MSG(rc != 0 && strstr(e.msg, "model.safetensors: tensor \"model.layers.0.") &&
                     strstr(e.msg, "has rows of 64 FP8 values, not a multiple of 128") && !strchr(e.msg, '\n'),
                 "got \"%s\"", e.msg);
    lm_model_free(m);
    lm_backend_destroy(be);
    free(q);
    free(src);
}

/* A checkpoint of llama-g256 repacked by scheme (FP8, MLX affine) on the
 * GPU (its blocks uploaded as stored) against the CPU's exact path: fed a
 * token at a time (the GEMV: exact block values, f32 sums), 1e-3; the
 * whole prompt at once (weights widened to bf16, x in three bf16 terms in
 * the exact mode, rounded to bf16 otherwise), 0.1 and 0.2 (the GGUF
 * types' bounds, test_cuda_quant.c). */
static void hq_cuda_model(lm_test_ctx *lm_t_, hqg_scheme scheme, const char *label) {
    char why[512];
    if (!lm_cuda_available(why, sizeof why)) LM_SKIP("%s", why);
    char *src = lm_test_fixture_path("gguf/llama-g256");
    if (!src || !lm_test_have_fixture("gguf/llama-g256/model.safetensors")) {
        free(src);
        LM_SKIP("%s", lm_test_fixtures_why());
    }
    char *q = lm_tu_mkdir(label);
    LM_REQUIRE(hqg_convert(src, scheme, q, NULL, why, sizeof why) == 0);
    enum { N = 40 };
    int32_t tokens[N];
    for (int i = 0; i < N; i++) tokens[i] = (int32_t)((i * 131 + 7) % 1000 + 3);
    lm_err e = { { 0 } };
    int V = 0;
    float *ref = hq_logits(q, tokens, N, true, false, &V, &e);
    LM_CHECK_MSG(ref, "%s", e.msg);
    LM_REQUIRE(ref);
    static const struct {
        bool exact, stepwise;
        double tol;
        const char *what;
    } pass[] = { { true, true, 1e-3, "a token at a time, exact" },
                 { false, true, 1e-3, "a token at a time, default" },
                 { true, false, 1e-1, "whole prompt, exact" },
                 { false, false, 2e-1, "whole prompt, default" } };
    for (size_t k = 0; k < LM_COUNT(pass); k++) {
        lm_backend *gpu = lm_cuda_backend_create(0, &e);
        LM_CHECK_MSG(gpu, "%s", e.msg);
        if (!gpu) break;
        lm_cuda_backend_quant_exact(gpu, pass[k].exact);
        int Vg = 0;
        float *g = hq_run(gpu, q, tokens, N, pass[k].stepwise, &Vg, &e);
        lm_backend_destroy(gpu);
        LM_CHECK_MSG(g && Vg == V, "%s: %s", pass[k].what, e.msg);
        if (!g || Vg != V) {
            free(g);
            continue;
        }
        const double worst = hq_max_diff(ref, g, (size_t)N * (size_t)V);
        int same = 0;
        for (int i = 0; i < N; i++) same += lm_argmax(ref + (size_t)i * V, V) == lm_argmax(g + (size_t)i * V, V);
        fprintf(stderr, "  %s on the GPU, %s: max |logit - CPU exact| %.3g (tol %.0e), argmax equal at %d/%d\n",
                label, pass[k].what, worst, pass[k].tol, same, N);
        LM_CHECK(worst <= pass[k].tol);
        free(g);
    }
    free(ref);
    free(q);
    free(src);
}

LM_TEST(hf_quant_cuda_fp8_model) { hq_cuda_model(lm_t_, HQG_FP8_BLOCK, "fp8-cuda"); }
LM_TEST(hf_quant_cuda_mlx4_model) { hq_cuda_model(lm_t_, HQG_MLX4_G64, "mlx4-cuda"); }
LM_TEST(hf_quant_cuda_mlx8_model) { hq_cuda_model(lm_t_, HQG_MLX8_G32, "mlx8-cuda"); }

/* The AVX2 FP8 widener (both x86 tables use it) gives lm_dequant_row's
 * bits for every code and sign, subnormals and NaN included. */
LM_TEST(hf_quant_fp8_simd_widening_exact) {
    if (lm_cpu_isa_detect() < LM_ISA_AVX2) LM_SKIP("this CPU has no AVX2");
    uint8_t blk[2 * LM_FP8_BLOCK_BYTES];
    float s0 = 0.0371f, s1 = -1e-36f; /* the second scale makes f32 subnormal products */
    memcpy(blk, &s0, 4);
    memcpy(blk + LM_FP8_BLOCK_BYTES, &s1, 4);
    for (int j = 0; j < LM_FP8_BLOCK; j++) {
        blk[4 + j] = (uint8_t)(2 * j);
        blk[LM_FP8_BLOCK_BYTES + 4 + j] = (uint8_t)(2 * j + 1);
    }
    float ref[2 * LM_FP8_BLOCK], got[2 * LM_FP8_BLOCK];
    lm_dequant_row(LM_FP8_B128, blk, ref, 2 * LM_FP8_BLOCK);
    lm_cpu_fp8_to_f32_avx2(blk, got, 2 * LM_FP8_BLOCK);
    int bad = 0;
    for (int i = 0; i < 2 * LM_FP8_BLOCK; i++)
        bad += !(isnan(ref[i]) ? isnan(got[i]) : memcmp(&ref[i], &got[i], 4) == 0);
    LM_CHECK_MSG(bad == 0, "%d of 256 values differ", bad);
    LM_CHECK(lm_cpu_kern_avx2.to_f32[LM_FP8_B128] == lm_cpu_fp8_to_f32_avx2);
}

/* The AVX2 affine wideners give lm_dequant_row's bits for random blocks. */
LM_TEST(hf_quant_affine_simd_widening_exact) {
    if (lm_cpu_isa_detect() < LM_ISA_AVX2) LM_SKIP("this CPU has no AVX2");
    static const lm_dtype types[] = { LM_A4_BF16, LM_A4_F16, LM_A8_BF16, LM_A8_F16 };
    uint64_t st = 12345;
    for (size_t k = 0; k < LM_COUNT(types); k++) {
        const lm_dtype t = types[k];
        enum { N = 256 };
        uint8_t blk[N / 32 * 36];
        size_t bytes = lm_dtype_row_bytes(t, N), bb = (size_t)lm_dtype_block_bytes(t);
        for (size_t i = 0; i < bytes; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            blk[i] = (uint8_t)(st >> 56);
        }
        for (size_t b = 0; b < bytes / bb; b++) { /* finite scales and biases of mixed magnitude */
            bool bf = t == LM_A4_BF16 || t == LM_A8_BF16;
            float sc = 0.001f * (float)(b + 1), bi = -0.37f * (float)b;
            put16(blk + b * bb, bf ? lm_f32_to_bf16(sc) : lm_f32_to_f16(sc));
            put16(blk + b * bb + 2, bf ? lm_f32_to_bf16(bi) : lm_f32_to_f16(bi));
        }
        float ref[N], got[N];
        lm_dequant_row(t, blk, ref, N);
        lm_cpu_kern_avx2.to_f32[t](blk, got, N);
        LM_CHECK_MSG(memcmp(ref, got, sizeof ref) == 0, "%s: widened rows differ", lm_dtype_name(t));
    }
}
