// claude.test.mjs - Claude Code (pinned in package.json) pointed at
// `lumen serve` on the bundled demo model through ANTHROPIC_BASE_URL, run
// non-interactively (`claude -p`) with a temporary HOME and every kind of
// non-essential traffic turned off, so it runs offline.
//
// A small recording proxy sits between Claude Code and lumen: it forwards
// every byte and keeps each request, so the test can say what Claude Code
// sent (streaming, thinking, tools, the tool_use / tool_result history).
//
// What is shown: (1) a turn with a tool definition (Claude Code's Read tool)
// completes: every request gets a 200 and a valid streamed message, Claude
// Code parses each one, and lumen logs no error; (2) a tool round trip:
// the demo model is too small to choose a tool itself, so the test writes
// a Read tool_use and its tool_result into the saved session and resumes it
// (`--resume`); Claude Code then sends that history, lumen answers it. The
// demo model tends to write until max_tokens; Claude Code then asks it to
// continue a few times and may stop with its own "exceeded the output
// token maximum" message: that is the model's quality, not the protocol,
// and the test accepts it only with every HTTP answer a 200.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { appendFileSync, existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..', '..', '..');
const lumen = process.env.LUMEN_BIN || path.join(root, 'build', 'release', 'lumen');
const claude = path.join(here, 'node_modules', '.bin', 'claude');
const demo = path.join(root, 'models', 'demo');
const KEY = 'sk-lumen-claude';

const skip = !existsSync(lumen)
  ? `lumen binary not found: ${lumen} (set LUMEN_BIN)`
  : !existsSync(claude)
    ? `Claude Code not installed: run npm ci in ${here}`
    : null;
if (skip) test('Claude Code against lumen serve', { skip }, () => {});

// lumen serve on the demo model, port 0; resolves to { port, log(), stop() }.
function startLumen() {
  return new Promise((resolve, reject) => {
    const proc = spawn(lumen, ['serve', '-m', demo, '--port', '0', '--threads', '2', '--api-key', KEY], {
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let log = '';
    let done = false;
    const timer = setTimeout(() => fail(new Error(`lumen serve did not start:\n${log}`)), 30000);
    const fail = (e) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      proc.kill('SIGKILL');
      reject(e);
    };
    proc.stderr.setEncoding('utf8');
    proc.stderr.on('data', (d) => {
      log += d;
      const m = /http:\/\/127\.0\.0\.1:(\d+)/.exec(log);
      if (m && !done) {
        done = true;
        clearTimeout(timer);
        resolve({
          port: Number(m[1]),
          log: () => log,
          stop: () =>
            new Promise((res) => {
              if (proc.exitCode !== null) return res(proc.exitCode);
              proc.on('exit', (code) => res(code));
              proc.kill('SIGTERM');
            }),
        });
      }
    });
    proc.on('exit', (code) => fail(new Error(`lumen serve exited with ${code}:\n${log}`)));
  });
}

// A forwarding proxy that records each request: { method, url, headers, body }.
function startProxy(target) {
  const seen = [];
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      seen.push({ method: req.method, url: req.url, headers: req.headers, body: body.toString('utf8') });
      const up = http.request(
        { host: '127.0.0.1', port: target, method: req.method, path: req.url, headers: req.headers },
        (ur) => {
          res.writeHead(ur.statusCode, ur.headers);
          ur.pipe(res);
        },
      );
      up.on('error', () => res.destroy());
      up.end(body);
    });
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({ port: server.address().port, seen, server })));
}

// Runs claude with args in cwd; resolves to { code, stdout, stderr, ms }.
function runClaude(args, env, cwd) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const p = spawn(claude, args, { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (d) => (stdout += d));
    p.stderr.on('data', (d) => (stderr += d));
    const kill = setTimeout(() => p.kill('SIGKILL'), 180000);
    p.on('exit', (code) => {
      clearTimeout(kill);
      resolve({ code, stdout, stderr, ms: Date.now() - t0 });
    });
  });
}

