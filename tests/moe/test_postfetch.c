/* test_postfetch.c - post-fetch's variables and decision (moe/postfetch.h) on hand-made experts
 * whose outcomes are derived in the comments: defaults, the environment (a bad value named),
 * one shared host bandwidth (nothing moves), reads and copies adding up (D's move while T falls,
 * the copy lane then binds), MAX_TRANSFERS, FORCE_CPU / ENABLE=0 / HOTMOE_POSTFETCH_FORCE, bad
 * rates, the [PF] line. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "moe/postfetch.h"

static int close_to(double a, double b) { return fabs(a - b) <= 1e-12 + 1e-9 * fabs(b); }

static void test_config(void) {
    pf_config c;
    hm_error err;
    const char *vars[] = {"LLAMA_POSTFETCH_ENABLE", "LLAMA_POSTFETCH_FORCE_CPU",
                          "LLAMA_POSTFETCH_BLOCK_ON_MISS", "LLAMA_POSTFETCH_MAX_TRANSFERS",
                          "LLAMA_POSTFETCH_SCRATCHPAD_MB", "LLAMA_POSTFETCH_USE_DEDICATED_STREAMS",
                          "LLAMA_POSTFETCH_DEBUG", "HOTMOE_POSTFETCH_FORCE"};
    for (int i = 0; i < 8; i++) unsetenv(vars[i]);
    HM_REQUIRE(pf_config_from_env(&c, &err) == HM_OK);
    HM_CHECK(c.enable && !c.force_cpu && c.block_on_miss && c.max_transfers == 8 &&
             c.scratchpad_mb == 0 && c.dedicated_streams && !c.debug && !c.force_gpu);
    setenv("LLAMA_POSTFETCH_MAX_TRANSFERS", "3", 1);
    setenv("LLAMA_POSTFETCH_BLOCK_ON_MISS", "0", 1);
    setenv("LLAMA_POSTFETCH_DEBUG", "", 1); /* empty: the default */
    HM_REQUIRE(pf_config_from_env(&c, &err) == HM_OK);
    HM_CHECK(c.max_transfers == 3 && !c.block_on_miss && !c.debug);
    setenv("LLAMA_POSTFETCH_MAX_TRANSFERS", "0", 1);
    HM_CHECK(pf_config_from_env(&c, &err) == HM_ERR_ARG &&
             strstr(err.msg, "LLAMA_POSTFETCH_MAX_TRANSFERS=0: must be an integer in [1, 1024]"));
    setenv("LLAMA_POSTFETCH_MAX_TRANSFERS", "8", 1);
    setenv("LLAMA_POSTFETCH_ENABLE", "yes", 1);
    HM_CHECK(pf_config_from_env(&c, &err) == HM_ERR_ARG &&
             strstr(err.msg, "LLAMA_POSTFETCH_ENABLE=yes"));
    for (int i = 0; i < 8; i++) unsetenv(vars[i]);
}

/* Four experts, gate+up 2 MB and D 1 MB each: 12 MB, read at 100 MB/s: T(empty) = 0.12 s. */
static void four(pf_expert ex[4]) {
    for (int i = 0; i < 4; i++) ex[i] = (pf_expert){2000000, 1000000};
}

