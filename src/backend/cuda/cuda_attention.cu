/* cuda_attention.cu - kv_write and causal attention over the paged KV pool
 * on the GPU (the forms fused with rope: cuda_rope_kv.cu). Semantics are
 * cpu_attention.c's: position p of sequence s lives in row (table[p / bs]
 * * bs + p % bs) of the layer's [n_blocks*bs][width] K and V arrays (its own width), kv
 * head g in columns [g*Dh, (g+1)*Dh), and
 *   out = sum_j softmax_j(cap(scale * q.k_j)) v_j   over j in [lo, pos]
 * with lo = pos - window + 1 on sliding layers (else 0).
 *
 * Staging. The batch's host arrays (pos, seq, the block tables, flattened
 * with per-sequence offsets, and the work list below) are packed into one
 * host buffer and staged with one lm_cuda_stage (cuda_attention_stage.cu).
 *
 * Batches of a few tokens per sequence (decode, short drafts) take the
 * decode kernel below. Prefill, chunks and mixed batches take a tiled
 * kernel: on tensor cores (cuda_attention_tc.cu) where the rows allow
 * 16-byte loads and heads are at most 256 wide, else the CUDA-core
 * att_kernel here (LUMEN_CUDA_ATT_TC=0 forces it). The work item of both is
 * a tile of query rows (64 here; 128 or 64 on tensor cores), a row being a
 * (token, query head) pair: up to rows / hb tokens of one sequence times hb
 * query heads that read the same kv head (GQA), so every K/V row brought
 * into shared memory serves all of them. The host groups each sequence's
 * tokens (batch order) into tiles and records each tile's key range
 * [min lo, max pos].
 *
 * att_kernel's block (tile, kv head and head subgroup, split): 256 threads = 8 warps,
 * warp w owning rows 8w .. 8w+7. Q of the tile sits in shared memory
 * [64][DP] (DP = head width padded to a multiple of 32, zeros beyond Dh);
 * keys come in tiles of 32 ([32][DP+1] K, padded against bank conflicts, and
 * [32][DP] V). Per key tile, lane j of a warp scores key j against the warp's
 * 8 rows, the warp reduces max and sum with shuffles (online softmax: the
 * running max m, denominator l and the accumulator are rescaled by
 * exp(m_old - m_new), every exponent <= 0), and the probabilities are
 * broadcast by shuffle into acc[row][d = lane + 32i] += p * V[j][d]. No
 * shared memory besides Q, K and V, and no block barrier besides the two
 * around each K/V load. Masking is per row (causal, window, tile end).
 *
 * Flash-decoding. When the tiles alone do not give the GPU enough blocks
 * (a few decoding sequences, or one long one), each tile's key range is cut
 * into n_splits equal runs (a multiple of 32 keys, at least
 * ATT_MIN_SPLIT_KEYS each) over gridDim.z. Each split then writes its
 * partial (m, l, unnormalised acc) per (token, head, split) to scratch and a
 * combine kernel merges them: out = sum_s e^{m_s-M} acc_s / sum_s e^{m_s-M} l_s.
 * With one split the kernel writes out directly.
 *
 * Precision: f32 throughout (f32 scores, f32 FMA accumulation, expf), as the
 * CPU backend, which keeps its denominator in double; agreement is ~1e-6
 * relative. Shared memory: (64*DP + 32*(DP+1) + 32*DP) floats, 131 KB at
 * Dh = 256 (opted in above 48 KB).
 *
 * KV formats other than f32 (lm_kv_type.h): the decode kernel has an
 * instantiation per format (att_kv_raw: rows loaded as they lie, widened
 * where used), the CUDA-core tiled kernel a second one (GEN) that decodes
 * each K/V value as it loads it (att_kv_span, att_kv_at); the tensor-core
 * kernel reads f32 and bf16 (K and V alike). A
 * rotated K (Q4R) is met by rotating q into scratch first; a rotated V
 * by un-rotating the output after (cuda_kv_format.cu). */
#include "cuda_attention.h"
#include "cuda_attention_combine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ATT_RPW 8              /* rows per warp */
#define ATT_BK 32              /* keys per shared-memory tile (= warp width) */
#define ATT_THREADS 256        /* ATT_ROWS / ATT_RPW warps */
#define ATT_MAX_DH 256
#define ATT_MIN_SPLIT_KEYS 256 /* keys per split, at least */

/* ---- kv_write ---------------------------------------------------------------- */

/* Blocks (token, column chunk): the token's K and V rows into the slot its
 * table names. */
__global__ void att_kv_write_kernel(float *kl, float *vl, const float *k, const float *v, int64_t cols,
                                    int64_t kv_ld, int bs, att_dev d) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    const int t = blockIdx.x;
    const int64_t c = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    const int32_t p = d.pos[t], s = d.seq[t];
    const int64_t row = (int64_t)d.tab[d.tab_off[s] + p / bs] * bs + p % bs;
    float *kd = kl + row * kv_ld, *vd = vl + row * kv_ld;
    kd[c] = k[(int64_t)t * cols + c];
    vd[c] = v[(int64_t)t * cols + c];
}

