/* mix.c - llama-quantize's per-tensor type rules (see lm_quant_mix.h).
 *
 * The rules are those of llama.cpp's src/llama-quant.cpp for the mixes
 * lumen writes, dense and MoE models of the architectures lumen runs:
 * which tensors may be quantised at all, the output head, attn_v (and the
 * fused attn_qkv / attn_kv_b, which llama.cpp treats alike), attn_k with 8
 * experts, ffn_down, attn_output, then the fallback for rows the type's
 * block does not divide. */
#include "lm_quant_mix.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "lm_quant.h"

static const lm_quant_mix lm_mixes[LM_MIX_COUNT] = {
    { LM_MIX_F32, "F32", 0, LM_F32 },          { LM_MIX_F16, "F16", 1, LM_F16 },
    { LM_MIX_BF16, "BF16", 32, LM_BF16 },      { LM_MIX_Q8_0, "Q8_0", 7, LM_Q8_0 },
    { LM_MIX_Q4_0, "Q4_0", 2, LM_Q4_0 },       { LM_MIX_Q4_K_S, "Q4_K_S", 14, LM_Q4_K },
    { LM_MIX_Q4_K_M, "Q4_K_M", 15, LM_Q4_K },  { LM_MIX_Q5_K_S, "Q5_K_S", 16, LM_Q5_K },
    { LM_MIX_Q5_K_M, "Q5_K_M", 17, LM_Q5_K },  { LM_MIX_Q6_K, "Q6_K", 18, LM_Q6_K },
    { LM_MIX_IQ4_XS, "IQ4_XS", 30, LM_IQ4_XS },
};

const lm_quant_mix *lm_quant_mix_find(const char *name) {
    for (int i = 0; i < LM_MIX_COUNT; i++) {
        if (!strcasecmp(lm_mixes[i].name, name)) return &lm_mixes[i];
    }
    return NULL;
}

const char *lm_quant_mix_names(void) {
    return "Q4_K_M|Q4_K_S|Q5_K_M|Q5_K_S|Q6_K|Q8_0|Q4_0|IQ4_XS|BF16|F16|F32";
}

typedef enum lm_tcat {
    CAT_OTHER, CAT_OUTPUT, CAT_TOKEN_EMBD, CAT_ATTN_V, CAT_ATTN_K, CAT_ATTN_OUTPUT, CAT_FFN_DOWN
} lm_tcat;

/* llama.cpp's broad tensor categories (names matched as it matches them). */
static lm_tcat lm_mix_category(const char *name) {
    if (!strcmp(name, "output.weight")) return CAT_OUTPUT;
    if (!strcmp(name, "token_embd.weight") || !strcmp(name, "per_layer_token_embd.weight")) return CAT_TOKEN_EMBD;
    if (strstr(name, "attn_qkv.weight") || strstr(name, "attn_kv_b.weight") || strstr(name, "attn_v.weight"))
        return CAT_ATTN_V;
    if (strstr(name, "attn_k.weight")) return CAT_ATTN_K;
    if (strstr(name, "attn_q.weight")) return CAT_OTHER;
    if (strstr(name, "attn_output.weight")) return CAT_ATTN_OUTPUT;
    if (strstr(name, "ffn_up") || strstr(name, "ffn_gate")) return CAT_OTHER;
    if (strstr(name, "ffn_down")) return CAT_FFN_DOWN;
    return CAT_OTHER;
}

void lm_mix_prepare(lm_mix_state *st, const char *const *names, int n) {
    st->tied = true;
    st->n_attn_v = st->i_attn_v = st->i_ffn_down = 0;
    for (int i = 0; i < n; i++) {
        lm_tcat c = lm_mix_category(names[i]);
        if (c == CAT_ATTN_V) st->n_attn_v++;
        if (c == CAT_OUTPUT) st->tied = false;
    }
}

/* Tensors llama-quantize never quantises: 1-D ones, non-weights, norms,
 * MoE routers and the small tensors of a few architectures. */
