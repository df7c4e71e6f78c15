/* cmd_run.c - `lumen run`: feed prompt ids, generate, print ids and timing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/lm_runner.h"
#include "../engine/lm_sampler.h"
#include "cli.h"
#include "textgen.h"

static const char *const k_help =
    "usage: lumen run [-m MODEL] (-p TEXT | --prompt-ids 1,2,3) [options]\n"
    "\n"
    "With -p, encodes the text with the model's tokenizer (special tokens as the\n"
    "tokenizer adds them), generates, and streams the generated text to stdout.\n"
    "With --prompt-ids, feeds the ids and prints the generated ids on one line.\n"
    "Timing goes to stderr.\n"
    "\n"
    "  -m, --model PATH  Hugging Face folder or .gguf file (default: the bundled demo model)\n"
    "  -p, --prompt TEXT prompt text\n"
    "  --prompt-ids IDS  comma-separated token ids\n"
    "  -n N              tokens to generate (default 32)\n"
    LM_SAMPLING_HELP("0", "1")
    "  --ignore-eos      keep generating after an end-of-sequence token\n"
    "  --ctx N           context length (default: the model's, capped to prompt + n)\n"
    LM_COMMON_HELP;

/* Parses "1,2,3"; returns the count or -1. */
static int parse_ids(const char *s, int32_t **out) {
    int cap = 16, n = 0;
    int32_t *ids = lm_xmalloc((size_t)cap * sizeof *ids);
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            free(ids);
            return -1;
        }
        if (n == cap) ids = lm_xrealloc(ids, (size_t)(cap *= 2) * sizeof *ids);
        ids[n++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    *out = ids;
    return n;
}

static void print_text(void *user, const char *t, size_t n) {
    (void)user;
    fwrite(t, 1, n, stdout);
    fflush(stdout);
}

/* -p: text in, streamed text out. */
static int run_text(const lm_common_opts *co, const char *model_path, const char *text, int n_gen, int ctx,
                    const lm_sampler_params *sp, bool ignore_eos) {
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
    if (lm_textgen_open(&g, src, be, ctx, sp, &e)) goto fail;
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

int lm_cmd_run(int argc, char **argv) {
    lm_common_opts co = { 0 };
    const char *model_path = NULL, *ids_text = NULL, *text = NULL;
    long n_gen = 32, ctx = 0;
    lm_sampler_params sp = { 0.0f, 0, 1.0f, 0.0f, 0 };
    bool ignore_eos = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int c = lm_cli_common(&co, argc, argv, &i);
        if (!c) c = lm_cli_sampling(&sp, argc, argv, &i);
        if (c < 0) return 2;
        if (c) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(k_help, stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(model_path = lm_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(text = lm_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--prompt-ids")) {
            if (!(ids_text = lm_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "-n")) {
            if (!(v = lm_cli_value(argc, argv, &i)) || !lm_cli_int(v, 0, 1 << 24, &n_gen)) goto bad;
        } else if (!strcmp(a, "--ctx")) {
            if (!(v = lm_cli_value(argc, argv, &i)) || !lm_cli_int(v, 1, 1 << 24, &ctx)) goto bad;
        } else if (!strcmp(a, "--ignore-eos")) {
            ignore_eos = true;
        } else {
            fprintf(stderr, "lumen run: unknown option %s (see lumen run --help)\n", a);
            return 2;
        }
        continue;
    bad:
        fprintf(stderr, "lumen run: bad value for %s (see lumen run --help)\n", a);
        return 2;
    }
    if (!text == !ids_text) {
        fprintf(stderr, "lumen run: give exactly one of -p TEXT and --prompt-ids (see lumen run --help)\n");
        return 2;
    }
    if (!model_path && !(model_path = lm_cli_default_model())) return 2;
    if (text) return run_text(&co, model_path, text, (int)n_gen, (int)ctx, &sp, ignore_eos);
    int32_t *prompt = NULL;
    int n_prompt = parse_ids(ids_text, &prompt);
    if (n_prompt <= 0) {
        fprintf(stderr, "lumen run: --prompt-ids must be a comma-separated list of token ids\n");
        return 2;
    }

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
    if (lm_model_load_from(&m, src, be, &e)) goto fail;
    double t_load = lm_now() - t0 + t_open;
    int want_ctx = ctx ? (int)ctx : LM_MIN(m->cfg.max_pos, n_prompt + (int)n_gen);
    if (n_prompt + n_gen > want_ctx) {
        lm_errf(&e, "prompt (%d) + generation (%ld) exceed the context of %d tokens", n_prompt, n_gen, want_ctx);
        goto fail;
    }
    if (lm_runner_create(&r, m, want_ctx, 0, &e)) goto fail;
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
