// responses.test.mjs - POST /v1/responses driven by the official openai npm
// SDK (pinned in package.json): plain and streamed answers, a function call
// and its output sent back, previous_response_id, and errors, against
// `lumen serve` on the bundled demo model (trained, so it follows the chat
// format; greedy answers are deterministic).
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import OpenAI from 'openai';

import { bin, demoModel, startServer } from './server.mjs';

const skip = !existsSync(path.join(demoModel, 'model.safetensors'))
  ? `demo model not found: ${demoModel}`
  : !existsSync(bin)
    ? `lumen binary not found: ${bin} (set LUMEN_BIN)`
    : null;
if (skip) test('lumen serve /v1/responses tests', { skip }, () => {});

const weatherTool = {
  type: 'function',
  name: 'get_weather',
  description: 'The weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  strict: false,
};

describe('lumen serve /v1/responses with the openai SDK', { skip: skip !== null }, () => {
  let srv;
  let client;

  before(async () => {
    srv = await startServer(['--parallel', '2'], demoModel);
    client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
  });

  after(async () => {
    if (srv) assert.equal(await srv.stop(), 0, `server did not exit cleanly:\n${srv.log()}`);
  });

  const base = {
    model: 'demo',
    instructions: 'You write Python.',
    input: 'Write a Python function `add`: Add two numbers',
    max_output_tokens: 24,
    temperature: 0,
  };

  test('responses.create: the response object', async () => {
    const r = await client.responses.create(base);
    assert.equal(r.object, 'response');
    assert.match(r.id, /^resp_/);
    assert.equal(r.model, 'demo');
    assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
    if (r.status === 'incomplete') assert.equal(r.incomplete_details.reason, 'max_output_tokens');
    const msg = r.output.find((o) => o.type === 'message');
    assert.ok(msg, JSON.stringify(r.output));
    assert.match(msg.id, /^msg_/);
    assert.equal(msg.role, 'assistant');
    assert.equal(msg.content[0].type, 'output_text');
    assert.deepEqual(msg.content[0].annotations, []);
    assert.ok(r.output_text.length > 0); // the SDK joins the output_text parts
    assert.equal(r.output_text, msg.content[0].text);
    assert.ok(r.usage.input_tokens > 10);
    assert.ok(r.usage.output_tokens > 0 && r.usage.output_tokens <= 24);
    assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
    assert.equal(typeof r.usage.input_tokens_details.cached_tokens, 'number');
    assert.equal(typeof r.usage.output_tokens_details.reasoning_tokens, 'number');
    assert.equal(r.instructions, 'You write Python.');
    assert.equal(r.max_output_tokens, 24);
    assert.equal(r.temperature, 0);
    assert.equal(r.store, true);
    assert.deepEqual(r.text, { format: { type: 'text' }, verbosity: 'medium' });
  });

  test('stream: the typed events build the same answer as the plain call', async () => {
    const plain = await client.responses.create({ ...base, max_output_tokens: 40 });
    const stream = client.responses.stream({ ...base, max_output_tokens: 40 });
    const types = [];
    let text = '';
    let seq = 0;
    for await (const ev of stream) {
      types.push(ev.type);
      assert.equal(ev.sequence_number, seq++);
      if (ev.type === 'response.output_text.delta') text += ev.delta;
    }
    const final = await stream.finalResponse();
    assert.equal(types[0], 'response.created');
    assert.equal(types[1], 'response.in_progress');
    assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)), types.at(-1));
    for (const t of ['response.output_item.added', 'response.content_part.added', 'response.output_text.delta',
      'response.output_text.done', 'response.content_part.done', 'response.output_item.done']) {
      assert.ok(types.includes(t), `no ${t} in ${types.join(' ')}`);
    }
    assert.equal(text, final.output_text);
    assert.equal(final.output_text, plain.output_text);
    assert.equal(final.usage.output_tokens, plain.usage.output_tokens);
  });

  test('create with stream: true is an async iterable of events', async () => {
    const stream = await client.responses.create({ ...base, stream: true, max_output_tokens: 8 });
    const events = [];
    for await (const ev of stream) events.push(ev);
    const last = events.at(-1);
    assert.ok(['response.completed', 'response.incomplete'].includes(last.type));
    assert.match(last.response.id, /^resp_/);
    assert.equal(last.response.id, events[0].response.id);
  });

  test('a forced function call, and its output sent back', async () => {
    const first = await client.responses.create({
      model: 'demo',
      input: 'What is the weather in Paris?',
      tools: [weatherTool],
      tool_choice: { type: 'function', name: 'get_weather' },
      max_output_tokens: 40,
      temperature: 0,
    });
    const call = first.output.find((o) => o.type === 'function_call');
    assert.ok(call, `no function_call in ${JSON.stringify(first.output)}`);
    assert.equal(call.name, 'get_weather');
    assert.match(call.id, /^fc_/);
    assert.match(call.call_id, /^call_/);
    assert.equal(call.status, 'completed');
    JSON.parse(call.arguments); // the demo model was never trained on calls: valid JSON is all it promises
    assert.deepEqual(first.tool_choice, { type: 'function', name: 'get_weather' });
    assert.equal(first.tools[0].name, 'get_weather');

    // the whole conversation sent again, as a stateless client does
    const second = await client.responses.create({
      model: 'demo',
      input: [
        { role: 'user', content: 'What is the weather in Paris?' },
        ...first.output,
        { type: 'function_call_output', call_id: call.call_id, output: '{"sky": "sunny", "celsius": 21}' },
      ],
      tools: [weatherTool],
      max_output_tokens: 16,
      temperature: 0,
      store: false,
    });
    assert.ok(['completed', 'incomplete'].includes(second.status));
    assert.ok(second.usage.input_tokens > first.usage.input_tokens);
    // the same through previous_response_id: the same prompt, so the same tokens in
    const third = await client.responses.create({
      model: 'demo',
      previous_response_id: first.id,
      input: [{ type: 'function_call_output', call_id: call.call_id, output: '{"sky": "sunny", "celsius": 21}' }],
      tools: [weatherTool],
      max_output_tokens: 16,
      temperature: 0,
    });
    assert.equal(third.usage.input_tokens, second.usage.input_tokens);
    assert.ok(third.usage.input_tokens_details.cached_tokens > 0, 'the earlier turn should come from the prefix cache');
    assert.equal(third.output_text, second.output_text);
    assert.equal(third.previous_response_id, first.id);
  });

  test('previous_response_id continues a stored conversation; store: false keeps nothing', async () => {
    const r1 = await client.responses.create({ ...base, max_output_tokens: 8 });
    const r2 = await client.responses.create({
      model: 'demo', previous_response_id: r1.id, input: 'Now `sub`', max_output_tokens: 8, temperature: 0,
    });
    assert.ok(r2.usage.input_tokens > r1.usage.input_tokens + r1.usage.output_tokens - 2);
    const unstored = await client.responses.create({ ...base, max_output_tokens: 4, store: false });
    assert.equal(unstored.store, false);
    for (const id of [unstored.id, 'resp_unknown']) {
      await assert.rejects(
        client.responses.create({ model: 'demo', previous_response_id: id, input: 'x' }),
        (err) => {
          assert.equal(err.status, 404);
          assert.equal(err.code, 'previous_response_not_found');
          assert.equal(err.param, 'previous_response_id');
          return true;
        },
      );
    }
  });

  test('text.format json_schema: output_text parses and follows the schema', async () => {
    const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 12 }, n: { type: 'integer', minimum: 0, maximum: 9 } },
                     required: ['name', 'n'], additionalProperties: false };
    const r = await client.responses.create({ ...base, max_output_tokens: 120, temperature: 0, reasoning: { effort: 'none' },
                                              text: { format: { type: 'json_schema', name: 'item', schema, strict: true } } });
    assert.equal(r.status, 'completed');
    const v = JSON.parse(r.output_text);
    assert.deepEqual(Object.keys(v).sort(), ['n', 'name']);
    assert.ok(Number.isInteger(v.n) && v.n >= 0 && v.n <= 9 && v.name.length <= 12);
  });

  test('errors name the field', async () => {
    await assert.rejects(
      client.responses.create({ ...base, text: { format: { type: 'json_schema', name: 'x', schema: { type: 'object', not: {} } } } }),
      (err) => err.status === 400 && /'not' is not supported/.test(err.message),
    );
    await assert.rejects(
      client.responses.create({ ...base, text: { format: { type: 'grammar' } } }),
      (err) => err.status === 400 && err.param === 'text.format',
    );
    await assert.rejects(
      client.responses.create({ model: 'demo', input: [{ type: 'message', role: 'user', content: [{ type: 'input_image', image_url: 'x' }] }] }),
      (err) => err.status === 400 && err.param === 'input[0].content[0]',
    );
    await assert.rejects(client.responses.create({ model: 'nope', input: 'x' }), (err) => err.status === 404);
  });
});
