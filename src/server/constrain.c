/* constrain.c - structured output: a request's response_format and forced
 * tool calls as a grammar for the engine (lm_grammar.h).
 *
 * response_format (chat and completions; the Responses API's text.format
 * arrives here translated):
 *   {"type": "text"}                              no grammar
 *   {"type": "json_object"}                       any JSON object
 *   {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
 *   {"type": "grammar", "grammar": "<GBNF>"}      lumen's (and llama.cpp's) GBNF
 *   {"type": "regex", "regex": "<expression>"}    the whole output matches it
 * A schema or grammar lumen cannot honour is a 400 naming the construct.
 * When the prompt ends inside an open think block, the grammar starts after
 * the model's </think> (when that is one token), so reasoning stays free.
 *
 * Forced tool calls (tool_choice required or a named function) in the
 * Hermes JSON format: after the chat layer's prefill (the call's opening),
 * the rest of the call is a grammar of the tools' parameter schemas, so the
 * call is always complete and its arguments valid; `required` allows
 * several calls in a row.
 *
 * Compiled grammars are cached by the text they came from (schemas dumped
 * with sorted keys), so an agent's repeated schema compiles once. */
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

#define SRV_GRAMMAR_CACHE 64

typedef struct srv_grammar_ent {
    char *key;
    lm_grammar *g;
    uint64_t used;
} srv_grammar_ent;

struct srv_grammars {
    pthread_mutex_t mu;
    srv_grammar_ent ent[SRV_GRAMMAR_CACHE];
    uint64_t clock;
    srv_metrics *m; /* compiles, hits and compile time go there */
};

void srv_constrain_init(srv *s) {
    int n = s->n_vocab;
    const char **bytes = lm_xcalloc((size_t)n, sizeof *bytes);
    size_t *lens = lm_xcalloc((size_t)n, sizeof *lens);
    lm_tok_str t = { 0 };
    for (int id = 0; id < n && id < lm_tokenizer_n_vocab(s->tok); id++) {
        if (s->hidden[id] || !lm_tokenizer_token_bytes(s->tok, id, &t) || !t.len) continue;
        /* special tags only as themselves: "<think>" inside a JSON string
         * must not switch the reasoning parser; the call tags are kept (the
         * call grammars end with </tool_call>) */
        if (lm_tokenizer_is_special(s->tok, id) && strcmp(t.s, "<tool_call>") && strcmp(t.s, "</tool_call>")) continue;
        char *copy = lm_xmalloc(t.len);
        memcpy(copy, t.s, t.len);
        bytes[id] = copy, lens[id] = t.len;
    }
    lm_tok_str_free(&t);
    s->gvocab = lm_grammar_vocab_create(n, bytes, lens, s->stop_ids, s->n_stop_ids);
    for (int id = 0; id < n; id++) free((char *)bytes[id]);
    free(bytes);
    free(lens);
    s->grammars = lm_xcalloc(1, sizeof *s->grammars);
    pthread_mutex_init(&s->grammars->mu, NULL);
    s->grammars->m = &s->metrics;
}

void srv_constrain_free(srv *s) {
    lm_grammar_vocab_free(s->gvocab);
    s->gvocab = NULL;
    if (!s->grammars) return;
    for (int i = 0; i < SRV_GRAMMAR_CACHE; i++) free(s->grammars->ent[i].key), lm_grammar_unref(s->grammars->ent[i].g);
    pthread_mutex_destroy(&s->grammars->mu);
    free(s->grammars);
    s->grammars = NULL;
}

static void count(struct srv_grammars *c, bool hit, double s) {
    pthread_mutex_lock(&c->m->mu);
    if (hit) c->m->grammar_hits++;
    else c->m->grammar_compiles++, c->m->grammar_compile_s += s;
    pthread_mutex_unlock(&c->m->mu);
}

enum { K_GBNF = 'g', K_REGEX = 'r', K_SCHEMA = 's' };

/* The grammar of kind and text (a new reference), from the cache or
 * compiled; NULL with le set. */
