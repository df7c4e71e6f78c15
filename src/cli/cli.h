/* cli.h - subcommands of the lumen binary and what they share: the backend
 * options and the sampling options (tables for options.h), the backend
 * choice, the default model. */
#ifndef LM_CLI_H
#define LM_CLI_H

#include "../backend/lm_backend.h"
#include "../engine/lm_engine.h"
#include "../engine/lm_sampler.h"
#include "../format/lm_source.h"
#include "../model/lm_model.h"
#include "options.h"

#define LM_VERSION "0.1.0"

int lm_cmd_run(int argc, char **argv);
int lm_cmd_parity(int argc, char **argv);
int lm_cmd_bench(int argc, char **argv);
int lm_cmd_check_template(int argc, char **argv);
int lm_cmd_tokenize(int argc, char **argv);
int lm_cmd_check_tokenizer(int argc, char **argv);
int lm_cmd_serve(int argc, char **argv);
int lm_cmd_quantize(int argc, char **argv);
int lm_cmd_eval(int argc, char **argv);
int lm_cmd_convert(int argc, char **argv);
/* bench-serve and report exec node on tools/benchserve (cmd_node_tool.c). */
int lm_cmd_bench_serve(int argc, char **argv);
int lm_cmd_report(int argc, char **argv);

/* The quantisation mixes as --type choices (values: lm_mix_id), the mix of
 * one, and the one-line summary quantize and convert print. */
struct lm_quant_mix;
struct lm_quantize_report;
extern const lm_opt_choice lm_cli_mix_choices[];
const struct lm_quant_mix *lm_cli_mix(int id);
/* Upper-cases the value of --type when it names a mix in another case
 * ("bf16", "q4_k_m"), before the option table (whose choices are exact) sees it. */
void lm_cli_mix_case(int argc, char **argv);
void lm_cli_print_report(const char *out, const struct lm_quant_mix *mix, const struct lm_quantize_report *rep);

/* Options every model command takes. */
typedef enum lm_device_choice { LM_DEVICE_AUTO = 0, LM_DEVICE_CPU, LM_DEVICE_CUDA } lm_device_choice;

/* --gpu-precision: how matrix products over bf16 weights and the tiled
 * attention treat their activations on the GPU (lm_cuda_backend_bf16_act).
 * DEFAULT leaves the backend as created: exact, or bf16 where
 * LUMEN_CUDA_GEMM=bf16. Exact stays the default because bf16 activations
 * let caching, batching and speculation change greedy tokens at near ties
 * (docs/history/34-gpu-precision.md). */
typedef enum lm_gpu_precision { LM_GPU_PREC_DEFAULT = 0, LM_GPU_PREC_EXACT, LM_GPU_PREC_BF16 } lm_gpu_precision;

typedef struct lm_common_opts {
    int threads;     /* 0 = every core */
    lm_cpu_isa isa;
    lm_device_choice device;
    int gpu;         /* CUDA device index */
    size_t gpu_memory; /* --gpu-memory: most GPU memory to use, 0 = all there is */
    lm_gpu_precision gpu_precision;
} lm_common_opts;

/* The options above as a table (--threads, --isa, --device, --gpu-memory),
 * and the sampling options into an lm_sampler_params (--temp, --top-k,
 * --top-p, --min-p, --seed): groups for a command's table (options.h). */
extern const lm_opt lm_cli_common_opts[];
/* --device's value (auto, cpu, cuda, cuda:N) into o's device and gpu; false
 * when it is none of those. */
bool lm_cli_parse_device(lm_common_opts *o, const char *v);
extern const lm_opt lm_cli_sampling_opts[];
/* --kv-type, --kv-k, --kv-v into an lm_kv_types. A command starts from
 * LM_CLI_KV_DEFAULT, bf16 on every backend: on the CPU its KL against f32
 * is ~1e-5, and on the H200 (8B shape) its decode is 1.05x f32's at 4k and
 * 0.97x at 32k, its 4k prefill 1.05x, at half the memory. */
extern const lm_opt lm_cli_kv_opts[];
/* --rope-scaling, --rope-scale, --rope-freq-base, --yarn-orig-ctx,
 * --yarn-beta-fast, --yarn-beta-slow into an lm_rope_override (llama.cpp's
 * names), which the model load applies over the model's config. */
extern const lm_opt lm_cli_rope_opts[];
/* --spec, --spec-draft, --spec-fixed into an lm_engine_opts (its spec fields). */
extern const lm_opt lm_cli_spec_opts[];
#define LM_CLI_KV_DEFAULT ((lm_kv_types){ LM_KV_BF16, LM_KV_BF16 })
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

/* A model's load as one updating line on stderr, when stderr is a terminal
 * (quiet otherwise, so logs and pipes see no progress bytes):
 *   lumen: loading NAME: 123 tensors, 0.4 / 1.5 GiB (27%)
 *   lumen: loading NAME: warming up
 *   lumen: NAME ready in 2.1 s
 * Its hook goes to lm_model_load_with, lm_textgen_open or the server. */
typedef struct lm_cli_progress {
    lm_load_progress hook;
    bool on;
    bool drawn;          /* a line is on screen without its newline */
    double t0, last;     /* start; last redraw */
    char name[96];
} lm_cli_progress;

/* Starts the clock; on when stderr is a terminal and LUMEN_PROGRESS is not 0. */
void lm_cli_progress_begin(lm_cli_progress *p, const char *model_path);
/* Ends an unfinished line (after an error). */
void lm_cli_progress_end(lm_cli_progress *p);

#endif
