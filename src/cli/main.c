/* main.c - the lumen command line (being written). */
#include <stdio.h>
int main(void) {
    fprintf(stderr, "lumen: no commands yet\n");
    return 2;
}
