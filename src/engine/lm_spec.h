/* lm_spec.h - speculative decoding's place in the engine: the contract, and
 * the entry points the step calls. Nothing speculates yet: no proposer
 * exists, lm_spec_create returns NULL, lm_spec_propose adds no draft, and
 * no step runs lm_spec_policy.
 *
 * The contract, for one decoding sequence r in one step:
 *
 *  1. Proposer. While the step's batch is built, right after r's next
 *     token t0, a proposer guesses up to k tokens d1..dk to follow it: the
 *     model's own draft head (lm_arch.draft, e.g. the MTP head Qwen3.5
 *     checkpoints carry, lm_qwen35.h), a small draft model, or n-grams of
 *     r's own tokens. k is bounded by the step's token budget, by r's
 *     max_tokens and by the context, so the drafts stay inside the blocks r
 *     reserved at admission.
 *  2. Verifier. The step's one forward feeds t0 d1..dk at positions
 *     p..p+k (consecutive tokens of one sequence, like a prefill chunk) with
 *     an output row each: row j is the model's next-token distribution
 *     after t0 d1..dj. Other sequences decode and prefill beside it.
 *  3. Acceptance. Row 0 gives x1 exactly as a plain step would (r's
 *     sampler, bias and penalties); while x_j == d_j, row j gives x_j+1. The
 *     m <= k + 1 tokens x1..xm are handed out one by one as ordinary tokens
 *     (stop tokens, max_tokens and the context end them early), so greedy
 *     output is byte-identical to plain decoding. Rejection sampling against
 *     the draft's probabilities would change a seeded request's tokens, so
 *     it can only be a request-level choice.
 *  4. Rollback. The forward wrote K/V at p..p+k and advanced r's recurrent
 *     state through all k + 1 tokens. Paged K/V needs nothing: n_cached
 *     grows by m, later forwards overwrite the rows past it, and the prefix
 *     cache only ever takes blocks below n_cached. Recurrent state cannot be
 *     stepped back: the verifier must keep the state after each draft
 *     position (or copy the slot before the forward and replay x1..xm) and
 *     leave r's slot at p + m. A proposer with state of its own (its K/V,
 *     an MTP layer) rolls back the same way.
 *
 * A step with drafts is never the look-ahead's (lm_ahead_claim wants one
 * token per sequence, its ids on the device; speculation reads every row on
 * the host): step() gives it lm_spec_policy instead. */
#ifndef LM_SPEC_H
#define LM_SPEC_H

#include "lm_engine.h"

typedef struct lm_spec lm_spec;
struct lm_step;
struct lm_step_policy;

/* The engine's proposer for m, NULL when there is none: always NULL today.
 * No proposer is wired yet; an architecture's lm_draft (none has one) is
 * where the first will come from. */
lm_spec *lm_spec_create(lm_model *m);
void lm_spec_free(lm_spec *sp);
/* Most draft tokens a step adds to one sequence (0 without a proposer); the
 * engine sizes its output rows for 1 + this per sequence. */
int lm_spec_max_draft(const lm_spec *sp);
/* Called by the step for every decoding sequence s (request r, its token
 * t0 just added to the batch): may append up to max draft tokens after it,
 * each with an output row, counting them in the step's n_draft. Returns how
 * many. Without a proposer it returns 0 and touches nothing. */
int lm_spec_propose(lm_engine *en, struct lm_step *st, int s, lm_request *r, int max);
/* The policy of a step with drafts: acceptance and rollback (3 and 4).
 * Verification is not written; its hand-out asserts the step has no
 * drafts, which holds while no proposer exists. */
extern const struct lm_step_policy lm_spec_policy;

#endif
