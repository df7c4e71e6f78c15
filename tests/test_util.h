/* test_util.h - helpers shared by tests: files, commands, safetensors writing. */
#ifndef LM_TEST_UTIL_H
#define LM_TEST_UTIL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/lm_engine.h"
#include "engine/lm_parity.h"
#include "lm_test.h"

/* Writes bytes to path; returns 0 on success. */
int lm_tu_write(const char *path, const void *data, size_t n);
/* Reads a whole file (malloc'd), or NULL. */
char *lm_tu_read(const char *path, size_t *n);
/* Runs a shell command; stdout and stderr go to malloc'd strings (may be NULL
 * args). Returns the exit status, or -1 if it did not exit normally. */
int lm_tu_run(const char *cmd, char **out, char **err);
/* A new directory under the test tmpdir, named after tag (malloc'd path). */
char *lm_tu_mkdir(const char *tag);
/* How far the largest of x[0..n) stands above the second largest: a greedy
 * pick closer than a known error to its runner-up may flip. */
double lm_tu_top2_margin(const float *x, int n);
/* A llama-g256 GGUF fixture file (pattern with %s for the type, as
 * "model.%s.gguf"): tests/data/gguf first (the types that ship with the
 * repository), then the shared fixtures; NULL when neither has it. */
char *lm_tu_g256_file(const char *type, const char *pattern);
/* max |got - ref| / max(|ref|, floor) over n values; NaN anywhere counts as
 * infinite. */
double lm_tu_rel_err(const float *got, const float *ref, size_t n, double floor);
/* The tokens of S sequences dealt round-robin (so sequences interleave in a
 * batch): sequence s has n[s] tokens from position pos0[s]. Writes each
 * token's position and sequence into pos and seq (room for the sum of n)
 * and returns the token count. */
int lm_tu_round_robin(int S, const int *n, const int *pos0, int32_t *pos, int32_t *seq);

/* Model-level tests run on the backend LUMEN_TEST_DEVICE names: "cuda" runs
 * them on the GPU (the device machine runs the suite both ways), anything
 * else on the CPU with every core up to threads and the best ISA. */
bool lm_tu_device_is_cuda(void);
lm_backend *lm_tu_model_backend(int threads, lm_err *e);

/* lm_parity_run on dir (tolerance 1e-3) with a CPU backend of the given ISA
 * and threads, printing the JSON line and checking the parity contract:
 * n_prompts prompts, logits within 1e-3, cached decoding within 1e-4 of the
 * full forward, 24 greedy steps with no mismatch and at least 12 of them
 * checked. Skips (with the reason) when the ISA is missing. out: optional. */
void lm_tu_parity(lm_test_ctx *lm_t_, const char *dir, lm_cpu_isa isa, int threads, int n_prompts,
                  lm_parity_result *out);
/* The same on ../shared/fixtures/models/NAME (3 prompts), skipping without fixtures. */
void lm_tu_parity_fixture(lm_test_ctx *lm_t_, const char *name, lm_cpu_isa isa, int threads);

struct lm_model;
/* Loads "demo" (models/demo) or the fixture models/NAME on the test backend
 * (lm_tu_model_backend, 2 threads); false with why filled when it is
 * missing or does not load (*be may then be set: the caller frees it). */
bool lm_tu_load_named(const char *name, lm_backend **be, struct lm_model **m, char *why, size_t n_why);

/* Greedy tokens of prompt alone through the plain runner; 0 on success. */
int lm_tu_greedy_alone(struct lm_model *m, const int32_t *prompt, int n, int gen, int32_t *out);
/* The same with the runner's KV cache in the formats kvt. */
int lm_tu_greedy_alone_kv(struct lm_model *m, lm_kv_types kvt, const int32_t *prompt, int n, int gen, int32_t *out);

/* What an engine request hands its callback, collected for a test: the
 * first LM_TU_COLLECT_MAX tokens, the first token's logprob and number of
 * top alternatives, and from the final event its finish reason, the
 * prompt tokens the cache served and, from its trace (-1 without one), how
 * many of them came from disk and how many the cache shared before its
 * checkpoints cut the hit. Submit with lm_tu_collect_on_token and the
 * collector as its user pointer. */
