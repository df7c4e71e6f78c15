/* test_cli_options.c - the option tables of src/cli/options.h: every kind of
 * value, both sides of every range, the error lines, --help from the table;
 * then every subcommand of the binary still takes every option it took
 * before the tables, and lists it in its --help. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/options.h"
#include "lm_test.h"
#include "test_util.h"

typedef struct sub_opts {
    int k;
    float p;
} sub_opts;

typedef struct tst_opts {
    bool flag;
    int i;
    int64_t big;
    uint64_t seed;
    float f;
    double d;
    size_t bytes;
    const char *s, *name;
    int color;
    int dev, gpu;
    const char *first, *second;
    sub_opts sub;
} tst_opts;

/* "cpu" or "gpu:N", as --device does */
static bool parse_dev(void *dst, const char *v) {
    tst_opts *o = dst;
    long long n;
    if (!strcmp(v, "cpu")) o->dev = 0, o->gpu = 0;
    else if (!strncmp(v, "gpu:", 4) && lm_opt_int(v + 4, 0, 7, &n)) o->dev = 1, o->gpu = (int)n;
    else return false;
    return true;
}

static const lm_opt_choice k_colors[] = { { "red", 10 }, { "green", 20 }, { NULL, 0 } };

static const lm_opt k_sub[] = {
    { LM_OPT_INT, "--k", NULL, LM_OPT_AT(sub_opts, k), "K", "sub int", .ilo = 0, .ihi = 9 },
    { LM_OPT_FLOAT, "--p", NULL, LM_OPT_AT(sub_opts, p), "P", "sub float", .lo = 0, .lo_open = true, .hi = 1 },
    { .kind = LM_OPT_END },
};

static const lm_opt k_tst[] = {
    { LM_OPT_ARG, "FIRST", NULL, LM_OPT_AT(tst_opts, first), NULL, "first argument" },
    { LM_OPT_FLAG, "--flag", "-f", LM_OPT_AT(tst_opts, flag), NULL, "a flag" },
    { LM_OPT_INT, "--int", "-i", LM_OPT_AT(tst_opts, i), "N", "an int", .ilo = -3, .ihi = 100 },
    { LM_OPT_INT, "--big", NULL, LM_OPT_AT(tst_opts, big), "N", "a 64-bit int", .ilo = 1, .ihi = 4102444800LL },
    { LM_OPT_INT, "--seed", NULL, LM_OPT_AT(tst_opts, seed), "S", "an unsigned 64-bit int", .ilo = 0,
      .ihi = INT64_MAX },
    { LM_OPT_FLOAT, "--float", NULL, LM_OPT_AT(tst_opts, f), "X", "a float", .lo = 0, .hi = INFINITY },
    { LM_OPT_FLOAT, "--double", NULL, LM_OPT_AT(tst_opts, d), "X", "a double", .lo = 0, .hi = 1, .hi_open = true },
    { LM_OPT_SIZE, "--bytes", NULL, LM_OPT_AT(tst_opts, bytes), "SIZE", "a size", "all of it", .ilo = 1 },
    { LM_OPT_STRING, "--str", "-s", LM_OPT_AT(tst_opts, s), "TEXT", "a string" },
    { LM_OPT_STRING, "--name", NULL, LM_OPT_AT(tst_opts, name), "NAME", "a string, not empty", .ilo = 1 },
    { LM_OPT_CHOICE, "--color", NULL, LM_OPT_AT(tst_opts, color), NULL, "a choice", .choices = k_colors },
    { LM_OPT_CUSTOM, "--dev", NULL, LM_OPT_AT(tst_opts, dev), "DEV", "a custom value", "cpu", .parse = parse_dev,
      .want = "cpu or gpu:N" },
    { LM_OPT_GROUP, .off = offsetof(tst_opts, sub), .group = k_sub },
    { LM_OPT_ARG, "SECOND", NULL, LM_OPT_AT(tst_opts, second), NULL, "second argument" },
    { .kind = LM_OPT_END },
};

typedef struct parsed {
    int rc;
    tst_opts o;
    char *out, *err;
} parsed;

