/* tpl_internal.h - types shared by the Jinja interpreter's files.
 *
 * Design (see lm_template.h for the outside view):
 *   lexer.c   source -> tokens (whitespace control, trim/lstrip_blocks)
 *   parser.c  tokens -> AST (jinja2's grammar and precedence)
 *   eval.c    statements and expressions over a scope chain
 *   ops.c     operators on values: x.name, x[key], slices, arithmetic, compare
 *   filters.c filters on strings and numbers, argument helpers; filters_seq.c
 *             filters on sequences; tests.c tests; methods.c str/dict/list methods
 *   format.c  '%' and str.format; globals.c range, namespace, dict ...
 *   value.c   values, Python str()/repr(), ==, <, truthiness; unicode helpers
 *   json_out.c tojson (json.dumps byte for byte) and Python float repr
 *
 * Memory: everything a parse or a render allocates comes from an arena that
 * is freed in one piece (the template's, or the render's), so values need no
 * reference counts and cyclic structures cannot leak. Errors anywhere below
 * the public entry points longjmp back to it with the message already
 * written; that is safe because nothing outside the arena is held across a
 * call that can fail. */
#ifndef LM_TPL_INTERNAL_H
#define LM_TPL_INTERNAL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "lm_template.h"

/* ---- arena --------------------------------------------------------------- */

typedef struct tpl_chunk tpl_chunk;
typedef struct tpl_arena {
    tpl_chunk *head;
    size_t total, limit;
} tpl_arena;

/* NULL when the limit would be passed (callers raise an error). */
void *tpl_arena_alloc(tpl_arena *a, size_t n);
void tpl_arena_free(tpl_arena *a);

/* ---- failure context ----------------------------------------------------- */

typedef struct tpl_fail {
    jmp_buf jb;
    lm_err *err;
    const char *name; /* template name for messages */
    const char *src;  /* normalised source, for line:column */
    size_t src_len;
    tpl_arena *arena;
} tpl_fail;

