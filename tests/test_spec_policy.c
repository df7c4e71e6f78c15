/* test_spec_policy.c - speculative decoding's adaptive policy
 * (spec_policy.c) driven with made-up costs: the fitted step time, the
 * draft length it picks, when the MTP head pays, what the head's timings
 * learn from, and the floor: over a grid of machines (step costs, head
 * costs, acceptance, batch sizes) the policy's expected rate under its own
 * model never falls below 0.97 of plain decoding's. The engine-level
 * behaviour (tokens unchanged, counters) is test_engine_spec.c's. */
#include "lm_test.h"

#include "engine/engine_internal.h"

#include <math.h>

/* Feeds n rounds of decode steps of 1 and 1 + k tokens on a machine where
 * a step of T tokens takes a + b T seconds. */
static void learn_machine(lm_spec_cost *c, double a, double b, int k, int n) {
    for (int i = 0; i < n; i++) {
        lm_spec_cost_learn(c, 1, a + b);
        lm_spec_cost_learn(c, 1 + k, a + b * (1 + k));
    }
}

static void fill(float *acc, float p) {
    for (int i = 0; i < LM_SPEC_MAX_DRAFT; i++) acc[i] = p;
}

LM_TEST(spec_policy_cost_model_and_draft_length) {
    lm_spec_cost c;
    lm_spec_cost_init(&c, 6, false);
    learn_machine(&c, 0.9e-3, 0.1e-3, 3, 20);
    double a, b;
    lm_spec_cost_model(&c, &a, &b);
    LM_CHECK_MSG(fabs(a - 0.9e-3) < 1e-9 && fabs(b - 0.1e-3) < 1e-9, "fitted a %g b %g", a, b);
    float acc[LM_SPEC_MAX_DRAFT];
    fill(acc, 0.9f); /* cheap tokens, good drafts: the longest pays */
    LM_CHECK(lm_spec_best_k(&c, acc, 6, 1, false) == 6);
    fill(acc, 0.05f); /* drafts almost never right: none */
    LM_CHECK(lm_spec_best_k(&c, acc, 6, 1, false) == 0);
    /* dear tokens (a forward of 2 costs 1.8 of 1): drafts only when nearly sure */
    lm_spec_cost_init(&c, 6, false);
    learn_machine(&c, 0.2e-3, 0.8e-3, 3, 20);
    fill(acc, 0.7f);
    LM_CHECK(lm_spec_best_k(&c, acc, 6, 1, false) == 0);
    fill(acc, 0.99f);
    LM_CHECK(lm_spec_best_k(&c, acc, 6, 1, false) > 0);
    /* replaying a rejection's run costs: never a longer draft than per position */
    lm_spec_cost r;
    lm_spec_cost_init(&r, 6, true);
    lm_spec_cost_init(&c, 6, false);
    learn_machine(&c, 0.3e-3, 0.12e-3, 3, 20);
    learn_machine(&r, 0.3e-3, 0.12e-3, 3, 20);
    for (float p = 0.3f; p < 1.0f; p += 0.1f) {
        fill(acc, p);
        LM_CHECK(lm_spec_best_k(&r, acc, 6, 1, false) <= lm_spec_best_k(&c, acc, 6, 1, false));
    }
    /* acceptance learning: accepted positions rise, the rejected one falls, later ones keep */
    fill(acc, 0.5f);
    lm_spec_acc_learn(acc, 3, 1, 0.5f);
    LM_CHECK(acc[0] == 0.75f && acc[1] == 0.25f && acc[2] == 0.5f);
}

/* The demo on the 2-core VM, roughly: a step 0.38 ms, a token 0.12 ms
 * more, the head half a step. */
