/* test_engine_moe.c - continuous batching on a mixture-of-experts model gives
 * every request the tokens it gets alone.
 *
 * MoE is where batching could leak between requests: the moe op groups the
 * batch's tokens by expert and runs each expert's matmuls over all of them,
 * so a token's experts see other requests' rows. Requests of different
 * lengths run at once, with prompts cut into chunks by small step budgets;
 * each must produce exactly its solo greedy tokens. Same pattern as
 * test_engine.c, on the qwen3-moe fixture and on the e16/k4 model with dense
 * and sparse layers (tests/data/moe). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/lm_engine.h"
#include "engine/lm_runner.h"
#include "engine/lm_sampler.h"
#include "lm_test.h"
#include "test_util.h"
#include "format/safetensors.h"

LM_TEST(engine_moe_concurrent_equals_alone) {
    char *dir = lm_test_fixture_path("models/qwen3-moe");
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    lm_tu_engine_concurrent_equals_alone(lm_t_, dir, 24, 2, 16);
    free(dir);
}

LM_TEST(engine_moe_dense_sparse_tiny_steps) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/data/moe/qwen3-moe-e16-k4-step2", LUMEN_SOURCE_DIR);
    lm_tu_engine_concurrent_equals_alone(lm_t_, dir, 5, 3, 16);
}
