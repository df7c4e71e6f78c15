/* spec.c - speculative decoding in the step (lm_spec.h): drafts into the
 * batch, acceptance and rollback after the forward, the adaptive policy and
 * the counters. The proposers are spec_lookup.c, spec_mtp.c and
 * spec_draft.c.
 *
 * Each step's drafted sequences are recorded in row order (the step adds a
 * sequence's t0 row and then its draft rows before the next sequence's), so
 * the hand-out walks the rows once: a row that starts a record is verified
 * with the k after it, any other row is a plain token. */
#include "engine_internal.h"

#include "../model/lm_arch.h"

#include <stdlib.h>
#include <string.h>

/* One drafted sequence of the step. */
typedef struct spec_rec {
    lm_request *r;
    int s;              /* its batch sequence */
    int row0;           /* output row of t0; drafts are rows row0 + 1 .. row0 + k */
    int k;
    int base;           /* r->n_cached before the step: the copied state's position */
    int p;              /* position of t0 (base, or later after a rejection's replay) */
    int32_t snap;       /* replay rollback: the copy of r's slot before the forward, else -1 */
    int n_pp;           /* per-position rollback: k, else 0 */
    int32_t pp[LM_SPEC_MAX_DRAFT]; /* slot j: r's state after position p + j (t0 and j drafts) */
    int accepted;       /* after the hand-out: drafts accepted */
    bool from_mtp;      /* the MTP head's guesses */
    bool from_dm;       /* a draft model's */
    int32_t draft[LM_SPEC_MAX_DRAFT];
} spec_rec;

struct lm_spec {
    lm_spec_mode mode;
    int max_draft;
    bool stateful;
    bool per_pos;       /* stateful, rolled back from the state after each position */
    spec_rec *rec;      /* [parallel] this step's drafted sequences, in row order */
    int *known;         /* [parallel] lm_mtp_after_hand_out's */
    int n_rec;
    lm_spec_cost c;     /* the adaptive policy's costs and the head's acceptance (spec_policy.c) */
    bool mtp_live;       /* this step runs the MTP head for some sequence */
    unsigned mtp_left_off; /* sequences head_decide left off before their first catch-up */
    unsigned dm_left_off;  /* new sequences a draft model that does not pay left off since it last ran */
    unsigned dm_every;     /* it runs for one new sequence in this many (8, doubling to 1024) */
    double last_forward_s; /* the step's forward, for the requests' traces */
    /* whole steps by the wall clock (lm_spec_step_start) */
    double t_step;       /* when the step being handed out started (lm_spec_step_start) */
    bool last_drafted;   /* the step handed out before it had drafts */
    uint64_t steps;      /* steps handed out */
    uint64_t probe_step; /* the step the last probe joined (steps at its build) */
    int since_plain;     /* steps with drafts since the last without */
    int plain_left;      /* plain steps still owed by a forced run */
    /* counters not yet in en->st */
    lm_engine_stats add;
};

/* ---- setup ---- */

/* The most draft tokens a step gives one sequence. */
static int draft_len(const lm_engine_opts *o) {
    return o->spec_draft > 0 ? o->spec_draft : o->spec == LM_SPEC_MTP ? 3 : 6;
}

/* Whether a rejection rolls back to the state kept after its position. */
static bool per_pos(const lm_engine_opts *o, const lm_model *m, bool stateful) {
    return stateful && !o->spec_replay && lm_model_state_out(m);
}

int lm_spec_state_slots(const lm_engine_opts *o, const lm_model *m, bool stateful) {
    if (o->spec == LM_SPEC_OFF || !stateful) return 0;
    const int P = LM_MAX(o->parallel, 1);
    return per_pos(o, m, stateful) ? P * LM_MIN(draft_len(o), LM_SPEC_MAX_DRAFT) : P;
}

size_t lm_spec_head_block_bytes(const lm_engine_opts *o, const lm_model *m, int block) {
    const lm_draft *d = o->spec == LM_SPEC_MTP || o->spec == LM_SPEC_AUTO ? lm_model_draft(m) : NULL;
    if (!d) return 0;
    return (size_t)block * lm_kv_bytes_per_token((lm_kv_types){ LM_KV_F32, LM_KV_F32 }, d->kv_layers(m), m->kv_width);
}

