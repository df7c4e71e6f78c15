/* test_cuda_ops.c - the CUDA backend's matmul and element-wise ops against
 * the CPU backend, and its setup and staging.
 *
 * Every op test builds random inputs (never zeros), runs the op on the CPU
 * backend and on the CUDA backend, where outputs are first poisoned with NaN
 * bytes, and compares. Without a GPU (or in a build without CUDA) each test
 * LM_SKIPs with lm_cuda_available's reason; the creation test runs
 * everywhere and checks that the failure is a message, not a crash.
 *
 * Tolerances, stated per op (ref = the CPU backend's result):
 *   matmul GEMV (T <= 8), f32 weights: |y - ref| <= 2e-5 * sum_i |x_i w_i| + 1e-6
 *   matmul hi/lo split (T > 8, bf16/f16): 1e-4 * sum_i |x_i w_i| + 1e-6
 *   matmul LUMEN_CUDA_GEMM=bf16 (T > 8): 1e-2 * sum_i |x_i w_i| + 1e-6
 *   matmul_glu over stacked weights (T > 8): the same bound on the gate and
 *              up products, carried through act(g) * u
 *   rms_norm, rope, gelu_mul, softcap (double arithmetic on both sides):
 *              2e-6 relative + 1e-6 absolute
 *   silu_mul, sigmoid_mul (f32 expf on both, ulps apart): 1e-5 relative + 1e-6
 *   add, scale, get_rows, gather_rows, copy_cols: exact */
#include "lm_test.h"

#include "backend/lm_backend.h"

#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------- */

static float cu_rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

/* Random values in [-amp, amp) pushed away from zero (|v| >= amp / 64). */
static float *cu_randv(uint64_t *s, int64_t n, float amp) {
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) {
        float r = cu_rnd(s);
        if (fabsf(r) < 1.0f / 64) r = r < 0 ? -1.0f / 64 : 1.0f / 64;
        v[i] = amp * r;
    }
    return v;
}

typedef struct cu_pair {
    lm_backend *cpu, *gpu;
} cu_pair;

#define CU_SETUP(p)                                                   \
    char why_[512];                                                   \
    if (!lm_cuda_available(why_, sizeof why_)) LM_SKIP("%s", why_);   \
    cu_pair p;                                                        \
    LM_REQUIRE(cu_open(&p, why_, sizeof why_));

static bool cu_open(cu_pair *p, char *why, size_t n) {
    lm_err e = { { 0 } };
    p->cpu = lm_cpu_backend_create(2, LM_ISA_AUTO, &e);
    p->gpu = p->cpu ? lm_cuda_backend_create(0, &e) : NULL;
    if (!p->gpu) {
        snprintf(why, n, "%s", e.msg);
        fprintf(stderr, "  backend creation failed: %s\n", e.msg);
        lm_backend_destroy(p->cpu);
        return false;
    }
    return true;
}

/* cu_open with the environment variable var set to value while the GPU
 * backend is created (switches it reads then), and restored after. */
static bool cu_open_with(cu_pair *p, const char *var, const char *value, char *why, size_t n) {
    const char *old = getenv(var);
    char *saved = old ? strdup(old) : NULL;
    setenv(var, value, 1);
    const bool ok = cu_open(p, why, n);
    if (saved) setenv(var, saved, 1);
    else unsetenv(var);
    free(saved);
    return ok;
}

static void cu_close(cu_pair *p) {
    lm_backend_destroy(p->gpu);
    lm_backend_destroy(p->cpu);
}

/* An f32 tensor on be holding host values (or poison when host is NULL). */
static lm_tensor cu_put(lm_backend *be, const float *host, int64_t rows, int64_t cols) {
    lm_tensor t;
    LM_ASSERT(lm_tensor_alloc(be, &t, rows, cols) == 0);
    size_t bytes = (size_t)(rows * cols) * sizeof(float);
    if (host) {
        be->ops->write(be, t.data, host, bytes);
    } else {
        unsigned char *nan = malloc(bytes ? bytes : 1);
        memset(nan, 0xff, bytes); /* NaN in every float */
        be->ops->write(be, t.data, nan, bytes);
        free(nan);
    }
    return t;
}

static float *cu_get(lm_backend *be, const lm_tensor *t) {
    size_t n = (size_t)(t->rows * t->cols);
    float *h = malloc((n ? n : 1) * sizeof *h);
    be->ops->read(be, h, t->data, n * sizeof *h);
    return h;
}

/* Counts elements outside |a - b| <= rel |b| + abs; prints the first few. */
static int cu_cmp(const char *what, const float *a, const float *b, int64_t n, double rel, double abs_) {
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= rel * fabs((double)b[i]) + abs_)) {
            if (bad < 5) fprintf(stderr, "  %s[%lld]: cuda %.9g, cpu %.9g\n", what, (long long)i, a[i], b[i]);
            bad++;
        }
    }
    return bad;
}

/* ---- creation, everywhere -------------------------------------------------- */

LM_TEST(cuda_create_or_explain) {
    char why[512] = "";
    bool avail = lm_cuda_available(why, sizeof why);
    LM_CHECK(why[0] != '\0');
    fprintf(stderr, "  lm_cuda_available: %s: %s\n", avail ? "yes" : "no", why);
    lm_err e = { { 0 } };
    lm_backend *be = lm_cuda_backend_create(0, &e);
    if (!avail) {
        LM_CHECK(be == NULL);
        LM_CHECK(e.msg[0] != '\0');
    } else {
        LM_REQUIRE(be != NULL);
        LM_CHECK(strcmp(be->name, "cuda") == 0);
        size_t fr = 0, tot = 0;
        lm_backend_mem_info(be, &fr, &tot);
        LM_CHECK(tot > 0 && fr > 0 && fr <= tot);
        lm_backend_sync(be);
        lm_backend_destroy(be);
    }
    /* a device that does not exist: a message, never a crash */
    lm_err e2 = { { 0 } };
    LM_CHECK(lm_cuda_backend_create(9999, &e2) == NULL);
    LM_CHECK(e2.msg[0] != '\0');
    /* the CPU backend answers the device queries with nothing */
    lm_err e3 = { { 0 } };
    lm_backend *cpu = lm_cpu_backend_create(1, LM_ISA_AUTO, &e3);
    LM_REQUIRE(cpu != NULL);
    size_t fr = 1, tot = 1;
    lm_backend_mem_info(cpu, &fr, &tot);
    LM_CHECK(fr == 0 && tot == 0);
    lm_backend_sync(cpu);
    lm_backend_destroy(cpu);
}

/* Every kernel launches with programmatic dependent launch, so it is alive
 * while the kernel before still writes its inputs. Loads through the
 * read-only (non-coherent) path assume data constant for the kernel's whole
 * life: ptxas then moved the GEMV's activation loads above the PDL wait
 * (seen in its SASS on the H200), and the demo hybrid's graph replays read
 * stale activations. No CUDA source may ask for that path: no __ldg, no
 * non-coherent loads in inline PTX, no const __restrict__ kernel pointers
 * (which let the compiler choose it). Runs everywhere: a source check. */
LM_TEST(cuda_sources_no_readonly_loads) {
    static const char *const banned[] = { "__ldg(", "ld.global.nc", "__restrict__" };
    const char *dir_path = LUMEN_SOURCE_DIR "/src/backend/cuda";
    DIR *dir = opendir(dir_path);
    LM_REQUIRE(dir != NULL);
    int checked = 0;
    bool saw_matmul = false;
    for (struct dirent *d; (d = readdir(dir));) {
        const size_t len = strlen(d->d_name);
        const bool src = (len > 3 && strcmp(d->d_name + len - 3, ".cu") == 0) ||
                         (len > 2 && strcmp(d->d_name + len - 2, ".h") == 0);
        if (!src) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir_path, d->d_name);
        FILE *fp = fopen(path, "r");
        LM_CHECK_MSG(fp != NULL, "cannot open %s", path);
        if (!fp) continue;
        char line[4096];
        for (int n = 1; fgets(line, sizeof line, fp); n++)
            for (size_t b = 0; b < sizeof banned / sizeof *banned; b++)
                LM_CHECK_MSG(!strstr(line, banned[b]), "%s:%d uses %s", d->d_name, n, banned[b]);
        fclose(fp);
        checked++;
        saw_matmul = saw_matmul || strcmp(d->d_name, "cuda_matmul.cu") == 0;
    }
    closedir(dir);
    LM_CHECK(checked >= 2 && saw_matmul);
}

/* ---- weights -------------------------------------------------------------------- */

/* GGUF and MLX affine blocks upload as stored; a type without GPU kernels
 * (i32) and a quantised row that is not whole blocks are refused, naming
 * the problem. */
