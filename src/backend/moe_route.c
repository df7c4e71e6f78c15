/* moe_route.c - the routing of one token for the moe op, shared by the
 * backends so that CPU and GPU pick the same experts with the same weights
 * (semantics in lm_backend.h, lm_moe_params). */
#include <math.h>

#include "lm_backend.h"
#include "moe_topk.h"

double lm_moe_softmax_den(const float *l, int E, double m) {
    double s[LM_MOE_DEN_LANES];
    for (int p = 0; p < LM_MOE_DEN_LANES; p++) {
        s[p] = 0.0;
        for (int e = p; e < E; e += LM_MOE_DEN_LANES) s[p] += exp((double)l[e] - m);
    }
    for (int off = LM_MOE_DEN_LANES / 2; off > 0; off >>= 1) {
        double t[LM_MOE_DEN_LANES];
        for (int p = 0; p < LM_MOE_DEN_LANES; p++) t[p] = s[p] + s[p ^ off];
        for (int p = 0; p < LM_MOE_DEN_LANES; p++) s[p] = t[p];
    }
    return s[0];
}

void lm_moe_route(const float *l, const float *scale, int E, int k, bool norm, int32_t *sel, float *w) {
    lm_moe_topk(l, E, k, sel);
    /* softmax over all E logits in double (the denominator in
     * lm_moe_softmax_den's order), renormalised over the k chosen when norm
     * (summed in top-k order), times the expert's scale */
    const double m = l[sel[0]], den = lm_moe_softmax_den(l, E, m);
    double chosen = 0.0;
    for (int j = 0; j < k; j++) chosen += exp((double)l[sel[j]] - m);
    for (int j = 0; j < k; j++) {
        double wj = exp((double)l[sel[j]] - m) / (norm ? chosen : den);
        if (scale) wj *= scale[sel[j]];
        w[j] = (float)wj;
    }
}
