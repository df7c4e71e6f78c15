/* textgen.h - text in, streamed text out, for the terminal commands (run -p,
 * chat): a model, its tokenizer, one sequence, a sampler. A new prompt that
 * extends what the sequence already holds (the next turn of a chat) only
 * feeds the new tokens.
 *
 * The last token an answer samples is not fed (that would cost a forward
 * nobody needs): it is kept as the tail, and a chat's next turn starts
 * with it (or drops it, see lm_textgen.tail_eos). */
#ifndef LM_TEXTGEN_H
#define LM_TEXTGEN_H

#include <signal.h>

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
    /* the last sampled token, not fed: has_tail after a run that sampled
     * one; tail_eos when it is an end token (not shown), else it was shown */
    int32_t tail;
    bool has_tail, tail_eos;
    /* set (by a SIGINT handler) to stop the current run between tokens or
     * prefill chunks; NULL: never. The run clears it when it stops. */
    volatile sig_atomic_t *stop;
} lm_textgen;

typedef struct lm_textgen_stats {
    int prompt_tokens, reused_tokens, generated;
    double prefill_s, decode_s;
    bool hit_eos;
    /* *stop was seen: while prefilling (nothing generated; the sequence is
     * forgotten, since a recurrent state cannot be rewound) or between
     * tokens (the answer so far stands) */
    bool stopped, stopped_in_prefill;
} lm_textgen_stats;

typedef void (*lm_text_cb)(void *user, const char *text, size_t len);

struct lm_load_progress;

/* Loads model and tokenizer from one opened source (a folder or .gguf) onto
 * be, as load says (lm_model_load_with); ctx <= 0 means 4096 (capped by the
 * model's maximum). load->progress (NULL: none) hears the load and, as its
 * stage NULL, that the model is ready. */
int lm_textgen_open(lm_textgen *g, lm_source *src, lm_backend *be, int ctx, lm_kv_types kvt,
                    const lm_sampler_params *sp, const lm_model_load_opts *load, lm_err *e);
void lm_textgen_close(lm_textgen *g);
/* Forgets the sequence: the next run feeds its whole prompt. */
void lm_textgen_forget(lm_textgen *g);
/* Feeds ids (reusing the held prefix when ids extend it), then generates up to
 * max_new tokens, streaming their text to cb; stops after an eos token unless
 * ignore_eos. The eos token itself is not printed. */
int lm_textgen_run(lm_textgen *g, const int32_t *ids, int n, int max_new, bool ignore_eos, lm_text_cb cb,
                   void *user, lm_textgen_stats *st, lm_err *e);

#endif
