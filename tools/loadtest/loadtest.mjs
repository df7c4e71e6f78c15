#!/usr/bin/env node
// loadtest.mjs - concurrent streaming clients against `lumen serve` on
// loopback, for a bounded time; prints one JSON object.
//
//   node tools/loadtest/loadtest.mjs --model ../shared/fixtures/models/qwen3 \
//        --clients 200 --duration 60 --max-tokens 64 --parallel 16
//
// Each client loops: POST /v1/chat/completions with stream=true, read the SSE
// stream to "data: [DONE]", start the next request. A request counts as an
// error when the status is not 200 or the connection fails, and as a dropped
// stream when the body ends without a finish_reason chunk and [DONE], or
// when its usage chunk reports fewer tokens than asked for (the request
// forbids the end token, so every answer runs to max_tokens). Time to first token (TTFT) is from
// sending the request to the first chunk that carries generated text.
// The server is started here (unless --url), so its resident memory is
// sampled from /proc every 200 ms.
//
// --overhead instead measures the time per streamed token of one client
// against `lumen bench` (the bare decode loop, same threads) and a
// non-streamed request of the same length.
//
// Requests stay on 127.0.0.1; the run stops by itself after --duration
// seconds plus the time to finish the requests in flight (at most 120 s).
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { sseFeed, startServer } from '../lib/lumen_serve.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..', '..');

function args() {
  const o = {
    bin: path.join(root, 'build', 'release', 'lumen'),
    model: path.resolve(root, '..', 'shared', 'fixtures', 'models', 'qwen3'),
    clients: 200,
    duration: 30,
    maxTokens: 64,
    parallel: 16,
    threads: 0,
    url: null,
    overhead: false,
    defaults: false,
    serverArgs: [],
  };
  const a = process.argv.slice(2);
  for (let i = 0; i < a.length; i++) {
    const k = a[i];
    const v = () => a[++i];
    if (k === '--bin') o.bin = v();
    else if (k === '--model') o.model = v();
    else if (k === '--clients') o.clients = Number(v());
    else if (k === '--duration') o.duration = Number(v());
    else if (k === '--max-tokens') o.maxTokens = Number(v());
    else if (k === '--parallel') o.parallel = Number(v());
    else if (k === '--threads') o.threads = Number(v());
    else if (k === '--url') o.url = v();
    else if (k === '--overhead') o.overhead = true;
    else if (k === '--defaults') o.defaults = true; // the server's own --parallel and --max-connections
    else if (k === '--server-arg') o.serverArgs.push(v());
    else {
      console.error(`unknown option ${k}`);
      process.exit(2);
    }
  }
  return o;
}

function startServerFor(o) {
  const sized = o.defaults ? [] : ['--parallel', String(o.parallel), '--max-connections', String(o.clients + 64)];
  const argv = ['serve', '-m', o.model, '--port', '0', '--quiet', ...sized, ...o.serverArgs];
  if (o.threads) argv.push('--threads', String(o.threads));
  return startServer(o.bin, argv);
}

function rssMb(pid) {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : null;
  } catch {
    return null;
  }
}

const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity });

// One streamed chat request; resolves to { ok, status, ttft, tokens, dropped, t0, t1, times }.
function streamOnce(url, body) {
  return new Promise((resolve) => {
    const t0 = performance.now();
    const r = { ok: false, status: 0, ttft: null, tokens: 0, usage: null, dropped: false, t0, t1: 0, times: [], error: null };
    const req = http.request(
      `${url}/v1/chat/completions`,
      { method: 'POST', agent, headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) } },
      (res) => {
        r.status = res.statusCode;
        r.retryAfter = res.headers['retry-after'] ?? null;
        let buf = '';
        let finished = false;
        let done = false;
        res.setEncoding('utf8');
        res.on('data', (d) => {
          buf = sseFeed(buf + d, (c) => {
            if (!c) {
              done = true;
              return;
            }
            if (c.usage) r.usage = c.usage;
            const ch = c.choices?.[0];
            if (!ch) return;
            const d0 = ch.delta ?? {};
            if (d0.content || d0.reasoning_content || d0.tool_calls) {
              const now = performance.now();
              if (r.ttft === null) r.ttft = now - t0;
              r.times.push(now);
              r.tokens++;
            }
            if (ch.finish_reason) finished = true;
          });
        });
        res.on('end', () => {
          r.t1 = performance.now();
          r.ok = res.statusCode === 200;
          r.dropped = r.ok && (!finished || !done);
          resolve(r);
        });
        res.on('error', (e) => {
          r.error = String(e);
          r.dropped = true;
          resolve(r);
        });
      },
    );
    req.on('error', (e) => {
      r.error = String(e);
      resolve(r);
    });
    req.end(body);
  });
}

