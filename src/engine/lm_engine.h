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
 * With opts.cache_ram > 0 a prefix cache keeps full KV blocks (16 tokens) of
 * finished and running requests - prompt and generated tokens - and, for
 * hybrid models, recurrent-state checkpoints; a new prompt shares the blocks
 * of its longest cached prefix (lm_prefix_cache.h). Results are the same as
 * without the cache; the final event says how many prompt tokens were cached.
 *
 * An embedding request (lm_engine_submit_embed) is a prompt with no
 * generation: it is prefilled in the same steps as everything else, the
 * model hands back the hidden states its pooling reads (lm_pooling.h), and
 * its one final event carries the pooled vector. It neither reads nor feeds
 * the prefix cache (mean pooling needs every position computed, and
 * embedding traffic must not evict chat prefixes).
 *
 * Tokens are reported through a callback on the engine thread; it must not
 * block (push the event into a per-request mailbox and return). Each request
 * gets exactly one final event (done = true). Cancelling is safe from any
 * thread at any time; the engine stops the request before its next step and
 * frees its cache blocks. */
#ifndef LM_ENGINE_H
#define LM_ENGINE_H

#include "../grammar/lm_grammar.h"
#include "../model/lm_model.h"
#include "lm_disk_cache.h"
#include "lm_sampler.h"

#define LM_MAX_TOP_LOGPROBS 20

typedef enum lm_finish {
    LM_FINISH_NONE = 0, /* not finished (a token event) */
    LM_FINISH_STOP,     /* an end-of-sequence / stop token was generated */
    LM_FINISH_LENGTH,   /* max_tokens or the context limit reached */
    LM_FINISH_CANCELLED,
    LM_FINISH_ERROR,
} lm_finish;

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
    /* Constrained decoding (lm_grammar.h): every generated token is one the
     * grammar allows (its end only where the grammar may end; the vocab's
     * end ids should be the stop tokens). NULL = none. The request takes
     * its own reference; grammar_vocab must outlive the engine. With
     * grammar_trigger > 0 (0: none; id 0 is never a trigger) the grammar
     * applies from the token after the first grammar_trigger generated
     * (free text before it: a think block ending in </think>). */
    lm_grammar *grammar;
    const lm_grammar_vocab *grammar_vocab;
    int32_t grammar_trigger;
    /* Speculative decoding (lm_engine_opts.spec) skips this request: its
     * tokens come one forward each. Output is the same either way. */
    bool no_spec;
    /* Token offsets in the prompt where its chat messages end (the
     * server's rendering knows them, the engine does not): a hybrid model
     * checkpoints its recurrent state there and densely inside the last
     * marked message (between the last two marks), where a later prompt is
     * most likely to depart from this one. Hints only: any values are
     * safe, out-of-range ones ignored. The engine copies what it needs at
     * submit. NULL = none. */
    const int32_t *prompt_marks;
    int n_prompt_marks;
} lm_gen_params;

/* Why a request got fewer cached prompt tokens than it shares with an earlier
 * request (the engine keeps the tokens of recent requests to tell). */
typedef enum lm_cache_miss {
    LM_MISS_NONE = 0,  /* hit everything it could (or nothing related was seen) */
    LM_MISS_DIVERGED,  /* the prompt departs from the closest earlier request
                        * before that request's end (rewritten turn, changed
                        * system prompt, dropped reasoning) */
    LM_MISS_EVICTED,   /* the shared tokens were cached once but are gone */
    LM_MISS_STATE,     /* hybrid model: KV shared, but no recurrent-state
                        * checkpoint at a usable position */
} lm_cache_miss;

#define LM_TRACE_WINDOW 16

/* Per-request spans and cache facts, delivered with the final event. Times
 * are lm_now() seconds; 0 where the stage never happened. */
