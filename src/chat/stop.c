/* stop.c - OpenAI `stop` strings over streamed text.
 *
 * The matcher keeps only the held-back suffix of the text (shorter than the
 * longest stop string, plus at most 3 bytes of an unfinished UTF-8
 * character). On each feed it looks for the stop occurrence that ends
 * earliest in the new bytes; occurrences ending in the held part were already
 * ruled out by earlier feeds, so each feed costs O(held + new) per string. */
#include "chat/lm_parse.h"
#include "chat/parse_internal.h"

#include <stdlib.h>
#include <string.h>

struct lm_stop_matcher {
    char **stops; /* copies; empty ones are kept (never match) so `which` is the caller's index */
    size_t *lens;
    int n;
    lm_pbuf held; /* text not emitted yet */
    lm_pbuf out;  /* output of the current call */
    bool stopped;
    int which;
};

lm_stop_matcher *lm_stop_matcher_create(const char *const *stops, const size_t *lens, int n) {
    LM_ASSERT(n >= 0 && (n == 0 || stops));
    lm_stop_matcher *m = lm_xcalloc(1, sizeof *m);
    m->n = n;
    m->stops = lm_xcalloc((size_t)(n ? n : 1), sizeof *m->stops);
    m->lens = lm_xcalloc((size_t)(n ? n : 1), sizeof *m->lens);
    for (int i = 0; i < n; i++) {
        size_t len = lens ? lens[i] : strlen(stops[i]);
        m->stops[i] = lm_xmalloc(len + 1);
        if (len) memcpy(m->stops[i], stops[i], len);
        m->stops[i][len] = 0;
        m->lens[i] = len;
    }
    m->which = -1;
    return m;
}

lm_stop_matcher *lm_stop_matcher_create_json(const json_t *stop, lm_err *err) {
    if (!stop || json_is_null(stop)) return lm_stop_matcher_create(NULL, NULL, 0);
    if (json_is_string(stop)) {
        const char *s = json_string_value(stop);
        size_t len = json_string_length(stop);
        return lm_stop_matcher_create(&s, &len, 1);
    }
    if (!json_is_array(stop)) {
        lm_errf(err, "`stop` must be a string or an array of strings");
        return NULL;
    }
    size_t n = json_array_size(stop);
    if (n > 1024) {
        lm_errf(err, "`stop` has %zu strings (at most 1024)", n);
        return NULL;
    }
    const char **s = lm_xcalloc(n ? n : 1, sizeof *s);
    size_t *len = lm_xcalloc(n ? n : 1, sizeof *len);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(stop, i);
        if (!json_is_string(v)) {
            free(s);
            free(len);
            lm_errf(err, "`stop`[%zu] is not a string", i);
            return NULL;
        }
        s[i] = json_string_value(v);
        len[i] = json_string_length(v);
    }
    lm_stop_matcher *m = lm_stop_matcher_create(s, len, (int)n);
    free(s);
    free(len);
    return m;
}

static void result(lm_stop_matcher *m, lm_stop_result *out) {
    out->text = lm_pbuf_str(&m->out);
    out->len = m->out.n;
    out->stopped = m->stopped;
    out->which = m->which;
}

void lm_stop_matcher_feed(lm_stop_matcher *m, const char *text, size_t n, lm_stop_result *out) {
    lm_pbuf_clear(&m->out);
    if (m->stopped || (n == 0 && m->held.n == 0)) {
        result(m, out);
        return;
    }
    size_t old = m->held.n;
    lm_pbuf_put(&m->held, text, n);
    const char *s = m->held.p;
    size_t len = m->held.n;

    /* the occurrence ending first (ties: starting first) among those that end
     * in the new bytes */
    size_t best_end = LM_PARSE_NPOS, best_start = 0;
    for (int i = 0; i < m->n; i++) {
        size_t L = m->lens[i];
        if (L == 0) continue;
        size_t from = old >= L - 1 ? old - (L - 1) : 0;
        size_t at = lm_parse_find(s + from, len - from, m->stops[i], L);
        if (at == LM_PARSE_NPOS) continue;
        at += from;
        if (at + L < best_end || (at + L == best_end && at < best_start)) {
            best_end = at + L;
            best_start = at;
            m->which = i;
        }
    }
    if (best_end != LM_PARSE_NPOS) {
        lm_pbuf_put(&m->out, s, best_start);
        m->stopped = true;
        lm_pbuf_clear(&m->held);
        result(m, out);
        return;
    }

    size_t hold = 0;
    for (int i = 0; i < m->n; i++) hold = LM_MAX(hold, lm_parse_partial(s, len, m->stops[i], m->lens[i]));
    size_t emit = len - hold;
    emit -= lm_parse_utf8_tail(s, emit);
    lm_pbuf_put(&m->out, s, emit);
    lm_pbuf_drop(&m->held, emit);
    result(m, out);
}

void lm_stop_matcher_finish(lm_stop_matcher *m, lm_stop_result *out) {
    lm_pbuf_clear(&m->out);
    if (!m->stopped) lm_pbuf_put(&m->out, m->held.p, m->held.n);
    lm_pbuf_clear(&m->held);
    result(m, out);
}

void lm_stop_matcher_free(lm_stop_matcher *m) {
    if (!m) return;
    for (int i = 0; i < m->n; i++) free(m->stops[i]);
    free(m->stops);
    free(m->lens);
    lm_pbuf_free(&m->held);
    lm_pbuf_free(&m->out);
    free(m);
}
