/* test_guard_kquant.c - quantised GGUF models against llama.cpp's own answers
 * (issue #25: the k-quant decoders were checked only against the test's own
 * quantiser, so a decoder and a quantiser wrong the same way would pass).
 *
 * Design. ../shared/fixtures/gguf/<model>/model.<TYPE>.gguf were quantised by
 * llama.cpp's llama-quantize, and <TYPE>.llamacpp.json holds llama.cpp's
 * answer on that very file: the log-probabilities at the last position of
 * prompt_ids (64 tokens) and 16 greedy ids. lumen loads the same file on
 * each CPU path and must give the same log-probabilities within a tolerance
 * measured per type, and the same greedy ids wherever llama.cpp's choice
 * was not a near-tie. The file types mix tensor types (Q4_K_M: Q4_K and
 * Q6_K; Q4_0: Q4_0 with a Q6_K output), so every decoder lumen has is on the
 * path: Q8_0, Q4_0, Q4_K, Q6_K, BF16.
 *
 * What differs legitimately: llama.cpp and lumen both round activations to
 * 8 bits before their quantised dot products, but in different blocks
 * (llama.cpp per 256 values for the k-quants, lumen per 32) and with
 * different f32 summation orders; bf16 has llama.cpp's f16/bf16 rounding.
 * GUARD_KQ_WORST holds the worst max |logprob(lumen) - logprob(llama.cpp)|
 * over the vocabulary and the worst KL(llama.cpp || lumen), measured on
 * 2026-12-02 over the AVX-512, AVX2 and scalar paths (int8 GEMV and, on
 * AVX-512 VNNI, the int8 prefill GEMM): 0.017 / 1.1e-5 (bf16) to 0.152 /
 * 9.0e-4 (IQ4_XS, Q6_K). The tolerances are 3x those. Greedy ids,
 * teacher-forced on llama.cpp's, must be equal wherever our top-2 margin
 * exceeds twice the logprob difference (3 to 15 of the 16 steps). A wrong
 * decoder detail (a min's sign, a scale's high bits, a 6-bit value's high
 * pair) moves the logprobs by far more (see tools/mutations.txt).
 *
 * Every file of the shared set loads now (the qwen3 GGUF architecture and
 * the Q5_K / IQ4_XS tensors since issue #26) and must. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/lm_runner.h"
#include "guard_util.h"
#include "lm_test.h"
#include "test_util.h"
#include "model/lm_model.h"

typedef struct kq_case {
    const char *model, *type;
    bool must_load;
    double worst, worst_kl; /* max |Δ logprob| and KL(llama.cpp || lumen) measured over the
                             * CPU paths (identical on all three); 0: not measured */
} kq_case;

static const kq_case GUARD_KQ_WORST[] = {
    { "llama-g256", "bf16", true, 0.01661, 1.05e-5 },  { "llama-g256", "Q8_0", true, 0.07336, 2.35e-4 },
    { "llama-g256", "Q4_0", true, 0.06857, 2.17e-4 },  { "llama-g256", "Q4_K_M", true, 0.0983, 4.17e-4 },
    { "llama-g256", "Q6_K", true, 0.1433, 8.52e-4 },   { "llama-g256", "Q5_K_M", true, 0.09648, 3.59e-4 },
    { "llama-g256", "IQ4_XS", true, 0.1521, 7.98e-4 }, { "qwen3-g256", "Q8_0", true, 0.07931, 2.42e-4 },
    { "qwen3-g256", "Q4_K_M", true, 0.1205, 6.27e-4 }, { "qwen3-g256", "Q6_K", true, 0.1471, 8.97e-4 },
};
#define GUARD_KQ_MARGIN 3.0
/* a combination that loads before it was measured: llama.cpp's own
 * quantisation error against transformers is ~0.05 KL at 4 bits */
#define GUARD_KQ_DEFAULT_TOL 0.3
#define GUARD_KQ_DEFAULT_KL 2e-3


