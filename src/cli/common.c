/* common.c - what the subcommands share: the backend and sampling option
 * tables, the backend choice, the default model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../model/lm_model.h"
#include "cli.h"

/* ---- the shared option tables ---------------------------------------------------------- */

bool lm_cli_parse_device(lm_common_opts *o, const char *v) {
    long long n = 0;
    if (!strcmp(v, "auto")) o->device = LM_DEVICE_AUTO;
    else if (!strcmp(v, "cpu")) o->device = LM_DEVICE_CPU;
    else if (!strcmp(v, "cuda")) o->device = LM_DEVICE_CUDA, o->gpu = 0;
    else if (!strncmp(v, "cuda:", 5) && lm_opt_int(v + 5, 0, 1023, &n)) o->device = LM_DEVICE_CUDA, o->gpu = (int)n;
    else return false;
    return true;
}

static bool parse_device(void *dst, const char *v) { return lm_cli_parse_device(dst, v); }

static const lm_opt_choice k_isa[] = {
    { "auto", LM_ISA_AUTO }, { "scalar", LM_ISA_SCALAR }, { "avx2", LM_ISA_AVX2 }, { "avx512", LM_ISA_AVX512 },
    { NULL, 0 },
};

static const lm_opt_choice k_gpu_precision[] = {
    { "bf16", LM_GPU_PREC_BF16 }, { "exact", LM_GPU_PREC_EXACT }, { NULL, 0 },
};

const lm_opt lm_cli_common_opts[] = {
    { LM_OPT_INT, "--threads", "-t", LM_OPT_AT(lm_common_opts, threads), "N", "worker threads", "every core",
      .ilo = 0, .ihi = 1024 },
    { LM_OPT_CHOICE, "--isa", NULL, LM_OPT_AT(lm_common_opts, isa), NULL, "CPU code path", .choices = k_isa },
    { LM_OPT_CUSTOM, "--device", NULL, LM_OPT_AT(lm_common_opts, device), "NAME",
      "auto, cpu, cuda (GPU 0) or cuda:N (GPU N)",
      "auto, the GPU when one is present and the model fits in its free memory", .parse = parse_device,
      .want = "auto, cpu, cuda or cuda:N" },
    { LM_OPT_SIZE, "--gpu-memory", NULL, LM_OPT_AT(lm_common_opts, gpu_memory), "SIZE",
      "most GPU memory to use, e.g. 20G; weights, KV cache and prefix cache fit inside it", "all that is free",
      .ilo = 1 },
    { LM_OPT_CHOICE, "--gpu-precision", NULL, LM_OPT_AT(lm_common_opts, gpu_precision), NULL,
      "activations of the GPU's matrix products over bf16 weights and of its prefill attention: exact (kept "
      "f32, products split in three bf16 terms above 8 tokens: the CPU's results to ~1e-6, so caching, batching "
      "and speculation keep greedy tokens) or bf16 (rounded to bf16, one tensor-core product, as llama.cpp and "
      "vLLM do: prefill ~2.4x faster at 4k tokens and ~3.4x at 32k on an H200, KL ~2e-5 against f32 on the demo, "
      "but cached, batched and speculated greedy tokens can differ where two are nearly tied)",
      "exact (bf16 where LUMEN_CUDA_GEMM=bf16)", .choices = k_gpu_precision },
    { .kind = LM_OPT_END },
};

/* The backend's precision as the options ask (lm_gpu_precision). */
static void apply_gpu_precision(const lm_common_opts *o, lm_backend *be) {
    if (o->gpu_precision != LM_GPU_PREC_DEFAULT) lm_cuda_backend_bf16_act(be, o->gpu_precision == LM_GPU_PREC_BF16);
}

/* --spec MODE; draft:PATH keeps the path (argv's) for the engine to load. */
static bool parse_spec(void *dst, const char *v) {
    lm_engine_opts *o = dst;
    if (!strncmp(v, "draft:", 6) && v[6]) o->spec = LM_SPEC_DRAFT, o->spec_model = v + 6;
    else if (!strcmp(v, "off")) o->spec = LM_SPEC_OFF;
    else if (!strcmp(v, "lookup")) o->spec = LM_SPEC_LOOKUP;
    else if (!strcmp(v, "mtp")) o->spec = LM_SPEC_MTP;
    else if (!strcmp(v, "auto")) o->spec = LM_SPEC_AUTO;
    else return false;
    return true;
}

