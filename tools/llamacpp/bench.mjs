// bench.mjs - llama.cpp's CPU prefill and decode speed on a GGUF model.
//
//   node bench.mjs MODEL.gguf [--prompt-len 512] [--gen 128] [--threads 2]
//                  [--batch 512] [--reps 3] [--seed 1] [--flash-attn 0|1]
//
// Prints one JSON line with prefill and decode tokens/s, the best (highest) of
// --reps repetitions plus every repetition's numbers. Each repetition clears
// the sequence, then evaluates --prompt-len random token ids (seeded, drawn
// below the vocabulary size) through the sequence's evaluate() generator with
// greedy sampling:
//   prefill = time from the call until the first generated token, i.e. the
//             prompt in batches of --batch tokens (llama.cpp n_batch = n_ubatch)
//             plus sampling one token;
//   decode  = --gen further single-token steps (one llama_decode each, with
//             the KV cache), timed from the first token to the last.
// End-of-generation tokens do not stop the run (yieldEogToken), so every
// repetition decodes exactly --gen tokens. A short warm-up evaluation runs
// first so that page faults of the mmapped weights are not timed.
// Threads are pinned: getLlama maxThreads and the context's ideal = min =
// --threads, so llama.cpp uses exactly that many for prompt and generation.
import {parseArgs, intArg, loadLlamaCpu, loadModel, vocabSize} from "./common.mjs";

const args = parseArgs(process.argv.slice(2), {
    "prompt-len": "512", "gen": "128", "threads": "2", "batch": "512",
    "reps": "3", "seed": "1", "flash-attn": "0",
});
const promptLen = intArg(args["prompt-len"], "prompt-len", 1);
const nGen = intArg(args.gen, "gen", 1);
const threads = intArg(args.threads, "threads", 1);
const batch = intArg(args.batch, "batch", 1);
const reps = intArg(args.reps, "reps", 1);
let seed = intArg(args.seed, "seed", 0);
const flashAttn = intArg(args["flash-attn"], "flash-attn", 0) !== 0;

// xorshift32, seeded; deterministic prompts across runs and machines.
let rng = (seed >>> 0) || 0x9e3779b9;
function nextU32() {
    rng ^= rng << 13; rng >>>= 0;
    rng ^= rng >>> 17;
    rng ^= rng << 5; rng >>>= 0;
    return rng;
}

const tLoad0 = performance.now();
const llama = await loadLlamaCpu({threads});
const model = await loadModel(llama, args.model);
const tLoad = (performance.now() - tLoad0) / 1000;
const nVocab = vocabSize(model);

const context = await model.createContext({
    contextSize: promptLen + nGen + 16,
    batchSize: Math.min(batch, promptLen),
    sequences: 1,
    threads: {ideal: threads, min: threads},
    flashAttention: flashAttn,
    // Dispatch each queued decode at once rather than on the next event-loop
    // cycle: less JavaScript latency between single-token decode steps.
    batching: {dispatchSchedule: (dispatch) => queueMicrotask(dispatch)},
});
const seq = context.getSequence();

function randomPrompt() {
    const ids = new Array(promptLen);
    for (let i = 0; i < promptLen; i++) ids[i] = nextU32() % nVocab;
    return ids;
}

async function runOnce(prompt, gen) {
    await seq.clearHistory();
    const t0 = performance.now();
    let tFirst = 0;
    let count = 0;
    const it = seq.evaluate(prompt, {temperature: 0, yieldEogToken: true});
    for await (const _tok of it) {
        if (count === 0) tFirst = performance.now();
        if (count === gen) break; // first token + gen decode steps
        count++;
    }
    const tEnd = performance.now();
    return {
        prefill_s: (tFirst - t0) / 1000,
        decode_s: (tEnd - tFirst) / 1000,
        prefill_tps: prompt.length / ((tFirst - t0) / 1000),
        decode_tps: gen / ((tEnd - tFirst) / 1000),
    };
}

// Warm-up: touch every weight page and the thread pool.
await runOnce(randomPrompt().slice(0, Math.min(promptLen, 32)), 4);

const runs = [];
for (let r = 0; r < reps; r++) runs.push(await runOnce(randomPrompt(), nGen));

const best = (k) => Math.max(...runs.map((x) => x[k]));
const round = (v) => Math.round(v * 1000) / 1000;
const out = {
    engine: "llama.cpp via node-llama-cpp 3.21.1 (CPU)",
    llama_cpp_release: llama.llamaCppRelease,
    model: args.model.split("/").pop(),
    model_bytes: model.size,
    model_type: model.typeDescription,
    n_vocab: nVocab,
    threads: context.currentThreads ?? threads,
    prompt_len: promptLen,
    gen: nGen,
    batch: Math.min(batch, promptLen),
    flash_attn: flashAttn,
    reps,
    load_s: round(tLoad),
    prefill_tokens_per_s: round(best("prefill_tps")),
    decode_tokens_per_s: round(best("decode_tps")),
    runs: runs.map((x) => Object.fromEntries(Object.entries(x).map(([k, v]) => [k, round(v)]))),
};
process.stdout.write(JSON.stringify(out) + "\n");
await context.dispose();
await model.dispose();
await llama.dispose();
