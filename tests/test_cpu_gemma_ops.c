/* test_cpu_gemma_ops.c - the ops first needed by gemma (cpu_gemma.c), on
 * every ISA this machine has and 1-3 threads, against plain double
 * references written here; plus the rope op driven the way gemma4's
 * "proportional" rope drives it (a full-width table whose tail frequencies
 * are zero), which must rotate exactly the pairs (i, i + Dh/2) for the
 * leading frequencies and leave every other element bit-identical.
 *
 * Tolerances: gelu_mul and softcap are computed in double and rounded once,
 * so they must be within 1 f32 ulp (2^-23 relative, plus 1e-30 absolute for
 * results near zero) of the double reference; copy_cols is exact. */
#include "lm_test.h"

#include "backend/lm_backend.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static float cg_rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

static lm_tensor cg_t(float *d, int64_t rows, int64_t cols) {
    return (lm_tensor){ .type = LM_F32, .rows = rows, .cols = cols, .data = d };
}

static float *cg_randv(uint64_t *s, int64_t n, float amp) {
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = amp * cg_rnd(s);
    return v;
}

static bool cg_ulp_close(double got, double ref) { return fabs(got - ref) <= 1.2e-7 * fabs(ref) + 1e-30; }

static double ref_gelu_tanh(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
static double ref_gelu_erf(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }

/* Runs body for each thread count on one ISA (skips when the CPU lacks it). */
static lm_backend *cg_backend(lm_test_ctx *lm_t_, lm_cpu_isa isa, int threads) {
    (void)lm_t_;
    if (isa > lm_cpu_isa_detect()) return NULL;
    return lm_cpu_backend_create(threads, isa, NULL);
}

static void cg_ops(lm_test_ctx *lm_t_, lm_cpu_isa isa) {
    if (isa > lm_cpu_isa_detect())
        LM_SKIP("this CPU lacks %s (best: %s)", lm_cpu_isa_name(isa), lm_cpu_isa_name(lm_cpu_isa_detect()));
    uint64_t s = 7;
    const int shapes[][2] = { { 1, 1 }, { 1, 37 }, { 3, 130 }, { 17, 300 }, { 65, 1000 } };
    for (int threads = 1; threads <= 3; threads++) {
        lm_backend *be = cg_backend(lm_t_, isa, threads);
        LM_REQUIRE(be);
        for (size_t k = 0; k < LM_COUNT(shapes); k++) {
            int T = shapes[k][0], F = shapes[k][1];
            /* gates up to +-8 reach both tails of gelu; plus exact zeros */
            float *g = cg_randv(&s, (int64_t)T * F, 8.0f), *u = cg_randv(&s, (int64_t)T * F, 2.0f);
            float *y = malloc((size_t)T * F * sizeof(float));
            g[0] = 0.0f;
            lm_tensor yt = cg_t(y, T, F), gt = cg_t(g, T, F), ut = cg_t(u, T, F);
            for (int approx = 0; approx <= 1; approx++) {
                be->ops->gelu_mul(be, &yt, &gt, &ut, approx);
                int bad = 0;
                for (int64_t i = 0; i < (int64_t)T * F; i++) {
                    double ref = (approx ? ref_gelu_tanh(g[i]) : ref_gelu_erf(g[i])) * u[i];
                    if (!cg_ulp_close(y[i], ref) && bad++ < 3)
                        fprintf(stderr, "  gelu_mul(%s) %lld: %.9g vs %.9g\n", approx ? "tanh" : "erf",
                                (long long)i, y[i], ref);
                }
                LM_CHECK_MSG(bad == 0, "%s threads=%d T=%d F=%d gelu_mul approx=%d: %d off",
                             lm_cpu_isa_name(isa), threads, T, F, approx, bad);
            }
            /* softcap in place, with values far inside and far beyond the cap */
            const float caps[] = { 0.5f, 30.0f };
            for (size_t c = 0; c < LM_COUNT(caps); c++) {
                for (int64_t i = 0; i < (int64_t)T * F; i++) y[i] = g[i] * 10.0f;
                be->ops->softcap(be, &yt, caps[c]);
                int bad = 0;
                for (int64_t i = 0; i < (int64_t)T * F; i++) {
                    double x = (double)(g[i] * 10.0f), ref = caps[c] * tanh(x / caps[c]);
                    if (!cg_ulp_close(y[i], ref) && bad++ < 3)
                        fprintf(stderr, "  softcap %lld: %.9g vs %.9g\n", (long long)i, y[i], ref);
                    if (!(fabsf(y[i]) <= caps[c])) bad++;
                }
                LM_CHECK_MSG(bad == 0, "%s threads=%d T=%d F=%d softcap %g: %d off", lm_cpu_isa_name(isa),
                             threads, T, F, caps[c], bad);
            }
            /* copy_cols: every block position, exact */
            for (int64_t c0 = 0; c0 < F; c0 += LM_MAX(1, F / 3)) {
                int64_t n = LM_MIN(F - c0, (int64_t)7 + c0 % 5);
                float *z = malloc((size_t)(T * n + 1) * sizeof(float));
                lm_tensor zt = cg_t(z, T, n);
                be->ops->copy_cols(be, &zt, &gt, c0);
                int bad = 0;
                for (int t = 0; t < T; t++) bad += memcmp(z + t * n, g + (int64_t)t * F + c0, (size_t)n * 4) != 0;
                LM_CHECK_MSG(bad == 0, "%s copy_cols T=%d F=%d col0=%lld: %d rows differ", lm_cpu_isa_name(isa), T,
                             F, (long long)c0, bad);
                free(z);
            }
            free(g);
            free(u);
            free(y);
        }
        lm_backend_destroy(be);
    }
}

/* gemma4's proportional rope: Dh = 48, partial 0.25 -> 6 rotated angles at
 * 1 / base^(2i / Dh), the other 18 frequencies zero. The op runs with
 * rot_dim = Dh over that table. */
static void cg_rope_proportional(lm_test_ctx *lm_t_, lm_cpu_isa isa) {
    if (isa > lm_cpu_isa_detect())
        LM_SKIP("this CPU lacks %s (best: %s)", lm_cpu_isa_name(isa), lm_cpu_isa_name(lm_cpu_isa_detect()));
    enum { Dh = 48, H = 3, T = 5, ANG = 6 };
    float inv[Dh / 2] = { 0 };
    for (int i = 0; i < ANG; i++) inv[i] = (float)(1.0 / pow(1e6, 2.0 * i / Dh));
    uint64_t s = 3;
    float *x = cg_randv(&s, T * H * Dh, 1.0f), *x0 = malloc(sizeof(float) * T * H * Dh);
    memcpy(x0, x, sizeof(float) * T * H * Dh);
    int32_t pos[T] = { 0, 1, 17, 300, 4095 };
    lm_backend *be = cg_backend(lm_t_, isa, 2);
    LM_REQUIRE(be);
    lm_tensor xt = cg_t(x, T, H * Dh);
    lm_rope_params rp = { .n_heads = H, .head_dim = Dh, .rot_dim = Dh, .interleaved = false, .inv_freq = inv,
                          .attn_factor = 1.0f };
    be->ops->rope(be, &xt, pos, &rp);
    int bad = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const float *a = x0 + (t * H + h) * Dh;
            const float *b = x + (t * H + h) * Dh;
            for (int i = 0; i < Dh / 2; i++) {
                double ang = (double)((float)pos[t] * inv[i]), c = cos(ang), sn = sin(ang); /* f32 angle */
                double r1 = a[i] * c - a[i + Dh / 2] * sn, r2 = a[i] * sn + a[i + Dh / 2] * c;
                if (i >= ANG) bad += b[i] != a[i] || b[i + Dh / 2] != a[i + Dh / 2];
                else bad += !(fabs(b[i] - r1) <= 1e-6 && fabs(b[i + Dh / 2] - r2) <= 1e-6);
            }
        }
    LM_CHECK_MSG(bad == 0, "%s proportional rope: %d elements off", lm_cpu_isa_name(isa), bad);
    lm_backend_destroy(be);
    free(x);
    free(x0);
}

LM_TEST(cpu_gemma_ops_scalar) { cg_ops(lm_t_, LM_ISA_SCALAR); }
LM_TEST(cpu_gemma_ops_avx2) { cg_ops(lm_t_, LM_ISA_AVX2); }
LM_TEST(cpu_gemma_ops_avx512) { cg_ops(lm_t_, LM_ISA_AVX512); }
LM_TEST(cpu_gemma_rope_proportional_scalar) { cg_rope_proportional(lm_t_, LM_ISA_SCALAR); }
LM_TEST(cpu_gemma_rope_proportional_auto) { cg_rope_proportional(lm_t_, lm_cpu_isa_detect()); }
