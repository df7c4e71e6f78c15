/* cmd_chat.c - `lumen chat`: an interactive terminal chat that streams.
 *
 * Design note
 * -----------
 * One sequence holds the conversation (lm_textgen). The first turn renders
 * the messages through the model's chat template (chat/lm_chat.h, as the
 * server does). Later turns are not rendered again from the start: the
 * template is rendered with a marker in place of the last answer, and only
 * its text after the marker (the end of the answer's turn, the new user
 * turn, the generation prompt) is encoded and fed after what the sequence
 * holds. So earlier turns are never prefilled twice, and the model keeps its
 * own tokens (thinking included) as it wrote them, as llama.cpp's chat does.
 * /reset, an interrupted prefill or an error start a fresh rendering.
 *
 * Ctrl-C during an answer stops it between two tokens; the part already
 * shown stays in the conversation (as the assistant's message, and in the
 * sequence), and the prompt comes back. Ctrl-C during the prefill drops the
 * turn. A second Ctrl-C before the first is seen leaves at once. At the
 * prompt Ctrl-C clears the line, or leaves on an empty one, as Ctrl-D does
 * (line_input.h). Reasoning (<think>...</think>) is shown dimmed on a
 * terminal and is not part of the saved messages. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <utf8proc.h>

#include "../base/lm_file.h"
#include "../chat/lm_chat.h"
#include "cli.h"
#include "line_input.h"
#include "textgen.h"

typedef struct chat_opts {
    const char *model, *system, *template_path;
    int n_gen, ctx;
    bool no_think, ignore_eos, stats;
    lm_sampler_params sp;
    lm_kv_types kv;
    lm_rope_override rope;
    lm_common_opts co;
} chat_opts;

static const lm_opt k_opts[] = {
    { LM_OPT_STRING, "--model", "-m", LM_OPT_AT(chat_opts, model), "PATH", "Hugging Face folder or .gguf file",
      "the bundled demo model" },
    { LM_OPT_STRING, "--system", NULL, LM_OPT_AT(chat_opts, system), "TEXT", "a system message" },
    { LM_OPT_STRING, "--chat-template", NULL, LM_OPT_AT(chat_opts, template_path), "FILE",
      "a Jinja chat template to use instead of the model's own (for a model without one)", .ilo = 1 },
    { LM_OPT_INT, "-n", NULL, LM_OPT_AT(chat_opts, n_gen), "N", "most tokens per answer", .ilo = 1, .ihi = 1 << 20 },
    { LM_OPT_FLAG, "--ignore-eos", NULL, LM_OPT_AT(chat_opts, ignore_eos), NULL,
      "keep generating past end-of-sequence, to -n tokens or the context's end" },
    { LM_OPT_GROUP, .off = offsetof(chat_opts, sp), .group = lm_cli_sampling_opts },
    { LM_OPT_INT, "--ctx", NULL, LM_OPT_AT(chat_opts, ctx), "N", "context length, at most the model's", .ilo = 16,
      .ihi = 1 << 24 },
    { LM_OPT_FLAG, "--no-think", NULL, LM_OPT_AT(chat_opts, no_think), NULL, "render with enable_thinking=false" },
    { LM_OPT_FLAG, "--stats", NULL, LM_OPT_AT(chat_opts, stats), NULL,
      "print each turn's token counts on stderr also when not typing at a terminal" },
    { LM_OPT_GROUP, .off = offsetof(chat_opts, kv), .group = lm_cli_kv_opts },
    { LM_OPT_GROUP, .off = offsetof(chat_opts, rope), .group = lm_cli_rope_opts },
    { LM_OPT_GROUP, .off = offsetof(chat_opts, co), .group = lm_cli_common_opts },
    { .kind = LM_OPT_END },
};

/* ctx 4096 is also what lm_textgen_open takes 0 for */
static const chat_opts k_defaults = { .n_gen = 512, .ctx = 4096, .sp = { .temperature = 0.7f, .top_p = 0.95f },
                                      .kv = LM_CLI_KV_DEFAULT };

#define CHAT_HELP                                                                                     \
    "  /reset      clear the conversation and start over\n"                                         \
    "  /save FILE  write the conversation to FILE: a JSON array of messages\n"                     \
    "  /help       this list\n"                                                                       \
    "  /quit       leave (also Ctrl-D, or Ctrl-C on an empty line)\n"

