/* cuda_delta_check.cpp - the GPU's chunked Gated DeltaNet kernel
 * (src/backend/cuda/cuda_delta_chunk.h) run on the CPU, against the delta
 * rule's token-by-token recurrence in double, so that a machine without a
 * GPU (CI, the mutation runs) still checks its indexing, its shared-memory
 * layout and its phases.
 *
 * The header is compiled as host C++: a block is 256 std::threads, each
 * running the kernel with its own threadIdx; __syncthreads is a barrier of
 * all of them and the warp shuffles exchange through memory between two
 * barriers of the warp's 32; shared memory is one buffer filled with NaN
 * before each block, so a read of anything not written shows in the
 * outputs. Blocks run one after another. Cases: heads 16, 48 x 40, 18 x 10,
 * 128 and 256 x 256 (the two template forms), several column splits (Dvb),
 * sequences of 1 .. 130 tokens across the 64-token chunks, fresh and
 * continuing states, short sequences left to the recurrent kernel
 * (rec_max 16: their state and outputs untouched), fused gates, strong and
 * weak decay. Outputs and states within 2e-5 of the double recurrence
 * (observed ~1e-7). Exit status 0 when all hold. Run by the test
 * cuda_delta_chunked_kernel_on_the_cpu. */
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

using std::max;
using std::min;

/* ---- CUDA written out for the host ------------------------------------------ */

#define LM_DELTA_HOST_CHECK
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(a, b)
#define __align__(x) alignas(x)
#define __shared__ static /* one block at a time */

struct dc_dim3 {
    unsigned x, y, z;
};
static thread_local dc_dim3 threadIdx, blockIdx;

struct alignas(16) float4 {
    float x, y, z, w;
};
static inline float4 make_float4(float a, float b, float c, float d) { return float4{ a, b, c, d }; }

/* A reusable barrier of n threads. */
struct dc_barrier {
    std::mutex m;
    std::condition_variable cv;
    int n, count = 0;
    unsigned gen = 0;
    explicit dc_barrier(int n_) : n(n_) {}
    void wait() {
        std::unique_lock<std::mutex> l(m);
        const unsigned g = gen;
        if (++count == n) {
            count = 0, gen++;
            cv.notify_all();
        } else {
            cv.wait(l, [&] { return gen != g; });
        }
    }
};

enum { DC_THREADS = 256, DC_WARPS = DC_THREADS / 32 };
static dc_barrier *dc_block_bar;
static dc_barrier *dc_warp_bar[DC_WARPS];
static double dc_xch[DC_THREADS];
static float *lm_delta_host_smem;

static inline void __syncthreads() { dc_block_bar->wait(); }

/* Lane src's v (the caller's own when src is outside the warp). */
template <typename T> static T dc_shfl(T v, int src) {
    const int tid = (int)threadIdx.x, w = tid / 32;
    dc_xch[tid] = (double)v;
    dc_warp_bar[w]->wait();
    const T r = src >= 0 && src < 32 ? (T)dc_xch[w * 32 + src] : v;
    dc_warp_bar[w]->wait();
    return r;
}
template <typename T> static T __shfl_xor_sync(unsigned, T v, int o) { return dc_shfl(v, (int)(threadIdx.x % 32) ^ o); }
template <typename T> static T __shfl_up_sync(unsigned, T v, int o) {
    const int l = (int)(threadIdx.x % 32);
    return dc_shfl(v, l >= o ? l - o : -1);
}
template <typename T> static T __shfl_sync(unsigned, T v, int src) { return dc_shfl(v, src); }
static inline void lm_pdl_wait() {}
static inline void lm_pdl_trigger() {}
#define DELTA_FULL 0xffffffffu

#include "../../src/backend/cuda/cuda_delta_chunk.h"

/* ---- the check ------------------------------------------------------------------ */

static uint64_t dc_seed = 12345;

static float dc_rnd(float lo, float hi) {
    dc_seed = dc_seed * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((dc_seed >> 40) & 0xffffff) / (float)0x1000000;
}

/* Every block of grid (gx, gy, gz), one after another. */
template <int CT, int PM> static void dc_launch(const delta_args &a, unsigned gx, unsigned gy, unsigned gz, size_t smem) {
    std::vector<float> sm(smem / sizeof(float) + 4);
    lm_delta_host_smem = sm.data();
    for (unsigned z = 0; z < gz; z++)
        for (unsigned y = 0; y < gy; y++)
            for (unsigned x = 0; x < gx; x++) {
                std::fill(sm.begin(), sm.end(), NAN);
                dc_barrier bar(DC_THREADS);
                dc_block_bar = &bar;
                for (int w = 0; w < DC_WARPS; w++) dc_warp_bar[w] = new dc_barrier(32);
                std::vector<std::thread> th;
                for (unsigned t = 0; t < DC_THREADS; t++)
                    th.emplace_back([=] {
                        threadIdx = dc_dim3{ t, 0, 0 };
                        blockIdx = dc_dim3{ x, y, z };
                        delta_chunk_kernel<CT, PM>(a);
                    });
                for (auto &t : th) t.join();
                for (int w = 0; w < DC_WARPS; w++) delete dc_warp_bar[w];
            }
}