/* Parses the space-separated words of line (argv[0] "tst" added). */
static parsed run_parse(const char *line) {
    static const tst_opts defaults = { .i = 5, .big = 7, .f = 0.5f, .d = 0.25, .color = 20, .sub = { .k = 3, .p = 1 } };
    const lm_opt_cmd cmd = { .name = "tst", .usage = "lumen tst [options] FIRST [SECOND]", .about = "Tests tables.\n",
                             .opts = k_tst, .epilog = "The end.\n", .defaults = &defaults, .size = sizeof defaults };
    char buf[512], *argv[32] = { "tst" };
    int argc = 1;
    snprintf(buf, sizeof buf, "%s", line);
    for (char *w = strtok(buf, " "); w && argc < 32; w = strtok(NULL, " ")) argv[argc++] = !strcmp(w, "''") ? "" : w;
    parsed p = { 0 };
    size_t on, en;
    FILE *out = open_memstream(&p.out, &on), *err = open_memstream(&p.err, &en);
    p.rc = lm_opts_parse_io(&cmd, &p.o, argc, argv, out, err);
    fclose(out);
    fclose(err);
    /* strings point into buf: keep only whether they were set */
    if (p.o.s) p.o.s = "set";
    if (p.o.first) p.o.first = strcmp(p.o.first, "a") ? "other" : "a";
    if (p.o.second) p.o.second = strcmp(p.o.second, "b") ? "other" : "b";
    if (p.o.name) p.o.name = "set";
    return p;
}

static void parsed_free(parsed *p) {
    free(p->out);
    free(p->err);
}

LM_TEST(cli_options_each_kind) {
    parsed p = run_parse("");
    LM_CHECK(p.rc == -1 && p.o.i == 5 && p.o.big == 7 && p.o.color == 20 && p.o.sub.k == 3 && !p.o.flag);
    parsed_free(&p);
    p = run_parse("a -f --int -3 --big 4102444800 --seed 9223372036854775807 --float 2.5 --double 0.75 "
                  "--bytes 1536KiB -s x --name n --color red --dev gpu:3 --k 9 --p 1 b");
    LM_CHECK_MSG(p.rc == -1, "rc %d: %s", p.rc, p.err);
    LM_CHECK(p.o.flag && p.o.i == -3 && p.o.big == 4102444800LL && p.o.seed == (uint64_t)INT64_MAX);
    LM_CHECK(p.o.f == 2.5f && p.o.d == 0.75 && p.o.bytes == 1536u * 1024u);
    LM_CHECK(lm_streq(p.o.s, "set") && lm_streq(p.o.name, "set") && p.o.color == 10);
    LM_CHECK(p.o.dev == 1 && p.o.gpu == 3 && p.o.sub.k == 9 && p.o.sub.p == 1.0f);
    LM_CHECK(lm_streq(p.o.first, "a") && lm_streq(p.o.second, "b"));
    parsed_free(&p);
    /* the last of a repeated option wins; aliases; "--" ends the options; "-" is an argument */
    p = run_parse("-i 1 --int 2 -i 4 -- -f -");
    LM_CHECK(p.rc == -1 && p.o.i == 4 && !p.o.flag && lm_streq(p.o.first, "other") && lm_streq(p.o.second, "other"));
    parsed_free(&p);
    /* a value is the next argument, even one that looks like an option */
    p = run_parse("--str --flag");
    LM_CHECK(p.rc == -1 && lm_streq(p.o.s, "set") && !p.o.flag);
    parsed_free(&p);
    p = run_parse("--size 512M");
    LM_CHECK(p.rc == 2); /* no prefix matching */
    parsed_free(&p);
}

