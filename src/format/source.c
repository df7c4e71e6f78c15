/* source.c - the one place that decides what a model path is (see
 * lm_source.h for the rule and who owns what). A GGUF file is parsed here,
 * once; a folder's safetensors wait for the first lm_source_weights, since
 * a tokenizer-only folder has none. */
#include "lm_source.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct lm_source {
    atomic_int refs;
    lm_source_kind kind;
    char *path;
    char *folder;
    lm_weight_source ws;  /* GGUF: from open; HF: once ws_open */
    bool ws_open;
};

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* Only regular files are sniffed: reading a pipe would eat its first bytes. */
static bool has_gguf_magic(const char *path) {
    if (!lm_file_exists(path)) return false;
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char magic[4] = { 0 };
    size_t n = fread(magic, 1, 4, f);
    fclose(f);
    return n == 4 && !memcmp(magic, "GGUF", 4);
}

/* The rule of lm_source.h. The name wins over the content so that a damaged
 * .gguf gets the GGUF parser's message rather than a JSON or Jinja one. */
static lm_source_kind kind_of_path(const char *path) {
    if (lm_is_dir(path)) return LM_SOURCE_HF;
    if (ends_with(path, ".gguf") || ends_with(path, ".GGUF") || has_gguf_magic(path)) return LM_SOURCE_GGUF;
    return LM_SOURCE_FILE;
}

static char *folder_of(const char *path, lm_source_kind kind) {
    const char *slash = strrchr(path, '/');
    if (kind == LM_SOURCE_HF) return lm_xstrdup(path);
    if (!slash) return lm_xstrdup(".");
    size_t n = (size_t)(slash - path);
    char *dir = lm_xmalloc(n + 1);
    memcpy(dir, path, n);
    dir[n] = 0;
    return dir;
}

int lm_source_open(lm_source **out, const char *path, lm_err *e) {
    *out = NULL;
    lm_source *s = lm_xcalloc(1, sizeof *s);
    atomic_init(&s->refs, 1);
    s->kind = kind_of_path(path);
    s->path = lm_xstrdup(path);
    s->folder = folder_of(path, s->kind);
    if (s->kind == LM_SOURCE_GGUF) {
        int rc = lm_file_exists(path) ? lm_weights_open_gguf(&s->ws, path, e)
                                      : lm_errf(e, "%s: no such file or directory", path);
        if (rc) {
            lm_source_unref(s);
            return -1;
        }
        s->ws_open = true;
    }
    *out = s;
    return 0;
}

lm_source *lm_source_ref(lm_source *src) {
    atomic_fetch_add_explicit(&src->refs, 1, memory_order_relaxed);
    return src;
}

void lm_source_unref(lm_source *src) {
    if (!src) return;
    /* acq_rel: the last holder sees every other holder's writes before freeing */
    int before = atomic_fetch_sub_explicit(&src->refs, 1, memory_order_acq_rel);
    LM_ASSERT(before > 0);
    if (before > 1) return;
    if (src->ws_open) lm_weights_close(&src->ws);
    free(src->path);
    free(src->folder);
    free(src);
}

lm_source_kind lm_source_kind_of(const lm_source *src) { return src->kind; }
const char *lm_source_path(const lm_source *src) { return src->path; }
const char *lm_source_folder(const lm_source *src) { return src->folder; }
const lm_gguf *lm_source_gguf(const lm_source *src) { return src->kind == LM_SOURCE_GGUF ? src->ws.gguf : NULL; }

int lm_source_weights(lm_source *src, const lm_weight_source **out, lm_err *e) {
    *out = NULL;
    if (src->kind == LM_SOURCE_FILE)
        return lm_file_exists(src->path) ? lm_errf(e, "%s: not a model folder or a GGUF file", src->path)
                                         : lm_errf(e, "%s: no such file or directory", src->path);
    if (!src->ws_open) {
        if (lm_weights_open_hf(&src->ws, src->path, e)) return -1;
        src->ws_open = true;
    }
    *out = &src->ws;
    return 0;
}