static void test_decisions(void) {
    pf_expert ex[4];
    four(ex);
    uint8_t gpu[4], why[4];
    pf_decision d;
    hm_error err;
    pf_config c = pf_config_default();
    /* one shared bandwidth (concurrency 1): (cpu + copy) / read never falls below 0.12 */
    pf_rates r = {.read_bytes_per_s = 100e6, .h2d_bytes_per_s = 50e6, .concurrency = 1.0};
    HM_REQUIRE(pf_decide(&c, &r, ex, 4, gpu, why, &d, &err) == HM_OK);
    HM_CHECK(d.n_gpu == 0 && close_to(d.t_cpu_only_s, 0.12) && close_to(d.t_s, 0.12));
    /* concurrency 2, h2d 50 MB/s: k D's moved: cpu (12 - k) / 100, copy k / 50, all / 200 (0.06):
     * 0.11, 0.10, 0.09, 0.08 (= copy 0.08): all four move, T 0.08 */
    r.concurrency = 2.0;
    HM_REQUIRE(pf_decide(&c, &r, ex, 4, gpu, why, &d, &err) == HM_OK);
    HM_CHECK_MSG(d.n_gpu == 4 && close_to(d.t_s, 0.08) && d.copy_bytes == 4000000, "%d %g",
                 d.n_gpu, d.t_s);
    for (int i = 0; i < 4; i++) HM_CHECK(gpu[i] && why[i] == PF_WHY_GAIN);
    /* h2d 20 MB/s: 0.11 (copy 0.05), 0.10 (copy 0.10), then copy 0.15 > 0.10: two move */
    r.h2d_bytes_per_s = 20e6;
    HM_REQUIRE(pf_decide(&c, &r, ex, 4, gpu, why, &d, &err) == HM_OK);
    HM_CHECK(d.n_gpu == 2 && close_to(d.t_s, 0.10) && gpu[0] && gpu[1] && !gpu[2] && !gpu[3]);
    /* MAX_TRANSFERS 1 at h2d 50 MB/s: one moves, the others would gain: staging full */
    r.h2d_bytes_per_s = 50e6;
    c.max_transfers = 1;
    HM_REQUIRE(pf_decide(&c, &r, ex, 4, gpu, why, &d, &err) == HM_OK);
    HM_CHECK(d.n_gpu == 1 && gpu[0] && why[1] == PF_WHY_CAP && why[3] == PF_WHY_CAP);
    /* off: FORCE_CPU, or ENABLE=0 */
    c = pf_config_default();
    c.force_cpu = true;
    HM_REQUIRE(pf_decide(&c, &r, ex, 4, gpu, why, &d, &err) == HM_OK);
    HM_CHECK(d.n_gpu == 0);
    c = pf_config_default();
    c.enable = false;
    HM_REQUIRE(pf_decide(&c, &r, ex, 4, gpu, why, &d, &err) == HM_OK);
    HM_CHECK(d.n_gpu == 0);
    /* forced on a shared bandwidth: every D, largest first (the third is bigger), up to 3 */
    c = pf_config_default();
    c.force_gpu = true;
    c.max_transfers = 3;
    r.concurrency = 1.0;
    ex[2].down_bytes = 1500000;
    HM_REQUIRE(pf_decide(&c, &r, ex, 4, gpu, why, &d, &err) == HM_OK);
    HM_CHECK(d.n_gpu == 3 && gpu[2] && gpu[0] && gpu[1] && !gpu[3] && why[2] == PF_WHY_FORCED &&
             why[3] == PF_WHY_CAP);
    /* SCRATCHPAD_MB 2 (2,097,152 bytes): the 1.5 MB D, then a 1 MB one would pass the
     * scratchpad; none of the others fits beside it either */
    c.max_transfers = 8;
    c.scratchpad_mb = 2;
    pf_decision d2;
    HM_REQUIRE(pf_decide(&c, &r, ex, 4, gpu, why, &d2, &err) == HM_OK);
    HM_CHECK_MSG(d2.n_gpu == 1 && gpu[2] && d2.copy_bytes == 1500000 && why[0] == PF_WHY_CAP &&
                     why[1] == PF_WHY_CAP && why[3] == PF_WHY_CAP,
                 "%d D's, %llu bytes", d2.n_gpu, (unsigned long long)d2.copy_bytes);
    c.scratchpad_mb = 3; /* 3,145,728: 1.5 MB + 1 MB, not a third */
    HM_REQUIRE(pf_decide(&c, &r, ex, 4, gpu, why, &d2, &err) == HM_OK);
    HM_CHECK(d2.n_gpu == 2 && gpu[2] && gpu[0] && d2.copy_bytes == 2500000);
    char line[160];
    pf_format(&d, 7, 4, line, sizeof(line));
    HM_CHECK_MSG(!strncmp(line, "[PF] layer 7: 4 cold experts, 3 D over PCIe (3.34 MiB), T ", 58),
                 "%s", line);
}

static void test_bad_rates(void) {
    pf_expert ex[4];
    four(ex);
    uint8_t gpu[4], why[4];
    pf_decision d;
    hm_error err;
    const pf_config c = pf_config_default();
    pf_rates r = {.read_bytes_per_s = 100e6, .h2d_bytes_per_s = 50e6, .concurrency = 0.5};
    HM_CHECK(pf_decide(&c, &r, ex, 4, gpu, why, &d, &err) == HM_ERR_ARG &&
             strstr(err.msg, "concurrency 0.5"));
    r.concurrency = 1.0;
    r.read_bytes_per_s = NAN;
    HM_CHECK(pf_decide(&c, &r, ex, 4, gpu, why, &d, &err) == HM_ERR_ARG);
}

HM_TEST_MAIN(test_config, test_decisions, test_bad_rates)
