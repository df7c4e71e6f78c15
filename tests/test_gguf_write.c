/* test_gguf_write.c - the GGUF writer against lumen's reader and llama.cpp's
 * own files: every value type and tensor table written reads back the same,
 * offsets honour the alignment, and a llama.cpp-written file copied key by
 * key and tensor by tensor comes out byte for byte identical. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "format/gguf_write.h"
#include "lm_test.h"
#include "test_util.h"

/* Writes a file with one key of every type and three tensors. */
static int write_sample(const char *path, uint32_t align, lm_err *e) {
    lm_gguf_writer *w = lm_gguf_writer_create(align);
    lm_gguf_set_int(w, "t.u8", LM_GGUF_U8, 200);
    lm_gguf_set_int(w, "t.i8", LM_GGUF_I8, -100);
    lm_gguf_set_int(w, "t.u16", LM_GGUF_U16, 60000);
    lm_gguf_set_int(w, "t.i16", LM_GGUF_I16, -30000);
    lm_gguf_set_int(w, "t.u32", LM_GGUF_U32, 4000000000ll);
    lm_gguf_set_int(w, "t.i32", LM_GGUF_I32, -2000000000);
    lm_gguf_set_uint64(w, "t.u64", 1ull << 60);
    lm_gguf_set_int(w, "t.i64", LM_GGUF_I64, -(1ll << 50));
    lm_gguf_set_float(w, "t.f32", LM_GGUF_F32, 0.125);
    lm_gguf_set_float(w, "t.f64", LM_GGUF_F64, 1.0 / 3.0);
    lm_gguf_set_bool(w, "t.bool", true);
    lm_gguf_set_str(w, "t.str", "replaced", 8);
    lm_gguf_set_str(w, "t.str", "h\0llo", 5); /* replaced in place, NUL inside */
    int32_t ints[3] = { 1, -2, 3 };
    lm_gguf_set_arr(w, "t.arr_i32", LM_GGUF_I32, ints, 3);
    float fl[2] = { 1.5f, -0.25f };
    lm_gguf_set_arr(w, "t.arr_f32", LM_GGUF_F32, fl, 2);
    const char *strs[3] = { "a", "", "ccc" };
    lm_gguf_set_arr_str(w, "t.arr_str", strs, NULL, 3);
    lm_gguf_set_int(w, "t.gone", LM_GGUF_U8, 1);
    lm_gguf_del_kv(w, "t.gone");

    float f32[3] = { 1, 2, 3 };
    uint16_t bf16[64];
    for (int i = 0; i < 64; i++) bf16[i] = lm_f32_to_bf16((float)i);
    uint8_t q8[2 * 34];
    for (int i = 0; i < (int)sizeof q8; i++) q8[i] = (uint8_t)(i * 7);
    int64_t s1[1] = { 3 }, s2[2] = { 2, 32 }, s3[2] = { 1, 64 };
    int rc = lm_gguf_add_tensor(w, "a", LM_F32, 1, s1, e);
    rc = rc ? rc : lm_gguf_add_tensor(w, "b.q8", LM_Q8_0, 2, s2, e);
    rc = rc ? rc : lm_gguf_add_tensor(w, "c.bf16", LM_BF16, 2, s3, e);
    rc = rc ? rc : lm_gguf_writer_begin(w, path, e);
    rc = rc ? rc : lm_gguf_writer_put(w, f32, sizeof f32, e);
    rc = rc ? rc : lm_gguf_writer_put(w, q8, sizeof q8, e);
    rc = rc ? rc : lm_gguf_writer_put(w, bf16, sizeof bf16, e);
    rc = rc ? rc : lm_gguf_writer_finish(w, e);
    lm_gguf_writer_free(w);
    return rc;
}