// Claude Code's environment: nothing inherited but PATH, a temporary HOME,
// no telemetry, error reports, auto-update or other non-essential traffic.
function claudeEnv(home, port, auth) {
  return {
    PATH: process.env.PATH,
    HOME: home,
    ANTHROPIC_BASE_URL: `http://127.0.0.1:${port}`,
    ...auth,
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
    DISABLE_TELEMETRY: '1',
    DISABLE_ERROR_REPORTING: '1',
    DISABLE_AUTOUPDATER: '1',
    DISABLE_BUG_COMMAND: '1',
    DISABLE_NON_ESSENTIAL_MODEL_CALLS: '1',
    CLAUDE_CODE_MAX_OUTPUT_TOKENS: '128', // short answers: the demo model rambles
    MAX_THINKING_TOKENS: '0',
  };
}

// The demo model's context (4096 tokens) cannot hold Claude Code's default
// system prompt and tool set (about 30,000 tokens here): one built-in tool
// and a short system prompt fit.
const common = ['--output-format', 'json', '--model', 'claude-sonnet-4-5', '--tools', 'Read', '--system-prompt', 'You write Python.'];

// Claude Code's result, checked for what would be a protocol failure.
function checkTurn(run, lumenLog, seen) {
  assert.ok(run.stdout.trim().startsWith('{'), `claude printed no JSON result (exit ${run.code}):\n${run.stderr}`);
  const res = JSON.parse(run.stdout);
  assert.equal(res.type, 'result');
  assert.ok(res.num_turns >= 1);
  assert.equal(res.api_error_status ?? null, null, `an HTTP error reached Claude Code: ${res.result}`);
  if (res.is_error) assert.match(res.result, /exceeded the \d+ output token maximum/, res.result);
  else assert.equal(run.code, 0);
  const posts = seen.filter((r) => r.url.startsWith('/v1/messages'));
  assert.ok(posts.length >= 1, 'Claude Code sent no request to /v1/messages');
  const lines = lumenLog.split('\n').filter((l) => l.includes('POST /v1/messages'));
  assert.ok(lines.length >= posts.length, lumenLog);
  for (const l of lines) assert.match(l, /POST \/v1\/messages(\/count_tokens)? 200 /, `lumen answered with an error: ${l}`);
  assert.doesNotMatch(run.stderr, /API Error|ECONNREFUSED|Invalid|SyntaxError/);
  return res;
}

