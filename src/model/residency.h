/* residency.h - the residency map: where each expert's weights live.
 *
 * DESIGN: placement is data (ARCHITECTURE.md section 3). An expert of a layer is one unit of
 * weights — its gate, up and down matrices and their biases — and the map says where that unit
 * lives: in host memory (HM_HOME_HOST: the mapped file), in a slot of the device's expert arena
 * for that layer (HM_HOME_DEVICE, slot >= 0), or both. A layer's arena holds n_slots[layer]
 * experts, laid out as the model's expert tensors are (slot s where the file has expert s), so
 * an engine finds expert e's weights at base + slot[layer][e] * expert_stride; the GPU engine
 * keeps the slot array in device memory (its expert->slot table, cuda/cuda_engine.h). Moving an
 * expert changes its entry and a slot's contents, never a code path or a shape.
 *
 * The map is plain data: the arrays may be filled by hand (a placement plan, a test) and then
 * checked with hm_residency_check. Layers without experts (dense layers) leave their n_expert
 * entries unused. Every expert lives somewhere (home != 0); an expert with a device slot has
 * HM_HOME_DEVICE and one without has not; a layer's slots are distinct and below its n_slots.
 */
#ifndef HM_MODEL_RESIDENCY_H
#define HM_MODEL_RESIDENCY_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

enum { HM_HOME_HOST = 1, HM_HOME_DEVICE = 2 }; /* bits of hm_residency.home */

typedef struct {
    int n_layer, n_expert;
    uint8_t *home;    /* [n_layer][n_expert] HM_HOME_* bits */
    int32_t *slot;    /* [n_layer][n_expert] device slot of the expert's weights, -1: none */
    int32_t *n_slots; /* [n_layer] slots the device holds for that layer */
} hm_residency;

/* Every expert in host memory only: no slots. n_layer, n_expert >= 1. */
hm_status hm_residency_init_host(hm_residency *r, int n_layer, int n_expert, hm_error *err);
/* Every expert in host memory and on the device, slot == expert id, n_slots == n_expert (the
 * whole model on one GPU). */
hm_status hm_residency_init_device(hm_residency *r, int n_layer, int n_expert, hm_error *err);
/* Frees the arrays (r itself is the caller's); NULL or a zeroed map is fine. */
void hm_residency_free(hm_residency *r);

/* Index of (layer, expert) in home and slot. */
static inline size_t hm_residency_at(const hm_residency *r, int layer, int expert) {
    return (size_t)layer * (size_t)r->n_expert + (size_t)expert;
}

/* HM_ERR_ARG naming the first problem: bad dimensions or missing arrays; a layer's n_slots
 * outside [0, n_expert]; an expert with no home, unknown home bits, a slot outside
 * [-1, n_slots), HM_HOME_DEVICE without a slot or a slot without HM_HOME_DEVICE; two experts of
 * a layer in one slot. */
hm_status hm_residency_check(const hm_residency *r, hm_error *err);

/* Experts of layer that have a device slot. */
int hm_residency_n_device(const hm_residency *r, int layer);

#endif