static const lm_opt_cmd k_cmd = {
    .name = "chat",
    .usage = "lumen chat [-m MODEL] [options]",
    .about = "Reads your messages from standard input, one per line, and streams the\n"
             "model's answers to standard output. On a terminal the line can be edited,\n"
             "earlier lines come back with the arrow keys (history in\n"
             "$XDG_STATE_HOME/lumen/history, else ~/.lumen_history), and Ctrl-C stops an\n"
             "answer (what was shown stays in the conversation). Each turn feeds only its\n"
             "new tokens: earlier turns stay in the model's cache. Commands:\n" CHAT_HELP,
    .opts = k_opts,
    .defaults = &k_defaults,
    .size = sizeof(chat_opts),
};

/* The flag the SIGINT handler sets and lm_textgen_run reads: a handler can
 * reach nothing else, so this one variable is global. */
static volatile sig_atomic_t g_stop;

static void on_sigint(int sig) {
    (void)sig;
    if (g_stop) _exit(130); /* the second Ctrl-C before the first was seen */
    g_stop = 1;
}

/* ---- the answer on the terminal ------------------------------------------------------------ */

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

/* ---- the conversation -------------------------------------------------------------------------- */

/* Stands in for the last answer when a turn's new text is rendered. */
#define CHAT_MARK "\x1flumen-answer-mark\x1f"

typedef struct chat_session {
    lm_textgen g;
    lm_chat *chat;
    json_t *messages;  /* [{role, content}], what /save writes */
    json_t *kwargs;    /* chat_template_kwargs, or NULL */
    const char *system;
    bool cont;         /* g holds the conversation up to the last answer (and its tail) */
} chat_session;

/* {role, content}. Bytes that are not UTF-8 (a line pasted in another
 * encoding, an answer stopped inside a character) become U+FFFD: JSON
 * strings, and so the messages, must be UTF-8. */
static json_t *message(const char *role, const char *text) {
    json_t *s = json_string(text);
    if (!s) {
        size_t n = strlen(text), k = 0;
        char *c = lm_xmalloc(3 * n + 1);
        for (size_t i = 0; i < n;) {
            utf8proc_int32_t cp;
            utf8proc_ssize_t got = utf8proc_iterate((const utf8proc_uint8_t *)text + i, (utf8proc_ssize_t)(n - i), &cp);
            if (got > 0) {
                memcpy(c + k, text + i, (size_t)got);
                k += (size_t)got, i += (size_t)got;
            } else {
                memcpy(c + k, "\xEF\xBF\xBD", 3);
                k += 3, i++;
            }
        }
        c[k] = 0;
        s = json_string(c);
        free(c);
    }
    return json_pack("{s:s,s:o}", "role", role, "content", s ? s : json_string(""));
}

static void append_ids(lm_tok_ids *dst, const int32_t *ids, size_t n) {
    if (dst->n + n > dst->cap) dst->ids = lm_xrealloc(dst->ids, (dst->cap = (dst->n + n) * 2) * sizeof(int32_t));
    memcpy(dst->ids + dst->n, ids, n * sizeof(int32_t));
    dst->n += n;
}

static void start_over(chat_session *cs) {
    json_array_clear(cs->messages);
    if (cs->system) json_array_append_new(cs->messages, message("system", cs->system));
    lm_textgen_forget(&cs->g);
    cs->cont = false;
}

/* The text the template puts after the last answer (its turn's end, the
 * new user message, the generation prompt) into *post (malloc'd), or NULL
 * when the template does not show the marker. */
static int text_after_answer(chat_session *cs, char **post, bool *start_in_reasoning, lm_err *e) {
    *post = NULL;
    size_t n = json_array_size(cs->messages);
    json_t *m = json_copy(cs->messages); /* shallow: the other messages are shared */
    json_array_set_new(m, n - 2, json_pack("{s:s,s:s}", "role", "assistant", "content", CHAT_MARK));
    /* the terminal's user writes the messages: special-token text stays theirs to use */
    const lm_chat_req req = { .messages = m, .kwargs = cs->kwargs, .special_in_content = true };
    lm_chat_prompt p;
    int rc = lm_chat_render(cs->chat, &req, &p, e);
    json_decref(m);
    if (!rc) {
        const char *at = strstr(p.text, CHAT_MARK);
        if (at) *post = lm_xstrdup(at + strlen(CHAT_MARK));
        *start_in_reasoning = p.start_in_reasoning;
    }
    lm_chat_prompt_free(&p);
    return rc;
}

