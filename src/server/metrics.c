/* metrics.c - request counters and latency histograms, exposed at /metrics
 * in the Prometheus text format (version 0.0.4).
 *
 * One mutex guards everything: updates are a handful per request, far from
 * any hot path. Engine gauges (queue depth, running sequences, KV blocks) are
 * read from lm_engine_get_stats when the page is rendered, and so are the
 * prefix cache's counters and the batch-size histogram. Requests are
 * counted by route_table.c's entry and named by its metric field. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

static const char *const k_codes[6] = { "2xx", "400", "401", "404", "4xx", "5xx" };

static void hist_init(srv_hist *h, const double *bounds, int n) {
    memset(h, 0, sizeof *h);
    LM_ASSERT(n <= SRV_HIST_BUCKETS);
    memcpy(h->bounds, bounds, (size_t)n * sizeof *bounds);
    h->n_bounds = n;
}

void srv_metrics_init(srv_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    static const double lat[] = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120 };
    static const double tok[] = { 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1 };
    hist_init(&m->ttft, lat, (int)LM_COUNT(lat));
    hist_init(&m->duration, lat, (int)LM_COUNT(lat));
    hist_init(&m->queue, lat, (int)LM_COUNT(lat));
    hist_init(&m->per_token, tok, (int)LM_COUNT(tok));
}

void srv_metrics_free(srv_metrics *m) { pthread_mutex_destroy(&m->mu); }

void srv_metrics_request(srv_metrics *m, int route, int status) {
    int c = status < 300 ? 0 : status == 400 ? 1 : status == 401 ? 2 : status == 404 ? 3 : status < 500 ? 4 : 5;
    pthread_mutex_lock(&m->mu);
    m->requests[route][c]++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_observe(srv_hist *h, srv_metrics *m, double v) {
    pthread_mutex_lock(&m->mu);
    int b = 0;
    while (b < h->n_bounds && v > h->bounds[b]) b++;
    h->counts[b]++;
    h->total++;
    h->sum += v;
    pthread_mutex_unlock(&m->mu);
}

typedef struct tbuf {
    char *p;
    size_t n, cap;
} tbuf;

static void tprintf(tbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tprintf(tbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        LM_ASSERT(w >= 0);
        if ((size_t)w < b->cap - b->n) {
            b->n += (size_t)w;
            return;
        }
        b->cap = b->cap * 2 + (size_t)w;
        b->p = lm_xrealloc(b->p, b->cap);
    }
}

static void hist_text(tbuf *b, const char *name, const char *help, const srv_hist *h) {
    tprintf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        tprintf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    tprintf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum, name,
            h->sum, name, (unsigned long long)h->total);
}

static void counter(tbuf *b, const char *name, const char *help, uint64_t v) {
    tprintf(b, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, (unsigned long long)v);
}

static void gauge(tbuf *b, const char *name, const char *help, long long v) {
    tprintf(b, "# HELP %s %s\n# TYPE %s gauge\n%s %lld\n", name, help, name, name, v);
}

/* lumen_batch_size: the engine's steps by sequences in the forward, bucket i
 * counting sizes 2^i .. 2^(i+1)-1, as a cumulative Prometheus histogram. The
 * engine keeps no sum of sizes, so there is no _sum (optional in the format);
 * lumen_engine_batch_tokens_total / lumen_engine_steps_total is the mean
 * tokens per step. */
static void batch_hist_text(tbuf *b, const lm_engine_stats *es) {
    const char *name = "lumen_batch_size";
    tprintf(b, "# HELP %s Engine steps by the number of sequences in the forward.\n# TYPE %s histogram\n", name, name);
    uint64_t cum = 0;
    int nb = (int)LM_COUNT(es->batch_hist);
    for (int i = 0; i < nb - 1; i++) {
        cum += es->batch_hist[i];
        tprintf(b, "%s_bucket{le=\"%d\"} %llu\n", name, (2 << i) - 1, (unsigned long long)cum);
    }
    cum += es->batch_hist[nb - 1];
    tprintf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_count %llu\n", name, (unsigned long long)cum, name,
            (unsigned long long)cum);
}

/* Speculative decoding (--spec): acceptance per draft position, tokens
 * per verify step, time drafting and verifying. */
