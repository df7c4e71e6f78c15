// codex.test.mjs - Codex (@openai/codex, pinned in package.json) runs turns
// against `lumen serve` on the bundled demo model through the Responses API.
//
// Codex is pointed at lumen with a custom model provider (wire_api =
// "responses", base_url, env_key) in a temporary CODEX_HOME, and run with
// `codex exec --json` (non-interactive). A small recording proxy between
// them (the harness's) keeps every request and answer, so the test can say
// what Codex sent (tools, items) and what lumen answered;
// LUMEN_AGENTS_KEEP=1 keeps the temp CODEX_HOME with exchanges.json and
// lumen.log in it.
//
// The demo model is tiny (4096 tokens of context, never trained on tool
// calls): Codex's own 17 kB system prompt and its subagent/goal tools do not
// fit, so the config replaces the instructions with a short file and turns
// those tools and the permission, environment and skills notes off (which
// also keeps temporary paths out of the prompt); the shell tools
// (exec_command, write_stdin, request_user_input) stay and go to lumen on
// every request. The model will not call a tool by itself, so the tool round
// trip is shown on the history side: a function_call and its
// function_call_output are added to the session's rollout, and `codex exec
// resume` sends them back to lumen in the next turn.
//
// Codex sends no temperature, so the model samples at 1, and about half of
// its answers ramble on until the context is full: lumen then answers
// status "incomplete" (max_output_tokens), which Codex reports as a failed
// turn. Less often it stays inside <think> until its end of sequence, and
// the turn completes with only reasoning shown (see allReasoning). These two
// outcomes (and only they, each checked on both sides) are retried with the
// next of a few requests in the demo's training format, up to 10 times; any
// other failure fails the test at once.
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { appendFileSync, existsSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { startProxy, tempDir } from '../lib/harness.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..', '..', '..');
const bin = process.env.LUMEN_BIN || path.join(root, 'build', 'release', 'lumen');
const demo = path.join(root, 'models', 'demo');
const codex = path.join(here, 'node_modules', '.bin', 'codex');
const apiKey = 'lumen-codex-test-key';

const skip = !existsSync(codex)
  ? `codex not installed: run npm ci in ${here}`
  : !existsSync(bin)
    ? `lumen binary not found: ${bin} (set LUMEN_BIN)`
    : !existsSync(path.join(demo, 'model.safetensors'))
      ? `demo model not found: ${demo}`
      : null;
if (skip) test('codex against lumen serve', { skip }, () => {});

// Codex's own warnings that say nothing about the protocol.
const benign = [/Model metadata for `demo` not found/];

function startLumen() {
  return new Promise((resolve, reject) => {
    const proc = spawn(bin, ['serve', '-m', demo, '--port', '0', '--threads', '2', '--api-key', apiKey], {
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let log = '';
    const timer = setTimeout(() => reject(new Error(`lumen serve did not start:\n${log}`)), 30000);
    proc.stderr.setEncoding('utf8');
    proc.stderr.on('data', (d) => {
      log += d;
      const m = /http:\/\/127\.0\.0\.1:(\d+)/.exec(log);
      if (m && timer) {
        clearTimeout(timer);
        resolve({ port: Number(m[1]), proc, log: () => log });
      }
    });
    proc.on('exit', (code) => reject(new Error(`lumen serve exited with ${code}:\n${log}`)));
  });
}

function runCodex(home, work, args) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const child = execFile(codex, ['exec', '--skip-git-repo-check', '--json', ...args], {
      cwd: work,
      env: { ...process.env, CODEX_HOME: home, LUMEN_API_KEY: apiKey, NO_COLOR: '1' },
      timeout: 180000,
      maxBuffer: 64 << 20,
    }, (err, stdout, stderr) => {
      const events = stdout.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
      resolve({ err, stdout, stderr, events, seconds: (Date.now() - t0) / 1000 });
    });
    child.stdin.end(); // codex exec reads a piped stdin to its end before it starts
  });
}

// The turn completed and Codex reported nothing but benign warnings.
function assertCleanTurn(run) {
  const dump = `stdout:\n${run.stdout}\nstderr:\n${run.stderr}`;
  assert.equal(run.err, null, dump);
  const types = run.events.map((e) => e.type);
  assert.ok(types.includes('turn.completed'), dump);
  assert.ok(!types.includes('turn.failed') && !types.includes('error'), dump);
  for (const e of run.events) {
    if (e.type === 'item.completed' && e.item.type === 'error')
      assert.ok(benign.some((re) => re.test(e.item.message)), `Codex reported: ${e.item.message}`);
  }
  const msg = run.events.find((e) => e.type === 'item.completed' && e.item.type === 'agent_message');
  assert.ok(msg && msg.item.text.length > 0, dump);
  assert.ok(!/Reconnecting|stream disconnected|unexpected status/i.test(run.stderr), run.stderr);
}

