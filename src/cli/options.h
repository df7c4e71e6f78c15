/* options.h - command-line options from one table per command.
 *
 * Design note
 * -----------
 * Each subcommand declares its options once, as a table of lm_opt entries:
 * the spelling (a long name, a short alias where one exists), the kind of
 * value and its range, where the value goes (an offset into the command's
 * options struct), the metavar, the help text and, where the default is not
 * simply the field's initial value, the default in words. lm_opts_parse walks
 * argv against that table starting from the command's defaults, and --help is
 * printed from the same table and the same defaults, so the help cannot drift
 * from what the options do.
 *
 * Options shared by several commands (the backend options, the sampling
 * options) are tables of their own, spliced into a command's table with an
 * LM_OPT_GROUP entry at the offset of their struct in the command's struct.
 *
 * Messages (stderr, exit status 2): a missing value is
 * "lumen: option X needs a value"; a bad one is
 * "lumen CMD: bad value for X 'V': it is not WANT", WANT made from the kind
 * and range; an unknown option or an argument too many points at --help.
 *
 * Rules: options and arguments may be mixed; "--" ends the options; "-" alone
 * is an argument; an option's value is always the next argument, even when it
 * starts with '-'; an option given twice keeps the last value. */
#ifndef LM_CLI_OPTIONS_H
#define LM_CLI_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef enum lm_opt_kind {
    LM_OPT_END = 0, /* ends a table */
    LM_OPT_FLAG,    /* no value: sets a bool to true */
    LM_OPT_INT,     /* a whole number in [ilo, ihi] into an int or a 64-bit field */
    LM_OPT_FLOAT,   /* a number between lo and hi (each end in or out) into a float or double */
    LM_OPT_SIZE,    /* a byte size ("512M", "4G") of at least ilo bytes into a size_t */
    LM_OPT_STRING,  /* the text itself into a const char *; ilo 1: not empty */
    LM_OPT_CHOICE,  /* one of choices[].name: its value into an int or enum */
    LM_OPT_CUSTOM,  /* parse(the table's struct, text) decides; false: it is not `want` */
    LM_OPT_ARG,     /* the next positional argument (const char *); name is its metavar */
    LM_OPT_GROUP,   /* the entries of group, whose struct sits at off */
} lm_opt_kind;

typedef struct lm_opt_choice {
    const char *name;
    int value;
} lm_opt_choice;

typedef struct lm_opt lm_opt;
struct lm_opt {
    lm_opt_kind kind;
    const char *name;        /* "--model", or the only spelling ("-n") */
    const char *alias;       /* the short spelling ("-m") or NULL */
    size_t off, size;        /* the field: LM_OPT_AT(type, field) */
    const char *meta;        /* the value in help ("PATH"); CHOICE: NULL lists the names */
    const char *help;
    const char *dflt;        /* the default in words; NULL: the field's initial value, if any */
    long long ilo, ihi;      /* INT range; SIZE: the least bytes; STRING: 1 = not empty */
    double lo, hi;           /* FLOAT range */
    bool lo_open, hi_open;   /* FLOAT: the end itself is out */
    const lm_opt_choice *choices;                /* CHOICE: ends with a NULL name */
    bool (*parse)(void *dst, const char *text);  /* CUSTOM */
    const char *want;                            /* CUSTOM: a good value, for the error */
    const lm_opt *group;                         /* GROUP */
};

/* Where a field lives: its offset and size in the command's struct. */
#define LM_OPT_AT(type, field) .off = offsetof(type, field), .size = sizeof(((type *)0)->field)

/* A command: its synopsis, what it does, its table and its defaults. */
typedef struct lm_opt_cmd {
    const char *name;        /* "run": messages say "lumen run: ..." */
    const char *usage;       /* "lumen run [-m MODEL] ..." */
    const char *about;       /* paragraphs after the usage line (ends with "\n") */
    const lm_opt *opts;
    const char *epilog;      /* text after the options, or NULL */
    const void *defaults;    /* the struct before any argument; --help shows these */
    size_t size;             /* of that struct */
} lm_opt_cmd;

/* Fills dst (cmd->size bytes) with cmd's defaults, then argv[1..]. Returns
 * -1 when the command should go on; else the status it should exit with at
 * once: 0 after --help (printed to stdout), 2 after a usage error (explained
 * on stderr). */
int lm_opts_parse(const lm_opt_cmd *cmd, void *dst, int argc, char **argv);
/* The same, with the help to out and the errors to err (tests). */
int lm_opts_parse_io(const lm_opt_cmd *cmd, void *dst, int argc, char **argv, FILE *out, FILE *err);
/* The usage, the about text, every entry with its default, the epilog. */
void lm_opts_help(const lm_opt_cmd *cmd, FILE *f);

/* The value parsers the table kinds use, for the odd option parsed by hand. */
bool lm_opt_int(const char *s, long long lo, long long hi, long long *out);
bool lm_opt_float(const char *s, double *out);
/* A byte size: a whole number with an optional K, M, G or T suffix (powers of
 * 1024, then an optional B or iB); false for anything else, a fraction, or
 * more than 2^60 bytes. */
bool lm_opt_size(const char *s, size_t *out);

#endif
