/* toolcall.c - tool calls in generated content, as OpenAI tool_calls deltas.
 *
 * Formats, content framing and failure rules are in lm_parse.h. States:
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
 * becomes content and scanning resumes in CONTENT at the byte that failed.
 *
 * A call's arguments are built in call->args (append-only); deltas hand out
 * the bytes not sent yet (never the first bytes of an unfinished UTF-8
 * character). Output of one feed is collected in `out_*` and handed out as
 * pointers at the end. */
#include "chat/lm_parse.h"
#include "chat/parse_internal.h"

#include <stdlib.h>
#include <string.h>

enum { ST_CONTENT, ST_BEGIN, ST_JSON, ST_XML_NAME, ST_XML_BODY, ST_XML_PNAME, ST_XML_PVALUE, ST_CLOSE };
enum { KEY_OTHER, KEY_NAME, KEY_ARGS };
enum { T_STRING = 1, T_INTEGER = 2, T_NUMBER = 4, T_BOOLEAN = 8, T_NULL = 16, T_OBJECT = 32, T_ARRAY = 64 };

#define NAME_MAX_LEN 256 /* a function or parameter name longer than this is not a tag */

static const char FUNC_OPEN[] = "<function=";
static const char FUNC_CLOSE[] = "</function>";
static const char PARAM_OPEN[] = "<parameter=";
static const char PARAM_CLOSE[] = "</parameter>";
static const char PARAM_CLOSE_NL[] = "\n</parameter>";
#define SLEN(s) (sizeof(s) - 1)

typedef struct tc_call {
    char *id;         /* set with the index */
    char *name;       /* NULL until known */
    lm_pbuf args;
    size_t args_sent; /* bytes of args already in deltas */
    int index;        /* -1 until its first delta */
    bool committed;
} tc_call;

typedef struct out_delta {
    tc_call *call;
    bool first;
    size_t off, len; /* in out_args (each fragment is followed by a NUL) */
} out_delta;

struct lm_toolcall_parser {
    json_t *tools;
    char *open, *close;
    size_t open_len, close_len;
    uint64_t seed;
    bool atomic;

    int state;
    lm_pbuf pend;     /* input not consumed yet */
    size_t pend_ws;   /* (CONTENT) leading bytes of pend known to be whitespace */
    lm_pbuf raw;      /* text of the current call attempt */
    bool after_call;  /* (CONTENT) drop whitespace that follows a call */

    tc_call **calls;  /* every attempt that reached a name, in order */
    int n_calls, cap_calls;
    tc_call *cur;     /* the call being parsed, or NULL */
    int n_index, n_committed;

    /* JSON form */
    lm_json_scan js;
    int key_kind, val_kind;
    size_t key_start, val_start; /* offsets in raw */
    bool args_live;              /* copying the arguments object into args */
    bool seen_name, seen_args;

    /* XML form */
    const json_t *props;  /* `properties` of the called function's schema, or NULL */
    char *pname;          /* current parameter */
    unsigned ptypes;      /* its schema types (T_*), 0 when unknown */
    bool pstream;         /* string-typed: the value streams */
    size_t val_scanned;   /* bytes of the value searched for the closing tag */
    size_t val_sent;      /* bytes of the (framing-stripped) value already in args */
    int n_params;

    lm_pbuf out_content, out_args;
    out_delta *od;
    int n_od, cap_od;
    lm_toolcall_delta *deltas;
    int cap_deltas;
};

