/* cuda_graph.cu - replaying a forward pass as one CUDA graph.
 *
 * Why. A decode step of an 8B model is ~450 small launches; issued one by
 * one on a stream each costs the device ~4 us between kernels, in a graph
 * ~2.4 us (tools/bench_cuda_gemv "launch", H200), and the host pays ~3.6 us
 * per launch. Replaying a captured graph removes most of both.
 *
 * How, without the model knowing. lm_model_forward brackets a forward with
 * graph_begin(key) / graph_end; key names the batch's shape (tokens,
 * sequences, outputs), not its data. Each forward of a known key then runs
 * the model's host code in REPLAY mode: every op does its host work as usual
 * but launches nothing; instead each launch (kernel, grid, block, shared
 * memory and every argument's bytes), cuBLAS call and in-op copy is hashed,
 * and host arrays are staged into one graph staging buffer (pinned host +
 * device, same offsets) whose bytes are copied to the device in one copy
 * before the graph runs. Reads (logits, argmax ids) are deferred until the
 * graph has run. At graph_end, the hash either equals the hash of the graph
 * captured for this key - the launches would be exactly those of the graph,
 * only the staged data differs - and the graph is launched; or it differs
 * (a block table grew past its bucket, attention took more splits, a scratch
 * buffer moved) and the forward runs again under stream capture, the graph
 * is updated in place (cudaGraphExecUpdate, ~55 us) or re-instantiated, and
 * launched. So a replayed graph never runs launches other than the ones the
 * eager code would have issued.
 *
 * What cannot be captured (an op that waits for the host, as MoE routing
 * does; alloc, free, write, copy, clear; a scratch buffer that must grow
 * during capture) abandons the pass: nothing more is issued or hashed
 * (DRY), and graph_end asks for the forward to run again eagerly. A key that
 * keeps missing or abandoning is switched off, so the worst case is one
 * extra host pass now and then, never a wrong result.
 *
 * Policy: a key's first forward runs eagerly (it warms every scratch
 * buffer); the second is captured; later ones replay. LUMEN_CUDA_GRAPHS=0
 * turns graphs off; LUMEN_CUDA_GRAPH_STATS=1 prints counts at destroy, and
 * where the wall time of the decode steps went (host pass, graph, idle):
 * of the steps whose launch waits for its reads, so not of look-ahead steps
 * (argmax_rows_later), whose reads it does not wait for. */
#include "cuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#define LM_GRAPH_KEYS 64                     /* shapes remembered (LRU) */
#define LM_GRAPH_STAGE0 ((size_t)4 << 20)    /* first graph staging buffer */
#define LM_GRAPH_ALIGN 256
#define LM_GRAPH_SEED 0x6c756d656e677261ull

typedef struct lm_graph_entry {
    uint64_t key;
    uint64_t hash;        /* of the launches captured in exec */
    cudaGraphExec_t exec; /* NULL until captured */
    uint64_t last_use;
    int seen, misses, abandons;
    bool off;
} lm_graph_entry;

typedef struct lm_graph_read {
    void *host;
    const void *dev;
    size_t bytes;
    int later; /* >= 0: the look-ahead ring entry whose event follows this copy (not waited for) */
} lm_graph_read;

struct lm_cuda_graphs {
    bool enabled, stats;
    lm_graph_entry keys[LM_GRAPH_KEYS];
    uint64_t clock;
    lm_graph_entry *cur;
    /* graph staging buffer: host arrays of the current pass */
    unsigned char *stage_host, *stage_dev;
    size_t stage_cap, stage_used, stage_want;
    bool stage_short; /* this pass outgrew the staging buffer: not the key's fault */
    cudaEvent_t staged; /* after the last copy out of stage_host */
    lm_graph_read *reads;
    int n_reads, cap_reads;
    /* counts for LUMEN_CUDA_GRAPH_STATS */
    long n_replay, n_capture, n_update, n_instantiate, n_miss, n_abandon, n_eager;
    /* and, for the replays that end with a read (decode steps), where a
     * step's wall time goes: on the host the pass (graph_begin to launch),
     * the launch calls, the wait for the reads and the time from the reads
     * to the next graph_begin; on the device (events, two sets in turn) the
     * staged copy in, the graph, the reads, and the idle time from the
     * previous step's reads to this one's copy */
    cudaEvent_t ev[2][4];
    int ev_set;
    bool ev_prev; /* ev[ev_set ^ 1] holds the previous timed step */
    double t_begin, t_synced, h_pass, h_launch, h_wait, h_between, d_in, d_graph, d_out, d_idle;
    long n_timed, n_between;
};

