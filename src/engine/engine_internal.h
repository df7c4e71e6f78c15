/* engine_internal.h - what the engine's files share; nothing outside
 * src/engine includes it.
 *
 * The engine (lm_engine.h) is split by job:
 *   engine.c        the scheduler: requests (submit, cancel, release),
 *                   admission, the step and its plain policy, the thread
 *   cache_policy.c  how the prefix cache is used: block hashes and inserts,
 *                   hybrid checkpoints, the lookup at admission, miss
 *                   diagnosis; the seams of the disk tier
 *   disk_tier.c     the disk tier under it: spills down, loads up
 *   lookahead.c     the greedy look-ahead: a step policy, and the chain of
 *                   device-fed forwards it shares with `lumen bench`
 *   spec.c          speculative decoding (lm_spec.h): drafts into the step,
 *                   the verifying step policy, the adaptive draft length;
 *                   spec_lookup.c, spec_mtp.c and spec_draft.c its proposers
 *   fit.c           KV sizing against device memory, the warm-up forward
 *   batch.c, sampler.c, prefix_cache.c, kv_cache.c: the parts they use.
 *
 * A step (engine.c's step()) is: take the forward a policy already queued
 * during the last step, or build one and issue it; then the step's policy
 * (lm_step_policy) runs: after_forward, then hand_out. Plain steps, the
 * look-ahead and speculation differ only in their policy.
 *
 * Threads: the engine thread owns everything but the fields marked "under
 * mu", which submit, stats and cancel reach from other threads, and a
 * request's refs and cancelled (atomics) and released (under its cb_mu).
 * Callbacks run on the engine thread with no engine lock held, only the
 * request's cb_mu. */
#ifndef LM_ENGINE_INTERNAL_H
#define LM_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "lm_batch_builder.h"
#include "lm_disk_cache.h"
#include "lm_engine.h"
#include "lm_kv_cache.h"
#include "lm_lookahead.h"
#include "lm_prefix_cache.h"
#include "lm_spec.h"

typedef enum lm_req_state { LM_REQ_QUEUED, LM_REQ_RUNNING, LM_REQ_DONE } lm_req_state;

struct lm_request {
    lm_engine *en;
    int32_t *tokens;        /* prompt, then generated tokens */
    int n_prompt, n_tokens, cap;
    int n_cached;           /* tokens whose K/V are in the cache */
    lm_gen_params p;        /* stop_tokens: the owned copy below; logit_bias: the sampler's */
    int32_t *stop_tokens;
    lm_sampler *sampler;    /* with the request's bias and penalties */
    lm_token_cb cb;
    void *user;
    atomic_int refs;        /* caller + engine (+ a queued look-ahead forward) */
    atomic_bool cancelled;
    pthread_mutex_t cb_mu;  /* held while calling cb; guards released */
    bool released;
    lm_req_state state;
    lm_kv_seq seq;
    int32_t slot;           /* recurrent-state slot, -1 when the model has none */
    int n_generated;
    double t_submit, t_admit, t_first;
    struct lm_request *next; /* queue link */
    /* prefix cache (cache_policy.c) */
    uint64_t *hashes;       /* [cap / 16 + 1] chain hash of each full block hashed so far */
    int n_hashes;
    int n_ins;              /* leading full blocks known to be in the cache */
    int n_hit;              /* prompt tokens served from the cache */
    bool prefetched;        /* the disk tier has loaded what it holds of the prompt */
    int prefetch_disk;      /* tokens that load added to the RAM cache's hit */
    int32_t *ckpt_at;       /* [n_ckpt_at] ascending block ends past the ordinary ones where a
                             * hybrid checkpoints its prompt (lm_cache_policy_plan) */
    int n_ckpt_at;
    bool has_gen_ckpt;      /* this request made the checkpoint on entry gen_ckpt */
    uint64_t gen_ckpt;
    uint64_t hist_id;
    lm_request_trace tr;
    int32_t *step_batch;    /* [max_tokens] for tr.step_batch */
    /* an embedding request (lm_engine_submit_embed): no tokens generated,
     * no prefix cache; pool folds in its hidden rows step by step */
    bool embed;
    lm_embed_pool pool;
    float *embedding;       /* [D] the pooled vector, at the end */
    /* constrained decoding: the request's matcher, live once its trigger
     * (if any) was generated */
    lm_grammar_matcher *gm;
    bool gm_live;
    /* masks computed during the forward (mask_ahead.c): rows pre_row0 ..
     * pre_row0 + pre_n - 1 of the post pre_serial, from the matcher at
     * step pre_steps0; pre_next the next to hand out */
    uint64_t pre_serial;
    int pre_row0, pre_n, pre_next, pre_steps0;
    lm_spec_req spec;       /* speculative decoding (spec.c), zero when it never drafted */
};