typedef struct dc_case {
    int Hk, Hv, Dk, Dv;
    bool tiled;
    int S;
    int n[3], pos0[3]; /* tokens and first position of each sequence */
    int Dvb, rec_max;
    float glo, ghi;
    bool fused; /* g and beta raw, the gates in the kernel */
} dc_case;

/* Runs one case (tokens dealt round-robin, slot of sequence s = s + 1,
 * slot 0 unused) and compares; returns true when it holds. */
static bool dc_run(const dc_case &c) {
    const int Hk = c.Hk, Hv = c.Hv, Dk = c.Dk, Dv = c.Dv, S = c.S;
    const int64_t C = 2LL * Hk * Dk + (int64_t)Hv * Dv, O = (int64_t)Hv * Dv, floats = (int64_t)Hv * Dk * Dv;
    int T = 0;
    for (int s = 0; s < S; s++) T += c.n[s];
    std::vector<int32_t> pos(T), seq(T), slot(S), start(S + 1, 0), tok(T);
    std::vector<int> used(S, 0);
    for (int t = 0; t < T;)
        for (int s = 0; s < S; s++)
            if (used[s] < c.n[s]) pos[t] = c.pos0[s] + used[s]++, seq[t++] = s;
    for (int s = 0; s < S; s++) slot[s] = s + 1;
    for (int t = 0; t < T; t++) start[seq[t] + 1]++;
    for (int s = 0; s < S; s++) start[s + 1] += start[s];
    std::vector<int32_t> fill(start);
    for (int t = 0; t < T; t++) tok[fill[seq[t]]++] = t;
    std::vector<float> qkv(T * C), g(T * Hv), be(T * Hv), out(T * O, NAN), alog(Hv), dtb(Hv);
    std::vector<float> st((S + 1) * floats);
    for (auto &x : qkv) x = dc_rnd(-1, 1);
    for (auto &x : alog) x = dc_rnd(-3, -1);
    for (auto &x : dtb) x = dc_rnd(-1, 1);
    for (int i = 0; i < T * Hv; i++) {
        g[i] = c.fused ? dc_rnd(-2, 2) : dc_rnd(c.glo, c.ghi);
        be[i] = c.fused ? dc_rnd(-3, 3) : dc_rnd(0.05f, 1.0f);
    }
    for (auto &x : st) x = dc_rnd(-1, 1);
    const std::vector<float> st0 = st, out0 = out;

    delta_args a;
    memset(&a, 0, sizeof a);
    a.out = out.data(), a.qkv = qkv.data(), a.g = g.data(), a.beta = be.data();
    if (c.fused) a.a_log = alog.data(), a.dt_bias = dtb.data();
    a.qkv_ld = C, a.out_ld = O, a.state = st.data(), a.slot_floats = floats, a.st_off = 0;
    a.q = delta_seqs{ pos.data(), slot.data(), start.data(), tok.data() };
    a.Hk = Hk, a.Hv = Hv, a.Dk = Dk, a.Dv = Dv, a.v_tiled = c.tiled, a.rec_max = c.rec_max;
    a.DkP = (Dk + 3) / 4 * 4, a.Dvb = c.Dvb;
    const size_t smem = dch_smem_bytes(a.DkP, a.Dvb);
    const unsigned gz = (unsigned)((Dv + a.Dvb - 1) / a.Dvb);
    if (a.DkP <= 128) dc_launch<2, 2>(a, (unsigned)Hv, (unsigned)S, gz, smem);
    else dc_launch<1, 4>(a, (unsigned)Hv, (unsigned)S, gz, smem);

    double eo = 0, es = 0;
    bool untouched = memcmp(st.data(), st0.data(), (size_t)floats * sizeof(float)) == 0;
    for (int s = 0; s < S; s++) {
        float *S1 = st.data() + slot[s] * floats;
        const float *S0 = st0.data() + slot[s] * floats;
        if (c.n[s] < c.rec_max) { /* the recurrent kernel's: untouched */
            untouched = untouched && memcmp(S1, S0, (size_t)floats * sizeof(float)) == 0;
            for (int it = start[s]; it < start[s + 1]; it++)
                untouched = untouched && memcmp(&out[tok[it] * O], &out0[tok[it] * O], (size_t)O * sizeof(float)) == 0;
            continue;
        }
        for (int h = 0; h < Hv; h++) {
            const int hk = c.tiled ? h % Hk : h / (Hv / Hk);
            std::vector<double> Sd((size_t)Dk * Dv), q(Dk), k(Dk);
            for (int i = 0; i < Dk * Dv; i++) Sd[i] = c.pos0[s] == 0 ? 0.0 : S0[(int64_t)h * Dk * Dv + i];
            for (int it = start[s]; it < start[s + 1]; it++) {
                const int t = tok[it];
                const float *row = &qkv[t * C];
                double sq = 0, sk = 0, qk = 0;
                for (int d = 0; d < Dk; d++) {
                    q[d] = row[hk * Dk + d], k[d] = row[Hk * Dk + hk * Dk + d];
                    sq += q[d] * q[d], sk += k[d] * k[d];
                }
                for (int d = 0; d < Dk; d++) q[d] /= sqrt(sq + 1e-6) * sqrt((double)Dk), k[d] /= sqrt(sk + 1e-6);
                for (int d = 0; d < Dk; d++) qk += q[d] * k[d];
                double gg = g[t * Hv + h], bb = be[t * Hv + h];
                if (c.fused) {
                    const double x = gg + dtb[h];
                    gg = -exp((double)alog[h]) * (x > 20.0 ? x : log1p(exp(x)));
                    bb = 1.0 / (1.0 + exp(-bb));
                }
                const double al = exp(gg);
                for (int v = 0; v < Dv; v++) {
                    double skv = 0, sqv = 0;
                    for (int d = 0; d < Dk; d++) skv += Sd[d * Dv + v] * k[d], sqv += Sd[d * Dv + v] * q[d];
                    const double u = bb * (row[2 * Hk * Dk + h * Dv + v] - al * skv), o = al * sqv + qk * u;
                    const float got = out[t * O + h * Dv + v];
                    eo = std::isnan(got) ? INFINITY : max(eo, fabs(o - got));
                    for (int d = 0; d < Dk; d++) Sd[d * Dv + v] = al * Sd[d * Dv + v] + k[d] * u;
                }
            }
            for (int i = 0; i < Dk * Dv; i++) {
                const float got = S1[(int64_t)h * Dk * Dv + i];
                es = std::isnan(got) ? INFINITY : max(es, fabs(Sd[i] - got));
            }
        }
    }
    const bool ok = eo <= 2e-5 && es <= 2e-5 && untouched;
    printf("Dk %d Dv %d (Hk %d Hv %d%s) Dvb %d rec_max %d, tokens %d %d %d from %d %d %d, g [%g, %g]%s: out %.2g, "
           "state %.2g, others %s%s\n",
           Dk, Dv, Hk, Hv, c.tiled ? " tiled" : "", c.Dvb, c.rec_max, c.n[0], S > 1 ? c.n[1] : 0, S > 2 ? c.n[2] : 0,
           c.pos0[0], S > 1 ? c.pos0[1] : 0, S > 2 ? c.pos0[2] : 0, c.glo, c.ghi, c.fused ? ", fused gates" : "", eo,
           es, untouched ? "untouched" : "CHANGED", ok ? "" : "  FAIL");
    return ok;
}

