/* lm_test.h - a tiny self-registering test framework.
 *
 *   LM_TEST(name) { ... LM_CHECK(cond); LM_CHECK_NEAR(a, b, tol); ... }
 *
 * Every tests/test_*.c is linked into one binary; tests register themselves
 * at load time. The runner prints one line per test and ends with
 * "N passed, N failed, N skipped". A test that cannot run here (missing
 * fixture, missing CPU feature) calls LM_SKIP("why"), which prints the reason
 * and counts as skipped, never as passed. */
#ifndef LM_TEST_H
#define LM_TEST_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* a equals b, false when a is NULL (a missing JSON field: the check fails
 * instead of the test crashing). */
static inline bool lm_streq(const char *a, const char *b) { return a && b && !strcmp(a, b); }

typedef struct lm_test_ctx {
    int failed;
    int skipped;
    char skip_reason[1024];
} lm_test_ctx;

typedef void (*lm_test_fn)(lm_test_ctx *lm_t_);
void lm_test_register(const char *name, const char *file, lm_test_fn fn);

#define LM_TEST(name)                                                      \
    static void lm_test_##name(lm_test_ctx *lm_t_);                        \
    __attribute__((constructor)) static void lm_test_reg_##name(void) {    \
        lm_test_register(#name, __FILE__, lm_test_##name);                 \
    }                                                                      \
    static void lm_test_##name(lm_test_ctx *lm_t_)

#define LM_CHECK(c)                                                              \
    do {                                                                         \
        if (!(c)) {                                                              \
            fprintf(stderr, "  %s:%d: check failed: %s\n", __FILE__, __LINE__, #c); \
            lm_t_->failed++;                                                     \
        }                                                                        \
    } while (0)

#define LM_CHECK_MSG(c, ...)                                          \
    do {                                                              \
        if (!(c)) {                                                   \
            fprintf(stderr, "  %s:%d: check failed: %s: ", __FILE__, __LINE__, #c); \
            fprintf(stderr, __VA_ARGS__);                             \
            fprintf(stderr, "\n");                                    \
            lm_t_->failed++;                                          \
        }                                                             \
    } while (0)

#define LM_CHECK_NEAR(a, b, tol)                                                       \
    do {                                                                               \
        double lm_a_ = (a), lm_b_ = (b);                                               \
        if (!(fabs(lm_a_ - lm_b_) <= (tol))) {                                         \
            fprintf(stderr, "  %s:%d: %s = %.9g, %s = %.9g, |diff| > %g\n", __FILE__, \
                    __LINE__, #a, lm_a_, #b, lm_b_, (double)(tol));                    \
            lm_t_->failed++;                                                           \
        }                                                                              \
    } while (0)

/* Stops the test: return after a fatal check. */
#define LM_REQUIRE(c)                                                            \
    do {                                                                         \
        if (!(c)) {                                                              \
            fprintf(stderr, "  %s:%d: required check failed: %s\n", __FILE__, __LINE__, #c); \
            lm_t_->failed++;                                                     \
            return;                                                              \
        }                                                                        \
    } while (0)

#define LM_SKIP(...)                                                                  \
    do {                                                                              \
        snprintf(lm_t_->skip_reason, sizeof lm_t_->skip_reason, __VA_ARGS__);         \
        lm_t_->skipped = 1;                                                           \
        return;                                                                       \
    } while (0)

/* Where ../shared/fixtures is (LUMEN_FIXTURES overrides); NULL if absent. */
const char *lm_test_fixtures(void);
/* A path under the fixtures dir (static buffer per call site is not safe;
 * returns a malloc'd string the caller frees), or NULL if fixtures absent. */
char *lm_test_fixture_path(const char *rel);
/* Whether the fixture at rel is there. */
bool lm_test_have_fixture(const char *rel);
/* Why lm_test_fixture_path returned NULL, for skip messages. */
const char *lm_test_fixtures_why(void);
/* Whether the checkout's own rel (tests/data/..., models/demo) may be used:
 * true when it is there (a folder: not empty), and when it is not but
 * LUMEN_FIXTURES_PARTIAL is unset (the test then fails on it, as it should
 * in CI). False: a device call left it out of its upload (a folder may
 * arrive empty), and the test skips, saying so. */
bool lm_test_source_carried(const char *rel);
/* Skips the test when rel of the checkout was not carried (lm_test_source_carried). */
#define LM_SKIP_UNLESS_CARRIED(rel)                                                      \
    do {                                                                                 \
        if (!lm_test_source_carried(rel))                                                \
            LM_SKIP("%s is not carried to this machine (LUMEN_FIXTURES_PARTIAL)", rel); \
    } while (0)
/* The lumen binary, for tests that run the CLI (LUMEN_BIN, set by the build). */
const char *lm_test_lumen_bin(void);
/* A fresh temporary directory for this test (removed by the runner at exit). */
const char *lm_test_tmpdir(void);

#endif
