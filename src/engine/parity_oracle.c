/* parity_oracle.c - a model against llama.cpp's answer (lm_parity_oracle.h). */
#include "lm_parity_oracle.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/lm_model.h"
#include "lm_parity.h"
#include "lm_runner.h"
#include "lm_sampler.h"

/* Default tolerances. llama.cpp rounds activations to 8 bits before its
 * quantised dot products and multiplies bf16 weights with f16/bf16
 * activations; lumen keeps f32, so the two differ by that rounding. The
 * worst seen on the gguf fixtures (test_guard_kquant.c, every CPU path):
 * bf16 max |Δ logprob| 0.017 / KL 1.1e-5, quantised up to 0.115 / 4.9e-4.
 * The defaults are about 3x those. */
#define ORACLE_EXACT_LOGPROB 0.05
#define ORACLE_EXACT_KL 5e-5
#define ORACLE_QUANT_LOGPROB 0.35
#define ORACLE_QUANT_KL 2e-3

void lm_oracle_type_tolerance(lm_dtype t, double *logprob, double *kl) {
    bool q = lm_dtype_is_quant(t);
    *logprob = q ? ORACLE_QUANT_LOGPROB : ORACLE_EXACT_LOGPROB;
    *kl = q ? ORACLE_QUANT_KL : ORACLE_EXACT_KL;
}

/* ids of a JSON array of integers into a new array; -1 if it is not one. */
static int read_ids(json_t *a, int32_t **out, const char *path, const char *key, lm_err *e) {
    *out = NULL;
    if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > (1u << 20))
        return lm_errf(e, "%s: \"%s\" is not a non-empty array of token ids", path, key);
    int n = (int)json_array_size(a);
    int32_t *ids = lm_xmalloc((size_t)n * sizeof *ids);
    for (int i = 0; i < n; i++) {
        json_t *v = json_array_get(a, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            free(ids);
            return lm_errf(e, "%s: \"%s\"[%d] is not a token id", path, key, i);
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    *out = ids;
    return n;
}

/* Our log-softmax of logits against theirs: max |difference| and KL. */
static void compare_logprobs(const float *logits, const double *theirs, int V, double *max_diff, double *kl) {
    double mx = logits[lm_argmax(logits, V)], sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)logits[i] - mx);
    const double lse = mx + log(sum);
    *max_diff = 0;
    *kl = 0;
    for (int i = 0; i < V; i++) {
        double ours = logits[i] - lse, d = fabs(ours - theirs[i]);
        if (!(d <= *max_diff)) *max_diff = d; /* NaN is the worst */
        *kl += exp(theirs[i]) * (theirs[i] - ours);
    }
}

static double top2_margin(const float *x, int n) {
    int a = lm_argmax(x, n);
    float second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != a && x[i] > second) second = x[i];
    return (double)x[a] - second;
}

