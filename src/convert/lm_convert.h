/* lm_convert.h - a Hugging Face folder into a GGUF file as llama.cpp's
 * convert_hf_to_gguf.py writes it (lumen convert, and lumen quantize of a
 * folder): its metadata keys, tensor names and order, the llama q/k row
 * permutation, the tokenizer and chat template metadata.
 *
 * Covered: model_type llama / mistral (GGUF arch llama), qwen2, qwen3,
 * qwen3_moe (one tensor per expert stacked per layer: ffn_*_exps), the
 * hybrids qwen3_next, qwen3_5_text / qwen3_5 and qwen3_5_moe (GGUF archs
 * qwen3next, qwen35, qwen35moe: convert_hybrid.c), and gemma3 / gemma4
 * (convert_gemma.c), with byte-level BPE tokenizers (tokenizer.ggml.model
 * gpt2) and SentencePiece-style ones (llama, gemma4: convert_vocab.c).
 * Anything else is refused with a message naming what is missing. */
#ifndef LM_CONVERT_H
#define LM_CONVERT_H

#include "../format/gguf_write.h"
#include "../quant/lm_quantize.h"

/* Writes dir's model to out with each tensor in the type mix gives it: 1-D
 * tensors and norms F32 (as llama.cpp's converter stores them), the others
 * the mix's type (a plain mix) or, for a quantised mix, llama-quantize's
 * choice on top of that; rows are converted on up to `threads` threads
 * (<= 0: every core). */
int lm_convert_hf(const char *dir, const char *out, const lm_quant_mix *mix, int threads, lm_quantize_report *rep,
                  lm_err *e);

/* Internal to src/convert: the tokenizer's metadata (tokenizer.ggml.* and
 * tokenizer.chat_template) of folder dir, for a vocabulary of vocab_size,
 * in the form llama.cpp reads for GGUF architecture arch (a
 * SentencePiece-style tokenizer: "gemma4" for gemma4, else "llama"). */
int lm_convert_vocab(lm_gguf_writer *w, const char *dir, const char *arch, int vocab_size, lm_err *e);

#endif