static void spec_text(tbuf *b, const lm_engine_stats *es) {
    counter(b, "lumen_spec_verify_steps_total", "Sequences a step fed with draft tokens to verify (--spec).",
            es->spec_verifies);
    counter(b, "lumen_spec_verify_tokens_total", "Tokens those verifications handed out (accepted drafts + 1 each).",
            es->spec_verify_tokens);
    counter(b, "lumen_spec_draft_tokens_total", "Draft tokens fed.", es->spec_drafted);
    counter(b, "lumen_spec_accepted_tokens_total", "Draft tokens accepted.", es->spec_accepted);
    counter(b, "lumen_spec_replayed_tokens_total",
            "Tokens a hybrid model fed again after a rejected draft (its recurrent state was rolled back).",
            es->spec_replayed);
    counter(b, "lumen_spec_undrafted_steps_total",
            "Decode steps of sequences the adaptive policy kept from drafting (it did not pay).", es->spec_off_steps);
    counter(b, "lumen_spec_draft_model_tokens_total",
            "Tokens the draft model fed (--spec draft:PATH): prompts and answers it followed, and its guesses.",
            es->spec_model_tokens);
    const char *d = "lumen_spec_position_draft_tokens_total", *a = "lumen_spec_position_accepted_tokens_total";
    tprintf(b, "# HELP %s Draft tokens fed at each draft position.\n# TYPE %s counter\n", d, d);
    for (int i = 0; i < LM_SPEC_MAX_DRAFT; i++)
        tprintf(b, "%s{position=\"%d\"} %llu\n", d, i + 1, (unsigned long long)es->spec_pos_drafted[i]);
    tprintf(b, "# HELP %s Of those, accepted (acceptance at a position: this over the draft count).\n# TYPE %s "
               "counter\n", a, a);
    for (int i = 0; i < LM_SPEC_MAX_DRAFT; i++)
        tprintf(b, "%s{position=\"%d\"} %llu\n", a, i + 1, (unsigned long long)es->spec_pos_accepted[i]);
    tprintf(b, "# HELP lumen_spec_draft_seconds_total Time proposing drafts (lookup, the MTP head's or a draft model's forwards).\n"
               "# TYPE lumen_spec_draft_seconds_total counter\nlumen_spec_draft_seconds_total %.6f\n",
            es->spec_draft_s);
    tprintf(b, "# HELP lumen_spec_verify_seconds_total Time in forwards of steps that verified drafts.\n"
               "# TYPE lumen_spec_verify_seconds_total counter\nlumen_spec_verify_seconds_total %.6f\n",
            es->spec_verify_s);
}

/* The prefix cache's disk tier: what it holds, wrote, read, and found wrong. */
static void disk_text(tbuf *b, const lm_dc_stats *d) {
    gauge(b, "lumen_disk_cache_budget_bytes", "Bytes the disk tier may hold (--cache-disk).", (long long)d->budget);
    gauge(b, "lumen_disk_cache_bytes", "Bytes of this model's entries in --cache-dir.", (long long)d->bytes);
    gauge(b, "lumen_disk_cache_entries", "This model's entries (KV blocks and state checkpoints) in --cache-dir.",
          d->entries);
    counter(b, "lumen_disk_cache_writes_total", "Entries written.", d->writes);
    counter(b, "lumen_disk_cache_reads_total", "Entries read and verified.", d->reads);
    counter(b, "lumen_disk_cache_evicted_total", "Entries deleted, least recently used first, over the budget.",
            d->evicted);
    counter(b, "lumen_disk_cache_dropped_total", "Entries not written because the writer's queue was full.",
            d->dropped);
    tprintf(b, "# HELP lumen_disk_cache_discarded_total Entries found bad and not served, by reason: write_error "
               "(ENOSPC, EIO ...), read_error (EIO ...), corrupt (torn, truncated, checksum), foreign (another model, "
               "KV format or version; left alone), temp (a write cut short by a crash, deleted at start), old_format (files "
               "of an older cache format, deleted at start).\n"
               "# TYPE lumen_disk_cache_discarded_total counter\n");
    const struct { const char *why; uint64_t n; } k[] = { { "write_error", d->write_errors },
                                                          { "read_error", d->read_errors },
                                                          { "corrupt", d->corrupt },
                                                          { "foreign", d->foreign },
                                                          { "temp", d->temp_cleaned },
                                                          { "old_format", d->old_format } };
    for (size_t i = 0; i < LM_COUNT(k); i++)
        tprintf(b, "lumen_disk_cache_discarded_total{reason=\"%s\"} %llu\n", k[i].why, (unsigned long long)k[i].n);
    tprintf(b, "# HELP lumen_disk_cache_open_seconds Time the index rebuild took at start.\n"
               "# TYPE lumen_disk_cache_open_seconds gauge\nlumen_disk_cache_open_seconds %.6f\n", d->open_s);
}

