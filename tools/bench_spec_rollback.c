/* bench_spec_rollback.c - what rolling back a hybrid's recurrent state costs
 * speculative decoding, the two ways lm_spec.h weighs.
 *
 *   bench_spec_rollback [MODEL] [THREADS] [CONTEXT]   (from the repository root)
 *
 * On the CPU backend (default: models/demo, 2 threads, context 600): the
 * bytes of one sequence's state slot and the time to copy it (the snapshot
 * before a verify forward: lm_kv_state_copy); the time of one sequence's
 * forward of T = 1, 2, 4 and 8 tokens at CONTEXT positions (the verify
 * forward, and the marginal cost of a token fed again after a rejection),
 * and of the same forward keeping the state after each of its first T - 1
 * tokens (lm_batch_set_state_out: the per-position rollback, which replays
 * nothing). Forwards alternate between the two kinds, best of 30 each, so
 * that the machine's load falls on both; docs/architecture.md puts them
 * side by side with the acceptance measured by `lumen bench --spec`. */
#include <stdio.h>
#include <stdlib.h>

#include "../src/engine/lm_kv_cache.h"
#include "../src/engine/lm_batch_builder.h"
#include "../src/model/lm_model.h"

/* Best of reps forwards of T tokens at ctx; pp: slots for the state after
 * each of the first T - 1 tokens (NULL: none). */
static double forward_ms(lm_model *m, lm_kv_cache *kv, lm_kv_seq *seq, int32_t slot, int ctx, int T, int reps,
                         const int32_t *pp) {
    lm_batch_builder *bb = lm_batch_builder_create(T, 1, T, true);
    int32_t ids[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, out[8];
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        lm_batch_reset(bb);
        int s = lm_batch_add_seq(bb, seq->blocks, slot);
        int last = lm_batch_add_tokens(bb, s, ids, ctx, T);
        for (int i = 0; i < T; i++) lm_batch_add_out(bb, last - T + 1 + i);
        for (int i = 0; pp && i < T - 1; i++) lm_batch_set_state_out(bb, last - T + 1 + i, pp[i]);
        lm_batch_set_argmax(bb, out, NULL, false);
        double t0 = lm_now();
        lm_err e = { { 0 } };
        if (lm_batch_forward(bb, m, &kv->pool, NULL, &e)) {
            fprintf(stderr, "forward: %s\n", e.msg);
            exit(1);
        }
        double t = lm_now() - t0;
        if (t < best) best = t;
    }
    lm_batch_builder_free(bb);
    return best * 1e3;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "models/demo";
    const int threads = argc > 2 ? atoi(argv[2]) : 2, ctx = argc > 3 ? atoi(argv[3]) : 600;
    lm_err e = { { 0 } };
    lm_backend *be = lm_cpu_backend_create(threads, LM_ISA_AUTO, &e);
    lm_model *m = NULL;
    if (!be || lm_model_load(&m, path, be, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    lm_kv_cache *kv = NULL;
    if (lm_kv_cache_create_for(&kv, m, (lm_kv_types){ LM_KV_BF16, LM_KV_BF16 }, 16, (ctx + 32) / 16 + 1, 9, 0, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    lm_kv_seq seq = { 0 };
    lm_kv_seq_reserve(kv, &seq, ctx + 16, &e);
    int32_t slot = lm_kv_state_acquire(kv), snap = lm_kv_state_acquire(kv), pp[7];
    for (int i = 0; i < 7; i++) pp[i] = lm_kv_state_acquire(kv);
    const bool per_pos = lm_model_state_out(m);
    const size_t bytes = lm_kv_state_bytes(kv);
    double best = 1e30;
    for (int r = 0; r < 200; r++) {
        double t0 = lm_now();
        lm_kv_state_copy(kv, snap, slot);
        lm_backend_sync(be);
        double t = lm_now() - t0;
        if (t < best) best = t;
    }
    printf("{\"model\":\"%s\",\"threads\":%d,\"context\":%d,\"state_bytes\":%zu,\"state_copy_ms\":%.4f", path, threads,
           ctx, bytes, best * 1e3);
    for (int T = 1; T <= 8; T *= 2) {
        double plain = 1e30, pos = 1e30;
        for (int round = 0; round < 3; round++) {
            plain = LM_MIN(plain, forward_ms(m, kv, &seq, slot, ctx, T, 10, NULL));
            if (per_pos && T > 1) pos = LM_MIN(pos, forward_ms(m, kv, &seq, slot, ctx, T, 10, pp));
        }
        printf(",\"forward_T%d_ms\":%.4f", T, plain);
        if (per_pos && T > 1) printf(",\"forward_T%d_per_pos_ms\":%.4f", T, pos);
    }
    printf("}\n");
    lm_kv_seq_release(kv, &seq);
    lm_kv_cache_free(kv);
    lm_model_free(m);
    lm_backend_destroy(be);
    return 0;
}
