/* make_random_model.c - writes a Hugging Face checkpoint with random weights:
 * Llama, Qwen3 (Llama with q/k norms), Qwen3-MoE (Qwen3 attention with a
 * sparse expert FFN in every layer), or a Qwen3.5 hybrid (Gated DeltaNet +
 * gated full attention).
 *
 *   make_random_model OUT_DIR --shape llama-3.2-1b|llama-3.1-8b|qwen3-8b|tiny|
 *                                     qwen3-30b-a3b|qwen3-moe-tiny|
 *                                     qwen3.5-0.8b|qwen3.5-2b|qwen3.5-9b|qwen3.5-27b|qwen3.5-tiny
 *                     [--seed N] [--layers N] [--dtype bf16|f32]
 *                     [--config-style hub|v5] [--threads N]
 *
 * Design. A random model at real shapes is a valid speed and memory test for
 * the engine, so this writes exactly the files a Hugging Face Llama folder
 * has: config.json, generation_config.json and one model.safetensors.
 *
 * - Tensors are listed once (name, shape, fill), sorted by name as the
 *   safetensors library does, and given consecutive data offsets in that
 *   order. The header is JSON with "__metadata__" first, padded with spaces so
 *   that 8 + header length is a multiple of 8 (data then starts 8-aligned).
 * - Weights are normal(0, 0.02), norms are 1 (Qwen3.5's zero-centred
 *   (1 + w) norms are 0, so they scale by 1 too). Values are produced in chunks
 *   of 2^20 elements; each chunk has its own xorshift64* state derived with
 *   splitmix64 from (seed, tensor index in sorted order, chunk index), and
 *   Box-Muller turns pairs of uniforms into pairs of normals (the angle's
 *   sine and cosine from a 65536-entry table, for speed). The output is
 *   therefore a pure function of the seed and the shape, whatever the number
 *   of threads, and chunks can be filled in parallel.
 * - Writing streams through two fixed buffers of a few chunks: worker threads
 *   (pthreads, sharing its pieces: chunks of any tensors) fill one while the main thread
 *   writes the other with one large write(); nothing close to the model's size is ever held in memory
 *   (the 8B model is 16 GB in bf16). The file is written as
 *   model.safetensors.tmp and renamed when complete, so an interrupted run
 *   never leaves a plausible-looking truncated model.
 * - config.json follows the layout of the real checkpoints on the Hub
 *   (rope_theta + rope_scaling, torch_dtype) by default; --config-style v5
 *   writes what transformers 5 saves instead (rope_parameters, dtype), as in
 *   the fixtures under shared/fixtures/models. Qwen3-MoE and Qwen3.5 shapes
 *   always write the transformers 5 layout (the MoE one with the keys of
 *   tests/data/moe/qwen3-moe-e32-k8/config.json).
 * - Qwen3-MoE layers have no dense MLP: a router mlp.gate.weight
 *   [experts, hidden] and per expert mlp.experts.E.{gate,up}_proj.weight
 *   [moe_intermediate, hidden] and down_proj.weight [hidden, moe_intermediate]
 *   (the per-expert layout of the Hub checkpoints); all random like the other
 *   matrices. Qwen3-30B-A3B is 30.5B parameters, 61.1 GB in bf16.
 *
 * Errors (bad arguments, I/O) are reported on stderr and exit with status 1
 * (2 for usage errors). */
#include "base/lm_base.h"
#include "backend/lm_dtype.h"
#include "base/lm_file.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- model shapes ------------------------------------------------------- */

typedef struct shape {
    const char *name;
    int hidden, intermediate, layers, heads, kv_heads, head_dim, vocab;
    double rope_theta;
    /* llama3 rope scaling; factor 0 = none (default rope) */
    double rope_factor, low_freq_factor, high_freq_factor;
    int rope_orig_max_pos;
    int max_pos;
    bool tied;
    double rms_eps;
    int bos, eos, pad; /* -1 = null / absent */
    /* Qwen3.5 hybrids (lin_k_heads > 0): Gated DeltaNet heads and widths, the
     * conv kernel, every full_every-th layer full attention, partial rope */
    int lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim, conv_kernel, full_every;
    double partial_rotary;
    bool qk_norm; /* Qwen3: per-head RMSNorm of q and k (Qwen3ForCausalLM) */
    /* Qwen3-MoE (experts > 0, Qwen3MoeForCausalLM): every layer's MLP is
     * experts routed experts of width moe_inter, experts_per_tok active per
     * token (norm_topk_prob true); intermediate is only written to config.json.
     * 0 experts = dense. */
    int experts, experts_per_tok, moe_inter;
} shape;

