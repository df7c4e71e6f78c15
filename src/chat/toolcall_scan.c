/* toolcall_scan.c - the state machine that finds tool calls in generated
 * text, for the parser object of toolcall.c (struct lm_toolcall_parser in
 * parse_internal.h). Formats, content framing and failure rules are in
 * lm_parse.h. States:
 *
 *   CONTENT    --"<tool_call>"-->  BEGIN
 *   BEGIN      --'{'-->  JSON  --object closed-->  CLOSE
 *   BEGIN      --"<function="-->  XML_NAME  --'>'-->  XML_BODY
 *   XML_BODY   --"<parameter="-->  XML_PNAME --'>'--> XML_PVALUE --"</parameter>"--> XML_BODY
 *   XML_BODY   --"</function>"-->  CLOSE
 *   CLOSE      --"</tool_call>"-->  CONTENT   ('{' or "<function=": one more call in the block)
 *   any call state --unexpected byte, or end of input-->  CONTENT (the attempt is content)
 *
 * `pend` holds input not consumed yet; each state consumes what it can decide
 * and waits for more input otherwise, so decisions depend only on the bytes,
 * never on the chunking. `raw` collects the text of the current call attempt
 * (from the framing whitespace before the open tag): if the attempt fails it
 * becomes content and scanning resumes in CONTENT at the byte that failed. */
#include "chat/lm_parse.h"
#include "chat/parse_internal.h"

#include <stdlib.h>
#include <string.h>

enum { KEY_OTHER, KEY_NAME, KEY_ARGS };
enum { T_STRING = 1, T_INTEGER = 2, T_NUMBER = 4, T_BOOLEAN = 8, T_NULL = 16, T_OBJECT = 32, T_ARRAY = 64 };

#define NAME_MAX_LEN 256 /* a function or parameter name longer than this is not a tag */

static const char FUNC_OPEN[] = "<function=";
static const char FUNC_CLOSE[] = "</function>";
static const char PARAM_OPEN[] = "<parameter=";
static const char PARAM_CLOSE[] = "</parameter>";
static const char PARAM_CLOSE_NL[] = "\n</parameter>";
#define SLEN(s) (sizeof(s) - 1)

/* ---- tool schemas -------------------------------------------------------------- */

static unsigned type_bit(const char *t) {
    static const struct { const char *name; unsigned bit; } map[] = {
        { "string", T_STRING }, { "integer", T_INTEGER }, { "number", T_NUMBER },
        { "boolean", T_BOOLEAN }, { "null", T_NULL }, { "object", T_OBJECT }, { "array", T_ARRAY },
    };
    for (size_t i = 0; i < LM_COUNT(map); i++)
        if (strcmp(t, map[i].name) == 0) return map[i].bit;
    return 0;
}

static unsigned value_type_bit(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_STRING: return T_STRING;
    case JSON_INTEGER: return T_INTEGER;
    case JSON_REAL: return T_NUMBER;
    case JSON_TRUE:
    case JSON_FALSE: return T_BOOLEAN;
    case JSON_NULL: return T_NULL;
    case JSON_OBJECT: return T_OBJECT;
    default: return T_ARRAY;
    }
}

/* The JSON types a schema allows (T_* bits), 0 when it does not say. */
static unsigned schema_types(const json_t *sch, int depth) {
    if (!json_is_object(sch) || depth > 8) return 0;
    unsigned t = 0;
    const json_t *ty = json_object_get(sch, "type");
    if (json_is_string(ty)) t |= type_bit(json_string_value(ty));
    size_t i;
    const json_t *v;
    if (json_is_array(ty)) json_array_foreach(ty, i, v) if (json_is_string(v)) t |= type_bit(json_string_value(v));
    static const char *const alts[] = { "anyOf", "oneOf" };
    for (size_t a = 0; a < LM_COUNT(alts); a++) {
        const json_t *arr = json_object_get(sch, alts[a]);
        if (json_is_array(arr)) json_array_foreach(arr, i, v) t |= schema_types(v, depth + 1);
    }
    if (!t) {
        const json_t *en = json_object_get(sch, "enum");
        if (json_is_array(en)) json_array_foreach(en, i, v) t |= value_type_bit(v);
        const json_t *cst = json_object_get(sch, "const");
        if (cst) t |= value_type_bit(cst);
    }
    if (!t && json_object_get(sch, "properties")) t = T_OBJECT;
    if (!t && json_object_get(sch, "items")) t = T_ARRAY;
    if (t && json_is_true(json_object_get(sch, "nullable"))) t |= T_NULL; /* OpenAPI style */
    return t;
}

