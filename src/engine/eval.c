/* eval.c - perplexity and divergence from a reference (see lm_eval.h).
 *
 * Per window, each model gets its own runner (reset per window) and is fed
 * chunks of LM_EVAL_CHUNK tokens asking for every row's logits; a row's
 * log-softmax is taken in double. The per-position KL values are kept for
 * the 99th percentile (n doubles for n scored positions). */
#include "lm_eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lm_runner.h"

/* log-softmax of x[n] into lp[n] (double); returns the argmax. */
static int lm_eval_log_softmax(const float *x, int n, double *lp) {
    int am = lm_argmax(x, n);
    double mx = x[am], sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)x[i] - mx);
    double lse = mx + log(sum);
    for (int i = 0; i < n; i++) lp[i] = (double)x[i] - lse;
    return am;
}

static int lm_eval_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The running sums of one evaluation. */
typedef struct lm_eval_acc {
    double nll, ref_nll, kl_sum, kl_max;
    double *kl; /* [n_scored] */
    int n_scored, n_agree;
} lm_eval_acc;

/* Scores one row: logits of m (and ref) predicting target. */
static void lm_eval_row(lm_eval_acc *a, const float *lm_row, const float *ref_row, int V, int32_t target, double *lp,
                        double *lq) {
    int am = lm_eval_log_softmax(lm_row, V, lp);
    a->nll -= lp[target];
    if (ref_row) {
        int ar = lm_eval_log_softmax(ref_row, V, lq);
        a->ref_nll -= lq[target];
        double kl = 0;
        for (int i = 0; i < V; i++) kl += exp(lq[i]) * (lq[i] - lp[i]);
        kl = kl > 0 ? kl : 0; /* rounding can leave a tiny negative sum */
        a->kl[a->n_scored] = kl;
        a->kl_sum += kl;
        a->kl_max = fmax(a->kl_max, kl);
        a->n_agree += am == ar;
    }
    a->n_scored++;
}

int lm_eval_run(lm_model *m, lm_model *ref, const int32_t *ids, int n, int ctx, lm_kv_types kvt, lm_eval_result *out,
                lm_err *e) {
    memset(out, 0, sizeof *out);
    const int V = m->cfg.vocab;
    if (ctx < 2) return lm_errf(e, "the evaluation window must hold at least 2 tokens (got %d)", ctx);
    if (n < 2) return lm_errf(e, "the text has %d token%s: nothing to predict", n, n == 1 ? "" : "s");
    if (ref && ref->cfg.vocab != V)
        return lm_errf(e, "the reference's vocabulary has %d tokens, the model's %d", ref->cfg.vocab, V);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= V) return lm_errf(e, "token %d (id %d) is outside the vocabulary", i, ids[i]);
    }
    lm_runner *rm = NULL, *rr = NULL;
    if (lm_runner_create_kv(&rm, m, ctx, LM_EVAL_CHUNK, kvt, e)) return -1;
    if (ref && lm_runner_create(&rr, ref, ctx, LM_EVAL_CHUNK, e)) {
        lm_runner_free(rm);
        return -1;
    }
    float *lm_logits = lm_xmalloc((size_t)LM_EVAL_CHUNK * V * sizeof(float));
    float *ref_logits = ref ? lm_xmalloc((size_t)LM_EVAL_CHUNK * V * sizeof(float)) : NULL;
    double *lp = lm_xmalloc((size_t)V * sizeof *lp), *lq = lm_xmalloc((size_t)V * sizeof *lq);
    lm_eval_acc a = { .kl = ref ? lm_xmalloc((size_t)n * sizeof(double)) : NULL };
    int rc = 0;
    for (int w0 = 0; rc == 0 && w0 < n - 1; w0 += ctx) {
        int wn = LM_MIN(ctx, n - w0);
        if (wn < 2) break; /* a last window of one token predicts nothing */
        lm_runner_reset(rm);
        if (rr) lm_runner_reset(rr);
        out->n_windows++;
        for (int c0 = 0; rc == 0 && c0 < wn - 1; c0 += LM_EVAL_CHUNK) {
            int cn = LM_MIN(LM_EVAL_CHUNK, wn - 1 - c0); /* the window's last token is never fed */
            const int32_t *chunk = ids + w0 + c0;
            rc = lm_runner_eval(rm, chunk, cn, true, lm_logits, e);
            if (rc == 0 && rr) rc = lm_runner_eval(rr, chunk, cn, true, ref_logits, e);
            for (int i = 0; rc == 0 && i < cn; i++) {
                lm_eval_row(&a, lm_logits + (size_t)i * V, ref ? ref_logits + (size_t)i * V : NULL, V, chunk[i + 1],
                            lp, lq);
            }
        }
    }
    if (rc == 0) {
        out->n_tokens = n;
        out->n_scored = a.n_scored;
        out->nll = a.nll / a.n_scored;
        out->ppl = exp(out->nll);
        if (ref) {
            out->has_ref = true;
            out->ref_nll = a.ref_nll / a.n_scored;
            out->ref_ppl = exp(out->ref_nll);
            out->kl_mean = a.kl_sum / a.n_scored;
            out->kl_max = a.kl_max;
            qsort(a.kl, (size_t)a.n_scored, sizeof *a.kl, lm_eval_cmp);
            int k = (int)ceil(0.99 * a.n_scored) - 1;
            out->kl_p99 = a.kl[k < 0 ? 0 : k];
            out->top1 = (double)a.n_agree / a.n_scored;
        }
    }
    free(a.kl);
    free(lp);
    free(lq);
    free(lm_logits);
    free(ref_logits);
    lm_runner_free(rm);
    lm_runner_free(rr);
    return rc;
}
