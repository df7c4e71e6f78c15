/* hf_quant.c - repack Hugging Face FP8 and MLX affine weights (hf_quant.h).
 *
 * Design: driven by the tensors, told the parameters by config.json. Every
 * F8_E4M3 tensor is an FP8 weight and must have a scale tensor; with an MLX
 * "quantization" config every U32 "X.weight" is a packed weight and must
 * have X.scales and X.biases. The scales go into the blocks as the
 * checkpoint has them (FP8 scales widened to f32, which is exact; MLX
 * halves bit for bit), so a repacked tensor dequantises to exactly what the
 * checkpoint's own formula gives. Shapes and dtypes of the weight and of each
 * scale tensor are checked before anything is read, and a bad one is a
 * one-line error naming the file and the tensor.
 *
 * The repacked tensors live in memory owned by the weight source (the rest
 * of the checkpoint stays mapped in place); they cost about the file size of
 * what they replace (FP8: +3 %; MLX 4-bit g64: 5 bits a value instead of 4.5,
 * since lumen's affine blocks hold 32 values). */
#include "hf_quant.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend/dtype_hf.h"

typedef struct hfq_ctx {
    lm_weight_source *ws;
    json_t *config;       /* dir/config.json, or NULL when there is none */
    const json_t *mlx;    /* the MLX "quantization" object, or NULL */
    int64_t fp8_block[2]; /* quantization_config.weight_block_size, default [128, 128] */
    lm_repacked_tensor *out;
    int n_out;
    size_t from_bytes;
    lm_err *e;
} hfq_ctx;

/* ---- config.json ---------------------------------------------------------- */

/* Reads what repacking needs from dir/config.json. A folder without one is
 * told so by the config loader, not here. */
static int hfq_read_config(hfq_ctx *c, const char *dir) {
    c->fp8_block[0] = c->fp8_block[1] = 128;
    char *path = lm_path_join(dir, "config.json");
    int rc = 0;
    if (!lm_file_exists(path)) goto done;
    json_error_t jerr;
    c->config = json_load_file(path, 0, &jerr);
    if (!c->config) {
        rc = lm_errf(c->e, "%s: invalid JSON at line %d: %s", path, jerr.line, jerr.text);
        goto done;
    }
    const json_t *qc = json_object_get(c->config, "quantization_config");
    const json_t *q = json_object_get(c->config, "quantization");
    if (json_is_object(q)) c->mlx = q;
    else if (json_is_object(qc) && json_object_get(qc, "bits") && json_object_get(qc, "group_size")) c->mlx = qc;
    const json_t *mode = c->mlx ? json_object_get(c->mlx, "mode") : NULL;
    if (mode && !(json_is_string(mode) && !strcmp(json_string_value(mode), "affine"))) {
        rc = lm_errf(c->e, "%s: MLX quantization mode %s is not supported (only affine is)", path,
                     json_is_string(mode) ? json_string_value(mode) : "(not a string)");
        goto done;
    }
    const json_t *bs = json_is_object(qc) ? json_object_get(qc, "weight_block_size") : NULL;
    if (bs && !json_is_null(bs)) {
        bool ok = json_is_array(bs) && json_array_size(bs) == 2;
        for (size_t i = 0; ok && i < 2; i++) {
            const json_t *v = json_array_get(bs, i);
            ok = json_is_integer(v) && json_integer_value(v) > 0;
            if (ok) c->fp8_block[i] = json_integer_value(v);
        }
        if (!ok) rc = lm_errf(c->e, "%s: quantization_config.weight_block_size is not two positive integers", path);
    }
done:
    free(path);
    return rc;
}

/* MLX bits and group size of a module: its own entry in the quantization
 * object when it has one (mixed-precision checkpoints), else the defaults. */
