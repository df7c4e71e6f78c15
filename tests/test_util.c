/* test_util.c - see test_util.h. */
#include "test_util.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine/lm_engine.h"
#include "engine/lm_kv_cache.h"
#include "model/lm_qwen35.h"
#include "engine/lm_runner.h"
#include "lm_test.h"
#include "format/safetensors.h"

int lm_tu_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, n, f);
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

char *lm_tu_read(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (len < cap) break;
        buf = realloc(buf, (cap *= 2) + 1);
    }
    fclose(f);
    buf[len] = 0;
    if (n) *n = len;
    return buf;
}

int lm_tu_run(const char *cmd, char **out, char **err) {
    static int counter;
    char o[512], e[512], full[8192];
    snprintf(o, sizeof o, "%s/cmd%d.out", lm_test_tmpdir(), counter);
    snprintf(e, sizeof e, "%s/cmd%d.err", lm_test_tmpdir(), counter++);
    snprintf(full, sizeof full, "( %s ) >'%s' 2>'%s' </dev/null", cmd, o, e);
    int st = system(full);
    if (out) *out = lm_tu_read(o, NULL);
    if (err) *err = lm_tu_read(e, NULL);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

char *lm_tu_mkdir(const char *tag) {
    static int counter;
    size_t n = strlen(lm_test_tmpdir()) + strlen(tag) + 32;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s-%d", lm_test_tmpdir(), tag, counter++);
    mkdir(p, 0755);
    return p;
}

bool lm_tu_device_is_cuda(void) {
    const char *d = getenv("LUMEN_TEST_DEVICE");
    return d && !strcmp(d, "cuda");
}

lm_backend *lm_tu_model_backend(int threads, lm_err *e) {
    if (lm_tu_device_is_cuda()) return lm_cuda_backend_create(0, e);
    return lm_cpu_backend_create(threads, LM_ISA_AUTO, e);
}

void lm_tu_parity(lm_test_ctx *lm_t_, const char *dir, lm_cpu_isa isa, int threads, int n_prompts,
                  lm_parity_result *out) {
    lm_err e = { { 0 } };
    lm_backend *be = lm_tu_device_is_cuda() ? lm_tu_model_backend(threads, &e) : lm_cpu_backend_create(threads, isa, &e);
    if (!be) LM_SKIP("%s backend unavailable here: %s", lm_cpu_isa_name(isa), e.msg);
    lm_parity_result res;
    int rc = lm_parity_run(dir, be, 1e-3, &res, &e);
    LM_CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc == 0) {
        char *js = lm_parity_json(dir, be, &res);
        printf("  %s\n", js);
        free(js);
        LM_CHECK(res.n_prompts == n_prompts);
        LM_CHECK(res.max_abs_err <= 1e-3);
        LM_CHECK(res.cache_vs_full <= 1e-4);
        for (int i = 0; i < res.n_prompts; i++) {
            LM_CHECK(res.prompts[i].greedy_mismatch == 0);
            LM_CHECK(res.prompts[i].greedy_steps == 24);
            /* the check must have teeth: most steps have a comfortable margin */
            LM_CHECK(res.prompts[i].greedy_checked >= 12);
        }
        LM_CHECK(res.ok);
        if (out) *out = res;
    }
    lm_backend_destroy(be);
}

void lm_tu_parity_fixture(lm_test_ctx *lm_t_, const char *name, lm_cpu_isa isa, int threads) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", name);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    lm_tu_parity(lm_t_, dir, isa, threads, 3, NULL);
    free(dir);
}

bool lm_tu_load_named(const char *name, lm_backend **be, lm_model **m, char *why, size_t n_why) {
    char *dir;
    if (strcmp(name, "demo") == 0) {
        dir = malloc(strlen(LUMEN_SOURCE_DIR) + 16);
        sprintf(dir, "%s/models/demo", LUMEN_SOURCE_DIR);
    } else {
        char rel[128];
        snprintf(rel, sizeof rel, "models/%s", name);
        if (!(dir = lm_test_fixture_path(rel))) {
            snprintf(why, n_why, "%s", lm_test_fixtures_why());
            return false;
        }
    }
    lm_err e = { { 0 } };
    *be = lm_tu_model_backend(2, &e);
    bool ok = *be && lm_model_load(m, dir, *be, &e) == 0;
    free(dir);
    if (!ok) snprintf(why, n_why, "%s: %s", name, e.msg);
    return ok;
}

