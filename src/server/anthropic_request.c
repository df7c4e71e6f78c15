/* anthropic_request.c - an Anthropic Messages API body (POST /v1/messages,
 * /v1/messages/count_tokens) -> srv_req, the same request the chat
 * completions endpoint builds, so that both share the chat template, the
 * engine and output.c's parsers.
 *
 * The translation builds an OpenAI-shaped chat body that srv_req owns
 * (r->body) and points r->messages, r->tools and r->stop into it:
 *   system (string or text blocks)   -> a first {"role": "system"} message
 *                                       (cache_control is ignored);
 *   user text blocks                 -> a {"role": "user"} message;
 *   user tool_result blocks          -> {"role": "tool", "tool_call_id",
 *                                       "content"}, in block order ("Error: "
 *                                       before the text when is_error);
 *   assistant text / tool_use        -> content and tool_calls [{"id", "type":
 *                                       "function", "function": {"name",
 *                                       "arguments": input}}];
 *   assistant thinking               -> reasoning_content (what templates
 *                                       read); redacted_thinking is dropped;
 *   tools [{name, description,       -> [{"type": "function", "function":
 *           input_schema}]              {"name", "description", "parameters"}}];
 *   tool_choice auto/any/tool/none   -> SRV_TOOLS_AUTO/REQUIRED/NAMED/NONE;
 *   stop_sequences                   -> stop;
 *   thinking enabled/adaptive        -> chat_template_kwargs enable_thinking
 *            / disabled                 true / false (absent: the template's
 *                                       default; budget_tokens is not enforced;
 *                                       display "omitted" sends thinking blocks
 *                                       with empty text, as Anthropic does).
 * Anthropic's own rules that clients rely on are kept: max_tokens is
 * required (not for count_tokens; a cap, cut to what the model's context
 * leaves after the prompt), temperature and top_p are in [0, 1],
 * roles are user and assistant (and system, which the SDK also types).
 * Refused with a 400 that says so: images and documents, server tools (a
 * tool whose `type` is not "custom"), and a last assistant message (Anthropic
 * continues it as a prefill; lumen cannot yet). Any model name is accepted:
 * lumen serves one model, and Claude Code names its own. Errors name the
 * field the way Anthropic's do ("messages.0.content.1: ..."). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "server_internal.h"

/* ---- small helpers -------------------------------------------------------------- */

typedef struct sbuf {
    char *s;
    size_t len, cap;
} sbuf;

static void sb_put(sbuf *b, const char *p, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 128;
        while (cap < b->len + n + 1) cap *= 2;
        b->s = lm_xrealloc(b->s, cap);
        b->cap = cap;
    }
    if (n) memcpy(b->s + b->len, p, n);
    b->len += n;
    b->s[b->len] = 0;
}

/* Takes the text as a JSON string and empties the buffer. */
static json_t *sb_take(sbuf *b) {
    json_t *j = json_stringn(b->s ? b->s : "", b->len);
    b->len = 0;
    return j ? j : json_string("");
}