LM_TEST(cuda_upload_weight_types) {
    CU_SETUP(p);
    uint8_t blk[34 * 4] = { 0 };
    lm_tensor q = { .type = LM_Q8_0, .rows = 2, .cols = 64 };
    lm_err e = { { 0 } };
    LM_CHECK_MSG(p.gpu->ops->upload_weight(p.gpu, &q, blk, &e) == 0, "%s", e.msg);
    if (q.data) p.gpu->ops->free(p.gpu, q.data);
    lm_tensor i32 = { .type = LM_I32, .rows = 2, .cols = 4 };
    LM_CHECK(p.gpu->ops->upload_weight(p.gpu, &i32, blk, &e) != 0);
    LM_CHECK(strstr(e.msg, "i32") || strstr(e.msg, "I32"));
    LM_CHECK(strstr(e.msg, "bf16") != NULL && strstr(e.msg, "Q4_K") != NULL);
    fprintf(stderr, "  i32 upload: %s\n", e.msg);
    lm_tensor a4 = { .type = LM_A4_BF16, .rows = 2, .cols = 64 };
    LM_CHECK_MSG(p.gpu->ops->upload_weight(p.gpu, &a4, blk, &e) == 0, "%s", e.msg);
    if (a4.data) p.gpu->ops->free(p.gpu, a4.data);
    lm_tensor part = { .type = LM_Q8_0, .rows = 1, .cols = 48 };
    LM_CHECK(p.gpu->ops->upload_weight(p.gpu, &part, blk, &e) != 0);
    LM_CHECK(strstr(e.msg, "Q8_0") != NULL && strstr(e.msg, "shape") != NULL);
    fprintf(stderr, "  q8_0 [1][48] upload: %s\n", e.msg);
    cu_close(&p);
}

/* ---- matmul ---------------------------------------------------------------------- */

/* Host weight of type t [O][I] from random values; *deq gets its f32 value. */
static void *cu_weight(lm_dtype t, int64_t O, int64_t I, uint64_t *s, float **deq) {
    size_t n = (size_t)(O * I);
    float *v = cu_randv(s, (int64_t)n, 1.0f);
    void *w = malloc(n * (t == LM_F32 ? 4 : 2) + 1);
    for (size_t i = 0; i < n; i++) {
        if (t == LM_F32) {
            ((float *)w)[i] = v[i];
        } else if (t == LM_BF16) {
            uint16_t h = lm_f32_to_bf16(v[i]);
            ((uint16_t *)w)[i] = h;
            v[i] = lm_bf16_to_f32(h);
        } else {
            uint16_t h = lm_f32_to_f16(v[i]);
            ((uint16_t *)w)[i] = h;
            v[i] = lm_f16_to_f32(h);
        }
    }
    *deq = v;
    return w;
}

/* |y - ref| <= tol * cond + 1e-6 over [T][O], cond[t][o] given; returns the
 * count of outputs outside. */
static int cu_cmp_cond(const char *what, const float *y, const float *ref, const double *cond, int64_t n, double tol) {
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)y[i] - ref[i]) <= tol * cond[i] + 1e-6)) {
            if (bad < 3) fprintf(stderr, "  %s[%lld]: cuda %.9g cpu %.9g\n", what, (long long)i, y[i], ref[i]);
            bad++;
        }
    return bad;
}

/* sum_i |x[t][i] w[o][i]| for every (t, o). */
static double *cu_cond(const float *x, const float *w, int64_t T, int64_t O, int64_t I) {
    double *c = malloc((size_t)(T * O) * sizeof *c);
    for (int64_t t = 0; t < T; t++)
        for (int64_t o = 0; o < O; o++) {
            double s = 0;
            for (int64_t i = 0; i < I; i++) s += fabs((double)x[t * I + i] * w[o * I + i]);
            c[t * O + o] = s;
        }
    return c;
}

/* Runs one matmul shape on both backends; returns the number of bad outputs.
 * x_bf16: the CPU reference gets x rounded to bf16 (the GPU gets it whole). */
static int cu_matmul_case_x(cu_pair *p, lm_dtype wt, int64_t T, int64_t O, int64_t I, bool with_bias, double tol,
                            uint64_t seed, bool x_bf16) {
    uint64_t s = seed;
    float *wdeq;
    void *wh = cu_weight(wt, O, I, &s, &wdeq);
    float *xh = cu_randv(&s, T * I, 2.0f);
    float *bh = cu_randv(&s, O, 0.5f);
    lm_err e = { { 0 } };
    lm_tensor wc = { .type = wt, .rows = O, .cols = I }, wg = wc;
    LM_ASSERT(p->cpu->ops->upload_weight(p->cpu, &wc, wh, &e) == 0);
    if (p->gpu->ops->upload_weight(p->gpu, &wg, wh, &e) != 0) {
        fprintf(stderr, "  upload: %s\n", e.msg);
        return 1;
    }
    lm_tensor xg = cu_put(p->gpu, xh, T, I);
    if (x_bf16)
        for (int64_t i = 0; i < T * I; i++) xh[i] = lm_bf16_to_f32(lm_f32_to_bf16(xh[i]));
    lm_tensor xc = cu_put(p->cpu, xh, T, I);
    lm_tensor bc = cu_put(p->cpu, bh, 1, O), bg = cu_put(p->gpu, bh, 1, O);
    lm_tensor yc = cu_put(p->cpu, NULL, T, O), yg = cu_put(p->gpu, NULL, T, O);
    p->cpu->ops->matmul(p->cpu, &yc, &xc, &wc, with_bias ? &bc : NULL);
    p->gpu->ops->matmul(p->gpu, &yg, &xg, &wg, with_bias ? &bg : NULL);
    float *a = cu_get(p->gpu, &yg), *b = cu_get(p->cpu, &yc);
    double *cond = cu_cond(xh, wdeq, T, O, I);
    char what[96];
    snprintf(what, sizeof what, "matmul %s T=%lld O=%lld I=%lld bias=%d y", lm_dtype_name(wt), (long long)T,
             (long long)O, (long long)I, with_bias);
    int bad = cu_cmp_cond(what, a, b, cond, T * O, tol);
    free(a);
    free(b);
    free(cond);
    lm_tensor_release(p->cpu, &xc);
    lm_tensor_release(p->gpu, &xg);
    lm_tensor_release(p->cpu, &bc);
    lm_tensor_release(p->gpu, &bg);
    lm_tensor_release(p->cpu, &yc);
    lm_tensor_release(p->gpu, &yg);
    p->gpu->ops->free(p->gpu, wg.data);
    free(wh);
    free(wdeq);
    free(xh);
    free(bh);
    return bad;
}

static int cu_matmul_case(cu_pair *p, lm_dtype wt, int64_t T, int64_t O, int64_t I, bool with_bias, double tol,
                          uint64_t seed) {
    return cu_matmul_case_x(p, wt, T, O, I, with_bias, tol, seed, false);
}

static const lm_dtype cu_wtypes[] = { LM_BF16, LM_F16, LM_F32 };

LM_TEST(cuda_matmul_vs_cpu) {
    CU_SETUP(p);
    static const int64_t Ts[] = { 1, 2, 3, 8, 9, 64, 300 };
    /* (O, I): odd O (block tails), I not a multiple of 8 (element-wise GEMV
     * path), I straddling the thread stride, a model-like shape */
    static const int64_t shapes[][2] = { { 67, 37 }, { 130, 1000 }, { 257, 2056 }, { 512, 4096 } };
    uint64_t seed = 1;
    for (size_t ti = 0; ti < LM_COUNT(Ts); ti++)
        for (size_t si = 0; si < LM_COUNT(shapes); si++)
            for (size_t wi = 0; wi < LM_COUNT(cu_wtypes); wi++)
                for (int bias = 0; bias < 2; bias++) {
                    int64_t T = Ts[ti];
                    lm_dtype wt = cu_wtypes[wi];
                    double tol = (T <= 8 || wt == LM_F32) ? 2e-5 : 1e-4;
                    int bad = cu_matmul_case(&p, wt, T, shapes[si][0], shapes[si][1], bias, tol, seed++);
                    LM_CHECK_MSG(bad == 0, "%d bad outputs: %s T=%lld O=%lld I=%lld bias=%d", bad,
                                 lm_dtype_name(wt), (long long)T, (long long)shapes[si][0],
                                 (long long)shapes[si][1], bias);
                }
    cu_close(&p);
}

/* A weight view at an odd row offset (rows not 16-byte aligned) and large
 * activations (f16 range guard of the split path). */
