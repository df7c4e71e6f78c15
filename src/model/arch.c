/* arch.c - the registry of architectures (one line per architecture). */
#include <stdio.h>
#include <string.h>

#include "lm_arch.h"

extern const lm_arch lm_arch_llama;
extern const lm_arch lm_arch_qwen35;
extern const lm_arch lm_arch_qwen3_moe;
extern const lm_arch lm_arch_gemma;

static const lm_arch *const k_archs[] = {
    &lm_arch_llama,
    &lm_arch_qwen35,
    &lm_arch_qwen3_moe,
    &lm_arch_gemma,
};

const lm_arch *lm_arch_find(const char *model_type) {
    for (size_t i = 0; i < LM_COUNT(k_archs); i++)
        for (const char *const *t = k_archs[i]->model_types; *t; t++)
            if (!strcmp(*t, model_type)) return k_archs[i];
    return NULL;
}

void lm_arch_supported(char *buf, size_t n) {
    size_t k = 0;
    buf[0] = 0;
    for (size_t i = 0; i < LM_COUNT(k_archs); i++)
        for (const char *const *t = k_archs[i]->model_types; *t && k < n; t++)
            k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? ", " : "", *t);
}
