#!/usr/bin/env node
// cachebench.mjs - continuous batching and the RAM prefix cache, measured
// through `lumen serve` over loopback HTTP (the path clients use).
//
//   node tools/cachebench/cachebench.mjs [--bin build/release/lumen] [--model models/demo]
//        [--threads N] [--only batch,prefix,agent] [--json]
//
// Three runs, each against a server this script starts (and stops):
//
//  batch   Aggregate decode throughput of C concurrent greedy requests
//          (C = --streams, default 1,4,16,64), each generating --gen tokens
//          (the end token is forbidden, so every request runs to --gen,
//          default 128), against the same C requests sent one after another,
//          same server, same run; the two alternate --reps times (default 3)
//          and the median group is shown, after one unmeasured concurrent
//          group of the largest size. tok/s = generated tokens / wall
//          time of the group. /metrics before and after each group gives the
//          tokens per engine step and the largest lumen_batch_size bucket
//          reached; the trace, each request's mean tokens per decode step.
//          --model picks the model (a large one shows batching best: its
//          decode reads all weights per step, whatever the batch).
//  prefix  Time to first token of a --prefix-tokens (default 8192) token
//          prompt whose prefix the cache holds (warm: an earlier request sent
//          the same prefix, each request adds 16 new tokens) against the same
//          length with a fresh random prefix (cold). A request is
//          /v1/completions with token ids and max_tokens 1, so its wall time
//          is its TTFT plus one HTTP round trip; the server's trace line
//          (--trace) adds its prefill, lookup and restore spans. Needs a
//          context longer than the prefix: when the model's
//          max_position_embeddings is shorter, the script serves a copy of the
//          model folder (weights symlinked) whose config.json says 4x the
//          prefix (fine for timing; positions past training only change the
//          text).
//  agent   Replays a multi-turn agent conversation through
//          /v1/chat/completions (the model's chat template): each turn sends
//          the previous turn's messages, the model's answer, and a new user
//          message, streams the answer (greedy, --agent-gen tokens), and
//          prints prompt tokens, cached tokens (usage), TTFT at the client,
//          and the server's prefill time and cache miss kind (trace). Run
//          twice: with the prefix cache and with --cache-ram 0.
//
// Prints a table per run, or one JSON object with --json.
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { sseFeed, startServer, stopServer } from '../lib/lumen_serve.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..', '..');

function args() {
  const o = {
    bin: path.join(root, 'build', 'release', 'lumen'),
    model: path.join(root, 'models', 'demo'),
    threads: 0,
    only: ['batch', 'prefix', 'agent'],
    streams: [1, 4, 16, 64],
    gen: 128,
    prefixTokens: 8192,
    reps: 3,
    turns: 8,
    agentGen: 48,
    cacheRam: null,
    json: false,
    serverArgs: [],
  };
  const a = process.argv.slice(2);
  for (let i = 0; i < a.length; i++) {
    const k = a[i];
    const v = () => a[++i];
    if (k === '--bin') o.bin = v();
    else if (k === '--model') o.model = v();
    else if (k === '--threads') o.threads = Number(v());
    else if (k === '--only') o.only = v().split(',');
    else if (k === '--streams') o.streams = v().split(',').map(Number);
    else if (k === '--gen') o.gen = Number(v());
    else if (k === '--prefix-tokens') o.prefixTokens = Number(v());
    else if (k === '--reps') o.reps = Number(v());
    else if (k === '--turns') o.turns = Number(v());
    else if (k === '--agent-gen') o.agentGen = Number(v());
    else if (k === '--cache-ram') o.cacheRam = v();
    else if (k === '--server-arg') o.serverArgs.push(v());
    else if (k === '--json') o.json = true;
    else {
      console.error(`unknown option ${k} (see the comment at the top of ${path.basename(fileURLToPath(import.meta.url))})`);
      process.exit(2);
    }
  }
  return o;
}

