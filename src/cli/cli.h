/* cli.h - subcommands of the lumen binary and the option helpers they share. */
#ifndef LM_CLI_H
#define LM_CLI_H

#include "../backend/lm_backend.h"

#define LM_VERSION "0.1.0"

int lm_cmd_run(int argc, char **argv);
int lm_cmd_parity(int argc, char **argv);
int lm_cmd_bench(int argc, char **argv);
int lm_cmd_check_template(int argc, char **argv);
int lm_cmd_tokenize(int argc, char **argv);
int lm_cmd_check_tokenizer(int argc, char **argv);
int lm_cmd_serve(int argc, char **argv);

/* Options every model command takes. */
typedef struct lm_common_opts {
    int threads;     /* 0 = every core */
    lm_cpu_isa isa;
} lm_common_opts;

/* Parses "--threads N" / "--isa NAME" at argv[*i] (advancing *i); returns 1
 * if consumed, 0 if not a common option, -1 on a bad value (message printed). */
int lm_cli_common(lm_common_opts *o, int argc, char **argv, int *i);
/* The value after argv[*i], or NULL with a message. */
const char *lm_cli_value(int argc, char **argv, int *i);
bool lm_cli_int(const char *s, long lo, long hi, long *out);
bool lm_cli_float(const char *s, double *out);
lm_backend *lm_cli_backend(const lm_common_opts *o);
/* The bundled demo model's folder (models/demo of the source tree; LUMEN_MODEL
 * overrides), or NULL with a message when it is not there. */
const char *lm_cli_default_model(void);
int lm_cmd_chat(int argc, char **argv);

#define LM_COMMON_HELP                                                        \
    "  --threads N       worker threads (default: every core)\n"             \
    "  --isa NAME        CPU code path: auto, scalar, avx2, avx512 (default auto)\n"

#endif
