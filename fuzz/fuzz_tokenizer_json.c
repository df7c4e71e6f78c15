/* fuzz_tokenizer_json.c - libFuzzer harness: any bytes as tokenizer.json.
 *
 * A rejected file must leave one message naming the source and nothing
 * allocated (LeakSanitizer checks); an accepted one must encode and decode
 * a fixed mixed text without breaking the invariants of
 * fuzz_tokenizer_common.h. */
#include "fuzz_tokenizer_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lm_err e = { { 0 } };
    lm_tokenizer *t = NULL;
    if (lm_tokenizer_load_json(&t, (const char *)data, size, NULL, 0, "fuzz.json", &e)) {
        LM_ASSERT(t == NULL && !strncmp(e.msg, "fuzz.json", 9) && !strchr(e.msg, '\n'));
        return 0;
    }
    static const char text[] = "Hello, world! <s> caf\xC3\xA9 12345 \xF0\x9F\x98\x80 \xE2\x96\x81x\n\t  end";
    lm_tok_ids ids = { 0 };
    LM_ASSERT(lm_tokenizer_encode(t, text, sizeof text - 1, true, &ids, &e) == 0);
    lm_tok_str out = { 0 };
    fz_check_decode(t, ids.ids, ids.n, false, &out);
    lm_tok_str_free(&out);
    lm_tok_ids_free(&ids);
    lm_tokenizer_free(t);
    return 0;
}
