// harness.mjs - what every agent test shares: `lumen serve` on the demo model,
// a recording proxy in front of it, a throw-away HOME for the agent's config,
// running the agent's CLI for one turn, and the checks on lumen's log.
//
// Each agent lives in its own folder (tests/agents/NAME) with its pinned npm
// package (package.json + package-lock.json) and one NAME.test.mjs that uses
// this module; see tests/agents/README.md.
//
// Network: the runner (tests/agents/run.sh) starts `node --test` in a network
// namespace of its own with only loopback up, so an agent cannot reach the
// internet even if a setting below is missed; isolated() says whether that is
// so, and the tests print it.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const root = path.resolve(here, '..', '..', '..');
export const bin = process.env.LUMEN_BIN || path.join(root, 'build', 'release', 'lumen');
export const model = path.join(root, 'models', 'demo');
export const modelName = 'demo';

// Why the agent in folder dir cannot run here, or null: no lumen binary, or
// its npm package is not installed (run.sh runs `npm ci` first).
export function skipReason(dir, binName) {
  if (!existsSync(bin)) return `lumen binary not found: ${bin} (set LUMEN_BIN)`;
  const b = path.join(dir, 'node_modules', '.bin', binName);
  if (!existsSync(b)) return `${b} not found (run npm ci in ${dir})`;
  return null;
}

// True when this process sees no network interface but loopback.
export function isolated() {
  return Object.keys(os.networkInterfaces()).every((n) => n === 'lo');
}

// A fresh folder for an agent's HOME and working directory; removed by the
// returned cleanup unless LUMEN_AGENTS_KEEP is set (to look at what it wrote;
// runTurn then also leaves exchanges.json, lumen.log and agent.out there).
export function tempDir(name) {
  const d = mkdtempSync(path.join(os.tmpdir(), `lumen-agent-${name}-`));
  return {
    dir: d,
    cleanup: () => {
      if (!process.env.LUMEN_AGENTS_KEEP) rmSync(d, { recursive: true, force: true });
    },
  };
}

// ---- lumen ---------------------------------------------------------------------------

// Starts `lumen serve` on the demo model on a free port; resolves to
// { url, port, log(), stop() }. stop() resolves to the exit code.
export function startLumen(args = []) {
  return new Promise((resolve, reject) => {
    const proc = spawn(bin, ['serve', '-m', model, '--alias', modelName, '--port', '0', '--threads', '1', ...args], {
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let log = '';
    let done = false;
    const fail = (msg) => {
      if (done) return;
      done = true;
      reject(new Error(`${msg}:\n${log}`));
    };
    const timer = setTimeout(() => {
      proc.kill('SIGKILL');
      fail('lumen serve did not start');
    }, 30000);
    proc.stderr.setEncoding('utf8');
    proc.stderr.on('data', (d) => {
      log += d;
      const m = /serving .* on http:\/\/127\.0\.0\.1:(\d+)/.exec(log);
      if (m && !done) {
        done = true;
        clearTimeout(timer);
        const port = Number(m[1]);
        resolve({ port, url: `http://127.0.0.1:${port}`, log: () => log, stop: () => stop(proc) });
      }
    });
    proc.on('exit', (code) => {
      clearTimeout(timer);
      fail(`lumen serve exited with ${code}`);
    });
  });
}

function stop(proc) {
  return new Promise((resolve) => {
    if (proc.exitCode !== null) return resolve(proc.exitCode);
    const t = setTimeout(() => proc.kill('SIGKILL'), 20000);
    proc.on('exit', (code, sig) => {
      clearTimeout(t);
      resolve(code ?? `signal ${sig}`);
    });
    proc.kill('SIGTERM');
  });
}

// lumen's request lines: "lumen: POST /v1/chat/completions 200 prompt ..." and
// "lumen: GET /v1/models 200 0.001s ..." -> [{ method, path, status, line }].
export function requestLines(log) {
  const out = [];
  for (const line of log.split('\n')) {
    const m = /^lumen: (GET|POST|HEAD|PUT|DELETE|OPTIONS|PATCH) (\S+) (\d{3})\b/.exec(line);
    if (m) out.push({ method: m[1], path: m[2], status: Number(m[3]), line });
  }
  return out;
}

// ---- the recording proxy ---------------------------------------------------------------

// An HTTP proxy on a free loopback port that forwards everything to target
// and keeps each exchange: { method, url, body (parsed JSON or null), status,
// response (the whole text, SSE included), aborted (the agent hung up before
// the answer ended) }. The agent talks to the proxy, so
// the test sees exactly what it sent and what lumen answered. rewrite, when
// given, maps a JSON request body to the one forwarded to lumen (the exchange
// keeps what the agent sent).
export function startProxy(target, rewrite = null) {
  const exchanges = [];
  const t = new URL(target);
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const raw = Buffer.concat(chunks);
      const ex = { method: req.method, url: req.url, body: null, status: 0, response: '', aborted: false };
      try {
        ex.body = raw.length ? JSON.parse(raw.toString('utf8')) : null;
      } catch {
        ex.body = raw.toString('utf8');
      }
      exchanges.push(ex);
      const headers = { ...req.headers, host: t.host };
      const out = rewrite && ex.body && typeof ex.body === 'object' ? forwarded(ex.body, rewrite, headers) : raw;
      const up = http.request({ host: t.hostname, port: t.port, method: req.method, path: req.url, headers }, (ur) => {
        ex.status = ur.statusCode;
        res.writeHead(ur.statusCode, ur.headers);
        ur.setEncoding('utf8');
        ur.on('data', (d) => {
          ex.response += d;
          res.write(d);
        });
        ur.on('end', () => res.end());
      });
      up.on('error', (e) => {
        if (ex.aborted) return;
        ex.status = 502;
        ex.response = String(e);
        res.writeHead(502).end();
      });
      // The agent hung up before the answer ended: pass that on to lumen.
      res.on('close', () => {
        if (res.writableFinished) return;
        ex.aborted = true;
        up.destroy();
      });
      up.end(out);
    });
  });
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      resolve({
        url: `http://127.0.0.1:${port}`,
        exchanges,
        // The chat-completions requests (method POST) in order.
        chats: () => exchanges.filter((x) => x.method === 'POST' && x.url.startsWith('/v1/chat/completions')),
        close: () => new Promise((r) => {
          server.closeAllConnections();
          server.close(() => r());
        }),
      });
    });
  });
}

