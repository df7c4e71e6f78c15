/* lm_parity.h - check a model folder against reference outputs.
 *
 * The folder holds a model (config + weights) and reference.safetensors with,
 * for prompts i = 0, 1, ...: prompt{i}.ids [T], prompt{i}.logits [T][V] (one
 * full forward), prompt{i}.greedy_ids [G] and prompt{i}.greedy_logits [G][V]
 * (greedy decoding with a cache). We measure:
 *  - logits_max_abs: our full-forward logits vs the reference, every position;
 *  - greedy_logits_max_abs: teacher-forced on the reference's greedy tokens,
 *    our logits at each step vs the reference's;
 *  - greedy tokens: our argmax must equal the reference token at every step
 *    whose reference top-1/top-2 margin exceeds 10x the observed logit error;
 *  - cache_vs_full_max_abs: feeding the prompt one token at a time through the
 *    KV cache vs the full forward. */
#ifndef LM_PARITY_H
#define LM_PARITY_H

#include "../backend/lm_backend.h"
#include "../format/lm_source.h"

#define LM_PARITY_MAX_PROMPTS 16

typedef struct lm_parity_prompt {
    int len;
    double logits_max_abs;
    double greedy_logits_max_abs;
    double cache_vs_full_max_abs;
    int greedy_steps;     /* reference greedy tokens */
    int greedy_checked;   /* steps whose margin was large enough to demand equality */
    int greedy_equal;     /* steps where our argmax equals the reference token */
    int greedy_mismatch;  /* checked steps that differ: each one is a failure */
} lm_parity_prompt;

typedef struct lm_parity_result {
    char model_type[32];
    char weight_type[16]; /* the least precise type of the model's matrices (lm_parity_weight_type) */
    int n_prompts;
    lm_parity_prompt prompts[LM_PARITY_MAX_PROMPTS];
    double max_abs_err;   /* worst of logits and greedy logits */
    double cache_vs_full; /* worst over prompts */
    double tolerance;
    double cache_tolerance;
    bool ok;
} lm_parity_result;

/* src: the model folder, opened once (format/lm_source.h); its
 * reference.safetensors is read beside the model. */
int lm_parity_run_from(lm_source *src, lm_backend *be, double tolerance, lm_parity_result *res, lm_err *e);
/* The model of src (a folder or a GGUF file) against ref_dir's
 * reference.safetensors: a GGUF checked against the Hugging Face folder it
 * was converted from. tolerance <= 0 picks lm_parity_type_tolerance. */
int lm_parity_run_ref(lm_source *src, const char *ref_dir, lm_backend *be, double tolerance, lm_parity_result *res,
                      lm_err *e);

/* The least precise storage type among the model's 2-D weights (by bits per
 * value: what bounds its error), and the logit tolerance against a
 * full-precision reference that type earns: 1e-3 (as for safetensors) for
 * f32/f16/bf16, wider for quantised types, measured on the gguf fixtures
 * (see parity.c). */
lm_dtype lm_parity_weight_type(const lm_weight_source *ws);
double lm_parity_type_tolerance(lm_dtype t);
/* The same on a source opened from dir and released after. */
int lm_parity_run(const char *dir, lm_backend *be, double tolerance, lm_parity_result *res, lm_err *e);
/* One JSON line (caller frees). */
char *lm_parity_json(const char *dir, const lm_backend *be, const lm_parity_result *res);

#endif
