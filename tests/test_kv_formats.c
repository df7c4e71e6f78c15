/* test_kv_formats.c - the KV cache's element formats (lm_kv_type.h) on the
 * CPU: names and sizes, the rotation, the encoder's error bounds, and
 * kv_write + attention per format on every ISA against two references:
 * the cache's own decoded rows (the kernel reads the format right: ~1e-6)
 * and the exact f32 K/V (what the format costs: a stated bound per format). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kern.h"
#include "engine/lm_kv_cache.h"
#include "kv_format_case.h"
#include "lm_test.h"

LM_TEST(kv_type_names_and_sizes) {
    lm_kv_types t;
    LM_CHECK(lm_kv_types_parse("bf16", &t) == 0 && t.k == LM_KV_BF16 && t.v == LM_KV_BF16);
    LM_CHECK(lm_kv_types_parse("int8", &t) == 0 && t.k == LM_KV_Q8 && t.v == LM_KV_Q8);
    LM_CHECK(lm_kv_types_parse("K8V4r", &t) == 0 && t.k == LM_KV_Q8 && t.v == LM_KV_Q4R);
    LM_CHECK(lm_kv_types_parse("k16v32", &t) == 0 && t.k == LM_KV_BF16 && t.v == LM_KV_F32);
    LM_CHECK(lm_kv_types_parse("K8", &t) != 0 && lm_kv_types_parse("K8V5", &t) != 0);
    LM_CHECK(lm_kv_types_parse("q5", &t) != 0 && lm_kv_types_parse("", &t) != 0 && lm_kv_type_parse(NULL) == -1);
    char buf[32];
    LM_CHECK(!strcmp(lm_kv_types_str((lm_kv_types){ LM_KV_Q4R, LM_KV_Q4R }, buf, sizeof buf), "q4r"));
    LM_CHECK(!strcmp(lm_kv_types_str((lm_kv_types){ LM_KV_Q8, LM_KV_Q4 }, buf, sizeof buf), "K=q8,V=q4"));
    /* 1024 values: f32 4096, bf16 2048, q8 1024 + 64, q4 512 + 64 */
    LM_CHECK(lm_kv_row_bytes(LM_KV_F32, 1024) == 4096 && lm_kv_row_bytes(LM_KV_BF16, 1024) == 2048);
    LM_CHECK(lm_kv_row_bytes(LM_KV_Q8, 1024) == 1088 && lm_kv_row_bytes(LM_KV_Q4, 1024) == 576);
    LM_CHECK(lm_kv_row_bytes(LM_KV_Q4R, 1024) == 576 && lm_kv_row_bytes(LM_KV_Q4, 32) == 32);
    /* Qwen3.5-27B's full-attention layers: 16 x 4 heads x 256 */
    LM_CHECK(lm_kv_bytes_per_token((lm_kv_types){ LM_KV_F32, LM_KV_F32 }, 16, 1024) == 131072);
    LM_CHECK(lm_kv_bytes_per_token((lm_kv_types){ LM_KV_Q4R, LM_KV_Q4R }, 16, 1024) == 18432);
    LM_CHECK(lm_kv_rot_for(256) == 128 && lm_kv_rot_for(64) == 64 && lm_kv_rot_for(80) == 16);
}

LM_TEST(kv_rotation_is_orthogonal) {
    for (int rot = 2; rot <= LM_KV_MAX_ROT; rot *= 2) {
        float x[LM_KV_MAX_ROT], y[LM_KV_MAX_ROT], z[LM_KV_MAX_ROT];
        double nx = 0, ny = 0, dxz = 0, dot = 0, rdot = 0;
        for (int i = 0; i < rot; i++) x[i] = sinf(0.7f * (float)i + 0.3f) * (i == 3 ? 20.0f : 1.0f);
        for (int i = 0; i < rot; i++) z[i] = cosf(1.3f * (float)i);
        memcpy(y, x, sizeof(float) * (size_t)rot);
        lm_kv_rotate(y, rot);
        for (int i = 0; i < rot; i++) nx += (double)x[i] * x[i], ny += (double)y[i] * y[i], dot += (double)x[i] * z[i];
        float zr[LM_KV_MAX_ROT];
        memcpy(zr, z, sizeof(float) * (size_t)rot);
        lm_kv_rotate(zr, rot);
        for (int i = 0; i < rot; i++) rdot += (double)y[i] * zr[i];
        lm_kv_unrotate(y, rot);
        for (int i = 0; i < rot; i++) dxz = fmax(dxz, fabs((double)y[i] - x[i]));
        LM_CHECK_MSG(fabs(nx - ny) <= 1e-5 * nx && dxz <= 1e-4 && fabs(dot - rdot) <= 1e-4 * sqrt(nx * rot),
                     "rot %d: |x|^2 %g vs %g, back %g, dot %g vs %g", rot, nx, ny, dxz, dot, rdot);
    }
    /* the signs are a fixed, balanced pattern */
    int neg = 0;
    for (int i = 0; i < 512; i++) neg += lm_kv_rot_sign(i) < 0;
    LM_CHECK(neg > 200 && neg < 312);
}

