/* cmd_eval.c - `lumen eval -m MODEL --text FILE [--reference MODEL2]`:
 * perplexity of a text, and divergence from a reference model, as one JSON
 * line. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/lm_file.h"
#include "../engine/lm_eval.h"
#include "../tokenizer/lm_tokenizer.h"
#include "cli.h"

typedef struct eval_opts {
    const char *model, *text, *reference;
    int ctx;
    lm_kv_types kv;
    lm_rope_override rope;
    lm_common_opts co;
    lm_common_opts ref_co; /* --reference-device: the reference's backend */
    bool ref_device;
} eval_opts;

static bool parse_ref_device(void *dst, const char *v) {
    eval_opts *o = dst;
    o->ref_device = true;
    return lm_cli_parse_device(&o->ref_co, v);
}

static const lm_opt k_opts[] = {
    { LM_OPT_STRING, "--model", "-m", LM_OPT_AT(eval_opts, model), "PATH", "the model to evaluate (folder or .gguf)" },
    { LM_OPT_STRING, "--text", NULL, LM_OPT_AT(eval_opts, text), "FILE", "the text to score" },
    { LM_OPT_STRING, "--reference", NULL, LM_OPT_AT(eval_opts, reference), "PATH",
      "a model with the same vocabulary (e.g. the bf16 original) to measure KL(reference || model) and top-1 "
      "agreement against" },
    { LM_OPT_CUSTOM, "--reference-device", NULL, LM_OPT_AT(eval_opts, ref_co), "NAME",
      "run the reference on another device (auto, cpu, cuda, cuda:N): --reference-device cpu with the same model "
      "measures what the GPU's arithmetic (--gpu-precision) costs against the CPU's f32",
      "the model's device", .parse = parse_ref_device, .want = "auto, cpu, cuda or cuda:N" },
    { LM_OPT_INT, "--ctx", NULL, LM_OPT_AT(eval_opts, ctx), "N", "tokens per window", .ilo = 2, .ihi = 1 << 20 },
    { LM_OPT_GROUP, .off = offsetof(eval_opts, kv), .group = lm_cli_kv_opts },
    { LM_OPT_GROUP, .off = offsetof(eval_opts, rope), .group = lm_cli_rope_opts },
    { LM_OPT_GROUP, .off = offsetof(eval_opts, co), .group = lm_cli_common_opts },
    { .kind = LM_OPT_END },
};

/* f32 KV by default: eval measures a model (its weights' quantisation
 * against a reference); --kv-type measures a cache format */
static const eval_opts k_defaults = { .ctx = 512, .kv = { LM_KV_F32, LM_KV_F32 } };

static const lm_opt_cmd k_cmd = {
    .name = "eval",
    .usage = "lumen eval -m MODEL --text FILE [--reference MODEL2] [--ctx N] [options]",
    .about = "Encodes FILE with MODEL's tokenizer (special tokens as it adds them) and cuts\n"
             "the tokens into windows of --ctx; each window is a fresh sequence in which\n"
             "every position but the last predicts the next token. Prints one JSON line:\n"
             "tokens, windows, scored predictions, the mean negative log-likelihood (nats)\n"
             "and perplexity; with --reference also the reference's, KL(reference ||\n"
             "model) mean, 99th percentile and max over the positions (nats), and the\n"
             "fraction of positions where both models' top token is the same. --kv-type\n"
             "is the model's KV cache format (here f32 unless given); the reference always\n"
             "runs with an f32 cache, so --reference of the same model measures what a\n"
             "format costs. The --rope-* options apply to both models (a format's cost\n"
             "past the model's trained context, say).\n",
    .opts = k_opts,
    .defaults = &k_defaults,
    .size = sizeof(eval_opts),
};

