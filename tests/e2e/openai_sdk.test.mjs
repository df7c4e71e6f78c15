// openai_sdk.test.mjs - `lumen serve` driven by the official openai npm SDK
// (pinned in package.json), as an application would use it unchanged.
//
// The fixture model has random weights, so the tests check protocol and
// behaviour (shapes, usage, stop, seeds, logprobs, errors), not the words.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import OpenAI from 'openai';

import { skipReason, startServer } from './server.mjs';

const skip = skipReason();
const noEos = { 2: -100 }; // <|im_end|>: keep generating to max_tokens

// A skipped suite counts no test in node's summary; this one counts as skipped.
if (skip) test('lumen serve end-to-end tests', { skip }, () => {});

describe('lumen serve with the openai SDK', { skip: skip !== null }, () => {
  let srv;
  let client;

  before(async () => {
    srv = await startServer(['--parallel', '4']);
    client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
  });

  after(async () => {
    if (srv) assert.equal(await srv.stop(), 0, `server did not exit cleanly:\n${srv.log()}`);
  });

  test('models.list names the served model', async () => {
    const page = await client.models.list();
    assert.deepEqual(page.data.map((m) => m.id), ['qwen3']);
    assert.equal(page.data[0].object, 'model');
  });

  test('chat completion: shape and usage', async () => {
    const r = await client.chat.completions.create({
      model: 'qwen3',
      messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello' }],
      max_tokens: 16,
      logit_bias: noEos,
    });
    assert.equal(r.object, 'chat.completion');
    assert.match(r.id, /^chatcmpl-/);
    assert.equal(r.model, 'qwen3');
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(typeof r.choices[0].message.content, 'string');
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, 16);
    assert.ok(r.usage.prompt_tokens > 5);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 16);
    assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
  });

  test('streamed chat equals the plain answer; include_usage', async () => {
    const req = {
      model: 'qwen3',
      messages: [{ role: 'user', content: 'Tell me a story' }],
      max_tokens: 20,
      temperature: 0.8,
      seed: 11,
      logit_bias: noEos,
    };
    const plain = await client.chat.completions.create(req);
    const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
    let text = '';
    let role = null;
    let finish = null;
    let usage = null;
    let chunks = 0;
    for await (const c of stream) {
      chunks++;
      assert.equal(c.object, 'chat.completion.chunk');
      if (c.choices.length === 0) {
        usage = c.usage;
        continue;
      }
      assert.equal(c.usage, null);
      const d = c.choices[0].delta;
      if (d.role) role = d.role;
      if (d.content) text += d.content;
      if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
    }
    assert.ok(chunks >= 3);
    assert.equal(role, 'assistant');
    assert.equal(finish, 'length');
    assert.equal(text, plain.choices[0].message.content);
    assert.equal(usage.completion_tokens, 20);
    assert.equal(usage.prompt_tokens, plain.usage.prompt_tokens);
  });

  test('the SDK stream helper assembles a final completion', async () => {
    const runner = client.chat.completions.stream({
      model: 'qwen3',
      messages: [{ role: 'user', content: 'Hi' }],
      max_tokens: 8,
      logit_bias: noEos,
    });
    const final = await runner.finalChatCompletion();
    assert.equal(final.choices[0].message.role, 'assistant');
    assert.equal(final.choices[0].finish_reason, 'length');
  });

  test('same seed, same output; another seed, another output', async () => {
    const ask = (seed) =>
      client.chat.completions
        .create({ model: 'qwen3', messages: [{ role: 'user', content: 'Go' }], max_tokens: 24, temperature: 1, seed, logit_bias: noEos })
        .then((r) => r.choices[0].message.content);
    const [a, b, c] = await Promise.all([ask(5), ask(5), ask(6)]);
    assert.equal(a, b);
    assert.notEqual(a, c);
  });

  test('stop strings end the answer before the match, streamed or not', async () => {
    const base = { model: 'qwen3', messages: [{ role: 'user', content: 'Count' }], max_tokens: 30, temperature: 0, logit_bias: noEos };
    const full = (await client.chat.completions.create(base)).choices[0].message.content;
    assert.ok(full.length > 10, `answer too short to pick a stop string: ${JSON.stringify(full)}`);
    const stop = full.slice(Math.floor(full.length / 2), Math.floor(full.length / 2) + 3);
    const want = full.slice(0, full.indexOf(stop));
    const r = await client.chat.completions.create({ ...base, stop: [stop, 'never-appears'] });
    assert.equal(r.choices[0].message.content, want);
    assert.equal(r.choices[0].finish_reason, 'stop');
    const s = await client.chat.completions.create({ ...base, stop, stream: true });
    let text = '';
    let finish = null;
    for await (const c of s) {
      text += c.choices[0]?.delta?.content ?? '';
      finish = c.choices[0]?.finish_reason ?? finish;
      assert.ok(!text.includes(stop));
    }
    assert.equal(text, want);
    assert.equal(finish, 'stop');
  });

  test('chat logprobs and top_logprobs', async () => {
    const r = await client.chat.completions.create({
      model: 'qwen3',
      messages: [{ role: 'user', content: 'Hi' }],
      max_tokens: 5,
      logprobs: true,
      top_logprobs: 3,
      logit_bias: noEos,
    });
    const lp = r.choices[0].logprobs.content;
    assert.equal(lp.length, 5);
    for (const e of lp) {
      assert.equal(typeof e.token, 'string');
      assert.ok(e.logprob <= 0);
      assert.ok(Array.isArray(e.bytes));
      assert.equal(e.top_logprobs.length, 3);
      assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[2].logprob);
    }
  });

  test('completions: text, logprobs, echo, streaming', async () => {
    const r = await client.completions.create({ model: 'qwen3', prompt: 'Once upon a time', max_tokens: 6, logprobs: 2, logit_bias: noEos });
    assert.equal(r.object, 'text_completion');
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.choices[0].logprobs.tokens.length, 6);
    assert.equal(r.choices[0].logprobs.token_logprobs.length, 6);
    assert.equal(r.choices[0].logprobs.text_offset.length, 6);
    assert.equal(r.usage.completion_tokens, 6);
    const e = await client.completions.create({ model: 'qwen3', prompt: 'Echo me', max_tokens: 2, echo: true, temperature: 0 });
    assert.ok(e.choices[0].text.startsWith('Echo me'));
    const s = await client.completions.create({ model: 'qwen3', prompt: 'Stream me', max_tokens: 7, stream: true, logit_bias: noEos });
    let n = 0;
    let finish = null;
    for await (const c of s) {
      if (c.choices[0]?.text) n++;
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    assert.ok(n >= 1);
    assert.equal(finish, 'length');
  });

  test('tool definitions and history render; tool_choice none', async () => {
    const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
    const messages = [
      { role: 'user', content: 'Weather in Oslo?' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: 'sunny' },
    ];
    // Greedy with <|im_end|> banned: every answer runs to max_tokens, so the
    // finish reason is exactly 'length' (the random model cannot finish a call
    // in 8 tokens); a tool_choice that steers adds its prefill to the prompt.
    const prompt = {};
    for (const tool_choice of ['auto', 'none', 'required', { type: 'function', function: { name: 'get_weather' } }]) {
      const r = await client.chat.completions.create({
        model: 'qwen3', messages, tools, tool_choice, max_tokens: 8, temperature: 0, logit_bias: noEos,
      });
      const key = typeof tool_choice === 'string' ? tool_choice : 'named';
      assert.equal(r.choices[0].finish_reason, 'length', key);
      assert.equal(r.usage.completion_tokens, 8, key);
      assert.equal(r.choices[0].message.tool_calls, undefined, key);
      assert.ok(r.usage.prompt_tokens > 40); // the history is in the prompt
      prompt[key] = r.usage.prompt_tokens;
    }
    assert.ok(prompt.none < prompt.auto, JSON.stringify(prompt)); // tool_choice none drops the tools
    assert.ok(prompt.required > prompt.auto, JSON.stringify(prompt)); // "<tool_call>\n" prefilled
    assert.ok(prompt.named > prompt.required, JSON.stringify(prompt)); // ... with the function's name
  });

  test('response_format json_schema and a required tool call always parse', async () => {
    const schema = { type: 'object', properties: { city: { type: 'string', maxLength: 20 }, days: { type: 'integer', minimum: 1, maximum: 7 },
                                                   unit: { enum: ['c', 'f'] } }, required: ['city', 'days'], additionalProperties: false };
    for (const temperature of [0, 1]) {
      const c = await client.chat.completions.create({
        model: 'qwen3', messages: [{ role: 'user', content: 'Weather request as JSON.' }], max_tokens: 400, temperature, seed: 5,
        chat_template_kwargs: { enable_thinking: false },
        response_format: { type: 'json_schema', json_schema: { name: 'w', schema, strict: true } },
      });
      assert.equal(c.choices[0].finish_reason, 'stop');
      const v = JSON.parse(c.choices[0].message.content);
      assert.ok(typeof v.city === 'string' && v.city.length <= 20 && Number.isInteger(v.days) && v.days >= 1 && v.days <= 7);
      const t = await client.chat.completions.create({
        model: 'qwen3', messages: [{ role: 'user', content: 'Weather in Oslo?' }], max_tokens: 400, temperature, seed: 5,
        chat_template_kwargs: { enable_thinking: false }, parallel_tool_calls: false,
        tools: [{ type: 'function', function: { name: 'get_weather', parameters: schema } }], tool_choice: 'required',
      });
      assert.equal(t.choices[0].finish_reason, 'tool_calls');
      const args = JSON.parse(t.choices[0].message.tool_calls[0].function.arguments);
      assert.ok(Number.isInteger(args.days) && args.days >= 1 && args.days <= 7);
    }
  });

  test('errors are OpenAI errors with the right status', async () => {
    const bad = async (req, status, code) => {
      await assert.rejects(client.chat.completions.create(req), (err) => {
        assert.ok(err instanceof OpenAI.APIError, String(err));
        assert.equal(err.status, status, err.message);
        if (code) assert.equal(err.code, code);
        assert.equal(typeof err.error.message, 'string');
        return true;
      });
    };
    await bad({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x' }] }, 404, 'model_not_found');
    await bad({ model: 'qwen3', messages: [] }, 400);
    await bad({ model: 'qwen3', messages: [{ role: 'user', content: 'x' }], temperature: 'warm' }, 400);
    await bad({ model: 'qwen3', messages: [{ role: 'user', content: 'x '.repeat(5000) }] }, 400, 'context_length_exceeded');
    // the server is still fine
    const r = await client.chat.completions.create({ model: 'qwen3', messages: [{ role: 'user', content: 'x' }], max_tokens: 2 });
    assert.equal(r.choices.length, 1);
  });

  test('X-Request-Id round trip; a repeated conversation reports cached_tokens', async () => {
    const req = {
      model: 'qwen3',
      messages: [
        { role: 'system', content: 'You answer questions about the weather in one sentence, without lists or markup.' },
        { role: 'user', content: 'What colour is the sky on a clear day, and why does it look that way at noon?' },
      ],
      max_tokens: 8,
      temperature: 0,
      logit_bias: noEos,
    };
    const { data: first, response } = await client.chat.completions
      .create(req, { headers: { 'X-Request-Id': 'e2e-turn-1' } })
      .withResponse();
    assert.equal(response.headers.get('x-request-id'), 'e2e-turn-1');
    const again = await client.chat.completions.create(req);
    const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
    let text = '';
    let usage = null;
    for await (const c of stream) {
      text += c.choices[0]?.delta?.content ?? '';
      if (c.usage) usage = c.usage;
    }
    // the prefix cache is on by default (--cache-ram): its counter must count
    const metrics = await (await fetch(`${srv.url}/metrics`)).text();
    assert.match(metrics, /^lumen_prefix_cache_lookup_tokens_total [1-9]/m);
    // earlier tests' prompts share the template's first tokens, so the first may hit a few
    const cached0 = first.usage.prompt_tokens_details.cached_tokens;
    assert.ok(again.usage.prompt_tokens_details.cached_tokens > cached0, JSON.stringify([first.usage, again.usage]));
    assert.ok(usage.prompt_tokens_details.cached_tokens > cached0, JSON.stringify(usage));
    assert.equal(again.choices[0].message.content, first.choices[0].message.content);
    assert.equal(text, first.choices[0].message.content);
  });

  test('aborting a stream cancels its generation', async () => {
    const ac = new AbortController();
    const s = await client.chat.completions.create(
      { model: 'qwen3', messages: [{ role: 'user', content: 'Go on' }], max_tokens: 3000, stream: true, logit_bias: noEos },
      { signal: ac.signal },
    );
    let n = 0;
    try {
      for await (const c of s) {
        if (c.choices[0]?.delta?.content && ++n === 3) {
          ac.abort();
          break;
        }
      }
    } catch (err) {
      assert.ok(err instanceof OpenAI.APIUserAbortError || err.name === 'AbortError', String(err));
    }
    assert.equal(n, 3);
    let metrics = '';
    for (let i = 0; i < 100; i++) {
      metrics = await (await fetch(`${srv.url}/metrics`)).text();
      if (/lumen_client_disconnects_total [1-9]/.test(metrics) && /lumen_requests_running 0/.test(metrics)) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.match(metrics, /lumen_client_disconnects_total [1-9]/);
    assert.match(metrics, /lumen_requests_running 0/);
  });
});

describe('lumen serve --api-key', { skip: skip !== null }, () => {
  let srv;
  before(async () => {
    srv = await startServer(['--api-key', 'k-123']);
  });
  after(async () => {
    if (srv) assert.equal(await srv.stop(), 0);
  });

  test('401 without the key, 200 with it', async () => {
    const wrong = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'nope', maxRetries: 0 });
    await assert.rejects(wrong.models.list(), (err) => err instanceof OpenAI.AuthenticationError && err.status === 401);
    const right = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'k-123', maxRetries: 0 });
    const page = await right.models.list();
    assert.equal(page.data[0].id, 'qwen3');
  });
});
