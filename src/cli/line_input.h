/* line_input.h - the lines a terminal command reads: with line editing and
 * a saved history (libedit) when a person types them, plain lines from a
 * pipe or file otherwise.
 *
 * Editing is on when standard input and standard error are terminals (the
 * prompt and the echo go to standard error, so standard output carries only
 * what the command writes). There Ctrl-C is a key, not a signal: it clears
 * the line, or on an empty line leaves like Ctrl-D. History lives in
 * $XDG_STATE_HOME/lumen/history, else ~/.lumen_history; it is read at start
 * and written after every line, never when input is not a terminal. */
#ifndef LM_LINE_INPUT_H
#define LM_LINE_INPUT_H

#include <stdbool.h>

typedef struct lm_line_input lm_line_input;

typedef enum lm_line_status {
    LM_LINE_OK,        /* a line (without its newline) */
    LM_LINE_EOF,       /* end of input, Ctrl-D, or Ctrl-C on an empty line */
    LM_LINE_CANCELLED, /* Ctrl-C on a line with text: the line is dropped */
} lm_line_status;

/* prog names the program for ~/.editrc sections. */
lm_line_input *lm_line_input_create(const char *prog);
/* Saves the history and restores the terminal. NULL is fine. */
void lm_line_input_free(lm_line_input *in);
/* Whether a person is typing (editing and history are on). */
bool lm_line_input_interactive(const lm_line_input *in);
/* Reads one line, showing prompt when interactive. *line stays valid until
 * the next call. */
lm_line_status lm_line_read(lm_line_input *in, const char *prompt, const char **line);

#endif