/* The JSON line for r. */
static void print_result(const eval_opts *o, const lm_eval_result *r) {
    json_t *j = json_object();
    json_object_set_new(j, "model", json_string(o->model));
    json_object_set_new(j, "text", json_string(o->text));
    json_object_set_new(j, "ctx", json_integer(o->ctx));
    char kvs[32];
    json_object_set_new(j, "kv", json_string(lm_kv_types_str(o->kv, kvs, sizeof kvs)));
    json_object_set_new(j, "tokens", json_integer(r->n_tokens));
    json_object_set_new(j, "windows", json_integer(r->n_windows));
    json_object_set_new(j, "scored", json_integer(r->n_scored));
    json_object_set_new(j, "nll", json_real(r->nll));
    json_object_set_new(j, "ppl", json_real(r->ppl));
    if (r->has_ref) {
        json_object_set_new(j, "reference", json_string(o->reference));
        json_object_set_new(j, "ref_nll", json_real(r->ref_nll));
        json_object_set_new(j, "ref_ppl", json_real(r->ref_ppl));
        json_object_set_new(j, "kl_mean", json_real(r->kl_mean));
        json_object_set_new(j, "kl_p99", json_real(r->kl_p99));
        json_object_set_new(j, "kl_max", json_real(r->kl_max));
        json_object_set_new(j, "top1", json_real(r->top1));
    }
    char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    printf("%s\n", s);
    free(s);
    json_decref(j);
}

/* Loads the model at path onto be with rope's overrides (NULL after
 * printing why). */
static lm_model *load(const char *path, lm_backend *be, const lm_rope_override *rope, lm_source **src_out) {
    lm_source *src = lm_cli_open_model(path);
    if (!src) return NULL;
    lm_err e = { { 0 } };
    lm_model *m = NULL;
    const lm_model_load_opts lo = { NULL, *rope };
    if (lm_model_load_with(&m, src, be, &lo, &e)) {
        fprintf(stderr, "lumen: %s\n", e.msg);
        lm_source_unref(src);
        return NULL;
    }
    *src_out = src;
    return m;
}

int lm_cmd_eval(int argc, char **argv) {
    eval_opts o;
    int parsed = lm_opts_parse(&k_cmd, &o, argc, argv);
    if (parsed >= 0) return parsed;
    if (!o.model || !o.text) {
        fprintf(stderr, "lumen eval: -m MODEL and --text FILE are required (see lumen eval --help)\n");
        return 2;
    }
    lm_err e = { { 0 } };
    size_t len = 0;
    char *text = lm_read_file(o.text, &len, &e);
    if (!text) {
        fprintf(stderr, "lumen: %s\n", e.msg);
        return 1;
    }
    int rc = 1;
    lm_source *src = NULL, *ref_src = NULL;
    lm_model *m = NULL, *ref = NULL;
    lm_tokenizer *tok = NULL;
    lm_tok_ids ids = { 0 };
    lm_backend *be = lm_cli_backend(&o.co), *ref_be = NULL;
    if (!be || !(m = load(o.model, be, &o.rope, &src))) goto done;
    if (o.ref_device) {
        lm_common_opts ro = o.co;
        ro.device = o.ref_co.device, ro.gpu = o.ref_co.gpu;
        if (!(ref_be = lm_cli_backend(&ro))) goto done;
    }
    if (o.reference && !(ref = load(o.reference, ref_be ? ref_be : be, &o.rope, &ref_src))) goto done;
    lm_eval_result r;
    if (lm_tokenizer_load_from(&tok, src, &e) || lm_tokenizer_encode(tok, text, len, true, &ids, &e) ||
        lm_eval_run(m, ref, ids.ids, (int)ids.n, o.ctx, o.kv, &r, &e)) {
        fprintf(stderr, "lumen: %s\n", e.msg);
        goto done;
    }
    print_result(&o, &r);
    rc = 0;
done:
    lm_tok_ids_free(&ids);
    lm_tokenizer_free(tok);
    lm_model_free(ref);
    lm_model_free(m);
    if (ref_src) lm_source_unref(ref_src);
    if (src) lm_source_unref(src);
    if (ref_be) lm_backend_destroy(ref_be);
    if (be) lm_backend_destroy(be);
    free(text);
    return rc;
}
