/* cuda_backend.cu - the CUDA backend: device setup, memory, staging of host
 * arrays, weight upload, and the op table.
 *
 * Design. One backend is one device, one non-blocking stream and one cuBLAS
 * handle bound to it. Every op enqueues on the stream and returns; read()
 * is the only call that waits (and lm_backend_sync). be->impl points at the
 * lm_cuda shared with the op files (cuda_internal.h); this file wraps it in
 * lm_cuda_ctx with what only it needs.
 *
 * Memory. alloc is cudaMalloc plus an async memset (stream-ordered: every
 * later op sees zeros); free is cudaFree, which waits for the device, so
 * memory a queued kernel still reads is never released under it. Weights are
 * copied at upload in their own type (f32, f16, bf16, and the GGUF block
 * types of lm_cuda_qtype, block for block), through two pinned
 * 8 MiB buffers used in turn so that reading the mmapped file overlaps the
 * DMA; the backend owns them and frees them at destroy (models never free
 * weights: on the CPU they are the mapped file).
 *
 * Staging (lm_cuda_stage). Ops take small host arrays (positions, ids, rope
 * frequencies, block tables). Each is memcpy'd into a pinned host ring and
 * copied with cudaMemcpyAsync into the same offset of a device ring, in
 * stream order, so no op waits for the host. Two hazards:
 *  - device side: a later copy that overwrites ring bytes is enqueued after
 *    every kernel that read them (one stream), so kernels always see their
 *    own data. Only data staged and then held across a whole lap of the ring
 *    could be lost; the ring (64 MiB) is far larger than one forward's
 *    host arrays, and any single request above a quarter of it grows it.
 *  - host side: the CPU writes the pinned ring now, while a copy queued
 *    earlier may not yet have read its source. The ring is cut into 8
 *    segments; when the write head leaves a segment an event is recorded
 *    after the copies from it, and before the head enters a segment again it
 *    waits for that segment's event. In steady state the GPU is far less than
 *    7/8 of a ring behind, so the wait costs nothing.
 * Growing: the old rings are retired, not freed (a caller may still hold a
 * pointer staged earlier in the same op); they are freed at destroy.
 *
 * Scratch (lm_cuda_scratch, lm_cuda_matmul_ws, lm_cuda_dequant_ws): grow-only device buffers;
 * growing waits for the stream, then reallocates, so the decode hot path
 * never allocates once warmed up. */
#include "cuda_internal.h"

__thread int lm_cuda_current_device = -1;

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LM_CUDA_STAGE_BYTES ((size_t)64 << 20)
#define LM_CUDA_STAGE_SEGS 8
#define LM_CUDA_STAGE_ALIGN 256
#define LM_CUDA_UPLOAD_CHUNK ((size_t)8 << 20)
#define LM_CUDA_BLAS_WS ((size_t)32 << 20)
#define LM_MIB(b) ((double)(b) / (1024.0 * 1024.0))

typedef struct lm_cuda_ctx {
    lm_cuda c; /* first: be.impl points here */
    lm_backend be;
    cudaEvent_t seg_ev[LM_CUDA_STAGE_SEGS];
    int seg_cur; /* segment holding the last staged byte */
    /* retired staging rings (host, device pairs), freed at destroy */
    void **retired;
    int n_retired;
    /* uploaded weights, owned here */
    void **weights;
    size_t n_weights, cap_weights;
    unsigned char *up_host[2]; /* pinned upload buffers, LM_CUDA_UPLOAD_CHUNK each (lazy) */
    cudaEvent_t up_ev[2];
    void *mm_ws; /* lm_cuda_matmul_ws */
    void *blas_ws; /* cuBLAS's workspace, fixed so that captured GEMMs can replay */
    size_t mm_ws_cap;
    void *deq_ws; /* lm_cuda_dequant_ws */
    size_t deq_ws_cap;
    unsigned char *rd_host; /* pinned landing area of read_n (lazy) */
    size_t rd_cap;
    char dev_name[256];
} lm_cuda_ctx;

static lm_cuda_ctx *lm_cuda_ctx_of(lm_backend *be) { return (lm_cuda_ctx *)be->impl; }
static lm_cuda_ctx *lm_cuda_ctx_c(lm_cuda *c) { return (lm_cuda_ctx *)c; }

/* ---- failures ------------------------------------------------------------ */

void lm_cuda_check_fail(cudaError_t err, const char *what, const char *file, int line) {
    fprintf(stderr, "lumen: CUDA error at %s:%d: %s: %s (%s)\n", file, line, what, cudaGetErrorString(err),
            cudaGetErrorName(err));
    fflush(stderr);
    abort();
}

static const char *lm_cublas_status_name(int s) {
    switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
    }
}

void lm_cuda_blas_fail(int status, const char *what, const char *file, int line) {
    fprintf(stderr, "lumen: cuBLAS error at %s:%d: %s: %s (%d)\n", file, line, what, lm_cublas_status_name(status),
            status);
    fflush(stderr);
    abort();
}

/* ---- availability ---------------------------------------------------------- */

/* Fills why with a readable reason; never aborts (no driver, no device, a
 * too-old GPU are all ordinary answers). */
