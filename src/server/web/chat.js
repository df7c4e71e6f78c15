// chat.js - the chat page of `lumen serve`: sends the conversation to
// /v1/chat/completions with stream: true, reads the server-sent events as
// they arrive and shows the answer growing; reasoning goes into a collapsed
// <details>. The conversation lives in this page only (reloading starts a
// new one); the system prompt, when one is typed, goes first in every
// request; the API key, when the server wants one, is kept in
// sessionStorage (this tab only). Stop aborts the fetch: the server sees the
// connection close and cancels the request; the part already shown stays in
// the conversation, as in `lumen chat`. Before sending, context.js leaves
// out the oldest turns that no longer fit the model's context and sets the
// answer's token budget; the page still shows those turns and says that
// they were left out. Text is only ever set as textContent.
'use strict';

const $ = (id) => document.getElementById(id);
const keyStore = 'lumen-api-key';
const state = { messages: [], controller: null };

const keyInput = $('key');
keyInput.value = sessionStorage.getItem(keyStore) || '';
keyInput.addEventListener('input', () => {
  const k = keyInput.value.trim();
  if (k) sessionStorage.setItem(keyStore, k);
  else sessionStorage.removeItem(keyStore);
});

function status(text) {
  $('status').textContent = text;
}

function busy(on) {
  $('send').disabled = on;
  $('stop').disabled = !on;
}

// A message box in the log: its text element, and for the assistant a
// reasoning <details> (hidden until reasoning arrives) and a note line.
function addMessage(role, text) {
  const div = document.createElement('div');
  div.className = `msg ${role}`;
  const view = { div };
  if (role === 'assistant') {
    view.details = document.createElement('details');
    view.details.hidden = true;
    const summary = document.createElement('summary');
    summary.textContent = 'reasoning';
    view.reasoning = document.createElement('div');
    view.details.append(summary, view.reasoning);
    div.append(view.details);
  }
  view.text = document.createElement('div');
  view.text.className = 'text';
  view.text.textContent = text || '';
  div.append(view.text);
  view.note = document.createElement('div');
  view.note.className = 'note';
  div.append(view.note);
  $('log').append(div);
  div.scrollIntoView({ block: 'end' });
  return view;
}

// The data of each server-sent event of a response body, as it arrives.
async function* sseData(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf = (buf + decoder.decode(value, { stream: true })).replace(/\r\n/g, '\n');
    let end;
    while ((end = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, end);
      buf = buf.slice(end + 2);
      const data = [];
      for (const line of block.split('\n')) {
        if (line.startsWith('data:')) data.push(line.slice(line.startsWith('data: ') ? 6 : 5));
      }
      if (data.length) yield data.join('\n'); // comments (": keep-alive") carry none
    }
  }
}

// A failed response as { text, code }: the server's message and error code
// where it sent JSON, else the status alone.
async function errorOf(res) {
  try {
    const body = await res.json();
    if (body && body.error && body.error.message)
      return { text: `${res.status}: ${body.error.message}`, code: body.error.code || null };
  } catch (_) {
    // not JSON: the status says enough
  }
  return { text: `HTTP ${res.status}`, code: null };
}

// POSTs the system prompt and conv[conv.skip..] and returns the response;
// while the server says they exceed the context (the page's count is an
// estimate), leaves out the oldest turn and retries (conv.skip remembers it
// for later turns). Throws on any other failure, with the server's message.
async function post(conv, system, maxTokens, headers, signal) {
  for (;;) {
    const messages = (system ? [{ role: 'system', content: system }] : []).concat(conv.slice(conv.skip || 0));
    const request = { messages, stream: true };
    if (maxTokens) request.max_tokens = maxTokens;
    const res = await fetch('/v1/chat/completions', {
      method: 'POST',
      headers,
      body: JSON.stringify(request),
      signal,
    });
    if (res.ok) return res;
    const err = await errorOf(res);
    const next = err.code === 'context_length_exceeded' ? nextTurn(conv, conv.skip || 0) : -1;
    if (next < 0) throw new Error(err.text);
    conv.skip = next;
  }
}

async function send(text) {
  const conv = state.messages; // "New chat" starts another array; this turn stays with its own
  conv.push({ role: 'user', content: text });
  const user = addMessage('user', text);
  const view = addMessage('assistant', '');
  view.div.dataset.state = 'streaming';
  const controller = new AbortController();
  state.controller = controller;
  busy(true);
  status('answering...');
  let content = '';
  let reasoning = '';
  let chunks = 0;
  let outcome = 'done';
  const skipped = conv.skip || 0;
  try {
    const headers = { 'Content-Type': 'application/json' };
    const key = keyInput.value.trim();
    if (key) headers.Authorization = `Bearer ${key}`;
    const system = $('system').value.trim();
    const plan = await planRequest(conv, system, headers, controller.signal);
    if (plan) conv.skip = plan.skip;
    const res = await post(conv, system, plan && plan.maxTokens, headers, controller.signal);
    if ((conv.skip || 0) > skipped) {
      const where = plan ? `the model's context (${plan.ctx} tokens)` : 'the context';
      view.note.textContent = `(the oldest ${conv.skip} messages no longer fit ${where} and were left out)`;
    }
    for await (const data of sseData(res.body)) {
      if (data === '[DONE]') break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message || 'the server reported an error');
      if (chunk.model) $('model').textContent = chunk.model;
      const choice = chunk.choices && chunk.choices[0];
      const delta = choice && choice.delta;
      if (!delta) continue;
      if (delta.reasoning_content) {
        reasoning += delta.reasoning_content;
        view.reasoning.textContent = reasoning;
        view.details.hidden = false;
      }
      if (delta.content) {
        content += delta.content;
        view.text.textContent = content;
      }
      chunks++;
      view.div.dataset.chunks = String(chunks);
      if (choice.finish_reason === 'length')
        view.note.textContent = `${view.note.textContent} (cut at the token limit)`.trim();
      view.div.scrollIntoView({ block: 'end' });
    }
  } catch (err) {
    outcome = err.name === 'AbortError' ? 'stopped' : 'error';
    if (outcome === 'stopped') view.note.textContent = '(stopped)';
    else {
      view.div.classList.add('error');
      view.note.textContent = String(err.message || err);
    }
  }
  if (outcome === 'error' && !content) {
    // nothing came back: the message is not part of the conversation
    conv.pop();
    conv.skip = skipped;
    user.note.textContent = '(not sent)';
  } else {
    conv.push({ role: 'assistant', content });
  }
  view.div.dataset.state = outcome;
  view.div.scrollIntoView({ block: 'end' }); // a note added last is in view too
  if (state.controller === controller) {
    state.controller = null;
    busy(false);
    status(outcome === 'error' ? 'failed' : '');
  }
}

$('form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const input = $('input');
  const text = input.value.trim();
  if (!text || state.controller) return;
  input.value = '';
  send(text);
});

$('input').addEventListener('keydown', (ev) => {
  if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) {
    ev.preventDefault();
    $('form').requestSubmit();
  }
});

$('stop').addEventListener('click', () => {
  if (state.controller) state.controller.abort();
});

$('new').addEventListener('click', () => {
  if (state.controller) state.controller.abort();
  state.messages = [];
  forgetTokenCounts();
  $('log').replaceChildren();
  status('');
  $('input').focus();
});
