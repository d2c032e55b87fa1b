/* test_json.c - the streaming JSON writer: exact compact and pretty output, string escaping
 * (quotes, backslash, control characters, invalid UTF-8 -> U+FFFD, valid multi-byte kept),
 * shortest round-tripping numbers, NaN/inf as null, misuse reported by hm_json_finish, and the
 * FILE* mode producing the same text as the buffer mode. */
#include <math.h>
#include <stdint.h>

#include "base/json.h"
#include "harness.h"

static void build_sample(hm_json *j) {
    hm_json_obj_begin(j);
    hm_json_key(j, "name");
    hm_json_str(j, "moe");
    hm_json_key(j, "n");
    hm_json_int(j, -42);
    hm_json_key(j, "big");
    hm_json_uint(j, UINT64_MAX);
    hm_json_key(j, "ok");
    hm_json_bool(j, true);
    hm_json_key(j, "none");
    hm_json_null(j);
    hm_json_key(j, "list");
    hm_json_arr_begin(j);
    hm_json_int(j, 1);
    hm_json_arr_begin(j);
    hm_json_arr_end(j);
    hm_json_obj_begin(j);
    hm_json_obj_end(j);
    hm_json_arr_end(j);
    hm_json_obj_end(j);
}

static void test_compact(void) {
    hm_json j;
    hm_error err;
    hm_json_init_buf(&j, false);
    build_sample(&j);
    HM_REQUIRE(hm_json_finish(&j, &err) == HM_OK);
    size_t len;
    const char *s = hm_json_data(&j, &len);
    const char *want = "{\"name\":\"moe\",\"n\":-42,\"big\":18446744073709551615,\"ok\":true,"
                       "\"none\":null,\"list\":[1,[],{}]}";
    HM_CHECK_MSG(!strcmp(s, want), "got %s", s);
    HM_CHECK(len == strlen(want));
    hm_json_free(&j);
}

static void test_pretty(void) {
    hm_json j;
    hm_error err;
    hm_json_init_buf(&j, true);
    build_sample(&j);
    HM_REQUIRE(hm_json_finish(&j, &err) == HM_OK);
    const char *want = "{\n  \"name\": \"moe\",\n  \"n\": -42,\n  \"big\": 18446744073709551615,\n"
                       "  \"ok\": true,\n  \"none\": null,\n  \"list\": [\n    1,\n    [],\n    {}\n"
                       "  ]\n}";
    HM_CHECK_MSG(!strcmp(hm_json_data(&j, NULL), want), "got %s", hm_json_data(&j, NULL));
    hm_json_free(&j);
}

static void test_escaping(void) {
    hm_json j;
    hm_error err;
    hm_json_init_buf(&j, false);
    hm_json_arr_begin(&j);
    hm_json_str(&j, "q\"b\\s/n\nr\rt\tb\bf\f\x01\x1f\x7f");
    hm_json_strn(&j, "a\0b", 3);
    hm_json_str(&j, "\xc3\xa9\xe2\x96\x81\xf0\x9f\x98\x80");    /* é ▁ 😀 kept */
    hm_json_str(&j, "x\xff" "y\xc3" "z\xe2\x96" "\xed\xa0\x80" "\xc0\xaf"); /* invalid */
    hm_json_arr_end(&j);
    HM_REQUIRE(hm_json_finish(&j, &err) == HM_OK);
    const char *want = "[\"q\\\"b\\\\s/n\\nr\\rt\\tb\\bf\\f\\u0001\\u001f\x7f\",\"a\\u0000b\","
                       "\"\xc3\xa9\xe2\x96\x81\xf0\x9f\x98\x80\","
                       "\"x\\ufffdy\\ufffdz\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\"]";
    HM_CHECK_MSG(!strcmp(hm_json_data(&j, NULL), want), "got %s", hm_json_data(&j, NULL));
    hm_json_free(&j);
}

static void test_numbers(void) {
    hm_json j;
    hm_error err;
    hm_json_init_buf(&j, false);
    hm_json_arr_begin(&j);
    hm_json_double(&j, 0.1);
    hm_json_double(&j, 1.0 / 3.0);
    hm_json_double(&j, 1e300);
    hm_json_double(&j, -0.0);
    hm_json_double(&j, NAN);
    hm_json_double(&j, INFINITY);
    hm_json_float(&j, 0.1f);
    hm_json_float(&j, 3.5f);
    hm_json_float(&j, 1e-10f);
    hm_json_int(&j, INT64_MIN);
    hm_json_arr_end(&j);
    HM_REQUIRE(hm_json_finish(&j, &err) == HM_OK);
    const char *want = "[0.1,0.3333333333333333,1e+300,-0,null,null,0.1,3.5,1e-10,"
                       "-9223372036854775808]";
    HM_CHECK_MSG(!strcmp(hm_json_data(&j, NULL), want), "got %s", hm_json_data(&j, NULL));
    hm_json_free(&j);
}

static hm_status misuse(int which, hm_error *err) {
    hm_json j;
    hm_json_init_buf(&j, false);
    switch (which) {
    case 0: hm_json_obj_begin(&j); hm_json_int(&j, 1); hm_json_obj_end(&j); break; /* no key */
    case 1: hm_json_arr_begin(&j); hm_json_key(&j, "k"); hm_json_arr_end(&j); break;
    case 2: hm_json_arr_begin(&j); hm_json_obj_end(&j); break;
    case 3: hm_json_obj_begin(&j); break;                                       /* unclosed */
    case 4: break;                                                              /* nothing */
    case 5: hm_json_int(&j, 1); hm_json_int(&j, 2); break;                      /* two values */
    case 6: hm_json_obj_begin(&j); hm_json_key(&j, "k"); hm_json_obj_end(&j); break;
    default:
        for (int i = 0; i < HM_JSON_MAX_DEPTH + 1; i++) hm_json_arr_begin(&j);
        for (int i = 0; i < HM_JSON_MAX_DEPTH + 1; i++) hm_json_arr_end(&j);
        break;
    }
    hm_status st = hm_json_finish(&j, err);
    hm_json_free(&j);
    return st;
}

static void test_misuse(void) {
    hm_error err;
    for (int i = 0; i < 8; i++) {
        hm_status st = misuse(i, &err);
        HM_CHECK_MSG(st == HM_ERR_STATE && !strncmp(err.msg, "json: ", 6), "case %d: %d %s", i, st,
                     err.msg);
    }
}

static void test_file_mode(void) {
    FILE *f = tmpfile();
    HM_REQUIRE(f);
    hm_json j, b;
    hm_error err;
    hm_json_init_file(&j, f, true);
    hm_json_init_buf(&b, true);
    build_sample(&j);
    build_sample(&b);
    HM_CHECK(hm_json_finish(&j, &err) == HM_OK && hm_json_finish(&b, &err) == HM_OK);
    HM_CHECK(!strcmp(hm_json_data(&j, NULL), "")); /* nothing buffered in file mode */
    char got[1024] = {0};
    rewind(f);
    size_t n = fread(got, 1, sizeof(got) - 1, f);
    HM_CHECK(n == strlen(hm_json_data(&b, NULL)) && !strcmp(got, hm_json_data(&b, NULL)));
    fclose(f);
    hm_json_free(&j);
    hm_json_free(&b);
}

HM_TEST_MAIN(test_compact, test_pretty, test_escaping, test_numbers, test_misuse, test_file_mode)