/* `properties` of the tool called `name` in the request's tools, or NULL.
 * Accepts OpenAI's {"type": "function", "function": {...}} and bare functions. */
static const json_t *tool_props(const json_t *tools, const char *name) {
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *fn = json_object_get(t, "function");
        if (!json_is_object(fn)) fn = t;
        const json_t *nm = json_object_get(fn, "name");
        if (!json_is_string(nm) || strcmp(json_string_value(nm), name) != 0) continue;
        const json_t *props = json_object_get(json_object_get(fn, "parameters"), "properties");
        return json_is_object(props) ? props : NULL;
    }
    return NULL;
}

/* ---- XML parameter values ------------------------------------------------------- */

static bool ieq(const char *s, size_t n, const char *lit) {
    if (strlen(lit) != n) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
        if (c != lit[i]) return false;
    }
    return true;
}

/* Appends the JSON for a complete parameter value v (framing newlines already
 * removed) converted by the schema types (see lm_parse.h). */
static void convert_value(lm_pbuf *out, const char *v, size_t n, unsigned types) {
    const char *t = v;
    size_t tn = n;
    while (tn && lm_parse_is_ws((unsigned char)t[0])) t++, tn--;
    while (tn && lm_parse_is_ws((unsigned char)t[tn - 1])) tn--;
    bool json = tn && lm_json_valid(t, tn);
    /* "null" is null unless a string is wanted and null is not allowed */
    if ((types & T_NULL || !(types & T_STRING)) && tn == 4 && memcmp(t, "null", 4) == 0) {
        lm_pbuf_puts(out, "null");
        return;
    }
    if ((types & (T_INTEGER | T_NUMBER)) && json && (t[0] == '-' || (t[0] >= '0' && t[0] <= '9'))) {
        lm_pbuf_put(out, t, tn);
        return;
    }
    if ((types & T_BOOLEAN) && (ieq(t, tn, "true") || ieq(t, tn, "false"))) {
        lm_pbuf_puts(out, ieq(t, tn, "true") ? "true" : "false");
        return;
    }
    if (json && (((types & T_OBJECT) && t[0] == '{') || ((types & T_ARRAY) && t[0] == '['))) {
        lm_pbuf_put(out, t, tn);
        return;
    }
    if (types == 0 && json) { /* unknown parameter: best-effort JSON */
        lm_pbuf_put(out, t, tn);
        return;
    }
    lm_pbuf_putc(out, '"');
    lm_parse_json_escape(out, v, n);
    lm_pbuf_putc(out, '"');
}

/* {"key": or , "key": before a parameter's value */
static void param_key(lm_toolcall_parser *p) {
    lm_pbuf *a = &p->cur->args;
    lm_pbuf_puts(a, p->n_params ? ", \"" : "{\"");
    lm_parse_json_escape(a, p->pname, strlen(p->pname));
    lm_pbuf_puts(a, "\": ");
}

/* Streams the part of a string value that is certain: the value so far minus
 * its framing newline at the start, minus what may still be "\n</parameter>"
 * or "</parameter>" at the end, minus an unfinished UTF-8 character. */
static void stream_value(lm_toolcall_parser *p, const char *v, size_t n) {
    if (!n) return; /* the first byte decides whether a framing newline leads */
    size_t lead = v[0] == '\n';
    const char *body = v + lead;
    size_t bn = n - lead;
    size_t hold = LM_MAX(lm_parse_partial(body, bn, PARAM_CLOSE, SLEN(PARAM_CLOSE)),
                         lm_parse_partial(body, bn, PARAM_CLOSE_NL, SLEN(PARAM_CLOSE_NL)));
    size_t certain = bn - hold;
    certain -= lm_parse_utf8_tail(body, certain);
    if (certain <= p->val_sent) return;
    lm_parse_json_escape(&p->cur->args, body + p->val_sent, certain - p->val_sent);
    p->val_sent = certain;
    lm_tc_args_changed(p);
}

/* The value v (raw, up to "</parameter>") is complete. */
static void param_done(lm_toolcall_parser *p, const char *v, size_t n) {
    if (n && v[0] == '\n') v++, n--;
    if (n && v[n - 1] == '\n') n--;
    lm_pbuf *a = &p->cur->args;
    if (p->pstream) {
        LM_ASSERT(p->val_sent <= n);
        lm_parse_json_escape(a, v + p->val_sent, n - p->val_sent);
        lm_pbuf_putc(a, '"');
    } else {
        param_key(p);
        convert_value(a, v, n, p->ptypes);
    }
    p->n_params++;
    free(p->pname);
    p->pname = NULL;
    lm_tc_args_changed(p);
}

