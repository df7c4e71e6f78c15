/* config.c - Hugging Face config.json -> lm_model_config.
 *
 * Reads the fields every architecture shares, in both the transformers 5
 * spelling (rope_parameters with rope_theta inside) and the older one
 * (rope_theta at top level, rope_scaling), then lets the architecture read its
 * own (lm_arch.parse_config). Multimodal checkpoints keep the language model's
 * config under "text_config"; that is what lumen reads. Anything the forward
 * pass would silently get wrong (an unknown model_type, activation or rope
 * type) is an error, not a guess. */
#include "lm_config.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../base/lm_file.h"
#include "lm_arch.h"

bool lm_json_int(json_t *o, const char *key, int *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return false;
    json_int_t i = json_integer_value(v);
    if (i < INT32_MIN || i > INT32_MAX) return false;
    *out = (int)i;
    return true;
}

bool lm_json_num(json_t *o, const char *key, double *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) return false;
    *out = json_number_value(v);
    return true;
}

bool lm_json_bool(json_t *o, const char *key, bool dflt) {
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static int require_int(json_t *o, const char *key, int *out, int lo, const char *label, lm_err *e) {
    if (!lm_json_int(o, key, out)) return lm_errf(e, "%s: missing or non-integer \"%s\"", label, key);
    if (*out < lo) return lm_errf(e, "%s: \"%s\" = %d, must be >= %d", label, key, *out, lo);
    return 0;
}

/* eos_token_id may be an integer or a list of integers. */
static void read_eos(lm_model_config *c, json_t *v) {
    if (json_is_integer(v)) {
        c->n_eos = 1;
        c->eos_ids[0] = (int)json_integer_value(v);
    } else if (json_is_array(v)) {
        size_t i;
        json_t *x;
        c->n_eos = 0;
        json_array_foreach(v, i, x) {
            if (json_is_integer(x) && c->n_eos < LM_MAX_EOS) c->eos_ids[c->n_eos++] = (int)json_integer_value(x);
        }
    }
}

static int parse_rope(lm_model_config *c, json_t *root, const char *label, lm_err *e) {
    lm_rope_config *r = &c->rope;
    r->theta = 10000.0;
    r->factor = 1.0;
    r->partial_factor = 1.0;
    lm_json_num(root, "rope_theta", &r->theta);
    lm_json_num(root, "partial_rotary_factor", &r->partial_factor);
    json_t *p = json_object_get(root, "rope_parameters");
    if (!json_is_object(p)) p = json_object_get(root, "rope_scaling");
    if (!json_is_object(p)) return 0;
    lm_json_num(p, "rope_theta", &r->theta);
    lm_json_num(p, "partial_rotary_factor", &r->partial_factor);
    json_t *t = json_object_get(p, "rope_type");
    if (!json_is_string(t)) t = json_object_get(p, "type");
    const char *type = json_is_string(t) ? json_string_value(t) : "default";
    lm_json_num(p, "factor", &r->factor);
    if (!strcmp(type, "default")) {
        r->type = LM_ROPE_DEFAULT;
    } else if (!strcmp(type, "linear")) {
        r->type = LM_ROPE_LINEAR;
    } else if (!strcmp(type, "llama3")) {
        r->type = LM_ROPE_LLAMA3;
        if (!lm_json_num(p, "low_freq_factor", &r->low_freq_factor) ||
            !lm_json_num(p, "high_freq_factor", &r->high_freq_factor) ||
            !lm_json_num(p, "original_max_position_embeddings", &r->orig_max_pos))
            return lm_errf(e, "%s: llama3 rope scaling needs low_freq_factor, high_freq_factor and "
                              "original_max_position_embeddings", label);
    } else if (!strcmp(type, "yarn")) {
        r->type = LM_ROPE_YARN;
        r->beta_fast = 32.0;
        r->beta_slow = 1.0;
        lm_json_num(p, "beta_fast", &r->beta_fast);
        lm_json_num(p, "beta_slow", &r->beta_slow);
        lm_json_num(p, "attention_factor", &r->attn_factor);
        if (!lm_json_num(p, "original_max_position_embeddings", &r->orig_max_pos))
            r->orig_max_pos = c->max_pos;
    } else {
        return lm_errf(e, "%s: unsupported rope type \"%s\"", label, type);
    }
    if (r->type != LM_ROPE_DEFAULT && !(r->factor > 0))
        return lm_errf(e, "%s: rope scaling factor must be > 0", label);
    if (!(r->theta > 0)) return lm_errf(e, "%s: rope_theta must be > 0", label);
    if (!(r->partial_factor > 0 && r->partial_factor <= 1))
        return lm_errf(e, "%s: partial_rotary_factor must be in (0, 1]", label);
    return 0;
}

/* Sliding window: explicit layer_types wins; mistral applies it to every
 * layer; qwen2/qwen3 only with use_sliding_window (layers >= max_window_layers). */
int lm_config_parse_sliding(lm_model_config *c, json_t *root, const char *label, lm_err *e) {
    c->layer_sliding = lm_xcalloc((size_t)c->n_layers, sizeof(bool));
    int window = 0;
    lm_json_int(root, "sliding_window", &window);
    json_t *lt = json_object_get(root, "layer_types");
    if (json_is_array(lt)) {
        if ((int)json_array_size(lt) != c->n_layers)
            return lm_errf(e, "%s: layer_types has %zu entries for %d layers", label, json_array_size(lt), c->n_layers);
        for (int l = 0; l < c->n_layers; l++) {
            json_t *s = json_array_get(lt, (size_t)l);
            c->layer_sliding[l] = json_is_string(s) && !strcmp(json_string_value(s), "sliding_attention");
        }
    } else if (window > 0) {
        bool mistral = !strcmp(c->model_type, "mistral");
        bool use = mistral || lm_json_bool(root, "use_sliding_window", false);
        int from = 0;
        if (!mistral) lm_json_int(root, "max_window_layers", &from);
        for (int l = 0; l < c->n_layers; l++) c->layer_sliding[l] = use && l >= from;
    }
    bool any = false;
    for (int l = 0; l < c->n_layers; l++) any |= c->layer_sliding[l];
    if (any && window <= 0) return lm_errf(e, "%s: sliding-window layers but no positive sliding_window", label);
    c->sliding_window = any ? window : 0;
    return 0;
}

int lm_config_parse_hf(lm_model_config *c, const char *text, const char *label, lm_err *e) {
    memset(c, 0, sizeof *c);
    c->bos_id = -1;
    json_error_t jerr;
    json_t *doc = json_loads(text, 0, &jerr);
    if (!doc) return lm_errf(e, "%s: invalid JSON at line %d: %s", label, jerr.line, jerr.text);
    json_t *root = doc;
    int rc = -1;
    if (!json_is_object(root)) {
        lm_errf(e, "%s: not a JSON object", label);
        goto done;
    }
    json_t *tc = json_object_get(root, "text_config");
    json_t *cfg = json_is_object(tc) ? tc : root;
    json_t *mt = json_object_get(cfg, "model_type");
    if (!json_is_string(mt)) mt = json_object_get(root, "model_type");
    if (!json_is_string(mt)) {
        lm_errf(e, "%s: missing \"model_type\"", label);
        goto done;
    }
    const char *type = json_string_value(mt);
    const lm_arch *arch = lm_arch_find(type);
    if (!arch) {
        char list[512];
        lm_arch_supported(list, sizeof list);
        lm_errf(e, "%s: unsupported model_type \"%s\" (supported: %s)", label, type, list);
        goto done;
    }
    snprintf(c->model_type, sizeof c->model_type, "%s", type);
    root = cfg; /* the language model's fields from here on; `done` frees the document */
    if (arch->config_defaults) arch->config_defaults(type, root);

    if (require_int(root, "vocab_size", &c->vocab, 1, label, e) ||
        require_int(root, "hidden_size", &c->d_model, 1, label, e) ||
        require_int(root, "num_hidden_layers", &c->n_layers, 1, label, e) ||
        require_int(root, "num_attention_heads", &c->n_heads, 1, label, e))
        goto done;
    lm_json_int(root, "intermediate_size", &c->d_ff); /* MoE configs may have none */
    c->n_kv_heads = c->n_heads;
    lm_json_int(root, "num_key_value_heads", &c->n_kv_heads);
    if (c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads) {
        lm_errf(e, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", label,
                c->n_heads, c->n_kv_heads);
        goto done;
    }
    if (!lm_json_int(root, "head_dim", &c->head_dim) || c->head_dim <= 0) {
        if (c->d_model % c->n_heads) {
            lm_errf(e, "%s: hidden_size %d not divisible by num_attention_heads %d and no head_dim", label,
                    c->d_model, c->n_heads);
            goto done;
        }
        c->head_dim = c->d_model / c->n_heads;
    }
    if (c->head_dim % 2) {
        lm_errf(e, "%s: head_dim %d must be even", label, c->head_dim);
        goto done;
    }
    c->max_pos = 4096;
    lm_json_int(root, "max_position_embeddings", &c->max_pos);
    double eps = 1e-6;
    if (!lm_json_num(root, "rms_norm_eps", &eps)) lm_json_num(root, "layer_norm_epsilon", &eps);
    c->norm_eps = (float)eps;

    json_t *act = json_object_get(root, "hidden_activation");
    if (!json_is_string(act)) act = json_object_get(root, "hidden_act");
    const char *act_name = json_is_string(act) ? json_string_value(act) : "silu";
    if (!strcmp(act_name, "silu") || !strcmp(act_name, "swish")) {
        c->act = LM_ACT_SILU;
    } else if (!strcmp(act_name, "gelu_pytorch_tanh") || !strcmp(act_name, "gelu_new") ||
               !strcmp(act_name, "gelu_fast")) {
        c->act = LM_ACT_GELU_TANH;
    } else if (!strcmp(act_name, "gelu")) {
        c->act = LM_ACT_GELU;
    } else {
        lm_errf(e, "%s: unsupported activation \"%s\"", label, act_name);
        goto done;
    }
    if (parse_rope(c, root, label, e)) goto done;

    /* a multimodal checkpoint ties (or not) at the top level (Qwen3.5's
     * Qwen3_5Config.tie_word_embeddings), which wins over its text_config */
    c->tie_embeddings = lm_json_bool(doc, "tie_word_embeddings", lm_json_bool(root, "tie_word_embeddings", false));
    if (lm_config_parse_sliding(c, root, label, e)) goto done;
    if (arch->parse_config && arch->parse_config(c, root, label, e)) goto done;
    read_eos(c, json_object_get(root, "eos_token_id"));
    lm_json_int(root, "bos_token_id", &c->bos_id);
    rc = 0;
done:
    json_decref(doc);
    if (rc) lm_config_free(c);
    return rc;
}

int lm_config_load_hf(lm_model_config *c, const char *dir, lm_err *e) {
    char *path = lm_path_join(dir, "config.json");
    char *text = lm_read_file(path, NULL, e);
    int rc = -1;
    if (text) rc = lm_config_parse_hf(c, text, path, e);
    free(text);
    free(path);
    if (rc) return rc;

    /* generation_config.json's eos list (often longer, e.g. Llama 3 instruct) wins. */
    path = lm_path_join(dir, "generation_config.json");
    if (lm_file_exists(path)) {
        text = lm_read_file(path, NULL, NULL);
        json_t *g = text ? json_loads(text, 0, NULL) : NULL;
        if (json_is_object(g)) {
            read_eos(c, json_object_get(g, "eos_token_id"));
            lm_json_int(g, "bos_token_id", &c->bos_id);
        }
        json_decref(g);
        free(text);
    }
    free(path);
    return 0;
}

void lm_config_free(lm_model_config *c) {
    free(c->layer_sliding);
    c->layer_sliding = NULL;
    free(c->gemma);
    c->gemma = NULL;
    free(c->hybrid);
    c->hybrid = NULL;
    free(c->layer_moe);
    c->layer_moe = NULL;
}

/* YaRN's correction range: the rotary dims whose wavelength fits between
 * beta_fast and beta_slow rotations over the original context. */
static double yarn_dim(double rotations, int dim, double base, double max_pos) {
    return (dim * log(max_pos / (rotations * 2 * M_PI))) / (2 * log(base));
}

float lm_rope_inv_freq(const lm_rope_config *r, int rot_dim, float *inv_freq) {
    int half = rot_dim / 2;
    float attn = 1.0f;
    double lo = 0, hi = 0;
    if (r->type == LM_ROPE_YARN) {
        lo = floor(yarn_dim(r->beta_fast, rot_dim, r->theta, r->orig_max_pos));
        hi = ceil(yarn_dim(r->beta_slow, rot_dim, r->theta, r->orig_max_pos));
        if (lo < 0) lo = 0;
        if (hi > rot_dim - 1) hi = rot_dim - 1;
        if (hi == lo) hi += 0.001;
        attn = r->attn_factor > 0 ? (float)r->attn_factor
                                  : (float)(r->factor <= 1 ? 1.0 : 0.1 * log(r->factor) + 1.0);
    }
    for (int i = 0; i < half; i++) {
        /* float32 exponent as transformers computes it: base ** (arange(0, dim, 2).float() / dim) */
        double f = 1.0 / pow(r->theta, (double)(float)((float)(2 * i) / (float)rot_dim));
        switch (r->type) {
        case LM_ROPE_DEFAULT: break;
        case LM_ROPE_LINEAR: f /= r->factor; break;
        case LM_ROPE_LLAMA3: {
            double low_wavelen = r->orig_max_pos / r->low_freq_factor;
            double high_wavelen = r->orig_max_pos / r->high_freq_factor;
            double wavelen = 2 * M_PI / f;
            if (wavelen > low_wavelen) {
                f /= r->factor;
            } else if (wavelen >= high_wavelen) {
                double smooth = (r->orig_max_pos / wavelen - r->low_freq_factor) /
                                (r->high_freq_factor - r->low_freq_factor);
                f = (1 - smooth) * f / r->factor + smooth * f;
            }
            break;
        }
        case LM_ROPE_YARN: {
            double ramp = ((double)i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double extrapolation = 1 - ramp;
            f = f / r->factor * (1 - extrapolation) + f * extrapolation;
            break;
        }
        }
        inv_freq[i] = (float)f;
    }
    return attn;
}