// The body rewrite(body) makes, as bytes, with headers' content-length set
// to match.
function forwarded(body, rewrite, headers) {
  const out = Buffer.from(JSON.stringify(rewrite(structuredClone(body))), 'utf8');
  headers['content-length'] = String(out.length);
  delete headers['transfer-encoding'];
  return out;
}

// The tool calls in a chat answer, streamed (SSE) or not:
// [{ id, name, arguments }] with the arguments text joined from the deltas.
export function toolCallsIn(response) {
  const calls = [];
  const add = (tcs) => {
    for (const tc of tcs || []) {
      const i = tc.index ?? calls.length;
      calls[i] ??= { id: '', name: '', arguments: '' };
      if (tc.id) calls[i].id = tc.id;
      if (tc.function?.name) calls[i].name += tc.function.name;
      if (tc.function?.arguments) calls[i].arguments += tc.function.arguments;
    }
  };
  if (response.trimStart().startsWith('{')) {
    add(JSON.parse(response).choices?.[0]?.message?.tool_calls);
    return calls;
  }
  for (const line of response.split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    add(JSON.parse(line.slice(6)).choices?.[0]?.delta?.tool_calls);
  }
  return calls;
}

// ---- running an agent ----------------------------------------------------------------------

// Runs cmd with args (cwd, env added to a minimal environment whose HOME is
// home); resolves to { code, signal, stdout, stderr, seconds }. Killed after
// timeoutMs.
export function runAgent(cmd, args, { cwd, home, env = {}, timeoutMs = 120000, input = '' }) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const proc = spawn(cmd, args, {
      cwd,
      env: {
        PATH: process.env.PATH,
        HOME: home,
        XDG_CONFIG_HOME: path.join(home, '.config'),
        XDG_DATA_HOME: path.join(home, '.local', 'share'),
        XDG_CACHE_HOME: path.join(home, '.cache'),
        XDG_STATE_HOME: path.join(home, '.local', 'state'),
        TMPDIR: os.tmpdir(),
        TERM: 'dumb',
        NO_COLOR: '1',
        CI: '1',
        ...env,
      },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    proc.stdout.setEncoding('utf8');
    proc.stderr.setEncoding('utf8');
    proc.stdout.on('data', (d) => (stdout += d));
    proc.stderr.on('data', (d) => (stderr += d));
    proc.stdin.end(input);
    const timer = setTimeout(() => proc.kill('SIGKILL'), timeoutMs);
    proc.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr, seconds: (Date.now() - t0) / 1000 });
    });
  });
}

// A readable dump of a run for assertion messages.
export function describeRun(run, lumenLog) {
  return `exit ${run.code} signal ${run.signal}\n--- stdout\n${run.stdout.slice(-4000)}\n--- stderr\n${run.stderr.slice(-4000)}\n--- lumen log\n${lumenLog.slice(-4000)}`;
}

// ---- one turn, start to end ----------------------------------------------------------------

