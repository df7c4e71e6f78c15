/* test_safetensors.c - the safetensors parser on built, real and broken files.
 *
 * Design: a tiny builder (lm_stb_*) assembles files in memory from a JSON
 * header and a data section, so each bad-input case is one line of JSON
 * showing exactly what is wrong. Every parse of a hand-made buffer gets its
 * own heap copy of exactly the advertised size, so ASan catches any read
 * past the end. Real files come from ../shared/fixtures and are skipped,
 * with the reason, when that folder is absent. */
#include "lm_test.h"

#include "format/safetensors.h"

#include <stdlib.h>
#include <string.h>

/* A built file: 8-byte little-endian header length, header, data. */
typedef struct lm_stb {
    uint8_t *buf;
    size_t size;
} lm_stb;

static lm_stb lm_stb_make(const char *header, const void *data, size_t data_size) {
    size_t hlen = strlen(header);
    lm_stb b = { lm_xmalloc(8 + hlen + data_size + 1), 8 + hlen + data_size };
    for (int i = 0; i < 8; i++) b.buf[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(b.buf + 8, header, hlen);
    if (data_size) memcpy(b.buf + 8 + hlen, data, data_size);
    return b;
}

/* Data section of n bytes 0, 1, 2, ... (mod 256). */
static lm_stb lm_stb_make_n(const char *header, size_t n) {
    uint8_t *d = lm_xmalloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) d[i] = (uint8_t)i;
    lm_stb b = lm_stb_make(header, d, n);
    free(d);
    return b;
}

/* Parses the first `size` bytes of b from an exact-size heap copy, so any
 * read past the end is an ASan error, not a silent read of our slack. */
static int lm_stb_parse_prefix(const lm_stb *b, size_t size, lm_err *e) {
    uint8_t *copy = lm_xmalloc(size ? size : 1);
    if (size) memcpy(copy, b->buf, size);
    lm_safetensors st;
    int rc = lm_safetensors_parse(&st, copy, size, "/x/t.safetensors", e);
    if (rc == 0) lm_safetensors_close(&st);
    free(copy);
    return rc;
}

/* Expects failure with a message that starts with the label and contains
 * `want` (NULL: anything). Returns 1 when that holds. */
static int lm_stb_fails_with(const char *header, size_t data_size, const char *want,
                             char *msg_out, size_t msg_cap) {
    lm_stb b = lm_stb_make_n(header, data_size);
    lm_err e = { { 0 } };
    int rc = lm_stb_parse_prefix(&b, b.size, &e);
    free(b.buf);
    snprintf(msg_out, msg_cap, "%s", e.msg);
    return rc == -1 && strncmp(e.msg, "/x/t.safetensors: ", 18) == 0 && !strchr(e.msg, '\n') &&
           (!want || strstr(e.msg, want));
}

static const char *lm_stb_or_any(const char *want) { return want ? want : "(any)"; }

#define LM_EXPECT_BAD(header, data_size, want)                                         \
    do {                                                                               \
        char lm_msg_[LM_ERR_MAX];                                                      \
        LM_CHECK_MSG(lm_stb_fails_with(header, data_size, want, lm_msg_, sizeof lm_msg_), \
                     "header %s: got \"%s\", wanted \"%s\"", header, lm_msg_,           \
                     lm_stb_or_any(want));                                      \
    } while (0)

static const char *lm_st_small_header =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"z.bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
    "\"a.weight\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[8,20]},"
    "\"m.ids\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[20,24]},"
    "\"k.half\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[24,26]},"
    "\"d.f64\":{\"dtype\":\"F64\",\"shape\":[1,1],\"data_offsets\":[26,34]},"
    "\"e.empty\":{\"dtype\":\"U8\",\"shape\":[0,5],\"data_offsets\":[34,34]}}";

