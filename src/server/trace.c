/* trace.c - request ids and the per-request trace line (`lumen serve --trace`).
 *
 * Design note
 * -----------
 * Every HTTP request gets an id: the client's X-Request-Id when it sends one
 * (sanitised: only A-Z a-z 0-9 . _ : -, at most SRV_RID_MAX characters, so it
 * is safe in a header, a log line and JSON), else "req-" and 24 random
 * characters. The response echoes it; the access log and the trace use it.
 *
 * A trace line is one compact JSON object per finished generation, written
 * with a single fwrite under a mutex so that lines of concurrent requests
 * never interleave. Its spans come from the engine's lm_request_trace (the
 * engine's clock is lm_now, the same as the server's); when the engine gives
 * none, the line says so ("engine_trace": false) and carries what the final
 * event and the server's own timestamps know.
 *
 * When the prefix cache served fewer tokens than the prompt shares with an
 * earlier request, the line shows why (miss kind) and, for a divergence,
 * this prompt's text around it: the tokens just before diverge_pos (which
 * the earlier prompt had too) and this prompt's tokens from there (decoded
 * here: the engine deals in ids only). The earlier request's side is never
 * written: it may be another user's prompt, and a trace line is about its
 * own request only.
 *
 * The file is created 0600 (prompts are private), and a line that cannot be
 * written (a full disk) is counted and reported on stderr, not lost
 * silently. */
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server_internal.h"

/* tokens shown on each side of a divergence */
#define SRV_TRACE_CONTEXT 8
/* decode-step batch sizes listed in full up to this many steps */
#define SRV_TRACE_MAX_STEPS 32

/* ---- request ids ------------------------------------------------------------------- */

static bool rid_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == ':' || c == '-';
}

void srv_request_id(const char *header, char *out, size_t cap) {
    LM_ASSERT(cap > SRV_RID_MAX);
    size_t n = 0;
    for (const char *p = header; p && *p && n < SRV_RID_MAX; p++)
        if (rid_char(*p)) out[n++] = *p;
    out[n] = 0;
    if (n == 0) srv_make_id(out, cap, "req-");
}

/* ---- the trace file ---------------------------------------------------------------- */

int srv_trace_open(srv *s, const char *path, lm_err *e) {
    pthread_mutex_init(&s->trace_mu, NULL);
    s->trace_mu_init = true;
    if (!path) return 0;
    if (!strcmp(path, "-")) {
        s->trace = stderr;
        return 0;
    }
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || !(s->trace = fdopen(fd, "a"))) {
        int err = errno;
        if (fd >= 0) close(fd);
        return lm_errf(e, "--trace %s: %s", path, strerror(err));
    }
    s->trace_owned = true;
    return 0;
}

void srv_trace_close(srv *s) {
    if (s->trace_owned) fclose(s->trace);
    s->trace = NULL;
    s->trace_owned = false;
    if (s->trace_mu_init) pthread_mutex_destroy(&s->trace_mu);
    s->trace_mu_init = false;
}

/* ---- the line ---------------------------------------------------------------------- */

static const char *miss_name(lm_cache_miss m) {
    switch (m) {
    case LM_MISS_NONE: return "none";
    case LM_MISS_DIVERGED: return "diverged";
    case LM_MISS_EVICTED: return "evicted";
    case LM_MISS_STATE: return "state";
    }
    return "unknown";
}

static double ms(double s) { return s > 0 ? (double)(int64_t)(s * 1e6 + 0.5) / 1e3 : 0; }

/* The decoded text of ids (lossy where a token cuts a UTF-8 character). */
static json_t *text_of(const srv *s, const int32_t *ids, int n) {
    if (n <= 0) return json_string("");
    int32_t buf[2 * LM_TRACE_WINDOW + 2 * SRV_TRACE_CONTEXT];
    int k = 0;
    for (int i = 0; i < n && k < (int)LM_COUNT(buf); i++)
        if (ids[i] >= 0 && ids[i] < s->n_vocab) buf[k++] = ids[i];
    lm_tok_str t = { 0 };
    lm_tokenizer_decode(s->tok, buf, (size_t)k, false, &t);
    json_t *j = srv_lossy_string(t.s ? t.s : "");
    free(t.s);
    return j;
}