const lm_opt lm_cli_spec_opts[] = {
    { LM_OPT_CUSTOM, "--spec", NULL, LM_OPT_AT(lm_engine_opts, spec), "MODE",
      "speculative decoding: each step also checks guessed next tokens, in the same forward, and keeps those the "
      "model agrees with; the tokens are those of plain decoding (greedy), a sampled request keeps its "
      "distribution and, seeded, its tokens. MODE: lookup (guesses from n-grams of the prompt and the answer so "
      "far: pays when the answer copies its input), mtp (the model's own multi-token-prediction head: Qwen3.5 / "
      "Qwen3-Next checkpoints with mtp.* tensors; an error on other models), auto (lookup where it has a guess, "
      "else the MTP head if there is one), draft:PATH (a separate smaller model, a folder or .gguf with the same "
      "tokenizer, e.g. Qwen3-0.6B for Qwen3-8B: it decodes the guesses itself, with a KV cache of its own, on the "
      "same device) or off. Per sequence, the number of guesses follows their measured acceptance and the step's "
      "measured cost, and drops to none where guessing does not pay; a grammar-constrained request takes lookup "
      "or draft-model guesses only, cut where its grammar refuses them",
      "off", .parse = parse_spec, .want = "lookup, mtp, auto, draft:PATH or off" },
    { LM_OPT_INT, "--spec-draft", NULL, LM_OPT_AT(lm_engine_opts, spec_draft), "N",
      "most guessed tokens per sequence and step", "3 for mtp, 6 for lookup, auto and draft:PATH", .ilo = 1,
      .ihi = LM_SPEC_MAX_DRAFT },
    { LM_OPT_FLAG, "--spec-fixed", NULL, LM_OPT_AT(lm_engine_opts, spec_fixed), NULL,
      "always guess --spec-draft tokens where the proposer has them, without the adaptive policy (for measuring "
      "one depth)" },
    { LM_OPT_FLAG, "--spec-replay", NULL, LM_OPT_AT(lm_engine_opts, spec_replay), NULL,
      "roll back a rejected guess's recurrent state (Qwen3.5's linear attention) from a copy taken before the "
      "check, feeding the accepted tokens again, rather than from the state kept after every guessed position "
      "(the default where the backend keeps it: the CPU; for measuring one against the other)" },
    { .kind = LM_OPT_END },
};

/* --kv-type sets K and V; --kv-k and --kv-v then change one of them. */
static bool parse_kv_type(void *dst, const char *v) { return lm_kv_types_parse(v, dst) == 0; }
static bool parse_kv_k(void *dst, const char *v) {
    int t = lm_kv_type_parse(v);
    if (t >= 0) ((lm_kv_types *)dst)->k = (lm_kv_type)t;
    return t >= 0;
}
static bool parse_kv_v(void *dst, const char *v) {
    int t = lm_kv_type_parse(v);
    if (t >= 0) ((lm_kv_types *)dst)->v = (lm_kv_type)t;
    return t >= 0;
}

const lm_opt lm_cli_kv_opts[] = {
    { LM_OPT_CUSTOM, "--kv-type", NULL, .off = 0, .size = sizeof(lm_kv_types), "T",
      "KV cache format of K and V: f32, bf16, q8 (int8, a scale per 32 values), q4 (int4), q4r (int4 after a fixed "
      "Hadamard rotation of each head: about half q4's divergence from f32); or K<k>V<v> with k, v in 32, 16, 8, 4, "
      "4r (e.g. K8V4r)",
      "bf16 (eval: f32)", .parse = parse_kv_type, .want = "f32, bf16, q8, q4, q4r or K<bits>V<bits>" },
    { LM_OPT_CUSTOM, "--kv-k", NULL, .off = 0, .size = sizeof(lm_kv_types), "T", "K's format alone (after --kv-type)",
      "--kv-type's", .parse = parse_kv_k, .want = "f32, bf16, q8, q4 or q4r" },
    { LM_OPT_CUSTOM, "--kv-v", NULL, .off = 0, .size = sizeof(lm_kv_types), "T", "V's format alone (after --kv-type)",
      "--kv-type's", .parse = parse_kv_v, .want = "f32, bf16, q8, q4 or q4r" },
    { .kind = LM_OPT_END },
};

static const lm_opt_choice k_rope_scaling[] = {
    { "none", LM_ROPE_SET_NONE }, { "linear", LM_ROPE_SET_LINEAR }, { "yarn", LM_ROPE_SET_YARN }, { NULL, 0 } };