/* The small valid file: known values in each tensor. */
static lm_stb lm_st_small_file(void) {
    uint8_t d[34];
    float f[2] = { 1.5f, -2.25f };
    memcpy(d, f, 8);
    for (int i = 0; i < 6; i++) {
        uint16_t h = lm_f32_to_bf16((float)(i + 1));
        memcpy(d + 8 + 2 * i, &h, 2);
    }
    int32_t id = 12345;
    memcpy(d + 20, &id, 4);
    uint16_t one_f16 = 0x3c00;
    memcpy(d + 24, &one_f16, 2);
    double x = 3.0;
    memcpy(d + 26, &x, 8);
    return lm_stb_make(lm_st_small_header, d, sizeof d);
}

LM_TEST(safetensors_roundtrip) {
    lm_stb b = lm_st_small_file();
    lm_safetensors st;
    lm_err e = { { 0 } };
    int rc = lm_safetensors_parse(&st, b.buf, b.size, "mem", &e);
    LM_CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc != 0) {
        free(b.buf);
        return;
    }
    LM_CHECK(st.n_tensors == 6);
    for (int i = 1; i < st.n_tensors; i++)
        LM_CHECK(strcmp(st.tensors[i - 1].name, st.tensors[i].name) < 0);
    LM_CHECK(strcmp(st.tensors[0].name, "a.weight") == 0);

    const lm_file_tensor *z = lm_safetensors_find(&st, "z.bias");
    LM_REQUIRE(z);
    LM_CHECK(z->type == LM_F32 && strcmp(z->type_name, "F32") == 0);
    LM_CHECK(z->n_dims == 1 && z->shape[0] == 2 && z->nbytes == 8);
    float zf[2];
    memcpy(zf, z->data, 8);
    LM_CHECK(zf[0] == 1.5f && zf[1] == -2.25f);

    const lm_file_tensor *a = lm_safetensors_find(&st, "a.weight");
    LM_REQUIRE(a);
    LM_CHECK(a->type == LM_BF16 && a->n_dims == 2 && a->shape[0] == 2 && a->shape[1] == 3);
    LM_CHECK(lm_file_tensor_numel(a) == 6 && a->nbytes == 12);
    for (int i = 0; i < 6; i++) {
        uint16_t h;
        memcpy(&h, a->data + 2 * i, 2);
        LM_CHECK(lm_bf16_to_f32(h) == (float)(i + 1));
    }

    const lm_file_tensor *m = lm_safetensors_find(&st, "m.ids");
    LM_REQUIRE(m);
    LM_CHECK(m->type == LM_I32 && m->n_dims == 0 && lm_file_tensor_numel(m) == 1);
    int32_t id;
    memcpy(&id, m->data, 4);
    LM_CHECK(id == 12345);

    const lm_file_tensor *k = lm_safetensors_find(&st, "k.half");
    LM_REQUIRE(k);
    LM_CHECK(k->type == LM_F16 && k->nbytes == 2 && k->data[0] == 0x00 && k->data[1] == 0x3c);

    /* Types lumen does not compute with are kept, marked, and sized right. */
    const lm_file_tensor *d = lm_safetensors_find(&st, "d.f64");
    LM_REQUIRE(d);
    LM_CHECK(d->type == LM_DTYPE_COUNT && strcmp(d->type_name, "F64") == 0 && d->nbytes == 8);
    double x;
    memcpy(&x, d->data, 8);
    LM_CHECK(x == 3.0);

    const lm_file_tensor *em = lm_safetensors_find(&st, "e.empty");
    LM_REQUIRE(em);
    LM_CHECK(em->type == LM_DTYPE_COUNT && em->nbytes == 0 && lm_file_tensor_numel(em) == 0);

    LM_CHECK(lm_safetensors_find(&st, "absent") == NULL);
    LM_CHECK(lm_safetensors_find(&st, "") == NULL);
    LM_CHECK(lm_safetensors_find(&st, "__metadata__") == NULL);
    for (int i = 0; i < st.n_tensors; i++)
        LM_CHECK(lm_safetensors_find(&st, st.tensors[i].name) == &st.tensors[i]);
    lm_safetensors_close(&st);
    lm_safetensors_close(&st); /* closing twice is harmless */
    free(b.buf);
}

