/* fuzz_safetensors.c - libFuzzer harness for the safetensors parser.
 *
 * Design: parse the input as a whole file, then touch the first and last
 * byte of every tensor the parser accepted. libFuzzer hands us a heap copy
 * of exactly `size` bytes, so with ASan any data pointer or nbytes that
 * escapes the buffer is reported at once. Besides memory safety, the
 * harness checks the parser's promises that callers rely on and aborts
 * (a finding) when one breaks: failures carry a message starting with the
 * label, accepted tensors are sorted, findable, and their nbytes agrees with
 * the shape. */
#include "format/safetensors.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char label[] = "fuzz.safetensors";
    lm_safetensors st;
    lm_err e = { { 0 } };
    if (lm_safetensors_parse(&st, data, size, label, &e) != 0) {
        /* The error contract: one line, naming the file. */
        LM_ASSERT(strncmp(e.msg, label, sizeof label - 1) == 0 && e.msg[sizeof label - 1] == ':');
        LM_ASSERT(strchr(e.msg, '\n') == NULL);
        LM_ASSERT(st.n_tensors == 0 && st.tensors == NULL);
        return 0;
    }
    /* volatile: keeps the reads from being optimised away. */
    volatile uint8_t sink = 0;
    for (int i = 0; i < st.n_tensors; i++) {
        const lm_file_tensor *t = &st.tensors[i];
        if (t->nbytes > 0) {
            sink ^= t->data[0];
            sink ^= t->data[t->nbytes - 1];
        }
        LM_ASSERT(t->data >= data && (size_t)(t->data - data) <= size &&
                  t->nbytes <= size - (size_t)(t->data - data));
        LM_ASSERT(t->n_dims >= 0 && t->n_dims <= LM_MAX_DIMS);
        LM_ASSERT(i == 0 || strcmp(st.tensors[i - 1].name, t->name) < 0);
        LM_ASSERT(lm_safetensors_find(&st, t->name) == t);
        /* numel cannot overflow here: the parser bounded it. */
        int64_t numel = lm_file_tensor_numel(t);
        LM_ASSERT(numel >= 0);
        LM_ASSERT(t->nbytes == 0 || t->nbytes % (size_t)numel == 0);
    }
    (void)sink;
    lm_safetensors_close(&st);
    return 0;
}
