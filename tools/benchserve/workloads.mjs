// workloads.mjs - the request sets bench-serve sends. A workload is a list
// of sessions; a session is a list of chat requests sent one after another
// (each after the previous answer, plus an optional think time), sessions
// run concurrently. Everything is a function of the seed: the same seed
// gives the same requests byte for byte, a different seed different ones.
//
//   random         one-request sessions, prompt and output lengths uniform
//                  in [len*(1-range), len*(1+range)]
//   shared-prefix  many users, one long system prompt, short questions
//   long-context   one document of 8k..128k (approximate) tokens + a question
//   agent          recorded multi-turn agent sessions (sessions/*.json),
//                  replayed turn by turn with their tool definitions; the
//                  history holds the recorded answers, each turn generates
//                  --output-len tokens
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { makeRng, randInt } from './rng.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const repoRoot = path.resolve(here, '..', '..');
export const defaultSessionsDir = path.join(here, 'sessions');

export const WORKLOADS = ['random', 'shared-prefix', 'long-context', 'agent'];

// Real prose for the prompts (a tokenizer sees words, not random bytes):
// the repository's documentation, about 1.3 tokens per word.
let corpusWords = null;
function words() {
  if (corpusWords) return corpusWords;
  const files = [path.join(repoRoot, 'README.md')];
  try {
    for (const f of readdirSync(path.join(repoRoot, 'docs')).sort()) if (f.endsWith('.md')) files.push(path.join(repoRoot, 'docs', f));
  } catch {
    // docs/ missing (the tool copied elsewhere): README alone
  }
  const text = files.map((f) => { try { return readFileSync(f, 'utf8'); } catch { return ''; } }).join('\n');
  corpusWords = text.split(/\s+/).filter((w) => w && w.length < 40 && !/[`|<>]/.test(w));
  if (corpusWords.length < 1000) throw new Error(`workloads: too little text in ${repoRoot}/README.md and docs/`);
  return corpusWords;
}

// The corpus's digest: results record it, since the prompts of a seed are
// the same only over the same documentation.
export function corpusDigest() {
  return createHash('sha256').update(words().join(' ')).digest('hex').slice(0, 16);
}

// n words of text starting at a seeded place in the corpus (wrapping).
function passage(rng, n) {
  const w = words();
  const start = Math.floor(rng() * w.length);
  const out = new Array(n);
  for (let i = 0; i < n; i++) out[i] = w[(start + i) % w.length];
  return out.join(' ');
}

const TOKENS_PER_WORD = 1.3;
const wordsFor = (tokens) => Math.max(1, Math.round(tokens / TOKENS_PER_WORD));

function spread(rng, len, range) {
  return Math.max(1, randInt(rng, Math.round(len * (1 - range)), Math.round(len * (1 + range))));
}

// The fields every generated request carries: greedy, a fixed output length
// (ignore_eos, which lumen, llama-server and vLLM accept) unless asked not to,
// then the user's extra fields (--extra-body), which win.
function genFields(o, maxTokens) {
  const f = { max_tokens: maxTokens, temperature: 0 };
  if (o.ignoreEos) f.ignore_eos = true;
  return { ...f, ...structuredClone(o.extraBody ?? {}) };
}

function randomWorkload(o, rng) {
  const sessions = [];
  for (let i = 0; i < o.requests; i++) {
    const prompt = passage(rng, wordsFor(spread(rng, o.inputLen, o.range)));
    const out = spread(rng, o.outputLen, o.range);
    sessions.push([{ body: { messages: [{ role: 'user', content: prompt }], ...genFields(o, out) } }]);
  }
  return sessions;
}

function sharedPrefixWorkload(o, rng) {
  const system = `You answer questions about this text.\n\n${passage(rng, wordsFor(o.prefixLen))}`;
  const sessions = [];
  for (let i = 0; i < o.requests; i++) {
    const question = `Question ${i + 1}: what does this say about "${passage(rng, wordsFor(spread(rng, o.inputLen, o.range)))}"?`;
    sessions.push([{ body: { messages: [{ role: 'system', content: system }, { role: 'user', content: question }],
      ...genFields(o, o.outputLen) } }]);
  }
  return sessions;
}

function longContextWorkload(o, rng) {
  const sessions = [];
  for (let i = 0; i < o.requests; i++) {
    const len = o.contextLens[randInt(rng, 0, o.contextLens.length - 1)];
    const doc = passage(rng, wordsFor(len));
    sessions.push([{ body: { messages: [{ role: 'user', content: `${doc}\n\nSummarise the text above in one paragraph.` }],
      ...genFields(o, o.outputLen) } }]);
  }
  return sessions;
}

// Recorded sessions (record.mjs writes them): { turns: [{ gap_ms, body }] }.
export function loadSessions(dir) {
  const files = readdirSync(dir).filter((f) => f.endsWith('.json')).sort();
  if (!files.length) throw new Error(`agent workload: no session files (*.json) in ${dir}`);
  return files.map((f) => ({ name: f, ...JSON.parse(readFileSync(path.join(dir, f), 'utf8')) }));
}

// Each replayed session gets a seed-specific tag at the start of its first
// message: distinct seeds are distinct work (a server cannot serve block 2
// from the cache block 1 filled), while the turns of one session still share
// their prefix as the recorded agent's did.
function agentWorkload(o, rng) {
  const recorded = loadSessions(o.sessionsDir);
  const first = randInt(rng, 0, recorded.length - 1);
  const sessions = [];
  for (let i = 0; i < o.requests; i++) {
    const rec = recorded[(first + i) % recorded.length];
    const tag = `[session ${o.seed}-${i}] `;
    sessions.push(rec.turns.map((t) => {
      const body = structuredClone(t.body);
      delete body.stream;
      delete body.stream_options;
      delete body.model;
      delete body.max_completion_tokens; // it would win over max_tokens
      const m0 = body.messages?.[0];
      if (m0 && typeof m0.content === 'string') m0.content = tag + m0.content;
      Object.assign(body, genFields(o, o.outputLen));
      return { body, gap_ms: o.replayTiming === 'recorded' ? (t.gap_ms ?? 0) : 0, session: rec.name };
    }));
  }
  return sessions;
}

export const workloadDefaults = {
  requests: 16,
  inputLen: 128,
  outputLen: 64,
  range: 0.5,
  prefixLen: 1024,
  contextLens: [8192, 16384, 32768, 65536, 131072],
  ignoreEos: true,
  sessionsDir: defaultSessionsDir,
  replayTiming: 'fast',
  extraBody: null,
};

// The sessions of workload `name` for `seed` (options: workloadDefaults).
export function buildWorkload(name, seed, options = {}) {
  const o = { ...workloadDefaults, ...options, seed };
  const rng = makeRng(seed);
  switch (name) {
    case 'random': return randomWorkload(o, rng);
    case 'shared-prefix': return sharedPrefixWorkload(o, rng);
    case 'long-context': return longContextWorkload(o, rng);
    case 'agent': return agentWorkload(o, rng);
    default: throw new Error(`unknown workload "${name}" (one of ${WORKLOADS.join(', ')})`);
  }
}
