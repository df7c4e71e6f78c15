/* kv_format_case.h - one attention case over a KV cache in given formats,
 * on any backend (test_kv_formats.c on the CPU, test_cuda_kv_formats.c on
 * the GPU): three sequences share a pool through shuffled block tables;
 * their history is written, then one batch (a decode token, a short
 * continuation, a long chunk) is written and attended. */
#ifndef KV_FORMAT_CASE_H
#define KV_FORMAT_CASE_H

#include "backend/lm_backend.h"

typedef struct kvf_cfg {
    int H, Hkv, Dh, window;
    float softcap, scale;
    float outlier; /* > 0: K channels 3 and Dh-5 of every head scaled by it (keys' outlier channels) */
    bool decode;   /* one token per sequence in the batch (a decode step), else 1, 3 and 65 */
    int long_len;  /* the third sequence's length (0: 180); long ones split a decode kernel's keys into many tiles */
} kvf_cfg;

typedef struct kvf_result {
    int n_out;          /* floats of out */
    float *out;         /* [T][H*Dh] the attention output (malloc'd) */
    double err_deq;     /* max |out - reference over the cache's own decoded rows| / max |reference| */
    double err_f32;     /* |out - reference over the exact f32 K and V| / |reference| (norms over all outputs) */
    int rows_bad;       /* pool rows that differ from lm_kv_encode_row's bytes */
} kvf_result;

/* Runs the case on be with the cache in formats kvt (rotation width rot);
 * 0 on success (r filled, r->out to free), -1 if the cache cannot be made. */
int kvf_case(lm_backend *be, lm_kv_types kvt, int rot, const kvf_cfg *cf, uint64_t seed, kvf_result *r);

#endif
