/* value.c - the interpreter's values with Python's semantics: truthiness,
 * ==, ordering, str() and repr(), len() and iteration; the arena they live
 * in; buffers; and the small amount of Unicode that Python string methods
 * need (whitespace, case mapping for Latin, Greek and Cyrillic).
 *
 * Part of lumen's Jinja interpreter, written by hand for lumen (no Jinja
 * library exists in C); semantics follow the jinja2 and Python docs. */
#include "tpl_internal.h"

#include <math.h>
#include <stdlib.h>

/* ---- arena --------------------------------------------------------------- */

struct tpl_chunk {
    tpl_chunk *next;
    size_t used, cap;
    _Alignas(16) char data[];
};

void *tpl_arena_alloc(tpl_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    tpl_chunk *h = a->head;
    if (h && h->cap - h->used >= n) {
        void *p = h->data + h->used;
        h->used += n;
        return p;
    }
    size_t cap = n > 32768 ? n : 65536;
    if (a->limit && (cap > a->limit || a->total > a->limit - cap)) return NULL;
    tpl_chunk *c = malloc(sizeof *c + cap);
    if (!c) return NULL;
    a->total += cap;
    c->cap = cap;
    c->used = n;
    if (h && n > 32768 && h->cap - h->used > 4096) {
        /* a big block: keep allocating small things from the current chunk */
        c->next = h->next;
        h->next = c;
    } else {
        c->next = h;
        a->head = c;
    }
    return c->data;
}