typedef struct lm_request_trace {
    double t_submit, t_admit, t_first, t_done;
    double lookup_s, restore_s;  /* prefix-cache lookup, KV/state restore */
    double disk_read_s;          /* reading the disk tier's entries (before admission
                                  * and in the lookup: part of lookup_s there) */
    int n_cached;                /* prompt tokens served from the cache */
    int n_cached_disk;           /* of those, read from the disk tier */
    int n_shared;                /* prompt tokens shared with the closest earlier request */
    lm_cache_miss miss;
    int diverge_pos;             /* first position where the prompt differs from the
                                  * closest earlier request; -1 when none */
    /* The earlier request's tokens around diverge_pos: prev_window[i] is its
     * token at position prev_start + i (the server decodes them for the log). */
    int prev_start, n_prev;
    int32_t prev_window[LM_TRACE_WINDOW];
    int n_prefill_chunks;
    int n_steps;                 /* decode steps after the first token */
    int spec_verifies;           /* of those, steps that fed a draft (speculative decoding) */
    int spec_drafted, spec_accepted; /* draft tokens fed, and accepted */
    double spec_draft_s;         /* its share of the time spent proposing drafts */
    double spec_verify_s;        /* the forwards of its steps that verified a draft */
    const int32_t *step_batch;   /* [n_steps] tokens in the forward of each decode step */
} lm_request_trace;

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
    const lm_request_trace *trace; /* final event only; valid during the callback */
    /* An embedding request's final event (LM_FINISH_STOP): the pooled
     * vector [n_embedding] (the model's width); valid during the callback. */
    const float *embedding;
    int n_embedding;
} lm_token_event;

typedef void (*lm_token_cb)(void *user, const lm_token_event *ev);

/* Where speculative decoding's drafts come from (lm_spec.h). Whatever the
 * proposer, a greedy request gets exactly the tokens of plain decoding and
 * a sampled one keeps its distribution. */
typedef enum lm_spec_mode {
    LM_SPEC_OFF = 0,
    LM_SPEC_LOOKUP,   /* n-grams of the request's own prompt and output */
    LM_SPEC_MTP,      /* the model's MTP head (qwen3_5 / qwen3_next with mtp.*) */
    LM_SPEC_AUTO,     /* lookup where it has a hit, else the MTP head where
                       * the model has one */
    LM_SPEC_CALLBACK, /* lm_engine_opts.spec_cb (tests, a caller's own drafter) */
    LM_SPEC_DRAFT,    /* a separate draft model (lm_engine_opts.spec_model) */
} lm_spec_mode;

/* A caller's proposer (LM_SPEC_CALLBACK): up to max tokens to follow
 * tokens[0, n_tokens) (the first n_prompt the prompt) into draft; returns
 * how many. Runs on the engine thread. */
typedef int (*lm_spec_cb)(void *user, const int32_t *tokens, int n_tokens, int n_prompt, int32_t *draft, int max);

/* Most draft tokens a sequence gets in one step. */
#define LM_SPEC_MAX_DRAFT 8

