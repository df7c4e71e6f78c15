/* runner.c - runs every registered test (or those whose name contains argv[1])
 * and ends with the line "N passed, N failed, N skipped"; `--count` prints
 * how many tests there are.
 *
 * LUMEN_TEST_QUEUE=FILE: several runners share the work, a test file at a
 * time: each takes the next file's number from FILE (a counter under an
 * flock) until none is left, so two runners on two cores finish within
 * about one file's time of each other (scripts/test.sh). */
#include "lm_test.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

typedef struct entry {
    const char *name, *file;
    lm_test_fn fn;
} entry;

static entry *g_tests;
static int g_n, g_cap;
static char g_tmp[256];

void lm_test_register(const char *name, const char *file, lm_test_fn fn) {
    if (g_n == g_cap) {
        g_cap = g_cap ? g_cap * 2 : 64;
        g_tests = realloc(g_tests, (size_t)g_cap * sizeof *g_tests);
        if (!g_tests) abort();
    }
    g_tests[g_n++] = (entry){ name, file, fn };
}

const char *lm_test_fixtures(void) {
    static char buf[1024];
    const char *env = getenv("LUMEN_FIXTURES");
    const char *cand = env ? env : LUMEN_SOURCE_DIR "/../shared/fixtures";
    char probe[1100];
    snprintf(probe, sizeof probe, "%s/README.md", cand);
    if (access(probe, R_OK) != 0) return NULL;
    snprintf(buf, sizeof buf, "%s", cand);
    return buf;
}

/* The device machine gets only some fixtures per call (its upload limit):
 * LUMEN_FIXTURES_PARTIAL=1 makes an absent one a skip instead of a failure. */
static bool fixtures_partial(void) {
    const char *p = getenv("LUMEN_FIXTURES_PARTIAL");
    return p && *p && strcmp(p, "0") != 0;
}

char *lm_test_fixture_path(const char *rel) {
    const char *f = lm_test_fixtures();
    if (!f) return NULL;
    size_t n = strlen(f) + strlen(rel) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", f, rel);
    if (fixtures_partial() && access(p, R_OK) != 0) {
        free(p);
        return NULL;
    }
    return p;
}

bool lm_test_have_fixture(const char *rel) {
    char *p = lm_test_fixture_path(rel);
    bool ok = p && access(p, R_OK) == 0;
    free(p);
    return ok;
}

const char *lm_test_fixtures_why(void) {
    if (!lm_test_fixtures()) return "../shared/fixtures not found (set LUMEN_FIXTURES)";
    return fixtures_partial() ? "fixture not in this partial set (LUMEN_FIXTURES_PARTIAL)" : "fixture not found";
}

bool lm_test_source_carried(const char *rel) {
    if (!fixtures_partial()) return true;
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", LUMEN_SOURCE_DIR, rel);
    /* a folder left out of an upload may arrive empty (its files deleted) */
    DIR *d = opendir(p);
    if (!d) return access(p, R_OK) == 0;
    bool any = false;
    for (struct dirent *e; !any && (e = readdir(d));) any = strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return any;
}

const char *lm_test_lumen_bin(void) {
    const char *env = getenv("LUMEN_BIN");
    return env ? env : LUMEN_BIN_PATH;
}

const char *lm_test_tmpdir(void) {
    if (!g_tmp[0]) {
        snprintf(g_tmp, sizeof g_tmp, "/tmp/lumen-test-XXXXXX");
        if (!mkdtemp(g_tmp)) abort();
    }
    return g_tmp;
}

static int by_file_then_order(const void *a, const void *b) {
    const entry *x = a, *y = b;
    int c = strcmp(x->file, y->file);
    if (c) return c;
    return (x < y) ? -1 : (x > y);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A test's wall time after its line when it took a second or more, so the
 * suite's slow parts show in every CI log. */
static void print_time(double s) {
    if (s >= 1.0) printf(" (%.1f s)", s);
    printf("\n");
}

/* The next test file's number from the shared counter at path (each
 * number is handed out once), or -1 when the counter cannot be used. */
static int queue_next(const char *path) {
    int fd = open(path, O_RDWR | O_CREAT, 0600), k = -1;
    if (fd < 0) return -1;
    if (flock(fd, LOCK_EX) == 0) {
        char buf[32] = { 0 };
        ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
        k = n > 0 ? atoi(buf) : 0;
        int len = snprintf(buf, sizeof buf, "%d\n", k + 1);
        if (pwrite(fd, buf, (size_t)len, 0) != len || ftruncate(fd, len) != 0) k = -1;
        flock(fd, LOCK_UN);
    }
    close(fd);
    return k;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--count")) { /* how many tests there are (scripts/test.sh checks the runners' sum) */
        printf("%d\n", g_n);
        return 0;
    }
    const char *filter = argc > 1 ? argv[1] : NULL;
    const char *queue = getenv("LUMEN_TEST_QUEUE");
    qsort(g_tests, (size_t)g_n, sizeof *g_tests, by_file_then_order);
    int passed = 0, failed = 0, skipped = 0;
    int file = -1, mine = queue ? queue_next(queue) : -1; /* the file number of test i; the one this runner takes */
    for (int i = 0; i < g_n; i++) {
        file += i == 0 || strcmp(g_tests[i].file, g_tests[i - 1].file) != 0;
        if (queue) {
            while (mine >= 0 && mine < file) mine = queue_next(queue);
            if (mine < 0) {
                fprintf(stderr, "runner: the queue %s cannot be used\n", queue);
                return 1;
            }
            if (mine != file) continue;
        }
        if (filter && !strstr(g_tests[i].name, filter)) continue;
        lm_test_ctx ctx = { 0 };
        fflush(stdout);
        double t0 = now_s();
        g_tests[i].fn(&ctx);
        double took = now_s() - t0;
        if (ctx.failed) {
            printf("FAIL %s (%d checks)", g_tests[i].name, ctx.failed);
            failed++;
        } else if (ctx.skipped) {
            printf("skip %s: %s", g_tests[i].name, ctx.skip_reason);
            skipped++;
        } else {
            printf("ok   %s", g_tests[i].name);
            passed++;
        }
        print_time(took);
        fflush(stdout);
    }
    if (g_tmp[0] && getenv("LUMEN_TEST_KEEP")) { /* for looking at what a test wrote */
        fprintf(stderr, "kept %s (LUMEN_TEST_KEEP)\n", g_tmp);
    } else if (g_tmp[0]) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
