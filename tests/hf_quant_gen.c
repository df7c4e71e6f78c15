/* hf_quant_gen.c - FP8 / MLX checkpoint writer for the tests (hf_quant_gen.h). */
#include "hf_quant_gen.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/lm_file.h"
#include "format/safetensors.h"

/* ---- e4m3fn, from its definition ------------------------------------------ */

/* Code c (sign bit clear, c < 127): exponent bits e = c >> 3 (bias 7),
 * mantissa m = c & 7; subnormal m * 2^-9 when e is 0, else (8 + m) * 2^(e-10). */
static float hqg_e4m3_pos(int c) {
    int e = c >> 3, m = c & 7;
    return e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), e - 10);
}

float hqg_e4m3_value(uint8_t code) {
    int c = code & 0x7f;
    if (c == 0x7f) return NAN;
    float v = hqg_e4m3_pos(c);
    return (code & 0x80) ? -v : v;
}

uint8_t hqg_e4m3_encode(float x) {
    uint8_t sign = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    int c = 0;
    while (c < 0x7e && hqg_e4m3_pos(c + 1) <= a) c++;
    if (c < 0x7e) {
        float lo = a - hqg_e4m3_pos(c), hi = hqg_e4m3_pos(c + 1) - a;
        if (hi < lo || (hi == lo && (c & 1))) c++;
    }
    return (uint8_t)(sign | c);
}

/* ---- safetensors writing ------------------------------------------------------ */

static int hqg_by_name(const void *a, const void *b) {
    return strcmp(((const hqg_tensor *)a)->name, ((const hqg_tensor *)b)->name);
}

int hqg_write_safetensors(const char *path, hqg_tensor *t, int n) {
    qsort(t, (size_t)n, sizeof *t, hqg_by_name);
    json_t *h = json_object();
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < t[i].n_dims; d++) json_array_append_new(shape, json_integer(t[i].shape[d]));
        json_object_set_new(h, t[i].name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", t[i].dtype, "shape", shape, "data_offsets",
                                      (json_int_t)off, (json_int_t)(off + t[i].nbytes)));
        off += t[i].nbytes;
    }
    char *js = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(h);
    size_t len = strlen(js), padded = (len + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    int rc = f ? 0 : -1;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    if (!rc && fwrite(len8, 1, 8, f) != 8) rc = -1;
    if (!rc && fwrite(js, 1, len, f) != len) rc = -1;
    for (size_t i = len; !rc && i < padded; i++)
        if (fputc(' ', f) == EOF) rc = -1;
    for (int i = 0; !rc && i < n; i++)
        if (t[i].nbytes && fwrite(t[i].data, 1, t[i].nbytes, f) != t[i].nbytes) rc = -1;
    if (f && fclose(f)) rc = -1;
    free(js);
    return rc;
}

/* ---- quantisers ------------------------------------------------------------------ */

/* Buffers handed to the writer, freed together at the end. */
typedef struct hqg_out {
    hqg_tensor *t;
    int n;
    void **owned;
    int n_owned;
} hqg_out;

static void *hqg_own(hqg_out *o, size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    o->owned = realloc(o->owned, (size_t)(o->n_owned + 1) * sizeof *o->owned);
    o->owned[o->n_owned++] = p;
    return p;
}