void lm_cuda_kv_write(lm_backend *be, lm_kv_pool *kv, int layer, const lm_tensor *k, const lm_tensor *v,
                      const lm_attn_batch *b) {
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_use(c);
    LM_ASSERT(layer >= 0 && layer < kv->n_layers);
    LM_ASSERT(k->type == LM_F32 && v->type == LM_F32 && k->rows == b->n_tokens && v->rows == b->n_tokens);
    LM_ASSERT(k->cols == v->cols && k->cols <= lm_kv_layer_width(kv, layer));
    if (b->n_tokens == 0) return;
    att_dev d = att_stage_memo(c, kv, b, 0, true);
    if (kv->k_type != LM_KV_F32 || kv->v_type != LM_KV_F32) {
        lm_cuda_kv_write_fmt(c, kv, layer, k, v, d);
        return;
    }
    lm_cuda_launch_pdl(c, att_kv_write_kernel, dim3((unsigned)b->n_tokens, (unsigned)((k->cols + 127) / 128)), 128, 0,
                       (float *)kv->k[layer], (float *)kv->v[layer], (const float *)k->data, (const float *)v->data, k->cols,
                       lm_kv_layer_width(kv, layer), kv->block_size, d);
    LM_CUDA_LAUNCHED("att_kv_write_kernel");
}

/* ---- attention ------------------------------------------------------------------ */

/* ND = DP / 32 accumulator columns per lane. grid (tiles, Hkv * n_sub, n_splits).
 * GEN: K and V in any format (decoded as loaded), else f32. */
