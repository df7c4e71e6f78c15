/* fuzz_tokenizer_json.c - libFuzzer harness: tokenizer.json documents.
 *
 * Two input forms, so that mutations reach the tokenizer build and not only
 * the JSON parser's error path (a whole tokenizer.json mutated at random is
 * almost never JSON any more):
 *   - an input starting with '{' is a whole document, loaded as it is;
 *   - any other input is a section: byte 0 picks one of the three built-in
 *     documents of fuzz_tokenizer_common.h (bits 0-1) and the section to
 *     replace (bits 2-4: normalizer, pre_tokenizer, decoder, post_processor,
 *     added_tokens, model, model.vocab, model.merges); the rest is parsed as
 *     JSON and put there. The document around it stays valid, so every
 *     input that is JSON exercises the section's builder with a working
 *     tokenizer around it. tools/fuzz.sh seeds this form with the sections
 *     of the fixtures' real tokenizers.
 * A rejected document must leave one message naming the source and nothing
 * allocated (LeakSanitizer checks); an accepted one must encode and decode
 * a fixed mixed text without breaking the invariants of
 * fuzz_tokenizer_common.h. */
#include <jansson.h>

#include "fuzz_tokenizer_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void load_and_check(const char *doc, size_t n) {
    lm_err e = { { 0 } };
    lm_tokenizer *t = NULL;
    if (lm_tokenizer_load_json(&t, doc, n, NULL, 0, "fuzz.json", &e)) {
        LM_ASSERT(t == NULL && !strncmp(e.msg, "fuzz.json", 9) && !strchr(e.msg, '\n'));
        return;
    }
    static const char text[] = "Hello, world! <s> caf\xC3\xA9 12345 \xF0\x9F\x98\x80 \xE2\x96\x81x\n\t  end";
    lm_tok_ids ids = { 0 };
    LM_ASSERT(lm_tokenizer_encode(t, text, sizeof text - 1, true, &ids, &e) == 0);
    lm_tok_str out = { 0 };
    fz_check_decode(t, ids.ids, ids.n, false, &out);
    lm_tok_str_free(&out);
    lm_tok_ids_free(&ids);
    lm_tokenizer_free(t);
}

/* The built-in document `which` with section `where` replaced by v (stolen);
 * NULL when v does not fit there. */
static char *with_section(int which, int where, json_t *v) {
    char *bl = which == 0 ? fz_bytelevel_json() : NULL;
    const char *src = which == 0 ? bl : which == 1 ? k_fz_spm : k_fz_meta;
    json_t *doc = json_loads(src, 0, NULL);
    free(bl);
    LM_ASSERT(doc);
    static const char *const k_top[] = { "normalizer", "pre_tokenizer", "decoder", "post_processor", "added_tokens", "model" };
    json_t *model = json_object_get(doc, "model");
    if (where < 6) json_object_set_new(doc, k_top[where], v);
    else json_object_set_new(model, where == 6 ? "vocab" : "merges", v);
    char *s = json_dumps(doc, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(doc);
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size && data[0] == '{') {
        load_and_check((const char *)data, size);
        return 0;
    }
    if (size < 2) return 0;
    int which = (data[0] & 3) % 3, where = (data[0] >> 2) & 7;
    json_t *v = json_loadb((const char *)data + 1, size - 1, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (!v) return 0;
    char *doc = with_section(which, where, v);
    if (doc) load_and_check(doc, strlen(doc));
    free(doc);
    return 0;
}
