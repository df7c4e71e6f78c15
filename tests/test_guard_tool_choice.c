/* test_guard_tool_choice.c - tool_choice "required" and a named function
 * give parsed tool calls through the real server (issue #25: no HTTP test
 * checked that they yield a call, and the e2e check accepted any finish).
 *
 * Design. No trained model here writes tool calls reliably (the demo model
 * never saw one; the fixtures are random), so the test writes a scripted
 * model: a Llama of one layer whose attention and MLP weights are zero, so
 * the hidden state at a position is its token's embedding and the next token
 * is a fixed function of the current one (a bigram table in lm_head). The
 * tokenizer is byte-level (ids 0..255 are the bytes, no merges) plus a few
 * added tokens that carry whole pieces of an answer. The table:
 *
 *   "\n"             -> "Plain answer."   (a prompt ending "assistant\n": no steering)
 *   "<tool_call>\n"  -> call 1 -> call 2  (the server's prefill for "required")
 *   " "              -> "{args}}\n</tool_call>"  (the prefill for a named function
 *                                          ends in `"arguments": `)
 *   anything else    -> <|im_end|>
 *
 * So the model writes calls only when the server steers it, and which calls
 * depends on how: "auto" gets plain text; "required" two parallel calls
 * (get_weather, get_time); a named get_time one call whose name comes from
 * the server's prefill. Each is checked as a client sees it: the message's
 * tool_calls, finish_reason "tool_calls", and a stream's deltas merged by
 * index. The model is 90 KB, written to the test's tmpdir. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "guard_util.h"
#include "lm_test.h"
#include "test_util.h"

enum { HID = 64, T_START = 256, T_END, T_OPEN, T_CALL1, T_CALL2, T_ARGS, T_TEXT, VOCAB };

static const char *const k_added[] = {
    [T_START - 256] = "<|im_start|>",
    [T_END - 256] = "<|im_end|>",
    [T_OPEN - 256] = "<tool_call>\n",
    [T_CALL1 - 256] = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>",
    [T_CALL2 - 256] = "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Lima\"}}\n</tool_call>",
    [T_ARGS - 256] = "{\"city\": \"Oslo\"}}\n</tool_call>",
    [T_TEXT - 256] = "Plain answer.",
};

static const char k_template[] =
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content if m.content else '' }}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}";

static const char k_config[] =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":64,"
    "\"num_hidden_layers\":1,\"num_attention_heads\":1,\"num_key_value_heads\":1,\"head_dim\":64,\"vocab_size\":263,"
    "\"max_position_embeddings\":1024,\"rms_norm_eps\":1e-06,\"rope_theta\":10000.0,\"tie_word_embeddings\":false,"
    "\"hidden_act\":\"silu\",\"bos_token_id\":null,\"eos_token_id\":257,\"torch_dtype\":\"float32\"}";

/* GPT-2's byte-level alphabet: the printable bytes stand for themselves,
 * the others for U+0100 onwards in byte order. */
static void byte_char(int b, char out[4]) {
    int cp;
    if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)) {
        cp = b;
    } else {
        int k = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff))) k++;
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp, out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3f)), out[2] = 0;
    }
}

static int write_tokenizer(const char *dir) {
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char c[4];
        byte_char(b, c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    json_t *added = json_array();
    for (int i = T_START; i < VOCAB; i++)
        json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", i, "content", k_added[i - 256],
                                               "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special",
                                               i == T_START || i == T_END));
    json_t *tok = json_pack(
        "{s:s,s:n,s:n,s:o,s:n,s:{s:s,s:b,s:b,s:b},s:n,s:{s:s,s:b,s:b,s:b},s:{s:s,s:n,s:n,s:n,s:n,s:b,s:b,s:b,s:o,s:[]}}",
        "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer", "pre_tokenizer", "type",
        "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 1, "post_processor", "decoder", "type",
        "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 1, "model", "type", "BPE", "dropout",
        "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0,
        "ignore_merges", 0, "vocab", vocab, "merges");
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    int rc = tok ? json_dump_file(tok, path, 0) : -1;
    json_decref(tok);
    return rc;
}