void tpl_arena_free(tpl_arena *a) {
    tpl_chunk *c = a->head;
    while (c) {
        tpl_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->total = 0;
}

/* ---- failures ------------------------------------------------------------ */

void tpl_line_col(const char *src, size_t len, size_t pos, int *line, int *col) {
    int l = 1, c = 1;
    if (pos > len) pos = len;
    for (size_t i = 0; i < pos; i++) {
        if (src[i] == '\n') {
            l++;
            c = 1;
        } else if (((unsigned char)src[i] & 0xC0) != 0x80) {
            c++;
        }
    }
    *line = l;
    *col = c;
}

void tpl_raise(tpl_fail *f, size_t pos, const char *fmt, ...) {
    char msg[LM_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (f->src) {
        int line, col;
        tpl_line_col(f->src, f->src_len, pos, &line, &col);
        lm_errf(f->err, "%s:%d:%d: %s", f->name, line, col, msg);
    } else {
        lm_errf(f->err, "%s: %s", f->name, msg);
    }
    longjmp(f->jb, 1);
}

void *tpl_alloc(tpl_fail *f, size_t n) {
    void *p = tpl_arena_alloc(f->arena, n);
    if (!p) tpl_raise(f, 0, "out of memory (the template needs more than %zu bytes)", f->arena->limit);
    memset(p, 0, n);
    return p;
}

void tpl_steps_exceeded(tpl_rt *rt) {
    tpl_rt_raise(rt, "template took too many steps (over %llu)", (unsigned long long)rt->max_steps);
}

void *tpl_rt_alloc(tpl_rt *rt, size_t n) {
    void *p = tpl_arena_alloc(rt->f.arena, n);
    if (!p) tpl_rt_raise(rt, "out of memory (rendering needs more than %zu bytes)", rt->f.arena->limit);
    memset(p, 0, n);
    return p;
}

void tpl_rt_raise(tpl_rt *rt, const char *fmt, ...) {
    char msg[LM_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tpl_raise(&rt->f, rt->pos, "%s", msg);
}

/* ---- buffers ------------------------------------------------------------- */

void tpl_buf_put(tpl_rt *rt, tpl_buf *b, const char *p, size_t n) {
    if (n == 0) return;
    if (b->cap - b->n < n) {
        size_t need = b->n + n;
        if (need < b->n) tpl_rt_raise(rt, "output too large");
        if (rt->max_output && need > rt->max_output)
            tpl_rt_raise(rt, "output too large (over %zu bytes)", rt->max_output);
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < need) cap *= 2;
        char *np = tpl_arena_alloc(rt->f.arena, cap);
        if (!np) tpl_rt_raise(rt, "out of memory (rendering needs more than %zu bytes)", rt->f.arena->limit);
        if (b->n) memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

void tpl_buf_printf(tpl_rt *rt, tpl_buf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    tpl_buf_put(rt, b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

tpl_val tpl_buf_val(tpl_buf *b) { return tv_strn(b->n ? b->p : "", b->n); }

/* ---- constructors -------------------------------------------------------- */

tpl_val tv_str_copy(tpl_rt *rt, const char *p, size_t n) {
    char *q = tpl_rt_alloc(rt, n + 1);
    if (n) memcpy(q, p, n);
    return tv_strn(q, n);
}

tpl_val tv_cstr(const char *s) { return tv_strn(s, strlen(s)); }

tpl_val tv_undef_named(const char *name, size_t n, const char *hint) {
    tpl_val v = tv_undef();
    v.u.s.p = name;
    v.u.s.n = n;
    v.hint = hint;
    return v;
}

tpl_val tv_list(tpl_rt *rt, size_t cap) {
    tpl_val v = { 0 };
    v.t = TV_LIST;
    v.u.l = tpl_rt_alloc(rt, sizeof *v.u.l);
    if (cap) {
        if (cap > SIZE_MAX / sizeof(tpl_val)) tpl_rt_raise(rt, "list too large");
        v.u.l->v = tpl_rt_alloc(rt, cap * sizeof(tpl_val));
        v.u.l->cap = cap;
    }
    return v;
}

static void index_build(tpl_rt *rt, tpl_dict *d);

tpl_val tv_dict(tpl_rt *rt, size_t cap) {
    tpl_val v = { 0 };
    v.t = TV_DICT;
    v.u.d = tpl_rt_alloc(rt, sizeof *v.u.d);
    if (cap) {
        if (cap > SIZE_MAX / sizeof(tpl_val)) tpl_rt_raise(rt, "dict too large");
        v.u.d->k = tpl_rt_alloc(rt, cap * sizeof(tpl_val));
        v.u.d->v = tpl_rt_alloc(rt, cap * sizeof(tpl_val));
        v.u.d->cap = cap;
        if (cap >= 16) index_build(rt, v.u.d);
    }
    return v;
}

void tpl_list_push(tpl_rt *rt, tpl_list *l, tpl_val v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        if (cap > SIZE_MAX / sizeof(tpl_val)) tpl_rt_raise(rt, "list too large");
        tpl_val *nv = tpl_rt_alloc(rt, cap * sizeof *nv);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

static bool key_eq(tpl_val a, tpl_val b) {
    if (a.t == TV_STR && b.t == TV_STR) return a.u.s.n == b.u.s.n && !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
    if (a.t == TV_STR || b.t == TV_STR) return false;
    return tpl_eq(NULL, a, b);
}

static uint64_t str_hash(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

/* Big dicts (tool schemas, long contexts) get a hash index of their string
 * keys so that lookups stay O(1); small ones are scanned. */
static void index_insert(tpl_dict *d, size_t entry) {
    const tpl_val *k = &d->k[entry];
    size_t mask = d->idx_cap - 1, i = (size_t)str_hash(k->u.s.p, k->u.s.n) & mask;
    while (d->idx[i]) i = (i + 1) & mask;
    d->idx[i] = (uint32_t)entry + 1;
}

static void index_build(tpl_rt *rt, tpl_dict *d) {
    size_t cap = 64;
    while (cap < d->cap * 2) cap *= 2;
    if (d->cap > UINT32_MAX / 2) return; /* stays linear */
    d->idx = tpl_rt_alloc(rt, cap * sizeof *d->idx);
    d->idx_cap = cap;
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == TV_STR) index_insert(d, i);
}

tpl_val *tpl_dict_gets(tpl_dict *d, const char *k, size_t n) {
    if (d->idx) {
        size_t mask = d->idx_cap - 1, i = (size_t)str_hash(k, n) & mask;
        for (; d->idx[i]; i = (i + 1) & mask) {
            const tpl_val *x = &d->k[d->idx[i] - 1];
            if (x->u.s.n == n && !memcmp(x->u.s.p, k, n)) return &d->v[d->idx[i] - 1];
        }
        return NULL;
    }
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == TV_STR && d->k[i].u.s.n == n && !memcmp(d->k[i].u.s.p, k, n)) return &d->v[i];
    return NULL;
}

tpl_val *tpl_dict_get(tpl_dict *d, tpl_val k) {
    if (k.t == TV_STR) return tpl_dict_gets(d, k.u.s.p, k.u.s.n);
    for (size_t i = 0; i < d->n; i++)
        if (key_eq(d->k[i], k)) return &d->v[i];
    return NULL;
}

void tpl_dict_set(tpl_rt *rt, tpl_dict *d, tpl_val k, tpl_val v) {
    tpl_val *slot = tpl_dict_get(d, k);
    if (slot) {
        *slot = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        if (cap > SIZE_MAX / sizeof(tpl_val)) tpl_rt_raise(rt, "dict too large");
        tpl_val *nk = tpl_rt_alloc(rt, cap * sizeof *nk), *nv = tpl_rt_alloc(rt, cap * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
        if (d->idx || cap >= 16) index_build(rt, d);
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    if (d->idx && k.t == TV_STR) index_insert(d, d->n - 1);
}

/* The render's view of the context: strings point into the json_t, which
 * the caller keeps alive and unchanged while rendering. */
tpl_val tpl_from_json(tpl_rt *rt, const json_t *j, int depth) {
    if (depth > TPL_MAX_DEPTH) tpl_rt_raise(rt, "context nested too deeply");
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        tpl_val d = tv_dict(rt, json_object_size(j));
        for (void *it = json_object_iter((json_t *)j); it; it = json_object_iter_next((json_t *)j, it)) {
            const char *k = json_object_iter_key(it);
            tpl_dict_set(rt, d.u.d, tv_strn(k, json_object_iter_key_len(it)),
                         tpl_from_json(rt, json_object_iter_value(it), depth + 1));
        }
        return d;
    }
    case JSON_ARRAY: {
        tpl_val l = tv_list(rt, json_array_size(j));
        for (size_t i = 0; i < json_array_size(j); i++)
            tpl_list_push(rt, l.u.l, tpl_from_json(rt, json_array_get(j, i), depth + 1));
        return l;
    }
    case JSON_STRING: return tv_strn(json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return tv_int(json_integer_value(j));
    case JSON_REAL: return tv_float(json_real_value(j));
    case JSON_TRUE: return tv_bool(true);
    case JSON_FALSE: return tv_bool(false);
    default: return tv_none();
    }
}

/* ---- Python semantics ---------------------------------------------------- */

const char *tpl_type_name(const tpl_val *v) {
    switch (v->t) {
    case TV_UNDEF: return "Undefined";
    case TV_NONE: return "NoneType";
    case TV_BOOL: return "bool";
    case TV_INT: return "int";
    case TV_FLOAT: return "float";
    case TV_STR: return (v->flags & TVF_MARKUP) ? "Markup" : "str";
    case TV_LIST:
        if (v->flags & TVF_GEN) return "generator";
        if (v->flags & TVF_ITEMS) return "dict_items";
        if (v->flags & TVF_KEYS) return "dict_keys";
        if (v->flags & TVF_VALUES) return "dict_values";
        return (v->flags & TVF_TUPLE) ? "tuple" : "list";
    case TV_DICT: return "dict";
    case TV_NS: return "Namespace";
    case TV_FUNC: return v->u.fn->kind == FN_MACRO ? "Macro" : "function";
    case TV_LOOP: return "LoopContext";
    }
    return "object";
}

/* Using an undefined value for anything but printing, testing or iterating
 * is jinja2's UndefinedError. */
void tpl_undef_fail(tpl_rt *rt, tpl_val v) {
    if (v.hint)
        tpl_rt_raise(rt, "'%s' has no attribute '%.*s'", v.hint, (int)LM_MIN(v.u.s.n, 200), v.u.s.p);
    if (v.u.s.p) tpl_rt_raise(rt, "'%.*s' is undefined", (int)LM_MIN(v.u.s.n, 200), v.u.s.p);
    tpl_rt_raise(rt, "undefined value");
}

bool tpl_truthy(tpl_rt *rt, tpl_val v) {
    switch (v.t) {
    case TV_UNDEF: case TV_NONE: return false;
    case TV_BOOL: return v.u.b;
    case TV_INT: return v.u.i != 0;
    case TV_FLOAT: return v.u.f != 0.0;
    case TV_STR: return v.u.s.n != 0;
    case TV_LIST: return v.u.l->n != 0 || (v.flags & TVF_GEN);
    case TV_DICT: return v.u.d->n != 0;
    default: return true;
    }
}

static bool is_num(tpl_val v) { return v.t == TV_BOOL || v.t == TV_INT || v.t == TV_FLOAT; }
static double num_f(tpl_val v) { return v.t == TV_FLOAT ? v.u.f : v.t == TV_INT ? (double)v.u.i : v.u.b; }
static int64_t num_i(tpl_val v) { return v.t == TV_INT ? v.u.i : v.u.b; }

bool tpl_eq(tpl_rt *rt, tpl_val a, tpl_val b) {
    if (is_num(a) && is_num(b)) {
        if (a.t == TV_FLOAT || b.t == TV_FLOAT) return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case TV_UNDEF: case TV_NONE: return true;
    case TV_STR: return a.u.s.n == b.u.s.n && !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
    case TV_LIST:
        if ((a.flags | b.flags) & TVF_GEN) return a.u.l == b.u.l;
        if ((a.flags & TVF_TUPLE) != (b.flags & TVF_TUPLE) || a.u.l->n != b.u.l->n) return false;
        if (a.u.l == b.u.l) return true;
        if (rt && ++rt->depth > TPL_MAX_DEPTH) tpl_rt_raise(rt, "values nested too deeply");
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!tpl_eq(rt, a.u.l->v[i], b.u.l->v[i])) {
                if (rt) rt->depth--;
                return false;
            }
        if (rt) rt->depth--;
        return true;
    case TV_DICT:
        if (a.u.d->n != b.u.d->n) return false;
        if (a.u.d == b.u.d) return true;
        if (rt && ++rt->depth > TPL_MAX_DEPTH) tpl_rt_raise(rt, "values nested too deeply");
        for (size_t i = 0; i < a.u.d->n; i++) {
            tpl_val *o = tpl_dict_get(b.u.d, a.u.d->k[i]);
            if (!o || !tpl_eq(rt, a.u.d->v[i], *o)) {
                if (rt) rt->depth--;
                return false;
            }
        }
        if (rt) rt->depth--;
        return true;
    case TV_NS: return a.u.d == b.u.d;
    case TV_FUNC: return a.u.fn == b.u.fn;
    case TV_LOOP: return a.u.loop == b.u.loop;
    default: return false;
    }
}

int tpl_cmp(tpl_rt *rt, tpl_val a, tpl_val b) {
    if (a.t == TV_UNDEF) tpl_undef_fail(rt, a);
    if (b.t == TV_UNDEF) tpl_undef_fail(rt, b);
    if (is_num(a) && is_num(b)) {
        if (a.t == TV_FLOAT || b.t == TV_FLOAT) {
            double x = num_f(a), y = num_f(b);
            return x < y ? -1 : x > y ? 1 : 0;
        }
        int64_t x = num_i(a), y = num_i(b);
        return x < y ? -1 : x > y;
    }
    if (a.t == TV_STR && b.t == TV_STR) {
        size_t n = LM_MIN(a.u.s.n, b.u.s.n);
        int c = n ? memcmp(a.u.s.p, b.u.s.p, n) : 0;
        if (c) return c;
        return a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n;
    }
    if (a.t == TV_LIST && b.t == TV_LIST && (a.flags & TVF_TUPLE) == (b.flags & TVF_TUPLE)) {
        if (++rt->depth > TPL_MAX_DEPTH) tpl_rt_raise(rt, "values nested too deeply");
        size_t n = LM_MIN(a.u.l->n, b.u.l->n);
        for (size_t i = 0; i < n; i++) {
            if (tpl_eq(rt, a.u.l->v[i], b.u.l->v[i])) continue;
            int c = tpl_cmp(rt, a.u.l->v[i], b.u.l->v[i]);
            rt->depth--;
            return c;
        }
        rt->depth--;
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    }
    tpl_rt_raise(rt, "'<' not supported between instances of '%s' and '%s'", tpl_type_name(&a),
                 tpl_type_name(&b));
}

int64_t tpl_len(tpl_rt *rt, tpl_val v) {
    switch (v.t) {
    case TV_UNDEF: return 0;
    case TV_STR: return (int64_t)tpl_utf8_len(v.u.s.p, v.u.s.n);
    case TV_LIST:
        if (v.flags & TVF_GEN) tpl_rt_raise(rt, "object of type 'generator' has no len()");
        return (int64_t)v.u.l->n;
    case TV_DICT: return (int64_t)v.u.d->n;
    case TV_LOOP: return (int64_t)v.u.loop->items->n;
    default: tpl_rt_raise(rt, "object of type '%s' has no len()", tpl_type_name(&v));
    }
}

tpl_list *tpl_iter_list(tpl_rt *rt, tpl_val v) {
    tpl_list *l;
    switch (v.t) {
    case TV_UNDEF: return tv_list(rt, 0).u.l;
    case TV_LIST:
        l = tv_list(rt, 0).u.l;
        l->v = v.u.l->v;
        l->n = l->cap = v.u.l->n;
        return l;
    case TV_DICT:
        l = tv_list(rt, v.u.d->n).u.l;
        if (v.u.d->n) memcpy(l->v, v.u.d->k, v.u.d->n * sizeof *l->v);
        l->n = v.u.d->n;
        return l;
    case TV_STR: {
        l = tv_list(rt, v.u.s.n).u.l;
        size_t i = 0;
        while (i < v.u.s.n) {
            size_t st = i;
            tpl_utf8_dec(v.u.s.p, v.u.s.n, &i);
            l->v[l->n++] = tv_strn(v.u.s.p + st, i - st);
        }
        return l;
    }
    case TV_LOOP: return tpl_iter_list(rt, (tpl_val){ .t = TV_LIST, .u.l = v.u.loop->items });
    default: tpl_rt_raise(rt, "'%s' object is not iterable", tpl_type_name(&v));
    }
}

/* ---- str() and repr() ---------------------------------------------------- */

/* Python's str.isprintable, approximated: control characters, separators
 * other than the space, format characters and private use are not. */
static bool cp_printable(uint32_t c) {
    if (c < 0x20 || c == 0x7F) return false;
    if (c < 0x7F) return true;
    if (c <= 0xA0 || c == 0xAD) return false;
    if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F)) return false;
    if ((c >= 0x205F && c <= 0x206F) || c == 0x3000 || c == 0xFEFF) return false;
    if ((c >= 0xD800 && c <= 0xF8FF) || (c >= 0xFFF0 && c <= 0xFFFB) || c >= 0xF0000) return false;
    if (c == 0xFFFE || c == 0xFFFF || (c >= 0xE0000 && c <= 0xE0FFF)) return false;
    return true;
}

static void repr_str(tpl_rt *rt, tpl_buf *b, tpl_str s) {
    bool sq = memchr(s.p, '\'', s.n) != NULL, dq = memchr(s.p, '"', s.n) != NULL;
    char q = (sq && !dq) ? '"' : '\'';
    tpl_buf_put(rt, b, &q, 1);
    size_t i = 0;
    while (i < s.n) {
        size_t st = i;
        uint32_t c = (uint32_t)tpl_utf8_dec(s.p, s.n, &i);
        if (c == (uint32_t)q || c == '\\') {
            char e[2] = { '\\', (char)c };
            tpl_buf_put(rt, b, e, 2);
        } else if (c == '\n') tpl_buf_put(rt, b, "\\n", 2);
        else if (c == '\r') tpl_buf_put(rt, b, "\\r", 2);
        else if (c == '\t') tpl_buf_put(rt, b, "\\t", 2);
        else if (!cp_printable(c)) {
            if (c < 0x100) tpl_buf_printf(rt, b, "\\x%02x", c);
            else if (c < 0x10000) tpl_buf_printf(rt, b, "\\u%04x", c);
            else tpl_buf_printf(rt, b, "\\U%08x", c);
        } else tpl_buf_put(rt, b, s.p + st, i - st);
    }
    tpl_buf_put(rt, b, &q, 1);
}

static void put_num(tpl_rt *rt, tpl_buf *b, tpl_val v) {
    char tmp[32];
    if (v.t == TV_INT) snprintf(tmp, sizeof tmp, "%lld", (long long)v.u.i);
    else tpl_float_repr(v.u.f, tmp);
    tpl_buf_puts(rt, b, tmp);
}

static void str_or_repr(tpl_rt *rt, tpl_buf *b, tpl_val v, bool repr) {
    switch (v.t) {
    case TV_UNDEF: if (repr) tpl_buf_puts(rt, b, "Undefined"); return;
    case TV_NONE: tpl_buf_puts(rt, b, "None"); return;
    case TV_BOOL: tpl_buf_puts(rt, b, v.u.b ? "True" : "False"); return;
    case TV_INT: case TV_FLOAT: put_num(rt, b, v); return;
    case TV_STR:
        if (!repr) tpl_buf_put(rt, b, v.u.s.p, v.u.s.n);
        else if (v.flags & TVF_MARKUP) {
            tpl_buf_puts(rt, b, "Markup(");
            repr_str(rt, b, tpl_sv(v));
            tpl_buf_puts(rt, b, ")");
        } else repr_str(rt, b, tpl_sv(v));
        return;
    default: break;
    }
    if (++rt->depth > TPL_MAX_DEPTH) tpl_rt_raise(rt, "values nested too deeply to print");
    if (v.t == TV_LIST && (v.flags & TVF_GEN)) {
        tpl_buf_puts(rt, b, "<generator object>");
    } else if (v.t == TV_LIST) {
        bool tup = v.flags & TVF_TUPLE;
        const char *view = (v.flags & TVF_ITEMS) ? "dict_items(" : (v.flags & TVF_KEYS) ? "dict_keys(" :
                           (v.flags & TVF_VALUES) ? "dict_values(" : NULL;
        if (view) tpl_buf_puts(rt, b, view);
        tpl_buf_puts(rt, b, tup ? "(" : "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) tpl_buf_puts(rt, b, ", ");
            str_or_repr(rt, b, v.u.l->v[i], true);
        }
        if (tup && v.u.l->n == 1) tpl_buf_puts(rt, b, ",");
        tpl_buf_puts(rt, b, tup ? ")" : "]");
        if (view) tpl_buf_puts(rt, b, ")");
    } else if (v.t == TV_DICT || v.t == TV_NS) {
        if (v.t == TV_NS) tpl_buf_puts(rt, b, "<Namespace ");
        tpl_buf_puts(rt, b, "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) tpl_buf_puts(rt, b, ", ");
            str_or_repr(rt, b, v.u.d->k[i], true);
            tpl_buf_puts(rt, b, ": ");
            str_or_repr(rt, b, v.u.d->v[i], true);
        }
        tpl_buf_puts(rt, b, v.t == TV_NS ? "}>" : "}");
    } else if (v.t == TV_FUNC) {
        if (v.u.fn->kind == FN_MACRO) {
            tpl_buf_puts(rt, b, "<Macro ");
            repr_str(rt, b, v.u.fn->name);
            tpl_buf_puts(rt, b, ">");
        } else {
            tpl_buf_printf(rt, b, "<function %.*s>", (int)LM_MIN(v.u.fn->name.n, 64), v.u.fn->name.p);
        }
    } else if (v.t == TV_LOOP) {
        tpl_buf_printf(rt, b, "<LoopContext %zu/%zu>", v.u.loop->index0 + 1, v.u.loop->items->n);
    }
    rt->depth--;
}

void tpl_str_of(tpl_rt *rt, tpl_buf *b, tpl_val v) { str_or_repr(rt, b, v, false); }
void tpl_repr_of(tpl_rt *rt, tpl_buf *b, tpl_val v) { str_or_repr(rt, b, v, true); }

tpl_val tpl_to_str(tpl_rt *rt, tpl_val v) {
    if (v.t == TV_STR) return v;
    if (v.t == TV_UNDEF) return tv_strn("", 0);
    tpl_buf b = { 0 };
    tpl_str_of(rt, &b, v);
    return tpl_buf_val(&b);
}

/* ---- Unicode ------------------------------------------------------------- */

int tpl_utf8_dec(const char *p, size_t n, size_t *i) {
    const unsigned char *s = (const unsigned char *)p;
    size_t k = *i;
    unsigned c = s[k];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || k + (size_t)len > n) {
        *i = k + 1;
        return 0xFFFD;
    }
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int j = 1; j < len; j++) {
        if ((s[k + j] & 0xC0) != 0x80) {
            *i = k + 1;
            return 0xFFFD;
        }
        cp = (cp << 6) | (s[k + j] & 0x3F);
    }
    *i = k + (size_t)len;
    return (int)cp;
}

int tpl_utf8_enc(uint32_t cp, char out[4]) {
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp > 0x10FFFF) cp = 0xFFFD;
    if (cp == 0xFFFD) return tpl_utf8_enc(cp, out);
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t tpl_utf8_len(const char *p, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)p[i] & 0xC0) != 0x80;
    return c;
}

