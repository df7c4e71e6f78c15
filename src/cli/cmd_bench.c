/* cmd_bench.c - `lumen bench` (being written). */
#include <stdio.h>
#include "cli.h"
int lm_cmd_bench(int argc, char **argv) {
    fprintf(stderr, "lumen bench: not yet\n");
    return 2;
}
