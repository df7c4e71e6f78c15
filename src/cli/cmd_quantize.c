/* cmd_quantize.c - `lumen quantize IN OUT --type MIX`: a GGUF file or a
 * Hugging Face folder into a quantised GGUF with llama-quantize's
 * per-tensor mixes; also the mix names and the summary line that
 * `lumen convert` shares. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../convert/lm_convert.h"
#include "cli.h"

typedef struct quantize_opts {
    const char *in, *out;
    int mix; /* lm_mix_id */
    int threads;
} quantize_opts;

const lm_opt_choice lm_cli_mix_choices[] = {
    { "Q4_K_M", LM_MIX_Q4_K_M }, { "Q4_K_S", LM_MIX_Q4_K_S }, { "Q5_K_M", LM_MIX_Q5_K_M },
    { "Q5_K_S", LM_MIX_Q5_K_S }, { "Q6_K", LM_MIX_Q6_K },     { "Q8_0", LM_MIX_Q8_0 },
    { "Q4_0", LM_MIX_Q4_0 },     { "IQ4_XS", LM_MIX_IQ4_XS }, { "BF16", LM_MIX_BF16 },
    { "F16", LM_MIX_F16 },       { "F32", LM_MIX_F32 },       { NULL, 0 },
};

static const lm_opt k_opts[] = {
    { LM_OPT_ARG, "IN", NULL, LM_OPT_AT(quantize_opts, in), NULL,
      "the model: a .gguf file of any type lumen reads, or a Hugging Face folder (converted as lumen convert "
      "does)" },
    { LM_OPT_ARG, "OUT", NULL, LM_OPT_AT(quantize_opts, out), NULL, "the .gguf file to write" },
    { LM_OPT_CHOICE, "--type", NULL, LM_OPT_AT(quantize_opts, mix), NULL, "the quantisation mix (any case)",
      .choices = lm_cli_mix_choices },
    { LM_OPT_INT, "--threads", "-t", LM_OPT_AT(quantize_opts, threads), "N", "threads converting rows",
      .dflt = "every core", .ilo = 0, .ihi = 4096 },
    { .kind = LM_OPT_END },
};

static const quantize_opts k_defaults = { .mix = LM_MIX_Q4_K_M };

static const lm_opt_cmd k_cmd = {
    .name = "quantize",
    .usage = "lumen quantize IN OUT [--type MIX]",
    .about = "Writes OUT with each tensor in the type llama-quantize's rules give it under\n"
             "MIX: norms and other 1-D tensors are kept as they are; output.weight (or\n"
             "a tied token_embd) gets Q6_K (Q8_0 under Q8_0); Q4_K_M and Q5_K_M give\n"
             "attn_v and ffn_down Q6_K in the first and last eighth of the layers and\n"
             "every third layer between; Q4_K_S gives the first four attn_v and the\n"
             "first eighth's ffn_down Q5_K, IQ4_XS the first eighth's ffn_down (and\n"
             "attn_v when 4+ query heads share a kv head). Rows a K-quant block does\n"
             "not divide fall back to IQ4_NL, Q5_0, Q5_1 or Q8_0 as llama.cpp's do,\n"
             "or F16. Metadata is copied, with general.file_type set. Prints one\n"
             "line: tensors, bytes in and out, and the count of each type.\n",
    .opts = k_opts,
    .defaults = &k_defaults,
    .size = sizeof(quantize_opts),
};

int lm_cmd_quantize(int argc, char **argv) {
    quantize_opts o;
    lm_cli_mix_case(argc, argv);
    int parsed = lm_opts_parse(&k_cmd, &o, argc, argv);
    if (parsed >= 0) return parsed;
    if (!o.in || !o.out) {
        fprintf(stderr, "lumen quantize: IN and OUT are required (see lumen quantize --help)\n");
        return 2;
    }
    const lm_quant_mix *mix = lm_cli_mix(o.mix);
    lm_err e = { { 0 } };
    lm_quantize_report rep;
    struct stat sb;
    bool folder = stat(o.in, &sb) == 0 && S_ISDIR(sb.st_mode);
    int rc = folder ? lm_convert_hf(o.in, o.out, mix, o.threads, &rep, &e) : lm_quantize_gguf(o.in, o.out, mix, o.threads, &rep, &e);
    if (rc != 0) {
        fprintf(stderr, "lumen: %s\n", e.msg);
        return 1;
    }
    lm_cli_print_report(o.out, mix, &rep);
    return 0;
}

void lm_cli_mix_case(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--type") || !lm_quant_mix_find(argv[i + 1])) continue;
        for (char *c = argv[i + 1]; *c; c++) *c = (char)toupper((unsigned char)*c);
    }
}

const lm_quant_mix *lm_cli_mix(int id) {
    for (const lm_opt_choice *c = lm_cli_mix_choices; c->name; c++) {
        if (c->value == id) return lm_quant_mix_find(c->name);
    }
    LM_ASSERT(!"a mix id outside the table");
    return NULL;
}

void lm_cli_print_report(const char *out, const lm_quant_mix *mix, const lm_quantize_report *rep) {
    printf("%s: %s, %d tensors (%d converted), %.2f MiB -> %.2f MiB:", out, mix->name, rep->n_tensors,
           rep->n_requantised, (double)rep->bytes_in / (1 << 20), (double)rep->bytes_out / (1 << 20));
    for (int t = 0; t < LM_DTYPE_COUNT; t++) {
        if (rep->count_by_type[t]) printf(" %s %d", lm_dtype_name((lm_dtype)t), rep->count_by_type[t]);
    }
    printf("\n");
}
