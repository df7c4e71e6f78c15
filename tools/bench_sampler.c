/* bench_sampler.c - the host's cost of drawing one token (lm_sample) over
 * a large vocabulary, per filter setting: what a sampled request pays each
 * step on top of the forward.
 *
 *   bench_sampler [--vocab N] [--draws N] [--shape peaked|flat]
 *
 * Logits are fixed pseudo-random values (peaked: a few large ones over a
 * long low tail, as a language model's; flat: uniform in [0, 10), the
 * worst case for a filter that sorts only the distribution's head). Prints
 * milliseconds a draw, the best of 3 passes of --draws draws each; then
 * greedy under a grammar's token mask (lm_sample_masked) allowing every
 * id, and one in 64. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../src/engine/lm_sampler.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int vocab = 151669, draws = 50;
    const char *shape = "peaked";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--vocab")) vocab = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--draws")) draws = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--shape")) shape = argv[i + 1];
        else {
            fprintf(stderr, "usage: bench_sampler [--vocab N] [--draws N] [--shape peaked|flat]\n");
            return 2;
        }
    }
    if (vocab < 2 || draws < 1) return 2;
    float *x = malloc((size_t)vocab * sizeof *x);
    uint64_t z = 1;
    for (int v = 0; v < vocab; v++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        const double u = (double)(z >> 11) / 9007199254740992.0;
        x[v] = strcmp(shape, "flat") ? (float)(20.0 * pow(u, 8.0)) : (float)(10.0 * u);
    }
    const struct {
        const char *name;
        lm_sampler_params p;
    } sets[] = {
        { "greedy", { .temperature = 0, .top_p = 1 } },
        { "T 0.7, no filter", { .temperature = 0.7f, .top_p = 1 } },
        { "T 0.7, top_p 0.95", { .temperature = 0.7f, .top_p = 0.95f } },
        { "T 0.7, top_k 20, top_p 0.8", { .temperature = 0.7f, .top_k = 20, .top_p = 0.8f } },
        { "T 1, min_p 0.05", { .temperature = 1, .top_p = 1, .min_p = 0.05f } },
    };
    printf("lm_sample over %d ids, %s logits, best of 3 x %d draws:\n", vocab, shape, draws);
    long sink = 0;
    for (size_t k = 0; k < sizeof sets / sizeof sets[0]; k++) {
        lm_sampler_params p = sets[k].p;
        p.seed = 5;
        lm_sampler *s = lm_sampler_create(&p, vocab);
        double best = 1e30;
        for (int pass = 0; pass < 3; pass++) {
            const double t0 = now_s();
            for (int i = 0; i < draws; i++) sink += lm_sample(s, x);
            const double dt = (now_s() - t0) / draws;
            best = dt < best ? dt : best;
        }
        printf("  %-30s %8.3f ms\n", sets[k].name, best * 1e3);
        lm_sampler_free(s);
    }
    /* greedy under a grammar's mask: every id allowed (a JSON string's
     * content, about), and one in 64 */
    uint32_t *mask = malloc((size_t)(vocab + 31) / 32 * sizeof *mask);
    float *work = malloc((size_t)vocab * sizeof *work);
    const lm_sampler_params g = { .temperature = 0, .top_p = 1 };
    lm_sampler *s = lm_sampler_create(&g, vocab);
    for (int dense = 1; dense >= 0; dense--) {
        for (int w = 0; w < (vocab + 31) / 32; w++) mask[w] = dense ? ~0u : (w & 1 ? 0x10001u : 0);
        double best = 1e30;
        for (int pass = 0; pass < 3; pass++) {
            const double t0 = now_s();
            for (int i = 0; i < draws; i++) sink += lm_sample_masked(s, x, work, mask);
            const double dt = (now_s() - t0) / draws;
            best = dt < best ? dt : best;
        }
        printf("  %-30s %8.3f ms\n", dense ? "greedy, mask allows all" : "greedy, mask allows 1 in 64", best * 1e3);
    }
    lm_sampler_free(s);
    free(mask);
    free(work);
    printf("(ids drawn, summed: %ld)\n", sink);
    free(x);
    return 0;
}