int lm_spec_create(lm_engine *en, lm_err *e) {
    en->spec = NULL;
    const lm_engine_opts *o = &en->o;
    if (o->spec == LM_SPEC_OFF) return 0;
    if (o->spec_draft < 0 || o->spec_draft > LM_SPEC_MAX_DRAFT)
        return lm_errf(e, "draft length %d out of range [1, %d]", o->spec_draft, LM_SPEC_MAX_DRAFT);
    if (o->spec == LM_SPEC_CALLBACK && !o->spec_cb) return lm_errf(e, "speculation by callback without a callback");
    en->spec_mtp = NULL;
    if (o->spec == LM_SPEC_MTP || o->spec == LM_SPEC_AUTO) {
        lm_err me = { { 0 } };
        en->spec_mtp = lm_mtp_create(en, &me);
        if (!en->spec_mtp && me.msg[0]) return lm_errf(e, "the MTP head's KV pool: %s", me.msg);
        if (!en->spec_mtp && o->spec == LM_SPEC_MTP)
            return lm_errf(e, "--spec mtp: %s has no MTP head (a qwen3_5 / qwen3_next checkpoint with mtp.* "
                              "tensors); use --spec lookup or auto", en->m->path ? en->m->path : "the model");
    }
    en->spec_dm = NULL;
    if (o->spec == LM_SPEC_DRAFT && !(en->spec_dm = lm_dm_create(en, en->dm_model, e))) return -1;
    lm_spec *sp = lm_xcalloc(1, sizeof *sp);
    sp->known = lm_xmalloc((size_t)o->parallel * sizeof *sp->known);
    sp->mode = o->spec;
    sp->max_draft = draft_len(o);
    sp->stateful = en->stateful;
    sp->per_pos = per_pos(o, en->m, en->stateful);
    lm_spec_cost_init(&sp->c, sp->max_draft, sp->stateful && !sp->per_pos);
    sp->rec = lm_xcalloc((size_t)o->parallel, sizeof *sp->rec);
    en->spec = sp;
    return 0;
}

void lm_spec_free(lm_spec *sp) {
    if (!sp) return;
    free(sp->known);
    free(sp->rec);
    free(sp);
}

int lm_spec_max_draft(const lm_spec *sp) { return sp ? sp->max_draft : 0; }

/* ---- the adaptive policy ---- */

/* How many draft tokens r should get this step (at most max): the k that
 * maximises expected tokens per second of r's share of the step, 0 when
 * none beats plain decoding by a margin; a one-token probe every so often
 * keeps the estimate alive. */
/* Whether a probe may join the step being built (ahead: the next one):
 * the one another probe joined, or one far enough from it
 * (lm_spec_probe_every: further apart while a drafting step costs much). */
static bool probe_ok(const lm_spec *sp, uint64_t step, int S) {
    return step == sp->probe_step || step - sp->probe_step >= (uint64_t)lm_spec_probe_every(&sp->c, S);
}

static int policy_k(lm_engine *en, lm_request *r, int max, int S) {
    lm_spec *sp = en->spec;
    lm_spec_req *q = &r->spec;
    const int k = lm_spec_best_k(&sp->c, q->acc, max, S, en->spec_mtp && lm_mtp_tracked(r));
    if (k == 0 && ++q->quiet >= LM_SPEC_PROBE_EVERY && probe_ok(sp, sp->steps, S)) {
        q->quiet = 0;
        sp->probe_step = sp->steps;
        return LM_MIN(1, max);
    }
    if (k > 0) q->quiet = 0;
    return k;
}

/* ---- proposals ---- */

/* A grammar-constrained request: the longest head of the draft that its
 * grammar allows, checked token by token on its matcher and then rolled
 * back (the hand-out accepts what it hands out). Before the grammar is
 * live the draft ends after its trigger token, past which it would apply;
 * a stop token ends it too (the request would end there). */
static int grammar_cut(lm_request *r, const int32_t *draft, int k) {
    int n = 0, taken = 0;
    for (; n < k; n++) {
        bool stop = false;
        for (int i = 0; i < r->p.n_stop_tokens; i++) stop |= r->stop_tokens[i] == draft[n];
        if (stop) break;
        if (!r->gm_live) {
            if (draft[n] == r->p.grammar_trigger) {
                n++;
                break;
            }
            continue;
        }
        if (!lm_grammar_accept(r->gm, draft[n])) break;
        taken++;
    }
    if (taken) lm_grammar_rollback(r->gm, taken);
    return n;
}

