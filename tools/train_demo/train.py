#!/usr/bin/env python3
"""Trains lumen's bundled demo model on the GPU machine, reproducibly.

A small Qwen3.5 hybrid (Gated DeltaNet + gated full attention, the real
`qwen3_5_text` config and weight names) with one MTP layer in the real
Qwen3.5 checkpoint layout (`mtp.*`), trained on the Python sources shipped in
the machine's image, with a byte-level BPE tokenizer trained on the same data
and a Qwen-style chat template (roles, tool calls, think tags). Instruction
pairs come from the corpus itself: a function's docstring is the request, the
function is the answer.

Phases (each resumable from --work, so training can span several device
calls):
  prepare   corpus, tokenizer, token streams           -> WORK/data
  train     until --minutes of this call are spent or held-out loss stops
            improving; checkpoints to WORK/ckpt.pt      -> WORK/ckpt.pt
  export    bf16 weights (+ mtp.*), config, tokenizer, chat template,
            reference.safetensors (transformers' logits for lumen parity),
            evaluation (held-out loss, MTP acceptance, 20 sampled answers
            checked with ast.parse)                     -> OUT/demo/...

The MTP head follows the Qwen3.5 layout: for position t it takes the main
model's final hidden state h_t (after model.norm) and the embedding of token
t+1, normalises each (pre_fc_norm_hidden, pre_fc_norm_embedding, (1+w)
RMSNorms), concatenates [embedding, hidden], projects 2D -> D (fc), runs one
full-attention decoder layer, normalises (mtp.norm) and shares the main
lm_head: its logits at t predict token t+2.
"""
import argparse
import ast
import copy
import glob
import hashlib
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

SEED = 1234
SEQ = 512
QWEN_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
            "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
HERE = os.path.dirname(os.path.abspath(__file__))

MODEL_CONFIG = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=8,
    full_attention_interval=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    partial_rotary_factor=0.25,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    initializer_range=0.02,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25},
)


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


# ---- corpus ------------------------------------------------------------------


def corpus_roots():
    roots = sorted(set(glob.glob("/usr/lib/python3*")) | {os.path.dirname(os.__file__)})
    site = [p for p in sys.path if p.endswith("site-packages")]
    for s in site[:1]:
        for pkg in ("numpy", "torch", "transformers", "scipy", "sympy", "networkx", "pandas"):
            if os.path.isdir(os.path.join(s, pkg)):
                roots.append(os.path.join(s, pkg))
    return roots


def corpus(max_bytes):
    """(relpath, text) for every distinct .py file, in a fixed order."""
    seen, out, total = set(), [], 0
    for root in corpus_roots():
        for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
            try:
                raw = open(path, "rb").read()
            except OSError:
                continue
            if len(raw) < 200 or len(raw) > 200_000:
                continue
            h = hashlib.sha1(raw).hexdigest()
            if h in seen:
                continue
            seen.add(h)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                continue
            rel = os.path.relpath(path, os.path.dirname(root))
            out.append((rel, text))
            total += len(raw)
            if total >= max_bytes:
                return out
    return out


def is_heldout(rel):
    return int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 50 == 0