static bool lm_cuda_probe(int device, char *why, size_t n, char *name, size_t name_n) {
    char tmp[8];
    if (!why || n == 0) {
        why = tmp;
        n = sizeof tmp;
    }
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        const char *hint = err == cudaErrorInsufficientDriver ? " (no NVIDIA driver is loaded, or it is older than this CUDA runtime)"
                           : err == cudaErrorNoDevice        ? " (no CUDA-capable GPU is visible; check CUDA_VISIBLE_DEVICES)"
                                                             : "";
        snprintf(why, n, "no usable CUDA GPU: %s%s", cudaGetErrorString(err), hint);
        return false;
    }
    if (count <= 0) {
        snprintf(why, n, "no usable CUDA GPU: the driver reports no devices");
        return false;
    }
    if (device < 0 || device >= count) {
        snprintf(why, n, "CUDA device %d does not exist (%d device%s: 0..%d)", device, count, count == 1 ? "" : "s",
                 count - 1);
        return false;
    }
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
        err = cudaGetLastError();
        snprintf(why, n, "CUDA device %d: cannot read its compute capability: %s", device, cudaGetErrorString(err));
        return false;
    }
    cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(prop.name, sizeof prop.name, "device %d", device);
    }
    if (name) snprintf(name, name_n, "%s", prop.name);
    if (major < 8) {
        snprintf(why, n, "CUDA device %d (%s) has compute capability %d.%d; lumen's kernels need 8.0 (Ampere) or newer",
                 device, prop.name, major, minor);
        return false;
    }
    snprintf(why, n, "%d CUDA device%s; device %d: %s (compute %d.%d)", count, count == 1 ? "" : "s", device,
             prop.name, major, minor);
    return true;
}

bool lm_cuda_available(char *why, size_t n) { return lm_cuda_probe(0, why, n, NULL, 0); }

/* The CUDA backend under any wrappers of be, or NULL for another backend. */
static lm_cuda *lm_cuda_under(lm_backend *be) {
    be = lm_backend_base(be);
    return be && !strcmp(be->name, "cuda") ? lm_cuda_of(be) : NULL;
}

bool lm_cuda_backend_bf16_act(lm_backend *be, bool on) {
    lm_cuda *c = lm_cuda_under(be);
    if (!c) return false;
    const bool old = c->gemm_mode == LM_CUDA_GEMM_BF16;
    c->gemm_mode = on ? LM_CUDA_GEMM_BF16 : LM_CUDA_GEMM_SPLIT;
    return old;
}

bool lm_cuda_backend_quant_exact(lm_backend *be, bool exact) {
    lm_cuda *c = lm_cuda_under(be);
    if (!c) return false;
    const bool old = c->quant_exact;
    c->quant_exact = exact;
    return old;
}

bool lm_cuda_backend_qstaged(lm_backend *be, bool on) {
    lm_cuda *c = lm_cuda_under(be);
    if (!c) return false;
    const bool old = c->qstaged;
    c->qstaged = on && c->qstaged_ok;
    return old;
}

/* ---- memory ------------------------------------------------------------------ */

static void *lm_cuda_alloc(lm_backend *be, size_t bytes) {
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_use(c);
    lm_cuda_graph_abandon(c); /* a new buffer: the pass's pointers change */
    size_t b = bytes ? bytes : 1;
    void *p = NULL;
    if (cudaMalloc(&p, b) != cudaSuccess) {
        (void)cudaGetLastError(); /* out of memory is not sticky: clear it */
        return NULL;
    }
    LM_CUDA_CHECK(cudaMemsetAsync(p, 0, b, c->stream));
    return p;
}

static void lm_cuda_free(lm_backend *be, void *p) {
    if (!p) return;
    lm_cuda_ctx *x = lm_cuda_ctx_of(be);
    lm_cuda_use(&x->c);
    lm_cuda_graph_abandon(&x->c);
    for (size_t i = 0; i < x->n_weights; i++)
        if (x->weights[i] == p) {
            x->weights[i] = x->weights[--x->n_weights];
            break;
        }
    LM_CUDA_CHECK(cudaFree(p)); /* synchronises the device: queued readers finish first */
}

static void lm_cuda_read(lm_backend *be, void *host_dst, const void *src, size_t bytes) {
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_use(c);
    if (c->gmode != LM_G_OFF) { /* the forward's output: after the graph */
        lm_cuda_graph_defer_read(c, host_dst, src, bytes, -1);
        return;
    }
    if (bytes) LM_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    LM_CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

/* The copies land in one pinned buffer, queued back to back, and the host
 * waits once; then they are spread into the callers' buffers. Inside a
 * capture, or when no pinned memory can be had, they are plain reads. */
static void lm_cuda_read_n(lm_backend *be, int n, void *const *host_dst, const void *const *src,
                           const size_t *bytes) {
    lm_cuda_ctx *x = lm_cuda_ctx_of(be);
    lm_cuda *c = &x->c;
    lm_cuda_use(c);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += bytes[i];
    if (c->gmode == LM_G_OFF && total > x->rd_cap) {
        if (x->rd_host) LM_CUDA_CHECK(cudaFreeHost(x->rd_host));
        x->rd_cap = 0;
        if (cudaMallocHost((void **)&x->rd_host, total) == cudaSuccess) x->rd_cap = total;
        else x->rd_host = NULL, (void)cudaGetLastError();
    }
    if (c->gmode != LM_G_OFF || total > x->rd_cap) {
        for (int i = 0; i < n; i++) lm_cuda_read(be, host_dst[i], src[i], bytes[i]);
        return;
    }
    size_t off = 0;
    for (int i = 0; i < n; off += bytes[i++])
        if (bytes[i]) LM_CUDA_CHECK(cudaMemcpyAsync(x->rd_host + off, src[i], bytes[i], cudaMemcpyDeviceToHost, c->stream));
    LM_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    off = 0;
    for (int i = 0; i < n; off += bytes[i++]) memcpy(host_dst[i], x->rd_host + off, bytes[i]);
}

/* Pageable source: the runtime has consumed host_src when this returns (it
 * stages through its own pinned buffer), so the caller may reuse it. */
static void lm_cuda_write(lm_backend *be, void *dst, const void *host_src, size_t bytes) {
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_use(c);
    if (c->gmode != LM_G_OFF) { /* not in a graph: the eager rerun writes */
        lm_cuda_graph_abandon(c);
        return;
    }
    if (bytes) LM_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, c->stream));
}

