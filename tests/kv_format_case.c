/* kv_format_case.c - see kv_format_case.h. */
#include "kv_format_case.h"

#include "engine/lm_kv_cache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { KS = 3, KLAYERS = 2, KLAYER = 1, KLONG = 180, KBS = 16 };

static uint32_t kvf_u32(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 32);
}

static float kvf_rnd(uint64_t *s) { return (float)kvf_u32(s) / 4294967296.0f * 2.0f - 1.0f; }

/* A standard normal value (Box-Muller): activations are bell-shaped, not
 * uniform, which is what makes a group's largest value costly. */
static float kvf_normal(uint64_t *s) {
    const double u = ((double)kvf_u32(s) + 0.5) / 4294967296.0, v = (double)kvf_u32(s) / 4294967296.0;
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* Softmax attention of one (token, head) in double over rows K, V
 * ([j][W], kv head g's columns), written to ref[Dh]. */
static void kvf_ref(const float *q, const float *K, const float *V, int W, int g, int Dh, int lo, int pos,
                    const kvf_cfg *cf, double *sc, double *ref) {
    double mx = -INFINITY, sum = 0;
    for (int j = lo; j <= pos; j++) {
        double d = 0;
        for (int i = 0; i < Dh; i++) d += (double)q[i] * K[(int64_t)j * W + g * Dh + i];
        d *= cf->scale;
        if (cf->softcap > 0) d = cf->softcap * tanh(d / cf->softcap);
        sc[j] = d;
        mx = fmax(mx, d);
    }
    for (int j = lo; j <= pos; j++) sum += sc[j] = exp(sc[j] - mx);
    for (int i = 0; i < Dh; i++) {
        double x = 0;
        for (int j = lo; j <= pos; j++) x += sc[j] * V[(int64_t)j * W + g * Dh + i];
        ref[i] = x / sum;
    }
}

/* Row p of sequence q as the cache holds it, decoded and un-rotated. */
static void kvf_decoded(const uint8_t *row, lm_kv_type t, int W, int Dh, int rot, float *y) {
    lm_kv_decode(t, row, 0, W, W, y);
    if (t == LM_KV_Q4R)
        for (int c = 0; c < W; c += rot) lm_kv_unrotate(y + c, rot);
    (void)Dh;
}

int kvf_case(lm_backend *be, lm_kv_types kvt, int rot, const kvf_cfg *cf, uint64_t seed, kvf_result *r) {
    memset(r, 0, sizeof *r);
    uint64_t s = seed;
    const int max_len = cf->long_len > 0 ? cf->long_len : KLONG;
    const int len[KS] = { 1, 23, max_len }, news[KS] = { 1, cf->decode ? 1 : 3, cf->decode ? 1 : 65 };
    const int H = cf->H, Hkv = cf->Hkv, Dh = cf->Dh, W = Hkv * Dh;
    int nb_seq[KS], n_blocks = 3;
    for (int q = 0; q < KS; q++) n_blocks += nb_seq[q] = (len[q] + KBS - 1) / KBS;
    lm_kv_cache *kc = NULL;
    if (lm_kv_cache_create_typed(&kc, be, KLAYERS, W, NULL, kvt, rot, KBS, n_blocks, NULL, NULL)) return -1;
    lm_kv_pool *kv = &kc->pool;
    int32_t *perm = malloc((size_t)n_blocks * sizeof *perm);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)(kvf_u32(&s) % (uint32_t)(i + 1));
        int32_t tmp = perm[i];
        perm[i] = perm[j], perm[j] = tmp;
    }
    int32_t *tables[KS];
    for (int q = 0, used = 0; q < KS; q++) {
        tables[q] = malloc((size_t)nb_seq[q] * sizeof(int32_t));
        for (int i = 0; i < nb_seq[q]; i++) tables[q][i] = perm[used++];
    }
    /* logical K/V per sequence [KS][max_len][W]; keys with outlier channels */
    float *K = malloc(sizeof(float) * KS * max_len * W), *V = malloc(sizeof(float) * KS * max_len * W);
    for (int64_t i = 0; i < (int64_t)KS * max_len * W; i++) {
        K[i] = kvf_normal(&s), V[i] = kvf_normal(&s);
        const int c = (int)(i % W) % Dh;
        if (cf->outlier > 0 && (c == 3 || c == Dh - 5)) K[i] *= cf->outlier;
    }
    int32_t *pos = malloc(sizeof(int32_t) * KS * max_len), *seq = malloc(sizeof(int32_t) * KS * max_len);
    float *q = NULL;
    int n = 0;
    for (int pass = 0; pass < 2; pass++) {
        n = 0;
        for (int sq = 0; sq < KS; sq++)
            for (int p = 0; p < len[sq]; p++)
                if ((p >= len[sq] - news[sq]) == (pass == 1)) pos[n] = p, seq[n] = sq, n++;
        lm_tensor kt, vt;
        lm_tensor_alloc(be, &kt, n, W);
        lm_tensor_alloc(be, &vt, n, W);
        float *kb = malloc((size_t)n * W * 4), *vb = malloc((size_t)n * W * 4);
        for (int t = 0; t < n; t++) {
            memcpy(kb + (int64_t)t * W, K + ((int64_t)seq[t] * max_len + pos[t]) * W, (size_t)W * 4);
            memcpy(vb + (int64_t)t * W, V + ((int64_t)seq[t] * max_len + pos[t]) * W, (size_t)W * 4);
        }
        be->ops->write(be, kt.data, kb, (size_t)n * W * 4);
        be->ops->write(be, vt.data, vb, (size_t)n * W * 4);
        lm_attn_batch b = { .n_tokens = n, .pos = pos, .seq = seq, .n_seqs = KS,
                            .block_tables = (const int32_t *const *)tables };
        be->ops->kv_write(be, kv, KLAYER, &kt, &vt, &b);
        free(kb), free(vb);
        lm_tensor_release(be, &kt);
        lm_tensor_release(be, &vt);
        if (pass == 0) continue;
        q = malloc((size_t)n * H * Dh * 4);
        for (int64_t i = 0; i < (int64_t)n * H * Dh; i++) q[i] = kvf_rnd(&s);
        lm_tensor qt, ot;
        lm_tensor_alloc(be, &qt, n, H * Dh);
        lm_tensor_alloc(be, &ot, n, H * Dh);
        be->ops->write(be, qt.data, q, (size_t)n * H * Dh * 4);
        lm_attn_params ap = { .n_heads = H, .n_kv_heads = Hkv, .head_dim = Dh, .scale = cf->scale,
                              .window = cf->window, .softcap = cf->softcap };
        be->ops->attention(be, &ot, &qt, kv, KLAYER, &b, &ap);
        r->n_out = n * H * Dh;
        r->out = malloc((size_t)r->n_out * 4);
        be->ops->read(be, r->out, ot.data, (size_t)r->n_out * 4);
        lm_tensor_release(be, &qt);
        lm_tensor_release(be, &ot);
    }
    /* the cache as stored: every row against the reference encoder, and
     * decoded (un-rotated) for the reference over what it holds */
    const size_t kb = lm_kv_row_bytes(kvt.k, W), vb = lm_kv_row_bytes(kvt.v, W);
    const size_t rows = (size_t)n_blocks * KBS;
    uint8_t *kp = malloc(rows * kb), *vp = malloc(rows * vb), *enc = malloc(kb > vb ? kb : vb);
    be->ops->read(be, kp, kv->k[KLAYER], rows * kb);
    be->ops->read(be, vp, kv->v[KLAYER], rows * vb);
    float *KD = malloc(sizeof(float) * KS * max_len * W), *VD = malloc(sizeof(float) * KS * max_len * W);
    for (int sq = 0; sq < KS; sq++)
        for (int p = 0; p < len[sq]; p++) {
            const int64_t row = (int64_t)tables[sq][p / KBS] * KBS + p % KBS, at = ((int64_t)sq * max_len + p) * W;
            memset(enc, 0, kb > vb ? kb : vb);
            lm_kv_encode_row(kvt.k, enc, K + at, W, W, rot);
            r->rows_bad += memcmp(enc, kp + row * kb, kb) != 0; /* padding: zero on both sides */
            memset(enc, 0, kb > vb ? kb : vb);
            lm_kv_encode_row(kvt.v, enc, V + at, W, W, rot);
            r->rows_bad += memcmp(enc, vp + row * vb, vb) != 0;
            kvf_decoded(kp + row * kb, kvt.k, W, Dh, rot, KD + at);
            kvf_decoded(vp + row * vb, kvt.v, W, Dh, rot, VD + at);
        }
    double *sc = malloc(sizeof(double) * max_len), *ref = malloc(sizeof(double) * Dh);
    double *refd = malloc(sizeof(double) * Dh), big = 1e-30, e_deq = 0, e2 = 0, r2 = 1e-300;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < H; h++) {
            const int g = h / (H / Hkv), lo = cf->window > 0 && pos[t] - cf->window + 1 > 0 ? pos[t] - cf->window + 1 : 0;
            const int64_t base = (int64_t)seq[t] * max_len * W;
            const float *qh = q + ((int64_t)t * H + h) * Dh;
            kvf_ref(qh, K + base, V + base, W, g, Dh, lo, pos[t], cf, sc, ref);
            kvf_ref(qh, KD + base, VD + base, W, g, Dh, lo, pos[t], cf, sc, refd);
            for (int i = 0; i < Dh; i++) {
                const double got = r->out[((int64_t)t * H + h) * Dh + i];
                big = fmax(big, fabs(ref[i]));
                e2 += (got - ref[i]) * (got - ref[i]), r2 += ref[i] * ref[i];
                e_deq = fmax(e_deq, fabs(got - refd[i]));
            }
        }
    r->err_deq = e_deq / big;
    r->err_f32 = sqrt(e2 / r2);
    free(sc), free(ref), free(refd), free(KD), free(VD), free(kp), free(vp), free(enc), free(q), free(K), free(V);
    free(perm), free(pos), free(seq);
    for (int i = 0; i < KS; i++) free(tables[i]);
    lm_kv_cache_free(kc);
    return 0;
}
