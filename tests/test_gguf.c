/* test_gguf.c - the GGUF parser on the llama fixture and on files built here.
 *
 * A tiny in-memory builder writes a small valid GGUF (every scalar type,
 * string / numeric / nested arrays, tensors of supported and unsupported
 * types) and records where interesting fields are, so each malformed case is
 * "build valid, patch one field, expect a clean one-line error". Buffers are
 * handed to the parser in exact-size heap copies so ASan catches any read
 * past the end. */
#include "lm_test.h"

#include "format/gguf.h"

#include <stdlib.h>
#include <string.h>

/* ---- builder ----------------------------------------------------------------- */

typedef struct gb {
    uint8_t *p;
    size_t n, cap;
} gb;

static void gb_bytes(gb *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void gb_u8(gb *b, uint8_t v) { gb_bytes(b, &v, 1); }

static void gb_uint(gb *b, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) gb_u8(b, (uint8_t)(v >> (8 * i)));
}

static void gb_u32(gb *b, uint32_t v) { gb_uint(b, v, 4); }
static void gb_u64(gb *b, uint64_t v) { gb_uint(b, v, 8); }

static void gb_str(gb *b, const char *s) {
    gb_u64(b, strlen(s));
    gb_bytes(b, s, strlen(s));
}

static void gb_f32(gb *b, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    gb_u32(b, u);
}

static void gb_pad(gb *b, size_t align) {
    while (b->n % align) gb_u8(b, 0);
}

static void put_u64_at(gb *b, size_t pos, uint64_t v) {
    for (int i = 0; i < 8; i++) b->p[pos + (size_t)i] = (uint8_t)(v >> (8 * i));
}

static void put_u32_at(gb *b, size_t pos, uint32_t v) {
    for (int i = 0; i < 4; i++) b->p[pos + (size_t)i] = (uint8_t)(v >> (8 * i));
}

/* Options for the small file; zero means default. */
typedef struct spec {
    uint32_t version;      /* default 3 */
    uint64_t alignment;    /* 0: no general.alignment key (32 used) */
    lm_gguf_type align_type; /* type of general.alignment when present (0 = u8 -> use u32) */
    int nest_depth;        /* >0: add a key holding arrays nested this deep */
    bool dup_tensor, dup_key;
} spec;

#define N_T 4

/* The built file and where its fields are. */
typedef struct built {
    gb b;
    size_t pos_version, pos_n_tensors, pos_n_kv;
    size_t pos_key0_len, pos_align_val, pos_strs_count, pos_ints_count, pos_nested_count;
    size_t pos_ndims[N_T], pos_ne[N_T], pos_type[N_T], pos_offset[N_T];
    size_t data_start;
    uint32_t alignment;
} built;

static void kv_scalar(gb *b, const char *key, lm_gguf_type t, uint64_t bits, int bytes) {
    gb_str(b, key);
    gb_u32(b, t);
    gb_uint(b, bits, bytes);
}

/* Writes the type, count and elements of arrays nested depth deep: [[[1, 2]]] */
static void nested(gb *b, int depth, built *out) {
    if (depth == 0) {
        gb_u32(b, LM_GGUF_U16);
        gb_u64(b, 2);
        gb_uint(b, 1, 2);
        gb_uint(b, 2, 2);
        return;
    }
    gb_u32(b, LM_GGUF_ARRAY);
    if (out) out->pos_nested_count = b->n;
    gb_u64(b, 1); /* one element, itself an array */
    nested(b, depth - 1, NULL);
}

static int n_kvs(const spec *s) { return 17 + (s->alignment != 0) + (s->nest_depth > 0) + s->dup_key; }

