/* test_chat_effort.c - the harmony reasoning effort (gpt-oss): low, medium and high are
 * rendered into the system message, for OpenAI's template and forge's; any other value is an
 * HM_ERR_ARG naming it and the allowed ones (the template would write it into the prompt as it
 * is); other families ignore the option. */
#include <stdlib.h>
#include <string.h>

#include "forge/forge.h"
#include "forge/forge_vocab_internal.h"
#include "harness.h"
#include "tokenizer/chat.h"

static const chat_message k_msgs[] = {{"user", "Hi"}};

/* renders k_msgs with effort; returns the text (caller frees) or NULL with *st set */
static char *render(const chat_template *t, const char *effort, hm_status *st, hm_error *err) {
    chat_render_opts o = chat_render_default_opts();
    o.date = "2026-11-22";
    o.reasoning_effort = effort;
    char *text = NULL;
    *st = chat_render(t, k_msgs, 1, &o, &text, NULL, err);
    return text;
}

static void check_family(const chat_template *t, const char *what) {
    static const char *const ok[] = {"low", "medium", "high"};
    for (int i = 0; i < 3; i++) {
        hm_status st;
        hm_error err = {0};
        char *text = render(t, ok[i], &st, &err);
        char want[64];
        snprintf(want, sizeof(want), "Reasoning: %s", ok[i]);
        HM_CHECK_MSG(st == HM_OK && text && strstr(text, want), "%s %s: %s", what, ok[i],
                     st == HM_OK ? text : err.msg);
        free(text);
    }
    static const char *const bad[] = {"extreme", "HIGH", "", "medium\n\n# injected"};
    for (int i = 0; i < 4; i++) {
        hm_status st;
        hm_error err = {0};
        char *text = render(t, bad[i], &st, &err);
        HM_CHECK_MSG(st == HM_ERR_ARG && !text, "%s '%s': rendered", what, bad[i]);
        char want[96];
        snprintf(want, sizeof(want), "reasoning effort '%s' is not one of low, medium, high",
                 bad[i]);
        HM_CHECK_MSG(strstr(err.msg, want) != NULL, "%s '%s': message '%s'", what, bad[i],
                     err.msg);
        free(text);
    }
    hm_status st;
    hm_error err = {0};
    char *text = render(t, NULL, &st, &err); /* the template's default */
    HM_CHECK_MSG(st == HM_OK && text && strstr(text, "Reasoning: medium"), "%s default", what);
    free(text);
}

static void test_valid(void) {
    HM_CHECK(chat_reasoning_effort_valid("low") && chat_reasoning_effort_valid("medium") &&
             chat_reasoning_effort_valid("high"));
    HM_CHECK(!chat_reasoning_effort_valid(NULL) && !chat_reasoning_effort_valid("") &&
             !chat_reasoning_effort_valid("Low") && !chat_reasoning_effort_valid("highest"));
}

static void test_openai(void) {
    chat_template t;
    hm_error err = {0};
    HM_REQUIRE(chat_template_from_name("harmony", &t, &err) == HM_OK);
    check_family(&t, "harmony (OpenAI)");
    chat_template_free(&t);
}

static void test_forge(void) {
    const char *j = forge_chat_template(FORGE_ARCH_GPTOSS);
    HM_REQUIRE(j);
    chat_template t;
    hm_error err = {0};
    HM_REQUIRE(chat_template_detect(j, strlen(j), &t, &err) == HM_OK);
    HM_REQUIRE(t.family == CHAT_HARMONY && t.harmony_preamble);
    check_family(&t, "harmony (forge)");
    chat_template_free(&t);
}

static void test_other_families(void) {
    chat_template t;
    hm_error err = {0};
    HM_REQUIRE(chat_template_from_name("chatml", &t, &err) == HM_OK);
    hm_status st;
    char *text = render(&t, "extreme", &st, &err);
    HM_CHECK_MSG(st == HM_OK && text, "chatml: %s", err.msg);
    free(text);
    chat_template_free(&t);
}

HM_TEST_MAIN(test_valid, test_openai, test_forge, test_other_families)
