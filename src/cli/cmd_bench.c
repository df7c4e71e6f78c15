/* cmd_bench.c - `lumen bench`: prefill and decode speed of one model, next to
 * the machine's copy bandwidth measured in the same run.
 *
 * Decode is memory-bound: each token reads every weight once, so its
 * roofline is weight_bytes / bandwidth. Prefill is compute-bound:
 * 2 * matmul_params flops per token (+ attention). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/lm_membw.h"
#include "../engine/lm_lookahead.h"
#include "../engine/lm_runner.h"
#include "../engine/lm_sampler.h"
#include "../tokenizer/lm_tokenizer.h"
#include "cli.h"
#include "enginegen.h"

#include <jansson.h>

typedef struct bench_opts {
    const char *model;
    int prompt_len, gen, reps, chunk, batch; /* batch 0: not batched */
    bool no_look_ahead, no_membw, no_prefill;
    lm_kv_types kv;
    lm_rope_override rope;
    lm_engine_opts eo;       /* --spec */
    const char *prompts;     /* --prompts FILE */
    lm_common_opts co;
} bench_opts;

static const lm_opt k_opts[] = {
    { LM_OPT_STRING, "--model", "-m", LM_OPT_AT(bench_opts, model), "PATH", "Hugging Face folder or .gguf file" },
    { LM_OPT_INT, "--prompt-len", NULL, LM_OPT_AT(bench_opts, prompt_len), "N", "prompt tokens", .ilo = 1,
      .ihi = 1 << 20 },
    { LM_OPT_INT, "--gen", NULL, LM_OPT_AT(bench_opts, gen), "N", "decoded tokens", .ilo = 1, .ihi = 1 << 20 },
    { LM_OPT_INT, "--reps", NULL, LM_OPT_AT(bench_opts, reps), "N", "repetitions, best is reported", .ilo = 1,
      .ihi = 1000 },
    { LM_OPT_INT, "--chunk", NULL, LM_OPT_AT(bench_opts, chunk), "N", "most prompt tokens per forward", .ilo = 1,
      .ihi = 1 << 20 },
    { LM_OPT_INT, "--batch", NULL, LM_OPT_AT(bench_opts, batch), "B",
      "aggregate decode tokens/s of B sequences stepping together (each prefilled with --prompt-len random ids; "
      "greedy ids from the backend), and for one step without the output head the host time to enqueue it "
      "(body_issue_ms) against its whole time (body_ms); with the bandwidth measured, the time one step's weights "
      "take at the copy rate (weights_at_copy_ms) as a share of the step (decode_pct_of_copy: at batch 1 the same "
      "figure as without --batch, for decoding as the engine does it; not for a MoE model above batch 1, whose "
      "steps read more experts than one token's)",
      "off", .ilo = 1, .ihi = 4096 },
    { LM_OPT_FLAG, "--no-look-ahead", NULL, LM_OPT_AT(bench_opts, no_look_ahead), NULL,
      "with --batch: wait for each step's ids before queuing the next (by default, where the backend offers it, "
      "each step is queued before the previous one's ids reach the host, its tokens fed forward on the device, as "
      "the engine does; \"look_ahead\" in the output says which ran)" },
    { LM_OPT_FLAG, "--no-prefill", NULL, LM_OPT_AT(bench_opts, no_prefill), NULL,
      "with --batch: no prefill; the first --prompt-len positions of each sequence keep the KV cache as allocated "
      "(zeros), so decode at a long context is measured without spending its prefill (a decode step reads the "
      "same bytes whatever they hold)" },
    { LM_OPT_FLAG, "--no-membw", NULL, LM_OPT_AT(bench_opts, no_membw), NULL, "skip the bandwidth measurement" },
    { LM_OPT_STRING, "--prompts", NULL, LM_OPT_AT(bench_opts, prompts), "FILE",
      "with --spec: the workload, one JSON object per line with the prompt text in \"prompt\" (already in the "
      "chat template where it is a chat); each is generated greedily up to --gen tokens or an end token, --batch "
      "at a time (default 1), once plainly and once speculating in each of --reps rounds, in alternating order "
      "(the best of each is reported with their ratio, and the median of the rounds' ratios; the two must give "
      "the same tokens)", .ilo = 1 },
    { LM_OPT_GROUP, .off = offsetof(bench_opts, eo), .group = lm_cli_spec_opts },
    { LM_OPT_GROUP, .off = offsetof(bench_opts, kv), .group = lm_cli_kv_opts },
    { LM_OPT_GROUP, .off = offsetof(bench_opts, rope), .group = lm_cli_rope_opts },
    { LM_OPT_GROUP, .off = offsetof(bench_opts, co), .group = lm_cli_common_opts },
    { .kind = LM_OPT_END },
};

