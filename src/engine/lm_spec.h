/* lm_spec.h - speculative decoding's place in the engine: the contract, and
 * the entry points the step calls (spec.c: the verifier and the adaptive
 * policy; spec_lookup.c: the n-gram proposer; spec_mtp.c: the MTP head's;
 * spec_draft.c: a separate draft model's).
 *
 * The contract, for one decoding sequence r in one step:
 *
 *  1. Proposer. While the step's batch is built, right after r's next
 *     token t0, a proposer guesses up to k tokens d1..dk to follow it: the
 *     model's own draft head (the MTP head Qwen3.5 checkpoints carry,
 *     lm_qwen35.h), a separate smaller model with the same tokenizer
 *     decoding them greedily, or n-grams of r's own tokens. k is bounded by the step's
 *     token budget, by r's max_tokens and by the context, so the drafts stay
 *     inside the blocks r reserved at admission, and by the adaptive policy
 *     below.
 *  2. Verifier. The step's one forward feeds t0 d1..dk at positions
 *     p..p+k (consecutive tokens of one sequence, like a prefill chunk) with
 *     an output row each: row j is the model's next-token distribution
 *     after t0 d1..dj. Other sequences decode and prefill beside it.
 *  3. Acceptance. Row 0 gives x1 exactly as a plain step would (r's
 *     sampler, bias and penalties); while x_j == d_j, row j gives x_j+1. The
 *     m <= k + 1 tokens x1..xm are handed out one by one as ordinary tokens
 *     (stop tokens, max_tokens and the context end them early), so greedy
 *     output is the tokens of plain decoding. A sampled request draws every
 *     row with its own sampler, in order, and keeps drafting only while the
 *     draw equals the draft: each token is still drawn from the model's
 *     distribution given the tokens before it, with the same generator
 *     calls as plain decoding, so a seeded request gives the same tokens
 *     with and without speculation. (Rejection sampling against the draft's
 *     probabilities would accept more but change a seeded request's tokens,
 *     so it is not used.)
 *  4. Rollback. The forward wrote K/V at p..p+k and advanced r's recurrent
 *     state through all k + 1 tokens. Paged K/V needs nothing: n_cached
 *     grows by m, later forwards overwrite the rows past it, and the prefix
 *     cache only ever takes blocks below n_cached. Recurrent state (Gated
 *     DeltaNet conv window and delta state, sliding-window rings) cannot be
 *     stepped back; two ways:
 *     - per position, where the backend keeps it (lm_model_state_out: the
 *       CPU's recurrent ops; Gated DeltaNet models): the verify forward
 *       also writes r's state after t0 and after each draft but the last
 *       into spare slots (lm_batch_set_state_out). With j drafts accepted
 *       r takes the slot of position p + j (a swap of slot ids, no copy),
 *       the others go back, and nothing is fed again;
 *     - copy and replay, elsewhere (CUDA, Gemma's rings, or
 *       lm_engine_opts.spec_replay): the verifier copies r's slot to a
 *       spare one before the forward. When every draft is accepted the
 *       forward's state is r's. On a rejection r takes the copy (the state
 *       at p; a slot swap) and n_cached stays at p: the next step feeds t0
 *       x1..xm again in front of its own token and draft ("replay", folded
 *       into a forward that runs anyway; a rejection there goes back to
 *       the same copy, so the replayed run grows until a draft is accepted
 *       whole, or until it reaches LM_SPEC_MAX_REPLAY tokens and a step
 *       catches up undrafted).
 *     Measured (docs/architecture.md): a token fed again costs ~45 % of a
 *     step on the demo on the CPU; keeping the state per position costs
 *     the slot writes, within the noise of a verify forward. A proposer
 *     with state of its own (the MTP head's K/V) rolls back the same way
 *     either way: its rows past the accepted position are rewritten; a
 *     draft model checks the guesses it fed against r's tokens and keeps
 *     its rows up to the first that differs (a recurrent draft goes back to
 *     a copy of its state from before its guesses).
 *
 * Adaptive policy (spec_policy.c): per sequence, an estimate of the chance
 * that draft position i is accepted given i - 1 was, and a model of the
 * step's cost (time = a + b * tokens, fitted from the steps it sees, plus
 * the time to propose), choose each step the k that maximises tokens per
 * second; k = 0 when no k beats plain decoding, with a one-token probe now
 * and then to notice that drafts pay again. The MTP head runs per
 * sequence, only where it is expected to pay with its own time counted
 * (spec.c's head_decide); where it does not it is off for that sequence
 * for good, so the sequence decodes as plain decoding does.
 *
 * A step with drafts is never the look-ahead's (lm_ahead_claim wants one
 * token per sequence, its ids on the device; speculation reads every row on
 * the host): step() gives it lm_spec_policy instead. A step where no
 * sequence drafts may be claimed by the look-ahead, which then queues the
 * next ones without proposals while no sequence would draft
 * (lm_spec_would_draft: the policy says it pays and the lookup has a
 * hit), so sequences the policy turned off decode at the look-ahead's
 * pace. With the MTP head only while no running sequence has it on (it
 * reads every step's hidden rows on the host); never with a callback
 * proposer. Embeddings do not speculate. A grammar-constrained
 * request speculates with lookup, a draft model (or a callback), never the
 * MTP head: its
 * draft is cut at the first token its grammar refuses (checked on its
 * matcher and rolled back) and at a stop token, before it joins the batch;
 * each verified row is then sampled under its mask as any of its tokens,
 * and a strict fill after a row ends the run there (the rows after it do
 * not follow the forced tokens). */