/* The adaptive policy owes plain steps (LM_SPEC_PLAIN_EVERY). */
static bool plain_owed(const lm_engine *en) {
    const lm_spec *sp = en->spec;
    return sp->plain_left > 0 && sp->mode != LM_SPEC_CALLBACK && !en->o.spec_fixed;
}

bool lm_spec_would_draft(lm_engine *en, lm_request *r) {
    lm_spec *sp = en->spec;
    if (!sp || r->p.no_spec || r->embed) return false;
    if (sp->mode == LM_SPEC_MTP) return lm_mtp_tracked(r); /* its only proposer */
    if (sp->mode == LM_SPEC_DRAFT && !lm_dm_tracked(en, r)) return false;
    if (sp->mode == LM_SPEC_CALLBACK || en->o.spec_fixed || r->spec.acc[0] == 0) return true;
    if (plain_owed(en)) return false;
    lm_spec_req *q = &r->spec;
    if (lm_spec_best_k(&sp->c, q->acc, sp->max_draft, en->n_running, false) == 0) /* counted as policy_k does; */
        return ++q->quiet >= LM_SPEC_PROBE_EVERY - 1 && probe_ok(sp, sp->steps + 1, en->n_running); /* stop before a probe */
    if (sp->mode == LM_SPEC_DRAFT) return true;
    int32_t draft[1];
    return lm_lookup_propose(q, r->tokens, r->n_tokens, r->cap, draft, 1) > 0;
}

int lm_spec_propose(lm_engine *en, lm_step *st, int s, lm_request *r, int max) {
    lm_spec *sp = en->spec;
    if (!sp || r->p.no_spec || r->embed || plain_owed(en)) return 0;
    /* only a sequence whose whole tail is in the batch with t0's row last */
    if (st->seq_n[s] != r->n_tokens - r->n_cached || st->n_out == 0 || st->row_req[st->n_out - 1] != r) return 0;
    /* a stateful sequence after a rejection feeds its run again in front of
     * t0 and may draft after it: another rejection takes it back to the same
     * copy, so the run grows; past LM_SPEC_MAX_REPLAY it catches up undrafted */
    if (sp->stateful && !sp->per_pos && st->seq_n[s] > LM_SPEC_MAX_REPLAY) return 0;
    if (r->spec.acc[0] == 0) /* first proposal: optimistic, so that it tries; the head's from all sequences */
        for (int i = 0; i < LM_SPEC_MAX_DRAFT; i++)
            r->spec.acc[i] = sp->mode == LM_SPEC_MTP ? sp->c.mtp_acc[i] : sp->mode == LM_SPEC_DRAFT ? sp->c.dm_acc[i] : 0.6f;
    const double t0 = lm_now();
    /* a verification hands out at most k + 1 tokens: no draft past
     * max_tokens or the context (so every draft position is a reserved one) */
    int room = LM_MIN(r->p.max_tokens - r->n_generated, en->o.ctx - r->n_tokens) - 1;
    max = LM_MIN(LM_MIN(max, room), sp->max_draft);
    if (max <= 0) return 0;
    int k = en->o.spec_fixed ? max : policy_k(en, r, max, en->n_running);
    r->spec.k_last = k;
    spec_rec *rc = &sp->rec[sp->n_rec];
    rc->from_mtp = rc->from_dm = false;
    if (k > 0 && sp->mode == LM_SPEC_CALLBACK) {
        int n = en->o.spec_cb(en->o.spec_user, r->tokens, r->n_tokens, r->n_prompt, rc->draft, k);
        k = LM_MAX(0, LM_MIN(k, n));
    } else if (k > 0 && sp->mode == LM_SPEC_DRAFT) {
        k = lm_dm_propose(r, rc->draft, k);
        rc->from_dm = k > 0;
    } else if (k > 0) {
        int want = k;
        k = 0;
        if (sp->mode != LM_SPEC_MTP) k = lm_lookup_propose(&r->spec, r->tokens, r->n_tokens, r->cap, rc->draft, want);
        rc->from_mtp = false;
        if (k == 0 && en->spec_mtp) k = lm_mtp_propose(r, rc->draft, want), rc->from_mtp = k > 0;
    }
    for (int j = 0; j < k; j++) /* a caller's draft stops at a token the model does not have */
        if (rc->draft[j] < 0 || rc->draft[j] >= en->vocab) k = j;
    if (r->gm && k > 0) k = grammar_cut(r, rc->draft, k);
    const double dt = lm_now() - t0;
    sp->add.spec_draft_s += dt;
    r->tr.spec_draft_s += dt;
    sp->c.draft_s_per = 0.9 * sp->c.draft_s_per + 0.1 * dt;
    if (k == 0) {
        sp->add.spec_off_steps += r->spec.k_last == 0;
        return 0;
    }
    rc->snap = -1, rc->n_pp = 0;
    if (sp->per_pos) { /* a slot for the state after t0 and each draft but the last */
        int32_t slot;
        while (rc->n_pp < k && (slot = lm_kv_state_take(en->kv)) >= 0) rc->pp[rc->n_pp++] = slot;
        if (rc->n_pp == 0) return 0; /* no spare slot: decode plainly */
        k = rc->n_pp;
    } else if (sp->stateful) {
        rc->snap = lm_kv_state_take(en->kv);
        if (rc->snap < 0) return 0;
        lm_kv_state_copy(en->kv, rc->snap, r->slot);
    }
    rc->r = r, rc->s = s, rc->k = k, rc->base = r->n_cached, rc->p = r->n_cached + st->seq_n[s] - 1;
    rc->row0 = st->n_out - 1;
    const int t0_row = lm_batch_n_tokens(en->bb) - 1;
    int last = lm_batch_add_tokens(en->bb, s, rc->draft, rc->p + 1, k);
    for (int j = 0; j < rc->n_pp; j++) lm_batch_set_state_out(en->bb, t0_row + j, rc->pp[j]);
    for (int j = 0; j < k; j++) {
        int o = lm_batch_add_out(en->bb, last - k + 1 + j);
        st->row_req[o] = r;
        st->n_out = o + 1;
    }
    st->seq_n[s] += k;
    st->n_draft += k;
    sp->n_rec++;
    return k;
}