static void write_kvs(built *o, const spec *s) {
    gb *b = &o->b;
    o->pos_key0_len = b->n;
    gb_str(b, "general.architecture");
    gb_u32(b, LM_GGUF_STRING);
    gb_str(b, "llama");
    kv_scalar(b, "t.u8", LM_GGUF_U8, 200, 1);
    kv_scalar(b, "t.i8", LM_GGUF_I8, (uint8_t)-5, 1);
    kv_scalar(b, "t.u16", LM_GGUF_U16, 60000, 2);
    kv_scalar(b, "t.i16", LM_GGUF_I16, (uint16_t)-300, 2);
    kv_scalar(b, "t.u32", LM_GGUF_U32, 4000000000u, 4);
    kv_scalar(b, "t.i32", LM_GGUF_I32, (uint32_t)-70000, 4);
    kv_scalar(b, "t.u64", LM_GGUF_U64, 1ull << 40, 8);
    kv_scalar(b, "t.i64", LM_GGUF_I64, (uint64_t)-(1ll << 40), 8);
    kv_scalar(b, "t.big", LM_GGUF_U64, (1ull << 63) + 1, 8);
    kv_scalar(b, "t.bool", LM_GGUF_BOOL, 1, 1);
    gb_str(b, "t.f32");
    gb_u32(b, LM_GGUF_F32);
    gb_f32(b, 1.5f);
    double f64 = -0.25;
    uint64_t u64;
    memcpy(&u64, &f64, 8);
    kv_scalar(b, "t.f64", LM_GGUF_F64, u64, 8);
    gb_str(b, "t.strs");
    gb_u32(b, LM_GGUF_ARRAY);
    gb_u32(b, LM_GGUF_STRING);
    o->pos_strs_count = b->n;
    gb_u64(b, 3);
    gb_str(b, "a");
    gb_str(b, "bc");
    gb_str(b, "");
    gb_str(b, "t.ints");
    gb_u32(b, LM_GGUF_ARRAY);
    gb_u32(b, LM_GGUF_I32);
    o->pos_ints_count = b->n;
    gb_u64(b, 3);
    gb_u32(b, 1);
    gb_u32(b, (uint32_t)-2);
    gb_u32(b, 3);
    gb_str(b, "t.empty");
    gb_u32(b, LM_GGUF_ARRAY);
    gb_u32(b, LM_GGUF_STRING);
    gb_u64(b, 0);
    if (s->nest_depth > 0) {
        gb_str(b, "t.nested");
        gb_u32(b, LM_GGUF_ARRAY);
        nested(b, s->nest_depth - 1, o);
    }
    if (s->dup_key) kv_scalar(b, "t.u8", LM_GGUF_U8, 1, 1);
    if (s->alignment) {
        lm_gguf_type t = s->align_type ? s->align_type : LM_GGUF_U32;
        gb_str(b, "general.alignment");
        gb_u32(b, t);
        o->pos_align_val = b->n;
        if (t == LM_GGUF_F32) gb_f32(b, (float)s->alignment);
        else gb_uint(b, s->alignment, t == LM_GGUF_U64 ? 8 : 4);
    }
    gb_str(b, "t.last");
    gb_u32(b, LM_GGUF_STRING);
    gb_str(b, "end");
}

/* Tensors: a F32 ne[4,2] (shape {2,4}), b Q8_0 ne[32], c Q4_K ne[256,1],
 * d IQ3_S ne[256] (a type lumen does not compute with). */
static const struct {
    const char *name;
    uint32_t type, n_dims;
    uint64_t ne[2];
    size_t nbytes;
} tinfo[N_T] = {
    { "a", 0, 2, { 4, 2 }, 32 },
    { "b", 8, 1, { 32, 0 }, 34 },
    { "c", 12, 2, { 256, 1 }, 144 },
    { "d", 21, 1, { 256, 0 }, 110 },
};

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

static built build(const spec *s) {
    built o;
    memset(&o, 0, sizeof o);
    gb *b = &o.b;
    o.alignment = s->alignment && s->alignment <= 4096 && !(s->alignment & (s->alignment - 1))
                      ? (uint32_t)s->alignment : 32;
    gb_bytes(b, "GGUF", 4);
    o.pos_version = b->n;
    gb_u32(b, s->version ? s->version : 3);
    o.pos_n_tensors = b->n;
    gb_u64(b, N_T);
    o.pos_n_kv = b->n;
    gb_u64(b, (uint64_t)n_kvs(s));
    write_kvs(&o, s);
    size_t off = 0;
    for (int i = 0; i < N_T; i++) {
        gb_str(b, s->dup_tensor && i == 2 ? tinfo[0].name : tinfo[i].name);
        o.pos_ndims[i] = b->n;
        gb_u32(b, tinfo[i].n_dims);
        o.pos_ne[i] = b->n;
        for (uint32_t d = 0; d < tinfo[i].n_dims; d++) gb_u64(b, tinfo[i].ne[d]);
        o.pos_type[i] = b->n;
        gb_u32(b, tinfo[i].type);
        o.pos_offset[i] = b->n;
        gb_u64(b, off);
        off = align_up(off + tinfo[i].nbytes, o.alignment);
    }
    gb_pad(b, o.alignment);
    o.data_start = b->n;
    for (int i = 0; i < N_T; i++) {
        for (size_t k = 0; k < tinfo[i].nbytes; k++) {
            uint8_t v = (uint8_t)(k * 7 + (size_t)i);
            if (i == 0) v = 0; /* "a" gets real floats below */
            gb_u8(b, v);
        }
        if (i + 1 < N_T) gb_pad(b, o.alignment);
    }
    for (int k = 0; k < 8; k++) {
        float f = (float)k - 3.5f;
        memcpy(b->p + o.data_start + 4 * (size_t)k, &f, 4);
    }
    /* b: Q8_0 with d = 1 and q = j - 16 */
    uint8_t *q8 = b->p + o.data_start + align_up(32, o.alignment);
    q8[0] = 0x00, q8[1] = 0x3c;
    for (int j = 0; j < 32; j++) q8[2 + j] = (uint8_t)(int8_t)(j - 16);
    return o;
}