describe('Claude Code against lumen serve', { skip: skip !== null }, () => {
  let srv;
  let proxy;
  let work;
  let home;

  before(async () => {
    srv = await startLumen();
    proxy = await startProxy(srv.port);
    work = mkdtempSync(path.join(os.tmpdir(), 'lumen-claude-work-'));
    home = mkdtempSync(path.join(os.tmpdir(), 'lumen-claude-home-'));
    writeFileSync(path.join(work, 'notes.txt'), 'the secret word is pelican\n');
  });

  after(async () => {
    if (proxy) proxy.server.close();
    if (srv) assert.equal(await srv.stop(), 0, `lumen did not exit cleanly:\n${srv.log()}`);
    for (const d of [work, home]) if (d) rmSync(d, { recursive: true, force: true });
  });

  let sessionId;

  test('one turn with a tool definition (x-api-key)', async () => {
    const before = proxy.seen.length;
    const run = await runClaude(
      ['-p', 'Write a Python function `is_even`: Return True if n is even.', ...common],
      claudeEnv(home, proxy.port, { ANTHROPIC_API_KEY: KEY }),
      work,
    );
    const seen = proxy.seen.slice(before);
    const res = checkTurn(run, srv.log(), seen);
    sessionId = res.session_id;
    const first = seen.find((r) => r.url.startsWith('/v1/messages'));
    assert.equal(first.headers['x-api-key'], KEY);
    assert.ok(first.headers['anthropic-version']);
    const body = JSON.parse(first.body);
    assert.equal(body.stream, true);
    assert.equal(body.model, 'claude-sonnet-4-5');
    assert.deepEqual(body.tools.map((t) => t.name), ['Read']);
    assert.ok(body.tools[0].input_schema);
    console.log(`# claude turn: ${run.ms} ms, ${seen.length} requests, result ${res.is_error ? 'max-token stop' : 'completed'}`);
  });

  test('a Read tool_use and its tool_result, resumed (Bearer)', async () => {
    assert.ok(sessionId, 'the first turn left no session');
    const dir = path.join(home, '.claude', 'projects');
    const proj = readdirSync(dir).map((d) => path.join(dir, d)).find((d) => existsSync(path.join(d, `${sessionId}.jsonl`)));
    assert.ok(proj, `no session file for ${sessionId}`);
    const file = path.join(proj, `${sessionId}.jsonl`);
    // Claude Code's transcript: rows linked by parentUuid; the leaf is the
    // last message or attachment row. Append an assistant tool_use of Read
    // and the user's tool_result, as Claude Code itself records them.
    const rows = readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    const linked = rows.filter((r) => r.uuid && (r.type === 'assistant' || r.type === 'user' || r.type === 'attachment'));
    const leaf = linked.at(-1);
    const meta = {};
    for (const k of ['isSidechain', 'userType', 'entrypoint', 'cwd', 'sessionId', 'version', 'gitBranch']) meta[k] = leaf[k];
    const useId = 'toolu_lumen_read_1';
    const a = randomUUID();
    const u = randomUUID();
    const now = new Date().toISOString();
    const notes = path.join(work, 'notes.txt');
    appendFileSync(
      file,
      [
        { ...meta, parentUuid: leaf.uuid, type: 'assistant', uuid: a, timestamp: now,
          message: { id: 'msg_lumen_tool', type: 'message', role: 'assistant', model: 'demo',
            content: [{ type: 'tool_use', id: useId, name: 'Read', input: { file_path: notes } }],
            stop_reason: 'tool_use', stop_sequence: null, usage: { input_tokens: 1, output_tokens: 1 } } },
        { ...meta, parentUuid: a, type: 'user', uuid: u, timestamp: now,
          message: { role: 'user', content: [{ type: 'tool_result', tool_use_id: useId, content: '     1\tthe secret word is pelican\n' }] } },
      ].map((r) => JSON.stringify(r) + '\n').join(''),
    );
    const before = proxy.seen.length;
    // ANTHROPIC_AUTH_TOKEN (Bearer): with ANTHROPIC_API_KEY Claude Code asks
    // to approve the key again when it resumes, which -p cannot answer.
    const run = await runClaude(
      ['-p', 'What is the secret word?', '--resume', sessionId, ...common],
      claudeEnv(home, proxy.port, { ANTHROPIC_AUTH_TOKEN: KEY }),
      work,
    );
    const seen = proxy.seen.slice(before);
    checkTurn(run, srv.log(), seen);
    const first = seen.find((r) => r.url.startsWith('/v1/messages'));
    assert.equal(first.headers.authorization, `Bearer ${KEY}`);
    const body = JSON.parse(first.body);
    const blocks = body.messages.flatMap((m) => (Array.isArray(m.content) ? m.content.map((b) => ({ role: m.role, ...b })) : []));
    const use = blocks.find((b) => b.type === 'tool_use' && b.id === useId);
    const result = blocks.find((b) => b.type === 'tool_result' && b.tool_use_id === useId);
    assert.ok(use && use.role === 'assistant' && use.name === 'Read', JSON.stringify(body.messages).slice(0, 2000));
    assert.ok(result && result.role === 'user');
    assert.match(JSON.stringify(result.content), /pelican/);
    console.log(`# claude resumed turn with tool_use + tool_result: ${run.ms} ms, ${seen.length} requests`);
  });
});