static void lm_cuda_clear(lm_backend *be, void *dst, size_t bytes) {
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_use(c);
    lm_cuda_memset(c, dst, 0, bytes);
}

void lm_cuda_memset(lm_cuda *c, void *p, int v, size_t bytes) {
    struct {
        void *p;
        int64_t v;
        uint64_t n;
    } d = { p, v, bytes };
    if (bytes && lm_cuda_gate(c, &d, sizeof d)) LM_CUDA_CHECK(cudaMemsetAsync(p, v, bytes, c->stream));
}

void lm_cuda_memcpy_d2d(lm_cuda *c, void *dst, const void *src, size_t bytes) {
    struct {
        void *d;
        const void *s;
        uint64_t n;
    } d = { dst, src, bytes };
    if (bytes && lm_cuda_gate(c, &d, sizeof d))
        LM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
}

/* memmove semantics, as the CPU backend: overlapping ranges go through a
 * stream-ordered temporary (rare; models copy between distinct buffers). */
static void lm_cuda_copy(lm_backend *be, void *dst, const void *src, size_t bytes) {
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_use(c);
    if (!bytes || dst == src) return;
    const char *d = (const char *)dst, *s = (const char *)src;
    if (d < s + bytes && s < d + bytes) {
        lm_cuda_graph_abandon(c); /* rare; a temporary buffer */
        if (c->gmode != LM_G_OFF) return;
        void *tmp = NULL;
        LM_CUDA_CHECK(cudaMallocAsync(&tmp, bytes, c->stream));
        LM_CUDA_CHECK(cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
        LM_CUDA_CHECK(cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, c->stream));
        LM_CUDA_CHECK(cudaFreeAsync(tmp, c->stream));
        return;
    }
    lm_cuda_memcpy_d2d(c, dst, src, bytes);
}

static size_t lm_cuda_elt_bytes(lm_dtype t) {
    switch (t) {
    case LM_F32: return 4;
    case LM_F16:
    case LM_BF16: return 2;
    default: return 0;
    }
}

/* The bytes of weight t on the GPU (its stored bytes: quantised blocks stay
 * blocks), or 0 with e set when its type or shape cannot be uploaded. */
static size_t lm_cuda_weight_bytes(const lm_tensor *t, lm_err *e) {
    const bool known = (unsigned)t->type < LM_DTYPE_COUNT;
    const bool quant = known && lm_cuda_qtype(t->type);
    size_t elt = known ? lm_cuda_elt_bytes(t->type) : 0;
    if (!elt && !quant) {
        lm_errf(e,
                "cuda backend: weight [%lld][%lld] has type %s, which the GPU kernels do not support "
                "(supported: f32, f16, bf16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, FP8_B128, "
                "A4_BF16, A4_F16, A8_BF16, A8_F16; "
                "others run on the CPU backend)",
                (long long)t->rows, (long long)t->cols, known ? lm_dtype_name(t->type) : "unknown");
        return 0;
    }
    const int64_t blk = quant ? lm_dtype_block(t->type) : 1;
    if (t->rows < 0 || t->cols < 0 || t->cols % blk != 0) {
        lm_errf(e, "cuda backend: weight [%lld][%lld] %s has an invalid shape", (long long)t->rows,
                (long long)t->cols, lm_dtype_name(t->type));
        return 0;
    }
    const size_t row = quant ? lm_dtype_row_bytes(t->type, t->cols) : (size_t)t->cols * elt;
    if (row > 0 && (uint64_t)t->rows > SIZE_MAX / row) {
        lm_errf(e, "cuda backend: weight [%lld][%lld] has an invalid shape", (long long)t->rows, (long long)t->cols);
        return 0;
    }
    size_t bytes = (size_t)t->rows * row;
    return bytes ? bytes : 1;
}

/* Bytes allocated past a quantised weight's last block: the decoders
 * (cuda_quant.h) read whole aligned words, up to 3 bytes past a 2-byte
 * aligned field; the pad keeps those reads inside the allocation. */
#define LM_CUDA_QUANT_PAD 16

/* Device memory for weights (freed at destroy), or NULL with e set naming
 * what does not fit. */
static void *lm_cuda_weight_alloc(lm_cuda_ctx *x, size_t bytes, const lm_tensor *t, int n, lm_err *e) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        size_t fr = 0, tot = 0;
        if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) (void)cudaGetLastError();
        lm_errf(e, "out of GPU memory: %s ([%lld][%lld] %s%s) needs %.1f MiB, %.1f MiB free of %.1f MiB",
                n > 1 ? "these weights" : "this weight", (long long)t->rows, (long long)t->cols,
                lm_dtype_name(t->type), n > 1 ? " and the others of its group" : "", LM_MIB(bytes), LM_MIB(fr),
                LM_MIB(tot));
        return NULL;
    }
    if (x->n_weights == x->cap_weights) {
        x->cap_weights = x->cap_weights ? 2 * x->cap_weights : 256;
        x->weights = (void **)lm_xrealloc(x->weights, x->cap_weights * sizeof *x->weights);
    }
    x->weights[x->n_weights++] = d;
    return d;
}