/* Parses an exact-size heap copy of data[0..n); returns rc, fills g / e. */
static int parse_copy(lm_gguf *g, const uint8_t *data, size_t n, lm_err *e, uint8_t **copy) {
    *copy = malloc(n ? n : 1);
    if (n) memcpy(*copy, data, n);
    e->msg[0] = 0;
    return lm_gguf_parse(g, *copy, n, "mem.gguf", e);
}

/* One line, starting with the label. */
static bool good_error(const lm_err *e) {
    return strncmp(e->msg, "mem.gguf: ", 10) == 0 && strlen(e->msg) > 10 && !strchr(e->msg, '\n');
}

/* Expects parsing o to fail with an error containing want. */
static bool expect_fail(built *o, const char *want) {
    lm_gguf g;
    lm_err e;
    uint8_t *copy;
    int rc = parse_copy(&g, o->b.p, o->b.n, &e, &copy);
    bool ok = rc == -1 && good_error(&e) && (!want || strstr(e.msg, want));
    if (!ok) fprintf(stderr, "  rc=%d error=\"%s\" (wanted \"%s\")\n", rc, e.msg, want ? want : "");
    if (rc == 0) lm_gguf_close(&g);
    free(copy);
    free(o->b.p);
    return ok;
}

/* ---- valid files ---------------------------------------------------------------- */