/* Formats "NAME:LINE:COL: msg" for the source offset pos and longjmps. */
void tpl_raise(tpl_fail *f, size_t pos, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
void *tpl_alloc(tpl_fail *f, size_t n); /* zeroed; raises on the limit */
void tpl_line_col(const char *src, size_t len, size_t pos, int *line, int *col);

/* ---- values -------------------------------------------------------------- */

typedef enum tpl_type {
    TV_UNDEF, TV_NONE, TV_BOOL, TV_INT, TV_FLOAT, TV_STR, TV_LIST, TV_DICT, TV_NS, TV_FUNC,
    TV_LOOP
} tpl_type;

/* flags */
#define TVF_MARKUP 1u /* a str marked safe (markupsafe.Markup) */
#define TVF_TUPLE 2u  /* a list that is a Python tuple (prints as (a, b)) */
#define TVF_GROUP 4u  /* a groupby() tuple: also has .grouper and .list */
#define TVF_ITEMS 8u  /* lists from dict.items() / keys() / values(): print as */
#define TVF_KEYS 16u  /* dict_items([...]) etc. */
#define TVF_VALUES 32u
/* a list standing for a Python generator/iterator (what map, select, reject,
 * items, unique, batch and reverse return): always true, no len(), no
 * indexing, not JSON */
#define TVF_GEN 64u
#define TVF_NOT_LIST (TVF_GEN | TVF_ITEMS | TVF_KEYS | TVF_VALUES) /* no indexing, not JSON */

typedef struct tpl_list tpl_list;
typedef struct tpl_dict tpl_dict;
typedef struct tpl_func tpl_func;
typedef struct tpl_loop tpl_loop;

typedef struct tpl_val {
    uint8_t t, flags;
    union {
        bool b;
        int64_t i;
        double f;
        struct { const char *p; size_t n; } s; /* TV_STR; also an undefined's name */
        tpl_list *l;
        tpl_dict *d; /* TV_DICT, TV_NS */
        tpl_func *fn;
        tpl_loop *loop;
    } u;
    /* TV_UNDEF: what was missing, for the error when it is used:
     * u.s = the name, and hint = the object's type name or NULL (a variable) */
    const char *hint;
} tpl_val;

struct tpl_list {
    tpl_val *v;
    size_t n, cap;
};

struct tpl_dict {
    tpl_val *k, *v;
    size_t n, cap;
    uint32_t *idx; /* from 16 entries: open-addressing index of string keys (entry + 1, 0 = empty) */
    size_t idx_cap;
};

typedef struct tpl_str {
    const char *p;
    size_t n;
} tpl_str;

/* ---- AST ----------------------------------------------------------------- */

typedef enum tpl_kind {
    /* expressions */
    N_CONST, N_NAME, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_NEG, N_POS, N_NOT,
    N_BIN, N_CMP, N_AND, N_OR, N_COND, N_LIST, N_TUPLE, N_DICT, N_CONCAT,
    /* statements */
    N_DATA, N_PRINT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_CALLBLOCK, N_FILTERBLOCK,
    N_BREAK, N_CONTINUE, N_WITH, N_DO, N_BODY
} tpl_kind;

typedef enum tpl_binop { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW } tpl_binop;
typedef enum tpl_cmpop { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN } tpl_cmpop;

typedef struct tpl_node tpl_node;

typedef struct tpl_nodes {
    tpl_node **v;
    int n;
} tpl_nodes;

/* Call arguments: positional, keyword (name=value), *args, **kwargs. */
typedef struct tpl_args {
    tpl_nodes pos;
    tpl_str *kwname;
    tpl_nodes kw;
    tpl_node *star, *dstar;
} tpl_args;

struct tpl_node {
    uint8_t kind, op;
    bool neg;      /* N_TEST: is not */
    size_t pos;    /* source offset */
    tpl_str name;  /* N_NAME, N_ATTR, N_FILTER, N_TEST, N_MACRO */
    tpl_val cval;  /* N_CONST */
    tpl_node *a, *b, *c, *d;
    tpl_nodes list;  /* items, body, compare operands */
    tpl_nodes list2; /* else body, dict values */
    tpl_args args;   /* N_CALL, N_FILTER, N_TEST, macro params (names + defaults) */
    uint8_t *ops;    /* N_CMP operators */
    bool recursive;  /* N_FOR */
};

/* Statement fields:
 *   N_DATA cval (str); N_PRINT a
 *   N_IF a=cond list=body list2=else
 *   N_FOR a=target b=iter c=filter list=body list2=else recursive
 *   N_SET a=target b=value; N_SETBLOCK a=target list=body c=filter chain (N_FILTER on N_CONST none)
 *   N_MACRO name, args.pos = params (N_NAME), args.kw = defaults by name, list=body
 *   N_CALLBLOCK a=call expr, args = caller params, list=body
 *   N_FILTERBLOCK c=filter chain, list=body
 *   N_WITH args.kwname/kw = assignments, list=body; N_DO a */

struct lm_template {
    tpl_arena arena;
    char *name;
    char *src; /* normalised source (line:column of runtime errors) */
    size_t src_len;
    tpl_node *root; /* N_BODY */
};

/* lexer.c / parser.c */
typedef enum tpl_tok {
    T_EOF, T_DATA, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING,
    T_INT, T_FLOAT, T_OP
} tpl_tok;

typedef struct tpl_token {
    uint8_t type;
    size_t pos;
    tpl_str s;  /* text of DATA, NAME, STRING (decoded), OP */
    int64_t i;
    double f;
} tpl_token;

/* Tokenises the normalised source; returns the count (last is T_EOF). */
tpl_token *tpl_lex(tpl_fail *f, const char *src, size_t len, int *n_out);
tpl_node *tpl_parse_tokens(tpl_fail *f, tpl_token *toks, int n);

/* ---- runtime ------------------------------------------------------------- */

typedef struct tpl_scope tpl_scope;
struct tpl_scope {
    tpl_scope *parent;
    tpl_str *names;
    tpl_val *vals;
    int n, cap;
    bool captured; /* a macro or caller() closes over it: never reuse it */
};

typedef struct tpl_buf {
    char *p;
    size_t n, cap;
} tpl_buf;

typedef struct tpl_rt {
    tpl_fail f;
    tpl_arena arena;
    const lm_template *tpl;
    tpl_scope *globals; /* the context's variables */
    tpl_buf *out;       /* where output goes now */
    size_t max_output;
    uint64_t steps, max_steps;
    int depth;
    int64_t now;
    size_t pos; /* source offset of the node being evaluated, for errors */
} tpl_rt;

/* Nesting limit for evaluation frames (expressions, statements, macro calls)
 * and for walking nested values: about 250 bytes of C stack each (3x that
 * under ASan), so well inside a 2 MB thread stack. */
#define TPL_MAX_DEPTH 1000

typedef enum tpl_fkind { FN_MACRO, FN_BUILTIN, FN_METHOD, FN_CALLER } tpl_fkind;
struct tpl_func {
    uint8_t kind;
    int id;              /* FN_BUILTIN / FN_METHOD: which */
    tpl_val self;        /* FN_METHOD: the receiver */
    const tpl_node *node;  /* FN_MACRO: N_MACRO; FN_CALLER: N_CALLBLOCK */
    tpl_scope *closure;
    tpl_str name;
};

struct tpl_loop {
    tpl_list *items;
    size_t index0;
    int depth0;
    const tpl_node *for_node; /* recursive loops: loop(x) re-runs it */
    tpl_scope *scope;         /* the scope the loop runs in */
    tpl_val last_changed;
    bool has_changed;
};

/* Evaluated call arguments. */
typedef struct tpl_argv {
    int npos, nkw;
    tpl_val *pos;
    tpl_str *kwname;
    tpl_val *kw;
    uint32_t used_kw; /* bit i: kw[i] consumed (checked by tpl_args_done) */
} tpl_argv;

/* Counts n units of work against max_steps (loops, comparisons in filters):
 * every render ends in bounded time. */
void tpl_steps_exceeded(tpl_rt *rt) __attribute__((noreturn));
static inline void tpl_tick(tpl_rt *rt, uint64_t n) {
    rt->steps += n;
    if (rt->steps > rt->max_steps) tpl_steps_exceeded(rt);
}

/* value.c: constructors */
static inline tpl_val tv_undef(void) { tpl_val v = { 0 }; v.t = TV_UNDEF; return v; }
static inline tpl_val tv_none(void) { tpl_val v = { 0 }; v.t = TV_NONE; return v; }
static inline tpl_val tv_bool(bool b) { tpl_val v = { 0 }; v.t = TV_BOOL; v.u.b = b; return v; }
static inline tpl_val tv_int(int64_t i) { tpl_val v = { 0 }; v.t = TV_INT; v.u.i = i; return v; }
static inline tpl_val tv_float(double f) { tpl_val v = { 0 }; v.t = TV_FLOAT; v.u.f = f; return v; }
static inline tpl_val tv_strn(const char *p, size_t n) {
    tpl_val v = { 0 };
    v.t = TV_STR;
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}
tpl_val tv_str_copy(tpl_rt *rt, const char *p, size_t n);
tpl_val tv_cstr(const char *s); /* static string */
tpl_val tv_undef_named(const char *name, size_t n, const char *hint);
tpl_val tv_list(tpl_rt *rt, size_t cap);
tpl_val tv_dict(tpl_rt *rt, size_t cap);
void tpl_list_push(tpl_rt *rt, tpl_list *l, tpl_val v);
void tpl_dict_set(tpl_rt *rt, tpl_dict *d, tpl_val k, tpl_val v);
tpl_val *tpl_dict_get(tpl_dict *d, tpl_val k);
tpl_val *tpl_dict_gets(tpl_dict *d, const char *k, size_t n);
tpl_val tpl_from_json(tpl_rt *rt, const json_t *j, int depth);

/* value.c: Python semantics */
const char *tpl_type_name(const tpl_val *v); /* 'str', 'dict', 'NoneType' ... */
bool tpl_truthy(tpl_rt *rt, tpl_val v);
bool tpl_eq(tpl_rt *rt, tpl_val a, tpl_val b);
int tpl_cmp(tpl_rt *rt, tpl_val a, tpl_val b); /* <0, 0, >0; raises if unorderable */
void tpl_str_of(tpl_rt *rt, tpl_buf *b, tpl_val v);   /* str(v) */
void tpl_repr_of(tpl_rt *rt, tpl_buf *b, tpl_val v);  /* repr(v) */
tpl_val tpl_to_str(tpl_rt *rt, tpl_val v);             /* str(v) as a value */
int64_t tpl_len(tpl_rt *rt, tpl_val v);
/* Iterates v as Python's iter(): list items, dict keys, string characters.
 * Undefined is empty; other types raise. A list comes back as a view of the
 * same items (cap == n, so pushing to it copies first): callers must not
 * change its items in place. */
tpl_list *tpl_iter_list(tpl_rt *rt, tpl_val v);
void tpl_undef_fail(tpl_rt *rt, tpl_val v) __attribute__((noreturn));
void tpl_rt_raise(tpl_rt *rt, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
void *tpl_rt_alloc(tpl_rt *rt, size_t n);

/* buffers */
void tpl_buf_put(tpl_rt *rt, tpl_buf *b, const char *p, size_t n);
static inline void tpl_buf_puts(tpl_rt *rt, tpl_buf *b, const char *s) { tpl_buf_put(rt, b, s, strlen(s)); }
void tpl_buf_printf(tpl_rt *rt, tpl_buf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
tpl_val tpl_buf_val(tpl_buf *b);

/* unicode helpers (value.c) */
int tpl_utf8_dec(const char *p, size_t n, size_t *i); /* code point at *i, advances */
int tpl_utf8_enc(uint32_t cp, char out[4]);
size_t tpl_utf8_len(const char *p, size_t n);          /* code points */
bool tpl_cp_space(uint32_t cp);                        /* Python str.isspace */
uint32_t tpl_cp_upper(uint32_t cp);
uint32_t tpl_cp_lower(uint32_t cp);
bool tpl_cp_cased(uint32_t cp);
bool tpl_cp_alpha(uint32_t cp);
bool tpl_cp_digit(uint32_t cp);
bool tpl_utf8_valid(const char *p, size_t n, size_t *bad);
/* Strips Python whitespace (or the code points of chars) from the ends. */
tpl_str tpl_strip(tpl_str s, const tpl_str *chars, bool left, bool right);
tpl_val tpl_case_map(tpl_rt *rt, tpl_str s, int mode); /* 0 lower 1 upper 2 title 3 capitalize 4 swapcase */

/* json_out.c */
void tpl_float_repr(double x, char out[32]); /* Python repr(float) */
void tpl_tojson(tpl_rt *rt, tpl_buf *b, tpl_val v, bool ensure_ascii, const char *indent,
                int indent_len, const char *item_sep, const char *key_sep, bool sort_keys);

/* eval.c */
tpl_val tpl_call(tpl_rt *rt, tpl_val fn, tpl_argv *av);

/* ops.c */
tpl_val tpl_getattr(tpl_rt *rt, tpl_val obj, tpl_str name);
tpl_val tpl_getitem(tpl_rt *rt, tpl_val obj, tpl_val key);
tpl_val tpl_slice(tpl_rt *rt, tpl_val obj, tpl_val a, tpl_val b, tpl_val c); /* obj[a:b:c]; None: omitted */
tpl_val tpl_binary(tpl_rt *rt, tpl_binop op, tpl_val a, tpl_val b);
bool tpl_compare(tpl_rt *rt, tpl_cmpop op, tpl_val a, tpl_val b);
static inline bool tpl_is_num(tpl_val v) { return v.t == TV_BOOL || v.t == TV_INT || v.t == TV_FLOAT; }
static inline double tpl_as_f(tpl_val v) { return v.t == TV_FLOAT ? v.u.f : v.t == TV_INT ? (double)v.u.i : v.u.b; }
static inline int64_t tpl_as_i(tpl_val v) { return v.t == TV_INT ? v.u.i : v.u.b; }

/* filters.c, filters_seq.c, tests.c */
tpl_val tpl_filter(tpl_rt *rt, tpl_str name, tpl_val v, tpl_argv *av);
bool tpl_test(tpl_rt *rt, tpl_str name, tpl_val v, tpl_argv *av);
bool tpl_filter_exists(tpl_str name);
bool tpl_test_exists(tpl_str name);
/* select/reject: av->pos[first] names the test (absent: truthiness), the
 * rest are its arguments */
bool tpl_test_args(tpl_rt *rt, tpl_val item, tpl_argv *av, int first);
/* argument helpers: the idx-th positional or the keyword name; false if absent */
bool tpl_arg(tpl_argv *av, int idx, const char *name, tpl_val *out);
void tpl_args_done(tpl_rt *rt, tpl_argv *av, int max_pos, const char *what);
/* the same as a truth value, or as an integer (None counts as absent);
 * dflt if absent */
bool tpl_arg_bool(tpl_rt *rt, tpl_argv *av, int idx, const char *name, bool dflt);
int64_t tpl_arg_int(tpl_rt *rt, tpl_argv *av, int idx, const char *name, int64_t dflt);
/* A filter by name: filters.c's table, then filters_seq.c's. */
typedef tpl_val (*tpl_filter_fn)(tpl_rt *rt, tpl_val v, tpl_argv *av);
typedef struct tpl_filter_def {
    const char *name;
    tpl_filter_fn fn;
} tpl_filter_def;
extern const tpl_filter_def tpl_seq_filters[];
extern const size_t tpl_seq_filters_n;

/* methods.c */
tpl_val tpl_method_lookup(tpl_rt *rt, tpl_val obj, tpl_str name, bool *found);
tpl_val tpl_call_method(tpl_rt *rt, tpl_func *fn, tpl_argv *av);
tpl_val tpl_str_replace(tpl_rt *rt, tpl_str s, tpl_str old, tpl_str rep, int64_t count);
tpl_val tpl_str_split(tpl_rt *rt, tpl_str s, const tpl_str *sep, int64_t maxsplit, bool right);
tpl_val tpl_html_escape(tpl_rt *rt, tpl_val v);

/* format.c */
tpl_val tpl_str_format(tpl_rt *rt, tpl_str fmt, tpl_argv *av);   /* str.format */
tpl_val tpl_percent_format(tpl_rt *rt, tpl_str fmt, tpl_val args); /* fmt % args */

/* globals.c */
bool tpl_global(tpl_str name, tpl_val *out);
tpl_val tpl_call_builtin(tpl_rt *rt, tpl_func *fn, tpl_argv *av);

static inline bool tpl_str_eq(tpl_str a, const char *b) {
    size_t n = strlen(b);
    return a.n == n && !memcmp(a.p, b, n);
}
static inline tpl_str tpl_sv(tpl_val v) { return (tpl_str){ v.u.s.p, v.u.s.n }; }

#endif
