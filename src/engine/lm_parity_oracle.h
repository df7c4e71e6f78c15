/* lm_parity_oracle.h - check a model file against llama.cpp's answer on it.
 *
 * The answer is the JSON line tools/llamacpp/oracle.mjs prints for the same
 * GGUF file: prompt_ids, greedy_ids (llama.cpp's greedy continuation with
 * its KV cache), n_vocab and last_logprobs (its log-softmax at the last
 * prompt position). We run the prompt, compare our log-softmax at the last
 * position (max |difference| and KL(llama.cpp || lumen)), then feed
 * llama.cpp's greedy ids one by one (teacher forcing) and demand our argmax
 * equal to theirs at every step where our top-2 margin exceeds twice the
 * log-probability difference (closer calls may flip on rounding alone). */
#ifndef LM_PARITY_ORACLE_H
#define LM_PARITY_ORACLE_H

#include "../backend/lm_backend.h"
#include "../format/lm_source.h"

typedef struct lm_oracle_result {
    char model_type[32];
    char weight_type[16];   /* as lm_parity_result's */
    int n_prompt, n_vocab;
    double max_logprob_diff; /* last prompt position, over the vocabulary */
    double kl;               /* KL(llama.cpp || lumen) there */
    double tolerance, kl_tolerance;
    int greedy_steps, greedy_equal, greedy_checked, greedy_mismatch;
    bool ok;
} lm_oracle_result;

/* Loads the model of src and checks it against the answer in json_path.
 * tolerance / kl_tolerance <= 0: lm_oracle_type_tolerance for the model's
 * least precise weight type. Fails (-1) only when something cannot be read
 * or run (a vocabulary of another size is such a failure); res->ok says
 * whether the model agrees. */
int lm_parity_oracle_run(lm_source *src, const char *json_path, lm_backend *be, double tolerance,
                         double kl_tolerance, lm_oracle_result *res, lm_err *e);
/* The default tolerances for weights of type t (see parity_oracle.c). */
void lm_oracle_type_tolerance(lm_dtype t, double *logprob, double *kl);
/* One JSON line (caller frees). */
char *lm_oracle_json(const char *model, const char *oracle, const lm_backend *be, const lm_oracle_result *res);

#endif