/* Each limit from both sides, and the one error line each failure gives. */
LM_TEST(cli_options_ranges_and_errors) {
    static const struct {
        const char *args;
        int rc;
        const char *err; /* NULL: accepted */
    } k_cases[] = {
        { "--int -4", 2, "lumen tst: bad value for --int '-4': it is not a whole number from -3 to 100\n" },
        { "--int -3", -1, NULL },
        { "--int 100", -1, NULL },
        { "-i 101", 2, "lumen tst: bad value for -i '101': it is not a whole number from -3 to 100\n" },
        { "--int 1.5", 2, "bad value for --int '1.5'" },
        { "--int ''", 2, "bad value for --int ''" },
        { "--big 0", 2, "from 1 to 4102444800" },
        { "--big 4102444801", 2, "from 1 to 4102444800" },
        { "--seed -1", 2, "from 0 to 9223372036854775807" },
        { "--seed 9223372036854775808", 2, "from 0 to 9223372036854775807" },
        { "--float -0.001", 2, "it is not a number >= 0" },
        { "--float 0", -1, NULL },
        { "--float nan", 2, "it is not a number >= 0" },
        { "--double 1", 2, "it is not a number in [0, 1)" },
        { "--double 0.999", -1, NULL },
        { "--p 0", 2, "it is not a number in (0, 1]" },
        { "--p 1e-9", -1, NULL },
        { "--bytes 0", 2, "it is not a size above 0" },
        { "--bytes 1", -1, NULL },
        { "--bytes 1.5G", 2, "bad value for --bytes '1.5G': it is not a size" },
        { "--bytes 4GG", 2, "it is not a size" },
        { "--name ''", 2, "bad value for --name '': it is empty" },
        { "--str ''", -1, NULL },
        { "--color blue", 2, "it is not one of red, green\n" },
        { "--dev gpu:8", 2, "bad value for --dev 'gpu:8': it is not cpu or gpu:N\n" },
        { "--k 10", 2, "it is not a whole number from 0 to 9" },
        { "--int", 2, "lumen: option --int needs a value\n" },
        { "-s", 2, "lumen: option -s needs a value\n" },
        { "--nope", 2, "lumen tst: unknown option --nope (see lumen tst --help)\n" },
        { "-x", 2, "unknown option -x" },
        { "a b c", 2, "lumen tst: unexpected argument c (see lumen tst --help)\n" },
    };
    for (size_t i = 0; i < LM_COUNT(k_cases); i++) {
        parsed p = run_parse(k_cases[i].args);
        LM_CHECK_MSG(p.rc == k_cases[i].rc, "%s: rc %d", k_cases[i].args, p.rc);
        if (k_cases[i].err) {
            /* one line, holding the text (a line from its start when that starts with "lumen") */
            const char *want = k_cases[i].err, *at = p.err ? strstr(p.err, want) : NULL;
            const char *nl = p.err ? strchr(p.err, '\n') : NULL;
            LM_CHECK_MSG(at && (strncmp(want, "lumen", 5) || at == p.err) && nl && !nl[1], "%s: '%s'",
                         k_cases[i].args, p.err ? p.err : "");
        } else {
            LM_CHECK_MSG(p.err && !p.err[0], "%s: '%s'", k_cases[i].args, p.err ? p.err : "");
        }
        LM_CHECK(p.out && !p.out[0]);
        parsed_free(&p);
    }
}

/* --help is the table: every entry, spelled as parsed, with the default it
 * starts from (not a value given before --help), wrapped to 80 columns. */
