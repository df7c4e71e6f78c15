/* web_page.c - GET / and /assets/...: the chat page (src/server/web), a
 * static page that talks to /v1/chat/completions like any other client.
 *
 * The page needs no API key to load (it holds no secret; its requests carry
 * the key the user types). Its Content-Security-Policy allows only this
 * server's own scripts, styles and requests: no inline code, no other
 * origins, no framing, so text that a model writes can never run there. */
#include <string.h>

#include "server_internal.h"
#include "web_assets.h"

#define SRV_PAGE_CSP                                                                                      \
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src data:; " \
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

const srv_asset *srv_web_asset(const char *url) {
    for (const srv_asset *a = srv_web_assets; a->url; a++)
        if (!strcmp(a->url, url)) return a;
    return NULL;
}

enum MHD_Result srv_handle_page(srv *s, struct MHD_Connection *c, srv_conn *cc, const char *url) {
    (void)s;
    const srv_asset *a = srv_web_asset(url);
    if (!a) {
        srv_err e;
        srv_fail(&e, 404, "invalid_request_error", "not_found", NULL, "No such file.");
        return srv_respond_error(cc, c, &e);
    }
    struct MHD_Response *res = MHD_create_response_from_buffer(a->len, (void *)a->data, MHD_RESPMEM_PERSISTENT);
    if (!res) return MHD_NO;
    MHD_add_response_header(res, "Content-Type", a->type);
    MHD_add_response_header(res, "Content-Security-Policy", SRV_PAGE_CSP);
    MHD_add_response_header(res, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(res, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(res, "Cache-Control", "no-cache");
    if (cc->rid[0]) MHD_add_response_header(res, "X-Request-Id", cc->rid);
    enum MHD_Result ok = MHD_queue_response(c, 200, res);
    MHD_destroy_response(res);
    cc->status = 200;
    return ok;
}
