# conv_gguf.py LLAMACPP_DIR [--gpt2-vocab] ARGS... - llama.cpp's convert_hf_to_gguf.py for the
# test fixtures. Their tokenizer is a byte-level BPE trained for the project (Qwen-style split
# regex), whose hash llama.cpp's pre-tokenizer table does not know: declare it "qwen2".
# --gpt2-vocab also writes that BPE vocabulary for architectures whose converter insists on a
# SentencePiece-style one (gemma4), so that tiny fixtures of them convert at all.
import runpy, sys
LC = sys.argv[1]
args = sys.argv[2:]
gpt2 = "--gpt2-vocab" in args
args = [a for a in args if a != "--gpt2-vocab"]
sys.argv = ["convert_hf_to_gguf.py"] + args
sys.path[:0] = [LC, LC + "/gguf-py"]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
if gpt2:
    import conversion.gemma as gemma
    gemma.Gemma4Model.set_vocab = base.TextModel._set_vocab_gpt2
runpy.run_path(LC + "/convert_hf_to_gguf.py", run_name="__main__")