static void check_valid(lm_test_ctx *lm_t_, const spec *s) {
    built o = build(s);
    lm_gguf g;
    lm_err e;
    uint8_t *copy;
    int rc = parse_copy(&g, o.b.p, o.b.n, &e, &copy);
    LM_CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc != 0) {
        free(copy);
        free(o.b.p);
        return;
    }
    LM_CHECK(g.version == (s->version ? s->version : 3));
    LM_CHECK(g.alignment == o.alignment);
    LM_CHECK(g.n_kv == n_kvs(s));
    int64_t i;
    double f;
    bool bl;
    LM_CHECK(lm_gguf_get_int(&g, "t.u8", &i) && i == 200);
    LM_CHECK(lm_gguf_get_int(&g, "t.i8", &i) && i == -5);
    LM_CHECK(lm_gguf_get_int(&g, "t.u16", &i) && i == 60000);
    LM_CHECK(lm_gguf_get_int(&g, "t.i16", &i) && i == -300);
    LM_CHECK(lm_gguf_get_int(&g, "t.u32", &i) && i == 4000000000ll);
    LM_CHECK(lm_gguf_get_int(&g, "t.i32", &i) && i == -70000);
    LM_CHECK(lm_gguf_get_int(&g, "t.u64", &i) && i == 1ll << 40);
    LM_CHECK(lm_gguf_get_int(&g, "t.i64", &i) && i == -(1ll << 40));
    LM_CHECK(!lm_gguf_get_int(&g, "t.big", &i));   /* above INT64_MAX */
    LM_CHECK(!lm_gguf_get_int(&g, "t.f32", &i));   /* wrong type */
    LM_CHECK(!lm_gguf_get_int(&g, "t.bool", &i));
    LM_CHECK(!lm_gguf_get_int(&g, "missing", &i));
    LM_CHECK(lm_gguf_get_float(&g, "t.f32", &f) && f == 1.5);
    LM_CHECK(lm_gguf_get_float(&g, "t.f64", &f) && f == -0.25);
    LM_CHECK(!lm_gguf_get_float(&g, "t.u8", &f));
    LM_CHECK(lm_gguf_get_bool(&g, "t.bool", &bl) && bl);
    LM_CHECK(!lm_gguf_get_bool(&g, "t.u8", &bl));
    char *str = lm_gguf_get_str(&g, "general.architecture");
    LM_CHECK(str && strcmp(str, "llama") == 0);
    free(str);
    str = lm_gguf_get_str(&g, "t.last");
    LM_CHECK(str && strcmp(str, "end") == 0);
    free(str);
    LM_CHECK(lm_gguf_get_str(&g, "t.u8") == NULL && lm_gguf_get_str(&g, "nope") == NULL);

    const lm_gguf_kv *kv = lm_gguf_find_kv(&g, "t.strs");
    LM_REQUIRE(kv && kv->type == LM_GGUF_ARRAY && kv->arr_type == LM_GGUF_STRING && kv->arr_count == 3);
    lm_gguf_str s1 = lm_gguf_arr_str(kv, 1), s2 = lm_gguf_arr_str(kv, 2);
    LM_CHECK(s1.len == 2 && memcmp(s1.ptr, "bc", 2) == 0 && s2.len == 0);
    LM_CHECK(!lm_gguf_arr_int(kv, 0, &i));
    kv = lm_gguf_find_kv(&g, "t.ints");
    LM_REQUIRE(kv && kv->arr_type == LM_GGUF_I32 && kv->arr_count == 3);
    LM_CHECK(lm_gguf_arr_int(kv, 1, &i) && i == -2);
    LM_CHECK(lm_gguf_arr_int(kv, 2, &i) && i == 3);
    LM_CHECK(!lm_gguf_arr_float(kv, 0, &f));
    kv = lm_gguf_find_kv(&g, "t.empty");
    LM_CHECK(kv && kv->arr_count == 0 && kv->arr_strs == NULL);
    if (s->nest_depth > 0) {
        kv = lm_gguf_find_kv(&g, "t.nested");
        LM_CHECK(kv && kv->type == LM_GGUF_ARRAY && kv->arr_type == (s->nest_depth > 1 ? LM_GGUF_ARRAY : LM_GGUF_U16));
    }

    LM_REQUIRE(g.n_tensors == N_T);
    const lm_file_tensor *t = lm_gguf_find_tensor(&g, "a");
    LM_REQUIRE(t);
    LM_CHECK(t->type == LM_F32 && strcmp(t->type_name, "F32") == 0 && t->n_dims == 2);
    LM_CHECK(t->shape[0] == 2 && t->shape[1] == 4 && lm_file_tensor_numel(t) == 8 && t->nbytes == 32);
    LM_CHECK(t->data == copy + o.data_start);
    float row[32];
    lm_dequant_row(t->type, t->data + 4 * 4, row, 4);
    LM_CHECK(row[0] == 0.5f && row[3] == 3.5f);
    t = lm_gguf_find_tensor(&g, "b");
    LM_REQUIRE(t);
    LM_CHECK(t->type == LM_Q8_0 && t->n_dims == 1 && t->shape[0] == 32 && t->nbytes == 34);
    LM_CHECK((size_t)(t->data - copy - o.data_start) % o.alignment == 0);
    lm_dequant_row(t->type, t->data, row, 32);
    LM_CHECK(row[0] == -16.0f && row[31] == 15.0f);
    t = lm_gguf_find_tensor(&g, "c");
    LM_CHECK(t && t->type == LM_Q4_K && t->n_dims == 2 && t->shape[0] == 1 && t->shape[1] == 256 && t->nbytes == 144);
    t = lm_gguf_find_tensor(&g, "d");
    LM_CHECK(t && t->type == LM_DTYPE_COUNT && strcmp(t->type_name, "IQ3_S") == 0 && t->nbytes == 110);
    LM_CHECK(t && t->data + t->nbytes == copy + o.b.n); /* last tensor ends the file */
    LM_CHECK(lm_gguf_find_tensor(&g, "e") == NULL);
    lm_gguf_close(&g);
    free(copy);
    free(o.b.p);
}

LM_TEST(gguf_valid_v3) { check_valid(lm_t_, &(spec){ .version = 3 }); }
LM_TEST(gguf_valid_v2) { check_valid(lm_t_, &(spec){ .version = 2 }); }
LM_TEST(gguf_valid_alignment_64) { check_valid(lm_t_, &(spec){ .alignment = 64 }); }
LM_TEST(gguf_valid_alignment_u64_key) {
    check_valid(lm_t_, &(spec){ .alignment = 16, .align_type = LM_GGUF_U64 });
}
LM_TEST(gguf_valid_alignment_1) { check_valid(lm_t_, &(spec){ .alignment = 1 }); }
LM_TEST(gguf_valid_nested_arrays) {
    check_valid(lm_t_, &(spec){ .nest_depth = 1 });
    check_valid(lm_t_, &(spec){ .nest_depth = 3 });
}