static void hfq_mlx_params(const hfq_ctx *c, const char *module, int *bits, int *group) {
    const json_t *own = json_object_get(c->mlx, module);
    const json_t *b = json_is_object(own) ? json_object_get(own, "bits") : NULL;
    const json_t *g = json_is_object(own) ? json_object_get(own, "group_size") : NULL;
    if (!b) b = json_object_get(c->mlx, "bits");
    if (!g) g = json_object_get(c->mlx, "group_size");
    *bits = json_is_integer(b) ? (int)json_integer_value(b) : 0;
    *group = json_is_integer(g) ? (int)json_integer_value(g) : 0;
}

/* ---- helpers ---------------------------------------------------------------- */

static void hfq_shape(char *buf, size_t n, const lm_file_tensor *t) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->n_dims && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

static bool hfq_is_2d(const lm_file_tensor *t, int64_t rows, int64_t cols) {
    return t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols;
}

/* A scale tensor's values as f32 (F32, BF16 or F16 are exact), or NULL
 * with the error set. */
static float *hfq_widen(const hfq_ctx *c, const lm_file_tensor *s, const char *file) {
    if (s->type != LM_F32 && s->type != LM_BF16 && s->type != LM_F16) {
        lm_errf(c->e, "%s: tensor \"%s\" has type %s, expected F32, BF16 or F16", file, s->name, s->type_name);
        return NULL;
    }
    int64_t n = lm_file_tensor_numel(s);
    float *v = lm_xmalloc((size_t)LM_MAX(n, 1) * sizeof *v);
    lm_dequant_row(s->type, s->data, v, n);
    return v;
}

/* Adds the repacked form of weight w (its name and file) to the table:
 * rows x cols, or stack x rows x cols when stack > 0 (a 3-D stack of
 * experts, rows each). */
static void hfq_add(hfq_ctx *c, const lm_file_tensor *w, const char *file, lm_dtype type, int64_t stack, int64_t rows,
                    int64_t cols, uint8_t *data) {
    c->out = lm_xrealloc(c->out, (size_t)(c->n_out + 1) * sizeof *c->out);
    lm_repacked_tensor *r = &c->out[c->n_out++];
    memset(r, 0, sizeof *r);
    r->t.name = lm_xstrdup(w->name);
    r->t.type = type;
    snprintf(r->t.type_name, sizeof r->t.type_name, "%s", lm_dtype_name(type));
    int d = 0;
    if (stack > 0) r->t.shape[d++] = stack;
    r->t.shape[d++] = rows;
    r->t.shape[d++] = cols;
    r->t.n_dims = d;
    r->t.data = data;
    r->t.nbytes = (size_t)LM_MAX(stack, 1) * (size_t)rows * lm_dtype_row_bytes(type, cols);
    r->file = file;
}

/* ---- FP8 ---------------------------------------------------------------------- */

/* How an FP8 weight's scale tensor maps onto its [O][I] values. */
typedef enum { HFQ_PER_TENSOR, HFQ_PER_ROW, HFQ_PER_BLOCK } hfq_fp8_kind;

/* Checks weight w's scale tensor s (`_scale_inv`: block scales, or one;
 * `_scale`: one, or one per row) and says how it maps. */
