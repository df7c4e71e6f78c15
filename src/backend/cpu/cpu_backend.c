/* cpu_backend.c - the CPU backend: creation, memory, and the op table.
 *
 * Design: lm_cpu (cpu_impl.h) holds the kernel table picked for the ISA, the
 * thread pool and per-thread scratch; the ops live in cpu_matmul.c,
 * cpu_ops.c and cpu_attention.c and reach this state through be->impl.
 *
 * Memory: "backend memory" is ordinary host memory, 64-byte aligned and
 * zeroed. Large blocks (the KV pool, activations of long prompts) come from
 * mmap so that zeroing is free and untouched pages cost nothing; small ones
 * from posix_memalign. A 64-byte header in front of every block records which,
 * so free() needs no size. Weights are used in place (upload_weight only
 * points the tensor at the mapped file). */
#include "cpu_impl.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define LM_CPU_HDR 64
#define LM_CPU_MMAP_MIN ((size_t)1 << 20)
/* Below roughly this many flops an op runs on the caller alone: waking the
 * pool would cost more than it saves. */
#define LM_CPU_PAR_MIN 32768
#define LM_CPU_MAX_THREADS 1024

typedef struct lm_cpu_hdr {
    size_t map_bytes; /* > 0: mmapped block of this many bytes; 0: posix_memalign */
} lm_cpu_hdr;

/* ---- memory ------------------------------------------------------------ */

static void *lm_cpu_alloc(lm_backend *be, size_t bytes) {
    (void)be;
    if (bytes > SIZE_MAX - LM_CPU_HDR - 65536) return NULL;
    char *base;
    size_t map_bytes = 0;
    if (bytes >= LM_CPU_MMAP_MIN) {
        long pg = sysconf(_SC_PAGESIZE);
        size_t page = pg > 0 ? (size_t)pg : 4096;
        map_bytes = (bytes + LM_CPU_HDR + page - 1) / page * page;
        void *m = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return NULL;
        base = m; /* anonymous pages are zero */
    } else {
        void *p = NULL;
        if (posix_memalign(&p, 64, bytes + LM_CPU_HDR) != 0) return NULL;
        base = p;
        memset(base, 0, bytes + LM_CPU_HDR);
    }
    ((lm_cpu_hdr *)base)->map_bytes = map_bytes;
    return base + LM_CPU_HDR;
}

static void lm_cpu_free(lm_backend *be, void *p) {
    (void)be;
    if (!p) return;
    char *base = (char *)p - LM_CPU_HDR;
    size_t map_bytes = ((lm_cpu_hdr *)base)->map_bytes;
    if (map_bytes) munmap(base, map_bytes);
    else free(base);
}

static int lm_cpu_upload_weight(lm_backend *be, lm_tensor *t, const void *host_data, lm_err *e) {
    (void)be;
    if ((unsigned)t->type >= LM_DTYPE_COUNT || t->type == LM_I32)
        return lm_errf(e, "cpu backend: weight of type %s is not supported", lm_dtype_name(t->type));
    if (t->rows < 0 || t->cols < 0 || t->cols % lm_dtype_block(t->type) != 0)
        return lm_errf(e, "cpu backend: weight [%lld][%lld] of type %s: cols must be a multiple of %d",
                       (long long)t->rows, (long long)t->cols, lm_dtype_name(t->type),
                       lm_dtype_block(t->type));
    t->data = (void *)host_data; /* used in place: the caller keeps it mapped */
    return 0;
}

static void lm_cpu_read(lm_backend *be, void *host_dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memcpy(host_dst, src, bytes);
}

static void lm_cpu_write(lm_backend *be, void *dst, const void *host_src, size_t bytes) {
    (void)be;
    if (bytes) memcpy(dst, host_src, bytes);
}

/* ---- shared helpers for the op files ------------------------------------ */

void lm_cpu_reserve(lm_cpu *c, size_t bytes) {
    if (bytes <= c->scratch_bytes) return;
    bytes = (bytes + 4095) & ~(size_t)4095;
    for (int i = 0; i < c->n_threads; i++) {
        lm_afree(c->scratch[i]);
        c->scratch[i] = lm_xaligned(bytes);
    }
    c->scratch_bytes = bytes;
}

/* [0, n) is cut into a few contiguous chunks per thread, claimed through an
 * atomic counter: threads that start late (preempted, or woken from sleep)
 * find the work already taken instead of holding everyone up. */