template <int ND, bool GEN>
__global__ void __launch_bounds__(ATT_THREADS) att_kernel(att_args a) {
    constexpr int DP = ND * 32;
    extern __shared__ float4 att_smem4[];
    float *sQ = (float *)att_smem4;    /* [ATT_ROWS][DP] */
    float *sK = sQ + ATT_ROWS * DP;    /* [ATT_BK][DP + 1] */
    float *sV = sK + ATT_BK * (DP + 1); /* [ATT_BK][DP] */
    __shared__ int r_tok[ATT_ROWS], r_head[ATT_ROWS], r_pos[ATT_ROWS], r_lo[ATT_ROWS];

    const int32_t *tr = a.tiles + 4 * (int64_t)blockIdx.x;
    const int4 tile = make_int4(tr[0], tr[1], tr[2], tr[3]);
    const int g = blockIdx.y / a.n_sub, sub = blockIdx.y % a.n_sub;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int32_t *table = a.d.tab + a.d.tab_off[a.d.seq[a.tok[tile.x]]];

    if (tid < ATT_ROWS) att_tile_row(a, tile, g, sub, tid, &r_tok[tid], &r_head[tid], &r_pos[tid], &r_lo[tid]);
    __syncthreads();
    for (int i = tid; i < ATT_ROWS * DP; i += ATT_THREADS) {
        const int r = i / DP, dd = i % DP;
        float x = 0.0f;
        if (r_tok[r] >= 0 && dd < a.Dh) x = a.q[(int64_t)r_tok[r] * a.q_ld + (int64_t)r_head[r] * a.Dh + dd];
        sQ[i] = x;
    }

    /* this split's keys */
    int k_lo, k_hi;
    static_assert(ATT_BK == 32, "splits are whole key tiles");
    att_tile_split(a, tile, &k_lo, &k_hi);

    float m[ATT_RPW], l[ATT_RPW], acc[ATT_RPW][ND];
    int rpos[ATT_RPW], rlo[ATT_RPW];
    bool active = false;
#pragma unroll
    for (int i = 0; i < ATT_RPW; i++) {
        m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
        for (int jd = 0; jd < ND; jd++) acc[i][jd] = 0.0f;
        rpos[i] = r_pos[warp * ATT_RPW + i];
        rlo[i] = r_lo[warp * ATT_RPW + i];
        active |= rpos[i] >= 0;
    }
    const int64_t goff = (int64_t)g * a.Dh;

    for (int j0 = k_lo; j0 <= k_hi; j0 += ATT_BK) {
        __syncthreads(); /* Q written / the previous tile consumed */
        for (int i = tid; i < ATT_BK * DP; i += ATT_THREADS) {
            const int jj = i / DP, dd = i % DP, j = j0 + jj;
            float kx = 0.0f, vx = 0.0f;
            if (j <= k_hi && dd < a.Dh) {
                const int64_t row = (int64_t)table[j / a.bs] * a.bs + j % a.bs;
                if (GEN) {
                    kx = att_kv_at(a.kt, a.kl, a.k_rb, a.k_cb, row, goff + dd);
                    vx = att_kv_at(a.vt, a.vl, a.v_rb, a.v_cb, row, goff + dd);
                } else {
                    const int64_t o = row * a.kv_ld + goff + dd;
                    kx = a.kl[o];
                    vx = a.vl[o];
                }
            }
            sK[jj * (DP + 1) + dd] = kx;
            sV[jj * DP + dd] = vx;
        }
        __syncthreads();
        if (!active) continue; /* warp-uniform */

        /* scores: lane = key */
        const int j = j0 + lane;
        float sc[ATT_RPW];
#pragma unroll
        for (int i = 0; i < ATT_RPW; i++) sc[i] = 0.0f;
        const float *kr = sK + lane * (DP + 1);
        for (int dd = 0; dd < DP; dd += 4) {
            const float k0 = kr[dd], k1 = kr[dd + 1], k2 = kr[dd + 2], k3 = kr[dd + 3];
#pragma unroll
            for (int i = 0; i < ATT_RPW; i++) {
                const float4 q4 = *(const float4 *)(sQ + (warp * ATT_RPW + i) * DP + dd);
                sc[i] += q4.x * k0 + q4.y * k1 + q4.z * k2 + q4.w * k3;
            }
        }
        /* online softmax per row */
#pragma unroll
        for (int i = 0; i < ATT_RPW; i++) {
            float x = sc[i] * a.scale;
            if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
            const bool ok = j <= k_hi && rpos[i] >= 0 && j <= rpos[i] && j >= rlo[i];
            x = ok ? x : -INFINITY;
            const float mn = fmaxf(m[i], att_warp_max(x));
            float p = 0.0f, alpha = 1.0f;
            if (mn != -INFINITY) {
                p = ok ? expf(x - mn) : 0.0f;
                alpha = expf(m[i] - mn); /* 0 when m was -inf */
            }
            l[i] = l[i] * alpha + att_warp_sum(p);
            m[i] = mn;
#pragma unroll
            for (int jd = 0; jd < ND; jd++) acc[i][jd] *= alpha;
            sc[i] = p;
        }
        /* acc += P V: probabilities by shuffle, lane = column */
#pragma unroll 4
        for (int kk = 0; kk < ATT_BK; kk++) {
            float vr[ND];
#pragma unroll
            for (int jd = 0; jd < ND; jd++) vr[jd] = sV[kk * DP + lane + 32 * jd];
#pragma unroll
            for (int i = 0; i < ATT_RPW; i++) {
                const float pk = __shfl_sync(ATT_FULL, sc[i], kk);
#pragma unroll
                for (int jd = 0; jd < ND; jd++) acc[i][jd] += pk * vr[jd];
            }
        }
    }

#pragma unroll
    for (int i = 0; i < ATT_RPW; i++) {
        const int r = warp * ATT_RPW + i, t = r_tok[r], h = r_head[r];
        if (t < 0) continue;
        if (a.n_splits == 1) {
            float *o = a.out + (int64_t)t * a.out_ld + (int64_t)h * a.Dh;
            const float inv = 1.0f / l[i];
#pragma unroll
            for (int jd = 0; jd < ND; jd++)
                if (lane + 32 * jd < a.Dh) o[lane + 32 * jd] = acc[i][jd] * inv;
        } else {
            const int64_t idx = ((int64_t)t * a.H + h) * a.n_splits + blockIdx.z;
            if (lane == 0) a.pm[idx] = m[i], a.pl[idx] = l[i];
            float *o = a.pacc + idx * a.Dh;
#pragma unroll
            for (int jd = 0; jd < ND; jd++)
                if (lane + 32 * jd < a.Dh) o[lane + 32 * jd] = acc[i][jd];
        }
    }
}

/* grid (H, T): the merge as a kernel of its own (the tiled kernel's splits). */
__global__ void att_combine_kernel(float *out, int64_t out_ld, const float *pm, const float *pl, const float *pacc,
                                   int H, int Dh, int ns) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    att_combine_heads(out, out_ld, pm, pl, pacc, H, Dh, ns, blockIdx.y, blockIdx.x, 1);
}

/* The arguments both attention kernels share, with split partials in
 * scratch when ns > 1. */
