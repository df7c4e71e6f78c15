// report.mjs - results files (bench.mjs) -> one self-contained HTML page
// (inline CSS and SVG, no script, no network) or Markdown tables for docs:
// provenance (command, machine, arms, workload), per-arm medians over blocks
// at each concurrency, the paired ratios B/A with their intervals (or why
// they are withheld), the greedy-output comparison, and plots: TTFT and
// end-to-end CDFs, throughput against concurrency, cached tokens per agent
// turn; and a quality ledger of `lumen eval` lines given beside the results
// (perplexity, and KL / top-1 agreement against a reference when measured).
// Numbers carry data-* attributes so tests can check them against the JSON.
import { cdfPoints, forestPlot, lineChart } from './svg.mjs';
import { METRICS, quantile } from './stats.mjs';

const esc = (s) => String(s ?? '').replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c]);
export const num = (x, d = 2) => (x === null || x === undefined || !Number.isFinite(x) ? '–' : x.toFixed(d));

const TABLE_METRICS = ['ttft_p50_ms', 'ttft_p90_ms', 'itl_mean_ms', 'e2e_p50_ms', 'output_tok_s', 'requests_s'];
const LABEL = { ...Object.fromEntries(Object.entries(METRICS).map(([k, v]) => [k, v.label])), requests_s: 'requests/s' };

const measured = (res) => res.runs.filter((r) => r.block >= 0);

// The median over blocks of metric m for arm a at concurrency c.
export function armMedian(res, a, c, m) {
  return quantile(measured(res).filter((r) => r.arm === a && r.concurrency === c).map((r) => r.summary[m]), 0.5);
}

function sumOver(res, a, c, key) {
  return measured(res).filter((r) => r.arm === a && r.concurrency === c).reduce((n, r) => n + (r.summary[key] ?? 0), 0);
}

function ratioText(x) {
  if (x.withheld) return `withheld: ${x.withheld}`;
  return `${x.ratio.toFixed(3)} [${x.lo.toFixed(3)}, ${x.hi.toFixed(3)}]`;
}

function provenance(res) {
  const cfg = res.config;
  return `<table class="prov">
<tr><th>created</th><td>${esc(res.created)}</td></tr>
<tr><th>command</th><td><code>${esc(res.command)}</code></td></tr>
<tr><th>machine</th><td>${esc(`${res.machine.hostname}: ${res.machine.cpus} × ${res.machine.cpu}, ${res.machine.platform}, node ${res.machine.node}`)}</td></tr>
<tr><th>workload</th><td>${esc(cfg.workload)}, seed ${cfg.seed}, ${cfg.blocks} blocks, concurrency ${cfg.concurrency.join(', ')}, warm-up runs ${cfg.warmup}, prompt text ${esc(cfg.corpus ?? '?')}; ${esc(JSON.stringify(cfg.workload_options))}</td></tr>
${res.arms.map((a) => `<tr><th>arm ${esc(a.name)}</th><td>${esc(a.url)} (model ${esc(a.model ?? '?')})</td></tr>`).join('\n')}
</table>`;
}

function summaryTable(res) {
  const head = `<tr><th>arm</th><th>concurrency</th><th>requests</th><th>errors</th>${TABLE_METRICS.map((m) => `<th>${esc(LABEL[m])}</th>`).join('')}<th>cached / prompt tokens</th></tr>`;
  const rows = [];
  for (const c of res.config.concurrency)
    res.arms.forEach((arm, a) => {
      const cells = TABLE_METRICS.map((m) => {
        const v = armMedian(res, a, c, m);
        return `<td data-arm="${esc(arm.name)}" data-c="${c}" data-metric="${m}" data-value="${v ?? ''}">${num(v)}</td>`;
      }).join('');
      rows.push(`<tr><td>${esc(arm.name)}</td><td>${c}</td><td>${sumOver(res, a, c, 'requests')}</td><td>${sumOver(res, a, c, 'errors')}</td>${cells}<td>${sumOver(res, a, c, 'cached_tokens')} / ${sumOver(res, a, c, 'prompt_tokens')}</td></tr>`);
    });
  return `<table class="summary">${head}\n${rows.join('\n')}</table>`;
}

