/* spec_policy.c - speculative decoding's adaptive policy (lm_spec.h): a
 * model of what a step costs and what a draft is expected to give, so
 * that a sequence drafts only as far as it pays and the MTP head runs only
 * for sequences where it pays, its own time counted.
 *
 * Costs are measured, not assumed: a decode step of T tokens takes
 * a + b T seconds (least squares over recent steps, the sums decaying so
 * that the fit follows the machine's load); the head takes mtp_s_per a
 * decoding sequence and step (learnt from decode steps only: a catch-up
 * over a prompt chunk would inflate it tenfold) and mtp_tok_s a prompt
 * token (learnt from those catch-ups); a draft model's guess guess_s a
 * sequence (its forwards' time over the sequences in them, decode steps
 * only). A sequence's share of a step is
 * a / S + b with S sequences running. With acceptance p_i (draft i
 * accepted given i - 1 was), k drafts give 1 + sum_j prod_{i<=j} p_i
 * tokens at a cost of share + b k + the proposal's time; on the
 * copy-and-replay rollback a rejection also feeds its run again. Pure
 * functions of their arguments, so tests can drive them with made-up
 * costs. */
#include "engine_internal.h"

void lm_spec_cost_init(lm_spec_cost *c, int max_draft, bool replay) {
    *c = (lm_spec_cost){ .max_draft = max_draft, .replay = replay };
    for (int i = 0; i < LM_SPEC_MAX_DRAFT; i++) c->mtp_acc[i] = 0.9f, c->dm_acc[i] = 0.6f;
}

void lm_spec_cost_learn(lm_spec_cost *c, int T, double s) {
    const double keep = 0.995; /* a long memory: one step's time is noisy */
    c->sw = c->sw * keep + 1, c->st = c->st * keep + T, c->stt = c->stt * keep + (double)T * T;
    c->sy = c->sy * keep + s, c->sty = c->sty * keep + (double)T * s;
}

void lm_spec_cost_model(const lm_spec_cost *c, double *a, double *b) {
    double det = c->sw * c->stt - c->st * c->st;
    if (c->sw >= 4 && det > 1e-9 * c->sw * c->sw) {
        *b = (c->sw * c->sty - c->st * c->sy) / det;
        *a = (c->sy - *b * c->st) / c->sw;
        if (*b > 0 && *a > 0) return;
    }
    /* before enough steps: a token costs a tenth of a step */
    double mean = c->sw > 0 ? c->sy / c->sw : 1.0, tok = c->sw > 0 ? c->st / c->sw : 1.0;
    *b = mean / (10.0 + tok);
    *a = mean - *b * tok;
}

void lm_spec_wall_learn(lm_spec_cost *c, bool drafted, int T, double s) {
    double a, b;
    lm_spec_cost_model(c, &a, &b);
    const double x = s - b * T;
    double *w = drafted ? &c->wall_draft : &c->wall_plain;
    int *n = drafted ? &c->n_wall_draft : &c->n_wall_plain;
    *w = *n ? 0.9 * *w + 0.1 * x : x;
    if (*n < INT32_MAX) (*n)++;
}

double lm_spec_draft_penalty(const lm_spec_cost *c) {
    if (c->n_wall_draft < LM_SPEC_WALL_MIN || c->n_wall_plain < LM_SPEC_WALL_MIN) return 0;
    return LM_MAX(0.0, c->wall_draft - c->wall_plain);
}

int lm_spec_probe_every(const lm_spec_cost *c, int S) {
    double a, b;
    lm_spec_cost_model(c, &a, &b);
    const double step = a + b * LM_MAX(S, 1), pen = lm_spec_draft_penalty(c);
    const double every = step > 0 ? 100.0 * pen / step : 0; /* the probes' penalties: ~1 % of the steps' time */
    return every > LM_SPEC_PROBE_MAX ? LM_SPEC_PROBE_MAX : LM_MAX(LM_SPEC_PROBE_EVERY, (int)every);
}

int lm_spec_best_k(const lm_spec_cost *c, const float *acc, int max, int S, bool head) {
    double a, b;
    lm_spec_cost_model(c, &a, &b);
    const double share = a / LM_MAX(S, 1) + b; /* the sequence's part of a step without drafts */
    const double pen = lm_spec_draft_penalty(c);
    double best = 1.0 / share, expect = 0, run = 1;
    int k_best = 0;
    for (int k = 1; k <= max; k++) {
        run *= acc[k - 1];
        expect += run;
        /* while the head runs its catch-up is paid anyway: only the chained
         * guesses beyond the first are this choice's (about half its time each) */
        double cost = share + b * k + c->draft_s_per + pen + (head ? 0.5 * c->mtp_s_per * (k - 1) : c->guess_s * k);
        if (c->replay) cost += (1 - run) * b * (1 + expect); /* a rejection's run is fed again */
        double rate = (1 + expect) / cost;
        if (rate > best * LM_SPEC_DRAFT_MARGIN) best = rate, k_best = k;
    }
    return k_best;
}

bool lm_spec_head_pays(const lm_spec_cost *c, const float *acc, int S, double extra) {
    double a, b;
    lm_spec_cost_model(c, &a, &b);
    const double share = a / LM_MAX(S, 1) + b, h = c->mtp_s_per;
    extra += lm_spec_draft_penalty(c);
    double expect = 0, run = 1;
    for (int k = 1; k <= c->max_draft; k++) {
        run *= acc[k - 1];
        expect += run;
        double cost = share + b * k + h * (1 + 0.5 * (k - 1)) + extra;
        if (c->replay) cost += (1 - run) * b * (1 + expect);
        if ((1 + expect) / cost > LM_SPEC_HEAD_MARGIN / share) return true;
    }
    return false;
}

void lm_spec_head_learn(lm_spec_cost *c, double dt, int n_decoding, int n_tok, bool prefill) {
    if (prefill) {
        if (n_tok > 0) c->mtp_tok_s = 0.7 * c->mtp_tok_s + 0.3 * dt / n_tok;
    } else if (n_decoding > 0) {
        c->mtp_s_per = 0.9 * c->mtp_s_per + 0.1 * dt / n_decoding;
    }
}

void lm_spec_acc_learn(float *acc, int k, int accepted, float rate) {
    for (int i = 0; i < k && i <= accepted; i++) acc[i] = (1 - rate) * acc[i] + rate * (i < accepted ? 1.0f : 0.0f);
}