static int hfq_fp8_kind_of(const hfq_ctx *c, const lm_file_tensor *w, const lm_file_tensor *s, bool inv,
                           const char *file, hfq_fp8_kind *kind) {
    const int64_t B0 = c->fp8_block[0], B1 = c->fp8_block[1];
    const int64_t n = lm_file_tensor_numel(s);
    char got[96];
    hfq_shape(got, sizeof got, s);
    if (w->n_dims == 3) { /* a stack of experts: tiles per expert, or one scale */
        const int64_t E = w->shape[0], Rb = (w->shape[1] + B0 - 1) / B0, Cb = (w->shape[2] + B1 - 1) / B1;
        if (inv && s->n_dims == 3 && s->shape[0] == E && s->shape[1] == Rb && s->shape[2] == Cb && B1 % LM_FP8_BLOCK == 0)
            *kind = HFQ_PER_BLOCK;
        else if (n == 1)
            *kind = HFQ_PER_TENSOR;
        else
            return lm_errf(c->e, "%s: tensor \"%s\" has shape %s, expected [%lld, %lld, %lld] (%lldx%lld blocks of "
                           "each of \"%s\"'s experts) or one scale", file, s->name, got, (long long)E, (long long)Rb,
                           (long long)Cb, (long long)B0, (long long)B1, w->name);
        return 0;
    }
    const int64_t O = w->shape[0], I = w->shape[1];
    if (inv && hfq_is_2d(s, (O + B0 - 1) / B0, (I + B1 - 1) / B1)) {
        if (B1 % LM_FP8_BLOCK)
            return lm_errf(c->e, "%s: tensor \"%s\" has %lldx%lld block scales; lumen needs column blocks of a multiple of %d",
                           file, s->name, (long long)B0, (long long)B1, LM_FP8_BLOCK);
        *kind = HFQ_PER_BLOCK;
    } else if (n == 1) {
        *kind = HFQ_PER_TENSOR;
    } else if (!inv && n == O && (s->n_dims == 1 || hfq_is_2d(s, O, 1))) {
        *kind = HFQ_PER_ROW;
    } else if (inv) {
        return lm_errf(c->e, "%s: tensor \"%s\" has shape %s, expected [%lld, %lld] (%lldx%lld blocks of \"%s\")", file,
                       s->name, got, (long long)((O + B0 - 1) / B0), (long long)((I + B1 - 1) / B1), (long long)B0,
                       (long long)B1, w->name);
    } else {
        return lm_errf(c->e, "%s: tensor \"%s\" has shape %s, expected one scale or [%lld, 1]", file, s->name, got,
                       (long long)O);
    }
    return 0;
}

/* F8_E4M3 w [O][I] and its scale -> FP8_B128 rows: each block of 128
 * values of a row takes the scale of the tile (or row, or tensor) it is in.
 * A 3-D w [E][O][I] (transformers 5's fused experts, experts.gate_up_proj
 * with experts.gate_up_proj_scale_inv [E][tiles][tiles]) stays a stack,
 * each expert with its own tiles. */
static int hfq_fp8(hfq_ctx *c, const lm_file_tensor *w, const char *file) {
    if (w->n_dims != 2 && w->n_dims != 3)
        return lm_errf(c->e, "%s: tensor \"%s\" is F8_E4M3 with %d dimensions; FP8 weights must be matrices or stacks "
                       "of them", file, w->name, w->n_dims);
    const int64_t E = w->n_dims == 3 ? w->shape[0] : 0, O1 = w->shape[w->n_dims - 2], I = w->shape[w->n_dims - 1];
    const int64_t O = LM_MAX(E, 1) * O1; /* rows of every expert */
    if (I % LM_FP8_BLOCK)
        return lm_errf(c->e, "%s: tensor \"%s\" has rows of %lld FP8 values, not a multiple of %d", file, w->name,
                       (long long)I, LM_FP8_BLOCK);
    char name[512];
    snprintf(name, sizeof name, "%s_scale_inv", w->name);
    const char *sfile = NULL;
    const lm_file_tensor *s = lm_weights_find(c->ws, name, &sfile);
    bool inv = s != NULL;
    if (!s) {
        snprintf(name, sizeof name, "%s_scale", w->name);
        s = lm_weights_find(c->ws, name, &sfile);
    }
    if (!s)
        return lm_errf(c->e, "%s: tensor \"%s\" (F8_E4M3) has no scale tensor \"%s_scale_inv\" or \"%s_scale\"", file,
                       w->name, w->name, w->name);
    hfq_fp8_kind kind = HFQ_PER_TENSOR;
    if (hfq_fp8_kind_of(c, w, s, inv, sfile, &kind)) return -1;
    float *sv = hfq_widen(c, s, sfile);
    if (!sv) return -1;
    const int64_t nb = I / LM_FP8_BLOCK, B0 = c->fp8_block[0], B1 = c->fp8_block[1];
    const int64_t scale_cols = (I + B1 - 1) / B1, expert_tiles = (O1 + B0 - 1) / B0 * scale_cols;
    const size_t row = lm_dtype_row_bytes(LM_FP8_B128, I);
    uint8_t *data = lm_xmalloc(LM_MAX((size_t)O * row, 1));
    for (int64_t r = 0; r < O; r++) {
        for (int64_t j = 0; j < nb; j++) {
            int64_t at = kind == HFQ_PER_TENSOR ? 0
                         : kind == HFQ_PER_ROW  ? r
                                                : (r / O1) * expert_tiles + (r % O1 / B0) * scale_cols + j * LM_FP8_BLOCK / B1;
            uint8_t *dst = data + (size_t)r * row + (size_t)j * LM_FP8_BLOCK_BYTES;
            memcpy(dst, &sv[at], 4);
            memcpy(dst + 4, w->data + (size_t)r * (size_t)I + (size_t)j * LM_FP8_BLOCK, LM_FP8_BLOCK);
        }
    }
    free(sv);
    hfq_add(c, w, file, LM_FP8_B128, E, O1, I, data);
    c->from_bytes += w->nbytes + s->nbytes;
    return 0;
}