// ---- the server ---------------------------------------------------------------------------

const tmp = mkdtempSync(path.join(os.tmpdir(), 'cachebench-'));

function startServerFor(o, model, extra) {
  const trace = path.join(tmp, `trace-${Date.now()}-${Math.random().toString(36).slice(2)}.jsonl`);
  const argv = ['serve', '-m', model, '--port', '0', '--quiet', '--trace', trace, ...extra, ...o.serverArgs];
  if (o.threads) argv.push('--threads', String(o.threads));
  if (o.cacheRam !== null && !extra.includes('--cache-ram')) argv.push('--cache-ram', o.cacheRam);
  return startServer(o.bin, argv).then((s) => ({ ...s, trace }));
}

// The server's trace lines by request id.
function traces(s) {
  const out = new Map();
  if (!existsSync(s.trace)) return out;
  for (const line of readFileSync(s.trace, 'utf8').split('\n')) {
    if (!line) continue;
    const j = JSON.parse(line);
    out.set(j.id, j);
  }
  return out;
}

const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity });

// POST json; resolves to { status, json, ms, ttft (first SSE data chunk with text, streams only), text }.
function post(url, route, body, id) {
  return new Promise((resolve, reject) => {
    const data = JSON.stringify(body);
    const t0 = performance.now();
    const r = { status: 0, json: null, ms: 0, ttft: null, text: '', usage: null, finish: null };
    const req = http.request(`${url}${route}`, {
      method: 'POST', agent,
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data), 'X-Request-Id': id },
    }, (res) => {
      r.status = res.statusCode;
      let buf = '';
      res.setEncoding('utf8');
      res.on('data', (d) => {
        buf += d;
        if (!body.stream) return;
        buf = sseFeed(buf, (c) => {
          if (!c) return;
          if (c.usage) r.usage = c.usage;
          const ch = c.choices?.[0];
          if (!ch) return;
          const t = ch.delta ? (ch.delta.content ?? '') : (ch.text ?? '');
          const any = t || ch.delta?.reasoning_content || ch.delta?.tool_calls;
          if (any && r.ttft === null) r.ttft = performance.now() - t0;
          r.text += t;
          if (ch.finish_reason) r.finish = ch.finish_reason;
        });
      });
      res.on('end', () => {
        r.ms = performance.now() - t0;
        if (!body.stream) {
          try {
            r.json = JSON.parse(buf);
            r.usage = r.json.usage;
          } catch {
            r.json = { raw: buf };
          }
        }
        resolve(r);
      });
    });
    req.on('error', reject);
    req.end(data);
  });
}

async function metricsText(url) {
  return (await fetch(`${url}/metrics`)).text();
}

// lumen_batch_size buckets as [le, cumulative count] pairs.
function batchHist(text) {
  const out = [];
  for (const m of text.matchAll(/^lumen_batch_size_bucket\{le="([^"]+)"\} (\d+)$/gm)) out.push([m[1], Number(m[2])]);
  return out;
}

const counterOf = (text, name) => Number(new RegExp(`^${name} (\\d+)$`, 'm').exec(text)?.[1] ?? NaN);

// Between two /metrics pages: engine steps, mean tokens per step (exact, from
// lumen_engine_batch_tokens_total / lumen_engine_steps_total), and the largest
// lumen_batch_size bucket (sequences per step) that grew.
function batchDelta(ta, tb) {
  const a = batchHist(ta), b = batchHist(tb);
  let lo = 1, top = null;
  for (let i = 0; i < b.length; i++) {
    const n = (b[i][1] - (i ? b[i - 1][1] : 0)) - ((a[i]?.[1] ?? 0) - (i ? a[i - 1]?.[1] ?? 0 : 0));
    const hi = b[i][0] === '+Inf' ? Infinity : Number(b[i][0]);
    if (n > 0) top = hi === Infinity ? `>=${lo}` : lo === hi ? `${hi}` : `${lo}-${hi}`;
    lo = hi + 1;
  }
  const steps = counterOf(tb, 'lumen_engine_steps_total') - counterOf(ta, 'lumen_engine_steps_total');
  const toks = counterOf(tb, 'lumen_engine_batch_tokens_total') - counterOf(ta, 'lumen_engine_batch_tokens_total');
  return { steps, tokens_per_step: steps > 0 ? Number((toks / steps).toFixed(1)) : null, top_bucket: top };
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.floor(s.length / 2)] : null;
};
const r1 = (x, d = 1) => (x === null || x === undefined ? null : Number(x.toFixed(d)));

