/* kv_type.c - the KV cache's element formats: names, row sizes, and the
 * reference encoder, decoder and rotation (lm_kv_type.h). */
#include "lm_kv_type.h"

#include "../base/lm_base.h"
#include "lm_dtype.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static const char *const lm_kv_names[LM_KV_TYPE_COUNT] = { "f32", "bf16", "q8", "q4", "q4r" };

const char *lm_kv_type_name(lm_kv_type t) {
    return (unsigned)t < LM_KV_TYPE_COUNT ? lm_kv_names[t] : "?";
}

int lm_kv_type_parse(const char *s) {
    if (!s) return -1;
    for (int t = 0; t < LM_KV_TYPE_COUNT; t++)
        if (!strcasecmp(s, lm_kv_names[t])) return t;
    if (!strcasecmp(s, "int8") || !strcasecmp(s, "q8_0")) return LM_KV_Q8;
    if (!strcasecmp(s, "int4") || !strcasecmp(s, "q4_0")) return LM_KV_Q4;
    if (!strcasecmp(s, "int4r")) return LM_KV_Q4R;
    return -1;
}

/* "32", "16", "8", "4", "4r" after K or V. */
static int lm_kv_bits_parse(const char *s, size_t n) {
    static const char *const bits[LM_KV_TYPE_COUNT] = { "32", "16", "8", "4", "4r" };
    for (int t = 0; t < LM_KV_TYPE_COUNT; t++)
        if (strlen(bits[t]) == n && !strncasecmp(s, bits[t], n)) return t;
    return -1;
}

int lm_kv_types_parse(const char *s, lm_kv_types *out) {
    int t = lm_kv_type_parse(s);
    if (t >= 0) {
        *out = (lm_kv_types){ (lm_kv_type)t, (lm_kv_type)t };
        return 0;
    }
    if (!s || (s[0] != 'K' && s[0] != 'k')) return -1;
    const char *v = strpbrk(s + 1, "Vv");
    if (!v) return -1;
    int k = lm_kv_bits_parse(s + 1, (size_t)(v - s - 1)), vt = lm_kv_bits_parse(v + 1, strlen(v + 1));
    if (k < 0 || vt < 0) return -1;
    *out = (lm_kv_types){ (lm_kv_type)k, (lm_kv_type)vt };
    return 0;
}

const char *lm_kv_types_str(lm_kv_types t, char *buf, size_t n) {
    if (t.k == t.v) snprintf(buf, n, "%s", lm_kv_type_name(t.k));
    else snprintf(buf, n, "K=%s,V=%s", lm_kv_type_name(t.k), lm_kv_type_name(t.v));
    return buf;
}

size_t lm_kv_codes_bytes(lm_kv_type t, int64_t w) {
    switch (t) {
    case LM_KV_F32: return (size_t)w * 4;
    case LM_KV_BF16: return (size_t)w * 2;
    case LM_KV_Q8: return (size_t)w;
    case LM_KV_Q4:
    case LM_KV_Q4R: return (size_t)w / 2;
    default: LM_ASSERT(!"bad KV type");
    }
    return 0;
}

size_t lm_kv_row_bytes(lm_kv_type t, int64_t w) {
    size_t n = lm_kv_codes_bytes(t, w);
    if (!lm_kv_quantised(t)) return n; /* f32 rows stay kv_width floats: the f32 kernels' layout */
    LM_ASSERT(w % LM_KV_GROUP == 0);
    n += (size_t)(w / LM_KV_GROUP) * sizeof(uint16_t);
    return (n + LM_KV_ROW_ALIGN - 1) / LM_KV_ROW_ALIGN * LM_KV_ROW_ALIGN;
}

/* ---- rotation -------------------------------------------------------------- */

/* In-place Walsh-Hadamard transform of n (a power of two) values, scaled by
 * 1/sqrt(n) so that it is orthogonal (and its own inverse). */
