/* cmd_parity.c - `lumen parity DIR`: one JSON line, exit 0 only within tolerance. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/lm_parity.h"
#include "cli.h"

static const char *const k_help =
    "usage: lumen parity DIR [options]\n"
    "\n"
    "DIR holds a model (config.json + safetensors) and reference.safetensors with\n"
    "prompt{i}.ids, .logits, .greedy_ids and .greedy_logits. Prints one JSON line\n"
    "with the measured errors; exits 0 only if every logit is within tolerance,\n"
    "cached decoding matches the full forward, and every greedy token whose\n"
    "reference margin exceeds 10x the logit error matches.\n"
    "\n"
    "  --tol X           absolute logit tolerance (default 1e-3)\n"
    LM_COMMON_HELP;

int lm_cmd_parity(int argc, char **argv) {
    lm_common_opts co = { 0 };
    const char *dir = NULL;
    double tol = 1e-3;
    for (int i = 1; i < argc; i++) {
        int c = lm_cli_common(&co, argc, argv, &i);
        if (c < 0) return 2;
        if (c) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(k_help, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--tol")) {
            const char *v = lm_cli_value(argc, argv, &i);
            if (!v || !lm_cli_float(v, &tol) || !(tol > 0)) {
                fprintf(stderr, "lumen parity: --tol needs a positive number\n");
                return 2;
            }
        } else if (argv[i][0] == '-' || dir) {
            fprintf(stderr, "lumen parity: unexpected argument %s (see lumen parity --help)\n", argv[i]);
            return 2;
        } else {
            dir = argv[i];
        }
    }
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
