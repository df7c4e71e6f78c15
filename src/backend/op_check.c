/* op_check.c - the argument contracts of the ops whose shapes are easy to
 * get wrong, checked the same way by every backend (a broken contract is a
 * bug: LM_ASSERT). */
#include "lm_backend.h"

void lm_check_state_ref(const lm_kv_pool *kv, lm_state_ref r, const lm_attn_batch *b, int64_t floats) {
    LM_ASSERT(b->state_slot != NULL);
    LM_ASSERT(r.index >= 0 && r.index < kv->n_state && r.offset >= 0);
    LM_ASSERT(r.offset + floats <= kv->state_floats[r.index]);
    for (int t = 0; b->state_out && t < b->n_tokens; t++)
        LM_ASSERT(b->state_out[t] >= -1 && b->state_out[t] < kv->n_state_slots);
}

void lm_check_gated_delta(const lm_tensor *out, const lm_tensor *qkv, const lm_tensor *g, const lm_tensor *beta,
                          const lm_kv_pool *kv, const lm_attn_batch *b, const lm_delta_params *p) {
    const int Hk = p->n_k_heads, Hv = p->n_v_heads, Dk = p->k_dim, Dv = p->v_dim;
    LM_ASSERT(Hk > 0 && Hv > 0 && Hv % Hk == 0 && Dk > 0 && Dv > 0);
    LM_ASSERT(out->type == LM_F32 && qkv->type == LM_F32 && g->type == LM_F32 && beta->type == LM_F32);
    LM_ASSERT(qkv->rows == b->n_tokens && out->rows == b->n_tokens);
    LM_ASSERT(qkv->cols == 2 * (int64_t)Hk * Dk + (int64_t)Hv * Dv && out->cols == (int64_t)Hv * Dv);
    LM_ASSERT(g->rows == b->n_tokens && g->cols == Hv && beta->rows == b->n_tokens && beta->cols == Hv);
    LM_ASSERT(out->data != qkv->data);
    lm_check_state_ref(kv, p->state, b, (int64_t)Hv * Dk * Dv);
}

void lm_check_moe(const lm_tensor *y, const lm_tensor *x, const lm_tensor *router_logits, const lm_moe_params *p) {
    const int64_t T = x->rows, D = x->cols;
    const int E = p->n_experts, k = p->top_k;
    LM_ASSERT(x->type == LM_F32 && y->type == LM_F32 && router_logits->type == LM_F32);
    LM_ASSERT(y->rows == T && y->cols == D && y->data != x->data);
    LM_ASSERT(E >= 1 && k >= 1 && k <= E);
    LM_ASSERT(router_logits->rows == T && router_logits->cols == E);
    LM_ASSERT(!p->expert_scale || (p->expert_scale->type == LM_F32 && p->expert_scale->rows * p->expert_scale->cols == E));
    const int64_t F = p->gate[0].rows;
    for (int e = 0; e < E; e++) {
        LM_ASSERT(p->gate[e].rows == F && p->gate[e].cols == D);
        LM_ASSERT(p->up[e].rows == F && p->up[e].cols == D);
        LM_ASSERT(p->down[e].rows == D && p->down[e].cols == F);
    }
}