/* ---- acceptance and rollback ---- */

/* Hands out rc's rows (t0's and its drafts') until a token differs from
 * the draft or r ends, and leaves r's cache at what it accepted. */
static void verify(lm_engine *en, lm_step *st, spec_rec *rc) {
    lm_spec *sp = en->spec;
    lm_request *r = rc->r;
    const int32_t fwd_slot = r->slot;
    /* until the run is known, r stands at p: its tokens below p are cached,
     * its state (on a stateful model) is the copy from before the forward,
     * so that r ending mid-run leaves the prefix cache consistent */
    if (r->tr.n_steps < r->p.max_tokens) r->step_batch[r->tr.n_steps++] = st->T;
    if (rc->snap >= 0) r->slot = rc->snap;
    r->n_cached = rc->snap >= 0 ? rc->base : rc->p;
    const int n0 = r->n_tokens;
    int accepted = 0;
    int32_t held = r->slot; /* r's slot when its last token was handed out */
    for (int j = 0; j <= rc->k; j++) {
        /* the token fed at p + j is t0 (j = 0) or a draft equal to the run so
         * far; per position, r's state is the one after it */
        if (rc->snap < 0) r->n_cached = rc->p + j + 1;
        if (rc->n_pp) r->slot = j < rc->n_pp ? rc->pp[j] : fwd_slot;
        held = r->slot;
        const int o = rc->row0 + j, before = r->n_tokens;
        lm_req_take_token(en, r, st->want_logits[o] ? st->logits + (size_t)o * en->vocab : NULL, st->ids[o]);
        /* a strict fill (grammar) appended forced tokens: the rows after this
         * one do not follow them */
        if (r->state == LM_REQ_DONE || j == rc->k || r->n_tokens != before + 1 ||
            r->tokens[r->n_tokens - 1] != rc->draft[j])
            break;
        accepted++;
    }
    const int m = r->n_tokens - n0; /* tokens appended (a stop token is not) */
    rc->accepted = accepted;
    sp->add.spec_verifies++;
    sp->add.spec_verify_tokens += (uint64_t)(accepted + 1);
    sp->add.spec_drafted += (uint64_t)rc->k;
    sp->add.spec_accepted += (uint64_t)accepted;
    for (int i = 0; i < rc->k; i++) {
        sp->add.spec_pos_drafted[i] += i <= accepted;
        sp->add.spec_pos_accepted[i] += i < accepted;
    }
    lm_spec_acc_learn(r->spec.acc, rc->k, accepted, 0.15f);
    if (rc->from_mtp) lm_spec_acc_learn(sp->c.mtp_acc, rc->k, accepted, 0.05f);
    if (rc->from_dm) lm_spec_acc_learn(sp->c.dm_acc, rc->k, accepted, 0.05f);
    r->tr.spec_verifies++;
    r->tr.spec_verify_s += sp->last_forward_s;
    r->tr.spec_drafted += rc->k;
    r->tr.spec_accepted += accepted;
    if (rc->n_pp) { /* keep the slot of the accepted position (released already if r is done) */
        for (int j = 0; j < rc->n_pp; j++)
            if (rc->pp[j] != held) lm_kv_state_release(en->kv, rc->pp[j]);
        if (fwd_slot != held) lm_kv_state_release(en->kv, fwd_slot);
    }
    if (r->state == LM_REQ_DONE) { /* its slot (the copy) is released; the forward's goes too */
        if (rc->snap >= 0) lm_kv_state_release(en->kv, fwd_slot);
        return;
    }
    if (rc->snap >= 0) {
        if (accepted == rc->k) { /* the forward's state is at p + k + 1 = the accepted run */
            r->slot = fwd_slot;
            lm_kv_state_release(en->kv, rc->snap);
            r->n_cached = rc->p + rc->k + 1;
        } else { /* stay at base: the next step feeds the run again */
            lm_kv_state_release(en->kv, fwd_slot);
            sp->add.spec_replayed += (uint64_t)(rc->p - rc->base + m);
        }
    } else {
        r->n_cached = rc->p + accepted + 1; /* t0 and the accepted drafts (not a strict fill's tokens) */
    }
    lm_cache_policy_progress(en, r);
}

