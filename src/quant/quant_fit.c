/* quant_fit.c - the shared scale searches (see quant_fit.h).
 *
 * Symmetric: the largest |x| is mapped onto each end of the level set and
 * onto 2*LM_QFIT_STEPS scales around it; each trial's level assignment gets
 * its least-squares scale, whose error is sum w x^2 - (sum w x L)^2 /
 * sum w L^2, so the best trial is the one with the largest
 * (sum w x L)^2 / sum w L^2. Then a few rounds of "assign levels for this
 * scale, refit the scale" (each round can only lower the error).
 * Asymmetric: the same over the range [min(x, 0), max(x)] with a
 * least-squares fit of both scale and offset per trial. */
#include "quant_fit.h"

#include <math.h>

#include "../base/lm_base.h"

#define LM_QFIT_STEPS 12      /* trials either side of the plain scale */
#define LM_QFIT_SPREAD 0.02f  /* relative step between trials */
#define LM_QFIT_REFINE 3      /* assign / refit rounds after the search */
#define LM_QFIT_MAX_N 256

int lm_qfit_nearest(const lm_qlevels *L, float t) {
    if (L->uniform) {
        float r = nearbyintf(t - L->v[0]);
        if (!(r > 0)) return 0; /* NaN lands here too */
        return r >= (float)(L->n - 1) ? L->n - 1 : (int)r;
    }
    int lo = 0, hi = L->n - 1;
    if (!(t > L->v[0])) return 0;
    if (t >= L->v[hi]) return hi;
    while (hi - lo > 1) { /* v[lo] < t <= v[hi] */
        int mid = (lo + hi) / 2;
        if (L->v[mid] < t) lo = mid;
        else hi = mid;
    }
    return t - L->v[lo] <= L->v[hi] - t ? lo : hi;
}

void lm_qfit_assign_sym(const lm_qlevels *L, const float *x, int n, float s, uint8_t *q) {
    float inv = s != 0 ? 1.0f / s : 0;
    for (int i = 0; i < n; i++) q[i] = (uint8_t)lm_qfit_nearest(L, x[i] * inv);
}

void lm_qfit_assign_asym(int nmax, const float *x, int n, float s, float m, uint8_t *q) {
    float inv = s > 0 ? 1.0f / s : 0;
    for (int i = 0; i < n; i++) {
        float r = nearbyintf((x[i] + m) * inv);
        q[i] = (uint8_t)(!(r > 0) ? 0 : r >= (float)nmax ? nmax : (int)r);
    }
}

/* Least-squares scale for the levels q and its score (sum w x L)^2 / sum w L^2. */
static double lm_qfit_sym_ls(const lm_qlevels *L, const float *x, const float *w, int n, const uint8_t *q,
                             float *s) {
    double sxl = 0, sll = 0;
    for (int i = 0; i < n; i++) {
        double wi = w ? w[i] : 1.0, l = L->v[q[i]];
        sxl += wi * x[i] * l;
        sll += wi * l * l;
    }
    if (sll <= 0) {
        *s = 0;
        return 0;
    }
    *s = (float)(sxl / sll);
    return sxl * sxl / sll;
}

float lm_qfit_sym(const lm_qlevels *L, const float *x, const float *w, int n, uint8_t *q) {
    LM_ASSERT(n > 0 && n <= LM_QFIT_MAX_N);
    int imax = 0;
    for (int i = 1; i < n; i++) {
        if (fabsf(x[i]) > fabsf(x[imax])) imax = i;
    }
    if (x[imax] == 0) {
        lm_qfit_assign_sym(L, x, n, 0, q);
        return 0;
    }
    uint8_t tq[LM_QFIT_MAX_N];
    double best = -1;
    float best_s = 0;
    const float ends[2] = { L->v[0], L->v[L->n - 1] };
    /* a set symmetric about 0 gives the same trials from either end */
    int n_ends = ends[0] == -ends[1] ? 1 : 2;
    for (int e = 0; e < n_ends; e++) {
        if (ends[e] == 0) continue;
        for (int t = -LM_QFIT_STEPS; t <= LM_QFIT_STEPS; t++) {
            float s = x[imax] / (ends[e] * (1.0f + LM_QFIT_SPREAD * (float)t)), fit;
            lm_qfit_assign_sym(L, x, n, s, tq);
            double score = lm_qfit_sym_ls(L, x, w, n, tq, &fit);
            if (score > best) best = score, best_s = fit;
        }
    }
    for (int r = 0; r < LM_QFIT_REFINE; r++) {
        float fit;
        lm_qfit_assign_sym(L, x, n, best_s, tq);
        double score = lm_qfit_sym_ls(L, x, w, n, tq, &fit);
        if (!(score > best)) break;
        best = score, best_s = fit;
    }
    lm_qfit_assign_sym(L, x, n, best_s, q);
    return best_s;
}