typedef struct lm_mask_ahead lm_mask_ahead;
typedef struct lm_step_policy lm_step_policy;

/* One step's forward as the scheduler sees it: which request owns each
 * batch sequence and each output row, and where the outputs land. The
 * arrays are the engine's, sized at creation for parallel sequences and
 * parallel * (1 + lm_spec_max_draft) rows. */
typedef struct lm_step {
    const lm_step_policy *policy;
    bool queued;             /* issued by the last step's policy (look-ahead), not built by this one */
    int T, S, n_out;         /* tokens, sequences, output rows */
    int n_draft;             /* draft tokens among T (lm_spec.h) */
    lm_request **seq_req;    /* [S] request of each batch sequence */
    int *seq_n;              /* [S] its tokens in this forward */
    lm_request **row_req;    /* [n_out] request of each output row */
    int32_t *ids;            /* [n_out] argmax of each row, from the backend */
    uint8_t *want_logits;    /* [n_out] rows whose request needs the full logits */
    bool masked;             /* the look-ahead: the argmax waits for the rows' grammar masks (after_forward) */
    int *allowed;            /* [parallel] with masked: tokens each row's mask allowed, -1: no mask */
    float *logits;           /* [n_out][V] those rows' logits */
    int *seq_h0, *seq_hn;    /* [S] an embedding sequence's first hidden row and count (0: none) */
} lm_step;

/* What a step does once its forward is issued. step() picks one per built
 * step, first that applies: speculation (when it drafted), the look-ahead
 * (lm_ahead_claim), plain. A policy may issue the next step's forward
 * itself and leave it in en->queued (with the policy that finishes it);
 * the next step then takes that forward as it is. */
struct lm_step_policy {
    const char *name;
    bool argmax_later;   /* the forward returns before its ids; after_forward waits for them */
    /* The forward is issued, its ids not yet read (NULL: nothing to do). */
    void (*after_forward)(lm_engine *en, lm_step *st);
    /* Reads the ids and logits, advances the sequences, hands out tokens. */
    void (*hand_out)(lm_engine *en, lm_step *st);
    /* A queued step nobody will take, the engine stopping (NULL: the
     * policy never queues). */
    void (*abandon)(lm_engine *en, lm_step *st);
};

struct lm_engine {
    lm_model *m;
    lm_kv_cache *kv;
    lm_engine_opts o;
    int vocab;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stopping;               /* under mu */
    lm_request *q_head, *q_tail; /* under mu: waiting for admission */
    int n_queued;                /* under mu */
    lm_request **running;        /* [parallel] */
    int n_running;
    lm_engine_stats st;          /* under mu; the engine thread publishes after each step */
    uint64_t step_generated;
    /* the step */
    lm_batch_builder *bb;        /* every batch the engine sends, one at a time */
    lm_step cur;                 /* the step step() builds */
    lm_step *queued;             /* a forward already issued for the next step, or NULL */
    float *work;                 /* [V] biased/penalised copy for sampling */
    uint32_t *gmask;             /* [V / 32] a grammar's token mask */
    uint64_t grammar_masks;      /* published into st after each step */
    double grammar_mask_s;
    uint64_t grammar_fill_tokens;
    float *hidden;               /* [lm_engine_max_step][D] hidden rows of embedding requests; made at the first */
    /* prefix cache (cache_policy.c) */
    lm_prefix_cache *pc;         /* NULL without one */
    lm_req_history *hist;
    bool stateful;               /* the model has recurrent state (or sliding-window rings) */
    int ring;                    /* blocks per sequence of the sliding-window rings (lm_kv_ring_for); 0: none */
    int bs;                      /* tokens per KV block */
    int ckpt_slots;              /* recurrent-state slots set aside for checkpoints */
    size_t fit_bytes;            /* the caches' device bytes as lm_fit_memory counted them */
    int32_t *hit_blocks;         /* [ctx / bs + 2] lookup scratch */
    lm_disk_cache *dc;           /* the disk tier (disk_tier.c), NULL without one */
    uint8_t *dc_buf;             /* [max(block bytes, state bytes)] its host copy of one entry */
    /* greedy look-ahead (lookahead.c) */
    bool ahead_on;
    bool ahead_masked;           /* ... also for requests under a grammar, masked on the backend */
    uint32_t *ahead_masks;       /* [parallel][V / 32] a masked step's rows' masks */
    uint8_t *ahead_rows;         /* [parallel] which of its rows have one */
    uint64_t grammar_masks_chained; /* masks computed while a look-ahead forward ran, applied on the backend */
    lm_step ahead[2];            /* queued steps, alternating: one is handed out while the next runs;
                                  * each holds a reference to its requests */
    int ahead_next;              /* ahead[ahead_next]: where the next one is queued */
    /* grammar masks computed while the forward runs (mask_ahead.c): NULL when off */
    lm_mask_ahead *ma;
    double grammar_wait_s;       /* the engine thread's time on masks after the forwards */
    uint64_t grammar_masks_ahead; /* masks taken from the helper */
    /* speculative decoding (spec.c): NULL when off */
    lm_spec *spec;
    lm_spec_mtp *spec_mtp;       /* its MTP proposer (spec_mtp.c), NULL without */
    lm_model *dm_model;          /* LM_SPEC_DRAFT: the draft model, loaded before the fit */
    lm_spec_dm *spec_dm;         /* its proposer (spec_draft.c), NULL without */
};

