/* convert_hybrid.c - the Qwen3.5 and Qwen3-Next hybrids (GGUF archs qwen35,
 * qwen3next) for lm_convert_hf, as llama.cpp's converter writes them
 * (Qwen3_5TextModel, Qwen3NextModel):
 *
 *  - names: linear_attn.in_proj_qkv -> attn_qkv, in_proj_z -> attn_gate,
 *    in_proj_a / _b -> ssm_alpha / ssm_beta, A_log -> ssm_a, dt_bias ->
 *    ssm_dt.bias, conv1d -> ssm_conv1d (squeezed to [channels][kernel]),
 *    norm -> ssm_norm, out_proj -> ssm_out; post_attention_layernorm ->
 *    post_attention_norm; the MTP head (mtp.*) as the nextn layers after the
 *    last block (mtp.fc -> nextn.eh_proj, pre_fc_norm_embedding / _hidden ->
 *    nextn.enorm / hnorm, mtp.norm -> nextn.shared_head_norm, mtp.layers.i
 *    -> blk.<layers + i>), counted in block_count and nextn_predict_layers;
 *  - values: every RMSNorm weight but the gated one stored as 1 + w (the
 *    checkpoint's norms scale by 1 + w), A_log as -exp(A_log) (computed in
 *    double, which gives llama.cpp's f32 values);
 *  - value heads re-ordered from grouped by key head to tiled (head
 *    a * Hk + k takes head k * r + a) wherever they index rows (the v rows
 *    of qkv and of the conv channels, z, a, b, A_log, dt_bias) or columns
 *    (out_proj);
 *  - a multimodal checkpoint's text model (model.language_model.*) with its
 *    vision tower left out;
 *  - Qwen3-Next: value heads stay grouped; its fused in_proj_qkvz is split
 *    into attn_qkv (all q rows, then k, then v) and attn_gate (z), its fused
 *    in_proj_ba kept as ssm_ba;
 *  - the sparse layers (Qwen3-Next, Qwen3.5-MoE): the router
 *    (ffn_gate_inp), shared expert (ffn_*_shexp) and its gate
 *    (ffn_gate_inp_shexp); experts stored one tensor each are stacked by
 *    convert.c, fused ones (mlp.experts.gate_up_proj [E][2F][D], gate rows
 *    first, and mlp.experts.down_proj [E][D][F], as Qwen3.5-MoE ships) are
 *    split into ffn_gate_exps and ffn_up_exps, and ffn_down_exps as is. */
#include "convert_internal.h"

#include <stdio.h>
#include <string.h>

/* HF suffix inside a layer, GGUF suffix, transform. */
typedef struct hy_name {
    const char *hf, *gguf;
    conv_vx vx;
    int vreorder; /* 0 none; 1 rows from 2 Hk Dk in heads of Dv; 2 rows in heads of Dv; 3 rows of one value; 4 columns */
} hy_name;

static const hy_name k_hy_layer[] = {
    { "input_layernorm.weight", "attn_norm.weight", CONV_VX_PLUS1, 0 },
    { "post_attention_layernorm.weight", "post_attention_norm.weight", CONV_VX_PLUS1, 0 },
    { "self_attn.q_proj.weight", "attn_q.weight", CONV_VX_NONE, 0 },
    { "self_attn.k_proj.weight", "attn_k.weight", CONV_VX_NONE, 0 },
    { "self_attn.v_proj.weight", "attn_v.weight", CONV_VX_NONE, 0 },
    { "self_attn.o_proj.weight", "attn_output.weight", CONV_VX_NONE, 0 },
    { "self_attn.q_norm.weight", "attn_q_norm.weight", CONV_VX_PLUS1, 0 },
    { "self_attn.k_norm.weight", "attn_k_norm.weight", CONV_VX_PLUS1, 0 },
    { "linear_attn.in_proj_qkv.weight", "attn_qkv.weight", CONV_VX_NONE, 1 },
    { "linear_attn.in_proj_z.weight", "attn_gate.weight", CONV_VX_NONE, 2 },
    { "linear_attn.in_proj_a.weight", "ssm_alpha.weight", CONV_VX_NONE, 3 },
    { "linear_attn.in_proj_b.weight", "ssm_beta.weight", CONV_VX_NONE, 3 },
    { "linear_attn.A_log", "ssm_a", CONV_VX_NEGEXP, 3 },
    { "linear_attn.dt_bias", "ssm_dt.bias", CONV_VX_NONE, 3 },
    { "linear_attn.conv1d.weight", "ssm_conv1d.weight", CONV_VX_NONE, 1 },
    { "linear_attn.norm.weight", "ssm_norm.weight", CONV_VX_NONE, 0 },
    { "linear_attn.out_proj.weight", "ssm_out.weight", CONV_VX_NONE, 4 },
    { "mlp.gate_proj.weight", "ffn_gate.weight", CONV_VX_NONE, 0 },
    { "mlp.up_proj.weight", "ffn_up.weight", CONV_VX_NONE, 0 },
    { "mlp.down_proj.weight", "ffn_down.weight", CONV_VX_NONE, 0 },
    { "linear_attn.in_proj_ba.weight", "ssm_ba.weight", CONV_VX_NONE, 0 },
    { "mlp.gate.weight", "ffn_gate_inp.weight", CONV_VX_NONE, 0 },
    { "mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight", CONV_VX_NONE, 0 },
    { "mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight", CONV_VX_NONE, 0 },
    { "mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight", CONV_VX_NONE, 0 },
    { "mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight", CONV_VX_NONE, 0 },
};