function modelConfig(model) {
  return JSON.parse(readFileSync(path.join(model, 'config.json'), 'utf8'));
}

// ---- batch: concurrent vs serial -------------------------------------------------------------

function completionBody(o, i) {
  // distinct prompts: nothing to share, this run is about batching
  return { prompt: `# task ${i}\ndef f${i}(x):\n    return x * ${i} +`, max_tokens: o.gen, temperature: 0, logit_bias: { 0: -100, 2: -100 } };
}

async function runBatch(o) {
  const s = await startServerFor(o, o.model, ['--parallel', String(Math.max(...o.streams))]);
  const rows = [];
  try {
    // warm-up: one concurrent group of the largest size first, so that no measured
    // group pays for first touches (KV pages of every slot, weights, thread stacks)
    const cmax = Math.max(...o.streams);
    await Promise.all(Array.from({ length: cmax }, (_, i) => post(s.url, '/v1/completions', completionBody(o, 1000 + i), `warmup-${i}`)));
    for (const c of o.streams) {
      const row = { streams: c };
      // serial and concurrent alternate, --reps times each; the median group counts
      const groups = { serial: [], concurrent: [] };
      for (let rep = 0; rep < o.reps; rep++)
        for (const mode of ['serial', 'concurrent']) {
          const h0 = await metricsText(s.url);
          const t0 = performance.now();
          let toks = 0;
          const ids = Array.from({ length: c }, (_, i) => `b${c}-${mode}-r${rep}-${i}`);
          const one = async (i) => {
            const r = await post(s.url, '/v1/completions', completionBody(o, i), ids[i]);
            if (r.status !== 200) throw new Error(`HTTP ${r.status}: ${JSON.stringify(r.json)}`);
            toks += r.usage.completion_tokens;
          };
          if (mode === 'serial') for (let i = 0; i < c; i++) await one(i);
          else await Promise.all(Array.from({ length: c }, (_, i) => one(i)));
          const wall = (performance.now() - t0) / 1000;
          const h1 = await metricsText(s.url);
          groups[mode].push({ tokens: toks, wall_s: r1(wall, 2), tok_s: r1(toks / wall), batch: batchDelta(h0, h1), ids });
        }
      for (const mode of ['serial', 'concurrent']) {
        const g = [...groups[mode]].sort((a, b) => a.tok_s - b.tok_s);
        row[mode] = g[Math.floor(g.length / 2)];
        row[mode].tok_s_all = groups[mode].map((x) => x.tok_s);
      }
      row.speedup = r1(row.concurrent.tok_s / row.serial.tok_s, 2);
      rows.push(row);
      if (!o.json) console.error(`batch: ${c} streams: serial ${row.serial.tok_s} tok/s, concurrent ${row.concurrent.tok_s} tok/s (x${row.speedup})`);
    }
  } finally {
    await stopServer(s);
  }
  // the trace's decode_steps.mean: tokens in the forward of each of a request's decode steps
  const tr = traces(s);
  for (const row of rows)
    for (const mode of ['serial', 'concurrent']) {
      const means = row[mode].ids.map((id) => tr.get(id)?.decode_steps?.mean).filter((x) => typeof x === 'number');
      row[mode].step_tokens_mean = means.length ? r1(means.reduce((a, b) => a + b, 0) / means.length) : null;
      delete row[mode].ids;
    }
  return { server: s.banner, gen: o.gen, rows };
}

