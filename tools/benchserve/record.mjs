// record.mjs - a recording proxy: clients (an agent CLI, a script) talk to
// http://127.0.0.1:PORT as if it were the server at UPSTREAM; every request
// is forwarded, its response streamed back unchanged, and the exchange
// saved with its timing:
//
//   DIR/exchanges/NNNN.json  method, path, request body, status, the raw
//                            response body, start / first byte / end times
//   DIR/session.json         the chat completions as an agent session the
//                            `agent` workload replays: { turns: [{ gap_ms,
//                            body, recorded: { first_byte_ms, e2e_ms, ... } }] },
//                            gap_ms = the client's time between the end of
//                            the previous answer and this request
//
// Both are rewritten after every exchange, so stopping the proxy (Ctrl-C)
// loses nothing.
import { mkdirSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';

const HOP_HEADERS = new Set(['host', 'connection', 'content-length', 'transfer-encoding', 'keep-alive']);

function readBody(req) {
  return new Promise((resolve, reject) => {
    const parts = [];
    req.on('data', (d) => parts.push(d));
    req.on('end', () => resolve(Buffer.concat(parts)));
    req.on('error', reject);
  });
}

// Starts the proxy; resolves to { url, close(), session } once listening.
export function startRecorder({ listen = 0, upstream, out, log = () => {} }) {
  mkdirSync(path.join(out, 'exchanges'), { recursive: true });
  const session = { recorded_with: 'lumen bench-serve record', upstream, started: new Date().toISOString(), turns: [] };
  let n = 0;
  let lastEnd = null;
  const t0 = performance.now();
  const server = http.createServer(async (req, res) => {
    const id = ++n;
    const start = performance.now();
    const reqBody = await readBody(req);
    const headers = {};
    for (const [k, v] of Object.entries(req.headers)) if (!HOP_HEADERS.has(k)) headers[k] = v;
    const ex = { id, method: req.method, path: req.url, start_ms: start - t0, request: null, status: null, first_byte_ms: null, end_ms: null, response: '' };
    try { ex.request = reqBody.length ? JSON.parse(reqBody.toString('utf8')) : null; } catch { ex.request = reqBody.toString('utf8'); }
    try {
      const up = await fetch(new URL(req.url, upstream), {
        method: req.method, headers, body: ['GET', 'HEAD'].includes(req.method) ? undefined : reqBody,
      });
      ex.status = up.status;
      const outHeaders = {};
      up.headers.forEach((v, k) => { if (!HOP_HEADERS.has(k) && k !== 'content-encoding') outHeaders[k] = v; });
      res.writeHead(up.status, outHeaders);
      const dec = new TextDecoder();
      if (up.body) {
        for await (const chunk of up.body) {
          if (ex.first_byte_ms === null) ex.first_byte_ms = performance.now() - start;
          ex.response += dec.decode(chunk, { stream: true });
          res.write(chunk);
        }
      }
      res.end();
    } catch (err) {
      ex.error = String(err?.message ?? err);
      if (!res.headersSent) res.writeHead(502, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { message: `recording proxy: ${ex.error}` } }));
    }
    const end = performance.now();
    ex.end_ms = end - t0;
    writeFileSync(path.join(out, 'exchanges', `${String(id).padStart(4, '0')}.json`), `${JSON.stringify(ex, null, 1)}\n`);
    if (req.method === 'POST' && /\/chat\/completions$/.test(req.url.split('?')[0]) && ex.request && typeof ex.request === 'object') {
      session.turns.push({
        gap_ms: lastEnd === null ? 0 : Math.max(0, Math.round(start - lastEnd)),
        body: ex.request,
        recorded: { status: ex.status, first_byte_ms: ex.first_byte_ms, e2e_ms: end - start, exchange: id },
      });
      lastEnd = end;
      writeFileSync(path.join(out, 'session.json'), `${JSON.stringify(session, null, 1)}\n`);
    }
    log(`${req.method} ${req.url} -> ${ex.status ?? 'error'} (${(end - start).toFixed(0)} ms)`);
  });
  return new Promise((resolve) => {
    server.listen(listen, '127.0.0.1', () => {
      resolve({ url: `http://127.0.0.1:${server.address().port}`, session, close: () => new Promise((r) => server.close(r)) });
    });
  });
}
