/* cmd_serve.c - `lumen serve`: the OpenAI-compatible HTTP server. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/lm_file.h"
#include "../server/lm_server.h"
#include "cli.h"

typedef struct serve_opts {
    lm_server_opts so;
    int max_body_mb;
    bool quiet;
    const char *template_path;
    lm_common_opts co;
} serve_opts;

static const lm_opt_choice k_on_off[] = { { "on", 1 }, { "off", -1 }, { NULL, 0 } };

static const lm_opt k_opts[] = {
    { LM_OPT_STRING, "--model", "-m", LM_OPT_AT(serve_opts, so.model_path), "PATH", "Hugging Face folder or .gguf file",
      "the bundled demo model, models/demo" },
    { LM_OPT_STRING, "--alias", NULL, LM_OPT_AT(serve_opts, so.alias), "NAME", "model name in the API",
      "MODEL's basename", .ilo = 1 },
    { LM_OPT_STRING, "--host", NULL, LM_OPT_AT(serve_opts, so.host), "ADDR", "address to bind",
      "127.0.0.1: this machine only" },
    { LM_OPT_INT, "--port", NULL, LM_OPT_AT(serve_opts, so.port), "N", "TCP port; 0 = any free port", .ilo = 0,
      .ihi = 65535 },
    { LM_OPT_STRING, "--api-key", NULL, LM_OPT_AT(serve_opts, so.api_key), "KEY",
      "require 'Authorization: Bearer KEY' (also 'x-api-key: KEY' on /v1/messages; LUMEN_API_KEY)", .ilo = 1 },
    { LM_OPT_INT, "--ctx", NULL, LM_OPT_AT(serve_opts, so.engine.ctx), "N",
      "tokens per request, prompt + completion", "the model's", .ilo = 16, .ihi = 1 << 24 },
    { LM_OPT_INT, "--parallel", NULL, LM_OPT_AT(serve_opts, so.engine.parallel), "N", "requests generated at once",
      .ilo = 1, .ihi = 4096 },
    { LM_OPT_INT, "--step-tokens", NULL, LM_OPT_AT(serve_opts, so.engine.step_tokens), "N",
      "most tokens one forward takes while any request is generating: a prompt that arrives meanwhile is prefilled "
      "beside them in chunks that fit, so they wait at most one step of N tokens for each token",
      .ilo = 16, .ihi = 1 << 16 },
    { LM_OPT_INT, "--prefill-tokens", NULL, LM_OPT_AT(serve_opts, so.engine.prefill_tokens), "N",
      "most tokens one forward takes while no request is generating (prompts alone; raised to --step-tokens if "
      "below)", "4096 with --device cuda (larger products keep the tensor cores busy), --step-tokens on the CPU",
      .ilo = 16, .ihi = 1 << 16 },
    { LM_OPT_INT, "--max-queue", NULL, LM_OPT_AT(serve_opts, so.engine.max_queue), "N",
      "requests waiting beyond those; more get 503", .ilo = 1, .ihi = 1 << 20 },
    { LM_OPT_INT, "--timeout", NULL, LM_OPT_AT(serve_opts, so.timeout_s), "S",
      "drop a client idle for S seconds while sending", .ilo = 1, .ihi = 86400 },
    { LM_OPT_INT, "--max-body-mb", NULL, LM_OPT_AT(serve_opts, max_body_mb), "N",
      "largest request body in MiB; larger get 413", .ilo = 1, .ihi = 4096 },
    { LM_OPT_INT, "--max-connections", NULL, LM_OPT_AT(serve_opts, so.max_connections), "N",
      "open connections at once; past it a request gets 503 with Retry-After (lowered to what ulimit -n allows)",
      .ilo = 1, .ihi = 100000 },
    { LM_OPT_INT, "--max-client-connections", NULL, LM_OPT_AT(serve_opts, so.max_client_connections), "N",
      "open connections from one IP address; more are refused", "no cap", .ilo = 1, .ihi = 100000 },
    { LM_OPT_INT, "--header-timeout", NULL, LM_OPT_AT(serve_opts, so.header_timeout_s), "S",
      "a request's headers must arrive within S seconds of connecting (of the idle timeout, on a kept-alive "
      "connection)", .ilo = 1, .ihi = 86400 },
    { LM_OPT_INT, "--body-timeout", NULL, LM_OPT_AT(serve_opts, so.body_timeout_s), "S",
      "a request's body must arrive within S seconds of its headers", .ilo = 1, .ihi = 86400 },
    { LM_OPT_INT, "--shutdown-timeout", NULL, LM_OPT_AT(serve_opts, so.shutdown_timeout_s), "S",
      "on SIGTERM or SIGINT, let running requests finish for up to S seconds, then end the rest with an error "
      "event or a 503 (a second signal stops at once)", .ilo = 1, .ihi = 86400 },
    { LM_OPT_STRING, "--allow-host", NULL, LM_OPT_AT(serve_opts, so.allow_hosts), "NAMES",
      "host names (comma-separated; '*' = any) allowed in Host and Origin besides localhost, 127.0.0.1 and ::1; "
      "a server on loopback, or given this option, refuses other Host and Origin headers with 403 (against DNS "
      "rebinding and cross-site requests)", .ilo = 1 },
    { LM_OPT_SIZE, "--cache-ram", NULL, LM_OPT_AT(serve_opts, so.engine.cache_ram), "SIZE",
      "memory for the prefix cache: KV blocks and recurrent-state checkpoints of earlier prompts, reused when a new "
      "prompt starts the same way (SIZE in bytes or with K, M, G, e.g. 512M, 4G; 0 = off)",
      "a quarter of the memory available at start, at most 1G; on a GPU, where the cache's blocks live in its memory, "
      "a quarter of what it has free after the weights" },
    { LM_OPT_STRING, "--cache-dir", NULL, LM_OPT_AT(serve_opts, so.engine.cache_dir), "DIR",
      "keep the prefix cache on disk too, in DIR (created if missing; one server per DIR, a lock file says so): "
      "KV blocks and hybrid models' recurrent-state checkpoints leaving the RAM cache and those of every finished "
      "request are written there by a background thread (dropped, never waited for, when it falls behind) and read "
      "back at admission, also after a restart or a crash. Entries are checksummed and tied to the model's weights, "
      "config and KV format; a damaged or foreign entry is skipped and recomputed. Needs --cache-ram above 0",
      .ilo = 1 },
    { LM_OPT_SIZE, "--cache-disk", NULL, LM_OPT_AT(serve_opts, so.engine.cache_disk), "SIZE",
      "bytes of entries --cache-dir may hold; past it the least recently used go (SIZE as for --cache-ram)", "16G" },
    { LM_OPT_STRING, "--trace", NULL, LM_OPT_AT(serve_opts, so.trace_path), "FILE",
      "append one JSON line per finished generation to FILE ('-' = stderr): its id, token counts, time spans "
      "(queue, cache lookup and restore, prefill, decode), batch sizes and what the prefix cache missed", .ilo = 1 },
    { LM_OPT_CHOICE, "--look-ahead", NULL, LM_OPT_AT(serve_opts, so.engine.look_ahead), NULL,
      "greedy look-ahead: while every running request decodes greedily (structured output included: the GPU "
      "applies its masks), queue each step before the last one's token ids reach the host (the GPU feeds them "
      "forward), so the GPU does not wait for the server between tokens; the tokens are the same either way",
      "on with --device cuda, off on the CPU, where it gains nothing", .choices = k_on_off },
    { LM_OPT_STRING, "--chat-template", NULL, LM_OPT_AT(serve_opts, template_path), "FILE",
      "a Jinja chat template to use instead of the model's own (for a model without one)", .ilo = 1 },
    { LM_OPT_STRING, "--debug-tool-call", NULL, LM_OPT_AT(serve_opts, so.debug_tool_call), "NAME=JSON",
      "debugging, for testing agents with a model too small to choose tools: a chat request that offers the tool "
      "NAME, leaves tool_choice auto or required and ends with a user message is answered with the call NAME(JSON) "
      "(JSON an object), written into the answer in the model's tool-call format; what the model would add is "
      "dropped. Answers after a tool result are the model's own", .ilo = 1 },
    { LM_OPT_FLAG, "--special-in-content", NULL, LM_OPT_AT(serve_opts, so.special_in_content), NULL,
      "unsafe: let special-token text in messages and tools (e.g. <|im_end|>) become control tokens, so a "
      "message can end its turn; by default it is tokenized as plain text" },
    { LM_OPT_FLAG, "--quiet", NULL, LM_OPT_AT(serve_opts, quiet), NULL, "no line per request on stderr" },
    { LM_OPT_GROUP, .off = offsetof(serve_opts, so.engine), .group = lm_cli_spec_opts },
    { LM_OPT_GROUP, .off = offsetof(serve_opts, so.engine.kv_type), .group = lm_cli_kv_opts },
    { LM_OPT_GROUP, .off = offsetof(serve_opts, so.rope), .group = lm_cli_rope_opts },
    { LM_OPT_GROUP, .off = offsetof(serve_opts, co), .group = lm_cli_common_opts },
    { .kind = LM_OPT_END },
};

/* The server's and the engine's own defaults, spelled out so that --help
 * shows them; cache_ram LM_CACHE_RAM_AUTO: not given (the engine chooses). */