static const shape SHAPES[] = {
    { "llama-3.2-1b", 2048, 8192, 16, 32, 8, 64, 128256, 500000.0,
      32.0, 1.0, 4.0, 8192, 131072, true, 1e-5, 128000, 128001, -1, 0, 0, 0, 0, 0, 0, 0.0, false, 0, 0, 0 },
    { "llama-3.1-8b", 4096, 14336, 32, 32, 8, 128, 128256, 500000.0,
      8.0, 1.0, 4.0, 8192, 131072, false, 1e-5, 128000, 128001, -1, 0, 0, 0, 0, 0, 0, 0.0, false, 0, 0, 0 },
    /* Qwen3-8B: Llama's layout plus q/k norms, untied head */
    { "qwen3-8b", 4096, 12288, 36, 32, 8, 128, 151936, 1000000.0,
      0.0, 0.0, 0.0, 0, 40960, false, 1e-6, -1, 151645, -1, 0, 0, 0, 0, 0, 0, 0.0, true, 0, 0, 0 },
    /* the fixtures' tokenizer: vocab 1024, eos 2, pad 0, no bos */
    { "tiny", 64, 176, 2, 4, 2, 16, 1024, 10000.0,
      0.0, 0.0, 0.0, 0, 4096, false, 1e-5, -1, 2, 0, 0, 0, 0, 0, 0, 0, 0.0, false, 0, 0, 0 },
    /* Qwen3-30B-A3B: Qwen3 attention (32 / 4 heads of 128, q/k norms), 128
     * experts of width 768 per layer, 8 active, untied head; 30.5B parameters
     * (3.3B active), 61.1 GB in bf16 */
    { "qwen3-30b-a3b", 2048, 6144, 48, 32, 4, 128, 151936, 1000000.0,
      0.0, 0.0, 0.0, 0, 40960, false, 1e-6, -1, 151645, -1, 0, 0, 0, 0, 0, 0, 0.0, true, 128, 8, 768 },
    /* as tests/data/moe/qwen3-moe-e32-k8 (the fixtures' tokenizer) */
    { "qwen3-moe-tiny", 64, 128, 2, 4, 2, 16, 1024, 1000000.0,
      0.0, 0.0, 0.0, 0, 32768, false, 1e-6, -1, 2, 0, 0, 0, 0, 0, 0, 0, 0.0, true, 32, 8, 16 },
    /* Qwen3.5 text models (Qwen/Qwen3.5-0.8B, -2B): 3 DeltaNet : 1 attention */
    { "qwen3.5-0.8b", 1024, 3584, 24, 8, 2, 256, 248320, 10000000.0,
      0.0, 0.0, 0.0, 0, 262144, true, 1e-6, -1, 248046, -1, 16, 16, 128, 128, 4, 4, 0.25, false, 0, 0, 0 },
    { "qwen3.5-2b", 2048, 6144, 24, 8, 2, 256, 248320, 10000000.0,
      0.0, 0.0, 0.0, 0, 262144, true, 1e-6, -1, 248046, -1, 16, 16, 128, 128, 4, 4, 0.25, false, 0, 0, 0 },
    /* Qwen3.5-27B (dense hybrid): 48 DeltaNet layers of 16 key / 48 value
     * heads, 16 gated attention layers of 24 / 4 heads, untied head; 26.9B
     * parameters, 53.8 GB in bf16 */
    { "qwen3.5-27b", 5120, 17408, 64, 24, 4, 256, 248320, 10000000.0,
      0.0, 0.0, 0.0, 0, 262144, false, 1e-6, -1, 248046, -1, 16, 48, 128, 128, 4, 4, 0.25, false, 0, 0, 0 },
    /* Qwen3.5-9B: 24 DeltaNet layers of 16 key / 32 value heads, 8 gated
     * attention layers of 16 / 4 heads, untied head; 8.95B parameters */
    { "qwen3.5-9b", 4096, 12288, 32, 16, 4, 256, 248320, 10000000.0,
      0.0, 0.0, 0.0, 0, 262144, false, 1e-6, -1, 248046, -1, 16, 32, 128, 128, 4, 4, 0.25, false, 0, 0, 0 },
    { "qwen3.5-tiny", 64, 128, 4, 4, 2, 32, 1024, 10000000.0,
      0.0, 0.0, 0.0, 0, 32768, false, 1e-6, -1, 2, 0, 2, 4, 16, 16, 4, 4, 0.25, false, 0, 0, 0 },
};

static bool is_hybrid(const shape *s) { return s->lin_k_heads > 0; }
static bool is_moe(const shape *s) { return s->experts > 0; }
static bool layer_is_linear(const shape *s, int l) { return (l + 1) % s->full_every != 0; }

/* ---- tensors ------------------------------------------------------------- */

typedef struct tensor {
    char name[96];
    int64_t rows, cols; /* cols == 0: a vector of rows elements */
    bool ones;          /* norm weight: all 1 */
    bool zeros;         /* zero-centred norm weight (used as 1 + w): all 0 */
    bool conv;          /* depthwise conv weight: shape [rows, 1, cols] */
    uint64_t index;     /* position in sorted order, part of the RNG seed */
    uint64_t offset, bytes;
} tensor;

typedef struct tensor_list {
    tensor *t;
    size_t n, cap;
} tensor_list;

static tensor *add_tensor(tensor_list *l, const char *name, int64_t rows, int64_t cols, bool ones) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->t = lm_xrealloc(l->t, l->cap * sizeof *l->t);
    }
    tensor *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    LM_ASSERT(strlen(name) < sizeof t->name);
    strcpy(t->name, name);
    t->rows = rows;
    t->cols = cols;
    t->ones = ones;
    return t;
}

