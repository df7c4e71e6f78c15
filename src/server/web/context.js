// context.js - fits the chat page's conversation into the model's context
// before chat.js sends it. The server says how many tokens the context holds
// (context_length in GET /v1/models) and how many each message's text takes
// (POST /tokenize, remembered per text); the chat template's role markers
// are estimated on top. The oldest turns - a user message and the answers
// after it - are left out until the prompt leaves the answer its budget; the
// system prompt and the newest user message always go. The estimate may be a
// little off, so chat.js still leaves out one turn more when the server
// answers 400 context_length_exceeded.
'use strict';

// Tokens the chat template adds to each message (role markers: 5 to 12 on
// the demo model) and once per prompt (the answer's opening). Better too
// many than too few: the server turns away a prompt that does not fit.
const templateTokensPerMessage = 12;
const templateTokensOnce = 16;

// The answer's share of the context: a quarter, at most 4,096 tokens. A
// long newest message may eat into it down to the minimum, no further.
const replyBudget = (ctx) => Math.min(4096, Math.floor(ctx / 4));
const minimumReply = (ctx) => Math.min(256, replyBudget(ctx));

const fit = { ctx: 0, counts: new Map() }; // the context size once known; tokens per text

// Where the oldest turn of messages[from..] ends: the index of the second
// user message at or after from, or -1 when only one is left.
function nextTurn(messages, from) {
  for (let i = from + 1; i < messages.length; i++) if (messages[i].role === 'user') return i;
  return -1;
}

// The served model's context size in tokens, or 0 when the server does not say.
async function contextSize(headers, signal) {
  if (fit.ctx) return fit.ctx;
  const res = await fetch('/v1/models', { headers, signal });
  if (!res.ok) return 0;
  const model = ((await res.json()).data || [])[0] || {};
  fit.ctx = model.context_length || model.max_model_len || 0;
  return fit.ctx;
}

// How many tokens text takes, or null when the server does not count.
async function tokensOf(text, headers, signal) {
  if (!text) return 0;
  if (fit.counts.has(text)) return fit.counts.get(text);
  const res = await fetch('/tokenize', { method: 'POST', headers, body: JSON.stringify({ content: text }), signal });
  if (!res.ok) return null;
  const tokens = (await res.json()).tokens;
  if (!Array.isArray(tokens)) return null;
  fit.counts.set(text, tokens.length);
  return tokens.length;
}

// Plans the request for conv (user and assistant messages, the newest a
// user message) after the system prompt (may be empty): { skip, maxTokens,
// ctx }, skip being where the messages sent start (conv.skip or later) and
// maxTokens the answer's budget. null when the server does not tell the
// context size or the counts: then everything goes, as from any client.
// Throws, naming the limit, when the system prompt and the newest message
// alone leave the answer too little room.
async function planRequest(conv, system, headers, signal) {
  const ctx = await contextSize(headers, signal);
  if (!ctx) return null;
  const from = conv.skip || 0;
  const texts = [system, ...conv.slice(from).map((m) => m.content)];
  const counts = await Promise.all(texts.map((t) => tokensOf(t, headers, signal)));
  if (counts.includes(null)) return null;
  const cost = (i) => counts[i - from + 1] + templateTokensPerMessage; // of conv[i]
  let total = templateTokensOnce + (system ? counts[0] + templateTokensPerMessage : 0);
  for (let i = from; i < conv.length; i++) total += cost(i);
  const budget = replyBudget(ctx);
  let skip = from;
  for (let next; total + budget > ctx && (next = nextTurn(conv, skip)) >= 0; skip = next)
    for (let i = skip; i < next; i++) total -= cost(i);
  if (ctx - total < minimumReply(ctx)) {
    const withSystem = system ? ' with the system prompt' : '';
    throw new Error(`This message is too long for the model: about ${total} tokens${withSystem}, and its ` +
      `context holds ${ctx}, of which ${minimumReply(ctx)} must stay free for the answer. Shorten it.`);
  }
  return { skip, maxTokens: Math.min(budget, ctx - total), ctx };
}

// Forgets the counts of a conversation that is gone.
function forgetTokenCounts() {
  fit.counts.clear();
}
