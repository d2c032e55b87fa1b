/* forge_json.h - a small JSON writer into a growing buffer (config.json, tokenizer.json, the
 * safetensors header). Objects print one member per line; arrays stay on one line. */
#ifndef HM_FORGE_JSON_H
#define HM_FORGE_JSON_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

#define FJ_MAX_DEPTH 32

typedef struct {
    char *buf;
    size_t len, cap;
    bool oom;
    bool pretty;
    int depth;
    bool first[FJ_MAX_DEPTH]; /* no member written yet at this depth */
    bool is_obj[FJ_MAX_DEPTH];
    bool after_key;
} fj;

void fj_init(fj *j, bool pretty);
void fj_free(fj *j);
void fj_obj_begin(fj *j);
void fj_obj_end(fj *j);
void fj_arr_begin(fj *j);
void fj_arr_end(fj *j);
void fj_key(fj *j, const char *k);
void fj_str(fj *j, const char *s);
void fj_int(fj *j, long long v);
void fj_num(fj *j, double v);
void fj_bool(fj *j, bool v);
void fj_null(fj *j);
/* key + value shorthands */
void fj_kstr(fj *j, const char *k, const char *s); /* s NULL writes null */
void fj_kint(fj *j, const char *k, long long v);
void fj_knum(fj *j, const char *k, double v);
void fj_kbool(fj *j, const char *k, bool v);
void fj_knull(fj *j, const char *k);
/* Appends raw bytes (no separator logic). */
void fj_raw(fj *j, const char *s, size_t n);
/* Writes the buffer to path (with a trailing newline). */
hm_status fj_write_file(fj *j, const char *path, hm_error *err);

#endif