LM_TEST(safetensors_open_file) {
    lm_stb b = lm_st_small_file();
    char path[512];
    snprintf(path, sizeof path, "%s/small.safetensors", lm_test_tmpdir());
    FILE *f = fopen(path, "wb");
    LM_REQUIRE(f);
    LM_CHECK(fwrite(b.buf, 1, b.size, f) == b.size);
    fclose(f);
    free(b.buf);

    lm_safetensors st;
    lm_err e = { { 0 } };
    int rc = lm_safetensors_open(&st, path, &e); /* LM_REQUIRE evaluates twice */
    LM_CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc != 0) return;
    LM_CHECK(st.file.data != NULL && st.n_tensors == 6);
    const lm_file_tensor *z = lm_safetensors_find(&st, "z.bias");
    LM_REQUIRE(z);
    LM_CHECK(z->data >= st.file.data && z->data + z->nbytes <= st.file.data + st.file.size);
    lm_safetensors_close(&st);
}

LM_TEST(safetensors_empty_header_object) {
    lm_stb b = lm_stb_make("{}", NULL, 0);
    lm_safetensors st;
    lm_err e = { { 0 } };
    LM_CHECK(lm_safetensors_parse(&st, b.buf, b.size, "mem", &e) == 0);
    LM_CHECK(st.n_tensors == 0 && lm_safetensors_find(&st, "x") == NULL);
    lm_safetensors_close(&st);
    free(b.buf);
    /* Writers pad the header with spaces to align the data section. */
    b = lm_stb_make("{\"t\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]}}   ", "\x7f", 1);
    LM_CHECK(lm_safetensors_parse(&st, b.buf, b.size, "mem", &e) == 0);
    LM_CHECK(st.n_tensors == 1 && st.tensors[0].data[0] == 0x7f);
    lm_safetensors_close(&st);
    free(b.buf);
}

LM_TEST(safetensors_fixture_llama) {
    char *path = lm_test_fixture_path("models/llama/model.safetensors");
    if (!path || !lm_file_exists(path)) {
        free(path);
        LM_SKIP("fixture models/llama/model.safetensors not found (../shared/fixtures absent)");
    }
    lm_safetensors st;
    lm_err e = { { 0 } };
    int rc = lm_safetensors_open(&st, path, &e);
    LM_CHECK_MSG(rc == 0, "%s", e.msg);
    free(path);
    if (rc != 0) return;
    LM_CHECK(st.n_tensors > 3);
    for (int i = 1; i < st.n_tensors; i++)
        LM_CHECK(strcmp(st.tensors[i - 1].name, st.tensors[i].name) < 0);
    const lm_file_tensor *t = lm_safetensors_find(&st, "model.embed_tokens.weight");
    LM_CHECK(t != NULL);
    if (t) {
        LM_CHECK(t->type == LM_BF16 && strcmp(t->type_name, "BF16") == 0);
        LM_CHECK(t->n_dims == 2 && t->shape[0] == 1024 && t->shape[1] == 64);
        LM_CHECK(t->nbytes == (size_t)1024 * 64 * 2);
        /* Random-initialised weights: finite, small, not all zero. */
        int nonzero = 0, finite = 1;
        for (int i = 0; i < 1024 * 64; i++) {
            uint16_t h;
            memcpy(&h, t->data + 2 * i, 2);
            float v = lm_bf16_to_f32(h);
            if (!isfinite(v) || fabsf(v) > 100.0f) finite = 0;
            nonzero += v != 0.0f;
        }
        LM_CHECK(finite && nonzero > 1000);
    }
    lm_safetensors_close(&st);
}

