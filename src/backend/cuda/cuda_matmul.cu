/* cuda_matmul.cu - y[T][O] = x[T][I] W[O][I]^T (+ bias) on the GPU: the
 * matmul op and its fused forms (optional ops of lm_backend.h). Up to
 * LM_GEMV_MAX_T tokens take the GEMV (cuda_gemv.cu), more take cuBLAS
 * (cuda_gemm.cu); the fused forms fall back to separate ops where neither
 * takes them.
 *
 * x and y are f32; W is bf16, f16 or f32 in its stored layout [O][I], or
 * GGUF blocks (lm_cuda_qtype): cuda_qgemv.cu up to LM_GEMV_MAX_T tokens,
 * above int8 tensor cores on the blocks (cuda_mmq.cu), or in the exact mode
 * (and shapes it does not take) cuda_dequant.cu's widening to bf16. */
#include "cuda_internal.h"
#include "cuda_mmq.h"

/* ---- entry ---------------------------------------------------------------------------- */

void lm_cuda_matmul(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w, const lm_tensor *bias) {
    lm_cuda *c = lm_cuda_of(be);
    LM_ASSERT(x->type == LM_F32 && y->type == LM_F32);
    LM_ASSERT(w->type == LM_BF16 || w->type == LM_F16 || w->type == LM_F32 || lm_cuda_qtype(w->type));
    LM_ASSERT(x->cols == w->cols && y->rows == x->rows && y->cols == w->rows);
    LM_ASSERT(!bias || (bias->type == LM_F32 && bias->rows * bias->cols == w->rows));
    LM_ASSERT(y->data != x->data || x->rows == 0);
    const int64_t T = x->rows, O = w->rows, I = w->cols;
    if (T == 0 || O == 0) return;
    lm_cuda_use(c);
    float *yp = (float *)y->data;
    const float *bp = bias ? (const float *)bias->data : NULL;
    if (I == 0) {
        if (bp) {
            lm_cuda_launch(c, lm_bias_fill_kernel, lm_grid_1d(c, T * O, 256), 256, 0, yp, bp, T, O);
            LM_CUDA_LAUNCHED("bias_fill");
        } else {
            lm_cuda_memset(c, yp, 0, (size_t)(T * O) * sizeof(float));
        }
        return;
    }
    if (lm_cuda_qtype(w->type)) {
        if (T <= LM_GEMV_MAX_T && lm_qgemv_ok((const float *)x->data, w->data, w->type))
            lm_qgemv(c, (int)T, yp, (const float *)x->data, w->data, w->type, bp, O, I);
        else if (lm_mmq_takes(c, T, (const float *)x->data, w->data, w->type, I))
            lm_mmq(c, T, yp, (const float *)x->data, w->data, w->type, bp, O, I);
        else lm_qgemm(c, T, yp, (const float *)x->data, w->data, w->type, bp, O, I);
    } else if (T <= LM_GEMV_MAX_T) lm_gemv(c, (int)T, yp, (const float *)x->data, w->data, w->type, bp, O, I);
    else lm_gemm1(c, T, yp, (const float *)x->data, w->data, w->type, bp, O, I, false);
}

/* ---- fused forms (optional ops of lm_backend.h) ------------------------------------ */

/* The fused GEMV takes: few tokens, 16-byte chunks of bf16/f16 weights. */
static bool lm_gemv_fusable(const lm_tensor *x, const lm_tensor *const *w, int n) {
    if (x->rows < 1 || x->rows > LM_GEMV_MAX_T || x->type != LM_F32) return false;
    lm_gemv_args a = lm_gemv_args0((const float *)x->data, x->cols, x->rows, false);
    for (int i = 0; i < n; i++) {
        if ((w[i]->type != LM_BF16 && w[i]->type != LM_F16) || w[i]->type != w[0]->type || w[i]->cols != x->cols)
            return false;
        a.w[i] = (const unsigned char *)w[i]->data;
    }
    return lm_gemv_vec(&a, n, w[0]->type);
}

