/* responses_request.c - a Responses API body -> a chat completions body ->
 * srv_req (see responses.h for why the translation).
 *
 * What becomes what:
 *   instructions, and the system/developer messages before the first other
 *     item                       one system message, joined by blank lines
 *                                (templates read only messages[0] as system)
 *   input "text"                 a user message
 *   message items                messages; input_text / output_text / refusal
 *                                parts become text parts; developer -> system
 *   function_call items          tool_calls of one assistant message (the
 *                                message just before, when it is an assistant
 *                                message of the same turn)
 *   function_call_output items   tool messages (tool_call_id = call_id)
 *   reasoning items              reasoning_content of the next assistant
 *                                message (their text; encrypted-only: dropped)
 *   tools [{type: function, name, description, parameters, strict}]
 *                                chat tools; tools of other types (web_search,
 *                                namespace, custom ...) are left out: lumen's
 *                                models call functions only
 *   tool_choice                  auto / none / required / {type: function,
 *                                name}; one naming another tool type is a 400
 *   reasoning.effort             the template's thinking switch
 *                                (enable_thinking): "none" and "minimal" turn
 *                                it off, others leave it on
 *   reasoning.summary            the reasoning item also carries its text as
 *                                its summary (responses_stream.c)
 *   max_output_tokens, temperature, top_p, stream
 *                                the chat fields of the same meaning
 * Refused with a 400 that says so: non-text input parts (images, files,
 * audio), item types other than those above, text.format other than text,
 * json_object and json_schema (those become the chat body's response_format),
 * background, conversation, prompt templates. Accepted and echoed or ignored: store, metadata, include,
 * truncation, user, prompt_cache_key, parallel_tool_calls, service_tier,
 * safety_identifier, text.verbosity, stream_options, client_metadata. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "responses.h"

static int bad_type(srv_err *e, const char *key, const char *want, const json_t *v) {
    if (!v) return srv_bad(e, key, "Missing required parameter: '%s' (%s).", key, want);
    return srv_bad(e, key, "Invalid type for '%s': expected %s, but got %s instead.", key, want, srv_json_type_name(v));
}

/* body[key], or NULL when absent or null. */
static const json_t *field(const json_t *body, const char *key) {
    const json_t *v = json_object_get(body, key);
    return v && !json_is_null(v) ? v : NULL;
}

static bool str_is(const json_t *v, const char *s) { return json_is_string(v) && !strcmp(json_string_value(v), s); }

/* ---- input items -> messages ------------------------------------------------------- */

/* The translation's state: the messages so far and what is pending. */
typedef struct conv {
    json_t *messages;        /* chat messages */
    json_t *system;          /* text parts of the leading system message, or NULL */
    bool leading;            /* no item other than system/developer seen yet */
    json_t *reasoning;       /* text for the next assistant message, or NULL */
    json_t *last_asst;       /* the last message when it is an assistant message
                                that function calls may join, else NULL */
} conv;

/* Text of a content part list as chat text parts; 400 for other part types. */
static json_t *text_parts(const json_t *content, const char *param, srv_err *e) {
    json_t *parts = json_array();
    char p[128]; /* param (< 96) + "[index]" */
    for (size_t i = 0; i < json_array_size(content); i++) {
        const json_t *part = json_array_get(content, i);
        snprintf(p, sizeof p, "%s[%zu]", param, i);
        const json_t *type = json_object_get(part, "type");
        if (!json_is_object(part) || !json_is_string(type)) {
            srv_bad(e, p, "Invalid '%s': a content part is an object with a 'type'.", p);
            goto fail;
        }
        const char *t = json_string_value(type);
        const char *key = !strcmp(t, "refusal") ? "refusal" : "text";
        if (strcmp(t, "input_text") && strcmp(t, "output_text") && strcmp(t, "text") && strcmp(t, "refusal")) {
            srv_bad(e, p, "Content parts of type '%.40s' are not supported (only input_text and output_text).", t);
            goto fail;
        }
        const json_t *text = json_object_get(part, key);
        if (!json_is_string(text)) {
            srv_bad(e, p, "Invalid '%s.%s': expected a string.", p, key);
            goto fail;
        }
        json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text", text));
    }
    return parts;
fail:
    json_decref(parts);
    return NULL;
}