/* One F32 tensor into a safetensors blob under construction. */
typedef struct st_out {
    json_t *hdr;
    uint8_t *data;
    size_t len;
} st_out;

static float *st_add(st_out *o, const char *name, int rows, int cols) {
    size_t n = (size_t)rows * (size_t)(cols ? cols : 1) * sizeof(float);
    json_t *shape = cols ? json_pack("[i,i]", rows, cols) : json_pack("[i]", rows);
    json_object_set_new(o->hdr, name,
                        json_pack("{s:s,s:o,s:[I,I]}", "dtype", "F32", "shape", shape, "data_offsets",
                                  (json_int_t)o->len, (json_int_t)(o->len + n)));
    o->data = realloc(o->data, o->len + n);
    float *p = (float *)(o->data + o->len);
    memset(p, 0, n);
    o->len += n;
    return p;
}

static int write_weights(const char *dir) {
    st_out o = { json_object(), NULL, 0 };
    /* the slot of a token in the hidden state, and the next token of each slot */
    static const int32_t slot_token[] = { -1, '\n', T_OPEN, T_CALL1, ' ' };
    static const int32_t next_of_slot[] = { T_END, T_TEXT, T_CALL1, T_CALL2, T_ARGS };
    enum { N_SLOTS = 5 };
    size_t off_embed, off_head;
    (void)st_add(&o, "model.embed_tokens.weight", VOCAB, HID);
    off_embed = o.len - (size_t)VOCAB * HID * sizeof(float);
    static const char *const zero[] = { "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj" };
    char name[128];
    for (size_t i = 0; i < sizeof zero / sizeof *zero; i++) {
        snprintf(name, sizeof name, "model.layers.0.%s.weight", zero[i]);
        (void)st_add(&o, name, HID, HID);
    }
    static const char *const ones[] = { "model.layers.0.input_layernorm.weight",
                                        "model.layers.0.post_attention_layernorm.weight", "model.norm.weight" };
    for (size_t i = 0; i < sizeof ones / sizeof *ones; i++) {
        float *w = st_add(&o, ones[i], HID, 0);
        for (int k = 0; k < HID; k++) w[k] = 1;
    }
    (void)st_add(&o, "lm_head.weight", VOCAB, HID);
    off_head = o.len - (size_t)VOCAB * HID * sizeof(float);
    float *embed = (float *)(o.data + off_embed), *head = (float *)(o.data + off_head);
    for (int t = 0; t < VOCAB; t++) {
        int slot = 0;
        for (int s = 1; s < N_SLOTS; s++)
            if (slot_token[s] == t) slot = s;
        embed[(size_t)t * HID + (size_t)slot] = 1;
    }
    for (int s = 0; s < N_SLOTS; s++) head[(size_t)next_of_slot[s] * HID + (size_t)s] = 4;
    char *h = json_dumps(o.hdr, JSON_COMPACT | JSON_SORT_KEYS);
    size_t hl = strlen(h), pad = (8 - (8 + hl) % 8) % 8;
    uint64_t total = hl + pad;
    size_t n = 8 + total + o.len;
    uint8_t *blob = malloc(n);
    memcpy(blob, &total, 8);
    memcpy(blob + 8, h, hl);
    memset(blob + 8 + hl, ' ', pad);
    memcpy(blob + 8 + total, o.data, o.len);
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = lm_tu_write(path, blob, n);
    free(blob);
    free(h);
    free(o.data);
    json_decref(o.hdr);
    return rc;
}