static bool lm_mix_may_quantise(const char *name, int n_dims) {
    static const char *const keep[] = { "_norm.weight", "ffn_gate_inp.weight", "ssm_conv1d", "altup", "laurel",
                                        "per_layer_model_proj", "position_embd", "token_types", "attn_rel_b" };
    size_t len = strlen(name);
    if (n_dims < 2 || len < 6 || strcmp(name + len - 6, "weight")) return false;
    for (size_t i = 0; i < sizeof keep / sizeof *keep; i++) {
        if (strstr(name, keep[i])) return false;
    }
    return true;
}

/* First and last eighth, and every third layer between. */
static bool lm_use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* The layer a tensor belongs to: its "blk.N." for MoE models (experts are not
 * in layer order), else the walk's counter. */
static int lm_mix_layer(const lm_mix_state *st, const char *name, int counter) {
    int layer;
    if (st->n_expert > 1 && sscanf(name, "blk.%d.", &layer) == 1) return layer;
    return counter;
}

/* The type the rules pick for a quantisable tensor of category c. */
static lm_dtype lm_mix_rules(lm_mix_state *st, lm_tcat c, const char *name, int64_t cols) {
    lm_mix_id m = st->mix->id;
    lm_dtype t = st->mix->base;
    if (c == CAT_OUTPUT || (c == CAT_TOKEN_EMBD && st->tied)) {
        if (cols % lm_dtype_block(t) != 0) return LM_Q8_0;
        return t == LM_Q8_0 ? t : LM_Q6_K;
    }
    if (c == CAT_ATTN_V) {
        if (m == LM_MIX_IQ4_XS && st->n_gqa >= 4) t = LM_Q5_K;
        else if ((m == LM_MIX_Q4_K_M || m == LM_MIX_Q5_K_M) && lm_use_more_bits(st->i_attn_v, st->n_attn_v))
            t = LM_Q6_K;
        else if (m == LM_MIX_Q4_K_S && st->i_attn_v < 4) t = LM_Q5_K;
        if (st->n_expert == 8) t = LM_Q8_0;
        st->i_attn_v++;
    } else if (c == CAT_ATTN_K) {
        if (st->n_expert == 8) t = LM_Q8_0;
    } else if (c == CAT_FFN_DOWN) {
        int i = lm_mix_layer(st, name, st->i_ffn_down), n = st->n_layer;
        if (m == LM_MIX_Q4_K_M && lm_use_more_bits(i, n)) t = LM_Q6_K;
        else if (m == LM_MIX_IQ4_XS && i < n / 8) t = LM_Q5_K;
        else if (m == LM_MIX_Q5_K_M && lm_use_more_bits(i, n)) t = LM_Q6_K;
        else if (m == LM_MIX_Q4_K_S && i < n / 8) t = LM_Q5_K;
        st->i_ffn_down++;
    } else if (c == CAT_ATTN_OUTPUT) {
        if (st->n_expert == 8 && (m == LM_MIX_Q4_K_S || m == LM_MIX_Q4_K_M || m == LM_MIX_IQ4_XS)) t = LM_Q5_K;
    }
    return t;
}

/* llama.cpp's type for rows t's block does not divide: a 32-value type for
 * the 256-value ones (IQ4_NL, Q5_0, Q5_1, Q8_0 for IQ4_XS, Q4_K, Q5_K,
 * Q6_K), F16 when 32 does not divide them either. */
static lm_dtype lm_mix_fallback(lm_dtype t, int64_t cols) {
    if (cols % lm_dtype_block(t) == 0) return t;
    lm_dtype f = t == LM_IQ4_XS ? LM_IQ4_NL : t == LM_Q4_K ? LM_Q5_0 : t == LM_Q5_K ? LM_Q5_1 : t == LM_Q6_K ? LM_Q8_0 : t;
    LM_ASSERT(lm_quant_supported(f));
    return cols % lm_dtype_block(f) == 0 ? f : LM_F16;
}

lm_dtype lm_mix_tensor_type(lm_mix_state *st, const char *name, int n_dims, const int64_t *shape, lm_dtype src) {
    lm_tcat c = lm_mix_category(name);
    if (!lm_mix_may_quantise(name, n_dims)) return src;
    if (!lm_dtype_is_quant(st->mix->base)) return st->mix->base;
    return lm_mix_fallback(lm_mix_rules(st, c, name, shape[n_dims - 1]), shape[n_dims - 1]);
}
