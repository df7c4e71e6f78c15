/* openai_request.c - a request body -> srv_req: every field OpenAI defines
 * that lumen honours, checked for type and range, with OpenAI's defaults.
 *
 * Unknown fields are ignored (clients send many); fields lumen cannot honour
 * honestly (several prompts, a schema it cannot enforce) are
 * refused with a 400 that says so, rather than silently ignored. Extensions
 * that llama.cpp and vLLM also accept: top_k, min_p, repetition_penalty,
 * chat_template_kwargs, ignore_eos.
 *
 * A chat request's prompt is the chat layer's (chat/lm_chat.h): the request
 * handed over as an lm_chat_req, its failures answered as 400s. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "server_internal.h"

int srv_fail(srv_err *e, int status, const char *type, const char *code, const char *param,
             const char *fmt, ...) {
    if (!e) return -1;
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int srv_shutdown_error(srv_err *e) {
    return srv_fail(e, 503, "server_error", "shutting_down", NULL,
                    "The server is shutting down; the request was not finished. Retry it.");
}

const char *srv_json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static int bad_type(srv_err *e, const char *key, const char *want, const json_t *v) {
    return srv_bad(e, key, "Invalid type for '%s': expected %s, but got %s instead.", key, want, srv_json_type_name(v));
}

/* The field key of body, or NULL when absent or JSON null (OpenAI treats an
 * explicit null as "use the default"). */