/* A message's content (a string or parts) as chat content (new reference). */
static json_t *message_content(const json_t *content, const char *param, srv_err *e) {
    if (json_is_string(content)) return json_incref((json_t *)content);
    if (!json_is_array(content)) {
        bad_type(e, param, "a string or an array of content parts", content);
        return NULL;
    }
    return text_parts(content, param, e);
}

static void push(conv *c, json_t *m) {
    json_array_append_new(c->messages, m);
    c->last_asst = NULL;
}

static json_t *assistant_message(conv *c) {
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string("assistant"));
    if (c->reasoning) {
        json_object_set_new(m, "reasoning_content", c->reasoning);
        c->reasoning = NULL;
    }
    return m;
}

static int add_message(conv *c, const json_t *item, const char *param, srv_err *e) {
    char p[96];
    snprintf(p, sizeof p, "%s.role", param);
    const json_t *role = json_object_get(item, "role");
    if (!json_is_string(role)) return srv_bad(e, p, "Missing or invalid '%s': expected a string.", p);
    const char *r = json_string_value(role);
    bool sys = !strcmp(r, "system") || !strcmp(r, "developer");
    if (!sys && strcmp(r, "user") && strcmp(r, "assistant"))
        return srv_bad(e, p, "Invalid '%s': '%.40s' is not one of 'user', 'assistant', 'system', 'developer'.", p, r);
    snprintf(p, sizeof p, "%s.content", param);
    json_t *content = message_content(json_object_get(item, "content"), p, e);
    if (!content) return -1;
    if (sys && c->leading) { /* joins the one system message */
        if (json_is_string(content)) {
            json_t *one = json_pack("[{s:s,s:O}]", "type", "text", "text", content);
            json_decref(content);
            content = one;
        }
        json_array_extend(c->system, content);
        json_decref(content);
        return 0;
    }
    c->leading = false;
    if (!strcmp(r, "assistant")) {
        json_t *m = assistant_message(c);
        json_object_set_new(m, "content", content);
        push(c, m);
        c->last_asst = m;
        return 0;
    }
    push(c, json_pack("{s:s,s:o}", "role", sys ? "system" : "user", "content", content));
    return 0;
}

static int add_function_call(conv *c, const json_t *item, const char *param, srv_err *e) {
    const char *keys[] = { "call_id", "name", "arguments" };
    char p[96];
    for (int k = 0; k < 3; k++) {
        snprintf(p, sizeof p, "%s.%s", param, keys[k]);
        if (!json_is_string(json_object_get(item, keys[k])))
            return srv_bad(e, p, "Missing or invalid '%s': expected a string.", p);
    }
    c->leading = false;
    json_t *m = c->last_asst;
    if (!m) {
        m = assistant_message(c);
        json_object_set_new(m, "content", json_null());
        push(c, m);
        c->last_asst = m;
    }
    json_t *calls = json_object_get(m, "tool_calls");
    if (!calls) {
        calls = json_array();
        json_object_set_new(m, "tool_calls", calls);
    }
    json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", json_object_get(item, "call_id"), "type",
                                           "function", "function", "name", json_object_get(item, "name"),
                                           "arguments", json_object_get(item, "arguments")));
    return 0;
}