/* Each value decodes within half a step of its group's scale (bf16: its
 * rounding); the rotated format within the same bound in rotated space,
 * so its error after un-rotating has the same norm. */
LM_TEST(kv_encode_decode_bounds) {
    enum { W = 256 };
    float x[W], y[W];
    uint8_t row[2048];
    for (int i = 0; i < W; i++) x[i] = sinf(0.37f * (float)i) * (i % 64 == 5 ? 30.0f : 1.0f) + (i == 77 ? 1e-7f : 0);
    for (int t = 0; t < LM_KV_TYPE_COUNT; t++) {
        memset(row, 0xA5, sizeof row);
        lm_kv_encode_row((lm_kv_type)t, row, x, W, W, 64);
        lm_kv_decode((lm_kv_type)t, row, 0, W, W, y);
        float xr[W];
        memcpy(xr, x, sizeof xr);
        if (t == LM_KV_Q4R)
            for (int c = 0; c < W; c += 64) lm_kv_rotate(xr + c, 64);
        int bad = 0;
        for (int g = 0; g < W; g += 32) {
            float amax = 0;
            for (int i = g; i < g + 32; i++) amax = fmaxf(amax, fabsf(xr[i]));
            const double step = t == LM_KV_Q8 ? amax / 127.0 : amax / 7.0;
            for (int i = g; i < g + 32; i++) {
                double lim = t == LM_KV_F32 ? 0 : t == LM_KV_BF16 ? fabs(xr[i]) / 256 : 0.5 * step * 1.002 + 1e-12;
                bad += !(fabs((double)y[i] - xr[i]) <= lim);
            }
        }
        LM_CHECK_MSG(bad == 0, "%s: %d values outside their bound", lm_kv_type_name((lm_kv_type)t), bad);
        /* a part of a row decodes as the whole row's part */
        float part[40];
        lm_kv_decode((lm_kv_type)t, row, 48, 40, W, part);
        LM_CHECK(memcmp(part, y + 48, sizeof part) == 0);
    }
    /* zeros stay zeros (no 0/0) */
    float zero[32] = { 0 }, back[32];
    lm_kv_encode_row(LM_KV_Q8, row, zero, 32, 32, 0);
    lm_kv_decode(LM_KV_Q8, row, 0, 32, 32, back);
    LM_CHECK(memcmp(zero, back, sizeof zero) == 0);
}

LM_TEST(kv_cache_refuses_formats_that_do_not_fit) {
    lm_err e = { { 0 } };
    LM_CHECK(lm_kv_check_format((lm_kv_types){ LM_KV_Q8, LM_KV_F32 }, 48, 16, 16, &e) != 0 &&
             strstr(e.msg, "q8") && strstr(e.msg, "48"));
    LM_CHECK(lm_kv_check_format((lm_kv_types){ LM_KV_BF16, LM_KV_Q4R }, 96, 96, 64, &e) != 0 &&
             strstr(e.msg, "q4r"));
    LM_CHECK(lm_kv_check_format((lm_kv_types){ LM_KV_BF16, LM_KV_BF16 }, 48, 16, 0, NULL) == 0);
    LM_CHECK(lm_kv_check_format((lm_kv_types){ LM_KV_Q4R, LM_KV_Q8 }, 96, 96, 32, NULL) == 0);
}

/* The ISA tables' group decoders equal the reference bit for bit: rows of
 * random values with outliers, zero groups and f16-subnormal scales, every
 * group-aligned slice of a 256-wide row. */
LM_TEST(kv_group_decoders_match_reference) {
    enum { W = 256 };
    const lm_cpu_kern *tabs[] = { &lm_cpu_kern_avx2, &lm_cpu_kern_avx512 };
    const lm_cpu_isa isas[] = { LM_ISA_AVX2, LM_ISA_AVX512 };
    const lm_kv_type types[] = { LM_KV_Q8, LM_KV_Q4, LM_KV_Q4R };
    uint32_t seed = 7;
    int checked = 0;
    for (int ti = 0; ti < 2; ti++) {
        if (isas[ti] > lm_cpu_isa_detect()) {
            printf("  skip %s: this CPU lacks it\n", lm_cpu_isa_name(isas[ti]));
            continue;
        }
        for (int k = 0; k < 3; k++) {
            const lm_kv_to_f32_fn fn = tabs[ti]->kv_to_f32[types[k]];
            LM_CHECK_MSG(fn != NULL, "%s has no %s decoder", lm_cpu_isa_name(isas[ti]), lm_kv_type_name(types[k]));
            if (!fn) continue;
            for (int trial = 0; trial < 20; trial++) {
                float x[W], want[W], got[W];
                uint8_t row[1024];
                for (int i = 0; i < W; i++) {
                    seed = seed * 1664525u + 1013904223u;
                    const float u = (float)(seed >> 8) / 16777216.0f - 0.5f;
                    const int g = i / 32;
                    x[i] = g == 2 ? 0.0f : g == 3 ? u * 1e-6f : u * (i % 61 == 3 ? 40.0f : 1.0f) * (float)(trial + 1);
                }
                lm_kv_encode_row(types[k], row, x, W, W, 64);
                for (int c0 = 0; c0 < W; c0 += 32)
                    for (int n = 32; c0 + n <= W; n += 96) {
                        lm_kv_decode(types[k], row, c0, n, W, want);
                        memset(got, 0xFF, sizeof got);
                        fn(row, c0, n, W, got);
                        checked++;
                        LM_CHECK_MSG(memcmp(want, got, (size_t)n * sizeof(float)) == 0, "%s %s trial %d [%d, %d)",
                                     lm_cpu_isa_name(isas[ti]), lm_kv_type_name(types[k]), trial, c0, c0 + n);
                    }
            }
        }
    }
    if (checked == 0) LM_SKIP("this CPU has neither AVX2 nor AVX-512");
}