int lm_tu_greedy_alone(lm_model *m, const int32_t *prompt, int n, int gen, int32_t *out) {
    return lm_tu_greedy_alone_kv(m, (lm_kv_types){ LM_KV_F32, LM_KV_F32 }, prompt, n, gen, out);
}

int lm_tu_greedy_alone_kv(lm_model *m, lm_kv_types kvt, const int32_t *prompt, int n, int gen, int32_t *out) {
    lm_runner *r = NULL;
    if (lm_runner_create_kv(&r, m, n + gen + 1, 0, kvt, NULL)) return -1;
    float *logits = malloc((size_t)m->cfg.vocab * sizeof(float));
    int rc = lm_runner_eval(r, prompt, n, false, logits, NULL);
    for (int i = 0; rc == 0 && i < gen; i++) {
        out[i] = lm_argmax(logits, m->cfg.vocab);
        rc = lm_runner_eval(r, &out[i], 1, false, logits, NULL);
    }
    free(logits);
    lm_runner_free(r);
    return rc;
}

void lm_tu_collect_init(lm_tu_collect *c) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
}

void lm_tu_collect_destroy(lm_tu_collect *c) {
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
}

void lm_tu_collect_on_token(void *user, const lm_token_event *ev) {
    lm_tu_collect *c = user;
    pthread_mutex_lock(&c->mu);
    if (ev->has_token && c->n < LM_TU_COLLECT_MAX) {
        if (c->n == 0) {
            c->logprob0 = ev->logprob;
            c->n_top0 = ev->n_top;
        }
        c->toks[c->n++] = ev->token;
    }
    if (ev->done) {
        c->done = true;
        c->finish = ev->finish;
        c->n_cached = ev->n_cached;
        c->n_cached_disk = ev->trace ? ev->trace->n_cached_disk : -1;
        c->n_shared = ev->trace ? ev->trace->n_shared : -1;
        c->n_prefill_chunks = ev->trace ? ev->trace->n_prefill_chunks : -1;
        c->max_step_batch = -1;
        for (int i = 0; ev->trace && i < ev->trace->n_steps; i++)
            c->max_step_batch = LM_MAX(c->max_step_batch, ev->trace->step_batch[i]);
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void lm_tu_collect_wait(lm_tu_collect *c) {
    pthread_mutex_lock(&c->mu);
    while (!c->done) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

void lm_tu_collect_wait_tokens(lm_tu_collect *c, int min_tokens) {
    pthread_mutex_lock(&c->mu);
    while (!c->done && c->n < min_tokens) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

#define TU_N 6
#define TU_MAX_GEN 64

void lm_tu_engine_concurrent_equals_alone(lm_test_ctx *lm_t_, const char *dir, int step_tokens, int threads,
                                          int gen) {
    lm_tu_engine_concurrent_equals_alone_kv(lm_t_, dir, step_tokens, threads, gen, (lm_kv_types){ 0 });
}

void lm_tu_engine_concurrent_equals_alone_kv(lm_test_ctx *lm_t_, const char *dir, int step_tokens, int threads,
                                             int gen, lm_kv_types kvt) {
    LM_REQUIRE(gen > 0 && gen <= TU_MAX_GEN);
    char path[1024];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    lm_err e = { { 0 } };
    lm_safetensors ref = { 0 };
    if (lm_safetensors_open(&ref, path, &e)) LM_SKIP("%s", e.msg);
    const lm_file_tensor *t = lm_safetensors_find(&ref, "prompt2.ids");
    int n_full = t ? (int)LM_MIN(t->shape[0], 300) : 0;
    int32_t full[300], prompts[TU_N][300], solo[TU_N][TU_MAX_GEN];
    if (n_full) memcpy(full, t->data, (size_t)n_full * sizeof(int32_t));
    lm_safetensors_close(&ref);
    LM_REQUIRE(n_full >= 64);
    int cut[TU_N] = { 7, 300, 64, 1, 129, 33 }, lens[TU_N];
    for (int i = 0; i < TU_N; i++) {
        int off = (i * 11) % 5;
        lens[i] = LM_MIN(cut[i], n_full - off);
        memcpy(prompts[i], full + off, (size_t)lens[i] * sizeof(int32_t));
    }
    lm_backend *be = lm_tu_model_backend(threads, &e);
    if (!be) {
        LM_CHECK_MSG(false, "%s", e.msg);
        return;
    }
    lm_model *m = NULL;
    if (lm_model_load(&m, dir, be, &e)) {
        LM_CHECK_MSG(false, "%s", e.msg);
        lm_backend_destroy(be);
        return;
    }
    /* solo runs first: a model runs one forward at a time, and the engine's
     * thread owns it while the engine lives */
    for (int i = 0; i < TU_N; i++) LM_CHECK(lm_tu_greedy_alone_kv(m, kvt, prompts[i], lens[i], gen, solo[i]) == 0);
    lm_engine_opts o = { .ctx = 512, .parallel = 4, .step_tokens = step_tokens, .kv_type = kvt };
    lm_engine *en = NULL;
    LM_CHECK_MSG(lm_engine_create(&en, m, &o, &e) == 0, "%s", e.msg);
    lm_tu_collect c[TU_N];
    lm_request *req[TU_N] = { 0 };
    lm_gen_params p = { 0 };
    p.sampling.top_p = 1;
    p.repetition_penalty = 1;
    p.max_tokens = gen;
    for (int i = 0; en && i < TU_N; i++) {
        lm_tu_collect_init(&c[i]);
        LM_CHECK(lm_engine_submit(en, prompts[i], lens[i], &p, lm_tu_collect_on_token, &c[i], &req[i], &e) ==
                 LM_ENGINE_OK);
    }
    for (int i = 0; en && i < TU_N; i++) {
        if (!req[i]) continue;
        lm_tu_collect_wait(&c[i]);
        LM_CHECK(c[i].finish == LM_FINISH_LENGTH || c[i].finish == LM_FINISH_STOP);
        LM_CHECK_MSG(c[i].n == gen || c[i].finish == LM_FINISH_STOP, "request %d: %d tokens", i, c[i].n);
        LM_CHECK_MSG(memcmp(c[i].toks, solo[i], (size_t)c[i].n * sizeof(int32_t)) == 0,
                     "request %d (len %d) differs from alone", i, lens[i]);
        lm_request_release(req[i]);
        lm_tu_collect_destroy(&c[i]);
    }
    if (en) {
        /* stats are published after each step, a moment after the last final event */
        lm_engine_stats st = { 0 };
        for (int i = 0; i < 2000; i++) {
            lm_engine_get_stats(en, &st);
            if (st.running == 0 && st.kv_blocks_free == st.kv_blocks_total) break;
            struct timespec ts = { 0, 1000000 };
            nanosleep(&ts, NULL);
        }
        LM_CHECK(st.kv_blocks_free == st.kv_blocks_total);
        LM_CHECK(st.steps > 0 && st.batch_tokens_total > st.steps); /* batches held more than one token */
    }
    lm_engine_free(en);
    lm_model_free(m);
    lm_backend_destroy(be);
}

double lm_tu_top2_margin(const float *x, int n) {
    int a = lm_argmax(x, n);
    float s = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != a && x[i] > s) s = x[i];
    return (double)x[a] - s;
}

double lm_tu_rel_err(const float *got, const float *ref, size_t n, double floor) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]) / fmax(fabs((double)ref[i]), floor);
        if (!(d <= m)) m = isnan(d) ? INFINITY : d;
    }
    return m;
}