bool lm_cuda_env_flag(const char *name, bool dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    return strcmp(v, "0") != 0 && strcmp(v, "off") != 0 && strcmp(v, "no") != 0;
}

void lm_cuda_graphs_init(lm_cuda *c) {
    lm_cuda_graphs *g = (lm_cuda_graphs *)lm_xcalloc(1, sizeof *g);
    g->enabled = lm_cuda_env_flag("LUMEN_CUDA_GRAPHS", true);
    g->stats = lm_cuda_env_flag("LUMEN_CUDA_GRAPH_STATS", false);
    for (int i = 0; g->stats && i < 8; i++) LM_CUDA_CHECK(cudaEventCreate(&g->ev[i / 4][i % 4]));
    LM_CUDA_CHECK(cudaEventCreateWithFlags(&g->staged, cudaEventDisableTiming));
    c->graphs = g;
    c->gmode = LM_G_OFF;
}

void lm_cuda_graphs_free(lm_cuda *c) {
    lm_cuda_graphs *g = c->graphs;
    if (!g) return;
    if (g->stats)
        fprintf(stderr,
                "lumen: cuda graphs: %ld replayed, %ld captured (%ld updated in place, %ld instantiated), "
                "%ld hash misses, %ld abandoned, %ld eager forwards of graphable batches\n",
                g->n_replay, g->n_capture, g->n_update, g->n_instantiate, g->n_miss, g->n_abandon, g->n_eager);
    if (g->stats && g->n_timed) {
        const double n = (double)g->n_timed, nb = (double)LM_MAX(g->n_between, 1);
        fprintf(stderr,
                "lumen: cuda graphs: %ld replays with reads, mean us: host pass %.1f, launch calls %.1f, wait %.1f, "
                "reads to the next pass %.1f; device copy in %.1f, graph %.1f, reads %.1f, idle before the copy in %.1f\n",
                g->n_timed, 1e6 * g->h_pass / n, 1e6 * g->h_launch / n, 1e6 * g->h_wait / n, 1e6 * g->h_between / nb,
                1e3 * g->d_in / n, 1e3 * g->d_graph / n, 1e3 * g->d_out / n, 1e3 * g->d_idle / nb);
    }
    for (int i = 0; i < 8; i++)
        if (g->ev[i / 4][i % 4]) (void)cudaEventDestroy(g->ev[i / 4][i % 4]);
    for (int i = 0; i < LM_GRAPH_KEYS; i++)
        if (g->keys[i].exec) (void)cudaGraphExecDestroy(g->keys[i].exec);
    if (g->stage_host) (void)cudaFreeHost(g->stage_host);
    if (g->stage_dev) (void)cudaFree(g->stage_dev);
    if (g->staged) (void)cudaEventDestroy(g->staged);
    free(g->reads);
    free(g);
    c->graphs = NULL;
}

void lm_cuda_graph_counts(lm_cuda *c, long *replayed, long *captured) {
    *replayed = c->graphs ? c->graphs->n_replay : 0;
    *captured = c->graphs ? c->graphs->n_capture : 0;
}

/* ---- what ops call while a pass is on ----------------------------------------- */

void lm_cuda_graph_mix(lm_cuda *c, const void *bytes, size_t n) {
    c->ghash = XXH3_64bits_withSeed(bytes, n, c->ghash);
}

bool lm_cuda_gate(lm_cuda *c, const void *desc, size_t n) {
    if (c->gmode == LM_G_OFF) return true;
    if (c->gmode == LM_G_DRY) return false;
    lm_cuda_graph_mix(c, desc, n);
    return c->gmode == LM_G_CAPTURE;
}

void lm_cuda_graph_abandon(lm_cuda *c) {
    if (c->gmode == LM_G_OFF || c->gmode == LM_G_DRY) return;
    if (c->gmode == LM_G_CAPTURE) {
        cudaGraph_t g = NULL;
        cudaError_t err = cudaStreamEndCapture(c->stream, &g);
        if (g) (void)cudaGraphDestroy(g);
        if (err != cudaSuccess) (void)cudaGetLastError();
    }
    c->gmode = LM_G_DRY;
}

void *lm_cuda_graph_stage(lm_cuda *c, const void *host, size_t bytes) {
    lm_cuda_graphs *g = c->graphs;
    size_t off = (g->stage_used + LM_GRAPH_ALIGN - 1) / LM_GRAPH_ALIGN * LM_GRAPH_ALIGN;
    if (c->gmode == LM_G_DRY || off + bytes > g->stage_cap) {
        /* too small: this pass cannot be a graph; the next one gets room */
        if (off + bytes > g->stage_cap) {
            g->stage_want = LM_MAX(g->stage_want, 2 * (off + bytes));
            g->stage_short = true;
        }
        lm_cuda_graph_abandon(c);
        return g->stage_dev; /* never read: nothing is issued in DRY */
    }
    memcpy(g->stage_host + off, host, bytes);
    g->stage_used = off + bytes;
    return g->stage_dev + off;
}