/* ---- MLX affine ------------------------------------------------------------------ */

/* The lumen type of MLX weights of `bits` with halves of type `half`: codes
 * of 2-4 bits go into 4-bit blocks, 5-8 bits into 8-bit ones. The values
 * stay exact (s * q + b with the checkpoint's own q); 2-, 3-, 5- and 6-bit
 * weights take more memory than their files (3-bit groups of 64: 5 bits a
 * value instead of 3.5). */
static lm_dtype hfq_affine_type(int bits, lm_dtype half) {
    if (bits <= 4) return half == LM_BF16 ? LM_A4_BF16 : LM_A4_F16;
    return half == LM_BF16 ? LM_A8_BF16 : LM_A8_F16;
}

/* Code i of a row MLX packed at `bits` bits: every width packs the row as
 * one little-endian bit stream, value i at bits [bits*i, bits*(i+1)) (for 3,
 * 5 and 6 bits in packs of 3, 5 and 3 bytes; for 2, 4 and 8 within bytes);
 * row_bytes bounds the read. */
static int hfq_mlx_code(const uint8_t *row, size_t row_bytes, int bits, int64_t i) {
    const size_t bit = (size_t)i * (size_t)bits, at = bit / 8;
    unsigned v = row[at];
    if (at + 1 < row_bytes) v |= (unsigned)row[at + 1] << 8;
    return (int)((v >> (bit % 8)) & ((1u << bits) - 1));
}

/* Finds X.scales or X.biases of MLX weight w and checks shape [O][G] (a
 * stack: [E][O][G]) and a half type; NULL with the error set. */
static const lm_file_tensor *hfq_mlx_side(hfq_ctx *c, const lm_file_tensor *w, const char *file, size_t prefix,
                                          const char *what, int64_t E, int64_t O, int64_t G, int bits, int group) {
    char name[512];
    snprintf(name, sizeof name, "%.*s%s", (int)prefix, w->name, what);
    const char *sfile = NULL;
    const lm_file_tensor *s = lm_weights_find(c->ws, name, &sfile);
    if (!s) {
        lm_errf(c->e, "%s: missing tensor \"%s\" (the %s of MLX-quantised \"%s\")", file, name, what, w->name);
        return NULL;
    }
    const bool shaped = E > 0 ? s->n_dims == 3 && s->shape[0] == E && s->shape[1] == O && s->shape[2] == G
                              : hfq_is_2d(s, O, G);
    if (!shaped) {
        char got[96], want[96];
        hfq_shape(got, sizeof got, s);
        if (E > 0) snprintf(want, sizeof want, "[%lld, %lld, %lld]", (long long)E, (long long)O, (long long)G);
        else snprintf(want, sizeof want, "[%lld, %lld]", (long long)O, (long long)G);
        lm_errf(c->e, "%s: tensor \"%s\" has shape %s, expected %s (%d-bit groups of %d)", sfile, name, got, want, bits,
                group);
        return NULL;
    }
    if (s->type != LM_BF16 && s->type != LM_F16) {
        lm_errf(c->e, "%s: tensor \"%s\" has type %s, expected BF16 or F16", sfile, name, s->type_name);
        return NULL;
    }
    return s;
}

