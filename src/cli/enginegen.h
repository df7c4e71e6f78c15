/* enginegen.h - generation through the engine (continuous batching,
 * speculative decoding) for the terminal commands: `run --spec` and
 * `bench --spec`. */
#ifndef LM_CLI_ENGINEGEN_H
#define LM_CLI_ENGINEGEN_H

#include "../engine/lm_engine.h"

/* One request: its prompt in, its tokens out. */
typedef struct lm_egen_req {
    const int32_t *ids;
    int n;
    int32_t *out;        /* [max_tokens of the run] the tokens handed out */
    int n_out;
    lm_finish finish;
    const char *error;   /* LM_FINISH_ERROR: the engine's message (static storage of the run) */
    double first_s;      /* seconds from the run's start to its first token, */
    double done_s;       /* and to its final event */
} lm_egen_req;

/* Called on the engine thread for every token of request i. */
typedef void (*lm_egen_tok)(void *user, int i, int32_t tok);

/* Runs the requests through one engine of m with eo (all submitted at
 * once; eo->parallel run together), each with gp; returns when every one
 * has finished. *wall_s: from the first submit to the last final event;
 * st: the engine's counters at the end. -1 with e when the engine cannot
 * start or a request is refused or fails. */
int lm_egen_run(lm_model *m, const lm_engine_opts *eo, const lm_gen_params *gp, lm_egen_req *reqs, int n_req,
                lm_egen_tok cb, void *user, lm_engine_stats *st, double *wall_s, lm_err *e);

/* The speculative-decoding counters of st as one JSON object's members
 * (no braces) into buf: acceptance per draft position, tokens per verify
 * step, seconds drafting and verifying. */
void lm_egen_spec_json(const lm_engine_stats *st, char *buf, size_t n);

#endif