void lm_cuda_graph_defer_read(lm_cuda *c, void *host, const void *dev, size_t bytes, int later) {
    lm_cuda_graphs *g = c->graphs;
    if (c->gmode == LM_G_DRY || !bytes) return;
    if (g->n_reads == g->cap_reads) {
        g->cap_reads = g->cap_reads ? 2 * g->cap_reads : 8;
        g->reads = (lm_graph_read *)lm_xrealloc(g->reads, (size_t)g->cap_reads * sizeof *g->reads);
    }
    g->reads[g->n_reads++] = (lm_graph_read){ host, dev, bytes, later };
    /* the copy is the graph's output, not a launch: its size is part of the shape */
    uint64_t d[2] = { (uint64_t)(uintptr_t)dev, (uint64_t)bytes };
    lm_cuda_graph_mix(c, d, sizeof d);
}

/* ---- the pass ----------------------------------------------------------------------- */

static lm_graph_entry *lm_graph_lookup(lm_cuda_graphs *g, uint64_t key) {
    lm_graph_entry *lru = &g->keys[0];
    for (int i = 0; i < LM_GRAPH_KEYS; i++) {
        lm_graph_entry *e = &g->keys[i];
        if (e->seen && e->key == key) return e;
        if (!e->seen || (lru->seen && e->last_use < lru->last_use)) lru = e;
    }
    if (lru->exec) (void)cudaGraphExecDestroy(lru->exec);
    memset(lru, 0, sizeof *lru);
    lru->key = key;
    return lru;
}

/* Starts a pass (REPLAY when a graph exists, else CAPTURE): fresh hash,
 * staging and deferred reads. */
static void lm_graph_start(lm_cuda *c, int mode) {
    lm_cuda_graphs *g = c->graphs;
    /* the previous pass's copy out of the staging buffer must be done
     * before this pass writes it (cheap: forwards end with a read) */
    LM_CUDA_CHECK(cudaEventSynchronize(g->staged));
    if (g->stage_want > g->stage_cap || !g->stage_host) {
        size_t cap = LM_MAX(g->stage_want, LM_GRAPH_STAGE0);
        if (g->stage_host) LM_CUDA_CHECK(cudaFreeHost(g->stage_host));
        if (g->stage_dev) {
            LM_CUDA_CHECK(cudaStreamSynchronize(c->stream)); /* a graph may still read it */
            LM_CUDA_CHECK(cudaFree(g->stage_dev));
        }
        LM_CUDA_CHECK(cudaMallocHost((void **)&g->stage_host, cap));
        LM_CUDA_CHECK(cudaMalloc((void **)&g->stage_dev, cap));
        g->stage_cap = cap;
    }
    g->stage_used = 0;
    g->stage_short = false;
    g->n_reads = 0;
    c->ghash = LM_GRAPH_SEED;
    c->gmode = mode;
    c->gpass++;
    if (mode == LM_G_CAPTURE) LM_CUDA_CHECK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
}

int lm_cuda_graph_begin(lm_backend *be, uint64_t key) {
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_graphs *g = c->graphs;
    LM_ASSERT(c->gmode == LM_G_OFF);
    if (!g->enabled) return 0;
    lm_cuda_use(c);
    lm_graph_entry *e = lm_graph_lookup(g, key);
    e->seen++;
    e->last_use = ++g->clock;
    if (e->off || e->seen < 2) {
        g->n_eager++;
        return 0;
    }
    g->cur = e;
    if (g->stats) g->t_begin = lm_now();
    lm_graph_start(c, e->exec ? LM_G_REPLAY : LM_G_CAPTURE);
    return 1;
}

/* Copies the staged bytes in, runs e's graph, then the deferred reads;
 * waits for them unless every one is a look-ahead read. */