static const json_t *field(const json_t *body, const char *key) {
    const json_t *v = json_object_get(body, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int get_number(const json_t *body, const char *key, double lo, double hi, double *out, srv_err *e) {
    const json_t *v = field(body, key);
    if (!v) return 0;
    if (!json_is_number(v)) return bad_type(e, key, "a number", v);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return srv_bad(e, key, "Invalid '%s': %g is not in [%g, %g].", key, x, lo, hi);
    *out = x;
    return 0;
}

static int get_int(const json_t *body, const char *key, long long lo, long long hi, long long *out, bool *set,
                   srv_err *e) {
    const json_t *v = field(body, key);
    if (!v) return 0;
    long long x;
    if (json_is_integer(v)) x = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 9e15)
        x = (long long)json_real_value(v);
    else return bad_type(e, key, "an integer", v);
    if (x < lo || x > hi) return srv_bad(e, key, "Invalid '%s': %lld is not in [%lld, %lld].", key, x, lo, hi);
    *out = x;
    if (set) *set = true;
    return 0;
}

static int get_bool(const json_t *body, const char *key, bool *out, srv_err *e) {
    const json_t *v = field(body, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return bad_type(e, key, "a boolean", v);
    *out = json_is_true(v);
    return 0;
}

/* A fresh seed for requests that give none. */
static uint64_t random_seed(void) {
    uint64_t x = 0;
    if (getrandom(&x, sizeof x, 0) != (ssize_t)sizeof x) x = 0;
    return x ^ (uint64_t)(lm_now() * 1e9);
}

static int parse_logit_bias(const srv *s, const json_t *body, srv_req *r, srv_err *e) {
    const json_t *lb = field(body, "logit_bias");
    if (!lb) return 0;
    if (!json_is_object(lb)) return bad_type(e, "logit_bias", "an object", lb);
    size_t n = json_object_size(lb);
    if (n > 1024) return srv_bad(e, "logit_bias", "Invalid 'logit_bias': %zu entries (at most 1024).", n);
    r->bias = lm_xcalloc(n ? n : 1, sizeof *r->bias);
    const char *k;
    const json_t *v;
    int i = 0;
    json_object_foreach((json_t *)lb, k, v) {
        char *end;
        long id = strtol(k, &end, 10);
        if (!*k || *end || id < 0 || id >= s->n_vocab)
            return srv_bad(e, "logit_bias", "Invalid key in 'logit_bias': \"%.40s\" is not a token id in [0, %d).", k,
                           s->n_vocab);
        if (!json_is_number(v)) return bad_type(e, "logit_bias", "numbers as values", v);
        double b = json_number_value(v);
        if (!(b >= -100 && b <= 100))
            return srv_bad(e, "logit_bias", "Invalid 'logit_bias' value %g for token %ld: must be in [-100, 100].", b, id);
        r->bias[i++] = (lm_logit_bias){ (int32_t)id, (float)b };
    }
    r->gp.logit_bias = r->bias;
    r->gp.n_logit_bias = i;
    return 0;
}

/* Sampling, penalties, limits, logprobs, stop: shared by both endpoints. */
static int parse_common(const srv *s, const json_t *body, srv_req *r, srv_err *e) {
    /* response_format: constrain.c */
    lm_gen_params *gp = &r->gp;
    gp->sampling = (lm_sampler_params){ .temperature = 1, .top_k = 0, .top_p = 1, .min_p = 0 };
    gp->repetition_penalty = 1;
    double t = 1, top_p = 1, min_p = 0, pp = 0, fp = 0, rp = 1;
    long long top_k = 0, seed = 0, n = 1, mt = 0;
    bool seed_set = false, n_set = false;
    if (get_number(body, "temperature", 0, 2, &t, e) || get_number(body, "top_p", 0, 1, &top_p, e) ||
        get_number(body, "min_p", 0, 1, &min_p, e) || get_number(body, "presence_penalty", -2, 2, &pp, e) ||
        get_number(body, "frequency_penalty", -2, 2, &fp, e) ||
        get_number(body, "repetition_penalty", 0.01, 10, &rp, e) ||
        get_int(body, "top_k", -1, 1 << 30, &top_k, NULL, e) ||
        get_int(body, "seed", INT64_MIN, INT64_MAX, &seed, &seed_set, e) || get_int(body, "n", 1, 128, &n, &n_set, e))
        return -1;
    if (n > SRV_MAX_CHOICES)
        return srv_bad(e, "n", "Invalid 'n': %lld choices (at most %d per request).", n, SRV_MAX_CHOICES);
    r->n = (int)n;
    if (top_p == 0) top_p = 1e-9; /* OpenAI accepts 0: keep only the top token */
    gp->sampling.temperature = (float)t;
    gp->sampling.top_p = (float)top_p;
    gp->sampling.min_p = (float)min_p;
    gp->sampling.top_k = top_k < 0 ? 0 : (int)top_k;
    gp->sampling.seed = seed_set ? (uint64_t)seed : random_seed();
    gp->presence_penalty = (float)pp;
    gp->frequency_penalty = (float)fp;
    gp->repetition_penalty = (float)rp;

    /* max_completion_tokens wins over the older max_tokens (as OpenAI does) */
    bool mt_set = false;
    const char *mt_key = field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (get_int(body, mt_key, 1, INT32_MAX, &mt, &mt_set, e)) return -1;
    r->max_tokens_set = mt_set;
    /* more than the context leaves is cut to it later (generate.c) */
    gp->max_tokens = mt_set ? (int)mt : 0;

    /* ignore_eos (llama.cpp, vLLM): generation runs to max_tokens, so that
     * benchmarks compare equal work; end-of-turn tokens are still not shown */
    bool ignore_eos = false;
    if (get_bool(body, "ignore_eos", &ignore_eos, e)) return -1;
    gp->stop_tokens = s->stop_ids;
    gp->n_stop_tokens = ignore_eos ? 0 : s->n_stop_ids;
    /* speculative (lumen): false opts this request out of speculative
     * decoding (--spec); its tokens are the same either way */
    bool spec = true;
    if (get_bool(body, "speculative", &spec, e)) return -1;
    gp->no_spec = !spec;
    if (parse_logit_bias(s, body, r, e)) return -1;

    const json_t *stop = field(body, "stop");
    if (stop) {
        if (json_is_array(stop)) {
            if (json_array_size(stop) > 16) return srv_bad(e, "stop", "Invalid 'stop': at most 16 strings.");
            for (size_t i = 0; i < json_array_size(stop); i++)
                if (!json_is_string(json_array_get(stop, i)))
                    return bad_type(e, "stop", "a string or an array of strings", json_array_get(stop, i));
        } else if (!json_is_string(stop)) {
            return bad_type(e, "stop", "a string or an array of strings", stop);
        }
        r->stop = stop;
    }

    if (get_bool(body, "stream", &r->stream, e)) return -1;
    const json_t *so = field(body, "stream_options");
    if (so) {
        if (!json_is_object(so)) return bad_type(e, "stream_options", "an object", so);
        if (!r->stream) return srv_bad(e, "stream_options", "'stream_options' is only allowed when 'stream' is true.");
        const json_t *iu = field(so, "include_usage");
        if (iu && !json_is_boolean(iu)) return bad_type(e, "stream_options.include_usage", "a boolean", iu);
        r->include_usage = json_is_true(iu);
    }

    const json_t *rf = field(body, "response_format");
    if (rf && srv_parse_response_format(s, rf, r, e)) return -1;

    const json_t *model = field(body, "model");
    if (model) {
        if (!json_is_string(model)) return bad_type(e, "model", "a string", model);
        const char *name = json_string_value(model);
        if (strcmp(name, s->model_name) != 0)
            return srv_fail(e, 404, "invalid_request_error", "model_not_found", "model",
                            "The model '%.200s' does not exist; this server serves '%.200s'.", name, s->model_name);
    }
    return 0;
}

/* ---- chat ---------------------------------------------------------------------------- */

static int parse_content(const json_t *c, const char *param, bool allow_null, srv_err *e) {
    if (!c || json_is_null(c)) {
        if (allow_null) return 0;
        return srv_bad(e, param, "Invalid '%s': a message needs content.", param);
    }
    if (json_is_string(c)) return 0;
    if (!json_is_array(c)) return bad_type(e, param, "a string or an array of content parts", c);
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *part = json_array_get(c, i);
        const json_t *type = json_object_get(part, "type");
        if (!json_is_object(part) || !json_is_string(type))
            return srv_bad(e, param, "Invalid '%s[%zu]': a content part is an object with a 'type'.", param, i);
        if (strcmp(json_string_value(type), "text") != 0)
            return srv_bad(e, param, "Content parts of type '%.40s' are not supported (only 'text').",
                           json_string_value(type));
        if (!json_is_string(json_object_get(part, "text")))
            return srv_bad(e, param, "Invalid '%s[%zu].text': expected a string.", param, i);
    }
    return 0;
}

static int parse_messages(const json_t *body, srv_req *r, srv_err *e) {
    const json_t *msgs = json_object_get(body, "messages");
    if (!msgs) return srv_bad(e, "messages", "Missing required parameter: 'messages'.");
    if (!json_is_array(msgs)) return bad_type(e, "messages", "an array", msgs);
    if (json_array_size(msgs) == 0)
        return srv_bad(e, "messages", "Invalid 'messages': empty array. Expected an array with minimum length 1.");
    char param[64];
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(m)) return bad_type(e, param, "an object", m);
        const json_t *role = json_object_get(m, "role");
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!json_is_string(role)) return srv_bad(e, param, "Missing or invalid '%s': expected a string.", param);
        const char *rs = json_string_value(role);
        bool assistant = !strcmp(rs, "assistant");
        if (strcmp(rs, "system") && strcmp(rs, "developer") && strcmp(rs, "user") && !assistant && strcmp(rs, "tool"))
            return srv_bad(e, param,
                           "Invalid '%s': '%.40s' is not one of 'system', 'developer', 'user', 'assistant', 'tool'.",
                           param, rs);
        const json_t *tc = json_object_get(m, "tool_calls");
        snprintf(param, sizeof param, "messages[%zu].content", i);
        if (parse_content(json_object_get(m, "content"), param, assistant, e)) return -1;
        if (tc && !json_is_null(tc)) {
            snprintf(param, sizeof param, "messages[%zu].tool_calls", i);
            if (!assistant) return srv_bad(e, param, "Only assistant messages have 'tool_calls'.");
            if (!json_is_array(tc)) return bad_type(e, param, "an array", tc);
            for (size_t k = 0; k < json_array_size(tc); k++) {
                const json_t *call = json_array_get(tc, k);
                const json_t *fn = json_object_get(call, "function");
                if (!json_is_object(call) || !json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
                    return srv_bad(e, param, "Invalid '%s[%zu]': expected {\"function\": {\"name\", \"arguments\"}}.",
                                   param, k);
                const json_t *args = json_object_get(fn, "arguments");
                if (args && !json_is_string(args) && !json_is_object(args))
                    return srv_bad(e, param, "Invalid '%s[%zu].function.arguments': expected a JSON string.", param, k);
            }
        }
        const json_t *rc = json_object_get(m, "reasoning_content");
        if (rc && !json_is_null(rc) && !json_is_string(rc)) {
            snprintf(param, sizeof param, "messages[%zu].reasoning_content", i);
            return bad_type(e, param, "a string", rc);
        }
    }
    r->messages = msgs;
    return 0;
}