static const bench_opts k_defaults = { .prompt_len = 512, .gen = 64, .reps = 3, .chunk = 512,
                                       .kv = LM_CLI_KV_DEFAULT };

static const lm_opt_cmd k_cmd = {
    .name = "bench",
    .usage = "lumen bench -m MODEL [options]",
    .about = "Prints one JSON line: prefill tokens/s for a prompt of random ids, decode\n"
             "tokens/s after it, the bytes of weights each decoded token reads, the\n"
             "machine's memory bandwidth measured in the same run with the same threads\n"
             "(a STREAM-like copy, counting read + write bytes, and a streaming read),\n"
             "and decode speed as a fraction of the read roofline (weight bytes per token\n"
             "over read bandwidth) and of the copy figure. With --spec and --prompts, it\n"
             "instead runs a workload through the engine with and without speculative\n"
             "decoding in the same run and prints both and their ratio.\n",
    .opts = k_opts,
    .defaults = &k_defaults,
    .size = sizeof(bench_opts),
};

/* Parameters a token multiplies (every matrix but the embedding table, which
 * is only gathered), for the prefill flop count: the decode weight bytes over
 * the bytes of one stored weight. Exact for dense models of one weight type
 * (llama, hybrids); an upper bound for MoE, where a token uses k experts. */
static double matmul_params(const lm_model *m) {
    double esz = (double)lm_dtype_row_bytes(m->lm_head.type, 256) / 256.0;
    return (double)lm_model_weight_bytes(m) / esz - (double)m->cfg.d_model;
}

/* Copy bandwidth of the backend's own memory (read + write bytes): the GPU's
 * device-to-device copy through the backend ops, or the CPU probe. */
static double backend_copy_bandwidth(lm_backend *be, int threads) {
    if (strcmp(be->name, "cuda")) return lm_copy_bandwidth((size_t)1 << 30, threads, 5);
    const size_t bytes = (size_t)2 << 30;
    void *a = be->ops->alloc(be, bytes), *b = be->ops->alloc(be, bytes);
    double best = 0;
    if (a && b) {
        be->ops->copy(be, b, a, bytes); /* warm-up */
        lm_backend_sync(be);
        for (int rep = 0; rep < 5; rep++) {
            double t0 = lm_now();
            for (int i = 0; i < 4; i++) be->ops->copy(be, i & 1 ? a : b, i & 1 ? b : a, bytes);
            lm_backend_sync(be);
            double bw = 4 * 2.0 * (double)bytes / (lm_now() - t0);
            if (bw > best) best = bw;
        }
    }
    if (a) be->ops->free(be, a);
    if (b) be->ops->free(be, b);
    return best;
}

/* Aggregate decode speed of B sequences stepping together: each gets a
 * prompt of prompt_len random ids, then gen decode steps of one B-token
 * batch each. Returns tokens/s over the decode steps, or -1 with e set.
 * issue_ms / body_ms: for a step without the output head, the host time to
 * enqueue it and the time until the backend finished it (best of 8): when
 * they are close, the host, not the device, sets the pace.
 *
 * The look-ahead is the engine's mechanism (lm_lookahead_queue) without the
 * engine's policy: these sequences never stop, take only the argmax and
 * have no prefix cache, so none of its conditions (room for two more
 * tokens, checkpoints, discarded rows of stopped requests) apply and every
 * step after the first chains. */
