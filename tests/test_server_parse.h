/* test_server_parse.h - a harness for the streaming parsers (src/chat):
 * runs a model output through the server's pipeline (stop strings ->
 * reasoning -> tool calls) cut into chunks, and checks that every chunking
 * gives the same final content, reasoning and tool calls, and the expected
 * ones. Implemented in test_server_parse_harness.c. */
#ifndef TEST_SERVER_PARSE_H
#define TEST_SERVER_PARSE_H

#include "lm_test.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct pp_case {
    const char *name;
    const char *text;            /* the model's output */
    /* pipeline */
    const char *const *stops;    /* NULL-terminated, or NULL: no stop matcher */
    bool think;                  /* run the reasoning parser */
    bool think_open;             /* ... starting inside <think> (opened by the prompt) */
    const char *think_tags[2];   /* custom open/close tags, or NULL */
    const char *think_implicit;  /* implicit end tag of reasoning, or NULL */
    bool tools;                  /* run the tool-call parser */
    const char *tools_json;      /* the request's tools (JSON text), or NULL */
    /* expected */
    const char *content;
    const char *reasoning;       /* NULL: "" */
    const char *calls;           /* JSON [{"name": .., "arguments": {..}}], NULL: none */
    const char *args_exact;      /* if set: the first call's arguments string, byte for byte */
    bool stopped;
    int partial;                 /* calls that stream a start but fail (streaming mode) */
    bool tags_in_content;        /* malformed input: tag text may reach content */
} pp_case;

/* Runs c whole, byte by byte, cut at every split point into two chunks and
 * in random chunkings (fixed seed), in streaming and (for tool calls) atomic
 * mode; checks each against the expected result and per-delta invariants.
 * Returns the number of failed checks (each one printed). */
int pp_check_case(const pp_case *c);

/* Only checks that all chunkings agree (no expected values): for generated
 * inputs. `splits` limits the two-chunk split points tried (0: all). */
int pp_check_consistent(const pp_case *c, int n_random, size_t splits);

#define PP_CHECK_CASE(c)                                                    \
    do {                                                                    \
        int pp_fail_ = pp_check_case(c);                                    \
        if (pp_fail_) {                                                     \
            fprintf(stderr, "  %s:%d: case \"%s\" failed\n", __FILE__, __LINE__, (c)->name); \
            lm_t_->failed += pp_fail_;                                      \
        }                                                                   \
    } while (0)

#endif