static void check_sample(lm_test_ctx *lm_t_, uint32_t align) {
    char path[512];
    snprintf(path, sizeof path, "%s/sample-%u.gguf", lm_test_tmpdir(), align);
    lm_err e = { { 0 } };
    LM_REQUIRE(write_sample(path, align, &e) == 0);
    lm_gguf g;
    LM_REQUIRE(lm_gguf_open(&g, path, &e) == 0);
    int64_t i;
    double f;
    bool b;
    LM_CHECK(g.version == 3 && g.alignment == align);
    LM_CHECK(lm_gguf_get_int(&g, "t.u8", &i) && i == 200);
    LM_CHECK(lm_gguf_get_int(&g, "t.i8", &i) && i == -100);
    LM_CHECK(lm_gguf_get_int(&g, "t.u16", &i) && i == 60000);
    LM_CHECK(lm_gguf_get_int(&g, "t.i16", &i) && i == -30000);
    LM_CHECK(lm_gguf_get_int(&g, "t.u32", &i) && i == 4000000000ll);
    LM_CHECK(lm_gguf_get_int(&g, "t.i32", &i) && i == -2000000000);
    LM_CHECK(lm_gguf_get_int(&g, "t.u64", &i) && i == (1ll << 60));
    LM_CHECK(lm_gguf_get_int(&g, "t.i64", &i) && i == -(1ll << 50));
    LM_CHECK(lm_gguf_get_float(&g, "t.f32", &f) && f == 0.125);
    LM_CHECK(lm_gguf_get_float(&g, "t.f64", &f) && f == 1.0 / 3.0);
    LM_CHECK(lm_gguf_get_bool(&g, "t.bool", &b) && b);
    LM_CHECK(lm_gguf_find_kv(&g, "t.gone") == NULL);
    const lm_gguf_kv *kv = lm_gguf_find_kv(&g, "t.str");
    LM_CHECK(kv && kv->type == LM_GGUF_STRING && kv->str.len == 5 && !memcmp(kv->str.ptr, "h\0llo", 5));
    LM_CHECK(g.n_kv == 15 + (align != 32));
    LM_CHECK(!strcmp(g.kv[11].key, "t.str")); /* kept its first place */
    kv = lm_gguf_find_kv(&g, "t.arr_i32");
    LM_CHECK(kv && kv->arr_type == LM_GGUF_I32 && kv->arr_count == 3 && lm_gguf_arr_int(kv, 1, &i) && i == -2);
    kv = lm_gguf_find_kv(&g, "t.arr_f32");
    LM_CHECK(kv && kv->arr_count == 2 && lm_gguf_arr_float(kv, 1, &f) && f == -0.25);
    kv = lm_gguf_find_kv(&g, "t.arr_str");
    LM_CHECK(kv && kv->arr_count == 3 && lm_gguf_arr_str(kv, 1).len == 0 && lm_gguf_arr_str(kv, 2).len == 3 &&
             !memcmp(lm_gguf_arr_str(kv, 2).ptr, "ccc", 3));
    LM_REQUIRE(g.n_tensors == 3);
    const lm_file_tensor *a = lm_gguf_find_tensor(&g, "a"), *q = lm_gguf_find_tensor(&g, "b.q8");
    const lm_file_tensor *c = lm_gguf_find_tensor(&g, "c.bf16");
    LM_REQUIRE(a && q && c);
    LM_CHECK(a->type == LM_F32 && a->n_dims == 1 && a->shape[0] == 3 && a->nbytes == 12);
    LM_CHECK(q->type == LM_Q8_0 && q->n_dims == 2 && q->shape[0] == 2 && q->shape[1] == 32 && q->nbytes == 68);
    LM_CHECK(c->type == LM_BF16 && c->shape[0] == 1 && c->shape[1] == 64);
    const uint8_t *base = g.file.data;
    LM_CHECK((size_t)(q->data - base) % align == 0 && (size_t)(c->data - base) % align == 0);
    float y[3];
    lm_dequant_row(LM_F32, a->data, y, 3);
    LM_CHECK(y[0] == 1 && y[2] == 3);
    LM_CHECK(q->data[5] == (uint8_t)(5 * 7) && q->data[67] == (uint8_t)(67 * 7));
    lm_gguf_close(&g);
}

LM_TEST(gguf_write_round_trip_every_type) {
    check_sample(lm_t_, 32);
    check_sample(lm_t_, 64);
}

