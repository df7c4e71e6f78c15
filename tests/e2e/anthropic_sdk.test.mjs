// anthropic_sdk.test.mjs - `lumen serve` on the bundled demo model driven by
// the official @anthropic-ai/sdk (pinned in package.json) through
// /v1/messages, as Claude Code and other Anthropic clients use it.
//
// The demo model is small and writes Python-looking text: the tests check
// protocol and behaviour (shapes, streaming, usage, tool round trips, auth),
// not the quality of the words.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import Anthropic from '@anthropic-ai/sdk';

import { bin, demoModel, startServer } from './server.mjs';

const KEY = 'sk-lumen-e2e';
const skip = !existsSync(bin)
  ? `lumen binary not found: ${bin} (set LUMEN_BIN)`
  : !existsSync(path.join(demoModel, 'config.json'))
    ? `demo model not found: ${demoModel}`
    : null;
if (skip) test('lumen serve with the Anthropic SDK', { skip }, () => {});

const weather = {
  name: 'get_weather',
  description: 'Current weather of a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};
const ask = [{ role: 'user', content: 'Write a Python function `is_even`: Return True if n is even.' }];

describe('lumen serve with the Anthropic SDK', { skip: skip !== null }, () => {
  let srv;
  let client;

  before(async () => {
    srv = await startServer(['--api-key', KEY, '--parallel', '2'], demoModel);
    client = new Anthropic({ baseURL: srv.url, apiKey: KEY, maxRetries: 0, timeout: 60000 });
  });

  after(async () => {
    if (srv) assert.equal(await srv.stop(), 0, `server did not exit cleanly:\n${srv.log()}`);
  });

  test('messages.create: a message with a text block and usage', async () => {
    const m = await client.messages.create({
      model: 'claude-sonnet-4-5', // any name: lumen serves one model
      max_tokens: 24,
      temperature: 0,
      system: [{ type: 'text', text: 'You write Python.', cache_control: { type: 'ephemeral' } }],
      messages: ask,
    });
    assert.equal(m.type, 'message');
    assert.match(m.id, /^msg_/);
    assert.equal(m.role, 'assistant');
    assert.equal(m.model, 'demo');
    assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason), m.stop_reason);
    assert.equal(m.stop_sequence, null);
    const text = m.content.filter((b) => b.type === 'text');
    assert.equal(text.length, 1);
    assert.ok(text[0].text.length > 0);
    assert.ok(m.usage.input_tokens + m.usage.cache_read_input_tokens > 10);
    assert.equal(m.usage.cache_creation_input_tokens, 0);
    assert.ok(m.usage.output_tokens >= 1 && m.usage.output_tokens <= 24);
  });

  test('messages.stream: events add up to finalMessage, equal to the plain answer', async () => {
    const req = { model: 'claude-x', max_tokens: 32, temperature: 0, messages: ask };
    const plain = await client.messages.create(req);
    const stream = client.messages.stream(req);
    const kinds = [];
    let text = '';
    stream.on('streamEvent', (e) => kinds.push(e.type));
    stream.on('text', (t) => {
      text += t;
    });
    const fin = await stream.finalMessage();
    assert.equal(kinds[0], 'message_start');
    assert.equal(kinds.at(-1), 'message_stop');
    assert.ok(kinds.includes('content_block_delta') && kinds.includes('message_delta'));
    assert.match(fin.id, /^msg_/);
    assert.deepEqual(
      fin.content.map((b) => b.type),
      plain.content.map((b) => b.type),
    );
    const finText = fin.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
    assert.equal(finText, text);
    assert.equal(finText, plain.content.filter((b) => b.type === 'text').map((b) => b.text).join(''));
    assert.equal(fin.stop_reason, plain.stop_reason);
    assert.equal(fin.usage.output_tokens, plain.usage.output_tokens);
    // the second identical prompt is served from the prefix cache; the totals agree
    assert.equal(
      fin.usage.input_tokens + fin.usage.cache_read_input_tokens,
      plain.usage.input_tokens + plain.usage.cache_read_input_tokens,
    );
    assert.ok(fin.usage.cache_read_input_tokens > 0);
  });

  test('stop_sequences: the answer stops before the sequence', async () => {
    const base = { model: 'claude-x', max_tokens: 40, temperature: 0, messages: ask };
    const full = await client.messages.create(base);
    const whole = full.content.find((b) => b.type === 'text').text;
    const seq = whole.slice(6, 9); // three characters from inside the greedy answer
    const cut = await client.messages.create({ ...base, stop_sequences: [seq] });
    assert.equal(cut.stop_reason, 'stop_sequence');
    assert.equal(cut.stop_sequence, seq);
    const t = cut.content.find((b) => b.type === 'text')?.text ?? '';
    assert.equal(t, whole.slice(0, whole.indexOf(seq)));
  });

  test('tools: a forced tool_use, then its tool_result round trip', async () => {
    const req = {
      model: 'claude-x',
      max_tokens: 40,
      temperature: 0,
      tools: [weather],
      tool_choice: { type: 'tool', name: 'get_weather' },
      messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
    };
    const m = await client.messages.create(req);
    const use = m.content.find((b) => b.type === 'tool_use');
    assert.ok(use, `no tool_use block: ${JSON.stringify(m.content)}`);
    assert.match(use.id, /^toolu_/);
    assert.equal(use.name, 'get_weather');
    assert.equal(typeof use.input, 'object');
    // streamed: the SDK assembles the input from input_json_delta
    const fin = await client.messages.stream(req).finalMessage();
    const suse = fin.content.find((b) => b.type === 'tool_use');
    assert.equal(suse.name, 'get_weather');
    assert.deepEqual(suse.input, use.input);

    // the SDK's own message goes back as history, with the tool's result
    const history = [
      ...req.messages,
      { role: 'assistant', content: m.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '18 C and sunny' }] },
    ];
    const back = await client.messages.create({ model: 'claude-x', max_tokens: 16, tools: [weather], messages: history });
    assert.equal(back.type, 'message');
    assert.ok(back.content.length > 0);
    // the result reaches the prompt: a longer result costs more input tokens
    const count = async (result) =>
      (
        await client.messages.countTokens({
          model: 'claude-x',
          tools: [weather],
          messages: [
            ...history.slice(0, 2),
            { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: result, is_error: false }] },
          ],
        })
      ).input_tokens;
    const short = await count('18 C and sunny');
    const long = await count('18 C and sunny, wind from the north-west at 12 km/h, humidity 40 %');
    assert.ok(long > short, `${long} > ${short}`);
    assert.equal(short, back.usage.input_tokens + back.usage.cache_read_input_tokens);
  });

  test('count_tokens equals the input the generation reports', async () => {
    const req = { model: 'claude-x', system: 'Be brief.', tools: [weather], messages: ask };
    const { input_tokens } = await client.messages.countTokens(req);
    const m = await client.messages.create({ ...req, max_tokens: 4 });
    assert.equal(input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
  });

  test('a wrong x-api-key is a 401 authentication_error; bad input a 400', async () => {
    const bad = new Anthropic({ baseURL: srv.url, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(
      bad.messages.create({ model: 'claude-x', max_tokens: 4, messages: ask }),
      (err) => {
        assert.ok(err instanceof Anthropic.AuthenticationError, String(err));
        assert.equal(err.status, 401);
        assert.equal(err.error.type, 'error');
        assert.equal(err.error.error.type, 'authentication_error');
        return true;
      },
    );
    await assert.rejects(
      client.messages.create({
        model: 'claude-x',
        max_tokens: 4,
        messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }],
      }),
      (err) => {
        assert.ok(err instanceof Anthropic.BadRequestError, String(err));
        assert.equal(err.error.error.type, 'invalid_request_error');
        assert.match(err.error.error.message, /images are not supported/);
        return true;
      },
    );
  });
});
