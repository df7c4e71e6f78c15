// bench_serve.test.mjs - `lumen bench-serve` and `lumen report` end to end:
// two configurations of lumen (prefix cache on, and off with --cache-ram 0)
// on the demo model in paired AB/BA blocks, the results file checked, then
// the report rendered and opened in headless Chromium (Debian's
// /usr/bin/chromium, or CHROMIUM) via puppeteer-core: no console errors, the
// plots there, and its numbers the same as the JSON's.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { bin, serveDemo, skipReason } from './live.mjs';

const chromium = process.env.CHROMIUM || '/usr/bin/chromium';

test('lumen bench-serve without node says so', { skip: skipReason() ?? false }, () => {
  const r = spawnSync(bin, ['bench-serve', '--help'], { env: { PATH: '/nonexistent' }, encoding: 'utf8' });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /node \(20 or later\) was not found/);
  const ok = spawnSync(bin, ['bench-serve', '--help'], { encoding: 'utf8' });
  assert.equal(ok.status, 0, ok.stderr);
  assert.match(ok.stdout, /--concurrency/);
  const help = spawnSync(bin, ['--help'], { encoding: 'utf8' });
  assert.match(help.stdout, /bench-serve/);
  assert.match(help.stdout, /\n {2}report /);
});

const skip = skipReason();
describe('paired blocks: prefix cache on (A) vs off (B)', { skip: skip ?? false }, () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'bench-serve-'));
  const results = path.join(dir, 'results.json');
  const html = path.join(dir, 'report.html');
  let on;
  let off;
  let res;
  before(async () => {
    [on, off] = await Promise.all([serveDemo(), serveDemo(['--cache-ram', '0'])]);
  });
  after(async () => { await Promise.all([on?.stop(), off?.stop()]); });

  test('bench-serve writes paired runs, ratios with intervals, equal greedy outputs', () => {
    const r = spawnSync(bin, ['bench-serve', '--url', `${on.url},${off.url}`, '--name', 'cache-on,cache-off',
      '--workload', 'shared-prefix', '--requests', '3', '--prefix-len', '400', '--input-len', '8', '--output-len', '6',
      '--concurrency', '1,2', '--blocks', '5', '--seed', '3', '--out', results, '--quiet'], { encoding: 'utf8', timeout: 120000 });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /\| 1 \| TTFT p50 \(ms\) \| [0-9.]+ \[[0-9.]+, [0-9.]+\] \|/);
    res = JSON.parse(readFileSync(results, 'utf8'));
    assert.equal(res.format, 'lumen-bench-serve/1');
    assert.deepEqual(res.arms.map((a) => a.name), ['cache-on', 'cache-off']);
    // 5 blocks of 2 arms at 2 concurrencies (the warm-up runs are discarded)
    assert.equal(res.runs.length, 2 * 10);
    for (const c of [1, 2]) {
      const blocks = res.runs.filter((x) => x.concurrency === c && x.block >= 0);
      for (let b = 0; b < 5; b++) {
        const order = blocks.filter((x) => x.block === b).sort((x, y) => x.position - y.position).map((x) => x.arm);
        assert.deepEqual(order, b % 2 ? [1, 0] : [0, 1], `block ${b} order`);
        assert.ok(blocks.filter((x) => x.block === b).every((x) => x.seed === 3 + (c - 1) * 5 + b), 'seeds');
      }
      for (const x of blocks) for (const q of x.requests) {
        assert.equal(q.error, null);
        assert.equal(q.output_tokens, 6);
        assert.ok(q.ttft_ms > 0 && Array.isArray(q.itl_ms));
      }
      const cmp = res.comparisons.find((x) => x.concurrency === c);
      const t = cmp.metrics.ttft_p50_ms;
      assert.equal(t.withheld, null);
      assert.ok(t.lo <= t.ratio && t.ratio <= t.hi);
      assert.equal(t.n_blocks, 5);
      assert.equal(cmp.outputs.compared, 15);
      assert.equal(cmp.outputs.differing, 0, JSON.stringify(cmp.outputs.examples));
    }
    // the cache-on arm reused the shared system prompt; the cache-off arm did not
    const cached = (a) => res.runs.filter((x) => x.arm === a && x.block >= 0).reduce((n, x) => n + x.summary.cached_tokens, 0);
    assert.ok(cached(0) > 0);
    assert.equal(cached(1), 0);
    assert.ok(res.runs[0].metrics_delta && Object.keys(res.runs[0].metrics_delta).length > 0);
  });

  const noChromium = existsSync(chromium) ? null : `chromium not found: ${chromium} (apt-get install chromium, or set CHROMIUM)`;
  test('lumen report renders a page that Chromium shows without errors, numbers as in the JSON', { skip: noChromium ?? false }, async () => {
    assert.ok(res, 'no results from the previous test');
    const r = spawnSync(bin, ['report', results, '--html', html], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    const page = readFileSync(html, 'utf8');
    assert.doesNotMatch(page, /<script|https?:\/\/(?!127\.0\.0\.1|www\.w3\.org\/2000\/svg)[a-z]/i); // self-contained
    const { default: puppeteer } = await import('puppeteer-core');
    const browser = await puppeteer.launch({ executablePath: chromium, headless: true,
      args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'] });
    try {
      const p = await browser.newPage();
      const problems = [];
      p.on('console', (m) => { if (m.type() === 'error') problems.push(m.text()); });
      p.on('pageerror', (e) => problems.push(String(e)));
      p.on('requestfailed', (q) => problems.push(`request failed: ${q.url()}`));
      await p.goto(`file://${html}`, { waitUntil: 'load' });
      const seen = await p.evaluate(() => ({
        svgs: document.querySelectorAll('svg.chart').length,
        series: document.querySelectorAll('svg.chart path.series').length,
        forest: document.querySelectorAll('svg.forest circle').length,
        cells: [...document.querySelectorAll('td[data-metric]')].map((td) => ({ arm: td.dataset.arm, c: Number(td.dataset.c), m: td.dataset.metric, v: td.dataset.value, text: td.textContent })),
        ratios: [...document.querySelectorAll('tr.ratio')].map((tr) => ({ c: Number(tr.dataset.c), m: tr.dataset.metric, ratio: tr.dataset.ratio, text: tr.textContent })),
        outputs: [...document.querySelectorAll('ul.outputs li')].map((li) => li.dataset.differing),
        width: document.querySelector('svg.chart').getBoundingClientRect().width,
      }));
      assert.deepEqual(problems, []);
      assert.equal(seen.svgs, 2 * 2 + 1 + 1); // TTFT and e2e CDFs per concurrency, throughput, forest
      assert.ok(seen.series >= 2 * 2 * 2 + 2);
      assert.equal(seen.forest, 2 * 5);
      assert.ok(seen.width > 100);
      assert.equal(seen.cells.length, 2 * 2 * 6);
      for (const cell of seen.cells) {
        const a = res.arms.findIndex((x) => x.name === cell.arm);
        // the median of 5 blocks, computed here from the JSON
        const vals = res.runs.filter((x) => x.arm === a && x.concurrency === cell.c).map((x) => x.summary[cell.m]).sort((x, y) => x - y);
        const want = vals[2];
        assert.equal(Number(cell.v), want, `${cell.arm} c=${cell.c} ${cell.m}`);
        assert.equal(cell.text, want.toFixed(2));
      }
      assert.equal(seen.ratios.length, 2 * 5);
      for (const row of seen.ratios) {
        const x = res.comparisons.find((c) => c.concurrency === row.c).metrics[row.m];
        assert.equal(Number(row.ratio), x.ratio);
        assert.ok(row.text.includes(`${x.ratio.toFixed(3)} [${x.lo.toFixed(3)}, ${x.hi.toFixed(3)}]`), row.text);
      }
      assert.deepEqual(seen.outputs, ['0', '0']);
    } finally {
      await browser.close();
    }
    const md = spawnSync(bin, ['report', results, '--markdown'], { encoding: 'utf8' });
    assert.equal(md.status, 0, md.stderr);
    assert.match(md.stdout, /\| cache-on \| 2 \|/);
  });
});