/* A bad table entry is an error naming the tensor, and nothing is left behind. */
LM_TEST(gguf_write_refuses_bad_tensors) {
    lm_err e = { { 0 } };
    lm_gguf_writer *w = lm_gguf_writer_create(32);
    int64_t shape[2] = { 2, 48 };
    LM_CHECK(lm_gguf_add_tensor(w, "w", LM_Q8_0, 2, shape, &e) != 0 && strstr(e.msg, "\"w\""));
    shape[1] = 32;
    LM_REQUIRE(lm_gguf_add_tensor(w, "w", LM_Q8_0, 2, shape, &e) == 0);
    char path[512];
    snprintf(path, sizeof path, "%s/short.gguf", lm_test_tmpdir());
    LM_REQUIRE(lm_gguf_writer_begin(w, path, &e) == 0);
    uint8_t buf[68] = { 0 };
    LM_CHECK(lm_gguf_writer_put(w, buf, 34, &e) != 0 && strstr(e.msg, "34 bytes"));
    LM_CHECK(lm_gguf_writer_finish(w, &e) != 0);
    lm_gguf_writer_free(w);
    char tmp[520];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    LM_CHECK(fopen(path, "rb") == NULL && fopen(tmp, "rb") == NULL);
}

/* llama.cpp's files, rewritten through the writer, are identical bytes. */
LM_TEST(gguf_write_copies_llamacpp_files_exactly) {
    static const char *const files[] = { "gguf/llama-g256/model.bf16.gguf", "gguf/llama-g256/model.Q4_K_M.gguf",
                                         "gguf/qwen3-g256/model.Q8_0.gguf" };
    for (size_t k = 0; k < LM_COUNT(files); k++) {
        char *src = lm_test_fixture_path(files[k]);
        if (!src) LM_SKIP("%s", lm_test_fixtures_why());
        lm_err e = { { 0 } };
        lm_gguf g;
        LM_REQUIRE(lm_gguf_open(&g, src, &e) == 0);
        lm_gguf_writer *w = lm_gguf_writer_create(g.alignment);
        for (int i = 0; i < g.n_kv; i++) LM_CHECK(lm_gguf_copy_kv(w, &g.kv[i], &e) == 0);
        for (int i = 0; i < g.n_tensors; i++) {
            const lm_file_tensor *t = &g.tensors[i];
            LM_CHECK(lm_gguf_add_tensor(w, t->name, t->type, t->n_dims, t->shape, &e) == 0);
        }
        char dst[512];
        snprintf(dst, sizeof dst, "%s/copy-%zu.gguf", lm_test_tmpdir(), k);
        LM_CHECK(lm_gguf_writer_begin(w, dst, &e) == 0);
        for (int i = 0; i < g.n_tensors; i++) {
            LM_CHECK(lm_gguf_writer_put(w, g.tensors[i].data, g.tensors[i].nbytes, &e) == 0);
        }
        LM_CHECK(lm_gguf_writer_finish(w, &e) == 0);
        lm_gguf_writer_free(w);
        size_t na, nb;
        char *a = lm_tu_read(src, &na), *b = lm_tu_read(dst, &nb);
        LM_CHECK_MSG(a && b && na == nb && !memcmp(a, b, na), "%s: copy differs (%zu vs %zu bytes)", files[k], na, nb);
        free(a);
        free(b);
        lm_gguf_close(&g);
        free(src);
    }
}

/* A disk that fills up mid-write (a file size limit in a child process) is
 * an error, and neither the file nor its temporary is left behind. */
LM_TEST(gguf_write_full_disk_leaves_nothing) {
    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/full.gguf", lm_test_tmpdir());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    pid_t pid = fork();
    LM_REQUIRE(pid >= 0);
    if (pid == 0) {
        struct rlimit rl = { 16384, 16384 };
        signal(SIGXFSZ, SIG_IGN);
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(3);
        lm_err e = { { 0 } };
        lm_gguf_writer *w = lm_gguf_writer_create(32);
        int64_t shape[2] = { 64, 256 };
        static float data[64 * 256];
        int rc = lm_gguf_add_tensor(w, "big", LM_F32, 2, shape, &e);
        rc = rc ? rc : lm_gguf_writer_begin(w, path, &e);
        rc = rc ? rc : lm_gguf_writer_put(w, data, sizeof data, &e);
        rc = rc ? rc : lm_gguf_writer_finish(w, &e);
        lm_gguf_writer_free(w);
        bool said = strstr(e.msg, "failed") != NULL;
        _exit(rc != 0 && said ? 0 : 1);
    }
    int status = 0;
    LM_REQUIRE(waitpid(pid, &status, 0) == pid);
    LM_CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    LM_CHECK(access(path, F_OK) != 0 && access(tmp, F_OK) != 0);
}
