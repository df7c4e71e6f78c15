// workloads.test.mjs - bench-serve's workloads (tools/benchserve/workloads.mjs)
// are a function of the seed, have the shape each promises, and the shipped
// agent session replays turn by turn.
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import { buildWorkload, defaultSessionsDir, loadSessions, WORKLOADS } from '../../tools/benchserve/workloads.mjs';

const small = { requests: 4, contextLens: [2000, 4000] };

test('every workload is the same for a seed and different for another', () => {
  for (const w of WORKLOADS) {
    const a = buildWorkload(w, 11, small);
    assert.deepEqual(a, buildWorkload(w, 11, small), w);
    assert.notDeepEqual(a, buildWorkload(w, 12, small), w);
    assert.equal(a.length, 4, w);
  }
});

test('generated requests are greedy and of fixed length unless asked not to', () => {
  const [[r]] = buildWorkload('random', 1, { requests: 1, outputLen: 33, range: 0 });
  assert.equal(r.body.temperature, 0);
  assert.equal(r.body.max_tokens, 33);
  assert.equal(r.body.ignore_eos, true);
  const [[q]] = buildWorkload('random', 1, { requests: 1, ignoreEos: false });
  assert.equal(q.body.ignore_eos, undefined);
});

test('extra body fields reach every request of every workload, and win', () => {
  const extraBody = { logit_bias: { 7: -100 }, max_tokens: 5 };
  for (const w of WORKLOADS) {
    const s = buildWorkload(w, 2, { ...small, extraBody });
    for (const t of s.flat()) {
      assert.deepEqual(t.body.logit_bias, { 7: -100 }, w);
      assert.equal(t.body.max_tokens, 5, w);
    }
  }
  // each request has a copy: a server-side mutation of one cannot leak
  const [[a], [b]] = buildWorkload('random', 2, { requests: 2, extraBody });
  assert.notEqual(a.body.logit_bias, b.body.logit_bias);
});

test('shared-prefix: one system prompt, a different question per user', () => {
  const s = buildWorkload('shared-prefix', 3, { requests: 5, prefixLen: 500 });
  const systems = new Set(s.map(([t]) => t.body.messages[0].content));
  const questions = new Set(s.map(([t]) => t.body.messages[1].content));
  assert.equal(systems.size, 1);
  assert.equal(questions.size, 5);
  const words = [...systems][0].split(/\s+/).length;
  assert.ok(words > 350 && words < 420, `${words} words for ~500 tokens`);
});

test('long-context: prompt lengths come from the list asked for', () => {
  const s = buildWorkload('long-context', 4, { requests: 8, contextLens: [1300, 13000] });
  const lens = new Set(s.map(([t]) => Math.round(t.body.messages[0].content.split(/\s+/).length / 1000)));
  for (const l of lens) assert.ok(l === 1 || l === 10, `${l}k words`);
});

test('agent: recorded sessions replay turn by turn, tagged per seed', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'bench-sessions-'));
  const turns = [1, 2, 3].map((i) => ({ gap_ms: 100 * i, body: { model: 'x', stream: true, max_completion_tokens: 256,
    messages: [{ role: 'system', content: 'sys' }, { role: 'user', content: `turn ${i}` }], tools: [{ type: 'function' }] } }));
  writeFileSync(path.join(dir, 's.json'), JSON.stringify({ turns }));
  const fast = buildWorkload('agent', 5, { requests: 2, sessionsDir: dir });
  assert.equal(fast.length, 2);
  assert.equal(fast[0].length, 3);
  assert.equal(fast[0][2].body.messages[1].content, 'turn 3');
  assert.equal(fast[0][0].body.messages[0].content, '[session 5-0] sys');
  assert.equal(fast[1][0].body.messages[0].content, '[session 5-1] sys');
  assert.equal(fast[0][1].body.stream, undefined); // the client sets streaming
  assert.equal(fast[0][1].body.model, undefined);
  assert.equal(fast[0][1].body.max_completion_tokens, undefined); // else it would win over max_tokens
  assert.equal(fast[0][1].body.max_tokens, 64);
  assert.deepEqual(fast[0][1].body.tools, [{ type: 'function' }]);
  assert.equal(fast[0][1].gap_ms, 0);
  assert.equal(buildWorkload('agent', 5, { requests: 1, sessionsDir: dir, replayTiming: 'recorded' })[0][1].gap_ms, 200);
});

test('the shipped agent session: several tool-using turns, each extending the last', () => {
  const [s] = loadSessions(defaultSessionsDir);
  assert.ok(s.turns.length >= 3, `${s.turns.length} turns`);
  assert.ok(s.turns[0].body.tools?.length > 0, 'no tool definitions');
  for (let i = 1; i < s.turns.length; i++) {
    const prev = s.turns[i - 1].body.messages;
    const cur = s.turns[i].body.messages;
    assert.ok(cur.length > prev.length, `turn ${i} does not extend turn ${i - 1}`);
    assert.deepEqual(cur.slice(0, prev.length), prev, `turn ${i} rewrites the history`);
  }
  assert.ok(s.turns.some((t) => t.body.messages.some((m) => m.role === 'tool')), 'no tool result in the session');
});
