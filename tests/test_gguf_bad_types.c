/* test_gguf_bad_types.c - a GGUF model with a tensor lumen cannot use fails to
 * load with one line that names the tensor and its type.
 *
 * Each case takes the llama-g256 Q8_0 fixture, edits one tensor's info in a
 * copy (its type id, a dimension) or cuts the file short, and loads the copy
 * as a model. The edits keep the rest of the file valid, so the error must
 * come from the check for that very problem: a type id ggml does not have, a
 * type lumen has no kernel for (the new type is smaller per value than Q8_0,
 * so its data still lies inside the file), a row that is not whole blocks, a
 * tensor whose data runs past the end of the file. */
#include "lm_test.h"

#include "backend/lm_backend.h"
#include "model/lm_model.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

#define BT_TENSOR "blk.0.ffn_down.weight"

typedef struct bt_file {
    uint8_t *data;
    size_t size;
    size_t type_pos; /* offset of BT_TENSOR's u32 type id */
    size_t ne0_pos;  /* offset of its innermost dimension (u64) */
} bt_file;

static uint32_t bt_rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void bt_wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Reads the fixture and finds BT_TENSOR's info: u64 name length, the name,
 * u32 n_dims, n_dims x u64, u32 type. Returns false when it is absent. */
static bool bt_load(bt_file *f, const char *path) {
    f->data = (uint8_t *)lm_tu_read(path, &f->size);
    if (!f->data) return false;
    size_t n = strlen(BT_TENSOR);
    for (size_t i = 8; i + n + 4 < f->size; i++) {
        if (memcmp(f->data + i, BT_TENSOR, n) != 0 || f->data[i - 8] != n) continue;
        uint32_t n_dims = bt_rd32(f->data + i + n);
        f->ne0_pos = i + n + 4;
        f->type_pos = f->ne0_pos + 8 * (size_t)n_dims;
        return n_dims >= 1 && n_dims <= 4 && f->type_pos + 4 <= f->size;
    }
    return false;
}

/* Writes size bytes of f to a temp file and loads it; returns the error
 * message (malloc'd) or NULL when the model loaded. */
static char *bt_try(const bt_file *f, size_t size, const char *tag) {
    char *dir = lm_tu_mkdir(tag), path[512];
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    free(dir);
    if (lm_tu_write(path, f->data, size) != 0) return strdup("(could not write the temp file)");
    lm_err e = { { 0 } };
    lm_backend *be = lm_cpu_backend_create(1, LM_ISA_AUTO, &e);
    if (!be) return strdup(e.msg);
    lm_model *m = NULL;
    char *msg = NULL;
    if (lm_model_load(&m, path, be, &e) != 0) msg = strdup(e.msg);
    else lm_model_free(m);
    lm_backend_destroy(be);
    remove(path);
    return msg;
}

/* The load failed with one line holding every one of want[]. */
static void bt_expect(lm_test_ctx *lm_t_, const char *what, char *msg, const char *const *want, int n_want) {
    LM_CHECK_MSG(msg != NULL, "%s: the model loaded", what);
    if (!msg) return;
    printf("  %s: %s\n", what, msg);
    LM_CHECK_MSG(strchr(msg, '\n') == NULL, "%s: error is more than one line", what);
    for (int i = 0; i < n_want; i++) LM_CHECK_MSG(strstr(msg, want[i]) != NULL, "%s: no \"%s\" in the error", what, want[i]);
    free(msg);
}

LM_TEST(gguf_bad_types_model_load) {
    char *path = lm_test_fixture_path("gguf/llama-g256/model.Q8_0.gguf");
    if (!path) LM_SKIP("%s", lm_test_fixtures_why());
    bt_file f = { 0 };
    bool found = bt_load(&f, path);
    free(path);
    LM_REQUIRE(found);
    LM_REQUIRE(bt_rd32(f.data + f.type_pos) == 8); /* Q8_0 */

    /* sanity: the untouched copy loads */
    char *msg = bt_try(&f, f.size, "bt-ok");
    LM_CHECK_MSG(msg == NULL, "the unedited fixture does not load: %s", msg ? msg : "");
    free(msg);

    /* types ggml has and lumen does not compute with */
    static const struct { uint32_t id; const char *name; } no_kernel[] = {
        { 16, "IQ2_XXS" }, { 19, "IQ1_S" }, { 21, "IQ3_S" }, { 34, "TQ1_0" }, { 39, "MXFP4" }, { 15, "Q8_K" },
    };
    for (size_t i = 0; i < LM_COUNT(no_kernel); i++) {
        bt_wr32(f.data + f.type_pos, no_kernel[i].id);
        const char *want[] = { BT_TENSOR, no_kernel[i].name, "cannot compute with" };
        bt_expect(lm_t_, no_kernel[i].name, bt_try(&f, f.size, "bt-type"), want, 3);
    }

    /* type ids ggml does not have (4 was removed from ggml) */
    static const uint32_t unknown[] = { 4, 40, 1000, 0xffffffffu };
    for (size_t i = 0; i < LM_COUNT(unknown); i++) {
        bt_wr32(f.data + f.type_pos, unknown[i]);
        char id[32], what[48];
        snprintf(id, sizeof id, "unknown ggml type %u", unknown[i]);
        snprintf(what, sizeof what, "type id %u", unknown[i]);
        const char *want[] = { BT_TENSOR, id };
        bt_expect(lm_t_, what, bt_try(&f, f.size, "bt-unknown"), want, 2);
    }
    bt_wr32(f.data + f.type_pos, 8);

    /* a row that is not a whole number of Q8_0 blocks (the same bytes in all) */
    uint8_t ne0[8];
    memcpy(ne0, f.data + f.ne0_pos, 8);
    bt_wr32(f.data + f.ne0_pos, bt_rd32(ne0) - 16);
    {
        const char *want[] = { BT_TENSOR, "Q8_0", "block" };
        bt_expect(lm_t_, "partial block", bt_try(&f, f.size, "bt-block"), want, 3);
    }
    memcpy(f.data + f.ne0_pos, ne0, 8);

    /* cut short: the last tensor's data runs past the end */
    {
        const char *want[] = { "Q8_0", "outside the file" };
        bt_expect(lm_t_, "truncated", bt_try(&f, f.size - 100, "bt-trunc"), want, 2);
    }
    free(f.data);
}
