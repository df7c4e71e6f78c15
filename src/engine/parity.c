/* parity.c - lumen's outputs against a reference.safetensors (see lm_parity.h). */
#include "lm_parity.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/lm_file.h"
#include "../model/lm_model.h"
#include "../format/safetensors.h"
#include "lm_runner.h"
#include "lm_sampler.h"

/* Cached decoding runs the same math in another order (GEMV vs GEMM); it must
 * agree far more tightly than the model agrees with the reference. */
#define LM_CACHE_TOLERANCE 1e-4
/* bf16 weights (safetensors or GGUF) against transformers' reference */
#define LM_PARITY_EXACT_TOLERANCE 1e-3
/* quantised weights: this times the worst error measured for the type */
#define PARITY_QUANT_TOL 3.0


static const lm_file_tensor *ref_get(const lm_safetensors *st, const char *path, int i, const char *what,
                                     lm_dtype type, int64_t d0, int64_t d1, lm_err *e) {
    char name[64];
    snprintf(name, sizeof name, "prompt%d.%s", i, what);
    const lm_file_tensor *t = lm_safetensors_find(st, name);
    if (!t) {
        lm_errf(e, "%s: missing tensor \"%s\"", path, name);
        return NULL;
    }
    bool ok = t->type == type && (d1 ? (t->n_dims == 2 && t->shape[0] == d0 && t->shape[1] == d1)
                                     : (t->n_dims == 1 && (d0 < 0 || t->shape[0] == d0)));
    if (!ok || (d1 == 0 && t->shape[0] <= 0)) {
        lm_errf(e, "%s: tensor \"%s\" has an unexpected type or shape", path, name);
        return NULL;
    }
    return t;
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d; /* NaN propagates as the worst error */
    }
    return m;
}

static double top_margin(const float *x, int n) {
    int a = lm_argmax(x, n);
    float second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != a && x[i] > second) second = x[i];
    return (double)x[a] - second;
}

/* Teacher-forced greedy check; r holds the prompt already. */
static int check_greedy(lm_runner *r, const float *last_logits, const int32_t *ids, const float *ref_logits,
                        int G, int V, double base_err, lm_parity_prompt *p, lm_err *e) {
    float *ours = lm_xmalloc((size_t)G * V * sizeof(float));
    memcpy(ours, last_logits, (size_t)V * sizeof(float));
    for (int j = 1; j < G; j++)
        if (lm_runner_eval(r, &ids[j - 1], 1, false, ours + (size_t)j * V, e)) {
            free(ours);
            return -1;
        }
    p->greedy_steps = G;
    p->greedy_logits_max_abs = max_abs_diff(ours, ref_logits, (size_t)G * V);
    double err = LM_MAX(base_err, p->greedy_logits_max_abs);
    for (int j = 0; j < G; j++) {
        bool equal = lm_argmax(ours + (size_t)j * V, V) == ids[j];
        p->greedy_equal += equal;
        if (top_margin(ref_logits + (size_t)j * V, V) > 10 * err) {
            p->greedy_checked++;
            p->greedy_mismatch += !equal;
        }
    }
    free(ours);
    return 0;
}

static int check_prompt(lm_runner *r, const lm_safetensors *ref, const char *path, int i, lm_parity_prompt *p,
                        lm_err *e) {
    const int V = r->model->cfg.vocab;
    const lm_file_tensor *ids_t = ref_get(ref, path, i, "ids", LM_I32, -1, 0, e);
    if (!ids_t) return -1;
    const int T = (int)ids_t->shape[0];
    const lm_file_tensor *log_t = ref_get(ref, path, i, "logits", LM_F32, T, V, e);
    const lm_file_tensor *gid_t = log_t ? ref_get(ref, path, i, "greedy_ids", LM_I32, -1, 0, e) : NULL;
    if (!gid_t) return -1;
    const int G = (int)gid_t->shape[0];
    const lm_file_tensor *glog_t = ref_get(ref, path, i, "greedy_logits", LM_F32, G, V, e);
    if (!glog_t) return -1;
    /* safetensors data is only byte-aligned: copy before reading as numbers */
    int32_t *ids = lm_xmalloc(ids_t->nbytes), *gids = lm_xmalloc(gid_t->nbytes);
    float *ref_logits = lm_xmalloc(log_t->nbytes), *ref_glogits = lm_xmalloc(glog_t->nbytes);
    memcpy(ids, ids_t->data, ids_t->nbytes);
    memcpy(gids, gid_t->data, gid_t->nbytes);
    memcpy(ref_logits, log_t->data, log_t->nbytes);
    memcpy(ref_glogits, glog_t->data, glog_t->nbytes);
    float *full = lm_xmalloc((size_t)T * V * sizeof(float));
    float *step = lm_xmalloc((size_t)T * V * sizeof(float));
    int rc = -1;
    p->len = T;

    lm_runner_reset(r);
    if (lm_runner_eval(r, ids, T, true, full, e)) goto done;
    p->logits_max_abs = max_abs_diff(full, ref_logits, (size_t)T * V);
    if (check_greedy(r, full + (size_t)(T - 1) * V, gids, ref_glogits, G, V, p->logits_max_abs, p, e)) goto done;

    lm_runner_reset(r);
    for (int t = 0; t < T; t++)
        if (lm_runner_eval(r, &ids[t], 1, false, step + (size_t)t * V, e)) goto done;
    p->cache_vs_full_max_abs = max_abs_diff(step, full, (size_t)T * V);
    rc = 0;
done:
    free(ids);
    free(gids);
    free(ref_logits);
    free(ref_glogits);
    free(full);
    free(step);
    return rc;
}

