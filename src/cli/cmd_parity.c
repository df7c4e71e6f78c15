/* cmd_parity.c - `lumen parity`: a model against transformers' reference
 * outputs (DIR/reference.safetensors) or against llama.cpp's answer on the
 * same GGUF file (--oracle). One JSON line; exit 0 only within tolerance. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/lm_parity.h"
#include "../base/lm_file.h"
#include "../engine/lm_parity_oracle.h"
#include "cli.h"

typedef struct parity_opts {
    const char *dir;
    const char *model;
    const char *oracle;
    double tol;
    double kl_tol;
    lm_common_opts co;
} parity_opts;

static const lm_opt k_opts[] = {
    { LM_OPT_ARG, "DIR", NULL, LM_OPT_AT(parity_opts, dir), NULL,
      "the folder with reference.safetensors (and, without --model, the model)" },
    { LM_OPT_STRING, "--model", "-m", LM_OPT_AT(parity_opts, model), "FILE",
      "the model to check instead of DIR's own (a GGUF file converted from DIR)", .ilo = 1 },
    { LM_OPT_STRING, "--oracle", NULL, LM_OPT_AT(parity_opts, oracle), "FILE.json",
      "check --model against llama.cpp's answer (tools/llamacpp/oracle.mjs) instead of DIR", .ilo = 1 },
    { LM_OPT_FLOAT, "--tolerance", "--tol", LM_OPT_AT(parity_opts, tol), "X",
      "the largest error allowed: |logit| against DIR, |log-probability| against --oracle",
      .lo = 0, .lo_open = true, .hi = INFINITY, .dflt = "by the model's least precise weight type" },
    { LM_OPT_FLOAT, "--kl-tolerance", NULL, LM_OPT_AT(parity_opts, kl_tol), "X",
      "with --oracle: the largest KL(llama.cpp || lumen) allowed", .lo = 0, .lo_open = true, .hi = INFINITY,
      .dflt = "by weight type" },
    { LM_OPT_GROUP, .off = offsetof(parity_opts, co), .group = lm_cli_common_opts },
    { .kind = LM_OPT_END },
};

static const parity_opts k_defaults = { 0 };

static const lm_opt_cmd k_cmd = {
    .name = "parity",
    .usage = "lumen parity DIR [--model FILE.gguf] [options]\n"
             "       lumen parity --model FILE.gguf --oracle FILE.json [options]",
    .about = "Against DIR: DIR holds reference.safetensors with prompt{i}.ids, .logits,\n"
             ".greedy_ids and .greedy_logits (transformers' outputs), and the model itself\n"
             "unless --model names another file of the same model (a GGUF converted from\n"
             "it). Passes when every logit is within tolerance, cached decoding matches the\n"
             "full forward within 1e-4 (quantised weights: within the tolerance, as their\n"
             "decode steps may take another kernel), and every greedy token whose\n"
             "reference margin exceeds 10x the logit error matches. The default tolerance\n"
             "is 1e-3 for f32/f16/bf16 weights and wider for quantised ones, by the least\n"
             "precise weight type of the model (the JSON line says which and what it\n"
             "allowed).\n"
             "\n"
             "Against --oracle: the JSON llama.cpp gave for the same GGUF file\n"
             "(tools/llamacpp/oracle.mjs: prompt_ids, greedy_ids, last_logprobs). Passes\n"
             "when the last prompt position's log-probabilities are within tolerance\n"
             "(max |difference| and KL(llama.cpp || lumen)) and, fed llama.cpp's greedy\n"
             "ids, lumen picks the same token at every step whose top-2 margin exceeds\n"
             "twice the log-probability difference.\n"
             "\n"
             "Prints one JSON line with the measured errors; exits 0 within tolerance, 1\n"
             "beyond it or on an error, 2 on bad usage.\n",
    .opts = k_opts,
    .defaults = &k_defaults,
    .size = sizeof(parity_opts),
};

/* --oracle: the model file against llama.cpp's answer. */
static int run_oracle(const parity_opts *o, lm_source *model, lm_backend *be) {
    lm_err e = { { 0 } };
    lm_oracle_result res;
    if (lm_parity_oracle_run(model, o->oracle, be, o->tol, o->kl_tol, &res, &e)) {
        fprintf(stderr, "lumen: %s\n", e.msg);
        return 1;
    }
    char *js = lm_oracle_json(o->model, o->oracle, be, &res);
    printf("%s\n", js);
    free(js);
    return res.ok ? 0 : 1;
}

/* DIR's reference against the model (DIR's own or --model). */
static int run_reference(const parity_opts *o, lm_source *model, lm_backend *be) {
    lm_err e = { { 0 } };
    lm_parity_result res;
    if (lm_parity_run_ref(model, o->dir, be, o->tol, &res, &e)) {
        fprintf(stderr, "lumen: %s\n", e.msg);
        return 1;
    }
    char *js = lm_parity_json(o->model ? o->model : o->dir, be, &res);
    printf("%s\n", js);
    free(js);
    return res.ok ? 0 : 1;
}

int lm_cmd_parity(int argc, char **argv) {
    parity_opts o;
    int parsed = lm_opts_parse(&k_cmd, &o, argc, argv);
    if (parsed >= 0) return parsed;
    /* parity checks the arithmetic against a reference: exact unless asked */
    if (o.co.gpu_precision == LM_GPU_PREC_DEFAULT) o.co.gpu_precision = LM_GPU_PREC_EXACT;
    if (o.oracle && (!o.model || o.dir)) {
        fprintf(stderr, "lumen parity: --oracle checks --model FILE.gguf and takes no DIR (see lumen parity --help)\n");
        return 2;
    }
    if (!o.oracle && !o.dir) {
        fprintf(stderr, "lumen parity: a folder with reference.safetensors is required (see lumen parity --help)\n");
        return 2;
    }
    if (o.dir && !lm_is_dir(o.dir) && lm_file_exists(o.dir)) {
        fprintf(stderr, "lumen parity: %s is a file; DIR is the folder with reference.safetensors (a GGUF goes in "
                        "--model)\n", o.dir);
        return 2;
    }
    if (o.kl_tol > 0 && !o.oracle) {
        fprintf(stderr, "lumen parity: --kl-tolerance applies to --oracle only\n");
        return 2;
    }
    lm_source *model = lm_cli_open_model(o.model ? o.model : o.dir);
    if (!model) return 1;
    lm_backend *be = lm_cli_backend_for(&o.co, model);
    int rc = 1;
    if (be) rc = o.oracle ? run_oracle(&o, model, be) : run_reference(&o, model, be);
    lm_source_unref(model);
    if (be) lm_backend_destroy(be);
    return rc;
}
