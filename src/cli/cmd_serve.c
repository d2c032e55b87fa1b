/* cmd_serve.c - `hotmoe serve -m MODEL [--host H] [--port P] [--api-key K] [options]`: the
 * OpenAI-compatible server (server/server.h) over one context, until SIGTERM or Ctrl-C, which
 * let the requests in flight finish (at most 10 s) and exit 0.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/engine.h"
#include "server/server.h"

#define CMD "serve"
#define DRAIN_MS 10000

int cmd_serve(int argc, char **argv) {
    const char *host = "127.0.0.1", *api_key = NULL, *tmpl_name = NULL, *alias = NULL;
    int port = 8080, n_parallel = 1, queue = 64;
    const cli_arg_spec extra[] = {
        {"--host", NULL, CLI_ARG_STR, &host, "ADDR", "IPv4 address to listen on (default: "
                                                      "127.0.0.1)"},
        {"--port", NULL, CLI_ARG_INT, &port, "N", "port (default: 8080; 0: any free one, printed)"},
        {"--api-key", NULL, CLI_ARG_STR, &api_key, "KEY",
         "require Authorization: Bearer KEY on /v1/ routes (default: none)"},
        {"-np", "--parallel", CLI_ARG_INT, &n_parallel, "N",
         "requests decoded at once, batched together; -c is split between them (default: 1; "
         "on the CPU engine; docs/SERVER.md says where else)"},
        {"--queue", NULL, CLI_ARG_INT, &queue, "N", "requests that may wait (default: 64; more: "
                                                    "503)"},
        {"--chat-template", NULL, CLI_ARG_STR, &tmpl_name, "NAME",
         "chatml, harmony, mistral, mistral-legacy or tulu instead of the model's template"},
        {"-a", "--alias", CLI_ARG_STR, &alias, "NAME", "the model's id in /v1/models (default: "
                                                       "the file's path)"},
    };
    const cli_args_def def = {CMD, "-m MODEL [--host ADDR] [--port N] [options]",
                              "OpenAI-compatible HTTP server: POST /v1/chat/completions, POST "
                              "/v1/completions (stream: server-sent events), GET /v1/models, "
                              "GET /health. SIGTERM or Ctrl-C let the requests in flight finish "
                              "(at most 10 s).",
                              CLI_ARGS_MODEL | CLI_ARGS_CONTEXT | CLI_ARGS_THREADS |
                                  CLI_ARGS_SAMPLING,
                              extra, sizeof(extra) / sizeof(extra[0])};
    cli_common_args a;
    int rc = cli_args_parse(&def, argc, argv, &a);
    if (rc != CLI_ARGS_CONTINUE) return rc;
    if (port < 0 || port > 65535 || queue < 1 || n_parallel < 1) {
        fprintf(stderr, "hotmoe " CMD ": --port must be in [0, 65535], --queue and -np >= 1\n");
        return 2;
    }
    a.n_seq = n_parallel;
    cli_engine e;
    rc = cli_engine_open(&e, CMD, &a, CLI_ENGINE_VOCAB, 0);
    if (rc) return rc;
    hm_error err = {0};
    chat_template tmpl;
    const bool have_tmpl =
        chat_template_for_model(hm_model_gguf(e.model), tmpl_name, &tmpl, &err) == HM_OK;
    if (!have_tmpl && tmpl_name) {
        fprintf(stderr, "hotmoe " CMD ": %s\n", err.msg);
        cli_engine_close(&e);
        return 2;
    }
    if (!have_tmpl)
        fprintf(stderr, "hotmoe " CMD ": no chat template (%s): /v1/chat/completions answers "
                "400\n", err.msg);
    sample_params sp = sample_params_default();
    sp.temperature = a.temp, sp.top_k = a.top_k, sp.top_p = a.top_p, sp.min_p = a.min_p;
    sp.repeat_penalty = a.repeat_penalty, sp.presence_penalty = a.presence_penalty;
    sp.frequency_penalty = a.frequency_penalty;
    sp.penalty_last_n = a.repeat_last_n < 0 ? hm_context_n_ctx(e.ctx) : a.repeat_last_n;
    sp.seed = a.seed == CLI_SEED_RANDOM ? 0 : a.seed;
    const hm_server_model m = {.ctx = e.ctx, .vocab = e.vocab, .tmpl = have_tmpl ? &tmpl : NULL,
                               .model_name = alias ? alias : a.model, .defaults = sp,
                               .seed_random = a.seed == CLI_SEED_RANDOM};
    hm_server_params p = hm_server_default_params();
    p.host = host, p.port = port, p.api_key = api_key, p.queue_max = queue;
    /* SIGINT and SIGTERM wait for sigwait below, in every thread the server starts */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    hm_server *srv = NULL;
    int status = 0;
    if (hm_server_start(&p, &m, &srv, &err) != HM_OK) {
        fprintf(stderr, "hotmoe " CMD ": %s\n", err.msg);
        status = 1;
    } else {
        fprintf(stderr, "hotmoe " CMD ": listening on http://%s:%d (model %s, context %d%s%d "
                "slots)\n", host, hm_server_port(srv), m.model_name, hm_context_n_ctx(e.ctx),
                n_parallel > 1 ? " per slot, " : ", ", n_parallel);
        int sig = 0;
        sigwait(&set, &sig);
        fprintf(stderr, "hotmoe " CMD ": %s: finishing the requests in flight\n",
                sig == SIGTERM ? "SIGTERM" : "interrupted");
        hm_server_stats st;
        hm_server_get_stats(srv, &st);
        hm_server_stop(srv, DRAIN_MS);
        fprintf(stderr, "hotmoe " CMD ": %llu requests, %llu completed, %llu errors, %llu "
                "cancelled, %llu refused (queue full)\n", (unsigned long long)st.requests,
                (unsigned long long)st.completed, (unsigned long long)st.errors,
                (unsigned long long)st.cancelled, (unsigned long long)st.rejected);
    }
    if (have_tmpl) chat_template_free(&tmpl);
    cli_engine_close(&e);
    return status;
}
