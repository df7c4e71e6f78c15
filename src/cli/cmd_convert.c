/* cmd_convert.c - `lumen convert HF_DIR OUT.gguf [--type T]`: a Hugging Face
 * folder as the GGUF file llama.cpp's converter would write. */
#include <stdio.h>

#include "../convert/lm_convert.h"
#include "cli.h"

typedef struct convert_opts {
    const char *dir, *out;
    int mix; /* lm_mix_id */
    int threads;
} convert_opts;

static const lm_opt k_opts[] = {
    { LM_OPT_ARG, "HF_DIR", NULL, LM_OPT_AT(convert_opts, dir), NULL,
      "the model folder: config.json, safetensors, tokenizer.json (+ tokenizer_config.json, chat template)" },
    { LM_OPT_ARG, "OUT", NULL, LM_OPT_AT(convert_opts, out), NULL, "the .gguf file to write" },
    { LM_OPT_CHOICE, "--type", NULL, LM_OPT_AT(convert_opts, mix), NULL,
      "the type of the matrices (any case): a plain type, or a quantisation mix as lumen quantize applies it",
      .choices = lm_cli_mix_choices },
    { LM_OPT_INT, "--threads", "-t", LM_OPT_AT(convert_opts, threads), "N", "threads converting rows",
      .dflt = "every core", .ilo = 0, .ihi = 4096 },
    { .kind = LM_OPT_END },
};

static const convert_opts k_defaults = { .mix = LM_MIX_BF16 };

static const lm_opt_cmd k_cmd = {
    .name = "convert",
    .usage = "lumen convert HF_DIR OUT [--type T]",
    .about = "Writes the model as llama.cpp's convert_hf_to_gguf.py does: its metadata keys,\n"
             "tensor names and order, llama's q/k rows permuted for GGML's rope, 1-D\n"
             "tensors and norms in F32, the tokenizer (byte-level BPE: tokenizer.ggml.model\n"
             "gpt2, with tokens, token types, merges, pre-tokenizer and special ids) and\n"
             "the chat template. Architectures: llama, mistral, qwen2, qwen3 (default\n"
             "rope; llama3 rope scaling as rope_freqs.weight), qwen3_moe (experts stacked\n"
             "per layer, the router in F32), qwen3_next (in_proj_qkvz split into q|k|v and\n"
             "z, the shared expert and its gate) and the Qwen3.5 hybrids\n"
             "(qwen3_5_text and qwen3_5_moe_text, or the text model of a multimodal\n"
             "qwen3_5 / qwen3_5_moe checkpoint: its norms as 1 + w, A_log as\n"
             "-exp(A_log), value heads in tiled order, fused experts split into\n"
             "gate and up stacks, the MTP head as llama.cpp's nextn layer). Prints\n"
             "one line: tensors, bytes in and out, the count of each type.\n",
    .opts = k_opts,
    .defaults = &k_defaults,
    .size = sizeof(convert_opts),
};

int lm_cmd_convert(int argc, char **argv) {
    convert_opts o;
    lm_cli_mix_case(argc, argv);
    int parsed = lm_opts_parse(&k_cmd, &o, argc, argv);
    if (parsed >= 0) return parsed;
    if (!o.dir || !o.out) {
        fprintf(stderr, "lumen convert: HF_DIR and OUT are required (see lumen convert --help)\n");
        return 2;
    }
    const lm_quant_mix *mix = lm_cli_mix(o.mix);
    lm_err e = { { 0 } };
    lm_quantize_report rep;
    if (lm_convert_hf(o.dir, o.out, mix, o.threads, &rep, &e) != 0) {
        fprintf(stderr, "lumen: %s\n", e.msg);
        return 1;
    }
    lm_cli_print_report(o.out, mix, &rep);
    return 0;
}