static char *write_model(void) {
    char *dir = lm_tu_mkdir("scripted-tools");
    char path[1024];
    int rc = write_tokenizer(dir) || write_weights(dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    rc = rc || lm_tu_write(path, k_config, strlen(k_config));
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    rc = rc || lm_tu_write(path, k_template, strlen(k_template));
    static const char tc[] = "{\"eos_token\": \"<|im_end|>\", \"bos_token\": null}";
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    rc = rc || lm_tu_write(path, tc, strlen(tc));
    if (rc) {
        free(dir);
        return NULL;
    }
    return dir;
}

static const char k_tools[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"}}}}}]";

typedef struct want_call {
    const char *name, *args;
} want_call;

/* The answer's calls (message.tool_calls, or stream deltas merged by index
 * as clients merge them) as [{id, name, arguments}], its content and finish. */
static json_t *answer_calls(lm_test_ctx *lm_t_, const gu_resp *r, bool stream, char *content, size_t ccap, char *finish,
                            size_t fcap) {
    json_t *calls = json_array();
    content[0] = finish[0] = 0;
    if (!stream) {
        json_t *j = gu_json(r);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0), *msg = json_object_get(ch, "message");
        snprintf(finish, fcap, "%s", json_string_value(json_object_get(ch, "finish_reason")) ?: "");
        snprintf(content, ccap, "%s", json_string_value(json_object_get(msg, "content")) ?: "");
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(msg, "tool_calls"), i, c) {
            json_t *fn = json_object_get(c, "function");
            LM_CHECK(lm_streq(json_string_value(json_object_get(c, "type")), "function"));
            json_array_append_new(calls, json_pack("{s:s,s:s,s:s}", "id", json_string_value(json_object_get(c, "id")) ?: "",
                                                   "name", json_string_value(json_object_get(fn, "name")) ?: "",
                                                   "arguments", json_string_value(json_object_get(fn, "arguments")) ?: ""));
        }
        json_decref(j);
        return calls;
    }
    int n_done, n_bad;
    json_t *chunks = gu_sse_chunks(r, &n_done, &n_bad);
    LM_CHECK_MSG(n_done == 1 && n_bad == 0, "[DONE] %d times, %d bad chunks", n_done, n_bad);
    size_t ci;
    json_t *chunk;
    json_array_foreach(chunks, ci, chunk) {
        json_t *ch = json_array_get(json_object_get(chunk, "choices"), 0), *d = json_object_get(ch, "delta");
        if (json_is_string(json_object_get(ch, "finish_reason")))
            snprintf(finish, fcap, "%s", json_string_value(json_object_get(ch, "finish_reason")));
        const char *t = json_string_value(json_object_get(d, "content"));
        if (t) strncat(content, t, ccap - strlen(content) - 1);
        size_t i;
        json_t *tc;
        json_array_foreach(json_object_get(d, "tool_calls"), i, tc) {
            long idx = json_is_integer(json_object_get(tc, "index")) ? (long)json_integer_value(json_object_get(tc, "index")) : -1;
            json_t *fn = json_object_get(tc, "function");
            LM_CHECK_MSG(idx >= 0 && idx <= (long)json_array_size(calls), "delta index %ld with %zu calls", idx,
                         json_array_size(calls));
            if (idx < 0 || idx > (long)json_array_size(calls)) continue;
            if (idx == (long)json_array_size(calls))
                json_array_append_new(calls, json_pack("{s:s,s:s,s:s}", "id", json_string_value(json_object_get(tc, "id")) ?: "",
                                                       "name", json_string_value(json_object_get(fn, "name")) ?: "",
                                                       "arguments", ""));
            else
                LM_CHECK_MSG(!json_object_get(tc, "id") && !json_object_get(fn, "name"), "call %ld started twice", idx);
            json_t *c = json_array_get(calls, (size_t)idx);
            const char *frag = json_string_value(json_object_get(fn, "arguments"));
            if (frag) {
                size_t a = strlen(json_string_value(json_object_get(c, "arguments"))), b = strlen(frag);
                char *cat = malloc(a + b + 1);
                memcpy(cat, json_string_value(json_object_get(c, "arguments")), a);
                memcpy(cat + a, frag, b + 1);
                json_object_set_new(c, "arguments", json_string(cat));
                free(cat);
            }
        }
    }
    json_decref(chunks);
    return calls;
}

