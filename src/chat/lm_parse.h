/* lm_parse.h - streaming parsers for generated text: stop strings, reasoning
 * blocks and tool calls, turned into OpenAI-shaped deltas.
 *
 * Design note
 * -----------
 * The server decodes tokens into text deltas and pushes every delta through
 * up to three parsers, in this order (`lumen chat` uses the reasoning parser
 * alone):
 *
 *     model text -> lm_stop_matcher -> lm_reasoning_parser -> reasoning_content
 *                                                          \-> content -> lm_toolcall_parser
 *                                                                         -> content, tool_calls
 *
 * Stop strings apply to the raw generated text (as OpenAI's `stop` does);
 * tool calls are parsed from the content only (never from inside <think>).
 *
 * All three share one contract:
 *   - Incremental. feed() takes any chunk: a tag or stop string may be split
 *     anywhere, even inside a multi-byte UTF-8 character. The concatenated
 *     output of all feed() calls plus finish() is the same however the text
 *     was chunked (the tests check whole, byte by byte, every two-chunk split
 *     and random chunkings).
 *   - Never premature. Text is emitted only once it cannot turn out to be part
 *     of a tag, stop string or tag framing; what is held back is the minimal
 *     ambiguous suffix: the longest suffix that is a proper prefix of a tag
 *     (plus, where documented, framing whitespace), plus an incomplete UTF-8
 *     sequence at the very end, so that every delta is valid UTF-8 when the
 *     input is (each delta can go straight into a JSON string).
 *   - Nothing is lost. Text that looked like a tag but was not is emitted as
 *     it was; a malformed or unfinished tool call comes back as content.
 *   - Output pointers belong to the parser and stay valid until its next
 *     feed/finish/free call. Lengths are given; strings are also NUL-terminated.
 *
 * Why hand-written: no C library does streaming, chunk-split-safe tag parsing
 * with minimal hold-back, and the tool-call formats are model conventions, not
 * a grammar any parser library ships. jansson is used for JSON values (tool
 * schemas, decoding strings, building OpenAI objects); the incremental JSON
 * validator that lets tool-call arguments stream while they are generated is
 * our own (json_scan.c), because jansson only parses complete documents.
 *
 * Input text is expected to be UTF-8 (the detokenizer's job); invalid bytes
 * are passed through, never interpreted. */
#ifndef LM_PARSE_H
#define LM_PARSE_H

#include "base/lm_base.h"

#include <jansson.h>

/* ---- stop strings --------------------------------------------------------- */

/* Semantics: generation stops at the earliest point where any stop string has
 * been completed (earliest end offset; on a tie the occurrence that starts
 * first). The output is cut right before that occurrence; the stop string
 * never appears in the output, also when it arrives split across chunks. This
 * is exactly what a server checking after every token would do, so it is the
 * same whatever the chunking. */
typedef struct lm_stop_matcher lm_stop_matcher;

typedef struct lm_stop_result {
    const char *text; /* safe to emit now */
    size_t len;
    bool stopped;     /* a stop string matched: text ends right before it;
                         further feeds return nothing; stop generating */
    int which;        /* index of the matching stop string, or -1 */
} lm_stop_result;

/* n stop strings of any bytes; lens may be NULL (then strlen). Empty strings
 * never match. The strings are copied. n may be 0 (everything passes). */
lm_stop_matcher *lm_stop_matcher_create(const char *const *stops, const size_t *lens, int n);
/* From a request's `stop` value: NULL, JSON null, a string or an array of
 * strings. Returns NULL with a one-line error for anything else. */
lm_stop_matcher *lm_stop_matcher_create_json(const json_t *stop, lm_err *err);
void lm_stop_matcher_feed(lm_stop_matcher *m, const char *text, size_t n, lm_stop_result *out);
/* End of generation: returns what was held back (a stop-string prefix that
 * never completed). */
void lm_stop_matcher_finish(lm_stop_matcher *m, lm_stop_result *out);
void lm_stop_matcher_free(lm_stop_matcher *m);

/* ---- reasoning (<think> ... </think>) ---------------------------------------- */

