#include "base/text.h"

#include <stdarg.h>
#include <stdio.h>

void hm_text_put(hm_text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *dst = t->len < t->cap ? t->buf + t->len : NULL;
    const size_t room = t->len < t->cap ? t->cap - t->len : 0;
    const int k = vsnprintf(dst, room, fmt, ap);
    va_end(ap);
    if (k > 0) t->len += (size_t)k;
}
