/* lm_source.h - one opened model path, shared by every loader that reads it.
 *
 * A command opens the path the user gave once and hands the source to the
 * model, tokenizer and template loaders, so the folder-or-GGUF decision is
 * made in one place and a GGUF file is mapped and parsed once. The rule
 * (lm_source_open), in order:
 *   1. a directory                                  -> LM_SOURCE_HF
 *   2. a name ending in ".gguf" or ".GGUF"          -> LM_SOURCE_GGUF
 *   3. a regular file that starts with "GGUF"       -> LM_SOURCE_GGUF
 *   4. anything else, existing or not               -> LM_SOURCE_FILE
 * LM_SOURCE_FILE is a single file of another kind (a tokenizer.json, a
 * .jinja template, a tokenizer_config.json): the tokenizer and template
 * loaders read it, the model loader refuses it ("not a model folder or a
 * GGUF file", or "no such file or directory" when it is not there).
 *
 * Ownership: reference-counted. lm_source_open returns one reference, the
 * caller's; lm_source_ref adds one, lm_source_unref drops one and frees the
 * source with the last. A consumer that keeps pointers into the mapped files
 * takes its own reference: a model does (its weights are used in place), so
 * a command may drop its reference as soon as everything is loaded and the
 * files stay mapped until lm_model_free. Consumers that copy what they read
 * (tokenizer, template) take none.
 *
 * The source owns every mapped file of the model: the GGUF file (opened and
 * parsed by lm_source_open) or a folder's safetensors files (opened by the
 * first lm_source_weights; a folder that only holds a tokenizer never opens
 * them). References may be dropped from any thread; open, lm_source_weights
 * and the loaders run on one thread at a time (a command loads on one). */
#ifndef LM_SOURCE_H
#define LM_SOURCE_H

#include "lm_weights.h"

typedef enum lm_source_kind {
    LM_SOURCE_HF,    /* a Hugging Face folder: config.json, safetensors, tokenizer files */
    LM_SOURCE_GGUF,  /* one GGUF file: metadata, tokenizer and tensors */
    LM_SOURCE_FILE   /* another single file (tokenizer.json, a chat template) */
} lm_source_kind;

typedef struct lm_source lm_source;

/* Decides what path is and, for a GGUF file, maps and parses it. Fails only
 * for a GGUF file ("PATH: no such file or directory", or the parser's
 * "PATH: problem"); other paths are checked by the loaders that read them. */
int lm_source_open(lm_source **out, const char *path, lm_err *e);
/* Adds a reference; returns src. */
lm_source *lm_source_ref(lm_source *src);
/* Drops a reference (NULL is a no-op); the last one frees the source. */
void lm_source_unref(lm_source *src);

lm_source_kind lm_source_kind_of(const lm_source *src);
/* The path as given to lm_source_open. */
const char *lm_source_path(const lm_source *src);
/* The folder that holds the model's side files (tokenizer_config.json,
 * chat_template.jinja): the path itself for LM_SOURCE_HF, else the file's
 * directory ("." for a bare file name). */
const char *lm_source_folder(const lm_source *src);
/* The parsed GGUF file, or NULL when the source is not one. */
const lm_gguf *lm_source_gguf(const lm_source *src);

/* The model's weight table (the source keeps it; valid while the source
 * lives): the GGUF's tensors, or the folder's model.safetensors or its
 * index's shards, opened on the first call. LM_SOURCE_FILE has none. */
int lm_source_weights(lm_source *src, const lm_weight_source **out, lm_err *e);

#endif