function comparisonSection(res) {
  if (res.arms.length !== 2) return '';
  const [A, B] = res.arms.map((a) => a.name);
  const parts = [`<h3>Paired ratios ${esc(B)} / ${esc(A)}</h3>`,
    '<p>Geometric mean over blocks of the per-block ratio; 95% percentile-bootstrap interval over blocks (fixed seed). Below 1 means B is lower.</p>',
    '<table class="ratios"><tr><th>concurrency</th><th>metric</th><th>ratio [95% interval]</th><th>blocks</th></tr>'];
  const forest = [];
  for (const cmp of res.comparisons) {
    for (const [m, x] of Object.entries(cmp.metrics)) {
      parts.push(`<tr class="ratio" data-c="${cmp.concurrency}" data-metric="${m}" data-ratio="${x.ratio ?? ''}" data-lo="${x.lo ?? ''}" data-hi="${x.hi ?? ''}" data-withheld="${esc(x.withheld ?? '')}"><td>${cmp.concurrency}</td><td>${esc(LABEL[m])}</td><td>${esc(ratioText(x))}</td><td>${x.n_blocks}</td></tr>`);
      forest.push({ label: `c=${cmp.concurrency} ${LABEL[m]}`, ratio: x.withheld ? null : x.ratio, lo: x.lo, hi: x.hi });
    }
  }
  parts.push('</table>', forestPlot(forest, { title: `${B} / ${A} with 95% intervals` }));
  parts.push('<h3>Greedy outputs, arm against arm</h3><ul class="outputs">');
  for (const cmp of res.comparisons) {
    const o = cmp.outputs;
    parts.push(`<li data-c="${cmp.concurrency}" data-differing="${o.differing}" data-compared="${o.compared}">concurrency ${cmp.concurrency}: ${o.differing} of ${o.compared} outputs differ${o.examples.map((e) => `<br><small>block ${e.block} request ${e.request}, from character ${e.at}: ${esc(A)} «${esc(e.a)}» vs ${esc(B)} «${esc(e.b)}»</small>`).join('')}</li>`);
  }
  parts.push('</ul>');
  return parts.join('\n');
}

function plots(res) {
  const out = [];
  const runsOf = (a, c) => measured(res).filter((r) => r.arm === a && r.concurrency === c);
  for (const c of res.config.concurrency) {
    const reqs = (a) => runsOf(a, c).flatMap((r) => r.requests.filter((q) => !q.error));
    out.push(lineChart(res.arms.map((arm, a) => ({ name: arm.name, points: cdfPoints(reqs(a).map((q) => q.ttft_ms)) })),
      { title: `TTFT CDF, concurrency ${c}`, xLabel: 'ms', yLabel: 'fraction of requests', step: true }));
    out.push(lineChart(res.arms.map((arm, a) => ({ name: arm.name, points: cdfPoints(reqs(a).map((q) => q.e2e_ms)) })),
      { title: `End-to-end latency CDF, concurrency ${c}`, xLabel: 'ms', yLabel: 'fraction of requests', step: true }));
  }
  if (res.config.concurrency.length > 1)
    out.push(lineChart(res.arms.map((arm, a) => ({ name: arm.name, points: res.config.concurrency.map((c) => [c, armMedian(res, a, c, 'output_tok_s')]) })),
      { title: 'Output throughput against concurrency (median over blocks)', xLabel: 'concurrent sessions', yLabel: 'output tokens/s' }));
  const multiTurn = measured(res).some((r) => r.requests.some((q) => q.turn > 0));
  if (multiTurn) {
    const series = [];
    res.arms.forEach((arm, a) => {
      const byTurn = [];
      for (const r of measured(res).filter((x) => x.arm === a))
        for (const q of r.requests) if (!q.error) (byTurn[q.turn] ??= []).push(q);
      const mean = (t, k) => byTurn[t].reduce((n, q) => n + (q[k] ?? 0), 0) / byTurn[t].length;
      series.push({ name: `${arm.name} cached`, points: byTurn.map((_, t) => [t + 1, mean(t, 'cached_tokens')]).filter(Boolean) });
      if (a === 0) series.push({ name: 'prompt', points: byTurn.map((_, t) => [t + 1, mean(t, 'prompt_tokens')]).filter(Boolean) });
    });
    out.push(lineChart(series, { title: 'Cached and prompt tokens per agent turn (mean)', xLabel: 'turn', yLabel: 'tokens' }));
  }
  return `<div class="plots">${out.join('\n')}</div>`;
}

// `lumen eval` prints one JSON object a run; these are its fields, in order.
const EVAL_COLS = [['model', 'model'], ['reference', 'reference'], ['kv', 'KV'], ['ctx', 'ctx'], ['scored', 'scored tokens'],
  ['ppl', 'perplexity'], ['ref_ppl', 'reference perplexity'], ['kl_mean', 'KL mean (nats)'], ['kl_p99', 'KL p99'],
  ['kl_max', 'KL max'], ['top1', 'top-1 agreement']];

