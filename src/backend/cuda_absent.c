/* cuda_absent.c - the CUDA entry points in a build without nvcc: every GPU
 * request fails with a message that says so. */
#include <stdio.h>
#include <stdlib.h>

#include "lm_backend.h"

lm_backend *lm_cuda_backend_create(int device, lm_err *e) {
    (void)device;
    lm_errf(e, "this lumen was built without CUDA (nvcc not found at build time, or LUMEN_CUDA=OFF)");
    return NULL;
}

bool lm_cuda_available(char *why, size_t n) {
    snprintf(why, n, "this lumen was built without CUDA (nvcc not found at build time, or LUMEN_CUDA=OFF)");
    return false;
}

bool lm_cuda_backend_bf16_act(lm_backend *be, bool on) {
    (void)be, (void)on;
    return false;
}

bool lm_cuda_backend_quant_exact(lm_backend *be, bool exact) {
    (void)be, (void)exact;
    return false;
}

bool lm_cuda_backend_qstaged(lm_backend *be, bool on) {
    (void)be, (void)on;
    return false;
}

void lm_backend_mem_info(lm_backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)be;
    *free_bytes = 0;
    *total_bytes = 0;
}

void lm_backend_sync(lm_backend *be) { (void)be; }

void *lm_backend_host_alloc(lm_backend *be, size_t bytes) {
    (void)be;
    return lm_xmalloc(bytes);
}

void lm_backend_host_free(lm_backend *be, void *p) {
    (void)be;
    free(p);
}

void lm_backend_graph_counts(lm_backend *be, long *replayed, long *captured) {
    (void)be;
    *replayed = *captured = 0;
}

void lm_backend_set_memory_limit(lm_backend *be, size_t bytes) {
    (void)be;
    (void)bytes;
}

bool lm_cuda_moe_route(lm_backend *be, const float *logits, const float *scale, int T, int E, int k, bool norm,
                       int32_t *sel, float *w) {
    (void)be, (void)logits, (void)scale, (void)T, (void)E, (void)k, (void)norm, (void)sel, (void)w;
    return false;
}
