// make_cases.js TOKENIZER_DIR N SEED > cases.jsonl - random stress texts with
// the Hugging Face tokenizers' answers, in the fixtures' cases.jsonl format
// ({text, ids, ids_with_special, tokens, decoded, decoded_with_special}), for
// `lumen check-tokenizer` beyond the shared fixtures. Texts mix ASCII words,
// every Unicode space, combining marks, digits of several scripts, CJK,
// Arabic, emoji sequences, control characters and the tokenizer's own added
// tokens, with a seeded PRNG so a failing case can be regenerated. Each text
// has 1 to MAX_PIECES (environment, default 12) such pieces.
'use strict';
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require('@anush008/tokenizers');

const [dir, nArg, seedArg] = process.argv.slice(2);
if (!dir) { console.error('usage: node make_cases.js TOKENIZER_DIR [N] [SEED]'); process.exit(2); }
const n = Number(nArg || 500);
let seed = Number(seedArg || 1) >>> 0;
const rand = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 4294967296);
const pick = (a) => a[Math.floor(rand() * a.length)];
const json = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8'));
const added = (json.added_tokens || []).map((t) => t.content).slice(0, 200);

const cp = (lo, hi) => String.fromCodePoint(lo + Math.floor(rand() * (hi - lo + 1)));
const pieces = [
  () => pick(['the', 'The', 'THE', 'hello', "don't", "I'm", "we'll", "'s", "'S", 'x', 'café', 'naïve', 'über']),
  () => pick([' ', '  ', '   ', '\t', '\n', '\n\n', '\r\n', '\r', ' \n ', '\u000b', '\f']),
  () => pick(['\u0085', '\u00a0', '\u1680', '\u2000', '\u2005', '\u200a', '\u2028', '\u2029', '\u202f',
              '\u205f', '\u3000', '\u180e', '\u200b', '\u200c', '\u200d', '\ufeff', '\u2060']),
  () => cp(0x300, 0x36f),                       // combining marks
  () => 'e' + cp(0x300, 0x36f) + cp(0x300, 0x36f),
  () => cp(0x30, 0x39).repeat(1 + Math.floor(rand() * 6)),
  () => pick(['٣', '४', '৫', '໒', '１２', 'Ⅻ', '½', '²', '①', '𝟙']),
  () => cp(0x4e00, 0x9fff) + cp(0x4e00, 0x9fff),
  () => cp(0x3040, 0x30ff),
  () => cp(0x0600, 0x06ff) + cp(0x0600, 0x06ff),
  () => cp(0x0900, 0x097f),
  () => cp(0xac00, 0xd7a3),
  () => cp(0x1100, 0x1112) + cp(0x1161, 0x1175),       // conjoining jamo
  () => pick(['😀', '👍🏽', '🧑🏻‍💻', '🏳️‍🌈', '🇺🇸', '❤️', '✔️', '🫠']),
  () => cp(0x1f300, 0x1faff),
  () => cp(0x0, 0x1f),
  () => cp(0x7f, 0x9f),
  () => cp(0x21, 0x2f) + cp(0x3a, 0x40),
  () => pick(['{', '}', '()', '[]', '=>', '->', '//', '/*', '*/', '#', '"', "'", '`', '\\', '...']),
  () => cp(0xa0, 0x24f),
  () => cp(0x370, 0x3ff) + cp(0x400, 0x4ff),
  () => cp(0x10000, 0x10fff),
  () => cp(0xe000, 0xe0ff),                     // private use
  () => pick(['ﬁ', 'ﬂ', 'Ｆｕｌｌ', 'ǅ', 'İ', 'ß', 'ẞ', 'Ω', 'K', 'Å']),
  () => (added.length ? pick(added) : 'x'),
  () => ' ' + (added.length ? pick(added) : 'x') + ' ',
  () => '\u2581' + pick(['a', '', '\u2581', ' ']),
  () => pick(['<0x41>', '<unk>', '<s>', '</s>', '<|endoftext|>', '<bos>']),
];

async function main() {
  const tok = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
  const out = [];
  for (let i = 0; i < n; i++) {
    let text = '';
    const k = 1 + Math.floor(rand() * Number(process.env.MAX_PIECES || 12));
    for (let j = 0; j < k; j++) text += pick(pieces)();
    const a = await tok.encode(text, null, { addSpecialTokens: false });
    const b = await tok.encode(text, null, { addSpecialTokens: true });
    const ids = a.getIds(), idsw = b.getIds();
    out.push(JSON.stringify({ text, ids, ids_with_special: idsw, decoded: await tok.decode(ids, false),
      tokens: a.getTokens(), decoded_with_special: await tok.decode(idsw, false) }));
  }
  process.stdout.write(out.join('\n') + '\n');
}
main().catch((e) => { console.error(e); process.exit(1); });
