/* cli.h - subcommands of the lumen binary and the option helpers they share. */
#ifndef LM_CLI_H
#define LM_CLI_H

#include "../backend/lm_backend.h"
#include "../engine/lm_sampler.h"
#include "../format/lm_source.h"

#define LM_VERSION "0.1.0"

int lm_cmd_run(int argc, char **argv);
int lm_cmd_parity(int argc, char **argv);
int lm_cmd_bench(int argc, char **argv);
int lm_cmd_check_template(int argc, char **argv);
int lm_cmd_tokenize(int argc, char **argv);
int lm_cmd_check_tokenizer(int argc, char **argv);
int lm_cmd_serve(int argc, char **argv);

/* Options every model command takes. */
typedef enum lm_device_choice { LM_DEVICE_AUTO = 0, LM_DEVICE_CPU, LM_DEVICE_CUDA } lm_device_choice;

typedef struct lm_common_opts {
    int threads;     /* 0 = every core */
    lm_cpu_isa isa;
    lm_device_choice device;
    int gpu;         /* CUDA device index */
    size_t gpu_memory; /* --gpu-memory: most GPU memory to use, 0 = all there is */
} lm_common_opts;

/* Parses "--threads N" / "--isa NAME" at argv[*i] (advancing *i); returns 1
 * if consumed, 0 if not a common option, -1 on a bad value (message printed). */
int lm_cli_common(lm_common_opts *o, int argc, char **argv, int *i);
/* Parses a sampling option (--temp, --top-k, --top-p, --min-p, --seed) at
 * argv[*i] into p, as lm_cli_common does. */
int lm_cli_sampling(lm_sampler_params *p, int argc, char **argv, int *i);
/* The value after argv[*i], or NULL with a message. */
const char *lm_cli_value(int argc, char **argv, int *i);
bool lm_cli_int(const char *s, long lo, long hi, long *out);
bool lm_cli_float(const char *s, double *out);
/* A byte size: a whole number with an optional K, M, G or T suffix (powers of
 * 1024; "512M", "4G", "1536KiB"); false for anything else. */
bool lm_cli_size(const char *s, size_t *out);
/* The backend the options ask for. auto: CUDA when a GPU is present and the
 * model (NULL: not checked) fits in its free memory, else the CPU, saying
 * why on stderr. */
lm_backend *lm_cli_backend_for(const lm_common_opts *o, lm_source *model);
lm_backend *lm_cli_backend(const lm_common_opts *o);
/* The bundled demo model's folder (models/demo of the source tree; LUMEN_MODEL
 * overrides), or NULL with a message when it is not there. */
const char *lm_cli_default_model(void);
/* Opens a command's model path once (format/lm_source.h), for the backend
 * choice and every loader; NULL after printing "lumen: MESSAGE". */
lm_source *lm_cli_open_model(const char *path);
int lm_cmd_chat(int argc, char **argv);

/* The sampling options' help, with a command's defaults (string literals). */
#define LM_SAMPLING_HELP(temp, top_p)                                                               \
    "  --temp T          sampling temperature (default " temp "; 0 = greedy)\n"                      \
    "  --top-k K         keep the K most likely tokens (default 0 = off)\n"                          \
    "  --top-p P         nucleus sampling mass (default " top_p "; 1 = off)\n"                        \
    "  --min-p P         drop tokens below P x the top probability (default 0 = off)\n"              \
    "  --seed S          sampling seed (default 0); same seed, same tokens\n"

#define LM_COMMON_HELP                                                        \
    "  --threads N       worker threads (default: every core)\n"             \
    "  --isa NAME        CPU code path: auto, scalar, avx2, avx512 (default auto)\n"      \
    "  --device NAME     auto, cpu, cuda or cuda:N (default auto: the GPU when one\n"   \
    "                    is present and the model fits in its free memory)\n"   \
    "  --gpu-memory SIZE most GPU memory to use, e.g. 20G (default: all that is\n" \
    "                    free); weights, KV cache and prefix cache fit inside it\n"

#endif