/* Copies bytes of host weights to d. Two pinned buffers in turn: memcpy
 * from the (mmapped) source into one while the DMA of the other runs. Falls
 * back to a plain copy if pinned memory cannot be had. */
static void lm_cuda_weight_copy(lm_cuda_ctx *x, void *d, const void *host_data, size_t bytes) {
    lm_cuda *c = &x->c;
    if (!x->up_host[0] && bytes > 0) {
        for (int i = 0; i < 2; i++)
            if (cudaMallocHost((void **)&x->up_host[i], LM_CUDA_UPLOAD_CHUNK) != cudaSuccess) {
                (void)cudaGetLastError();
                x->up_host[i] = NULL;
            }
        if (!x->up_host[0] || !x->up_host[1]) {
            for (int i = 0; i < 2; i++)
                if (x->up_host[i]) LM_CUDA_CHECK(cudaFreeHost(x->up_host[i]));
            x->up_host[0] = x->up_host[1] = NULL;
        }
    }
    const unsigned char *src = (const unsigned char *)host_data;
    if (!x->up_host[0]) {
        if (bytes) LM_CUDA_CHECK(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice));
        return;
    }
    int i = 0;
    for (size_t off = 0; off < bytes; off += LM_CUDA_UPLOAD_CHUNK, i ^= 1) {
        size_t n = LM_MIN(LM_CUDA_UPLOAD_CHUNK, bytes - off);
        LM_CUDA_CHECK(cudaEventSynchronize(x->up_ev[i])); /* its previous DMA has read it */
        memcpy(x->up_host[i], src + off, n);
        LM_CUDA_CHECK(cudaMemcpyAsync((unsigned char *)d + off, x->up_host[i], n, cudaMemcpyHostToDevice, c->stream));
        LM_CUDA_CHECK(cudaEventRecord(x->up_ev[i], c->stream));
    }
}

static int lm_cuda_upload_weight(lm_backend *be, lm_tensor *t, const void *host_data, lm_err *e) {
    lm_cuda_ctx *x = lm_cuda_ctx_of(be);
    size_t bytes = lm_cuda_weight_bytes(t, e);
    if (!bytes) return -1;
    lm_cuda_use(&x->c);
    LM_ASSERT(x->c.gmode == LM_G_OFF); /* weights load outside forwards */
    void *d = lm_cuda_weight_alloc(x, bytes + (lm_cuda_qtype(t->type) ? LM_CUDA_QUANT_PAD : 0), t, 1, e);
    if (!d) return -1;
    lm_cuda_weight_copy(x, d, host_data, bytes);
    t->data = d;
    return 0;
}

/* Weights of one type whose sizes keep 256-byte alignment go back to back
 * in one allocation, so that a product of more than LM_GEMV_MAX_T tokens
 * covers them in one GEMM (lm_cuda_matmul_n, lm_cuda_matmul_glu: cuBLAS
 * fills the GPU far better with the 6,144 rows of a Llama-8B q/k/v than
 * with 4,096 and twice 1,024). Others are uploaded one by one. */
static int lm_cuda_upload_weights(lm_backend *be, int n, lm_tensor *const *t, const void *const *host, lm_err *e) {
    lm_cuda_ctx *x = lm_cuda_ctx_of(be);
    size_t total = 0;
    bool together = n > 1;
    for (int i = 0; i < n; i++) {
        size_t bytes = lm_cuda_weight_bytes(t[i], e);
        if (!bytes) return -1;
        together = together && t[i]->type == t[0]->type && bytes % 256 == 0;
        total += bytes;
    }
    if (!together) {
        for (int i = 0; i < n; i++)
            if (lm_cuda_upload_weight(be, t[i], host[i], e)) return -1;
        return 0;
    }
    lm_cuda_use(&x->c);
    LM_ASSERT(x->c.gmode == LM_G_OFF);
    unsigned char *d =
        (unsigned char *)lm_cuda_weight_alloc(x, total + (lm_cuda_qtype(t[0]->type) ? LM_CUDA_QUANT_PAD : 0), t[0], n, e);
    if (!d) return -1;
    for (int i = 0; i < n; i++) {
        size_t bytes = lm_cuda_weight_bytes(t[i], e);
        lm_cuda_weight_copy(x, d, host[i], bytes);
        t[i]->data = d;
        d += bytes;
    }
    return 0;
}

/* ---- staging ------------------------------------------------------------------ */

static size_t lm_align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* Replaces both rings by ones of at least `need` bytes; the old ones are kept
 * until destroy (see the design note). Aborts if memory cannot be had: ops
 * have no error return, and this is at most a few MiB beyond the last size. */
static void lm_cuda_stage_grow(lm_cuda_ctx *x, size_t need) {
    lm_cuda *c = &x->c;
    size_t cap = c->stage_cap ? c->stage_cap : LM_CUDA_STAGE_BYTES;
    while (cap < need) cap *= 2;
    /* Wait for every copy out of the old pinned ring and every event on it:
     * the new ring starts with fresh segments. */
    LM_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    x->retired = (void **)lm_xrealloc(x->retired, (size_t)(x->n_retired + 2) * sizeof *x->retired);
    x->retired[x->n_retired++] = c->stage_host;
    x->retired[x->n_retired++] = c->stage_dev;
    c->stage_host = NULL;
    c->stage_dev = NULL;
    LM_CUDA_CHECK(cudaMallocHost((void **)&c->stage_host, cap));
    LM_CUDA_CHECK(cudaMalloc((void **)&c->stage_dev, cap));
    c->stage_cap = cap;
    c->stage_used = 0;
    x->seg_cur = 0;
}