static void expect(lm_test_ctx *lm_t_, int port, const char *tool_choice, bool stream, const want_call *want, int n_want,
                   const char *want_content, const char *want_finish) {
    char body[2048];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather and time, please.\"}],\"tools\":%s,"
             "\"tool_choice\":%s,\"max_tokens\":16,\"temperature\":0,\"stream\":%s}",
             k_tools, tool_choice, stream ? "true" : "false");
    gu_resp r;
    LM_REQUIRE(gu_http(port, "POST", "/v1/chat/completions", body, NULL, &r) == 0);
    LM_CHECK_MSG(r.status == 200, "tool_choice %s: %d %s", tool_choice, r.status, r.body);
    char content[512], finish[32];
    json_t *calls = answer_calls(lm_t_, &r, stream, content, sizeof content, finish, sizeof finish);
    const char *how = stream ? "stream" : "plain";
    LM_CHECK_MSG((int)json_array_size(calls) == n_want, "tool_choice %s (%s): %zu calls, want %d; content '%s'; body %.300s",
                 tool_choice, how, json_array_size(calls), n_want, content, r.body);
    for (int i = 0; i < n_want && i < (int)json_array_size(calls); i++) {
        json_t *c = json_array_get(calls, (size_t)i);
        const char *args = json_string_value(json_object_get(c, "arguments"));
        json_t *got = json_loads(args ? args : "", 0, NULL), *exp = json_loads(want[i].args, 0, NULL);
        LM_CHECK_MSG(lm_streq(json_string_value(json_object_get(c, "name")), want[i].name) && json_equal(got, exp),
                     "tool_choice %s (%s) call %d: %s(%s), want %s(%s)", tool_choice, how, i,
                     json_string_value(json_object_get(c, "name")), args ? args : "", want[i].name, want[i].args);
        const char *id = json_string_value(json_object_get(c, "id"));
        LM_CHECK_MSG(id && !strncmp(id, "call_", 5), "call %d id '%s'", i, id ? id : "");
        json_decref(got);
        json_decref(exp);
    }
    if (n_want == 2)
        LM_CHECK(!lm_streq(json_string_value(json_object_get(json_array_get(calls, 0), "id")),
                           json_string_value(json_object_get(json_array_get(calls, 1), "id"))));
    LM_CHECK_MSG(!strcmp(content, want_content), "tool_choice %s (%s): content '%s', want '%s'", tool_choice, how, content,
                 want_content);
    LM_CHECK_MSG(!strcmp(finish, want_finish), "tool_choice %s (%s): finish_reason '%s', want '%s'", tool_choice, how,
                 finish, want_finish);
    json_decref(calls);
    gu_resp_free(&r);
}

LM_TEST(guard_tool_choice_http_parsed_calls) {
    char *dir = write_model();
    LM_REQUIRE(dir != NULL);
    gu_server s;
    if (gu_server_start(&s, dir, "--threads 1 --cache-ram 0")) {
        gu_server_dump_log(&s);
        free(dir);
        LM_REQUIRE(!"the scripted model's server started");
    }
    static const want_call both[] = { { "get_weather", "{\"city\": \"Paris\", \"days\": 2}" },
                                      { "get_time", "{\"city\": \"Lima\"}" } };
    static const want_call named[] = { { "get_time", "{\"city\": \"Oslo\"}" } };
    for (int stream = 0; stream < 2; stream++) {
        /* unsteered, the model answers in text: the calls below come from tool_choice */
        expect(lm_t_, s.port, "\"auto\"", stream, NULL, 0, "Plain answer.", "stop");
        expect(lm_t_, s.port, "\"none\"", stream, NULL, 0, "Plain answer.", "stop");
        expect(lm_t_, s.port, "\"required\"", stream, both, 2, "", "tool_calls");
        expect(lm_t_, s.port, "{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}", stream, named, 1, "",
               "tool_calls");
    }
    int rc = gu_server_stop(&s);
    if (rc) gu_server_dump_log(&s);
    LM_CHECK_MSG(rc == 0, "server exit status %d", rc);
    free(dir);
}