static void lm_graph_launch(lm_cuda *c, lm_graph_entry *e, bool replay) {
    lm_cuda_graphs *g = c->graphs;
    bool wait = false;
    for (int i = 0; i < g->n_reads; i++) wait |= g->reads[i].later < 0;
    const bool timed = g->stats && replay && wait;
    cudaEvent_t *ev = g->ev[g->ev_set];
    double t0 = 0, t1 = 0;
    if (timed) {
        t0 = lm_now();
        g->h_pass += t0 - g->t_begin;
        LM_CUDA_CHECK(cudaEventRecord(ev[0], c->stream));
    }
    if (g->stage_used)
        LM_CUDA_CHECK(cudaMemcpyAsync(g->stage_dev, g->stage_host, g->stage_used, cudaMemcpyHostToDevice, c->stream));
    LM_CUDA_CHECK(cudaEventRecord(g->staged, c->stream));
    if (timed) LM_CUDA_CHECK(cudaEventRecord(ev[1], c->stream));
    LM_CUDA_CHECK(cudaGraphLaunch(e->exec, c->stream));
    if (timed) LM_CUDA_CHECK(cudaEventRecord(ev[2], c->stream));
    for (int i = 0; i < g->n_reads; i++) {
        LM_CUDA_CHECK(cudaMemcpyAsync(g->reads[i].host, g->reads[i].dev, g->reads[i].bytes, cudaMemcpyDeviceToHost,
                                      c->stream));
        if (g->reads[i].later >= 0) lm_cuda_later_commit(c, g->reads[i].later);
    }
    if (timed) {
        LM_CUDA_CHECK(cudaEventRecord(ev[3], c->stream));
        t1 = lm_now();
        g->h_launch += t1 - t0;
    }
    if (wait) LM_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    if (timed) {
        const double t2 = lm_now();
        g->h_wait += t2 - t1;
        float ms[4] = { 0, 0, 0, 0 };
        LM_CUDA_CHECK(cudaEventElapsedTime(&ms[0], ev[0], ev[1]));
        LM_CUDA_CHECK(cudaEventElapsedTime(&ms[1], ev[1], ev[2]));
        LM_CUDA_CHECK(cudaEventElapsedTime(&ms[2], ev[2], ev[3]));
        g->d_in += ms[0], g->d_graph += ms[1], g->d_out += ms[2];
        if (g->ev_prev) { /* consecutive timed steps: the gap between them */
            LM_CUDA_CHECK(cudaEventElapsedTime(&ms[3], g->ev[g->ev_set ^ 1][3], ev[0]));
            g->d_idle += ms[3];
            g->h_between += g->t_begin - g->t_synced;
            g->n_between++;
        }
        g->t_synced = t2;
        g->n_timed++;
        g->ev_set ^= 1;
    }
    g->ev_prev = timed;
    g->n_reads = 0;
}

/* A key that misses or abandons often is not worth the extra host pass. */
static void lm_graph_maybe_off(lm_graph_entry *e) {
    if ((e->misses >= 8 && 4 * e->misses > e->seen) || e->abandons >= 2) e->off = true;
}

int lm_cuda_graph_end(lm_backend *be, bool ok) {
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_graphs *g = c->graphs;
    lm_graph_entry *e = g->cur;
    if (c->gmode == LM_G_OFF) return 0; /* an eager pass: done */
    if (!ok) {
        lm_cuda_graph_abandon(c);
        c->gmode = LM_G_OFF;
        return 1; /* the eager run reports the error */
    }
    if (c->gmode == LM_G_DRY) {
        c->gmode = LM_G_OFF;
        g->n_abandon++;
        if (!g->stage_short) e->abandons++; /* a bigger buffer comes with the next pass */
        lm_graph_maybe_off(e);
        return 1;
    }
    if (c->gmode == LM_G_REPLAY) {
        if (c->ghash == e->hash) {
            c->gmode = LM_G_OFF;
            lm_graph_launch(c, e, true);
            g->n_replay++;
            return 0;
        }
        g->n_miss++;
        e->misses++;
        lm_graph_maybe_off(e);
        if (e->off) {
            c->gmode = LM_G_OFF;
            return 1;
        }
        lm_graph_start(c, LM_G_CAPTURE);
        return 1;
    }
    /* CAPTURE */
    cudaGraph_t graph = NULL;
    cudaError_t err = cudaStreamEndCapture(c->stream, &graph);
    c->gmode = LM_G_OFF;
    if (err != cudaSuccess || !graph) {
        (void)cudaGetLastError();
        if (graph) (void)cudaGraphDestroy(graph);
        g->n_abandon++;
        e->abandons++;
        lm_graph_maybe_off(e);
        return 1;
    }
    bool updated = false;
    if (e->exec) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(e->exec, graph, &info) == cudaSuccess) {
            updated = true;
        } else {
            (void)cudaGetLastError();
            LM_CUDA_CHECK(cudaGraphExecDestroy(e->exec));
            e->exec = NULL;
        }
    }
    if (!updated) {
        LM_CUDA_CHECK(cudaGraphInstantiate(&e->exec, graph, 0));
        g->n_instantiate++;
    } else {
        g->n_update++;
    }
    LM_CUDA_CHECK(cudaGraphDestroy(graph));
    e->hash = c->ghash;
    g->n_capture++;
    lm_graph_launch(c, e, false);
    return 0;
}
