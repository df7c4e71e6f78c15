/* tokenize.c - POST /tokenize and /detokenize in llama-server's shapes:
 *   {"content": TEXT, "add_special": false, "with_pieces": false} -> {"tokens": [ids]}
 *     (with_pieces: [{"id", "piece"}], the piece a string when its bytes are
 *     valid UTF-8, else the array of its bytes)
 *   {"tokens": [ids]} -> {"content": TEXT}
 * "prompt" is taken for "content" too. Ids outside the vocabulary are a 400. */
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

static int get_flag(const json_t *body, const char *key, bool *out, srv_err *e) {
    const json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return srv_bad(e, key, "Invalid type for '%s': expected a boolean.", key);
    *out = json_is_true(v);
    return 0;
}

static json_t *piece_json(const srv *s, int32_t id, lm_tok_str *scratch) {
    lm_tokenizer_decode(s->tok, &id, 1, false, scratch);
    json_t *str = json_stringn(scratch->s ? scratch->s : "", scratch->len); /* NULL: not valid UTF-8 */
    if (str) return str;
    json_t *a = json_array();
    for (size_t i = 0; i < scratch->len; i++) json_array_append_new(a, json_integer((unsigned char)scratch->s[i]));
    return a;
}

enum MHD_Result srv_handle_tokenize(srv *s, struct MHD_Connection *c, srv_conn *cc) {
    srv_err e = { 0 };
    json_t *body = srv_json_body(cc->body ? cc->body : "", cc->body_len, &e);
    if (!body) return srv_respond_error(cc, c, &e);
    const char *key = json_object_get(body, "content") ? "content" : "prompt";
    const json_t *text = json_object_get(body, key);
    bool add_special = false, pieces = false;
    if (!json_is_string(text)) srv_bad(&e, "content", "Missing required parameter: 'content' (a string).");
    else if (!get_flag(body, "add_special", &add_special, &e) && !get_flag(body, "with_pieces", &pieces, &e)) {
        lm_tok_ids ids = { 0 };
        lm_err le = { { 0 } };
        if (lm_tokenizer_encode(s->tok, json_string_value(text), json_string_length(text), add_special, &ids, &le)) {
            srv_bad(&e, key, "%s", le.msg);
        } else {
            json_t *toks = json_array();
            lm_tok_str scratch = { 0 };
            for (size_t i = 0; i < ids.n; i++)
                json_array_append_new(toks, pieces ? json_pack("{s:i, s:o}", "id", ids.ids[i], "piece",
                                                               piece_json(s, ids.ids[i], &scratch))
                                                   : json_integer(ids.ids[i]));
            lm_tok_str_free(&scratch);
            lm_tok_ids_free(&ids);
            json_decref(body);
            return srv_respond_json(cc, c, 200, json_pack("{s:o}", "tokens", toks));
        }
        lm_tok_ids_free(&ids);
    }
    json_decref(body);
    return srv_respond_error(cc, c, &e);
}

enum MHD_Result srv_handle_detokenize(srv *s, struct MHD_Connection *c, srv_conn *cc) {
    srv_err e = { 0 };
    json_t *body = srv_json_body(cc->body ? cc->body : "", cc->body_len, &e);
    if (!body) return srv_respond_error(cc, c, &e);
    const json_t *toks = json_object_get(body, "tokens");
    const int n_vocab = LM_MIN(s->n_vocab, lm_tokenizer_n_vocab(s->tok));
    if (!json_is_array(toks)) {
        srv_bad(&e, "tokens", "Missing required parameter: 'tokens' (an array of token ids).");
    } else {
        size_t n = json_array_size(toks);
        int32_t *ids = lm_xmalloc((n ? n : 1) * sizeof *ids);
        for (size_t i = 0; i < n && !e.status; i++) {
            const json_t *t = json_array_get(toks, i);
            if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= n_vocab)
                srv_bad(&e, "tokens", "Invalid 'tokens': element %zu is not a token id in [0, %d).", i, n_vocab);
            else ids[i] = (int32_t)json_integer_value(t);
        }
        if (!e.status) {
            lm_tok_str out = { 0 };
            lm_tokenizer_decode(s->tok, ids, n, false, &out);
            /* the exact text (NULs included) when it is valid UTF-8, else lossy */
            json_t *content = json_stringn(out.s ? out.s : "", out.len);
            if (!content) content = srv_lossy_string(out.s);
            lm_tok_str_free(&out);
            free(ids);
            json_decref(body);
            return srv_respond_json(cc, c, 200, json_pack("{s:o}", "content", content));
        }
        free(ids);
    }
    json_decref(body);
    return srv_respond_error(cc, c, &e);
}