typedef struct lm_engine_opts {
    int ctx;          /* most tokens per sequence (prompt + generated); 0 = model max */
    int parallel;     /* most sequences running at once (default 4) */
    int max_queue;    /* most requests waiting for admission (default 256) */
    int step_tokens;  /* token budget of one forward while any sequence
                       * decodes (default 512): bounds how long a running
                       * stream waits while prompts are prefilled */
    int prefill_tokens; /* token budget of a forward in which no sequence
                         * decodes (prompts alone; no stream waits on it):
                         * 0 = 4096 on backends with their own memory (GPUs,
                         * whose tensor cores a 512-token chunk leaves half
                         * idle), step_tokens on the CPU; never below
                         * step_tokens */
    int kv_tokens;    /* KV cache size in tokens (default parallel * ctx) */
    lm_kv_types kv_type; /* element formats of K and V (lm_kv_type.h); zero: f32
                          * (the CLI's default is bf16) */
    size_t cache_ram; /* prefix-cache budget in bytes (KV blocks and recurrent-state
                       * checkpoints kept for reuse); 0 = no prefix cache;
                       * LM_CACHE_RAM_AUTO = chosen at creation (lm_engine_cache_ram). The
                       * pool grows by cache_ram / block bytes blocks and, for
                       * hybrids, by checkpoint slots for up to half of it, on top
                       * of kv_tokens; admission evicts cache-only blocks (least
                       * recently used first) before a request has to wait. */
    const char *cache_dir; /* the prefix cache's disk tier (lm_disk_cache.h): KV
                            * blocks and checkpoints leaving the RAM cache and
                            * those of every finished request are written here
                            * and read back across restarts; NULL = none. Needs
                            * cache_ram > 0 (entries come back through it). */
    size_t cache_disk;     /* bytes of entries the directory may hold */
    const char *cache_faults; /* tests only: faults injected into the disk tier's
                               * I/O (lm_dcache_inject_spec); NULL = none */
    int warmup;       /* one forward of the largest batch at creation, so that
                       * every activation and workspace buffer is allocated
                       * before the first request (a GPU that cannot hold them
                       * fails here, not mid-request): 0 = on backends with
                       * their own memory (GPUs), 1 = always, -1 = never */
    int look_ahead;   /* greedy look-ahead: while every running request
                       * decodes greedily, each decode step is queued before
                       * the previous one's ids reach the host (the backend
                       * feeds them forward itself), so the device never waits
                       * for the host; a step queued for a request that has
                       * just stopped is discarded. Results are unchanged.
                       * 0 = on backends with their own memory (GPUs) that
                       * offer it, 1 = wherever offered, -1 = never */
    int strict_fill;  /* a request with a grammar: where the grammar forces
                       * the next bytes (a fixed key, a closing brace), their
                       * tokens are appended without sampling and fed in
                       * the next forward together (lm_grammar_fill). 0 = on,
                       * -1 = off */
    int mask_ahead;   /* grammar token masks computed by a helper thread
                       * while the step's forward runs, instead of after
                       * its logits (the hand-out picks them up; results
                       * are unchanged). 0 = on backends with their own
                       * memory (GPUs: the host waits for the forward
                       * anyway), 1 = always (a CPU forward then shares the
                       * cores with it), -1 = never */
    lm_spec_mode spec; /* speculative decoding (lm_spec.h); off by default.
                        * A model without what the mode needs (LM_SPEC_MTP
                        * without an MTP head) is an error at creation. */
    int spec_draft;    /* most draft tokens per sequence and step, 1 ..
                        * LM_SPEC_MAX_DRAFT; 0 = the proposer's default (MTP
                        * 3, lookup, auto and a draft model 6); the adaptive policy picks at
                        * most this */
    bool spec_fixed;   /* no adaptive policy: every decode step drafts as many
                        * as the proposer has, up to spec_draft (tests, and
                        * benchmarks of one depth) */
    bool spec_replay;  /* roll back a rejected draft's recurrent state by a
                        * copy from before the verify and feeding the
                        * accepted tokens again, even where the backend
                        * keeps the state after every position (the
                        * default there; lm_spec.h): tests, benchmarks */
    const char *spec_model; /* LM_SPEC_DRAFT: the draft model's path (a folder or
                             * .gguf whose tokenizer is the model's); the engine
                             * loads it on the model's backend */
    lm_spec_cb spec_cb; /* LM_SPEC_CALLBACK's proposer and its argument */
    void *spec_user;
} lm_engine_opts;

typedef struct lm_engine_stats {
    int queued, running;
    uint64_t requests, prompt_tokens, generated_tokens, steps;
    uint64_t batch_tokens_total;  /* sum of tokens over steps, for the mean batch size */
    uint64_t ahead_steps;         /* decode steps queued ahead (look_ahead) */
    uint64_t ahead_discarded;     /* their rows for requests that had already stopped */
    int kv_blocks_free, kv_blocks_total;
    /* prefix cache */
    uint64_t cache_lookup_tokens;  /* prompt tokens looked up */
    uint64_t cache_hit_tokens;     /* of those, served from the cache */
    uint64_t cache_evicted_blocks;
    uint64_t miss_diverged, miss_evicted, miss_state; /* requests per lm_cache_miss */
    int cache_blocks;              /* KV blocks held by the cache */
    int cache_checkpoints;         /* recurrent-state checkpoints held */
    size_t cache_bytes;            /* bytes the cache holds (<= cache_ram) */
    uint64_t cache_disk_hit_tokens; /* of cache_hit_tokens, those read from the disk tier */
    bool disk_on;                  /* a disk tier exists: disk holds its figures */
    bool disk_failed;              /* cache_dir was given but could not be used: no disk tier */
    lm_dc_stats disk;
    double disk_identity_s;        /* hashing the model's identity at start took this */
    bool disk_identity_sampled;    /* its weights were sampled, not hashed whole */
    /* steps by batch size (sequences in the forward): bucket i counts steps
     * with 2^i <= size < 2^(i+1); the last bucket takes the rest */
    uint64_t batch_hist[8];
    /* constrained decoding */
    uint64_t grammar_masks;        /* token masks applied */
    uint64_t grammar_masks_ahead;  /* of which computed while a forward ran (mask_ahead) */
    uint64_t grammar_masks_chained; /* of which computed while the look-ahead's next forward ran,
                                     * applied by the backend's argmax */
    double grammar_mask_s;         /* seconds computing them */
    double grammar_wait_s;         /* of which the engine thread spent after the
                                    * forwards (the rest ran during them) */
    uint64_t grammar_fill_tokens;  /* tokens appended by strict fill */
    /* speculative decoding (lm_engine_opts.spec) */
    uint64_t spec_verifies;        /* sequences that a step fed with a draft */
    uint64_t spec_verify_tokens;   /* tokens those verifications handed out */
    uint64_t spec_drafted;         /* draft tokens fed */
    uint64_t spec_accepted;        /* of those, accepted */
    uint64_t spec_pos_drafted[LM_SPEC_MAX_DRAFT];  /* draft tokens fed at draft position i + 1 */
    uint64_t spec_pos_accepted[LM_SPEC_MAX_DRAFT]; /* of those, accepted */
    uint64_t spec_replayed;        /* tokens fed again after a rejection (recurrent state) */
    uint64_t spec_off_steps;       /* decode steps where the adaptive policy did not draft */
    uint64_t spec_model_tokens;    /* tokens a draft model fed (--spec draft:PATH: following
                                    * prompts and answers, and its chained guesses) */
    double spec_draft_s;           /* seconds proposing drafts */
    double spec_verify_s;          /* seconds in forwards of steps with drafts */
} lm_engine_stats;