static const serve_opts k_defaults = {
    .so = { .port = 8080, .timeout_s = 30, .max_connections = 4096, .header_timeout_s = 10, .body_timeout_s = 60,
            .shutdown_timeout_s = 30, .log_requests = true,
            .engine = { .parallel = 4, .step_tokens = 512, .max_queue = 1024, .cache_ram = LM_CACHE_RAM_AUTO,
                        .cache_disk = (size_t)16 << 30, .kv_type = LM_CLI_KV_DEFAULT } },
    .max_body_mb = 8,
};

static const lm_opt_cmd k_cmd = {
    .name = "serve",
    .usage = "lumen serve [-m MODEL] [options]",
    .about = "Serves MODEL over an OpenAI-compatible HTTP API until SIGINT or SIGTERM:\n"
             "POST /v1/chat/completions, POST /v1/completions, POST /v1/responses\n"
             "(the Responses API: Codex), POST /v1/embeddings, POST /tokenize,\n"
             "POST /detokenize, GET /v1/models, GET /health, GET /metrics (Prometheus),\n"
             "a chat page at GET /; and Anthropic's Messages API (POST /v1/messages,\n"
             "/v1/messages/count_tokens) for Claude Code and the Anthropic SDKs,\n"
             "answering to any model name.\n",
    .opts = k_opts,
    .epilog = "A request may name itself with an X-Request-Id header (A-Z a-z 0-9 . _ : -;\n"
              "other characters are dropped, the rest cut to 64); otherwise the server makes\n"
              "one. The response echoes it in X-Request-Id; the log and trace lines carry it.\n",
    .defaults = &k_defaults,
    .size = sizeof(serve_opts),
};

