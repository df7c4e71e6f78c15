/* lm_template.h - Jinja chat templates, rendered the way transformers does.
 *
 * A hand-written interpreter for the Jinja subset that real model chat
 * templates use (Qwen, Llama, Gemma, Mistral, Nemotron ...). The target is
 * Python jinja2 as configured by transformers' apply_chat_template: an
 * ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
 * loopcontrols extension ({% break %}, {% continue %}), the {% generation %}
 * tag, a tojson filter that is json.dumps(ensure_ascii=False) keeping key
 * order, and the globals raise_exception(msg) and strftime_now(fmt).
 * Values print as Python prints them (True, None, ['a', 1]).
 *
 *   lm_template *t;
 *   if (lm_template_parse(src, len, "chat_template.jinja", &t, &e)) ...
 *   char *text; size_t n;
 *   if (lm_template_render(t, ctx, NULL, &text, &n, &e)) ...   // ctx: JSON object
 *   free(text); lm_template_free(t);
 *
 * A parsed template is immutable: any number of threads may render it at
 * once. Errors are one line, "NAME:LINE:COL: message"; a template's
 * raise_exception("msg") fails the render with that message. Resource use is
 * bounded (output size, memory, steps, nesting) so that no input can hang or
 * exhaust the process. */
#ifndef LM_TEMPLATE_H
#define LM_TEMPLATE_H

#include <jansson.h>

#include "../base/lm_base.h"

typedef struct lm_template lm_template;
struct lm_source;

/* Parses Jinja source (UTF-8, need not be NUL-terminated). name labels error
 * messages (e.g. the file name). On error fills e with "NAME:LINE:COL: ..."
 * and returns -1. */
int lm_template_parse(const char *src, size_t len, const char *name, lm_template **out, lm_err *e);
void lm_template_free(lm_template *t);

typedef struct lm_template_opts {
    /* Seconds since the epoch that strftime_now() formats (local time);
     * 0 = the current time. Tests set it to get a fixed date. */
    int64_t now;
    /* Limits; 0 = the default. */
    size_t max_output;  /* bytes of rendered text (default 64 MiB) */
    size_t max_memory;  /* bytes the renderer may allocate (default 1 GiB) */
    uint64_t max_steps; /* evaluation steps (default 200 million) */
} lm_template_opts;

/* Renders with the variables of ctx (a JSON object: messages, tools,
 * add_generation_prompt, bos_token, extra kwargs ...). Object keys keep their
 * order. opts may be NULL. On success *out is a malloc'd NUL-terminated
 * string (the caller frees it) of *out_len bytes. */
int lm_template_render(const lm_template *t, const json_t *ctx, const lm_template_opts *opts,
                       char **out, size_t *out_len, lm_err *e);

/* Reads a chat template's source from an opened source (format/lm_source.h):
 * a .jinja/.jinja2 (or any text) file; a tokenizer_config.json
 * ("chat_template" as a string, or a list of {name, template} from which
 * "default" is taken); a GGUF file (tokenizer.chat_template); or a model
 * folder (chat_template.jinja, else chat_template.json, else
 * tokenizer_config.json). *src is malloc'd; the source may be released after. */
int lm_template_load_from(const struct lm_source *source, char **src, size_t *len, lm_err *e);
/* The same on a source opened from path and released after. */
int lm_template_load_source(const char *path, char **src, size_t *len, lm_err *e);

#endif