static const char *kind_of(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static int want(srv_err *e, const char *path, const char *what, const json_t *v) {
    return srv_bad(e, path, "%s: Input should be %s (got %s).", path, what, v ? kind_of(v) : "nothing");
}

/* The field, or NULL when absent or null. */
static const json_t *opt(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

static const char *type_of(const json_t *b) { return json_string_value(json_object_get(b, "type")); }

/* A block that lumen cannot take: images and documents (text-only models),
 * anything else by its type. */
static int unsupported_block(srv_err *e, const char *path, const char *t) {
    if (!strcmp(t, "image") || !strcmp(t, "document"))
        return srv_bad(e, path, "%s: %ss are not supported (lumen serves text-only models).", path, t);
    return srv_bad(e, path, "%s: content blocks of type '%.60s' are not supported here.", path, t);
}

/* Appends the text of a string or of an array of text blocks ("\n" between
 * blocks) to b. */
static int text_into(const json_t *c, const char *path, sbuf *b, srv_err *e) {
    if (json_is_string(c)) {
        sb_put(b, json_string_value(c), json_string_length(c));
        return 0;
    }
    if (!json_is_array(c)) return want(e, path, "a string or a list of text blocks", c);
    char p[96];
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *blk = json_array_get(c, i);
        const char *t = type_of(blk);
        snprintf(p, sizeof p, "%s.%zu", path, i);
        if (!json_is_object(blk) || !t) return srv_bad(e, p, "%s: a block is an object with a 'type'.", p);
        if (strcmp(t, "text")) return unsupported_block(e, p, t);
        const json_t *txt = json_object_get(blk, "text");
        if (!json_is_string(txt)) return want(e, p, "a text block with a string 'text'", txt);
        if (i) sb_put(b, "\n", 1);
        sb_put(b, json_string_value(txt), json_string_length(txt));
    }
    return 0;
}

static json_t *chat_message(const char *role, json_t *content) {
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string(role));
    json_object_set_new(m, "content", content);
    return m;
}

/* ---- messages ------------------------------------------------------------------- */

/* A user turn: its text goes into user messages, each tool_result becomes a
 * tool message, in the order of the blocks. */
static int user_turn(const json_t *content, const char *path, json_t *out, srv_err *e) {
    if (json_is_string(content)) {
        json_array_append_new(out, chat_message("user", json_copy((json_t *)content)));
        return 0;
    }
    sbuf text = { 0 };
    bool have_text = false;
    size_t before = json_array_size(out);
    char p[96];
    int rc = 0;
    for (size_t i = 0; i < json_array_size(content) && !rc; i++) {
        const json_t *blk = json_array_get(content, i);
        const char *t = type_of(blk);
        snprintf(p, sizeof p, "%s.%zu", path, i);
        if (!json_is_object(blk) || !t) {
            rc = srv_bad(e, p, "%s: a content block is an object with a 'type'.", p);
        } else if (!strcmp(t, "text")) {
            const json_t *txt = json_object_get(blk, "text");
            if (!json_is_string(txt)) {
                rc = want(e, p, "a text block with a string 'text'", txt);
                break;
            }
            if (have_text) sb_put(&text, "\n", 1);
            sb_put(&text, json_string_value(txt), json_string_length(txt));
            have_text = true;
        } else if (!strcmp(t, "tool_result")) {
            const json_t *id = json_object_get(blk, "tool_use_id");
            if (!json_is_string(id)) {
                rc = want(e, p, "a tool_result with a string 'tool_use_id'", id);
                break;
            }
            if (have_text) { /* text before a result stays before it */
                json_array_append_new(out, chat_message("user", sb_take(&text)));
                have_text = false;
            }
            sbuf res = { 0 };
            if (json_is_true(json_object_get(blk, "is_error"))) sb_put(&res, "Error: ", 7);
            const json_t *c = opt(blk, "content");
            char cp[112];
            snprintf(cp, sizeof cp, "%s.content", p);
            if (c) rc = text_into(c, cp, &res, e);
            json_t *m = chat_message("tool", sb_take(&res));
            free(res.s);
            json_object_set_new(m, "tool_call_id", json_copy((json_t *)id));
            json_array_append_new(out, m);
        } else {
            rc = unsupported_block(e, p, t);
        }
    }
    if (!rc && (have_text || json_array_size(out) == before))
        json_array_append_new(out, chat_message("user", sb_take(&text)));
    free(text.s);
    return rc;
}

/* An assistant turn: text into content, thinking into reasoning_content,
 * tool_use blocks into tool_calls. */