/* The ids of the next turn (the messages end with its user message). */
static int turn_ids(chat_session *cs, lm_tok_ids *ids, bool *start_in_reasoning, lm_err *e) {
    lm_textgen *g = &cs->g;
    char *post = NULL;
    if (cs->cont && text_after_answer(cs, &post, start_in_reasoning, e)) return -1;
    if (post) {
        append_ids(ids, g->held.ids, g->held.n);
        const char *rest = post;
        if (g->has_tail && !g->tail_eos) append_ids(ids, &g->tail, 1); /* shown, never fed */
        if (g->has_tail && g->tail_eos) {
            /* the end token the model wrote stands for the template's own when they agree */
            size_t len = 0;
            const char *txt = lm_tokenizer_id_to_token(g->tok, g->tail, &len);
            if (txt && len && !strncmp(rest, txt, len)) {
                append_ids(ids, &g->tail, 1);
                rest += len;
            }
        }
        lm_tok_ids more = { 0 };
        int bad = lm_tokenizer_encode(g->tok, rest, strlen(rest), false, &more, e);
        if (!bad) append_ids(ids, more.ids, more.n);
        lm_tok_ids_free(&more);
        free(post);
        return bad ? -1 : 0;
    }
    /* the whole conversation: the template writes special tokens itself, as apply_chat_template does */
    const lm_chat_req req = { .messages = cs->messages, .kwargs = cs->kwargs, .special_in_content = true };
    lm_chat_prompt p;
    int rc = lm_chat_render(cs->chat, &req, &p, e);
    if (!rc) rc = lm_tokenizer_encode(g->tok, p.text, p.len, false, ids, e);
    *start_in_reasoning = p.start_in_reasoning;
    lm_chat_prompt_free(&p);
    return rc;
}

/* One turn: the user's line in, the answer out. Returns -1 with e set when
 * the turn failed (the conversation is as before it). */
static int turn(chat_session *cs, const char *line, const chat_opts *o, bool interactive, lm_err *e) {
    json_array_append_new(cs->messages, message("user", line));
    lm_tok_ids ids = { 0 };
    bool in_reasoning = false;
    if (turn_ids(cs, &ids, &in_reasoning, e)) {
        lm_tok_ids_free(&ids);
        json_array_remove(cs->messages, json_array_size(cs->messages) - 1);
        return -1;
    }
    lm_reasoning_opts ro = { .start_in_reasoning = in_reasoning };
    chat_out out = { .tty = isatty(STDOUT_FILENO) };
    out.rp = lm_reasoning_parser_create(&ro, e);
    lm_textgen_stats st;
    g_stop = 0;
    struct sigaction sa = { .sa_handler = on_sigint, .sa_flags = SA_RESTART }, old;
    sigemptyset(&sa.sa_mask);
    if (!interactive) sigaction(SIGINT, &sa, &old); /* a terminal session has it all along */
    int r = lm_textgen_run(&cs->g, ids.ids, (int)ids.n, o->n_gen, o->ignore_eos, on_text, &out, &st, e);
    if (!interactive) sigaction(SIGINT, &old, NULL);
    lm_reasoning_delta d;
    lm_reasoning_parser_finish(out.rp, &d);
    emit(&out, d.reasoning, d.reasoning_len, true);
    emit(&out, d.content, d.content_len, false);
    if (out.tty && out.in_dim) fputs("\033[0m", stdout);
    if (!st.stopped_in_prefill) printf("\n");
    fflush(stdout);
    lm_reasoning_parser_free(out.rp);
    lm_tok_ids_free(&ids);
    if (r || st.stopped_in_prefill) {
        /* the sequence may hold part of this turn: start afresh next time */
        cs->cont = false;
        lm_textgen_forget(&cs->g);
        json_array_remove(cs->messages, json_array_size(cs->messages) - 1);
        free(out.answer);
        if (st.stopped_in_prefill) {
            fprintf(stderr, "[stopped before the answer began; the message was dropped]\n");
            return 0;
        }
        return -1;
    }
    json_array_append_new(cs->messages, message("assistant", out.answer ? out.answer : ""));
    free(out.answer);
    cs->cont = true;
    if (st.stopped) fprintf(stderr, "[stopped]\n");
    if (interactive || o->stats) {
        int fed = st.prompt_tokens - st.reused_tokens;
        fprintf(stderr, "[%d prompt tokens: %d reused, %d new; %d generated, %.1f tok/s]\n", st.prompt_tokens,
                st.reused_tokens, fed, st.generated, st.generated > 1 ? (st.generated - 1) / st.decode_s : 0.0);
    }
    return 0;
}

