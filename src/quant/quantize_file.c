/* quantize_file.c - lm_quantize_gguf: read a GGUF, decide each tensor's type
 * with the mix rules, convert row by row (dequantise to f32, quantise), and
 * stream the result through the GGUF writer, so only one tensor is in memory
 * at a time beside the mapped input. */
#include "lm_quantize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../format/gguf_write.h"
#include "lm_quant.h"

#define LM_QUANTIZATION_VERSION 2 /* ggml's GGML_QNT_VERSION */

/* {arch}.KEY as an integer, or 0. */
static int lm_arch_int(const lm_gguf *g, const char *arch, const char *key) {
    char k[256];
    int64_t v = 0;
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return lm_gguf_get_int(g, k, &v) && v > 0 && v < (1 << 30) ? (int)v : 0;
}

/* The mix state for g: layer, head and expert counts from its metadata. */
static void lm_quantize_state(const lm_gguf *g, const lm_quant_mix *mix, lm_mix_state *st) {
    memset(st, 0, sizeof *st);
    st->mix = mix;
    char *arch = lm_gguf_get_str(g, "general.architecture");
    if (arch) {
        st->n_layer = lm_arch_int(g, arch, "block_count");
        int heads = lm_arch_int(g, arch, "attention.head_count");
        int kv = lm_arch_int(g, arch, "attention.head_count_kv");
        st->n_gqa = heads && kv ? heads / kv : 0;
        st->n_expert = lm_arch_int(g, arch, "expert_count");
    }
    free(arch);
    const char **names = lm_xmalloc((size_t)g->n_tensors * sizeof *names + 1);
    for (int i = 0; i < g->n_tensors; i++) names[i] = g->tensors[i].name;
    lm_mix_prepare(st, names, g->n_tensors);
    free(names);
}

/* Row r of a GGUF tensor. */
static const uint8_t *lm_quantize_src_row(void *ctx, int64_t r) {
    const lm_file_tensor *t = ctx;
    return t->data + (size_t)r * lm_dtype_row_bytes(t->type, t->shape[t->n_dims - 1]);
}

/* t's data converted to type `to` (malloc'd, *nbytes set). */
static uint8_t *lm_quantize_tensor(const lm_file_tensor *t, lm_dtype to, int threads, size_t *nbytes) {
    int64_t cols = t->shape[t->n_dims - 1], rows = cols ? lm_file_tensor_numel(t) / cols : 0;
    *nbytes = (size_t)rows * lm_dtype_row_bytes(to, cols);
    lm_qrows q = { t->type, to, rows, cols, lm_quantize_src_row, (void *)t, lm_xmalloc(*nbytes + 1) };
    lm_quant_rows(&q, threads);
    return q.dst;
}

int lm_quantize_gguf(const char *in, const char *out, const lm_quant_mix *mix, int threads, lm_quantize_report *rep,
                     lm_err *e) {
    memset(rep, 0, sizeof *rep);
    lm_gguf g;
    if (lm_gguf_open(&g, in, e) != 0) return -1;
    lm_mix_state st;
    lm_quantize_state(&g, mix, &st);
    lm_gguf_writer *w = lm_gguf_writer_create(g.alignment);
    lm_dtype *to = lm_xmalloc((size_t)g.n_tensors * sizeof *to + 1);
    int rc = 0;
    for (int i = 0; rc == 0 && i < g.n_kv; i++) rc = lm_gguf_copy_kv(w, &g.kv[i], e);
    if (lm_dtype_is_quant(mix->base)) lm_gguf_set_int(w, "general.quantization_version", LM_GGUF_U32, LM_QUANTIZATION_VERSION);
    lm_gguf_set_int(w, "general.file_type", LM_GGUF_U32, mix->ftype);
    for (int i = 0; rc == 0 && i < g.n_tensors; i++) {
        const lm_file_tensor *t = &g.tensors[i];
        if (t->type == LM_DTYPE_COUNT) {
            rc = lm_errf(e, "%s: tensor \"%s\" has type %s, which lumen cannot read", in, t->name, t->type_name);
            break;
        }
        to[i] = lm_mix_tensor_type(&st, t->name, t->n_dims, t->shape, t->type);
        rc = lm_gguf_add_tensor(w, t->name, to[i], t->n_dims, t->shape, e);
    }
    if (rc == 0) rc = lm_gguf_writer_begin(w, out, e);
    for (int i = 0; rc == 0 && i < g.n_tensors; i++) {
        const lm_file_tensor *t = &g.tensors[i];
        size_t nbytes = t->nbytes;
        uint8_t *conv = to[i] == t->type ? NULL : lm_quantize_tensor(t, to[i], threads, &nbytes);
        rc = lm_gguf_writer_put(w, conv ? conv : t->data, nbytes, e);
        free(conv);
        rep->n_tensors++;
        rep->n_requantised += to[i] != t->type;
        rep->bytes_in += t->nbytes;
        rep->bytes_out += nbytes;
        rep->count_by_type[to[i]]++;
    }
    if (rc == 0) rc = lm_gguf_writer_finish(w, e);
    free(to);
    lm_gguf_writer_free(w);
    lm_gguf_close(&g);
    return rc;
}