LM_TEST(safetensors_fixture_reference) {
    char *path = lm_test_fixture_path("models/llama/reference.safetensors");
    if (!path || !lm_file_exists(path)) {
        free(path);
        LM_SKIP("fixture models/llama/reference.safetensors not found (../shared/fixtures absent)");
    }
    lm_safetensors st;
    lm_err e = { { 0 } };
    int rc = lm_safetensors_open(&st, path, &e);
    LM_CHECK_MSG(rc == 0, "%s", e.msg);
    free(path);
    if (rc != 0) return;
    const lm_file_tensor *t = lm_safetensors_find(&st, "prompt0.ids");
    LM_CHECK(t != NULL);
    if (t) {
        LM_CHECK(t->type == LM_I32 && strcmp(t->type_name, "I32") == 0);
        LM_CHECK(t->n_dims == 1 && t->shape[0] == 7 && t->nbytes == 28);
        for (int i = 0; i < 7; i++) {
            int32_t id;
            memcpy(&id, t->data + 4 * i, 4);
            LM_CHECK(id >= 0 && id < 1024);
        }
    }
    const lm_file_tensor *l = lm_safetensors_find(&st, "prompt0.logits");
    LM_CHECK(l && l->type == LM_F32 && l->n_dims == 2 && l->shape[0] == 7 && l->shape[1] == 1024);
    lm_safetensors_close(&st);
}

LM_TEST(safetensors_truncated_everywhere) {
    lm_stb b = lm_st_small_file();
    int whole = lm_stb_parse_prefix(&b, b.size, &(lm_err){ { 0 } });
    LM_CHECK(whole == 0);
    int bad = 0;
    for (size_t n = 0; n < b.size; n++) {
        lm_err e = { { 0 } };
        int rc = lm_stb_parse_prefix(&b, n, &e);
        if (rc != -1 || strncmp(e.msg, "/x/t.safetensors: ", 18) != 0) {
            if (bad++ < 5) fprintf(stderr, "  truncated at %zu: rc %d, \"%s\"\n", n, rc, e.msg);
        }
    }
    LM_CHECK(bad == 0);
    free(b.buf);
}

LM_TEST(safetensors_bad_length_prefix) {
    /* Header length past the end of the file. */
    lm_stb b = lm_stb_make("{}", NULL, 0);
    b.buf[0] = 3;
    lm_err e = { { 0 } };
    LM_CHECK(lm_stb_parse_prefix(&b, b.size, &e) == -1);
    LM_CHECK(strstr(e.msg, "/x/t.safetensors: header length 3 runs past") == e.msg);
    /* A huge length must not wrap around when added to 8. */
    memset(b.buf, 0xff, 8);
    LM_CHECK(lm_stb_parse_prefix(&b, b.size, &e) == -1);
    LM_CHECK(strstr(e.msg, "runs past the end") != NULL);
    free(b.buf);
    /* Shorter than the length field itself. */
    LM_CHECK(lm_stb_parse_prefix(&(lm_stb){ (uint8_t *)"\x02\0\0", 3 }, 3, &e) == -1);
    LM_CHECK(strstr(e.msg, "too short") != NULL);
}

LM_TEST(safetensors_bad_offsets) {
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
                  "tensor 't': data_offsets [0, 16] outside the 8-byte data section");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[16,20]}}", 8,
                  "outside the 8-byte data section");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8,
                  "tensor 't': data_offsets [8, 4] end before begin");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]}}", 8,
                  "tensor 't': data_offsets are not non-negative integers");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 8,
                  "data_offsets is not an array [begin, end]");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8,
                  "data_offsets is not an array [begin, end]");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0.0,4]}}", 8,
                  "data_offsets are not non-negative integers");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", 8, "tensor 't': missing data_offsets");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],"
                  "\"data_offsets\":[18446744073709551615,18446744073709551615]}}",
                  8, NULL);
}