LM_TEST(spec_policy_head_pays_with_its_own_time) {
    lm_spec_cost c;
    lm_spec_cost_init(&c, 3, false);
    learn_machine(&c, 0.26e-3, 0.12e-3, 3, 20);
    c.mtp_s_per = 0.18e-3;
    float acc[LM_SPEC_MAX_DRAFT];
    fill(acc, 0.9f);
    LM_CHECK(lm_spec_head_pays(&c, acc, 1, 0));
    LM_CHECK(!lm_spec_head_pays(&c, acc, 1, 0.15e-3)); /* a long prompt's catch-up over a short answer */
    fill(acc, 0.5f);
    LM_CHECK(!lm_spec_head_pays(&c, acc, 1, 0));
    fill(acc, 0.9f);
    c.mtp_s_per = 0.5e-3; /* a head dearer than a step */
    LM_CHECK(!lm_spec_head_pays(&c, acc, 1, 0));
    /* with copy and replay the same drafts pay less */
    lm_spec_cost_init(&c, 3, true);
    learn_machine(&c, 0.26e-3, 0.12e-3, 3, 20);
    c.mtp_s_per = 0.18e-3;
    fill(acc, 0.9f);
    lm_spec_cost p = c;
    p.replay = false;
    LM_CHECK(lm_spec_head_pays(&p, acc, 1, 0) && !lm_spec_head_pays(&c, acc, 1, 0));
}

/* A catch-up over a 500-token prompt chunk is not a decode step's head time
 * (learning it as one made the head look ten times dearer: adaptive MTP
 * at 0.83x); it teaches the per-token time instead. */
LM_TEST(spec_policy_head_learns_step_time_from_decode_only) {
    lm_spec_cost c;
    lm_spec_cost_init(&c, 3, false);
    c.mtp_s_per = 0.2e-3, c.mtp_tok_s = 0.02e-3;
    lm_spec_head_learn(&c, 15e-3, 1, 500, true);
    LM_CHECK(c.mtp_s_per == 0.2e-3);
    LM_CHECK(fabs(c.mtp_tok_s - (0.7 * 0.02e-3 + 0.3 * 0.03e-3)) < 1e-12);
    lm_spec_head_learn(&c, 0.4e-3, 2, 6, false); /* two decoding sequences */
    LM_CHECK(fabs(c.mtp_s_per - (0.9 * 0.2e-3 + 0.1 * 0.2e-3)) < 1e-12);
}

/* The floor, under the policy's own model: for each machine and
 * acceptance, the head runs iff lm_spec_head_pays, the draft is
 * lm_spec_best_k's (the head's catch-up then paid besides), and the
 * expected tokens per second are at least 0.97 of plain decoding's. */
LM_TEST(spec_policy_never_below_plain) {
    static const double as[] = { 0.05e-3, 0.26e-3, 1e-3, 5e-3 }, bs[] = { 0.01e-3, 0.12e-3, 0.5e-3, 2e-3 };
    static const double hs[] = { 0, 0.05, 0.5, 1.5 }; /* head time as a fraction of a step */
    static const float ps[] = { 0.05f, 0.3f, 0.6f, 0.8f, 0.95f };
    int cases = 0, drafted = 0;
    for (int replay = 0; replay < 2; replay++)
        for (size_t ia = 0; ia < LM_COUNT(as); ia++)
            for (size_t ib = 0; ib < LM_COUNT(bs); ib++)
                for (size_t ih = 0; ih < LM_COUNT(hs); ih++)
                    for (size_t ip = 0; ip < LM_COUNT(ps); ip++)
                        for (int S = 1; S <= 32; S *= 4) {
                            lm_spec_cost c;
                            lm_spec_cost_init(&c, 3, replay);
                            learn_machine(&c, as[ia], bs[ib], 3, 20);
                            const double a = as[ia], b = bs[ib], share = a / S + b;
                            c.mtp_s_per = hs[ih] * (a + b);
                            float acc[LM_SPEC_MAX_DRAFT];
                            fill(acc, ps[ip]);
                            const bool head = hs[ih] > 0 && lm_spec_head_pays(&c, acc, S, 0);
                            const int k = hs[ih] > 0 && !head ? 0 : lm_spec_best_k(&c, acc, 3, S, hs[ih] > 0);
                            double expect = 0, run = 1;
                            for (int i = 0; i < k; i++) run *= acc[i], expect += run;
                            double cost = share + b * k + (head ? c.mtp_s_per * (1 + 0.5 * (k > 0 ? k - 1 : 0)) : 0);
                            if (replay) cost += (1 - run) * b * (1 + expect);
                            const double ratio = (1 + expect) / cost * share;
                            LM_CHECK_MSG(ratio >= 0.97, "a %g b %g head %g p %g S %d replay %d: k %d, %.3fx plain",
                                         a, b, hs[ih], (double)ps[ip], S, replay, k, ratio);
                            cases++, drafted += k > 0;
                        }
    LM_CHECK(drafted > cases / 10 && drafted < cases); /* the grid has both */
}