static int64_t tensor_numel(const tensor *t) { return t->cols ? t->rows * t->cols : t->rows; }

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const tensor *)a)->name, ((const tensor *)b)->name);
}

/* Qwen3.5 (Qwen3_5ForCausalLM) names: linear_attn.* on DeltaNet layers,
 * self_attn.* (q_proj carries q and its output gate per head) on the others. */
static void build_hybrid_layer(tensor_list *l, const shape *s, int i) {
    char nm[96];
    int64_t h = s->hidden, q = (int64_t)s->heads * s->head_dim, kv = (int64_t)s->kv_heads * s->head_dim;
    int64_t kd = (int64_t)s->lin_k_heads * s->lin_k_dim, vd = (int64_t)s->lin_v_heads * s->lin_v_dim;
#define T(suffix, r, c, one) (snprintf(nm, sizeof nm, "model.layers.%d.%s", i, suffix), add_tensor(l, nm, r, c, one))
    T("input_layernorm.weight", h, 0, false)->zeros = true;
    T("post_attention_layernorm.weight", h, 0, false)->zeros = true;
    if (layer_is_linear(s, i)) {
        T("linear_attn.in_proj_qkv.weight", 2 * kd + vd, h, false);
        T("linear_attn.in_proj_z.weight", vd, h, false);
        T("linear_attn.in_proj_b.weight", s->lin_v_heads, h, false);
        T("linear_attn.in_proj_a.weight", s->lin_v_heads, h, false);
        T("linear_attn.conv1d.weight", 2 * kd + vd, s->conv_kernel, false)->conv = true;
        T("linear_attn.A_log", s->lin_v_heads, 0, false);
        T("linear_attn.dt_bias", s->lin_v_heads, 0, false);
        T("linear_attn.norm.weight", s->lin_v_dim, 0, true);
        T("linear_attn.out_proj.weight", h, vd, false);
    } else {
        T("self_attn.q_proj.weight", 2 * q, h, false);
        T("self_attn.k_proj.weight", kv, h, false);
        T("self_attn.v_proj.weight", kv, h, false);
        T("self_attn.o_proj.weight", h, q, false);
        T("self_attn.q_norm.weight", s->head_dim, 0, false)->zeros = true;
        T("self_attn.k_norm.weight", s->head_dim, 0, false)->zeros = true;
    }
    T("mlp.gate_proj.weight", s->intermediate, h, false);
    T("mlp.up_proj.weight", s->intermediate, h, false);
    T("mlp.down_proj.weight", h, s->intermediate, false);
#undef T
}

static void build_tensors(tensor_list *l, const shape *s) {
    char nm[96];
    int64_t h = s->hidden, q = (int64_t)s->heads * s->head_dim, kv = (int64_t)s->kv_heads * s->head_dim;
    add_tensor(l, "model.embed_tokens.weight", s->vocab, h, false);
    for (int i = 0; i < s->layers; i++) {
        if (is_hybrid(s)) {
            build_hybrid_layer(l, s, i);
            continue;
        }
#define T(suffix, r, c, one)                                          \
    do {                                                              \
        snprintf(nm, sizeof nm, "model.layers.%d.%s", i, suffix);     \
        add_tensor(l, nm, r, c, one);                                 \
    } while (0)
        T("input_layernorm.weight", h, 0, true);
        T("post_attention_layernorm.weight", h, 0, true);
        T("self_attn.q_proj.weight", q, h, false);
        T("self_attn.k_proj.weight", kv, h, false);
        T("self_attn.v_proj.weight", kv, h, false);
        T("self_attn.o_proj.weight", h, q, false);
        if (s->qk_norm) {
            T("self_attn.q_norm.weight", s->head_dim, 0, true);
            T("self_attn.k_norm.weight", s->head_dim, 0, true);
        }
        if (is_moe(s)) {
            T("mlp.gate.weight", s->experts, h, false);
            for (int e = 0; e < s->experts; e++) {
                snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.gate_proj.weight", i, e);
                add_tensor(l, nm, s->moe_inter, h, false);
                snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.up_proj.weight", i, e);
                add_tensor(l, nm, s->moe_inter, h, false);
                snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.down_proj.weight", i, e);
                add_tensor(l, nm, h, s->moe_inter, false);
            }
        } else {
            T("mlp.gate_proj.weight", s->intermediate, h, false);
            T("mlp.up_proj.weight", s->intermediate, h, false);
            T("mlp.down_proj.weight", h, s->intermediate, false);
        }
#undef T
    }
    add_tensor(l, "model.norm.weight", h, 0, !is_hybrid(s))->zeros = is_hybrid(s);
    if (!s->tied) add_tensor(l, "lm_head.weight", s->vocab, h, false);
    qsort(l->t, l->n, sizeof *l->t, cmp_tensor_name);
    for (size_t i = 0; i < l->n; i++) l->t[i].index = i;
}

