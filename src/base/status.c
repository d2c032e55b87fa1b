#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>

hm_status hm_error_set(hm_error *err, hm_status status, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
        err->status = status;
    }
    return status;
}

void hm_error_clear(hm_error *err) {
    if (err) {
        err->status = HM_OK;
        err->msg[0] = '\0';
    }
}

const char *hm_status_str(hm_status status) {
    switch (status) {
    case HM_OK: return "ok";
    case HM_ERR_IO: return "I/O error";
    case HM_ERR_FORMAT: return "format error";
    case HM_ERR_UNSUPPORTED: return "unsupported";
    case HM_ERR_NOMEM: return "out of memory";
    case HM_ERR_ARG: return "invalid argument";
    case HM_ERR_NOT_FOUND: return "not found";
    case HM_ERR_RANGE: return "out of range";
    case HM_ERR_CUDA: return "CUDA error";
    case HM_ERR_STATE: return "invalid state";
    }
    return "unknown status";
}