static att_args att_common_args(lm_cuda *c, lm_tensor *out, const lm_tensor *q, const lm_kv_pool *kv, int layer,
                                att_dev d, const lm_attn_params *p, int T, int ns) {
    att_args a;
    memset(&a, 0, sizeof a);
    a.out = (float *)out->data;
    a.q = (const float *)q->data;
    a.kl = (const float *)kv->k[layer], a.vl = (const float *)kv->v[layer];
    const int64_t w = lm_kv_layer_width(kv, layer);
    a.q_ld = q->cols, a.out_ld = out->cols, a.kv_ld = w;
    a.kt = kv->k_type, a.vt = kv->v_type;
    a.k_rb = (int64_t)lm_kv_row_bytes(kv->k_type, w), a.v_rb = (int64_t)lm_kv_row_bytes(kv->v_type, w);
    a.k_cb = (int64_t)lm_kv_codes_bytes(kv->k_type, w);
    a.v_cb = (int64_t)lm_kv_codes_bytes(kv->v_type, w);
    a.d = d;
    a.bs = kv->block_size, a.H = p->n_heads, a.gsz = p->n_heads / p->n_kv_heads, a.Dh = p->head_dim;
    a.window = p->window, a.n_splits = ns;
    a.scale = p->scale, a.softcap = p->softcap;
    /* one scratch: the split partials, then a rotated copy of q (K in Q4R) */
    const size_t rows = ns > 1 ? (size_t)T * (size_t)a.H * (size_t)ns : 0, hd = (size_t)a.H * (size_t)a.Dh;
    const size_t qrot = kv->k_type == LM_KV_Q4R ? (size_t)T * hd : 0;
    if (rows + qrot == 0) return a;
    float *part = (float *)lm_cuda_scratch(c, (rows * ((size_t)a.Dh + 2) + qrot) * sizeof(float));
    if (ns > 1) a.pm = part, a.pl = part + rows, a.pacc = part + 2 * rows;
    if (qrot) {
        float *qr = part + rows * ((size_t)a.Dh + 2);
        lm_cuda_kv_rotate(c, qr, (int64_t)hd, a.q, a.q_ld, T, (int64_t)hd, kv->rot, false);
        a.q = qr, a.q_ld = (int64_t)hd;
    }
    return a;
}

/* Merges the ns > 1 splits into out (unless the kernel did). */
static void att_combine(lm_cuda *c, const att_args *a, int T) {
    if (a->n_splits <= 1 || a->cnt) return;
    lm_cuda_launch_pdl(c, att_combine_kernel, dim3((unsigned)a->H, (unsigned)T), 128, 0, a->out, a->out_ld, a->pm,
                       a->pl, a->pacc, a->H, a->Dh, a->n_splits);
    LM_CUDA_LAUNCHED("att_combine_kernel");
}

/* A V in Q4R leaves the output rotated: turn each head back, in place. */
static void att_unrotate(lm_cuda *c, const lm_kv_pool *kv, lm_tensor *out, const lm_attn_params *p, int T) {
    if (kv->v_type != LM_KV_Q4R) return;
    const int64_t hd = (int64_t)p->n_heads * p->head_dim;
    lm_cuda_kv_rotate(c, (float *)out->data, out->cols, (const float *)out->data, out->cols, T, hd, kv->rot, true);
}

/* ---- decode: one block per (token, kv head, split) -------------------------------- */

/* For batches of one or a few tokens per sequence the tiled kernel wastes
 * most of its 64 rows and walks the keys in one block; this one spreads
 * them. Block (token t, kv head g, split z), ATT_DEC_WARPS warps; warp w
 * takes groups of KB keys of the split (groups w, w + ATT_DEC_WARPS, ...).
 * Lane l holds dims [l*DPL, l*DPL + DPL) of the G query heads of g (q in
 * registers) and of the key and value rows, so a key's score is DPL FMAs
 * per head and a share of a warp reduction. Online softmax per head, then
 * the warps merge through shared memory. Needs Dh = 32 * DPL. A block takes up to GM of the
 * group's heads (GM = 8, or 2 at Dh = 512 to stay in registers); larger
 * groups span gridDim.y = Hkv * ceil(G / GM) blocks. */
#define ATT_DEC_WARPS 4
#define ATT_DEC_MIN_KEYS 16 /* keys per split, at least: short contexts still spread over blocks */
/* keys a warp takes at a time: 4, fewer for wide heads (the current and
 * the next group's K and V rows, 4 * KB * DPL floats, stay in registers) */
#define ATT_DEC_KB(DPL) ((DPL) <= 4 ? 4 : 16 / (DPL) < 1 ? 1 : 16 / (DPL))
static_assert(8 <= ATT_COMB_HEADS, "a decode block's heads (GM) are merged together");

/* The warp sums of NP values (lm_warp_sum_scatter), every lane left with
 * the whole sum of its value, value lane >> (5 - log2 NP). */
template <int NP> __device__ __forceinline__ float att_reduce_scatter(float (&v)[NP], int lane) {
    static_assert(NP <= 32, "one value a lane");
    lm_warp_sum_scatter<NP>(v, lane);
    return v[0];
}

template <int DPL, int GM, int KT, int VT>
__global__ void __launch_bounds__(ATT_DEC_WARPS * 32, GM <= 4 && DPL <= 4 ? 4 : 1) att_decode_kernel(att_args a) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    const int t = blockIdx.x, z = blockIdx.z, g = blockIdx.y / a.n_sub, sub = blockIdx.y % a.n_sub;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, Dh = DPL * 32;
    const int h0 = g * a.gsz + sub * GM, G = min(GM, a.gsz - sub * GM); /* this block's heads */
    __shared__ float s_m[ATT_DEC_WARPS][GM], s_l[ATT_DEC_WARPS][GM];
    extern __shared__ float s_acc[]; /* [ATT_DEC_WARPS][G][Dh] */
    const int32_t p = a.d.pos[t];
    const int32_t *table = a.d.tab + a.d.tab_off[a.d.seq[t]];
    const int lo = a.window > 0 ? max(0, p - a.window + 1) : 0, range = p - lo + 1;
    const int chunk = (range + a.n_splits - 1) / a.n_splits;
    const int k_lo = lo + z * chunk, k_hi = min(p, k_lo + chunk - 1);

    float q[GM][DPL], acc[GM][DPL];