static double batched_decode(lm_model *m, lm_kv_types kvt, int B, int prompt_len, int gen, int chunk, bool ahead,
                             bool prefill, double *issue_ms, double *body_ms, lm_err *e) {
    const int V = m->cfg.vocab, bs = 16, ctx = prompt_len + gen + 1;
    lm_kv_cache *kv = NULL;
    double tps = -1;
    if (lm_kv_cache_create_for(&kv, m, kvt, bs, B * ((ctx + bs - 1) / bs), B, 0, e)) return -1;
    lm_kv_seq *seqs = lm_xcalloc((size_t)B, sizeof *seqs);
    lm_batch_builder *bb = lm_batch_builder_create(LM_MAX(B, chunk), B, B, kv->pool.n_state > 0);
    int32_t *slots = lm_xmalloc((size_t)B * sizeof *slots), *toks = lm_xmalloc((size_t)chunk * sizeof *toks),
            *next = lm_xmalloc((size_t)2 * B * sizeof *next);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int s = 0; s < B; s++) {
        slots[s] = lm_kv_state_acquire(kv);
        if (lm_kv_seq_reserve(kv, &seqs[s], ctx, e)) goto done;
    }
    for (int s = 0; s < B; s++) next[s] = 1; /* without a prefill: any token */
    for (int s = 0; prefill && s < B; s++) /* prefill one sequence at a time */
        for (int done = 0; done < prompt_len;) {
            int t = LM_MIN(chunk, prompt_len - done);
            for (int i = 0; i < t; i++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                toks[i] = (int32_t)(x % (uint64_t)V);
            }
            lm_batch_reset(bb);
            int last = lm_batch_add_tokens(bb, lm_batch_add_seq(bb, seqs[s].blocks, slots[s]), toks, done, t);
            if (done + t == prompt_len) lm_batch_add_out(bb, last);
            lm_batch_set_argmax(bb, &next[s], NULL, false);
            if (lm_batch_forward(bb, m, &kv->pool, NULL, e)) goto done;
            done += t;
        }
    double t0 = lm_now();
    /* greedy on the backend, as the engine does: ids back, not logits; with
     * the look-ahead, step g takes step g - 1's ids on the device and is
     * queued before they reach the host (into the other half of next) */
    for (int g = 0; g < gen; g++) {
        const bool chained = ahead && g > 0;
        int32_t *ids = next + (ahead ? (size_t)(g % 2) * B : 0);
        lm_batch_reset(bb);
        for (int s = 0; s < B; s++) {
            int q = lm_batch_add_seq(bb, seqs[s].blocks, slots[s]);
            if (chained) lm_batch_add_from_argmax(bb, q, prompt_len + g);
            else lm_batch_add_out(bb, lm_batch_add_tokens(bb, q, &next[s], prompt_len + g, 1));
        }
        if (chained) {
            if (lm_lookahead_queue(m, &kv->pool, bb, ids, false, e)) goto done;
            lm_model_wait_argmax(m);
        } else {
            lm_batch_set_argmax(bb, ids, NULL, ahead);
            if (lm_batch_forward(bb, m, &kv->pool, NULL, e)) goto done;
        }
    }
    if (ahead) lm_model_wait_argmax(m);
    tps = (double)B * gen / (lm_now() - t0);
    *issue_ms = *body_ms = 1e30;
    /* the last step again, its head left out */
    lm_batch_reset(bb);
    for (int s = 0; s < B; s++)
        lm_batch_add_tokens(bb, lm_batch_add_seq(bb, seqs[s].blocks, slots[s]), &next[s], prompt_len + gen - 1, 1);
    for (int rep = 0; rep < 8; rep++) {
        double t1 = lm_now();
        if (lm_batch_forward(bb, m, &kv->pool, NULL, e)) goto fail;
        double t2 = lm_now();
        lm_backend_sync(m->be);
        *issue_ms = LM_MIN(*issue_ms, 1e3 * (t2 - t1));
        *body_ms = LM_MIN(*body_ms, 1e3 * (lm_now() - t1));
    }
    goto done;
