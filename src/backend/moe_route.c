/* moe_route.c - the routing of one token for the moe op, shared by the
 * backends so that CPU and GPU pick the same experts with the same weights
 * (semantics in lm_backend.h, lm_moe_params). */
#include <math.h>

#include "lm_backend.h"
#include "moe_topk.h"

void lm_moe_route(const float *l, const float *scale, int E, int k, bool norm, int32_t *sel, float *w) {
    lm_moe_topk(l, E, k, sel);
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