/* A function_call_output's output: a string, or text parts joined. */
static int add_function_output(conv *c, const json_t *item, const char *param, srv_err *e) {
    char p[96];
    snprintf(p, sizeof p, "%s.call_id", param);
    const json_t *id = json_object_get(item, "call_id");
    if (!json_is_string(id)) return srv_bad(e, p, "Missing or invalid '%s': expected a string.", p);
    snprintf(p, sizeof p, "%s.output", param);
    const json_t *out = json_object_get(item, "output");
    json_t *text;
    if (json_is_string(out)) {
        text = json_incref((json_t *)out);
    } else if (json_is_array(out)) {
        json_t *parts = text_parts(out, p, e);
        if (!parts) return -1;
        lm_tok_str joined = { 0 };
        for (size_t i = 0; i < json_array_size(parts); i++) {
            const json_t *t = json_object_get(json_array_get(parts, i), "text");
            size_t n = json_string_length(t), need = joined.len + n + 2;
            if (need > joined.cap) {
                joined.cap = need * 2;
                joined.s = lm_xrealloc(joined.s, joined.cap);
            }
            if (i) joined.s[joined.len++] = '\n';
            memcpy(joined.s + joined.len, json_string_value(t), n);
            joined.len += n;
        }
        text = json_stringn_nocheck(joined.s ? joined.s : "", joined.len);
        lm_tok_str_free(&joined);
        json_decref(parts);
    } else {
        return bad_type(e, p, "a string or an array of content parts", out);
    }
    c->leading = false;
    push(c, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id", id, "content", text));
    return 0;
}

/* A reasoning item's text (content, else summary) waits for the assistant
 * message that follows it. */
static int add_reasoning(conv *c, const json_t *item, const char *param, srv_err *e) {
    lm_tok_str t = { 0 };
    const char *lists[] = { "content", "summary" };
    for (int l = 0; l < 2 && !t.len; l++) {
        const json_t *list = json_object_get(item, lists[l]);
        if (list && !json_is_null(list) && !json_is_array(list)) {
            char p[96];
            snprintf(p, sizeof p, "%s.%s", param, lists[l]);
            return bad_type(e, p, "an array", list);
        }
        for (size_t i = 0; i < json_array_size(list); i++) {
            const json_t *text = json_object_get(json_array_get(list, i), "text");
            if (!json_is_string(text)) continue;
            size_t n = json_string_length(text), need = t.len + n + 3;
            if (need > t.cap) {
                t.cap = need * 2;
                t.s = lm_xrealloc(t.s, t.cap);
            }
            if (t.len) t.s[t.len++] = '\n', t.s[t.len++] = '\n';
            memcpy(t.s + t.len, json_string_value(text), n);
            t.len += n;
        }
    }
    if (t.len) {
        json_decref(c->reasoning);
        c->reasoning = json_stringn_nocheck(t.s, t.len);
    }
    lm_tok_str_free(&t);
    c->leading = false;
    c->last_asst = NULL;
    return 0;
}

static int add_item(conv *c, const json_t *item, size_t i, srv_err *e) {
    char param[64];
    snprintf(param, sizeof param, "input[%zu]", i);
    if (!json_is_object(item)) return bad_type(e, param, "an object", item);
    const json_t *type = json_object_get(item, "type");
    if (!type && json_object_get(item, "role")) return add_message(c, item, param, e); /* EasyInputMessage */
    if (!json_is_string(type)) return srv_bad(e, param, "Invalid '%s': an input item needs a 'type'.", param);
    const char *t = json_string_value(type);
    if (!strcmp(t, "message")) return add_message(c, item, param, e);
    if (!strcmp(t, "function_call")) return add_function_call(c, item, param, e);
    if (!strcmp(t, "function_call_output")) return add_function_output(c, item, param, e);
    if (!strcmp(t, "reasoning")) return add_reasoning(c, item, param, e);
    snprintf(param, sizeof param, "input[%zu].type", i);
    return srv_bad(e, param, "Input items of type '%.60s' are not supported (message, function_call, "
                   "function_call_output and reasoning are).", t);
}

/* The chat messages of instructions + items (new reference), or NULL. */
static json_t *to_messages(const json_t *instructions, const json_t *items, size_t first_new, srv_err *e) {
    conv c = { .messages = json_array(), .system = json_array(), .leading = true };
    if (instructions) json_array_append_new(c.system, json_pack("{s:s,s:O}", "type", "text", "text", instructions));
    for (size_t i = 0; i < json_array_size(items); i++) {
        /* params count from this request's input, whose items follow the stored ones */
        if (add_item(&c, json_array_get(items, i), i >= first_new ? i - first_new : i, e)) goto fail;
    }
    if (json_array_size(c.system))
        json_array_insert_new(c.messages, 0, json_pack("{s:s,s:O}", "role", "system", "content", c.system));
    json_decref(c.system);
    json_decref(c.reasoning);
    return c.messages;
fail:
    json_decref(c.messages);
    json_decref(c.system);
    json_decref(c.reasoning);
    return NULL;
}

/* ---- tools ----------------------------------------------------------------------------- */

/* Function tools as chat tools (new reference; possibly empty). */
static json_t *to_chat_tools(const json_t *tools, srv_err *e) {
    json_t *out = json_array();
    char p[64];
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i);
        snprintf(p, sizeof p, "tools[%zu]", i);
        if (!json_is_object(t) || !json_is_string(json_object_get(t, "type"))) {
            srv_bad(e, p, "Invalid '%s': a tool is an object with a 'type'.", p);
            goto fail;
        }
        if (!str_is(json_object_get(t, "type"), "function")) continue;
        const json_t *fn = json_is_object(json_object_get(t, "function")) ? json_object_get(t, "function") : t;
        const json_t *name = json_object_get(fn, "name"), *params = json_object_get(fn, "parameters");
        const json_t *desc = json_object_get(fn, "description");
        if (!json_is_string(name)) {
            snprintf(p, sizeof p, "tools[%zu].name", i);
            srv_bad(e, p, "Missing or invalid '%s': expected a string.", p);
            goto fail;
        }
        if (params && !json_is_null(params) && !json_is_object(params)) {
            snprintf(p, sizeof p, "tools[%zu].parameters", i);
            bad_type(e, p, "an object", params);
            goto fail;
        }
        json_t *f = json_pack("{s:O}", "name", name);
        if (json_is_string(desc)) json_object_set(f, "description", (json_t *)desc);
        if (json_is_object(params)) json_object_set(f, "parameters", (json_t *)params);
        json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", f));
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

static json_t *to_chat_tool_choice(const json_t *tc, srv_err *e) {
    if (json_is_string(tc)) {
        const char *v = json_string_value(tc);
        if (strcmp(v, "auto") && strcmp(v, "none") && strcmp(v, "required")) {
            srv_bad(e, "tool_choice",
                    "Invalid 'tool_choice': '%.40s' (expected none, auto, required or an object).", v);
            return NULL;
        }
        return json_incref((json_t *)tc);
    }
    if (!json_is_object(tc)) {
        bad_type(e, "tool_choice", "a string or an object", tc);
        return NULL;
    }
    const json_t *type = json_object_get(tc, "type"), *name = json_object_get(tc, "name");
    if (!str_is(type, "function")) {
        srv_bad(e, "tool_choice", "'tool_choice' of type '%.40s' is not supported: lumen's models call function "
                "tools only.", json_is_string(type) ? json_string_value(type) : "?");
        return NULL;
    }
    if (!json_is_string(name)) {
        srv_bad(e, "tool_choice", "Invalid 'tool_choice': expected {\"type\": \"function\", \"name\": ...}.");
        return NULL;
    }
    return json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", name);
}

/* ---- the request ---------------------------------------------------------------------- */

static const char *const k_refused[][2] = {
    { "background", "Background responses are not supported." },
    { "conversation", "Conversations are not supported; use previous_response_id." },
    { "prompt", "Prompt templates are not supported." },
};

static int check_reasoning(const json_t *body, const srv *s, json_t *chat, srv_err *e) {
    const json_t *rs = field(body, "reasoning");
    if (!rs) return 0;
    if (!json_is_object(rs)) return bad_type(e, "reasoning", "an object", rs);
    const json_t *effort = field(rs, "effort"), *summary = field(rs, "summary");
    static const char *const efforts[] = { "none", "minimal", "low", "medium", "high", "xhigh" };
    if (effort) {
        bool ok = false;
        for (size_t i = 0; i < sizeof efforts / sizeof *efforts; i++) ok |= str_is(effort, efforts[i]);
        if (!ok)
            return srv_bad(e, "reasoning.effort", "Invalid 'reasoning.effort': expected one of none, minimal, low, "
                           "medium, high, xhigh.");
        bool off = str_is(effort, "none") || str_is(effort, "minimal");
        if (s->chat && s->chat->think)
            json_object_set_new(chat, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", !off));
    }
    if (summary && !str_is(summary, "auto") && !str_is(summary, "concise") && !str_is(summary, "detailed"))
        return srv_bad(e, "reasoning.summary", "Invalid 'reasoning.summary': expected auto, concise or detailed.");
    return 0;
}

static int check_text(const json_t *body, srv_err *e) {
    const json_t *text = field(body, "text");
    if (!text) return 0;
    if (!json_is_object(text)) return bad_type(e, "text", "an object", text);
    const json_t *fmt = field(text, "format");
    if (!fmt) return 0;
    const json_t *t = json_object_get(fmt, "type");
    if (!json_is_object(fmt) || !json_is_string(t)) return bad_type(e, "text.format", "an object with a 'type'", fmt);
    if (!str_is(t, "text") && !str_is(t, "json_object") && !str_is(t, "json_schema"))
        return srv_bad(e, "text.format", "Invalid 'text.format.type': '%.40s' (expected text, json_object or json_schema).",
                       json_string_value(t));
    return 0;
}

/* text.format as the chat body's response_format (constrain.c compiles it):
 * Responses' json_schema is flat ({type, name, schema, strict}). */
static void text_format(const json_t *body, json_t *chat) {
    const json_t *fmt = field(field(body, "text"), "format");
    if (!fmt || str_is(json_object_get(fmt, "type"), "text")) return;
    json_t *rf = json_pack("{s:O}", "type", json_object_get(fmt, "type"));
    if (str_is(json_object_get(fmt, "type"), "json_schema")) {
        json_t *js = json_deep_copy(fmt);
        json_object_del(js, "type");
        json_object_set_new(rf, "json_schema", js);
    }
    json_object_set_new(chat, "response_format", rf);
}

/* The fields a response object repeats, with OpenAI's defaults. */
static json_t *echo_fields(const json_t *body, bool store) {
    json_t *o = json_object();
    const json_t *v;
#define ECHO(key, dflt) json_object_set_new(o, key, (v = field(body, key)) ? json_deep_copy(v) : (dflt))
    ECHO("instructions", json_null());
    ECHO("max_output_tokens", json_null());
    ECHO("max_tool_calls", json_null());
    ECHO("metadata", json_object());
    ECHO("parallel_tool_calls", json_true());
    ECHO("previous_response_id", json_null());
    ECHO("prompt_cache_key", json_null());
    json_t *rs = json_pack("{s:n,s:n}", "effort", "summary");
    if ((v = field(body, "reasoning")))
        json_object_update_existing(rs, (json_t *)v);
    json_object_set_new(o, "reasoning", rs);
    ECHO("safety_identifier", json_null());
    json_object_set_new(o, "service_tier", json_string("default"));
    json_object_set_new(o, "store", json_boolean(store));
    ECHO("temperature", json_real(1.0));
    json_t *text = json_pack("{s:{s:s},s:s}", "format", "type", "text", "verbosity", "medium");
    if ((v = field(body, "text"))) json_object_update_existing(text, (json_t *)v);
    json_object_set_new(o, "text", text);
    ECHO("tool_choice", json_string("auto"));
    ECHO("tools", json_array());
    json_object_set_new(o, "top_logprobs", json_integer(0));
    ECHO("top_p", json_real(1.0));
    ECHO("truncation", json_string("disabled"));
    ECHO("user", json_null());
#undef ECHO
    return o;
}

/* Validates the Responses-only fields and builds the chat body. */
static json_t *to_chat(const srv *s, const json_t *body, const json_t *items, size_t first_new, srv_err *e) {
    for (size_t i = 0; i < sizeof k_refused / sizeof *k_refused; i++) {
        const json_t *v = field(body, k_refused[i][0]);
        if (v && !(json_is_boolean(v) && !json_is_true(v))) {
            srv_bad(e, k_refused[i][0], "%s", k_refused[i][1]);
            return NULL;
        }
    }
    const json_t *instr = field(body, "instructions");
    if (instr && !json_is_string(instr)) {
        bad_type(e, "instructions", "a string", instr);
        return NULL;
    }
    const json_t *v;
    if ((v = field(body, "metadata")) && !json_is_object(v)) return bad_type(e, "metadata", "an object", v), NULL;
    if ((v = field(body, "include")) && !json_is_array(v)) return bad_type(e, "include", "an array", v), NULL;
    if ((v = field(body, "parallel_tool_calls")) && !json_is_boolean(v))
        return bad_type(e, "parallel_tool_calls", "a boolean", v), NULL;
    if ((v = field(body, "truncation")) && !str_is(v, "auto") && !str_is(v, "disabled"))
        return srv_bad(e, "truncation", "Invalid 'truncation': expected 'auto' or 'disabled'."), NULL;
    if ((v = field(body, "top_logprobs")) && !(json_is_integer(v) && json_integer_value(v) == 0))
        return srv_bad(e, "top_logprobs", "'top_logprobs' is not supported on /v1/responses yet."), NULL;
    if (check_text(body, e)) return NULL;

    json_t *chat = json_object();
    text_format(body, chat);
    if (check_reasoning(body, s, chat, e)) goto fail;
    static const char *const same[] = { "model", "temperature", "top_p", "stream", "speculative" };
    for (size_t i = 0; i < sizeof same / sizeof *same; i++)
        if ((v = field(body, same[i]))) json_object_set(chat, same[i], (json_t *)v);
    if ((v = field(body, "max_output_tokens"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 1) {
            srv_bad(e, "max_output_tokens", "Invalid 'max_output_tokens': expected an integer of at least 1.");
            goto fail;
        }
        json_object_set(chat, "max_completion_tokens", (json_t *)v);
    }
    json_t *msgs = to_messages(instr, items, first_new, e);
    if (!msgs) goto fail;
    if (!json_array_size(msgs)) {
        json_decref(msgs);
        srv_bad(e, "input", "Invalid 'input': there is nothing to answer (no input and no instructions).");
        goto fail;
    }
    json_object_set_new(chat, "messages", msgs);

    const json_t *tools = field(body, "tools");
    json_t *ctools = NULL;
    if (tools) {
        if (!json_is_array(tools)) {
            bad_type(e, "tools", "an array", tools);
            goto fail;
        }
        if (!(ctools = to_chat_tools(tools, e))) goto fail;
        if (json_array_size(ctools)) json_object_set(chat, "tools", ctools);
    }
    const json_t *tc = field(body, "tool_choice");
    if (tc) {
        json_t *ctc = to_chat_tool_choice(tc, e);
        if (!ctc) {
            json_decref(ctools);
            goto fail;
        }
        bool needs = !json_is_string(ctc) || str_is(ctc, "required");
        if (needs && !json_array_size(ctools)) {
            json_decref(ctc);
            json_decref(ctools);
            srv_bad(e, "tool_choice", "'tool_choice' asks for a function call, but 'tools' holds no function tool "
                    "(lumen's models call function tools only).");
            goto fail;
        }
        json_object_set_new(chat, "tool_choice", ctc);
    }
    json_decref(ctools);
    return chat;
fail:
    json_decref(chat);
    return NULL;
}

/* This request's input as items: a string is one user message. */
static int input_items(const json_t *body, json_t *items, srv_err *e) {
    const json_t *in = field(body, "input");
    if (!in) return 0;
    if (json_is_string(in)) {
        json_array_append_new(items, json_pack("{s:s,s:s,s:O}", "type", "message", "role", "user", "content", in));
        return 0;
    }
    if (!json_is_array(in)) return bad_type(e, "input", "a string or an array of input items", in);
    for (size_t i = 0; i < json_array_size(in); i++) json_array_append(items, json_array_get(in, i));
    return 0;
}

int srv_resp_parse(const srv *s, const char *body, size_t len, srv_resp_req *q, srv_req *r, srv_err *e) {
    memset(q, 0, sizeof *q);
    memset(r, 0, sizeof *r);
    r->kind = SRV_CHAT;
    /* U+0000 included: strings keep their length (json_string_length) */
    if (!(q->body = srv_json_body(body, len, e))) return -1;
    const json_t *b = q->body, *v;
    q->store = true;
    if ((v = field(b, "store"))) {
        if (!json_is_boolean(v)) return bad_type(e, "store", "a boolean", v);
        q->store = json_is_true(v);
    }
    if ((v = field(b, "stream"))) {
        if (!json_is_boolean(v)) return bad_type(e, "stream", "a boolean", v);
        q->stream = json_is_true(v);
    }
    q->items = json_array();
    const json_t *prev = field(b, "previous_response_id");
    if (prev) {
        if (!json_is_string(prev)) return bad_type(e, "previous_response_id", "a string", prev);
        json_t *old = s->resp_store ? srv_resp_store_get(s->resp_store, json_string_value(prev)) : NULL;
        if (!old)
            return srv_fail(e, 404, "invalid_request_error", "previous_response_not_found", "previous_response_id",
                            "Previous response with id '%.100s' not found.", json_string_value(prev));
        json_array_extend(q->items, old);
        json_decref(old);
    }
    size_t first_new = json_array_size(q->items);
    if (input_items(b, q->items, e)) return -1;
    if (json_array_size(q->items) == first_new && !field(b, "instructions"))
        return srv_bad(e, "input", "Missing required parameter: 'input'.");
    json_t *chat = to_chat(s, b, q->items, first_new, e);
    if (!chat) return -1;
    q->summary = field(field(b, "reasoning"), "summary") != NULL; /* valid: to_chat checked it */
    q->echo = echo_fields(b, q->store);
    if (srv_req_parse_json(s, SRV_CHAT, chat, r, e)) {
        /* a chat field refused by the chat parser: name it as this API does */
        if (!strcmp(e->param, "max_completion_tokens")) snprintf(e->param, sizeof e->param, "max_output_tokens");
        return -1;
    }
    return 0;
}

void srv_resp_req_free(srv_resp_req *q) {
    json_decref(q->body);
    json_decref(q->items);
    json_decref(q->echo);
    memset(q, 0, sizeof *q);
}