LM_TEST(cuda_matmul_views_and_range) {
    CU_SETUP(p);
    uint64_t s = 99;
    const int64_t O = 65, I = 100, T = 12; /* bf16/f16: element-wise path; f32: vectorised */
    for (size_t wi = 0; wi < LM_COUNT(cu_wtypes); wi++) {
        lm_dtype wt = cu_wtypes[wi];
        size_t eb = wt == LM_F32 ? 4 : 2;
        float *wdeq;
        void *wh = cu_weight(wt, O, I, &s, &wdeq);
        lm_err e = { { 0 } };
        lm_tensor wfull = { .type = wt, .rows = O, .cols = I };
        LM_REQUIRE(p.gpu->ops->upload_weight(p.gpu, &wfull, wh, &e) == 0);
        /* rows [1, O): the CPU reference gets the same rows in place */
        lm_tensor wg = { .type = wt, .rows = O - 1, .cols = I, .data = (char *)wfull.data + (size_t)I * eb };
        lm_tensor wc = { .type = wt, .rows = O - 1, .cols = I, .data = (char *)wh + (size_t)I * eb };
        for (int big = 0; big < 2; big++) {
            for (int64_t t = 1; t <= T; t += T - 1) {
                float *xh = cu_randv(&s, t * I, big ? 3.0e5f : 1.0f); /* 3e5: beyond f16's 65504 */
                lm_tensor xc = cu_put(p.cpu, xh, t, I), xg = cu_put(p.gpu, xh, t, I);
                lm_tensor yc = cu_put(p.cpu, NULL, t, O - 1), yg = cu_put(p.gpu, NULL, t, O - 1);
                p.cpu->ops->matmul(p.cpu, &yc, &xc, &wc, NULL);
                p.gpu->ops->matmul(p.gpu, &yg, &xg, &wg, NULL);
                float *a = cu_get(p.gpu, &yg), *b = cu_get(p.cpu, &yc);
                double *cond = cu_cond(xh, wdeq + I, t, O - 1, I); /* rows [1, O) */
                int bad = cu_cmp_cond("matmul view", a, b, cond, t * (O - 1), 1e-4);
                LM_CHECK_MSG(bad == 0, "%d bad: %s T=%lld big=%d", bad, lm_dtype_name(wt), (long long)t, big);
                free(a);
                free(b);
                free(cond);
                free(xh);
                lm_tensor_release(p.cpu, &xc);
                lm_tensor_release(p.gpu, &xg);
                lm_tensor_release(p.cpu, &yc);
                lm_tensor_release(p.gpu, &yg);
            }
        }
        p.gpu->ops->free(p.gpu, wfull.data);
        free(wh);
        free(wdeq);
    }
    cu_close(&p);
}

/* bf16 activations (lm_cuda_backend_bf16_act; LUMEN_CUDA_GEMM=bf16 at
 * creation): over bf16 weights every path - GEMV on CUDA cores (1-4
 * tokens), on tensor cores (5-8), cuBLAS above - gives the products of x
 * rounded to bf16, so each matches the CPU fed the rounded x as tightly as
 * the exact mode matches the CPU fed x (a GEMV left unrounded is ~2^-9
 * relative off). f16 weights keep their own f16 split: within 1e-2. */
LM_TEST(cuda_matmul_bf16_mode) {
    CU_SETUP(p);
    LM_CHECK(!lm_cuda_backend_bf16_act(p.gpu, true)); /* exact by default */
    static const int64_t Ts[] = { 1, 3, 5, 8, 9, 64 };
    uint64_t seed = 7;
    for (size_t ti = 0; ti < LM_COUNT(Ts); ti++)
        for (int bias = 0; bias < 2; bias++) {
            int bad = cu_matmul_case_x(&p, LM_BF16, Ts[ti], 130, 1000, bias, 2e-5, seed++, true);
            LM_CHECK_MSG(bad == 0, "%d bad: bf16 weights, T=%lld bias=%d", bad, (long long)Ts[ti], bias);
        }
    int bad = cu_matmul_case(&p, LM_F16, 64, 130, 1000, true, 1e-2, seed++);
    LM_CHECK_MSG(bad == 0, "%d bad (f16)", bad);
    LM_CHECK(lm_cuda_backend_bf16_act(p.gpu, false));
    cu_close(&p);
    /* the variable at creation */
    char why[512];
    LM_REQUIRE(cu_open_with(&p, "LUMEN_CUDA_GEMM", "bf16", why, sizeof why));
    LM_CHECK(lm_cuda_backend_bf16_act(p.gpu, true));
    cu_close(&p);
}

/* A single weight of few tokens whose three-term product does not fit the
 * scratch at once (an output head): products in row chunks of W, bias
 * added by the kernel that sums the terms; T odd leaves the terms unpacked. */
LM_TEST(cuda_matmul_row_chunks) {
    CU_SETUP(p);
    int bad = cu_matmul_case(&p, LM_BF16, 201, 30000, 64, true, 1e-4, 5);
    LM_CHECK_MSG(bad == 0, "%d bad outputs", bad);
    cu_close(&p);
}

/* Weights uploaded as one group (lm_backend_upload_weights) lie back to back
 * on the GPU, and above 8 tokens matmul_n (q, k, v, gate; a bias on k) and
 * matmul_glu (three activations) then run one product over them: against
 * the CPU's separate products, in the default three-term mode and with
 * LUMEN_CUDA_GEMM=bf16. I = 64 with odd T leaves the activation terms
 * unpacked (one product a term) and its odd widths the sums one float at a
 * time. */
LM_TEST(cuda_stacked_products_vs_cpu) {
    char why[512];
    if (!lm_cuda_available(why, sizeof why)) LM_SKIP("%s", why);
    static const int64_t Ts[] = { 9, 40, 201 }, Is[] = { 256, 64 };
    for (int mode = 0; mode < 2; mode++) {
        cu_pair p;
        LM_REQUIRE(mode ? cu_open_with(&p, "LUMEN_CUDA_GEMM", "bf16", why, sizeof why) : cu_open(&p, why, sizeof why));
        const double tol = mode ? 1e-2 : 1e-4;
        uint64_t s = 31;
        for (size_t ii = 0; ii < LM_COUNT(Is); ii++) {
            /* I = 256: widths of 4n (the sums go 4 floats at a time); 64: not */
            const int64_t I = Is[ii], Ok = I == 64 ? 34 : 32, O[4] = { 96, Ok, Ok, 96 }, F = I == 64 ? 162 : 160;
            /* q, k, v, gate; then gate and up of an MLP: host bf16, f32 values */
            void *wh[6];
            float *wd[6];
            const int64_t rows[6] = { O[0], O[1], O[2], O[3], F, F };
            lm_tensor wg[6], wc[6];
            lm_err e = { { 0 } };
            for (int i = 0; i < 6; i++) {
                wh[i] = cu_weight(LM_BF16, rows[i], I, &s, &wd[i]);
                wg[i] = wc[i] = (lm_tensor){ .type = LM_BF16, .rows = rows[i], .cols = I };
                LM_ASSERT(p.cpu->ops->upload_weight(p.cpu, &wc[i], wh[i], &e) == 0);
            }
            LM_REQUIRE(lm_backend_upload_weights(p.gpu, 4, (lm_tensor *const[]){ &wg[0], &wg[1], &wg[2], &wg[3] },
                                                 (const void *const *)wh, &e) == 0);
            LM_REQUIRE(lm_backend_upload_weights(p.gpu, 2, (lm_tensor *const[]){ &wg[4], &wg[5] },
                                                 (const void *const *)wh + 4, &e) == 0);
            for (int i = 1; i < 6; i++)
                if (i != 4)
                    LM_CHECK_MSG((char *)wg[i].data == (char *)wg[i - 1].data + rows[i - 1] * I * 2,
                                 "weight %d of its group is not right after the one before", i);
            for (size_t ti = 0; ti < LM_COUNT(Ts); ti++) {
                const int64_t T = Ts[ti];
                float *xh = cu_randv(&s, T * I, 1.0f), *bh = cu_randv(&s, O[1], 0.5f);
                lm_tensor xc = cu_put(p.cpu, xh, T, I), xg = cu_put(p.gpu, xh, T, I);
                lm_tensor bc = cu_put(p.cpu, bh, 1, O[1]), bg = cu_put(p.gpu, bh, 1, O[1]);
                lm_tensor yg[4], yc[4];
                for (int i = 0; i < 4; i++) yg[i] = cu_put(p.gpu, NULL, T, O[i]), yc[i] = cu_put(p.cpu, NULL, T, O[i]);
                p.gpu->ops->matmul_n(p.gpu, 4, (lm_tensor *const[]){ &yg[0], &yg[1], &yg[2], &yg[3] }, &xg,
                                     (const lm_tensor *const[]){ &wg[0], &wg[1], &wg[2], &wg[3] },
                                     (const lm_tensor *const[]){ NULL, &bg, NULL, NULL });
                for (int i = 0; i < 4; i++) {
                    p.cpu->ops->matmul(p.cpu, &yc[i], &xc, &wc[i], i == 1 ? &bc : NULL);
                    float *a = cu_get(p.gpu, &yg[i]), *b = cu_get(p.cpu, &yc[i]);
                    double *cond = cu_cond(xh, wd[i], T, O[i], I);
                    int bad = cu_cmp_cond("matmul_n", a, b, cond, T * O[i], tol);
                    LM_CHECK_MSG(bad == 0, "matmul_n mode %d T=%lld I=%lld out %d: %d bad", mode, (long long)T,
                                 (long long)I, i, bad);
                    free(a), free(b), free(cond);
                    lm_tensor_release(p.gpu, &yg[i]), lm_tensor_release(p.cpu, &yc[i]);
                }
                double *cg = cu_cond(xh, wd[4], T, F, I), *cu = cu_cond(xh, wd[5], T, F, I);
                for (int act = 0; act < 3; act++) {
                    lm_tensor y = cu_put(p.gpu, NULL, T, F), gw = cu_put(p.gpu, NULL, T, F), uw = cu_put(p.gpu, NULL, T, F);
                    lm_tensor ycpu = cu_put(p.cpu, NULL, T, F), g = cu_put(p.cpu, NULL, T, F), u = cu_put(p.cpu, NULL, T, F);
                    p.gpu->ops->matmul_glu(p.gpu, &y, &xg, &wg[4], &wg[5], (lm_glu)act, &gw, &uw);
                    p.cpu->ops->matmul(p.cpu, &g, &xc, &wc[4], NULL);
                    p.cpu->ops->matmul(p.cpu, &u, &xc, &wc[5], NULL);
                    if (act == LM_GLU_SILU) p.cpu->ops->silu_mul(p.cpu, &ycpu, &g, &u);
                    else p.cpu->ops->gelu_mul(p.cpu, &ycpu, &g, &u, act == LM_GLU_GELU_TANH);
                    /* the error of act(g) u: from g's and u's, each within tol * cond */
                    const float *gv = g.data, *uv = u.data;
                    double *cond = malloc((size_t)(T * F) * sizeof *cond);
                    for (int64_t i = 0; i < T * F; i++)
                        cond[i] = 2 * cg[i] * (fabs((double)uv[i]) + 1) + cu[i] * (fabs((double)gv[i]) + 1);
                    float *a = cu_get(p.gpu, &y);
                    int bad = cu_cmp_cond("matmul_glu", a, ycpu.data, cond, T * F, tol);
                    LM_CHECK_MSG(bad == 0, "matmul_glu act %d mode %d T=%lld I=%lld: %d bad", act, mode, (long long)T,
                                 (long long)I, bad);
                    free(a), free(cond);
                    lm_tensor *all[] = { &y, &gw, &uw };
                    for (size_t i = 0; i < LM_COUNT(all); i++) lm_tensor_release(p.gpu, all[i]);
                    lm_tensor_release(p.cpu, &ycpu), lm_tensor_release(p.cpu, &g), lm_tensor_release(p.cpu, &u);
                }
                free(cg), free(cu), free(xh), free(bh);
                lm_tensor_release(p.cpu, &xc), lm_tensor_release(p.gpu, &xg);
                lm_tensor_release(p.cpu, &bc), lm_tensor_release(p.gpu, &bg);
            }
            p.gpu->ops->free(p.gpu, wg[0].data); /* the group's one allocation */
            p.gpu->ops->free(p.gpu, wg[4].data);
            for (int i = 0; i < 6; i++) free(wh[i]), free(wd[i]);
        }
        cu_close(&p);
    }
}