static lm_grammar *get_grammar(const srv *s, int kind, const char *text, lm_err *le) {
    struct srv_grammars *c = s->grammars;
    size_t n = strlen(text);
    char *key = lm_xmalloc(n + 2);
    key[0] = (char)kind;
    memcpy(key + 1, text, n + 1);
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < SRV_GRAMMAR_CACHE; i++)
        if (c->ent[i].key && !strcmp(c->ent[i].key, key)) {
            c->ent[i].used = ++c->clock;
            lm_grammar *g = lm_grammar_ref(c->ent[i].g);
            pthread_mutex_unlock(&c->mu);
            free(key);
            count(c, true, 0);
            return g;
        }
    pthread_mutex_unlock(&c->mu);
    const double t0 = lm_now();
    lm_grammar *g = NULL;
    int rc;
    if (kind == K_SCHEMA) {
        json_t *schema = json_loads(text, 0, NULL);
        rc = lm_grammar_from_schema(&g, schema, le);
        json_decref(schema);
    } else if (kind == K_REGEX) {
        rc = lm_grammar_from_regex(&g, text, n, le);
    } else {
        rc = lm_grammar_from_gbnf(&g, text, n, le);
    }
    if (rc) {
        free(key);
        return NULL;
    }
    count(c, false, lm_now() - t0);
    pthread_mutex_lock(&c->mu);
    int victim = 0;
    for (int i = 1; i < SRV_GRAMMAR_CACHE; i++)
        if (c->ent[i].used < c->ent[victim].used) victim = i;
    free(c->ent[victim].key);
    lm_grammar_unref(c->ent[victim].g);
    c->ent[victim] = (srv_grammar_ent){ key, lm_grammar_ref(g), ++c->clock };
    pthread_mutex_unlock(&c->mu);
    return g;
}

/* The key keeps the members' order: properties are written in the order
 * the schema declares them, so two orders are two grammars. */
static lm_grammar *schema_grammar(const srv *s, const json_t *schema, lm_err *le) {
    char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    lm_grammar *g = get_grammar(s, K_SCHEMA, text, le);
    free(text);
    return g;
}

int srv_parse_response_format(const srv *s, const json_t *rf, srv_req *r, srv_err *e) {
    const json_t *t = json_object_get(rf, "type");
    if (!json_is_object(rf) || !json_is_string(t))
        return srv_bad(e, "response_format", "Invalid 'response_format': expected an object with a 'type'.");
    const char *type = json_string_value(t);
    lm_err le = { { 0 } };
    if (!strcmp(type, "text")) return 0;
    if (!strcmp(type, "json_object")) {
        json_t *obj = json_pack("{s:s}", "type", "object");
        r->grammar = schema_grammar(s, obj, &le);
        json_decref(obj);
    } else if (!strcmp(type, "json_schema")) {
        const json_t *js = json_object_get(rf, "json_schema");
        const json_t *schema = json_object_get(js, "schema");
        if (!json_is_object(js) || !(json_is_object(schema) || json_is_boolean(schema)))
            return srv_bad(e, "response_format",
                           "Invalid 'response_format.json_schema': expected {\"name\": ..., \"schema\": {...}}.");
        r->grammar = schema_grammar(s, schema, &le);
    } else if (!strcmp(type, "grammar") || !strcmp(type, "regex")) {
        const json_t *text = json_object_get(rf, type);
        if (!json_is_string(text))
            return srv_bad(e, "response_format", "Invalid 'response_format.%s': expected a string.", type);
        r->grammar = get_grammar(s, type[0] == 'g' ? K_GBNF : K_REGEX, json_string_value(text), &le);
    } else {
        return srv_bad(e, "response_format",
                       "Invalid 'response_format.type': '%.40s' (expected text, json_object, json_schema, grammar or regex).",
                       type);
    }
    if (!r->grammar) return srv_bad(e, "response_format", "Unsupported 'response_format': %s", le.msg);
    return 0;
}

/* ---- tool calls ---- */

