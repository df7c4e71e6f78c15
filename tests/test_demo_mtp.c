/* test_demo_mtp.c - the demo model's MTP head (lm_qwen35_mtp_forward) gives
 * the training code's MTP logits (reference.safetensors prompt{i}.mtp_logits:
 * train.py's MTP.forward in float32 over the main model's final hidden states
 * at positions 0..T-2 and the next tokens ids[1..T-1]), in one batch and one
 * position at a time. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/lm_kv_cache.h"
#include "lm_test.h"
#include "test_util.h"
#include "model/lm_qwen35.h"
#include "format/safetensors.h"

#define DEMO LUMEN_SOURCE_DIR "/models/demo"
#define KV_BLOCK 16

/* The MTP over n positions p0..p0+n-1 (tokens next[i], hidden rows hid[i]),
 * all rows, through the pool's block table `table`. */
static int mtp_run(lm_model *m, lm_kv_pool *pool, const int32_t *table, const int32_t *next, const float *hid,
                   int p0, int n, float *logits, lm_err *e) {
    int32_t *pos = malloc((size_t)n * sizeof *pos), *rows = malloc((size_t)n * sizeof *rows);
    int32_t *sq = calloc((size_t)n, sizeof *sq);
    for (int i = 0; i < n; i++) pos[i] = p0 + i, rows[i] = i;
    lm_batch b = { .n_tokens = n, .tokens = next, .pos = pos, .seq = sq, .n_seqs = 1, .block_tables = &table,
                   .n_out = n, .out_rows = rows };
    int rc = lm_qwen35_mtp_forward(m, pool, &b, hid, logits, e);
    free(pos), free(rows), free(sq);
    return rc;
}

LM_TEST(demo_mtp_matches_training_code) {
    lm_err e = { { 0 } };
    lm_backend *be = lm_tu_model_backend(2, &e);
    LM_REQUIRE(be != NULL);
    lm_model *m = NULL;
    LM_REQUIRE(lm_model_load(&m, DEMO, be, &e) == 0);
    const lm_qwen35_mtp *head = lm_qwen35_mtp_head(m);
    LM_REQUIRE(head && head->n_layers == 1);
    lm_safetensors ref = { 0 };
    LM_REQUIRE(lm_safetensors_open(&ref, DEMO "/reference.safetensors", &e) == 0);
    const int D = m->cfg.d_model, V = m->cfg.vocab;
    int n_prompts = 0;
    for (int i = 0;; i++, n_prompts++) {
        char name[64];
        snprintf(name, sizeof name, "prompt%d.ids", i);
        const lm_file_tensor *ti = lm_safetensors_find(&ref, name);
        if (!ti) break;
        snprintf(name, sizeof name, "prompt%d.mtp_logits", i);
        const lm_file_tensor *tl = lm_safetensors_find(&ref, name);
        LM_REQUIRE(ti->n_dims == 1 && !strcmp(ti->type_name, "I32") && tl && !strcmp(tl->type_name, "F32"));
        const int T = (int)ti->shape[0], n = T - 1;
        LM_REQUIRE(T >= 2 && tl->n_dims == 2 && tl->shape[0] == n && tl->shape[1] == V);
        const int32_t *ids = (const int32_t *)ti->data;
        const float *want = (const float *)tl->data;

        float *hidden = malloc((size_t)T * D * sizeof(float));
        float *got = malloc((size_t)n * V * sizeof(float)), *step = malloc((size_t)n * V * sizeof(float));
        LM_REQUIRE(lm_tu_q35_hidden(m, ids, T, hidden, &e) == 0);

        lm_kv_cache *mkv = NULL;
        LM_REQUIRE(lm_kv_cache_create(&mkv, be, head->n_layers, m->kv_width, KV_BLOCK, (n + KV_BLOCK - 1) / KV_BLOCK,
                                      NULL, &e) == 0);
        lm_kv_seq seq = { 0 };
        LM_REQUIRE(lm_kv_seq_reserve(mkv, &seq, n, &e) == 0);
        /* one batch: next tokens ids[1..T-1] at positions 0..T-2 */
        int rc = mtp_run(m, &mkv->pool, seq.blocks, ids + 1, hidden, 0, n, got, &e);
        LM_CHECK_MSG(rc == 0, "%s", e.msg);
        /* one position at a time through the same pool */
        for (int p = 0; rc == 0 && p < n; p++) {
            rc = mtp_run(m, &mkv->pool, seq.blocks, ids + 1 + p, hidden + (size_t)p * D, p, 1, step + (size_t)p * V, &e);
            LM_CHECK_MSG(rc == 0, "%s", e.msg);
        }
        lm_kv_seq_release(mkv, &seq);
        lm_kv_cache_free(mkv);

        if (rc == 0) {
            double err = 0, step_err = 0;
            for (size_t k = 0; k < (size_t)n * V; k++) {
                err = fmax(err, fabs((double)got[k] - want[k]));
                step_err = fmax(step_err, fabs((double)got[k] - step[k]));
            }
            /* argmax agrees wherever the reference's top-1/top-2 margin is well above the error */
            int checked = 0, mismatch = 0;
            for (int p = 0; p < n; p++) {
                const float *w = want + (size_t)p * V, *g = got + (size_t)p * V;
                int a = 0, ga = 0;
                for (int v = 1; v < V; v++) {
                    if (w[v] > w[a]) a = v;
                    if (g[v] > g[ga]) ga = v;
                }
                float second = -INFINITY;
                for (int v = 0; v < V; v++)
                    if (v != a && w[v] > second) second = w[v];
                if (w[a] - second > 10 * err) {
                    checked++;
                    mismatch += ga != a;
                }
            }
            printf("  prompt%d: %d positions, max abs err %.3g vs training code, step vs batch %.3g, "
                   "argmax checked %d, mismatched %d\n", i, n, err, step_err, checked, mismatch);
            LM_CHECK(err <= 1e-3);
            LM_CHECK(step_err <= 1e-4);
            LM_CHECK(mismatch == 0 && checked >= n / 2);
        }
        free(hidden), free(got), free(step);
    }
    LM_CHECK(n_prompts == 3);
    lm_safetensors_close(&ref);
    lm_model_free(m);
    lm_backend_destroy(be);
}
