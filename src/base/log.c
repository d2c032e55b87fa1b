#include "base/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* -1: not yet read from the environment. Atomic so that any thread may log first. */
static atomic_int g_level = -1;

static int level_from_env(void) {
    const char *s = getenv("HOTMOE_LOG");
    if (!s) return HM_LOG_INFO;
    if (!strcmp(s, "error")) return HM_LOG_ERROR;
    if (!strcmp(s, "warn")) return HM_LOG_WARN;
    if (!strcmp(s, "debug")) return HM_LOG_DEBUG;
    return HM_LOG_INFO;
}

void hm_log_set_level(hm_log_level level) { atomic_store(&g_level, (int)level); }

hm_log_level hm_log_get_level(void) {
    int l = atomic_load(&g_level);
    if (l < 0) {
        l = level_from_env();
        atomic_store(&g_level, l);
    }
    return (hm_log_level)l;
}

void hm_log(hm_log_level level, const char *fmt, ...) {
    static const char *const tag[] = {"error", "warn", "info", "debug"};
    if (level > hm_log_get_level()) return;
    char line[8192]; /* the pool profile of a one-job decode step lists every stage */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "hotmoe %s: %s\n", tag[level], line);
}
