/* cmd_chat.c - `lumen chat`: an interactive terminal chat that streams.
 *
 * Each turn renders the whole conversation through the model's chat template
 * (chat/lm_chat.h, as the server does), encodes it, and lets lm_textgen feed
 * only the tokens that extend what the sequence already holds. Reasoning
 * (<think>...</think>) is shown dimmed and is not sent back in the history. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../chat/lm_chat.h"
#include "cli.h"
#include "textgen.h"

typedef struct chat_opts {
    const char *model, *system;
    int n_gen, ctx;
    bool no_think;
    lm_sampler_params sp;
    lm_common_opts co;
} chat_opts;

static const lm_opt k_opts[] = {
    { LM_OPT_STRING, "--model", "-m", LM_OPT_AT(chat_opts, model), "PATH", "Hugging Face folder or .gguf file",
      "the bundled demo model" },
    { LM_OPT_STRING, "--system", NULL, LM_OPT_AT(chat_opts, system), "TEXT", "a system message" },
    { LM_OPT_INT, "-n", NULL, LM_OPT_AT(chat_opts, n_gen), "N", "most tokens per answer", .ilo = 1, .ihi = 1 << 20 },
    { LM_OPT_GROUP, .off = offsetof(chat_opts, sp), .group = lm_cli_sampling_opts },
    { LM_OPT_INT, "--ctx", NULL, LM_OPT_AT(chat_opts, ctx), "N", "context length, at most the model's", .ilo = 16,
      .ihi = 1 << 24 },
    { LM_OPT_FLAG, "--no-think", NULL, LM_OPT_AT(chat_opts, no_think), NULL, "render with enable_thinking=false" },
    { LM_OPT_GROUP, .off = offsetof(chat_opts, co), .group = lm_cli_common_opts },
    { .kind = LM_OPT_END },
};

/* ctx 4096 is also what lm_textgen_open takes 0 for */
static const chat_opts k_defaults = { .n_gen = 512, .ctx = 4096, .sp = { .temperature = 0.7f, .top_p = 0.95f } };

static const lm_opt_cmd k_cmd = {
    .name = "chat",
    .usage = "lumen chat [-m MODEL] [options]",
    .about = "Reads your messages from standard input, one per line, and streams the\n"
             "model's answers. Commands: /reset starts over, /quit (or end of input) leaves.\n",
    .opts = k_opts,
    .defaults = &k_defaults,
    .size = sizeof(chat_opts),
};

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
    chat_opts o;
    int parsed = lm_opts_parse(&k_cmd, &o, argc, argv);
    if (parsed >= 0) return parsed;
    const lm_common_opts co = o.co;
    const lm_sampler_params sp = o.sp;
    const char *model_path = o.model, *system = o.system;
    const long n_gen = o.n_gen, ctx = o.ctx;
    const bool think = !o.no_think;
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
    lm_chat *chat = NULL;
    json_t *messages = json_array();
    json_t *kwargs = think ? NULL : json_pack("{s:b}", "enable_thinking", 0);
    int rc = 1;
    if (lm_textgen_open(&g, model, be, (int)ctx, &sp, &e)) goto fail;
    if (lm_chat_create(&chat, g.tok, NULL, &e)) {
        lm_err_prefix(&e, "%s", model_path);
        goto fail;
    }
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
        const lm_chat_req req = { .messages = messages, .kwargs = kwargs };
        lm_chat_prompt prompt;
        if (lm_chat_render(chat, &req, &prompt, &e)) goto fail_line;
        lm_tok_ids ids = { 0 };
        /* the template writes special tokens itself, as apply_chat_template does */
        int bad = lm_tokenizer_encode(g.tok, prompt.text, prompt.len, false, &ids, &e);
        lm_reasoning_opts ro = { .start_in_reasoning = prompt.start_in_reasoning };
        lm_chat_prompt_free(&prompt);
        if (bad) {
            lm_tok_ids_free(&ids);
            goto fail_line;
        }
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
    json_decref(kwargs);
    lm_chat_free(chat);
    lm_textgen_close(&g);
    lm_source_unref(model);
    lm_backend_destroy(be);
    return rc;
}