int lm_tu_round_robin(int S, const int *n, const int *pos0, int32_t *pos, int32_t *seq) {
    int t = 0;
    for (int i = 0, more = 1; more; i++) {
        more = 0;
        for (int s = 0; s < S; s++)
            if (i < n[s]) {
                pos[t] = pos0[s] + i;
                seq[t++] = s;
                more = 1;
            }
    }
    return t;
}

char *lm_tu_g256_file(const char *type, const char *pattern) {
    char name[96], rel[160];
    snprintf(name, sizeof name, pattern, type);
    size_t n = strlen(LUMEN_SOURCE_DIR "/tests/data/gguf/llama-g256/") + strlen(name) + 1;
    char *local = malloc(n);
    snprintf(local, n, "%s/tests/data/gguf/llama-g256/%s", LUMEN_SOURCE_DIR, name);
    if (access(local, R_OK) == 0) return local;
    free(local);
    snprintf(rel, sizeof rel, "gguf/llama-g256/%s", name);
    char *shared = lm_test_fixture_path(rel);
    if (shared && access(shared, R_OK) != 0) {
        free(shared);
        return NULL;
    }
    return shared;
}

void lm_tu_engine_settled(lm_engine *en, lm_engine_stats *st) {
    for (int i = 0; i < 2000; i++) {
        lm_engine_get_stats(en, st);
        if (st->running == 0 && st->queued == 0) return;
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
}

int lm_tu_ref_ids(const char *dir, const char *name, int32_t *ids, int max, lm_err *e) {
    char path[1024];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    lm_safetensors ref = { 0 };
    if (lm_safetensors_open(&ref, path, e)) return 0;
    const lm_file_tensor *t = lm_safetensors_find(&ref, name);
    int n = t && t->type == LM_I32 ? (int)LM_MIN(t->shape[0], max) : 0;
    if (n > 0) memcpy(ids, t->data, (size_t)n * sizeof(int32_t));
    else lm_errf(e, "%s: no I32 tensor %s", path, name);
    lm_safetensors_close(&ref);
    return n;
}

void lm_tu_mtp_run(lm_test_ctx *lm_t_, struct lm_model *m, const int32_t *prompt, int n_prompt, lm_tu_mtp_out *out) {
    memset(out, 0, sizeof *out);
    lm_err e = { { 0 } };
    lm_engine *en = NULL;
    lm_engine_opts o = { .ctx = 256, .parallel = 1, .spec = LM_SPEC_MTP, .spec_draft = 3, .spec_fixed = true };
    if (lm_engine_create(&en, m, &o, &e)) {
        LM_CHECK_MSG(0, "%s", e.msg);
        return;
    }
    lm_tu_collect c;
    lm_tu_collect_init(&c);
    lm_request *r = NULL;
    lm_gen_params p = { .sampling = { .top_p = 1 }, .repetition_penalty = 1, .max_tokens = LM_TU_MTP_GEN };
    if (lm_engine_submit(en, prompt, n_prompt, &p, lm_tu_collect_on_token, &c, &r, &e) == LM_ENGINE_OK) {
        lm_tu_collect_wait(&c);
        out->n = LM_MIN(c.n, LM_TU_MTP_GEN);
        memcpy(out->toks, c.toks, (size_t)out->n * sizeof(int32_t));
        lm_request_release(r);
        lm_tu_engine_settled(en, &out->st);
    } else {
        LM_CHECK_MSG(0, "%s", e.msg);
    }
    lm_tu_collect_destroy(&c);
    lm_engine_free(en);
}

int lm_tu_q35_hidden(struct lm_model *m, const int32_t *ids, int T, float *hidden, lm_err *e) {
    const int n_blocks = (T + 16 - 1) / 16;
    lm_kv_cache *kv = NULL;
    if (lm_kv_cache_create_for(&kv, m, (lm_kv_types){ 0 }, 16, n_blocks, 1, 0, e)) return -1;
    lm_kv_seq seq = { 0 };
    int32_t slot = lm_kv_state_acquire(kv);
    int32_t *pos = malloc((size_t)T * sizeof *pos), *sq = calloc((size_t)T, sizeof *sq);
    for (int t = 0; t < T; t++) pos[t] = t;
    int rc = lm_kv_seq_reserve(kv, &seq, T, e);
    if (rc == 0) {
        const int32_t *table = seq.blocks;
        lm_batch b = { .n_tokens = T, .tokens = ids, .pos = pos, .seq = sq, .n_seqs = 1, .block_tables = &table,
                       .state_slot = slot >= 0 ? &slot : NULL, .n_out = T, .out_rows = pos };
        rc = lm_qwen35_forward_hidden(m, &kv->pool, &b, NULL, hidden, e);
    }
    lm_kv_seq_release(kv, &seq);
    lm_kv_cache_free(kv);
    free(pos), free(sq);
    return rc;
}

int lm_tu_mtp_logits(struct lm_model *m, const int32_t *ids, int T, float *logits, lm_err *e) {
    const lm_qwen35_mtp *head = lm_qwen35_mtp_head(m);
    if (!head || T < 2) return lm_errf(e, "no MTP head, or fewer than 2 tokens");
    const int n = T - 1;
    float *hidden = malloc((size_t)T * (size_t)m->cfg.d_model * sizeof(float));
    lm_kv_cache *mkv = NULL;
    lm_kv_seq seq = { 0 };
    int rc = lm_tu_q35_hidden(m, ids, T, hidden, e);
    if (rc == 0) rc = lm_kv_cache_create(&mkv, m->be, head->n_layers, m->kv_width, 16, (n + 15) / 16, NULL, e);
    if (rc == 0) rc = lm_kv_seq_reserve(mkv, &seq, n, e);
    if (rc == 0) {
        int32_t *pos = malloc((size_t)n * sizeof *pos), *sq = calloc((size_t)n, sizeof *sq);
        for (int i = 0; i < n; i++) pos[i] = i;
        const int32_t *table = seq.blocks;
        lm_batch b = { .n_tokens = n, .tokens = ids + 1, .pos = pos, .seq = sq, .n_seqs = 1, .block_tables = &table,
                       .n_out = n, .out_rows = pos };
        rc = lm_qwen35_mtp_forward(m, &mkv->pool, &b, hidden, logits, e);
        free(pos), free(sq);
        lm_kv_seq_release(mkv, &seq);
    }
    if (mkv) lm_kv_cache_free(mkv);
    free(hidden);
    return rc;
}

const char *lm_tu_llamacpp_missing(void) {
    if (access(LUMEN_SOURCE_DIR "/tools/llamacpp/node_modules/node-llama-cpp/package.json", R_OK) != 0)
        return "node-llama-cpp is not installed (cd tools/llamacpp && npm ci)";
    if (lm_tu_run("node --version", NULL, NULL) != 0) return "node is not on PATH";
    return NULL;
}

char *lm_tu_llamacpp_answer(lm_test_ctx *lm_t_, const char *gguf, const int32_t *prompt, int n, int gen) {
    size_t cap = strlen(gguf) + 256 + (size_t)n * 12;
    char *cmd = malloc(cap);
    size_t len = (size_t)snprintf(cmd, cap, "node %s/tools/llamacpp/oracle.mjs %s -n %d --threads 2 --prompt-ids ",
                                  LUMEN_SOURCE_DIR, gguf, gen);
    for (int i = 0; i < n; i++) len += (size_t)snprintf(cmd + len, cap - len, "%s%d", i ? "," : "", prompt[i]);
    char *out = NULL, *err = NULL;
    int rc = lm_tu_run(cmd, &out, &err);
    LM_CHECK_MSG(rc == 0, "llama.cpp did not run %s: %s", gguf, err ? err : "");
    free(cmd), free(err);
    if (rc == 0) return out;
    free(out);
    return NULL;
}