/* ---- element-wise ----------------------------------------------------------------- */

LM_TEST(cuda_rms_norm_vs_cpu) {
    CU_SETUP(p);
    /* (rows, cols, w width): whole rows, per-head rows, wide rows (block path) */
    static const int64_t shapes[][3] = { { 5, 1000, 1000 }, { 7, 4 * 128, 128 }, { 3, 3000, 3000 }, { 1, 64, 64 } };
    static const float offs[] = { 0.0f, 1.0f };
    uint64_t s = 3;
    for (size_t si = 0; si < LM_COUNT(shapes); si++)
        for (size_t oi = 0; oi < LM_COUNT(offs); oi++) {
            int64_t R = shapes[si][0], C = shapes[si][1], W = shapes[si][2];
            float *xh = cu_randv(&s, R * C, 3.0f), *wh = cu_randv(&s, W, 1.0f);
            lm_tensor xc = cu_put(p.cpu, xh, R, C), xg = cu_put(p.gpu, xh, R, C);
            lm_tensor wc = cu_put(p.cpu, wh, 1, W), wg = cu_put(p.gpu, wh, 1, W);
            lm_tensor yc = cu_put(p.cpu, NULL, R, C), yg = cu_put(p.gpu, NULL, R, C);
            p.cpu->ops->rms_norm(p.cpu, &yc, &xc, &wc, 1e-6f, offs[oi]);
            p.gpu->ops->rms_norm(p.gpu, &yg, &xg, &wg, 1e-6f, offs[oi]);
            float *a = cu_get(p.gpu, &yg), *b = cu_get(p.cpu, &yc);
            LM_CHECK(cu_cmp("rms_norm", a, b, R * C, 2e-6, 1e-6) == 0);
            free(a); free(b); free(xh); free(wh);
            lm_tensor_release(p.cpu, &xc); lm_tensor_release(p.gpu, &xg);
            lm_tensor_release(p.cpu, &wc); lm_tensor_release(p.gpu, &wg);
            lm_tensor_release(p.cpu, &yc); lm_tensor_release(p.gpu, &yg);
        }
    cu_close(&p);
}

LM_TEST(cuda_rope_vs_cpu) {
    CU_SETUP(p);
    uint64_t s = 5;
    const int64_t T = 9;
    const int H = 3, Dh = 64;
    const int64_t cols = H * Dh + 16; /* wider than the heads: the tail must stay untouched */
    int32_t pos[9] = { 0, 1, 2, 17, 255, 1000, 4095, 30000, 131071 };
    static const int rots[] = { 64, 32 };
    for (int inter = 0; inter < 2; inter++)
        for (size_t ri = 0; ri < LM_COUNT(rots); ri++) {
            int rot = rots[ri];
            float inv[32];
            for (int i = 0; i < rot / 2; i++) inv[i] = powf(10000.0f, -2.0f * (float)i / (float)rot);
            lm_rope_params rp = { .n_heads = H, .head_dim = Dh, .rot_dim = rot, .interleaved = inter != 0,
                                  .inv_freq = inv, .attn_factor = inter ? 1.0f : 1.25f };
            float *xh = cu_randv(&s, T * cols, 2.0f);
            lm_tensor xc = cu_put(p.cpu, xh, T, cols), xg = cu_put(p.gpu, xh, T, cols);
            p.cpu->ops->rope(p.cpu, &xc, pos, &rp);
            p.gpu->ops->rope(p.gpu, &xg, pos, &rp);
            float *a = cu_get(p.gpu, &xg), *b = cu_get(p.cpu, &xc);
            LM_CHECK(cu_cmp("rope", a, b, T * cols, 2e-6, 1e-6) == 0);
            free(a); free(b); free(xh);
            lm_tensor_release(p.cpu, &xc); lm_tensor_release(p.gpu, &xg);
        }
    cu_close(&p);
}

/* silu_mul, gelu_mul (both forms), add, scale, softcap, sigmoid_mul (both
 * gate shapes) on one odd shape. */
