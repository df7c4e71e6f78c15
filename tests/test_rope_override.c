/* test_rope_override.c - RoPE scaling from the command line (--rope-scaling,
 * --rope-scale, --rope-freq-base, --yarn-orig-ctx, --yarn-beta-fast,
 * --yarn-beta-slow) over the model's config: the frequencies are then those
 * of transformers' formulas for a config that said the same (the values of
 * test_rope_scaling.c), the context grows to the factor times the original,
 * the commands take the options and list them in --help, and contradictions
 * are refused with a message naming the options. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "lm_test.h"
#include "model/lm_config.h"
#include "model/lm_model.h"
#include "test_util.h"

static lm_model_config plain_config(void) {
    const lm_rope_config r = { .type = LM_ROPE_DEFAULT, .theta = 10000.0, .factor = 1.0, .partial_factor = 1 };
    return (lm_model_config){ .max_pos = 4096, .rope = r };
}

LM_TEST(rope_override_sets_the_formulas_frequencies) {
    float f[64];
    lm_err e = { { 0 } };
    /* --rope-scaling linear --rope-scale 2 on an unscaled model: every frequency halved */
    lm_model_config c = plain_config();
    LM_REQUIRE(lm_rope_override_apply(&c, &(lm_rope_override){ .scaling = LM_ROPE_SET_LINEAR, .factor = 2 }, &e) == 0);
    LM_CHECK(c.rope.type == LM_ROPE_LINEAR && c.max_pos == 8192);
    LM_CHECK(lm_rope_inv_freq(&c.rope, 128, f) == 1.0f);
    LM_CHECK_NEAR(f[0], 0.5, 1e-7);
    LM_CHECK_NEAR(f[17], 4.329821617e-02, 2e-6 * 4.329821617e-02);
    /* --rope-scaling yarn --rope-scale 4: over the original 4096, beta 32 / 1, mscale 0.1 ln 4 + 1 */
    c = plain_config();
    LM_REQUIRE(lm_rope_override_apply(&c, &(lm_rope_override){ .scaling = LM_ROPE_SET_YARN, .factor = 4 }, &e) == 0);
    LM_CHECK(c.rope.type == LM_ROPE_YARN && c.rope.orig_max_pos == 4096 && c.max_pos == 16384);
    LM_CHECK_NEAR(lm_rope_inv_freq(&c.rope, 128, f), 1.138629436, 1e-6);
    const int at[] = { 0, 10, 20, 25, 30, 40, 63 };
    const double want[] = { 1.0, 2.371373706e-01, 5.623413252e-02, 2.343455264e-02, 9.488517883e-03, 1.337886702e-03,
                            2.886954962e-05 };
    for (int i = 0; i < 7; i++)
        LM_CHECK_MSG(fabs(f[at[i]] - want[i]) <= 2e-6 * want[i], "yarn 4x: inv_freq[%d] = %.9g, want %.9g", at[i],
                     f[at[i]], want[i]);
    /* the same with --yarn-orig-ctx 8192 --rope-freq-base 1e6 on 64 dims: the 8x table's model at 4x */
    c = plain_config();
    lm_rope_override y8 = { .scaling = LM_ROPE_SET_YARN, .factor = 8, .yarn_orig_ctx = 8192, .freq_base = 1e6 };
    LM_REQUIRE(lm_rope_override_apply(&c, &y8, &e) == 0);
    LM_CHECK(c.max_pos == 65536 && c.rope.theta == 1e6);
    LM_CHECK_NEAR(lm_rope_inv_freq(&c.rope, 64, f), 1.207944154, 1e-6);
    LM_CHECK_NEAR(f[10], 1.074225598e-02, 2e-6 * 1.074225598e-02);
    LM_CHECK_NEAR(f[15], 4.919209736e-04, 2e-6 * 4.919209736e-04);
    /* --rope-scale alone changes a YaRN model's own factor and keeps its original context */
    c = plain_config();
    c.rope = (lm_rope_config){ .type = LM_ROPE_YARN, .theta = 10000.0, .factor = 2, .orig_max_pos = 4096,
                               .beta_fast = 32, .beta_slow = 1, .partial_factor = 1 };
    LM_REQUIRE(lm_rope_override_apply(&c, &(lm_rope_override){ .factor = 4 }, &e) == 0);
    LM_CHECK(c.rope.type == LM_ROPE_YARN && c.rope.factor == 4 && c.rope.orig_max_pos == 4096 && c.max_pos == 16384);
    /* --rope-scaling none turns a model's scaling off; nothing given changes nothing */
    LM_REQUIRE(lm_rope_override_apply(&c, &(lm_rope_override){ .scaling = LM_ROPE_SET_NONE }, &e) == 0);
    LM_CHECK(c.rope.type == LM_ROPE_DEFAULT && c.rope.factor == 1);
    lm_model_config before = c;
    LM_REQUIRE(lm_rope_override_apply(&c, &(lm_rope_override){ 0 }, &e) == 0);
    LM_CHECK(!memcmp(&before.rope, &c.rope, sizeof c.rope) && before.max_pos == c.max_pos);
}

