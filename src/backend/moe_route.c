/* moe_route.c - the routing of one token for the moe op, shared by the
 * backends so that CPU and GPU pick the same experts with the same weights
 * (semantics in lm_backend.h, lm_moe_params). */
#include <math.h>

#include "lm_backend.h"

/* a comes before b in the top-k order: larger logit, then lower index. */
static bool before(float la, int a, float lb, int b) { return la > lb || (la == lb && a < b); }

void lm_moe_route(const float *l, const float *scale, int E, int k, bool norm, int32_t *sel, float *w) {
    /* k passes, each taking the first expert (in top-k order) that comes
     * after the previous pick: no per-token marks, k*E compares. A NaN logit
     * is never "before" anything; the fallback keeps the k ids distinct,
     * which the backends' grouping relies on. */
    int prev = -1;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            if (prev >= 0 && !before(l[prev], prev, l[e], e)) continue;
            if (best < 0 || before(l[e], e, l[best], best)) best = e;
        }
        for (int e = 0; best < 0 && e < E; e++) { /* NaN logits: lowest expert not yet chosen */
            bool used = false;
            for (int i = 0; i < j; i++) used |= sel[i] == e;
            if (!used) best = e;
        }
        sel[j] = best;
        prev = best;
    }
    /* softmax over all E logits in double, renormalised over the k chosen
     * when norm, times the expert's scale */
    double m = l[sel[0]], den = 0.0, chosen = 0.0;
    for (int e = 0; e < E; e++) den += exp((double)l[e] - m);
    for (int j = 0; j < k; j++) chosen += exp((double)l[sel[j]] - m);
    for (int j = 0; j < k; j++) {
        double wj = exp((double)l[sel[j]] - m) / (norm ? chosen : den);
        if (scale) wj *= scale[sel[j]];
        w[j] = (float)wj;
    }
}