fail:
    tps = -1;
done:
    for (int s = 0; s < B; s++) lm_kv_seq_release(kv, &seqs[s]);
    lm_kv_cache_free(kv);
    lm_batch_builder_free(bb);
    free(seqs), free(slots), free(toks), free(next);
    return tps;
}

/* --prompts: the "prompt" of every JSON line, tokenized; -1 with e. */
static int read_prompts(const char *path, lm_tokenizer *tok, lm_egen_req **out, int *n_out, lm_err *e) {
    FILE *f = fopen(path, "r");
    if (!f) return lm_errf(e, "cannot open %s", path);
    lm_egen_req *reqs = NULL;
    int n = 0, cap = 0, line = 0, rc = 0;
    char *buf = NULL;
    size_t bcap = 0;
    while (rc == 0 && getline(&buf, &bcap, f) > 0) {
        line++;
        if (buf[strspn(buf, " \t\r\n")] == 0) continue;
        json_error_t je;
        json_t *j = json_loads(buf, 0, &je);
        const char *text = j ? json_string_value(json_object_get(j, "prompt")) : NULL;
        lm_tok_ids ids = { 0 };
        if (!text) rc = lm_errf(e, "%s:%d: not a JSON object with a \"prompt\" string", path, line);
        else if (lm_tokenizer_encode(tok, text, strlen(text), true, &ids, e) == 0 && ids.n > 0) {
            if (n == cap) reqs = lm_xrealloc(reqs, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *reqs);
            reqs[n++] = (lm_egen_req){ .ids = ids.ids, .n = (int)ids.n };
        } else {
            lm_tok_ids_free(&ids);
        }
        json_decref(j);
    }
    free(buf);
    fclose(f);
    if (rc == 0 && n == 0) rc = lm_errf(e, "%s holds no prompt", path);
    *out = reqs, *n_out = n;
    return rc;
}

/* Seconds per output token after each request's first, over the run: the
 * decode phase alone (TPOT), which prefill does not dilute. */
static double run_tpot(const lm_egen_req *r, int n) {
    double s = 0;
    long toks = 0;
    for (int i = 0; i < n; i++)
        if (r[i].n_out > 1) s += r[i].done_s - r[i].first_s, toks += r[i].n_out - 1;
    return toks ? s / (double)toks : 0;
}

static double median_of(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1], v[j - 1] = t;
        }
    return n & 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* bench --spec: the workload plainly and speculating, --reps rounds of each. */
