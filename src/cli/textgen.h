/* textgen.h - text in, streamed text out, for the terminal commands (run -p,
 * chat): a model, its tokenizer, one sequence, a sampler. A new prompt that
 * extends what the sequence already holds (the next turn of a chat) only
 * feeds the new tokens. */
#ifndef LM_TEXTGEN_H
#define LM_TEXTGEN_H

#include "../engine/lm_runner.h"
#include "../engine/lm_sampler.h"
#include "../format/lm_source.h"
#include "../tokenizer/lm_tokenizer.h"

typedef struct lm_textgen {
    lm_model *model;
    lm_tokenizer *tok;
    lm_runner *runner;
    lm_sampler *sampler;
    float *logits;       /* [V] */
    int32_t eos[16];     /* tokens that end generation */
    int n_eos;
    lm_tok_ids held;     /* tokens whose state the runner holds */
} lm_textgen;

typedef struct lm_textgen_stats {
    int prompt_tokens, reused_tokens, generated;
    double prefill_s, decode_s;
    bool hit_eos;
} lm_textgen_stats;

typedef void (*lm_text_cb)(void *user, const char *text, size_t len);

/* Loads model and tokenizer from one opened source (a folder or .gguf) onto
 * be; ctx <= 0 means 4096 (capped by the model's maximum). */
int lm_textgen_open(lm_textgen *g, lm_source *src, lm_backend *be, int ctx, const lm_sampler_params *sp,
                    lm_err *e);
void lm_textgen_close(lm_textgen *g);
/* Feeds ids (reusing the held prefix when ids extend it), then generates up to
 * max_new tokens, streaming their text to cb; stops after an eos token unless
 * ignore_eos. The eos token itself is not printed. */
int lm_textgen_run(lm_textgen *g, const int32_t *ids, int n, int max_new, bool ignore_eos, lm_text_cb cb,
                   void *user, lm_textgen_stats *st, lm_err *e);

#endif
