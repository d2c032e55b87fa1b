/* text.h - formatted text appended to a caller's buffer, snprintf's way: what does not fit is
 * cut (the buffer stays NUL-terminated when cap > 0) and len counts every byte asked for, so a
 * caller that sees len >= cap knows the size it needed. */
#ifndef HM_BASE_TEXT_H
#define HM_BASE_TEXT_H

#include <stddef.h>

typedef struct {
    char *buf;  /* [cap] */
    size_t cap;
    size_t len; /* bytes written or wanted so far */
} hm_text;

void hm_text_put(hm_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