/* XML (Qwen3.5) parameter values: a string parameter is raw text up to
 * the closing tag; the grammar keeps "</" out of it (the format cannot
 * carry "</parameter>" inside a value anyway), and with maxLength any '<'
 * (so that characters are counted exactly). A string enum is its values
 * verbatim. Other types are JSON. */
static int xml_value(FILE *f, const json_t *ps, const char *prefix, lm_err *le) {
    const json_t *type = json_object_get(ps, "type"), *en = json_object_get(ps, "enum");
    const json_t *mx = json_object_get(ps, "maxLength");
    bool str_enum = json_is_array(en) && json_array_size(en) > 0;
    for (size_t i = 0; str_enum && i < json_array_size(en); i++) str_enum = json_is_string(json_array_get(en, i));
    if (str_enum) { /* the parser keeps a string enum's value verbatim */
        fprintf(f, "%s ::= ", prefix);
        for (size_t i = 0; i < json_array_size(en); i++) {
            const json_t *x = json_array_get(en, i);
            fputs(i ? " | \"" : "\"", f);
            lm_gbnf_put_literal(f, json_string_value(x), json_string_length(x));
            fputc('"', f);
        }
        fputc('\n', f);
        return 0;
    }
    bool str = json_is_string(type) && !strcmp(json_string_value(type), "string");
    if (str && !json_object_get(ps, "pattern") && !json_object_get(ps, "format") && !json_object_get(ps, "minLength")) {
        if (json_is_integer(mx) && json_integer_value(mx) >= 0 && json_integer_value(mx) <= 1000)
            fprintf(f, "%s ::= [^<]{0,%lld}\n", prefix, (long long)json_integer_value(mx)); /* counted exactly: no '<' */
        else
            fprintf(f, "%s ::= ([^<] | \"<\" [^/])*\n", prefix);
        return 0;
    }
    if (str) return lm_errf(le, "string parameters with pattern, format or minLength are not supported in the XML call format");
    return lm_schema_append_gbnf(f, ps, prefix, le);
}

/* Rule `name`: the <parameter=...> blocks of function schema params, in
 * order, required ones always. */
static int xml_params(FILE *f, const json_t *params, const char *name, lm_err *le) {
    const json_t *props = json_object_get(params, "properties"), *req = json_object_get(params, "required");
    size_t n = json_object_size(props), j = 0;
    const char *k;
    const json_t *ps;
    fprintf(f, "%s ::= %s-f0\n", name, name);
    json_object_foreach((json_t *)props, k, ps) {
        bool required = false;
        for (size_t i = 0; i < json_array_size(req); i++) required |= !strcmp(json_string_value(json_array_get(req, i)), k);
        fprintf(f, "%s-f%zu ::= \"<parameter=", name, j);
        lm_gbnf_put_literal(f, k, strlen(k));
        fprintf(f, ">\\n\" %s-v%zu \"\\n</parameter>\\n\" %s-f%zu", name, j, name, j + 1);
        if (!required) fprintf(f, " | %s-f%zu", name, j + 1);
        fputc('\n', f);
        char vn[64];
        snprintf(vn, sizeof vn, "%s-v%zu", name, j);
        if (xml_value(f, ps, vn, le)) return lm_err_prefix(le, "parameter '%.60s'", k);
        j++;
    }
    fprintf(f, "%s-f%zu ::=\n", name, n);
    return 0;
}

/* The GBNF of a tool call in the template's format, for what follows
 * `from`: the prefill of a forced named call (the arguments on), of a
 * forced call of any tool (after "<tool_call>\n"), or the model's own
 * <tool_call> token (auto: "\n" first). One call, or several when allowed. */
