/* harness.h - the test harness: every test program is a list of test functions run by
 * HM_TEST_MAIN, which prints one line per failed check and ends with "N passed, N failed".
 *
 *   static void test_roundtrip(void) { HM_CHECK(x == y); HM_CHECK_MSG(ok, "row %d", r); }
 *   HM_TEST_MAIN(test_roundtrip, test_other)
 *
 * A test "passes" when none of its checks failed. The exit status is non-zero on any failure. */
#ifndef HM_TESTS_HARNESS_H
#define HM_TESTS_HARNESS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int hm_t_failed_checks;

#define HM_CHECK(cond)                                                                     \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);       \
            hm_t_failed_checks++;                                                          \
        }                                                                                  \
    } while (0)

#define HM_CHECK_MSG(cond, ...)                                                            \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);      \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
            hm_t_failed_checks++;                                                          \
        }                                                                                  \
    } while (0)

/* Stops the current test function (not the program) when cond fails. */
#define HM_REQUIRE(cond)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "%s:%d: requirement failed: %s\n", __FILE__, __LINE__, #cond); \
            hm_t_failed_checks++;                                                          \
            return;                                                                        \
        }                                                                                  \
    } while (0)

/* stderr (where the log goes) kept in memory from hm_t_log_begin to hm_t_log_end, which returns
 * the text: malloc'd, "" when nothing was written or the capture could not start. */
typedef struct {
    FILE *saved, *mem;
    char *buf;
    size_t len;
} hm_t_log;

static inline void hm_t_log_begin(hm_t_log *l) {
    l->buf = NULL;
    l->len = 0;
    l->saved = stderr;
    l->mem = open_memstream(&l->buf, &l->len);
    if (l->mem) stderr = l->mem;
}

static inline char *hm_t_log_end(hm_t_log *l) {
    if (l->mem) {
        stderr = l->saved;
        fclose(l->mem);
    }
    return l->buf ? l->buf : (char *)calloc(1, 1);
}

/* The tests' random numbers: xorshift64 on *state (a test's own seed), the upper bits. */
static inline unsigned hm_t_rnd(unsigned long long *state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (unsigned)(*state >> 16);
}

typedef void (*hm_t_fn)(void);

static inline int hm_t_run(const char *names, hm_t_fn *fns, int n) {
    int passed = 0, failed = 0;
    char buf[4096];
    snprintf(buf, sizeof(buf), "%s", names);
    char *save = NULL, *name = strtok_r(buf, ", ", &save);
    for (int i = 0; i < n; i++) {
        int before = hm_t_failed_checks;
        fns[i]();
        int ok = hm_t_failed_checks == before;
        printf("%-6s %s\n", ok ? "ok" : "FAIL", name ? name : "?");
        fflush(stdout);
        if (ok) passed++; else failed++;
        name = strtok_r(NULL, ", ", &save);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

#define HM_TEST_MAIN(...)                                                                  \
    int main(void) {                                                                       \
        hm_t_fn fns[] = {__VA_ARGS__};                                                     \
        return hm_t_run(#__VA_ARGS__, fns, (int)(sizeof(fns) / sizeof(fns[0])));           \
    }

#endif