// Runs one agent turn against a fresh lumen: starts `lumen serve` (extra
// args lumenArgs, or lumenArgs({ home, work }) when a function) and the
// recording proxy, makes HOME and a working folder
// (work) under a temp folder, calls setup({ home, work, url }) to write the
// agent's config and return { cmd, args, env }, runs it, and stops
// everything; rewrite is the proxy's (startProxy). Resolves to { run, log,
// exchanges, chats, lumenExit, work }.
export async function runTurn({ name, lumenArgs = [], setup, rewrite = null, timeoutMs = 120000 }) {
  const tmp = tempDir(name);
  const home = path.join(tmp.dir, 'home');
  const work = path.join(tmp.dir, 'work');
  mkdirSync(home, { recursive: true });
  mkdirSync(work, { recursive: true });
  const lumen = await startLumen(typeof lumenArgs === 'function' ? lumenArgs({ home, work }) : lumenArgs);
  const proxy = await startProxy(lumen.url, rewrite);
  try {
    const { cmd, args, env = {}, input = '' } = await setup({ home, work, url: proxy.url });
    const run = await runAgent(cmd, args, { cwd: work, home, env, timeoutMs, input });
    await proxy.close();
    const lumenExit = await lumen.stop();
    if (process.env.LUMEN_AGENTS_KEEP) {
      writeFileSync(path.join(tmp.dir, 'exchanges.json'), JSON.stringify(proxy.exchanges, null, 1));
      writeFileSync(path.join(tmp.dir, 'lumen.log'), lumen.log());
      writeFileSync(path.join(tmp.dir, 'agent.out'), `${run.stdout}\n--- stderr\n${run.stderr}`);
    }
    return { run, log: lumen.log(), exchanges: proxy.exchanges, chats: proxy.chats(), lumenExit, work };
  } finally {
    await proxy.close().catch(() => {});
    await lumen.stop();
    tmp.cleanup();
  }
}

// The checks every turn passes: the agent exited 0; lumen shut down cleanly,
// logged at least one `POST route 200` and no 4xx/5xx line; every exchange
// the proxy saw was answered below 400. An agent may hang up on a request it
// no longer wants (opencode drops its title request when the turn ends
// first): lumen logs that as 499 (client gone), allowed as often as the proxy
// saw the agent hang up. Returns the route's log lines.
export function assertCleanTurn(r, route) {
  const why = describeRun(r.run, r.log);
  assert.equal(r.run.code, 0, `the agent failed:\n${why}`);
  assert.equal(r.lumenExit, 0, `lumen did not exit cleanly:\n${why}`);
  const lines = requestLines(r.log);
  const bad = lines.filter((l) => l.status >= 400 && l.status !== 499);
  assert.deepEqual(bad.map((l) => l.line), [], `lumen answered errors:\n${why}`);
  const gone = lines.filter((l) => l.status === 499).length;
  const hungUp = r.exchanges.filter((x) => x.aborted).length;
  assert.ok(gone <= hungUp, `lumen logged ${gone} client-gone line(s), the agent hung up ${hungUp} time(s):\n${why}`);
  const ok = lines.filter((l) => l.method === 'POST' && l.path === route && l.status === 200);
  assert.ok(ok.length >= 1, `no POST ${route} 200 in lumen's log:\n${why}`);
  for (const x of r.exchanges.filter((e) => !e.aborted))
    assert.ok(x.status > 0 && x.status < 400, `${x.method} ${x.url} -> ${x.status}: ${x.response.slice(0, 500)}`);
  return ok;
}

// The names of the tools a chat-completions request offered.
export function toolNames(body) {
  return (body?.tools || []).map((t) => t.function?.name);
}

// Checks a tool round trip through chat completions: some answer carried a
// call to tool (its arguments equal to args), and a later request sent the
// call back in an assistant message with the same id, followed by a "tool"
// message for that id whose content includes marker. Returns that request.
export function assertToolRoundTrip(r, tool, args, marker) {
  const why = describeRun(r.run, r.log);
  const i = r.chats.findIndex((x) => toolCallsIn(x.response).some((c) => c.name === tool));
  assert.ok(i >= 0, `no answer called ${tool}:\n${why}`);
  const call = toolCallsIn(r.chats[i].response).find((c) => c.name === tool);
  assert.deepEqual(JSON.parse(call.arguments), args);
  assert.match(call.id, /^call_/);
  const next = r.chats.slice(i + 1).find((x) => (x.body.messages || []).some((m) => m.role === 'tool' && m.tool_call_id === call.id));
  assert.ok(next, `no later request carried the result of ${call.id}:\n${why}`);
  const msgs = next.body.messages;
  const a = msgs.find((m) => m.role === 'assistant' && (m.tool_calls || []).some((c) => c.id === call.id));
  assert.ok(a, 'the assistant message with the call was not sent back');
  const res = msgs.find((m) => m.role === 'tool' && m.tool_call_id === call.id);
  const text = typeof res.content === 'string' ? res.content : JSON.stringify(res.content);
  assert.ok(text.includes(marker), `the tool result does not hold ${marker}: ${text.slice(0, 500)}`);
  assert.equal(next.status, 200);
  return next;
}
