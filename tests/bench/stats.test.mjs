// stats.test.mjs - bench-serve's statistics (tools/benchserve/stats.mjs):
// the bootstrap interval against an exact enumeration, its determinism and
// its coverage on synthetic paired blocks with a known ratio, and the rules
// that withhold a ratio when the arms did different work.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { makeRng } from '../../tools/benchserve/rng.mjs';
import { bootstrapRatio, compareArms, compareOutputs, quantile, summarize } from '../../tools/benchserve/stats.mjs';

// Synthetic runs: arm B's TTFT = arm A's * ratio * noise, same work.
function syntheticRuns({ blocks, ratio, noise, seed, tweak = () => {} }) {
  const rng = makeRng(seed);
  const gauss = () => Math.sqrt(-2 * Math.log(1 - rng())) * Math.cos(2 * Math.PI * rng());
  const runs = [];
  for (let b = 0; b < blocks; b++) {
    const base = 50 + 50 * rng(); // blocks differ a lot; pairing cancels it
    for (const arm of [0, 1]) {
      const f = arm ? ratio * Math.exp(noise * gauss()) : 1;
      const requests = [0, 1, 2].map((i) => ({ ttft_ms: base * f * (1 + i / 10), e2e_ms: 2 * base * f, itl_ms: [base * f / 10],
        output_tokens: 8, prompt_tokens: 20, cached_tokens: 0, text: `out ${b} ${i}`, error: null }));
      const run = { arm, block: b, requests, output_tok_s: 24 / (base * f), requests_s: 1 };
      tweak(run);
      run.summary = summarize(run);
      runs.push(run);
    }
  }
  return runs;
}

test('quantile interpolates between order statistics', () => {
  assert.equal(quantile([3, 1, 2], 0.5), 2);
  assert.equal(quantile([1, 2, 3, 4], 0.5), 2.5);
  assert.equal(quantile([], 0.5), null);
});

test('bootstrap interval matches the exact bootstrap distribution', () => {
  // Three blocks: all 27 resamples enumerated give the exact distribution
  // of the resampled mean; the Monte Carlo percentiles must land on it.
  const logs = [Math.log(0.8), Math.log(1.0), Math.log(1.5)];
  const means = [];
  for (const a of logs) for (const b of logs) for (const c of logs) means.push((a + b + c) / 3);
  means.sort((x, y) => x - y);
  const exactCdf = (x) => means.filter((m) => m <= x + 1e-12).length / means.length;
  const r = bootstrapRatio(logs, { seed: 3, resamples: 20000 });
  assert.ok(Math.abs(r.ratio - Math.exp((logs[0] + logs[1] + logs[2]) / 3)) < 1e-12);
  // the lower bound is a resampled mean at or above the exact 2.5% point
  assert.ok(exactCdf(Math.log(r.lo)) >= 0.025 - 0.01 && exactCdf(Math.log(r.lo)) <= 0.1, `lo ${r.lo}`);
  assert.ok(exactCdf(Math.log(r.hi)) >= 0.95, `hi ${r.hi}`);
  // two blocks: the resampled means are a, (a+b)/2, b with weights 1/4, 1/2, 1/4
  const two = bootstrapRatio([Math.log(2), Math.log(4)], { seed: 1 });
  assert.ok(Math.abs(two.lo - 2) < 1e-9 && Math.abs(two.hi - 4) < 1e-9, `${two.lo} ${two.hi}`);
});

test('bootstrap is deterministic for a seed and depends on it', () => {
  const logs = [0.1, -0.05, 0.2, 0.03, 0.12, 0.07];
  assert.deepEqual(bootstrapRatio(logs, { seed: 7 }), bootstrapRatio(logs, { seed: 7 }));
  assert.notDeepEqual(bootstrapRatio(logs, { seed: 7 }), bootstrapRatio(logs, { seed: 8 }));
});

test('95% interval covers the true ratio in about 95% of synthetic experiments', () => {
  const rng = makeRng(99);
  const gauss = () => Math.sqrt(-2 * Math.log(1 - rng())) * Math.cos(2 * Math.PI * rng());
  let covered = 0;
  const trials = 300;
  for (let t = 0; t < trials; t++) {
    const logs = Array.from({ length: 12 }, () => Math.log(0.8) + 0.1 * gauss());
    const c = bootstrapRatio(logs, { seed: t, resamples: 1000 });
    if (c.lo <= 0.8 && c.hi >= 0.8) covered++;
  }
  // a percentile bootstrap over 12 blocks undercovers a little
  assert.ok(covered / trials >= 0.85 && covered / trials <= 0.99, `coverage ${covered / trials}`);
});

test('pairing removes the between-block spread', () => {
  const runs = syntheticRuns({ blocks: 6, ratio: 1.25, noise: 0.001, seed: 5 });
  const c = compareArms(runs, { seed: 1 });
  assert.ok(Math.abs(c.ttft_p50_ms.ratio - 1.25) < 0.01, String(c.ttft_p50_ms.ratio));
  assert.ok(c.ttft_p50_ms.hi / c.ttft_p50_ms.lo < 1.01);
  assert.ok(Math.abs(c.output_tok_s.ratio - 0.8) < 0.01, String(c.output_tok_s.ratio));
});

test('a ratio is withheld when the arms did different work', () => {
  const unequal = syntheticRuns({ blocks: 6, ratio: 1, noise: 0.05, seed: 2,
    tweak: (r) => { if (r.arm === 1 && r.block === 3) r.requests[1].output_tokens = 7; } });
  let c = compareArms(unequal);
  for (const m of Object.values(c)) {
    assert.match(m.withheld, /block 3: request 1 generated 8 vs 7 tokens/);
    assert.equal(m.ratio, undefined);
  }
  const failed = syntheticRuns({ blocks: 6, ratio: 1, noise: 0.05, seed: 2,
    tweak: (r) => { if (r.arm === 0 && r.block === 0) r.requests[2].error = 'HTTP 500'; } });
  assert.match(compareArms(failed).ttft_p50_ms.withheld, /failed request/);
  const few = syntheticRuns({ blocks: 4, ratio: 1, noise: 0.05, seed: 2 });
  assert.match(compareArms(few).ttft_p50_ms.withheld, /4 paired blocks/);
  const ok = syntheticRuns({ blocks: 5, ratio: 1, noise: 0.05, seed: 2 });
  assert.equal(compareArms(ok).ttft_p50_ms.withheld, null);
});

test('greedy outputs are compared request by request', () => {
  const runs = syntheticRuns({ blocks: 5, ratio: 1, noise: 0.05, seed: 2,
    tweak: (r) => { if (r.arm === 1 && r.block === 2) r.requests[0].text = 'out 2 X'; } });
  const o = compareOutputs(runs);
  assert.equal(o.compared, 15);
  assert.equal(o.differing, 1);
  assert.deepEqual(o.examples[0], { block: 2, request: 0, at: 6, a: '0', b: 'X' });
});
