/* cmd_serve.c - `lumen serve`: the OpenAI-compatible HTTP server. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../server/lm_server.h"
#include "cli.h"

static const char *const k_help =
    "usage: lumen serve [-m MODEL] [options]\n"
    "\n"
    "Serves MODEL over an OpenAI-compatible HTTP API until SIGINT or SIGTERM:\n"
    "POST /v1/chat/completions, POST /v1/completions, GET /v1/models,\n"
    "GET /health, GET /metrics (Prometheus).\n"
    "\n"
    "  -m, --model PATH      Hugging Face folder or .gguf file (default: the bundled\n"
    "                        demo model, models/demo)\n"
    "  --alias NAME          model name in the API (default: MODEL's basename)\n"
    "  --host ADDR           address to bind (default 127.0.0.1: this machine only)\n"
    "  --port N              TCP port (default 8080; 0 = any free port)\n"
    "  --api-key KEY         require 'Authorization: Bearer KEY' (also LUMEN_API_KEY)\n"
    "  --ctx N               tokens per request, prompt + completion (default: the model's)\n"
    "  --parallel N          requests generated at once (default 4)\n"
    "  --max-queue N         requests waiting beyond those (default 256; more get 503)\n"
    "  --timeout S           drop a client idle for S seconds while sending (default 30)\n"
    "  --max-body-mb N       largest request body in MiB (default 8; larger get 413)\n"
    "  --max-connections N   open connections at once (default 1024)\n"
    "  --cache-ram SIZE      memory for the prefix cache: KV blocks and recurrent-state\n"
    "                        checkpoints of earlier prompts, reused when a new prompt\n"
    "                        starts the same way (SIZE in bytes or with K, M, G, e.g.\n"
    "                        512M, 4G; 0 = off; default: a quarter of the memory\n"
    "                        available at start, at most 1G)\n"
    "  --trace FILE          append one JSON line per finished generation to FILE\n"
    "                        ('-' = stderr): its id, token counts, time spans (queue,\n"
    "                        cache lookup and restore, prefill, decode), batch sizes\n"
    "                        and what the prefix cache missed\n"
    "  --look-ahead on|off   greedy look-ahead: while every running request decodes\n"
    "                        greedily, queue each step before the last one's token\n"
    "                        ids reach the host (the GPU feeds them forward), so the\n"
    "                        GPU does not wait for the server between tokens; the\n"
    "                        tokens are the same either way (default: on with\n"
    "                        --device cuda, off on the CPU, where it gains nothing)\n"
    "  --quiet               no line per request on stderr\n"
    LM_COMMON_HELP
    "\n"
    "A request may name itself with an X-Request-Id header (A-Z a-z 0-9 . _ : -;\n"
    "other characters are dropped, the rest cut to 64); otherwise the server makes\n"
    "one. The response echoes it in X-Request-Id; the log and trace lines carry it.\n";

/* The default prefix-cache budget: a quarter of MemAvailable, at most 1 GiB
 * (the cache is an optimisation; it must not push the machine into swap). */
static size_t default_cache_ram(void) {
    size_t cap = (size_t)1 << 30, avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
            avail = (size_t)kb << 10;
            break;
        }
    }
    if (f) fclose(f);
    if (!avail) {
        long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        if (pages > 0 && psz > 0) avail = (size_t)pages * (size_t)psz;
    }
    return avail ? LM_MIN(cap, avail / 4) : cap;
}