function pct(xs, p) {
  if (!xs.length) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}

const round = (x, d = 2) => (x === null ? null : Number(x.toFixed(d)));

function chatBody(o, i, stream = true, temperature = 1) {
  return JSON.stringify({
    messages: [{ role: 'user', content: `Request ${i}: tell me something.` }],
    max_tokens: o.maxTokens,
    stream,
    ...(stream ? { stream_options: { include_usage: true } } : {}),
    temperature,
    seed: i,
    logit_bias: { 2: -100 }, // no end token: every answer runs to max_tokens
  });
}

async function load(o, url, pid) {
  const deadline = performance.now() + o.duration * 1000;
  const results = [];
  const rss = [];
  const sampler = setInterval(() => {
    const m = pid ? rssMb(pid) : null;
    if (m !== null) rss.push(m);
  }, 200);
  const rssStart = pid ? rssMb(pid) : null;
  let n = 0;
  const client = async () => {
    while (performance.now() < deadline) {
      const r = await streamOnce(url, chatBody(o, n++));
      results.push(r);
      if (!r.ok && !r.status) await new Promise((res) => setTimeout(res, 50)); // connection refused: back off
      // a well-behaved client waits as long as a 503's Retry-After says
      if (r.status === 503 && r.retryAfter) await new Promise((res) => setTimeout(res, 1000 * Number(r.retryAfter)));
    }
  };
  const t0 = performance.now();
  await Promise.race([
    Promise.all(Array.from({ length: o.clients }, client)),
    new Promise((res) => setTimeout(res, (o.duration + 120) * 1000)),
  ]);
  const wall = (performance.now() - t0) / 1000;
  clearInterval(sampler);
  const ok = results.filter((r) => r.ok && !r.dropped);
  const errors = results.filter((r) => !r.ok);
  const dropped = results.filter((r) => r.ok && r.dropped);
  const short = ok.filter((r) => r.usage?.completion_tokens !== o.maxTokens);
  const ttft = ok.map((r) => r.ttft).filter((x) => x !== null);
  const itl = [];
  for (const r of ok) for (let i = 1; i < r.times.length; i++) itl.push(r.times[i] - r.times[i - 1]);
  const tokens = ok.reduce((s, r) => s + (r.usage?.completion_tokens ?? 0), 0);
  return {
    clients: o.clients,
    duration_s: o.duration,
    wall_s: round(wall, 1),
    max_tokens: o.maxTokens,
    requests: results.length,
    completed: ok.length,
    errors: errors.length,
    error_samples: [...new Set(errors.map((r) => r.error ?? `HTTP ${r.status}`))].slice(0, 3),
    status_counts: results.reduce((m, r) => ((m[r.status || 'none'] = (m[r.status || 'none'] ?? 0) + 1), m), {}),
    busy_503_with_retry_after: results.filter((r) => r.status === 503 && r.retryAfter).length,
    other_5xx: results.filter((r) => r.status >= 500 && !(r.status === 503 && r.retryAfter)).length,
    dropped_streams: dropped.length + short.length,
    generated_tokens: tokens,
    tokens_per_s: round(tokens / wall, 1),
    ttft_ms: { p50: round(pct(ttft, 50)), p90: round(pct(ttft, 90)), p99: round(pct(ttft, 99)), max: round(pct(ttft, 100)) },
    inter_token_ms: { p50: round(pct(itl, 50), 3), p99: round(pct(itl, 99), 3) },
    request_s: { p50: round(pct(ok.map((r) => (r.t1 - r.t0) / 1000), 50), 3), p99: round(pct(ok.map((r) => (r.t1 - r.t0) / 1000), 99), 3) },
    server_rss_mb: pid ? { start: round(rssStart, 1), peak: round(Math.max(...rss), 1), end: round(rssMb(pid), 1) } : null,
  };
}

// Time per token: bare decode loop (lumen bench) vs one streamed / one plain request.
// CPU milliseconds (user + system, all threads) a process has used so far.
function cpuMs(pid) {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return ((Number(f[11]) + Number(f[12])) * 1000) / 100; // utime, stime in 100 Hz ticks
}

