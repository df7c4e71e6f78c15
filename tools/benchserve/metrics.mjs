// metrics.mjs - a Prometheus text scrape of the server's /metrics (lumen
// serves one; other servers may not: then null), and the change of every
// counter between two scrapes.

export async function scrape(url) {
  try {
    const res = await fetch(new URL('/metrics', url), { signal: AbortSignal.timeout(5000) });
    if (!res.ok) return null;
    return parseProm(await res.text());
  } catch {
    return null;
  }
}

// "name{labels} value" lines -> { "name{labels}": value }.
export function parseProm(text) {
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^(\S+?(?:\{[^}]*\})?)\s+(\S+)/.exec(line);
    if (m && Number.isFinite(Number(m[2]))) out[m[1]] = Number(m[2]);
  }
  return out;
}

// after - before for every series both hold that changed.
export function delta(before, after) {
  if (!before || !after) return null;
  const d = {};
  for (const [k, v] of Object.entries(after)) if (k in before && v !== before[k]) d[k] = v - before[k];
  return d;
}
