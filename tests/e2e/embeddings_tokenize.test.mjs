// embeddings_tokenize.test.mjs - /v1/embeddings through the official openai
// SDK (its default base64 encoding and plain floats), /tokenize and
// /detokenize through fetch, and n > 1 choices through the SDK, against the
// real `lumen serve` on the qwen3 fixture.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import OpenAI from 'openai';

import { skipReason, startServer } from './server.mjs';

const skip = skipReason();
if (skip) test('lumen serve embeddings / tokenize / n end-to-end tests', { skip }, () => {});

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));

describe('embeddings, tokenize and n > 1 with the openai SDK', { skip: skip !== null }, () => {
  let srv;
  let client;
  const post = async (path, body) => {
    const r = await fetch(`${srv.url}${path}`, { method: 'POST', body: JSON.stringify(body) });
    return { status: r.status, body: await r.json() };
  };

  before(async () => {
    srv = await startServer(['--parallel', '4']);
    client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
  });

  after(async () => {
    if (srv) assert.equal(await srv.stop(), 0, `server did not exit cleanly:\n${srv.log()}`);
  });

  test('embeddings.create: the default (base64) equals float', async () => {
    const input = ['def fib(n):', 'hello world'];
    const b = await client.embeddings.create({ model: 'qwen3', input }); // the SDK asks for base64
    const f = await client.embeddings.create({ model: 'qwen3', input, encoding_format: 'float' });
    assert.equal(b.object, 'list');
    assert.equal(b.model, 'qwen3');
    assert.equal(b.data.length, 2);
    for (const [i, d] of b.data.entries()) {
      assert.equal(d.object, 'embedding');
      assert.equal(d.index, i);
      assert.equal(d.embedding.length, 64);
      assert.ok(Math.abs(norm(d.embedding) - 1) < 1e-5);
      assert.equal(f.data[i].embedding.length, 64);
      for (let k = 0; k < 64; k++) assert.ok(Math.abs(d.embedding[k] - f.data[i].embedding[k]) < 1e-6);
    }
    assert.notDeepEqual(b.data[0].embedding, b.data[1].embedding);
    assert.ok(b.usage.prompt_tokens > 2);
    assert.equal(b.usage.total_tokens, b.usage.prompt_tokens);
  });

  test('embeddings.create: dimensions, token ids, errors', async () => {
    const d = await client.embeddings.create({ model: 'qwen3', input: 'def fib(n):', dimensions: 8 });
    assert.equal(d.data[0].embedding.length, 8);
    assert.ok(Math.abs(norm(d.data[0].embedding) - 1) < 1e-5);
    const tok = await post('/tokenize', { content: 'def fib(n):', add_special: true });
    const byIds = await client.embeddings.create({ model: 'qwen3', input: tok.body.tokens, encoding_format: 'float' });
    const byText = await client.embeddings.create({ model: 'qwen3', input: 'def fib(n):', encoding_format: 'float' });
    assert.deepEqual(byIds.data[0].embedding, byText.data[0].embedding);
    await assert.rejects(client.embeddings.create({ model: 'qwen3', input: 'x', dimensions: 65 }), (e) => {
      assert.equal(e.status, 400);
      assert.equal(e.param, 'dimensions');
      return true;
    });
    await assert.rejects(client.embeddings.create({ model: 'qwen3', input: ['ok', ''] }), (e) => {
      assert.equal(e.status, 400);
      assert.equal(e.param, 'input[1]');
      return true;
    });
  });

  test('/tokenize and /detokenize round trip', async () => {
    const t = await post('/tokenize', { content: 'hello world' });
    assert.equal(t.status, 200);
    assert.ok(t.body.tokens.length > 0 && t.body.tokens.every(Number.isInteger));
    const d = await post('/detokenize', { tokens: t.body.tokens });
    assert.deepEqual(d, { status: 200, body: { content: 'hello world' } });
    const p = await post('/tokenize', { content: 'hello', with_pieces: true });
    assert.equal(p.body.tokens.map((x) => x.piece).join(''), 'hello');
    const bad = await post('/detokenize', { tokens: [1, 1 << 20] });
    assert.equal(bad.status, 400);
    assert.equal(bad.body.error.param, 'tokens');
  });

  test('n > 1: choices, seeds, streaming indexes', async () => {
    const req = { model: 'qwen3', messages: [{ role: 'user', content: 'hi' }], max_tokens: 6, n: 3, seed: 11 };
    const a = await client.chat.completions.create(req);
    const b = await client.chat.completions.create(req);
    assert.deepEqual(a.choices.map((c) => c.index), [0, 1, 2]);
    assert.deepEqual(a.choices.map((c) => c.message.content), b.choices.map((c) => c.message.content));
    assert.ok(a.usage.completion_tokens > 6);
    const g = await client.completions.create({ model: 'qwen3', prompt: 'hello', max_tokens: 5, n: 2, temperature: 0 });
    assert.equal(g.choices.length, 2);
    assert.equal(g.choices[0].text, g.choices[1].text);
    const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
    const text = ['', '', ''];
    let usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) text[c.index] += c.delta.content ?? '';
    }
    assert.deepEqual(text, a.choices.map((c) => c.message.content));
    assert.equal(usage.completion_tokens, a.usage.completion_tokens);
    await assert.rejects(client.chat.completions.create({ ...req, n: 17 }), (e) => e.status === 400 && e.param === 'n');
  });
});