bool tpl_utf8_valid(const char *p, size_t n, size_t *bad) {
    const unsigned char *s = (const unsigned char *)p;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        uint32_t min;
        if (c < 0x80) { i++; continue; }
        if ((c >> 5) == 6) { len = 2; min = 0x80; }
        else if ((c >> 4) == 14) { len = 3; min = 0x800; }
        else if ((c >> 3) == 30) { len = 4; min = 0x10000; }
        else goto fail;
        if (i + len > n) goto fail;
        uint32_t cp = c & (0x7F >> len);
        for (size_t j = 1; j < len; j++) {
            if ((s[i + j] & 0xC0) != 0x80) goto fail;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) goto fail;
        i += len;
        continue;
    fail:
        *bad = i;
        return false;
    }
    return true;
}

bool tpl_cp_space(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* Simple one-to-one case pairs for the scripts chat text most often uses. */
uint32_t tpl_cp_upper(uint32_t c) {
    if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
    if (c == 0xB5) return 0x39C;
    if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
    if (c == 0xFF) return 0x178;
    if (c >= 0x100 && c <= 0x17F) {
        if (c == 0x131) return 'I';
        if (c == 0x17F) return 'S';
        if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c : c - 1;
        if (c == 0x138 || c == 0x149) return c;
        return (c & 1) ? c - 1 : c;
    }
    if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
    if (c == 0x3C2) return 0x3A3;
    if (c >= 0x3AC && c <= 0x3AF) return c == 0x3AC ? 0x386 : c - 37;
    if (c == 0x3CC) return 0x38C;
    if (c == 0x3CD || c == 0x3CE) return c - 63;
    if (c >= 0x430 && c <= 0x44F) return c - 32;
    if (c >= 0x450 && c <= 0x45F) return c - 80;
    if (c >= 0x460 && c <= 0x4FF && c != 0x482 && !(c >= 0x483 && c <= 0x489)) {
        if (c >= 0x4C1 && c <= 0x4CE) return (c & 1) ? c : c - 1;
        if (c == 0x4CF) return 0x4C0;
        return (c & 1) ? c - 1 : c;
    }
    if (c >= 0xFF41 && c <= 0xFF5A) return c - 32;
    return c;
}

uint32_t tpl_cp_lower(uint32_t c) {
    if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
    if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
    if (c == 0x178) return 0xFF;
    if (c >= 0x100 && c <= 0x17F) {
        if (c == 0x130) return 'i';
        if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c + 1 : c;
        if (c == 0x131 || c == 0x138 || c == 0x149 || c == 0x17F) return c;
        return (c & 1) ? c : c + 1;
    }
    if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
    if (c == 0x386) return 0x3AC;
    if (c >= 0x388 && c <= 0x38A) return c + 37;
    if (c == 0x38C) return 0x3CC;
    if (c == 0x38E || c == 0x38F) return c + 63;
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    if (c >= 0x460 && c <= 0x4FF && c != 0x482 && !(c >= 0x483 && c <= 0x489)) {
        if (c >= 0x4C1 && c <= 0x4CE) return (c & 1) ? c + 1 : c;
        if (c == 0x4C0) return 0x4CF;
        return (c & 1) ? c : c + 1;
    }
    if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;
    return c;
}

bool tpl_cp_cased(uint32_t c) { return tpl_cp_upper(c) != c || tpl_cp_lower(c) != c || c == 0xDF; }

bool tpl_cp_alpha(uint32_t c) {
    if (c < 0x80) return (c | 32) >= 'a' && (c | 32) <= 'z';
    if (tpl_cp_cased(c)) return true;
    /* letters without case: CJK, kana, hangul, Arabic, Hebrew, Indic ... */
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3040 && c <= 0x30FF && c != 0x30FB) ||
           (c >= 0xAC00 && c <= 0xD7A3) || (c >= 0x5D0 && c <= 0x5EA) || (c >= 0x620 && c <= 0x64A) ||
           (c >= 0x904 && c <= 0x939) || c == 0xAA || c == 0xBA || c == 0xDF;
}

