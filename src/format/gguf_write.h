/* gguf_write.h - writes GGUF v3 files (the layout gguf.h reads).
 *
 * A writer collects metadata (every GGUF value type, arrays included) and a
 * tensor table (name, storage type, shape outermost first), then streams the
 * file: lm_gguf_writer_begin writes the header and the tensor infos to a
 * temporary file beside the destination, lm_gguf_writer_put appends each
 * tensor's bytes in table order (padded to the alignment), and
 * lm_gguf_writer_finish flushes, fsyncs and renames it into place, so a
 * reader never sees a half-written file and the tensors need never all be
 * in memory at once. */
#ifndef LM_GGUF_WRITE_H
#define LM_GGUF_WRITE_H

#include "gguf.h"

typedef struct lm_gguf_writer lm_gguf_writer;

/* alignment: a power of two (general.alignment is written when not 32). */
lm_gguf_writer *lm_gguf_writer_create(uint32_t alignment);
/* Frees the writer; a file begun and not finished is removed. */
void lm_gguf_writer_free(lm_gguf_writer *w);

/* Metadata. Setting a key again replaces its value in place (keys keep the
 * order of their first setting). Integer types take int_value (checked to
 * fit the type, asserted), F32/F64 float_value. */
void lm_gguf_set_int(lm_gguf_writer *w, const char *key, lm_gguf_type type, int64_t v);
void lm_gguf_set_uint64(lm_gguf_writer *w, const char *key, uint64_t v);
void lm_gguf_set_float(lm_gguf_writer *w, const char *key, lm_gguf_type type, double v);
void lm_gguf_set_bool(lm_gguf_writer *w, const char *key, bool v);
void lm_gguf_set_str(lm_gguf_writer *w, const char *key, const char *s, size_t len);
/* An array of count scalars of elem_type, read from elems as little-endian
 * values of the type's own width (bool: one byte each). */
void lm_gguf_set_arr(lm_gguf_writer *w, const char *key, lm_gguf_type elem_type, const void *elems,
                     uint64_t count);
/* An array of count strings (lens[i] bytes each; lens NULL: NUL-terminated). */
void lm_gguf_set_arr_str(lm_gguf_writer *w, const char *key, const char *const *strs, const size_t *lens,
                         uint64_t count);
/* Copies one key/value read by gguf.h (nested arrays: -1 with e set). */
int lm_gguf_copy_kv(lm_gguf_writer *w, const lm_gguf_kv *kv, lm_err *e);
/* Removes a key if present. */
void lm_gguf_del_kv(lm_gguf_writer *w, const char *key);

/* Appends a tensor to the table; -1 with e set when the type has no GGUF id
 * or the innermost dimension is not a multiple of its block. */
int lm_gguf_add_tensor(lm_gguf_writer *w, const char *name, lm_dtype type, int n_dims, const int64_t *shape,
                       lm_err *e);
int lm_gguf_writer_n_tensors(const lm_gguf_writer *w);
/* Bytes tensor i takes in the file (without padding). */
size_t lm_gguf_writer_tensor_bytes(const lm_gguf_writer *w, int i);

/* The streaming write: begin, put each tensor in table order, finish. */
int lm_gguf_writer_begin(lm_gguf_writer *w, const char *path, lm_err *e);
int lm_gguf_writer_put(lm_gguf_writer *w, const void *data, size_t nbytes, lm_err *e);
int lm_gguf_writer_finish(lm_gguf_writer *w, lm_err *e);

#endif