#define LM_TU_COLLECT_MAX 512
typedef struct lm_tu_collect {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t toks[LM_TU_COLLECT_MAX];
    int n;
    bool done;
    lm_finish finish;
    int n_cached, n_cached_disk, n_shared;
    int n_prefill_chunks, max_step_batch; /* from the final event's trace (-1 without) */
    float logprob0;
    int n_top0;
} lm_tu_collect;

/* Empties c (before its request is submitted); lm_tu_collect_destroy after. */
void lm_tu_collect_init(lm_tu_collect *c);
void lm_tu_collect_destroy(lm_tu_collect *c);
/* The engine callback: user is the lm_tu_collect. */
void lm_tu_collect_on_token(void *user, const lm_token_event *ev);
/* Waits until the request is done. */
void lm_tu_collect_wait(lm_tu_collect *c);
/* Waits until the request is done or has min_tokens tokens. */
void lm_tu_collect_wait_tokens(lm_tu_collect *c, int min_tokens);

/* en's counters once nothing runs or waits (they are published after each
 * step, a moment after a request's final event; gives up after 2 s). */
void lm_tu_engine_settled(lm_engine *en, lm_engine_stats *st);

/* One greedy request of prompt through an engine (ctx 256) speculating
 * with m's MTP head at a fixed depth of 3: its first LM_TU_MTP_GEN tokens
 * and the engine's settled counters. */
#define LM_TU_MTP_GEN 48
typedef struct lm_tu_mtp_out {
    int32_t toks[LM_TU_MTP_GEN];
    int n;
    lm_engine_stats st;
} lm_tu_mtp_out;
void lm_tu_mtp_run(lm_test_ctx *lm_t_, struct lm_model *m, const int32_t *prompt, int n_prompt, lm_tu_mtp_out *out);
/* Why llama.cpp (tools/llamacpp, node-llama-cpp) cannot run here, or NULL
 * when it can: tests that need it skip with this. */
const char *lm_tu_llamacpp_missing(void);
/* llama.cpp's answer on gguf (tools/llamacpp/oracle.mjs, 2 threads): the
 * prompt, then gen greedy ids; its JSON line (malloc'd), or NULL after a
 * failed check naming llama.cpp's error. */
char *lm_tu_llamacpp_answer(lm_test_ctx *lm_t_, const char *gguf, const int32_t *prompt, int n, int gen);

/* A qwen3_5 / qwen3_next model over ids[0..T-1] in one batch: all T rows
 * of its final hidden states, hidden [T][D]; 0 on success. */
int lm_tu_q35_hidden(struct lm_model *m, const int32_t *ids, int T, float *hidden, lm_err *e);
/* Its MTP head's logits [T-1][V] over those hidden states and the next
 * tokens ids[1..T-1] (positions 0..T-2), in one batch; 0 on success. */
int lm_tu_mtp_logits(struct lm_model *m, const int32_t *ids, int T, float *logits, lm_err *e);

/* The I32 tensor name (e.g. "prompt1.ids") of dir/reference.safetensors,
 * at most max values, into ids: its count, 0 (e set) when the file or the
 * tensor is missing. */
int lm_tu_ref_ids(const char *dir, const char *name, int32_t *ids, int max, lm_err *e);

/* Continuous batching is exact: six requests of different lengths (1 to 300
 * tokens, cut from prompt2.ids of DIR/reference.safetensors) submitted at
 * once to an engine with the given step budget each produce exactly the
 * `gen` greedy tokens they produce alone; the cache is whole again after. */
void lm_tu_engine_concurrent_equals_alone(lm_test_ctx *lm_t_, const char *dir, int step_tokens, int threads,
                                          int gen);
/* The same with both sides' KV cache in the formats kvt. */
void lm_tu_engine_concurrent_equals_alone_kv(lm_test_ctx *lm_t_, const char *dir, int step_tokens, int threads,
                                             int gen, lm_kv_types kvt);

#endif
