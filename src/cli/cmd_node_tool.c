/* cmd_node_tool.c - `lumen bench-serve` and `lumen report`: the serving
 * benchmark is a node program (tools/benchserve, like the repository's other
 * HTTP tools), so these subcommands find node and the script and exec it
 * with the arguments unchanged.
 *
 * The script: $LUMEN_BENCHSERVE, else the source tree lumen was built from,
 * else ../../tools/benchserve next to the binary (build/NAME/lumen). Node:
 * $LUMEN_NODE, else `node` on the PATH. */
#define _GNU_SOURCE /* execv, readlink */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define SCRIPT_REL "tools/benchserve/benchserve.mjs"

static bool is_file(const char *p) { return access(p, R_OK) == 0; }

static bool find_script(char *out, size_t n) {
    const char *env = getenv("LUMEN_BENCHSERVE");
    if (env && *env) {
        snprintf(out, n, "%s", env);
        return is_file(out);
    }
    snprintf(out, n, "%s/" SCRIPT_REL, LUMEN_SOURCE_DIR);
    if (is_file(out)) return true;
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return false;
    exe[len] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    snprintf(out, n, "%s/../../" SCRIPT_REL, exe);
    return is_file(out);
}

static bool find_node(char *out, size_t n) {
    const char *env = getenv("LUMEN_NODE");
    if (env && *env) {
        snprintf(out, n, "%s", env);
        return access(out, X_OK) == 0;
    }
    const char *path = getenv("PATH");
    if (!path) return false;
    for (const char *p = path; *p;) {
        const char *end = strchr(p, ':');
        size_t dl = end ? (size_t)(end - p) : strlen(p);
        snprintf(out, n, "%.*s/node", (int)dl, dl ? p : ".");
        if (access(out, X_OK) == 0) return true;
        if (!end) break;
        p = end + 1;
    }
    return false;
}

/* Execs node SCRIPT [sub] argv[1..]; returns only on failure. */
static int exec_tool(const char *cmd, const char *sub, int argc, char **argv) {
    char script[PATH_MAX + 64], node[PATH_MAX + 64];
    if (!find_script(script, sizeof script)) {
        fprintf(stderr, "lumen %s: the benchmark script %s was not found (set LUMEN_BENCHSERVE to its path)\n", cmd,
                SCRIPT_REL);
        return 1;
    }
    if (!find_node(node, sizeof node)) {
        fprintf(stderr, "lumen %s: node (20 or later) was not found on the PATH; install Node.js (apt-get install "
                        "nodejs) or set LUMEN_NODE to its path\n", cmd);
        return 1;
    }
    char **args = calloc((size_t)argc + 4, sizeof *args);
    if (!args) return 1;
    int k = 0;
    args[k++] = node;
    args[k++] = script;
    if (sub) args[k++] = (char *)sub;
    for (int i = 1; i < argc; i++) args[k++] = argv[i];
    args[k] = NULL;
    fflush(NULL);
    execv(node, args);
    fprintf(stderr, "lumen %s: cannot run %s: %s\n", cmd, node, strerror(errno));
    free(args);
    return 1;
}

int lm_cmd_bench_serve(int argc, char **argv) { return exec_tool("bench-serve", NULL, argc, argv); }

int lm_cmd_report(int argc, char **argv) { return exec_tool("report", "report", argc, argv); }
