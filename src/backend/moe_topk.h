/* moe_topk.h - the top-k expert selection of the moe op (lm_backend.h,
 * lm_moe_params), shared by the host routing (moe_route.c) and the CUDA
 * routing kernel (cuda_moe.cu) so that both pick the same experts. */
#ifndef LM_MOE_TOPK_H
#define LM_MOE_TOPK_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __CUDACC__
#define LM_MOE_HD __host__ __device__
#else
#define LM_MOE_HD
#endif

/* The routing's softmax denominator (lm_moe_softmax_den) is summed as
 * LM_MOE_DEN_LANES partial sums (partial p over experts p, p + 32, ...
 * ascending), then combined as a warp's xor butterfly combines its lanes:
 * for off = 16, 8, .., 1 each partial p becomes s[p] + s[p ^ off]. */
#define LM_MOE_DEN_LANES 32

/* a comes before b in the top-k order: larger logit, then lower index. */
static inline LM_MOE_HD bool lm_moe_before(float la, int a, float lb, int b) { return la > lb || (la == lb && a < b); }

/* sel[0..k) = the k experts by descending logit l[E]: k passes, each taking
 * the first expert (in top-k order) that comes after the previous pick: no
 * per-token marks, k*E compares. A NaN logit is never "before" anything;
 * the fallback keeps the k ids distinct, which the backends' grouping
 * relies on. */
static inline LM_MOE_HD void lm_moe_topk(const float *l, int E, int k, int32_t *sel) {
    int prev = -1;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            if (prev >= 0 && !lm_moe_before(l[prev], prev, l[e], e)) continue;
            if (best < 0 || lm_moe_before(l[e], e, l[best], best)) best = e;
        }
        for (int e = 0; best < 0 && e < E; e++) { /* NaN logits: lowest expert not yet chosen */
            bool used = false;
            for (int i = 0; i < j; i++) used |= sel[i] == e;
            if (!used) best = e;
        }
        sel[j] = best;
        prev = best;
    }
}

#endif
