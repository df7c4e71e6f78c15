# gen.py - the gemma fixtures made for lumen (tests/data/gemma), and the
# transformers sources their semantics were read from.
#
# Runs where torch + transformers 5.17 are installed (the GPU machine), next
# to a copy of ../shared/tools/make_fixtures.py (or with MAKE_FIXTURES_DIR
# naming its folder):
#   python3 gen.py specs.json        -> $OUT/gemx.tar.gz, $OUT/src.tar.gz
# specs.json: gemma3-x (linear rope on global layers, final and attention
# soft-capping, GQA 2, D = 96), gemma4-x (KV sharing, attention_k_eq_v,
# double-wide MLP, per-layer inputs, final soft-capping), gemma4-y (no
# per-layer inputs, default layer types) and gemma3-mm (the multimodal gemma3
# wrapper, text part); specs2.json: gemma3-mm-cap and gemma4-mm (the
# multimodal wrappers with soft-capping configured), gemma3-bias (attention
# biases, untied head, erf gelu, MHA) and gemma4-z (default rope on global
# layers, random layer scalars). tests/data/gemma keeps gemma3-x and gemma4-x with only
# their 300-token prompt (renamed prompt0) to stay small.
#
# make_fixtures' own make_config would put vocab_size on the multimodal
# config's top level; the multimodal specs set text_config.vocab_size themselves.
import os, sys, tarfile, traceback

sys.path.insert(0, os.environ.get("MAKE_FIXTURES_DIR", os.path.dirname(os.path.abspath(__file__))))
OUT = os.environ.get("OUT", "/tmp/out")

import transformers  # noqa: E402

base = os.path.dirname(transformers.__file__)
with tarfile.open(os.path.join(OUT, "src.tar.gz"), "w:gz") as t:
    for f in ["models/gemma3/modeling_gemma3.py", "models/gemma3/configuration_gemma3.py",
              "models/gemma4/modeling_gemma4.py", "models/gemma4/configuration_gemma4.py",
              "modeling_rope_utils.py", "masking_utils.py", "cache_utils.py", "configuration_utils.py",
              "activations.py", "integrations/sdpa_attention.py", "models/auto/modeling_auto.py"]:
        p = os.path.join(base, f)
        if os.path.exists(p):
            t.add(p, arcname=f)

import make_fixtures as mf  # noqa: E402
from transformers import AutoConfig  # noqa: E402

orig = mf.make_config


def make_config(spec, vocab):
    if spec["model_type"] not in ("gemma3", "gemma4"):
        return orig(spec, vocab)
    cfg = AutoConfig.for_model(spec["model_type"], **spec["config"])
    for c in (cfg, cfg.text_config):
        for k, v in (("bos_token_id", None), ("eos_token_id", 2), ("pad_token_id", 0)):
            try:
                setattr(c, k, v)
            except Exception:
                traceback.print_exc()
    return cfg


mf.make_config = make_config

# Biases and gemma4's layer scalars are initialised to 0 and 1; give them
# random values (as make_fixtures does for norms) so that a wrong use shows.
import torch  # noqa: E402

_from_config = mf.AutoModelForCausalLM.from_config


def from_config(cfg, **kw):
    model = _from_config(cfg, **kw)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.05)
        for n, b in model.named_buffers():
            if n.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand_like(b))
    return model


mf.AutoModelForCausalLM.from_config = from_config
sys.argv = [sys.argv[0], sys.argv[1]]
mf.main()