#pragma unroll
    for (int i = 0; i < GM; i++) {
        const float *qh = a.q + (int64_t)t * a.q_ld + (int64_t)(h0 + (i < G ? i : 0)) * Dh + lane * DPL;
#pragma unroll
        for (int d = 0; d < DPL; d++) q[i][d] = i < G ? qh[d] : 0.0f, acc[i][d] = 0.0f;
    }
    const int64_t goff = (int64_t)g * Dh + lane * DPL;
    /* Keys go KB at a time: a warp takes groups of KB consecutive keys
     * (group w, w + ATT_DEC_WARPS, ...) and loads the next group's rows
     * before it uses this one's, so 2 KB keys' loads are in flight per warp:
     * the loop waits on memory latency, not bandwidth, and a long context is
     * a few hundred keys per warp.
     *
     * A group's NP = GM * KB (head, key) dot products are reduced together
     * (att_reduce_scatter: NP - 1 + 5 - log2 NP shuffles instead of 5 NP),
     * which leaves lane l with pair (l >> SH) whole: its lane scores, masks
     * and exponentiates that one pair, and keeps the running max and
     * denominator of its head (lanes of one head meet by xor over the key
     * bits [SH, SH + log2 KB)). The accumulators, a head's dims across the
     * warp, take each pair's probability and each head's rescale factor by
     * shuffle from the lane that owns it. */
    constexpr int KB = ATT_DEC_KB(DPL), NP = GM * KB, SH = 5 - lm_log2_const(NP);
    static_assert((NP & (NP - 1)) == 0 && NP <= 32, "pairs a lane: a power of two up to the warp");
    const int pi = lane >> SH, own_h = pi / KB, own_b = pi % KB; /* this lane's pair */
    float m_own = -INFINITY, l_own = 0.0f;
    /* R groups of raw rows in flight (att_kv_raw): the f32 rows' registers
     * allow one, the narrower formats' two, so that about as many bytes
     * wait on memory per warp */
    using RK = att_kv_raw<KT, DPL>;
    using RV = att_kv_raw<VT, DPL>;
    constexpr int R = KT == LM_KV_F32 && VT == LM_KV_F32 ? 1 : 2;
    auto load = [&](int j0, RK (&kr)[KB], RV (&vr)[KB]) {
#pragma unroll
        for (int b = 0; b < KB; b++) {
            const int j = min(j0 + b, k_hi); /* past k_hi: a valid row, masked below */
            const int64_t row = (int64_t)table[j / a.bs] * a.bs + j % a.bs;
            kr[b].load(a.kt, a.kl, a.k_rb, a.k_cb, row, goff);
            vr[b].load(a.vt, a.vl, a.v_rb, a.v_cb, row, goff);
        }
    };
    auto keys = [&](int j0, const float (&kx)[KB][DPL], const float (&vx)[KB][DPL]) {
        float sc[NP];
#pragma unroll
        for (int i = 0; i < GM; i++)
#pragma unroll
            for (int b = 0; b < KB; b++) {
                float s = 0.0f;
#pragma unroll
                for (int d = 0; d < DPL; d++) s += q[i][d] * kx[b][d];
                sc[i * KB + b] = s;
            }
        float x = att_reduce_scatter<NP>(sc, lane) * a.scale;
        if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
        x = own_h < G && j0 + own_b <= k_hi ? x : -INFINITY;
        float mx = x;
#pragma unroll
        for (int o = 1 << SH; o < (KB << SH); o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(ATT_FULL, mx, o));
        const float mn = fmaxf(m_own, mx);
        /* a head past G sees no key: nothing rescales, nothing adds */
        const float alpha = mn != -INFINITY ? expf(m_own - mn) : 1.0f, pr = mn != -INFINITY ? expf(x - mn) : 0.0f;
        float ps = pr;
#pragma unroll
        for (int o = 1 << SH; o < (KB << SH); o <<= 1) ps += __shfl_xor_sync(ATT_FULL, ps, o);
        l_own = l_own * alpha + ps;
        m_own = mn;
#pragma unroll
        for (int i = 0; i < GM; i++) {
            if (i >= G) break;
            const float al = __shfl_sync(ATT_FULL, alpha, (i * KB) << SH);
#pragma unroll
            for (int d = 0; d < DPL; d++) acc[i][d] *= al;
#pragma unroll
            for (int b = 0; b < KB; b++) {
                const float p = __shfl_sync(ATT_FULL, pr, (i * KB + b) << SH);
#pragma unroll
                for (int d = 0; d < DPL; d++) acc[i][d] += p * vx[b][d];
            }
        }
    };
    constexpr int STEP = ATT_DEC_WARPS * KB;
    RK kr[R][KB];
    RV vr[R][KB];