LM_TEST(safetensors_bad_shape) {
    /* Shape and byte count disagree. */
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
                  "tensor 't': F32 shape needs 12 bytes but data_offsets [0, 8] hold 8");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,4]}}", 8,
                  "needs 8 bytes");
    /* Products that overflow int64, or whose byte size does. */
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}",
                  8, "tensor 't': shape element count overflows");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}",
                  8, "shape byte size overflows");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"U8\",\"shape\":[9223372036854775807,2],\"data_offsets\":[0,0]}}",
                  8, "overflows");
    /* A wrapped product that happens to equal the byte count must not pass:
     * 2^32 * 2^32 = 2^64 = 0 mod 2^64. */
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,1],\"data_offsets\":[0,0]}}",
                  8, "overflows");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 8,
                  "tensor 't': shape[0] is not a non-negative integer");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 8,
                  "shape[0] is not a non-negative integer");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8,
                  "shape[0] is not a non-negative integer");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8,
                  "shape is not an array");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "missing shape");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 8,
                  "shape has 9 dimensions, at most 8");
    /* Too big for jansson's json_int_t: a JSON error, not a wrap. */
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"U8\",\"shape\":[99999999999999999999],\"data_offsets\":[0,1]}}",
                  8, "not valid JSON");
    /* A zero dimension does not excuse the others: numel is computed in
     * shape order by lm_file_tensor_numel, and 2^62 * 4 overflows before
     * the 0 is reached (found fuzzing the GGUF parser). */
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"U8\",\"shape\":[4611686018427387904,4,0],\"data_offsets\":[0,0]}}",
                  8, "shape element count overflows");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"U8\",\"shape\":[9223372036854775807,0,3],\"data_offsets\":[0,0]}}",
                  8, "shape element count overflows");
    /* A zero dimension with sane others: valid, 0 bytes. */
    lm_stb b = lm_stb_make_n(
        "{\"t\":{\"dtype\":\"U8\",\"shape\":[4611686018427387904,0,1],\"data_offsets\":[8,8]}}", 8);
    lm_err e = { { 0 } };
    LM_CHECK_MSG(lm_stb_parse_prefix(&b, b.size, &e) == 0, "%s", e.msg);
    free(b.buf);
    /* The full 8 dims are fine. */
    b = lm_stb_make_n("{\"t\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,2],\"data_offsets\":[0,2]}}", 8);
    LM_CHECK_MSG(lm_stb_parse_prefix(&b, b.size, &e) == 0, "%s", e.msg);
    free(b.buf);
}

LM_TEST(safetensors_bad_json) {
    LM_EXPECT_BAD("[1,2,3]", 0, "/x/t.safetensors: header is not a JSON object");
    /* jansson refuses a bare scalar at top level itself. */
    LM_EXPECT_BAD("\"x\"", 0, "/x/t.safetensors: header is not");
    LM_EXPECT_BAD("", 0, "header is not valid JSON");
    LM_EXPECT_BAD("{\"t\":", 0, "header is not valid JSON");
    LM_EXPECT_BAD("{} {}", 0, "header is not valid JSON");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                  "\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                  8, "header is not valid JSON: duplicate object key");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"U8\",\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
                  8, "duplicate");
    LM_EXPECT_BAD("{\"t\":3}", 0, "tensor 't': entry is not a JSON object");
    LM_EXPECT_BAD("{\"t\\u0000x\":{}}", 0, "not valid JSON");
    LM_EXPECT_BAD("{\"__metadata__\":[]}", 0, "__metadata__ is not a JSON object");
    LM_EXPECT_BAD("{\"__metadata__\":{\"format\":1}}", 0, "__metadata__ value 'format' is not a string");
    /* Deep nesting must be refused, not recursed into until the stack ends. */
    enum { depth = 100000 };
    char *deep = lm_xmalloc(2 * depth + 16);
    size_t n = 0;
    n += (size_t)sprintf(deep, "{\"t\":");
    for (int i = 0; i < depth; i++) deep[n++] = '[';
    for (int i = 0; i < depth; i++) deep[n++] = ']';
    deep[n++] = '}';
    deep[n] = 0;
    LM_EXPECT_BAD(deep, 0, "not valid JSON");
    free(deep);
}