/* Text between the open and close tags goes to reasoning, the rest to content.
 * Tags are recognised anywhere (a second think block is reasoning again).
 *
 * Newline framing. Qwen3's chat template renders an assistant turn as
 *     "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + content.lstrip("\n")
 * and splits a stored turn back the same way, so the parser inverts exactly
 * that and strips only '\n' (never spaces or other text):
 *   - every '\n' at the start of a reasoning block (after the open tag, or at
 *     the start of generation when the prompt opened the block);
 *   - every '\n' at the end of a reasoning block (right before the close tag,
 *     and at the end of generation when the block never closed);
 *   - every '\n' at the start of the content that follows a close tag.
 * Newlines inside reasoning are kept; a trailing run of them is held back
 * until later reasoning text shows they were not the end of the block.
 * Content that precedes any think block is not stripped.
 *
 * Open tag emitted again inside an opened block: some templates put "<think>\n"
 * in the prompt while the model also generates "<think>" (Qwen3 2507-style
 * checkpoints with newer templates); an open tag at the very start of a
 * reasoning block (only newlines before it) is dropped as framing. */
typedef struct lm_reasoning_parser lm_reasoning_parser;

typedef struct lm_reasoning_opts {
    const char *open_tag;    /* NULL: "<think>" */
    const char *close_tag;   /* NULL: "</think>" */
    bool start_in_reasoning; /* the rendered prompt ended inside an open think
                                block (e.g. "...<|im_start|>assistant\n<think>\n"),
                                so generation starts as reasoning and a bare
                                close tag ends it */
    const char *implicit_end_tag; /* NULL, or a string that also ends reasoning
                                but belongs to the content: Qwen3.5 may start
                                "<tool_call>" inside its think block without
                                closing it first (vLLM treats it the same way) */
} lm_reasoning_opts;

typedef struct lm_reasoning_delta {
    const char *reasoning; /* reasoning_content delta */
    size_t reasoning_len;
    const char *content;   /* content delta */
    size_t content_len;
} lm_reasoning_delta;

/* opts may be NULL (defaults). Returns NULL with an error for an empty tag. */
lm_reasoning_parser *lm_reasoning_parser_create(const lm_reasoning_opts *opts, lm_err *err);
void lm_reasoning_parser_feed(lm_reasoning_parser *p, const char *text, size_t n,
                              lm_reasoning_delta *out);
void lm_reasoning_parser_finish(lm_reasoning_parser *p, lm_reasoning_delta *out);
/* Whether the text so far ends inside a reasoning block. */
bool lm_reasoning_parser_in_reasoning(const lm_reasoning_parser *p);
void lm_reasoning_parser_free(lm_reasoning_parser *p);
/* Whether a rendered prompt ends inside an open think block: its last open
 * tag comes after its last close tag and only whitespace follows it (what
 * lm_reasoning_opts.start_in_reasoning wants to know). */
bool lm_reasoning_prompt_open(const char *text, size_t len, const char *open, const char *close);

/* ---- tool calls ------------------------------------------------------------- */

