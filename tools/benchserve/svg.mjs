// svg.mjs - the report's plots as inline SVG strings: line charts (CDFs,
// throughput against concurrency, tokens per turn) and a forest plot of
// ratios with intervals. No scripts, no fonts fetched: the page works
// offline.

export const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b'];

const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c]);
const fmt = (x) => (Number.isInteger(x) ? String(x) : Math.abs(x) >= 100 ? x.toFixed(0) : Math.abs(x) >= 1 ? x.toFixed(1) : x.toPrecision(2));

function ticks(lo, hi, n = 5) {
  if (!(hi > lo)) return [lo];
  const step = 10 ** Math.floor(Math.log10((hi - lo) / n));
  const mult = [1, 2, 5, 10].find((m) => (hi - lo) / (step * m) <= n) ?? 10;
  const s = step * mult;
  const out = [];
  for (let t = Math.ceil(lo / s) * s; t <= hi + 1e-9 * s; t += s) out.push(t);
  return out;
}

// series: [{ name, points: [[x, y], ...] }]; options: title, xLabel, yLabel, step (CDF steps).
export function lineChart(series, { title, xLabel, yLabel, step = false, width = 560, height = 300 } = {}) {
  const pts = series.flatMap((s) => s.points);
  if (!pts.length) return `<p class="empty">${esc(title)}: no data</p>`;
  const m = { l: 60, r: 120, t: 28, b: 40 };
  let [x0, x1] = [Math.min(...pts.map((p) => p[0])), Math.max(...pts.map((p) => p[0]))];
  let [y0, y1] = [Math.min(0, ...pts.map((p) => p[1])), Math.max(...pts.map((p) => p[1]))];
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) y1 = y0 + 1;
  const X = (x) => m.l + ((x - x0) / (x1 - x0)) * (width - m.l - m.r);
  const Y = (y) => height - m.b - ((y - y0) / (y1 - y0)) * (height - m.t - m.b);
  const out = [`<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" role="img" aria-label="${esc(title)}">`,
    `<text x="${width / 2}" y="16" text-anchor="middle" class="title">${esc(title)}</text>`];
  for (const t of ticks(x0, x1)) out.push(`<line x1="${X(t)}" x2="${X(t)}" y1="${m.t}" y2="${height - m.b}" class="grid"/><text x="${X(t)}" y="${height - m.b + 14}" text-anchor="middle">${fmt(t)}</text>`);
  for (const t of ticks(y0, y1)) out.push(`<line x1="${m.l}" x2="${width - m.r}" y1="${Y(t)}" y2="${Y(t)}" class="grid"/><text x="${m.l - 4}" y="${Y(t) + 4}" text-anchor="end">${fmt(t)}</text>`);
  out.push(`<text x="${(m.l + width - m.r) / 2}" y="${height - 6}" text-anchor="middle">${esc(xLabel)}</text>`);
  out.push(`<text transform="translate(14 ${(m.t + height - m.b) / 2}) rotate(-90)" text-anchor="middle">${esc(yLabel)}</text>`);
  series.forEach((s, i) => {
    const c = COLORS[i % COLORS.length];
    let d = '';
    s.points.forEach(([x, y], j) => {
      if (j === 0) d += `M${X(x).toFixed(1)},${Y(y).toFixed(1)}`;
      else if (step) d += `H${X(x).toFixed(1)}V${Y(y).toFixed(1)}`;
      else d += `L${X(x).toFixed(1)},${Y(y).toFixed(1)}`;
    });
    out.push(`<path d="${d}" fill="none" stroke="${c}" stroke-width="2" class="series" data-series="${esc(s.name)}"/>`);
    if (!step) for (const [x, y] of s.points) out.push(`<circle cx="${X(x).toFixed(1)}" cy="${Y(y).toFixed(1)}" r="3" fill="${c}"/>`);
    out.push(`<rect x="${width - m.r + 10}" y="${m.t + i * 18}" width="10" height="10" fill="${c}"/><text x="${width - m.r + 24}" y="${m.t + i * 18 + 9}">${esc(s.name)}</text>`);
  });
  out.push('</svg>');
  return out.join('');
}

// The empirical CDF of xs as chart points.
export function cdfPoints(xs) {
  const v = xs.filter(Number.isFinite).sort((a, b) => a - b);
  return v.map((x, i) => [x, (i + 1) / v.length]);
}

// rows: [{ label, ratio, lo, hi }] (withheld rows: ratio null). Log x axis, 1 marked.
export function forestPlot(rows, { title, width = 560 } = {}) {
  const shown = rows.filter((r) => Number.isFinite(r.ratio));
  const height = 40 + rows.length * 24 + 30;
  const m = { l: 230, r: 30 };
  const vals = shown.flatMap((r) => [r.lo, r.hi, r.ratio]).concat([1]);
  let lo = Math.log(Math.min(...vals)) - 0.05;
  let hi = Math.log(Math.max(...vals)) + 0.05;
  if (hi - lo < 0.2) { lo -= 0.1; hi += 0.1; }
  const X = (v) => m.l + ((Math.log(v) - lo) / (hi - lo)) * (width - m.l - m.r);
  const out = [`<svg class="chart forest" xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" role="img" aria-label="${esc(title)}">`,
    `<text x="${width / 2}" y="16" text-anchor="middle" class="title">${esc(title)}</text>`,
    `<line x1="${X(1)}" x2="${X(1)}" y1="28" y2="${height - 24}" class="one"/>`,
    `<text x="${X(1)}" y="${height - 8}" text-anchor="middle">1.0</text>`];
  rows.forEach((r, i) => {
    const y = 44 + i * 24;
    out.push(`<text x="${m.l - 8}" y="${y + 4}" text-anchor="end">${esc(r.label)}</text>`);
    if (!Number.isFinite(r.ratio)) { out.push(`<text x="${m.l + 4}" y="${y + 4}" class="withheld">withheld</text>`); return; }
    out.push(`<line x1="${X(r.lo)}" x2="${X(r.hi)}" y1="${y}" y2="${y}" stroke="#333" stroke-width="2"/>`,
      `<circle cx="${X(r.ratio)}" cy="${y}" r="4" fill="#d62728"/>`,
      `<text x="${Math.min(X(r.hi) + 6, width - m.r)}" y="${y + 4}">${r.ratio.toFixed(3)}</text>`);
  });
  out.push('</svg>');
  return out.join('');
}
