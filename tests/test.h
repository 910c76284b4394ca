/* test.h -- the tiny test framework of rockmate's suite.
 *
 * Each tests/test_*.c is one program: TEST(name) functions, run from main()
 * with RUN(name), ending with TEST_END() which prints
 * "<file>: N passed, N failed" and returns non-zero on failure.
 * tests/run.sh runs every program and prints the total line. */
#ifndef RKM_TEST_H
#define RKM_TEST_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_passed, test_failed, test_current_failed;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            test_current_failed = 1;                                                 \
        }                                                                            \
    } while (0)

#define CHECK_EQ_U64(a, b)                                                                        \
    do {                                                                                          \
        unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b);            \
        if (a_ != b_) {                                                                           \
            fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%llu != %llu)\n", __FILE__, __LINE__, \
                    #a, #b, a_, b_);                                                              \
            test_current_failed = 1;                                                              \
        }                                                                                         \
    } while (0)

#define TEST(name) static void name(void)

#define RUN(name)                                             \
    do {                                                      \
        test_current_failed = 0;                              \
        name();                                               \
        if (test_current_failed) {                            \
            test_failed++;                                    \
            fprintf(stderr, "FAIL %s\n", #name);              \
        } else {                                              \
            test_passed++;                                    \
        }                                                     \
    } while (0)

#define TEST_END()                                                             \
    do {                                                                       \
        printf("%s: %d passed, %d failed\n", __FILE__, test_passed, test_failed); \
        return test_failed != 0;                                               \
    } while (0)

/* Where the bundled graphs are (the Makefile passes -DTEST_GRAPHS_DIR). */
#ifndef TEST_GRAPHS_DIR
#define TEST_GRAPHS_DIR "tests/graphs"
#endif

#endif