LM_TEST(rope_override_refuses_contradictions) {
    static const struct {
        lm_rope_type had;
        lm_rope_override o;
        const char *needle;
    } cases[] = {
        { LM_ROPE_DEFAULT, { .scaling = LM_ROPE_SET_NONE, .factor = 2 }, "--rope-scaling none takes no --rope-scale" },
        { LM_ROPE_DEFAULT, { .scaling = LM_ROPE_SET_LINEAR }, "--rope-scaling linear needs --rope-scale" },
        { LM_ROPE_DEFAULT, { .scaling = LM_ROPE_SET_YARN }, "--rope-scaling yarn needs --rope-scale" },
        { LM_ROPE_DEFAULT, { .factor = 2 }, "--rope-scale needs --rope-scaling linear or yarn" },
        { LM_ROPE_DEFAULT, { .yarn_orig_ctx = 2048 }, "need --rope-scaling yarn" },
        { LM_ROPE_LINEAR, { .scaling = LM_ROPE_SET_LINEAR, .beta_fast = 16 }, "need --rope-scaling yarn" },
        { LM_ROPE_DEFAULT, { .scaling = LM_ROPE_SET_YARN, .factor = 4, .beta_fast = 1, .beta_slow = 2 },
          "--yarn-beta-fast (1) must be above --yarn-beta-slow (2)" },
    };
    for (size_t i = 0; i < LM_COUNT(cases); i++) {
        lm_model_config c = plain_config();
        c.rope.type = cases[i].had;
        lm_err e = { { 0 } };
        LM_CHECK_MSG(lm_rope_override_apply(&c, &cases[i].o, &e) == -1 && strstr(e.msg, cases[i].needle),
                     "case %zu: '%s'", i, e.msg);
    }
    /* a GGUF's Llama 3 frequency factors stay: no other type over them */
    lm_model_config c = plain_config();
    c.rope.type = LM_ROPE_LLAMA3, c.rope.freq_factors = true;
    lm_err e = { { 0 } };
    LM_CHECK(lm_rope_override_apply(&c, &(lm_rope_override){ .scaling = LM_ROPE_SET_YARN, .factor = 4 }, &e) == -1 &&
             strstr(e.msg, "rope_freqs.weight"));
}

/* Through the load: the model's inv_freq and attention factor are the
 * override's; gemma (a rope per layer type) refuses the options by name. */