LM_TEST(gguf_open_file) {
    built o = build(&(spec){ 0 });
    char *path = lm_path_join(lm_test_tmpdir(), "small.gguf");
    FILE *f = fopen(path, "wb");
    LM_REQUIRE(f);
    LM_CHECK(fwrite(o.b.p, 1, o.b.n, f) == o.b.n);
    fclose(f);
    lm_gguf g;
    lm_err e;
    LM_CHECK_MSG(lm_gguf_open(&g, path, &e) == 0, "%s", e.msg);
    LM_CHECK(g.n_tensors == N_T && g.file.size == o.b.n);
    lm_gguf_close(&g);
    LM_CHECK(lm_gguf_open(&g, "/nonexistent/x.gguf", &e) == -1 && strstr(e.msg, "/nonexistent/x.gguf"));
    /* an empty file */
    f = fopen(path, "wb");
    LM_REQUIRE(f);
    fclose(f);
    LM_CHECK(lm_gguf_open(&g, path, &e) == -1 && strncmp(e.msg, path, strlen(path)) == 0);
    free(path);
    free(o.b.p);
}

/* ---- malformed files -------------------------------------------------------------- */

/* Every proper prefix of a valid file fails cleanly (the last tensor ends
 * the file, so even a one-byte cut must be detected). */
LM_TEST(gguf_truncated_every_offset) {
    built o = build(&(spec){ .alignment = 16, .nest_depth = 2 });
    int bad = 0;
    for (size_t n = 0; n < o.b.n; n++) {
        lm_gguf g;
        lm_err e;
        uint8_t *copy;
        int rc = parse_copy(&g, o.b.p, n, &e, &copy);
        if (rc != -1 || !good_error(&e)) {
            if (bad++ < 3) fprintf(stderr, "  prefix %zu: rc=%d \"%s\"\n", n, rc, e.msg);
            if (rc == 0) lm_gguf_close(&g);
        }
        free(copy);
    }
    LM_CHECK(bad == 0);
    free(o.b.p);
}

LM_TEST(gguf_bad_magic_and_version) {
    built o = build(&(spec){ 0 });
    o.b.p[0] = 'X';
    LM_CHECK(expect_fail(&o, "magic"));
    o = build(&(spec){ 0 });
    put_u32_at(&o.b, o.pos_version, 1);
    LM_CHECK(expect_fail(&o, "version 1"));
    o = build(&(spec){ 0 });
    put_u32_at(&o.b, o.pos_version, 4);
    LM_CHECK(expect_fail(&o, "version 4"));
    o = build(&(spec){ 0 });
    put_u32_at(&o.b, o.pos_version, 0x03000000u);
    LM_CHECK(expect_fail(&o, "big-endian"));
    o = build(&(spec){ 0 });
    put_u32_at(&o.b, o.pos_version, 0);
    LM_CHECK(expect_fail(&o, "version 0"));
}

LM_TEST(gguf_tensor_offset_outside_file) {
    built o = build(&(spec){ 0 });
    put_u64_at(&o.b, o.pos_offset[3], 1ull << 20);
    LM_CHECK(expect_fail(&o, "outside the file"));
    o = build(&(spec){ 0 });
    put_u64_at(&o.b, o.pos_offset[0], 0xffffffffffffffe0ull); /* begin overflows */
    LM_CHECK(expect_fail(&o, "outside the file"));
    /* begins inside, ends one alignment unit past the end */
    o = build(&(spec){ 0 });
    uint64_t off = o.b.n - o.data_start - 110 + 32;
    put_u64_at(&o.b, o.pos_offset[3], off);
    LM_CHECK(expect_fail(&o, "outside the file"));
}

LM_TEST(gguf_tensor_offset_misaligned) {
    built o = build(&(spec){ 0 });
    put_u64_at(&o.b, o.pos_offset[1], 36);
    LM_CHECK(expect_fail(&o, "alignment"));
    o = build(&(spec){ .alignment = 64 });
    put_u64_at(&o.b, o.pos_offset[1], 32); /* aligned to 32, not to 64 */
    LM_CHECK(expect_fail(&o, "not a multiple of the alignment 64"));
}

