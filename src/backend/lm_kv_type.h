/* lm_kv_type.h - the element formats of the paged KV cache.
 *
 * A KV row is one token's K (or V) of one layer: W = kv_width values, the
 * layer's kv heads side by side. Its bytes depend on the format:
 *
 *   F32   W x f32                                   4 bytes a value
 *   BF16  W x bf16 (round to nearest even)          2
 *   Q8    W x int8 codes, then W/32 f16 scales      1.0625
 *   Q4    W/2 bytes of nibbles (value 2i in the low
 *         nibble of byte i), then W/32 f16 scales   0.5625
 *   Q4R   Q4 of the row after a fixed rotation of each rot-wide piece
 *         of a head (random signs, then a normalised Walsh-Hadamard)
 *
 * (quantised rows rounded up to 16 bytes). Scale groups are 32 consecutive values of the row
 * (W a multiple of 32; a group may span two narrow heads): d = f16(max|x| / Q) with Q = 127 (Q8) or 7
 * (Q4), code = round(x / d) in [-Q, Q] (Q4 stores code + 8), value = d *
 * code. The rotation R is orthogonal, so q.k = (Rq).(Rk) and sum p v =
 * R^T sum p (Rv): attention rotates q and un-rotates its output instead of
 * ever un-rotating the cache. It spreads a head's outlier channels over
 * all its values, which is what makes 4 bits usable.
 *
 * K and V pick their formats separately (lm_kv_pool.k_type, v_type). The
 * engine, the prefix cache and the model never look inside a row; the
 * backends' kv_write and attention ops dispatch on the tags. */
#ifndef LM_KV_TYPE_H
#define LM_KV_TYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum lm_kv_type {
    LM_KV_F32 = 0,
    LM_KV_BF16,
    LM_KV_Q8,
    LM_KV_Q4,
    LM_KV_Q4R,
    LM_KV_TYPE_COUNT
} lm_kv_type;

#define LM_KV_GROUP 32   /* values per scale */
#define LM_KV_ROW_ALIGN 16
#define LM_KV_MAX_ROT 512 /* widest rotated piece */

/* A cache's pair of formats (the --kv-k / --kv-v choice). */
typedef struct lm_kv_types {
    lm_kv_type k, v;
} lm_kv_types;

/* "f32", "bf16", "q8", "q4", "q4r". */
const char *lm_kv_type_name(lm_kv_type t);
/* The format named s (as above; "int8"/"int4"/"int4r" too); -1 if none. */
int lm_kv_type_parse(const char *s);
/* Parses a pair: one name for both ("q8"), or "K<k>V<v>" with k, v in
 * {32 (f32), 16 (bf16), 8 (q8), 4 (q4), 4r (q4r)}, e.g. "K8V4r". 0 or -1. */
int lm_kv_types_parse(const char *s, lm_kv_types *out);
/* "bf16" for equal types, else "K=q8,V=q4r" into buf. */
const char *lm_kv_types_str(lm_kv_types t, char *buf, size_t n);

static inline bool lm_kv_quantised(lm_kv_type t) { return t == LM_KV_Q8 || t == LM_KV_Q4 || t == LM_KV_Q4R; }
/* Bytes of the codes of a W-wide row (where its scales start). */
size_t lm_kv_codes_bytes(lm_kv_type t, int64_t w);
/* Bytes of one W-wide row, padded. */
size_t lm_kv_row_bytes(lm_kv_type t, int64_t w);

/* Encodes n values of x (n a multiple of 32 for quantised formats, n <= W)
 * into a W-wide row at dst: the reference every backend's kv_write
 * matches. Q4R rotates each rot-wide piece first (rot a power of two
 * dividing the head width, 2..LM_KV_MAX_ROT). */
void lm_kv_encode_row(lm_kv_type t, void *dst, const float *x, int64_t n, int64_t w, int rot);
/* Decodes values [c0, c0 + n) of a W-wide row into y as stored: for Q4R
 * still rotated. */
void lm_kv_decode(lm_kv_type t, const void *row, int64_t c0, int64_t n, int64_t w, float *y);

/* The rotation of one rot-wide piece, in place: x = R x, and its inverse
 * x = R^T x. The sign of element i is lm_kv_rot_sign(i). */
void lm_kv_rotate(float *x, int rot);
void lm_kv_unrotate(float *x, int rot);
/* +1 or -1: a fixed hash of i, the same on every backend. */
#ifdef __CUDACC__
#define LM_KV_HD __host__ __device__
#else
#define LM_KV_HD
#endif
static inline LM_KV_HD float lm_kv_rot_sign(int i) {
    uint32_t h = (uint32_t)i * 0x9E3779B1u;
    h ^= h >> 15;
    h *= 0x85EBCA77u;
    h ^= h >> 13;
    return (h & 1u) ? -1.0f : 1.0f;
}

#endif