enum { FROM_NAMED, FROM_ANY, FROM_TAG };
static char *tool_gbnf(const srv_req *r, bool xml, int from, lm_err *le) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    const char *more = r->one_tool_call ? "" : " (\"\\n<tool_call>\\n\" call \"\\n</tool_call>\")*";
    if (from == FROM_NAMED) fprintf(f, "root ::= a0 \"%s\\n</tool_call>\"\n", xml ? "</function>" : "}");
    else fprintf(f, "root ::= %scall \"\\n</tool_call>\"%s\n", from == FROM_TAG ? "\"\\n\" " : "", more);
    if (from != FROM_NAMED) fputs("call ::= ", f);
    int rc = 0, n = 0;
    for (size_t i = 0; i < json_array_size(r->tools); i++) {
        const char *name = json_string_value(json_object_get(json_object_get(json_array_get(r->tools, i), "function"), "name"));
        if (from == FROM_NAMED && strcmp(name, r->tool_name)) continue;
        if (from != FROM_NAMED) {
            fputs(n ? " | \"" : "\"", f);
            if (xml) {
                fputs("<function=", f);
                lm_gbnf_put_literal(f, name, strlen(name));
                fprintf(f, ">\\n\" a%d \"</function>\"", n);
            } else {
                json_t *jn = json_string(name);
                char *q = json_dumps(jn, JSON_ENCODE_ANY);
                json_decref(jn);
                fputs("{\\\"name\\\": ", f);
                lm_gbnf_put_literal(f, q, strlen(q));
                fprintf(f, ", \\\"arguments\\\": \" a%d \"}\"", n);
                free(q);
            }
        }
        n++;
    }
    if (from != FROM_NAMED) fputc('\n', f);
    n = 0;
    for (size_t i = 0; i < json_array_size(r->tools) && !rc; i++) {
        const json_t *fn = json_object_get(json_array_get(r->tools, i), "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (from == FROM_NAMED && strcmp(name, r->tool_name)) continue;
        const json_t *params = json_object_get(fn, "parameters");
        json_t *any = NULL;
        if (!json_is_object(params)) params = any = json_pack("{s:s}", "type", "object");
        char prefix[32];
        snprintf(prefix, sizeof prefix, "a%d", n++);
        if (xml ? xml_params(f, params, prefix, le) : lm_schema_append_gbnf(f, params, prefix, le)) {
            lm_err_prefix(le, "the parameters of '%.60s'", name);
            rc = -1;
        }
        json_decref(any);
    }
    fclose(f);
    if (rc) free(buf), buf = NULL;
    return buf;
}

int srv_constrain(const srv *s, srv_req *r, const lm_chat_prompt *p, srv_err *e) {
    lm_err le = { { 0 } };
    bool forced = p && p->prefill && !p->call_complete && r->tools &&
                  (r->tool_choice == SRV_TOOLS_REQUIRED || r->tool_choice == SRV_TOOLS_NAMED);
    int32_t tag = s->chat ? lm_tokenizer_token_to_id(s->tok, "<tool_call>", 11) : -1;
    /* auto: free text, or calls once the model opens one (<tool_call> as one token) */
    bool auto_calls = p && r->tools && !forced && !r->grammar && r->tool_choice == SRV_TOOLS_AUTO && tag > 0 &&
                      !(p->prefill && p->call_complete);
    if (forced || auto_calls) {
        int from = auto_calls ? FROM_TAG : r->tool_name ? FROM_NAMED : FROM_ANY;
        char *text = tool_gbnf(r, s->chat->xml_tools, from, &le);
        lm_grammar *g = text ? get_grammar(s, K_GBNF, text, &le) : NULL;
        free(text);
        if (!g) return srv_bad(e, "tools", "Unsupported tool parameters: %s", le.msg);
        lm_grammar_unref(r->grammar); /* a forced call wins over a response_format */
        r->grammar = g;
    }
    if (!r->grammar) return 0;
    r->gp.grammar = r->grammar;
    r->gp.grammar_vocab = s->gvocab;
    r->gp.grammar_trigger = 0;
    if (auto_calls) {
        r->gp.grammar_trigger = tag;
    } else if (p && p->start_in_reasoning && !forced) {
        int32_t id = lm_tokenizer_token_to_id(s->tok, "</think>", 8);
        if (id > 0) r->gp.grammar_trigger = id;
    }
    return 0;
}
