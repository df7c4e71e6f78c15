/* lm_chat.h - chat messages -> the model's chat template -> prompt text.
 *
 * Design note
 * -----------
 * The layer between the text layers (template/, tokenizer/) and the two
 * front ends that chat: the server's /v1/chat/completions and `lumen chat`.
 * It owns what both need and neither should own alone: the model's parsed
 * chat template with what it says about the model (does it think, which
 * tool-call format it writes), the context a template is rendered with, and
 * the streaming parsers for what the model writes back (lm_parse.h). The
 * server adds HTTP and OpenAI's request and response shapes on top; the
 * terminal adds a prompt loop.
 *
 * The template context is built the way transformers' apply_chat_template
 * builds it, because that is what chat templates are written against:
 *   messages               the messages (OpenAI's shape), normalised:
 *                            - content given as text parts is joined into one
 *                              string ("\n" between parts), as vLLM and
 *                              llama.cpp do for templates that expect strings;
 *                            - "developer" becomes "system";
 *                            - tool_calls[].function.arguments given as a JSON
 *                              string is parsed into an object (templates
 *                              apply `tojson` to it, or iterate its items);
 *                            - everything else (reasoning_content, name,
 *                              tool_call_id) passes through unchanged;
 *   tools                  the tools, when there are any;
 *   add_generation_prompt  true;
 *   bos_token, eos_token   the tokenizer's special-token strings, when defined;
 *   kwargs                 merged at top level (chat_template_kwargs, e.g.
 *                          enable_thinking).
 *
 * Forced tool calls (tool_choice required / a named function): the assistant
 * turn is prefilled with the opening of a call in the template's own format
 * (Hermes JSON or Qwen3.5 XML), closing an open think block first; the
 * server then holds the rest of the call to a grammar of the tools'
 * parameters (server/constrain.c). Given the arguments too (the server's
 * --debug-tool-call), the prefill is the whole call and the answer ends
 * there. */
#ifndef LM_CHAT_H
#define LM_CHAT_H

#include <jansson.h>

#include "../base/lm_base.h"
#include "../template/lm_template.h"
#include "../tokenizer/lm_tokenizer.h"
#include "lm_parse.h"

typedef struct lm_chat {
    lm_template *tpl;          /* the parsed chat template */
    const lm_tokenizer *tok;   /* borrowed: bos/eos token strings */
    bool think;                /* the model knows <think> ... </think> */
    bool xml_tools;            /* the template writes Qwen3.5-style <function=...> calls */
} lm_chat;

/* What to render. */
typedef struct lm_chat_req {
    const json_t *messages;    /* [{role, content, ...}] */
    const json_t *tools;       /* an array, or NULL */
    const json_t *kwargs;      /* an object merged into the context, or NULL */
    bool force_call;           /* prefill the opening of a tool call */
    const char *tool_name;     /* with force_call: that function's, or NULL for any */
    const json_t *tool_args;   /* with tool_name: the call's arguments (an object),
                                  prefilled whole; NULL: the model writes them */
    bool special_in_content;   /* special-token text in messages and tools becomes
                                  control tokens (the old, unsafe way); else it is
                                  literal text (chat_literal.c) */
} lm_chat_req;

typedef struct lm_chat_prompt {
    char *text;                /* the rendered prompt, prefill included */
    size_t len;
    char *prefill;             /* text put in the assistant turn for the model
                                  (forced tool call), to feed to the parsers; may be NULL */
    bool start_in_reasoning;   /* the prompt ends inside an open <think> block */
    bool call_complete;        /* the prefill is a whole tool call (tool_args): the
                                  answer ends with it */
    lm_tok_span *lit;          /* [n_lit] ranges of text that the request wrote (message
                                  content, tool names ...): tokenized as text only */
    size_t n_lit, cap_lit;
    size_t *marks;             /* [n_marks] ascending byte offsets where messages' contents
                                  end (lm_chat_mark_messages); NULL: none known */
    size_t n_marks;
} lm_chat_prompt;

/* Parses the chat template src (a C string; NULL: the tokenizer's own) for
 * a model with tokenizer tok (kept, not owned). -1 with e set ("the model has
 * no chat template", "the chat template does not parse (...)") and *out NULL. */
int lm_chat_create(lm_chat **out, const lm_tokenizer *tok, const char *src, lm_err *e);
void lm_chat_free(lm_chat *c);
/* The template context (new reference). */
json_t *lm_chat_context(const lm_chat *c, const lm_chat_req *r);
/* Renders r into p (free with lm_chat_prompt_free, also after an error). */
int lm_chat_render(const lm_chat *c, const lm_chat_req *r, lm_chat_prompt *p, lm_err *e);
void lm_chat_prompt_free(lm_chat_prompt *p);
/* The prompt's ids: its text tokenized with no special token matched in its
 * literal ranges (lm_tokenizer_encode_lit), none added around it. */
int lm_chat_encode(lm_tokenizer *tok, const lm_chat_prompt *p, lm_tok_ids *out, lm_err *e);

/* ---- message boundaries (chat_marks.c) ---- */

/* Sets p's marks (p rendered from r): where each message's content ends in
 * p's text; none when the template's rendering does not show it exactly. */
void lm_chat_mark_messages(const lm_chat *c, const lm_chat_req *r, lm_chat_prompt *p);
/* p's marks as token offsets into ids[0, n) (p's text tokenized): *out
 * (malloc'd, ascending) and their count; 0 and NULL when unknown. */
int lm_chat_mark_tokens(const lm_tokenizer *tok, const lm_chat_prompt *p, const int32_t *ids, int n, int32_t **out);

/* ---- literal text (chat_literal.c) ---- */

/* The texts taken out of a context by lm_chat_defuse. */
typedef struct lm_chat_lits {
    struct lit_tab *tab;
} lm_chat_lits;
/* Swaps every special token's text in ctx's messages and tools for a marker. */
void lm_chat_defuse(const lm_tokenizer *tok, json_t *ctx, lm_chat_lits *lits);
/* Puts the texts back into a rendered text (replaced, *len updated) and
 * records their ranges in p's literal ranges; -1 with e when there were too
 * many to mark. */
int lm_chat_restore(lm_chat_lits *lits, char **text, size_t *len, lm_chat_prompt *p, lm_err *e);
void lm_chat_lits_free(lm_chat_lits *lits);
/* Marks [start, end) of p's text literal (ranges added in order). */
void lm_chat_prompt_add_literal(lm_chat_prompt *p, size_t start, size_t end);

#endif
