/* lm_engine.h - requests in, tokens out: the scheduler between a server and a
 * model.
 *
 * The engine owns one model's KV cache and a scheduler thread. Every step it
 * runs ONE forward over all active sequences (continuous batching): one
 * decode token for each running sequence plus prefill chunks of waiting
 * prompts, within a per-step token budget so that a long prompt does not
 * stall running streams. Requests are admitted in arrival order when the KV
 * cache can hold their prompt plus max_tokens; until then they wait in a
 * bounded queue (submit fails with LM_ENGINE_BUSY past its limit).
 *
 * Tokens are reported through a callback on the engine thread; it must not
 * block (push the event into a per-request mailbox and return). Each request
 * gets exactly one final event (done = true). Cancelling is safe from any
 * thread at any time; the engine stops the request before its next step and
 * frees its cache blocks. */
#ifndef LM_ENGINE_H
#define LM_ENGINE_H

#include "../model/lm_model.h"
#include "lm_sampler.h"

#define LM_MAX_TOP_LOGPROBS 20

typedef enum lm_finish {
    LM_FINISH_NONE = 0, /* not finished (a token event) */
    LM_FINISH_STOP,     /* an end-of-sequence / stop token was generated */
    LM_FINISH_LENGTH,   /* max_tokens or the context limit reached */
    LM_FINISH_CANCELLED,
    LM_FINISH_ERROR,
} lm_finish;

typedef struct lm_logit_bias {
    int32_t token;
    float bias;
} lm_logit_bias;

typedef struct lm_gen_params {
    lm_sampler_params sampling;   /* temperature, top_k, top_p, min_p, seed */
    float presence_penalty;       /* OpenAI: over generated tokens, 0 = off */
    float frequency_penalty;      /* OpenAI: over generated tokens, 0 = off */
    float repetition_penalty;     /* over prompt + generated tokens, 1 = off */
    int max_tokens;               /* > 0 */
    const int32_t *stop_tokens;   /* generation ends after emitting one of these */
    int n_stop_tokens;
    const lm_logit_bias *logit_bias;
    int n_logit_bias;
    int top_logprobs;             /* 0..LM_MAX_TOP_LOGPROBS alternatives per token */
    bool logprobs;                /* report the chosen token's logprob */
} lm_gen_params;

typedef struct lm_token_event {
    int32_t token;                /* valid when !done, or when done with a final token */
    bool has_token;
    float logprob;                /* log-softmax of the model's logits */
    int n_top;
    int32_t top_ids[LM_MAX_TOP_LOGPROBS];
    float top_logprobs[LM_MAX_TOP_LOGPROBS];
    bool done;
    lm_finish finish;
    const char *error;            /* LM_FINISH_ERROR: one line */
    int n_prompt, n_cached, n_generated;
    double queue_s, prefill_s;    /* time waiting for admission, time to first token */
} lm_token_event;

typedef void (*lm_token_cb)(void *user, const lm_token_event *ev);

typedef struct lm_engine_opts {
    int ctx;          /* most tokens per sequence (prompt + generated); 0 = model max */
    int parallel;     /* most sequences running at once (default 4) */
    int max_queue;    /* most requests waiting for admission (default 256) */
    int step_tokens;  /* token budget of one forward (default 512) */
    int kv_tokens;    /* KV cache size in tokens (default parallel * ctx) */
} lm_engine_opts;

typedef struct lm_engine_stats {
    int queued, running;
    uint64_t requests, prompt_tokens, generated_tokens, steps;
    uint64_t batch_tokens_total;  /* sum of tokens over steps, for the mean batch size */
    int kv_blocks_free, kv_blocks_total;
} lm_engine_stats;

typedef struct lm_engine lm_engine;
typedef struct lm_request lm_request;

enum { LM_ENGINE_OK = 0, LM_ENGINE_ERROR = -1, LM_ENGINE_BUSY = -2 };

int lm_engine_create(lm_engine **out, lm_model *m, const lm_engine_opts *opts, lm_err *e);
/* Cancels everything, joins the thread, frees the cache (not the model). */
void lm_engine_free(lm_engine *en);
int lm_engine_ctx(const lm_engine *en);

/* Queues a request. prompt is copied. Returns LM_ENGINE_OK and a handle, or
 * LM_ENGINE_BUSY (queue full) / LM_ENGINE_ERROR (bad request: empty prompt,
 * prompt + max_tokens over the context, token out of range) with e set. The
 * handle stays valid until lm_request_release, which the caller must call
 * once, after the final event or instead of waiting for it. */
int lm_engine_submit(lm_engine *en, const int32_t *prompt, int n_prompt, const lm_gen_params *p,
                     lm_token_cb cb, void *user, lm_request **out, lm_err *e);
void lm_request_cancel(lm_request *r);
/* Cancels if still running and drops the caller's reference; after it the
 * callback is never called again. */
void lm_request_release(lm_request *r);

void lm_engine_get_stats(lm_engine *en, lm_engine_stats *s);

#endif