int lm_cmd_serve(int argc, char **argv) {
    serve_opts o;
    int parsed = lm_opts_parse(&k_cmd, &o, argc, argv);
    if (parsed >= 0) return parsed;
    lm_common_opts co = o.co;
    lm_server_opts so = o.so;
    so.max_body = (size_t)o.max_body_mb << 20;
    so.log_requests = !o.quiet;
    if (!so.api_key && (so.api_key = getenv("LUMEN_API_KEY")) && !*so.api_key) so.api_key = NULL;
    /* tests only: I/O faults for the disk tier (lm_dcache_inject_spec), e.g. "write:ENOSPC" */
    so.engine.cache_faults = getenv("LUMEN_DISK_FAULTS");
    if (!so.model_path && !(so.model_path = lm_cli_default_model())) return 2;
    lm_source *model = lm_cli_open_model(so.model_path);
    if (!model) return 1;
    lm_backend *be = lm_cli_backend_for(&co, model);
    if (!be) {
        lm_source_unref(model);
        return 1;
    }
    lm_err e = { { 0 } };
    char *tpl = NULL;
    int rc = 0;
    if (o.template_path && !(tpl = lm_read_file(o.template_path, NULL, &e))) {
        lm_err_prefix(&e, "--chat-template");
        rc = -1;
    }
    so.chat_template = tpl;
    lm_cli_progress pr;
    if (!rc) {
        lm_cli_progress_begin(&pr, so.model_path);
        so.progress = &pr.hook;
        rc = lm_server_run(&so, model, be, &e);
        lm_cli_progress_end(&pr);
    }
    if (rc) fprintf(stderr, "lumen: %s\n", e.msg);
    free(tpl);
    lm_source_unref(model);
    lm_backend_destroy(be);
    return rc ? 1 : 0;
}
