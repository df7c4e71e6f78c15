// stats.mjs - what a run means: per-run summaries (percentiles of TTFT,
// inter-token latency, end-to-end time; throughput), and arm B against arm
// A as paired ratios over blocks with a deterministic bootstrap interval.
//
// Pairing: block b ran both arms on the same workload seed, back to back
// (in AB or BA order). Its log-ratio ln(B_b / A_b) cancels what drifts
// between blocks (the machine, the workload's lengths); the estimate is
// exp(mean of the log-ratios), and the interval the 2.5th and 97.5th
// percentiles of that mean over resamples of the blocks (with replacement,
// a fixed seed, so the same results give the same interval). A ratio is
// withheld when a block's arms did different work (errors, another number
// of requests or output tokens): then it would compare unlike things.
import { makeRng } from './rng.mjs';

export const MIN_BLOCKS = 5;
export const BOOTSTRAP_RESAMPLES = 4000;

// The q-quantile (0..1) of xs, linear between order statistics; null if empty.
export function quantile(xs, q) {
  const v = xs.filter(Number.isFinite).sort((a, b) => a - b);
  if (!v.length) return null;
  const pos = (v.length - 1) * q;
  const lo = Math.floor(pos);
  return v[lo] + (v[Math.min(lo + 1, v.length - 1)] - v[lo]) * (pos - lo);
}

const mean = (xs) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null);

// The metrics of one run; `higherIsBetter` is for the reader of a ratio.
export const METRICS = {
  ttft_p50_ms: { label: 'TTFT p50 (ms)', higherIsBetter: false },
  ttft_p90_ms: { label: 'TTFT p90 (ms)', higherIsBetter: false },
  itl_mean_ms: { label: 'inter-token latency mean (ms)', higherIsBetter: false },
  e2e_p50_ms: { label: 'end-to-end p50 (ms)', higherIsBetter: false },
  output_tok_s: { label: 'output tokens/s', higherIsBetter: true },
};

export function summarize(run) {
  const ok = run.requests.filter((r) => !r.error);
  const ttft = ok.map((r) => r.ttft_ms);
  const itl = ok.flatMap((r) => r.itl_ms);
  const prompt = ok.reduce((n, r) => n + (r.prompt_tokens ?? 0), 0);
  const cached = ok.reduce((n, r) => n + (r.cached_tokens ?? 0), 0);
  return {
    requests: run.requests.length,
    errors: run.requests.length - ok.length,
    ttft_p50_ms: quantile(ttft, 0.5),
    ttft_p90_ms: quantile(ttft, 0.9),
    ttft_p99_ms: quantile(ttft, 0.99),
    itl_mean_ms: mean(itl),
    itl_p50_ms: quantile(itl, 0.5),
    itl_p99_ms: quantile(itl, 0.99),
    e2e_p50_ms: quantile(ok.map((r) => r.e2e_ms), 0.5),
    e2e_p90_ms: quantile(ok.map((r) => r.e2e_ms), 0.9),
    prompt_tokens: prompt,
    cached_tokens: cached,
    output_tokens: ok.reduce((n, r) => n + (r.output_tokens ?? 0), 0),
    output_tok_s: run.output_tok_s,
    requests_s: run.requests_s,
  };
}

// Why runs a and b of one block did different work, or null if they did not.
export function workDiffers(a, b) {
  if (a.requests.length !== b.requests.length) return `block ${a.block}: ${a.requests.length} vs ${b.requests.length} requests`;
  const errs = a.requests.filter((r) => r.error).length + b.requests.filter((r) => r.error).length;
  if (errs) return `block ${a.block}: ${errs} failed request(s)`;
  for (let i = 0; i < a.requests.length; i++)
    if (a.requests[i].output_tokens !== b.requests[i].output_tokens)
      return `block ${a.block}: request ${i} generated ${a.requests[i].output_tokens} vs ${b.requests[i].output_tokens} tokens`;
  return null;
}

// Percentile bootstrap of exp(mean(logs)) over resampled blocks.
export function bootstrapRatio(logs, { seed = 1, resamples = BOOTSTRAP_RESAMPLES, level = 0.95 } = {}) {
  const rng = makeRng(seed);
  const n = logs.length;
  const means = new Float64Array(resamples);
  for (let r = 0; r < resamples; r++) {
    let s = 0;
    for (let i = 0; i < n; i++) s += logs[Math.floor(rng() * n)];
    means[r] = s / n;
  }
  const sorted = Array.from(means).sort((a, b) => a - b);
  const a = (1 - level) / 2;
  return {
    ratio: Math.exp(mean(logs)),
    lo: Math.exp(quantile(sorted, a)),
    hi: Math.exp(quantile(sorted, 1 - a)),
  };
}

// Arm B / arm A for every metric at one concurrency, from that concurrency's
// runs ({ arm: 0|1, block, requests, summary }).
export function compareArms(runs, { seed = 1, minBlocks = MIN_BLOCKS } = {}) {
  const blocks = new Map();
  for (const r of runs) {
    if (!blocks.has(r.block)) blocks.set(r.block, [null, null]);
    blocks.get(r.block)[r.arm] = r;
  }
  const pairs = [...blocks.entries()].sort((x, y) => x[0] - y[0]).map(([, p]) => p).filter((p) => p[0] && p[1]);
  let withheld = null;
  if (pairs.length < minBlocks) withheld = `${pairs.length} paired blocks (at least ${minBlocks} needed)`;
  for (const [a, b] of pairs) withheld ??= workDiffers(a, b);
  const out = {};
  for (const m of Object.keys(METRICS)) {
    const logs = pairs.map(([a, b]) => Math.log(b.summary[m] / a.summary[m]));
    const c = { n_blocks: pairs.length, log_ratios: logs, withheld };
    if (!withheld && logs.some((x) => !Number.isFinite(x))) c.withheld = `${m} missing or zero in a block`;
    if (!c.withheld) Object.assign(c, bootstrapRatio(logs, { seed }));
    out[m] = c;
  }
  return out;
}

// Greedy outputs of the two arms, request by request: how many differ, and
// the first few differences (where the texts part).
export function compareOutputs(runs) {
  let compared = 0;
  let differing = 0;
  const examples = [];
  const byBlock = new Map();
  for (const r of runs) {
    if (!byBlock.has(r.block)) byBlock.set(r.block, []);
    byBlock.get(r.block)[r.arm] = r;
  }
  for (const [block, [a, b]] of byBlock) {
    if (!a || !b) continue;
    const n = Math.min(a.requests.length, b.requests.length);
    for (let i = 0; i < n; i++) {
      const ta = a.requests[i].text ?? '';
      const tb = b.requests[i].text ?? '';
      if (a.requests[i].error || b.requests[i].error) continue;
      compared++;
      if (ta === tb) continue;
      differing++;
      if (examples.length < 5) {
        let at = 0;
        while (at < ta.length && ta[at] === tb[at]) at++;
        examples.push({ block, request: i, at, a: ta.slice(at, at + 80), b: tb.slice(at, at + 80) });
      }
    }
  }
  return { compared, differing, examples };
}