/* Two forms inside <tool_call> ... </tool_call> (tags configurable):
 *
 *  (a) Hermes / Qwen2.5 / Qwen3 JSON:
 *        <tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>
 *      "parameters" is accepted for "arguments"; arguments given as a JSON
 *      string are decoded; missing or null arguments become "{}". Several JSON
 *      objects in one block are several calls.
 *      Streaming: the name is emitted once its string is complete; the raw
 *      bytes of the arguments object are streamed as they are validated by an
 *      incremental JSON validator (so every fragment is part of valid JSON);
 *      if "arguments" precedes "name" the arguments are held until the name.
 *
 *  (b) Qwen3-Coder / Qwen3.5 XML:
 *        <tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n</function>\n</tool_call>
 *      A value runs to the first "</parameter>" (the format cannot express a
 *      value containing that string). One '\n' right after the opening tag
 *      and one right before the closing tag are framing (the template writes
 *      "<parameter=p>\n" + value + "\n</parameter>") and are removed; the rest
 *      is converted by the parameter's JSON-schema type from the request's
 *      `tools` (type as string or list, anyOf/oneOf, enum/const):
 *        null     "null" -> null (also for any type but string, and for
 *                 "nullable": true)       integer/number  a JSON number, as written
 *        boolean  true/false, any case      object/array    parsed as JSON, as written
 *        string   the text verbatim (no trimming beyond the framing newlines)
 *        unknown parameter or no schema: the trimmed text if it is valid JSON,
 *        else a string. A value that does not fit its type becomes a string.
 *      Arguments are built as {"p": value, "q": value} (jansson's string
 *      escaping). Streaming: the name on "<function=f>"; a string-typed
 *      parameter streams its value as it arrives (holding back only what may
 *      be the closing tag and its framing newline); other parameters are
 *      emitted when complete; "}" on "</function>".
 *
 * Content. Text outside calls goes to content. Whitespace adjacent to a
 * tool-call block (before "<tool_call>" and after "</tool_call>") is framing
 * and dropped, so "Let me check.\n\n<tool_call>...</tool_call>\n" gives the
 * content "Let me check."; a trailing whitespace run is therefore held back
 * until the next non-space text shows it is not framing.
 *
 * Completion and failure. A call is produced (committed) when its JSON object
 * closes or on "</function>"; a missing "</tool_call>" after that is
 * tolerated (e.g. a `stop` of "</tool_call>"). A call that is malformed (bad
 * JSON, no name, unexpected text in the XML structure) or unfinished at the
 * end of the stream is not a tool call: its raw text, including the framing
 * whitespace before it, is emitted as content and parsing resumes at the byte
 * where it went wrong. In the default streaming mode such a call may already
 * have streamed its name and part of its arguments (as OpenAI does when
 * max_tokens cuts a call); set `atomic` to emit each call in one delta only
 * once it is committed. finish() returns the number of committed calls: the
 * server sets finish_reason "tool_calls" when it is > 0. */
typedef struct lm_toolcall_parser lm_toolcall_parser;

typedef struct lm_toolcall_opts {
    json_t *tools;          /* request `tools` array (a reference is taken), or NULL */
    const char *open_tag;   /* NULL: "<tool_call>" */
    const char *close_tag;  /* NULL: "</tool_call>" */
    uint64_t id_seed;       /* ids are "call_" + 24 chars derived from this and the
                               call's index: pass a per-request random value */
    bool atomic;            /* emit a call only when complete, in one delta */
} lm_toolcall_opts;

typedef struct lm_toolcall_delta {
    int index;          /* the call's index in this answer's tool_calls */
    const char *id;     /* on the call's first delta, else NULL */
    const char *name;   /* on the call's first delta, else NULL */
    const char *args;   /* arguments fragment (possibly ""), NUL-terminated */
    size_t args_len;
} lm_toolcall_delta;

typedef struct lm_toolcall_out {
    const char *content;              /* content delta */
    size_t content_len;
    const lm_toolcall_delta *calls;   /* at most one delta per call index, in order */
    int n_calls;
} lm_toolcall_out;

/* opts may be NULL. Returns NULL with an error for an empty or
 * whitespace-led tag, or tools that are not an array. */
lm_toolcall_parser *lm_toolcall_parser_create(const lm_toolcall_opts *opts, lm_err *err);
void lm_toolcall_parser_feed(lm_toolcall_parser *p, const char *text, size_t n, lm_toolcall_out *out);
/* End of stream: flushes held text, turns an unfinished call into content.
 * Returns the number of committed tool calls. */
int lm_toolcall_parser_finish(lm_toolcall_parser *p, lm_toolcall_out *out);
/* The deltas of out as an OpenAI `delta.tool_calls` array
 * ([{"index", "id", "type", "function": {"name", "arguments"}}], later
 * fragments only {"index", "function": {"arguments"}}); NULL when out has no
 * tool-call delta. New reference. */
json_t *lm_toolcall_out_json(const lm_toolcall_out *out);
/* The committed calls as an OpenAI `message.tool_calls` array (possibly
 * empty); arguments are exactly the concatenated streamed fragments. */
json_t *lm_toolcall_parser_calls_json(const lm_toolcall_parser *p);
void lm_toolcall_parser_free(lm_toolcall_parser *p);

#endif