// The model ran to the end of its context: lumen said "incomplete" and
// Codex failed the turn for it. lumen logs a stream once its last byte is
// out, which may be after Codex has exited: its line is waited for.
async function ranOutOfContext(run, lumen, mark) {
  const failed = run.events.find((e) => e.type === 'turn.failed');
  if (!failed || !/Incomplete response returned, reason: max_output_tokens/.test(failed.error.message)) return false;
  for (let i = 0; i < 50 && !/POST \/v1\/responses 200 .*finish length/.test(lumen.log().slice(mark)); i++)
    await new Promise((r) => setTimeout(r, 100));
  return /POST \/v1\/responses 200 .*finish length/.test(lumen.log().slice(mark));
}

// Requests like those the demo model was trained on.
const asks = ['Write a Python function `is_even`: Return True if n is even',
  'Write a Python function `add`: Add two numbers', 'Write a Python function `clamp`: Limit x to [lo, hi]'];

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// The events of a streamed Responses answer, once its last one is in (the
// proxy may still be passing the tail on when Codex has exited).
async function answerEvents(ex) {
  const events = () => ex.response.split('\n').slice(0, -1).filter((l) => l.startsWith('data: '))
    .map((l) => JSON.parse(l.slice(6)));
  for (let i = 0; i < 50 && !/^response\.(completed|incomplete|failed)$/.test(events().at(-1)?.type ?? ''); i++)
    await sleep(100);
  return events();
}

// The turn completed with reasoning alone because the demo model (sampling
// at Codex's temperature) stayed inside <think> until its end of sequence:
// lumen's one answer streamed reasoning items only, all completed. Codex asks
// for reasoning.summary and shows a reasoning item from its summary (lumen's
// is the think text itself), so it shows those items, one each, and no
// message (a lumen that wrote no summary would show nothing: not retried).
// (Codex's usage for a resumed turn is the thread's total: such a turn
// reports the first turn's answer as non-reasoning output too.)
async function allReasoning(run, posts) {
  if (!run.events.some((e) => e.type === 'turn.completed') || posts.length !== 1) return false;
  const shown = run.events.filter((e) => e.type === 'item.completed'
    && !(e.item.type === 'error' && benign.some((re) => re.test(e.item.message))));
  if (shown.some((e) => e.item.type !== 'reasoning')) return false;
  const events = await answerEvents(posts[0]);
  const last = events.at(-1);
  if (last?.type !== 'response.completed' || !last.response.output.length) return false;
  const added = events.filter((e) => e.type === 'response.output_item.added');
  return added.every((e) => e.item.type === 'reasoning') && shown.length === last.response.output.length
    && last.response.output.every((it) => it.type === 'reasoning' && it.status === 'completed');
}

// Runs attempt(ask) until a turn neither runs out of context nor ends in
// reasoning alone (at most 10 times); a lumen that never sends the message
// still fails after the last attempt.
async function turn(t, lumen, proxy, attempt) {
  let run;
  for (let i = 1; i <= 10; i++) {
    const mark = lumen.log().length;
    const from = proxy.exchanges.length;
    run = await attempt(asks[(i - 1) % asks.length]);
    const posts = proxy.exchanges.slice(from).filter((x) => x.method === 'POST');
    if (await ranOutOfContext(run, lumen, mark)) {
      t.diagnostic(`attempt ${i}: the model ran to the context limit (${run.seconds.toFixed(1)} s); again`);
    } else if (await allReasoning(run, posts)) {
      t.diagnostic(`attempt ${i}: the answer was all reasoning (${run.seconds.toFixed(1)} s); again`);
    } else {
      t.diagnostic(`attempt ${i}: ${run.seconds.toFixed(1)} s`);
      return run;
    }
  }
  return run;
}

