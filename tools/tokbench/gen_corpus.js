// gen_corpus.js OUT [MB] - a deterministic mixed-text corpus for the encode
// benchmark: lumen's own C sources and docs (code, English prose), the
// fixture tokenizers' test texts (CJK, Arabic, emoji, control characters)
// and chat templates, cut into paragraphs and shuffled with a fixed seed
// until the size is reached. Same commit + same fixtures = same bytes.
'use strict';
const fs = require('fs');
const path = require('path');

const out = process.argv[2];
const mb = Number(process.argv[3] || 4);
if (!out) { console.error('usage: node gen_corpus.js OUT [MB]'); process.exit(2); }
const root = path.resolve(__dirname, '../..');
const fixtures = process.env.LUMEN_FIXTURES || path.resolve(root, '../shared/fixtures');

function walk(dir, exts, acc) {
  for (const e of fs.readdirSync(dir, { withFileTypes: true }).sort((a, b) => a.name < b.name ? -1 : 1)) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) walk(p, exts, acc);
    else if (exts.some((x) => e.name.endsWith(x))) acc.push(p);
  }
  return acc;
}

const paras = [];
for (const f of walk(path.join(root, 'src'), ['.c', '.h'], []).concat(walk(path.join(root, 'docs'), ['.md'], [])))
  for (const p of fs.readFileSync(f, 'utf8').split(/\n\s*\n/)) if (p.trim()) paras.push(p);
const tokdir = path.join(fixtures, 'tokenizers');
if (fs.existsSync(tokdir)) {
  for (const d of fs.readdirSync(tokdir).sort()) {
    const cases = path.join(tokdir, d, 'cases.jsonl');
    if (fs.existsSync(cases))
      for (const l of fs.readFileSync(cases, 'utf8').split('\n')) if (l.trim()) paras.push(JSON.parse(l).text);
  }
}
const tdir = path.join(fixtures, 'templates');
if (fs.existsSync(tdir))
  for (const f of walk(tdir, ['.jinja'], [])) paras.push(fs.readFileSync(f, 'utf8'));

let seed = 12345;
const rand = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 4294967296);
const target = mb * 1024 * 1024;
const parts = [];
let size = 0;
while (size < target) {
  const p = paras[Math.floor(rand() * paras.length)];
  parts.push(p);
  size += Buffer.byteLength(p) + 2;
}
fs.writeFileSync(out, parts.join('\n\n'));
console.error(`gen_corpus: ${out}: ${size} bytes from ${paras.length} paragraphs`);