static void kq_run(lm_test_ctx *lm_t_, const char *model, const char *type) {
    const kq_case *c = NULL;
    for (size_t i = 0; i < sizeof GUARD_KQ_WORST / sizeof *GUARD_KQ_WORST; i++)
        if (!strcmp(GUARD_KQ_WORST[i].model, model) && !strcmp(GUARD_KQ_WORST[i].type, type)) c = &GUARD_KQ_WORST[i];
    LM_REQUIRE(c != NULL);
    char rel[256];
    snprintf(rel, sizeof rel, "gguf/%s/model.%s.gguf", model, type);
    char *gguf = lm_test_fixture_path(rel);
    snprintf(rel, sizeof rel, "gguf/%s/%s.llamacpp.json", model, type);
    char *ref = lm_test_fixture_path(rel);
    if (!gguf || !ref) {
        free(gguf);
        free(ref);
        LM_SKIP("%s", lm_test_fixtures_why());
    }
    json_t *j = json_load_file(ref, 0, NULL);
    json_t *pid = json_object_get(j, "prompt_ids"), *gid = json_object_get(j, "greedy_ids");
    json_t *lp = json_object_get(j, "last_logprobs");
    int n_prompt = (int)json_array_size(pid), n_gen = (int)json_array_size(gid), V = (int)json_array_size(lp);
    LM_CHECK(n_prompt > 0 && n_prompt <= 256 && n_gen >= 8 && V > 0);
    const double tol = c->worst > 0 ? GUARD_KQ_MARGIN * c->worst : GUARD_KQ_DEFAULT_TOL;
    const double tol_kl = c->worst_kl > 0 ? GUARD_KQ_MARGIN * c->worst_kl : GUARD_KQ_DEFAULT_KL;
    const lm_cpu_isa isas[3] = { LM_ISA_AVX512, LM_ISA_AVX2, LM_ISA_SCALAR };
    lm_cpu_isa best = lm_cpu_isa_detect();
    int ran = 0;
    for (int k = 0; k < 3 && !lm_t_->failed && n_prompt > 0 && n_prompt <= 256; k++) {
        lm_cpu_isa isa = isas[k];
        if ((isa == LM_ISA_AVX512 && best != LM_ISA_AVX512) || (isa == LM_ISA_AVX2 && best == LM_ISA_SCALAR)) continue;
        if (GU_SANITIZED && isa != best) continue; /* see guard_util.h */
        lm_err e = { { 0 } };
        lm_backend *be = lm_cpu_backend_create(2, isa, &e);
        LM_CHECK_MSG(be != NULL, "%s", e.msg);
        if (!be) break;
        lm_model *m = NULL;
        if (lm_model_load(&m, gguf, be, &e)) {
            lm_backend_destroy(be);
            bool known = strstr(e.msg, "cannot compute with") || strstr(e.msg, "unsupported GGUF architecture");
            LM_CHECK_MSG(!c->must_load && known, "%s %s does not load: %s", model, type, e.msg);
            json_decref(j);
            free(gguf);
            free(ref);
            if (!c->must_load && known) LM_SKIP("lumen cannot load it yet: %s", e.msg);
            return;
        }
        LM_CHECK(m->cfg.vocab == V);
        lm_runner *r = NULL;
        LM_REQUIRE(lm_runner_create(&r, m, n_prompt + n_gen + 1, 0, &e) == 0);
        int32_t ids[256];
        for (int i = 0; i < n_prompt; i++) ids[i] = (int32_t)json_integer_value(json_array_get(pid, (size_t)i));
        float *logits = malloc((size_t)V * sizeof(float));
        LM_REQUIRE(lm_runner_eval(r, ids, n_prompt, false, logits, &e) == 0);
        double mx = logits[lm_argmax(logits, V)], sum = 0, err = 0, kl = 0;
        for (int i = 0; i < V; i++) sum += exp(logits[i] - mx);
        for (int i = 0; i < V; i++) {
            double ours = logits[i] - mx - log(sum), theirs = json_number_value(json_array_get(lp, (size_t)i));
            err = fmax(err, fabs(ours - theirs));
            kl += exp(theirs) * (theirs - ours);
        }
        /* greedy, teacher-forced on llama.cpp's ids: equal wherever our top-2
         * margin is clearly above the logprob differences seen above */
        int equal = 0, checked = 0;
        for (int s = 0; s < n_gen; s++) {
            int ours = lm_argmax(logits, V), theirs = (int)json_integer_value(json_array_get(gid, (size_t)s));
            double mg = lm_tu_top2_margin(logits, V);
            if (mg > 2 * err) {
                checked++;
                LM_CHECK_MSG(ours == theirs, "%s %s step %d: lumen %d, llama.cpp %d (margin %.3g)", model, type, s, ours,
                             theirs, mg);
            }
            if (ours != theirs) printf("  (step %d: lumen %d, llama.cpp %d, our margin %.3g)\n", s, ours, theirs, mg);
            equal += ours == theirs;
            int32_t t = theirs;
            LM_REQUIRE(lm_runner_eval(r, &t, 1, false, logits, &e) == 0);
        }
        printf("  %s %-6s %-6s max |Δ logprob| %.4g (tol %.3g), KL %.3g (tol %.2g), greedy %d/%d equal (%d with a "
               "safe margin)\n", model, type, lm_cpu_isa_name(isa), err, tol, kl, tol_kl, equal, n_gen, checked);
        LM_CHECK_MSG(err <= tol, "%s %s %s: max |logprob - llama.cpp| %.3g > %.3g", model, type, lm_cpu_isa_name(isa), err,
                     tol);
        LM_CHECK_MSG(kl <= tol_kl, "%s %s %s: KL(llama.cpp || lumen) %.3g > %.3g", model, type, lm_cpu_isa_name(isa), kl,
                     tol_kl);
        /* enough steps to mean something, unless every one is equal anyway
         * (the int8 prefill of issue #26 moves err, and with it the margin
         * rule, by rounding activations as llama.cpp does, differently) */
        LM_CHECK_MSG(checked >= n_gen / 4 || equal == n_gen, "%s %s: only %d of %d greedy steps had a safe margin",
                     model, type, checked, n_gen);
        free(logits);
        lm_runner_free(r);
        lm_model_free(m);
        lm_backend_destroy(be);
        ran++;
    }
    LM_CHECK(ran >= 1 || lm_t_->failed);
    json_decref(j);
    free(gguf);
    free(ref);
}

