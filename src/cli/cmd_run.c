/* cmd_run.c - `lumen run`: feed prompt ids, generate, print ids and timing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/lm_runner.h"
#include "../engine/lm_sampler.h"
#include "cli.h"
#include "enginegen.h"
#include "textgen.h"

typedef struct run_opts {
    const char *model, *text;
    int32_t *ids;        /* --prompt-ids (owned) */
    int n_ids;
    int n_gen, ctx;
    bool ignore_eos;
    lm_sampler_params sp;
    lm_kv_types kv;
    lm_rope_override rope;
    lm_engine_opts eo;   /* --spec: generation goes through the engine */
    lm_common_opts co;
} run_opts;

/* --prompt-ids "1,2,3": at least one id, each in [0, INT32_MAX]. */
static bool parse_ids(void *dst, const char *s) {
    run_opts *o = dst;
    int cap = 16, n = 0;
    int32_t *ids = lm_xmalloc((size_t)cap * sizeof *ids);
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            free(ids);
            return false;
        }
        if (n == cap) ids = lm_xrealloc(ids, (size_t)(cap *= 2) * sizeof *ids);
        ids[n++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (n == 0) {
        free(ids);
        return false;
    }
    free(o->ids);
    o->ids = ids;
    o->n_ids = n;
    return true;
}

static const lm_opt k_opts[] = {
    { LM_OPT_STRING, "--model", "-m", LM_OPT_AT(run_opts, model), "PATH", "Hugging Face folder or .gguf file",
      "the bundled demo model" },
    { LM_OPT_STRING, "--prompt", "-p", LM_OPT_AT(run_opts, text), "TEXT", "prompt text" },
    { LM_OPT_CUSTOM, "--prompt-ids", NULL, LM_OPT_AT(run_opts, ids), "IDS", "comma-separated token ids",
      .parse = parse_ids, .want = "a comma-separated list of token ids" },
    { LM_OPT_INT, "-n", NULL, LM_OPT_AT(run_opts, n_gen), "N", "tokens to generate", .ilo = 0, .ihi = 1 << 24 },
    { LM_OPT_GROUP, .off = offsetof(run_opts, sp), .group = lm_cli_sampling_opts },
    { LM_OPT_FLAG, "--ignore-eos", NULL, LM_OPT_AT(run_opts, ignore_eos), NULL,
      "keep generating after an end-of-sequence token" },
    { LM_OPT_INT, "--ctx", NULL, LM_OPT_AT(run_opts, ctx), "N", "context length", "the model's, capped to prompt + n",
      .ilo = 1, .ihi = 1 << 24 },
    { LM_OPT_GROUP, .off = offsetof(run_opts, eo), .group = lm_cli_spec_opts },
    { LM_OPT_GROUP, .off = offsetof(run_opts, kv), .group = lm_cli_kv_opts },
    { LM_OPT_GROUP, .off = offsetof(run_opts, rope), .group = lm_cli_rope_opts },
    { LM_OPT_GROUP, .off = offsetof(run_opts, co), .group = lm_cli_common_opts },
    { .kind = LM_OPT_END },
};

static const run_opts k_defaults = { .n_gen = 32, .sp = { .temperature = 0.0f, .top_p = 1.0f },
                                     .kv = LM_CLI_KV_DEFAULT };

static const lm_opt_cmd k_cmd = {
    .name = "run",
    .usage = "lumen run [-m MODEL] (-p TEXT | --prompt-ids 1,2,3) [options]",
    .about = "With -p, encodes the text with the model's tokenizer (special tokens as the\n"
             "tokenizer adds them), generates, and streams the generated text to stdout.\n"
             "With --prompt-ids, feeds the ids and prints the generated ids on one line.\n"
             "Timing goes to stderr. With --spec, generation runs through the server's\n"
             "engine with speculative decoding, and stderr also gets its counters.\n",
    .opts = k_opts,
    .defaults = &k_defaults,
    .size = sizeof(run_opts),
};

static void print_text(void *user, const char *t, size_t n) {
    (void)user;
    fwrite(t, 1, n, stdout);
    fflush(stdout);
}

