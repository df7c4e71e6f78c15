/* cmd_chat.c - `lumen chat`: an interactive terminal chat that streams.
 *
 * Each turn renders the whole conversation through the model's chat template
 * (as a server would), encodes it, and lets lm_textgen feed only the tokens
 * that extend what the sequence already holds. Reasoning (<think>...</think>)
 * is shown dimmed and is not sent back in the history. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../server/parse/lm_parse.h"
#include "../template/lm_template.h"
#include "cli.h"
#include "textgen.h"

static const char *const k_help =
    "usage: lumen chat [-m MODEL] [options]\n"
    "\n"
    "Reads your messages from standard input, one per line, and streams the\n"
    "model's answers. Commands: /reset starts over, /quit (or end of input) leaves.\n"
    "\n"
    "  -m, --model PATH  Hugging Face folder or .gguf file (default: the bundled demo model)\n"
    "  --system TEXT     a system message\n"
    "  -n N              most tokens per answer (default 512)\n"
    LM_SAMPLING_HELP("0.7", "0.95")
    "  --ctx N           context length (default 4096)\n"
    "  --no-think        render with enable_thinking=false\n"
    LM_COMMON_HELP;

typedef struct chat_out {
    lm_reasoning_parser *rp;
    bool tty, in_dim;
    char *answer; /* content of this turn */
    size_t len, cap;
} chat_out;

static void emit(chat_out *o, const char *t, size_t n, bool dim) {
    if (!n) return;
    if (o->tty && dim != o->in_dim) {
        fputs(dim ? "\033[2m" : "\033[0m", stdout);
        o->in_dim = dim;
    }
    fwrite(t, 1, n, stdout);
    fflush(stdout);
    if (!dim) {
        if (o->len + n + 1 > o->cap) o->answer = lm_xrealloc(o->answer, o->cap = (o->len + n + 1) * 2);
        memcpy(o->answer + o->len, t, n);
        o->len += n;
        o->answer[o->len] = 0;
    }
}

static void on_text(void *user, const char *t, size_t n) {
    chat_out *o = user;
    lm_reasoning_delta d;
    lm_reasoning_parser_feed(o->rp, t, n, &d);
    emit(o, d.reasoning, d.reasoning_len, true);
    emit(o, d.content, d.content_len, false);
}

int lm_cmd_chat(int argc, char **argv) {
    lm_common_opts co = { 0 };
    const char *model_path = NULL, *system = NULL;
    long n_gen = 512, ctx = 0;
    lm_sampler_params sp = { 0.7f, 0, 0.95f, 0.0f, 0 };
    bool think = true;
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
        } else if (!strcmp(a, "--system")) {
            if (!(system = lm_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "-n")) {
            if (!(v = lm_cli_value(argc, argv, &i)) || !lm_cli_int(v, 1, 1 << 20, &n_gen)) goto bad;
        } else if (!strcmp(a, "--ctx")) {
            if (!(v = lm_cli_value(argc, argv, &i)) || !lm_cli_int(v, 16, 1 << 24, &ctx)) goto bad;
        } else if (!strcmp(a, "--no-think")) {
            think = false;
        } else {
            fprintf(stderr, "lumen chat: unknown option %s (see lumen chat --help)\n", a);
            return 2;
        }
        continue;
    bad:
        fprintf(stderr, "lumen chat: bad value for %s\n", a);
        return 2;
    }
    if (!model_path && !(model_path = lm_cli_default_model())) return 2;
    lm_source *model = lm_cli_open_model(model_path);
    if (!model) return 1;
    lm_backend *be = lm_cli_backend_for(&co, model);
    if (!be) {
        lm_source_unref(model);
        return 1;
    }
    lm_err e = { { 0 } };
    lm_textgen g;
    lm_template *tpl = NULL;
    json_t *messages = json_array();
    int rc = 1;
    if (lm_textgen_open(&g, model, be, (int)ctx, &sp, &e)) goto fail;
    const char *src = lm_tokenizer_chat_template(g.tok);
    if (!src) {
        lm_errf(&e, "%s: the model has no chat template", model_path);
        goto fail;
    }
    if (lm_template_parse(src, strlen(src), "chat_template", &tpl, &e)) goto fail;
    if (system) json_array_append_new(messages, json_pack("{s:s,s:s}", "role", "system", "content", system));
    bool tty = isatty(STDOUT_FILENO);
    if (isatty(STDIN_FILENO)) fprintf(stderr, "lumen chat on %s. /reset starts over, /quit leaves.\n", model_path);
    char *line = NULL;
    size_t cap = 0;
    for (;;) {
        if (isatty(STDIN_FILENO)) fputs("> ", stderr);
        ssize_t got = getline(&line, &cap, stdin);
        if (got < 0) break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (!strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            json_array_clear(messages);
            if (system) json_array_append_new(messages, json_pack("{s:s,s:s}", "role", "system", "content", system));
            continue;
        }
        if (got == 0) continue;
        json_array_append_new(messages, json_pack("{s:s,s:s}", "role", "user", "content", line));
        json_t *tctx = json_pack("{s:O,s:b,s:s?,s:s?}", "messages", messages, "add_generation_prompt", 1,
                                 "bos_token", lm_tokenizer_bos_token(g.tok), "eos_token", lm_tokenizer_eos_token(g.tok));
        if (!think) json_object_set_new(tctx, "enable_thinking", json_false());
        char *prompt = NULL;
        size_t plen = 0;
        int bad = lm_template_render(tpl, tctx, NULL, &prompt, &plen, &e);
        json_decref(tctx);
        if (bad) goto fail_line;
        lm_tok_ids ids = { 0 };
        /* the template writes special tokens itself, as apply_chat_template does */
        if (lm_tokenizer_encode(g.tok, prompt, plen, false, &ids, &e)) {
            free(prompt);
            goto fail_line;
        }
        lm_reasoning_opts ro = { .start_in_reasoning = lm_reasoning_prompt_open(prompt, plen, "<think>", "</think>") };
        free(prompt);
        chat_out out = { .tty = tty };
        out.rp = lm_reasoning_parser_create(&ro, &e);
        lm_textgen_stats st;
        int r = lm_textgen_run(&g, ids.ids, (int)ids.n, (int)n_gen, false, on_text, &out, &st, &e);
        lm_reasoning_delta d;
        lm_reasoning_parser_finish(out.rp, &d);
        emit(&out, d.reasoning, d.reasoning_len, true);
        emit(&out, d.content, d.content_len, false);
        if (out.tty && out.in_dim) fputs("\033[0m", stdout);
        printf("\n");
        lm_reasoning_parser_free(out.rp);
        lm_tok_ids_free(&ids);
        if (r) {
            free(out.answer);
            goto fail_line;
        }
        if (isatty(STDIN_FILENO))
            fprintf(stderr, "[%d prompt tokens, %d reused, %d generated, %.1f tok/s]\n", st.prompt_tokens,
                    st.reused_tokens, st.generated, st.generated > 1 ? (st.generated - 1) / st.decode_s : 0.0);
        json_array_append_new(messages, json_pack("{s:s,s:s}", "role", "assistant", "content", out.answer ? out.answer : ""));
        free(out.answer);
        continue;
    fail_line:
        fprintf(stderr, "lumen: %s\n", e.msg);
        json_array_remove(messages, json_array_size(messages) - 1);
    }
    free(line);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "lumen: %s\n", e.msg);
done:
    json_decref(messages);
    lm_template_free(tpl);
    lm_textgen_close(&g);
    lm_source_unref(model);
    lm_backend_destroy(be);
    return rc;
}
