// client_retry.test.mjs - bench-serve's client against a server that closes
// a connection without answering (as llama-server's HTTP library sometimes
// does to a kept-alive connection): the request is sent again and
// succeeds, counted in `retries` (at most 3); a server that never answers is an error
// that names the cause, not a bare "fetch failed".
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, test } from 'node:test';

import { streamChat } from '../../tools/benchserve/client.mjs';

const SSE = [
  { choices: [{ index: 0, delta: { content: 'hi' } }] },
  { choices: [{ index: 0, delta: { content: ' there' }, finish_reason: 'length' }] },
  { choices: [], usage: { prompt_tokens: 5, completion_tokens: 2, prompt_tokens_details: { cached_tokens: 0 } } },
].map((j) => `data: ${JSON.stringify(j)}\n\n`).join('') + 'data: [DONE]\n\n';

let server;
let url;
let drops = 0; // requests to hang up on before answering

before(async () => {
  server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (drops > 0) { drops--; req.socket.destroy(); return; }
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(SSE);
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  url = `http://127.0.0.1:${server.address().port}`;
});
after(() => server.close());

const body = { messages: [{ role: 'user', content: 'x' }], max_tokens: 2 };

test('connections closed without an answer are retried', async () => {
  drops = 2;
  const r = await streamChat(url, body);
  assert.equal(r.error, null);
  assert.equal(r.retries, 2);
  assert.equal(r.text, 'hi there');
  assert.equal(r.output_tokens, 2);
});

test('a server that keeps closing is an error naming the cause', async () => {
  drops = 4;
  const r = await streamChat(url, body);
  assert.equal(r.retries, 3);
  assert.match(r.error, /fetch failed: UND_ERR_SOCKET|ECONNRESET/);
  drops = 0;
  const ok = await streamChat(url, body);
  assert.equal(ok.error, null);
  assert.equal(ok.retries, 0);
});