/* Moves the step's counters into en->st (under mu). */
static void publish(lm_engine *en) {
    lm_spec *sp = en->spec;
    lm_engine_stats *a = &sp->add, *s = &en->st;
    pthread_mutex_lock(&en->mu);
    s->spec_verifies += a->spec_verifies, s->spec_verify_tokens += a->spec_verify_tokens;
    s->spec_drafted += a->spec_drafted, s->spec_accepted += a->spec_accepted;
    for (int i = 0; i < LM_SPEC_MAX_DRAFT; i++)
        s->spec_pos_drafted[i] += a->spec_pos_drafted[i], s->spec_pos_accepted[i] += a->spec_pos_accepted[i];
    s->spec_replayed += a->spec_replayed, s->spec_off_steps += a->spec_off_steps;
    s->spec_model_tokens += a->spec_model_tokens;
    s->spec_draft_s += a->spec_draft_s, s->spec_verify_s += a->spec_verify_s;
    pthread_mutex_unlock(&en->mu);
    memset(a, 0, sizeof *a);
}

static void spec_hand_out(lm_engine *en, lm_step *st) {
    lm_spec *sp = en->spec;
    LM_ASSERT(sp && st->n_draft > 0 && sp->n_rec > 0);
    lm_step_count(en, st->T, st->S, false, 0);
    /* sequences without a draft advance as in a plain step */
    for (int i = 0, c = 0; i < st->S; i++) {
        if (c < sp->n_rec && sp->rec[c].s == i) {
            c++;
            continue;
        }
        lm_step_advance(en, st, i);
    }
    for (int o = 0, c = 0; o < st->n_out;) {
        if (c < sp->n_rec && sp->rec[c].row0 == o) {
            verify(en, st, &sp->rec[c]);
            o += sp->rec[c++].k + 1;
            continue;
        }
        lm_req_take_token(en, st->row_req[o], st->want_logits[o] ? st->logits + (size_t)o * en->vocab : NULL,
                          st->ids[o]);
        o++;
    }
    publish(en);
}

/* ---- the MTP head's policy, per sequence ---- */

/* Turns the head off for r for good when it does not pay (the head's K/V
 * cannot skip positions: a gap costs most of its acceptance, so it is not
 * turned back on). Before r's first catch-up: with the acceptance of all
 * sequences so far, the prompt's catch-up spread over the answer counted
 * (every 8th sequence that would be left off runs it anyway, so that the
 * shared acceptance keeps being measured). Decoding: with r's own
 * acceptance, after LM_SPEC_HEAD_POOR steps in a row where it did not pay. */