#ifndef LM_SPEC_H
#define LM_SPEC_H

#include "lm_engine.h"

typedef struct lm_spec lm_spec;
struct lm_step;
struct lm_step_policy;

/* Most tokens a stateful sequence feeds again after rejections before a
 * step catches it up without a draft. */
#define LM_SPEC_MAX_REPLAY 16

/* The MTP head runs for a sequence only where it is expected to beat
 * plain decoding by this factor, its own time counted; a decoding sequence
 * where it does not for this many steps in a row has it turned off. */
#define LM_SPEC_HEAD_MARGIN 1.10
#define LM_SPEC_HEAD_POOR 8

/* Probes: a sequence the policy turned off drafts one token after
 * LM_SPEC_PROBE_EVERY plain steps (lm_spec_probe_every: more while a step
 * with drafts costs much), on a step where the others due probe too (each
 * step with a draft pays the penalty of lm_spec_draft_penalty once,
 * however many sequences draft in it); and after LM_SPEC_PLAIN_EVERY
 * steps with drafts (LM_SPEC_PLAIN_FIRST while the plain steps' wall time
 * is not yet known), LM_SPEC_PLAIN_RUN steps draft nothing, so that plain
 * steps are timed at the look-ahead's pace (the first of a run is not). */
#define LM_SPEC_PROBE_EVERY 16
#define LM_SPEC_PLAIN_EVERY 256
#define LM_SPEC_PLAIN_FIRST 8
#define LM_SPEC_PLAIN_RUN 4

/* n-gram lengths the lookup proposer matches, longest first. */
#define LM_LOOKUP_NMIN 2
#define LM_LOOKUP_NMAX 4

