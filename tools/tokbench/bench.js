// bench.js TOKENIZER_JSON CORPUS [REPS] [--paragraphs] - encode speed of the Hugging Face
// tokenizers Rust core (through its node binding) on one corpus, one
// sequence (or, with --paragraphs, each "\n\n"-separated paragraph through
// one encodeBatch call), without special tokens. Prints one JSON line like
// `lumen tokenize --bench`, with an FNV-1a hash of the ids so both sides can
// be checked to produce the same tokens. Run with RAYON_NUM_THREADS=1.
'use strict';
const fs = require('fs');
const { Tokenizer } = require('@anush008/tokenizers');

async function main() {
  const args = process.argv.slice(2).filter((a) => a !== '--paragraphs');
  const paras = process.argv.includes('--paragraphs');
  const [file, corpus, repsArg] = args;
  if (!file || !corpus) { console.error('usage: node bench.js tokenizer.json corpus.txt [reps]'); process.exit(2); }
  const reps = Number(repsArg || 3);
  const text = fs.readFileSync(corpus, 'utf8');
  let best = Infinity, bestCpu = Infinity, ids = null;
  for (let r = 0; r < reps; r++) {
    const tok = Tokenizer.fromFile(file); // a cold word cache every run, as lumen's bench does
    const t0 = process.hrtime.bigint(), c0 = process.cpuUsage();
    let got;
    if (paras) {
      const encs = await tok.encodeBatch(text.split('\n\n'), { addSpecialTokens: false });
      got = [].concat(...encs.map((e) => e.getIds()));
    } else {
      got = (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
    }
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    const cu = process.cpuUsage(c0), dc = (cu.user + cu.system) / 1e6; // all threads
    ids = got;
    if (dt < best) best = dt;
    if (dc < bestCpu) bestCpu = dc;
  }
  let h = 0x811c9dc5;
  for (const id of ids) for (let k = 0; k < 4; k++) { h ^= (id >>> (8 * k)) & 255; h = Math.imul(h, 16777619) >>> 0; }
  const bytes = Buffer.byteLength(text);
  console.log(JSON.stringify({ bytes, tokens: ids.length, seconds: +best.toFixed(4),
    tokens_per_s: Math.round(ids.length / best), mb_per_s: +(bytes / best / 1e6).toFixed(2),
    ids_fnv1a: h.toString(16), cpu_seconds: +bestCpu.toFixed(4), tokens_per_cpu_s: Math.round(ids.length / bestCpu) }));
}
main().catch((e) => { console.error(e); process.exit(1); });
