/* test_fetch_setup.c - the staging buffers' size (runtime/fetch_setup.h: fetch_setup_staging):
 * an eighth of the VRAM the context may use, the budget when it is below the free VRAM (so a
 * --vram-budget on a large card sizes them as a card of that size would), at least
 * FETCH_STAGING_MIN, at most the largest layer's experts. */
#include "harness.h"
#include "runtime/fetch_setup.h"

#define MIB (1ull << 20)
#define GIB (1ull << 30)

static void test_staging(void) {
    const uint64_t goss120 = 1660 * MIB, q3 = 300 * MIB, tiny = 2 * MIB, h200 = 139 * GIB;
    HM_CHECK(fetch_setup_staging(goss120, h200, 8 * GIB) == 1 * GIB); /* the budget's eighth */
    HM_CHECK(fetch_setup_staging(goss120, h200, 0) == goss120);       /* no budget: the card's */
    HM_CHECK(fetch_setup_staging(goss120, 7 * GIB, 0) == 7 * GIB / 8); /* an 8 GB card */
    HM_CHECK(fetch_setup_staging(goss120, 7 * GIB, 16 * GIB) == 7 * GIB / 8); /* above free */
    HM_CHECK(fetch_setup_staging(q3, h200, 8 * GIB) == q3);            /* a whole layer fits */
    HM_CHECK(fetch_setup_staging(tiny, h200, 4 * MIB) == tiny);        /* the floor: still whole */
    HM_CHECK(fetch_setup_staging(goss120, h200, 100 * MIB) == FETCH_STAGING_MIN);
    HM_CHECK(fetch_setup_staging(0, h200, 8 * GIB) == 0);              /* no experts */
}

HM_TEST_MAIN(test_staging)