LM_TEST(rope_override_reaches_the_loaded_model) {
    char *dir = lm_test_fixture_path("models/llama");
    if (!dir) LM_SKIP("fixture models/llama not available: %s", lm_test_fixtures_why());
    lm_backend *be = lm_tu_model_backend(1, NULL);
    lm_model *plain = NULL, *m = NULL;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_model_load(&plain, dir, be, &e) == 0);
    lm_source *src = NULL;
    LM_REQUIRE(lm_source_open(&src, dir, &e) == 0);
    const lm_model_load_opts lo = { NULL, { .scaling = LM_ROPE_SET_YARN, .factor = 4 } };
    LM_REQUIRE(lm_model_load_with(&m, src, be, &lo, &e) == 0);
    LM_CHECK(m->cfg.rope.type == LM_ROPE_YARN && m->cfg.max_pos == 4 * plain->cfg.max_pos);
    LM_CHECK(m->rot_dim == plain->rot_dim);
    float *want = malloc((size_t)m->rot_dim / 2 * sizeof(float));
    lm_rope_config r = plain->cfg.rope;
    r.type = LM_ROPE_YARN, r.factor = 4, r.orig_max_pos = plain->cfg.max_pos, r.beta_fast = 32, r.beta_slow = 1;
    LM_CHECK_NEAR(m->rope_attn_factor, lm_rope_inv_freq(&r, m->rot_dim, want), 1e-7);
    LM_CHECK_NEAR(m->rope_attn_factor, 0.1 * log(4.0) + 1.0, 1e-6);
    LM_CHECK(!memcmp(m->inv_freq, want, (size_t)m->rot_dim / 2 * sizeof(float)));
    LM_CHECK(m->inv_freq[m->rot_dim / 2 - 1] < plain->inv_freq[m->rot_dim / 2 - 1]); /* low frequencies scaled */
    LM_CHECK(m->inv_freq[0] == plain->inv_freq[0]);                                   /* high ones kept */
    free(want);
    lm_model_free(m);
    lm_model_free(plain);
    lm_source_unref(src);
    free(dir);

    char gdir[512];
    snprintf(gdir, sizeof gdir, "%s/tests/data/gemma/gemma3-x", LUMEN_SOURCE_DIR);
    LM_REQUIRE(lm_source_open(&src, gdir, &e) == 0);
    LM_CHECK(lm_model_load_with(&m, src, be, &lo, &e) == -1 && strstr(e.msg, "--rope-* options: gemma"));
    lm_source_unref(src);
    lm_backend_destroy(be);
}

/* The commands that load a model take the options and list them in --help;
 * a bad value and a contradiction are usage errors naming the option. */
LM_TEST(rope_override_cli_options) {
    static const char *const cmds[] = { "run", "chat", "serve", "bench" };
    static const char *const opts[] = { "--rope-scaling", "--rope-scale", "--rope-freq-base", "--yarn-orig-ctx",
                                        "--yarn-beta-fast", "--yarn-beta-slow" };
    char cmd[1024];
    for (size_t c = 0; c < LM_COUNT(cmds); c++) {
        char *out = NULL;
        snprintf(cmd, sizeof cmd, "'%s' %s --help", lm_test_lumen_bin(), cmds[c]);
        LM_CHECK(lm_tu_run(cmd, &out, NULL) == 0 && out);
        for (size_t o = 0; out && o < LM_COUNT(opts); o++)
            LM_CHECK_MSG(strstr(out, opts[o]), "%s --help has no %s", cmds[c], opts[o]);
        free(out);
    }
    char *err = NULL;
    snprintf(cmd, sizeof cmd, "'%s' run --rope-scaling ntk --prompt-ids 1", lm_test_lumen_bin());
    LM_CHECK(lm_tu_run(cmd, NULL, &err) == 2 && err && strstr(err, "--rope-scaling"));
    free(err);
    err = NULL;
    snprintf(cmd, sizeof cmd, "'%s' run --rope-scale 0 --prompt-ids 1", lm_test_lumen_bin());
    LM_CHECK(lm_tu_run(cmd, NULL, &err) == 2 && err && strstr(err, "--rope-scale"));
    free(err);
    char *dir = lm_test_fixture_path("models/llama");
    if (!dir) LM_SKIP("fixture models/llama not available: %s", lm_test_fixtures_why());
    err = NULL;
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' --device cpu --rope-scaling linear --prompt-ids 1 -n 1",
             lm_test_lumen_bin(), dir);
    LM_CHECK(lm_tu_run(cmd, NULL, &err) != 0 && err && strstr(err, "--rope-scaling linear needs --rope-scale"));
    free(err);
    /* a valid override runs */
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' --device cpu --rope-scaling yarn --rope-scale 4 --prompt-ids 1 -n 2",
             lm_test_lumen_bin(), dir);
    LM_CHECK(lm_tu_run(cmd, NULL, NULL) == 0);
    free(dir);
}