// ---- prefix: warm vs cold TTFT of a long prompt ------------------------------------------------

function specialIds(model) {
  try {
    const t = JSON.parse(readFileSync(path.join(model, 'tokenizer.json'), 'utf8'));
    return new Set((t.added_tokens ?? []).map((a) => a.id));
  } catch {
    return new Set();
  }
}

// A deterministic xorshift stream of ordinary token ids.
function idStream(seed, vocab, special) {
  let x = (seed * 2654435761) >>> 0 || 1;
  return (n) => {
    const out = [];
    while (out.length < n) {
      x ^= x << 13; x >>>= 0;
      x ^= x >>> 17;
      x ^= x << 5; x >>>= 0;
      const id = 16 + (x % (vocab - 16));
      if (!special.has(id)) out.push(id);
    }
    return out;
  };
}

async function runPrefix(o) {
  const ctx = o.prefixTokens * 2;
  const m = prepareModel(o.model, ctx);
  const cfg = modelConfig(o.model);
  const vocab = (cfg.text_config ?? cfg).vocab_size;
  const special = specialIds(o.model);
  const s = await startServerFor(o, m.dir, ['--ctx', String(ctx), '--parallel', '2']);
  const out = { server: s.banner, model_stretched_to: m.stretched ? ctx : null, prefix_tokens: o.prefixTokens, cold: [], warm: [] };
  try {
    const shared = idStream(1, vocab, special)(o.prefixTokens);
    const tail = idStream(7, vocab, special);
    const req = (prompt, id) => post(s.url, '/v1/completions', { prompt, max_tokens: 1, temperature: 0 }, id);
    await req(idStream(99, vocab, special)(64), 'warmup');
    const first = await req([...shared, ...tail(16)], 'prime'); // puts the prefix in the cache
    out.prime_ms = r1(first.ms);
    for (let i = 0; i < o.reps; i++) {
      const cold = await req([...idStream(100 + i, vocab, special)(o.prefixTokens), ...tail(16)], `cold-${i}`);
      const warm = await req([...shared, ...tail(16)], `warm-${i}`);
      for (const [k, r] of [['cold', cold], ['warm', warm]]) {
        if (r.status !== 200) throw new Error(`HTTP ${r.status}: ${JSON.stringify(r.json)}`);
        out[k].push({ id: `${k}-${i}`, ms: r.ms, prompt: r.usage.prompt_tokens, cached: r.usage.prompt_tokens_details?.cached_tokens ?? 0 });
      }
    }
  } finally {
    await stopServer(s);
  }
  const tr = traces(s);
  for (const k of ['cold', 'warm']) {
    for (const r of out[k]) {
      const t = tr.get(r.id);
      r.server = t ? { prefill_ms: t.ms?.prefill ?? null, lookup_ms: t.ms?.cache_lookup ?? null, restore_ms: t.ms?.cache_restore ?? null, miss: t.cache?.miss ?? null } : null;
    }
    out[`${k}_ttft_ms_median`] = r1(median(out[k].map((r) => r.ms)));
    out[`${k}_cached_median`] = median(out[k].map((r) => r.cached));
  }
  out.speedup = r1(out.cold_ttft_ms_median / out.warm_ttft_ms_median, 1);
  if (!o.json) console.error(`prefix: cold ${out.cold_ttft_ms_median} ms, warm ${out.warm_ttft_ms_median} ms (x${out.speedup}), cached ${out.warm_cached_median}`);
  return out;
}

// ---- agent: a multi-turn conversation -------------------------------------------------------------

