/* line_input.c - see line_input.h. */
#include "line_input.h"

#include <errno.h>
#include <histedit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/lm_base.h"

struct lm_line_input {
    EditLine *el;          /* NULL: plain lines */
    History *hist;
    char *hist_path;       /* NULL: no history file */
    const char *prompt;
    bool ctrl_c;           /* the line ended with Ctrl-C */
    char *buf;             /* plain mode's line */
    size_t cap;
};

static char *prompt_of(EditLine *el) {
    lm_line_input *in = NULL;
    el_get(el, EL_CLIENTDATA, &in);
    return (char *)(in && in->prompt ? in->prompt : "");
}

/* Ctrl-C bound as a key (the terminal's ISIG is off while editing): on an
 * empty line it leaves, like Ctrl-D; otherwise it ends the line, which
 * lm_line_read then drops, as a shell does. */
static unsigned char on_ctrl_c(EditLine *el, int ch) {
    (void)ch;
    lm_line_input *in = NULL;
    el_get(el, EL_CLIENTDATA, &in);
    const LineInfo *li = el_line(el);
    if (li->lastchar == li->buffer) return CC_EOF;
    in->ctrl_c = true;
    return CC_NEWLINE;
}

/* $XDG_STATE_HOME/lumen/history (the folder made if missing), else
 * ~/.lumen_history; NULL when neither variable is set. */
static char *history_path(void) {
    const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    char buf[4096];
    if (xdg && *xdg) {
        snprintf(buf, sizeof buf, "%s/lumen", xdg);
        if (mkdir(xdg, 0700) && errno != EEXIST) return NULL;
        if (mkdir(buf, 0700) && errno != EEXIST) return NULL;
        snprintf(buf, sizeof buf, "%s/lumen/history", xdg);
        return lm_xstrdup(buf);
    }
    if (!home || !*home) return NULL;
    snprintf(buf, sizeof buf, "%s/.lumen_history", home);
    return lm_xstrdup(buf);
}

lm_line_input *lm_line_input_create(const char *prog) {
    lm_line_input *in = lm_xcalloc(1, sizeof *in);
    if (!isatty(STDIN_FILENO) || !isatty(STDERR_FILENO)) return in;
    in->el = el_init(prog, stdin, stderr, stderr);
    if (!in->el) return in;
    HistEvent ev;
    in->hist = history_init();
    history(in->hist, &ev, H_SETSIZE, 1000);
    history(in->hist, &ev, H_SETUNIQUE, 1);
    in->hist_path = history_path();
    if (in->hist_path) history(in->hist, &ev, H_LOAD, in->hist_path); /* a missing file is an empty history */
    el_set(in->el, EL_CLIENTDATA, in);
    el_set(in->el, EL_EDITOR, "emacs");
    el_set(in->el, EL_PROMPT, prompt_of);
    el_set(in->el, EL_HIST, history, in->hist);
    el_set(in->el, EL_SIGNAL, 1); /* window resizes and suspends restore the line */
    el_set(in->el, EL_SETTY, "-d", "-isig", NULL);
    /* the wide form: libedit keeps these pointers (its narrow el_set copies and leaks them) */
    el_wset(in->el, EL_ADDFN, L"lumen-ctrl-c", L"clear the line, or leave on an empty one", on_ctrl_c);
    el_set(in->el, EL_BIND, "^C", "lumen-ctrl-c", NULL);
    el_source(in->el, NULL); /* the user's ~/.editrc */
    return in;
}

void lm_line_input_free(lm_line_input *in) {
    if (!in) return;
    if (in->el) el_end(in->el);
    if (in->hist) history_end(in->hist);
    free(in->hist_path);
    free(in->buf);
    free(in);
}

bool lm_line_input_interactive(const lm_line_input *in) { return in->el != NULL; }

lm_line_status lm_line_read(lm_line_input *in, const char *prompt, const char **line) {
    *line = NULL;
    if (!in->el) {
        ssize_t got = getline(&in->buf, &in->cap, stdin);
        if (got < 0) return LM_LINE_EOF;
        while (got > 0 && (in->buf[got - 1] == '\n' || in->buf[got - 1] == '\r')) in->buf[--got] = 0;
        *line = in->buf;
        return LM_LINE_OK;
    }
    in->prompt = prompt;
    in->ctrl_c = false;
    int count = 0;
    const char *s = el_gets(in->el, &count);
    if (!s || count <= 0) {
        fputc('\n', stderr);
        return LM_LINE_EOF;
    }
    if (in->ctrl_c) {
        fputc('\n', stderr); /* the dropped line stays on screen, the next prompt below it */
        return LM_LINE_CANCELLED;
    }
    size_t n = strlen(s);
    if (n + 1 > in->cap) in->buf = lm_xrealloc(in->buf, in->cap = n + 1);
    memcpy(in->buf, s, n + 1);
    while (n > 0 && (in->buf[n - 1] == '\n' || in->buf[n - 1] == '\r')) in->buf[--n] = 0;
    if (n > 0) {
        HistEvent ev;
        history(in->hist, &ev, H_ENTER, in->buf);
        if (in->hist_path) history(in->hist, &ev, H_SAVE, in->hist_path);
    }
    *line = in->buf;
    return LM_LINE_OK;
}