/* U32 w [O][I*bits/32] with X.scales and X.biases [O][I/group] -> A4_* /
 * A8_* rows of 32-value blocks; a group of 64 or 128 gives its scale and
 * bias to each of its blocks. MLX packs value i of a row at bits
 * [bits*(i%k), bits*(i%k+1)) of little-endian word i/k (k = 32/bits): for
 * 4 bits, the low nibble of byte i/2 when i is even, else the high one.
 * A 3-D w [E][O][...] (mlx-lm's switch_mlp: a MoE layer's experts stacked)
 * has [E][O][I/group] scales and biases and stays a stack. */
static int hfq_mlx(hfq_ctx *c, const lm_file_tensor *w, const char *file) {
    const size_t prefix = strlen(w->name) - strlen("weight");
    char module[512];
    snprintf(module, sizeof module, "%.*s", (int)(prefix ? prefix - 1 : 0), w->name);
    int bits, group;
    hfq_mlx_params(c, module, &bits, &group);
    if (bits < 2 || bits > 8 || bits == 7)
        return lm_errf(c->e, "%s: tensor \"%s\" is quantised to %d bits; lumen reads MLX weights of 2, 3, 4, 5, 6 or 8 "
                       "bits", file, w->name, bits);
    if (group <= 0 || group % LM_AFF_BLOCK)
        return lm_errf(c->e, "%s: tensor \"%s\" has MLX groups of %d values; lumen needs a multiple of %d", file,
                       w->name, group, LM_AFF_BLOCK);
    if (w->n_dims != 2 && w->n_dims != 3)
        return lm_errf(c->e, "%s: tensor \"%s\" is U32 with %d dimensions; MLX weights must be matrices or stacks of "
                       "them", file, w->name, w->n_dims);
    const int64_t E = w->n_dims == 3 ? w->shape[0] : 0, O1 = w->shape[w->n_dims - 2], P = w->shape[w->n_dims - 1];
    const int64_t O = LM_MAX(E, 1) * O1, I = P * 32 / bits; /* O: rows of every expert */
    if ((P * 32) % bits)
        return lm_errf(c->e, "%s: tensor \"%s\" has rows of %lld words, not a whole number of %d-bit values", file,
                       w->name, (long long)P, bits);
    if (I % group)
        return lm_errf(c->e, "%s: tensor \"%s\" has rows of %lld values, not a whole number of groups of %d", file,
                       w->name, (long long)I, group);
    const int64_t G = I / group;
    const lm_file_tensor *sc = hfq_mlx_side(c, w, file, prefix, "scales", E, O1, G, bits, group);
    const lm_file_tensor *bi = sc ? hfq_mlx_side(c, w, file, prefix, "biases", E, O1, G, bits, group) : NULL;
    if (!bi) return -1;
    if (bi->type != sc->type)
        return lm_errf(c->e, "%s: tensor \"%.*sbiases\" has type %s, but its scales are %s", file, (int)prefix,
                       w->name, bi->type_name, sc->type_name);
    const lm_dtype type = hfq_affine_type(bits, sc->type);
    const int bb = lm_dtype_block_bytes(type);
    const size_t row = lm_dtype_row_bytes(type, I), src_row = (size_t)P * 4;
    uint8_t *data = lm_xmalloc(LM_MAX((size_t)O * row, 1));
    for (int64_t r = 0; r < O; r++) {
        const uint8_t *q = w->data + (size_t)r * src_row;
        for (int64_t k = 0; k < I / LM_AFF_BLOCK; k++) {
            uint8_t *dst = data + (size_t)r * row + (size_t)k * (size_t)bb;
            size_t gi = (size_t)(r * G + k * LM_AFF_BLOCK / group);
            memcpy(dst, sc->data + 2 * gi, 2);
            memcpy(dst + 2, bi->data + 2 * gi, 2);
            const uint8_t *qb = q + (size_t)k * LM_AFF_BLOCK * (size_t)bits / 8;
            if (bits == 8) {
                memcpy(dst + 4, qb, LM_AFF_BLOCK);
                continue;
            }
            if (bits != 4) { /* 2, 3, 5, 6 bits: codes off the bit stream into 4- or 8-bit slots */
                for (int j = 0; j < LM_AFF_BLOCK; j++) {
                    int code = hfq_mlx_code(q, src_row, bits, k * LM_AFF_BLOCK + j);
                    if (bits > 4) dst[4 + j] = (uint8_t)code;
                    else if (j < LM_AFF_BLOCK / 2) dst[4 + j] = (uint8_t)code;
                    else dst[4 + j - LM_AFF_BLOCK / 2] |= (uint8_t)(code << 4);
                }
                continue;
            }
            for (int j = 0; j < LM_AFF_BLOCK / 2; j++) {
                int lo = j, hi = j + LM_AFF_BLOCK / 2; /* values of the block */
                int qlo = (qb[lo / 2] >> (4 * (lo % 2))) & 0x0f, qhi = (qb[hi / 2] >> (4 * (hi % 2))) & 0x0f;
                dst[4 + j] = (uint8_t)(qlo | (qhi << 4));
            }
        }
    }
    hfq_add(c, w, file, type, E, O1, I, data);
    c->from_bytes += w->nbytes + sc->nbytes + bi->nbytes;
    return 0;
}