/* Bits per stored value of a type: what bounds a weight's rounding error. */
static double type_bits(lm_dtype t) { return 8.0 * lm_dtype_block_bytes(t) / lm_dtype_block(t); }

lm_dtype lm_parity_weight_type(const lm_weight_source *ws) {
    lm_dtype worst = LM_F32;
    const lm_file_tensor *t = ws->gguf ? ws->gguf->tensors : NULL;
    int n = ws->gguf ? ws->gguf->n_tensors : 0;
    for (int f = 0; !ws->gguf && f < ws->n_files; f++)
        for (int i = 0; i < ws->st[f].n_tensors; i++) {
            const lm_file_tensor *x = &ws->st[f].tensors[i];
            if (x->n_dims >= 2 && x->type < LM_I32 && type_bits(x->type) < type_bits(worst)) worst = x->type;
        }
    for (int i = 0; i < n; i++)
        if (t[i].n_dims >= 2 && t[i].type < LM_I32 && type_bits(t[i].type) < type_bits(worst)) worst = t[i].type;
    return worst;
}

/* Max |logit - transformers'| a weight type earns. Full-precision types:
 * LM_PARITY_EXACT_TOLERANCE, as for safetensors. Quantised: PARITY_QUANT_TOL
 * times the worst measured on the gguf fixtures (llama-, qwen3- and
 * qwen3.5-g256, llama.cpp's own quantisations, every prompt) for the
 * nearest measured type of no more bits; below the last, the error is
 * taken to double with every bit lost. */
double lm_parity_type_tolerance(lm_dtype t) {
    if (!lm_dtype_is_quant(t)) return LM_PARITY_EXACT_TOLERANCE;
    static const struct { double bits, worst; } measured[] = {
        { 8.5, 0.560 },    /* Q8_0 (qwen3.5) */
        { 6.5625, 1.841 }, /* Q6_K (qwen3.5) */
        { 5.5, 2.771 },    /* Q5_K (qwen3.5 Q5_K_M) */
        { 4.5, 4.736 },    /* Q4_0, Q4_K (qwen3.5) */
        { 4.25, 4.870 },   /* IQ4_XS (qwen3.5) */
    };
    const double bits = type_bits(t);
    for (size_t i = 0; i < LM_COUNT(measured); i++)
        if (bits >= measured[i].bits) return PARITY_QUANT_TOL * measured[i].worst;
    const size_t last = LM_COUNT(measured) - 1;
    return PARITY_QUANT_TOL * measured[last].worst * pow(2.0, measured[last].bits - bits);
}