/* A line starting with '/': a command. Returns 1 to leave, 0 to go on. */
static int command(chat_session *cs, const char *line) {
    if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) return 1;
    if (!strcmp(line, "/reset")) {
        start_over(cs);
        fprintf(stderr, "[conversation cleared%s]\n", cs->system ? "; the system message stays" : "");
    } else if (!strcmp(line, "/help")) {
        fputs(CHAT_HELP, stderr);
    } else if (!strncmp(line, "/save", 5) && (line[5] == ' ' || !line[5])) {
        const char *path = line + 5;
        while (*path == ' ') path++;
        if (!*path) fprintf(stderr, "lumen: /save needs a file name: /save FILE\n");
        else if (json_dump_file(cs->messages, path, JSON_INDENT(2)))
            fprintf(stderr, "lumen: /save: cannot write %s\n", path);
        else
            fprintf(stderr, "[saved %zu messages to %s]\n", json_array_size(cs->messages), path);
    } else {
        fprintf(stderr, "lumen: unknown command %s (/help lists them)\n", line);
    }
    return 0;
}

int lm_cmd_chat(int argc, char **argv) {
    chat_opts o;
    int parsed = lm_opts_parse(&k_cmd, &o, argc, argv);
    if (parsed >= 0) return parsed;
    const char *model_path = o.model;
    if (!model_path && !(model_path = lm_cli_default_model())) return 2;
    lm_err e = { { 0 } };
    char *tpl = NULL;
    if (o.template_path && !(tpl = lm_read_file(o.template_path, NULL, &e))) {
        fprintf(stderr, "lumen: --chat-template: %s\n", e.msg);
        return 1;
    }
    lm_source *model = lm_cli_open_model(model_path);
    if (!model) {
        free(tpl);
        return 1;
    }
    lm_backend *be = lm_cli_backend_for(&o.co, model);
    if (!be) {
        free(tpl);
        lm_source_unref(model);
        return 1;
    }
    chat_session cs = { .messages = json_array(), .system = o.system };
    cs.kwargs = o.no_think ? json_pack("{s:b}", "enable_thinking", 0) : NULL;
    lm_line_input *in = NULL;
    int rc = 1;
    lm_cli_progress pr;
    lm_cli_progress_begin(&pr, model_path);
    const lm_model_load_opts lo = { &pr.hook, o.rope };
    if (lm_textgen_open(&cs.g, model, be, o.ctx, o.kv, &o.sp, &lo, &e)) {
        lm_cli_progress_end(&pr);
        goto fail;
    }
    cs.g.stop = &g_stop;
    if (lm_chat_create(&cs.chat, cs.g.tok, tpl, &e)) {
        lm_err_prefix(&e, "%s", tpl ? o.template_path : model_path);
        if (!tpl) {
            size_t n = strlen(e.msg);
            snprintf(e.msg + n, sizeof e.msg - n, " (give one with --chat-template FILE)");
        }
        goto fail;
    }
    start_over(&cs);
    in = lm_line_input_create("lumen");
    const bool interactive = lm_line_input_interactive(in);
    if (interactive) fprintf(stderr, "lumen chat on %s. /help lists the commands; Ctrl-D leaves.\n", model_path);
    /* On a terminal Ctrl-C is caught for the whole session: between two
     * reads (a command running, an answer just ended) it is dropped, not
     * fatal; while editing it is a key. From a pipe only answers catch it,
     * so a script waiting for input still dies of it. */
    struct sigaction sa = { .sa_handler = on_sigint, .sa_flags = SA_RESTART }, old_sa;
    sigemptyset(&sa.sa_mask);
    if (interactive) sigaction(SIGINT, &sa, &old_sa);
    for (;;) {
        g_stop = 0; /* a Ctrl-C between reads has been dropped */
        const char *line;
        lm_line_status ls = lm_line_read(in, "> ", &line);
        if (ls == LM_LINE_EOF) break;
        if (ls == LM_LINE_CANCELLED || !*line) continue;
        if (line[0] == '/') {
            if (command(&cs, line)) break;
            continue;
        }
        if (turn(&cs, line, &o, interactive, &e))
            fprintf(stderr, "lumen: %s%s\n", e.msg, strstr(e.msg, "no longer fits") ? "; /reset starts over" : "");
    }
    if (interactive) sigaction(SIGINT, &old_sa, NULL);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "lumen: %s\n", e.msg);
done:
    lm_line_input_free(in);
    json_decref(cs.messages);
    json_decref(cs.kwargs);
    lm_chat_free(cs.chat);
    lm_textgen_close(&cs.g);
    lm_source_unref(model);
    lm_backend_destroy(be);
    free(tpl);
    return rc;
}