/* The MTP head's own tensors, in the nextn layer. */
static const hy_name k_hy_mtp[] = {
    { "fc.weight", "nextn.eh_proj.weight", CONV_VX_NONE, 0 },
    { "pre_fc_norm_embedding.weight", "nextn.enorm.weight", CONV_VX_PLUS1, 0 },
    { "pre_fc_norm_hidden.weight", "nextn.hnorm.weight", CONV_VX_PLUS1, 0 },
    { "norm.weight", "nextn.shared_head_norm.weight", CONV_VX_PLUS1, 0 },
};

static void hy_set(conv_tensor *t, const conv_hybrid *h, const hy_name *e, int layer) {
    snprintf(t->name, sizeof t->name, "blk.%d.%s", layer, e->gguf);
    t->vx = e->vx;
    if (h->hv == h->hk || !e->vreorder || h->next) return; /* nothing to re-order */
    t->v_r = (int)(h->hv / h->hk), t->v_hk = (int)h->hk;
    switch (e->vreorder) {
    case 1: t->v_row0 = 2 * h->hk * h->dk, t->v_hd = h->dv; break;
    case 2: t->v_row0 = 0, t->v_hd = h->dv; break;
    case 3: t->v_row0 = 0, t->v_hd = 1; break;
    default: t->v_cols = true, t->v_hd = h->dv; break;
    }
}

const char *lm_conv_hybrid_canon(const conv_hybrid *h, const char *name, char *buf, size_t n) {
    int layer, used = 0;
    if (!strncmp(name, "model.language_model.", 21)) { /* the text model of a multimodal checkpoint */
        snprintf(buf, n, "model.%s", name + 21);
        return buf;
    }
    if (h->n_mtp > 0 && sscanf(name, "mtp.layers.%d.%n", &layer, &used) == 1 && used > 0 && layer >= 0 &&
        layer < h->n_mtp) {
        snprintf(buf, n, "model.layers.%lld.%s", (long long)(h->n_layer + layer), name + used);
        return buf;
    }
    return name;
}

int lm_conv_hybrid_name(const conv_hybrid *h, const char *name, conv_tensor *t) {
    char buf[256];
    name = lm_conv_hybrid_canon(h, name, buf, sizeof buf);
    if (!strncmp(name, "model.visual.", 13) || !strncmp(name, "visual.", 7)) return 0;
    if (!strcmp(name, "model.embed_tokens.weight")) return snprintf(t->name, sizeof t->name, "token_embd.weight"), 1;
    if (!strcmp(name, "lm_head.weight")) return snprintf(t->name, sizeof t->name, "output.weight"), 1;
    if (!strcmp(name, "model.norm.weight")) {
        snprintf(t->name, sizeof t->name, "output_norm.weight");
        t->vx = CONV_VX_PLUS1;
        return 1;
    }
    int layer, used = 0;
    const char *rest = NULL;
    if (sscanf(name, "model.layers.%d.%n", &layer, &used) == 1 && used > 0) {
        rest = name + used;
    } else if (!strncmp(name, "mtp.layers.", 11)) {
        return 0; /* the head left out (kept ones are model.layers. by now) */
    } else if (!strncmp(name, "mtp.", 4)) {
        if (h->n_mtp == 0) return 0;
        for (size_t i = 0; i < LM_COUNT(k_hy_mtp); i++)
            if (!strcmp(name + 4, k_hy_mtp[i].hf)) return hy_set(t, h, &k_hy_mtp[i], (int)h->n_layer), 1;
        return -1;
    }
    if (!rest) return -1;
    if (strstr(rest, "rotary_emb.inv_freq")) return 0;
    if (!strcmp(rest, "linear_attn.in_proj_qkvz.weight")) { /* split: q|k|v, and z */
        for (int i = 0; i < 2; i++) {
            snprintf(t[i].name, sizeof t[i].name, "blk.%d.%s", layer, i ? "attn_gate.weight" : "attn_qkv.weight");
            t[i].qkvz = i + 1;
            t[i].v_hk = (int)h->hk, t[i].v_r = (int)(h->hv / h->hk), t[i].v_hd = h->dv, t[i].qkvz_dk = h->dk;
            t[i].out_rows = i ? h->hv * h->dv : 2 * h->hk * h->dk + h->hv * h->dv;
        }
        return 2;
    }
    if (!strcmp(rest, "mlp.experts.gate_up_proj")) { /* fused experts: gate and up halves */
        for (int i = 0; i < 2; i++) {
            snprintf(t[i].name, sizeof t[i].name, "blk.%d.%s", layer, i ? "ffn_up_exps.weight" : "ffn_gate_exps.weight");
            t[i].gate_up = i + 1;
        }
        return 2;
    }
    if (!strcmp(rest, "mlp.experts.down_proj")) return snprintf(t->name, sizeof t->name, "blk.%d.ffn_down_exps.weight", layer), 1;
    for (size_t i = 0; i < LM_COUNT(k_hy_layer); i++)
        if (!strcmp(rest, k_hy_layer[i].hf)) return hy_set(t, h, &k_hy_layer[i], layer), 1;
    return -1;
}