int lm_parity_run_ref(lm_source *src, const char *dir, lm_backend *be, double tolerance, lm_parity_result *res,
                      lm_err *e) {
    memset(res, 0, sizeof *res);
    res->tolerance = tolerance;
    res->cache_tolerance = LM_CACHE_TOLERANCE;
    lm_model *m = NULL;
    lm_runner *r = NULL;
    lm_safetensors ref = { 0 };
    char *ref_path = lm_path_join(dir, "reference.safetensors");
    int rc = -1;
    if (lm_model_load_from(&m, src, be, e)) goto done;
    snprintf(res->model_type, sizeof res->model_type, "%s", m->cfg.model_type);
    const lm_dtype wt = lm_parity_weight_type(m->weights);
    snprintf(res->weight_type, sizeof res->weight_type, "%s", lm_dtype_name(wt));
    if (!(tolerance > 0)) res->tolerance = tolerance = lm_parity_type_tolerance(wt);
    /* quantised decode steps may take another kernel than the prefill (int8
     * activations): they agree to the quantisation's error, not to 1e-4 */
    if (lm_dtype_is_quant(wt)) res->cache_tolerance = LM_MAX(res->cache_tolerance, tolerance);
    if (lm_safetensors_open(&ref, ref_path, e)) goto done;
    int max_len = 0;
    for (int i = 0; i < LM_PARITY_MAX_PROMPTS; i++) {
        char name[64];
        snprintf(name, sizeof name, "prompt%d.ids", i);
        const lm_file_tensor *t = lm_safetensors_find(&ref, name);
        if (!t) break;
        res->n_prompts++;
        char gname[64];
        snprintf(gname, sizeof gname, "prompt%d.greedy_ids", i);
        const lm_file_tensor *g = lm_safetensors_find(&ref, gname);
        int len = (int)t->shape[0] + (g ? (int)g->shape[0] : 0);
        if (t->n_dims == 1) max_len = LM_MAX(max_len, len);
    }
    if (res->n_prompts == 0) {
        lm_errf(e, "%s: no prompt0.ids", ref_path);
        goto done;
    }
    if (lm_runner_create(&r, m, max_len + 1, 512, e)) goto done;
    for (int i = 0; i < res->n_prompts; i++) {
        lm_parity_prompt *p = &res->prompts[i];
        if (check_prompt(r, &ref, ref_path, i, p, e)) goto done;
        res->max_abs_err = LM_MAX(res->max_abs_err, LM_MAX(p->logits_max_abs, p->greedy_logits_max_abs));
        res->cache_vs_full = LM_MAX(res->cache_vs_full, p->cache_vs_full_max_abs);
    }
    res->ok = res->max_abs_err <= tolerance && res->cache_vs_full <= res->cache_tolerance;
    for (int i = 0; i < res->n_prompts; i++) res->ok &= res->prompts[i].greedy_mismatch == 0;
    rc = 0;
done:
    lm_runner_free(r);
    lm_model_free(m);
    if (ref.tensors || ref.file.data) lm_safetensors_close(&ref);
    free(ref_path);
    return rc;
}

int lm_parity_run_from(lm_source *src, lm_backend *be, double tolerance, lm_parity_result *res, lm_err *e) {
    return lm_parity_run_ref(src, lm_source_path(src), be, tolerance, res, e);
}

int lm_parity_run(const char *dir, lm_backend *be, double tolerance, lm_parity_result *res, lm_err *e) {
    lm_source *src;
    memset(res, 0, sizeof *res);
    if (lm_source_open(&src, dir, e)) return -1;
    int rc = lm_parity_run_from(src, be, tolerance, res, e);
    lm_source_unref(src);
    return rc;
}

char *lm_parity_json(const char *dir, const lm_backend *be, const lm_parity_result *res) {
    json_t *o = json_object();
    json_object_set_new(o, "model", json_string(dir));
    json_object_set_new(o, "model_type", json_string(res->model_type));
    json_object_set_new(o, "weight_type", json_string(res->weight_type));
    json_object_set_new(o, "backend", json_string(be->name));
    json_object_set_new(o, "ok", json_boolean(res->ok));
    json_object_set_new(o, "max_abs_err", json_real(res->max_abs_err));
    json_object_set_new(o, "tolerance", json_real(res->tolerance));
    json_object_set_new(o, "cache_vs_full_max_abs", json_real(res->cache_vs_full));
    json_object_set_new(o, "cache_tolerance", json_real(res->cache_tolerance));
    json_t *arr = json_array();
    for (int i = 0; i < res->n_prompts; i++) {
        const lm_parity_prompt *p = &res->prompts[i];
        json_t *x = json_object();
        json_object_set_new(x, "len", json_integer(p->len));
        json_object_set_new(x, "logits_max_abs", json_real(p->logits_max_abs));
        json_object_set_new(x, "greedy_logits_max_abs", json_real(p->greedy_logits_max_abs));
        json_object_set_new(x, "cache_vs_full_max_abs", json_real(p->cache_vs_full_max_abs));
        json_object_set_new(x, "greedy_steps", json_integer(p->greedy_steps));
        json_object_set_new(x, "greedy_equal", json_integer(p->greedy_equal));
        json_object_set_new(x, "greedy_checked", json_integer(p->greedy_checked));
        json_object_set_new(x, "greedy_mismatch", json_integer(p->greedy_mismatch));
        json_array_append_new(arr, x);
    }
    json_object_set_new(o, "prompts", arr);
    char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
    json_decref(o);
    return s;
}