bool tpl_cp_digit(uint32_t c) { return (c >= '0' && c <= '9') || (c >= 0x660 && c <= 0x669) || (c >= 0xFF10 && c <= 0xFF19); }

static bool in_chars(uint32_t c, const tpl_str *chars) {
    size_t i = 0;
    while (i < chars->n)
        if ((uint32_t)tpl_utf8_dec(chars->p, chars->n, &i) == c) return true;
    return false;
}

tpl_str tpl_strip(tpl_str s, const tpl_str *chars, bool left, bool right) {
    size_t a = 0, b = s.n;
    if (left) {
        while (a < b) {
            size_t i = a;
            uint32_t c = (uint32_t)tpl_utf8_dec(s.p, b, &i);
            if (chars ? !in_chars(c, chars) : !tpl_cp_space(c)) break;
            a = i;
        }
    }
    if (right) {
        while (b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)s.p[st] & 0xC0) == 0x80) st--;
            size_t i = st;
            uint32_t c = (uint32_t)tpl_utf8_dec(s.p, b, &i);
            if (chars ? !in_chars(c, chars) : !tpl_cp_space(c)) break;
            b = st;
        }
    }
    return (tpl_str){ s.p + a, b - a };
}

/* mode: 0 lower, 1 upper, 2 str.title, 3 str.capitalize, 4 swapcase */
tpl_val tpl_case_map(tpl_rt *rt, tpl_str s, int mode) {
    tpl_buf b = { 0 };
    size_t i = 0;
    bool prev_cased = false, first = true;
    while (i < s.n) {
        uint32_t c = (uint32_t)tpl_utf8_dec(s.p, s.n, &i), o;
        switch (mode) {
        case 0: o = tpl_cp_lower(c); break;
        case 1: o = tpl_cp_upper(c); break;
        case 2: o = prev_cased ? tpl_cp_lower(c) : tpl_cp_upper(c); break;
        case 3: o = first ? tpl_cp_upper(c) : tpl_cp_lower(c); break;
        default: o = tpl_cp_upper(c) != c ? tpl_cp_upper(c) : tpl_cp_lower(c); break;
        }
        bool word_start = mode == 2 ? !prev_cased : first;
        if (mode == 2) prev_cased = tpl_cp_cased(c);
        first = false;
        char e[4];
        if (c == 0xDF && (mode == 1 || mode == 4 || ((mode == 2 || mode == 3) && word_start))) {
            tpl_buf_put(rt, &b, mode == 1 || mode == 4 ? "SS" : "Ss", 2);
            continue;
        }
        tpl_buf_put(rt, &b, e, (size_t)tpl_utf8_enc(o, e));
    }
    return tpl_buf_val(&b);
}
