/* fuzz_template.c - libFuzzer harness for the Jinja chat-template interpreter.
 *
 * Design: the input is a template source, optionally followed by a NUL byte
 * and a JSON object used as the render context (otherwise a fixed context
 * with the shapes chat templates see: messages with string, null and
 * parts content, tool calls, tools, add_generation_prompt, special tokens).
 * Every input is parsed; a template that parses is rendered under small
 * limits (steps, output, memory) so that loops like range(10**7) end quickly
 * with an error instead of timing out. Checked promises (an abort is a
 * finding): a failure returns -1 with a message that starts with the
 * template's name and, for parse errors, a line:column; a success returns a
 * NUL-terminated string of the stated length. ASan/UBSan/LSan report memory
 * errors and leaks (everything is freed on every path). */
#include "template/lm_template.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char k_ctx[] =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"You are helpful.\"},"
    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hi \\u00e9\"}, {\"type\": \"image\"}]},"
    "{\"role\": \"assistant\", \"content\": null, \"reasoning_content\": \"hmm\", \"tool_calls\": [{\"id\": \"c1\", "
    "\"type\": \"function\", \"function\": {\"name\": \"get\", \"arguments\": {\"q\": \"x\", \"n\": 2, \"f\": 1.5, "
    "\"l\": [true, null]}}}]},"
    "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"ok\"},"
    "{\"role\": \"user\", \"content\": \"Thanks\"}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get\", \"description\": \"Get.\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"q\": {\"type\": \"string\"}}, \"required\": [\"q\"]}}}],"
    "\"add_generation_prompt\": true, \"enable_thinking\": false, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *src = (const char *)data;
    size_t src_len = size;
    const uint8_t *nul = memchr(data, 0, size);
    json_t *ctx = NULL;
    if (nul) {
        src_len = (size_t)(nul - data);
        json_error_t je;
        ctx = json_loadb((const char *)nul + 1, size - src_len - 1, JSON_ALLOW_NUL, &je);
        if (ctx && !json_is_object(ctx)) {
            json_decref(ctx);
            ctx = NULL;
        }
    }
    if (!ctx) {
        json_error_t je;
        ctx = json_loads(k_ctx, 0, &je);
        LM_ASSERT(ctx);
    }
    lm_template *t = NULL;
    lm_err e = { { 0 } };
    if (lm_template_parse(src, src_len, "fuzz", &t, &e)) {
        LM_ASSERT(t == NULL);
        LM_ASSERT(!strncmp(e.msg, "fuzz:", 5));
        json_decref(ctx);
        return 0;
    }
    lm_template_opts o = { .now = 1700000000, .max_output = 1 << 20, .max_memory = 64 << 20, .max_steps = 200000 };
    char *out = NULL;
    size_t n = 0;
    if (lm_template_render(t, ctx, &o, &out, &n, &e)) {
        LM_ASSERT(out == NULL);
        LM_ASSERT(!strncmp(e.msg, "fuzz", 4) && e.msg[4]);
    } else {
        LM_ASSERT(out && out[n] == 0 && n <= o.max_output);
        free(out);
    }
    lm_template_free(t);
    json_decref(ctx);
    return 0;
}