/* The prefix cache: what was looked up and hit, what it holds, why it missed. */
static void cache_text(tbuf *b, const lm_engine_stats *es, size_t budget) {
    gauge(b, "lumen_prefix_cache_budget_bytes", "Memory the prefix cache may use (--cache-ram; 0 = off).",
          (long long)budget);
    gauge(b, "lumen_prefix_cache_bytes", "Memory the prefix cache holds.", (long long)es->cache_bytes);
    gauge(b, "lumen_prefix_cache_blocks", "KV blocks held by the prefix cache.", es->cache_blocks);
    gauge(b, "lumen_prefix_cache_checkpoints", "Recurrent-state checkpoints held by the prefix cache.",
          es->cache_checkpoints);
    counter(b, "lumen_prefix_cache_lookup_tokens_total", "Prompt tokens looked up in the prefix cache.",
            es->cache_lookup_tokens);
    counter(b, "lumen_prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache.",
            es->cache_hit_tokens);
    tprintf(b, "# HELP lumen_prefix_cache_hit_ratio Hit tokens over lookup tokens since start (0 before any lookup).\n"
               "# TYPE lumen_prefix_cache_hit_ratio gauge\nlumen_prefix_cache_hit_ratio %.6f\n",
            es->cache_lookup_tokens ? (double)es->cache_hit_tokens / (double)es->cache_lookup_tokens : 0.0);
    counter(b, "lumen_prefix_cache_evicted_blocks_total", "KV blocks evicted from the prefix cache.",
            es->cache_evicted_blocks);
    tprintf(b, "# HELP lumen_prefix_cache_misses_total Prompts the prefix cache could not serve as far as they match an "
               "earlier prompt, by reason: diverged (departs from the closest earlier prompt before its end), "
               "evicted (the shared tokens were dropped), state (no recurrent-state checkpoint to resume from).\n# TYPE lumen_prefix_cache_misses_total counter\n"
               "lumen_prefix_cache_misses_total{reason=\"diverged\"} %llu\n"
               "lumen_prefix_cache_misses_total{reason=\"evicted\"} %llu\n"
               "lumen_prefix_cache_misses_total{reason=\"state\"} %llu\n",
            (unsigned long long)es->miss_diverged, (unsigned long long)es->miss_evicted,
            (unsigned long long)es->miss_state);
    tprintf(b, "# HELP lumen_prefix_cache_tier_hit_tokens_total Prompt tokens served from the prefix cache, by the tier "
               "they came from: ram (held in memory), disk (read from --cache-dir).\n"
               "# TYPE lumen_prefix_cache_tier_hit_tokens_total counter\n"
               "lumen_prefix_cache_tier_hit_tokens_total{tier=\"ram\"} %llu\n"
               "lumen_prefix_cache_tier_hit_tokens_total{tier=\"disk\"} %llu\n",
            (unsigned long long)(es->cache_hit_tokens - es->cache_disk_hit_tokens),
            (unsigned long long)es->cache_disk_hit_tokens);
    if (es->disk_on || es->disk_failed)
        gauge(b, "lumen_disk_cache_enabled",
              "1: the prefix cache's disk tier (--cache-dir) is in use; 0: it was asked for but its directory could not "
              "be used (the log says why) and only the RAM cache serves.",
              es->disk_on);
    if (es->disk_on) disk_text(b, &es->disk);
}