static int assistant_turn(const json_t *content, const char *path, json_t *out, srv_err *e) {
    if (json_is_string(content)) {
        json_array_append_new(out, chat_message("assistant", json_copy((json_t *)content)));
        return 0;
    }
    sbuf text = { 0 }, thought = { 0 };
    json_t *calls = json_array();
    char p[96];
    int rc = 0;
    for (size_t i = 0; i < json_array_size(content) && !rc; i++) {
        const json_t *blk = json_array_get(content, i);
        const char *t = type_of(blk);
        snprintf(p, sizeof p, "%s.%zu", path, i);
        if (!json_is_object(blk) || !t) {
            rc = srv_bad(e, p, "%s: a content block is an object with a 'type'.", p);
        } else if (!strcmp(t, "text") || !strcmp(t, "thinking")) {
            bool is_text = !strcmp(t, "text");
            const json_t *txt = json_object_get(blk, is_text ? "text" : "thinking");
            if (!json_is_string(txt)) {
                rc = want(e, p, is_text ? "a text block with a string 'text'" : "a thinking block with a string 'thinking'", txt);
                break;
            }
            sbuf *b = is_text ? &text : &thought;
            if (b->len) sb_put(b, "\n", 1);
            sb_put(b, json_string_value(txt), json_string_length(txt));
        } else if (!strcmp(t, "redacted_thinking")) {
            continue; /* opaque to any model but Anthropic's */
        } else if (!strcmp(t, "tool_use")) {
            const json_t *id = json_object_get(blk, "id"), *name = json_object_get(blk, "name");
            const json_t *input = opt(blk, "input");
            if (!json_is_string(id) || !json_is_string(name)) {
                rc = srv_bad(e, p, "%s: a tool_use block needs a string 'id' and 'name'.", p);
                break;
            }
            if (input && !json_is_object(input)) {
                rc = want(e, p, "a tool_use block whose 'input' is an object", input);
                break;
            }
            json_t *fn = json_object();
            json_object_set_new(fn, "name", json_copy((json_t *)name));
            json_object_set_new(fn, "arguments", input ? json_deep_copy(input) : json_object());
            json_t *call = json_object();
            json_object_set_new(call, "id", json_copy((json_t *)id));
            json_object_set_new(call, "type", json_string("function"));
            json_object_set_new(call, "function", fn);
            json_array_append_new(calls, call);
        } else {
            rc = unsupported_block(e, p, t);
        }
    }
    if (!rc) {
        json_t *m = chat_message("assistant", sb_take(&text));
        if (thought.len) json_object_set_new(m, "reasoning_content", sb_take(&thought));
        if (json_array_size(calls)) json_object_set(m, "tool_calls", calls);
        json_array_append_new(out, m);
    }
    json_decref(calls);
    free(text.s);
    free(thought.s);
    return rc;
}

static int parse_messages(const json_t *body, json_t *out, srv_err *e) {
    const json_t *sys = opt(body, "system");
    if (sys) {
        sbuf b = { 0 };
        if (text_into(sys, "system", &b, e)) {
            free(b.s);
            return -1;
        }
        json_array_append_new(out, chat_message("system", sb_take(&b)));
        free(b.s);
    }
    const json_t *msgs = json_object_get(body, "messages");
    if (!msgs) return srv_bad(e, "messages", "messages: Field required.");
    if (!json_is_array(msgs)) return want(e, "messages", "a list", msgs);
    if (json_array_size(msgs) == 0) return srv_bad(e, "messages", "messages: at least one message is required.");
    char p[64];
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        snprintf(p, sizeof p, "messages.%zu", i);
        if (!json_is_object(m)) return want(e, p, "an object", m);
        const char *role = json_string_value(json_object_get(m, "role"));
        const json_t *content = json_object_get(m, "content");
        if (!role) return srv_bad(e, p, "%s.role: Field required (a string).", p);
        snprintf(p, sizeof p, "messages.%zu.content", i);
        if (!json_is_string(content) && !json_is_array(content))
            return want(e, p, "a string or a list of content blocks", content);
        int rc;
        if (!strcmp(role, "user")) {
            rc = user_turn(content, p, out, e);
        } else if (!strcmp(role, "assistant")) {
            if (i + 1 == json_array_size(msgs))
                return srv_bad(e, "messages", "messages.%zu: a final assistant message (prefill) is not supported by "
                                              "lumen; end the conversation with a user message.", i);
            rc = assistant_turn(content, p, out, e);
        } else if (!strcmp(role, "system")) {
            sbuf b = { 0 };
            rc = text_into(content, p, &b, e);
            if (!rc) json_array_append_new(out, chat_message("system", sb_take(&b)));
            free(b.s);
        } else {
            return srv_bad(e, p, "messages.%zu.role: '%.40s' is not one of 'user', 'assistant'.", i, role);
        }
        if (rc) return -1;
    }
    return 0;
}