/* A request's own speculation state (lm_request.spec). */
typedef struct lm_spec_req {
    /* lookup: for each n-gram length n, a hash table of the position that
     * followed the latest n tokens of that hash (-1: empty) */
    int32_t *ngram[LM_LOOKUP_NMAX - LM_LOOKUP_NMIN + 1];
    uint32_t ngram_mask;   /* table size - 1 */
    int n_indexed;         /* positions < n_indexed are in the tables */
    /* adaptive policy */
    float acc[LM_SPEC_MAX_DRAFT]; /* P(draft i + 1 accepted | draft i was), smoothed */
    int quiet;             /* decode steps since it last drafted */
    int k_last;            /* the draft length the policy chose last */
    bool head_share;       /* this step's MTP head time is partly its */
    bool mtp_seen;         /* the head's policy has decided on it once */
    bool mtp_off;          /* the head does not pay for it: never runs for it again */
    int mtp_poor;          /* decode steps in a row where the head did not pay */
    /* MTP (spec_mtp.c) */
    int mtp_n;             /* the head's K/V cover positions < mtp_n */
    int hid_pos;           /* position of the hidden row in hid */
    float *hid;            /* [D] the model's final hidden state at hid_pos, NULL before the first */
    int32_t mtp_draft[LM_SPEC_MAX_DRAFT]; /* the head's guesses after token mtp_draft_at - 1 */
    int mtp_n_draft, mtp_draft_at;
    int want;          /* how many guesses the proposer's next chain makes (MTP, draft model) */
    /* draft model (spec_draft.c) */
    bool dm_seen;          /* the policy has decided on it once (spec.c) */
    bool dm_started;       /* its start was decided (dm_start) */
    bool dm_off;           /* no guesses for it: the draft does not pay, or no state slot was free */
    int dm_n;              /* the draft's cache covers positions < dm_n */
    int dm_rec;            /* its full blocks below dm_rec have their hash recorded */
    int32_t dm_slot, dm_snap; /* a recurrent draft's state slot and snapshot, + 1 (0: none) */
    int dm_at;             /* position of guess dm_draft[0], -1: no guesses */
    int dm_fed;            /* guesses fed by the chain (at dm_at .. dm_at + dm_fed - 1) */
    int32_t dm_draft[LM_SPEC_MAX_DRAFT];
    int dm_n_draft;
} lm_spec_req;

void lm_spec_req_free(lm_spec_req *q);

/* Sets en->spec for en->o.spec (NULL when off); -1 with e when the model
 * lacks what the mode needs. Call once the KV cache exists. */
int lm_spec_create(lm_engine *en, lm_err *e);
void lm_spec_free(lm_spec *sp);
/* Extra recurrent-state slots speculation needs on a stateful model: one
 * per draft position and running sequence where the state is kept per
 * position, else one snapshot per running sequence. */
int lm_spec_state_slots(const lm_engine_opts *o, const lm_model *m, bool stateful);
/* Bytes of a block (block tokens) of the MTP head's own KV pool, which has
 * as many blocks as the engine's (lm_mtp_create); 0 when the mode does not
 * use the head or the model has none. */
size_t lm_spec_head_block_bytes(const lm_engine_opts *o, const lm_model *m, int block);
/* Most draft tokens a step adds to one sequence (0 without a proposer); the
 * engine sizes its output rows for 1 + this per sequence. */
int lm_spec_max_draft(const lm_spec *sp);
/* Called by the step for every decoding sequence s (request r, its tokens
 * up to t0 just added to the batch): may append up to max draft tokens
 * after them, each with an output row, counting them in the step's
 * n_draft. Returns how many. Without a proposer it returns 0 and touches
 * nothing. */
int lm_spec_propose(lm_engine *en, struct lm_step *st, int s, lm_request *r, int max);
/* Whether r may draft if its next step is built rather than queued by the
 * look-ahead: the policy would draft for it and the lookup proposer has a
 * hit on its tokens so far (always true for a callback proposer, a fixed
 * depth or a request that never drafted; counts a plain step towards the
 * policy's probe otherwise). The look-ahead's chain stops for it. */
bool lm_spec_would_draft(lm_engine *en, lm_request *r);
/* The policy of a step with drafts: acceptance and rollback (3 and 4). */
extern const struct lm_step_policy lm_spec_policy;
/* A built step, before its forward: the hidden rows the MTP proposer reads. */
void lm_spec_before_issue(lm_engine *en, struct lm_step *st);
/* After any step's hand-out: the MTP proposer's guesses for the next, and
 * the step's wall time since lm_spec_step_start (at the start of every
 * engine step) learnt by its kind. */
void lm_spec_after_hand_out(lm_engine *en, struct lm_step *st);
void lm_spec_step_start(lm_engine *en);
/* Before the first request: times forwards of 1 and 1 + max draft tokens
 * and, with the MTP proposer, one of the head, on a scratch sequence, so
 * that the adaptive policy starts from this machine's costs rather than a
 * guess (the first requests would otherwise pay for learning them). */