char *srv_metrics_text(srv_metrics *m, lm_engine *en) {
    lm_engine_stats es;
    memset(&es, 0, sizeof es);
    if (en) lm_engine_get_stats(en, &es);
    tbuf b = { lm_xmalloc(4096), 0, 4096 };
    pthread_mutex_lock(&m->mu);
    const uint64_t g_compiles = m->grammar_compiles, g_hits = m->grammar_hits;
    const double g_compile_s = m->grammar_compile_s;
    tprintf(&b, "# HELP lumen_requests_total HTTP requests by route and status.\n# TYPE lumen_requests_total counter\n");
    for (int r = 0; r < SRV_N_ROUTES; r++)
        for (int c = 0; c < 6; c++)
            if (m->requests[r][c] || c == 0)
                tprintf(&b, "lumen_requests_total{route=\"%s\",status=\"%s\"} %llu\n", srv_routes[r].metric, k_codes[c],
                        (unsigned long long)m->requests[r][c]);
    counter(&b, "lumen_prompt_tokens_total", "Prompt tokens of finished generations.", m->prompt_tokens);
    counter(&b, "lumen_prompt_tokens_cached_total", "Prompt tokens served from the prefix cache.", m->cached_tokens);
    counter(&b, "lumen_completion_tokens_total", "Generated tokens.", m->completion_tokens);
    counter(&b, "lumen_client_disconnects_total", "Generations cancelled because the client went away.", m->disconnects);
    gauge(&b, "lumen_http_connections", "Open HTTP connections.", m->connections);
    gauge(&b, "lumen_streams_active", "Server-sent-event streams in progress.", m->streams);
    hist_text(&b, "lumen_time_to_first_token_seconds", "From request arrival to the first generated token.", &m->ttft);
    hist_text(&b, "lumen_request_duration_seconds", "From request arrival to the last token.", &m->duration);
    hist_text(&b, "lumen_queue_time_seconds", "Time waiting for admission to the engine.", &m->queue);
    hist_text(&b, "lumen_time_per_output_token_seconds", "Mean time between generated tokens, per request.",
              &m->per_token);
    pthread_mutex_unlock(&m->mu);
    gauge(&b, "lumen_queue_depth", "Requests waiting for admission.", es.queued);
    gauge(&b, "lumen_requests_running", "Sequences being generated.", es.running);
    counter(&b, "lumen_engine_steps_total", "Forward steps run by the engine.", es.steps);
    counter(&b, "lumen_engine_batch_tokens_total", "Tokens over all engine steps.", es.batch_tokens_total);
    counter(&b, "lumen_engine_look_ahead_steps_total",
            "Decode steps queued before the previous step's token ids reached the host (--look-ahead).",
            es.ahead_steps);
    counter(&b, "lumen_engine_look_ahead_discarded_total",
            "Rows of look-ahead steps for requests that had stopped on the step before.", es.ahead_discarded);
    gauge(&b, "lumen_kv_blocks_free", "Free KV cache blocks.", es.kv_blocks_free);
    gauge(&b, "lumen_kv_blocks_total", "KV cache blocks.", es.kv_blocks_total);
    counter(&b, "lumen_grammar_compiles_total", "Grammars compiled for structured output and tool calls.",
            g_compiles);
    counter(&b, "lumen_grammar_cache_hits_total", "Structured-output requests whose grammar was already compiled.",
            g_hits);
    tprintf(&b, "# HELP lumen_grammar_compile_seconds_total Time spent compiling grammars.\n"
                "# TYPE lumen_grammar_compile_seconds_total counter\nlumen_grammar_compile_seconds_total %.6f\n",
            g_compile_s);
    counter(&b, "lumen_grammar_fill_tokens_total", "Tokens appended by strict fill (forced by a grammar, not sampled).",
            es.grammar_fill_tokens);
    counter(&b, "lumen_grammar_masks_total", "Token masks applied to logits (one per constrained token).",
            es.grammar_masks);
    tprintf(&b, "# HELP lumen_grammar_mask_seconds_total Time spent computing token masks.\n"
                "# TYPE lumen_grammar_mask_seconds_total counter\nlumen_grammar_mask_seconds_total %.6f\n",
            es.grammar_mask_s);
    counter(&b, "lumen_grammar_masks_ahead_total", "Of those, masks computed while the forward ran.",
            es.grammar_masks_ahead);
    counter(&b, "lumen_grammar_masks_chained_total",
            "Of those, masks computed while the look-ahead's next forward ran and applied by the device's argmax.",
            es.grammar_masks_chained);
    tprintf(&b,
            "# HELP lumen_grammar_mask_wait_seconds_total Of that, time the engine spent on masks after the forwards "
            "(the rest ran while they did).\n"
            "# TYPE lumen_grammar_mask_wait_seconds_total counter\nlumen_grammar_mask_wait_seconds_total %.6f\n",
            es.grammar_wait_s);
    spec_text(&b, &es);
    batch_hist_text(&b, &es);
    cache_text(&b, &es, m->cache_ram);
    return b.p;
}
