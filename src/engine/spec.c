/* spec.c - speculative decoding's entry points (lm_spec.h), without a
 * proposer: they exist so that the step has one place that speculation
 * fills in, next to the look-ahead, rather than a special case inside
 * step(). Every function here is a no-op or unreachable until a proposer
 * and verification land. */
#include "engine_internal.h"

#include <stdlib.h>

lm_spec *lm_spec_create(lm_model *m) {
    (void)m; /* no proposer is wired: the step never drafts */
    return NULL;
}

void lm_spec_free(lm_spec *sp) { free(sp); }

int lm_spec_max_draft(const lm_spec *sp) {
    (void)sp; /* no proposer, no drafts */
    return 0;
}

int lm_spec_propose(lm_engine *en, lm_step *st, int s, lm_request *r, int max) {
    (void)st, (void)s, (void)r, (void)max;
    LM_ASSERT(en->spec == NULL); /* a proposer would append its draft here */
    return 0;
}

/* Acceptance and rollback would go here (lm_spec.h, points 3 and 4). A step
 * gets this policy only when it drafted, which no step does yet; without
 * drafts a speculative step is a plain one. */
static void spec_hand_out(lm_engine *en, lm_step *st) {
    LM_ASSERT(st->n_draft == 0);
    lm_step_hand_out(en, st);
}

const lm_step_policy lm_spec_policy = {
    .name = "speculative",
    .argmax_later = false,
    .after_forward = NULL,
    .hand_out = spec_hand_out,
    .abandon = NULL,
};
