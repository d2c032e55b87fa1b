/* test_json.c - the JSON builder over jansson: exact compact and pretty output, string escaping
 * (quotes, backslash, control characters, NUL, invalid UTF-8 -> U+FFFD, valid multi-byte kept),
 * numbers that read back exactly (integers as integers, reals with a '.' or exponent, uint64
 * above INT64_MAX as a real, NaN/inf as null, floats as their shortest decimal), misuse and
 * duplicate keys reported by hm_json_finish, the key-value shorthands, FILE* mode producing the
 * same text as the buffer mode, and hm_json_write_file. */
#include <jansson.h>
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
    hm_json_uint(j, (uint64_t)INT64_MAX);
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
    HM_CHECK(!strcmp(hm_json_data(&j, NULL), "")); /* nothing before finish */
    build_sample(&j);
    HM_REQUIRE(hm_json_finish(&j, &err) == HM_OK);
    size_t len;
    const char *s = hm_json_data(&j, &len);
    const char *want = "{\"name\":\"moe\",\"n\":-42,\"big\":9223372036854775807,\"ok\":true,"
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
    const char *want = "{\n  \"name\": \"moe\",\n  \"n\": -42,\n  \"big\": 9223372036854775807,\n"
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
#define FFFD "\xef\xbf\xbd"
    const char *want = "[\"q\\\"b\\\\s/n\\nr\\rt\\tb\\bf\\f\\u0001\\u001F\x7f\",\"a\\u0000b\","
                       "\"\xc3\xa9\xe2\x96\x81\xf0\x9f\x98\x80\","
                       "\"x" FFFD "y" FFFD "z" FFFD FFFD FFFD FFFD FFFD FFFD FFFD "\"]";
#undef FFFD
    HM_CHECK_MSG(!strcmp(hm_json_data(&j, NULL), want), "got %s", hm_json_data(&j, NULL));
    /* and jansson reads it back: the NUL survives */
    json_error_t je;
    json_t *r = json_loads(hm_json_data(&j, NULL), JSON_ALLOW_NUL, &je);
    HM_CHECK_MSG(r && json_string_length(json_array_get(r, 1)) == 3 &&
                     !memcmp(json_string_value(json_array_get(r, 1)), "a\0b", 3),
                 "%s", je.text);
    json_decref(r);
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
    hm_json_double(&j, 3.0);
    hm_json_uint(&j, UINT64_MAX);
    hm_json_float(&j, -INFINITY);
    hm_json_arr_end(&j);
    HM_REQUIRE(hm_json_finish(&j, &err) == HM_OK);
    const char *s = hm_json_data(&j, NULL);
    json_error_t je;
    json_t *r = json_loads(s, 0, &je);
    HM_REQUIRE(r && json_array_size(r) == 13);
    const double want[] = {0.1, 1.0 / 3.0, 1e300, -0.0, 0, 0, 0.1, 3.5, 1e-10};
    for (int i = 0; i < 9; i++) {
        json_t *v = json_array_get(r, (size_t)i);
        if (i == 4 || i == 5) {
            HM_CHECK_MSG(json_is_null(v), "value %d of %s", i, s);
            continue;
        }
        HM_CHECK_MSG(json_is_real(v) && json_real_value(v) == want[i], "value %d of %s", i, s);
    }
    HM_CHECK(signbit(json_real_value(json_array_get(r, 3))));
    HM_CHECK(json_is_integer(json_array_get(r, 9)) &&
             json_integer_value(json_array_get(r, 9)) == INT64_MIN);
    HM_CHECK(json_is_real(json_array_get(r, 10))); /* 3.0 stays a real */
    HM_CHECK_MSG(strstr(s, ",3.0,"), "%s", s);
    HM_CHECK(json_is_real(json_array_get(r, 11)) &&
             json_real_value(json_array_get(r, 11)) == 18446744073709551616.0);
    HM_CHECK(json_is_null(json_array_get(r, 12)));
    json_decref(r);
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
    case 7: /* the same key twice */
        hm_json_obj_begin(&j);
        hm_json_kint(&j, "k", 1);
        hm_json_kint(&j, "k", 2);
        hm_json_obj_end(&j);
        break;
    case 8: hm_json_obj_begin(&j); hm_json_key(&j, "a"); hm_json_key(&j, "b"); break;
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
    for (int i = 0; i < 10; i++) {
        hm_status st = misuse(i, &err);
        HM_CHECK_MSG(st == HM_ERR_STATE && !strncmp(err.msg, "json: ", 6), "case %d: %d %s", i, st,
                     err.msg);
    }
    misuse(7, &err);
    HM_CHECK_MSG(strstr(err.msg, "\"k\" given twice"), "%s", err.msg);
}

static void test_shorthands(void) {
    hm_json j;
    hm_error err;
    hm_json_init_buf(&j, false);
    hm_json_obj_begin(&j);
    hm_json_kstr(&j, "s", "v");
    hm_json_kstr(&j, "n", NULL);
    hm_json_kint(&j, "i", -1);
    hm_json_kuint(&j, "u", 7);
    hm_json_kdouble(&j, "d", 0.5);
    hm_json_kbool(&j, "b", false);
    hm_json_knull(&j, "z");
    hm_json_kstr(&j, "k\xff", "bad key repaired");
    hm_json_obj_end(&j);
    HM_REQUIRE(hm_json_finish(&j, &err) == HM_OK);
    const char *want = "{\"s\":\"v\",\"n\":null,\"i\":-1,\"u\":7,\"d\":0.5,\"b\":false,\"z\":null,"
                       "\"k\xef\xbf\xbd\":\"bad key repaired\"}";
    HM_CHECK_MSG(!strcmp(hm_json_data(&j, NULL), want), "got %s", hm_json_data(&j, NULL));
    hm_json_free(&j);
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

static void test_write_file(void) {
    char p[512];
    const char *tmp = getenv("HOTMOE_TMP");
    snprintf(p, sizeof(p), "%s/test_json_write.json", tmp && *tmp ? tmp : "/tmp");
    hm_json j;
    hm_error err;
    hm_json_init_buf(&j, false);
    build_sample(&j);
    HM_CHECK(hm_json_write_file(&j, p, &err) == HM_OK);
    FILE *f = fopen(p, "rb");
    HM_REQUIRE(f);
    char got[1024] = {0};
    size_t n = fread(got, 1, sizeof(got) - 1, f);
    fclose(f);
    remove(p);
    HM_CHECK(n == j.len + 1 && !memcmp(got, hm_json_data(&j, NULL), j.len) && got[j.len] == '\n');
    hm_json_free(&j);
    hm_json_init_buf(&j, false);
    build_sample(&j);
    HM_CHECK(hm_json_write_file(&j, "/nonexistent-dir/x.json", &err) == HM_ERR_IO &&
             strstr(err.msg, "/nonexistent-dir/x.json"));
    hm_json_free(&j);
}

HM_TEST_MAIN(test_compact, test_pretty, test_escaping, test_numbers, test_misuse, test_shorthands,
             test_file_mode, test_write_file)
