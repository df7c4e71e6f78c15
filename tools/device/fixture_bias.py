# fixture_bias.py SPECS.json - runs ../shared/tools/make_fixtures.py (beside this file on the
# device, carried) with random non-zero linear biases, so that a qwen2 fixture's q/k/v biases
# are exercised (transformers initialises them to zero).
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import make_fixtures as mf
_real = mf.AutoModelForCausalLM.from_config
def _with_bias(cfg, **kw):
    m = _real(cfg, **kw)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.1)
    return m
mf.AutoModelForCausalLM.from_config = _with_bias
sys.argv = ["make_fixtures.py", sys.argv[1]]
mf.main()