/* ---- attention per format, every ISA ------------------------------------------ */

static const kvf_cfg kvf_cfgs[] = {
    /* H Hkv Dh window softcap scale outlier decode long_len */
    { 8, 2, 64, 0, 0, 0.125f, 8.0f, false, 0 },  /* GQA 4:1, keys with outlier channels */
    { 4, 1, 128, 40, 0, 0.088f, 0, false, 0 },   /* MQA, sliding window */
    { 6, 2, 32, 0, 5.0f, 0.5f, 4.0f, false, 0 }, /* softcap */
    { 4, 2, 16, 0, 0, 0.25f, 0, true, 0 },       /* heads narrower than a scale group; a decode step */
};

/* err_f32 bounds per format (relative to the largest output), about twice
 * what the cases measure */
static double kvf_bound(lm_kv_type t) {
    switch (t) {
    case LM_KV_F32: return 1e-5;
    case LM_KV_BF16: return 0.01;
    case LM_KV_Q8: return 0.025;
    default: return 0.3;
    }
}

static void kvf_formats(lm_test_ctx *lm_t_, lm_cpu_isa isa) {
    if (isa > lm_cpu_isa_detect()) LM_SKIP("this CPU lacks %s", lm_cpu_isa_name(isa));
    const int threads[] = { 1, 3 };
    for (int ti = 0; ti < 2; ti++) {
        lm_err e = { { 0 } };
        lm_backend *be = lm_cpu_backend_create(threads[ti], isa, &e);
        LM_REQUIRE(be);
        for (size_t c = 0; c < sizeof kvf_cfgs / sizeof kvf_cfgs[0]; c++) {
            const kvf_cfg *cf = &kvf_cfgs[c];
            double err4 = 0, err4r = 0;
            for (int k = 0; k < LM_KV_TYPE_COUNT; k++) {
                /* K and V in one format; K in it with V in bf16; K in q8 with V in it */
                for (int mix = 0; mix < 3; mix++) {
                    lm_kv_types kvt = { mix == 2 ? LM_KV_Q8 : (lm_kv_type)k, mix == 1 ? LM_KV_BF16 : (lm_kv_type)k };
                    kvf_result r;
                    LM_REQUIRE(kvf_case(be, kvt, lm_kv_rot_for(cf->Dh), cf, 1000 + c, &r) == 0);
                    const double bound = fmax(kvf_bound(kvt.k), kvf_bound(kvt.v));
                    if (getenv("LUMEN_KV_TEST_VERBOSE"))
                        fprintf(stderr, "  cfg %zu K=%s V=%s: err vs decoded %.3g, vs f32 %.3g\n", c,
                                lm_kv_type_name(kvt.k), lm_kv_type_name(kvt.v), r.err_deq, r.err_f32);
                    LM_CHECK_MSG(r.err_deq <= 2e-5 && r.err_f32 <= bound && r.rows_bad == 0,
                                 "%s threads %d cfg %zu K=%s V=%s: err vs decoded %.3g, vs f32 %.3g (bound %g), "
                                 "%d rows off",
                                 lm_cpu_isa_name(isa), threads[ti], c, lm_kv_type_name(kvt.k),
                                 lm_kv_type_name(kvt.v), r.err_deq, r.err_f32, bound, r.rows_bad);
                    if (mix == 1 && k == LM_KV_Q4) err4 = r.err_f32;
                    if (mix == 1 && k == LM_KV_Q4R) err4r = r.err_f32;
                    free(r.out);
                }
            }
            /* the rotation is what makes 4-bit keys usable when they have
             * outlier channels (measured: 0.4 to 0.6 of q4's error) */
            if (cf->outlier > 0)
                LM_CHECK_MSG(err4r < 0.65 * err4, "cfg %zu: K in q4r error %.3g vs q4 %.3g", c, err4r, err4);
        }
        lm_backend_destroy(be);
    }
}

LM_TEST(kv_formats_attention_scalar) { kvf_formats(lm_t_, LM_ISA_SCALAR); }
LM_TEST(kv_formats_attention_avx2) { kvf_formats(lm_t_, LM_ISA_AVX2); }
LM_TEST(kv_formats_attention_avx512) { kvf_formats(lm_t_, LM_ISA_AVX512); }