/* ---- random numbers ------------------------------------------------------ */

#define CHUNK_LOG2 20
#define CHUNK ((int64_t)1 << CHUNK_LOG2)

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t chunk_state(uint64_t seed, uint64_t tensor_index, uint64_t chunk) {
    uint64_t x = seed;
    uint64_t s = splitmix64(&x);
    x = s ^ (tensor_index * 0xd1b54a32d192ed03ull);
    s = splitmix64(&x);
    x = s ^ (chunk * 0xaef17502108ef2d9ull);
    s = splitmix64(&x);
    return s ? s : 0x2545f4914f6cdd1dull; /* xorshift state must be nonzero */
}

static inline uint64_t xorshift64s(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

/* sin(2 pi i / 65536); cos is the same table a quarter turn on. Filled once
 * by init_sin_table() before any worker starts. */
#define ANGLE_BITS 16
static float g_sin[1u << ANGLE_BITS];

static void init_sin_table(void) {
    for (uint32_t i = 0; i < (1u << ANGLE_BITS); i++)
        g_sin[i] = (float)sin(6.283185307179586476925 * (double)i / (double)(1u << ANGLE_BITS));
}

/* Fills n (even or odd) normal(0, stddev) values, as f32, into out.
 * Box-Muller: one 64-bit draw gives u1 (24 bits, in (0, 1] so log(u1) is
 * finite) and a 16-bit angle; the pair is r cos(theta), r sin(theta) with
 * r = sqrt(-2 ln u1). The angle comes from the table (a 1e-4 rad grid, far
 * below bf16 resolution), which makes this ~2x faster than sinf/cosf. */
static void fill_normal(float *out, int64_t n, uint64_t state, float stddev) {
    const float inv24 = 1.0f / 16777216.0f;
    const uint32_t mask = (1u << ANGLE_BITS) - 1, quarter = 1u << (ANGLE_BITS - 2);
    for (int64_t i = 0; i < n; i += 2) {
        uint64_t r = xorshift64s(&state);
        float u1 = (float)((r >> 40) + 1) * inv24;
        uint32_t a = (uint32_t)(r >> 16) & mask;
        float rad = stddev * sqrtf(-2.0f * logf(u1));
        out[i] = rad * g_sin[(a + quarter) & mask];
        if (i + 1 < n) out[i + 1] = rad * g_sin[a];
    }
}

/* ---- parallel chunk filling ---------------------------------------------- */

/* A piece: up to CHUNK elements of one tensor, starting at a chunk
 * boundary (its values depend on the tensor and the chunk only). A buffer
 * holds the pieces of many small tensors (a MoE model has ~18k experts'
 * matrices of ~2 chunks each), so the workers share them at any size. */
typedef struct piece {
    const tensor *t;
    int64_t first_elem, n;
    uint8_t *dst; /* bytes for element first_elem */
} piece;

typedef struct fill_job {
    const piece *pieces; /* the worker's are pieces[k], k = first, first + stride, ... < n_pieces */
    size_t n_pieces, first, stride;
    uint64_t seed;
    bool bf16;
    float *scratch; /* CHUNK floats */
} fill_job;

static void *fill_worker(void *arg) {
    fill_job *j = arg;
    for (size_t k = j->first; k < j->n_pieces; k += j->stride) {
        const piece *p = &j->pieces[k];
        float *f = j->bf16 ? j->scratch : (float *)(void *)p->dst;
        if (p->t->ones || p->t->zeros) {
            for (int64_t i = 0; i < p->n; i++) f[i] = p->t->ones ? 1.0f : 0.0f;
        } else {
            fill_normal(f, p->n, chunk_state(j->seed, p->t->index, (uint64_t)(p->first_elem >> CHUNK_LOG2)), 0.02f);
        }
        if (j->bf16) {
            uint16_t *o = (uint16_t *)(void *)p->dst;
            for (int64_t i = 0; i < p->n; i++) o[i] = lm_f32_to_bf16(f[i]);
        }
    }
    return NULL;
}

/* ---- output -------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->cap - b->n, fmt, ap);
        va_end(ap);
        LM_ASSERT(k >= 0);
        if (b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        b->cap = (b->cap + (size_t)k + 1) * 2;
        b->p = lm_xrealloc(b->p, b->cap);
    }
}

static int write_all(int fd, const void *p, size_t n, const char *path) {
    const uint8_t *c = p;
    while (n > 0) {
        ssize_t k = write(fd, c, n);
        if (k < 0) {
            if (errno == EINTR) continue;
            fprintf(stderr, "make_random_model: %s: write: %s\n", path, strerror(errno));
            return -1;
        }
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

static int write_text_file(const char *path, const sbuf *b) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        fprintf(stderr, "make_random_model: %s: %s\n", path, strerror(errno));
        return -1;
    }
    int rc = write_all(fd, b->p, b->n, path);
    if (close(fd) != 0 && rc == 0) {
        fprintf(stderr, "make_random_model: %s: close: %s\n", path, strerror(errno));
        rc = -1;
    }
    return rc;
}

static void json_token_id(sbuf *b, const char *key, int id) {
    if (id < 0) sb_printf(b, "  \"%s\": null,\n", key);
    else sb_printf(b, "  \"%s\": %d,\n", key, id);
}

/* config.json of a Qwen3.5 text model as transformers 5 saves it. */
static void make_hybrid_config(sbuf *b, const shape *s, bool bf16) {
    sb_printf(b, "{\n  \"architectures\": [\n    \"Qwen3_5ForCausalLM\"\n  ],\n");
    sb_printf(b, "  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n");
    json_token_id(b, "bos_token_id", s->bos);
    sb_printf(b, "  \"dtype\": \"%s\",\n", bf16 ? "bfloat16" : "float32");
    json_token_id(b, "eos_token_id", s->eos);
    sb_printf(b, "  \"head_dim\": %d,\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": %d,\n", s->head_dim, s->hidden);
    sb_printf(b, "  \"initializer_range\": 0.02,\n  \"intermediate_size\": %d,\n  \"layer_types\": [", s->intermediate);
    for (int l = 0; l < s->layers; l++)
        sb_printf(b, "%s\n    \"%s\"", l ? "," : "", layer_is_linear(s, l) ? "linear_attention" : "full_attention");
    sb_printf(b, "\n  ],\n  \"linear_conv_kernel_dim\": %d,\n  \"linear_key_head_dim\": %d,\n", s->conv_kernel,
              s->lin_k_dim);
    sb_printf(b, "  \"linear_num_key_heads\": %d,\n  \"linear_num_value_heads\": %d,\n", s->lin_k_heads,
              s->lin_v_heads);
    sb_printf(b, "  \"linear_value_head_dim\": %d,\n  \"max_position_embeddings\": %d,\n", s->lin_v_dim, s->max_pos);
    sb_printf(b, "  \"model_type\": \"qwen3_5_text\",\n  \"num_attention_heads\": %d,\n", s->heads);
    sb_printf(b, "  \"num_hidden_layers\": %d,\n  \"num_key_value_heads\": %d,\n", s->layers, s->kv_heads);
    json_token_id(b, "pad_token_id", s->pad);
    sb_printf(b, "  \"partial_rotary_factor\": %g,\n  \"rms_norm_eps\": %g,\n", s->partial_rotary, s->rms_eps);
    sb_printf(b, "  \"rope_parameters\": {\n    \"partial_rotary_factor\": %g,\n", s->partial_rotary);
    sb_printf(b, "    \"rope_theta\": %.1f,\n    \"rope_type\": \"default\"\n  },\n", s->rope_theta);
    sb_printf(b, "  \"tie_word_embeddings\": %s,\n", s->tied ? "true" : "false");
    sb_printf(b, "  \"transformers_version\": \"5.17.0\",\n");
    sb_printf(b, "  \"use_cache\": true,\n  \"vocab_size\": %d\n}\n", s->vocab);
}

/* config.json of a Qwen3-MoE model as transformers 5 saves it (the keys of
 * tests/data/moe/qwen3-moe-e32-k8/config.json; lumen reads num_experts or
 * num_local_experts). Every layer sparse: decoder_sparse_step 1, no
 * mlp_only_layers. */
static void make_moe_config(sbuf *b, const shape *s, bool bf16) {
    sb_printf(b, "{\n  \"architectures\": [\n    \"Qwen3MoeForCausalLM\"\n  ],\n");
    sb_printf(b, "  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n");
    json_token_id(b, "bos_token_id", s->bos);
    sb_printf(b, "  \"decoder_sparse_step\": 1,\n");
    sb_printf(b, "  \"dtype\": \"%s\",\n", bf16 ? "bfloat16" : "float32");
    json_token_id(b, "eos_token_id", s->eos);
    sb_printf(b, "  \"head_dim\": %d,\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": %d,\n", s->head_dim, s->hidden);
    sb_printf(b, "  \"initializer_range\": 0.02,\n  \"intermediate_size\": %d,\n", s->intermediate);
    sb_printf(b, "  \"max_position_embeddings\": %d,\n  \"mlp_only_layers\": [],\n", s->max_pos);
    sb_printf(b, "  \"model_type\": \"qwen3_moe\",\n  \"moe_intermediate_size\": %d,\n", s->moe_inter);
    sb_printf(b, "  \"norm_topk_prob\": true,\n  \"num_attention_heads\": %d,\n", s->heads);
    sb_printf(b, "  \"num_experts_per_tok\": %d,\n  \"num_hidden_layers\": %d,\n", s->experts_per_tok, s->layers);
    sb_printf(b, "  \"num_key_value_heads\": %d,\n  \"num_local_experts\": %d,\n", s->kv_heads, s->experts);
    sb_printf(b, "  \"output_router_logits\": false,\n");
    json_token_id(b, "pad_token_id", s->pad);
    sb_printf(b, "  \"rms_norm_eps\": %g,\n", s->rms_eps);
    sb_printf(b, "  \"rope_parameters\": {\n    \"rope_theta\": %.1f,\n    \"rope_type\": \"default\"\n  },\n",
              s->rope_theta);
    sb_printf(b, "  \"router_aux_loss_coef\": 0.001,\n  \"sliding_window\": null,\n");
    sb_printf(b, "  \"tie_word_embeddings\": %s,\n", s->tied ? "true" : "false");
    sb_printf(b, "  \"transformers_version\": \"5.17.0\",\n");
    sb_printf(b, "  \"use_cache\": true,\n  \"use_sliding_window\": false,\n  \"vocab_size\": %d\n}\n", s->vocab);
}

static void make_config(sbuf *b, const shape *s, bool bf16, bool v5) {
    if (is_hybrid(s)) {
        make_hybrid_config(b, s, bf16);
        return;
    }
    if (is_moe(s)) {
        make_moe_config(b, s, bf16);
        return;
    }
    const char *dt = bf16 ? "bfloat16" : "float32";
    sb_printf(b, "{\n  \"architectures\": [\n    \"%s\"\n  ],\n", s->qk_norm ? "Qwen3ForCausalLM" : "LlamaForCausalLM");
    sb_printf(b, "  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n");
    json_token_id(b, "bos_token_id", s->bos);
    if (v5) sb_printf(b, "  \"dtype\": \"%s\",\n", dt);
    json_token_id(b, "eos_token_id", s->eos);
    sb_printf(b, "  \"head_dim\": %d,\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": %d,\n", s->head_dim, s->hidden);
    sb_printf(b, "  \"initializer_range\": 0.02,\n  \"intermediate_size\": %d,\n", s->intermediate);
    sb_printf(b, "  \"max_position_embeddings\": %d,\n  \"mlp_bias\": false,\n", s->max_pos);
    sb_printf(b, "  \"model_type\": \"%s\",\n  \"num_attention_heads\": %d,\n", s->qk_norm ? "qwen3" : "llama", s->heads);
    sb_printf(b, "  \"num_hidden_layers\": %d,\n  \"num_key_value_heads\": %d,\n", s->layers, s->kv_heads);
    if (s->pad >= 0) sb_printf(b, "  \"pad_token_id\": %d,\n", s->pad);
    sb_printf(b, "  \"pretraining_tp\": 1,\n  \"rms_norm_eps\": %g,\n", s->rms_eps);
    if (v5) {
        sb_printf(b, "  \"rope_parameters\": {\n");
        if (s->rope_factor > 0) {
            sb_printf(b, "    \"factor\": %.1f,\n    \"high_freq_factor\": %.1f,\n    \"low_freq_factor\": %.1f,\n",
                      s->rope_factor, s->high_freq_factor, s->low_freq_factor);
            sb_printf(b, "    \"original_max_position_embeddings\": %d,\n", s->rope_orig_max_pos);
            sb_printf(b, "    \"rope_theta\": %.1f,\n    \"rope_type\": \"llama3\"\n  },\n", s->rope_theta);
        } else {
            sb_printf(b, "    \"rope_theta\": %.1f,\n    \"rope_type\": \"default\"\n  },\n", s->rope_theta);
        }
    } else {
        if (s->rope_factor > 0) {
            sb_printf(b, "  \"rope_scaling\": {\n    \"factor\": %.1f,\n    \"high_freq_factor\": %.1f,\n",
                      s->rope_factor, s->high_freq_factor);
            sb_printf(b, "    \"low_freq_factor\": %.1f,\n    \"original_max_position_embeddings\": %d,\n",
                      s->low_freq_factor, s->rope_orig_max_pos);
            sb_printf(b, "    \"rope_type\": \"llama3\"\n  },\n");
        } else {
            sb_printf(b, "  \"rope_scaling\": null,\n");
        }
        sb_printf(b, "  \"rope_theta\": %.1f,\n", s->rope_theta);
    }
    sb_printf(b, "  \"tie_word_embeddings\": %s,\n", s->tied ? "true" : "false");
    if (!v5) sb_printf(b, "  \"torch_dtype\": \"%s\",\n", dt);
    sb_printf(b, "  \"transformers_version\": \"%s\",\n", v5 ? "5.17.0" : "4.45.0");
    sb_printf(b, "  \"use_cache\": true,\n  \"vocab_size\": %d\n}\n", s->vocab);
}

static void make_generation_config(sbuf *b, const shape *s, bool v5) {
    sb_printf(b, "{\n  \"_from_model_config\": true,\n");
    if (s->bos >= 0) sb_printf(b, "  \"bos_token_id\": %d,\n", s->bos);
    sb_printf(b, "  \"eos_token_id\": %d,\n", s->eos);
    if (s->pad >= 0) sb_printf(b, "  \"pad_token_id\": %d,\n", s->pad);
    sb_printf(b, "  \"transformers_version\": \"%s\"\n}\n", v5 ? "5.17.0" : "4.45.0");
}

/* Writes model.safetensors (via a .tmp file and rename). */
static int write_safetensors(const char *dir, const tensor_list *l, bool bf16, uint64_t seed, int nthreads) {
    size_t esz = bf16 ? 2 : 4;
    uint64_t off = 0;
    for (size_t i = 0; i < l->n; i++) {
        l->t[i].offset = off;
        l->t[i].bytes = (uint64_t)tensor_numel(&l->t[i]) * esz;
        off += l->t[i].bytes;
    }
    uint64_t data_bytes = off;

    sbuf h = {0};
    sb_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < l->n; i++) {
        const tensor *t = &l->t[i];
        sb_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, bf16 ? "BF16" : "F32");
        if (t->conv) sb_printf(&h, "%lld,1,%lld", (long long)t->rows, (long long)t->cols);
        else if (t->cols) sb_printf(&h, "%lld,%lld", (long long)t->rows, (long long)t->cols);
        else sb_printf(&h, "%lld", (long long)t->rows);
        sb_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)t->offset,
                  (unsigned long long)(t->offset + t->bytes));
    }
    sb_printf(&h, "}");
    while ((8 + h.n) % 8 != 0) sb_printf(&h, " ");

    char *path = lm_path_join(dir, "model.safetensors"), *tmp = lm_path_join(dir, "model.safetensors.tmp");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        fprintf(stderr, "make_random_model: %s: %s\n", tmp, strerror(errno));
        free(path), free(tmp), free(h.p);
        return -1;
    }
    int rc = 0;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)h.n >> (8 * i)); /* little-endian u64 */
    rc = write_all(fd, len8, 8, tmp);
    if (rc == 0) rc = write_all(fd, h.p, h.n, tmp);

    /* Two buffers of buf_elems elements each: while the workers fill one
     * (sharing its pieces), this thread writes the other. */
    const int64_t buf_elems = 8 * (int64_t)nthreads * CHUNK;
    const size_t buf_bytes = (size_t)buf_elems * esz;
    uint8_t *bufs[2] = { lm_xaligned(buf_bytes), lm_xaligned(buf_bytes) };
    float **scratch = lm_xcalloc((size_t)nthreads, sizeof *scratch);
    for (int i = 0; i < nthreads; i++) scratch[i] = lm_xaligned((size_t)CHUNK * sizeof(float));
    /* a buffer's pieces: at most one a chunk, plus one a tensor that ends in it */
    const size_t max_pieces = (size_t)(buf_elems / CHUNK) + l->n + 1;
    piece *pieces = lm_xcalloc(max_pieces, sizeof *pieces);
    fill_job *jobs = lm_xcalloc((size_t)nthreads, sizeof *jobs);
    pthread_t *tids = lm_xcalloc((size_t)nthreads, sizeof *tids);
    bool *running = lm_xcalloc((size_t)nthreads, sizeof *running);

    double t0 = lm_now();
    uint64_t written = 0;
    int last_pct = -1, cur = 0;
    size_t pending = 0, ti = 0; /* bytes of bufs[cur ^ 1] still to write; the next tensor to fill */
    int64_t te = 0;             /* its next element */
    for (;;) {
        /* the next buffer's pieces, in file order */
        size_t np = 0;
        int64_t used = 0;
        while (ti < l->n) {
            const tensor *t = &l->t[ti];
            const int64_t n = LM_MIN(CHUNK, tensor_numel(t) - te); /* a whole chunk, or the tensor's last */
            if (used + n > buf_elems) break;                       /* pieces are never cut: the next buffer */
            LM_ASSERT(np < max_pieces);
            pieces[np++] = (piece){ .t = t, .first_elem = te, .n = n, .dst = bufs[cur] + (size_t)used * esz };
            used += n, te += n;
            if (te == tensor_numel(t)) ti++, te = 0;
        }
        for (int k = 0; k < nthreads; k++) {
            running[k] = false;
            if ((size_t)k >= np) continue;
            jobs[k] = (fill_job){ .pieces = pieces, .n_pieces = np, .first = (size_t)k, .stride = (size_t)nthreads,
                                  .seed = seed, .bf16 = bf16, .scratch = scratch[k] };
            if (pthread_create(&tids[k], NULL, fill_worker, &jobs[k]) == 0) running[k] = true;
            else fill_worker(&jobs[k]); /* no thread: do it here */
        }
        if (pending) {
            rc = write_all(fd, bufs[cur ^ 1], pending, tmp);
            written += pending;
        }
        for (int k = 0; k < nthreads; k++)
            if (running[k]) pthread_join(tids[k], NULL);
        if (rc != 0 || np == 0) break;
        pending = (size_t)used * esz;
        cur ^= 1;
        int pct = (int)(100.0 * (double)written / (double)(data_bytes ? data_bytes : 1));
        if (data_bytes > ((uint64_t)256 << 20) && pct / 10 != last_pct / 10 && isatty(2)) {
            fprintf(stderr, "\r  %3d%%  %.1f GB", pct, (double)written / 1e9);
            last_pct = pct;
        }
    }
    LM_ASSERT(rc != 0 || written == data_bytes);
    if (last_pct >= 0) fprintf(stderr, "\n");
    if (close(fd) != 0 && rc == 0) {
        fprintf(stderr, "make_random_model: %s: close: %s\n", tmp, strerror(errno));
        rc = -1;
    }
    if (rc == 0 && rename(tmp, path) != 0) {
        fprintf(stderr, "make_random_model: rename %s: %s\n", tmp, strerror(errno));
        rc = -1;
    }
    if (rc != 0) unlink(tmp);
    else {
        double dt = lm_now() - t0;
        fprintf(stderr, "make_random_model: %s: %zu tensors, %.3f GB in %.1f s (%.2f GB/s)\n", path, l->n,
                (double)(8 + h.n + data_bytes) / 1e9, dt, (double)data_bytes / 1e9 / (dt > 0 ? dt : 1e-9));
    }

    for (int i = 0; i < nthreads; i++) lm_afree(scratch[i]);
    free(scratch), free(pieces), free(jobs), free(tids), free(running);
    lm_afree(bufs[0]), lm_afree(bufs[1]);
    free(path), free(tmp), free(h.p);
    return rc;
}