/* The wall-clock penalty of a step with drafts (lm_spec_draft_penalty):
 * nothing until both kinds of step were timed LM_SPEC_WALL_MIN times, then
 * the difference (never below 0), charged to a drafting sequence whole. On
 * a machine like the H200 with the demo model (a step ~0.39 ms whatever
 * its tokens; a step with drafts 0.28 ms more, its look-ahead lost), nearly
 * sure drafts still pay alone but not among 8 sequences. */
LM_TEST(spec_policy_draft_penalty) {
    const double a = 0.39e-3, b = 0.005e-3, pen = 0.28e-3;
    lm_spec_cost c;
    lm_spec_cost_init(&c, 3, false);
    learn_machine(&c, a, b, 3, 20);
    float acc[LM_SPEC_MAX_DRAFT];
    fill(acc, 0.99f);
    LM_CHECK(lm_spec_best_k(&c, acc, 3, 8, false) > 0);
    for (int i = 0; i < LM_SPEC_WALL_MIN; i++) lm_spec_wall_learn(&c, true, 12, a + b * 12 + pen);
    for (int i = 0; i < LM_SPEC_WALL_MIN - 1; i++) lm_spec_wall_learn(&c, false, 8, a + b * 8);
    LM_CHECK(lm_spec_draft_penalty(&c) == 0);
    lm_spec_wall_learn(&c, false, 8, a + b * 8);
    LM_CHECK_MSG(fabs(lm_spec_draft_penalty(&c) - pen) < 1e-9, "penalty %g", lm_spec_draft_penalty(&c));
    LM_CHECK(lm_spec_best_k(&c, acc, 3, 8, false) == 0);
    LM_CHECK(lm_spec_best_k(&c, acc, 3, 1, false) > 0);
    LM_CHECK(!lm_spec_head_pays(&c, acc, 8, 0));
    /* drafting steps that run faster than plain ones cost nothing extra */
    for (int i = 0; i < 60; i++) lm_spec_wall_learn(&c, true, 12, a);
    LM_CHECK(lm_spec_draft_penalty(&c) == 0 && lm_spec_best_k(&c, acc, 3, 8, false) > 0);
}

/* Probes further apart while a drafting step costs much: with the
 * penalty above (0.28 ms on 0.39 ms steps) ~72 steps, else every 16. */
LM_TEST(spec_policy_probe_interval) {
    lm_spec_cost c;
    lm_spec_cost_init(&c, 3, false);
    learn_machine(&c, 0.39e-3, 0.005e-3, 3, 20);
    LM_CHECK(lm_spec_probe_every(&c, 8) == LM_SPEC_PROBE_EVERY);
    for (int i = 0; i < LM_SPEC_WALL_MIN; i++) {
        lm_spec_wall_learn(&c, true, 12, 0.39e-3 + 12 * 0.005e-3 + 0.28e-3);
        lm_spec_wall_learn(&c, false, 8, 0.39e-3 + 8 * 0.005e-3);
    }
    const int every = lm_spec_probe_every(&c, 8);
    LM_CHECK_MSG(every >= 60 && every <= 75, "%d", every);
}