const lm_opt lm_cli_rope_opts[] = {
    { LM_OPT_CHOICE, "--rope-scaling", NULL, LM_OPT_AT(lm_rope_override, scaling), NULL,
      "RoPE scaling over the model's config: none, linear (positions divided by --rope-scale) or yarn (YaRN: "
      "low frequencies interpolated, high ones kept, attention scaled by 0.1 ln F + 1)",
      "the model's: config.json rope_scaling or GGUF rope.scaling.type", .choices = k_rope_scaling },
    { LM_OPT_FLOAT, "--rope-scale", NULL, LM_OPT_AT(lm_rope_override, factor), "F",
      "the scaling factor; with linear or yarn the context limit grows to F x the original context (needed when "
      "--rope-scaling names a type the model does not have; alone, it changes the model's own linear, llama3 or "
      "YaRN factor)",
      "the model's", .lo = 0, .lo_open = true, .hi = 1e6 },
    { LM_OPT_FLOAT, "--rope-freq-base", NULL, LM_OPT_AT(lm_rope_override, freq_base), "B", "RoPE base (rope_theta)",
      "the model's", .lo = 0, .lo_open = true, .hi = INFINITY, .hi_open = true },
    { LM_OPT_INT, "--yarn-orig-ctx", NULL, LM_OPT_AT(lm_rope_override, yarn_orig_ctx), "N",
      "YaRN: the context the model was trained on (original_max_position_embeddings)",
      "the model's, else max_position_embeddings", .ilo = 1, .ihi = 1 << 30 },
    { LM_OPT_FLOAT, "--yarn-beta-fast", NULL, LM_OPT_AT(lm_rope_override, beta_fast), "R",
      "YaRN: dims with more than R rotations over the original context keep their frequency", "the model's, else 32",
      .lo = 0, .lo_open = true, .hi = 1e6 },
    { LM_OPT_FLOAT, "--yarn-beta-slow", NULL, LM_OPT_AT(lm_rope_override, beta_slow), "R",
      "YaRN: dims with fewer than R rotations are fully interpolated", "the model's, else 1", .lo = 0,
      .lo_open = true, .hi = 1e6 },
    { .kind = LM_OPT_END },
};

const lm_opt lm_cli_sampling_opts[] = {
    { LM_OPT_FLOAT, "--temp", NULL, LM_OPT_AT(lm_sampler_params, temperature), "T", "sampling temperature; 0 = greedy",
      .lo = 0, .hi = INFINITY },
    { LM_OPT_INT, "--top-k", NULL, LM_OPT_AT(lm_sampler_params, top_k), "K", "keep the K most likely tokens; 0 = off",
      .ilo = 0, .ihi = 1 << 24 },
    { LM_OPT_FLOAT, "--top-p", NULL, LM_OPT_AT(lm_sampler_params, top_p), "P", "nucleus sampling mass; 1 = off",
      .lo = 0, .lo_open = true, .hi = 1 },
    { LM_OPT_FLOAT, "--min-p", NULL, LM_OPT_AT(lm_sampler_params, min_p), "P",
      "drop tokens below P x the top probability; 0 = off", .lo = 0, .hi = 1 },
    { LM_OPT_INT, "--seed", NULL, LM_OPT_AT(lm_sampler_params, seed), "S", "sampling seed; same seed, same tokens",
      .ilo = 0, .ihi = INT64_MAX },
    { .kind = LM_OPT_END },
};

/* ---- the backend ------------------------------------------------------------------------ */

static lm_backend *cpu_backend(const lm_common_opts *o) {
    lm_err e = { { 0 } };
    lm_backend *be = lm_cpu_backend_create(o->threads, o->isa, &e);
    if (!be) fprintf(stderr, "lumen: %s\n", e.msg);
    return be;
}

static lm_backend *choose_backend(const lm_common_opts *o, lm_source *model);

/* LUMEN_PROFILE=1 wraps the chosen backend in the op profiler. */
lm_backend *lm_cli_backend_for(const lm_common_opts *o, lm_source *model) {
    lm_backend *be = choose_backend(o, model);
    const char *prof = getenv("LUMEN_PROFILE");
    return be && prof && *prof && strcmp(prof, "0") ? lm_backend_profiled(be) : be;
}