LM_TEST(gguf_bad_alignment_value) {
    static const uint64_t bad[] = { 0, 3, 48, 1ull << 31, 0xffffffffu };
    for (size_t k = 0; k < LM_COUNT(bad); k++) {
        built o = build(&(spec){ .alignment = bad[k] ? bad[k] : 1 });
        if (!bad[k]) put_u32_at(&o.b, o.pos_align_val, 0); /* the builder omits the key for 0 */
        LM_CHECK_MSG(expect_fail(&o, "general.alignment"), "alignment %llu", (unsigned long long)bad[k]);
    }
    built o = build(&(spec){ .alignment = 32, .align_type = LM_GGUF_F32 });
    LM_CHECK(expect_fail(&o, "not an integer"));
}

LM_TEST(gguf_huge_counts) {
    built o = build(&(spec){ 0 });
    put_u64_at(&o.b, o.pos_n_tensors, UINT64_MAX);
    LM_CHECK(expect_fail(&o, "tensor count"));
    o = build(&(spec){ 0 });
    put_u64_at(&o.b, o.pos_n_kv, 1ull << 62);
    LM_CHECK(expect_fail(&o, "metadata count"));
    o = build(&(spec){ 0 });
    put_u64_at(&o.b, o.pos_n_tensors, 1000); /* plausible-looking but too many */
    LM_CHECK(expect_fail(&o, NULL));
    o = build(&(spec){ 0 });
    put_u64_at(&o.b, o.pos_strs_count, UINT64_MAX);
    LM_CHECK(expect_fail(&o, "does not fit"));
    o = build(&(spec){ 0 });
    put_u64_at(&o.b, o.pos_ints_count, 1ull << 62); /* count * 4 overflows 64 bits */
    LM_CHECK(expect_fail(&o, "does not fit"));
    o = build(&(spec){ .nest_depth = 2 });
    put_u64_at(&o.b, o.pos_nested_count, UINT64_MAX);
    LM_CHECK(expect_fail(&o, "does not fit"));
    o = build(&(spec){ 0 });
    put_u64_at(&o.b, o.pos_key0_len, UINT64_MAX);
    LM_CHECK(expect_fail(&o, "length"));
    o = build(&(spec){ 0 });
    put_u64_at(&o.b, o.pos_ne[0], 1ull << 62); /* 2^62 x 2 x 4 bytes */
    LM_CHECK(expect_fail(&o, "overflow"));
    o = build(&(spec){ 0 });
    put_u64_at(&o.b, o.pos_ne[0], 1ull << 32);
    put_u64_at(&o.b, o.pos_ne[0] + 8, 1ull << 32); /* numel 2^64 */
    LM_CHECK(expect_fail(&o, "overflow"));
    o = build(&(spec){ 0 });
    put_u64_at(&o.b, o.pos_ne[0], UINT64_MAX); /* negative as int64 */
    LM_CHECK(expect_fail(&o, "overflow"));
    o = build(&(spec){ 0 });
    put_u64_at(&o.b, o.pos_ne[0], 1ull << 20); /* fine arithmetic, data past the end */
    LM_CHECK(expect_fail(&o, "outside the file"));
}

LM_TEST(gguf_bad_tensor_info) {
    built o = build(&(spec){ 0 });
    put_u32_at(&o.b, o.pos_ndims[1], 0);
    LM_CHECK(expect_fail(&o, "dimensions"));
    o = build(&(spec){ 0 });
    put_u32_at(&o.b, o.pos_ndims[1], 5);
    LM_CHECK(expect_fail(&o, "dimensions"));
    o = build(&(spec){ 0 });
    put_u32_at(&o.b, o.pos_type[0], 4); /* a removed ggml type */
    LM_CHECK(expect_fail(&o, "unknown ggml type 4"));
    o = build(&(spec){ 0 });
    put_u32_at(&o.b, o.pos_type[0], 1000);
    LM_CHECK(expect_fail(&o, "unknown ggml type 1000"));
    o = build(&(spec){ 0 });
    put_u64_at(&o.b, o.pos_ne[1], 33); /* Q8_0 row not a whole number of blocks */
    LM_CHECK(expect_fail(&o, "block"));
    o = build(&(spec){ .dup_tensor = true });
    LM_CHECK(expect_fail(&o, "duplicate tensor name \"a\""));
    o = build(&(spec){ .dup_key = true });
    LM_CHECK(expect_fail(&o, "duplicate metadata key \"t.u8\""));
}

