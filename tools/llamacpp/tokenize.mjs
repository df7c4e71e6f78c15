// tokenize.mjs - llama.cpp's tokenizer on a GGUF against a cases.jsonl file
// (the tokenizer fixtures' format: {"text": ..., "ids": [...]} per line).
//
//   node tokenize.mjs MODEL.gguf CASES.jsonl
//
// Loads the vocabulary only (no tensors are read, so a GGUF whose tensors
// are missing works), tokenizes each text with special tokens parsed and no
// BOS, and prints one JSON line: equal and differing cases, and the first
// three differences. Exit status 1 when any case differs.
import fs from "fs";
import {die, loadLlamaCpu} from "./common.mjs";

const [model, cases] = process.argv.slice(2);
if (!model || !cases) die("usage: node tokenize.mjs MODEL.gguf CASES.jsonl");
const llama = await loadLlamaCpu();
const m = await llama.loadModel({modelPath: model, vocabOnly: true, gpuLayers: 0});
let equal = 0;
const differ = [];
for (const line of fs.readFileSync(cases, "utf8").split("\n")) {
    if (!line.trim()) continue;
    const c = JSON.parse(line);
    const got = Array.from(m.tokenize(c.text, true));
    if (JSON.stringify(got) === JSON.stringify(c.ids)) equal++;
    else differ.push({text: c.text.slice(0, 80), got: got.slice(0, 16), want: c.ids.slice(0, 16)});
}
console.log(JSON.stringify({model, cases, equal, differ: differ.length, first: differ.slice(0, 3)}));
process.exit(differ.length ? 1 : 0);