LM_TEST(guard_kquant_llama_bf16) { kq_run(lm_t_, "llama-g256", "bf16"); }
LM_TEST(guard_kquant_llama_q8_0) { kq_run(lm_t_, "llama-g256", "Q8_0"); }
LM_TEST(guard_kquant_llama_q4_0) { kq_run(lm_t_, "llama-g256", "Q4_0"); }
LM_TEST(guard_kquant_llama_q4_k_m) { kq_run(lm_t_, "llama-g256", "Q4_K_M"); }
LM_TEST(guard_kquant_llama_q6_k) { kq_run(lm_t_, "llama-g256", "Q6_K"); }
LM_TEST(guard_kquant_llama_q5_k_m) { kq_run(lm_t_, "llama-g256", "Q5_K_M"); }
LM_TEST(guard_kquant_llama_iq4_xs) { kq_run(lm_t_, "llama-g256", "IQ4_XS"); }
LM_TEST(guard_kquant_qwen3_q8_0) { kq_run(lm_t_, "qwen3-g256", "Q8_0"); }
LM_TEST(guard_kquant_qwen3_q4_k_m) { kq_run(lm_t_, "qwen3-g256", "Q4_K_M"); }
LM_TEST(guard_kquant_qwen3_q6_k) { kq_run(lm_t_, "qwen3-g256", "Q6_K"); }