/* ---- engine.c: requests and the plain step ---- */

/* An option whose 0 means "on backends with their own memory (GPUs)",
 * above 0 always and below 0 never (warmup, look_ahead, mask_ahead). */
bool lm_engine_opt_on(const lm_engine *en, int opt);
/* The most tokens one forward takes: the larger of the two step budgets
 * (what the step's builder, buffers and warm-up are sized for). */
static inline int lm_engine_max_step(const lm_engine *en) {
    return LM_MAX(en->o.step_tokens, en->o.prefill_tokens);
}

void lm_req_unref(lm_request *r);
/* Whether r's next token is the backend's argmax of the model's logits
 * (nothing needs the logits on the host). */
bool lm_req_plain_greedy(const lm_request *r);
/* One token for r (logits NULL: the backend's argmax `greedy`, under r's
 * grammar mask where it has one, -1 when that mask allowed nothing):
 * report it, append it, finish r when due. */
void lm_req_take_token(lm_engine *en, lm_request *r, const float *logits, int32_t greedy);
/* A forward of T tokens over S sequences into the stats (takes mu). */
void lm_step_count(lm_engine *en, int T, int S, bool ahead, uint64_t discarded);
/* Batch sequence i of st advances by its tokens (trace, cache, embedding). */
void lm_step_advance(lm_engine *en, lm_step *st, int i);
/* The plain hand-out: count the step, advance every sequence by its
 * tokens, then one token per output row. */
void lm_step_hand_out(lm_engine *en, lm_step *st);

/* ---- cache_policy.c ---- */

/* What admission found of a prompt (lm_cache_policy_lookup). */
typedef struct lm_cache_hit {
    lm_pcache_hit ram;       /* the RAM cache's hit, its entries pinned */
    int disk_tokens;         /* of ram.n_tokens, those the disk tier loaded for it */
    const int32_t *blocks;   /* [ram.n_blocks] its blocks, shared by reference */
    double t_lookup;         /* when the lookup began; restore_s counts from t_found */
    double t_found;
} lm_cache_hit;

/* Sets up the prefix cache (cache_blocks > 0: en->pc, with en->ckpt_slots
 * checkpoint slots) and its disk tier (en->o.cache_dir), the request
 * history and the lookup scratch. -1 with e when the disk tier cannot open. */
int lm_cache_policy_create(lm_engine *en, size_t cache_blocks, lm_err *e);
void lm_cache_policy_free(lm_engine *en);
/* Before admission (engine thread, mu not held): the disk tier's entries
 * of the queue head's prompt into the RAM cache, once per request, so that
 * admission finds them in RAM and no disk read runs under mu. */
void lm_cache_policy_prefetch(lm_engine *en);
/* At admission (under mu): what of r's prompt is cached. Every lookup is
 * followed by lm_cache_policy_restore or lm_cache_policy_unpin. */
void lm_cache_policy_lookup(lm_engine *en, lm_request *r, lm_cache_hit *hit);
/* Evicts cache-only blocks until the pool has `blocks` free; false when it cannot. */
bool lm_cache_policy_make_room(lm_engine *en, int blocks);
void lm_cache_policy_unpin(lm_engine *en);
/* r holds the hit's blocks and its state slot: copy the partly shared
 * block and the checkpoint in, record the trace, the diagnosis and stats. */
void lm_cache_policy_restore(lm_engine *en, lm_request *r, const lm_cache_hit *hit);
/* r's extra prompt checkpoint positions (r->ckpt_at) from the message
 * boundaries the caller marked (lm_gen_params.prompt_marks). */