def instruction_pairs(rel, text, limit=3):
    """(request, answer) from functions that have a docstring."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    pairs = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node)
        src = ast.get_source_segment(text, node)
        if not doc or not src or node.name.startswith("_"):
            continue
        lines = src.count("\n") + 1
        if lines < 4 or lines > 60:
            continue
        first = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
        if len(first) < 15:
            continue
        # dedent methods so that the answer parses on its own
        src_lines = src.split("\n")
        indent = node.col_offset
        src = "\n".join(l[indent:] if l[:indent].strip() == "" else l for l in src_lines)
        req = f"Write a Python function `{node.name}`: {first}"
        pairs.append((req, src))
        if len(pairs) >= limit:
            break
    return pairs


# ---- tokenizer and template ----------------------------------------------------


def build_tokenizer(texts, vocab_size):
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None)
    fast.chat_template = open(os.path.join(HERE, "chat_template.jinja")).read()
    return fast


def render_chat(tok, request, answer):
    msgs = [{"role": "user", "content": request}, {"role": "assistant", "content": answer}]
    return tok.apply_chat_template(msgs, tokenize=False)


def prompt_for(tok, request):
    return tok.apply_chat_template([{"role": "user", "content": request}], tokenize=False,
                                   add_generation_prompt=True)


# ---- MTP head --------------------------------------------------------------------


class MTP(nn.Module):
    """One Qwen3.5 MTP layer; parameter names match the checkpoint's mtp.*."""

    def __init__(self, cfg):
        super().__init__()
        mcfg = copy.deepcopy(cfg)
        mcfg.num_hidden_layers = 1
        mcfg.layer_types = ["full_attention"]
        D = cfg.hidden_size
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(D, eps=cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(D, eps=cfg.rms_norm_eps)
        self.fc = nn.Linear(2 * D, D, bias=False)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(mcfg, 0)])
        self.norm = Qwen3_5RMSNorm(D, eps=cfg.rms_norm_eps)

    def forward(self, model, hidden, next_ids):
        """hidden [B,T,D] after model.norm at positions 0..T-1; next_ids [B,T]
        the tokens at positions 1..T. Returns logits predicting tokens 2..T+1."""
        emb = model.model.embed_tokens(next_ids)
        x = torch.cat([self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(hidden)], dim=-1)
        x = self.fc(x)
        B, T, _ = x.shape
        pos = torch.arange(T, device=x.device).view(1, 1, -1).expand(3, B, -1)
        pe = model.model.rotary_emb(x, pos)
        # an explicit causal mask: eager attention treats a missing mask as "attend everywhere"
        mask = torch.full((T, T), float("-inf"), device=x.device, dtype=x.dtype).triu(1)[None, None]
        x = self.layers[0](x, position_embeddings=pe, attention_mask=mask,
                           position_ids=torch.arange(T, device=x.device).view(1, -1).expand(B, -1))
        return model.lm_head(self.norm(x))


def init_mtp_like_model(mtp):
    with torch.no_grad():
        for n, p in mtp.named_parameters():
            if "norm" in n and p.dim() == 1:
                p.zero_()  # (1 + w) norms start at identity
            elif p.dim() >= 2:
                p.normal_(0, 0.02)


# ---- data ------------------------------------------------------------------------


