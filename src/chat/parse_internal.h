/* parse_internal.h - pieces shared by the streaming parsers (not public):
 * a growable byte buffer, tag search helpers, UTF-8 and JSON-string helpers,
 * the incremental JSON validator (json_scan.c), and the tool-call parser's
 * state, shared by toolcall.c and toolcall_scan.c. */
#ifndef LM_PARSE_INTERNAL_H
#define LM_PARSE_INTERNAL_H

#include "base/lm_base.h"
#include "chat/lm_parse.h"

/* ---- byte buffer ---------------------------------------------------------- */

/* Always NUL-terminated after n (once anything was put), so p can be handed
 * out as a C string; lm_pbuf_str gives "" for an untouched buffer. */
typedef struct lm_pbuf {
    char *p;
    size_t n, cap;
} lm_pbuf;

void lm_pbuf_put(lm_pbuf *b, const void *s, size_t n);
void lm_pbuf_putc(lm_pbuf *b, char c);
void lm_pbuf_puts(lm_pbuf *b, const char *s);
void lm_pbuf_clear(lm_pbuf *b);
/* Removes the first n bytes. */
void lm_pbuf_drop(lm_pbuf *b, size_t n);
const char *lm_pbuf_str(const lm_pbuf *b);
void lm_pbuf_free(lm_pbuf *b);

/* ---- text helpers ------------------------------------------------------------ */

#define LM_PARSE_NPOS ((size_t)-1)

/* First occurrence of pat (m > 0 bytes) in s[0..n), or LM_PARSE_NPOS. */
size_t lm_parse_find(const char *s, size_t n, const char *pat, size_t m);
/* Longest k < m with k <= n such that s ends with pat[0..k): how much of the
 * end of s may still become pat. */
size_t lm_parse_partial(const char *s, size_t n, const char *pat, size_t m);
/* Bytes at the end of s[0..n) that form an incomplete (so far valid) UTF-8
 * sequence: 0..3. */
size_t lm_parse_utf8_tail(const char *s, size_t n);
bool lm_parse_is_ws(unsigned char c); /* JSON whitespace: space, \t, \n, \r */

/* Appends s as the body of a JSON string (no quotes), escaped the way jansson
 * dumps strings: \" \\ \b \f \n \r \t, other controls as \u00XX, everything
 * else verbatim. */
void lm_parse_json_escape(lm_pbuf *b, const char *s, size_t n);

/* ---- incremental JSON validator (json_scan.c) ------------------------------- */

/* Feed a JSON text one byte at a time; it validates strictly (RFC 8259
 * syntax; string contents are not checked for UTF-8) and reports, per byte,
 * where values and object keys begin and end, with their depth (the number of
 * containers around them: 0 for the top-level value). */
#define LM_JSON_MAX_DEPTH 64

enum {
    LM_JS_BEGIN = 1,      /* this byte begins a value at depth begin_depth */
    LM_JS_END = 2,        /* this byte ends a value (its last byte) at depth end_depth */
    LM_JS_END_BEFORE = 4, /* a number at depth endb_depth ended before this byte */
    LM_JS_KEY_BEGIN = 8,  /* this byte is the opening quote of a key (at depth `depth`) */
    LM_JS_KEY_END = 16,   /* this byte is the closing quote of a key */
};

typedef struct lm_json_scan {
    int state, num, hex_left, lit_pos;
    const char *lit;
    bool in_key;
    int depth;                      /* open containers */
    char stack[LM_JSON_MAX_DEPTH];  /* '{' or '[' per open container */
    unsigned ev;                    /* LM_JS_* for the last byte */
    int begin_depth, end_depth, endb_depth;
} lm_json_scan;

void lm_json_scan_init(lm_json_scan *js);
/* Returns 0, or -1 when the byte makes the text invalid (the scanner then
 * stays failed). */
int lm_json_scan_byte(lm_json_scan *js, unsigned char c);
/* End of input: true when exactly one complete value was read (a trailing
 * top-level number is completed here). */
bool lm_json_scan_end(lm_json_scan *js);
/* Whether s[0..n) is one complete JSON value (surrounding whitespace allowed). */
bool lm_json_valid(const char *s, size_t n);

/* ---- the tool-call parser (toolcall.c, toolcall_scan.c) -------------------- */

enum { ST_CONTENT, ST_BEGIN, ST_JSON, ST_XML_NAME, ST_XML_BODY, ST_XML_PNAME, ST_XML_PVALUE, ST_CLOSE };

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

/* toolcall.c: the current call (p->cur) and its deltas */
tc_call *lm_tc_call_new(lm_toolcall_parser *p);
void lm_tc_call_named(lm_toolcall_parser *p);    /* its name is known */
void lm_tc_args_changed(lm_toolcall_parser *p);  /* its args grew */
void lm_tc_call_commit(lm_toolcall_parser *p);   /* it is complete */
void lm_tc_call_abort(lm_toolcall_parser *p);    /* not a call: its text is content */
void lm_tc_content(lm_toolcall_parser *p, const char *s, size_t n);
/* toolcall_scan.c: runs the state machine over p->pend; at_end: the input is complete */
void lm_tc_run(lm_toolcall_parser *p, bool at_end);

#endif
