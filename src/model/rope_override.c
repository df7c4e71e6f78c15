/* rope_override.c - RoPE scaling from command-line options over the model's
 * own (lm_rope_override_apply in lm_config.h). The options follow
 * llama.cpp's names (--rope-scaling, --rope-scale, --rope-freq-base,
 * --yarn-orig-ctx, --yarn-beta-fast, --yarn-beta-slow); the frequencies are
 * then computed by lm_rope_inv_freq as for a config that said the same. */
#include "lm_config.h"

#include <limits.h>

static const char *rope_type_name(lm_rope_type t) {
    switch (t) {
    case LM_ROPE_LINEAR: return "linear";
    case LM_ROPE_LLAMA3: return "llama3";
    case LM_ROPE_YARN: return "yarn";
    case LM_ROPE_DEFAULT: break;
    }
    return "none";
}

int lm_rope_override_apply(lm_model_config *c, const lm_rope_override *o, lm_err *e) {
    const bool yarn_opts = o->yarn_orig_ctx > 0 || o->beta_fast > 0 || o->beta_slow > 0;
    if (o->scaling == LM_ROPE_SET_KEEP && o->factor <= 0 && o->freq_base <= 0 && !yarn_opts) return 0;
    if (c->gemma)
        return lm_errf(e, "--rope-* options: gemma models rope each layer type their own way, which these options "
                          "cannot override");
    lm_rope_config r = c->rope;
    const lm_rope_type had = r.type;
    if (o->freq_base > 0) r.theta = o->freq_base;
    switch (o->scaling) {
    case LM_ROPE_SET_NONE:
        if (o->factor > 0 || yarn_opts)
            return lm_errf(e, "--rope-scaling none takes no --rope-scale or --yarn-* option");
        r.type = LM_ROPE_DEFAULT;
        r.factor = 1.0;
        break;
    case LM_ROPE_SET_LINEAR:
    case LM_ROPE_SET_YARN:
        r.type = o->scaling == LM_ROPE_SET_LINEAR ? LM_ROPE_LINEAR : LM_ROPE_YARN;
        if (o->factor <= 0 && had != r.type)
            return lm_errf(e, "--rope-scaling %s needs --rope-scale (this model's rope scaling: %s)",
                           rope_type_name(r.type), rope_type_name(had));
        break;
    default:
        if (o->factor > 0 && had == LM_ROPE_DEFAULT)
            return lm_errf(e, "--rope-scale needs --rope-scaling linear or yarn (this model has no rope scaling)");
        break;
    }
    if (yarn_opts && r.type != LM_ROPE_YARN)
        return lm_errf(e, "--yarn-orig-ctx, --yarn-beta-fast and --yarn-beta-slow need --rope-scaling yarn (this "
                          "model's rope scaling: %s)", rope_type_name(r.type));
    if (o->factor > 0) r.factor = o->factor;
    if (r.type == LM_ROPE_YARN && had != LM_ROPE_YARN) {
        /* transformers' defaults for a YaRN config that names only its factor */
        r.beta_fast = 32.0, r.beta_slow = 1.0, r.attn_factor = 0;
        if (had != LM_ROPE_LLAMA3) r.orig_max_pos = c->max_pos;
    }
    if (o->yarn_orig_ctx > 0) r.orig_max_pos = o->yarn_orig_ctx;
    if (o->beta_fast > 0) r.beta_fast = o->beta_fast;
    if (o->beta_slow > 0) r.beta_slow = o->beta_slow;
    if (r.type == LM_ROPE_YARN && !(r.beta_fast > r.beta_slow))
        return lm_errf(e, "--yarn-beta-fast (%g) must be above --yarn-beta-slow (%g)", r.beta_fast, r.beta_slow);
    if (r.freq_factors && r.type != had)
        return lm_errf(e, "--rope-scaling: this GGUF's rope carries Llama 3 frequency factors (rope_freqs.weight), "
                          "which another scaling type cannot replace");
    /* the context the scaling is for: F x the original one */
    if ((r.type == LM_ROPE_YARN || r.type == LM_ROPE_LINEAR) && (o->factor > 0 || r.type != had)) {
        double orig = r.type == LM_ROPE_YARN ? r.orig_max_pos : c->max_pos;
        double ctx = orig * r.factor;
        if (ctx > c->max_pos) c->max_pos = ctx >= INT_MAX / 2 ? INT_MAX / 2 : (int)ctx;
    }
    c->rope = r;
    return 0;
}