const SYSTEM = `You are a coding agent working in a Python repository. You can read files, run the tests and edit code.
Rules: answer with working Python code; keep functions small and documented; never change the tests;
explain each change in one sentence after the code. The repository has src/geometry.py (points, vectors,
polygons), src/stats.py (mean, median, variance over lists), src/textutil.py (slugify, wrap, dedent) and
tests/ with one test file per module. The style guide asks for type hints, docstrings in the imperative mood,
and no global state. When a test fails, read the failing assertion first, then the function under test.`;

const TURNS = [
  'Write a Python function `mean(xs)` for src/stats.py: Return the arithmetic mean of a non-empty list.',
  'Now add `median(xs)`: Return the median; for an even count, the mean of the two middle values.',
  'The test for median fails on [3, 1, 2]. Fix the function so it sorts a copy first.',
  'Add `variance(xs, sample=False)`: Return the population variance, or the sample variance when sample is true.',
  'Write `slugify(text)` for src/textutil.py: Return text lower-cased with runs of non-alphanumerics replaced by a dash.',
  'slugify should strip leading and trailing dashes. Update it.',
  'Write `wrap(text, width)`: Return the text broken into lines of at most width characters at spaces.',
  'Add a docstring example to each function you wrote today.',
  'Write `polygon_area(points)` for src/geometry.py: Return the area of a simple polygon by the shoelace formula.',
  'Summarise the functions you added, one line each.',
];

async function replay(o, cacheRam) {
  const s = await startServerFor(o, o.model, ['--parallel', '2', '--cache-ram', cacheRam]);
  const rows = [];
  try {
    const messages = [{ role: 'system', content: SYSTEM }];
    for (let t = 0; t < o.turns; t++) {
      messages.push({ role: 'user', content: TURNS[t % TURNS.length] });
      const id = `agent-${cacheRam}-turn${t + 1}`;
      const r = await post(s.url, '/v1/chat/completions', {
        messages, max_tokens: o.agentGen, temperature: 0, stream: true, stream_options: { include_usage: true },
      }, id);
      if (r.status !== 200) throw new Error(`HTTP ${r.status}`);
      rows.push({ turn: t + 1, id, prompt: r.usage?.prompt_tokens, cached: r.usage?.prompt_tokens_details?.cached_tokens ?? 0, ttft_ms: r1(r.ttft ?? r.ms), total_ms: r1(r.ms) });
      messages.push({ role: 'assistant', content: r.text });
    }
  } finally {
    await stopServer(s);
  }
  const tr = traces(s);
  for (const row of rows) {
    const t = tr.get(row.id);
    row.server_prefill_ms = t?.ms?.prefill ?? null;
    row.miss = t?.cache?.miss ?? null;
    if (t?.cache?.miss && t.cache.miss !== 'none') row.divergence = { pos: t.cache.diverge_pos, prompt: t.cache.prompt, prev: t.cache.prev };
  }
  return { server: s.banner, cache_ram: cacheRam, rows };
}

async function runAgent(o) {
  const on = await replay(o, o.cacheRam ?? '1G');
  const off = await replay(o, '0');
  const rows = on.rows.map((r, i) => ({ ...r, ttft_ms_no_cache: off.rows[i]?.ttft_ms ?? null }));
  if (!o.json) console.error(`agent: ${rows.length} turns replayed`);
  return { server: on.server, turns: rows, no_cache_server: off.server };
}

// ---- output ----------------------------------------------------------------------------------------

function prepareModel(model, ctx) {
  const cfg = modelConfig(model);
  const text = cfg.text_config ?? cfg;
  if ((text.max_position_embeddings ?? 0) >= ctx) return { dir: model, stretched: false };
  const dir = mkdtempSync(path.join(tmp, `${path.basename(model)}-ctx${ctx}-`));
  for (const f of readdirSync(model)) if (f !== 'config.json') symlinkSync(path.resolve(model, f), path.join(dir, f));
  text.max_position_embeddings = ctx;
  writeFileSync(path.join(dir, 'config.json'), JSON.stringify(cfg, null, 2));
  return { dir, stretched: true };
}