static json_t *ids_json(const int32_t *ids, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

/* {"miss", "n_shared", "diverge_pos", and where the prompt departs from the
 * closest earlier one, the text on both sides}. */
static json_t *cache_json(const srv *s, const srv_trace_rec *r, const lm_request_trace *tr) {
    json_t *c = json_object();
    json_object_set_new(c, "miss", json_string(miss_name(tr->miss)));
    json_object_set_new(c, "n_shared", json_integer(tr->n_shared));
    json_object_set_new(c, "diverge_pos", json_integer(tr->diverge_pos));
    int dp = tr->diverge_pos;
    if (dp < 0 || !r->prompt) return c;
    /* shared context: this prompt's tokens just before dp (both have them) */
    int a = LM_MAX(0, dp - SRV_TRACE_CONTEXT), b = LM_MIN(dp, r->n_prompt_ids);
    json_object_set_new(c, "before", text_of(s, r->prompt + a, b - a));
    /* this prompt from dp */
    int pe = LM_MIN(r->n_prompt_ids, dp + SRV_TRACE_CONTEXT);
    json_object_set_new(c, "prompt", text_of(s, r->prompt + LM_MIN(dp, r->n_prompt_ids), LM_MAX(0, pe - dp)));
    json_object_set_new(c, "prompt_ids", ids_json(r->prompt + LM_MIN(dp, r->n_prompt_ids), LM_MAX(0, pe - dp)));
    return c; /* not tr->prev_window: the earlier request's text is not this line's to show */
}

/* {"n", "min", "mean", "max"[, "sizes"]} of the decode steps' batch sizes. */
static json_t *steps_json(const lm_request_trace *tr) {
    json_t *d = json_object();
    int n = tr->step_batch ? tr->n_steps : 0;
    json_object_set_new(d, "n", json_integer(tr->n_steps));
    if (n <= 0) return d;
    int lo = tr->step_batch[0], hi = lo;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        lo = LM_MIN(lo, tr->step_batch[i]);
        hi = LM_MAX(hi, tr->step_batch[i]);
        sum += tr->step_batch[i];
    }
    json_object_set_new(d, "min", json_integer(lo));
    json_object_set_new(d, "mean", json_real((double)(int64_t)(sum / n * 100 + 0.5) / 100));
    json_object_set_new(d, "max", json_integer(hi));
    if (n <= SRV_TRACE_MAX_STEPS) json_object_set_new(d, "sizes", ids_json(tr->step_batch, n));
    return d;
}

