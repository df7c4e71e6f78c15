/* test_gguf_llamacpp.c - the GGUF fixture against llama.cpp's own answer.
 *
 * llama-2-tiny-random.llamacpp.json was produced by llama.cpp (node-llama-cpp
 * 3.21.1; tools/llamacpp/oracle.mjs regenerates it). llama.cpp multiplies F16
 * weights with activations rounded to F16, lumen keeps activations in f32, so
 * the two differ by that rounding; we bound it and demand identical greedy
 * tokens wherever the decision margin is larger than 10x that difference. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/lm_runner.h"
#include "engine/lm_sampler.h"
#include "lm_test.h"
#include "test_util.h"
#include "model/lm_model.h"

#define LLAMACPP_LOGPROB_TOL 2e-3


static void check_isa(lm_test_ctx *lm_t_, lm_cpu_isa isa) {
    char *gguf = lm_test_fixture_path("models/llama-2-tiny-random.gguf");
    char *ref = lm_test_fixture_path("models/llama-2-tiny-random.llamacpp.json");
    if (!gguf || !ref) {
        free(gguf);
        free(ref);
        LM_SKIP("%s", lm_test_fixtures_why());
    }
    lm_err e = { { 0 } };
    lm_backend *be = lm_cpu_backend_create(2, isa, &e);
    if (!be) {
        free(gguf);
        free(ref);
        LM_SKIP("%s backend unavailable: %s", lm_cpu_isa_name(isa), e.msg);
    }
    json_t *j = json_load_file(ref, 0, NULL);
    LM_REQUIRE(j != NULL);
    json_t *pid = json_object_get(j, "prompt_ids"), *gid = json_object_get(j, "greedy_ids");
    json_t *lp = json_object_get(j, "last_logprobs");
    int n_prompt = (int)json_array_size(pid), n_gen = (int)json_array_size(gid);
    lm_model *m = NULL;
    lm_runner *r = NULL;
    LM_REQUIRE(lm_model_load(&m, gguf, be, &e) == 0);
    LM_CHECK(m->cfg.vocab == 32000 && (int)json_array_size(lp) == 32000);
    LM_REQUIRE(lm_runner_create(&r, m, n_prompt + n_gen + 1, 0, &e) == 0);
    int32_t ids[64];
    for (int i = 0; i < n_prompt; i++) ids[i] = (int32_t)json_integer_value(json_array_get(pid, (size_t)i));
    float *logits = malloc(32000 * sizeof(float));
    LM_REQUIRE(lm_runner_eval(r, ids, n_prompt, false, logits, &e) == 0);

    /* log-softmax of the last prompt position vs llama.cpp's */
    double mx = logits[lm_argmax(logits, 32000)], sum = 0, err = 0;
    for (int i = 0; i < 32000; i++) sum += exp(logits[i] - mx);
    for (int i = 0; i < 32000; i++) {
        double ours = logits[i] - mx - log(sum);
        err = fmax(err, fabs(ours - json_real_value(json_array_get(lp, (size_t)i))));
    }
    printf("  last-position logprob max |lumen - llama.cpp| = %.3g (%s)\n", err, be->name);
    LM_CHECK(err <= LLAMACPP_LOGPROB_TOL);
    LM_CHECK(lm_argmax(logits, 32000) == json_integer_value(json_object_get(j, "argmax_last")));

    /* greedy continuation */
    int equal = 0, checked = 0;
    for (int s = 0; s < n_gen; s++) {
        int ours = lm_argmax(logits, 32000);
        int theirs = (int)json_integer_value(json_array_get(gid, (size_t)s));
        if (ours != theirs) {
            LM_CHECK_MSG(lm_tu_top2_margin(logits, 32000) <= 10 * LLAMACPP_LOGPROB_TOL,
                         "step %d: lumen %d, llama.cpp %d with margin %.3g", s, ours, theirs,
                         lm_tu_top2_margin(logits, 32000));
            break;
        }
        equal++;
        checked++;
        int32_t t = theirs;
        LM_REQUIRE(lm_runner_eval(r, &t, 1, false, logits, &e) == 0);
    }
    printf("  greedy: %d of %d tokens equal to llama.cpp\n", equal, n_gen);
    LM_CHECK(checked >= 16);
    free(logits);
    lm_runner_free(r);
    lm_model_free(m);
    json_decref(j);
    lm_backend_destroy(be);
    free(gguf);
    free(ref);
}

LM_TEST(gguf_llamacpp_agreement) { check_isa(lm_t_, LM_ISA_AUTO); }
LM_TEST(gguf_llamacpp_agreement_scalar) { check_isa(lm_t_, LM_ISA_SCALAR); }