LM_TEST(cuda_elementwise_vs_cpu) {
    CU_SETUP(p);
    uint64_t s = 11;
    const int64_t R = 7, C = 1001;
    float *gh = cu_randv(&s, R * C, 6.0f), *uh = cu_randv(&s, R * C, 2.0f), *g1 = cu_randv(&s, R, 4.0f);
    lm_tensor gc = cu_put(p.cpu, gh, R, C), gg = cu_put(p.gpu, gh, R, C);
    lm_tensor uc = cu_put(p.cpu, uh, R, C), ug = cu_put(p.gpu, uh, R, C);
    lm_tensor g1c = cu_put(p.cpu, g1, R, 1), g1g = cu_put(p.gpu, g1, R, 1);
    for (int op = 0; op < 8; op++) {
        lm_tensor yc = cu_put(p.cpu, op >= 3 && op <= 5 ? uh : NULL, R, C);
        lm_tensor yg = cu_put(p.gpu, op >= 3 && op <= 5 ? uh : NULL, R, C);
        double rel = 2e-6;
        const char *name = "";
        switch (op) {
        case 0: name = "silu_mul"; rel = 1e-5;
            p.cpu->ops->silu_mul(p.cpu, &yc, &gc, &uc); p.gpu->ops->silu_mul(p.gpu, &yg, &gg, &ug); break;
        case 1: name = "gelu_mul tanh";
            p.cpu->ops->gelu_mul(p.cpu, &yc, &gc, &uc, true); p.gpu->ops->gelu_mul(p.gpu, &yg, &gg, &ug, true); break;
        case 2: name = "gelu_mul erf";
            p.cpu->ops->gelu_mul(p.cpu, &yc, &gc, &uc, false); p.gpu->ops->gelu_mul(p.gpu, &yg, &gg, &ug, false); break;
        case 3: name = "add"; rel = 0;
            p.cpu->ops->add(p.cpu, &yc, &gc); p.gpu->ops->add(p.gpu, &yg, &gg); break;
        case 4: name = "scale"; rel = 0;
            p.cpu->ops->scale(p.cpu, &yc, -0.37f); p.gpu->ops->scale(p.gpu, &yg, -0.37f); break;
        case 5: name = "softcap";
            p.cpu->ops->softcap(p.cpu, &yc, 1.5f); p.gpu->ops->softcap(p.gpu, &yg, 1.5f); break;
        case 6: name = "sigmoid_mul"; rel = 1e-5;
            p.cpu->ops->sigmoid_mul(p.cpu, &yc, &uc, &gc); p.gpu->ops->sigmoid_mul(p.gpu, &yg, &ug, &gg); break;
        case 7: name = "sigmoid_mul row gate"; rel = 1e-5;
            p.cpu->ops->sigmoid_mul(p.cpu, &yc, &uc, &g1c); p.gpu->ops->sigmoid_mul(p.gpu, &yg, &ug, &g1g); break;
        }
        float *a = cu_get(p.gpu, &yg), *b = cu_get(p.cpu, &yc);
        int bad = cu_cmp(name, a, b, R * C, rel, rel ? 1e-6 : 0);
        LM_CHECK_MSG(bad == 0, "%s: %d bad", name, bad);
        free(a); free(b);
        lm_tensor_release(p.cpu, &yc); lm_tensor_release(p.gpu, &yg);
    }
    /* sigmoid_mul in place (y is x) */
    lm_tensor xc = cu_put(p.cpu, uh, R, C), xg = cu_put(p.gpu, uh, R, C);
    p.cpu->ops->sigmoid_mul(p.cpu, &xc, &xc, &gc);
    p.gpu->ops->sigmoid_mul(p.gpu, &xg, &xg, &gg);
    float *a = cu_get(p.gpu, &xg), *b = cu_get(p.cpu, &xc);
    LM_CHECK(cu_cmp("sigmoid_mul in place", a, b, R * C, 1e-5, 1e-6) == 0);
    free(a); free(b);
    lm_tensor_release(p.cpu, &xc); lm_tensor_release(p.gpu, &xg);
    lm_tensor_release(p.cpu, &gc); lm_tensor_release(p.gpu, &gg);
    lm_tensor_release(p.cpu, &uc); lm_tensor_release(p.gpu, &ug);
    lm_tensor_release(p.cpu, &g1c); lm_tensor_release(p.gpu, &g1g);
    free(gh); free(uh); free(g1);
    cu_close(&p);
}

LM_TEST(cuda_rows_vs_cpu) {
    CU_SETUP(p);
    uint64_t s = 13;
    const int64_t V = 50, C = 37, T = 11;
    int32_t ids[11] = { 0, 49, 3, 3, 17, 48, 1, 25, 0, 30, 12 };
    for (size_t wi = 0; wi < LM_COUNT(cu_wtypes); wi++) {
        lm_dtype wt = cu_wtypes[wi];
        float *deq;
        void *th = cu_weight(wt, V, C, &s, &deq);
        lm_err e = { { 0 } };
        lm_tensor tc = { .type = wt, .rows = V, .cols = C }, tg = tc;
        LM_REQUIRE(p.cpu->ops->upload_weight(p.cpu, &tc, th, &e) == 0);
        LM_REQUIRE(p.gpu->ops->upload_weight(p.gpu, &tg, th, &e) == 0);
        lm_tensor yc = cu_put(p.cpu, NULL, T, C), yg = cu_put(p.gpu, NULL, T, C);
        p.cpu->ops->get_rows(p.cpu, &yc, &tc, ids);
        p.gpu->ops->get_rows(p.gpu, &yg, &tg, ids);
        float *a = cu_get(p.gpu, &yg), *b = cu_get(p.cpu, &yc);
        LM_CHECK_MSG(memcmp(a, b, (size_t)(T * C) * sizeof(float)) == 0, "get_rows %s", lm_dtype_name(wt));
        free(a); free(b); free(th); free(deq);
        lm_tensor_release(p.cpu, &yc); lm_tensor_release(p.gpu, &yg);
    }
    /* gather_rows: n < y->rows; rows past n are left alone (poison stays) */
    float *xh = cu_randv(&s, V * C, 1.0f);
    lm_tensor xc = cu_put(p.cpu, xh, V, C), xg = cu_put(p.gpu, xh, V, C);
    lm_tensor yc = cu_put(p.cpu, NULL, T, C), yg = cu_put(p.gpu, NULL, T, C);
    int n = 7;
    p.cpu->ops->gather_rows(p.cpu, &yc, &xc, ids, n);
    p.gpu->ops->gather_rows(p.gpu, &yg, &xg, ids, n);
    float *a = cu_get(p.gpu, &yg), *b = cu_get(p.cpu, &yc);
    LM_CHECK(memcmp(a, b, (size_t)(n * C) * sizeof(float)) == 0);
    LM_CHECK(isnan(a[n * C]) && isnan(a[T * C - 1]));
    free(a); free(b);
    lm_tensor_release(p.cpu, &yc); lm_tensor_release(p.gpu, &yg);
    /* copy_cols: a block from the middle of each row */
    lm_tensor zc = cu_put(p.cpu, NULL, V, 13), zg = cu_put(p.gpu, NULL, V, 13);
    p.cpu->ops->copy_cols(p.cpu, &zc, &xc, 5);
    p.gpu->ops->copy_cols(p.gpu, &zg, &xg, 5);
    a = cu_get(p.gpu, &zg);
    b = cu_get(p.cpu, &zc);
    LM_CHECK(memcmp(a, b, (size_t)(V * 13) * sizeof(float)) == 0);
    free(a); free(b);
    lm_tensor_release(p.cpu, &zc); lm_tensor_release(p.gpu, &zg);
    /* clear and copy (also overlapping, memmove semantics) */
    lm_tensor w1 = cu_put(p.gpu, xh, V, C);
    p.gpu->ops->copy(p.gpu, (float *)w1.data + 3, w1.data, (size_t)(V * C - 3) * sizeof(float));
    a = cu_get(p.gpu, &w1);
    LM_CHECK(memcmp(a + 3, xh, (size_t)(V * C - 3) * sizeof(float)) == 0);
    free(a);
    p.gpu->ops->clear(p.gpu, w1.data, (size_t)(V * C) * sizeof(float));
    a = cu_get(p.gpu, &w1);
    int nz = 0;
    for (int64_t i = 0; i < V * C; i++) nz += a[i] != 0.0f;
    LM_CHECK(nz == 0);
    free(a);
    lm_tensor_release(p.gpu, &w1);
    lm_tensor_release(p.cpu, &xc); lm_tensor_release(p.gpu, &xg);
    free(xh);
    cu_close(&p);
}

/* Many staged ops in a row before one read: the staging ring (64 MiB) wraps
 * several times, and one request larger than a quarter of it makes it grow;
 * every op must still see its own ids. */
LM_TEST(cuda_staging_ring_wraps) {
    CU_SETUP(p);
    const int64_t V = 1000;
    float *th = malloc((size_t)V * sizeof *th);
    for (int64_t i = 0; i < V; i++) th[i] = (float)i + 0.5f;
    lm_tensor tg = cu_put(p.gpu, th, V, 1);
    const int64_t per = (int64_t)1 << 18; /* 1 MiB of ids per op */
    const int n_ops = 200;                /* 200 MiB staged: ~3 laps */
    const int64_t big = (int64_t)1 << 23; /* 32 MiB in one request: grows the ring */
    int32_t *ids = malloc((size_t)big * sizeof *ids);
    lm_tensor yg = cu_put(p.gpu, NULL, per * n_ops, 1), bg = cu_put(p.gpu, NULL, big, 1);
    for (int k = 0; k < n_ops; k++) {
        for (int64_t i = 0; i < per; i++) ids[i] = (int32_t)((i * 7 + k * 13) % V);
        lm_tensor yk = lm_tensor_rows(&yg, k * per, per);
        p.gpu->ops->get_rows(p.gpu, &yk, &tg, ids);
        if (k == n_ops / 2) {
            for (int64_t i = 0; i < big; i++) ids[i] = (int32_t)((i * 3 + 1) % V);
            p.gpu->ops->get_rows(p.gpu, &bg, &tg, ids);
        }
    }
    float *a = cu_get(p.gpu, &yg);
    int bad = 0;
    for (int k = 0; k < n_ops; k++)
        for (int64_t i = 0; i < per; i++) bad += a[k * per + i] != th[(i * 7 + k * 13) % V];
    LM_CHECK_MSG(bad == 0, "%d wrong rows after the ring wrapped", bad);
    free(a);
    a = cu_get(p.gpu, &bg);
    bad = 0;
    for (int64_t i = 0; i < big; i++) bad += a[i] != th[(i * 3 + 1) % V];
    LM_CHECK_MSG(bad == 0, "%d wrong rows in the request that grew the ring", bad);
    free(a);
    free(ids);
    free(th);
    lm_tensor_release(p.gpu, &yg);
    lm_tensor_release(p.gpu, &bg);
    lm_tensor_release(p.gpu, &tg);
    cu_close(&p);
}

