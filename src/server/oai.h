/* oai.h - OpenAI-style requests and responses of `hotmoe serve` (server/server.c): the body of
 * POST /v1/completions and /v1/chat/completions into one request, and the JSON texts sent back
 * (whole responses, stream chunks, errors in OpenAI's shape). Pure: jansson only, no I/O.
 *
 * DESIGN: the parser checks every field it takes (type, range) and refuses what it cannot
 * honour (n > 1, a tool call, a message without text) with HM_ERR_ARG and a message naming the
 * field, which the server returns as a 400 in OpenAI's error shape; unknown fields are ignored,
 * as OpenAI's clients send many. Sampling fields default to the server's (its -t, --temp, ...).
 */
#ifndef HM_SERVER_OAI_H
#define HM_SERVER_OAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "sample/sample.h"
#include "tokenizer/chat.h"

enum { OAI_STOP_MAX = 4, OAI_MSG_MAX = 256 };

typedef struct {
    bool chat;               /* /v1/chat/completions (messages) or /v1/completions (prompt) */
    char *prompt;            /* completions: the prompt text (malloc'd) */
    chat_message *msgs;      /* chat: [n_msgs] (role and content malloc'd) */
    int n_msgs;
    int max_tokens;          /* -1: until the end of the turn or a full context */
    bool stream;
    bool include_usage;      /* stream_options.include_usage */
    sample_params sp;
    bool seed_given;         /* the request named its seed */
    bool cache_prompt;       /* llama-server's cache_prompt (default true): a slot may reuse what
                                its cache holds of the prompt */
    bool ignore_eos;         /* llama-server's ignore_eos: the end-of-generation tokens do not
                                end the text (max_tokens or a full context does) */
    char *stop[OAI_STOP_MAX]; /* stop strings (malloc'd), none after the last */
    int n_stop;
} oai_request;

/* Parses body (len bytes) for the route; defaults: sampling from *defaults. HM_ERR_FORMAT for
 * text that is not JSON, HM_ERR_ARG for a field of the wrong type or range (err names it). */
hm_status oai_parse(const char *body, size_t len, bool chat, const sample_params *defaults,
                    oai_request *out, hm_error *err);
void oai_request_free(oai_request *r);

typedef struct {
    const char *id;          /* "chatcmpl-7" */
    const char *model;
    int64_t created;         /* seconds since the epoch */
    bool chat;
    bool first;              /* a chat stream's first chunk: its delta names the role */
} oai_meta;

/* The whole response (malloc'd JSON text): the generated text, why it ended ("stop",
 * "length"), token counts. NULL when out of memory. */
char *oai_response(const oai_meta *m, const char *text, size_t len, const char *finish,
                   int prompt_tokens, int completion_tokens);
/* One stream chunk "data: {...}\n\n" (malloc'd): text (a delta, may be empty; a chat's first
 * also names the role "assistant", as OpenAI's does), finish NULL until the last; usage
 * (prompt_tokens >= 0) in a final chunk without choices when asked. */
char *oai_chunk(const oai_meta *m, const char *text, size_t len, const char *finish);
char *oai_usage_chunk(const oai_meta *m, int prompt_tokens, int completion_tokens);
/* An error body in OpenAI's shape {"error": {"message", "type", "code"}} (malloc'd). */
char *oai_error(const char *message, const char *type, int code);

#endif
