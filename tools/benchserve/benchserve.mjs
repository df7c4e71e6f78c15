#!/usr/bin/env node
// benchserve.mjs - `lumen bench-serve` and `lumen report` (the lumen binary
// execs node on this file): a serving benchmark of OpenAI-compatible
// servers with paired AB/BA blocks and bootstrap intervals, a recording
// proxy for agent sessions, and the HTML / Markdown report.
import { readFileSync, writeFileSync } from 'node:fs';

import { runBench } from './bench.mjs';
import { startRecorder } from './record.mjs';
import { isEvalLine, renderHtml, renderMarkdown } from './report.mjs';
import { MIN_BLOCKS } from './stats.mjs';
import { WORKLOADS, workloadDefaults } from './workloads.mjs';

const USAGE = `usage: lumen bench-serve --url URL[,URL2] --out RESULTS.json [options]
       lumen bench-serve record --upstream URL --out DIR [--listen PORT]
       lumen report RESULTS.json... [EVAL.jsonl...] [--html OUT.html | -o OUT.html] [--markdown]

bench-serve drives one server, or two (arms A and B) in alternating AB/BA
blocks over distinct workload seeds, and writes every request's timings.
  --url URL[,URL2]        servers (OpenAI-compatible: lumen, llama-server, vLLM)
  --name A,B              arm names (default A,B)
  --workload W            ${WORKLOADS.join(' | ')} (default random)
  --concurrency N[,N...]  sessions in flight (default 1)
  --requests K            requests (agent: sessions) per run (default ${workloadDefaults.requests})
  --blocks N              paired blocks: the i-th concurrency's seeds are SEED+i*N..SEED+i*N+N-1 (default ${MIN_BLOCKS}; ratios need >= ${MIN_BLOCKS})
  --seed S                workload seed (default 1)
  --warmup N              discarded runs per arm and concurrency first (default 1)
  --input-len N           prompt tokens, approximate (random, shared-prefix question; default ${workloadDefaults.inputLen})
  --output-len N          output tokens (default ${workloadDefaults.outputLen})
  --range F               random lengths uniform in len*(1±F) (default ${workloadDefaults.range})
  --prefix-len N          shared system prompt tokens, approximate (default ${workloadDefaults.prefixLen})
  --context-lens N,...    long-context prompt lengths (default ${workloadDefaults.contextLens.join(',')})
  --sessions DIR          agent sessions (default tools/benchserve/sessions)
  --replay-timing T       agent: fast | recorded (the recorded think/tool time)
  --no-ignore-eos         let the model stop early (outputs then differ in length)
  --extra-body JSON|@FILE fields added to every request, over the generated ones
                          (e.g. '{"logit_bias":{"5":-100}}'; recorded in the results)
  --model NAME            the request's model field (default: the server's first)
  --api-key KEY           sent as a bearer token
  --timeout S             per-request limit in seconds (default 600)
  --out FILE              results JSON (required)
  --quiet                 no progress lines

report renders results files as one HTML page or Markdown tables; files of
\`lumen eval\` output (its JSON lines, e.g. one per KV format or weight type)
given beside them become the page's quality ledger.`;

function fail(msg) {
  process.stderr.write(`lumen: ${msg}\n`);
  process.exit(2);
}

function parse(argv, spec) {
  const o = { _: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (!a.startsWith('-') || a === '-') { o._.push(a); continue; }
    const key = a.replace(/^--?/, '');
    if (!(key in spec)) fail(`unknown option ${a}\n\n${USAGE}`);
    if (spec[key] === 'flag') { o[key] = true; continue; }
    if (i + 1 >= argv.length) fail(`${a} needs a value`);
    o[key] = argv[++i];
  }
  return o;
}

const ints = (s, what) => String(s).split(',').map((x) => {
  const n = Number(x);
  if (!Number.isInteger(n) || n < 1) fail(`${what}: "${x}" is not a positive integer`);
  return n;
});
const int1 = (s, what, min = 1) => {
  const n = Number(s);
  if (!Number.isInteger(n) || n < min) fail(`${what}: "${s}" is not an integer >= ${min}`);
  return n;
};

// --extra-body: a JSON object, inline or from @FILE.
function extraBody(arg) {
  let j;
  try {
    j = JSON.parse(arg.startsWith('@') ? readFileSync(arg.slice(1), 'utf8') : arg);
  } catch (err) {
    fail(`--extra-body: ${err.message}`);
  }
  if (j === null || typeof j !== 'object' || Array.isArray(j)) fail('--extra-body: a JSON object, e.g. \'{"top_k":1}\'');
  return j;
}

function logger(quiet) {
  const tty = process.stderr.isTTY;
  return (line, transient = false) => {
    if (quiet) return;
    if (transient) { if (tty) process.stderr.write(`\r\x1b[K${line}`); return; }
    process.stderr.write(`${tty ? '\r\x1b[K' : ''}${line}\n`);
  };
}