/* ---- argmax of rows ---------------------------------------------------------- */

/* Rows that test lm_argmax's contract: random values, ties (the first wins),
 * NaN in the middle (never wins), NaN first (0), all -inf (0), the maximum
 * at the end, a row narrower than the block. */
LM_TEST(cuda_argmax_rows_vs_cpu) {
    CU_SETUP(p);
    const int64_t R = 9, V = 151937;
    float *x = malloc((size_t)(R * V) * sizeof *x);
    uint64_t st = 0x5eed;
    for (int64_t i = 0; i < R * V; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((st >> 40) % 100000) * 1e-3f - 50.0f;
    }
    float *r1 = x + V, *r2 = x + 2 * V, *r3 = x + 3 * V, *r4 = x + 4 * V, *r5 = x + 5 * V;
    r1[70000] = r1[3] = r1[150000] = 1000.0f;         /* tie: 3 wins */
    r2[10] = NAN, r2[20] = 2000.0f, r2[30] = NAN;     /* NaN never wins */
    r3[0] = NAN, r3[5] = 3000.0f;                     /* NaN first: 0 */
    for (int64_t i = 0; i < V; i++) r4[i] = -INFINITY; /* nothing beats x[0]: 0 */
    r5[V - 1] = 5000.0f;
    int32_t want[9], got[9];
    for (int64_t r = 0; r < R; r++) want[r] = lm_argmax(x + r * V, (int)V);
    LM_CHECK(want[1] == 3 && want[2] == 20 && want[3] == 0 && want[4] == 0 && want[5] == V - 1);
    lm_tensor t = cu_put(p.gpu, x, R, V);
    p.gpu->ops->argmax_rows(p.gpu, got, &t);
    for (int64_t r = 0; r < R; r++) LM_CHECK_MSG(got[r] == want[r], "row %lld: cuda %d, cpu %d", (long long)r, got[r], want[r]);
    lm_tensor narrow = cu_put(p.gpu, x, R * V / 7, 7); /* 7-wide rows */
    int32_t *g2 = malloc((size_t)(R * V / 7) * sizeof *g2);
    p.gpu->ops->argmax_rows(p.gpu, g2, &narrow);
    int bad = 0;
    for (int64_t r = 0; r < R * V / 7; r++) bad += g2[r] != lm_argmax(x + r * 7, 7);
    LM_CHECK(bad == 0);
    free(g2);
    lm_tensor_release(p.gpu, &narrow);
    lm_tensor_release(p.gpu, &t);
    free(x);
    cu_close(&p);
}

/* The argmax under grammar masks: each masked row as lm_argmax_masked
 * (ties, NaN, -inf, -0, a row nothing is allowed in, a word's last bits,
 * a mask allowing everything, one id), unmasked rows as lm_argmax (a NaN at
 * 0 still gives 0), the ids on the host after argmax_wait and kept for
 * get_rows_argmax. */
LM_TEST(cuda_argmax_rows_masked_vs_cpu) {
    CU_SETUP(p);
    const int64_t R = 10, V = 151937, W = (V + 31) / 32;
    float *x = malloc((size_t)(R * V) * sizeof *x);
    uint32_t *mk = malloc((size_t)(R * W) * sizeof *mk);
    uint64_t st = 0x5eed;
    for (int64_t i = 0; i < R * V; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((st >> 40) % 100000) * 1e-3f - 50.0f;
    }
    for (int64_t i = 0; i < R * W; i++) { /* about one id in 8 allowed */
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        mk[i] = (uint32_t)(st >> 32) & (uint32_t)(st >> 16) & (uint32_t)(st >> 8);
    }
    uint8_t masked[10] = { 1, 1, 1, 1, 1, 1, 0, 1, 1, 0 };
    float *row[10];
    uint32_t *m[10];
    for (int r = 0; r < R; r++) row[r] = x + r * V, m[r] = mk + r * W;
#define ALLOW(r, v) (m[r][(v) / 32] |= 1u << ((v) % 32))
#define REFUSE(r, v) (m[r][(v) / 32] &= ~(1u << ((v) % 32)))
    row[1][70001] = row[1][35] = 1000.0f, ALLOW(1, 70001), ALLOW(1, 35); /* tie: 35 wins */
    row[1][7] = 2000.0f, REFUSE(1, 7);                                  /* refused, larger */
    memset(m[2], 0, (size_t)W * 4);                                      /* all NaN/-inf but for refused ids */
    ALLOW(2, 9), ALLOW(2, 40), ALLOW(2, 41);
    row[2][9] = NAN, row[2][40] = -INFINITY, row[2][41] = NAN;           /* -inf above NaN: 40 */
    memset(m[3], 0, (size_t)W * 4);                                      /* nothing allowed: 0 */
    for (int64_t v = 0; v < W; v++) m[4][v] = ~0u;                       /* everything, last id largest */
    row[4][V - 1] = 9000.0f, row[4][0] = NAN;                            /* NaN at 0 does not win here */
    memset(m[5], 0, (size_t)W * 4);
    ALLOW(5, V - 2), ALLOW(5, 100), row[5][100] = -0.0f, row[5][V - 2] = 0.0f; /* -0 == 0: 100 */
    row[6][0] = NAN, row[6][77] = 8000.0f; /* unmasked: lm_argmax's 0 */
    memset(m[7], 0, (size_t)W * 4), ALLOW(7, 123456);                    /* one id */
    int32_t want[10], got[10];
    for (int r = 0; r < R; r++)
        want[r] = masked[r] ? lm_argmax_masked(row[r], (int)V, m[r]) : lm_argmax(row[r], (int)V);
    LM_CHECK(want[1] == 35 && want[2] == 40 && want[3] == 0 && want[4] == V - 1 && want[5] == 100 && want[6] == 0 &&
             want[7] == 123456);
    lm_tensor t = cu_put(p.gpu, x, R, V);
    LM_REQUIRE(p.gpu->ops->argmax_rows_masked_later);
    p.gpu->ops->argmax_rows_masked_later(p.gpu, got, &t, mk, masked);
    memset(mk, 0, (size_t)(R * W) * 4); /* copied before it returned */
    p.gpu->ops->argmax_wait(p.gpu);
    for (int r = 0; r < R; r++) LM_CHECK_MSG(got[r] == want[r], "row %d: cuda %d, cpu %d", r, got[r], want[r]);
    /* the ids stay on the device for the next forward's embedding */
    float *tab = malloc((size_t)V * 4 * sizeof *tab);
    for (int64_t i = 0; i < V * 4; i++) tab[i] = (float)i;
    lm_tensor table = cu_put(p.gpu, tab, V, 4), y = cu_put(p.gpu, tab, R, 4);
    p.gpu->ops->get_rows_argmax(p.gpu, &y, &table);
    float yh[40];
    p.gpu->ops->read(p.gpu, yh, y.data, sizeof yh);
    for (int r = 0; r < R; r++) LM_CHECK_MSG(yh[4 * r + 1] == (float)(4 * want[r] + 1), "row %d embedded", r);
#undef ALLOW
#undef REFUSE
    lm_tensor_release(p.gpu, &y);
    lm_tensor_release(p.gpu, &table);
    lm_tensor_release(p.gpu, &t);
    free(tab), free(mk), free(x);
    cu_close(&p);
}

/* ---- fused matmul forms ---------------------------------------------------------- */

/* Max |a - b| / (|b| + 1e-30) over n values, and whether they are bitwise equal. */
/* max |a - b| / max |b| */
static double cu_scaled_max(const float *a, const float *b, int64_t n) {
    double d = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (!(e <= d)) d = isnan(e) ? INFINITY : e;
        m = fabs((double)b[i]) > m ? fabs((double)b[i]) : m;
    }
    return m > 0 ? d / m : d;
}

