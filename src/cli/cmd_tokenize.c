/* cmd_tokenize.c - `lumen tokenize -m MODEL "text"`: the ids and tokens of a
 * text, as one JSON line. Also decodes ids (--decode 1,2,3) and measures
 * encode speed on a file (--bench FILE). */
#define _GNU_SOURCE /* memmem */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <time.h>

#include "../base/lm_file.h"
#include "../format/lm_source.h"
#include "../tokenizer/lm_tokenizer.h"
#include "cli.h"

typedef struct tokenize_opts {
    const char *text, *model, *file, *decode, *bench;
    bool no_special, paragraphs;
    int reps;
} tokenize_opts;

static const lm_opt k_opts[] = {
    { LM_OPT_ARG, "TEXT", NULL, LM_OPT_AT(tokenize_opts, text), NULL, "the text to tokenize" },
    { LM_OPT_STRING, "--model", "-m", LM_OPT_AT(tokenize_opts, model), "PATH", "the tokenizer" },
    { LM_OPT_FLAG, "--no-special", NULL, LM_OPT_AT(tokenize_opts, no_special), NULL,
      "do not add the post-processor's special tokens (bos ...)" },
    { LM_OPT_STRING, "--file", NULL, LM_OPT_AT(tokenize_opts, file), "PATH",
      "tokenize the contents of PATH instead of TEXT" },
    { LM_OPT_STRING, "--decode", NULL, LM_OPT_AT(tokenize_opts, decode), "IDS",
      "decode comma-separated ids instead (\"1,2,3\")" },
    { LM_OPT_STRING, "--bench", NULL, LM_OPT_AT(tokenize_opts, bench), "PATH",
      "encode PATH --reps times, print tokens/s (one thread); also decode speed, whole and one id at a time" },
    { LM_OPT_INT, "--reps", NULL, LM_OPT_AT(tokenize_opts, reps), "N", "repetitions for --bench, best is kept",
      .ilo = 1, .ihi = 1000 },
    { LM_OPT_FLAG, "--paragraphs", NULL, LM_OPT_AT(tokenize_opts, paragraphs), NULL,
      "with --bench: encode each \"\\n\\n\"-separated paragraph on its own (separators dropped) instead of one "
      "text" },
    { .kind = LM_OPT_END },
};

static const tokenize_opts k_defaults = { .reps = 3 };

static const lm_opt_cmd k_cmd = {
    .name = "tokenize",
    .usage = "lumen tokenize -m MODEL [options] [TEXT]",
    .about = "Prints {\"ids\": [...], \"tokens\": [...]} for TEXT (or the contents of\n"
             "--file). MODEL is a tokenizer.json, a folder holding one, or a .gguf file.\n",
    .opts = k_opts,
    .defaults = &k_defaults,
    .size = sizeof(tokenize_opts),
};

static int decode_ids(lm_tokenizer *tok, const char *list) {
    lm_tok_ids ids = { 0 };
    for (const char *p = list; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) {
            fprintf(stderr, "lumen tokenize: --decode needs comma-separated ids\n");
            lm_tok_ids_free(&ids);
            return 2;
        }
        ids.ids = realloc(ids.ids, (ids.n + 1) * sizeof *ids.ids);
        if (!ids.ids) abort();
        ids.ids[ids.n++] = (int32_t)v;
        p = *end == ',' ? end + 1 : end;
        if (*p && *end != ',') {
            fprintf(stderr, "lumen tokenize: --decode needs comma-separated ids\n");
            lm_tok_ids_free(&ids);
            return 2;
        }
    }
    lm_tok_str out = { 0 };
    lm_tokenizer_decode(tok, ids.ids, ids.n, false, &out);
    json_t *j = json_object();
    json_object_set_new(j, "text", json_stringn(out.s, out.len));
    char *s = json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII);
    puts(s);
    free(s);
    json_decref(j);
    lm_tok_str_free(&out);
    lm_tok_ids_free(&ids);
    return 0;
}

/* Encodes text whole, or paragraph by paragraph (split on "\n\n"). */
static void encode_all(lm_tokenizer *t, const char *text, size_t len, bool paras, lm_tok_ids *ids, lm_err *e) {
    if (!paras) {
        lm_tokenizer_encode(t, text, len, false, ids, e);
        return;
    }
    const char *p = text, *end = text + len;
    for (;;) {
        const char *q = memmem(p, (size_t)(end - p), "\n\n", 2);
        if (!q) q = end;
        lm_tokenizer_encode(t, p, (size_t)(q - p), false, ids, e);
        if (q == end) break;
        p = q + 2;
    }
}

