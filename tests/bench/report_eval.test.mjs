// report_eval.test.mjs - `lumen eval` lines in bench-serve's report: the
// quality ledger in HTML (values in data-* attributes) and Markdown, the
// `lumen report` command taking JSON-lines files beside results files, and
// its refusal of a file that is neither.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import { isEvalLine, renderHtml, renderMarkdown } from '../../tools/benchserve/report.mjs';

// Two lines as `lumen eval -m demo --reference demo --kv-type T` prints them.
const EVALS = [
  { model: 'models/demo', text: 't.txt', ctx: 256, kv: 'q8', tokens: 1205, windows: 5, scored: 1200, nll: 1.31072626,
    ppl: 3.70886632, reference: 'models/demo', ref_nll: 1.31107893, ref_ppl: 3.71017459, kl_mean: 4.1461775e-5,
    kl_p99: 0.000381440109, kl_max: 0.00189053782, top1: 0.9975 },
  { model: 'models/demo', text: 't.txt', ctx: 256, kv: 'q4r', tokens: 1205, windows: 5, scored: 1200, nll: 1.33,
    ppl: 3.781, reference: 'models/demo', ref_nll: 1.311, ref_ppl: 3.710, kl_mean: 0.0072, kl_p99: 0.05, kl_max: 0.2,
    top1: 0.959 },
];

test('eval lines are told from other JSON', () => {
  assert.ok(EVALS.every(isEvalLine));
  assert.ok(!isEvalLine({ format: 'lumen-bench-serve/1' }));
  assert.ok(!isEvalLine(null));
  assert.ok(!isEvalLine({ nll: '1.3', ppl: 3.7 }));
});

test('the ledger carries every eval value, in HTML and Markdown', () => {
  const html = renderHtml([], EVALS);
  assert.match(html, /Quality ledger \(lumen eval\)/);
  for (const [i, e] of EVALS.entries())
    for (const k of ['kv', 'ppl', 'kl_mean', 'top1']) {
      const m = html.match(new RegExp(`data-eval="${i}" data-key="${k}" data-value="([^"]*)"`));
      assert.ok(m, `${i} ${k}`);
      assert.equal(m[1], String(e[k]));
    }
  assert.doesNotMatch(renderHtml([], []), /Quality ledger/);
  const md = renderMarkdown([], EVALS);
  assert.match(md, /\| models\/demo \| models\/demo \| q8 \| 256 \| 1200 \| 3\.709 \| 3\.710 \| 4\.146e-5 \|/);
  assert.match(md, /\| q4r \|.*\| 0\.9590 \|/);
});

test('lumen report takes eval output beside results and refuses other files', { skip: process.env.LUMEN_BIN ? false : 'LUMEN_BIN is not set (scripts/test.sh sets it)' }, () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'lumen-report-eval-'));
  const ev = path.join(dir, 'eval.jsonl'), bad = path.join(dir, 'bad.json'), html = path.join(dir, 'r.html');
  writeFileSync(ev, EVALS.map((e) => JSON.stringify(e)).join('\n') + '\n');
  writeFileSync(bad, '{"hello": 1}\n');
  const md = spawnSync(process.env.LUMEN_BIN, ['report', ev, '--markdown'], { encoding: 'utf8' });
  assert.equal(md.status, 0, md.stderr);
  assert.match(md.stdout, /### Quality ledger \(lumen eval\)/);
  assert.equal(md.stdout.split('\n').filter((l) => l.startsWith('| models/demo')).length, 2);
  const h = spawnSync(process.env.LUMEN_BIN, ['report', ev, '--html', html], { encoding: 'utf8' });
  assert.equal(h.status, 0, h.stderr);
  const r = spawnSync(process.env.LUMEN_BIN, ['report', bad], { encoding: 'utf8' });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /neither a bench-serve results file nor lumen eval output/);
});