static double cu_relmax(const float *a, const float *b, int64_t n, bool *same) {
    double m = 0;
    *same = memcmp(a, b, (size_t)n * sizeof *a) == 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / (fabs((double)b[i]) + 1e-30);
        if (!(d <= m)) m = isnan(d) ? INFINITY : d;
    }
    return m;
}

static lm_tensor cu_gpu_weight(cu_pair *p, lm_dtype wt, int64_t O, int64_t I, uint64_t *s) {
    float *deq;
    void *wh = cu_weight(wt, O, I, s, &deq);
    lm_err e = { { 0 } };
    lm_tensor w = { .type = wt, .rows = O, .cols = I };
    LM_ASSERT(p->gpu->ops->upload_weight(p->gpu, &w, wh, &e) == 0);
    free(wh);
    free(deq);
    return w;
}

/* matmul_add of x by w into a copy of y0, with the norm of the new rows
 * (weights nw + off) when nw, against matmul + add + rms_norm. Returns the
 * worst relative difference; *same: every output bitwise equal. */
static double cu_matmul_add_vs_composed(lm_backend *g, const lm_tensor *x, const lm_tensor *w, const float *y0,
                                        const lm_tensor *nw, float off, bool *same) {
    const struct lm_backend_ops *op = g->ops;
    const int64_t T = x->rows, O = w->rows;
    lm_tensor yf = cu_put(g, y0, T, O), yc = cu_put(g, y0, T, O), ws = cu_put(g, NULL, T, O);
    lm_tensor nf = cu_put(g, NULL, T, O), nc = cu_put(g, NULL, T, O);
    const lm_norm_out norm = { &nf, nw, 1e-6f, off };
    op->matmul_add(g, &yf, x, w, &ws, nw ? &norm : NULL);
    op->matmul(g, &ws, x, w, NULL);
    op->add(g, &yc, &ws);
    if (nw) op->rms_norm(g, &nc, &yc, nw, 1e-6f, off);
    double worst = 0;
    *same = true;
    for (int k = 0; k < (nw ? 2 : 1); k++) {
        float *f = cu_get(g, k ? &nf : &yf), *u = cu_get(g, k ? &nc : &yc);
        bool sm;
        double r = cu_relmax(f, u, T * O, &sm);
        worst = r > worst ? r : worst;
        *same = *same && sm;
        free(f), free(u);
    }
    lm_tensor *all[] = { &yf, &yc, &ws, &nf, &nc };
    for (size_t i = 0; i < LM_COUNT(all); i++) lm_tensor_release(g, all[i]);
    return worst;
}

/* matmul_n (q, k, v and a gate sharing x; a bias on one), matmul_glu (silu
 * and both gelus) and matmul_add (alone and with the norm that follows it)
 * against the plain ops they stand for, on the GPU: the fused GEMV (T <= 8,
 * bf16/f16 with 16-byte rows) and the fallbacks (larger T, f32 weights, I not
 * a multiple of 8). Rows per block are 4, so the odd widths leave partial
 * blocks. The fused norm sums in the rms_norm kernel's order for rows over
 * 1024 wide (bitwise equal there); narrower rows take that op's one-warp
 * kernel, whose order differs. Above 8 tokens, weights that happen to lie
 * back to back (separate uploads can) take one stacked product, whose
 * cuBLAS kernel may add in another order: there matmul_n and matmul_glu
 * are held to 1e-6 of their output's largest magnitude instead. */
LM_TEST(cuda_fused_matmuls_equal_composed) {
    CU_SETUP(p);
    lm_backend *g = p.gpu;
    const struct lm_backend_ops *op = g->ops;
    LM_REQUIRE(op->matmul_n && op->matmul_glu && op->matmul_add);
    static const int64_t Ts[] = { 1, 3, 8, 9, 40 }, Is[] = { 256, 100 };
    uint64_t s = 77;
    int cases = 0, bitwise = 0;
    double worst = 0;
    for (size_t ti = 0; ti < LM_COUNT(Ts); ti++)
        for (size_t ii = 0; ii < LM_COUNT(Is); ii++)
            for (size_t wi = 0; wi < LM_COUNT(cu_wtypes); wi++) {
                const int64_t T = Ts[ti], I = Is[ii], Oq = 96, Ok = 33, F = 201, Ow = 1536;
                const lm_dtype wt = cu_wtypes[wi];
                lm_tensor wq = cu_gpu_weight(&p, wt, Oq, I, &s), wk = cu_gpu_weight(&p, wt, Ok, I, &s);
                lm_tensor wv = cu_gpu_weight(&p, wt, Ok, I, &s), wg = cu_gpu_weight(&p, wt, F, I, &s);
                lm_tensor wu = cu_gpu_weight(&p, wt, F, I, &s), wd = cu_gpu_weight(&p, wt, Oq, F, &s);
                lm_tensor wz = cu_gpu_weight(&p, wt, Oq, I, &s), wo = cu_gpu_weight(&p, wt, Ow, I, &s);
                float *xh = cu_randv(&s, T * I, 1.0f), *bh = cu_randv(&s, Ok, 0.5f), *rh = cu_randv(&s, T * Oq, 1.0f);
                float *ah = cu_randv(&s, T * F, 1.0f), *rwh = cu_randv(&s, T * Ow, 1.0f);
                float *nqh = cu_randv(&s, Oq, 1.0f), *nwh = cu_randv(&s, Ow, 1.0f);
                lm_tensor x = cu_put(g, xh, T, I), bk = cu_put(g, bh, 1, Ok), a = cu_put(g, ah, T, F);
                lm_tensor nq = cu_put(g, nqh, 1, Oq), nw = cu_put(g, nwh, 1, Ow);
                /* matmul_n vs four matmuls */
                lm_tensor y1[4] = { cu_put(g, NULL, T, Oq), cu_put(g, NULL, T, Ok), cu_put(g, NULL, T, Ok),
                                    cu_put(g, NULL, T, Oq) };
                lm_tensor y2[4] = { cu_put(g, NULL, T, Oq), cu_put(g, NULL, T, Ok), cu_put(g, NULL, T, Ok),
                                    cu_put(g, NULL, T, Oq) };
                lm_tensor *ys[4] = { &y1[0], &y1[1], &y1[2], &y1[3] };
                const lm_tensor *ws[4] = { &wq, &wk, &wv, &wz }, *bs[4] = { NULL, &bk, NULL, NULL };
                op->matmul_n(g, 4, ys, &x, ws, bs);
                for (int i = 0; i < 4; i++) op->matmul(g, &y2[i], &x, ws[i], bs[i]);
                for (int i = 0; i < 4; i++) {
                    float *f = cu_get(g, &y1[i]), *u = cu_get(g, &y2[i]);
                    bool same;
                    double r = cu_relmax(f, u, y1[i].rows * y1[i].cols, &same);
                    if (T > 8) r = cu_scaled_max(f, u, y1[i].rows * y1[i].cols);
                    worst = r > worst ? r : worst;
                    bitwise += same, cases++;
                    LM_CHECK_MSG(r <= 1e-6, "matmul_n %s T=%lld I=%lld out %d: rel %.3g", lm_dtype_name(wt),
                                 (long long)T, (long long)I, i, r);
                    free(f), free(u);
                }
                /* matmul_glu vs matmul, matmul, act_mul */
                for (int act = 0; act < 3; act++) {
                    lm_tensor yf = cu_put(g, NULL, T, F), yc = cu_put(g, NULL, T, F);
                    lm_tensor gw = cu_put(g, NULL, T, F), uw = cu_put(g, NULL, T, F);
                    op->matmul_glu(g, &yf, &x, &wg, &wu, (lm_glu)act, &gw, &uw);
                    op->matmul(g, &gw, &x, &wg, NULL);
                    op->matmul(g, &uw, &x, &wu, NULL);
                    if (act == LM_GLU_SILU) op->silu_mul(g, &yc, &gw, &uw);
                    else op->gelu_mul(g, &yc, &gw, &uw, act == LM_GLU_GELU_TANH);
                    float *f = cu_get(g, &yf), *u = cu_get(g, &yc);
                    bool same;
                    double r = cu_relmax(f, u, T * F, &same);
                    if (T > 8) r = cu_scaled_max(f, u, T * F);
                    worst = r > worst ? r : worst;
                    bitwise += same, cases++;
                    LM_CHECK_MSG(r <= 1e-6, "matmul_glu act %d %s T=%lld I=%lld: rel %.3g", act, lm_dtype_name(wt),
                                 (long long)T, (long long)I, r);
                    free(f), free(u);
                    lm_tensor_release(g, &yf), lm_tensor_release(g, &yc), lm_tensor_release(g, &gw),
                        lm_tensor_release(g, &uw);
                }
                /* matmul_add vs matmul + add (+ rms_norm): a down projection
                 * (narrow rows, Qwen3.5's w + 1 norm) and a wide one */
                for (int k = 0; k < 4; k++) {
                    const bool wide = k >= 2, with_norm = k != 0;
                    bool same;
                    double r = cu_matmul_add_vs_composed(g, wide ? &x : &a, wide ? &wo : &wd, wide ? rwh : rh,
                                                         !with_norm ? NULL : wide ? &nw : &nq, k == 1 ? 1.0f : 0.0f,
                                                         &same);
                    worst = r > worst ? r : worst;
                    bitwise += same, cases++;
                    LM_CHECK_MSG(r <= 1e-6, "matmul_add case %d %s T=%lld I=%lld: rel %.3g", k, lm_dtype_name(wt),
                                 (long long)T, (long long)I, r);
                    if (wide) LM_CHECK_MSG(same, "matmul_add case %d %s T=%lld I=%lld: not bitwise equal", k,
                                           lm_dtype_name(wt), (long long)T, (long long)I);
                }
                for (int i = 0; i < 4; i++) lm_tensor_release(g, &y1[i]), lm_tensor_release(g, &y2[i]);
                lm_tensor_release(g, &x), lm_tensor_release(g, &bk), lm_tensor_release(g, &a);
                lm_tensor_release(g, &nq), lm_tensor_release(g, &nw);
                lm_tensor *wall[] = { &wq, &wk, &wv, &wg, &wu, &wd, &wz, &wo };
                for (size_t i = 0; i < LM_COUNT(wall); i++) g->ops->free(g, wall[i]->data);
                free(xh), free(bh), free(rh), free(ah), free(rwh), free(nqh), free(nwh);
            }
    printf("  fused vs composed: %d cases, %d bitwise equal, worst relative difference %.3g\n", cases, bitwise, worst);
    cu_close(&p);
}