static int parse_tools(const json_t *body, srv_req *r, srv_err *e) {
    const json_t *tools = field(body, "tools");
    if (tools) {
        if (!json_is_array(tools)) return bad_type(e, "tools", "an array", tools);
        for (size_t i = 0; i < json_array_size(tools); i++) {
            const json_t *t = json_array_get(tools, i);
            const json_t *fn = json_object_get(t, "function");
            const json_t *type = json_object_get(t, "type");
            if (!json_is_object(t) || (type && !(json_is_string(type) && !strcmp(json_string_value(type), "function"))) ||
                !json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
                return srv_bad(e, "tools", "Invalid 'tools[%zu]': expected {\"type\": \"function\", \"function\": {\"name\", ...}}.", i);
            const json_t *params = json_object_get(fn, "parameters");
            if (params && !json_is_null(params) && !json_is_object(params))
                return srv_bad(e, "tools", "Invalid 'tools[%zu].function.parameters': expected an object.", i);
        }
        if (json_array_size(tools) > 0) r->tools = (json_t *)tools;
    }
    r->tool_choice = SRV_TOOLS_AUTO;
    const json_t *tc = field(body, "tool_choice");
    if (tc) {
        if (json_is_string(tc)) {
            const char *v = json_string_value(tc);
            if (!strcmp(v, "none")) r->tool_choice = SRV_TOOLS_NONE;
            else if (!strcmp(v, "auto")) r->tool_choice = SRV_TOOLS_AUTO;
            else if (!strcmp(v, "required")) r->tool_choice = SRV_TOOLS_REQUIRED;
            else return srv_bad(e, "tool_choice", "Invalid 'tool_choice': '%.40s' (expected none, auto, required or an object).", v);
        } else if (json_is_object(tc)) {
            const json_t *fn = json_object_get(tc, "function");
            const json_t *name = json_object_get(fn, "name");
            if (!json_is_string(name))
                return srv_bad(e, "tool_choice", "Invalid 'tool_choice': expected {\"type\": \"function\", \"function\": {\"name\": ...}}.");
            r->tool_choice = SRV_TOOLS_NAMED;
            r->tool_name = json_string_value(name);
        } else {
            return bad_type(e, "tool_choice", "a string or an object", tc);
        }
    }
    if (r->tool_choice != SRV_TOOLS_AUTO && r->tool_choice != SRV_TOOLS_NONE && !r->tools)
        return srv_bad(e, "tool_choice", "'tool_choice' requires 'tools'.");
    if (r->tool_choice == SRV_TOOLS_NAMED) {
        bool found = false;
        for (size_t i = 0; i < json_array_size(r->tools); i++) {
            const json_t *name = json_object_get(json_object_get(json_array_get(r->tools, i), "function"), "name");
            found |= !strcmp(json_string_value(name), r->tool_name);
        }
        if (!found)
            return srv_bad(e, "tool_choice", "'tool_choice' names the function '%.100s', which is not in 'tools'.",
                           r->tool_name);
    }
    if (r->tool_choice == SRV_TOOLS_NONE) r->tools = NULL;
    const json_t *ptc = field(body, "parallel_tool_calls");
    if (ptc && !json_is_boolean(ptc)) return bad_type(e, "parallel_tool_calls", "a boolean", ptc);
    r->one_tool_call = json_is_false(ptc); /* the call grammar allows one call */
    return 0;
}

/* --debug-tool-call applies to r: the request offers the tool, lets the
 * model choose (auto or required), and it is the user's turn (not the answer
 * to a tool result, so an agent's loop ends after one call). */
static void apply_debug_call(const srv *s, srv_req *r) {
    if (!s->debug_call_name || !r->tools) return;
    if (r->tool_choice != SRV_TOOLS_AUTO && r->tool_choice != SRV_TOOLS_REQUIRED) return;
    const json_t *last = json_array_get(r->messages, json_array_size(r->messages) - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    if (!role || strcmp(role, "user")) return;
    for (size_t i = 0; i < json_array_size(r->tools); i++) {
        const json_t *name = json_object_get(json_object_get(json_array_get(r->tools, i), "function"), "name");
        if (!strcmp(json_string_value(name), s->debug_call_name)) {
            r->tool_name = s->debug_call_name;
            r->tool_args = s->debug_call_args;
            return;
        }
    }
}

int srv_debug_call_parse(srv *s, const char *spec, lm_err *e) {
    const char *eq = strchr(spec, '=');
    if (!eq || eq == spec) return lm_errf(e, "--debug-tool-call '%.80s': expected NAME=JSON", spec);
    json_error_t je;
    json_t *args = json_loads(eq + 1, 0, &je);
    if (!json_is_object(args)) {
        json_decref(args);
        return lm_errf(e, "--debug-tool-call '%.80s': the arguments must be a JSON object%s%s", spec,
                       args || !je.text[0] ? "" : ": ", args ? "" : je.text);
    }
    free(s->debug_call_name);
    json_decref(s->debug_call_args);
    s->debug_call_name = lm_xstrdup(spec);
    s->debug_call_name[eq - spec] = 0;
    s->debug_call_args = args;
    return 0;
}

static int parse_chat(const srv *s, const json_t *body, srv_req *r, srv_err *e) {
    if (parse_messages(body, r, e) || parse_tools(body, r, e)) return -1;
    apply_debug_call(s, r);
    bool lp = false;
    long long top = 0;
    if (get_bool(body, "logprobs", &lp, e) ||
        get_int(body, "top_logprobs", 0, LM_MAX_TOP_LOGPROBS, &top, NULL, e))
        return -1;
    if (top > 0 && !lp) return srv_bad(e, "top_logprobs", "'top_logprobs' requires 'logprobs' to be true.");
    r->gp.logprobs = lp;
    r->gp.top_logprobs = (int)top;
    const json_t *kw = field(body, "chat_template_kwargs");
    if (kw && !json_is_object(kw)) return bad_type(e, "chat_template_kwargs", "an object", kw);
    r->template_kwargs = kw;
    (void)s;
    return 0;
}

/* ---- completions ------------------------------------------------------------------------- */

static int parse_completion(const srv *s, const json_t *body, srv_req *r, srv_err *e) {
    const json_t *p = json_object_get(body, "prompt");
    if (!p) return srv_bad(e, "prompt", "Missing required parameter: 'prompt'.");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        p = json_array_get(p, 0);
    if (json_is_string(p)) {
        r->prompt_text = json_string_value(p);
        r->prompt_len = json_string_length(p);
        if (r->prompt_len == 0) return srv_bad(e, "prompt", "Invalid 'prompt': empty string.");
    } else if (json_is_array(p)) {
        size_t n = json_array_size(p);
        if (n == 0) return srv_bad(e, "prompt", "Invalid 'prompt': empty array.");
        if (!json_is_integer(json_array_get(p, 0)))
            return srv_bad(e, "prompt", "Only one prompt per request is supported (a string or an array of token ids).");
        if (n > (size_t)s->ctx)
            return srv_fail(e, 400, "invalid_request_error", "context_length_exceeded", "prompt",
                            "This model's maximum context length is %d tokens, however you requested %zu tokens in the prompt.",
                            s->ctx, n);
        r->prompt_ids = lm_xmalloc(n * sizeof *r->prompt_ids);
        for (size_t i = 0; i < n; i++) {
            const json_t *v = json_array_get(p, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= s->n_vocab)
                return srv_bad(e, "prompt", "Invalid 'prompt[%zu]': expected a token id in [0, %d).", i, s->n_vocab);
            r->prompt_ids[i] = (int32_t)json_integer_value(v);
        }
        r->n_prompt_ids = (int)n;
    } else {
        return bad_type(e, "prompt", "a string or an array of token ids", p);
    }
    long long lp = 0;
    bool lp_set = false;
    if (get_bool(body, "echo", &r->echo, e) || get_int(body, "logprobs", 0, 5, &lp, &lp_set, e)) return -1;
    if (r->echo && lp_set) return srv_bad(e, "logprobs", "'echo' together with 'logprobs' is not supported (no prompt logprobs).");
    const json_t *suffix = field(body, "suffix");
    if (suffix) return srv_bad(e, "suffix", "'suffix' is not supported.");
    const json_t *bo = field(body, "best_of");
    if (bo && !(json_is_integer(bo) && json_integer_value(bo) == 1)) return srv_bad(e, "best_of", "Only best_of = 1 is supported.");
    r->gp.logprobs = lp_set;
    r->gp.top_logprobs = (int)lp;
    return 0;
}

json_t *srv_json_body(const char *body, size_t len, srv_err *e) {
    json_error_t je;
    /* a repeated key: the last wins, as in Python. \u0000 is valid JSON and
     * clients send back what a model wrote: strings keep their length
     * (json_string_length) all the way to the tokenizer */
    json_t *j = json_loadb(body, len, JSON_ALLOW_NUL, &je);
    if (!j) {
        srv_bad(e, NULL, "We could not parse the JSON body of your request: %s (line %d, column %d).", je.text,
                je.line, je.column);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        srv_bad(e, NULL, "The request body must be a JSON object.");
        return NULL;
    }
    return j;
}

static int parse_body(const srv *s, srv_req *r, srv_err *e) {
    if (!json_is_object(r->body)) return srv_bad(e, NULL, "The request body must be a JSON object.");
    if (parse_common(s, r->body, r, e)) return -1;
    return r->kind == SRV_CHAT ? parse_chat(s, r->body, r, e) : parse_completion(s, r->body, r, e);
}

int srv_req_parse(const srv *s, srv_kind kind, const char *body, size_t len, srv_req *r, srv_err *e) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    if (!(r->body = srv_json_body(body, len, e))) return -1;
    return parse_body(s, r, e);
}

int srv_req_parse_json(const srv *s, srv_kind kind, json_t *body, srv_req *r, srv_err *e) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->body = body;
    return parse_body(s, r, e);
}