static void lm_kv_fwht(float *x, int n) {
    for (int h = 1; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    const float s = 1.0f / sqrtf((float)n);
    for (int i = 0; i < n; i++) x[i] *= s;
}

void lm_kv_rotate(float *x, int rot) {
    LM_ASSERT(rot >= 1 && rot <= LM_KV_MAX_ROT && (rot & (rot - 1)) == 0);
    for (int i = 0; i < rot; i++) x[i] *= lm_kv_rot_sign(i);
    lm_kv_fwht(x, rot);
}

void lm_kv_unrotate(float *x, int rot) {
    LM_ASSERT(rot >= 1 && rot <= LM_KV_MAX_ROT && (rot & (rot - 1)) == 0);
    lm_kv_fwht(x, rot);
    for (int i = 0; i < rot; i++) x[i] *= lm_kv_rot_sign(i);
}

/* ---- encode / decode --------------------------------------------------------- */

/* One group of 32 values to codes (q: 127 or 7); returns the f16 scale. */
static uint16_t lm_kv_quant_group(const float *x, int q, int8_t *codes) {
    float amax = 0.0f;
    for (int i = 0; i < LM_KV_GROUP; i++) amax = fmaxf(amax, fabsf(x[i]));
    uint16_t dh = lm_f32_to_f16(amax / (float)q);
    float d = lm_f16_to_f32(dh);
    for (int i = 0; i < LM_KV_GROUP; i++) {
        float c = d > 0.0f ? rintf(x[i] / d) : 0.0f;
        codes[i] = (int8_t)fmaxf(-(float)q, fminf((float)q, c));
    }
    return dh;
}

void lm_kv_encode_row(lm_kv_type t, void *dst, const float *x, int64_t n, int64_t w, int rot) {
    LM_ASSERT(n >= 0 && n <= w);
    uint8_t *row = dst;
    switch (t) {
    case LM_KV_F32: memcpy(row, x, (size_t)n * sizeof(float)); return;
    case LM_KV_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = lm_f32_to_bf16(x[i]);
            memcpy(row + 2 * i, &h, 2);
        }
        return;
    default: break;
    }
    LM_ASSERT(n % LM_KV_GROUP == 0 && w % LM_KV_GROUP == 0);
    uint8_t *scales = row + lm_kv_codes_bytes(t, w);
    const int q = t == LM_KV_Q8 ? 127 : 7;
    if (t == LM_KV_Q4R) LM_ASSERT(rot >= 2 && rot <= LM_KV_MAX_ROT && (rot & (rot - 1)) == 0 && n % rot == 0);
    /* chunks of whole rotated pieces and whole scale groups (both powers of two) */
    const int chunk = t == LM_KV_Q4R ? LM_MAX(rot, LM_KV_GROUP) : LM_KV_GROUP;
    float buf[LM_KV_MAX_ROT];
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
        memcpy(buf, x + c0, (size_t)chunk * sizeof(float));
        if (t == LM_KV_Q4R)
            for (int p = 0; p < chunk; p += rot) lm_kv_rotate(buf + p, rot);
        for (int g0 = 0; g0 < chunk; g0 += LM_KV_GROUP) {
            int8_t c[LM_KV_GROUP];
            int64_t at = c0 + g0;
            uint16_t d = lm_kv_quant_group(buf + g0, q, c);
            memcpy(scales + 2 * (at / LM_KV_GROUP), &d, 2);
            if (t == LM_KV_Q8) memcpy(row + at, c, LM_KV_GROUP);
            else
                for (int i = 0; i < LM_KV_GROUP; i += 2)
                    row[(at + i) / 2] = (uint8_t)((c[i] + 8) | ((c[i + 1] + 8) << 4));
        }
    }
}

void lm_kv_decode(lm_kv_type t, const void *rowp, int64_t c0, int64_t n, int64_t w, float *y) {
    const uint8_t *row = rowp;
    switch (t) {
    case LM_KV_F32: memcpy(y, row + 4 * c0, (size_t)n * sizeof(float)); return;
    case LM_KV_BF16: {
        const uint16_t *h = (const uint16_t *)row + c0;
        for (int64_t i = 0; i < n; i++) y[i] = lm_bf16_to_f32(h[i]);
        return;
    }
    default: break;
    }
    const uint16_t *scales = (const uint16_t *)(row + lm_kv_codes_bytes(t, w));
    /* a segment at a time that stays inside one scale group */
    for (int64_t i = c0; i < c0 + n;) {
        const int64_t end = LM_MIN(c0 + n, (i / LM_KV_GROUP + 1) * LM_KV_GROUP);
        const float d = lm_f16_to_f32(scales[i / LM_KV_GROUP]);
        if (t == LM_KV_Q8) {
            const int8_t *c = (const int8_t *)row;
            for (; i < end; i++) y[i - c0] = d * (float)c[i];
        } else {
            for (; i < end; i++) {
                const uint8_t b = row[i / 2];
                y[i - c0] = d * (float)(((i & 1) ? b >> 4 : b & 15) - 8);
            }
        }
    }
}