/* ---- JSON form --------------------------------------------------------------------- */

static void json_call_begin(lm_toolcall_parser *p) {
    lm_tc_call_new(p);
    lm_json_scan_init(&p->js);
    p->key_kind = p->val_kind = KEY_OTHER;
    p->args_live = p->seen_name = p->seen_args = false;
    p->state = ST_JSON;
}

/* Decodes a JSON string literal; NULL when it is not one (or holds NUL). */
static char *json_string_dup(const char *s, size_t n) {
    json_t *v = json_loadb(s, n, JSON_DECODE_ANY, NULL);
    char *r = json_is_string(v) ? lm_xstrdup(json_string_value(v)) : NULL;
    json_decref(v);
    return r;
}

/* A value of the top-level object ended: raw[val_start..end). */
static void json_value_end(lm_toolcall_parser *p, size_t end) {
    const char *v = p->raw.p + p->val_start;
    size_t n = end - p->val_start;
    tc_call *c = p->cur;
    if (p->val_kind == KEY_NAME && !p->seen_name) {
        p->seen_name = true;
        c->name = json_string_dup(v, n);
        if (c->name && !c->name[0]) {
            free(c->name);
            c->name = NULL;
        }
        if (c->name) lm_tc_call_named(p);
    } else if (p->val_kind == KEY_ARGS && !p->seen_args) {
        p->seen_args = true;
        if (p->args_live) {
            p->args_live = false; /* the object is already in args */
        } else if (v[0] == '"') { /* arguments as a JSON-encoded string */
            char *dec = json_string_dup(v, n);
            if (dec) lm_pbuf_puts(&c->args, dec);
            else lm_pbuf_put(&c->args, v, n);
            free(dec);
        } else if (n == 4 && memcmp(v, "null", 4) == 0) {
            lm_pbuf_puts(&c->args, "{}");
        } else {
            lm_pbuf_put(&c->args, v, n);
        }
        lm_tc_args_changed(p);
    }
    p->val_kind = KEY_OTHER;
}

static int key_kind(const char *k, size_t n) {
    if (n == 4 && memcmp(k, "name", 4) == 0) return KEY_NAME;
    if ((n == 9 && memcmp(k, "arguments", 9) == 0) || (n == 10 && memcmp(k, "parameters", 10) == 0))
        return KEY_ARGS;
    return KEY_OTHER;
}

/* Feeds bytes to the JSON validator until the object closes or a byte is
 * invalid. Returns the bytes consumed. */
static size_t st_json(lm_toolcall_parser *p, const char *s, size_t n) {
    for (size_t k = 0; k < n; k++) {
        unsigned char c = (unsigned char)s[k];
        if (lm_json_scan_byte(&p->js, c) < 0) {
            lm_tc_call_abort(p);
            return k;
        }
        lm_pbuf_putc(&p->raw, (char)c);
        size_t at = p->raw.n - 1; /* c's offset in raw */
        unsigned ev = p->js.ev;
        if ((ev & LM_JS_END_BEFORE) && p->js.endb_depth == 1) json_value_end(p, at);
        if ((ev & LM_JS_KEY_BEGIN) && p->js.depth == 1) p->key_start = at + 1;
        if ((ev & LM_JS_KEY_END) && p->js.depth == 1)
            p->key_kind = key_kind(p->raw.p + p->key_start, at - p->key_start);
        if ((ev & LM_JS_BEGIN) && p->js.begin_depth == 1) {
            p->val_start = at;
            p->val_kind = p->key_kind;
            p->args_live = p->val_kind == KEY_ARGS && !p->seen_args && c == '{';
        }
        if (p->args_live) {
            lm_pbuf_putc(&p->cur->args, (char)c);
            lm_tc_args_changed(p);
        }
        if ((ev & LM_JS_END) && p->js.end_depth == 1) json_value_end(p, at + 1);
        if ((ev & LM_JS_END) && p->js.end_depth == 0) { /* the call object closed */
            if (!p->cur->name) {
                lm_tc_call_abort(p); /* no usable "name" */
                return k + 1;
            }
            if (!p->seen_args) {
                lm_pbuf_puts(&p->cur->args, "{}");
                lm_tc_args_changed(p);
            }
            lm_tc_call_commit(p);
            return k + 1;
        }
    }
    return n;
}

/* ---- literal matching ------------------------------------------------------------- */

enum { LIT_NEED = -1, LIT_NONE = -2 };

/* Which of lits[] s starts with; LIT_NEED when s is a proper prefix of one
 * (more input decides), LIT_NONE otherwise. */
