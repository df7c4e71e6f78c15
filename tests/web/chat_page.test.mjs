// chat_page.test.mjs - the chat page of `lumen serve` (GET /) in headless
// Chromium (Debian's /usr/bin/chromium, or CHROMIUM), driven by puppeteer-core
// (pinned in package.json): a person types the API key and a message, the
// answer streams in, the conversation goes back with the next message, Stop
// aborts a request, a conversation longer than the model's context goes on
// (its oldest turns left out, the system prompt kept), and the page logs no
// error on the way.
//
// The server runs the bundled demo model with --parallel 1 and an API key.
// To stop a request deterministically the test first occupies the one slot
// with a long request of its own, so the page's request is still waiting
// when Stop is clicked.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import puppeteer from 'puppeteer-core';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..', '..');
const bin = process.env.LUMEN_BIN || path.join(root, 'build', 'release', 'lumen');
const chromium = process.env.CHROMIUM || '/usr/bin/chromium';
const key = 'web-test-key';

function skipReason() {
  if (!existsSync(bin)) return `lumen binary not found: ${bin} (set LUMEN_BIN)`;
  if (!existsSync(chromium)) return `chromium not found: ${chromium} (apt-get install chromium, or set CHROMIUM)`;
  return null;
}

// `lumen serve` on the demo model; resolves to { url, stop() }.
function startServer(args) {
  return new Promise((resolve, reject) => {
    const proc = spawn(bin, ['serve', '--port', '0', '--device', 'cpu', '--threads', '1', ...args], {
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let log = '';
    const timer = setTimeout(() => reject(new Error(`lumen serve did not start:\n${log}`)), 30000);
    proc.stderr.setEncoding('utf8');
    proc.stderr.on('data', (d) => {
      log += d;
      const m = /http:\/\/127\.0\.0\.1:(\d+)/.exec(log);
      if (m) {
        clearTimeout(timer);
        resolve({
          url: `http://127.0.0.1:${m[1]}`,
          log: () => log,
          stop: () =>
            new Promise((done) => {
              if (proc.exitCode !== null) return done(proc.exitCode);
              proc.on('exit', (code, sig) => done(code ?? `signal ${sig}`));
              proc.kill('SIGTERM');
            }),
        });
      }
    });
    proc.on('exit', (code) => reject(new Error(`lumen serve exited with ${code}:\n${log}`)));
  });
}

const skip = skipReason();
if (skip) test('lumen chat page in Chromium', { skip }, () => {});

describe('the chat page in headless Chromium', { skip: skip !== null }, () => {
  let srv;
  let browser;
  let page;
  const problems = []; // console errors, page errors, failed requests
  const bodies = []; // the chat requests the page sent
  let cannedBody = null; // set: chat requests get this stream instead of the server's
  let contextLimit = 0; // set: chat requests of more messages get the server's context 400
  let overflowAll = false; // set: every chat request gets the server's context 400

  before(async () => {
    srv = await startServer(['--api-key', key, '--parallel', '1']);
    browser = await puppeteer.launch({
      executablePath: chromium,
      headless: true,
      args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'],
    });
    page = await browser.newPage();
    page.on('console', (m) => {
      if (m.type() === 'error' || m.type() === 'warn') problems.push(`console ${m.type()}: ${m.text()}`);
    });
    page.on('pageerror', (e) => problems.push(`page error: ${e}`));
    // Every request passes one handler: a canned test answers chat requests
    // itself; otherwise they go to the server with their answers cut to 300
    // tokens, to keep the tests quick (the page's own budget is 1,024 on the
    // demo model's 4,096-token context). bodies keeps what the page sent.
    await page.setRequestInterception(true);
    page.on('request', (r) => {
      if (!r.url().endsWith('/v1/chat/completions') || r.method() !== 'POST') return r.continue();
      const body = JSON.parse(r.postData());
      bodies.push(body);
      if (overflowAll || (contextLimit && body.messages.length > contextLimit))
        return r.respond({ status: 400, contentType: 'application/json', body: JSON.stringify(overflow) });
      if (cannedBody) return r.respond({ status: 200, contentType: 'text/event-stream', body: cannedBody });
      return r.continue({ postData: JSON.stringify({ ...body, max_tokens: 300 }) });
    });
  });

  after(async () => {
    if (browser) await browser.close();
    if (srv) assert.equal(await srv.stop(), 0, `server did not exit cleanly:\n${srv.log()}`);
  });

  // lumen's answer to a prompt that does not fit the context (generate.c)
  const overflow = {
    error: { message: 'the messages need 4100 tokens; the context holds 4096', type: 'invalid_request_error',
      param: 'messages', code: 'context_length_exceeded' },
  };

  const assistant = (i) => `#log .msg.assistant:nth-of-type(${2 * i + 2})`;
  const stateOf = (i) => page.$eval(assistant(i), (d) => d.dataset.state);

  async function sendMessage(text) {
    await page.type('#input', text);
    await page.keyboard.press('Enter');
  }

  test('the page loads with a restrictive Content-Security-Policy', async () => {
    const res = await page.goto(`${srv.url}/`, { waitUntil: 'load' });
    assert.equal(res.status(), 200);
    assert.equal(res.headers()['content-type'], 'text/html; charset=utf-8');
    assert.match(res.headers()['content-security-policy'], /default-src 'none'/);
    assert.equal(await page.title(), 'lumen chat');
  });

  test('a message with the API key streams its answer', async () => {
    await page.type('#key', key);
    assert.equal(await page.evaluate(() => sessionStorage.getItem('lumen-api-key')), key);
    await sendMessage('Write a Python function `add`');
    await page.waitForFunction((sel) => document.querySelector(sel)?.dataset.state !== 'streaming', { timeout: 60000 },
      assistant(0));
    assert.equal(await stateOf(0), 'done', await page.$eval(assistant(0), (d) => d.textContent));
    const chunks = Number(await page.$eval(assistant(0), (d) => d.dataset.chunks));
    assert.ok(chunks >= 2, `the answer came in ${chunks} chunk(s)`);
    const text = await page.$eval(`${assistant(0)} .text`, (d) => d.textContent);
    const reasoning = await page.$eval(`${assistant(0)} details`, (d) => ({ open: d.open, text: d.textContent }));
    assert.ok(text.length + reasoning.text.length > 10, 'the answer is on the page');
    assert.equal(reasoning.open, false, 'reasoning is shown collapsed');
    assert.equal(bodies.length, 1);
    assert.equal(bodies[0].stream, true);
    assert.deepEqual(bodies[0].messages, [{ role: 'user', content: 'Write a Python function `add`' }]);
  });

  test('the next message carries the conversation', async () => {
    await sendMessage('Now one called mul');
    await page.waitForFunction((sel) => document.querySelector(sel)?.dataset.state === 'done', { timeout: 60000 },
      assistant(1));
    assert.equal(bodies.length, 2);
    assert.deepEqual(bodies[1].messages.map((m) => m.role), ['user', 'assistant', 'user']);
    assert.equal(bodies[1].messages[2].content, 'Now one called mul');
  });

  test('Stop aborts a request and the conversation goes on', async () => {
    // occupy the server's one slot: the page's request waits behind it
    const hold = new AbortController();
    const busy = fetch(`${srv.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({
        messages: [{ role: 'user', content: 'Count' }],
        max_tokens: 3000,
        logit_bias: { 0: -100, 2: -100 },
        stream: true,
      }),
      signal: hold.signal,
    }).then((r) => r.body.getReader().read()); // resolves once it is generating
    await busy;
    await sendMessage('A third message');
    assert.equal(await stateOf(2), 'streaming');
    await page.click('#stop');
    await page.waitForFunction((sel) => document.querySelector(sel)?.dataset.state !== 'streaming', { timeout: 10000 },
      assistant(2));
    assert.equal(await stateOf(2), 'stopped');
    assert.equal(await page.$eval(`${assistant(2)} .note`, (d) => d.textContent), '(stopped)');
    hold.abort();
    await sendMessage('And a fourth');
    await page.waitForFunction((sel) => document.querySelector(sel)?.dataset.state === 'done', { timeout: 60000 },
      assistant(3));
    // the stopped turn stays, with what had arrived (nothing here)
    assert.deepEqual(bodies.at(-1).messages.map((m) => m.role), ['user', 'assistant', 'user', 'assistant', 'user', 'assistant', 'user']);
  });

  test('reasoning is shown folded away (a canned stream)', async () => {
    // the demo model rarely thinks: the page gets a stream written here, with
    // a keep-alive comment, CRLF framing and an event split over two lines
    const chunk = (delta, finish = null) =>
      `data: ${JSON.stringify({ object: 'chat.completion.chunk', model: 'canned', choices: [{ index: 0, delta, finish_reason: finish }] })}`;
    const body = [
      ': keep-alive\r\n\r\n',
      `${chunk({ role: 'assistant', reasoning_content: 'Let me think.' })}\r\n\r\n`,
      `${chunk({ reasoning_content: ' Twice.' })}\n\n`,
      `${chunk({ content: 'The answer' })}\n\n`,
      'data: {"object":"chat.completion.chunk","choices":[{"index":0,\ndata: "delta":{"content":" is 4."},"finish_reason":null}]}\n\n',
      `${chunk({}, 'stop')}\n\n`,
      'data: [DONE]\n\n',
    ].join('');
    cannedBody = body;
    try {
      await sendMessage('What is 2 + 2?');
      await page.waitForFunction((sel) => document.querySelector(sel)?.dataset.state !== 'streaming', { timeout: 10000 },
        assistant(4));
      assert.equal(await stateOf(4), 'done');
      assert.equal(await page.$eval(`${assistant(4)} .text`, (d) => d.textContent), 'The answer is 4.');
      const details = await page.$eval(`${assistant(4)} details`, (d) => ({ hidden: d.hidden, open: d.open,
        text: d.querySelector('div').textContent }));
      assert.deepEqual(details, { hidden: false, open: false, text: 'Let me think. Twice.' });
      assert.equal(await page.$eval('#model', (d) => d.textContent), 'canned');
    } finally {
      cannedBody = null;
    }
  });

  test('a conversation past the context leaves out its oldest turns', async () => {
    // 10 messages so far (5 turns); the next request holds 11. Allow 6: the
    // page must drop the 3 oldest turns (6 messages) to get there.
    contextLimit = 6;
    const sent = bodies.length;
    try {
      await sendMessage('A sixth message');
      await page.waitForFunction((sel) => document.querySelector(sel)?.dataset.state !== 'streaming', { timeout: 60000 },
        assistant(5));
      assert.equal(await stateOf(5), 'done', await page.$eval(assistant(5), (d) => d.textContent));
      const tries = bodies.slice(sent).map((b) => b.messages.length);
      assert.deepEqual(tries, [11, 9, 7, 5]);
      const last = bodies.at(-1).messages;
      assert.equal(last[0].role, 'user');
      assert.equal(last.at(-1).content, 'A sixth message');
      assert.match(await page.$eval(`${assistant(5)} .note`, (d) => d.textContent), /oldest 6 messages/);
      // the next turn starts where this one left off: 13 messages, 6 left
      // out (7 sent), then one turn more
      const first = last[0].content;
      const before = bodies.length;
      await sendMessage('A seventh');
      await page.waitForFunction((sel) => document.querySelector(sel)?.dataset.state !== 'streaming', { timeout: 60000 },
        assistant(6));
      assert.equal(await stateOf(6), 'done');
      assert.deepEqual(bodies.slice(before).map((b) => b.messages.length), [7, 5]);
      assert.equal(bodies[before].messages[0].content, first);
      assert.match(await page.$eval(`${assistant(6)} .note`, (d) => d.textContent), /oldest 8 messages/);
    } finally {
      contextLimit = 0;
      // Chromium logs each 400 as a failed resource; those were asked for
      for (let i = problems.length - 1; i >= 0; i--) if (/status of 400/.test(problems[i])) problems.splice(i, 1);
    }
  });

  // How many tokens the served model makes of text.
  async function tokensOf(text) {
    const res = await fetch(`${srv.url}/tokenize`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ content: text }),
    });
    return (await res.json()).tokens.length;
  }

  // A message of at least n tokens, starting with label.
  async function messageOf(label, n) {
    const sentence = 'The quick brown fox jumps over the lazy dog, and then it runs far away. ';
    const each = await tokensOf(sentence);
    return `${label} ${sentence.repeat(Math.ceil(n / each))}`.trim();
  }

  // Sends text as a paste would (typing thousands of keys is slow) and waits
  // for answer i to finish; returns the chat requests the page sent for it.
  async function sendLong(text, i) {
    const sent = bodies.length;
    await page.$eval('#input', (el, v) => { el.value = v; }, text);
    await page.focus('#input');
    await page.keyboard.press('Enter');
    await page.waitForFunction((sel) => document.querySelector(sel)?.dataset.state !== 'streaming', { timeout: 60000 },
      assistant(i));
    return bodies.slice(sent);
  }

  const noteOf = (i) => page.$eval(`${assistant(i)} .note`, (d) => d.textContent);
  const system = 'You are a patient assistant.';

  test('a conversation longer than the context goes on; the system prompt stays', async () => {
    await page.click('#new');
    await page.click('#system-box summary');
    await page.type('#system', system);
    // 4 user messages of 1,100 tokens: the 3rd no longer fits with the 1st
    // turn in the 3,072 tokens the answer's budget leaves of the context
    const texts = [];
    for (let i = 0; i < 4; i++) texts.push(await messageOf(`Message ${i + 1}.`, 1100));
    const notes = [];
    for (let i = 0; i < 4; i++) {
      const sent = await sendLong(texts[i], i);
      assert.equal(await stateOf(i), 'done', await noteOf(i));
      assert.equal(sent.length, 1, 'one request a turn: the page left out turns before the server had to refuse');
      const messages = sent[0].messages;
      assert.deepEqual(messages[0], { role: 'system', content: system });
      assert.equal(messages[1].role, 'user');
      assert.equal(messages.at(-1).content, texts[i]);
      assert.ok(sent[0].max_tokens >= 256 && sent[0].max_tokens <= 1024, `max_tokens ${sent[0].max_tokens}`);
      notes.push(await noteOf(i));
      assert.equal(messages.length, 1 + 2 * Math.min(i + 1, 2) - 1, `turn ${i + 1}: ${messages.length} messages`);
    }
    assert.doesNotMatch(notes[0] + notes[1], /left out/);
    assert.match(notes[2], /oldest 2 messages no longer fit the model's context \(4096 tokens\) and were left out/);
    assert.match(notes[3], /oldest 4 messages/);
    // the conversation on the page holds more than the context does
    const shown = await page.$$eval('#log .msg .text', (l) => l.map((d) => d.textContent));
    let total = 0;
    for (const t of shown) total += await tokensOf(t);
    assert.ok(total > 4096, `the conversation holds ${total} tokens`);
  });

  test('a message too long for the context alone is refused, naming the limit', async () => {
    const sent = await sendLong(await messageOf('Too long.', 4200), 4);
    assert.deepEqual(sent, [], 'nothing was sent');
    assert.equal(await stateOf(4), 'error');
    assert.match(await noteOf(4), /This message is too long for the model: about \d+ tokens with the system prompt, and its context holds 4096,/);
    assert.equal(await page.$eval('#log .msg.user:nth-of-type(9) .note', (d) => d.textContent), '(not sent)');
    assert.equal(await page.$eval('#status', (d) => d.textContent), 'failed');
    // the conversation goes on where it was, without the refused message;
    // a short one fits with the two turns before it again
    const next = await sendLong('A short one', 5);
    assert.equal(await stateOf(5), 'done');
    assert.equal(next.length, 1);
    const messages = next[0].messages;
    assert.deepEqual(messages.map((m) => m.role), ['system', 'user', 'assistant', 'user', 'assistant', 'user']);
    assert.deepEqual([0, 1, 3, 5].map((i) => messages[i].content.slice(0, 11)),
      [system.slice(0, 11), 'Message 3. ', 'Message 4. ', 'A short one']);
  });

  test("a 400 for length that leaving out turns cannot fix shows the server's message", async () => {
    overflowAll = true;
    try {
      const sent = await sendLong('Once more', 6);
      // the page left out one turn after another, then gave up: the last
      // try held the system prompt and the message alone
      const tries = sent.map((b) => b.messages.length);
      assert.ok(tries.length >= 2, `tries: ${tries}`);
      tries.forEach((n, i) => assert.equal(n, tries[0] - 2 * i, `tries: ${tries}`));
      assert.deepEqual(sent.at(-1).messages, [{ role: 'system', content: system }, { role: 'user', content: 'Once more' }]);
      assert.equal(await stateOf(6), 'error');
      assert.equal(await noteOf(6), `400: ${overflow.error.message}`);
    } finally {
      overflowAll = false;
      for (let i = problems.length - 1; i >= 0; i--) if (/status of 400/.test(problems[i])) problems.splice(i, 1);
    }
  });

  test('the API key survives a reload; no errors were logged', async () => {
    await page.reload({ waitUntil: 'load' });
    assert.equal(await page.$eval('#key', (i) => i.value), key);
    assert.equal(await page.$$eval('#log .msg', (l) => l.length), 0);
    assert.deepEqual(problems, []);
  });
});