/* ---- the table ---------------------------------------------------------------- */

static int hfq_by_name(const void *a, const void *b) {
    return strcmp(((const lm_repacked_tensor *)a)->t.name, ((const lm_repacked_tensor *)b)->t.name);
}

static bool hfq_ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

int lm_hf_quant_repack(lm_weight_source *ws, const char *dir, lm_err *e) {
    hfq_ctx c = { .ws = ws, .e = e };
    int rc = hfq_read_config(&c, dir);
    for (int f = 0; !rc && f < ws->n_files; f++) {
        const lm_safetensors *st = &ws->st[f];
        for (int i = 0; !rc && i < st->n_tensors; i++) {
            const lm_file_tensor *t = &st->tensors[i];
            if (!strcmp(t->type_name, "F8_E4M3")) rc = hfq_fp8(&c, t, st->file.path);
            else if (c.mlx && !strcmp(t->type_name, "U32") && hfq_ends_with(t->name, ".weight"))
                rc = hfq_mlx(&c, t, st->file.path);
        }
    }
    json_decref(c.config);
    if (c.n_out) qsort(c.out, (size_t)c.n_out, sizeof *c.out, hfq_by_name);
    ws->repacked = c.out;
    ws->n_repacked = c.n_out;
    ws->repacked_from = c.from_bytes;
    if (rc) lm_hf_quant_free(ws);
    return rc;
}

void lm_hf_quant_free(lm_weight_source *ws) {
    for (int i = 0; i < ws->n_repacked; i++) {
        free(ws->repacked[i].t.name);
        free((void *)ws->repacked[i].t.data);
    }
    free(ws->repacked);
    ws->repacked = NULL;
    ws->n_repacked = 0;
    ws->repacked_from = 0;
}
