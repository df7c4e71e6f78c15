/* test_server_page.c - the chat page at GET / (src/server/web, built into
 * the binary) as the real server sends it: the files byte for byte, their
 * Content-Type, a Content-Security-Policy that allows nothing but this
 * server, and no API key needed for the page while the API still wants one.
 * tests/web drives the page itself in headless Chromium. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "guard_util.h"
#include "lm_test.h"
#include "test_util.h"

/* The value of header name (case as sent) in r, malloc'd, or NULL. */
static char *header_value(const gu_resp *r, const char *name) {
    size_t n = strlen(name);
    for (const char *p = r->headers; p && *p;) {
        if (!strncasecmp(p, name, n) && p[n] == ':') {
            p += n + 1;
            while (*p == ' ') p++;
            size_t k = strcspn(p, "\r\n");
            char *v = malloc(k + 1);
            memcpy(v, p, k);
            v[k] = 0;
            return v;
        }
        const char *nl = strchr(p, '\n');
        p = nl ? nl + 1 : NULL;
    }
    return NULL;
}

static void expect_file(lm_test_ctx *lm_t_, int port, const char *url, const char *file, const char *type) {
    char path[1024];
    snprintf(path, sizeof path, "%s/src/server/web/%s", LUMEN_SOURCE_DIR, file);
    size_t n = 0;
    char *want = lm_tu_read(path, &n);
    gu_resp r = { 0 };
    LM_CHECK(gu_http(port, "GET", url, NULL, NULL, &r) == 0);
    LM_CHECK_MSG(r.status == 200, "%s: %d", url, r.status);
    LM_CHECK_MSG(want && r.body_len == n && !memcmp(r.body, want, n), "%s differs from %s", url, path);
    char *ct = header_value(&r, "Content-Type"), *csp = header_value(&r, "Content-Security-Policy");
    LM_CHECK_MSG(lm_streq(ct, type), "%s: Content-Type %s", url, ct);
    LM_CHECK_MSG(csp && strstr(csp, "default-src 'none'") && strstr(csp, "script-src 'self';") &&
                     strstr(csp, "connect-src 'self';") && strstr(csp, "frame-ancestors 'none'") &&
                     !strstr(csp, "unsafe"),
                 "%s: CSP %s", url, csp);
    free(ct), free(csp), free(want);
    gu_resp_free(&r);
}

LM_TEST(server_chat_page) {
    gu_server s;
    if (gu_server_start(&s, gu_demo_dir(), "--threads 1 --api-key page-test")) {
        gu_server_dump_log(&s);
        LM_CHECK(!"server started");
        return;
    }
    expect_file(lm_t_, s.port, "/", "index.html", "text/html; charset=utf-8");
    expect_file(lm_t_, s.port, "/assets/chat.js", "chat.js", "text/javascript; charset=utf-8");
    expect_file(lm_t_, s.port, "/assets/context.js", "context.js", "text/javascript; charset=utf-8");
    expect_file(lm_t_, s.port, "/assets/chat.css", "chat.css", "text/css; charset=utf-8");
    gu_resp r = { 0 };
    /* the page loads its files from /assets only, and nothing inline */
    LM_CHECK(gu_http(s.port, "GET", "/", NULL, NULL, &r) == 0);
    LM_CHECK(r.body && strstr(r.body, "src=\"/assets/chat.js\"") && strstr(r.body, "src=\"/assets/context.js\"") &&
             !strstr(r.body, "<script>") && !strstr(r.body, "style="));
    gu_resp_free(&r);
    static const struct {
        const char *method, *url;
        int status;
    } k_other[] = { { "GET", "/assets/none.js", 404 }, { "GET", "/index.html", 404 }, { "POST", "/", 405 },
                    { "GET", "/v1/models", 401 } };
    for (size_t i = 0; i < LM_COUNT(k_other); i++) {
        LM_CHECK(gu_http(s.port, k_other[i].method, k_other[i].url, k_other[i].method[0] == 'P' ? "{}" : NULL, NULL,
                         &r) == 0);
        LM_CHECK_MSG(r.status == k_other[i].status, "%s %s: %d", k_other[i].method, k_other[i].url, r.status);
        gu_resp_free(&r);
    }
    LM_CHECK(gu_server_stop(&s) == 0);
}