/* ---- tools ------------------------------------------------------------------------ */

static int parse_tools(const json_t *body, json_t *out, srv_req *r, srv_err *e) {
    const json_t *tools = opt(body, "tools");
    json_t *fns = json_array();
    json_object_set_new(out, "tools", fns);
    char p[64];
    if (tools && !json_is_array(tools)) return want(e, "tools", "a list", tools);
    for (size_t i = 0; tools && i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i);
        snprintf(p, sizeof p, "tools.%zu", i);
        if (!json_is_object(t)) return want(e, p, "an object", t);
        const char *type = json_string_value(opt(t, "type"));
        const json_t *name = json_object_get(t, "name"), *schema = json_object_get(t, "input_schema");
        if (type && strcmp(type, "custom"))
            return srv_bad(e, p, "%s: server tools ('%.60s') are not supported by lumen; define the tool with "
                                 "'name', 'description' and 'input_schema' and run it in the client.", p, type);
        if (!json_is_string(name)) return srv_bad(e, p, "%s.name: Field required (a string).", p);
        if (!json_is_object(schema)) return want(e, p, "a tool whose 'input_schema' is an object", schema);
        const json_t *desc = opt(t, "description");
        if (desc && !json_is_string(desc)) return want(e, p, "a tool whose 'description' is a string", desc);
        json_t *fn = json_object();
        json_object_set_new(fn, "name", json_copy((json_t *)name));
        if (desc) json_object_set_new(fn, "description", json_copy((json_t *)desc));
        json_object_set_new(fn, "parameters", json_deep_copy(schema));
        json_t *w = json_object();
        json_object_set_new(w, "type", json_string("function"));
        json_object_set_new(w, "function", fn);
        json_array_append_new(fns, w);
    }
    if (json_array_size(fns)) r->tools = fns;

    r->tool_choice = SRV_TOOLS_AUTO;
    const json_t *tc = opt(body, "tool_choice");
    if (!tc) return 0;
    const char *type = json_string_value(json_object_get(tc, "type"));
    if (!json_is_object(tc) || !type) return want(e, "tool_choice", "an object with a 'type'", tc);
    const json_t *dp = opt(tc, "disable_parallel_tool_use");
    if (dp && !json_is_boolean(dp)) return want(e, "tool_choice.disable_parallel_tool_use", "a boolean", dp);
    r->one_tool_call = json_is_true(dp);
    if (!strcmp(type, "auto")) r->tool_choice = SRV_TOOLS_AUTO;
    else if (!strcmp(type, "any")) r->tool_choice = SRV_TOOLS_REQUIRED;
    else if (!strcmp(type, "none")) r->tool_choice = SRV_TOOLS_NONE;
    else if (!strcmp(type, "tool")) r->tool_choice = SRV_TOOLS_NAMED;
    else return srv_bad(e, "tool_choice", "tool_choice.type: '%.40s' is not one of 'auto', 'any', 'tool', 'none'.", type);
    if ((r->tool_choice == SRV_TOOLS_REQUIRED || r->tool_choice == SRV_TOOLS_NAMED) && !r->tools)
        return srv_bad(e, "tool_choice", "tool_choice: '%s' requires 'tools'.", type);
    if (r->tool_choice == SRV_TOOLS_NAMED) {
        const json_t *name = json_object_get(tc, "name");
        if (!json_is_string(name)) return srv_bad(e, "tool_choice", "tool_choice.name: Field required (a string).");
        for (size_t i = 0; i < json_array_size(fns) && !r->tool_name; i++) { /* a pointer into r->body */
            const char *n = json_string_value(json_object_get(json_object_get(json_array_get(fns, i), "function"), "name"));
            if (!strcmp(n, json_string_value(name))) r->tool_name = n;
        }
        if (!r->tool_name)
            return srv_bad(e, "tool_choice", "tool_choice.name: '%.100s' is not in 'tools'.", json_string_value(name));
    }
    if (r->tool_choice == SRV_TOOLS_NONE) r->tools = NULL;
    return 0;
}

