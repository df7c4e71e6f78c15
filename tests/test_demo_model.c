/* test_demo_model.c - the bundled demo model (models/demo) matches
 * transformers' outputs for it, and its chat template and tokenizer load. */
#include <stdlib.h>
#include <string.h>

#include "engine/lm_parity.h"
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