/* ---- calls and deltas ----------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static char *make_id(lm_toolcall_parser *p, int index) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    uint64_t x = p->seed ^ ((uint64_t)index * 0xD1B54A32D192ED03ull);
    char *id = lm_xmalloc(5 + 24 + 1);
    memcpy(id, "call_", 5);
    uint64_t r = 0;
    for (int i = 0; i < 24; i++) {
        if (i % 8 == 0) r = splitmix64(&x);
        id[5 + i] = abc[r % 62];
        r /= 62;
    }
    id[29] = 0;
    return id;
}

static void call_free(tc_call *c) {
    if (!c) return;
    free(c->id);
    free(c->name);
    lm_pbuf_free(&c->args);
    free(c);
}

static tc_call *call_new(lm_toolcall_parser *p) {
    LM_ASSERT(!p->cur);
    p->cur = lm_xcalloc(1, sizeof *p->cur);
    p->cur->index = -1;
    return p->cur;
}

static out_delta *od_new(lm_toolcall_parser *p, tc_call *c, bool first) {
    if (p->n_od == p->cap_od) {
        p->cap_od = p->cap_od ? p->cap_od * 2 : 4;
        p->od = lm_xrealloc(p->od, (size_t)p->cap_od * sizeof *p->od);
    }
    out_delta *d = &p->od[p->n_od++];
    *d = (out_delta){ c, first, p->out_args.n, 0 };
    lm_pbuf_putc(&p->out_args, 0);
    return d;
}

/* Appends an arguments fragment to this feed's delta for c (coalescing). */
static void od_args(lm_toolcall_parser *p, tc_call *c, const char *s, size_t n) {
    out_delta *d = p->n_od && p->od[p->n_od - 1].call == c ? &p->od[p->n_od - 1] : od_new(p, c, false);
    p->out_args.n--; /* the fragment's NUL; d is the last fragment */
    lm_pbuf_put(&p->out_args, s, n);
    lm_pbuf_putc(&p->out_args, 0);
    d->len += n;
}

/* Gives c its index and id and emits its first delta (name). */
static void call_start(lm_toolcall_parser *p, tc_call *c) {
    LM_ASSERT(c->index < 0 && c->name);
    c->index = p->n_index++;
    c->id = make_id(p, c->index);
    if (p->n_calls == p->cap_calls) {
        p->cap_calls = p->cap_calls ? p->cap_calls * 2 : 4;
        p->calls = lm_xrealloc(p->calls, (size_t)p->cap_calls * sizeof *p->calls);
    }
    p->calls[p->n_calls++] = c;
    od_new(p, c, true);
}

/* Emits the arguments not sent yet; unless `all`, keeps back an unfinished
 * UTF-8 character. */
static void call_flush(lm_toolcall_parser *p, tc_call *c, bool all) {
    if (c->index < 0) return;
    size_t end = c->args.n;
    if (!all) end -= lm_parse_utf8_tail(c->args.p, end);
    if (end <= c->args_sent) return;
    od_args(p, c, c->args.p + c->args_sent, end - c->args_sent);
    c->args_sent = end;
}

/* The current call's name is known: in streaming mode it starts now. */
static void call_named(lm_toolcall_parser *p) {
    if (p->atomic) return;
    call_start(p, p->cur);
    call_flush(p, p->cur, false);
}

static void args_changed(lm_toolcall_parser *p) {
    if (!p->atomic) call_flush(p, p->cur, false);
}

static void call_commit(lm_toolcall_parser *p) {
    tc_call *c = p->cur;
    if (c->index < 0) call_start(p, c);
    call_flush(p, c, true);
    c->committed = true;
    p->n_committed++;
    p->cur = NULL;
    lm_pbuf_clear(&p->raw);
    p->state = ST_CLOSE;
}

static void content(lm_toolcall_parser *p, const char *s, size_t n) { lm_pbuf_put(&p->out_content, s, n); }

/* The current attempt is not a tool call: its text becomes content and the
 * caller resumes scanning in CONTENT at the byte that failed. */
static void call_abort(lm_toolcall_parser *p) {
    content(p, p->raw.p, p->raw.n);
    lm_pbuf_clear(&p->raw);
    if (p->cur && p->cur->index < 0) call_free(p->cur); /* never seen by anyone */
    p->cur = NULL;                                      /* else owned by calls[] */
    free(p->pname);
    p->pname = NULL;
    p->state = ST_CONTENT;
    p->after_call = false;
    p->pend_ws = 0;
}

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
    args_changed(p);
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
    args_changed(p);
}

