/* test_quantize.c - `lumen quantize` against llama-quantize.
 *
 * The fixtures' model.<MIX>.gguf were written by llama.cpp's llama-quantize
 * from model.bf16.gguf. lumen quantising the same bf16 file under the same
 * mix must give every tensor the same type (so the same file size) and the
 * same general.file_type: the per-tensor rules (output head, attn_v / qkv
 * and ffn_down in the layers that get more bits, norms and the hybrid's
 * small tensors left alone) are llama.cpp's. Then the written files run: in
 * lumen, and in llama.cpp itself through tools/llamacpp/oracle.mjs, which
 * must agree with lumen on the last position's log-probabilities and the
 * greedy ids (skipped, with the reason, when node-llama-cpp is absent). */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/lm_runner.h"
#include "format/gguf.h"
#include "lm_test.h"
#include "model/lm_model.h"
#include "quant/lm_quantize.h"
#include "test_util.h"

static const char *const k_mixes[] = { "Q8_0", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_XS" };

/* lumen's quantisation of DIR's bf16 file under mix into the tmpdir (malloc'd path). */
static char *quantize_fixture(lm_test_ctx *lm_t_, const char *dir, const char *mix) {
    char rel[256], out[512];
    snprintf(rel, sizeof rel, "gguf/%s/model.bf16.gguf", dir);
    char *src = lm_test_fixture_path(rel);
    if (!src) return NULL;
    snprintf(out, sizeof out, "%s/%s.%s.gguf", lm_test_tmpdir(), dir, mix);
    lm_err e = { { 0 } };
    lm_quantize_report rep;
    int rc = lm_quantize_gguf(src, out, lm_quant_mix_find(mix), 2, &rep, &e);
    LM_CHECK_MSG(rc == 0, "%s", e.msg);
    free(src);
    return rc == 0 ? strdup(out) : NULL;
}

static void check_same_table(lm_test_ctx *lm_t_, const char *dir) {
    for (size_t k = 0; k < LM_COUNT(k_mixes); k++) {
        char rel[256];
        snprintf(rel, sizeof rel, "gguf/%s/model.%s.gguf", dir, k_mixes[k]);
        char *theirs = lm_test_fixture_path(rel);
        if (!theirs) LM_SKIP("%s", lm_test_fixtures_why());
        char *ours = quantize_fixture(lm_t_, dir, k_mixes[k]);
        LM_REQUIRE(ours != NULL);
        lm_err e = { { 0 } };
        lm_gguf a, b;
        LM_REQUIRE(lm_gguf_open(&a, ours, &e) == 0);
        LM_REQUIRE(lm_gguf_open(&b, theirs, &e) == 0);
        LM_CHECK(a.n_tensors == b.n_tensors);
        int differ = 0;
        for (int i = 0; i < b.n_tensors; i++) {
            const lm_file_tensor *tb = &b.tensors[i], *ta = lm_gguf_find_tensor(&a, tb->name);
            if (!ta || strcmp(ta->type_name, tb->type_name) || ta->nbytes != tb->nbytes) {
                differ++;
                fprintf(stderr, "  %s %s %s: lumen %s, llama.cpp %s\n", dir, k_mixes[k], tb->name,
                        ta ? ta->type_name : "(missing)", tb->type_name);
            }
        }
        LM_CHECK(differ == 0);
        int64_t fa = -1, fb = -2, qa = -1, qb = -2;
        LM_CHECK(lm_gguf_get_int(&a, "general.file_type", &fa) && lm_gguf_get_int(&b, "general.file_type", &fb) &&
                 fa == fb);
        LM_CHECK(lm_gguf_get_int(&a, "general.quantization_version", &qa) &&
                 lm_gguf_get_int(&b, "general.quantization_version", &qb) && qa == qb);
        LM_CHECK(a.file.size == b.file.size);
        printf("  %s %-6s: %d tensors typed as llama-quantize types them, %zu bytes\n", dir, k_mixes[k],
               b.n_tensors, b.file.size);
        lm_gguf_close(&a);
        lm_gguf_close(&b);
        free(ours);
        free(theirs);
    }
}

LM_TEST(quantize_mix_llama_matches_llamacpp) { check_same_table(lm_t_, "llama-g256"); }
LM_TEST(quantize_mix_qwen3_matches_llamacpp) { check_same_table(lm_t_, "qwen3-g256"); }
LM_TEST(quantize_mix_qwen35_matches_llamacpp) { check_same_table(lm_t_, "qwen3.5-g256"); }

/* lumen and llama.cpp on the file lumen wrote: last-position logprobs within
 * tol (max |diff|) and tol_kl (KL(llama.cpp || lumen)), greedy ids equal
 * wherever lumen's top-2 margin is above twice that difference. */
static void check_in_llamacpp(lm_test_ctx *lm_t_, const char *dir, const char *mix, double tol, double tol_kl) {
    const char *why = lm_tu_llamacpp_missing();
    if (why) LM_SKIP("%s", why);
    char rel[256];
    snprintf(rel, sizeof rel, "gguf/%s/%s.llamacpp.json", dir, mix);
    char *ref = lm_test_fixture_path(rel);
    if (!ref) LM_SKIP("%s", lm_test_fixtures_why());
    json_t *jr = json_load_file(ref, 0, NULL);
    free(ref);
    json_t *pid = json_object_get(jr, "prompt_ids");
    int n_prompt = (int)json_array_size(pid);
    LM_REQUIRE(n_prompt > 0 && n_prompt <= 256);
    int32_t ids[256];
    for (int i = 0; i < n_prompt; i++) ids[i] = (int32_t)json_integer_value(json_array_get(pid, (size_t)i));
    json_decref(jr);
    char *ours = quantize_fixture(lm_t_, dir, mix);
    LM_REQUIRE(ours != NULL);
    char *out = lm_tu_llamacpp_answer(lm_t_, ours, ids, n_prompt, 16);
    json_t *j = out ? json_loads(out, 0, NULL) : NULL;
    free(out);
    LM_REQUIRE(j != NULL);
    json_t *gid = json_object_get(j, "greedy_ids"), *lp = json_object_get(j, "last_logprobs");
    int n_gen = (int)json_array_size(gid), V = (int)json_array_size(lp);
    lm_err e = { { 0 } };
    lm_backend *be = lm_cpu_backend_create(2, lm_cpu_isa_detect(), &e);
    LM_REQUIRE(be != NULL);
    lm_model *m = NULL;
    if (lm_model_load(&m, ours, be, &e)) {
        lm_backend_destroy(be);
        json_decref(j);
        free(ours);
        LM_REQUIRE(strstr(e.msg, "unsupported GGUF architecture"));
        LM_SKIP("llama.cpp runs it; lumen cannot load this architecture's GGUF yet: %s", e.msg);
    }
    LM_REQUIRE(m->cfg.vocab == V && n_gen >= 8);
    lm_runner *r = NULL;
    LM_REQUIRE(lm_runner_create(&r, m, n_prompt + n_gen + 1, 0, &e) == 0);
    float *logits = malloc((size_t)V * sizeof *logits);
    LM_REQUIRE(lm_runner_eval(r, ids, n_prompt, false, logits, &e) == 0);
    double mx = logits[lm_argmax(logits, V)], sum = 0, diff = 0, kl = 0;
    for (int i = 0; i < V; i++) sum += exp(logits[i] - mx);
    for (int i = 0; i < V; i++) {
        double a = logits[i] - mx - log(sum), b = json_number_value(json_array_get(lp, (size_t)i));
        diff = fmax(diff, fabs(a - b));
        kl += exp(b) * (b - a);
    }
    int equal = 0, checked = 0;
    for (int s = 0; s < n_gen; s++) {
        int a = lm_argmax(logits, V), b = (int)json_integer_value(json_array_get(gid, (size_t)s));
        if (lm_tu_top2_margin(logits, V) > 2 * diff) {
            checked++;
            LM_CHECK_MSG(a == b, "%s %s step %d: lumen %d, llama.cpp %d", dir, mix, s, a, b);
        }
        equal += a == b;
        int32_t t = b;
        LM_REQUIRE(lm_runner_eval(r, &t, 1, false, logits, &e) == 0);
    }
    printf("  %s %s written by lumen, run by llama.cpp and lumen: max |Δ logprob| %.4g, KL %.3g, greedy %d/%d "
           "equal (%d with a safe margin)\n", dir, mix, diff, kl, equal, n_gen, checked);
    /* few safe-margin steps are enough when every step agrees (the rule of
     * test_cpu_qdot.c and guard_kquant): a tiny random model's margins are
     * small against the int8 paths' last-position difference */
    LM_CHECK(diff <= tol && kl <= tol_kl && (checked >= n_gen / 4 || equal == n_gen));
    free(logits);
    lm_runner_free(r);
    lm_model_free(m);
    lm_backend_destroy(be);
    json_decref(j);
    free(ours);
}

/* Tolerances: 3x what lumen and llama.cpp differ by on llama.cpp's own files
 * of the type (test_guard_kquant.c), which differ for the same reasons. */
LM_TEST(quantize_q4_k_m_runs_in_llamacpp) { check_in_llamacpp(lm_t_, "llama-g256", "Q4_K_M", 0.31, 1e-3); }
LM_TEST(quantize_q8_0_runs_in_llamacpp) { check_in_llamacpp(lm_t_, "llama-g256", "Q8_0", 0.23, 6.6e-4); }
LM_TEST(quantize_iq4_xs_runs_in_llamacpp) { check_in_llamacpp(lm_t_, "llama-g256", "IQ4_XS", 0.31, 1e-3); }
LM_TEST(quantize_qwen3_q4_k_m_runs_in_llamacpp) { check_in_llamacpp(lm_t_, "qwen3-g256", "Q4_K_M", 0.31, 1e-3); }

/* The rules on shapes the fixtures lack: a 1-D weight that is not a norm,
 * the small tensors llama.cpp leaves alone, rows no K-quant block divides
 * (llama.cpp's 32-value fallback: Q5_0 for Q4_K, or F16 when not even 32
 * divides), a tied token_embd as the output head,
 * and the plain mixes. */
LM_TEST(quantize_mix_rules_on_odd_tensors) {
    lm_mix_state st = { .mix = lm_quant_mix_find("Q4_K_M"), .n_layer = 8 };
    const char *names[] = { "token_embd.weight", "blk.0.attn_v.weight" };
    lm_mix_prepare(&st, names, 2);
    LM_CHECK(st.tied && st.n_attn_v == 1);
    int64_t v1[1] = { 256 }, m256[2] = { 64, 256 }, m96[2] = { 64, 96 }, m40[2] = { 64, 40 };
    LM_CHECK(lm_mix_tensor_type(&st, "token_embd.weight", 2, m256, LM_BF16) == LM_Q6_K);
    LM_CHECK(lm_mix_tensor_type(&st, "blk.0.scale.weight", 1, v1, LM_F32) == LM_F32);
    LM_CHECK(lm_mix_tensor_type(&st, "blk.0.ffn_gate_inp.weight", 2, m256, LM_BF16) == LM_BF16);
    LM_CHECK(lm_mix_tensor_type(&st, "blk.0.ssm_conv1d.weight", 2, m256, LM_F32) == LM_F32);
    LM_CHECK(lm_mix_tensor_type(&st, "blk.0.attn_q.bias", 2, m256, LM_F32) == LM_F32);
    LM_CHECK(lm_mix_tensor_type(&st, "blk.0.attn_q.weight", 2, m96, LM_BF16) == LM_Q5_0);
    LM_CHECK(lm_mix_tensor_type(&st, "blk.0.attn_q.weight", 2, m40, LM_BF16) == LM_F16);
    LM_CHECK(lm_mix_tensor_type(&st, "blk.0.attn_q.weight", 2, m256, LM_BF16) == LM_Q4_K);
    st.mix = lm_quant_mix_find("Q6_K");
    LM_CHECK(lm_mix_tensor_type(&st, "blk.0.attn_q.weight", 2, m96, LM_BF16) == LM_Q8_0);
    st.mix = lm_quant_mix_find("IQ4_XS");
    LM_CHECK(lm_mix_tensor_type(&st, "blk.0.attn_q.weight", 2, m96, LM_BF16) == LM_IQ4_NL);
    st.mix = lm_quant_mix_find("Q5_K_S");
    LM_CHECK(lm_mix_tensor_type(&st, "blk.0.attn_q.weight", 2, m96, LM_BF16) == LM_Q5_1);
    st.mix = lm_quant_mix_find("f16");
    LM_CHECK(st.mix && lm_mix_tensor_type(&st, "blk.0.attn_q.weight", 2, m40, LM_BF16) == LM_F16);
    LM_CHECK(lm_mix_tensor_type(&st, "blk.0.attn_norm.weight", 1, v1, LM_F32) == LM_F32);
    LM_CHECK(lm_quant_mix_find("Q4_K_X") == NULL);
}

/* The commands end to end: a summary line and exit 0, usage errors exit 2,
 * bad input exits 1 with the reason, --help lists every mix. */
LM_TEST(quantize_and_convert_cli) {
    char *bf16 = lm_test_fixture_path("gguf/llama-g256/model.bf16.gguf"), *dir = lm_test_fixture_path("gguf/llama-g256");
    if (!bf16 || !dir) LM_SKIP("%s", lm_test_fixtures_why());
    char cmd[2048], out_path[512];
    snprintf(out_path, sizeof out_path, "%s/cli.gguf", lm_test_tmpdir());
    char *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "%s quantize %s %s --type q6_k -t 2", lm_test_lumen_bin(), bf16, out_path);
    LM_CHECK(lm_tu_run(cmd, &out, &err) == 0 && out && strstr(out, "Q6_K, 21 tensors (16 converted)") &&
             strstr(out, "F32 5 Q6_K 16"));
    free(out), free(err);
    snprintf(cmd, sizeof cmd, "%s convert %s %s --type Q8_0", lm_test_lumen_bin(), dir, out_path);
    LM_CHECK(lm_tu_run(cmd, &out, &err) == 0 && out && strstr(out, "F32 5 Q8_0 16"));
    free(out), free(err);
    snprintf(cmd, sizeof cmd, "%s quantize %s %s --type Q3_K_XL", lm_test_lumen_bin(), bf16, out_path);
    LM_CHECK(lm_tu_run(cmd, &out, &err) == 2 && err && strstr(err, "--type"));
    free(out), free(err);
    snprintf(cmd, sizeof cmd, "%s convert %s/nowhere %s", lm_test_lumen_bin(), lm_test_tmpdir(), out_path);
    LM_CHECK(lm_tu_run(cmd, &out, &err) == 1 && err && strstr(err, "config.json"));
    free(out), free(err);
    snprintf(cmd, sizeof cmd, "%s quantize --help", lm_test_lumen_bin());
    LM_CHECK(lm_tu_run(cmd, &out, NULL) == 0 && out && strstr(out, "Q4_K_M|Q4_K_S|Q5_K_M|Q5_K_S|Q6_K|Q8_0|Q4_0|IQ4_XS"));
    free(out);
    free(bf16);
    free(dir);
}