describe('codex exec against lumen serve (Responses API)', { skip: skip !== null }, () => {
  let lumen;
  let proxy;
  let homeDir;
  let workDir;
  let home;
  let work;
  let threadId;

  before(async () => {
    lumen = await startLumen();
    proxy = await startProxy(`http://127.0.0.1:${lumen.port}`);
    homeDir = tempDir('codex-home');
    workDir = tempDir('codex-work');
    home = homeDir.dir;
    work = workDir.dir;
    writeFileSync(path.join(home, 'instructions.md'), 'You are a coding agent. Answer briefly.\n');
    // the config the README shows, plus what makes Codex fit a 4k context
    writeFileSync(path.join(home, 'config.toml'), `model = "demo"
model_provider = "lumen"
model_instructions_file = "${path.join(home, 'instructions.md')}"
web_search = "disabled"
include_permissions_instructions = false
include_environment_context = false
include_apps_instructions = false

[features]
goals = false
view_image = false

[agents]
enabled = false

[skills]
include_instructions = false

[model_providers.lumen]
name = "lumen"
base_url = "${proxy.url}/v1"
env_key = "LUMEN_API_KEY"
wire_api = "responses"
`);
  });

  after(async () => {
    if (proxy) await proxy.close();
    if (lumen) {
      const exited = new Promise((r) => lumen.proc.on('exit', (code, sig) => r(code ?? sig)));
      lumen.proc.kill('SIGTERM');
      assert.equal(await exited, 0, `lumen serve did not exit cleanly:\n${lumen.log()}`);
    }
    if (process.env.LUMEN_AGENTS_KEEP && home) {
      writeFileSync(path.join(home, 'exchanges.json'), JSON.stringify(proxy?.exchanges ?? [], null, 1));
      writeFileSync(path.join(home, 'lumen.log'), lumen?.log() ?? '');
    }
    homeDir?.cleanup();
    workDir?.cleanup();
  });

  test('one turn completes; lumen accepted Codex\'s request and its tools', async (t) => {
    const run = await turn(t, lumen, proxy, (ask) => runCodex(home, work, [ask]));
    assertCleanTurn(run);
    threadId = run.events.find((e) => e.type === 'thread.started').thread_id;
    const posts = proxy.exchanges.filter((r) => r.method === 'POST');
    assert.ok(posts.length >= 1);
    for (const r of posts) {
      assert.equal(r.url, '/v1/responses');
      assert.equal(r.status, 200, `lumen answered ${r.status}:\n${lumen.log()}`);
    }
    const body = posts.at(-1).body;
    assert.equal(body.stream, true);
    assert.equal(body.model, 'demo');
    const fnTools = body.tools.filter((x) => x.type === 'function').map((x) => x.name);
    assert.ok(fnTools.includes('exec_command'), `tools sent: ${JSON.stringify(fnTools)}`);
    // lumen's own log: every generation answered 200 (a stream's line comes
    // once its last byte is out, maybe after Codex exited)
    const logged = () => lumen.log().split('\n').filter((l) => l.includes('POST /v1/responses'));
    for (let i = 0; i < 50 && logged().length < posts.length; i++) await new Promise((r) => setTimeout(r, 100));
    const lines = logged();
    assert.equal(lines.length, posts.length);
    for (const l of lines) assert.match(l, /POST \/v1\/responses 200 .*finish (stop|length|tool_calls)/);
  });

  test('a history holding a function_call and its output goes back to lumen', async (t) => {
    assert.ok(threadId, 'the first turn did not run');
    const dir = path.join(home, 'sessions');
    const find = (d) => readdirSync(d, { withFileTypes: true }).flatMap((e) =>
      e.isDirectory() ? find(path.join(d, e.name)) : e.name.includes(threadId) ? [path.join(d, e.name)] : []);
    const [rollout] = find(dir);
    assert.ok(rollout, `no rollout for ${threadId} under ${dir}`);
    // the first answer shortened (a long ramble leaves the next one little room),
    // then the call and its output after it
    const lines = readFileSync(rollout, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    for (const l of lines) {
      if (l.type === 'response_item' && l.payload.type === 'message' && l.payload.role === 'assistant')
        l.payload.content = [{ type: 'output_text', text: 'def add(a, b):\n    return a + b\n' }];
    }
    writeFileSync(rollout, lines.map((l) => `${JSON.stringify(l)}\n`).join(''));
    const last = lines.at(-1);
    const items = [
      { type: 'function_call', name: 'exec_command', arguments: JSON.stringify({ cmd: 'echo lumen-tool-ok' }), call_id: 'call_lumen_1' },
      { type: 'function_call_output', call_id: 'call_lumen_1', output: 'lumen-tool-ok\n' },
    ];
    items.forEach((payload, i) => appendFileSync(rollout, `${JSON.stringify({
      timestamp: last.timestamp, ordinal: (last.ordinal ?? 0) + 1 + i, type: 'response_item', payload,
    })}\n`));
    const snapshot = readFileSync(rollout, 'utf8'); // a failed attempt must not lengthen the history
    let before;
    const run = await turn(t, lumen, proxy, (ask) => {
      writeFileSync(rollout, snapshot);
      before = proxy.exchanges.length;
      return runCodex(home, work, ['resume', threadId, `Thanks. ${ask}`]);
    });
    assertCleanTurn(run);
    const posts = proxy.exchanges.slice(before).filter((r) => r.method === 'POST');
    assert.ok(posts.length >= 1);
    for (const r of posts) assert.equal(r.status, 200, lumen.log());
    const input = posts.at(-1).body.input;
    const call = input.find((x) => x.type === 'function_call');
    const out = input.find((x) => x.type === 'function_call_output');
    assert.ok(call && out, `items sent: ${input.map((x) => x.type).join(' ')}`);
    assert.equal(call.call_id, 'call_lumen_1');
    assert.equal(out.call_id, 'call_lumen_1');
    // the earlier assistant answer is in the history too
    assert.ok(input.some((x) => x.type === 'message' && x.role === 'assistant'));
  });
});
