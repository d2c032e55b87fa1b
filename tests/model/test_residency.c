/* test_residency.c - the residency map (model/residency.h): the two standard maps, a permuted
 * one, and every inconsistency hm_residency_check names. */
#include <stdint.h>
#include <string.h>

#include "harness.h"
#include "model/residency.h"

static void test_init(void) {
    hm_residency r;
    hm_error err;
    HM_REQUIRE(hm_residency_init_host(&r, 3, 5, &err) == HM_OK);
    HM_CHECK(r.n_layer == 3 && r.n_expert == 5);
    for (int l = 0; l < 3; l++) {
        HM_CHECK(r.n_slots[l] == 0);
        HM_CHECK(hm_residency_n_device(&r, l) == 0);
        for (int e = 0; e < 5; e++) {
            HM_CHECK(r.home[hm_residency_at(&r, l, e)] == HM_HOME_HOST);
            HM_CHECK(r.slot[hm_residency_at(&r, l, e)] == -1);
        }
    }
    HM_CHECK_MSG(hm_residency_check(&r, &err) == HM_OK, "%s", err.msg);
    hm_residency_free(&r);
    HM_CHECK(r.home == NULL && r.slot == NULL && r.n_slots == NULL);
    hm_residency_free(&r); /* twice is fine */
    hm_residency_free(NULL);

    HM_REQUIRE(hm_residency_init_device(&r, 2, 4, &err) == HM_OK);
    for (int l = 0; l < 2; l++) {
        HM_CHECK(r.n_slots[l] == 4);
        HM_CHECK(hm_residency_n_device(&r, l) == 4);
        for (int e = 0; e < 4; e++) {
            HM_CHECK(r.home[hm_residency_at(&r, l, e)] == (HM_HOME_HOST | HM_HOME_DEVICE));
            HM_CHECK(r.slot[hm_residency_at(&r, l, e)] == e);
        }
    }
    HM_CHECK_MSG(hm_residency_check(&r, &err) == HM_OK, "%s", err.msg);
    HM_CHECK(hm_residency_n_device(&r, 2) == 0 && hm_residency_n_device(&r, -1) == 0);
    hm_residency_free(&r);

    HM_CHECK(hm_residency_init_host(&r, 0, 4, &err) == HM_ERR_ARG && strstr(err.msg, "residency"));
    HM_CHECK(r.home == NULL);
    HM_CHECK(hm_residency_init_device(&r, 2, 0, &err) == HM_ERR_ARG);
    HM_CHECK(hm_residency_init_device(&r, 1 << 30, 1 << 30, &err) == HM_ERR_ARG);
}

static void test_permuted(void) {
    /* slot = (id * 7 + 3) % n: a permutation when gcd(7, n) == 1 */
    const int n = 16;
    hm_residency r;
    hm_error err;
    HM_REQUIRE(hm_residency_init_device(&r, 4, n, &err) == HM_OK);
    for (int l = 0; l < 4; l++)
        for (int e = 0; e < n; e++) r.slot[hm_residency_at(&r, l, e)] = (e * 7 + 3) % n;
    HM_CHECK_MSG(hm_residency_check(&r, &err) == HM_OK, "%s", err.msg);
    /* fewer slots than experts: some experts on the host only */
    r.n_slots[2] = 4;
    for (int e = 0; e < n; e++) {
        const size_t i = hm_residency_at(&r, 2, e);
        r.slot[i] = e < 4 ? 3 - e : -1;
        r.home[i] = e < 4 ? HM_HOME_HOST | HM_HOME_DEVICE : HM_HOME_HOST;
    }
    HM_CHECK_MSG(hm_residency_check(&r, &err) == HM_OK, "%s", err.msg);
    HM_CHECK(hm_residency_n_device(&r, 2) == 4);
    /* a device-only expert (home DEVICE without HOST) is allowed */
    r.home[hm_residency_at(&r, 2, 0)] = HM_HOME_DEVICE;
    HM_CHECK_MSG(hm_residency_check(&r, &err) == HM_OK, "%s", err.msg);
    hm_residency_free(&r);
}

/* one broken entry of a fresh device map each: the check fails naming the layer and expert */
static void test_check_errors(void) {
    struct {
        const char *what, *msg;
        int kind;
    } cases[] = {
        {"home 0", "lives nowhere", 0},
        {"unknown bits", "unknown home bits", 1},
        {"slot past n_slots", "outside the layer's slots", 2},
        {"slot below -1", "outside the layer's slots", 3},
        {"device without slot", "on the device without a slot", 4},
        {"slot without device", "has a slot but no device home", 5},
        {"shared slot", "shares its slot", 6},
        {"n_slots too large", "device slots", 7},
        {"n_slots negative", "device slots", 8},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        hm_residency r;
        hm_error err;
        HM_REQUIRE(hm_residency_init_device(&r, 3, 8, &err) == HM_OK);
        const size_t i = hm_residency_at(&r, 1, 5);
        switch (cases[c].kind) {
        case 0: r.home[i] = 0; break;
        case 1: r.home[i] |= 4; break;
        case 2: r.slot[i] = 8; break;
        case 3: r.slot[i] = -2; break;
        case 4: r.slot[i] = -1; break;
        case 5: r.home[i] = HM_HOME_HOST; break;
        case 6: r.slot[i] = 2; break;
        case 7: r.n_slots[1] = 9; break;
        case 8: r.n_slots[1] = -1; break;
        }
        hm_error_clear(&err);
        HM_CHECK_MSG(hm_residency_check(&r, &err) == HM_ERR_ARG, "%s: accepted", cases[c].what);
        HM_CHECK_MSG(strstr(err.msg, cases[c].msg) && strstr(err.msg, "layer 1"), "%s: '%s'",
                     cases[c].what, err.msg);
        if (cases[c].kind < 7)
            HM_CHECK_MSG(strstr(err.msg, cases[c].kind == 6 ? "expert" : "expert 5"), "%s: '%s'",
                         cases[c].what, err.msg);
        hm_residency_free(&r);
    }
    hm_error err;
    HM_CHECK(hm_residency_check(NULL, &err) == HM_ERR_ARG);
    hm_residency z;
    memset(&z, 0, sizeof(z));
    HM_CHECK(hm_residency_check(&z, &err) == HM_ERR_ARG);
    z.n_layer = z.n_expert = 1;
    HM_CHECK(hm_residency_check(&z, &err) == HM_ERR_ARG && strstr(err.msg, "arrays missing"));
}

HM_TEST_MAIN(test_init, test_permuted, test_check_errors)