async function benchMain(argv) {
  const o = parse(argv, {
    url: 'v', name: 'v', workload: 'v', concurrency: 'v', requests: 'v', blocks: 'v', seed: 'v', warmup: 'v',
    'input-len': 'v', 'output-len': 'v', range: 'v', 'prefix-len': 'v', 'context-lens': 'v', sessions: 'v',
    'replay-timing': 'v', 'no-ignore-eos': 'flag', 'extra-body': 'v', model: 'v', 'api-key': 'v', timeout: 'v', out: 'v', quiet: 'flag',
    help: 'flag', h: 'flag',
  });
  if (o.help || o.h) { process.stdout.write(`${USAGE}\n`); return; }
  if (!o.url) fail(`bench-serve: --url is required\n\n${USAGE}`);
  if (!o.out) fail('bench-serve: --out RESULTS.json is required');
  const urls = o.url.split(',');
  if (urls.length > 2) fail('bench-serve: one or two URLs (arms A and B)');
  const workload = o.workload ?? 'random';
  if (!WORKLOADS.includes(workload)) fail(`bench-serve: unknown workload "${workload}" (${WORKLOADS.join(', ')})`);
  const timing = o['replay-timing'] ?? 'fast';
  if (!['fast', 'recorded'].includes(timing)) fail('bench-serve: --replay-timing is fast or recorded');
  const wo = { ...workloadDefaults, replayTiming: timing, ignoreEos: !o['no-ignore-eos'] };
  if (o.requests) wo.requests = int1(o.requests, '--requests');
  if (o['input-len']) wo.inputLen = int1(o['input-len'], '--input-len');
  if (o['output-len']) wo.outputLen = int1(o['output-len'], '--output-len');
  if (o['prefix-len']) wo.prefixLen = int1(o['prefix-len'], '--prefix-len');
  if (o['context-lens']) wo.contextLens = ints(o['context-lens'], '--context-lens');
  if (o.range) { wo.range = Number(o.range); if (!(wo.range >= 0 && wo.range < 1)) fail('--range: a number in [0, 1)'); }
  if (o.sessions) wo.sessionsDir = o.sessions;
  if (o['extra-body']) wo.extraBody = extraBody(o['extra-body']);
  const cfg = {
    urls, names: o.name ? o.name.split(',') : [], workload, workloadOptions: wo,
    concurrency: o.concurrency ? ints(o.concurrency, '--concurrency') : [1],
    blocks: o.blocks ? int1(o.blocks, '--blocks') : MIN_BLOCKS,
    seed: o.seed ? int1(o.seed, '--seed', 0) : 1,
    warmup: o.warmup !== undefined ? int1(o.warmup, '--warmup', 0) : 1,
    model: o.model, apiKey: o['api-key'],
    timeoutMs: (o.timeout ? int1(o.timeout, '--timeout') : 600) * 1000,
    command: `lumen bench-serve ${argv.join(' ')}`,
  };
  const log = logger(o.quiet);
  const res = await runBench(cfg, log);
  writeFileSync(o.out, `${JSON.stringify(res)}\n`);
  log(`wrote ${o.out}`);
  process.stdout.write(renderMarkdown([res]));
}

async function recordMain(argv) {
  const o = parse(argv, { listen: 'v', upstream: 'v', out: 'v', quiet: 'flag', help: 'flag', h: 'flag' });
  if (o.help || o.h) { process.stdout.write(`${USAGE}\n`); return; }
  if (!o.upstream || !o.out) fail('bench-serve record: --upstream URL and --out DIR are required');
  const log = logger(o.quiet);
  const rec = await startRecorder({ listen: o.listen ? int1(o.listen, '--listen', 0) : 0, upstream: o.upstream, out: o.out, log });
  process.stderr.write(`recording proxy on ${rec.url} -> ${o.upstream}, writing ${o.out} (Ctrl-C stops)\n`);
  const stop = async () => { await rec.close(); process.exit(0); };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}

function reportMain(argv) {
  const o = parse(argv, { html: 'v', o: 'v', markdown: 'flag', help: 'flag', h: 'flag' });
  if (o.help || o.h || !o._.length) { process.stdout.write(`${USAGE}\n`); if (!o._.length && !o.help && !o.h) process.exit(2); return; }
  // each file: a bench-serve results file, or `lumen eval` output (JSON lines) for the quality ledger
  const all = [], evals = [];
  for (const f of o._) {
    let text;
    try { text = readFileSync(f, 'utf8'); } catch (err) { fail(`report: cannot read ${f}: ${err.message}`); }
    let j = null;
    try { j = JSON.parse(text); } catch { /* JSON lines, perhaps */ }
    if (j?.format === 'lumen-bench-serve/1') { all.push(j); continue; }
    const lines = text.split('\n').filter((l) => l.trim());
    const parsed = lines.map((l) => { try { return JSON.parse(l); } catch { return null; } });
    if (!lines.length || !parsed.every(isEvalLine)) fail(`report: ${f} is neither a bench-serve results file nor lumen eval output`);
    evals.push(...parsed);
  }
  if (!all.length && !evals.length) fail('report: nothing to report');
  const html = o.html ?? o.o;
  if (html) writeFileSync(html, renderHtml(all, evals));
  if (o.markdown || !html) process.stdout.write(renderMarkdown(all, evals));
}

const [cmd, ...rest] = process.argv.slice(2);
const main = cmd === 'report' ? () => reportMain(rest) : cmd === 'record' ? () => recordMain(rest)
  : cmd === 'run' ? () => benchMain(rest) : () => benchMain(process.argv.slice(2));
Promise.resolve().then(main).catch((err) => fail(err.stack ?? String(err)));