function table(rows, cols) {
  const head = `| ${cols.map((c) => c[0]).join(' | ')} |`;
  const sep = `|${cols.map((c) => (c[2] === 'l' ? '---' : '---:')).join('|')}|`;
  return [head, sep, ...rows.map((r) => `| ${cols.map((c) => String(c[1](r) ?? '-')).join(' | ')} |`)].join('\n');
}

const o = args();
const result = { date: new Date().toISOString(), bin: o.bin, model: o.model, machine: `${os.cpus().length} CPUs (${os.cpus()[0]?.model ?? '?'}), load ${os.loadavg().map((x) => x.toFixed(1)).join(' ')}` };
try {
  if (o.only.includes('batch')) result.batch = await runBatch(o);
  if (o.only.includes('prefix')) result.prefix = await runPrefix(o);
  if (o.only.includes('agent')) result.agent = await runAgent(o);
} finally {
  agent.destroy();
  rmSync(tmp, { recursive: true, force: true });
}
result.load_after = os.loadavg().map((x) => x.toFixed(1)).join(' ');
if (o.json) {
  console.log(JSON.stringify(result, null, 2));
} else {
  console.log(`# cachebench ${result.date}\n${result.machine}; load after ${result.load_after}\nmodel ${o.model}\n`);
  if (result.batch) {
    console.log(`## batch: ${result.batch.gen} greedy tokens per request (${result.batch.server})\n`);
    console.log(table(result.batch.rows, [
      ['streams', (r) => r.streams], ['serial tok/s', (r) => r.serial.tok_s], ['concurrent tok/s', (r) => r.concurrent.tok_s],
      ['speedup', (r) => `${r.speedup}x`], ['concurrent wall s', (r) => r.concurrent.wall_s],
      ['tokens per decode step (trace)', (r) => r.concurrent.step_tokens_mean],
      ['tokens per step (/metrics)', (r) => r.concurrent.batch.tokens_per_step], ['largest lumen_batch_size bucket', (r) => r.concurrent.batch.top_bucket, 'l'],
    ]));
    console.log();
  }
  if (result.prefix) {
    const p = result.prefix;
    console.log(`## prefix: ${p.prefix_tokens}-token prefix + 16 new tokens, max_tokens 1 (${p.server}${p.model_stretched_to ? `; config stretched to ${p.model_stretched_to} positions` : ''})\n`);
    const rows = [...p.cold, ...p.warm];
    console.log(table(rows, [
      ['request', (r) => r.id, 'l'], ['prompt', (r) => r.prompt], ['cached', (r) => r.cached], ['TTFT ms (client)', (r) => r1(r.ms)],
      ['server prefill ms', (r) => r.server?.prefill_ms], ['lookup ms', (r) => r.server?.lookup_ms], ['restore ms', (r) => r.server?.restore_ms],
    ]));
    console.log(`\nmedian TTFT: cold ${p.cold_ttft_ms_median} ms, warm ${p.warm_ttft_ms_median} ms (${p.speedup}x)\n`);
  }
  if (result.agent) {
    console.log(`## agent replay (${result.agent.server}; baseline: ${result.agent.no_cache_server})\n`);
    console.log(table(result.agent.turns, [
      ['turn', (r) => r.turn], ['prompt tokens', (r) => r.prompt], ['cached', (r) => r.cached], ['TTFT ms', (r) => r.ttft_ms],
      ['TTFT ms, cache off', (r) => r.ttft_ms_no_cache], ['server prefill ms', (r) => r.server_prefill_ms], ['miss', (r) => r.miss, 'l'],
    ]));
    for (const r of result.agent.turns)
      if (r.divergence) console.log(`\nturn ${r.turn} diverged at token ${r.divergence.pos}: prompt ${JSON.stringify(r.divergence.prompt)} vs earlier ${JSON.stringify(r.divergence.prev)}`);
    console.log();
  }
}
