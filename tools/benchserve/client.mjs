// client.mjs - one streamed chat completion against an OpenAI-compatible
// server, timed at the client: time to first token (first content or
// reasoning delta), the gaps between later deltas (inter-token latency, one
// per streamed chunk), end-to-end time, and the token counts of the usage
// chunk (prompt, cached, completion). A failure is a result with `error`
// set, never an exception: the benchmark counts it and carries on.

// Cached prompt tokens as OpenAI (usage.prompt_tokens_details.cached_tokens)
// or llama-server (timings.cache_n) report them; null when neither does.
function cachedTokens(usage, timings) {
  const c = usage?.prompt_tokens_details?.cached_tokens;
  if (Number.isInteger(c)) return c;
  if (Number.isInteger(timings?.cache_n)) return timings.cache_n;
  return null;
}

// Splits an SSE body chunk into events; returns the unfinished tail.
function feed(buf, onData) {
  let i;
  while ((i = buf.search(/\r?\n\r?\n/)) >= 0) {
    const ev = buf.slice(0, i);
    buf = buf.slice(i).replace(/^\r?\n\r?\n/, '');
    for (const line of ev.split(/\r?\n/)) if (line.startsWith('data:')) onData(line.slice(5).trim());
  }
  return buf;
}

// A connection the server closed as the request went out (llama-server's
// HTTP library does this now and then to kept-alive connections under
// concurrency): fetch fails with no response at all, not even a status. The
// request is sent again, up to MAX_RETRIES times (undici drops the closed
// connection, and an idle one it takes next may be closed too); `retries`
// counts them and the times start at the first attempt. A refused
// connection is not retried.
const STALE_SOCKET = new Set(['UND_ERR_SOCKET', 'ECONNRESET', 'EPIPE']);
const MAX_RETRIES = 3;

async function post(url, init, rec) {
  for (;;) {
    try {
      return await fetch(url, init);
    } catch (err) {
      if (rec.retries >= MAX_RETRIES || !STALE_SOCKET.has(err?.cause?.code) || init.signal.aborted) throw err;
      rec.retries++;
    }
  }
}

// Sends body (stream forced on, usage asked for) to url's
// /v1/chat/completions; resolves to the per-request record.
export async function streamChat(url, body, { model, timeoutMs = 600000, apiKey } = {}) {
  const req = { ...body, stream: true, stream_options: { include_usage: true } };
  if (model) req.model = model;
  const rec = {
    start_ms: performance.now(), ttft_ms: null, e2e_ms: null, itl_ms: [],
    prompt_tokens: null, cached_tokens: null, output_tokens: null, chunks: 0,
    finish_reason: null, text: '', error: null, retries: 0,
  };
  const headers = { 'content-type': 'application/json' };
  if (apiKey) headers.authorization = `Bearer ${apiKey}`;
  let last = null;
  try {
    const res = await post(new URL('/v1/chat/completions', url), {
      method: 'POST', headers, body: JSON.stringify(req), signal: AbortSignal.timeout(timeoutMs),
    }, rec);
    if (!res.ok) {
      rec.error = `HTTP ${res.status}: ${(await res.text()).slice(0, 300)}`;
      return finish(rec);
    }
    const decoder = new TextDecoder();
    let buf = '';
    const onData = (data) => {
      if (data === '[DONE]') return;
      const j = JSON.parse(data);
      if (j.error) throw new Error(`stream error: ${JSON.stringify(j.error).slice(0, 300)}`);
      if (j.usage) {
        rec.prompt_tokens = j.usage.prompt_tokens ?? null;
        rec.output_tokens = j.usage.completion_tokens ?? null;
        rec.cached_tokens = cachedTokens(j.usage, j.timings);
      }
      const ch = j.choices?.[0];
      if (!ch) return;
      if (ch.finish_reason) rec.finish_reason = ch.finish_reason;
      const d = ch.delta ?? {};
      const piece = (d.content ?? '') + (d.reasoning_content ?? '') +
        (d.tool_calls ? JSON.stringify(d.tool_calls) : '');
      if (!piece) return;
      const now = performance.now();
      if (rec.ttft_ms === null) rec.ttft_ms = now - rec.start_ms;
      else rec.itl_ms.push(now - last);
      last = now;
      rec.chunks++;
      rec.text += piece;
    };
    for await (const chunk of res.body) buf = feed(buf + decoder.decode(chunk, { stream: true }), onData);
    feed(`${buf}\n\n`, onData);
    if (rec.output_tokens === null) rec.error = 'no usage in the stream (stream_options.include_usage ignored?)';
  } catch (err) {
    rec.error = describe(err);
  }
  return finish(rec);
}

// fetch's own message ("fetch failed") hides the reason in err.cause
// (e.g. "other side closed", ECONNRESET): keep both.
function describe(err) {
  const msg = String(err?.message ?? err);
  const cause = err?.cause;
  if (!cause) return msg;
  return `${msg}: ${[cause.code, cause.message].filter(Boolean).join(' ')}`;
}

function finish(rec) {
  rec.e2e_ms = performance.now() - rec.start_ms;
  return rec;
}
