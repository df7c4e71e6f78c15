/* weights.c - open the weight files of a model folder or a GGUF file. A
 * folder's FP8 and MLX-quantised weights are repacked once here
 * (hf_quant.h) and then found in place of the checkpoint's tensors. */
#include "lm_weights.h"

#include "hf_quant.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static int add_shard(lm_weight_source *ws, const char *path, lm_err *e) {
    ws->st = lm_xrealloc(ws->st, (size_t)(ws->n_files + 1) * sizeof *ws->st);
    if (lm_safetensors_open(&ws->st[ws->n_files], path, e)) return -1;
    ws->n_files++;
    return 0;
}

static bool already_open(const lm_weight_source *ws, const char *path) {
    for (int i = 0; i < ws->n_files; i++)
        if (!strcmp(ws->st[i].file.path, path)) return true;
    return false;
}

/* The index maps tensor name -> shard file; we open every distinct shard and
 * check that each listed tensor really is in the shard the index names. */
static int open_index(lm_weight_source *ws, const char *dir, const char *index_path, lm_err *e) {
    json_error_t jerr;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return lm_errf(e, "%s: invalid JSON at line %d: %s", index_path, jerr.line, jerr.text);
    int rc = -1;
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map) || json_object_size(map) == 0) {
        lm_errf(e, "%s: missing or empty \"weight_map\"", index_path);
        goto done;
    }
    const char *name;
    json_t *file;
    json_object_foreach(map, name, file) {
        if (!json_is_string(file) || strchr(json_string_value(file), '/')) {
            lm_errf(e, "%s: weight_map entry \"%s\" is not a plain file name", index_path, name);
            goto done;
        }
        char *path = lm_path_join(dir, json_string_value(file));
        int bad = !already_open(ws, path) && add_shard(ws, path, e);
        free(path);
        if (bad) goto done;
    }
    json_object_foreach(map, name, file) {
        const char *where = NULL;
        const lm_file_tensor *t = lm_weights_find(ws, name, &where);
        const char *base = where ? strrchr(where, '/') : NULL;
        if (!t || strcmp(base ? base + 1 : where, json_string_value(file))) {
            lm_errf(e, "%s: tensor \"%s\" is not in %s", index_path, name, json_string_value(file));
            goto done;
        }
    }
    rc = 0;
done:
    json_decref(root);
    return rc;
}

int lm_weights_open_hf(lm_weight_source *ws, const char *dir, lm_err *e) {
    memset(ws, 0, sizeof *ws);
    char *single = lm_path_join(dir, "model.safetensors");
    char *index = lm_path_join(dir, "model.safetensors.index.json");
    int rc;
    if (lm_file_exists(index)) {
        rc = open_index(ws, dir, index, e);
    } else if (lm_file_exists(single)) {
        rc = add_shard(ws, single, e);
    } else {
        rc = lm_errf(e, "%s: no model.safetensors or model.safetensors.index.json", dir);
    }
    free(single);
    free(index);
    if (!rc) rc = lm_hf_quant_repack(ws, dir, e);
    if (rc) lm_weights_close(ws);
    return rc;
}

int lm_weights_open_gguf(lm_weight_source *ws, const char *path, lm_err *e) {
    memset(ws, 0, sizeof *ws);
    ws->gguf = lm_xcalloc(1, sizeof *ws->gguf);
    if (lm_gguf_open(ws->gguf, path, e)) {
        free(ws->gguf);
        ws->gguf = NULL;
        return -1;
    }
    return 0;
}

void lm_weights_close(lm_weight_source *ws) {
    lm_hf_quant_free(ws);
    for (int i = 0; i < ws->n_files; i++) lm_safetensors_close(&ws->st[i]);
    free(ws->st);
    if (ws->gguf) {
        lm_gguf_close(ws->gguf);
        free(ws->gguf);
    }
    memset(ws, 0, sizeof *ws);
}

static int repacked_cmp(const void *a, const void *b) {
    return strcmp(((const lm_repacked_tensor *)a)->t.name, ((const lm_repacked_tensor *)b)->t.name);
}

const lm_file_tensor *lm_weights_find(const lm_weight_source *ws, const char *name, const char **file) {
    if (ws->gguf) {
        if (file) *file = ws->gguf->file.path;
        return lm_gguf_find_tensor(ws->gguf, name);
    }
    lm_repacked_tensor key = { .t.name = (char *)name };
    const lm_repacked_tensor *r =
        ws->n_repacked ? bsearch(&key, ws->repacked, (size_t)ws->n_repacked, sizeof key, repacked_cmp) : NULL;
    if (r) {
        if (file) *file = r->file;
        return &r->t;
    }
    for (int i = 0; i < ws->n_files; i++) {
        const lm_file_tensor *t = lm_safetensors_find(&ws->st[i], name);
        if (t) {
            if (file) *file = ws->st[i].file.path;
            return t;
        }
    }
    return NULL;
}

size_t lm_weights_bytes(const lm_weight_source *ws) {
    size_t n = 0;
    for (int f = 0; f < ws->n_files; f++)
        for (int i = 0; i < ws->st[f].n_tensors; i++) n += ws->st[f].tensors[i].nbytes;
    if (ws->gguf)
        for (int i = 0; i < ws->gguf->n_tensors; i++) n += ws->gguf->tensors[i].nbytes;
    for (int i = 0; i < ws->n_repacked; i++) n += ws->repacked[i].t.nbytes;
    return n - ws->repacked_from;
}
