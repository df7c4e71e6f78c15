/* test_demo_model.c - the bundled demo model (models/demo) matches
 * transformers' outputs for it, its chat template and tokenizer load, and
 * the runner's next-token picks agree with the host's. */
#include <stdlib.h>
#include <string.h>

#include "engine/lm_parity.h"
#include "engine/lm_runner.h"
#include "lm_test.h"
#include "test_util.h"
#include "template/lm_template.h"
#include "tokenizer/lm_tokenizer.h"

#define DEMO LUMEN_SOURCE_DIR "/models/demo"

LM_TEST(demo_model_parity) {
    lm_err e = { { 0 } };
    lm_backend *be = lm_tu_model_backend(2, &e);
    LM_REQUIRE(be != NULL);
    lm_parity_result res;
    int rc = lm_parity_run(DEMO, be, 1e-3, &res, &e);
    LM_CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc == 0) {
        char *js = lm_parity_json(DEMO, be, &res);
        printf("  %s\n", js);
        free(js);
        LM_CHECK(res.n_prompts == 3 && res.ok);
        for (int i = 0; i < res.n_prompts; i++) LM_CHECK(res.prompts[i].greedy_checked >= 12);
    }
    lm_backend_destroy(be);
}

LM_TEST(demo_model_chat_prompt_tokens) {
    lm_err e = { { 0 } };
    lm_tokenizer *tok = NULL;
    LM_REQUIRE(lm_tokenizer_load(&tok, DEMO, &e) == 0);
    const char *src = lm_tokenizer_chat_template(tok);
    LM_REQUIRE(src != NULL);
    lm_template *t = NULL;
    LM_REQUIRE(lm_template_parse(src, strlen(src), "chat_template.jinja", &t, &e) == 0);
    json_t *ctx = json_pack("{s:[{s:s,s:s}],s:b}", "messages", "role", "user", "content", "Write a Python function `add`",
                            "add_generation_prompt", 1);
    char *out = NULL;
    size_t n = 0;
    LM_REQUIRE(lm_template_render(t, ctx, NULL, &out, &n, &e) == 0);
    LM_CHECK(!strcmp(out, "<|im_start|>user\nWrite a Python function `add`<|im_end|>\n<|im_start|>assistant\n"));
    lm_tok_ids ids = { 0 };
    LM_CHECK(lm_tokenizer_encode(tok, out, n, true, &ids, &e) == 0);
    /* special tokens come out whole */
    LM_CHECK(ids.n > 4 && ids.ids[0] == lm_tokenizer_token_to_id(tok, "<|im_start|>", 12));
    LM_CHECK(lm_tokenizer_eos(tok) == lm_tokenizer_token_to_id(tok, "<|im_end|>", 10));
    lm_tok_ids_free(&ids);
    free(out);
    json_decref(ctx);
    lm_template_free(t);
    lm_tokenizer_free(tok);
}

/* lm_runner_next: a greedy sampler's tokens come from the backend's argmax
 * (no logits copied) and equal lm_argmax of the copied logits; a sampling
 * one draws the same tokens as lm_sample on lm_runner_eval's logits with the
 * same seed. On the model device of the suite (LUMEN_TEST_DEVICE). */
LM_TEST(runner_next_greedy_on_backend_and_sampled) {
    lm_err e = { { 0 } };
    lm_backend *be = lm_tu_model_backend(2, &e);
    LM_REQUIRE(be != NULL);
    lm_model *m = NULL;
    LM_REQUIRE(lm_model_load(&m, DEMO, be, &e) == 0);
    enum { N = 24 };
    const int32_t prompt[] = { 9, 120, 77, 3001, 45, 8 };
    const int V = m->cfg.vocab;
    float *logits = malloc((size_t)V * sizeof *logits);
    for (int mode = 0; mode < 2; mode++) {
        const lm_sampler_params sp = { .temperature = mode ? 0.8f : 0.0f, .top_p = 1, .seed = 7 };
        lm_sampler *s1 = lm_sampler_create(&sp, V), *s2 = lm_sampler_create(&sp, V);
        LM_CHECK(lm_sampler_greedy(s1) == (mode == 0));
        lm_runner *r1 = NULL, *r2 = NULL;
        LM_REQUIRE(lm_runner_create(&r1, m, 64, 0, &e) == 0 && lm_runner_create(&r2, m, 64, 0, &e) == 0);
        int32_t a[N], b[N], cur;
        LM_REQUIRE(lm_runner_next(r1, prompt, 6, s1, logits, &a[0], &e) == 0);
        LM_REQUIRE(lm_runner_eval(r2, prompt, 6, false, logits, &e) == 0);
        b[0] = lm_sample(s2, logits);
        for (int i = 1; i < N; i++) {
            cur = a[i - 1];
            LM_REQUIRE(lm_runner_next(r1, &cur, 1, s1, logits, &a[i], &e) == 0);
            LM_REQUIRE(lm_runner_eval(r2, &b[i - 1], 1, false, logits, &e) == 0);
            b[i] = lm_sample(s2, logits);
        }
        LM_CHECK_MSG(!memcmp(a, b, sizeof a), "mode %d: the tokens differ", mode);
        int distinct = 0;
        for (int i = 1; i < N; i++) distinct += a[i] != a[0];
        LM_CHECK(distinct > 0); /* a real continuation, not one id repeated */
        lm_runner_free(r1), lm_runner_free(r2);
        lm_sampler_free(s1), lm_sampler_free(s2);
    }
    free(logits);
    lm_model_free(m);
    lm_backend_destroy(be);
}