/* Least-squares (s >= 0, m) for the integers q, m >= 0 unless signed_m,
 * and its error. */
static double lm_qfit_asym_ls(const float *x, const float *w, int n, const uint8_t *q, bool signed_m, float *s,
                              float *m) {
    double sw = 0, sq = 0, sqq = 0, sx = 0, sxq = 0;
    for (int i = 0; i < n; i++) {
        double wi = w ? w[i] : 1.0;
        sw += wi, sq += wi * q[i], sqq += wi * q[i] * q[i], sx += wi * x[i], sxq += wi * x[i] * q[i];
    }
    double det = sqq * sw - sq * sq, ds = 0, dm = 0;
    if (det > 0) {
        ds = (sxq * sw - sq * sx) / det;
        dm = (sq * sxq - sqq * sx) / det;
    }
    if (signed_m && (det <= 0 || ds < 0)) { /* one level used, or a negative scale: the offset alone */
        ds = 0;
        dm = -sx / sw;
    } else if (!signed_m && (dm < 0 || det <= 0)) { /* the offset cannot be negative: the scale alone */
        dm = 0;
        ds = sqq > 0 ? sxq / sqq : 0;
    }
    if (ds < 0) ds = 0;
    *s = (float)ds, *m = (float)dm;
    double err = 0;
    for (int i = 0; i < n; i++) {
        double d = *s * (double)q[i] - *m - x[i];
        err += (w ? w[i] : 1.0) * d * d;
    }
    return err;
}

void lm_qfit_asym(int nmax, const float *x, const float *w, int n, bool signed_m, float *s, float *m, uint8_t *q) {
    LM_ASSERT(n > 0 && n <= LM_QFIT_MAX_N && nmax > 0);
    float lo = signed_m ? x[0] : 0, hi = x[0];
    for (int i = 0; i < n; i++) lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
    if (!(hi > lo)) { /* every value is the same (non-positive, unless signed_m) number */
        *s = 0, *m = -lo;
        for (int i = 0; i < n; i++) q[i] = 0;
        return;
    }
    uint8_t tq[LM_QFIT_MAX_N];
    double best = INFINITY;
    float bs = (hi - lo) / (float)nmax, bm = -lo;
    for (int t = -LM_QFIT_STEPS; t <= LM_QFIT_STEPS; t++) {
        float ts = (hi - lo) / ((float)nmax * (1.0f + LM_QFIT_SPREAD * (float)t)), fs, fm;
        lm_qfit_assign_asym(nmax, x, n, ts, -lo, tq);
        double err = lm_qfit_asym_ls(x, w, n, tq, signed_m, &fs, &fm);
        if (err < best) best = err, bs = fs, bm = fm;
    }
    for (int r = 0; r < LM_QFIT_REFINE; r++) {
        float fs, fm;
        lm_qfit_assign_asym(nmax, x, n, bs, bm, tq);
        double err = lm_qfit_asym_ls(x, w, n, tq, signed_m, &fs, &fm);
        if (!(err < best)) break;
        best = err, bs = fs, bm = fm;
    }
    *s = bs, *m = bm;
    lm_qfit_assign_asym(nmax, x, n, bs, bm, q);
}