static void head_decide(lm_engine *en, lm_request *r) {
    lm_spec *sp = en->spec;
    lm_spec_req *q = &r->spec;
    if (en->o.spec_fixed || q->mtp_off || sp->c.mtp_s_per == 0) return;
    if (!q->mtp_seen) {
        q->mtp_seen = true;
        const int steps = LM_MAX(1, LM_MIN(r->p.max_tokens, en->o.ctx - r->n_tokens));
        const double extra = sp->c.mtp_tok_s * (r->n_tokens - r->n_cached) / steps;
        if (!lm_spec_head_pays(&sp->c, sp->c.mtp_acc, en->n_running, extra) && ++sp->mtp_left_off % 8 != 0) q->mtp_off = true;
        return;
    }
    if (r->n_cached < r->n_prompt) return;
    if (lm_spec_head_pays(&sp->c, q->acc[0] > 0 ? q->acc : sp->c.mtp_acc, en->n_running, 0)) q->mtp_poor = 0;
    else if (++q->mtp_poor >= LM_SPEC_HEAD_POOR) q->mtp_off = true;
}

void lm_spec_before_issue(lm_engine *en, lm_step *st) {
    lm_spec *sp = en->spec;
    sp->mtp_live = false;
    if (!en->spec_mtp) return;
    for (int s = 0; s < st->S; s++) {
        lm_request *r = st->seq_req[s];
        head_decide(en, r);
        sp->mtp_live |= lm_mtp_tracked(r);
    }
    if (sp->mtp_live) lm_mtp_before_issue(en, st);
}

/* The step just handed out: its wall time, from the start of the engine's
 * step (lm_spec_step_start; admission and idle waits fall outside) to now,
 * if it was a decode step (every sequence generating before it) - a plain
 * one only after another plain one (after a drafting step nothing
 * overlapped it); and the forced plain runs' count. */
static void note_step(lm_engine *en, const lm_step *st) {
    lm_spec *sp = en->spec;
    bool decode = st->S > 0;
    for (int i = 0; i < st->S; i++) {
        const int fed = st->seq_n ? st->seq_n[i] : 1; /* a look-ahead step has one token a sequence */
        decode &= st->seq_req[i]->n_generated >= 2 && fed <= 1 + sp->max_draft;
    }
    const bool drafted = st->n_draft > 0;
    if (decode && sp->t_step > 0 && (drafted || !sp->last_drafted))
        lm_spec_wall_learn(&sp->c, drafted, st->T, lm_now() - sp->t_step);
    sp->t_step = 0;
    sp->last_drafted = drafted;
    sp->steps++;
    if (!drafted) {
        sp->since_plain = 0;
        if (sp->plain_left > 0) sp->plain_left--;
    } else if (++sp->since_plain >= (sp->c.n_wall_plain >= LM_SPEC_WALL_MIN ? LM_SPEC_PLAIN_EVERY : LM_SPEC_PLAIN_FIRST)) {
        sp->since_plain = 0;
        sp->plain_left = LM_SPEC_PLAIN_RUN;
    }
}

/* The guesses a proposer's next chain makes for r: none while the policy
 * does not draft for it (but for the step before a probe), else one more
 * than it drafted last. A draft model's first: as many as the policy
 * would draft with its acceptance over all sequences (first), and it runs
 * for a sequence the policy keeps from drafting only for a probe the next
 * step will make (a guess costs it a forward; the MTP head's first guess
 * is a row of a catch-up it runs anyway). */
static int want_of(const lm_engine *en, const lm_request *r, bool draft_model, int first) {
    const lm_spec *sp = en->spec;
    const lm_spec_req *q = &r->spec;
    if (en->o.spec_fixed) return sp->max_draft;
    if (draft_model && q->acc[0] == 0) return first;
    if (q->k_last > 0) return LM_MIN(sp->max_draft, q->k_last + 1);
    if (!draft_model) return q->quiet < 15 ? 0 : 1;
    return q->quiet + 1 >= LM_SPEC_PROBE_EVERY && probe_ok(sp, sp->steps + 1, en->n_running) ? 1 : 0;
}

/* The draft model after a hand-out: its guesses for the next step, and
 * its time a guess for the policy (decode steps only). Not while the
 * look-ahead has a step queued: the chain's next step takes its tokens
 * from the backend's last argmax, which a draft forward would overwrite
 * (the chain stops where a sequence would draft; its first built step
 * then runs the draft, and the step after it verifies). */