/* -p: text in, streamed text out. */
static int run_text(const lm_common_opts *co, const char *model_path, const char *text, int n_gen, int ctx,
                    lm_kv_types kv, const lm_rope_override *rope, const lm_sampler_params *sp, bool ignore_eos) {
    double t_open = lm_now(); /* a GGUF is parsed here: part of the load */
    lm_source *src = lm_cli_open_model(model_path);
    t_open = lm_now() - t_open;
    if (!src) return 1;
    lm_backend *be = lm_cli_backend_for(co, src);
    if (!be) {
        lm_source_unref(src);
        return 1;
    }
    lm_err e = { { 0 } };
    lm_textgen g;
    lm_tok_ids ids = { 0 };
    lm_textgen_stats st;
    int rc = 1;
    double t0 = lm_now();
    lm_cli_progress pr;
    lm_cli_progress_begin(&pr, model_path);
    const lm_model_load_opts lo = { &pr.hook, *rope };
    if (lm_textgen_open(&g, src, be, ctx, kv, sp, &lo, &e)) {
        lm_cli_progress_end(&pr);
        goto fail;
    }
    double t_load = lm_now() - t0 + t_open;
    if (lm_tokenizer_encode(g.tok, text, strlen(text), true, &ids, &e)) goto fail;
    if (ids.n == 0) {
        lm_errf(&e, "the prompt encodes to no tokens");
        goto fail;
    }
    if (lm_textgen_run(&g, ids.ids, (int)ids.n, n_gen, ignore_eos, print_text, NULL, &st, &e)) goto fail;
    printf("\n");
    int n_fwd = st.generated > 0 ? st.generated - 1 : 0;
    fprintf(stderr, "load %.3f s | prefill %d tokens in %.3f s (%.1f tok/s) | decode %d tokens in %.3f s (%.1f tok/s)%s\n",
            t_load, st.prompt_tokens, st.prefill_s, st.prompt_tokens / st.prefill_s, st.generated, st.decode_s,
            n_fwd > 0 ? n_fwd / st.decode_s : 0.0, st.hit_eos ? " | stopped at end-of-sequence" : "");
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "lumen: %s\n", e.msg);
done:
    lm_tok_ids_free(&ids);
    lm_textgen_close(&g);
    lm_source_unref(src);
    lm_backend_destroy(be);
    return rc;
}

/* --spec: the request through the engine; text streamed as it comes. */
typedef struct spec_print {
    lm_detok *d;         /* -p: text; NULL: ids */
    int n;
} spec_print;

static void spec_token(void *user, int i, int32_t tok) {
    (void)i;
    spec_print *p = user;
    if (p->d) {
        lm_tok_str out = { 0 };
        lm_detok_push(p->d, tok, &out);
        if (out.len) fwrite(out.s, 1, out.len, stdout);
        lm_tok_str_free(&out);
    } else {
        printf(p->n ? " %d" : "%d", tok);
    }
    p->n++;
    fflush(stdout);
}

static int run_spec(run_opts *o) {
    lm_err e = { { 0 } };
    lm_source *src = lm_cli_open_model(o->model);
    lm_backend *be = src ? lm_cli_backend_for(&o->co, src) : NULL;
    lm_model *m = NULL;
    lm_tokenizer *tok = NULL;
    lm_tok_ids ids = { 0 };
    spec_print pr = { 0 };
    int rc = 1;
    if (!be) goto done;
    const lm_model_load_opts lo = { NULL, o->rope };
    double t0 = lm_now();
    if (lm_model_load_with(&m, src, be, &lo, &e)) goto fail;
    const int32_t *prompt = o->ids;
    int n_prompt = o->n_ids;
    int32_t stops[16];
    int n_stops = 0;
    if (o->text) {
        if (lm_tokenizer_load_from(&tok, src, &e) || lm_tokenizer_encode(tok, o->text, strlen(o->text), true, &ids, &e))
            goto fail;
        if (ids.n == 0) {
            lm_errf(&e, "the prompt encodes to no tokens");
            goto fail;
        }
        prompt = ids.ids, n_prompt = (int)ids.n;
        pr.d = lm_detok_create(tok, true);
        int32_t te = lm_tokenizer_eos(tok);
        if (te >= 0) stops[n_stops++] = te;
    }
    for (int k = 0; k < m->cfg.n_eos && n_stops < 16; k++) stops[n_stops++] = m->cfg.eos_ids[k];
    const double t_load = lm_now() - t0;
    lm_engine_opts eo = o->eo;
    eo.parallel = 1;
    eo.kv_type = o->kv;
    eo.ctx = o->ctx ? o->ctx : LM_MIN(m->cfg.max_pos, n_prompt + o->n_gen);
    lm_gen_params gp = { .sampling = o->sp, .repetition_penalty = 1, .max_tokens = LM_MAX(o->n_gen, 1),
                         .stop_tokens = stops, .n_stop_tokens = o->ignore_eos ? 0 : n_stops };
    lm_egen_req q = { .ids = prompt, .n = n_prompt, .out = lm_xmalloc((size_t)gp.max_tokens * sizeof(int32_t)) };
    lm_engine_stats st;
    double wall = 0;
    int r = lm_egen_run(m, &eo, &gp, &q, 1, spec_token, &pr, &st, &wall, &e);
    free(q.out);
    if (pr.d) {
        lm_tok_str out = { 0 };
        lm_detok_finish(pr.d, &out);
        if (out.len) fwrite(out.s, 1, out.len, stdout);
        lm_tok_str_free(&out);
    }
    printf("\n");
    if (r) goto fail;
    char js[1024];
    lm_egen_spec_json(&st, js, sizeof js);
    fprintf(stderr, "load %.3f s | %d prompt tokens, %d generated in %.3f s (%.1f tok/s, prefill included) | "
                    "%llu forwards | speculation {%s}\n",
            t_load, n_prompt, pr.n, wall, pr.n / wall, (unsigned long long)st.steps, js);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "lumen: %s\n", e.msg);