/* ---- main ---------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f,
            "usage: make_random_model OUT_DIR --shape llama-3.2-1b|llama-3.1-8b|qwen3-8b|tiny|\n"
            "                                          qwen3-30b-a3b|qwen3-moe-tiny|\n"
            "                                          qwen3.5-0.8b|qwen3.5-2b|qwen3.5-9b|qwen3.5-27b|qwen3.5-tiny\n"
            "                         [--seed N] [--layers N] [--dtype bf16|f32]\n"
            "                         [--config-style hub|v5] [--threads N]\n"
            "Writes config.json, generation_config.json and model.safetensors with\n"
            "normal(0, 0.02) weights and unit norms, deterministic in --seed (default 0).\n"
            "Qwen3.5 shapes always write the transformers 5 config (layer_types, rope_parameters),\n"
            "and so do the Qwen3-MoE shapes (qwen3-30b-a3b, qwen3-moe-tiny: experts per layer).\n");
}

static bool parse_u64(const char *s, uint64_t *out) {
    if (!*s) return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end || s[0] == '-') return false;
    *out = v;
    return true;
}

int main(int argc, char **argv) {
    const char *out_dir = NULL, *shape_name = NULL, *dtype = "bf16", *style = "hub";
    uint64_t seed = 0, layers = 0, threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--shape") && has_val) {
            shape_name = argv[++i];
        } else if (!strcmp(a, "--dtype") && has_val) {
            dtype = argv[++i];
        } else if (!strcmp(a, "--config-style") && has_val) {
            style = argv[++i];
        } else if (!strcmp(a, "--seed") && has_val) {
            if (!parse_u64(argv[++i], &seed)) goto bad;
        } else if (!strcmp(a, "--layers") && has_val) {
            if (!parse_u64(argv[++i], &layers) || layers < 1 || layers > 1024) goto bad;
        } else if (!strcmp(a, "--threads") && has_val) {
            if (!parse_u64(argv[++i], &threads) || threads < 1 || threads > 256) goto bad;
        } else if (a[0] != '-' && !out_dir) {
            out_dir = a;
        } else {
            goto bad;
        }
        continue;
    bad:
        fprintf(stderr, "make_random_model: bad argument near '%s'\n", a);
        usage(stderr);
        return 2;
    }
    if (!out_dir || !shape_name) {
        usage(stderr);
        return 2;
    }
    const shape *sp = NULL;
    for (size_t i = 0; i < LM_COUNT(SHAPES); i++)
        if (!strcmp(SHAPES[i].name, shape_name)) sp = &SHAPES[i];
    if (!sp) {
        fprintf(stderr, "make_random_model: unknown shape '%s'\n", shape_name);
        usage(stderr);
        return 2;
    }
    bool bf16 = !strcmp(dtype, "bf16");
    if (!bf16 && strcmp(dtype, "f32")) {
        fprintf(stderr, "make_random_model: --dtype must be bf16 or f32\n");
        return 2;
    }
    bool v5 = !strcmp(style, "v5");
    if (!v5 && strcmp(style, "hub")) {
        fprintf(stderr, "make_random_model: --config-style must be hub or v5\n");
        return 2;
    }
    shape s = *sp;
    if (layers) s.layers = (int)layers;
    if (!threads) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        threads = nc > 0 ? (uint64_t)LM_MIN(nc, 32) : 1;
    }

    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "make_random_model: mkdir %s: %s\n", out_dir, strerror(errno));
        return 1;
    }

    int rc = 0;
    sbuf cfg = {0}, gen = {0};
    make_config(&cfg, &s, bf16, v5);
    make_generation_config(&gen, &s, v5);
    char *p1 = lm_path_join(out_dir, "config.json"), *p2 = lm_path_join(out_dir, "generation_config.json");
    if (write_text_file(p1, &cfg) != 0 || write_text_file(p2, &gen) != 0) rc = 1;

    tensor_list tl = {0};
    build_tensors(&tl, &s);
    init_sin_table();
    if (rc == 0 && write_safetensors(out_dir, &tl, bf16, seed, (int)threads) != 0) rc = 1;

    free(tl.t), free(cfg.p), free(gen.p), free(p1), free(p2);
    return rc;
}