static void draft_after_hand_out(lm_engine *en, lm_step *st) {
    lm_spec *sp = en->spec;
    if (en->queued) return;
    /* what a sequence new to it would draft with the acceptance of all so
     * far: where none, the draft does not pay, and only one new sequence
     * in dm_every runs it (following its prompt, so that probes stay
     * cheap), to keep that acceptance measured; the others never do. The
     * interval doubles each time (to 1024) while it does not pay, so a
     * long-running server with a draft that never pays soon stops paying
     * for it, and goes back to 8 once it does */
    const int first = lm_spec_best_k(&sp->c, sp->c.dm_acc, sp->max_draft, en->n_running, false);
    int n_want = 0;
    for (int i = 0; i < st->S; i++) {
        lm_request *r = st->seq_req[i];
        if (r->state != LM_REQ_RUNNING || !lm_dm_tracked(en, r)) continue;
        if (!r->spec.dm_seen) {
            r->spec.dm_seen = true;
            if (first > 0 || sp->dm_every == 0) sp->dm_every = 8;
            if (!en->o.spec_fixed && first == 0) {
                if (++sp->dm_left_off < sp->dm_every) {
                    r->spec.dm_off = true;
                    continue;
                }
                sp->dm_left_off = 0;
                sp->dm_every = LM_MIN(2 * sp->dm_every, 1024u);
            }
        }
        r->spec.want = r->n_cached < r->n_prompt ? 1 : want_of(en, r, true, first);
        n_want += r->spec.want > 0 && r->n_cached >= r->n_prompt;
    }
    const double t0 = lm_now();
    bool lag = false;
    int fed = 0;
    const int n = lm_dm_after_hand_out(en, st, &lag, &fed);
    const double dt = lm_now() - t0;
    sp->add.spec_draft_s += dt;
    sp->add.spec_model_tokens += (uint64_t)fed;
    if (n > 0 && !lag) sp->c.guess_s = sp->c.guess_s > 0 ? 0.9 * sp->c.guess_s + 0.1 * dt / n : dt / n;
    for (int i = 0; n_want && i < st->S; i++) /* each wanting sequence's share */
        if (st->seq_req[i]->spec.want > 0) st->seq_req[i]->tr.spec_draft_s += dt / n_want;
}

void lm_spec_after_hand_out(lm_engine *en, lm_step *st) {
    lm_spec *sp = en->spec;
    if (sp->mtp_live) {
        const double t0 = lm_now();
        int n = 0;
        bool prefill = false; /* a catch-up over a prompt chunk: not a decode step's cost */
        for (int i = 0, c = 0; i < st->S; i++) {
            sp->known[i] = -1;
            if (c < sp->n_rec && sp->rec[c].s == i) {
                const spec_rec *rc = &sp->rec[c++];
                sp->known[i] = rc->p + 1 + rc->accepted; /* t0 and the accepted drafts */
            }
            lm_request *r = st->seq_req[i];
            if (r->state != LM_REQ_RUNNING || !lm_mtp_tracked(r)) continue;
            prefill |= st->seq_n[i] > 1 + sp->max_draft;
            if (r->n_cached >= r->n_prompt) r->spec.head_share = true;
            /* chained guesses cost a forward each: none while the policy does
             * not draft (but for the step before a probe); the head's K/V
             * follow regardless while it is on for r, since a gap in them
             * costs most of its acceptance (measured: 0.92 -> ~0.3 on the
             * code workload) */
            r->spec.want = want_of(en, r, false, 0);
            n += r->n_cached >= r->n_prompt;
        }
        const int n_tok = lm_mtp_after_hand_out(en, st, sp->known);
        const double dt = lm_now() - t0;
        sp->add.spec_draft_s += dt;
        lm_spec_head_learn(&sp->c, dt, n, n_tok, prefill);
        for (int i = 0; i < st->S; i++) { /* each decoding sequence's share of the head's time */
            lm_request *r = st->seq_req[i];
            if (r->spec.head_share) r->tr.spec_draft_s += dt / n, r->spec.head_share = false;
        }
    }
    if (en->spec_dm) draft_after_hand_out(en, st);
    sp->n_rec = 0;
    sp->mtp_live = false; /* a queued step after this one runs no head (lm_spec_before_issue sets it) */
    note_step(en, st);
}

void lm_spec_step_start(lm_engine *en) { en->spec->t_step = lm_now(); }

/* The best of 3 forwards of T tokens of the scratch sequence at position
 * pos (head: the MTP head's, over zero hidden rows), seconds; 0 on an error. */