int lm_cmd_serve(int argc, char **argv) {
    lm_common_opts co = { 0 };
    lm_server_opts so = { .port = 8080, .log_requests = true };
    bool cache_set = false;
    so.api_key = getenv("LUMEN_API_KEY");
    if (so.api_key && !*so.api_key) so.api_key = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        long n;
        int c = lm_cli_common(&co, argc, argv, &i);
        if (c < 0) return 2;
        if (c) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(k_help, stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(so.model_path = lm_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--alias")) {
            if (!(so.alias = lm_cli_value(argc, argv, &i))) return 2;
            if (!*so.alias) goto bad;
        } else if (!strcmp(a, "--host")) {
            if (!(so.host = lm_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--port")) {
            if (!(v = lm_cli_value(argc, argv, &i)) || !lm_cli_int(v, 0, 65535, &n)) goto bad;
            so.port = (int)n;
        } else if (!strcmp(a, "--api-key")) {
            if (!(so.api_key = lm_cli_value(argc, argv, &i))) return 2;
            if (!*so.api_key) goto bad;
        } else if (!strcmp(a, "--ctx")) {
            if (!(v = lm_cli_value(argc, argv, &i)) || !lm_cli_int(v, 16, 1 << 24, &n)) goto bad;
            so.engine.ctx = (int)n;
        } else if (!strcmp(a, "--parallel")) {
            if (!(v = lm_cli_value(argc, argv, &i)) || !lm_cli_int(v, 1, 4096, &n)) goto bad;
            so.engine.parallel = (int)n;
        } else if (!strcmp(a, "--max-queue")) {
            if (!(v = lm_cli_value(argc, argv, &i)) || !lm_cli_int(v, 1, 1 << 20, &n)) goto bad;
            so.engine.max_queue = (int)n;
        } else if (!strcmp(a, "--timeout")) {
            if (!(v = lm_cli_value(argc, argv, &i)) || !lm_cli_int(v, 1, 86400, &n)) goto bad;
            so.timeout_s = (int)n;
        } else if (!strcmp(a, "--max-body-mb")) {
            if (!(v = lm_cli_value(argc, argv, &i)) || !lm_cli_int(v, 1, 4096, &n)) goto bad;
            so.max_body = (size_t)n << 20;
        } else if (!strcmp(a, "--max-connections")) {
            if (!(v = lm_cli_value(argc, argv, &i)) || !lm_cli_int(v, 1, 100000, &n)) goto bad;
            so.max_connections = (int)n;
        } else if (!strcmp(a, "--cache-ram")) {
            if (!(v = lm_cli_value(argc, argv, &i))) return 2;
            if (!lm_cli_size(v, &so.engine.cache_ram)) {
                fprintf(stderr,
                        "lumen serve: --cache-ram '%s' is not a size: give bytes or a whole number with K, M, G "
                        "or T (e.g. 512M, 4G; 0 turns the prefix cache off)\n", v);
                return 2;
            }
            cache_set = true;
        } else if (!strcmp(a, "--trace")) {
            if (!(so.trace_path = lm_cli_value(argc, argv, &i))) return 2;
            if (!*so.trace_path) goto bad;
        } else if (!strcmp(a, "--look-ahead")) {
            if (!(v = lm_cli_value(argc, argv, &i))) return 2;
            if (strcmp(v, "on") && strcmp(v, "off")) goto bad;
            so.engine.look_ahead = strcmp(v, "on") ? -1 : 1;
        } else if (!strcmp(a, "--quiet")) {
            so.log_requests = false;
        } else {
            fprintf(stderr, "lumen serve: unknown option %s (see lumen serve --help)\n", a);
            return 2;
        }
        continue;
    bad:
        fprintf(stderr, "lumen serve: bad value for %s (see lumen serve --help)\n", a);
        return 2;
    }
    if (!so.model_path && !(so.model_path = lm_cli_default_model())) return 2;
    if (!cache_set) so.engine.cache_ram = default_cache_ram();
    lm_source *model = lm_cli_open_model(so.model_path);
    if (!model) return 1;
    lm_backend *be = lm_cli_backend_for(&co, model);
    if (!be) {
        lm_source_unref(model);
        return 1;
    }
    lm_err e = { { 0 } };
    int rc = lm_server_run(&so, model, be, &e);
    if (rc) fprintf(stderr, "lumen: %s\n", e.msg);
    lm_source_unref(model);
    lm_backend_destroy(be);
    return rc ? 1 : 0;
}
