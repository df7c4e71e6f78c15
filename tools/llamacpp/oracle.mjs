// oracle.mjs - llama.cpp's answer for a GGUF model on given token ids.
//
//   node oracle.mjs MODEL.gguf --prompt-ids 1,450,7483 [-n 32] [--threads N]
//
// Prints one JSON line: {"prompt_ids", "greedy_ids", "last_logprobs", ...}.
// The prompt is evaluated as token ids (no tokenizer involved). The last
// prompt position is evaluated through controlledEvaluate with a greedy
// sampler that asks for the full probability list: node-llama-cpp computes it
// in the addon as a float32 softmax over every raw logit of the vocabulary
// (greedy adds no temperature, top-k or penalties), and last_logprobs is the
// natural log of those probabilities, i.e. the log-softmax up to float32
// rounding. greedy_ids are then n tokens of greedy decoding with the KV cache
// (the first one is the argmax of the last prompt position).
import {die, parseArgs, intArg, loadLlamaCpu, loadModel, vocabSize} from "./common.mjs";

const argv = process.argv.slice(2).map((a) => (a === "-n" ? "--n" : a));
const args = parseArgs(argv, {"prompt-ids": null, "n": "32", "threads": "0", "context": "0"});
if (args["prompt-ids"] == null) die("missing --prompt-ids");
const promptIds = args["prompt-ids"].split(",").filter((s) => s.length > 0).map((s) => {
    const v = Number(s);
    if (!Number.isInteger(v) || v < 0) die(`bad token id '${s}'`);
    return v;
});
if (promptIds.length === 0) die("--prompt-ids is empty");
const nGen = intArg(args.n, "n", 0);
const threads = intArg(args.threads, "threads", 0);

const llama = await loadLlamaCpu({threads});
const model = await loadModel(llama, args.model);
const nVocab = vocabSize(model);
for (const t of promptIds)
    if (t >= nVocab) die(`token id ${t} >= vocab size ${nVocab}`);

const need = promptIds.length + nGen + 1;
let ctxSize = intArg(args.context, "context", 0);
if (ctxSize === 0) ctxSize = Math.max(256, need);
const context = await model.createContext({
    contextSize: ctxSize,
    batchSize: Math.min(ctxSize, 512),
    sequences: 1,
    threads: threads === 0 ? undefined : threads,
    flashAttention: false,
});
const seq = context.getSequence();

// Prompt: all but the last token without outputs, the last with full probabilities.
const input = promptIds.slice(0, -1).map((t) => t);
input.push([promptIds[promptIds.length - 1], {
    generateNext: {token: true, probabilities: true, options: {temperature: 0}},
}]);
const res = await seq.controlledEvaluate(input);
const last = res[promptIds.length - 1];
if (last == null || last.next.probabilities == null) die("llama.cpp returned no probabilities");
const probs = last.next.probabilities;
if (probs.size !== nVocab) die(`got ${probs.size} probabilities for a vocabulary of ${nVocab}`);
const n = nVocab;
const lastLogprobs = new Array(n).fill(-Infinity);
for (const [tok, p] of probs) lastLogprobs[tok] = Math.log(p);

let argmax = 0;
for (let i = 1; i < n; i++) if (lastLogprobs[i] > lastLogprobs[argmax]) argmax = i;

// Greedy continuation with the KV cache: feed each chosen token back.
const greedy = [];
if (nGen > 0) {
    greedy.push(last.next.token);
    while (greedy.length < nGen) {
        const r = await seq.controlledEvaluate([[greedy[greedy.length - 1], {
            generateNext: {token: true, options: {temperature: 0}},
        }]]);
        const tok = r[0]?.next?.token;
        if (tok == null) die("llama.cpp returned no token");
        greedy.push(tok);
    }
}

const out = {
    model: args.model.split("/").pop(),
    engine: "llama.cpp via node-llama-cpp 3.21.1 (CPU)",
    llama_cpp_release: llama.llamaCppRelease,
    prompt_ids: promptIds,
    greedy_ids: greedy,
    argmax_last: argmax,
    n_vocab: n,
    last_logprobs: lastLogprobs,
};
process.stdout.write(JSON.stringify(out) + "\n");
await context.dispose();
await model.dispose();
await llama.dispose();