int lm_parity_oracle_run(lm_source *src, const char *json_path, lm_backend *be, double tolerance,
                         double kl_tolerance, lm_oracle_result *res, lm_err *e) {
    memset(res, 0, sizeof *res);
    json_error_t jerr;
    json_t *j = json_load_file(json_path, 0, &jerr);
    if (!j && jerr.line <= 0) return lm_errf(e, "%s: cannot read llama.cpp's answer (%s)", json_path, jerr.text);
    if (!j) return lm_errf(e, "%s: invalid JSON at line %d: %s", json_path, jerr.line, jerr.text);
    lm_model *m = NULL;
    lm_runner *r = NULL;
    int32_t *prompt = NULL, *greedy = NULL;
    double *theirs = NULL;
    float *logits = NULL;
    int rc = -1;
    const int n_prompt = read_ids(json_object_get(j, "prompt_ids"), &prompt, json_path, "prompt_ids", e);
    const int n_greedy = n_prompt < 0 ? -1 : read_ids(json_object_get(j, "greedy_ids"), &greedy, json_path, "greedy_ids", e);
    json_t *lp = json_object_get(j, "last_logprobs");
    if (n_greedy < 0) goto done;
    if (!json_is_array(lp) || json_array_size(lp) == 0 || json_array_size(lp) > (1u << 24)) {
        lm_errf(e, "%s: \"last_logprobs\" is not an array of log-probabilities", json_path);
        goto done;
    }
    const int V = (int)json_array_size(lp);
    theirs = lm_xmalloc((size_t)V * sizeof *theirs);
    for (int i = 0; i < V; i++) {
        json_t *v = json_array_get(lp, (size_t)i);
        if (!json_is_number(v)) {
            lm_errf(e, "%s: \"last_logprobs\"[%d] is not a number", json_path, i);
            goto done;
        }
        theirs[i] = json_number_value(v);
    }
    if (lm_model_load_from(&m, src, be, e)) goto done;
    snprintf(res->model_type, sizeof res->model_type, "%s", m->cfg.model_type);
    const lm_dtype wt = lm_parity_weight_type(m->weights);
    snprintf(res->weight_type, sizeof res->weight_type, "%s", lm_dtype_name(wt));
    lm_oracle_type_tolerance(wt, &res->tolerance, &res->kl_tolerance);
    if (tolerance > 0) res->tolerance = tolerance;
    if (kl_tolerance > 0) res->kl_tolerance = kl_tolerance;
    if (m->cfg.vocab != V) {
        lm_errf(e, "%s: llama.cpp's answer has %d log-probabilities, the model a vocabulary of %d", json_path, V,
                m->cfg.vocab);
        goto done;
    }
    res->n_prompt = n_prompt;
    res->n_vocab = V;
    if (lm_runner_create(&r, m, n_prompt + n_greedy + 1, 0, e)) goto done;
    logits = lm_xmalloc((size_t)V * sizeof *logits);
    if (lm_runner_eval(r, prompt, n_prompt, false, logits, e)) goto done;
    compare_logprobs(logits, theirs, V, &res->max_logprob_diff, &res->kl);
    const double err = res->max_logprob_diff;
    for (int s = 0; s < n_greedy; s++) {
        const int ours = lm_argmax(logits, V);
        const bool equal = ours == greedy[s];
        res->greedy_steps++;
        res->greedy_equal += equal;
        if (top2_margin(logits, V) > 2 * err) {
            res->greedy_checked++;
            res->greedy_mismatch += !equal;
        }
        if (s + 1 < n_greedy && lm_runner_eval(r, &greedy[s], 1, false, logits, e)) goto done;
    }
    res->ok = res->max_logprob_diff <= res->tolerance && res->kl <= res->kl_tolerance && res->greedy_mismatch == 0;
    rc = 0;
done:
    lm_runner_free(r);
    lm_model_free(m);
    free(prompt);
    free(greedy);
    free(theirs);
    free(logits);
    json_decref(j);
    return rc;
}

char *lm_oracle_json(const char *model, const char *oracle, const lm_backend *be, const lm_oracle_result *res) {
    json_t *o = json_object();
    json_object_set_new(o, "model", json_string(model));
    json_object_set_new(o, "oracle", json_string(oracle));
    json_object_set_new(o, "model_type", json_string(res->model_type));
    json_object_set_new(o, "weight_type", json_string(res->weight_type));
    json_object_set_new(o, "backend", json_string(be->name));
    json_object_set_new(o, "ok", json_boolean(res->ok));
    json_object_set_new(o, "max_logprob_diff", json_real(res->max_logprob_diff));
    json_object_set_new(o, "tolerance", json_real(res->tolerance));
    json_object_set_new(o, "kl", json_real(res->kl));
    json_object_set_new(o, "kl_tolerance", json_real(res->kl_tolerance));
    json_object_set_new(o, "prompt_len", json_integer(res->n_prompt));
    json_object_set_new(o, "greedy_steps", json_integer(res->greedy_steps));
    json_object_set_new(o, "greedy_equal", json_integer(res->greedy_equal));
    json_object_set_new(o, "greedy_checked", json_integer(res->greedy_checked));
    json_object_set_new(o, "greedy_mismatch", json_integer(res->greedy_mismatch));
    char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
    json_decref(o);
    return s;
}
