// client.test.mjs - bench-serve's client, runner, /metrics scrape and
// recording proxy against a live `lumen serve` on the demo model: every
// request record carries TTFT, inter-token gaps, end-to-end time and the
// usage counts; ignore_eos gives exactly max_tokens; errors are counted,
// not thrown.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, readdirSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { streamChat } from '../../tools/benchserve/client.mjs';
import { delta, scrape } from '../../tools/benchserve/metrics.mjs';
import { startRecorder } from '../../tools/benchserve/record.mjs';
import { runSessions } from '../../tools/benchserve/runner.mjs';
import { buildWorkload } from '../../tools/benchserve/workloads.mjs';
import { serveDemo, skipReason } from './live.mjs';

const skip = skipReason();
if (skip) test('bench-serve client against lumen', { skip }, () => {});

describe('bench-serve client against lumen serve (demo model)', { skip: skip !== null }, () => {
  let srv;
  before(async () => { srv = await serveDemo(['--parallel', '2']); });
  after(async () => { await srv?.stop(); });

  const body = (n, extra = {}) => ({ messages: [{ role: 'user', content: 'Write a Python function add(a, b).' }],
    max_tokens: n, temperature: 0, ...extra });

  test('a streamed request has TTFT, inter-token gaps, e2e and usage', async () => {
    const r = await streamChat(srv.url, body(24, { ignore_eos: true }));
    assert.equal(r.error, null);
    assert.ok(r.ttft_ms > 0 && r.e2e_ms >= r.ttft_ms, `ttft ${r.ttft_ms} e2e ${r.e2e_ms}`);
    assert.equal(r.itl_ms.length, r.chunks - 1);
    assert.ok(r.itl_ms.every((x) => x >= 0));
    assert.equal(r.output_tokens, 24); // ignore_eos: runs to max_tokens
    assert.equal(r.finish_reason, 'length');
    assert.ok(r.prompt_tokens > 5);
    assert.ok(Number.isInteger(r.cached_tokens));
  });

  test('greedy output is the same twice; the second request hits the prefix cache', async () => {
    const a = await streamChat(srv.url, body(12, { ignore_eos: true }));
    const b = await streamChat(srv.url, body(12, { ignore_eos: true }));
    assert.equal(a.text, b.text);
    assert.ok(b.cached_tokens > 0, `cached ${b.cached_tokens}`);
  });

  test('a refused request is a record with an error, not an exception', async () => {
    const r = await streamChat(srv.url, body(8, { temperature: 9 }));
    assert.match(r.error, /HTTP 400/);
    const down = await streamChat('http://127.0.0.1:1', body(8));
    assert.ok(down.error);
  });

  test('runSessions keeps session order and sums throughput; /metrics moves', async () => {
    const before = await scrape(srv.url);
    assert.ok(before && Object.keys(before).some((k) => k.startsWith('lumen_')), 'no lumen_ metrics');
    const sessions = buildWorkload('shared-prefix', 2, { requests: 4, prefixLen: 200, inputLen: 10, outputLen: 8 });
    const run = await runSessions(srv.url, sessions, { concurrency: 2 });
    assert.equal(run.errors, 0);
    assert.deepEqual(run.requests.map((r) => r.session), [0, 1, 2, 3]);
    assert.equal(run.output_tokens, 32);
    assert.ok(run.output_tok_s > 0);
    const d = delta(before, await scrape(srv.url));
    assert.ok(Object.keys(d).length > 0, 'no counter changed');
  });

  test('the recording proxy passes the stream through and saves the session', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'bench-rec-'));
    const rec = await startRecorder({ upstream: srv.url, out: dir });
    try {
      const a = await streamChat(rec.url, body(6, { ignore_eos: true }));
      const direct = await streamChat(srv.url, body(6, { ignore_eos: true }));
      assert.equal(a.error, null);
      assert.equal(a.text, direct.text);
      await streamChat(rec.url, { ...body(6), messages: [...body(6).messages, { role: 'assistant', content: a.text }, { role: 'user', content: 'more' }] });
    } finally {
      await rec.close();
    }
    const s = JSON.parse(readFileSync(path.join(dir, 'session.json'), 'utf8'));
    assert.equal(s.turns.length, 2);
    assert.equal(s.turns[1].body.messages.length, 3);
    assert.ok(s.turns[1].gap_ms >= 0 && s.turns[0].recorded.e2e_ms > 0);
    const ex = readdirSync(path.join(dir, 'exchanges'));
    assert.equal(ex.length, 2);
    const e1 = JSON.parse(readFileSync(path.join(dir, 'exchanges', ex[0]), 'utf8'));
    assert.equal(e1.status, 200);
    assert.match(e1.response, /data: \[DONE\]/);
  });
});