#define LM_CPU_CHUNKS_PER_THREAD 4

typedef struct lm_cpu_pfor {
    lm_cpu_range_fn fn;
    void *ctx;
    int64_t n, n_chunks;
    atomic_llong next;
} lm_cpu_pfor;

static void lm_cpu_pfor_run(void *v, int ith, int nth) {
    (void)nth;
    lm_cpu_pfor *p = v;
    for (;;) {
        int64_t k = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (k >= p->n_chunks) break;
        int64_t i0 = p->n * k / p->n_chunks, i1 = p->n * (k + 1) / p->n_chunks;
        if (i0 < i1) p->fn(p->ctx, i0, i1, ith);
    }
}

void *lm_cpu_att_parts(lm_cpu *c, size_t bytes) {
    if (bytes > c->att_parts_bytes) {
        lm_afree(c->att_parts);
        c->att_parts_bytes = (bytes + 4095) & ~(size_t)4095;
        c->att_parts = lm_xaligned(c->att_parts_bytes);
    }
    return c->att_parts;
}

void lm_cpu_parallel_for(lm_cpu *c, int64_t n, int64_t cost, lm_cpu_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (c->n_threads == 1 || n == 1 || n * cost < LM_CPU_PAR_MIN) {
        fn(ctx, 0, n, 0);
        return;
    }
    lm_cpu_pfor p = { fn, ctx, n, LM_MIN(n, (int64_t)c->n_threads * LM_CPU_CHUNKS_PER_THREAD), 0 };
    atomic_init(&p.next, 0);
    lm_pool_run(c->pool, lm_cpu_pfor_run, &p);
}

/* ---- creation ------------------------------------------------------------ */

static void lm_cpu_destroy(lm_backend *be) {
    lm_cpu *c = lm_cpu_get(be);
    lm_pool_free(c->pool);
    for (int i = 0; i < c->n_threads; i++) lm_afree(c->scratch[i]);
    free(c->scratch);
    lm_afree(c->work);
    lm_afree(c->qx);
    lm_afree(c->att_parts);
    free(c->last_ids);
    free(c);
}

static void lm_cpu_clear(lm_backend *be, void *dst, size_t bytes) {
    (void)be;
    memset(dst, 0, bytes);
}

static void lm_cpu_copy(lm_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memmove(dst, src, bytes);
}

static void lm_cpu_argmax_rows_masked(lm_backend *be, int32_t *host_ids, const lm_tensor *x, const uint32_t *masks,
                                      const uint8_t *masked) {
    LM_ASSERT(x->type == LM_F32 && x->cols <= INT32_MAX);
    lm_cpu *c = lm_cpu_get(be);
    if (x->rows > c->cap_last_ids) {
        c->cap_last_ids = LM_MAX(x->rows, 2 * c->cap_last_ids);
        c->last_ids = lm_xrealloc(c->last_ids, (size_t)c->cap_last_ids * sizeof *c->last_ids);
    }
    const size_t words = (size_t)(x->cols + 31) / 32;
    for (int64_t r = 0; r < x->rows; r++) {
        const float *row = (const float *)x->data + r * x->cols;
        const int32_t id = masked && masked[r] ? lm_argmax_masked(row, (int)x->cols, masks + (size_t)r * words)
                                               : lm_argmax(row, (int)x->cols);
        host_ids[r] = c->last_ids[r] = id;
    }
    c->n_last_ids = x->rows;
}

static void lm_cpu_argmax_rows(lm_backend *be, int32_t *host_ids, const lm_tensor *x) {
    lm_cpu_argmax_rows_masked(be, host_ids, x, NULL, NULL);
}

/* The CPU computes in the caller's thread: the ids are there at once. */
static void lm_cpu_argmax_wait(lm_backend *be) { (void)be; }

static void lm_cpu_get_rows_argmax(lm_backend *be, lm_tensor *y, const lm_tensor *table) {
    const lm_cpu *c = lm_cpu_get(be);
    LM_ASSERT(c->n_last_ids == y->rows);
    lm_cpu_get_rows(be, y, table, c->last_ids);
}