json_t *srv_trace_json(const srv *s, const srv_trace_rec *r) {
    const lm_request_trace *tr = r->tr;
    json_t *j = json_object();
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct tm tm;
    gmtime_r(&now.tv_sec, &tm);
    char ts[96];
    snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
             tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(now.tv_nsec / 1000000));
    json_object_set_new(j, "ts", json_string(ts));
    json_object_set_new(j, "id", json_string(r->id));
    json_object_set_new(j, "route", json_string(r->route));
    json_object_set_new(j, "status", json_integer(r->status));
    json_object_set_new(j, "finish", json_string(r->finish ? r->finish : "-"));
    if (r->error) json_object_set_new(j, "error", srv_lossy_string(r->error));
    json_object_set_new(j, "n_prompt", json_integer(r->n_prompt));
    json_object_set_new(j, "n_cached", json_integer(r->n_cached));
    if (tr) json_object_set_new(j, "n_cached_disk", json_integer(tr->n_cached_disk));
    json_object_set_new(j, "n_generated", json_integer(r->n_generated));
    json_object_set_new(j, "engine_trace", json_boolean(tr != NULL));
    json_t *sp = json_object();
    if (r->error) {
        json_object_set_new(sp, "total", json_real(ms(r->t_end - r->t_arrive)));
        json_object_set_new(j, "ms", sp);
        return j;
    }
    if (tr) {
        /* arrival -> submit: body parsing, chat template, tokenizer */
        json_object_set_new(sp, "prepare", json_real(ms(tr->t_submit - r->t_arrive)));
        json_object_set_new(sp, "queue", json_real(ms(tr->t_admit - tr->t_submit)));
        json_object_set_new(sp, "cache_lookup", json_real(ms(tr->lookup_s)));
        json_object_set_new(sp, "cache_restore", json_real(ms(tr->restore_s)));
        if (tr->n_cached_disk || tr->disk_read_s > 0) json_object_set_new(sp, "cache_disk_read", json_real(ms(tr->disk_read_s)));
        json_object_set_new(sp, "prefill", json_real(ms(tr->t_first > 0 ? tr->t_first - tr->t_admit : 0)));
        json_object_set_new(sp, "decode", json_real(ms(tr->t_first > 0 ? tr->t_done - tr->t_first : 0)));
        json_object_set_new(sp, "engine", json_real(ms(tr->t_done - tr->t_submit)));
    } else {
        json_object_set_new(sp, "queue", json_real(ms(r->queue_s)));
        json_object_set_new(sp, "prefill", json_real(ms(r->prefill_s)));
        json_object_set_new(sp, "decode", json_real(ms(r->t_first > 0 ? r->t_last - r->t_first : 0)));
    }
    json_object_set_new(sp, "ttft", json_real(ms(r->t_first > 0 ? r->t_first - r->t_arrive : 0)));
    json_object_set_new(sp, "total", json_real(ms(r->t_end - r->t_arrive)));
    json_object_set_new(j, "ms", sp);
    if (tr) {
        json_object_set_new(j, "prefill_chunks", json_integer(tr->n_prefill_chunks));
        json_object_set_new(j, "decode_steps", steps_json(tr));
        if (tr->spec_verifies) {
            json_t *sj = json_object();
            json_object_set_new(sj, "verify_steps", json_integer(tr->spec_verifies));
            json_object_set_new(sj, "drafted", json_integer(tr->spec_drafted));
            json_object_set_new(sj, "accepted", json_integer(tr->spec_accepted));
            json_object_set_new(sj, "draft_ms", json_real(ms(tr->spec_draft_s)));
            json_object_set_new(sj, "verify_ms", json_real(ms(tr->spec_verify_s)));
            json_object_set_new(j, "speculation", sj);
        }
        json_object_set_new(j, "cache", cache_json(s, r, tr));
    }
    return j;
}

void srv_trace_write(srv *s, const srv_trace_rec *r) {
    if (!s->trace) return;
    json_t *j = srv_trace_json(s, r);
    /* 10 significant digits: milliseconds as 12.345, not 12.3449999999 */
    char *line = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(10));
    json_decref(j);
    LM_ASSERT(line);
    size_t n = strlen(line);
    line = lm_xrealloc(line, n + 2);
    line[n++] = '\n';
    line[n] = 0;
    pthread_mutex_lock(&s->trace_mu);
    bool ok = fwrite(line, 1, n, s->trace) == n;
    ok = fflush(s->trace) == 0 && ok;
    int err = errno;
    if (!ok) {
        clearerr(s->trace);
        if (s->trace_lost++ == 0 || (s->trace_lost & (s->trace_lost - 1)) == 0) /* the 1st, 2nd, 4th, 8th ... */
            fprintf(stderr, "lumen: warning: --trace: a line could not be written (%s); %llu lost so far\n",
                    strerror(err), (unsigned long long)s->trace_lost);
    }
    pthread_mutex_unlock(&s->trace_mu);
    free(line);
}