void srv_req_free(srv_req *r) {
    json_decref(r->body);
    free(r->bias);
    free(r->prompt_ids);
    lm_grammar_unref(r->grammar);
    memset(r, 0, sizeof *r);
}

/* ---- the chat prompt ------------------------------------------------------------------- */

lm_chat_req srv_chat_req(const srv_req *r) {
    bool force = r->tools && (r->tool_choice == SRV_TOOLS_REQUIRED || r->tool_choice == SRV_TOOLS_NAMED || r->tool_args);
    bool named = r->tool_choice == SRV_TOOLS_NAMED || r->tool_args;
    return (lm_chat_req){ .messages = r->messages, .tools = r->tools, .kwargs = r->template_kwargs,
                          .force_call = force, .tool_name = force && named ? r->tool_name : NULL,
                          .tool_args = force ? r->tool_args : NULL };
}

void srv_chat_marks(const srv *s, const srv_req *r, lm_chat_prompt *p) {
    lm_chat_req cr = srv_chat_req(r);
    cr.special_in_content = s->opts.special_in_content;
    lm_chat_mark_messages(s->chat, &cr, p);
}

int srv_chat_render(const srv *s, const srv_req *r, lm_chat_prompt *p, srv_err *e) {
    memset(p, 0, sizeof *p);
    if (!s->chat)
        return srv_bad(e, NULL, "The model '%s' has no chat template; use /v1/completions with a raw prompt.",
                       s->model_name);
    lm_chat_req cr = srv_chat_req(r);
    cr.special_in_content = s->opts.special_in_content;
    lm_err le = { { 0 } };
    if (lm_chat_render(s->chat, &cr, p, &le))
        return srv_bad(e, "messages", "The chat template could not render these messages: %s", le.msg);
    return 0;
}