// Whether j is one `lumen eval` result line.
export const isEvalLine = (j) => j !== null && typeof j === 'object' && typeof j.nll === 'number' && typeof j.ppl === 'number';

// four significant digits; KL divergences of 1e-5 as 1.000e-5, not 0.00001000
const fmtEval = (x) => (Number.isInteger(x) ? String(x) : x !== 0 && Math.abs(x) < 1e-3 ? x.toExponential(3) : x.toPrecision(4));
const evalCell = (e, k) => (typeof e[k] === 'number' ? fmtEval(e[k]) : (e[k] ?? '–'));

function evalLedger(evals) {
  if (!evals.length) return '';
  const head = `<tr>${EVAL_COLS.map(([, l]) => `<th>${esc(l)}</th>`).join('')}</tr>`;
  const rows = evals.map((e, i) => `<tr>${EVAL_COLS.map(([k]) =>
    `<td data-eval="${i}" data-key="${k}" data-value="${esc(e[k] ?? '')}">${esc(evalCell(e, k))}</td>`).join('')}</tr>`);
  return `<section class="ledger"><h2>Quality ledger (lumen eval)</h2>
<table class="eval">${head}\n${rows.join('\n')}</table></section>`;
}

const CSS = `body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}.prov td,.prov th{text-align:left}code{font-size:12px}
.chart text{font-size:11px;fill:#333}.chart .title{font-size:13px;font-weight:600}.grid{stroke:#eee}
.one{stroke:#888;stroke-dasharray:4 3}.withheld{fill:#a00}.plots{display:flex;flex-wrap:wrap;gap:12px}
section{border-top:2px solid #ddd;margin-top:2em}`;

export function renderHtml(all, evals = []) {
  const sections = all.map((res, i) => `<section class="result" data-index="${i}">
<h2>${esc(res.config.workload)}: ${res.arms.map((a) => esc(a.name)).join(' vs ')}</h2>
${provenance(res)}
<h3>Medians over blocks</h3>
${summaryTable(res)}
${comparisonSection(res)}
${plots(res)}
</section>`);
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>lumen bench-serve report</title>
<style>${CSS}</style></head>
<body><h1>lumen bench-serve report</h1>
${sections.join('\n')}
${evalLedger(evals)}
</body></html>
`;
}

export function renderMarkdown(all, evals = []) {
  const out = [];
  for (const res of all) {
    out.push(`### ${res.config.workload}: ${res.arms.map((a) => a.name).join(' vs ')}`, '',
      `\`${res.command}\``, '',
      `${res.machine.cpus} × ${res.machine.cpu}; seed ${res.config.seed}, ${res.config.blocks} blocks; ${res.created}`, '',
      `| arm | conc. | ${TABLE_METRICS.map((m) => LABEL[m]).join(' | ')} | errors |`,
      `|---|---|${TABLE_METRICS.map(() => '---|').join('')}---|`);
    for (const c of res.config.concurrency)
      res.arms.forEach((arm, a) => out.push(`| ${arm.name} | ${c} | ${TABLE_METRICS.map((m) => num(armMedian(res, a, c, m))).join(' | ')} | ${sumOver(res, a, c, 'errors')} |`));
    if (res.arms.length === 2) {
      out.push('', `| conc. | metric | ${res.arms[1].name} / ${res.arms[0].name} [95% CI] |`, '|---|---|---|');
      for (const cmp of res.comparisons)
        for (const [m, x] of Object.entries(cmp.metrics)) out.push(`| ${cmp.concurrency} | ${LABEL[m]} | ${ratioText(x)} |`);
      for (const cmp of res.comparisons)
        out.push('', `Greedy outputs at concurrency ${cmp.concurrency}: ${cmp.outputs.differing} of ${cmp.outputs.compared} differ.`);
    }
    out.push('');
  }
  if (evals.length) {
    out.push('### Quality ledger (lumen eval)', '', `| ${EVAL_COLS.map(([, l]) => l).join(' | ')} |`,
      `|${EVAL_COLS.map(() => '---|').join('')}`);
    for (const e of evals) out.push(`| ${EVAL_COLS.map(([k]) => evalCell(e, k)).join(' | ')} |`);
    out.push('');
  }
  return out.join('\n');
}