void *lm_cuda_stage(lm_cuda *c, const void *host, size_t bytes) {
    lm_cuda_ctx *x = lm_cuda_ctx_c(c);
    if (bytes == 0) return c->stage_dev; /* a valid pointer that nothing reads */
    if (c->gmode != LM_G_OFF) return lm_cuda_graph_stage(c, host, bytes);
    size_t a = lm_align_up(bytes, LM_CUDA_STAGE_ALIGN);
    if (a > c->stage_cap / 4) lm_cuda_stage_grow(x, 4 * a);
    size_t seg = c->stage_cap / LM_CUDA_STAGE_SEGS;
    size_t off = lm_align_up(c->stage_used, LM_CUDA_STAGE_ALIGN);
    if (off + a > c->stage_cap) off = 0; /* wrap */
    int first = (int)(off / seg), last = (int)((off + a - 1) / seg);
    /* Host side: segments entered anew must have had their previous lap's
     * copies done (an event never recorded counts as done). */
    for (int s = first; s <= last; s++)
        if (s != x->seg_cur) LM_CUDA_CHECK(cudaEventSynchronize(x->seg_ev[s]));
    memcpy(c->stage_host + off, host, bytes);
    LM_CUDA_CHECK(cudaMemcpyAsync(c->stage_dev + off, c->stage_host + off, bytes, cudaMemcpyHostToDevice, c->stream));
    /* Segments the head has now left: mark them with an event after this copy. */
    if (x->seg_cur < first || x->seg_cur > last) LM_CUDA_CHECK(cudaEventRecord(x->seg_ev[x->seg_cur], c->stream));
    for (int s = first; s < last; s++) LM_CUDA_CHECK(cudaEventRecord(x->seg_ev[s], c->stream));
    x->seg_cur = last;
    c->stage_used = off + a;
    return c->stage_dev + off;
}

/* ---- scratch --------------------------------------------------------------------- */

static void *lm_cuda_grow_buf(lm_cuda *c, void **buf, size_t *cap, size_t bytes, const char *what) {
    if (bytes <= *cap && *buf) return *buf;
    if (c->gmode == LM_G_CAPTURE) lm_cuda_graph_abandon(c); /* no synchronising while capturing */
    size_t want = lm_align_up(LM_MAX(bytes, *cap + *cap / 2), (size_t)1 << 20);
    LM_CUDA_CHECK(cudaStreamSynchronize(c->stream)); /* queued kernels may still use the old one */
    if (*buf) LM_CUDA_CHECK(cudaFree(*buf));
    *buf = NULL;
    *cap = 0;
    if (cudaMalloc(buf, want) != cudaSuccess) {
        size_t fr = 0, tot = 0;
        (void)cudaGetLastError();
        if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) (void)cudaGetLastError();
        fprintf(stderr, "lumen: out of GPU memory for %s: %.1f MiB needed, %.1f MiB free of %.1f MiB\n", what,
                LM_MIB(want), LM_MIB(fr), LM_MIB(tot));
        fflush(stderr);
        abort();
    }
    *cap = want;
    return *buf;
}

void *lm_cuda_scratch(lm_cuda *c, size_t bytes) {
    return lm_cuda_grow_buf(c, &c->scratch, &c->scratch_cap, bytes, "op scratch");
}

void *lm_cuda_matmul_ws(lm_cuda *c, size_t bytes) {
    lm_cuda_ctx *x = lm_cuda_ctx_c(c);
    return lm_cuda_grow_buf(c, &x->mm_ws, &x->mm_ws_cap, bytes, "matmul workspace");
}

void *lm_cuda_dequant_ws(lm_cuda *c, size_t bytes) {
    lm_cuda_ctx *x = lm_cuda_ctx_c(c);
    return lm_cuda_grow_buf(c, &x->deq_ws, &x->deq_ws_cap, bytes, "dequantised weights");
}

/* ---- creation ------------------------------------------------------------------- */

/* Tears down whatever create got to; safe on a partly built context. Errors
 * here are ignored (the device may be the reason we are tearing down). */
static void lm_cuda_release(lm_cuda_ctx *x) {
    lm_cuda *c = &x->c;
    if (cudaSetDevice(c->device) == cudaSuccess) lm_cuda_current_device = c->device;
    if (c->stream) (void)cudaStreamSynchronize(c->stream);
    lm_cuda_graphs_free(c);
    free(c->att_memo);
    for (size_t i = 0; i < x->n_weights; i++) (void)cudaFree(x->weights[i]);
    free(x->weights);
    for (int i = 0; i < x->n_retired; i += 2) {
        if (x->retired[i]) (void)cudaFreeHost(x->retired[i]);
        if (x->retired[i + 1]) (void)cudaFree(x->retired[i + 1]);
    }
    free(x->retired);
    if (c->stage_host) (void)cudaFreeHost(c->stage_host);
    if (x->rd_host) (void)cudaFreeHost(x->rd_host);
    if (c->stage_dev) (void)cudaFree(c->stage_dev);
    if (c->scratch) (void)cudaFree(c->scratch);
    if (c->counters) (void)cudaFree(c->counters);
    if (c->ids_dev) (void)cudaFree(c->ids_dev);
    for (int i = 0; i < LM_CUDA_LATER; i++) {
        if (c->later[i].pinned) (void)cudaFreeHost(c->later[i].pinned);
        if (c->later[i].mask_pinned) (void)cudaFreeHost(c->later[i].mask_pinned);
        if (c->later[i].ev) (void)cudaEventDestroy(c->later[i].ev);
    }
    for (int i = 0; i < LM_CUDA_FREQ_SLOTS; i++) {
        if (c->freq[i].dev) (void)cudaFree(c->freq[i].dev);
        free(c->freq[i].host);
    }
    if (x->mm_ws) (void)cudaFree(x->mm_ws);
    if (x->deq_ws) (void)cudaFree(x->deq_ws);
    if (x->blas_ws) (void)cudaFree(x->blas_ws);
    for (int i = 0; i < 2; i++) {
        if (x->up_host[i]) (void)cudaFreeHost(x->up_host[i]);
        if (x->up_ev[i]) (void)cudaEventDestroy(x->up_ev[i]);
    }
    for (int i = 0; i < LM_CUDA_STAGE_SEGS; i++)
        if (x->seg_ev[i]) (void)cudaEventDestroy(x->seg_ev[i]);
    if (c->blas) (void)cublasDestroy(c->blas);
    if (c->stream) (void)cudaStreamDestroy(c->stream);
    (void)cudaGetLastError();
    free(x);
}