static lm_backend *choose_backend(const lm_common_opts *o, lm_source *model) {
    lm_err e = { { 0 } };
    if (o->device == LM_DEVICE_CPU) return cpu_backend(o);
    if (o->device == LM_DEVICE_CUDA) {
        lm_backend *be = lm_cuda_backend_create(o->gpu, &e);
        if (!be) {
            fprintf(stderr, "lumen: --device cuda: %s\n", e.msg);
            return NULL;
        }
        if (o->gpu_memory) lm_backend_set_memory_limit(be, o->gpu_memory);
        apply_gpu_precision(o, be);
        return be;
    }
    char why[256];
    if (!lm_cuda_available(why, sizeof why)) return cpu_backend(o);
    lm_backend *be = lm_cuda_backend_create(0, &e);
    if (!be) {
        fprintf(stderr, "lumen: GPU present but not usable (%s); running on the CPU\n", e.msg);
        return cpu_backend(o);
    }
    if (o->gpu_memory) lm_backend_set_memory_limit(be, o->gpu_memory);
    apply_gpu_precision(o, be);
    /* the loader's measure (a model it would refuse runs on the CPU); a
     * model that cannot be opened is left for the load to report. The
     * weight table stays open in the source for that load. */
    size_t free_b, total_b, need = 0;
    lm_err ignored = { { 0 } };
    if (model && lm_model_tensor_bytes(model, &need, &ignored)) need = 0;
    lm_backend_mem_info(be, &free_b, &total_b);
    if (need > 0 && !lm_model_fits(need, free_b)) {
        fprintf(stderr, "lumen: the model's %.1f GiB of weights do not fit in the GPU's %.1f GiB free; running on the CPU\n",
                need / 1073741824.0, free_b / 1073741824.0);
        lm_backend_destroy(be);
        return cpu_backend(o);
    }
    return be;
}

lm_backend *lm_cli_backend(const lm_common_opts *o) { return lm_cli_backend_for(o, NULL); }

lm_source *lm_cli_open_model(const char *path) {
    lm_err e = { { 0 } };
    lm_source *src;
    if (lm_source_open(&src, path, &e)) {
        fprintf(stderr, "lumen: %s\n", e.msg);
        return NULL;
    }
    return src;
}

const char *lm_cli_default_model(void) {
    const char *env = getenv("LUMEN_MODEL");
    const char *path = env && *env ? env : LUMEN_DEFAULT_MODEL;
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/config.json", path);
    FILE *f = fopen(cfg, "r");
    if (!f) {
        fprintf(stderr, "lumen: no -m MODEL given and the default model %s is missing\n", path);
        return NULL;
    }
    fclose(f);
    return path;
}

/* ---- load progress on a terminal ---------------------------------------------------------- */

static void progress_draw(lm_cli_progress *p, const char *text) {
    fprintf(stderr, "\r\033[Klumen: loading %s: %s", p->name, text);
    fflush(stderr);
    p->drawn = true;
}

static void progress_bytes(void *user, size_t done, size_t total, int tensors) {
    lm_cli_progress *p = user;
    double now = lm_now();
    if (!p->on || (now - p->last < 0.1 && done < total)) return; /* ten redraws a second at most */
    p->last = now;
    const double gib = 1073741824.0;
    int pct = total ? (int)LM_MIN(100, (double)done * 100.0 / (double)total) : 100;
    char text[128];
    if (total >= (size_t)1 << 30)
        snprintf(text, sizeof text, "%d tensors, %.2f / %.2f GiB (%d%%)", tensors, done / gib, total / gib, pct);
    else
        snprintf(text, sizeof text, "%d tensors, %.0f / %.0f MiB (%d%%)", tensors, done / 1048576.0,
                 total / 1048576.0, pct);
    progress_draw(p, text);
}

static void progress_stage(void *user, const char *what) {
    lm_cli_progress *p = user;
    if (!p->on) return;
    if (what) {
        progress_draw(p, what);
        return;
    }
    fprintf(stderr, "\r\033[Klumen: %s ready in %.1f s\n", p->name, lm_now() - p->t0);
    fflush(stderr);
    p->drawn = false;
}

void lm_cli_progress_begin(lm_cli_progress *p, const char *model_path) {
    memset(p, 0, sizeof *p);
    const char *env = getenv("LUMEN_PROGRESS");
    p->on = isatty(STDERR_FILENO) && !(env && !strcmp(env, "0"));
    p->t0 = lm_now();
    /* the path's last component names the model */
    size_t n = strlen(model_path);
    while (n > 1 && model_path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && model_path[b - 1] != '/') b--;
    snprintf(p->name, sizeof p->name, "%.*s", (int)(n - b), model_path + b);
    p->hook = (lm_load_progress){ .bytes = progress_bytes, .stage = progress_stage, .user = p };
    if (p->on) progress_draw(p, "opening");
}

void lm_cli_progress_end(lm_cli_progress *p) {
    if (p->on && p->drawn) fputc('\n', stderr);
    p->drawn = false;
}
