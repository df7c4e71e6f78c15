// bench.mjs - the benchmark plan: for each concurrency (the i-th of the
// list), a discarded warm-up run per arm, then `blocks` blocks, block b on
// workload seed seed + i*blocks + b with
// the arms in AB order on even blocks and BA on odd ones (so neither arm
// always runs second, on a warmer machine). Each run is scraped for
// /metrics before and after. Returns the results object report.mjs reads.
import os from 'node:os';

import { delta, scrape } from './metrics.mjs';
import { runSessions } from './runner.mjs';
import { compareArms, compareOutputs, summarize } from './stats.mjs';
import { buildWorkload, corpusDigest } from './workloads.mjs';

const WARMUP_SEED_OFFSET = 1000003; // far from the blocks' seeds

async function serverModel(url, apiKey) {
  try {
    const res = await fetch(new URL('/v1/models', url), {
      headers: apiKey ? { authorization: `Bearer ${apiKey}` } : {}, signal: AbortSignal.timeout(5000),
    });
    const j = await res.json();
    return j.data?.[0]?.id ?? null;
  } catch {
    return null;
  }
}

// A request as the results keep it: timings, counts, the output text.
function keep(r) {
  const { session, turn, start_ms, ttft_ms, e2e_ms, itl_ms, prompt_tokens, cached_tokens, output_tokens,
    finish_reason, text, error, retries } = r;
  return { session, turn, start_ms, ttft_ms, e2e_ms, itl_ms, prompt_tokens, cached_tokens, output_tokens,
    finish_reason, text, error, retries };
}

export async function runBench(cfg, log = () => {}) {
  const arms = [];
  for (let i = 0; i < cfg.urls.length; i++) {
    const url = cfg.urls[i];
    arms.push({ name: cfg.names[i] ?? (i ? 'B' : 'A'), url, model: await serverModel(url, cfg.apiKey) });
  }
  const results = {
    format: 'lumen-bench-serve/1',
    created: new Date().toISOString(),
    command: cfg.command,
    machine: { hostname: os.hostname(), cpus: os.cpus().length, cpu: os.cpus()[0]?.model ?? '', platform: `${os.platform()} ${os.release()}`, node: process.version },
    config: { workload: cfg.workload, seed: cfg.seed, blocks: cfg.blocks, concurrency: cfg.concurrency, warmup: cfg.warmup, workload_options: cfg.workloadOptions, corpus: corpusDigest() },
    arms,
    runs: [],
    comparisons: [],
  };
  const one = async (armIdx, c, seed, block, position) => {
    const arm = arms[armIdx];
    const sessions = buildWorkload(cfg.workload, seed, cfg.workloadOptions);
    const before = await scrape(arm.url);
    const run = await runSessions(arm.url, sessions, {
      concurrency: c, model: cfg.model ?? arm.model ?? undefined, apiKey: cfg.apiKey, timeoutMs: cfg.timeoutMs,
      progress: (line) => log(`  ${arm.name} c=${c} ${block < 0 ? 'warm-up' : `block ${block}`}: ${line}`, true),
    });
    const after = await scrape(arm.url);
    const r = { arm: armIdx, concurrency: c, block, seed, position, wall_s: run.wall_s, output_tok_s: run.output_tok_s,
      requests_s: run.requests_s, requests: run.requests.map(keep), metrics_delta: delta(before, after) };
    r.summary = summarize(r);
    const s = r.summary;
    log(`  ${arm.name} c=${c} ${block < 0 ? 'warm-up' : `block ${block}`}: ${s.requests} requests, ${s.errors} errors, ` +
      `TTFT p50 ${s.ttft_p50_ms?.toFixed(1)} ms, ${s.output_tok_s.toFixed(1)} output tok/s`);
    return r;
  };
  for (const [ci, c] of cfg.concurrency.entries()) {
    // every concurrency gets seeds of its own: the same prompts again would
    // find the earlier concurrency's answers in a prefix cache
    const base = cfg.seed + ci * cfg.blocks;
    for (let w = 0; w < cfg.warmup; w++)
      for (let a = 0; a < arms.length; a++) await one(a, c, base + WARMUP_SEED_OFFSET + w, -1, a);
    const runs = [];
    for (let b = 0; b < cfg.blocks; b++) {
      const order = arms.length === 2 && b % 2 ? [1, 0] : arms.map((_, i) => i);
      for (let p = 0; p < order.length; p++) runs.push(await one(order[p], c, base + b, b, p));
    }
    results.runs.push(...runs);
    if (arms.length === 2) {
      results.comparisons.push({ concurrency: c, metrics: compareArms(runs, { seed: cfg.seed }), outputs: compareOutputs(runs) });
    }
  }
  return results;
}
