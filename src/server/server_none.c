/* server_none.c - hm_server_* in a build without libmicrohttpd: the server says so. */
#include "server/server.h"

#include <string.h>

hm_server_params hm_server_default_params(void) {
    return (hm_server_params){.host = "127.0.0.1", .port = 8080, .queue_max = 64,
                              .body_max = 1u << 20};
}

hm_status hm_server_start(const hm_server_params *p, const hm_server_model *m, hm_server **out,
                          hm_error *err) {
    (void)p, (void)m;
    *out = NULL;
    return hm_error_set(err, HM_ERR_UNSUPPORTED, "this hotmoe was built without libmicrohttpd "
                        "(install libmicrohttpd-dev and build again)");
}

int hm_server_port(const hm_server *s) {
    (void)s;
    return 0;
}

void hm_server_stop(hm_server *s, int drain_ms) { (void)s, (void)drain_ms; }

void hm_server_get_stats(const hm_server *s, hm_server_stats *out) {
    (void)s;
    memset(out, 0, sizeof(*out));
}