done:
    if (pr.d) lm_detok_free(pr.d);
    lm_tok_ids_free(&ids);
    lm_tokenizer_free(tok);
    lm_model_free(m);
    lm_source_unref(src);
    lm_backend_destroy(be);
    free(o->ids);
    return rc;
}

int lm_cmd_run(int argc, char **argv) {
    run_opts o;
    int parsed = lm_opts_parse(&k_cmd, &o, argc, argv);
    if (parsed < 0 && !o.text == !o.ids) {
        fprintf(stderr, "lumen run: give exactly one of -p TEXT and --prompt-ids (see lumen run --help)\n");
        parsed = 2;
    }
    if (parsed < 0 && !o.model && !(o.model = lm_cli_default_model())) parsed = 2;
    if (parsed >= 0) {
        free(o.ids);
        return parsed;
    }
    if (o.eo.spec != LM_SPEC_OFF) return run_spec(&o);
    const lm_common_opts co = o.co;
    const lm_sampler_params sp = o.sp;
    const char *model_path = o.model;
    const long n_gen = o.n_gen, ctx = o.ctx;
    const bool ignore_eos = o.ignore_eos;
    if (o.text) return run_text(&co, model_path, o.text, (int)n_gen, (int)ctx, o.kv, &o.rope, &sp, ignore_eos);
    int32_t *prompt = o.ids;
    int n_prompt = o.n_ids;

    int rc = 1;
    lm_err e = { { 0 } };
    double t_open = lm_now(); /* a GGUF is parsed here: part of the load */
    lm_source *src = lm_cli_open_model(model_path);
    t_open = lm_now() - t_open;
    lm_backend *be = src ? lm_cli_backend_for(&co, src) : NULL;
    lm_model *m = NULL;
    lm_runner *r = NULL;
    lm_sampler *s = NULL;
    float *logits = NULL;
    if (!be) goto done;
    double t0 = lm_now();
    const lm_model_load_opts lo = { NULL, o.rope };
    if (lm_model_load_with(&m, src, be, &lo, &e)) goto fail;
    double t_load = lm_now() - t0 + t_open;
    int want_ctx = ctx ? (int)ctx : LM_MIN(m->cfg.max_pos, n_prompt + (int)n_gen);
    if (n_prompt + n_gen > want_ctx) {
        lm_errf(&e, "prompt (%d) + generation (%ld) exceed the context of %d tokens", n_prompt, n_gen, want_ctx);
        goto fail;
    }
    if (lm_runner_create_kv(&r, m, want_ctx, 0, o.kv, &e)) goto fail;
    s = lm_sampler_create(&sp, m->cfg.vocab);
    logits = lm_xmalloc((size_t)m->cfg.vocab * sizeof(float));

    double t1 = lm_now();
    int32_t tok = 0;
    if (lm_runner_next(r, prompt, n_prompt, s, logits, &tok, &e)) goto fail;
    double t_prefill = lm_now() - t1;
    int n_done = 0;
    double t2 = lm_now();
    for (; n_done < n_gen; n_done++) {
        printf(n_done ? " %d" : "%d", tok);
        fflush(stdout);
        bool eos = false;
        for (int k = 0; k < m->cfg.n_eos; k++) eos |= tok == m->cfg.eos_ids[k];
        if ((eos && !ignore_eos) || n_done + 1 == n_gen) {
            n_done++;
            break;
        }
        const int32_t cur = tok;
        if (lm_runner_next(r, &cur, 1, s, logits, &tok, &e)) goto fail;
    }
    double t_decode = lm_now() - t2;
    printf("\n");
    /* n_done tokens were sampled, n_done - 1 of them needed a forward pass */
    int n_fwd = n_done > 0 ? n_done - 1 : 0;
    lm_backend *base = lm_backend_base(be);
    char where[64];
    if (!strcmp(base->name, "cpu"))
        snprintf(where, sizeof where, "cpu, %d threads", lm_cpu_backend_threads(base));
    else
        snprintf(where, sizeof where, "%s", base->name);
    fprintf(stderr, "load %.3f s | prefill %d tokens in %.3f s (%.1f tok/s) | decode %d tokens in %.3f s (%.1f tok/s) | %s\n",
            t_load, n_prompt, t_prefill, n_prompt / t_prefill, n_fwd, t_decode,
            n_fwd > 0 ? n_fwd / t_decode : 0.0, where);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "lumen: %s\n", e.msg);
done:
    free(logits);
    free(prompt);
    lm_sampler_free(s);
    lm_runner_free(r);
    lm_model_free(m);
    lm_source_unref(src);
    lm_backend_destroy(be);
    return rc;
}