static void lm_cuda_destroy(lm_backend *be) { lm_cuda_release(lm_cuda_ctx_of(be)); }

static const struct lm_backend_ops lm_cuda_ops = {
    /* .alloc = */ lm_cuda_alloc,
    /* .free = */ lm_cuda_free,
    /* .upload_weight = */ lm_cuda_upload_weight,
    /* .upload_weights = */ lm_cuda_upload_weights,
    /* .read = */ lm_cuda_read,
    /* .write = */ lm_cuda_write,
    /* .read_n = */ lm_cuda_read_n,
    /* .clear = */ lm_cuda_clear,
    /* .copy = */ lm_cuda_copy,
    /* .matmul = */ lm_cuda_matmul,
    /* .rms_norm = */ lm_cuda_rms_norm,
    /* .rope = */ lm_cuda_rope,
    /* .silu_mul = */ lm_cuda_silu_mul,
    /* .add = */ lm_cuda_add,
    /* .scale = */ lm_cuda_scale,
    /* .get_rows = */ lm_cuda_get_rows,
    /* .gather_rows = */ lm_cuda_gather_rows,
    /* .gelu_mul = */ lm_cuda_gelu_mul,
    /* .softcap = */ lm_cuda_softcap,
    /* .copy_cols = */ lm_cuda_copy_cols,
    /* .kv_write = */ lm_cuda_kv_write,
    /* .attention = */ lm_cuda_attention,
    /* .moe = */ lm_cuda_moe,
    /* .state_out = */ false, /* speculation rolls back by replay here (lm_spec.h) */
    /* .conv1d_state = */ lm_cuda_conv1d_state,
    /* .delta_gates = */ lm_cuda_delta_gates,
    /* .gated_delta = */ lm_cuda_gated_delta,
    /* .rms_norm_gated = */ lm_cuda_rms_norm_gated,
    /* .sigmoid_mul = */ lm_cuda_sigmoid_mul,
    /* .argmax_rows = */ lm_cuda_argmax_rows,
    /* .argmax_rows_later = */ lm_cuda_argmax_rows_later,
    /* .argmax_wait = */ lm_cuda_argmax_wait,
    /* .get_rows_argmax = */ lm_cuda_get_rows_argmax,
    /* .argmax_rows_masked_later = */ lm_cuda_argmax_rows_masked_later,
    /* .matmul_n = */ lm_cuda_matmul_n,
    /* .matmul_glu = */ lm_cuda_matmul_glu,
    /* .matmul_add = */ lm_cuda_matmul_add,
    /* .rope_kv_write = */ lm_cuda_rope_kv_write,
    /* .norm_rope_kv_write = */ lm_cuda_norm_rope_kv_write,
    /* .gated_delta_gates = */ lm_cuda_gated_delta_gates,
    /* .moe_add = */ lm_cuda_moe_add,
    /* .graph_begin = */ lm_cuda_graph_begin,
    /* .graph_end = */ lm_cuda_graph_end,
    /* .destroy = */ lm_cuda_destroy,
};

/* The table without the optional fused forms (LUMEN_CUDA_FUSED=0, which
 * also keeps the decode attention's split merge a kernel of its own): the
 * models then compose them from the plain ops, for measuring what fusion
 * gains and for telling a fused kernel's fault from the rest. */
static const struct lm_backend_ops *lm_cuda_ops_unfused(void) {
    static const struct lm_backend_ops t = [] {
        struct lm_backend_ops o = lm_cuda_ops;
        o.matmul_n = NULL, o.matmul_glu = NULL, o.matmul_add = NULL, o.rope_kv_write = NULL;
        o.norm_rope_kv_write = NULL, o.gated_delta_gates = NULL, o.moe_add = NULL;
        return o;
    }();
    return &t;
}

static bool lm_is_cuda(const lm_backend *be) {
    return be && (be->ops == &lm_cuda_ops || be->ops == lm_cuda_ops_unfused());
}

#define LM_CUDA_TRY(call)                                                                                  \
    do {                                                                                                   \
        cudaError_t err_ = (call);                                                                         \
        if (err_ != cudaSuccess) {                                                                         \
            (void)cudaGetLastError();                                                                      \
            lm_errf(e, "cuda backend: device %d (%s): %s failed: %s", device, x->dev_name, #call,          \
                    cudaGetErrorString(err_));                                                             \
            goto fail;                                                                                     \
        }                                                                                                  \
    } while (0)

