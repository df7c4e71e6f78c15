/* chat_render.c - the chat template of a model, and messages rendered with
 * it (see lm_chat.h for the context a template gets, and forced calls). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm_chat.h"

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
        json_t *parsed = json_loadb(json_string_value(args), json_string_length(args), JSON_ALLOW_NUL, NULL);
        if (json_is_object(parsed)) json_object_set_new(fn, "arguments", parsed);
        else json_decref(parsed);
    }
    return out;
}

int lm_chat_create(lm_chat **out, const lm_tokenizer *tok, const char *src, lm_err *e) {
    *out = NULL;
    if (!src && !(src = lm_tokenizer_chat_template(tok))) return lm_errf(e, "the model has no chat template");
    lm_template *tpl = NULL;
    lm_err te = { { 0 } };
    if (lm_template_parse(src, strlen(src), "chat_template", &tpl, &te))
        return lm_errf(e, "the chat template does not parse (%s)", te.msg);
    lm_chat *c = lm_xcalloc(1, sizeof *c);
    c->tpl = tpl;
    c->tok = tok;
    c->think = strstr(src, "</think>") ||
               (lm_tokenizer_token_to_id(tok, "<think>", 7) >= 0 && lm_tokenizer_token_to_id(tok, "</think>", 8) >= 0);
    c->xml_tools = strstr(src, "<function=") != NULL;
    *out = c;
    return 0;
}

void lm_chat_free(lm_chat *c) {
    if (!c) return;
    lm_template_free(c->tpl);
    free(c);
}

json_t *lm_chat_context(const lm_chat *c, const lm_chat_req *r) {
    json_t *ctx = json_object();
    json_t *msgs = json_array();
    for (size_t i = 0; i < json_array_size(r->messages); i++)
        json_array_append_new(msgs, normalise_message(json_array_get(r->messages, i)));
    json_object_set_new(ctx, "messages", msgs);
    if (r->tools) json_object_set_new(ctx, "tools", json_deep_copy(r->tools));
    json_object_set_new(ctx, "add_generation_prompt", json_true());
    const char *bos = lm_tokenizer_bos_token(c->tok), *eos = lm_tokenizer_eos_token(c->tok);
    if (bos) json_object_set_new(ctx, "bos_token", json_string(bos));
    if (eos) json_object_set_new(ctx, "eos_token", json_string(eos));
    if (r->kwargs) json_object_update(ctx, (json_t *)r->kwargs);
    return ctx;
}

/* A tool name inside <function=NAME>: the characters that would end the tag
 * or the line (< > = and controls) as their JSON-style \uXXXX escape, so a
 * name can never close the call markup; OpenAI's names never hold them. */
static void write_xml_name(FILE *f, const char *name) {
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        if (*p < 0x20 || *p == '<' || *p == '>' || *p == '=' || *p == 0x7f) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
}

/* The opening of a forced call, in the template's format; with r->tool_args
 * the whole call (string parameters of an XML call written raw, others as
 * JSON, as the templates write them). */
static char *forced_call_prefill(const lm_chat *c, const lm_chat_req *r, bool in_think, size_t *name_at,
                                 size_t *name_end) {
    char *p = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&p, &n);
    LM_ASSERT(f);
    fputs(in_think ? "\n</think>\n\n<tool_call>\n" : "<tool_call>\n", f);
    if (r->tool_name && c->xml_tools) {
        fputs("<function=", f);
        fflush(f);
        *name_at = n;
        write_xml_name(f, r->tool_name);
        fflush(f);
        *name_end = n;
        fputs(">\n", f);
        if (r->tool_args) {
            const char *k;
            const json_t *v;
            json_object_foreach((json_t *)r->tool_args, k, v) {
                char *dump = json_is_string(v) ? NULL : json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
                fprintf(f, "<parameter=%s>\n%s\n</parameter>\n", k, dump ? dump : json_string_value(v));
                free(dump);
            }
            fputs("</function>\n</tool_call>", f);
        }
    } else if (r->tool_name) {
        json_t *jname = json_string(r->tool_name);
        char *quoted = json_dumps(jname, JSON_ENCODE_ANY); /* the name as a JSON string */
        json_decref(jname);
        fputs("{\"name\": ", f);
        fflush(f);
        *name_at = n;
        fputs(quoted, f);
        fflush(f);
        *name_end = n;
        fputs(", \"arguments\": ", f);
        free(quoted);
        if (r->tool_args) {
            char *args = json_dumps(r->tool_args, JSON_COMPACT);
            fprintf(f, "%s}\n</tool_call>", args);
            free(args);
        }
    }
    fclose(f);
    return p;
}

int lm_chat_render(const lm_chat *c, const lm_chat_req *r, lm_chat_prompt *p, lm_err *e) {
    memset(p, 0, sizeof *p);
    json_t *ctx = lm_chat_context(c, r);
    lm_chat_lits lits = { 0 };
    if (!r->special_in_content) lm_chat_defuse(c->tok, ctx, &lits);
    char *text = NULL;
    size_t len = 0;
    int rc = lm_template_render(c->tpl, ctx, NULL, &text, &len, e);
    json_decref(ctx);
    if (!rc && lits.tab) rc = lm_chat_restore(&lits, &text, &len, p, e);
    lm_chat_lits_free(&lits);
    if (rc) {
        free(text);
        return -1;
    }
    p->start_in_reasoning = c->think && lm_reasoning_prompt_open(text, len, "<think>", "</think>");
    if (r->force_call) {
        size_t name_at = 0, name_end = 0;
        p->prefill = forced_call_prefill(c, r, p->start_in_reasoning, &name_at, &name_end);
        if (!r->special_in_content) lm_chat_prompt_add_literal(p, len + name_at, len + name_end);
        p->call_complete = r->tool_name && r->tool_args;
        size_t pl = strlen(p->prefill);
        text = lm_xrealloc(text, len + pl + 1);
        memcpy(text + len, p->prefill, pl + 1);
        len += pl;
    }
    p->text = text;
    p->len = len;
    return 0;
}

void lm_chat_prompt_free(lm_chat_prompt *p) {
    free(p->text);
    free(p->prefill);
    free(p->lit);
    free(p->marks);
    memset(p, 0, sizeof *p);
}