static int match_lits(const char *s, size_t n, const char *const *lits, int nl) {
    bool need = false;
    for (int i = 0; i < nl; i++) {
        size_t L = strlen(lits[i]);
        if (n >= L && memcmp(s, lits[i], L) == 0) return i;
        if (n < L && memcmp(s, lits[i], n) == 0) need = true;
    }
    return need ? LIT_NEED : LIT_NONE;
}

/* ---- the state machine ---------------------------------------------------------- */

static void raw_put(lm_toolcall_parser *p, const char *s, size_t n) { lm_pbuf_put(&p->raw, s, n); }

/* CONTENT: emits text up to an open tag, holding back whitespace and a
 * possible partial tag at the end. Returns bytes consumed; *wait when the
 * rest needs more input. */
static size_t st_content(lm_toolcall_parser *p, const char *s, size_t n, bool at_end, bool *wait) {
    size_t i = 0;
    if (p->after_call) {
        while (i < n && lm_parse_is_ws((unsigned char)s[i])) i++;
        if (i == n) {
            *wait = true;
            p->pend_ws = 0;
            return n; /* framing whitespace after a call: dropped */
        }
        p->after_call = false;
    }
    size_t ws_known = p->pend_ws > i ? p->pend_ws - i : 0; /* leading ws of s+i */
    p->pend_ws = 0;
    s += i, n -= i;
    /* the open tag cannot start inside the known whitespace: it starts with non-ws */
    size_t at = lm_parse_find(s + ws_known, n - ws_known, p->open, p->open_len);
    if (at != LM_PARSE_NPOS) {
        at += ws_known;
        size_t t = at;
        while (t > 0 && lm_parse_is_ws((unsigned char)s[t - 1])) t--;
        lm_tc_content(p, s, t);
        raw_put(p, s + t, at + p->open_len - t);
        p->state = ST_BEGIN;
        return i + at + p->open_len;
    }
    if (at_end) {
        lm_tc_content(p, s, n);
        *wait = true; /* nothing more will come */
        return i + n;
    }
    size_t keep = lm_parse_partial(s, n, p->open, p->open_len);
    size_t t = n - keep; /* whitespace before the partial tag is held too */
    while (t > ws_known && lm_parse_is_ws((unsigned char)s[t - 1])) t--;
    if (t == ws_known) t = 0; /* s[0..ws_known) is whitespace already */
    size_t u = lm_parse_utf8_tail(s, t);
    p->pend_ws = u ? 0 : n - keep - t; /* what stays starts with this much whitespace */
    t -= u;
    lm_tc_content(p, s, t);
    *wait = true;
    return i + t;
}

/* Reads a name up to '>' for "<function=" / "<parameter=". Returns the
 * malloc'd trimmed name and sets *used; or NULL, with *bad telling "not a
 * name" (newline, '<', NUL, empty, or too long) from "wait for more". */
static char *read_name(const char *s, size_t n, size_t *used, bool *bad) {
    *used = 0;
    *bad = false;
    size_t lim = LM_MIN(n, (size_t)NAME_MAX_LEN + 1);
    for (size_t k = 0; k < lim; k++) {
        if (s[k] == '\n' || s[k] == '<' || s[k] == 0) break;
        if (s[k] != '>') continue;
        size_t a = 0, b = k;
        while (a < b && lm_parse_is_ws((unsigned char)s[a])) a++;
        while (b > a && lm_parse_is_ws((unsigned char)s[b - 1])) b--;
        if (a == b) break;
        char *name = lm_xmalloc(b - a + 1);
        memcpy(name, s + a, b - a);
        name[b - a] = 0;
        *used = k + 1;
        return name;
    }
    *bad = lim < n || memchr(s, '\n', lim) || memchr(s, '<', lim) || memchr(s, 0, lim) || memchr(s, '>', lim);
    return NULL;
}

