/* hot_setup.h - the hot cache of a tiered context (--moe-hot-cache, docs/HOT_CACHE.md): the plan
 * from a learn or perf file turned into device slots of the placement's residency map, before
 * the GPU engine uploads it.
 *
 * DESIGN: the layers whose routed experts the placement leaves in RAM are the candidates; the
 * budget is --moe-hot-cache-max-mib, or what the placement's budget leaves after its own VRAM
 * minus the reserve; moe/hot_plan.h chooses; each chosen expert gets the next slot of its layer
 * (in id order) and HM_HOME_DEVICE, so its layer becomes a mixed layer of the GPU engine (the
 * GPU runs its hot slots, the CPU side the cold ones: cuda/cuda_engine_internal.h). The plan's
 * device figures grow by the cache's bytes. A file that cannot be used (unreadable, malformed,
 * another model's, a budget below one expert per RAM layer) is no error: the context runs
 * without a cache and the reason is logged and reported. Plain C, no GPU.
 * Once the engine holds the cache, hot_setup_control starts the controller on the tiered CPU
 * side when a policy or an update rate asks for one (runtime/tiered.h: hm_tiered_set_hot); its
 * exchanges go to cuda_engine_hot_request, which the engine's thread applies between steps.
 * A static cache without updates gets no controller, only its map (hm_tiered_set_hot_map): the
 * prompts' copies ahead leave the experts it holds out.
 */
#ifndef HM_RUNTIME_HOT_SETUP_H
#define HM_RUNTIME_HOT_SETUP_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "cuda/cuda_engine.h"
#include "model/model.h"
#include "moe/placement.h"
#include "runtime/context.h"
#include "runtime/tiered.h"

/* What hot_setup_apply changed in a plan, to take back when the engine cannot start with the
 * cache (out of VRAM while building it, say): added is false when it changed nothing. */
typedef struct {
    bool added;
    hm_residency res; /* the map as it was */
    uint64_t device_weights, device_total;
    bool fits;
} hot_setup_undo;

/* Applies p's hot cache to plan (its residency map and device figures). *report (malloc'd, may
 * be NULL) gets the plan's text, or the line saying why there is no cache, appended. undo (may
 * be NULL) keeps what it changed (hot_setup_revert or hot_setup_undo_free). HM_OK also when no
 * cache results; HM_ERR_NOMEM only. */
hm_status hot_setup_apply(const hm_model *m, const hm_context_params *p, moe_placement *plan,
                          char **report, hot_setup_undo *undo, hm_error *err);
/* The plan as it was before the cache (when one was added: logged and reported with why);
 * frees u. */
void hot_setup_revert(moe_placement *plan, hot_setup_undo *u, const char *why, char **report);
void hot_setup_undo_free(hot_setup_undo *u);

/* The controller for the cache gpu holds (its slots of the layers res keeps partly in RAM), or
 * for a static policy without updates the map alone; nothing without a cache; the tiered
 * side's errors. */
hm_status hot_setup_control(const hm_model *m, const hm_context_params *p, const hm_residency *res,
                            cuda_engine *gpu, hm_tiered *tiered, hm_error *err);

#endif