LM_TEST(cli_options_help_lists_every_entry) {
    parsed p = run_parse("--int 42 -h --nope");
    LM_CHECK(p.rc == 0 && p.err && !p.err[0]);
    LM_REQUIRE(p.out);
    const char *o = p.out;
    const char *top = "usage: lumen tst [options] FIRST [SECOND]\n\nTests tables.\n\n";
    LM_CHECK(!strncmp(o, top, strlen(top)));
    LM_CHECK(strstr(o, "\nThe end.\n"));
    static const char *const k_lines[] = {
        "  FIRST ", "  -f, --flag ", "  -i, --int N ", "an int (default 5)", "  --big N ", "(default 7)",
        "  --seed S ", "  --float X ", "a float (default 0.5)", "  --double X ", "(default 0.25)",
        "  --bytes SIZE ", "a size (default: all of it)", "  -s, --str TEXT ", "  --name NAME ",
        "  --color red|green ", "a choice (default green)", "  --dev DEV ", "a custom value (default: cpu)",
        "  --k K ", "sub int (default 3)", "  --p P ", "sub float (default 1)", "  SECOND ",
    };
    for (size_t i = 0; i < LM_COUNT(k_lines); i++)
        LM_CHECK_MSG(strstr(o, k_lines[i]), "no '%s' in:\n%s", k_lines[i], o);
    LM_CHECK(!strstr(o, "42"));
    /* every entry of the table (and its group) has its line */
    int entries = 0, lines_with_name = 0;
    for (const lm_opt *t = k_tst; t->kind != LM_OPT_END; t++) {
        const lm_opt *g = t->kind == LM_OPT_GROUP ? t->group : t;
        for (; g->kind != LM_OPT_END; g++) {
            char want[64];
            snprintf(want, sizeof want, "%s%s%s", g->alias ? g->alias : "", g->alias ? ", " : "", g->name);
            entries++;
            lines_with_name += strstr(o, want) != NULL;
            if (t->kind != LM_OPT_GROUP) break;
        }
    }
    LM_CHECK(entries == 15 && lines_with_name == entries);
    for (const char *l = o; *l;) {
        const char *nl = strchr(l, '\n');
        size_t n = nl ? (size_t)(nl - l) : strlen(l);
        LM_CHECK_MSG(n <= 80, "line of %zu: %.*s", n, (int)n, l);
        l += n + (nl != NULL);
    }
    parsed_free(&p);
}

/* The help spells the option as a word: " -m," or " --model ". */
static bool names(const char *help, const char *opt) {
    char a[64], b[64];
    snprintf(a, sizeof a, " %s ", opt);
    snprintf(b, sizeof b, " %s,", opt);
    return help && (strstr(help, a) || strstr(help, b));
}

/* Every option each subcommand took before the tables (as of issue #24):
 * --help names it, and the command still takes it. A value option given
 * last asks for its value; a flag followed by an unknown option gets as far
 * as that one. */
LM_TEST(cli_options_every_command_keeps_its_options) {
    static const char *const k_common[] = { "-t", "--threads", "--isa", "--device", "--gpu-memory", NULL };
    static const char *const k_sampling[] = { "--temp", "--top-k", "--top-p", "--min-p", "--seed", NULL };
    static const struct {
        const char *cmd;
        const char *values[20];
        const char *flags[4];
        bool common, sampling;
    } k_cmds[] = {
        { "run", { "-m", "--model", "-p", "--prompt", "--prompt-ids", "-n", "--ctx" }, { "--ignore-eos" }, true, true },
        { "chat", { "-m", "--model", "--system", "-n", "--ctx" }, { "--no-think" }, true, true },
        { "serve",
          { "-m", "--model", "--alias", "--host", "--port", "--api-key", "--ctx", "--parallel", "--max-queue",
            "--timeout", "--max-body-mb", "--max-connections", "--cache-ram", "--trace", "--look-ahead",
            "--step-tokens", "--prefill-tokens" },
          { "--quiet" }, true, false },
        { "parity", { "--tol" }, { NULL }, true, false },
        { "bench", { "-m", "--model", "--prompt-len", "--gen", "--reps", "--chunk", "--batch" },
          { "--no-look-ahead", "--no-membw" }, true, false },
        { "tokenize", { "-m", "--model", "--file", "--decode", "--bench", "--reps" },
          { "--no-special", "--paragraphs" }, false, false },
        { "check-tokenizer", { NULL }, { NULL }, false, false },
        { "check-template", { "--now" }, { "--verbose" }, false, false },
    };
    for (size_t c = 0; c < LM_COUNT(k_cmds); c++) {
        char cmd[1024], *out = NULL, *err = NULL;
        snprintf(cmd, sizeof cmd, "'%s' %s --help", lm_test_lumen_bin(), k_cmds[c].cmd);
        int rc = lm_tu_run(cmd, &out, &err);
        char head[64];
        snprintf(head, sizeof head, "usage: lumen %s", k_cmds[c].cmd);
        LM_CHECK_MSG(rc == 0 && out && !strncmp(out, head, strlen(head)), "%s --help: exit %d", k_cmds[c].cmd, rc);
        const char *const *lists[4] = { k_cmds[c].values, k_common, k_sampling, k_cmds[c].flags };
        for (int l = 0; l < 4; l++) {
            if ((l == 1 && !k_cmds[c].common) || (l == 2 && !k_cmds[c].sampling)) continue;
            for (const char *const *o = lists[l]; *o; o++) {
                LM_CHECK_MSG(names(out, *o), "%s --help has no %s", k_cmds[c].cmd, *o);
                char *e2 = NULL;
                snprintf(cmd, sizeof cmd, "'%s' %s %s%s", lm_test_lumen_bin(), k_cmds[c].cmd, *o,
                         l == 3 ? " --zz-unknown" : "");
                rc = lm_tu_run(cmd, NULL, &e2);
                const char *want = l == 3 ? "unknown option --zz-unknown" : "needs a value";
                LM_CHECK_MSG(rc == 2 && e2 && strstr(e2, want), "%s %s: exit %d, '%s'", k_cmds[c].cmd, *o, rc,
                             e2 ? e2 : "");
                free(e2);
            }
        }
        free(out);
        free(err);
    }
}