static void hqg_add(hqg_out *o, const char *dtype, int n_dims, int64_t r, int64_t c, const void *data,
                    size_t nbytes, const char *fmt, ...) {
    o->t = realloc(o->t, (size_t)(o->n + 1) * sizeof *o->t);
    hqg_tensor *t = &o->t[o->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->dtype = dtype;
    t->n_dims = n_dims;
    t->shape[0] = r;
    t->shape[1] = c;
    t->data = data;
    t->nbytes = nbytes;
}

static void hqg_free_out(hqg_out *o) {
    for (int i = 0; i < o->n_owned; i++) free(o->owned[i]);
    free(o->owned);
    free(o->t);
}

/* FP8 with one f32 scale_inv per 128x128 tile (amax / 448); w [O][I] f32,
 * twin gets the dequantised values. */
/* E > 0: w is a stack [E][O][I] of experts (transformers 5's fused
 * experts), each with its own tiles: scales [E][R][C], named
 * <name>_scale_inv as transformers' fine-grained FP8 names them. */
static void hqg_fp8_block(hqg_out *q, const char *name, const float *w, int64_t E, int64_t O, int64_t I, float *twin) {
    const int64_t R = (O + 127) / 128, C = (I + 127) / 128, X = LM_MAX(E, 1);
    uint8_t *codes = hqg_own(q, (size_t)(X * O * I));
    float *s = hqg_own(q, (size_t)(X * R * C) * sizeof *s);
    for (int64_t x = 0; x < X; x++) {
        const float *wx = w + x * O * I;
        float *tx = twin + x * O * I, *sx = s + x * R * C;
        uint8_t *cx = codes + x * O * I;
        for (int64_t br = 0; br < R; br++)
            for (int64_t bc = 0; bc < C; bc++) {
                float amax = 0;
                for (int64_t r = br * 128; r < LM_MIN(O, br * 128 + 128); r++)
                    for (int64_t c = bc * 128; c < LM_MIN(I, bc * 128 + 128); c++) amax = fmaxf(amax, fabsf(wx[r * I + c]));
                float sc = amax > 0 ? amax / 448.0f : 1.0f;
                sx[br * C + bc] = sc;
                for (int64_t r = br * 128; r < LM_MIN(O, br * 128 + 128); r++)
                    for (int64_t c = bc * 128; c < LM_MIN(I, bc * 128 + 128); c++) {
                        cx[r * I + c] = hqg_e4m3_encode(wx[r * I + c] / sc);
                        tx[r * I + c] = hqg_e4m3_value(cx[r * I + c]) * sc;
                    }
            }
    }
    hqg_add(q, "F8_E4M3", E ? 3 : 2, E ? E : O, E ? O : I, codes, (size_t)(X * O * I), "%s", name);
    if (E) q->t[q->n - 1].shape[2] = I;
    hqg_add(q, "F32", E ? 3 : 2, E ? E : R, E ? R : C, s, (size_t)(X * R * C) * sizeof *s, "%s_scale_inv", name);
    if (E) q->t[q->n - 1].shape[2] = C;
}

/* FP8 with one bf16 scale for the tensor, stored with shape []. */
static void hqg_fp8_tensor(hqg_out *q, const char *name, const float *w, int64_t O, int64_t I, float *twin) {
    float amax = 0;
    for (int64_t i = 0; i < O * I; i++) amax = fmaxf(amax, fabsf(w[i]));
    uint16_t *s = hqg_own(q, 2);
    *s = lm_f32_to_bf16(amax > 0 ? amax / 448.0f : 1.0f);
    float sc = lm_bf16_to_f32(*s);
    uint8_t *codes = hqg_own(q, (size_t)(O * I));
    for (int64_t i = 0; i < O * I; i++) {
        codes[i] = hqg_e4m3_encode(w[i] / sc);
        twin[i] = hqg_e4m3_value(codes[i]) * sc;
    }
    hqg_add(q, "F8_E4M3", 2, O, I, codes, (size_t)(O * I), "%s", name);
    hqg_add(q, "BF16", 0, 0, 0, s, 2, "%s_scale", name);
}

/* MLX affine: per group of a row, scale = (max - min) / (2^bits - 1) and
 * bias = min, both rounded to the half type first; q = round((w - bias) /
 * scale) clamped; the row's values packed as one little-endian bit stream,
 * value i at bits [bits*i, bits*(i+1)) (MLX's extract_bits for 3, 5 and 6
 * bits; for 2, 4 and 8 the same as word i/k, k = 32 / bits). */
static void hqg_mlx(hqg_out *q, const char *name, const float *w, int64_t O, int64_t I, int bits, int group,
                    bool bf16, float *twin) {
    const int64_t G = I / group, P = I * bits / 32;
    const int qmax = (1 << bits) - 1;
    uint8_t *packed = hqg_own(q, (size_t)(O * P) * 4);
    uint16_t *sc = hqg_own(q, (size_t)(O * G) * 2), *bi = hqg_own(q, (size_t)(O * G) * 2);
    for (int64_t r = 0; r < O; r++)
        for (int64_t g = 0; g < G; g++) {
            const float *x = w + r * I + g * group;
            float mn = x[0], mx = x[0];
            for (int i = 1; i < group; i++) mn = fminf(mn, x[i]), mx = fmaxf(mx, x[i]);
            float s = mx > mn ? (mx - mn) / (float)qmax : 1.0f;
            sc[r * G + g] = bf16 ? lm_f32_to_bf16(s) : lm_f32_to_f16(s);
            bi[r * G + g] = bf16 ? lm_f32_to_bf16(mn) : lm_f32_to_f16(mn);
            float sf = bf16 ? lm_bf16_to_f32(sc[r * G + g]) : lm_f16_to_f32(sc[r * G + g]);
            float bf = bf16 ? lm_bf16_to_f32(bi[r * G + g]) : lm_f16_to_f32(bi[r * G + g]);
            for (int i = 0; i < group; i++) {
                long v = lrintf((x[i] - bf) / sf);
                int qv = (int)(v < 0 ? 0 : v > qmax ? qmax : v);
                int64_t col = g * group + i;
                uint8_t *row = packed + (size_t)(r * P) * 4;
                size_t bit = (size_t)(bits * col);
                row[bit / 8] |= (uint8_t)(qv << (bit % 8));
                if (bit % 8 + (size_t)bits > 8) row[bit / 8 + 1] |= (uint8_t)(qv >> (8 - bit % 8));
                twin[r * I + col] = sf * (float)qv + bf;
            }
        }
    const char *half = bf16 ? "BF16" : "F16";
    hqg_add(q, "U32", 2, O, P, packed, (size_t)(O * P) * 4, "%s", name);
    size_t n = strlen(name) - strlen("weight");
    hqg_add(q, half, 2, O, G, sc, (size_t)(O * G) * 2, "%.*sscales", (int)n, name);
    hqg_add(q, half, 2, O, G, bi, (size_t)(O * G) * 2, "%.*sbiases", (int)n, name);
}

/* ---- the folders ---------------------------------------------------------------- */

static const char *HQG_OVERRIDE = "model.layers.1.mlp.down_proj";

static bool hqg_quantised(hqg_scheme s, const lm_file_tensor *t) {
    size_t n = strlen(t->name);
    /* fused experts (3-D, named without .weight) in the block FP8 scheme */
    if (s == HQG_FP8_BLOCK && t->n_dims == 3 && strstr(t->name, ".mlp.experts.")) return true;
    if (t->n_dims != 2 || n < 7 || strcmp(t->name + n - 7, ".weight")) return false;
    bool mlx = s != HQG_FP8_BLOCK && s != HQG_FP8_TENSOR;
    return mlx || (!strstr(t->name, "embed_tokens") && !strstr(t->name, "lm_head"));
}

static void hqg_quantise(hqg_scheme s, hqg_out *q, const lm_file_tensor *t, const float *w, float *twin) {
    if (t->n_dims == 3) { /* fused experts */
        hqg_fp8_block(q, t->name, w, t->shape[0], t->shape[1], t->shape[2], twin);
        return;
    }
    int64_t O = t->shape[0], I = t->shape[1];
    size_t n = strlen(t->name) - strlen(".weight");
    bool override = s == HQG_MLX4_G64 && strlen(HQG_OVERRIDE) == n && !strncmp(t->name, HQG_OVERRIDE, n);
    switch (s) {
    case HQG_FP8_BLOCK: hqg_fp8_block(q, t->name, w, 0, O, I, twin); break;
    case HQG_FP8_TENSOR: hqg_fp8_tensor(q, t->name, w, O, I, twin); break;
    case HQG_MLX4_G64: hqg_mlx(q, t->name, w, O, I, override ? 8 : 4, override ? 32 : 64, true, twin); break;
    case HQG_MLX8_G32: hqg_mlx(q, t->name, w, O, I, 8, 32, false, twin); break;
    case HQG_MLX4_SWITCH: hqg_mlx(q, t->name, w, O, I, strstr(t->name, "mlp.gate.") ? 8 : 4, 32, true, twin); break;
    case HQG_MLX3_G64: hqg_mlx(q, t->name, w, O, I, 3, 64, true, twin); break;
    case HQG_MLX6_G64: hqg_mlx(q, t->name, w, O, I, 6, 64, false, twin); break;
    case HQG_MLX2_G32: hqg_mlx(q, t->name, w, O, I, 2, 32, true, twin); break;
    case HQG_MLX5_G32: hqg_mlx(q, t->name, w, O, I, 5, 32, true, twin); break;
    }
}

/* Expert x of a layer's matrix `kind` (gate, up, down): its index, or -1
 * for any other tensor. */
static int hqg_expert(const char *name, int *layer, char *kind) {
    int x, used = 0;
    if (sscanf(name, "model.layers.%d.mlp.experts.%d.%7[a-z]_proj.weight%n", layer, &x, kind, &used) != 3 || name[used])
        return -1;
    return x;
}

/* Every layer's experts as switch_mlp stacks [E][rows][cols], quantised as
 * one matrix of E * rows rows; the twin gets each expert's dequantised rows
 * under its own name (the per-expert layout lumen reads from HF folders). */
static void hqg_switch(hqg_out *q, hqg_out *tw, const lm_safetensors *st) {
    for (int i = 0; i < st->n_tensors; i++) {
        int layer;
        char kind[8];
        if (hqg_expert(st->tensors[i].name, &layer, kind) != 0) continue; /* once a stack: at expert 0 */
        const int64_t R = st->tensors[i].shape[0], C = st->tensors[i].shape[1];
        int E = 0;
        char name[200];
        for (;; E++) {
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s_proj.weight", layer, E, kind);
            if (!lm_safetensors_find(st, name)) break;
        }
        float *w = hqg_own(tw, (size_t)(E * R * C) * sizeof *w), *x = malloc((size_t)(E * R * C) * sizeof *x);
        for (int e = 0; e < E; e++) {
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s_proj.weight", layer, e, kind);
            const lm_file_tensor *t = lm_safetensors_find(st, name);
            lm_dequant_row(t->type, t->data, x + (size_t)(e * R * C), R * C);
        }
        snprintf(name, sizeof name, "model.layers.%d.mlp.switch_mlp.%s_proj.weight", layer, kind);
        hqg_mlx(q, name, x, E * R, C, 4, 32, true, w);
        free(x);
        for (int k = q->n - 3; k < q->n; k++) { /* the weight, scales, biases: [E][R][...] */
            q->t[k].n_dims = 3;
            q->t[k].shape[2] = q->t[k].shape[1];
            q->t[k].shape[0] = E, q->t[k].shape[1] = R;
        }
        for (int e = 0; e < E; e++)
            hqg_add(tw, "F32", 2, R, C, w + (size_t)(e * R * C), (size_t)(R * C) * sizeof *w,
                    "model.layers.%d.mlp.experts.%d.%s_proj.weight", layer, e, kind);
    }
}

/* config.json of src with the scheme's quantization entries (MLX writes the
 * same object under both keys). */
static int hqg_write_config(const char *src, const char *dst, hqg_scheme s) {
    char *in = lm_path_join(src, "config.json"), *out = lm_path_join(dst, "config.json");
    json_t *c = json_load_file(in, 0, NULL);
    int rc = c ? 0 : -1;
    if (c && (s == HQG_FP8_BLOCK || s == HQG_FP8_TENSOR)) {
        json_t *q = json_pack("{s:s, s:s, s:s}", "quant_method", "fp8", "activation_scheme", "dynamic", "fmt", "e4m3");
        if (s == HQG_FP8_BLOCK) json_object_set_new(q, "weight_block_size", json_pack("[i, i]", 128, 128));
        json_object_set_new(c, "quantization_config", q);
    } else if (c) {
        json_t *q = s == HQG_MLX4_G64      ? json_pack("{s:i, s:i}", "group_size", 64, "bits", 4)
                    : s == HQG_MLX4_SWITCH ? json_pack("{s:i, s:i}", "group_size", 32, "bits", 4)
                    : s == HQG_MLX3_G64    ? json_pack("{s:i, s:i}", "group_size", 64, "bits", 3)
                    : s == HQG_MLX6_G64    ? json_pack("{s:i, s:i}", "group_size", 64, "bits", 6)
                    : s == HQG_MLX2_G32    ? json_pack("{s:i, s:i}", "group_size", 32, "bits", 2)
                    : s == HQG_MLX5_G32    ? json_pack("{s:i, s:i}", "group_size", 32, "bits", 5)
                                           : json_pack("{s:i, s:i}", "group_size", 32, "bits", 8);
        if (s == HQG_MLX4_G64) json_object_set_new(q, HQG_OVERRIDE, json_pack("{s:i, s:i}", "group_size", 32, "bits", 8));
        int64_t L = json_integer_value(json_object_get(c, "num_hidden_layers"));
        for (int64_t l = 0; s == HQG_MLX4_SWITCH && l < L; l++) { /* mlx-lm's per-module entries */
            char mod[64];
            snprintf(mod, sizeof mod, "model.layers.%lld.mlp.gate", (long long)l);
            json_object_set_new(q, mod, json_pack("{s:i, s:i}", "group_size", 32, "bits", 8));
        }
        json_object_set(c, "quantization", q);
        json_object_set_new(c, "quantization_config", q);
    }
    if (c && json_dump_file(c, out, JSON_INDENT(2))) rc = -1;
    json_decref(c);
    free(in);
    free(out);
    return rc;
}

static int hqg_link_reference(const char *src, const char *dst) {
    char *from = lm_path_join(src, "reference.safetensors"), *to = lm_path_join(dst, "reference.safetensors");
    int rc = lm_file_exists(from) && symlink(from, to) ? -1 : 0;
    free(from);
    free(to);
    return rc;
}

int hqg_convert(const char *src, hqg_scheme scheme, const char *out, const char *twin, char *why, size_t why_n) {
    char *path = lm_path_join(src, "model.safetensors");
    lm_safetensors st = { 0 };
    lm_err e = { { 0 } };
    if (lm_safetensors_open(&st, path, &e)) {
        snprintf(why, why_n, "%s", e.msg);
        free(path);
        return -1;
    }
    free(path);
    hqg_out q = { 0 }, tw = { 0 };
    if (scheme == HQG_MLX4_SWITCH) hqg_switch(&q, &tw, &st);
    for (int i = 0; i < st.n_tensors; i++) {
        const lm_file_tensor *t = &st.tensors[i];
        int layer;
        char kind[8];
        if (scheme == HQG_MLX4_SWITCH && hqg_expert(t->name, &layer, kind) >= 0) continue; /* in a stack */
        int64_t n = lm_file_tensor_numel(t);
        float *w = hqg_own(&tw, (size_t)n * sizeof *w); /* the twin's data: the source, then dequantised */
        lm_dequant_row(t->type, t->data, w, n);
        hqg_add(&tw, "F32", t->n_dims, t->shape[0], t->shape[1], w, (size_t)n * sizeof *w, "%s", t->name);
        if (t->n_dims == 3) tw.t[tw.n - 1].shape[2] = t->shape[2];
        if (hqg_quantised(scheme, t)) {
            float *x = malloc((size_t)n * sizeof *x);
            memcpy(x, w, (size_t)n * sizeof *x);
            hqg_quantise(scheme, &q, t, x, w);
            free(x);
        } else {
            hqg_add(&q, t->type_name, t->n_dims, t->shape[0], t->shape[1], t->data, t->nbytes, "%s", t->name);
            if (t->n_dims == 3) q.t[q.n - 1].shape[2] = t->shape[2];
        }
    }
    int rc = 0;
    char *qpath = lm_path_join(out, "model.safetensors");
    if (hqg_write_safetensors(qpath, q.t, q.n) || hqg_write_config(src, out, scheme) || hqg_link_reference(src, out))
        rc = -1;
    free(qpath);
    if (!rc && twin) {
        char *tpath = lm_path_join(twin, "model.safetensors"), *cfg = lm_path_join(src, "config.json");
        char *tcfg = lm_path_join(twin, "config.json");
        json_t *c = json_load_file(cfg, 0, NULL);
        if (!c || json_dump_file(c, tcfg, JSON_INDENT(2)) || hqg_write_safetensors(tpath, tw.t, tw.n) ||
            hqg_link_reference(src, twin))
            rc = -1;
        json_decref(c);
        free(tpath);
        free(cfg);
        free(tcfg);
    }
    if (rc) snprintf(why, why_n, "could not write %s or %s", out, twin ? twin : "-");
    hqg_free_out(&q);
    hqg_free_out(&tw);
    lm_safetensors_close(&st);
    return rc;
}