/* The default GEMV (CUDA cores) gives a token the same bits whether it
 * runs alone or with others (what greedy batched == solo rests on): each
 * row of x alone (T = 1) and in steps of 3 and 8 rows, bitwise, over a
 * bf16 weight with rows wide enough for several warps and a narrow odd
 * one. The opt-in tensor-core tiles from 5 tokens fail it (they are
 * opt-in for that). */
LM_TEST(cuda_gemv_rows_same_bits_at_every_t) {
    CU_SETUP(p);
    lm_backend *g = p.gpu;
    static const int64_t shapes[][2] = { { 131, 4104 }, { 48, 264 } };
    static const int64_t Ts[] = { 1, 3, 8 };
    uint64_t seed = 71;
    for (size_t si = 0; si < LM_COUNT(shapes); si++) {
        const int64_t O = shapes[si][0], I = shapes[si][1];
        lm_tensor w = cu_gpu_weight(&p, LM_BF16, O, I, &seed);
        float *xh = cu_randv(&seed, 8 * I, 1.5f);
        float *rows[LM_COUNT(Ts)]; /* [ti]: the 8 rows' outputs in steps of Ts[ti] */
        for (size_t ti = 0; ti < LM_COUNT(Ts); ti++) {
            const int64_t T = Ts[ti];
            rows[ti] = malloc((size_t)(8 * O) * sizeof(float));
            for (int64_t r0 = 0; r0 < 8; r0 += T) { /* rows r0 .. r0 + T - 1 as one step */
                const int64_t n = LM_MIN(T, 8 - r0);
                lm_tensor x = cu_put(g, xh + r0 * I, n, I), y = cu_put(g, NULL, n, O);
                g->ops->matmul(g, &y, &x, &w, NULL);
                float *got = cu_get(g, &y);
                memcpy(rows[ti] + r0 * O, got, (size_t)(n * O) * sizeof(float));
                free(got);
                lm_tensor_release(g, &x), lm_tensor_release(g, &y);
            }
        }
        for (size_t ti = 1; ti < LM_COUNT(Ts); ti++)
            LM_CHECK_MSG(!memcmp(rows[0], rows[ti], (size_t)(8 * O) * sizeof(float)),
                         "GEMV O=%lld I=%lld: rows in steps of %lld differ from each row alone", (long long)O,
                         (long long)I, (long long)Ts[ti]);
        for (size_t ti = 0; ti < LM_COUNT(Ts); ti++) free(rows[ti]);
        g->ops->free(g, w.data);
        free(xh);
    }
    cu_close(&p);
}

/* LUMEN_CUDA_GEMV_TC=1: GEMVs of 5-8 tokens over bf16 rows on tensor cores
 * (16-row tiles, x in three bf16 terms), against the CPU at the CUDA-core
 * GEMV's tolerance, and the fused forms against the plain ops bitwise
 * (fewer tokens stay on CUDA cores: 2 is checked too). */
LM_TEST(cuda_gemv_tensor_cores) {
    char why_[512];
    if (!lm_cuda_available(why_, sizeof why_)) LM_SKIP("%s", why_);
    cu_pair p;
    LM_REQUIRE(cu_open_with(&p, "LUMEN_CUDA_GEMV_TC", "1", why_, sizeof why_));
    static const int64_t Ts[] = { 2, 5, 6, 8 };
    static const int64_t shapes[][2] = { { 67, 264 }, { 130, 1000 }, { 257, 2056 }, { 512, 4096 } };
    uint64_t seed = 501;
    for (size_t ti = 0; ti < LM_COUNT(Ts); ti++)
        for (size_t si = 0; si < LM_COUNT(shapes); si++)
            for (int bias = 0; bias < 2; bias++) {
                const int64_t T = Ts[ti], O = shapes[si][0], I = shapes[si][1];
                int bad = cu_matmul_case(&p, LM_BF16, T, O, I, bias, 2e-5, seed++);
                LM_CHECK_MSG(bad == 0, "%d bad outputs: T=%lld O=%lld I=%lld bias=%d", bad, (long long)T, (long long)O,
                             (long long)I, bias);
            }
    /* fused q/k/v-like and gate/up forms against the plain matmul on the same tiles */
    lm_backend *g = p.gpu;
    for (size_t ti = 0; ti < LM_COUNT(Ts); ti++) {
        const int64_t T = Ts[ti], I = 512, Oq = 96, Ok = 33, F = 201;
        lm_tensor wq = cu_gpu_weight(&p, LM_BF16, Oq, I, &seed), wk = cu_gpu_weight(&p, LM_BF16, Ok, I, &seed);
        lm_tensor wu = cu_gpu_weight(&p, LM_BF16, F, I, &seed), wg = cu_gpu_weight(&p, LM_BF16, F, I, &seed);
        float *xh = cu_randv(&seed, T * I, 1.0f);
        lm_tensor x = cu_put(g, xh, T, I);
        lm_tensor yq = cu_put(g, NULL, T, Oq), yk = cu_put(g, NULL, T, Ok), zq = cu_put(g, NULL, T, Oq),
                  zk = cu_put(g, NULL, T, Ok);
        lm_tensor *ys[2] = { &yq, &yk };
        const lm_tensor *ws[2] = { &wq, &wk };
        g->ops->matmul_n(g, 2, ys, &x, ws, NULL);
        g->ops->matmul(g, &zq, &x, &wq, NULL);
        g->ops->matmul(g, &zk, &x, &wk, NULL);
        lm_tensor yf = cu_put(g, NULL, T, F), yc = cu_put(g, NULL, T, F), gw = cu_put(g, NULL, T, F),
                  uw = cu_put(g, NULL, T, F);
        g->ops->matmul_glu(g, &yf, &x, &wg, &wu, LM_GLU_SILU, &gw, &uw);
        g->ops->matmul(g, &gw, &x, &wg, NULL);
        g->ops->matmul(g, &uw, &x, &wu, NULL);
        g->ops->silu_mul(g, &yc, &gw, &uw);
        const lm_tensor *got[] = { &yq, &yk, &yf }, *want[] = { &zq, &zk, &yc };
        for (int i = 0; i < 3; i++) {
            float *a = cu_get(g, got[i]), *b = cu_get(g, want[i]);
            LM_CHECK_MSG(memcmp(a, b, (size_t)(got[i]->rows * got[i]->cols) * sizeof(float)) == 0,
                         "fused form %d T=%lld: not bitwise equal to the plain ops", i, (long long)T);
            free(a), free(b);
        }
        lm_tensor *all[] = { &x, &yq, &yk, &zq, &zk, &yf, &yc, &gw, &uw };
        for (size_t i = 0; i < LM_COUNT(all); i++) lm_tensor_release(g, all[i]);
        lm_tensor *wall[] = { &wq, &wk, &wu, &wg };
        for (size_t i = 0; i < LM_COUNT(wall); i++) g->ops->free(g, wall[i]->data);
        free(xh);
    }
    cu_close(&p);
}