void lm_spec_calibrate(lm_engine *en);
/* After any built step's forward (forward_s: how long issuing it took):
 * the cost model learns from steps without drafts too. */
void lm_spec_after_issue(lm_engine *en, struct lm_step *st, double forward_s);

/* ---- the adaptive policy (spec_policy.c) ---- */

/* A draft length is chosen only where it beats plain decoding by this
 * factor (the model's error, the draft's bookkeeping). */
#define LM_SPEC_DRAFT_MARGIN 1.02

typedef struct lm_spec_cost {
    int max_draft;
    bool replay;          /* a rejection feeds the accepted run again (copy-and-replay rollback) */
    double sw, st, stt, sy, sty; /* least-squares sums of decode steps: weight, T, T^2, seconds, T seconds */
    double draft_s_per;   /* smoothed seconds one proposal takes (lookup, callback) */
    double mtp_s_per;     /* smoothed seconds of the MTP head a decoding sequence and step */
    double mtp_tok_s;     /* smoothed seconds of its catch-up a prompt token */
    double guess_s;       /* smoothed seconds a draft model's guess costs a sequence (a draft
                           * forward's share; 0 without a draft model) */
    float mtp_acc[LM_SPEC_MAX_DRAFT]; /* the head's acceptance per position over all sequences */
    float dm_acc[LM_SPEC_MAX_DRAFT];  /* a draft model's, the same way */
    /* whole decode steps by the wall clock (the engine's step from its start
     * to the end of the hand-out: host work included, and with the
     * look-ahead the next step's issue overlapping) less the fitted b T,
     * smoothed over steps with drafts and over steps without */
    double wall_draft, wall_plain;
    int n_wall_draft, n_wall_plain;
} lm_spec_cost;

void lm_spec_cost_init(lm_spec_cost *c, int max_draft, bool replay);
/* A decode step of T tokens took s seconds. */
void lm_spec_cost_learn(lm_spec_cost *c, int T, double s);
/* The fitted step time a + b T; before enough steps, a guess that makes a
 * token cost a tenth of a step. */
void lm_spec_cost_model(const lm_spec_cost *c, double *a, double *b);
/* A whole decode step of T tokens, with drafts or without, took s seconds
 * of wall time. */
void lm_spec_wall_learn(lm_spec_cost *c, bool drafted, int T, double s);
/* What a step pays for having drafts at all beyond its tokens: the wall
 * time of drafting steps over plain ones at the same T (on a GPU, plain
 * steps overlap the host's work through the look-ahead and drafting ones
 * cannot); 0 until both kinds have LM_SPEC_WALL_MIN steps. */
#define LM_SPEC_WALL_MIN 4
double lm_spec_draft_penalty(const lm_spec_cost *c);
/* Steps between probe steps with S sequences running: LM_SPEC_PROBE_EVERY,
 * or as many as keep the probes' penalties near 1 % of the steps' time,
 * at most LM_SPEC_PROBE_MAX. */
#define LM_SPEC_PROBE_MAX 1024
int lm_spec_probe_every(const lm_spec_cost *c, int S);
/* The draft length (at most max) that maximises the expected tokens per
 * second of a sequence with acceptance acc among S running; 0 when none
 * beats plain decoding by LM_SPEC_DRAFT_MARGIN. head: the MTP head runs for
 * it (its chained guesses cost); otherwise each guess costs guess_s (a
 * draft model's forward). The step's draft penalty is charged to the
 * sequence whole, as if it drafted alone. */
int lm_spec_best_k(const lm_spec_cost *c, const float *acc, int max, int S, bool head);
/* Whether some depth with the head beats plain decoding by
 * LM_SPEC_HEAD_MARGIN with the head's own time counted (each step's
 * catch-up, half that per chained guess) and extra seconds a step. */
bool lm_spec_head_pays(const lm_spec_cost *c, const float *acc, int S, double extra);
/* The head's work after a step took dt seconds: n_tok tokens fed, for
 * n_decoding decoding sequences; prefill: it caught up over a prompt
 * chunk (then only the per-token time learns). */
