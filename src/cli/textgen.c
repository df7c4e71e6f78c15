/* textgen.c - see textgen.h. */
#include "textgen.h"

#include <stdlib.h>
#include <string.h>

/* Prompt tokens per forward: the runner's own chunk, so that a stop request
 * is seen between chunks at no cost. */
#define TEXTGEN_CHUNK 512

int lm_textgen_open(lm_textgen *g, lm_source *src, lm_backend *be, int ctx, lm_kv_types kvt,
                    const lm_sampler_params *sp, const lm_model_load_opts *load, lm_err *e) {
    memset(g, 0, sizeof *g);
    if (lm_model_load_with(&g->model, src, be, load, e)) return -1;
    if (lm_tokenizer_load_from(&g->tok, src, e)) return -1;
    /* a terminal session needs a modest context: the KV cache is sized by it */
    if (ctx <= 0) ctx = 4096;
    if (ctx > g->model->cfg.max_pos) ctx = g->model->cfg.max_pos;
    if (lm_runner_create_kv(&g->runner, g->model, ctx, TEXTGEN_CHUNK, kvt, e)) return -1;
    g->sampler = lm_sampler_create(sp, g->model->cfg.vocab);
    g->logits = lm_xmalloc((size_t)g->model->cfg.vocab * sizeof(float));
    /* the tokenizer's eos, plus generation_config's list */
    int32_t te = lm_tokenizer_eos(g->tok);
    if (te >= 0) g->eos[g->n_eos++] = te;
    for (int i = 0; i < g->model->cfg.n_eos && g->n_eos < 16; i++) g->eos[g->n_eos++] = g->model->cfg.eos_ids[i];
    const lm_load_progress *progress = load ? load->progress : NULL;
    if (progress && progress->stage) progress->stage(progress->user, NULL);
    return 0;
}

void lm_textgen_close(lm_textgen *g) {
    free(g->logits);
    lm_sampler_free(g->sampler);
    lm_runner_free(g->runner);
    lm_tokenizer_free(g->tok);
    lm_model_free(g->model);
    lm_tok_ids_free(&g->held);
    memset(g, 0, sizeof *g);
}

void lm_textgen_forget(lm_textgen *g) {
    if (g->runner) lm_runner_reset(g->runner);
    g->held.n = 0;
    g->has_tail = g->tail_eos = false;
}

static void hold(lm_textgen *g, const int32_t *ids, int n) {
    if (g->held.n + (size_t)n > g->held.cap) {
        g->held.cap = (g->held.n + (size_t)n) * 2;
        g->held.ids = lm_xrealloc(g->held.ids, g->held.cap * sizeof(int32_t));
    }
    memcpy(g->held.ids + g->held.n, ids, (size_t)n * sizeof(int32_t));
    g->held.n += (size_t)n;
}

static bool is_eos(const lm_textgen *g, int32_t t) {
    for (int i = 0; i < g->n_eos; i++)
        if (g->eos[i] == t) return true;
    return false;
}

static bool stop_asked(lm_textgen *g) {
    if (!g->stop || !*g->stop) return false;
    *g->stop = 0;
    return true;
}

int lm_textgen_run(lm_textgen *g, const int32_t *ids, int n, int max_new, bool ignore_eos, lm_text_cb cb,
                   void *user, lm_textgen_stats *st, lm_err *e) {
    memset(st, 0, sizeof *st);
    st->prompt_tokens = n;
    /* reuse only a whole held prefix: recurrent state cannot be rewound */
    int reuse = 0;
    if (g->held.n > 0 && g->held.n < (size_t)n && !memcmp(g->held.ids, ids, g->held.n * sizeof(int32_t)))
        reuse = (int)g->held.n;
    if (!reuse) lm_textgen_forget(g);
    st->reused_tokens = reuse;
    if (n - reuse + max_new + g->runner->n_past > g->runner->ctx) {
        int room = g->runner->ctx - g->runner->n_past - (n - reuse);
        if (room <= 0) return lm_errf(e, "the conversation (%d tokens) no longer fits the context of %d", n, g->runner->ctx);
        max_new = room;
    }
    g->has_tail = g->tail_eos = false; /* ids carry it now, or the caller dropped it */
    double t0 = lm_now();
    int32_t tok = 0;
    /* the prompt in chunks, a stop request seen between them */
    for (int at = reuse; at < n;) {
        int k = LM_MIN(TEXTGEN_CHUNK, n - at);
        if (stop_asked(g)) {
            lm_textgen_forget(g);
            st->stopped = st->stopped_in_prefill = true;
            st->prefill_s = lm_now() - t0;
            return 0;
        }
        if (lm_runner_next(g->runner, ids + at, k, g->sampler, g->logits, &tok, e)) {
            lm_textgen_forget(g);
            return -1;
        }
        hold(g, ids + at, k);
        at += k;
    }
    st->prefill_s = lm_now() - t0;
    lm_detok *d = lm_detok_create(g->tok, true);
    lm_tok_str piece = { 0 };
    double t1 = lm_now();
    int rc = 0;
    for (int i = 0; i < max_new; i++) {
        st->generated++;
        g->tail = tok;
        g->has_tail = true;
        if (is_eos(g, tok) && !ignore_eos) {
            st->hit_eos = g->tail_eos = true;
            break;
        }
        piece.len = 0;
        lm_detok_push(d, tok, &piece);
        if (piece.len) cb(user, piece.s, piece.len);
        if (i + 1 == max_new) break;
        if (stop_asked(g)) {
            st->stopped = true;
            break;
        }
        const int32_t cur = tok;
        if (lm_runner_next(g->runner, &cur, 1, g->sampler, g->logits, &tok, e)) {
            lm_textgen_forget(g);
            rc = -1;
            break;
        }
        hold(g, &cur, 1);
    }
    piece.len = 0;
    lm_detok_finish(d, &piece);
    if (piece.len) cb(user, piece.s, piece.len);
    st->decode_s = lm_now() - t1;
    lm_tok_str_free(&piece);
    lm_detok_free(d);
    return rc;
}