LM_TEST(safetensors_bad_dtype) {
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"F12\",\"shape\":[1],\"data_offsets\":[0,1]}}", 8,
                  "tensor 't': unknown dtype 'F12'");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8,
                  "unknown dtype 'f32'");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 8,
                  "tensor 't': dtype is not a string");
    LM_EXPECT_BAD("{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 8, "tensor 't': missing dtype");
    /* Each known safetensors dtype with its element size. */
    static const struct { const char *name; lm_dtype type; int bytes; } want[] = {
        { "F32", LM_F32, 4 },           { "F16", LM_F16, 2 },
        { "BF16", LM_BF16, 2 },         { "I32", LM_I32, 4 },
        { "F64", LM_DTYPE_COUNT, 8 },   { "I64", LM_DTYPE_COUNT, 8 },
        { "I16", LM_DTYPE_COUNT, 2 },   { "I8", LM_DTYPE_COUNT, 1 },
        { "U8", LM_DTYPE_COUNT, 1 },    { "BOOL", LM_DTYPE_COUNT, 1 },
        { "F8_E4M3", LM_DTYPE_COUNT, 1 }, { "F8_E5M2", LM_DTYPE_COUNT, 1 },
        { "U16", LM_DTYPE_COUNT, 2 },   { "U32", LM_DTYPE_COUNT, 4 },
        { "U64", LM_DTYPE_COUNT, 8 },
    };
    for (size_t i = 0; i < LM_COUNT(want); i++) {
        char hdr[256];
        snprintf(hdr, sizeof hdr, "{\"t\":{\"dtype\":\"%s\",\"shape\":[3],\"data_offsets\":[0,%d]}}",
                 want[i].name, 3 * want[i].bytes);
        lm_stb b = lm_stb_make_n(hdr, (size_t)(3 * want[i].bytes));
        lm_safetensors st;
        lm_err e = { { 0 } };
        int rc = lm_safetensors_parse(&st, b.buf, b.size, "mem", &e);
        LM_CHECK_MSG(rc == 0, "%s: %s", want[i].name, e.msg);
        if (rc == 0) {
            LM_CHECK(st.tensors[0].type == want[i].type);
            LM_CHECK(strcmp(st.tensors[0].type_name, want[i].name) == 0);
            LM_CHECK(st.tensors[0].nbytes == (size_t)(3 * want[i].bytes));
            lm_safetensors_close(&st);
        }
        free(b.buf);
    }
}

LM_TEST(safetensors_missing_file) {
    char path[512];
    snprintf(path, sizeof path, "%s/no-such-dir/model.safetensors", lm_test_tmpdir());
    lm_safetensors st;
    lm_err e = { { 0 } };
    LM_CHECK(lm_safetensors_open(&st, path, &e) == -1);
    LM_CHECK_MSG(strncmp(e.msg, path, strlen(path)) == 0, "%s", e.msg);
    LM_CHECK(st.n_tensors == 0 && st.tensors == NULL);
    lm_safetensors_close(&st);

    /* An empty file and a directory fail the same way, naming the path. */
    snprintf(path, sizeof path, "%s/empty.safetensors", lm_test_tmpdir());
    FILE *f = fopen(path, "wb");
    LM_REQUIRE(f);
    fclose(f);
    LM_CHECK(lm_safetensors_open(&st, path, &e) == -1);
    LM_CHECK_MSG(strncmp(e.msg, path, strlen(path)) == 0 && strstr(e.msg, "too short"), "%s", e.msg);
    LM_CHECK(lm_safetensors_open(&st, lm_test_tmpdir(), &e) == -1);
    LM_CHECK_MSG(strncmp(e.msg, lm_test_tmpdir(), strlen(lm_test_tmpdir())) == 0, "%s", e.msg);
}