typedef struct lm_engine lm_engine;
typedef struct lm_request lm_request;

enum { LM_ENGINE_OK = 0, LM_ENGINE_ERROR = -1, LM_ENGINE_BUSY = -2 };

int lm_engine_create(lm_engine **out, lm_model *m, const lm_engine_opts *opts, lm_err *e);
/* Cancels everything, joins the thread, frees the cache (not the model). */
void lm_engine_free(lm_engine *en);
int lm_engine_ctx(const lm_engine *en);
/* lm_engine_opts.cache_ram as the engine uses it. LM_CACHE_RAM_AUTO becomes,
 * on a backend with its own memory (a GPU), a quarter of what it has free
 * once the weights are in; on the host, a quarter of the memory available,
 * at most 1 GiB (the cache must not push the machine into swap). */
#define LM_CACHE_RAM_AUTO SIZE_MAX
size_t lm_engine_cache_ram(const lm_engine *en);
/* "KV bf16, 32.0 KiB a token, 16384 tokens (0.50 GiB)": the cache's format,
 * its bytes per token and the tokens it holds for running requests (the
 * startup line). */
const char *lm_engine_kv_summary(const lm_engine *en, char *buf, size_t n);
/* "steps of 512 tokens, 4096 for prompts alone": the step budgets as the
 * engine uses them (step_tokens, prefill_tokens after its fit; the startup
 * line). */
const char *lm_engine_step_summary(const lm_engine *en, char *buf, size_t n);

/* Queues a request. prompt is copied. Returns LM_ENGINE_OK and a handle, or
 * LM_ENGINE_BUSY (queue full) / LM_ENGINE_ERROR (bad request: empty prompt,
 * prompt + max_tokens over the context, token out of range) with e set. The
 * handle stays valid until lm_request_release, which the caller must call
 * once, after the final event or instead of waiting for it. */
int lm_engine_submit(lm_engine *en, const int32_t *prompt, int n_prompt, const lm_gen_params *p,
                     lm_token_cb cb, void *user, lm_request **out, lm_err *e);
/* Queues an embedding request for prompt (copied): prefill only, its final
 * event carries the pooled vector. Errors as lm_engine_submit; also when the
 * model's pooling is LM_POOL_NONE (the reason is in e). */
int lm_engine_submit_embed(lm_engine *en, const int32_t *prompt, int n_prompt, lm_token_cb cb, void *user,
                           lm_request **out, lm_err *e);
void lm_request_cancel(lm_request *r);
/* Bytes of KV blocks and state slots the engine's caches hold (the MTP
 * head's pool included); counted (may be NULL): what its memory fitting
 * counted for them, which a device's budget was checked against. */
size_t lm_engine_cache_bytes(const lm_engine *en, size_t *counted);
/* Cancels if still running and drops the caller's reference; after it the
 * callback is never called again. */
void lm_request_release(lm_request *r);

void lm_engine_get_stats(lm_engine *en, lm_engine_stats *s);
/* The disk tier (opts.cache_dir), NULL without one: tests inject faults. */
lm_disk_cache *lm_engine_disk_cache(lm_engine *en);

#endif
