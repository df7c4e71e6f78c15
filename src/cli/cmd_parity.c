/* cmd_parity.c - `lumen parity DIR`: one JSON line, exit 0 only within tolerance. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/lm_parity.h"
#include "cli.h"

typedef struct parity_opts {
    const char *dir;
    double tol;
    lm_common_opts co;
} parity_opts;

static const lm_opt k_opts[] = {
    { LM_OPT_ARG, "DIR", NULL, LM_OPT_AT(parity_opts, dir), NULL, "the model folder with reference.safetensors" },
    { LM_OPT_FLOAT, "--tol", NULL, LM_OPT_AT(parity_opts, tol), "X", "absolute logit tolerance", .lo = 0,
      .lo_open = true, .hi = INFINITY },
    { LM_OPT_GROUP, .off = offsetof(parity_opts, co), .group = lm_cli_common_opts },
    { .kind = LM_OPT_END },
};

static const parity_opts k_defaults = { .tol = 1e-3 };

static const lm_opt_cmd k_cmd = {
    .name = "parity",
    .usage = "lumen parity DIR [options]",
    .about = "DIR holds a model (config.json + safetensors) and reference.safetensors with\n"
             "prompt{i}.ids, .logits, .greedy_ids and .greedy_logits. Prints one JSON line\n"
             "with the measured errors; exits 0 only if every logit is within tolerance,\n"
             "cached decoding matches the full forward, and every greedy token whose\n"
             "reference margin exceeds 10x the logit error matches.\n",
    .opts = k_opts,
    .defaults = &k_defaults,
    .size = sizeof(parity_opts),
};

int lm_cmd_parity(int argc, char **argv) {
    parity_opts o;
    int parsed = lm_opts_parse(&k_cmd, &o, argc, argv);
    if (parsed >= 0) return parsed;
    const lm_common_opts co = o.co;
    const char *dir = o.dir;
    const double tol = o.tol;
    if (!dir) {
        fprintf(stderr, "lumen parity: a model folder is required (see lumen parity --help)\n");
        return 2;
    }
    lm_source *model = lm_cli_open_model(dir);
    if (!model) return 1;
    lm_backend *be = lm_cli_backend_for(&co, model);
    if (!be) {
        lm_source_unref(model);
        return 1;
    }
    lm_err e = { { 0 } };
    lm_parity_result res;
    int rc = 1;
    if (lm_parity_run_from(model, be, tol, &res, &e)) {
        fprintf(stderr, "lumen: %s\n", e.msg);
    } else {
        char *js = lm_parity_json(dir, be, &res);
        printf("%s\n", js);
        free(js);
        rc = res.ok ? 0 : 1;
    }
    lm_source_unref(model);
    lm_backend_destroy(be);
    return rc;
}