LM_TEST(safetensors_error_names_file_in_open) {
    /* Bad content through open(): the label is the path. */
    lm_stb b = lm_stb_make_n("{\"model.norm.weight\":{\"dtype\":\"BF16\",\"shape\":[450],"
                             "\"data_offsets\":[0,900]}}",
                             512);
    char path[512];
    snprintf(path, sizeof path, "%s/bad.safetensors", lm_test_tmpdir());
    FILE *f = fopen(path, "wb");
    LM_REQUIRE(f);
    LM_CHECK(fwrite(b.buf, 1, b.size, f) == b.size);
    fclose(f);
    free(b.buf);
    lm_safetensors st;
    lm_err e = { { 0 } };
    LM_CHECK(lm_safetensors_open(&st, path, &e) == -1);
    char want[700];
    snprintf(want, sizeof want,
             "%s: tensor 'model.norm.weight': data_offsets [0, 900] outside the 512-byte data section",
             path);
    LM_CHECK_MSG(strcmp(e.msg, want) == 0, "%s", e.msg);
    LM_CHECK(st.file.data == NULL && st.tensors == NULL);
}

LM_TEST(safetensors_all_fixture_models) {
    /* Every checkpoint and reference file in the fixtures must parse, and
     * every tensor's bytes must lie inside the mapping. */
    static const char *models[] = { "llama", "llama3-rope-mqa", "qwen3", "qwen3-moe",
                                    "qwen3-next", "qwen3.5", "gemma3", "gemma4" };
    static const char *files[] = { "model.safetensors", "reference.safetensors" };
    if (!lm_test_fixtures()) LM_SKIP("../shared/fixtures absent");
    int opened = 0;
    for (size_t i = 0; i < LM_COUNT(models); i++) {
        for (size_t j = 0; j < LM_COUNT(files); j++) {
            char rel[128];
            snprintf(rel, sizeof rel, "models/%s/%s", models[i], files[j]);
            char *path = lm_test_fixture_path(rel);
            if (!lm_file_exists(path)) {
                free(path);
                continue;
            }
            lm_safetensors st;
            lm_err e = { { 0 } };
            int rc = lm_safetensors_open(&st, path, &e);
            LM_CHECK_MSG(rc == 0, "%s", e.msg);
            free(path);
            if (rc != 0) continue;
            opened++;
            LM_CHECK(st.n_tensors > 0);
            for (int k = 0; k < st.n_tensors; k++) {
                const lm_file_tensor *t = &st.tensors[k];
                LM_CHECK(t->type != LM_DTYPE_COUNT); /* the fixtures use BF16, F32, I32 only */
                LM_CHECK(t->data >= st.file.data && t->data + t->nbytes <= st.file.data + st.file.size);
                LM_CHECK(lm_safetensors_find(&st, t->name) == t);
            }
            lm_safetensors_close(&st);
        }
    }
    if (opened == 0) LM_SKIP("no models/*/model.safetensors in the fixtures");
}

LM_TEST(safetensors_error_is_one_line) {
    /* Names and dtypes are file content: a newline in them must not split
     * the message, and a huge name must not crowd out the problem. */
    LM_EXPECT_BAD("{\"a\\nb\":3}", 0, "tensor 'a?b': entry is not a JSON object");
    LM_EXPECT_BAD("{\"t\":{\"dtype\":\"F\\r\\n32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8,
                  "unknown dtype 'F??32'");
    LM_EXPECT_BAD("{\"__metadata__\":{\"\\u001b[31m\":1}}", 0, "__metadata__ value '?[31m'");
    /* jansson's own message quotes raw input (fuzz finding). */
    LM_EXPECT_BAD("{\"a\\\n\":1}", 0, "header is not valid JSON: invalid escape near '\"a\\?'");
    char hdr[2200];
    int n = snprintf(hdr, sizeof hdr, "{\"");
    for (int i = 0; i < 2000; i++) hdr[n++] = 'x';
    snprintf(hdr + n, sizeof hdr - (size_t)n, "\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}");
    LM_EXPECT_BAD(hdr, 8, "xxx...': F32 shape needs 12 bytes but data_offsets [0, 8] hold 8");
}