/* Runs the machine over pend; at_end: the input is complete. */
void lm_tc_run(lm_toolcall_parser *p, bool at_end) {
    size_t i = 0;
    for (;;) {
        const char *s = p->pend.p + i;
        size_t n = p->pend.n - i;
        bool wait = false;
        switch (p->state) {
        case ST_CONTENT:
            i += st_content(p, s, n, at_end, &wait);
            break;

        case ST_BEGIN:
        case ST_XML_BODY:
        case ST_CLOSE: {
            size_t k = 0;
            while (k < n && lm_parse_is_ws((unsigned char)s[k])) k++;
            if (p->state != ST_CLOSE) raw_put(p, s, k); /* after a committed call it is framing */
            i += k, s += k, n -= k;
            if (!n) {
                wait = true;
                break;
            }
            if (p->state == ST_BEGIN) {
                static const char *const lits[] = { "{", FUNC_OPEN };
                int m = match_lits(s, n, lits, 2);
                if (m == 0) {
                    json_call_begin(p);
                } else if (m == 1) {
                    raw_put(p, s, SLEN(FUNC_OPEN));
                    i += SLEN(FUNC_OPEN);
                    p->state = ST_XML_NAME;
                } else if (m == LIT_NEED) {
                    wait = true;
                } else {
                    lm_tc_call_abort(p);
                }
            } else if (p->state == ST_XML_BODY) {
                static const char *const lits[] = { PARAM_OPEN, FUNC_CLOSE };
                int m = match_lits(s, n, lits, 2);
                if (m == 0) {
                    raw_put(p, s, SLEN(PARAM_OPEN));
                    i += SLEN(PARAM_OPEN);
                    p->state = ST_XML_PNAME;
                } else if (m == 1) {
                    raw_put(p, s, SLEN(FUNC_CLOSE));
                    i += SLEN(FUNC_CLOSE);
                    lm_pbuf_puts(&p->cur->args, p->n_params ? "}" : "{}");
                    lm_tc_call_commit(p);
                } else if (m == LIT_NEED) {
                    wait = true;
                } else {
                    lm_tc_call_abort(p);
                }
            } else { /* ST_CLOSE */
                const char *const lits[] = { p->close, "{", FUNC_OPEN };
                int m = match_lits(s, n, lits, 3);
                if (m == 0) {
                    i += p->close_len;
                    p->state = ST_CONTENT;
                    p->after_call = true;
                } else if (m == 1) { /* another JSON call in the same block */
                    json_call_begin(p);
                } else if (m == 2) {
                    raw_put(p, s, SLEN(FUNC_OPEN));
                    i += SLEN(FUNC_OPEN);
                    p->state = ST_XML_NAME;
                } else if (m == LIT_NEED) {
                    wait = true;
                } else { /* the close tag is missing: back to content */
                    p->state = ST_CONTENT;
                    p->after_call = true;
                }
            }
            break;
        }

        case ST_JSON:
            i += st_json(p, s, n);
            if (p->state == ST_JSON) wait = true;
            break;

        case ST_XML_NAME:
        case ST_XML_PNAME: {
            size_t used;
            bool bad;
            char *name = read_name(s, n, &used, &bad);
            if (!name) {
                if (bad) lm_tc_call_abort(p);
                else wait = true;
                break;
            }
            raw_put(p, s, used);
            i += used;
            if (p->state == ST_XML_NAME) {
                lm_tc_call_new(p)->name = name;
                p->props = p->tools ? tool_props(p->tools, name) : NULL;
                p->n_params = 0;
                lm_tc_call_named(p);
                p->state = ST_XML_BODY;
            } else {
                p->pname = name;
                p->ptypes = p->props ? schema_types(json_object_get(p->props, name), 0) : 0;
                p->pstream = p->ptypes == T_STRING;
                p->val_scanned = p->val_sent = 0;
                if (p->pstream) {
                    param_key(p);
                    lm_pbuf_putc(&p->cur->args, '"');
                    lm_tc_args_changed(p);
                }
                p->state = ST_XML_PVALUE;
            }
            break;
        }

        case ST_XML_PVALUE: {
            /* the value stays in pend (unconsumed) until its closing tag */
            size_t from = p->val_scanned >= SLEN(PARAM_CLOSE) - 1 ? p->val_scanned - (SLEN(PARAM_CLOSE) - 1) : 0;
            size_t at = lm_parse_find(s + from, n - from, PARAM_CLOSE, SLEN(PARAM_CLOSE));
            if (at == LM_PARSE_NPOS) {
                p->val_scanned = n;
                if (p->pstream) stream_value(p, s, n);
                wait = true;
                break;
            }
            at += from;
            param_done(p, s, at);
            raw_put(p, s, at + SLEN(PARAM_CLOSE));
            i += at + SLEN(PARAM_CLOSE);
            p->state = ST_XML_BODY;
            break;
        }
        }
        if (!wait) continue;
        if (!at_end || p->state == ST_CONTENT) break;
        /* end of input inside a call: what was not committed is content */
        if (p->state == ST_CLOSE) {
            p->state = ST_CONTENT;
            p->after_call = true;
        } else {
            lm_tc_call_abort(p);
        }
    }
    LM_ASSERT(i <= p->pend.n);
    lm_pbuf_drop(&p->pend, i);
    if (p->state == ST_CONTENT && at_end) LM_ASSERT(p->pend.n == 0);
}