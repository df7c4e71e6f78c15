/* convert_internal.h - what convert.c shares with the architecture files
 * of src/convert (convert_hybrid.c). */
#ifndef LM_CONVERT_INTERNAL_H
#define LM_CONVERT_INTERNAL_H

#include <jansson.h>

#include "lm_convert.h"

/* A value transform of a 1-D tensor (done in double, stored f32). */
typedef enum conv_vx {
    CONV_VX_NONE = 0,
    CONV_VX_PLUS1,  /* 1 + w: an RMSNorm the checkpoint scales by 1 + w */
    CONV_VX_NEGEXP, /* -exp(w): Gated DeltaNet's A_log as the decay rate */
} conv_vx;

/* One output tensor: its source, name, row order, value transform and type. */
typedef struct conv_tensor {
    const lm_file_tensor *src;
    char name[96];
    int permute_heads; /* 0: rows in order; else the rows of this many heads are interleaved (llama q/k) */
    /* value heads from grouped by key head to tiled: v_r heads a key head,
     * v_hk key heads, each v_hd rows from row v_row0 on (or, v_cols, columns) */
    int v_r, v_hk;
    int64_t v_row0, v_hd;
    bool v_cols;
    conv_vx vx;
    /* Qwen3-Next's fused in_proj_qkvz ([Hk][q Dk; k Dk; v r Dv; z r Dv]
     * rows): 1 takes its q, k and v rows (all q, then k, then v), 2 its z
     * rows; v_hk, v_r, v_hd (Dv) and qkvz_dk give the shape; out_rows the
     * output's rows (0: the source's) */
    int qkvz;
    int64_t qkvz_dk, out_rows;
    /* a fused expert stack [experts][gate F; up F][cols] (Qwen3.5-MoE's
     * mlp.experts.gate_up_proj): 1 takes every expert's gate rows, 2 its up
     * rows, as [experts][F][cols] */
    int gate_up;
    /* a stack of n_parts tensors of src's shape ([experts][rows][cols]: a
     * MoE layer's experts), parts[i] expert i; src is parts[0] */
    const lm_file_tensor **parts;
    int n_parts;
    lm_dtype type;
} conv_tensor;

/* The hybrids' geometry as the converter needs it. */
typedef struct conv_hybrid {
    int64_t n_layer, n_mtp;   /* decoder layers; MTP layers kept as nextn layers (0: none) */
    int64_t hk, hv, dk, dv;   /* key and value heads of the linear layers, their widths */
    bool next;                /* Qwen3-Next: fused qkvz and ba, value heads kept grouped */
} conv_hybrid;

/* t's GGUF name and transforms for the hybrid's HF tensor `name` (t[0],
 * and t[1] for the second output of a split): the outputs (1 or 2), 0 for
 * a tensor llama.cpp leaves out (the vision tower, rotary frequencies), -1
 * for an unknown one. Experts are the caller's (stacked). */
int lm_conv_hybrid_name(const conv_hybrid *h, const char *name, conv_tensor *t);

/* name as the text model's layer name: model.language_model.X -> model.X
 * (a multimodal checkpoint) and, when the MTP head is kept, mtp.layers.i.X
 * -> model.layers.<n_layer + i>.X (its nextn layer); in buf (n bytes), or
 * name itself when neither applies. */
const char *lm_conv_hybrid_canon(const conv_hybrid *h, const char *name, char *buf, size_t n);

/* t = rope_freqs.weight, f32, the n factors of f (malloc'd; t owns it). */
void lm_conv_rope_freqs_tensor(lm_file_tensor *t, float *f, int64_t n);

/* Gemma 3 / 4 (version 3 or 4; convert_gemma.c): t's GGUF name and
 * transform for HF tensor `name`: 1, 0 for a tensor llama.cpp leaves out
 * (towers of a multimodal checkpoint, rotary frequencies), -1 unknown. */
int lm_conv_gemma_name(int version, const char *name, conv_tensor *t);

/* The {arch}.* keys of a Gemma config (text_config where nested), from
 * block_count on, with general.file_type (ftype) and
 * general.quantization_version; -1 with e for a config it cannot write. */
int lm_conv_gemma_hparams(lm_gguf_writer *w, const char *dir, const char *arch, int version, json_t *cfg, int ftype,
                          lm_err *e);

/* Gemma 4's proportional rope as llama.cpp stores it: t (its data
 * malloc'd) = rope_freqs.weight and 1, or 0 when the global layers' rope is
 * not proportional. */
int lm_conv_gemma_rope_freqs(json_t *cfg, lm_file_tensor *t);

#endif