void lm_cache_policy_plan(const lm_engine *en, lm_request *r, const int32_t *marks, int n);
/* A prefill chunk of n tokens of r, cut at the next checkpoint position. */
int lm_cache_policy_cut(const lm_engine *en, const lm_request *r, int n);
/* After a forward: r's filled blocks into the cache, its checkpoint. */
void lm_cache_policy_progress(lm_engine *en, lm_request *r);
/* r ends (keep: not by an error): its blocks stay cached; the history learns its tokens. */
void lm_cache_policy_finish(lm_engine *en, lm_request *r, bool keep);
/* Whether a sequence reaching n_cached tokens may take a state checkpoint. */
bool lm_cache_policy_may_checkpoint(const lm_engine *en, int n_cached);
/* The cache's figures into en->st (under mu). */
void lm_cache_policy_stats(lm_engine *en);

/* ---- disk_tier.c ---- */

/* Opens en->o.cache_dir for entries of identity ident; hooks into en->pc. */
int lm_disk_tier_open(lm_engine *en, const uint64_t ident[2], lm_err *e);
/* Writes what is queued and closes. */
void lm_disk_tier_close(lm_engine *en);
/* Queues pool block `block` (if >= 0) and state slot `ckpt` (if >= 0) as
 * the entries of `hash` unless the disk has them. */
void lm_disk_tier_spill(lm_engine *en, uint64_t hash, uint64_t parent, const int32_t *tokens, int32_t block,
                        int32_t ckpt);
/* r's full blocks [from, to) and their checkpoints (as they fill, and at its end). */
void lm_disk_tier_keep(lm_engine *en, const lm_request *r, int from, int to);
/* Loads from disk into the RAM cache what extends r's RAM hit `ram` (the
 * RAM lookup's pins held); true when it loaded anything (look up again). */
bool lm_disk_tier_extend(lm_engine *en, const lm_request *r, const lm_pcache_hit *ram);

/* ---- lookahead.c ---- */

void lm_ahead_create(lm_engine *en);
void lm_ahead_free(lm_engine *en);
/* Whether the built step st may run under the look-ahead policy; if so,
 * its rows under a grammar read no logits and take their masks on the
 * backend (st->masked). */
bool lm_ahead_claim(lm_engine *en, lm_step *st);
extern const lm_step_policy lm_ahead_policy;

/* ---- mask_ahead.c ---- */

/* A helper thread for masks over vocab ids, rows output rows a step at
 * most; NULL when no thread can be started (masks are then computed
 * inline). */
lm_mask_ahead *lm_mask_ahead_create(int vocab, int rows);
void lm_mask_ahead_free(lm_mask_ahead *ma);
/* Posts the masks of st's rows whose request has a live grammar (bb the
 * step's built batch, before its forward); returns how many requests. The
 * engine thread leaves their matchers alone until lm_mask_ahead_wait. */
int lm_mask_ahead_start(lm_mask_ahead *ma, const lm_step *st, const lm_batch_builder *bb);
/* Until the post's masks are done (computing what the helper has not
 * started); returns the seconds it took, *mask_s the computing time. */
double lm_mask_ahead_wait(lm_mask_ahead *ma, double *mask_s);
/* r's next mask of the post if r stands where it was computed for (sets
 * *count, the tokens it allows), else NULL. */
const uint32_t *lm_mask_ahead_take(lm_mask_ahead *ma, lm_request *r, int *count);

/* ---- fit.c ---- */

/* The pool's size in en->bs-token blocks: n_blocks for sequences (KV tokens
 * shrunk to fit a GPU's free memory unless opts named them), cache_blocks
 * for the prefix cache; sets en->stateful and en->ckpt_slots, and en->o's
 * kv_tokens and ctx as fitted. */
int lm_fit_memory(lm_engine *en, const lm_engine_opts *opts, int *n_blocks, size_t *cache_blocks, lm_err *e);
/* lm_engine_opts.warmup's forwards; on a GPU with the default
 * prefill_tokens, first of step_tokens and twice that, and prefill_tokens
 * lowered to what their memory use leaves room for (lm_fit_prefill_tokens).
 * auto_prefill: prefill_tokens was not given. */
int lm_fit_warm_up(lm_engine *en, bool auto_prefill, lm_err *e);
/* The prompt-only step budget the device's memory allows: warm-ups of
 * step and 2 * step tokens took used1 and used2 bytes and left free_b free;
 * the growth between them is taken as each further token's, and half of
 * free_b is kept in reserve. want when it fits, else the largest multiple
 * of step below it that does, at least step. */
int lm_fit_prefill_tokens(int step, int want, size_t used1, size_t used2, size_t free_b);

#endif