/* ---- sampling and limits ----------------------------------------------------------- */

static int number_in(const json_t *body, const char *key, double lo, double hi, double *out, srv_err *e) {
    const json_t *v = opt(body, key);
    if (!v) return 0;
    if (!json_is_number(v)) return want(e, key, "a number", v);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return srv_bad(e, key, "%s: %g is not in [%g, %g].", key, x, lo, hi);
    *out = x;
    return 0;
}

static int parse_sampling(const srv *s, const json_t *body, bool counting, srv_req *r, srv_err *e) {
    lm_gen_params *gp = &r->gp;
    double t = 1, top_p = 1;
    if (number_in(body, "temperature", 0, 1, &t, e) || number_in(body, "top_p", 0, 1, &top_p, e)) return -1;
    const json_t *tk = opt(body, "top_k");
    if (tk && (!json_is_integer(tk) || json_integer_value(tk) < 0)) return want(e, "top_k", "an integer >= 0", tk);
    gp->sampling = (lm_sampler_params){ .temperature = (float)t, .top_p = top_p > 0 ? (float)top_p : 1e-9f,
                                        .top_k = tk ? (int)LM_MIN(json_integer_value(tk), 1 << 30) : 0 };
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed) seed = 0;
    gp->sampling.seed = seed ^ (uint64_t)(lm_now() * 1e9);
    gp->repetition_penalty = 1;
    gp->stop_tokens = s->stop_ids;
    gp->n_stop_tokens = s->n_stop_ids;
    /* speculative (lumen, as on the OpenAI routes): false opts out of --spec */
    const json_t *sp = opt(body, "speculative");
    if (sp && !json_is_boolean(sp)) return want(e, "speculative", "a boolean", sp);
    gp->no_spec = sp && json_is_false(sp);

    const json_t *mt = opt(body, "max_tokens");
    if (!mt && !counting) return srv_bad(e, "max_tokens", "max_tokens: Field required.");
    if (mt) {
        if (!json_is_integer(mt) || json_integer_value(mt) < 1) return want(e, "max_tokens", "an integer >= 1", mt);
        /* a cap, cut to what the context leaves (Claude Code asks for 32000
         * whatever the model) */
        gp->max_tokens = (int)LM_MIN(json_integer_value(mt), (json_int_t)s->ctx);
        r->max_tokens_set = true;
    }
    const json_t *st = opt(body, "stream");
    if (st && !json_is_boolean(st)) return want(e, "stream", "a boolean", st);
    r->stream = json_is_true(st) && !counting;
    const json_t *md = opt(body, "metadata");
    if (md && !json_is_object(md)) return want(e, "metadata", "an object", md);
    const json_t *model = json_object_get(body, "model");
    if (!json_is_string(model)) return want(e, "model", "a string (any name: lumen serves one model)", model);
    return 0;
}

