// common.mjs - shared setup for the llama.cpp peer scripts (oracle.mjs, bench.mjs).
//
// llama.cpp is reached through node-llama-cpp 3.21.1, pinned exactly in
// package.json. Its prebuilt CPU binaries come in the npm platform package
// @node-llama-cpp/linux-x64, installed by `npm ci`; getLlama() is told never to
// build, never to download sources and never to use a GPU, so a run is offline
// and CPU-only, and fails loudly instead of compiling when no binary fits.
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

export function die(msg) {
    process.stderr.write(`${process.argv[1].split("/").pop()}: ${msg}\n`);
    process.exit(2);
}

// Minimal argv parser: one positional model path, then --name value pairs.
export function parseArgs(argv, known) {
    const out = {model: null};
    for (let i = 0; i < argv.length; i++) {
        const a = argv[i];
        if (a.startsWith("--")) {
            const name = a.slice(2);
            if (!(name in known)) die(`unknown option ${a}`);
            if (i + 1 >= argv.length) die(`${a} needs a value`);
            out[name] = argv[++i];
        } else if (out.model == null) {
            out.model = a;
        } else {
            die(`unexpected argument ${a}`);
        }
    }
    for (const [name, def] of Object.entries(known))
        if (out[name] === undefined) out[name] = def;
    if (out.model == null) die("missing MODEL.gguf");
    return out;
}

export function intArg(v, name, min) {
    const n = Number(v);
    if (!Number.isInteger(n) || n < min) die(`--${name} must be an integer >= ${min}`);
    return n;
}

export async function loadLlamaCpu({threads = 0, quiet = true} = {}) {
    return await getLlama({
        gpu: false,            // CPU backend only; never probe CUDA/Vulkan
        build: "never",        // use the prebuilt binary or throw, never compile
        skipDownload: true,    // never fetch llama.cpp sources
        usePrebuiltBinaries: true,
        progressLogs: false,
        maxThreads: threads,   // 0 = no cap; the context's `threads` decides
        logLevel: quiet ? LlamaLogLevel.error : LlamaLogLevel.warn,
    });
}

export async function loadModel(llama, path) {
    return await llama.loadModel({
        modelPath: path,
        gpuLayers: 0,
        useMmap: true,
    });
}

// Size of the logits vector: rows of the output projection (token_embd when
// tied), read from the GGUF tensor table; node-llama-cpp has no getter for it.
export function vocabSize(model) {
    const tensors = model.fileInfo.fullTensorInfo ?? model.fileInfo.tensorInfo ?? [];
    for (const name of ["output.weight", "token_embd.weight"]) {
        const t = tensors.find((x) => x.name === name);
        if (t != null && t.dimensions.length >= 2) return Number(t.dimensions[1]);
    }
    const toks = model.fileInfo.metadata?.tokenizer?.ggml?.tokens;
    if (toks != null && toks.length > 0) return toks.length;
    die("cannot determine the vocabulary size from the GGUF file");
}
