/* cmd_bench.c - `lumen bench`: prefill and decode speed of one model, next to
 * the machine's copy bandwidth measured in the same run.
 *
 * Decode is memory-bound: each token reads every weight once, so its
 * roofline is weight_bytes / bandwidth. Prefill is compute-bound:
 * 2 * matmul_params flops per token (+ attention). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/lm_membw.h"
#include "../engine/lm_runner.h"
#include "../engine/lm_sampler.h"
#include "cli.h"

static const char *const k_help =
    "usage: lumen bench -m MODEL [options]\n"
    "\n"
    "Prints one JSON line: prefill tokens/s for a prompt of random ids, decode\n"
    "tokens/s after it, the bytes of weights each decoded token reads, the\n"
    "machine's memory bandwidth measured in the same run with the same threads\n"
    "(a STREAM-like copy, counting read + write bytes, and a streaming read),\n"
    "and decode speed as a fraction of the read roofline (weight bytes per token\n"
    "over read bandwidth) and of the copy figure.\n"
    "\n"
    "  -m, --model PATH  Hugging Face folder or .gguf file\n"
    "  --prompt-len N    prompt tokens (default 512)\n"
    "  --gen N           decoded tokens (default 64)\n"
    "  --reps N          repetitions, best is reported (default 3)\n"
    "  --no-membw        skip the bandwidth measurement\n"
    LM_COMMON_HELP;

/* Matmul parameters touched per token (everything but the embedding table,
 * which is only gathered), for the prefill flop count. */
static double matmul_params(const lm_model *m) {
    const lm_model_config *c = &m->cfg;
    double D = c->d_model, F = c->d_ff, QD = (double)c->n_heads * c->head_dim,
           KD = (double)c->n_kv_heads * c->head_dim;
    return c->n_layers * (2 * D * QD + 2 * D * KD + 3 * D * F) + (double)c->vocab * D;
}

int lm_cmd_bench(int argc, char **argv) {
    lm_common_opts co = { 0 };
    const char *model_path = NULL;
    long prompt_len = 512, gen = 64, reps = 3;
    bool membw = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int c = lm_cli_common(&co, argc, argv, &i);
        if (c < 0) return 2;
        if (c) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(k_help, stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(model_path = lm_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--prompt-len")) {
            if (!(v = lm_cli_value(argc, argv, &i)) || !lm_cli_int(v, 1, 1 << 20, &prompt_len)) goto bad;
        } else if (!strcmp(a, "--gen")) {
            if (!(v = lm_cli_value(argc, argv, &i)) || !lm_cli_int(v, 1, 1 << 20, &gen)) goto bad;
        } else if (!strcmp(a, "--reps")) {
            if (!(v = lm_cli_value(argc, argv, &i)) || !lm_cli_int(v, 1, 1000, &reps)) goto bad;
        } else if (!strcmp(a, "--no-membw")) {
            membw = false;
        } else {
            fprintf(stderr, "lumen bench: unknown option %s (see lumen bench --help)\n", a);
            return 2;
        }
        continue;
    bad:
        fprintf(stderr, "lumen bench: bad value for %s\n", a);
        return 2;
    }
    if (!model_path) {
        fprintf(stderr, "lumen bench: -m MODEL is required (see lumen bench --help)\n");
        return 2;
    }
    lm_backend *be = lm_cli_backend(&co);
    if (!be) return 1;
    lm_err e = { { 0 } };
    lm_model *m = NULL;
    lm_runner *r = NULL;
    int32_t *prompt = NULL;
    float *logits = NULL;
    int rc = 1;
    if (lm_model_load(&m, model_path, be, &e)) goto fail;
    if (lm_runner_create(&r, m, (int)(prompt_len + gen + 1), 512, &e)) goto fail;
    prompt = lm_xmalloc((size_t)prompt_len * sizeof *prompt);
    uint64_t x = 88172645463325252ull;
    for (long i = 0; i < prompt_len; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        prompt[i] = (int32_t)(x % (uint64_t)m->cfg.vocab);
    }
    logits = lm_xmalloc((size_t)m->cfg.vocab * sizeof(float));
    double best_prefill = 1e30, best_decode = 1e30;
    for (long rep = 0; rep < reps; rep++) {
        lm_runner_reset(r);
        double t0 = lm_now();
        if (lm_runner_eval(r, prompt, (int)prompt_len, false, logits, &e)) goto fail;
        double t1 = lm_now();
        for (long g = 0; g < gen; g++) {
            int32_t tok = lm_argmax(logits, m->cfg.vocab);
            if (lm_runner_eval(r, &tok, 1, false, logits, &e)) goto fail;
        }
        double t2 = lm_now();
        best_prefill = LM_MIN(best_prefill, t1 - t0);
        best_decode = LM_MIN(best_decode, t2 - t1);
    }
    double wbytes = (double)lm_model_weight_bytes(m);
    double prefill_tps = prompt_len / best_prefill, decode_tps = gen / best_decode;
    int threads = lm_cpu_backend_threads(be);
    double bw = membw ? lm_copy_bandwidth((size_t)1 << 30, threads, 5) : 0;
    double rbw = membw ? lm_read_bandwidth((size_t)1 << 30, threads, 5) : 0;
    printf("{\"model\":\"%s\",\"backend\":\"%s\",\"threads\":%d,\"weight_bytes\":%.0f,"
           "\"prompt_len\":%ld,\"prefill_tok_s\":%.2f,\"prefill_gflops\":%.2f,"
           "\"gen\":%ld,\"decode_tok_s\":%.3f,\"decode_weight_GB_s\":%.3f",
           model_path, be->name, threads, wbytes, prompt_len, prefill_tps,
           2 * matmul_params(m) * prefill_tps * 1e-9, gen, decode_tps, wbytes * decode_tps * 1e-9);
    /* Two yardsticks: STREAM's copy figure counts read + write bytes; a decode
     * step only reads weights, so the streaming-read rate is its roofline. */
    if (bw > 0 && rbw > 0)
        printf(",\"copy_GB_s\":%.3f,\"read_GB_s\":%.3f,\"decode_roofline_tok_s\":%.3f,"
               "\"decode_pct_of_read_roofline\":%.1f,\"decode_pct_of_copy\":%.1f",
               bw * 1e-9, rbw * 1e-9, rbw / wbytes, 100 * decode_tps * wbytes / rbw, 100 * decode_tps * wbytes / bw);
    printf("}\n");
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "lumen: %s\n", e.msg);
done:
    free(prompt);
    free(logits);
    lm_runner_free(r);
    lm_model_free(m);
    lm_backend_destroy(be);
    return rc;
}