/* Whether one quantised GEMV launch takes x by the n matrices w: few
 * tokens, one block type, each matrix readable by the kernel. */
static bool lm_qgemv_fusable(const lm_tensor *x, const lm_tensor *const *w, int n) {
    if (x->rows < 1 || x->rows > LM_GEMV_MAX_T || x->type != LM_F32 || !lm_cuda_qtype(w[0]->type)) return false;
    for (int i = 0; i < n; i++)
        if (w[i]->type != w[0]->type || w[i]->cols != x->cols || !lm_qgemv_ok((const float *)x->data, w[i]->data, w[i]->type))
            return false;
    return true;
}

/* More than LM_GEMV_MAX_T tokens by bf16 weights stored back to back (as
 * upload_weights places a group): one product for all of them, its columns
 * placed as o says. False when they are not, or the product does not fit the
 * scratch: the caller multiplies one weight at a time. */
static bool lm_gemm_stacked(lm_cuda *c, const lm_tensor *x, const lm_tensor *const *w, const lm_gemm_out *o) {
    if (x->rows <= LM_GEMV_MAX_T || x->type != LM_F32 || !lm_gemm_stackable(c, x->rows, o)) return false;
    for (int i = 0; i < o->n; i++) {
        if (w[i]->type != LM_BF16 || w[i]->cols != x->cols || w[i]->rows != o->O[i]) return false;
        if (i && (const unsigned char *)w[i]->data !=
                     (const unsigned char *)w[i - 1]->data + (size_t)w[i - 1]->rows * (size_t)w[i - 1]->cols * 2)
            return false;
    }
    lm_cuda_use(c);
    lm_gemm(c, x->rows, (const float *)x->data, w[0]->data, LM_BF16, x->cols, o);
    return true;
}

/* x by n quantised matrices of one block type (lm_qgemv_fusable) in one launch. */
static void lm_cuda_qgemv_n(lm_cuda *c, int n, lm_tensor *const *y, const lm_tensor *x, const lm_tensor *const *w,
                            const lm_tensor *const *bias) {
    lm_cuda_use(c);
    lm_gemv_args a = lm_qgemv_args0((const float *)x->data, x->cols);
    for (int i = 0; i < n; i++) {
        const lm_tensor *b = bias ? bias[i] : NULL;
        LM_ASSERT(y[i]->type == LM_F32 && y[i]->rows == x->rows && y[i]->cols == w[i]->rows);
        LM_ASSERT(y[i]->data != x->data && (!b || (b->type == LM_F32 && b->rows * b->cols == w[i]->rows)));
        lm_gemv_add(&a, i, (float *)y[i]->data, w[i]->data, b ? (const float *)b->data : NULL, w[i]->rows);
    }
    lm_qgemv_run(c, (int)x->rows, &a, w[0]->type, LM_GEMV_STORE);
}

