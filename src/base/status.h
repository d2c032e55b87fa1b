/* status.h - status codes and error messages shared by every module.
 *
 * DESIGN: library functions return an hm_status and, when the caller passes an hm_error,
 * write one line into it that names the problem (file, field, tensor, byte offset, value).
 * Nothing in the library prints errors or exits; the CLI decides what to do with the line.
 */
#ifndef HM_BASE_STATUS_H
#define HM_BASE_STATUS_H

#include <stddef.h>

typedef enum {
    HM_OK = 0,
    HM_ERR_IO,          /* open/read/write/mmap failed */
    HM_ERR_FORMAT,      /* input is malformed (corrupt or truncated file, bad JSON, ...) */
    HM_ERR_UNSUPPORTED, /* well-formed but not handled here (type, architecture, version) */
    HM_ERR_NOMEM,       /* allocation failed or a size would overflow */
    HM_ERR_ARG,         /* caller passed an invalid argument */
    HM_ERR_NOT_FOUND,   /* key, tensor or file missing */
    HM_ERR_RANGE,       /* value outside the allowed range */
    HM_ERR_CUDA,        /* CUDA runtime or driver error */
    HM_ERR_STATE,       /* call not allowed in the object's current state */
} hm_status;

#define HM_ERROR_MSG_MAX 512

typedef struct {
    hm_status status;
    char msg[HM_ERROR_MSG_MAX];
} hm_error;

/* Sets err (if non-NULL) to status and a printf-style message; returns status so that
 * callers can write `return hm_error_set(err, HM_ERR_FORMAT, "...", ...);`. */
hm_status hm_error_set(hm_error *err, hm_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Clears err (if non-NULL). */
void hm_error_clear(hm_error *err);

/* Short name of a status code ("format error", "unsupported", ...). */
const char *hm_status_str(hm_status status);

#endif