LM_TEST(gguf_bad_metadata) {
    built o = build(&(spec){ .nest_depth = 40 });
    LM_CHECK(expect_fail(&o, "nested"));
    /* unknown value type: the type of general.architecture */
    o = build(&(spec){ 0 });
    put_u32_at(&o.b, o.pos_key0_len + 8 + strlen("general.architecture"), 13);
    LM_CHECK(expect_fail(&o, "unknown value type 13"));
    /* unknown array element type */
    o = build(&(spec){ 0 });
    put_u32_at(&o.b, o.pos_ints_count - 4, 99);
    LM_CHECK(expect_fail(&o, "unknown value type 99"));
    /* a NUL inside a key; the message stays printable */
    o = build(&(spec){ 0 });
    o.b.p[o.pos_key0_len + 8 + 3] = 0;
    LM_CHECK(expect_fail(&o, "NUL"));
    o = build(&(spec){ 0 });
    o.b.p[o.pos_key0_len + 8 + 3] = '\n';
    o.b.p[o.pos_key0_len + 8 + 4] = 0;
    LM_CHECK(expect_fail(&o, "gen??al"));
    /* a control character in a key that later fails (found by fuzzing) */
    o = build(&(spec){ 0 });
    o.b.p[o.pos_key0_len + 8 + 3] = '\n';
    put_u32_at(&o.b, o.pos_key0_len + 8 + strlen("general.architecture"), 13);
    LM_CHECK(expect_fail(&o, "key \"gen?ral.architecture\": unknown value type 13"));
}

/* Random byte corruption: never a crash, and whenever the parse succeeds
 * every tensor lies inside the buffer. */
LM_TEST(gguf_random_corruption) {
    built o = build(&(spec){ .nest_depth = 2 });
    uint64_t seed = 12345;
    int inside_bad = 0;
    for (int it = 0; it < 3000; it++) {
        uint8_t *m = malloc(o.b.n);
        memcpy(m, o.b.p, o.b.n);
        int flips = 1 + it % 4;
        for (int k = 0; k < flips; k++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (size_t)(seed >> 33) % o.b.n;
            m[pos] = (uint8_t)(seed >> 13);
        }
        lm_gguf g;
        lm_err e;
        if (lm_gguf_parse(&g, m, o.b.n, "mem.gguf", &e) == 0) {
            for (int i = 0; i < g.n_tensors; i++) {
                const lm_file_tensor *t = &g.tensors[i];
                inside_bad += !(t->data >= m && t->data + t->nbytes <= m + o.b.n);
            }
            lm_gguf_close(&g);
        } else {
            inside_bad += !good_error(&e);
        }
        free(m);
    }
    LM_CHECK(inside_bad == 0);
    free(o.b.p);
}

/* ---- the llama fixture ------------------------------------------------------------- */