static double time_forward(lm_engine *en, lm_batch_builder *bb, const int32_t *table, int32_t slot, int pos, int T,
                           bool head, float *hidden) {
    int32_t ids[64] = { 0 }, out[64];
    LM_ASSERT(T <= 64);
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        lm_batch_reset(bb);
        int s = lm_batch_add_seq(bb, table, slot);
        int last = lm_batch_add_tokens(bb, s, ids, pos, T);
        /* a verify has a row per token; the head a guess per sequence */
        for (int i = head ? T - 1 : 0; i < T; i++) lm_batch_add_out(bb, last - T + 1 + i);
        lm_batch_set_argmax(bb, out, NULL, false);
        lm_err e = { { 0 } };
        const double t0 = lm_now();
        int rc = head ? lm_mtp_forward_scratch(en, bb, hidden, &e) : lm_batch_forward(bb, en->m, &en->kv->pool, NULL, &e);
        if (rc) return 0;
        best = LM_MIN(best, lm_now() - t0);
    }
    return best;
}

void lm_spec_calibrate(lm_engine *en) {
    lm_spec *sp = en->spec;
    const int k = LM_MIN(sp->max_draft, en->o.step_tokens - 1);
    const int pos = LM_MIN(LM_MIN(32, en->o.ctx - k - 1), en->o.step_tokens);
    if (k < 1 || pos < 1) return;
    lm_kv_seq seq = { 0 };
    if (lm_kv_seq_reserve(en->kv, &seq, pos + k + 1, NULL)) return;
    int32_t slot = en->stateful ? lm_kv_state_acquire(en->kv) : -1;
    if (en->stateful && slot < 0) {
        lm_kv_seq_release(en->kv, &seq);
        return;
    }
    lm_batch_builder *bb = lm_batch_builder_create(LM_MAX(pos, k + 1), 1, LM_MAX(pos, k + 1), en->stateful);
    float *hidden = lm_xcalloc((size_t)LM_MAX(pos, k + 1) * (size_t)en->m->cfg.d_model, sizeof(float));
    double t1 = 0, tk = 0, th = 0, tp = 0;
    /* positions before the timed ones hold real K/V (and the head's) */
    time_forward(en, bb, seq.blocks, slot, 0, pos, false, NULL);
    if (en->spec_mtp) tp = time_forward(en, bb, seq.blocks, -1, 0, pos, true, hidden);
    for (int round = 0; round < 3; round++) { /* alternating, each learnt as a decode step would be */
        t1 = time_forward(en, bb, seq.blocks, slot, pos, 1, false, NULL);
        tk = time_forward(en, bb, seq.blocks, slot, pos, k + 1, false, NULL);
        if (t1 > 0) lm_spec_cost_learn(&sp->c, 1, t1);
        if (tk > 0) lm_spec_cost_learn(&sp->c, k + 1, tk);
    }
    if (en->spec_mtp) th = time_forward(en, bb, seq.blocks, -1, pos, 1, true, hidden);
    if (en->spec_dm) sp->c.guess_s = lm_dm_time_guess(en, seq.blocks, pos);
    /* a step's head work: the catch-up and a chained guess */
    if (th > 0) sp->c.mtp_s_per = 2 * th;
    if (tp > 0) sp->c.mtp_tok_s = tp / pos;
    free(hidden);
    lm_batch_builder_free(bb);
    if (slot >= 0) lm_kv_state_release(en->kv, slot);
    lm_kv_seq_release(en->kv, &seq);
}

void lm_spec_after_issue(lm_engine *en, lm_step *st, double forward_s) {
    lm_spec *sp = en->spec;
    /* the cost model is of decode steps: a prefill chunk's tokens cost
     * otherwise (another matmul regime), and would skew the slope */
    bool decode = true;
    for (int i = 0; i < st->S && decode; i++) decode = st->seq_req[i]->n_cached >= st->seq_req[i]->n_prompt;
    if (decode) lm_spec_cost_learn(&sp->c, st->T, forward_s);
    sp->last_forward_s = forward_s;
    if (st->n_draft > 0) sp->add.spec_verify_s += forward_s;
    else if (sp->add.spec_off_steps || sp->add.spec_draft_s > 0) publish(en);
}

const lm_step_policy lm_spec_policy = {
    .name = "speculative",
    .argmax_later = false,
    .after_forward = NULL,
    .hand_out = spec_hand_out,
    .abandon = NULL,
};