#pragma unroll
    for (int r = 0; r < R; r++)
        if (k_lo + warp * KB + r * STEP <= k_hi) load(k_lo + warp * KB + r * STEP, kr[r], vr[r]);
    /* group j: widen ring slot r (the wait for its loads is here), refill
     * the slot with group j + R STEP, then score group j */
    for (int j0 = k_lo + warp * KB; j0 <= k_hi; j0 += R * STEP) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int j = j0 + r * STEP;
            if (j > k_hi) break;
            float kx[KB][DPL], vx[KB][DPL];
#pragma unroll
            for (int b = 0; b < KB; b++) kr[r][b].widen(kx[b]), vr[r][b].widen(vx[b]);
            if (j + R * STEP <= k_hi) load(j + R * STEP, kr[r], vr[r]);
            keys(j, kx, vx);
        }
    }
    /* merge the warps: head i's m and l from the first lane of its pairs */
#pragma unroll
    for (int i = 0; i < GM; i++) {
        if (i >= G) break;
        const float mi = __shfl_sync(ATT_FULL, m_own, (i * KB) << SH), li = __shfl_sync(ATT_FULL, l_own, (i * KB) << SH);
        if (lane == 0) s_m[warp][i] = mi, s_l[warp][i] = li;
#pragma unroll
        for (int d = 0; d < DPL; d++) s_acc[((int64_t)warp * G + i) * Dh + lane * DPL + d] = acc[i][d];
    }
    __syncthreads();
    att_decode_finish(a, t, z, h0, G, Dh, ATT_DEC_WARPS, &s_m[0][0], &s_l[0][0], GM, s_acc, (int64_t)G * Dh);
}

