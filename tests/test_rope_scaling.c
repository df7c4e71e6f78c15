/* test_rope_scaling.c - RoPE scaling for long contexts (linear and YaRN, as
 * config.json's rope_scaling / rope_parameters and GGUF's rope.scaling.*
 * give them) against values of transformers' formulas
 * (_compute_linear_scaling_rope_parameters, _compute_yarn_parameters:
 * correction range floor/ceil of the wavelength dims, linear ramp, mscale
 * 0.1 ln(factor) + 1), computed independently in Python (float32
 * exponents, as torch takes them) and written here. */
#include "lm_test.h"
#include "model/lm_config.h"

#include <math.h>

static void rope_check(lm_test_ctx *lm_t_, const char *what, const float *got, const int *at, const double *want,
                       int n) {
    for (int i = 0; i < n; i++)
        LM_CHECK_MSG(fabs(got[at[i]] - want[i]) <= 2e-6 * want[i], "%s: inv_freq[%d] = %.9g, want %.9g", what, at[i],
                     got[at[i]], want[i]);
}

LM_TEST(rope_scaling_linear_and_yarn_match_transformers) {
    float f[64];
    /* linear, factor 2: every frequency halved, no attention factor */
    lm_rope_config lin = { .type = LM_ROPE_LINEAR, .theta = 10000.0, .factor = 2.0, .partial_factor = 1 };
    LM_CHECK(lm_rope_inv_freq(&lin, 128, f) == 1.0f);
    rope_check(lm_t_, "linear", f, (const int[]){ 0, 17, 63 }, (const double[]){ 5.0e-01, 4.329821617e-02, 5.773909923e-05 },
               3);
    /* YaRN, factor 4 over an original 4096 (beta 32 / 1): dims 20..46 blend */
    lm_rope_config y = { .type = LM_ROPE_YARN, .theta = 10000.0, .factor = 4.0, .orig_max_pos = 4096,
                         .beta_fast = 32, .beta_slow = 1, .partial_factor = 1 };
    float a = lm_rope_inv_freq(&y, 128, f);
    LM_CHECK_NEAR(a, 1.138629436, 1e-6);
    rope_check(lm_t_, "yarn 4x", f, (const int[]){ 0, 10, 20, 25, 30, 40, 63 },
               (const double[]){ 1.0, 2.371373706e-01, 5.623413252e-02, 2.343455264e-02, 9.488517883e-03,
                                 1.337886702e-03, 2.886954962e-05 },
               7);
    /* YaRN, factor 8 over 8192, theta 1e6, 64 rotary dims */
    lm_rope_config y8 = { .type = LM_ROPE_YARN, .theta = 1000000.0, .factor = 8.0, .orig_max_pos = 8192,
                          .beta_fast = 32, .beta_slow = 1, .partial_factor = 1 };
    a = lm_rope_inv_freq(&y8, 64, f);
    LM_CHECK_NEAR(a, 1.207944154, 1e-6);
    rope_check(lm_t_, "yarn 8x", f, (const int[]){ 0, 5, 10, 15, 20, 31 },
               (const double[]){ 1.0, 1.154781985e-01, 1.074225598e-02, 4.919209736e-04, 2.222849263e-05,
                                 1.924908158e-07 },
               6);
    /* an explicit attention_factor wins */
    y8.attn_factor = 1.5;
    LM_CHECK(lm_rope_inv_freq(&y8, 64, f) == 1.5f);
}