void lm_cuda_matmul_n(lm_backend *be, int n, lm_tensor *const *y, const lm_tensor *x, const lm_tensor *const *w,
                      const lm_tensor *const *bias) {
    LM_ASSERT(n >= 1 && n <= LM_GEMV_MAXM);
    lm_cuda *c = lm_cuda_of(be);
    if (x->rows > LM_GEMV_MAX_T) {
        lm_gemm_out o = lm_gemm_out0(n);
        for (int i = 0; i < n; i++) {
            const lm_tensor *b = bias ? bias[i] : NULL;
            LM_ASSERT(y[i]->type == LM_F32 && y[i]->rows == x->rows && y[i]->cols == w[i]->rows);
            LM_ASSERT(y[i]->data != x->data && (!b || (b->type == LM_F32 && b->rows * b->cols == w[i]->rows)));
            o.y[i] = (float *)y[i]->data, o.bias[i] = b ? (const float *)b->data : NULL, o.O[i] = w[i]->rows;
        }
        if (n > 1 && lm_gemm_stacked(c, x, w, &o)) return;
    }
    if (lm_qgemv_fusable(x, w, n)) { /* the matrices' rows in one launch */
        lm_cuda_qgemv_n(c, n, y, x, w, bias);
        return;
    }
    if (n > 1 && lm_qgemv_fusable(x, w, 1)) { /* mixed block types (Q4_K_M's Q6_K v): one launch a type */
        for (int i = 0; i < n; i++) {
            bool first = true; /* the first matrix of its type takes the others of that type */
            for (int j = 0; j < i; j++) first = first && w[j]->type != w[i]->type;
            if (!first) continue;
            lm_tensor *ys[LM_GEMV_MAXM] = { 0 };
            const lm_tensor *ws[LM_GEMV_MAXM] = { 0 }, *bs[LM_GEMV_MAXM] = { 0 };
            int m = 0;
            for (int j = i; j < n; j++)
                if (w[j]->type == w[i]->type) ys[m] = y[j], ws[m] = w[j], bs[m] = bias ? bias[j] : NULL, m++;
            if (lm_qgemv_fusable(x, ws, m)) lm_cuda_qgemv_n(c, m, ys, x, ws, bs);
            else
                for (int j = 0; j < m; j++) lm_cuda_matmul(be, ys[j], x, ws[j], bs[j]);
        }
        return;
    }
    if (!lm_gemv_fusable(x, w, n)) {
        for (int i = 0; i < n; i++) lm_cuda_matmul(be, y[i], x, w[i], bias ? bias[i] : NULL);
        return;
    }
    lm_cuda_use(c);
    lm_gemv_args a = lm_gemv_args0((const float *)x->data, x->cols, x->rows, lm_gemv_tc(c, x->rows, w[0]->type));
    for (int i = 0; i < n; i++) {
        const lm_tensor *b = bias ? bias[i] : NULL;
        LM_ASSERT(y[i]->type == LM_F32 && y[i]->rows == x->rows && y[i]->cols == w[i]->rows);
        LM_ASSERT(y[i]->data != x->data && (!b || (b->type == LM_F32 && b->rows * b->cols == w[i]->rows)));
        lm_gemv_add(&a, i, (float *)y[i]->data, w[i]->data, b ? (const float *)b->data : NULL, w[i]->rows);
    }
    lm_gemv_run(c, (int)x->rows, &a, w[0]->type, LM_GEMV_STORE, true);
}

void lm_cuda_matmul_glu(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *wg, const lm_tensor *wu,
                        lm_glu act, lm_tensor *gate_ws, lm_tensor *up_ws) {
    lm_cuda *c = lm_cuda_of(be);
    const lm_tensor *w[2] = { wg, wu };
    LM_ASSERT(wg->rows == wu->rows && y->rows == x->rows && y->cols == wg->rows && y->type == LM_F32);
    if (x->rows > LM_GEMV_MAX_T) {
        lm_gemm_out o = lm_gemm_out0(2);
        o.glu = (int)act + 1, o.y[0] = (float *)y->data, o.O[0] = o.O[1] = wg->rows;
        LM_ASSERT(y->data != x->data);
        if (lm_gemm_stacked(c, x, w, &o)) return;
    }
    if (act == LM_GLU_SILU && lm_qgemv_fused(x->rows, wg->type) && lm_qgemv_fusable(x, w, 2)) { /* quantised gate/up */
        lm_cuda_use(c);
        lm_gemv_args a = lm_qgemv_args0((const float *)x->data, x->cols);
        lm_gemv_set_glu(&a, (float *)y->data, wg->data, wu->data, wg->rows);
        lm_qgemv_run(c, (int)x->rows, &a, wg->type, LM_GEMV_GLU_SILU);
        return;
    }
    if (!lm_gemv_fusable(x, w, 2)) {
        lm_cuda_matmul(be, gate_ws, x, wg, NULL);
        lm_cuda_matmul(be, up_ws, x, wu, NULL);
        if (act == LM_GLU_SILU) lm_cuda_silu_mul(be, y, gate_ws, up_ws);
        else lm_cuda_gelu_mul(be, y, gate_ws, up_ws, act == LM_GLU_GELU_TANH);
        return;
    }
    lm_cuda_use(c);
    lm_gemv_args a = lm_gemv_args0((const float *)x->data, x->cols, x->rows, lm_gemv_tc(c, x->rows, wg->type));
    lm_gemv_set_glu(&a, (float *)y->data, wg->data, wu->data, wg->rows);
    const int mode = act == LM_GLU_SILU ? LM_GEMV_GLU_SILU : act == LM_GLU_GELU_TANH ? LM_GEMV_GLU_GELU_TANH
                                                                                      : LM_GEMV_GLU_GELU;
    lm_gemv_run(c, (int)x->rows, &a, wg->type, mode, true);
}