/* grid.y = Hkv * ceil(G / GM): a->n_sub set here. */
template <int DPL, int GM, int KT, int VT>
static void att_decode_launch_as(lm_cuda *c, dim3 grid, att_args *a) {
    a->n_sub = (a->gsz + GM - 1) / GM;
    grid.y *= (unsigned)a->n_sub;
    if (c->fused && a->n_splits > 1 && (int64_t)grid.x * grid.y <= LM_CUDA_COUNTERS - 1) a->cnt = c->counters + 1;
    const size_t smem = (size_t)ATT_DEC_WARPS * LM_MIN(a->gsz, GM) * DPL * 32 * sizeof(float);
    if (smem > 48 * 1024)
        LM_CUDA_CHECK(cudaFuncSetAttribute(att_decode_kernel<DPL, GM, KT, VT>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    lm_cuda_launch_pdl(c, att_decode_kernel<DPL, GM, KT, VT>, grid, ATT_DEC_WARPS * 32, smem, *a);
    LM_CUDA_LAUNCHED("att_decode_kernel");
}

/* The formats of one type for K and V, and K8V4 (q4r reads as q4), have
 * kernels of their own; other mixes take the run-time switch. */
template <int DPL, int GM>
static void att_decode_launch(lm_cuda *c, dim3 grid, att_args *a) {
    const int kt = a->kt == LM_KV_Q4R ? LM_KV_Q4 : a->kt, vt = a->vt == LM_KV_Q4R ? LM_KV_Q4 : a->vt;
    if (kt == LM_KV_F32 && vt == LM_KV_F32) att_decode_launch_as<DPL, GM, LM_KV_F32, LM_KV_F32>(c, grid, a);
    else if (kt == LM_KV_BF16 && vt == LM_KV_BF16) att_decode_launch_as<DPL, GM, LM_KV_BF16, LM_KV_BF16>(c, grid, a);
    else if (kt == LM_KV_Q8 && vt == LM_KV_Q8) att_decode_launch_as<DPL, GM, LM_KV_Q8, LM_KV_Q8>(c, grid, a);
    else if (kt == LM_KV_Q4 && vt == LM_KV_Q4) att_decode_launch_as<DPL, GM, LM_KV_Q4, LM_KV_Q4>(c, grid, a);
    else if (kt == LM_KV_Q8 && vt == LM_KV_Q4) att_decode_launch_as<DPL, GM, LM_KV_Q8, LM_KV_Q4>(c, grid, a);
    else att_decode_launch_as<DPL, GM, ATT_KV_ANY, ATT_KV_ANY>(c, grid, a);
}

/* Few query tokens per sequence (decode, short drafts): one block per token.
 * Heads wider than the tiled kernel's 256 (Gemma 4's global layers) always
 * take this kernel. */
static bool att_use_decode(int T, int S, int Dh) {
    return (T <= 2 * S && (Dh == 64 || Dh == 128 || Dh == 256)) || Dh == 512;
}

static void att_decode(lm_cuda *c, lm_tensor *out, const lm_tensor *q, const lm_kv_pool *kv, int layer,
                       const lm_attn_batch *b, const lm_attn_params *p) {
    const int H = p->n_heads, Hkv = p->n_kv_heads, Dh = p->head_dim, T = b->n_tokens;
    att_dev d = att_stage_memo(c, kv, b, p->window, false);
    int max_range = 1;
    for (int t = 0; t < T; t++)
        max_range = LM_MAX(max_range, p->window > 0 ? LM_MIN(b->pos[t] + 1, p->window) : b->pos[t] + 1);
    /* splits: about att_blocks_sm blocks per SM (4: at 2 the 8B shape's
     * decode at 32k ran 0.87x (bf16) to 0.92x (q4r) as fast, H200), each split at least ATT_DEC_MIN_KEYS
     * keys of the range rounded up to a power of two (so that the launch, and
     * a CUDA graph of the step, changes at doublings, not every few tokens) */
    int range2 = 1;
    while (range2 < max_range) range2 *= 2;
    /* the tensor-core kernel: one wave of as many blocks as fit an SM */
    const int tc = lm_att_decode_tc_blocks(c, kv, layer, Dh, H / Hkv);
    const int64_t base = (int64_t)T * Hkv, target = (int64_t)(tc ? tc : c->att_blocks_sm) * LM_MAX(c->n_sms, 1);
    /* (the tensor-core kernel rounds down: one more block would start a wave) */
    int ns = (int)LM_MAX((int64_t)1, tc ? target / base : (target + base - 1) / base);
    ns = LM_MAX(1, LM_MIN(LM_MIN(ns, (range2 + ATT_DEC_MIN_KEYS - 1) / ATT_DEC_MIN_KEYS), ATT_MAX_SPLITS));
    att_args a = att_common_args(c, out, q, kv, layer, d, p, T, ns);
    dim3 grid((unsigned)T, (unsigned)Hkv, (unsigned)ns);
    /* groups of up to 4 query heads (Llama-3, Qwen3, Qwen3.5-9B) on blocks
     * of 4: the registers and dot products of 8 would be half empty */
    const bool g4 = H / Hkv <= 4;
    if (tc) lm_att_decode_tc_launch(c, grid, &a);
    else if (Dh == 64) g4 ? att_decode_launch<2, 4>(c, grid, &a) : att_decode_launch<2, 8>(c, grid, &a);
    else if (Dh == 128) g4 ? att_decode_launch<4, 4>(c, grid, &a) : att_decode_launch<4, 8>(c, grid, &a);
    else if (Dh == 256) g4 ? att_decode_launch<8, 4>(c, grid, &a) : att_decode_launch<8, 8>(c, grid, &a);
    else att_decode_launch<16, 2>(c, grid, &a);
    att_combine(c, &a, T);
    att_unrotate(c, kv, out, p, T);
}

template <int ND, bool GEN>
static void att_launch_as(lm_cuda *c, dim3 grid, const att_args *a) {
    const size_t smem = (size_t)(ATT_ROWS * ND * 32 + ATT_BK * (ND * 32 + 1) + ATT_BK * ND * 32) * sizeof(float);
    static bool opted; /* per instantiation; the limit is a property of the kernel */
    if (!opted)
        LM_CUDA_CHECK(
            cudaFuncSetAttribute(att_kernel<ND, GEN>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    opted = true;
    lm_cuda_launch(c, att_kernel<ND, GEN>, grid, ATT_THREADS, smem, *a);
    LM_CUDA_LAUNCHED("att_kernel");
}

template <int ND>
static void att_launch(lm_cuda *c, dim3 grid, const att_args *a) {
    if (a->kt == LM_KV_F32 && a->vt == LM_KV_F32) att_launch_as<ND, false>(c, grid, a);
    else att_launch_as<ND, true>(c, grid, a);
}

void lm_cuda_attention(lm_backend *be, lm_tensor *out, const lm_tensor *q, const lm_kv_pool *kv, int layer,
                       const lm_attn_batch *b, const lm_attn_params *p) {
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_use(c);
    const int H = p->n_heads, Hkv = p->n_kv_heads, Dh = p->head_dim, T = b->n_tokens, S = b->n_seqs;
    LM_ASSERT(H > 0 && Hkv > 0 && H % Hkv == 0 && Dh > 0 && (Dh <= ATT_MAX_DH || Dh == 512));
    LM_ASSERT(layer >= 0 && layer < kv->n_layers);
    const int64_t w = lm_kv_layer_width(kv, layer);
    LM_ASSERT((int64_t)Hkv * Dh <= w);
    LM_ASSERT(!(lm_kv_quantised(kv->k_type) || lm_kv_quantised(kv->v_type)) || w % LM_KV_GROUP == 0);
    if (kv->k_type == LM_KV_Q4R || kv->v_type == LM_KV_Q4R)
        LM_ASSERT(kv->rot >= 2 && kv->rot <= LM_KV_MAX_ROT && Dh % kv->rot == 0);
    LM_ASSERT(q->type == LM_F32 && out->type == LM_F32 && q->rows == T && out->rows == T);
    LM_ASSERT(q->cols >= (int64_t)H * Dh && out->cols >= (int64_t)H * Dh && out->data != q->data);
    if (T == 0 || lm_cuda_skip(c, LM_SKIP_ATTENTION)) return;
    if (att_use_decode(T, S, Dh)) {
        att_decode(c, out, q, kv, layer, b, p);
        return;
    }
    /* query rows a block: the tensor-core kernel's 64 or 128, else 64 */
    const int bf_rows = lm_att_bf16_rows(c, Dh, q->cols, w, kv->k_type, kv->v_type, q->data, kv->k[layer], kv->v[layer]);
    const bool tc_kv = kv->k_type == kv->v_type && (kv->k_type == LM_KV_F32 || kv->k_type == LM_KV_BF16);
    const int tc_rows =
        bf_rows ? 0 : tc_kv ? lm_att_tc_rows(c, Dh, q->cols, w, q->data, kv->k[layer], kv->v[layer]) : 0;
    const int rows = bf_rows ? bf_rows : tc_rows ? tc_rows : ATT_ROWS;
    const int gsz = H / Hkv, hb = LM_MIN(gsz, rows), n_sub = (gsz + hb - 1) / hb, tpb = rows / hb;

    /* Work list: tokens grouped by sequence (batch order inside one), cut
     * into tiles of tpb tokens; appended to the staged batch as
     * [T] token ids, then [n_tiles][4] tile records. */
    int32_t *cnt = (int32_t *)lm_xcalloc((size_t)S + 1, sizeof(int32_t));
    for (int t = 0; t < T; t++) {
        LM_ASSERT(b->seq[t] >= 0 && b->seq[t] < S);
        cnt[b->seq[t] + 1]++;
    }
    int n_tiles = 0;
    for (int s = 0; s < S; s++) n_tiles += (cnt[s + 1] + tpb - 1) / tpb;
    for (int s = 0; s < S; s++) cnt[s + 1] += cnt[s];
    const size_t n_extra = (size_t)T + 4 * (size_t)n_tiles;
    int32_t *extra = (int32_t *)lm_xmalloc(n_extra * sizeof(int32_t)), *tok = extra, *tiles = extra + T;
    {
        int32_t *fill = (int32_t *)lm_xmalloc((size_t)S * sizeof(int32_t));
        memcpy(fill, cnt, (size_t)S * sizeof(int32_t));
        for (int t = 0; t < T; t++) tok[fill[b->seq[t]]++] = t;
        free(fill);
    }
    int max_range = 0, nt = 0;
    for (int s = 0; s < S; s++)
        for (int i = cnt[s]; i < cnt[s + 1]; i += tpb) {
            int n = LM_MIN(tpb, cnt[s + 1] - i), lo = INT32_MAX, hi = -1;
            for (int k = i; k < i + n; k++) {
                int32_t ps = b->pos[tok[k]];
                lo = LM_MIN(lo, p->window > 0 ? LM_MAX(0, ps - p->window + 1) : 0);
                hi = LM_MAX(hi, ps);
            }
            int32_t *r = tiles + 4 * nt++;
            r[0] = i, r[1] = n, r[2] = lo, r[3] = hi;
            max_range = LM_MAX(max_range, hi - lo + 1);
        }
    LM_ASSERT(nt == n_tiles);
    free(cnt);
    att_dev d = att_stage(c, kv, b, p->window, false, extra, n_extra);
    free(extra);

    /* Splits: enough blocks for two per SM, each split at least
     * ATT_MIN_SPLIT_KEYS keys. */
    int sms = c->n_sms;
    if (sms <= 0) LM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, c->device));
    const int64_t base = (int64_t)n_tiles * Hkv * n_sub, target = 2 * (int64_t)LM_MAX(sms, 1);
    int ns = 1;
    if (base < target) {
        ns = (int)((target + base - 1) / base);
        ns = LM_MIN(ns, (max_range + ATT_MIN_SPLIT_KEYS - 1) / ATT_MIN_SPLIT_KEYS);
        ns = LM_MAX(1, LM_MIN(ns, ATT_MAX_SPLITS));
    }

    att_args a = att_common_args(c, out, q, kv, layer, d, p, T, ns);
    a.tok = d.extra;
    a.tiles = d.extra + T;
    a.hb = hb, a.n_sub = n_sub;
    dim3 grid((unsigned)n_tiles, (unsigned)(Hkv * n_sub), (unsigned)ns);
    if (bf_rows) lm_att_bf16_launch(c, grid, &a);
    else if (tc_rows) lm_att_tc_launch(c, grid, &a);
    else if (Dh <= 64) att_launch<2>(c, grid, &a);
    else if (Dh <= 128) att_launch<4>(c, grid, &a);
    else att_launch<8>(c, grid, &a);
    att_combine(c, &a, T);
    att_unrotate(c, kv, out, p, T);
}