LM_TEST(gguf_fixture_llama_tiny) {
    char *path = lm_test_fixture_path("models/llama-2-tiny-random.gguf");
    if (!path || !lm_file_exists(path)) {
        free(path);
        LM_SKIP("fixture models/llama-2-tiny-random.gguf not found (../shared/fixtures or LUMEN_FIXTURES)");
    }
    lm_gguf g;
    lm_err e;
    int rc = lm_gguf_open(&g, path, &e);
    free(path);
    LM_REQUIRE(rc == 0);
    LM_CHECK(g.version == 2 || g.version == 3);
    char *arch = lm_gguf_get_str(&g, "general.architecture");
    LM_CHECK(arch && strcmp(arch, "llama") == 0);
    free(arch);
    int64_t v;
    double f;
    LM_CHECK(lm_gguf_get_int(&g, "llama.block_count", &v) && v == 1);
    LM_CHECK(lm_gguf_get_int(&g, "llama.embedding_length", &v) && v == 8);
    LM_CHECK(lm_gguf_get_int(&g, "llama.feed_forward_length", &v) && v == 32);
    LM_CHECK(lm_gguf_get_int(&g, "llama.attention.head_count", &v) && v == 2);
    LM_CHECK(lm_gguf_get_int(&g, "llama.attention.head_count_kv", &v) && v == 2);
    LM_CHECK(lm_gguf_get_int(&g, "llama.context_length", &v) && v == 4096);
    LM_CHECK(lm_gguf_get_int(&g, "llama.rope.dimension_count", &v) && v == 4);
    LM_CHECK(lm_gguf_get_float(&g, "llama.attention.layer_norm_rms_epsilon", &f) && fabs(f - 1e-5) < 1e-9);
    LM_CHECK(lm_gguf_get_int(&g, "tokenizer.ggml.bos_token_id", &v) && v == 1);
    LM_CHECK(lm_gguf_get_int(&g, "tokenizer.ggml.eos_token_id", &v) && v == 2);

    const lm_gguf_kv *tok = lm_gguf_find_kv(&g, "tokenizer.ggml.tokens");
    LM_REQUIRE(tok && tok->type == LM_GGUF_ARRAY && tok->arr_type == LM_GGUF_STRING && tok->arr_count == 32000);
    lm_gguf_str s = lm_gguf_arr_str(tok, 1);
    LM_CHECK(s.len == 3 && memcmp(s.ptr, "<s>", 3) == 0);
    const lm_gguf_kv *sc = lm_gguf_find_kv(&g, "tokenizer.ggml.scores");
    LM_CHECK(sc && sc->arr_type == LM_GGUF_F32 && sc->arr_count == 32000 && lm_gguf_arr_float(sc, 100, &f));
    const lm_gguf_kv *tt = lm_gguf_find_kv(&g, "tokenizer.ggml.token_type");
    LM_CHECK(tt && tt->arr_count == 32000 && lm_gguf_arr_int(tt, 1, &v) && v == 3); /* <s> is a control token */

    const lm_file_tensor *t = lm_gguf_find_tensor(&g, "token_embd.weight");
    LM_REQUIRE(t);
    LM_CHECK(t->n_dims == 2 && t->shape[0] == 32000 && t->shape[1] == 8);
    t = lm_gguf_find_tensor(&g, "blk.0.ffn_down.weight");
    LM_CHECK(t && t->n_dims == 2 && t->shape[0] == 8 && t->shape[1] == 32);
    t = lm_gguf_find_tensor(&g, "blk.0.ffn_gate.weight");
    LM_CHECK(t && t->n_dims == 2 && t->shape[0] == 32 && t->shape[1] == 8);
    t = lm_gguf_find_tensor(&g, "output_norm.weight");
    LM_CHECK(t && t->type == LM_F32 && t->n_dims == 1 && t->shape[0] == 8);
    LM_CHECK(lm_gguf_find_tensor(&g, "blk.0.attn_q.weight") && lm_gguf_find_tensor(&g, "output.weight"));

    /* every tensor: supported type, sane size, inside the file, finite first row */
    for (int i = 0; i < g.n_tensors; i++) {
        t = &g.tensors[i];
        LM_CHECK_MSG(t->type != LM_DTYPE_COUNT, "%s has type %s", t->name, t->type_name);
        if (t->type == LM_DTYPE_COUNT) continue;
        int64_t cols = t->shape[t->n_dims - 1];
        LM_CHECK(t->nbytes == lm_dtype_row_bytes(t->type, cols) * (size_t)(lm_file_tensor_numel(t) / cols));
        LM_CHECK(t->data >= g.file.data && t->data + t->nbytes <= g.file.data + g.file.size);
        LM_CHECK((size_t)(t->data - g.file.data) % g.alignment == 0);
        float *row = malloc(sizeof(float) * (size_t)cols);
        lm_dequant_row(t->type, t->data, row, cols);
        int bad = 0;
        for (int64_t c = 0; c < cols; c++) bad += !isfinite(row[c]);
        LM_CHECK_MSG(bad == 0, "%s: %d non-finite values", t->name, bad);
        free(row);
    }
    lm_gguf_close(&g);
}

/* Fuzz finding: a zero dimension first (ne[0] = 0) let [0, 2^62, 4] through,
 * and the outermost-first product 4 * 2^62 then overflowed downstream. */
LM_TEST(gguf_zero_dim_hides_overflow) {
    gb b = { 0 };
    gb_bytes(&b, "GGUF", 4);
    gb_u32(&b, 3);
    gb_u64(&b, 1); /* tensors */
    gb_u64(&b, 0); /* metadata */
    gb_str(&b, "t");
    gb_u32(&b, 3);
    gb_u64(&b, 0);
    gb_u64(&b, (uint64_t)1 << 62);
    gb_u64(&b, 4);
    gb_u32(&b, 0); /* F32 */
    gb_u64(&b, 0);
    gb_pad(&b, 32);
    lm_gguf g;
    lm_err e;
    uint8_t *copy;
    int rc = parse_copy(&g, b.p, b.n, &e, &copy);
    LM_CHECK_MSG(rc == -1 && good_error(&e) && strstr(e.msg, "overflow"), "rc=%d %s", rc, e.msg);
    if (rc == 0) lm_gguf_close(&g);
    free(copy);
    free(b.p);
}
