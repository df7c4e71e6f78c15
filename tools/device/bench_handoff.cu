/* bench_handoff.cu - what one kernel-to-kernel handoff costs on the GPU, by
 * three mechanisms, in a CUDA graph of a long chain of small kernels (the
 * shape of a batch-1 decode step: every kernel reads what the one before
 * wrote). Each kernel has `blocks` blocks of 256 threads; every block reads
 * the previous kernel's 16 KB vector and writes its share of the next one.
 *   plain: ordinary launches (the next kernel starts after the last ends)
 *   pdl:   programmatic dependent launch; griddepcontrol.wait before reading
 *   flag:  programmatic dependent launch; no wait: the producer's last block
 *          (a counter) publishes a step number with a release store after
 *          every block's writes, and the consumer's blocks spin on it with
 *          acquire loads before reading
 * Prints microseconds per kernel for each (best of four graph replays), for
 * 1, 32, 132 and 264 blocks a kernel. Built with the CUDA backend (target
 * bench_handoff); `bench_handoff [kernels]`. The flag mode needs sm_90 (PDL
 * lets the consumer run while the producer does; without it the consumer
 * waits for the producer's end anyway). */
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(x)                                                                     \
    do {                                                                             \
        cudaError_t e_ = (x);                                                        \
        if (e_ != cudaSuccess) {                                                     \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

enum { N = 4096, THREADS = 256 };

template <int MODE> /* 0 plain, 1 pdl, 2 flag */
__global__ void step_kernel(const float *x, float *y, int step, unsigned *counter, volatile unsigned *flag) {
#if __CUDA_ARCH__ >= 900 /* programmatic dependent launch: sm_90 on; elsewhere every mode runs as plain */
    if (MODE >= 1) asm volatile("griddepcontrol.launch_dependents;" :::);
    if (MODE == 1) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    if (MODE == 2 && threadIdx.x == 0) {
        unsigned v;
        do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
        while ((int)(v - (unsigned)step) < 0);
    }
    if (MODE == 2) __syncthreads();
    /* every block reads the whole vector (as a GEMV block reads x) and writes its share */
    float s = 0;
    for (int i = threadIdx.x; i < N; i += THREADS) s += x[i];
    __shared__ float red[THREADS / 32];
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0;
        for (int w = 0; w < THREADS / 32; w++) t += red[w];
        const int per = (N + gridDim.x - 1) / gridDim.x;
        for (int i = blockIdx.x * per; i < N && i < (blockIdx.x + 1) * per; i++) y[i] = t * 1e-9f + 1.0f;
    }
    if (MODE == 2) {
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            if (atomicAdd(counter, 1u) == gridDim.x - 1) { /* the last block: everyone's writes are done */
                *counter = 0;
                __threadfence();
                asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flag), "r"((unsigned)step + 1) : "memory");
            }
        }
    }
}

template <int MODE>
static float run(int blocks, int kernels, float *buf, unsigned *counter, unsigned *flag, cudaStream_t st) {
    CHECK(cudaMemset(counter, 0, sizeof *counter)); /* the flag is reset before each replay */
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int k = 0; k < kernels; k++) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = blocks, cfg.blockDim = THREADS, cfg.stream = st;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at, cfg.numAttrs = MODE >= 1 ? 1 : 0;
        CHECK(cudaLaunchKernelEx(&cfg, step_kernel<MODE>, (const float *)(buf + (k % 2) * N), buf + ((k + 1) % 2) * N,
                                 k, counter, (volatile unsigned *)flag));
    }
    CHECK(cudaStreamEndCapture(st, &g));
    CHECK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    float best = 1e30f;
    for (int rep = 0; rep < 5; rep++) {
        /* the flag counts steps across replays: restart it before each */
        CHECK(cudaMemsetAsync(flag, 0, sizeof *flag, st));
        CHECK(cudaEventRecord(a, st));
        CHECK(cudaGraphLaunch(ge, st));
        CHECK(cudaEventRecord(b, st));
        CHECK(cudaEventSynchronize(b));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        if (rep > 0 && ms < best) best = ms;
    }
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    CHECK(cudaGraphExecDestroy(ge));
    CHECK(cudaGraphDestroy(g));
    return 1e3f * best / kernels;
}

int main(int argc, char **argv) {
    const int kernels = argc > 1 ? atoi(argv[1]) : 2000;
    float *buf;
    unsigned *counter, *flag;
    CHECK(cudaMalloc(&buf, 2 * N * sizeof(float)));
    CHECK(cudaMemset(buf, 0, 2 * N * sizeof(float)));
    CHECK(cudaMalloc(&counter, sizeof(unsigned)));
    CHECK(cudaMalloc(&flag, sizeof(unsigned)));
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (int blocks : { 1, 32, 132, 264 }) {
        const float p = run<0>(blocks, kernels, buf, counter, flag, st);
        const float d = run<1>(blocks, kernels, buf, counter, flag, st);
        const float f = run<2>(blocks, kernels, buf, counter, flag, st);
        printf("{\"blocks\":%d,\"kernels\":%d,\"us_per_kernel_plain\":%.3f,\"us_per_kernel_pdl\":%.3f,"
               "\"us_per_kernel_flag\":%.3f}\n", blocks, kernels, p, d, f);
    }
    return 0;
}