static int bench_spec(bench_opts *o, lm_source *src, lm_backend *be, lm_model *m, lm_err *e) {
    lm_tokenizer *tok = NULL;
    lm_egen_req *reqs = NULL, *ref = NULL;
    int n = 0, rc = -1;
    if (lm_tokenizer_load_from(&tok, src, e) || read_prompts(o->prompts, tok, &reqs, &n, e)) goto done;
    int32_t stops[16];
    int n_stops = 0;
    if (lm_tokenizer_eos(tok) >= 0) stops[n_stops++] = lm_tokenizer_eos(tok);
    for (int k = 0; k < m->cfg.n_eos && n_stops < 16; k++) stops[n_stops++] = m->cfg.eos_ids[k];
    const int B = o->batch > 0 ? o->batch : 1;
    int max_prompt = 0, generated = 0;
    for (int i = 0; i < n; i++) max_prompt = LM_MAX(max_prompt, reqs[i].n);
    ref = lm_xcalloc((size_t)n, sizeof *ref);
    for (int i = 0; i < n; i++) {
        reqs[i].out = lm_xmalloc((size_t)o->gen * sizeof(int32_t));
        ref[i] = reqs[i];
        ref[i].out = lm_xmalloc((size_t)o->gen * sizeof(int32_t));
    }
    lm_engine_opts plain = { .ctx = LM_MIN(m->cfg.max_pos, max_prompt + o->gen), .parallel = B, .kv_type = o->kv,
                             .step_tokens = 512 };
    lm_engine_opts spec = plain;
    spec.spec = o->eo.spec, spec.spec_draft = o->eo.spec_draft, spec.spec_fixed = o->eo.spec_fixed;
    spec.spec_replay = o->eo.spec_replay, spec.spec_model = o->eo.spec_model;
    lm_gen_params gp = { .sampling = { .top_p = 1 }, .repetition_penalty = 1, .max_tokens = o->gen,
                         .stop_tokens = stops, .n_stop_tokens = n_stops };
    double best_plain = 1e30, best_spec = 1e30, ratios[1000], tpot_ratios[1000];
    double tpot_plain = 1e30, tpot_spec = 1e30;
    lm_engine_stats st_plain = { 0 }, st_spec = { 0 }, st = { 0 };
    bool same = true;
    for (int rep = 0; rep < o->reps; rep++) {
        /* alternate which goes first, so that a drift in the machine's load
         * falls on both; each round's ratio is kept for the median */
        double wall_p = 0, wall_s = 0;
        for (int half = 0; half < 2; half++) {
            if ((half ^ (rep & 1)) == 0) {
                if (lm_egen_run(m, &plain, &gp, ref, n, NULL, NULL, &st, &wall_p, e)) goto done;
                if (wall_p < best_plain) best_plain = wall_p, st_plain = st;
            } else {
                if (lm_egen_run(m, &spec, &gp, reqs, n, NULL, NULL, &st, &wall_s, e)) goto done;
                if (wall_s < best_spec) best_spec = wall_s, st_spec = st;
            }
        }
        ratios[rep] = wall_p / wall_s;
        const double tp = run_tpot(ref, n), ts = run_tpot(reqs, n);
        tpot_ratios[rep] = ts > 0 ? tp / ts : 0;
        tpot_plain = LM_MIN(tpot_plain, tp), tpot_spec = LM_MIN(tpot_spec, ts);
        generated = 0;
        for (int i = 0; i < n; i++) {
            same &= reqs[i].n_out == ref[i].n_out && !memcmp(reqs[i].out, ref[i].out, (size_t)ref[i].n_out * 4);
            generated += ref[i].n_out;
        }
    }
    const double median = median_of(ratios, o->reps), tpot_median = median_of(tpot_ratios, o->reps);
    char js[1024], kvs[32];
    lm_egen_spec_json(&st_spec, js, sizeof js);
    const char *mode = o->eo.spec == LM_SPEC_MTP      ? "mtp"
                     : o->eo.spec == LM_SPEC_LOOKUP ? "lookup"
                     : o->eo.spec == LM_SPEC_DRAFT  ? "draft"
                                                    : "auto";
    printf("{\"model\":\"%s\",\"backend\":\"%s\",\"threads\":%d,\"kv\":\"%s\",\"prompts\":\"%s\",\"requests\":%d,"
           "\"batch\":%d,\"gen\":%d,\"spec\":\"%s\",\"spec_draft\":%d,\"spec_fixed\":%s,\"spec_replay\":%s,"
           "\"generated\":%d,\"same_tokens\":%s,\"plain_s\":%.4f,\"spec_s\":%.4f,\"plain_tok_s\":%.1f,\"spec_tok_s\":%.1f,"
           "\"speedup\":%.3f,\"speedup_median\":%.3f,\"plain_tpot_ms\":%.4f,\"spec_tpot_ms\":%.4f,"
           "\"decode_speedup\":%.3f,\"decode_speedup_median\":%.3f,\"plain_forwards\":%llu,\"spec_forwards\":%llu,%s}\n",
           o->model, be->name, strcmp(be->name, "cuda") ? lm_cpu_backend_threads(lm_backend_base(be)) : 0,
           lm_kv_types_str(o->kv, kvs, sizeof kvs), o->prompts, n, B, o->gen, mode, o->eo.spec_draft,
           o->eo.spec_fixed ? "true" : "false", o->eo.spec_replay ? "true" : "false", generated, same ? "true" : "false",
           best_plain, best_spec,
           generated / best_plain, generated / best_spec, best_plain / best_spec, median, 1e3 * tpot_plain,
           1e3 * tpot_spec, tpot_spec > 0 ? tpot_plain / tpot_spec : 0.0, tpot_median,
           (unsigned long long)st_plain.steps, (unsigned long long)st_spec.steps, js);
    rc = same ? 0 : lm_errf(e, "speculative decoding changed the greedy tokens");
done:
    for (int i = 0; i < n; i++) {
        free((void *)reqs[i].ids);
        free(reqs[i].out);
        if (ref) free(ref[i].out);
    }
    free(reqs);
    free(ref);
    lm_tokenizer_free(tok);
    return rc;
}