void lm_spec_head_learn(lm_spec_cost *c, double dt, int n_decoding, int n_tok, bool prefill);
/* After a verify of k drafts with accepted accepted: positions 1..accepted
 * were accepted, accepted + 1 (if drafted) was not; rate: the smoothing. */
void lm_spec_acc_learn(float *acc, int k, int accepted, float rate);

/* ---- proposers (spec_lookup.c, spec_mtp.c) ---- */

typedef struct lm_spec_mtp lm_spec_mtp;
/* The MTP proposer for en's model, NULL (e untouched) when the model has no
 * draft head; NULL with e set when its pool cannot be made. */
lm_spec_mtp *lm_mtp_create(lm_engine *en, lm_err *e);
void lm_mtp_free(lm_spec_mtp *M);
/* Bytes of the head's KV pool (0 for NULL). */
size_t lm_mtp_bytes(const lm_spec_mtp *M);
void lm_mtp_before_issue(lm_engine *en, struct lm_step *st);
/* known[s]: where batch sequence s's real tokens end among those the step
 * fed (-1: all of them were real). Returns the tokens the head was fed. */
int lm_mtp_after_hand_out(lm_engine *en, struct lm_step *st, const int *known);
/* Whether r's positions go through the head (it speculates, and the
 * policy has not turned the head off for it). */
bool lm_mtp_tracked(const lm_request *r);
/* The head over a batch of the caller's (its rows' hidden states: hidden;
 * at most parallel out rows), its K/V into the head's pool
 * (lm_spec_calibrate's timing). */
struct lm_batch_builder;
int lm_mtp_forward_scratch(lm_engine *en, struct lm_batch_builder *bb, const float *hidden, lm_err *e);
/* The head's guesses after r's newest token (at most max), 0 when none. */
int lm_mtp_propose(const lm_request *r, int32_t *draft, int max);

typedef struct lm_spec_dm lm_spec_dm;
/* A draft model for m from path: its tokenizer must map every id to the
 * same token as m's (checked first); loaded on m's backend. */
int lm_dm_load(lm_model **out, const char *path, const lm_model *m, lm_err *e);
/* Bytes of a block (block tokens) of draft dm's own pool, and of its state
 * slots (two a running sequence; 0 for an attention draft). */
size_t lm_dm_block_bytes(const lm_engine_opts *o, const lm_model *dm, int block);
size_t lm_dm_state_bytes(const lm_engine_opts *o, const lm_model *dm, int block);
/* The draft-model proposer over dm (not owned), its pool as large as the
 * engine's; NULL with e when it cannot be made. */
lm_spec_dm *lm_dm_create(lm_engine *en, lm_model *dm, lm_err *e);
void lm_dm_free(lm_spec_dm *D);
size_t lm_dm_bytes(const lm_spec_dm *D);
/* Whether r's tokens go through the draft. */
bool lm_dm_tracked(const lm_engine *en, const lm_request *r);
/* After a step's hand-out: the draft catches up over st's sequences and
 * guesses r->spec.want tokens for those that want them. Returns the
 * sequence-forwards it ran for decoding sequences' guesses; *lag: a
 * catch-up over a prompt or a long gap was among them (not a decode
 * step's cost); *fed: the tokens its forwards fed. */
int lm_dm_after_hand_out(lm_engine *en, struct lm_step *st, bool *lag, int *fed);
/* The draft's guesses after r's newest token (at most max), 0 when none. */
int lm_dm_propose(const lm_request *r, int32_t *draft, int max);
/* r ends: its state slots go back. */
void lm_dm_end(lm_engine *en, lm_request *r);
/* Seconds of one draft forward of one token at pos over the scratch
 * table (lm_spec_calibrate); 0 on an error. */
double lm_dm_time_guess(lm_engine *en, const int32_t *table, int pos);

/* Up to max tokens that followed the latest earlier occurrence of r's last
 * n tokens (n from LM_LOOKUP_NMAX down to LM_LOOKUP_NMIN) into draft. */
int lm_lookup_propose(lm_spec_req *q, const int32_t *tokens, int n_tokens, int cap, int32_t *draft, int max);

#endif