async function overhead(o, url, pid) {
  const gen = o.maxTokens;
  const benchArgs = ['bench', '-m', o.model, '--prompt-len', '16', '--gen', String(gen), '--reps', '5', '--no-membw'];
  if (o.threads) benchArgs.push('--threads', String(o.threads));
  const bench = JSON.parse(execFileSync(o.bin, benchArgs, { encoding: 'utf8' }).trim().split('\n').pop());
  const bareMs = 1000 / bench.decode_tok_s;
  // the engine alone: tools/loadtest/engine_decode.c against the same build's library
  const dir = path.dirname(o.bin);
  const exe = path.join(dir, 'engine_decode');
  const libs = execFileSync('pkg-config', ['--libs', 'jansson', 'libpcre2-8', 'libutf8proc', 'libxxhash', 'libmicrohttpd'], { encoding: 'utf8' }).trim().split(/\s+/);
  execFileSync('cc', ['-O2', '-I', path.join(root, 'src'), path.join(here, 'engine_decode.c'), path.join(dir, 'liblumen_core.a'), ...libs, '-lm', '-lpthread', '-o', exe]);
  const eng = JSON.parse(execFileSync(exe, [o.model, String(gen), '11', String(o.threads || 0)], { encoding: 'utf8' }).trim());
  const streamed = [];
  const plain = [];
  // CPU per token of the whole server process for streamed requests: unlike wall
  // times, other processes on the machine do not inflate it
  let cpuStream = null;
  if (pid) {
    const c0 = cpuMs(pid);
    let toks = 0;
    for (let i = 0; i < 20; i++) toks += (await streamOnce(url, chatBody(o, 100 + i, true, 0))).usage?.completion_tokens ?? 0;
    cpuStream = (cpuMs(pid) - c0) / toks;
  }
  for (let i = 0; i < 11; i++) {
    // greedy, like the bare loop and engine_decode: the sampler's cost is not the server's
    const r = await streamOnce(url, chatBody(o, i, true, 0));
    // per text chunk: a token without text of its own (half a UTF-8 character, a hidden
    // special token) rides on the next chunk, so this overestimates the time per token
    if (r.ok && r.times.length > 1) streamed.push((r.times.at(-1) - r.times[0]) / (r.times.length - 1));
    const t0 = performance.now();
    const res = await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: chatBody(o, i, false, 0) });
    const j = await res.json();
    plain.push((performance.now() - t0) / j.usage.completion_tokens);
  }
  const s = pct(streamed, 50);
  const p = pct(plain, 50);
  return {
    tokens_per_request: gen,
    bare_decode_ms_per_token: round(bareMs, 4),
    engine_ms_per_token: round(eng.engine_ms_per_token, 4),
    engine_cpu_ms_per_token: round(eng.engine_cpu_ms_per_token, 4),
    server_cpu_ms_per_streamed_token: cpuStream === null ? null : round(cpuStream, 4),
    server_cpu_overhead_ms_per_streamed_token: cpuStream === null ? null : round(cpuStream - eng.engine_cpu_ms_per_token, 4),
    plain_request_ms_per_token: round(p, 4),
    streamed_ms_per_token: round(s, 4),
    server_overhead_ms_per_streamed_token: round(s - eng.engine_ms_per_token, 4),
    engine_overhead_ms_per_token: round(eng.engine_ms_per_token - bareMs, 4),
    streaming_vs_plain_ms_per_token: round(s - p, 4),
    note: 'medians of 11 requests; bare = lumen bench (runner), engine = engine_decode.c (scheduler, no HTTP), streamed = time between SSE chunks at the client; plain includes prefill and the HTTP round trip spread over the tokens',
  };
}

const o = args();
let srv = null;
let url = o.url;
if (!url) {
  srv = await startServerFor(o);
  url = srv.url;
}
let out;
try {
  out = o.overhead ? await overhead(o, url, srv?.proc.pid) : await load(o, url, srv?.proc.pid);
  const health = await fetch(`${url}/health`).then((r) => r.status).catch(() => 0);
  out.server_alive_after = health === 200;
} finally {
  agent.destroy();
  if (srv) {
    const code = await new Promise((res) => {
      if (srv.proc.exitCode !== null || srv.proc.signalCode !== null) return res(srv.proc.exitCode ?? srv.proc.signalCode);
      srv.proc.on('exit', (c, s) => res(c ?? s));
      srv.proc.kill('SIGTERM');
    });
    if (out) out.server_exit = code;
    if (code !== 0) console.error(srv.log().slice(-3000));
  }
}
console.log(JSON.stringify(out, null, 2));
process.exit(out && out.errors === 0 && out.dropped_streams === 0 ? 0 : out?.errors === undefined ? 0 : 1);
