/* http_guard.c - what a request must pass before it is routed: strict HTTP
 * framing, the Host/Origin allow-list, and log-safe text.
 *
 * Design note
 * -----------
 * Framing: a body's length must be unambiguous (RFC 9112 6.3), or a proxy in
 * front of lumen and lumen itself may disagree on where one request ends and
 * the next starts (request smuggling). So two Content-Length headers,
 * Content-Length together with Transfer-Encoding, and an HTTP/1.1 request
 * without Host are 400; a Transfer-Encoding other than plain "chunked" (say
 * "gzip, chunked", which libmicrohttpd would read until the idle timeout) is
 * 501, as the RFC asks for a coding the server does not know.
 *
 * Host and Origin: a server on loopback is reachable from every web page the
 * user opens. A page cannot read cross-origin answers (lumen sends no CORS
 * headers), but it can send requests, and through DNS rebinding (a name that
 * first points at the attacker, then at 127.0.0.1) it can even read them.
 * So, as llama-server and Jupyter do, a server bound to loopback (or given
 * --allow-host) answers only requests whose Host names an allowed host
 * (localhost, 127.0.0.1, ::1, the bound address, --allow-host's names), and
 * refuses any Origin whose host is not one of them: 403. A browser's POST
 * (one that sends Origin or Sec-Fetch-Site) must also say application/json
 * (415), so that a form or a text/plain "simple request" never reaches a
 * handler.
 *
 * Log text: the URL MHD hands over is percent-decoded, so "%0a" would start a
 * forged log line; srv_log_text writes bytes outside printable ASCII (and the
 * backslash) as \xNN. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server_internal.h"

/* ---- log-safe text -------------------------------------------------------------------- */

void srv_log_text(const char *in, char *out, size_t cap) {
    LM_ASSERT(cap >= 5);
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p; p++) {
        bool plain = *p >= 0x20 && *p < 0x7f && *p != '\\';
        size_t need = plain ? 1 : 4;
        if (n + need + 1 > cap) break;
        if (plain) out[n++] = (char)*p;
        else n += (size_t)snprintf(out + n, cap - n, "\\x%02x", *p);
    }
    out[n] = 0;
}

/* ---- the host allow-list -------------------------------------------------------------- */

/* Whether name (len bytes, no port, no brackets) is one of the
 * comma-separated names of list ("*" = every name). */
static bool in_list(const char *list, const char *name, size_t len) {
    for (const char *p = list; p && *p;) {
        const char *q = strchr(p, ',');
        size_t n = q ? (size_t)(q - p) : strlen(p);
        while (n && *p == ' ') p++, n--;
        while (n && p[n - 1] == ' ') n--;
        if ((n == 1 && *p == '*') || (n == len && n && !strncasecmp(p, name, n))) return true;
        p = q ? q + 1 : NULL;
    }
    return false;
}

bool srv_host_allowed(const srv *s, const char *host, size_t len) {
    /* "[::1]:8080" -> "::1"; "localhost:8080" -> "localhost" */
    if (len && host[0] == '[') {
        const char *end = memchr(host, ']', len);
        if (!end) return false;
        host++;
        len = (size_t)(end - host);
    } else {
        const char *colon = memchr(host, ':', len);
        if (colon && !memchr(colon + 1, ':', len - (size_t)(colon + 1 - host))) len = (size_t)(colon - host);
    }
    if (len && host[len - 1] == '.') len--; /* "localhost." is localhost */
    static const char k_loopback[] = "localhost,127.0.0.1,::1";
    return in_list(k_loopback, host, len) || in_list(s->opts.host, host, len) || in_list(s->opts.allow_hosts, host, len);
}

/* "http://localhost:8080" -> its host is allowed; "null" and other schemes are not. */
static bool origin_allowed(const srv *s, const char *origin) {
    const char *h = NULL;
    if (!strncasecmp(origin, "http://", 7)) h = origin + 7;
    else if (!strncasecmp(origin, "https://", 8)) h = origin + 8;
    if (!h) return false;
    size_t n = strcspn(h, "/?#");
    return h[n] == 0 && srv_host_allowed(s, h, n);
}

/* ---- framing ------------------------------------------------------------------------------ */

typedef struct frame_scan {
    int n_length, n_te, n_host;
    const char *te;
} frame_scan;

static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    frame_scan *f = cls;
    if (!strcasecmp(key, "Content-Length")) f->n_length++;
    if (!strcasecmp(key, "Transfer-Encoding")) f->n_te++, f->te = value;
    if (!strcasecmp(key, "Host")) f->n_host++;
    return MHD_YES;
}

/* "chunked", ignoring case and surrounding blanks. */
static bool just_chunked(const char *v) {
    while (*v == ' ' || *v == '\t') v++;
    if (strncasecmp(v, "chunked", 7)) return false;
    for (v += 7; *v == ' ' || *v == '\t';) v++;
    return *v == 0;
}

/* application/json, with parameters (charset) or a +json suffix type. */
static bool is_json_type(const char *ct) {
    size_t n = strcspn(ct, ";");
    while (n && (ct[n - 1] == ' ' || ct[n - 1] == '\t')) n--;
    return (n == 16 && !strncasecmp(ct, "application/json", 16)) ||
           (n > 5 && !strncasecmp(ct + n - 5, "+json", 5));
}

int srv_http_check(const srv *s, struct MHD_Connection *c, const char *version, bool post, srv_err *e) {
    frame_scan f = { 0 };
    MHD_get_connection_values(c, MHD_HEADER_KIND, scan_header, &f);
    if (f.n_length > 1)
        return srv_fail(e, 400, "invalid_request_error", "bad_framing", NULL, "More than one Content-Length header.");
    if (f.n_te && f.n_length)
        return srv_fail(e, 400, "invalid_request_error", "bad_framing", NULL,
                        "Content-Length and Transfer-Encoding together.");
    if (f.n_te > 1 || (f.n_te && !just_chunked(f.te)))
        return srv_fail(e, 501, "invalid_request_error", "unsupported_transfer_encoding", NULL,
                        "Only 'Transfer-Encoding: chunked' is supported.");
    if (f.n_host > 1 || (f.n_host == 0 && version && !strcmp(version, MHD_HTTP_VERSION_1_1)))
        return srv_fail(e, 400, "invalid_request_error", "bad_host", NULL, "An HTTP/1.1 request needs one Host header.");
    if (s->check_host) {
        const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
        if (host && !srv_host_allowed(s, host, strlen(host)))
            return srv_fail(e, 403, "invalid_request_error", "host_not_allowed", NULL,
                            "Host '%.100s' is not allowed; start the server with --allow-host NAME to allow it.",
                            host);
    }
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (s->check_host && origin && !origin_allowed(s, origin))
        return srv_fail(e, 403, "invalid_request_error", "origin_not_allowed", NULL,
                        "Origin '%.100s' is not allowed; start the server with --allow-host NAME to allow its host.",
                        origin);
    const bool browser = origin || MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Sec-Fetch-Site");
    if (s->check_host && browser && post) {
        const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
        if (!ct || !is_json_type(ct))
            return srv_fail(e, 415, "invalid_request_error", "unsupported_media_type", NULL,
                            "A request from a browser must send 'Content-Type: application/json'.");
    }
    return 0;
}