/* stop_sequences -> out["stop"]; thinking -> out["chat_template_kwargs"]. */
static int parse_stop_and_thinking(const json_t *body, json_t *out, srv_req *r, srv_err *e) {
    const json_t *ss = opt(body, "stop_sequences");
    if (ss) {
        if (!json_is_array(ss)) return want(e, "stop_sequences", "a list of strings", ss);
        if (json_array_size(ss) > 16) return srv_bad(e, "stop_sequences", "stop_sequences: at most 16 strings.");
        for (size_t i = 0; i < json_array_size(ss); i++)
            if (!json_is_string(json_array_get(ss, i))) return want(e, "stop_sequences", "a list of strings", json_array_get(ss, i));
        json_object_set_new(out, "stop", json_deep_copy(ss));
        r->stop = json_object_get(out, "stop");
    }
    const json_t *th = opt(body, "thinking");
    if (th) {
        const char *type = json_string_value(json_object_get(th, "type"));
        if (!json_is_object(th) || !type) return want(e, "thinking", "an object with a 'type'", th);
        bool on = !strcmp(type, "enabled") || !strcmp(type, "adaptive") || !strcmp(type, "between_tools");
        if (!on && strcmp(type, "disabled"))
            return srv_bad(e, "thinking", "thinking.type: '%.40s' is not one of 'enabled', 'adaptive', 'disabled'.", type);
        const json_t *bt = opt(th, "budget_tokens");
        if (bt && !json_is_integer(bt)) return want(e, "thinking.budget_tokens", "an integer", bt);
        const json_t *disp = opt(th, "display");
        if (disp && !json_is_string(disp)) return want(e, "thinking.display", "a string", disp);
        r->omit_thinking = disp && !strcmp(json_string_value(disp), "omitted");
        json_t *kw = json_object();
        json_object_set_new(kw, "enable_thinking", json_boolean(on));
        json_object_set_new(out, "chat_template_kwargs", kw);
        r->template_kwargs = kw;
    }
    return 0;
}

/* ---- entry ---------------------------------------------------------------------------- */

int srv_anth_parse(const srv *s, const char *body, size_t len, bool counting, srv_req *r, srv_err *e) {
    memset(r, 0, sizeof *r);
    r->kind = SRV_CHAT;
    json_error_t je;
    /* \u0000 is valid JSON (clients send back what a model wrote); strings
     * keep their length through the translation (json_string_length) */
    json_t *in = json_loadb(body, len, JSON_ALLOW_NUL, &je);
    if (!in) return srv_bad(e, NULL, "The request body is not valid JSON: %s (line %d, column %d).", je.text, je.line, je.column);
    r->body = json_object();
    json_t *msgs = json_array();
    json_object_set_new(r->body, "messages", msgs);
    int rc = -1;
    if (!json_is_object(in)) {
        srv_bad(e, NULL, "The request body must be a JSON object.");
        goto done;
    }
    if (parse_sampling(s, in, counting, r, e) || parse_messages(in, msgs, e) || parse_tools(in, r->body, r, e) ||
        parse_stop_and_thinking(in, r->body, r, e))
        goto done;
    r->messages = msgs;
    rc = 0;
done:
    json_decref(in);
    return rc;
}

/* The prompt as generate.c builds it for the same body: rendered through the
 * chat template, tokenized without added specials. */
int srv_anth_count_tokens(const srv *s, const char *body, size_t len, int *n, srv_err *e) {
    srv_req r;
    lm_chat_prompt p = { 0 };
    lm_tok_ids ids = { 0 };
    lm_err le = { { 0 } };
    int rc = srv_anth_parse(s, body, len, true, &r, e);
    if (!rc) rc = srv_chat_render(s, &r, &p, e);
    if (!rc && lm_chat_encode(s->tok, &p, &ids, &le)) rc = srv_bad(e, "messages", "%s", le.msg);
    *n = rc ? 0 : (int)ids.n;
    lm_tok_ids_free(&ids);
    lm_chat_prompt_free(&p);
    srv_req_free(&r);
    return rc;
}