def prepare(args):
    os.makedirs(args.work, exist_ok=True)
    done = os.path.join(args.work, "data.pt")
    if os.path.exists(done):
        log("data already prepared")
        return torch.load(done)
    files = corpus(args.corpus_bytes)
    train_files = [(r, t) for r, t in files if not is_heldout(r)]
    held_files = [(r, t) for r, t in files if is_heldout(r)]
    log(f"corpus: {len(files)} files, {sum(len(t) for _, t in files) / 1e6:.1f} MB; held out {len(held_files)}")
    tok_dir = os.path.join(args.work, "tokenizer")
    if os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
        tok = PreTrainedTokenizerFast.from_pretrained(tok_dir)  # an earlier run's, for a re-export
        log("using the tokenizer in", tok_dir)
    else:
        tok = build_tokenizer((t for _, t in train_files[: max(1, len(train_files) // 2)]), args.vocab)
        tok.save_pretrained(tok_dir)
    eot = tok.convert_tokens_to_ids("<|endoftext|>")

    def stream(items, chat_repeat):
        ids = []
        pairs = []
        for rel, text in items:
            ids += tok(text, add_special_tokens=False)["input_ids"] + [eot]
            pairs += instruction_pairs(rel, text)
        chat = []
        for req, ans in pairs:
            chat += tok(render_chat(tok, req, ans), add_special_tokens=False)["input_ids"] + [eot]
        return ids + chat * chat_repeat, pairs

    train_ids, train_pairs = stream(train_files, 2)
    held_ids, held_pairs = stream(held_files, 1)
    data = {
        "train": torch.tensor(train_ids, dtype=torch.int32),
        "held": torch.tensor(held_ids, dtype=torch.int32),
        "held_pairs": held_pairs,
        "n_train_pairs": len(train_pairs),
        "files": len(files),
        "bytes": sum(len(t) for _, t in files),
        "held_files": [r for r, _ in held_files],
    }
    torch.save(data, done)
    log(f"tokens: train {len(train_ids)}, held-out {len(held_ids)}; pairs: train {len(train_pairs)}, held-out {len(held_pairs)}")
    return data


def make_model(tok_len, eos, pad):
    cfg = AutoConfig.for_model("qwen3_5_text", vocab_size=tok_len, **MODEL_CONFIG)
    cfg.eos_token_id = eos
    cfg.pad_token_id = pad
    cfg.bos_token_id = None
    cfg.mtp_num_hidden_layers = 1
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    mtp = MTP(model.config)
    init_mtp_like_model(mtp)
    return model, mtp


def batches(ids, bs, gen):
    n = (len(ids) - 1) // SEQ
    while True:
        starts = torch.randint(0, len(ids) - SEQ - 2, (bs,), generator=gen)
        x = torch.stack([ids[s: s + SEQ + 2].long() for s in starts.tolist()])
        yield x


def losses(model, mtp, x):
    inp = x[:, :SEQ]
    out = model.model(input_ids=inp)
    h = out.last_hidden_state
    logits = model.lm_head(h)
    main = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:SEQ + 1].reshape(-1))
    mlog = mtp(model, h, x[:, 1:SEQ + 1])
    extra = F.cross_entropy(mlog.float().reshape(-1, mlog.shape[-1]), x[:, 2:SEQ + 2].reshape(-1))
    return main, extra, logits, mlog


@torch.no_grad()
def evaluate(model, mtp, held, n_batches=16, bs=16):
    model.eval()
    mtp.eval()
    gen = torch.Generator().manual_seed(7)
    it = batches(held, bs, gen)
    tot_main = tot_mtp = 0.0
    accept = count = 0
    for _ in range(n_batches):
        x = next(it).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            main, extra, logits, mlog = losses(model, mtp, x)
        tot_main += main.item()
        tot_mtp += extra.item()
        # MTP first-draft acceptance: the draft for t+2 equals the main model's own
        # greedy choice at t+2 (what speculative decoding would verify)
        draft = mlog[:, :-1].argmax(-1)
        target = logits[:, 1:].argmax(-1)
        accept += (draft == target).sum().item()
        count += draft.numel()
    model.train()
    mtp.train()
    return tot_main / n_batches, tot_mtp / n_batches, accept / max(count, 1)


def train(args, data):
    tok = PreTrainedTokenizerFast.from_pretrained(os.path.join(args.work, "tokenizer"))
    model, mtp = make_model(len(tok), tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>"))
    model.cuda()
    mtp.cuda()
    params = list(model.parameters()) + list(mtp.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    ck = os.path.join(args.work, "ckpt.pt")
    state = {"step": 0, "gpu_seconds": 0.0, "history": [], "best": 1e9, "bad_evals": 0}
    if os.path.exists(ck):
        c = torch.load(ck, map_location="cuda")
        model.load_state_dict(c["model"])
        mtp.load_state_dict(c["mtp"])
        opt.load_state_dict(c["opt"])
        state = c["state"]
        log(f"resumed at step {state['step']}, {state['gpu_seconds'] / 60:.1f} GPU minutes so far")
    elif args.init and os.path.exists(args.init):
        # the machine was replaced between calls: weights survive, the optimizer restarts
        c = torch.load(args.init, map_location="cuda")
        model.load_state_dict({k: v.float() for k, v in c["model"].items()})
        mtp.load_state_dict({k: v.float() for k, v in c["mtp"].items()})
        state = c["state"]
        log(f"started from snapshot at step {state['step']} (fresh optimizer)")
    gen = torch.Generator().manual_seed(SEED + state["step"])
    it = batches(data["train"], args.batch, gen)
    t_call = time.time()
    last_eval = time.time()
    model.train()
    while True:
        step = state["step"]
        # warm-up, then cosine to 10% over the GPU-time budget (steps/s is not known ahead)
        progress = min(1.0, state["gpu_seconds"] / (args.max_gpu_minutes * 60))
        lr = args.lr * min(1.0, (step + 1) / 200) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for g in opt.param_groups:
            g["lr"] = lr
        x = next(it).cuda(non_blocking=True)
        t0 = time.time()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            main, extra, _, _ = losses(model, mtp, x)
            loss = main + 0.3 * extra
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        torch.cuda.synchronize()
        state["gpu_seconds"] += time.time() - t0
        state["step"] += 1
        if state["step"] % 50 == 0:
            log(f"step {state['step']} loss {main.item():.4f} mtp {extra.item():.4f} lr {lr:.2e} gpu {state['gpu_seconds'] / 60:.2f} min")
        if time.time() - last_eval > 60 or time.time() - t_call > args.minutes * 60:
            hl, hm, acc = evaluate(model, mtp, data["held"])
            state["history"].append({"step": state["step"], "gpu_minutes": state["gpu_seconds"] / 60,
                                     "train_loss": main.item(), "heldout_loss": hl, "heldout_mtp_loss": hm,
                                     "mtp_accept": acc})
            log(f"eval step {state['step']}: held-out loss {hl:.4f} (ppl {math.exp(hl):.2f}), mtp loss {hm:.4f}, mtp accept {acc:.3f}")
            if hl < state["best"] - 0.002:
                state["best"] = hl
                state["bad_evals"] = 0
            else:
                state["bad_evals"] += 1
            last_eval = time.time()
            torch.save({"model": model.state_dict(), "mtp": mtp.state_dict(), "opt": opt.state_dict(), "state": state}, ck)
            plateau = state["bad_evals"] >= 3
            if time.time() - t_call > args.minutes * 60 or plateau or state["gpu_seconds"] >= args.max_gpu_minutes * 60:
                budget = state["gpu_seconds"] >= args.max_gpu_minutes * 60
                why = "plateau" if plateau else ("gpu budget" if budget else "call time")
                log("stopping:", why)
                if plateau or budget:
                    state["stopped_by"] = why
                torch.save({"model": model.state_dict(), "mtp": mtp.state_dict(), "opt": opt.state_dict(), "state": state}, ck)
                # a small bf16 snapshot travels back, in case the next call gets a fresh machine
                os.makedirs(args.out, exist_ok=True)
                torch.save({"model": {k: v.bfloat16() for k, v in model.state_dict().items()},
                            "mtp": {k: v.bfloat16() for k, v in mtp.state_dict().items()}, "state": state},
                           os.path.join(args.out, "snapshot.pt"))
                return


# ---- export ----------------------------------------------------------------------


def export(args, data):
    tok = PreTrainedTokenizerFast.from_pretrained(os.path.join(args.work, "tokenizer"))
    model, mtp = make_model(len(tok), tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>"))
    if args.from_export:
        # re-export from an earlier export's bf16 weights (the checkpoint is gone with its machine)
        from safetensors.torch import load_file
        w = load_file(os.path.join(args.from_export, "model.safetensors"))
        model.load_state_dict({k: v.float() for k, v in w.items() if not k.startswith("mtp.")}, strict=False)
        model.tie_weights()
        mtp.load_state_dict({k[4:]: v.float() for k, v in w.items() if k.startswith("mtp.")})
        old = json.load(open(os.path.join(args.from_export, "training_report.json")))
        state = {"step": old["steps"], "gpu_seconds": old["gpu_minutes"] * 60, "history": old["history"],
                 "stopped_by": old["stopped_by"]}
    else:
        c = torch.load(os.path.join(args.work, "ckpt.pt"), map_location="cpu")
        model.load_state_dict(c["model"])
        mtp.load_state_dict(c["mtp"])
        state = c["state"]
    out = os.path.join(args.out, "demo")
    os.makedirs(out, exist_ok=True)
    model = model.to(torch.bfloat16)
    mtp = mtp.to(torch.bfloat16)
    model.generation_config.eos_token_id = model.config.eos_token_id
    model.generation_config.pad_token_id = model.config.pad_token_id
    # config.json, generation_config.json (and weights, rewritten below with mtp.*)
    model.save_pretrained(out, safe_serialization=True)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    for k, v in mtp.state_dict().items():
        tensors["mtp." + k] = v.contiguous()
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    tok.save_pretrained(out)
    with open(os.path.join(out, "chat_template.jinja"), "w") as f:
        f.write(tok.chat_template)
    log("weights:", sum(v.numel() for v in tensors.values()), "parameters,",
        os.path.getsize(os.path.join(out, "model.safetensors")), "bytes")

    # Reference outputs from the exported bf16 weights, upcast (the fixtures' format).
    ref = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32, attn_implementation="eager")
    ref.eval()
    mtp32 = MTP(ref.config)
    mtp32.load_state_dict({k: v.float() for k, v in mtp.state_dict().items()})
    mtp32.eval()
    held = data["held"].tolist()
    pairs = data["held_pairs"]
    texts = [prompt_for(tok, pairs[0][0]) if pairs else "def add(a, b):\n", None, None]
    ids0 = tok(texts[0], add_special_tokens=False)["input_ids"]
    prompts = [ids0, held[1000:1064], held[5000:5300]]
    tensors = {}
    meta = {"name": "demo", "model_type": "qwen3_5_text", "reference_dtype": "float32",
            "torch": torch.__version__, "transformers": transformers.__version__, "prompts": []}
    for i, ids in enumerate(prompts):
        x = torch.tensor([ids])
        with torch.no_grad():
            o = ref(x, use_cache=False, output_hidden_states=True)
            # an explicit mask: without one, generate treats every <|endoftext|> (the pad id)
            # inside the prompt as padding
            g = ref.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=24, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
        step = torch.stack([l[0].float() for l in g.logits])
        top2 = step.topk(2, dim=-1).values
        tensors[f"prompt{i}.ids"] = torch.tensor(ids, dtype=torch.int32)
        tensors[f"prompt{i}.logits"] = o.logits[0].float().contiguous()
        tensors[f"prompt{i}.greedy_ids"] = g.sequences[0, len(ids):].to(torch.int32).contiguous()
        tensors[f"prompt{i}.greedy_logits"] = step.contiguous()
        if i == 0:
            for li, h in enumerate(o.hidden_states):
                tensors[f"prompt0.hidden.{li}"] = h[0].float().contiguous()
        # the MTP head's logits at every position but the last (it needs token t+1)
        with torch.no_grad():
            h = o.hidden_states[-1]
            ml = mtp32(ref, h[:, :-1], x[:, 1:])
        tensors[f"prompt{i}.mtp_logits"] = ml[0].float().contiguous()
        meta["prompts"].append({"len": len(ids), "greedy_min_margin": (top2[:, 0] - top2[:, 1]).min().item()})
    save_file(tensors, os.path.join(out, "reference.safetensors"))
    json.dump(meta, open(os.path.join(out, "reference.json"), "w"), indent=1)

    # Held-out loss, MTP acceptance, and 20 sampled answers to held-out requests.
    model_gpu = ref.to(torch.bfloat16).cuda()
    mtp_gpu = mtp32.to(torch.bfloat16).cuda()
    hl, hm, acc = evaluate(model_gpu, mtp_gpu, data["held"], n_batches=32)
    rng = random.Random(SEED)
    chosen = rng.sample(pairs, min(args.samples, len(pairs)))
    samples, ok = [], 0
    for req, ans in chosen:
        p = tok(prompt_for(tok, req), add_special_tokens=False, return_tensors="pt")["input_ids"].cuda()
        torch.manual_seed(rng.randrange(1 << 30))
        with torch.no_grad():
            g = model_gpu.generate(p, max_new_tokens=256, do_sample=True, temperature=0.6, top_p=0.95,
                                   eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=0)
        text = tok.decode(g[0, p.shape[1]:], skip_special_tokens=True)
        code = text.split("</think>")[-1].strip()
        try:
            ast.parse(code)
            valid = True
        except SyntaxError:
            valid = False
        ok += valid
        samples.append({"request": req, "answer": text, "parses": valid})
    report = {
        "corpus_files": data["files"], "corpus_bytes": data["bytes"],
        "train_tokens": len(data["train"]), "heldout_tokens": len(data["held"]),
        "train_pairs": data["n_train_pairs"], "heldout_pairs": len(pairs),
        "steps": state["step"], "gpu_minutes": state["gpu_seconds"] / 60, "stopped_by": state.get("stopped_by"),
        "history": state["history"], "heldout_loss": hl, "heldout_ppl": math.exp(hl),
        "heldout_mtp_loss": hm, "mtp_first_draft_accept": acc,
        "samples_parse": ok, "samples": samples, "seed": SEED, "config": MODEL_CONFIG,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "gpu": torch.cuda.get_device_name(0),
    }
    json.dump(report, open(os.path.join(out, "training_report.json"), "w"), indent=1)
    log(f"held-out loss {hl:.4f} ppl {math.exp(hl):.2f}; mtp accept {acc:.3f}; {ok}/{len(samples)} samples parse")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/demo-work")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--phase", choices=["all", "train", "export"], default="all")
    ap.add_argument("--minutes", type=float, default=8.0, help="wall minutes of training in this call")
    ap.add_argument("--max-gpu-minutes", type=float, default=10.5)
    ap.add_argument("--from-export", default="", help="re-export from this earlier export folder")
    ap.add_argument("--init", default="", help="snapshot.pt to start from when WORK has no checkpoint")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--samples", type=int, default=20, help="held-out requests to answer and ast.parse")
    ap.add_argument("--corpus-bytes", type=int, default=60_000_000)
    args = ap.parse_args()
    random.seed(SEED)
    torch.manual_seed(SEED)
    torch.backends.cuda.matmul.allow_tf32 = True
    log("torch", torch.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name(0))
    data = prepare(args)
    if args.phase in ("all", "train"):
        train(args, data)
    if args.phase in ("all", "export"):
        export(args, data)


if __name__ == "__main__":
    main()
