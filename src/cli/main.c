/* main.c - the lumen command line: dispatch to one subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const char *const k_usage =
    "usage: lumen <command> [options]\n"
    "\n"
    "commands:\n"
    "  run      generate from a model: text (-p \"text\") or token ids (--prompt-ids 1,2,3)\n"
    "  chat     chat with a model in the terminal, streaming its answers\n"
    "  parity   check a model folder against its reference.safetensors\n"
    "  bench    measure prefill and decode speed of a model\n"
    "  check-template  render a chat template's JSONL cases and compare (TEMPLATE CASES.jsonl)\n"
    "  tokenize print the token ids of a text (-m MODEL \"text\")\n"
    "  check-tokenizer  compare a tokenizer with expected cases (DIR CASES.jsonl)\n"
    "  quantize write a GGUF in a quantisation mix (IN OUT --type Q4_K_M|Q8_0|...)\n"
    "  convert  write a Hugging Face folder as a GGUF file (DIR OUT.gguf --type BF16|Q8_0|...)\n"
    "  eval     perplexity of a text, and KL / top-1 against a reference model\n"
    "  serve    serve a model over an OpenAI-compatible HTTP API (-m MODEL)\n"
    "  bench-serve  benchmark OpenAI-compatible servers: paired AB/BA blocks, intervals (node)\n"
    "  report   a bench-serve results file as an HTML page (--html OUT) or Markdown\n"
    "  version  print the version\n"
    "\n"
    "MODEL is a Hugging Face folder (config.json + safetensors) or a .gguf file;\n"
    "without -m, run, chat and serve use the bundled demo model (models/demo).\n"
    "Run `lumen <command> --help` for the options of a command.\n";

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        fputs(k_usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "run")) return lm_cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "chat")) return lm_cmd_chat(argc - 1, argv + 1);
    if (!strcmp(cmd, "parity")) return lm_cmd_parity(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return lm_cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "check-template")) return lm_cmd_check_template(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return lm_cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "check-tokenizer")) return lm_cmd_check_tokenizer(argc - 1, argv + 1);
    if (!strcmp(cmd, "quantize")) return lm_cmd_quantize(argc - 1, argv + 1);
    if (!strcmp(cmd, "convert")) return lm_cmd_convert(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return lm_cmd_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return lm_cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench-serve")) return lm_cmd_bench_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "report")) return lm_cmd_report(argc - 1, argv + 1);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("lumen %s\n", LM_VERSION);
        return 0;
    }
    fprintf(stderr, "lumen: unknown command \"%s\"\n\n%s", cmd, k_usage);
    return 2;
}