static const struct lm_backend_ops lm_cpu_ops = {
    .alloc = lm_cpu_alloc,
    .free = lm_cpu_free,
    .upload_weight = lm_cpu_upload_weight,
    .read = lm_cpu_read,
    .write = lm_cpu_write,
    .clear = lm_cpu_clear,
    .copy = lm_cpu_copy,
    .matmul = lm_cpu_matmul,
    .matmul_n = lm_cpu_matmul_n,
    .matmul_glu = lm_cpu_matmul_glu,
    .rms_norm = lm_cpu_rms_norm,
    .rope = lm_cpu_rope,
    .silu_mul = lm_cpu_silu_mul,
    .add = lm_cpu_add,
    .scale = lm_cpu_scale,
    .get_rows = lm_cpu_get_rows,
    .gather_rows = lm_cpu_gather_rows,
    .gelu_mul = lm_cpu_gelu_mul,
    .softcap = lm_cpu_softcap,
    .copy_cols = lm_cpu_copy_cols,
    .kv_write = lm_cpu_kv_write,
    .attention = lm_cpu_attention,
    .moe = lm_cpu_moe,
    .state_out = true,
    .conv1d_state = lm_cpu_conv1d_state,
    .delta_gates = lm_cpu_delta_gates,
    .gated_delta = lm_cpu_gated_delta,
    .rms_norm_gated = lm_cpu_rms_norm_gated,
    .sigmoid_mul = lm_cpu_sigmoid_mul,
    .argmax_rows = lm_cpu_argmax_rows,
    .argmax_rows_later = lm_cpu_argmax_rows,
    .argmax_wait = lm_cpu_argmax_wait,
    .get_rows_argmax = lm_cpu_get_rows_argmax,
    .argmax_rows_masked_later = lm_cpu_argmax_rows_masked,
    .destroy = lm_cpu_destroy,
};

static const lm_cpu_kern *lm_cpu_kern_for(lm_cpu_isa isa) {
    switch (isa) {
    case LM_ISA_AVX512: return &lm_cpu_kern_avx512;
    case LM_ISA_AVX2: return &lm_cpu_kern_avx2;
    default: return &lm_cpu_kern_scalar;
    }
}

lm_backend *lm_cpu_backend_create(int n_threads, lm_cpu_isa isa, lm_err *e) {
    lm_cpu_isa best = lm_cpu_isa_detect();
    if (isa < LM_ISA_AUTO || isa > LM_ISA_AVX512) {
        lm_errf(e, "cpu backend: unknown instruction set %d", (int)isa);
        return NULL;
    }
    if (isa == LM_ISA_AUTO) isa = best;
    /* The enum is ordered scalar < avx2 < avx512, each a superset of the last. */
    if (isa > best) {
        lm_errf(e, "cpu backend: this CPU does not support %s (best available: %s)",
                lm_cpu_isa_name(isa), lm_cpu_isa_name(best));
        return NULL;
    }
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)LM_MIN(n, LM_CPU_MAX_THREADS) : 1;
    }
    if (n_threads > LM_CPU_MAX_THREADS) {
        lm_errf(e, "cpu backend: %d threads requested, at most %d supported", n_threads,
                LM_CPU_MAX_THREADS);
        return NULL;
    }
    lm_cpu *c = lm_xcalloc(1, sizeof *c);
    c->be.ops = &lm_cpu_ops;
    c->be.name = "cpu";
    c->be.impl = c;
    c->k = lm_cpu_kern_for(isa);
    c->qk_best = lm_cpu_qkern_for(isa);
    const char *exact = getenv("LUMEN_CPU_QUANT_EXACT");
    c->qk = exact && *exact && strcmp(exact, "0") != 0 ? NULL : c->qk_best;
    c->n_threads = n_threads;
    c->scratch = lm_xcalloc((size_t)n_threads, sizeof *c->scratch);
    c->pool = lm_pool_create(n_threads, e);
    if (!c->pool) {
        free(c->scratch);
        free(c);
        return NULL;
    }
    return &c->be;
}

bool lm_cpu_backend_quant_exact(lm_backend *be, bool exact) {
    be = lm_backend_base(be);
    LM_ASSERT(be && be->ops == &lm_cpu_ops);
    lm_cpu *c = be->impl;
    bool old = c->qk == NULL;
    c->qk = exact ? NULL : c->qk_best;
    return old;
}

int lm_cpu_backend_threads(const lm_backend *be) {
    be = lm_backend_base((lm_backend *)be);
    LM_ASSERT(be && be->ops == &lm_cpu_ops);
    return ((const lm_cpu *)be->impl)->n_threads;
}
