/* fuzz_tokenizer_decode.c - libFuzzer harness: any id sequence to decode.
 *
 * The first byte picks the tokenizer and skip_special; each following pair
 * of bytes is one id (little-endian), with 0xFFFF meaning "an id far out of
 * range" and values past the vocabulary kept as they are, so unknown ids are
 * exercised too. Checks the invariants of fuzz_tokenizer_common.h. */
#include "fuzz_tokenizer_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_init();
    if (size < 1) return 0;
    lm_tokenizer *t = g_fz_tok[data[0] % g_fz_n];
    bool skip = data[0] & 0x80;
    size_t n = (size - 1) / 2;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    int32_t nv = lm_tokenizer_n_vocab(t);
    for (size_t i = 0; i < n; i++) {
        uint32_t v = data[1 + 2 * i] | (uint32_t)data[2 + 2 * i] << 8;
        ids[i] = v == 0xFFFF ? INT32_MAX - 1 : (int32_t)(v % (uint32_t)(nv + 8)) - (v & 0x8000 ? 4 : 0);
    }
    lm_tok_str out = { 0 };
    fz_check_decode(t, ids, n, skip, &out);
    lm_tok_str_free(&out);
    free(ids);
    return 0;
}
