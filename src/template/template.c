/* template.c - the public entry points around the interpreter: parsing a
 * template (UTF-8 check, jinja2's newline normalisation, lexing, parsing),
 * freeing it, and finding a model's chat template source in a .jinja file,
 * a tokenizer_config.json, a GGUF file or a model folder (an lm_source).
 *
 * Part of lumen's Jinja interpreter, written by hand for lumen. */
#include "tpl_internal.h"

#include <stdlib.h>

#include "../base/lm_file.h"
#include "../format/lm_source.h"

int lm_template_parse(const char *src, size_t len, const char *name, lm_template **out, lm_err *e) {
    *out = NULL;
    if (!name) name = "template";
    size_t bad;
    if (!tpl_utf8_valid(src, len, &bad)) {
        int line, col;
        tpl_line_col(src, len, bad, &line, &col);
        return lm_errf(e, "%s:%d:%d: template is not valid UTF-8", name, line, col);
    }
    lm_template *t = calloc(1, sizeof *t);
    char *norm = malloc(len + 1);
    char *nm = lm_xstrdup(name);
    if (!t || !norm) {
        free(t);
        free(norm);
        free(nm);
        return lm_errf(e, "%s: out of memory", name);
    }
    /* jinja2: \r\n and \r become \n, and one trailing newline is dropped */
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            norm[n++] = src[i];
        }
    }
    if (n && norm[n - 1] == '\n') n--;
    norm[n] = 0;
    t->src = norm;
    t->src_len = n;
    t->name = nm;
    t->arena.limit = (size_t)256 << 20;
    tpl_fail *f = calloc(1, sizeof *f);
    if (!f) {
        lm_template_free(t);
        return lm_errf(e, "%s: out of memory", name);
    }
    f->err = e;
    f->name = t->name;
    f->src = t->src;
    f->src_len = t->src_len;
    f->arena = &t->arena;
    if (setjmp(f->jb)) {
        free(f);
        lm_template_free(t);
        return -1;
    }
    int ntok;
    tpl_token *toks = tpl_lex(f, t->src, t->src_len, &ntok);
    t->root = tpl_parse_tokens(f, toks, ntok);
    free(f);
    *out = t;
    return 0;
}

void lm_template_free(lm_template *t) {
    if (!t) return;
    tpl_arena_free(&t->arena);
    free(t->src);
    free(t->name);
    free(t);
}

/* ---- finding a model's template ------------------------------------------ */

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* "chat_template" of a tokenizer_config.json / chat_template.json. */
static int from_json(const char *path, char **src, size_t *len, lm_err *e) {
    json_error_t je;
    json_t *root = json_load_file(path, JSON_ALLOW_NUL, &je);
    if (!root) return lm_errf(e, "%s:%d: %s", path, je.line, je.text);
    json_t *ct = json_object_get(root, "chat_template");
    const json_t *str = NULL;
    if (json_is_string(ct)) {
        str = ct;
    } else if (json_is_array(ct)) {
        size_t i;
        json_t *item;
        json_array_foreach(ct, i, item) {
            const char *nm = json_string_value(json_object_get(item, "name"));
            if (nm && !strcmp(nm, "default")) str = json_object_get(item, "template");
        }
        if (!str) {
            json_decref(root);
            return lm_errf(e, "%s: chat_template is a list without a \"default\" entry", path);
        }
    }
    if (!json_is_string(str)) {
        json_decref(root);
        return lm_errf(e, "%s: no chat_template string", path);
    }
    *len = json_string_length(str);
    *src = malloc(*len + 1);
    if (!*src) {
        json_decref(root);
        return lm_errf(e, "%s: out of memory", path);
    }
    memcpy(*src, json_string_value(str), *len);
    (*src)[*len] = 0;
    json_decref(root);
    return 0;
}

static int from_gguf(const lm_gguf *g, const char *path, char **src, size_t *len, lm_err *e) {
    const lm_gguf_kv *kv = lm_gguf_find_kv(g, "tokenizer.chat_template");
    if (!kv || kv->type != LM_GGUF_STRING)
        return lm_errf(e, "%s: no tokenizer.chat_template string in the GGUF metadata", path);
    *len = (size_t)kv->str.len;
    *src = malloc(*len + 1);
    if (!*src) return lm_errf(e, "%s: out of memory", path);
    memcpy(*src, kv->str.ptr, *len);
    (*src)[*len] = 0;
    return 0;
}

/* A single template file: a tokenizer_config.json / chat_template.json, or
 * the template's text. */
static int from_file(const char *path, char **src, size_t *len, lm_err *e) {
    if (ends_with(path, ".json")) return from_json(path, src, len, e);
    *src = lm_read_file(path, len, e);
    return *src ? 0 : -1;
}

int lm_template_load_from(const lm_source *source, char **src, size_t *len, lm_err *e) {
    *src = NULL;
    *len = 0;
    const char *path = lm_source_path(source);
    if (lm_source_gguf(source)) return from_gguf(lm_source_gguf(source), path, src, len, e);
    if (lm_source_kind_of(source) != LM_SOURCE_HF) return from_file(path, src, len, e);
    static const char *const names[] = { "chat_template.jinja", "chat_template.json", "tokenizer_config.json" };
    for (size_t i = 0; i < LM_COUNT(names); i++) {
        char *p = lm_path_join(path, names[i]);
        if (lm_file_exists(p)) {
            int rc = from_file(p, src, len, e);
            free(p);
            return rc;
        }
        free(p);
    }
    return lm_errf(e, "%s: no chat_template.jinja, chat_template.json or tokenizer_config.json", path);
}

int lm_template_load_source(const char *path, char **src, size_t *len, lm_err *e) {
    lm_source *source;
    *src = NULL;
    *len = 0;
    if (lm_source_open(&source, path, e)) return -1;
    int rc = lm_template_load_from(source, src, len, e);
    lm_source_unref(source);
    return rc;
}
