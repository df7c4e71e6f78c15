/* pooling.c - reading a model's pooling, and pooling hidden states (see
 * lm_pooling.h). */
#include "lm_pooling.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/lm_file.h"

const char *lm_pool_mode_name(lm_pool_mode m) {
    switch (m) {
    case LM_POOL_LAST: return "last";
    case LM_POOL_MEAN: return "mean";
    case LM_POOL_CLS: return "cls";
    case LM_POOL_NONE: break;
    }
    return "none";
}

static void set_default(lm_pooling *p) {
    *p = (lm_pooling){ .mode = LM_POOL_LAST, .normalize = true };
    snprintf(p->source, sizeof p->source, "default");
}

static void set_none(lm_pooling *p, const char *why) {
    *p = (lm_pooling){ .mode = LM_POOL_NONE };
    snprintf(p->source, sizeof p->source, "%s", why);
}

static json_t *load_json(const char *dir, const char *name) {
    char *path = lm_path_join(dir, name);
    json_t *j = json_load_file(path, 0, NULL);
    free(path);
    return j;
}

/* The Pooling module's config.json (folder `sub` of dir) into p. */
static void read_pooling_config(lm_pooling *p, const char *dir, const char *sub) {
    char name[256];
    snprintf(name, sizeof name, "%s/config.json", sub);
    json_t *c = load_json(dir, name);
    if (!json_is_object(c)) {
        json_decref(c);
        char why[160];
        snprintf(why, sizeof why, "%.120s cannot be read as JSON", name);
        return set_none(p, why);
    }
    static const struct { const char *key; lm_pool_mode mode; } k_modes[] = {
        { "pooling_mode_lasttoken", LM_POOL_LAST },
        { "pooling_mode_mean_tokens", LM_POOL_MEAN },
        { "pooling_mode_cls_token", LM_POOL_CLS },
    };
    static const char *const k_other[] = { "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                                           "pooling_mode_weightedmean_tokens" };
    int n_on = 0;
    for (size_t i = 0; i < sizeof k_modes / sizeof *k_modes; i++)
        if (json_is_true(json_object_get(c, k_modes[i].key))) p->mode = k_modes[i].mode, n_on++;
    for (size_t i = 0; i < sizeof k_other / sizeof *k_other; i++)
        if (json_is_true(json_object_get(c, k_other[i]))) n_on += 2;
    json_decref(c);
    if (n_on != 1) set_none(p, "sentence-transformers asks for a pooling other than one of last token, mean, cls");
}

void lm_pooling_read_hf(lm_pooling *p, const char *dir) {
    set_default(p);
    json_t *mods = load_json(dir, "modules.json");
    if (!mods) return; /* not a sentence-transformers folder */
    if (!json_is_array(mods)) {
        json_decref(mods);
        return set_none(p, "modules.json is not a JSON array");
    }
    bool pooled = false, normalize = false;
    size_t i;
    json_t *m;
    json_array_foreach(mods, i, m) {
        const char *type = json_string_value(json_object_get(m, "type"));
        const char *path = json_string_value(json_object_get(m, "path"));
        if (!type) continue;
        const char *dot = strrchr(type, '.');
        const char *cls = dot ? dot + 1 : type;
        if (!strcmp(cls, "Pooling") && path && !pooled) {
            read_pooling_config(p, dir, path);
            pooled = true;
        } else if (!strcmp(cls, "Normalize")) {
            normalize = true;
        }
    }
    json_decref(mods);
    if (p->mode == LM_POOL_NONE) return;
    if (!pooled) return set_none(p, "modules.json names no Pooling module");
    p->normalize = normalize;
    snprintf(p->source, sizeof p->source, "sentence-transformers");
}

void lm_pooling_from_gguf(lm_pooling *p, bool has_type, int64_t type) {
    set_default(p);
    if (!has_type || type == 0) return;
    if (type < 1 || type > 3) {
        char why[160];
        snprintf(why, sizeof why, "the GGUF's pooling_type %lld is not one of 1 (mean), 2 (cls), 3 (last)",
                 (long long)type);
        return set_none(p, why);
    }
    p->mode = type == 1 ? LM_POOL_MEAN : type == 2 ? LM_POOL_CLS : LM_POOL_LAST;
    snprintf(p->source, sizeof p->source, "gguf");
}

void lm_pooling_span(const lm_pooling *p, int n, int *first, int *count) {
    switch (p->mode) {
    case LM_POOL_MEAN: *first = 0, *count = n; return;
    case LM_POOL_CLS: *first = 0, *count = n > 0; return;
    case LM_POOL_LAST: *first = n - 1, *count = n > 0; return;
    case LM_POOL_NONE: break;
    }
    *first = 0, *count = 0;
}

void lm_embed_pool_begin(lm_embed_pool *p, const lm_pooling *how, int64_t D) {
    p->how = *how;
    p->D = D;
    p->acc = lm_xcalloc((size_t)D, sizeof *p->acc);
    p->n = 0;
}

void lm_embed_pool_add(lm_embed_pool *p, const float *rows, int n) {
    for (int r = 0; r < n; r++)
        for (int64_t i = 0; i < p->D; i++) p->acc[i] += rows[(size_t)r * (size_t)p->D + (size_t)i];
    p->n += n;
}

bool lm_embed_pool_end(const lm_embed_pool *p, float *out) {
    if (p->n == 0) return false;
    double ss = 0;
    for (int64_t i = 0; i < p->D; i++) {
        double v = p->acc[i] / p->n;
        ss += v * v;
    }
    double scale = p->how.normalize && ss > 0 ? 1.0 / sqrt(ss) : 1.0;
    for (int64_t i = 0; i < p->D; i++) out[i] = (float)(p->acc[i] / p->n * scale);
    return true;
}

void lm_embed_pool_free(lm_embed_pool *p) {
    free(p->acc);
    p->acc = NULL;
}

void lm_l2_normalize(float *v, int64_t n) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)v[i] * v[i];
    if (ss <= 0) return;
    double s = 1.0 / sqrt(ss);
    for (int64_t i = 0; i < n; i++) v[i] = (float)(v[i] * s);
}
