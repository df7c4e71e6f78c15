/* chat_render.c - OpenAI messages -> the model's chat template -> prompt text.
 *
 * The template context is built the way transformers' apply_chat_template
 * builds it, because that is what chat templates are written against:
 *   messages               the request's messages, normalised:
 *                            - content given as text parts is joined into one
 *                              string ("\n" between parts), as vLLM and
 *                              llama.cpp do for templates that expect strings;
 *                            - "developer" becomes "system";
 *                            - tool_calls[].function.arguments given as a JSON
 *                              string is parsed into an object (templates
 *                              apply `tojson` to it, or iterate its items);
 *                            - everything else (reasoning_content, name,
 *                              tool_call_id) passes through unchanged;
 *   tools                  the request's tools (absent with tool_choice none);
 *   add_generation_prompt  true;
 *   bos_token, eos_token   the tokenizer's special-token strings, when defined;
 *   chat_template_kwargs   merged at top level (e.g. enable_thinking).
 *
 * Forced tool calls (tool_choice required / a named function): lumen has no
 * constrained decoding yet, so it steers instead: the assistant turn is
 * prefilled with the opening of a call in the template's own format (Hermes
 * JSON or Qwen3.5 XML), closing an open think block first. The model usually
 * continues the call; nothing guarantees it. */
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

static json_t *join_text_parts(const json_t *content) {
    size_t total = 0, n = json_array_size(content);
    for (size_t i = 0; i < n; i++) total += json_string_length(json_object_get(json_array_get(content, i), "text")) + 1;
    char *buf = lm_xmalloc(total + 1);
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_object_get(json_array_get(content, i), "text");
        if (i) buf[len++] = '\n';
        memcpy(buf + len, json_string_value(t), json_string_length(t));
        len += json_string_length(t);
    }
    json_t *s = json_stringn(buf, len);
    free(buf);
    return s;
}

static json_t *normalise_message(const json_t *m) {
    json_t *out = json_deep_copy(m);
    const char *role = json_string_value(json_object_get(out, "role"));
    if (role && !strcmp(role, "developer")) json_object_set_new(out, "role", json_string("system"));
    json_t *content = json_object_get(out, "content");
    if (json_is_array(content)) json_object_set_new(out, "content", join_text_parts(content));
    json_t *calls = json_object_get(out, "tool_calls");
    for (size_t i = 0; json_is_array(calls) && i < json_array_size(calls); i++) {
        json_t *fn = json_object_get(json_array_get(calls, i), "function");
        json_t *args = json_object_get(fn, "arguments");
        if (!json_is_string(args)) continue;
        json_t *parsed = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
        if (json_is_object(parsed)) json_object_set_new(fn, "arguments", parsed);
        else json_decref(parsed);
    }
    return out;
}

json_t *srv_chat_context(const srv *s, const srv_req *r, srv_err *e) {
    (void)e;
    json_t *ctx = json_object();
    json_t *msgs = json_array();
    for (size_t i = 0; i < json_array_size(r->messages); i++)
        json_array_append_new(msgs, normalise_message(json_array_get(r->messages, i)));
    json_object_set_new(ctx, "messages", msgs);
    if (r->tools) json_object_set_new(ctx, "tools", json_deep_copy(r->tools));
    json_object_set_new(ctx, "add_generation_prompt", json_true());
    const char *bos = lm_tokenizer_bos_token(s->tok), *eos = lm_tokenizer_eos_token(s->tok);
    if (bos) json_object_set_new(ctx, "bos_token", json_string(bos));
    if (eos) json_object_set_new(ctx, "eos_token", json_string(eos));
    if (r->template_kwargs) json_object_update(ctx, (json_t *)r->template_kwargs);
    return ctx;
}

/* The opening of a forced call, in the template's format. */
static char *forced_call_prefill(const srv *s, const srv_req *r, bool in_think) {
    const char *close = in_think ? "\n</think>\n\n" : "";
    json_t *jname = json_string(r->tool_name ? r->tool_name : "");
    char *quoted = json_dumps(jname, JSON_ENCODE_ANY); /* the name as a JSON string */
    json_decref(jname);
    size_t cap = strlen(close) + 2 * strlen(quoted) + 128;
    char *p = lm_xmalloc(cap);
    if (r->tool_choice == SRV_TOOLS_NAMED && s->xml_tools)
        snprintf(p, cap, "%s<tool_call>\n<function=%s>\n", close, r->tool_name);
    else if (r->tool_choice == SRV_TOOLS_NAMED)
        snprintf(p, cap, "%s<tool_call>\n{\"name\": %s, \"arguments\": ", close, quoted);
    else
        snprintf(p, cap, "%s<tool_call>\n", close);
    free(quoted);
    return p;
}

int srv_chat_render(const srv *s, const srv_req *r, srv_prompt *p, srv_err *e) {
    memset(p, 0, sizeof *p);
    if (!s->tpl)
        return srv_bad(e, NULL, "The model '%s' has no chat template; use /v1/completions with a raw prompt.",
                       s->model_name);
    json_t *ctx = srv_chat_context(s, r, e);
    if (!ctx) return -1;
    lm_err le = { { 0 } };
    char *text = NULL;
    size_t len = 0;
    int rc = lm_template_render(s->tpl, ctx, NULL, &text, &len, &le);
    json_decref(ctx);
    if (rc) return srv_bad(e, "messages", "The chat template could not render these messages: %s", le.msg);
    p->start_in_reasoning = s->think && lm_reasoning_prompt_open(text, len, "<think>", "</think>");
    if (r->tools && (r->tool_choice == SRV_TOOLS_REQUIRED || r->tool_choice == SRV_TOOLS_NAMED)) {
        p->prefill = forced_call_prefill(s, r, p->start_in_reasoning);
        size_t pl = strlen(p->prefill);
        text = lm_xrealloc(text, len + pl + 1);
        memcpy(text + len, p->prefill, pl + 1);
        len += pl;
    }
    p->text = text;
    p->len = len;
    return 0;
}

void srv_prompt_free(srv_prompt *p) {
    free(p->text);
    free(p->prefill);
    memset(p, 0, sizeof *p);
}