/* ---- JSON form --------------------------------------------------------------------- */

static void json_call_begin(lm_toolcall_parser *p) {
    call_new(p);
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
        if (c->name) call_named(p);
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
        args_changed(p);
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
            call_abort(p);
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
            args_changed(p);
        }
        if ((ev & LM_JS_END) && p->js.end_depth == 1) json_value_end(p, at + 1);
        if ((ev & LM_JS_END) && p->js.end_depth == 0) { /* the call object closed */
            if (!p->cur->name) {
                call_abort(p); /* no usable "name" */
                return k + 1;
            }
            if (!p->seen_args) {
                lm_pbuf_puts(&p->cur->args, "{}");
                args_changed(p);
            }
            call_commit(p);
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
        content(p, s, t);
        raw_put(p, s + t, at + p->open_len - t);
        p->state = ST_BEGIN;
        return i + at + p->open_len;
    }
    if (at_end) {
        content(p, s, n);
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
    content(p, s, t);
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
static void run(lm_toolcall_parser *p, bool at_end) {
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
                    call_abort(p);
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
                    call_commit(p);
                } else if (m == LIT_NEED) {
                    wait = true;
                } else {
                    call_abort(p);
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
                if (bad) call_abort(p);
                else wait = true;
                break;
            }
            raw_put(p, s, used);
            i += used;
            if (p->state == ST_XML_NAME) {
                call_new(p)->name = name;
                p->props = p->tools ? tool_props(p->tools, name) : NULL;
                p->n_params = 0;
                call_named(p);
                p->state = ST_XML_BODY;
            } else {
                p->pname = name;
                p->ptypes = p->props ? schema_types(json_object_get(p->props, name), 0) : 0;
                p->pstream = p->ptypes == T_STRING;
                p->val_scanned = p->val_sent = 0;
                if (p->pstream) {
                    param_key(p);
                    lm_pbuf_putc(&p->cur->args, '"');
                    args_changed(p);
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
            call_abort(p);
        }
    }
    LM_ASSERT(i <= p->pend.n);
    lm_pbuf_drop(&p->pend, i);
    if (p->state == ST_CONTENT && at_end) LM_ASSERT(p->pend.n == 0);
}

/* ---- API ------------------------------------------------------------------------- */

lm_toolcall_parser *lm_toolcall_parser_create(const lm_toolcall_opts *opts, lm_err *err) {
    lm_toolcall_opts o = opts ? *opts : (lm_toolcall_opts){ 0 };
    const char *open = o.open_tag ? o.open_tag : "<tool_call>";
    const char *close = o.close_tag ? o.close_tag : "</tool_call>";
    if (!open[0] || !close[0] || lm_parse_is_ws((unsigned char)open[0]) || lm_parse_is_ws((unsigned char)close[0])) {
        lm_errf(err, "tool-call tags must be non-empty and not start with whitespace");
        return NULL;
    }
    if (o.tools && !json_is_array(o.tools)) {
        lm_errf(err, "`tools` must be an array");
        return NULL;
    }
    lm_toolcall_parser *p = lm_xcalloc(1, sizeof *p);
    p->tools = o.tools ? json_incref(o.tools) : NULL;
    p->open = lm_xstrdup(open);
    p->close = lm_xstrdup(close);
    p->open_len = strlen(open);
    p->close_len = strlen(close);
    p->seed = o.id_seed;
    p->atomic = o.atomic;
    p->state = ST_CONTENT;
    return p;
}

static void begin_output(lm_toolcall_parser *p) {
    lm_pbuf_clear(&p->out_content);
    lm_pbuf_clear(&p->out_args);
    p->n_od = 0;
}