/* LUMEN_CUDA_SKIP's names, in LM_SKIP_* bit order. */
static const char *const lm_cuda_skip_names[] = { "attention", "rope_kv", "norm", "gemv_n", "gemv_glu", "gemv_add",
                                                  "gemv_down", "norm_tail", "conv", "gates", "delta_rule", "gnorm",
                                                  "gemm", "gemm_split" };

static unsigned lm_cuda_skip_parse(const char *v) {
    unsigned m = 0;
    for (const char *p = v; p && *p;) {
        const char *end = strchr(p, ',');
        const size_t n = end ? (size_t)(end - p) : strlen(p);
        bool known = false;
        for (size_t i = 0; i < sizeof lm_cuda_skip_names / sizeof *lm_cuda_skip_names; i++)
            if (strlen(lm_cuda_skip_names[i]) == n && !strncmp(p, lm_cuda_skip_names[i], n)) m |= 1u << i, known = true;
        if (!known && n) fprintf(stderr, "lumen: LUMEN_CUDA_SKIP: unknown kind '%.*s' ignored\n", (int)n, p);
        p = end ? end + 1 : NULL;
    }
    if (m) fprintf(stderr, "lumen: LUMEN_CUDA_SKIP=%s: those kernels are left out, every output is wrong (timing only)\n", v);
    return m;
}