/* The fused norm takes whole rows of y with one norm vector ([T][O],
 * contiguous, into a distinct [T][O]). One block norms the rows one after
 * another, so only for one or two tokens: at 8 that tail cut a Llama-8B
 * batch-8 decode from 842 to 721 tok/s against the norm kernel's block per
 * row (H200). */
#define LM_NORM_FUSE_MAX_T 2
static bool lm_norm_fusable(const lm_tensor *y, const lm_norm_out *n) {
    return y->rows <= LM_NORM_FUSE_MAX_T && lm_norm_out_fits(n, y->data, y->rows, y->cols);
}

void lm_cuda_matmul_add(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w, lm_tensor *ws,
                        const lm_norm_out *norm) {
    lm_cuda *c = lm_cuda_of(be);
    LM_ASSERT(y->type == LM_F32 && y->rows == x->rows && y->cols == w->rows && y->data != x->data);
    /* quantised: the add in the GEMV, the norm after (cuda_qgemv_staged.cu: why not in it) */
    if (lm_qgemv_fused(x->rows, w->type) && lm_qgemv_fusable(x, &w, 1)) {
        lm_cuda_use(c);
        lm_gemv_args q = lm_qgemv_args0((const float *)x->data, x->cols);
        lm_gemv_add(&q, 0, (float *)y->data, w->data, NULL, w->rows);
        lm_qgemv_run(c, (int)x->rows, &q, w->type, LM_GEMV_ADD);
        if (norm) lm_cuda_rms_norm(be, norm->y, y, norm->w, norm->eps, norm->w_offset);
        return;
    }
    lm_gemv_args a = lm_gemv_args0((const float *)x->data, x->cols, x->rows, lm_gemv_tc(c, x->rows, w->type));
    lm_gemv_add(&a, 0, (float *)y->data, w->data, NULL, w->rows);
    const bool fuse = lm_gemv_fusable(x, &w, 1);
    const bool fuse_norm = fuse && norm && lm_norm_fusable(y, norm);
    if (x->rows > LM_GEMV_MAX_T && w->type == LM_BF16 && x->type == LM_F32 && x->cols == w->cols && w->rows > 0 &&
        x->cols > 0) {
        /* the product adds itself to y: the kernel that sums its terms adds
         * them to y as the add op would (same bits), or (bf16 activations)
         * cuBLAS with beta 1. f16 and f32 weights keep the add op: their
         * products accumulate into y term by term, in another order. */
        lm_cuda_use(c);
        lm_gemm1(c, x->rows, (float *)y->data, (const float *)x->data, w->data, w->type, NULL, w->rows, w->cols, true);
    } else if (!fuse) {
        lm_cuda_matmul(be, ws, x, w, NULL);
        lm_cuda_add(be, y, ws);
    } else {
        lm_cuda_use(c);
        if (fuse_norm) {
            a.norm_y = (float *)norm->y->data, a.norm_w = (const float *)norm->w->data;
            a.eps = norm->eps, a.w_offset = norm->w_offset, a.counter = c->counters;
        }
        lm_gemv_run(c, (int)x->rows, &a, w->type, fuse_norm ? LM_GEMV_ADD_NORM : LM_GEMV_ADD, true);
    }
    if (norm && !fuse_norm) lm_cuda_rms_norm(be, norm->y, y, norm->w, norm->eps, norm->w_offset);
}
