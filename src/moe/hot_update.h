/* hot_update.h - the hot cache's updater (seed 001): after a request (server) or every
 * --moe-hot-cache-update-interval tokens (CLI), exchange cache slots for better-scored experts,
 * one for one in the same layer: same capacity, same tensor shapes, never a reallocation.
 *
 * DESIGN: the scores are the weighting's (moe/hot_weight.h) over the counters of the window just
 * ended. In each layer the cold experts with a score > 0 are candidates, best first, and the hot
 * experts are victims, worst first; the k-th candidate pairs with the k-th victim while it scores
 * strictly more (ties: lower id first on both sides). The pairs of all layers are taken by
 * decreasing gain (candidate score - victim score; ties: lower layer, then the pair's rank) up to
 * max_exchange = floor(update_rate * hot slots) (update_rate in [0, 1]; 0: static). With the
 * window's raw counts (the periodic updates), a pair must also stand out from chance: the
 * candidate's count above the victim's by more than z sqrt(c_in + c_out), z = sqrt(2 ln n_expert)
 * (the spread two equally used experts' Poisson counts reach somewhere among a layer's n_expert:
 * about the largest of n_expert normal deviates), so a window whose differences are noise
 * (uniform routing: copies that gain nothing) exchanges nothing, while a skewed layer's popular
 * experts still come in; a manual apply passes no counts. The caller
 * copies each candidate's bytes into its victim's slot on a side stream and switches the
 * expert -> slot table between steps. The statistics carry the seed's names. Pure C.
 */
#ifndef HM_MOE_HOT_UPDATE_H
#define HM_MOE_HOT_UPDATE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

typedef struct {
    int layer;
    int out;   /* the hot expert whose slot is reused */
    int in;    /* the cold expert copied into it */
    double gain;
} hot_exchange;

/* The seed's update statistics (logged after each update). */
typedef struct {
    bool active;          /* an update was attempted (update_rate > 0 and a cache exists) */
    double update_rate;   /* the configured share of hot slots that may change */
    double hit_rate;      /* hot_slots / (hot_slots + cold_slots) of the window */
    uint64_t hot_slots, cold_slots; /* selections served hot and cold in the window */
    int candidates;       /* pairs that would gain */
    int max_exchange;     /* floor(update_rate * hot slots of the cache) */
    int exchanged;        /* pairs returned */
    int layers_changed;   /* layers with at least one exchange */
} hot_update_stats;

/* Plans the exchanges: hot [n_layer][n_expert] (1: has a slot), score [n_layer][n_expert],
 * counts [n_layer][n_expert] the window's selections behind the scores (NULL: every gain counts),
 * hot_hits / cold_hits of the window (for the statistics), rate in [0, 1]. out holds room
 * entries: the best-gain min(max_exchange, room) pairs are returned; *n_out gets their number,
 * sorted by layer, then victim id. HM_ERR_ARG for a rate outside [0, 1] or NaN, or negative shapes. */
hm_status hot_update_plan(int n_layer, int n_expert, const uint8_t *hot, const double *score,
                          const uint64_t *counts, uint64_t hot_hits, uint64_t cold_hits,
                          double rate, hot_exchange *out, int room, int *n_out,
                          hot_update_stats *st, hm_error *err);

/* One line of st for the log: "hot cache update: active 1, update_rate 0.10, ...". */
int hot_update_format(const hot_update_stats *st, char *buf, int n);

#endif