lm_backend *lm_cuda_backend_create(int device, lm_err *e) {
    char why[512];
    char name[256] = "";
    if (!lm_cuda_probe(device, why, sizeof why, name, sizeof name)) {
        lm_errf(e, "cuda backend: %s", why);
        return NULL;
    }
    lm_cuda_ctx *x = (lm_cuda_ctx *)lm_xcalloc(1, sizeof *x);
    lm_cuda *c = &x->c;
    snprintf(x->dev_name, sizeof x->dev_name, "%s", name);
    c->device = device;
    c->fused = lm_cuda_env_flag("LUMEN_CUDA_FUSED", true);
    c->skip = lm_cuda_skip_parse(getenv("LUMEN_CUDA_SKIP"));
    x->be.ops = c->fused ? &lm_cuda_ops : lm_cuda_ops_unfused();
    x->be.name = "cuda";
    x->be.impl = c;
    {
        LM_CUDA_TRY(cudaSetDevice(device));
        lm_cuda_current_device = device;
        LM_CUDA_TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
        cublasStatus_t bs = cublasCreate(&c->blas);
        if (bs != CUBLAS_STATUS_SUCCESS) {
            c->blas = NULL;
            lm_errf(e, "cuda backend: device %d (%s): cuBLAS initialisation failed: %s", device, x->dev_name,
                    lm_cublas_status_name((int)bs));
            goto fail;
        }
        if (cublasSetStream(c->blas, c->stream) != CUBLAS_STATUS_SUCCESS ||
            cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
            lm_errf(e, "cuda backend: device %d (%s): cuBLAS setup failed", device, x->dev_name);
            goto fail;
        }
        LM_CUDA_TRY(cudaMalloc(&x->blas_ws, LM_CUDA_BLAS_WS));
        if (cublasSetWorkspace(c->blas, x->blas_ws, LM_CUDA_BLAS_WS) != CUBLAS_STATUS_SUCCESS) {
            lm_errf(e, "cuda backend: device %d (%s): cuBLAS workspace setup failed", device, x->dev_name);
            goto fail;
        }
        for (int i = 0; i < LM_CUDA_STAGE_SEGS; i++)
            LM_CUDA_TRY(cudaEventCreateWithFlags(&x->seg_ev[i], cudaEventDisableTiming));
        for (int i = 0; i < 2; i++) LM_CUDA_TRY(cudaEventCreateWithFlags(&x->up_ev[i], cudaEventDisableTiming));
        LM_CUDA_TRY(cudaMallocHost((void **)&c->stage_host, LM_CUDA_STAGE_BYTES));
        LM_CUDA_TRY(cudaMalloc((void **)&c->stage_dev, LM_CUDA_STAGE_BYTES));
        c->stage_cap = LM_CUDA_STAGE_BYTES;
        LM_CUDA_TRY(cudaMalloc((void **)&c->counters, LM_CUDA_COUNTERS * sizeof(int)));
        LM_CUDA_TRY(cudaMemsetAsync(c->counters, 0, LM_CUDA_COUNTERS * sizeof(int), c->stream));
        LM_CUDA_TRY(cudaMalloc((void **)&c->ids_dev, LM_CUDA_IDS * sizeof(int32_t)));
        c->ids_rows = -1;
        for (int i = 0; i < LM_CUDA_LATER; i++) {
            LM_CUDA_TRY(cudaMallocHost((void **)&c->later[i].pinned, LM_CUDA_IDS * sizeof(int32_t)));
            LM_CUDA_TRY(cudaEventCreateWithFlags(&c->later[i].ev, cudaEventDisableTiming));
        }
        c->stage_used = 0;
        LM_CUDA_TRY(cudaDeviceGetAttribute(&c->n_sms, cudaDevAttrMultiProcessorCount, device));
        LM_CUDA_TRY(cudaMemGetInfo(&c->free_mem_at_start, &c->total_mem));
        const char *mode = getenv("LUMEN_CUDA_GEMM");
        c->gemm_mode = mode && strcmp(mode, "bf16") == 0 ? LM_CUDA_GEMM_BF16 : LM_CUDA_GEMM_SPLIT;
        lm_cuda_graphs_init(c);
        {
            int major = 0;
            LM_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
            c->pdl = major >= 9 && lm_cuda_env_flag("LUMEN_CUDA_PDL", true);
            c->att_tc = major >= 8 && lm_cuda_env_flag("LUMEN_CUDA_ATT_TC", true);
            c->att_bf16 = lm_cuda_env_flag("LUMEN_CUDA_ATT_BF16", true);
            c->att_dec_tc = lm_cuda_env_flag("LUMEN_CUDA_ATT_DEC_TC", true);
            const char *ds = getenv("LUMEN_CUDA_ATT_DEC_STAGES");
            c->att_dec_stages = ds ? atoi(ds) : 0;
            c->gemv_tc_ok = major >= 8;
            const char *tc = getenv("LUMEN_CUDA_GEMV_TC");
            c->gemv_tc = tc && *tc ? (strcmp(tc, "0") ? 1 : 0) : -1;
            c->quant_exact = lm_cuda_env_flag("LUMEN_CUDA_QUANT_EXACT", false);
            c->qstaged_ok = major >= 9;
            c->qstaged = c->qstaged_ok && lm_cuda_env_flag("LUMEN_CUDA_QSTAGED", true);
            if (c->qstaged_ok) lm_sgemv_init(c);
            const char *qb = getenv("LUMEN_CUDA_QSTAGED_BLOCKS");
            c->qstaged_blocks = qb ? LM_MAX(0, LM_MIN(atoi(qb), 8)) : 0;
            const char *qs = getenv("LUMEN_CUDA_QSTAGED_STAGE"), *qi = getenv("LUMEN_CUDA_QSTAGED_INFLIGHT");
            c->qstaged_stage_kb = qs ? LM_MAX(0, LM_MIN(atoi(qs), 96)) : 0;
            c->qstaged_inflight_kb = qi ? LM_MAX(0, LM_MIN(atoi(qi), 200)) : 0;
            c->qstaged_fill = lm_cuda_env_flag("LUMEN_CUDA_QSTAGED_FILL", false);
        }
        { /* LUMEN_CUDA_GEMV_CHUNKS=n: GEMV threads take up to n chunks a row (cuda_gemv.cu) */
            const char *v = getenv("LUMEN_CUDA_GEMV_CHUNKS");
            const int n = v ? atoi(v) : 0;
            c->gemv_chunks = n > 0 ? n : LM_GEMV_CHUNKS_MAX;
        }
        { /* LUMEN_CUDA_DELTA_CHUNK_MIN=n: the delta rule's crossover (cuda_delta.cu) */
            const char *v = getenv("LUMEN_CUDA_DELTA_CHUNK_MIN");
            c->delta_chunk_min = v ? LM_MAX(0, atoi(v)) : 32;
            const char *b = getenv("LUMEN_CUDA_ATT_BLOCKS_SM"); /* decode attention's blocks an SM (cuda_attention.cu) */
            c->att_blocks_sm = b && atoi(b) > 0 ? LM_MIN(atoi(b), 8) : 4;
            LM_CUDA_TRY(cudaDeviceGetAttribute(&c->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        }
    }
    return &x->be;
fail:
    lm_cuda_release(x);
    return NULL;
}

/* ---- backend-independent queries ---------------------------------------------------- */

void *lm_backend_host_alloc(lm_backend *be, size_t bytes) {
    be = lm_backend_base(be);
    if (!lm_is_cuda(be)) return lm_xmalloc(bytes);
    lm_cuda_use(lm_cuda_of(be));
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        fprintf(stderr, "lumen: out of pinned host memory (%zu bytes)\n", bytes);
        abort();
    }
    return p;
}

void lm_backend_host_free(lm_backend *be, void *p) {
    be = lm_backend_base(be);
    if (!p) return;
    if (!lm_is_cuda(be)) {
        free(p);
        return;
    }
    lm_cuda_use(lm_cuda_of(be));
    (void)cudaFreeHost(p);
}

void lm_backend_mem_info(lm_backend *be, size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = 0;
    *total_bytes = 0;
    be = lm_backend_base(be);
    if (!lm_is_cuda(be)) return;
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_use(c);
    LM_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
    if (c->mem_limit) {
        /* what this process took since creation counts against the limit */
        const size_t used = c->free_mem_at_start > *free_bytes ? c->free_mem_at_start - *free_bytes : 0;
        const size_t room = c->mem_limit > used ? c->mem_limit - used : 0;
        *free_bytes = LM_MIN(*free_bytes, room);
        *total_bytes = LM_MIN(*total_bytes, c->mem_limit);
    }
}

void lm_backend_set_memory_limit(lm_backend *be, size_t bytes) {
    be = lm_backend_base(be);
    if (!lm_is_cuda(be)) return;
    lm_cuda_of(be)->mem_limit = bytes;
}

void lm_backend_graph_counts(lm_backend *be, long *replayed, long *captured) {
    *replayed = *captured = 0;
    be = lm_backend_base(be);
    if (!lm_is_cuda(be)) return;
    lm_cuda_graph_counts(lm_cuda_of(be), replayed, captured);
}

void lm_backend_sync(lm_backend *be) {
    be = lm_backend_base(be);
    if (!lm_is_cuda(be)) return;
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_use(c);
    LM_ASSERT(c->gmode == LM_G_OFF); /* not inside a forward */
    LM_CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

/* The backend's stream, for tools that time ops with CUDA events
 * (tools/bench_cuda_gemv.c declares it itself; not part of lm_backend.h). */
extern "C" cudaStream_t lm_cuda_backend_stream(lm_backend *be) {
    LM_ASSERT(lm_is_cuda(be));
    return lm_cuda_of(be)->stream;
}