/* Parses one line of options (words split at spaces) with the table opts
 * into dst (size bytes, starting from defaults) as a command named "tst"
 * would; lm_opts_parse_io's result (-1: parsed, go on). */
static int parse_line(const lm_opt *opts, const void *defaults, void *dst, size_t size, const char *line) {
    const lm_opt_cmd cmd = { .name = "tst", .usage = "lumen tst [options]", .about = "Options.\n",
                             .opts = opts, .defaults = defaults, .size = size };
    char buf[256], *argv[16] = { "tst" };
    int argc = 1;
    snprintf(buf, sizeof buf, "%s", line);
    for (char *w = strtok(buf, " "); w && argc < 16; w = strtok(NULL, " ")) argv[argc++] = w;
    FILE *null = fopen("/dev/null", "w");
    const int rc = lm_opts_parse_io(&cmd, dst, argc, argv, null, null);
    fclose(null);
    return rc;
}

/* The KV format a command gets: bf16 on both sides unless given; a side
 * given alone keeps the other's default, and --kv-k/--kv-v after
 * --kv-type override its side. */
static lm_kv_types kv_parse(const char *line) {
    static const lm_kv_types defaults = LM_CLI_KV_DEFAULT;
    lm_kv_types kv;
    if (parse_line(lm_cli_kv_opts, &defaults, &kv, sizeof kv, line) != -1) kv.k = kv.v = (lm_kv_type)-1;
    return kv;
}

LM_TEST(cli_kv_default_is_bf16) {
    lm_kv_types kv = kv_parse("");
    LM_CHECK(kv.k == LM_KV_BF16 && kv.v == LM_KV_BF16);
    kv = kv_parse("--kv-v q4r");
    LM_CHECK(kv.k == LM_KV_BF16 && kv.v == LM_KV_Q4R);
    kv = kv_parse("--kv-type q8 --kv-k f32");
    LM_CHECK(kv.k == LM_KV_F32 && kv.v == LM_KV_Q8);
}

/* --gpu-precision: unset (the backend's own setting, exact unless
 * LUMEN_CUDA_GEMM=bf16), exact or bf16; anything else is refused. */
static int prec_parse(const char *line) {
    static const lm_common_opts defaults = { 0 };
    lm_common_opts co;
    return parse_line(lm_cli_common_opts, &defaults, &co, sizeof co, line) == -1 ? (int)co.gpu_precision : -1;
}

LM_TEST(cli_gpu_precision_choices) {
    LM_CHECK(prec_parse("") == LM_GPU_PREC_DEFAULT);
    LM_CHECK(prec_parse("--gpu-precision exact") == LM_GPU_PREC_EXACT);
    LM_CHECK(prec_parse("--gpu-precision bf16") == LM_GPU_PREC_BF16);
    LM_CHECK(prec_parse("--gpu-precision fp8") == -1);
}