/* CPU seconds of this process: steadier than wall time on a busy machine. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int bench(lm_tokenizer *tok, const char *path, long reps, const lm_source *model, double load_s,
                 bool paras) {
    lm_err e = { { 0 } };
    size_t len;
    char *text = lm_read_file(path, &len, &e);
    if (!text) {
        fprintf(stderr, "lumen tokenize: %s\n", e.msg);
        return 1;
    }
    double best = 1e30, best_cpu = 1e30;
    size_t ntok = 0;
    double dec_s = 0, stream_s = 0;
    uint32_t fnv = 0x811c9dc5; /* FNV-1a over the ids' bytes, to compare with tools/tokbench */
    for (long r = 0; r < reps; r++) {
        lm_tokenizer *fresh = NULL;
        if (r > 0 && lm_tokenizer_load_from(&fresh, model, &e)) { /* a cold cache every run */
            fprintf(stderr, "lumen tokenize: %s\n", e.msg);
            free(text);
            return 1;
        }
        lm_tokenizer *t = fresh ? fresh : tok;
        lm_tok_ids ids = { 0 };
        double t0 = lm_now(), c0 = cpu_now();
        encode_all(t, text, len, paras, &ids, &e);
        double dt = lm_now() - t0, dc = cpu_now() - c0;
        if (dt < best) best = dt;
        if (dc < best_cpu) best_cpu = dc;
        ntok = ids.n;
        if (r == 0) { /* decode speed, whole and streamed */
            lm_tok_str out = { 0 };
            double d0 = lm_now();
            lm_tokenizer_decode(t, ids.ids, ids.n, false, &out);
            dec_s = lm_now() - d0;
            lm_detok *stream = lm_detok_create(t, false);
            out.len = 0;
            d0 = lm_now();
            for (size_t i = 0; i < ids.n; i++) lm_detok_push(stream, ids.ids[i], &out);
            lm_detok_finish(stream, &out);
            stream_s = lm_now() - d0;
            lm_detok_free(stream);
            lm_tok_str_free(&out);
        }
        if (r == 0)
            for (size_t i = 0; i < ids.n; i++)
                for (int k = 0; k < 4; k++) fnv = (fnv ^ (((uint32_t)ids.ids[i] >> (8 * k)) & 255)) * 16777619u;
        lm_tok_ids_free(&ids);
        lm_tokenizer_free(fresh);
    }
    printf("{\"bytes\":%zu,\"tokens\":%zu,\"seconds\":%.4f,\"tokens_per_s\":%.0f,\"mb_per_s\":%.2f,"
           "\"load_seconds\":%.3f,\"ids_fnv1a\":\"%x\",\"decode_tokens_per_s\":%.0f,"
           "\"stream_decode_tokens_per_s\":%.0f,\"cpu_seconds\":%.4f,\"tokens_per_cpu_s\":%.0f}\n",
           len, ntok, best, ntok / best, len / best / 1e6, load_s, fnv, ntok / dec_s, ntok / stream_s,
           best_cpu, ntok / best_cpu);
    free(text);
    return 0;
}

int lm_cmd_tokenize(int argc, char **argv) {
    tokenize_opts o;
    int parsed = lm_opts_parse(&k_cmd, &o, argc, argv);
    if (parsed >= 0) return parsed;
    const char *model = o.model, *text = o.text, *file = o.file, *dec = o.decode, *bench_path = o.bench;
    const bool special = !o.no_special, paras = o.paragraphs;
    const long reps = o.reps;
    if (!model || (!text && !file && !dec && !bench_path)) {
        fprintf(stderr, "lumen tokenize: needs -m MODEL and a TEXT (see --help)\n");
        return 2;
    }
    lm_err e = { { 0 } };
    lm_tokenizer *tok;
    lm_source *src = NULL;
    double t0 = lm_now();
    if (lm_source_open(&src, model, &e) || lm_tokenizer_load_from(&tok, src, &e)) {
        fprintf(stderr, "lumen tokenize: %s\n", e.msg);
        lm_source_unref(src);
        return 1;
    }
    double load_s = lm_now() - t0;
    int rc = 0;
    if (dec) rc = decode_ids(tok, dec);
    else if (bench_path) rc = bench(tok, bench_path, reps, src, load_s, paras);
    else {
        size_t len;
        char *buf = NULL;
        if (file) {
            if (!(buf = lm_read_file(file, &len, &e))) {
                fprintf(stderr, "lumen tokenize: %s\n", e.msg);
                lm_tokenizer_free(tok);
                lm_source_unref(src);
                return 1;
            }
            text = buf;
        } else len = strlen(text);
        lm_tok_ids ids = { 0 };
        if (lm_tokenizer_encode(tok, text, len, special, &ids, &e)) {
            fprintf(stderr, "lumen tokenize: %s\n", e.msg);
            rc = 1;
        } else {
            json_t *j = json_object(), *ja = json_array(), *jt = json_array();
            for (size_t i = 0; i < ids.n; i++) {
                size_t l;
                const char *s = lm_tokenizer_id_to_token(tok, ids.ids[i], &l);
                json_array_append_new(ja, json_integer(ids.ids[i]));
                json_array_append_new(jt, s ? json_stringn(s, l) : json_null());
            }
            json_object_set_new(j, "ids", ja);
            json_object_set_new(j, "tokens", jt);
            char *s = json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII);
            puts(s);
            free(s);
            json_decref(j);
        }
        lm_tok_ids_free(&ids);
        free(buf);
    }
    lm_tokenizer_free(tok);
    lm_source_unref(src);
    return rc;
}