int lm_cmd_bench(int argc, char **argv) {
    bench_opts o;
    int parsed = lm_opts_parse(&k_cmd, &o, argc, argv);
    if (parsed >= 0) return parsed;
    const lm_common_opts co = o.co;
    const char *model_path = o.model;
    const long prompt_len = o.prompt_len, gen = o.gen, reps = o.reps, chunk = o.chunk, batch = o.batch ? o.batch : 1;
    const bool membw = !o.no_membw, batched = o.batch > 0, look_ahead = !o.no_look_ahead;
    if (!model_path) {
        fprintf(stderr, "lumen bench: -m MODEL is required (see lumen bench --help)\n");
        return 2;
    }
    lm_source *src = lm_cli_open_model(model_path);
    if (!src) return 1;
    lm_backend *be = lm_cli_backend_for(&co, src);
    if (!be) {
        lm_source_unref(src);
        return 1;
    }
    lm_err e = { { 0 } };
    lm_model *m = NULL;
    lm_runner *r = NULL;
    int32_t *prompt = NULL;
    float *logits = NULL;
    int rc = 1;
    const lm_model_load_opts lo = { NULL, o.rope };
    if (lm_model_load_with(&m, src, be, &lo, &e)) goto fail;
    if (o.eo.spec != LM_SPEC_OFF) {
        if (!o.prompts) {
            lm_errf(&e, "bench --spec needs a workload: --prompts FILE");
            goto fail;
        }
        if (bench_spec(&o, src, be, m, &e)) goto fail;
        rc = 0;
        goto done;
    }
    if (batched) {
        double issue_ms = 0, body_ms = 0;
        const bool ahead = look_ahead && lm_model_look_ahead(m);
        double tps = batched_decode(m, o.kv, (int)batch, (int)prompt_len, (int)gen, (int)chunk, ahead, !o.no_prefill,
                                    &issue_ms, &body_ms, &e);
        if (tps < 0) goto fail;
        long replayed = 0, captured = 0;
        lm_backend_graph_counts(be, &replayed, &captured);
        char kvs[32];
        printf("{\"model\":\"%s\",\"backend\":\"%s\",\"kv\":\"%s\",\"kv_bytes_per_token\":%zu,\"batch\":%ld,"
               "\"prompt_len\":%ld,\"gen\":%ld,"
               "\"look_ahead\":%s,\"decode_tok_s\":%.2f,\"decode_step_ms\":%.3f,\"body_issue_ms\":%.3f,"
               "\"body_ms\":%.3f,\"graphs_replayed\":%ld",
               model_path, be->name, lm_kv_types_str(o.kv, kvs, sizeof kvs),
               lm_kv_model_bytes_per_token(m, o.kv, 0), batch, prompt_len, gen,
               ahead ? "true" : "false", tps, 1e3 * batch / tps, issue_ms, body_ms, replayed);
        const bool gpu = !strcmp(be->name, "cuda");
        double bw = membw ? backend_copy_bandwidth(be, gpu ? 0 : lm_cpu_backend_threads(lm_backend_base(be))) : 0;
        if (bw > 0) printf(",\"copy_GB_s\":%.3f", bw * 1e-9);
        /* a dense step reads every weight once, whatever the batch; a MoE
         * step of several tokens reads an expert per distinct pick, which
         * the weight count (one token's experts) does not say */
        if (bw > 0 && (batch == 1 || m->cfg.n_experts == 0)) {
            const double w_s = (double)lm_model_weight_bytes(m) / bw;
            printf(",\"weights_at_copy_ms\":%.3f,\"decode_pct_of_copy\":%.1f", 1e3 * w_s,
                   100 * w_s * tps / (double)batch);
        }
        printf("}\n");
        rc = 0;
        goto done;
    }
    if (lm_runner_create_kv(&r, m, (int)(prompt_len + gen + 1), (int)chunk, o.kv, &e)) goto fail;
    prompt = lm_xmalloc((size_t)prompt_len * sizeof *prompt);
    uint64_t x = 88172645463325252ull;
    for (long i = 0; i < prompt_len; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        prompt[i] = (int32_t)(x % (uint64_t)m->cfg.vocab);
    }
    logits = lm_xmalloc((size_t)m->cfg.vocab * sizeof(float));
    double best_prefill = 1e30, best_decode = 1e30;
    for (long rep = 0; rep < reps; rep++) {
        lm_runner_reset(r);
        double t0 = lm_now();
        if (lm_runner_eval(r, prompt, (int)prompt_len, false, logits, &e)) goto fail;
        double t1 = lm_now();
        for (long g = 0; g < gen; g++) {
            int32_t tok = lm_argmax(logits, m->cfg.vocab);
            if (lm_runner_eval(r, &tok, 1, false, logits, &e)) goto fail;
        }
        double t2 = lm_now();
        best_prefill = LM_MIN(best_prefill, t1 - t0);
        best_decode = LM_MIN(best_decode, t2 - t1);
    }
    double wbytes = (double)lm_model_weight_bytes(m);
    double prefill_tps = prompt_len / best_prefill, decode_tps = gen / best_decode;
    const bool gpu = !strcmp(be->name, "cuda");
    int threads = gpu ? 0 : lm_cpu_backend_threads(lm_backend_base(be));
    double bw = membw ? backend_copy_bandwidth(be, threads) : 0;
    /* a GPU has no separate streaming-read probe: its roofline is the copy figure */
    double rbw = membw ? (gpu ? bw : lm_read_bandwidth((size_t)1 << 30, threads, 5)) : 0;
    char kvs[32];
    printf("{\"model\":\"%s\",\"backend\":\"%s\",\"kv\":\"%s\",\"threads\":%d,\"weight_bytes\":%.0f,"
           "\"prompt_len\":%ld,\"prefill_tok_s\":%.2f,\"prefill_gflops\":%.2f,"
           "\"gen\":%ld,\"decode_tok_s\":%.3f,\"decode_weight_GB_s\":%.3f",
           model_path, be->name, lm_kv_types_str(o.kv, kvs, sizeof kvs), threads, wbytes, prompt_len, prefill_tps,
           2 * matmul_params(m) * prefill_tps * 1e-9, gen, decode_tps, wbytes * decode_tps * 1e-9);
    /* Two yardsticks: STREAM's copy figure counts read + write bytes; a decode
     * step only reads weights, so the streaming-read rate is its roofline. */
    if (bw > 0 && rbw > 0)
        printf(",\"copy_GB_s\":%.3f,\"read_GB_s\":%.3f,\"decode_roofline_tok_s\":%.3f,"
               "\"decode_pct_of_read_roofline\":%.1f,\"decode_pct_of_copy\":%.1f",
               bw * 1e-9, rbw * 1e-9, rbw / wbytes, 100 * decode_tps * wbytes / rbw, 100 * decode_tps * wbytes / bw);
    printf("}\n");
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "lumen: %s\n", e.msg);
done:
    free(prompt);
    free(logits);
    lm_runner_free(r);
    lm_model_free(m);
    lm_source_unref(src);
    lm_backend_destroy(be);
    return rc;
}