static void end_output(lm_toolcall_parser *p, lm_toolcall_out *out) {
    if (p->n_od > p->cap_deltas) {
        p->cap_deltas = p->n_od;
        p->deltas = lm_xrealloc(p->deltas, (size_t)p->cap_deltas * sizeof *p->deltas);
    }
    for (int i = 0; i < p->n_od; i++) {
        const out_delta *d = &p->od[i];
        p->deltas[i] = (lm_toolcall_delta){
            .index = d->call->index,
            .id = d->first ? d->call->id : NULL,
            .name = d->first ? d->call->name : NULL,
            .args = p->out_args.p + d->off,
            .args_len = d->len,
        };
    }
    out->content = lm_pbuf_str(&p->out_content);
    out->content_len = p->out_content.n;
    out->calls = p->deltas;
    out->n_calls = p->n_od;
}

void lm_toolcall_parser_feed(lm_toolcall_parser *p, const char *text, size_t n, lm_toolcall_out *out) {
    begin_output(p);
    lm_pbuf_put(&p->pend, text, n);
    run(p, false);
    end_output(p, out);
}

int lm_toolcall_parser_finish(lm_toolcall_parser *p, lm_toolcall_out *out) {
    begin_output(p);
    run(p, true);
    end_output(p, out);
    return p->n_committed;
}

/* A JSON string from bytes that may not be valid UTF-8 (invalid bytes become
 * U+FFFD), so building a response never fails on odd model output. */
static json_t *json_str(const char *s, size_t n) {
    json_t *v = json_stringn(s, n);
    if (v) return v;
    lm_pbuf b = { 0 };
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        json_t *one = len && i + len <= n ? json_stringn(s + i, len) : NULL;
        if (one) {
            lm_pbuf_put(&b, s + i, len);
            json_decref(one);
            i += len;
        } else {
            lm_pbuf_puts(&b, "\xEF\xBF\xBD");
            i++;
        }
    }
    v = json_stringn(lm_pbuf_str(&b), b.n);
    lm_pbuf_free(&b);
    return v;
}

static json_t *call_json(int index, const char *id, const char *name, const char *args, size_t args_len) {
    json_t *fn = json_object();
    if (name) json_object_set_new(fn, "name", json_str(name, strlen(name)));
    json_object_set_new(fn, "arguments", json_str(args, args_len));
    json_t *c = json_object();
    if (index >= 0) json_object_set_new(c, "index", json_integer(index));
    if (id) {
        json_object_set_new(c, "id", json_string(id));
        json_object_set_new(c, "type", json_string("function"));
    }
    json_object_set_new(c, "function", fn);
    return c;
}

json_t *lm_toolcall_out_json(const lm_toolcall_out *out) {
    if (!out->n_calls) return NULL;
    json_t *arr = json_array();
    for (int i = 0; i < out->n_calls; i++) {
        const lm_toolcall_delta *d = &out->calls[i];
        json_array_append_new(arr, call_json(d->index, d->id, d->name, d->args, d->args_len));
    }
    return arr;
}

json_t *lm_toolcall_parser_calls_json(const lm_toolcall_parser *p) {
    json_t *arr = json_array();
    for (int i = 0; i < p->n_calls; i++) {
        const tc_call *c = p->calls[i];
        if (!c->committed) continue;
        json_array_append_new(arr, call_json(-1, c->id, c->name, lm_pbuf_str(&c->args), c->args.n));
    }
    return arr;
}

void lm_toolcall_parser_free(lm_toolcall_parser *p) {
    if (!p) return;
    for (int i = 0; i < p->n_calls; i++) call_free(p->calls[i]);
    if (p->cur && p->cur->index < 0) call_free(p->cur);
    free(p->calls);
    json_decref(p->tools);
    free(p->open);
    free(p->close);
    free(p->pname);
    lm_pbuf_free(&p->pend);
    lm_pbuf_free(&p->raw);
    lm_pbuf_free(&p->out_content);
    lm_pbuf_free(&p->out_args);
    free(p->od);
    free(p->deltas);
    free(p);
}