int main(void) {
    static const dc_case cases[] = {
        { 1, 2, 16, 16, false, 3, { 70, 1, 130 }, { 0, 5, 12 }, 16, 1, -1.0f, 0.0f, false },
        { 1, 2, 16, 16, true, 3, { 70, 1, 130 }, { 0, 5, 12 }, 8, 1, -1.0f, 0.0f, false },
        { 1, 3, 48, 40, false, 3, { 70, 1, 130 }, { 0, 5, 12 }, 40, 1, -1.0f, 0.0f, false },
        { 1, 3, 48, 40, false, 3, { 70, 1, 130 }, { 0, 5, 12 }, 12, 16, -1.0f, 0.0f, false },
        { 1, 3, 18, 10, false, 3, { 70, 1, 63 }, { 0, 5, 12 }, 12, 1, 0.0f, 0.0f, true },
        { 1, 1, 128, 128, false, 2, { 65, 3, 0 }, { 3, 0, 0 }, 128, 1, -1.0f, 0.0f, false },
        { 1, 1, 128, 128, false, 2, { 65, 3, 0 }, { 3, 0, 0 }, 64, 16, -20.0f, -5.0f, false },
        { 1, 1, 256, 256, false, 2, { 64, 2, 0 }, { 3, 0, 0 }, 32, 1, -1.0f, 0.0f, false },
        { 1, 1, 100, 36, false, 2, { 64, 2, 0 }, { 3, 0, 0 }, 36, 1, -0.01f, 0.0f, false },
    };
    int bad = 0;
    for (const dc_case &c : cases) bad += !dc_run(c);
    printf("%s\n", bad ? "chunked delta kernel: FAILED" : "chunked delta kernel: all within 2e-5");
    return bad != 0;
}
