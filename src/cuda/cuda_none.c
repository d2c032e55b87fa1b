/* cuda_none.c - the CUDA device API for builds without CUDA: no devices, the CPU path runs. */
#include "cuda/cuda_device.h"

int cuda_compiled(void) { return 0; }

hm_status cuda_device_query(cuda_device_info *out, int max, int *n, hm_error *err) {
    (void)out;
    (void)max;
    (void)err;
    *n = 0;
    return HM_OK;
}

/* ---- cuda_quant.h (helper K): every launcher fails cleanly without CUDA ---- */
#include "cuda/cuda_quant.h"

static hm_status quant_none(hm_error *err, const char *fn) {
    return hm_error_set(err, HM_ERR_UNSUPPORTED, "%s: built without CUDA", fn);
}

hm_status cuda_quantize_act(uint32_t wtype, const float *x, int64_t k, int64_t n_rows, void *act,
                            void *stream, hm_error *err) {
    return quant_none(err, "cuda_quantize_act");
}

hm_status cuda_quantize_act_glu(uint32_t wtype, const float *gate, const float *up, int64_t k,
                                int64_t n_rows, void *act, void *stream, hm_error *err) {
    return quant_none(err, "cuda_quantize_act_glu");
}

hm_status cuda_matvec(uint32_t wtype, const void *w, int64_t n_rows, int64_t k, const void *act,
                      int64_t n_tok, float *y, void *stream, hm_error *err) {
    return quant_none(err, "cuda_matvec");
}

hm_status cuda_moe_matvec(const cuda_moe_args *a, void *stream, hm_error *err) {
    return quant_none(err, "cuda_moe_matvec");
}

hm_status cuda_moe_gate_up(const cuda_moe_gate_up_args *a, void *stream, hm_error *err) {
    return quant_none(err, "cuda_moe_gate_up");
}

hm_status cuda_get_rows(uint32_t wtype, const void *table, size_t row_size, const int32_t *d_ids,
                        int64_t n, int64_t k, float *out, void *stream, hm_error *err) {
    return quant_none(err, "cuda_get_rows");
}

/* ---- the engine (cuda_engine.h): every entry point says the build has no CUDA ---- */
#include "cuda/cuda_engine.h"

static hm_status no_cuda(hm_error *err) {
    return hm_error_set(err, HM_ERR_UNSUPPORTED, "built without CUDA");
}

hm_status cuda_engine_plan(const hm_model *m, const cuda_engine_params *p, uint64_t *weights,
                           uint64_t *kv, uint64_t *scratch, hm_error *err) {
    (void)m;
    (void)p;
    if (weights) *weights = 0;
    if (kv) *kv = 0;
    if (scratch) *scratch = 0;
    return no_cuda(err);
}

hm_status cuda_engine_init(const hm_model *m, const cuda_engine_params *p, cuda_engine **out,
                           hm_error *err) {
    (void)m;
    (void)p;
    *out = NULL;
    return no_cuda(err);
}

void cuda_engine_free(cuda_engine *e) { (void)e; }

hm_status cuda_engine_decode(cuda_engine *e, const int32_t *tokens, int n_tok, int pos,
                             float *logits, hm_logits_mode mode, hm_error *err) {
    (void)e;
    (void)tokens;
    (void)n_tok;
    (void)pos;
    (void)logits;
    (void)mode;
    return no_cuda(err);
}

hm_status cuda_engine_seq_reset(cuda_engine *e, int seq, hm_error *err) {
    (void)e;
    (void)seq;
    return hm_error_set(err, HM_ERR_UNSUPPORTED, "built without CUDA");
}

hm_status cuda_engine_decode_seqs(cuda_engine *e, const int32_t *tokens, int n, const int32_t *seq,
                                  const int32_t *pos, const uint8_t *want, float *logits,
                                  hm_error *err) {
    (void)e;
    (void)tokens;
    (void)n;
    (void)seq;
    (void)pos;
    (void)want;
    (void)logits;
    return no_cuda(err);
}

hm_status cuda_engine_decode_rows(cuda_engine *e, const float *x, int n_tok, int pos,
                                  float *logits, hm_logits_mode mode, hm_error *err) {
    (void)e;
    (void)x;
    (void)n_tok;
    (void)pos;
    (void)logits;
    (void)mode;
    return no_cuda(err);
}

const char *cuda_engine_describe(const cuda_engine *e) {
    (void)e;
    return "built without CUDA";
}

/* ---- cuda_sample.h (helper S): the device sampler fails cleanly without CUDA ---- */
#include "cuda/cuda_sample.h"

static hm_status sample_none(hm_error *err, const char *fn) {
    return hm_error_set(err, HM_ERR_UNSUPPORTED, "%s: built without CUDA", fn);
}

hm_status cuda_sampler_init(const sample_params *p, int32_t n_vocab, void *stream,
                            cuda_sampler **out, hm_error *err) {
    (void)p;
    (void)n_vocab;
    (void)stream;
    *out = NULL;
    return sample_none(err, "cuda_sampler_init");
}

void cuda_sampler_free(cuda_sampler *s) { (void)s; }

hm_status cuda_sampler_reset(cuda_sampler *s, void *stream, hm_error *err) {
    return sample_none(err, "cuda_sampler_reset");
}

hm_status cuda_sampler_accept_host(cuda_sampler *s, const int32_t *tokens, int n, void *stream,
                                   hm_error *err) {
    return sample_none(err, "cuda_sampler_accept_host");
}

hm_status cuda_sampler_set_draws(cuda_sampler *s, uint64_t n_draws, void *stream, hm_error *err) {
    return sample_none(err, "cuda_sampler_set_draws");
}

hm_status cuda_sampler_sample(cuda_sampler *s, const float *d_logits, int32_t *d_token,
                              void *stream, hm_error *err) {
    return sample_none(err, "cuda_sampler_sample");
}

hm_status cuda_sampler_sample_host(cuda_sampler *s, const float *logits, int32_t *token,
                                   void *stream, hm_error *err) {
    return sample_none(err, "cuda_sampler_sample_host");
}

hm_status cuda_sampler_read_state(cuda_sampler *s, void *stream, uint64_t *n_draws,
                                  int32_t *hist_len, hm_error *err) {
    return sample_none(err, "cuda_sampler_read_state");
}

/* ---- cuda_decode.h (helper E2): the autonomous decode loop needs CUDA ---- */
#include "cuda/cuda_decode.h"

static hm_status decode_none(hm_error *err, const char *fn) {
    return hm_error_set(err, HM_ERR_UNSUPPORTED, "%s: built without CUDA", fn);
}

hm_status cuda_decode_init(cuda_engine *e, const sample_params *sp, int depth, cuda_decode **out,
                           hm_error *err) {
    *out = NULL;
    return decode_none(err, "cuda_decode_init");
}

void cuda_decode_free(cuda_decode *d) { (void)d; }

hm_status cuda_decode_sampler_set(cuda_decode *d, const int32_t *hist, int n_hist,
                                  uint64_t n_draws, hm_error *err) {
    return decode_none(err, "cuda_decode_sampler_set");
}

hm_status cuda_decode_accept(cuda_decode *d, const int32_t *tokens, int n, hm_error *err) {
    return decode_none(err, "cuda_decode_accept");
}

hm_status cuda_decode_begin(cuda_decode *d, int pos, hm_error *err) {
    return decode_none(err, "cuda_decode_begin");
}

hm_status cuda_decode_launch(cuda_decode *d, hm_error *err) {
    return decode_none(err, "cuda_decode_launch");
}

uint64_t cuda_decode_launched(const cuda_decode *d) { return 0; }

hm_status cuda_decode_wait(cuda_decode *d, uint64_t step, int32_t *token, hm_error *err) {
    return decode_none(err, "cuda_decode_wait");
}

hm_status cuda_decode_finish(cuda_decode *d, hm_error *err) {
    return decode_none(err, "cuda_decode_finish");
}

hm_status cuda_decode_set_logits(cuda_decode *d, const float *logits, hm_error *err) {
    return decode_none(err, "cuda_decode_set_logits");
}

hm_status cuda_decode_redo(cuda_decode *d, int32_t token, int pos, hm_error *err) {
    return decode_none(err, "cuda_decode_redo");
}

void cuda_decode_get_stats(const cuda_decode *d, cuda_decode_stats *s) {
    (void)d;
    s->graph_nodes = s->kernel_nodes = s->launches = s->queries = 0;
}

uint64_t cuda_decode_host_syncs(const cuda_decode *d) { return 0; }

uint64_t cuda_engine_host_syncs(const cuda_engine *e) { return 0; }

hm_status cuda_engine_route_counts_enable(cuda_engine *e, bool on, hm_error *err) {
    return hm_error_set(err, HM_ERR_UNSUPPORTED, "built without CUDA");
}

hm_status cuda_engine_route_counts_read(cuda_engine *e, uint64_t *hits, uint64_t *calls,
                                        uint64_t *tokens, hm_error *err) {
    return hm_error_set(err, HM_ERR_UNSUPPORTED, "built without CUDA");
}

hm_status cuda_engine_hot_exchange(cuda_engine *e, int il, int out, int in, hm_error *err) {
    return hm_error_set(err, HM_ERR_UNSUPPORTED, "built without CUDA");
}

int cuda_engine_hot_poll(cuda_engine *e, hm_error *err) { return 0; }

int cuda_engine_slot(const cuda_engine *e, int il, int x) { return -1; }

hm_status cuda_engine_hot_request(cuda_engine *e, int il, int out, int in, hm_error *err) {
    return hm_error_set(err, HM_ERR_UNSUPPORTED, "built without CUDA");
}

hm_status cuda_engine_route_table(cuda_engine *e, const int32_t *table, int n_pos,
                                  hm_error *err) {
    return hm_error_set(err, HM_ERR_UNSUPPORTED, "built without CUDA");
}

void cuda_engine_hot_counts(const cuda_engine *e, uint64_t *applied, uint64_t *refused) {
    *applied = *refused = 0;
}

hm_status cuda_engine_experts(cuda_engine *e, int il, int n_tok, const float *x,
                              const int32_t *ids, float *y, hm_error *err) {
    return hm_error_set(err, HM_ERR_UNSUPPORTED, "built without CUDA");
}

/* ---- cuda_host.h: no registration and no copy lane without CUDA (callers keep experts on the
 * CPU) ---- */
#include "cuda/cuda_host.h"

static hm_status host_none(hm_error *err, const char *fn) {
    return hm_error_set(err, HM_ERR_UNSUPPORTED, "%s: built without CUDA", fn);
}

hm_status cuda_host_register(const void *p, size_t n, cuda_host_reg **out, hm_error *err) {
    *out = NULL;
    return host_none(err, "cuda_host_register");
}

void cuda_host_unregister(cuda_host_reg *r) { (void)r; }

bool cuda_host_reg_covers(const cuda_host_reg *r, const void *p, size_t n) { return false; }

void cuda_host_reg_range(const cuda_host_reg *r, const void **base, size_t *len, double *secs) {
    if (base) *base = NULL;
    if (len) *len = 0;
    if (secs) *secs = 0.0;
}

void *cuda_host_reg_device_ptr(const cuda_host_reg *r, const void *p) { return NULL; }

hm_status cuda_copy_lane_init(int dev, size_t cap, const cuda_host_reg *reg,
                              cuda_copy_lane **out, hm_error *err) {
    *out = NULL;
    return host_none(err, "cuda_copy_lane_init");
}

void cuda_copy_lane_free(cuda_copy_lane *l) { (void)l; }

size_t cuda_copy_lane_bytes(const cuda_host_range *src, int n) {
    size_t t = 0;
    for (int i = 0; i < n; i++)
        t += (src[i].n + CUDA_COPY_LANE_ALIGN - 1) & ~(size_t)(CUDA_COPY_LANE_ALIGN - 1);
    return t;
}

size_t cuda_copy_lane_cap(const cuda_copy_lane *l) { return 0; }

hm_status cuda_copy_lane_copy(cuda_copy_lane *l, int b, int layer, const cuda_host_range *src,
                              int n, size_t *off, hm_error *err) {
    return host_none(err, "cuda_copy_lane_copy");
}

hm_status cuda_copy_lane_copy_at(cuda_copy_lane *l, int b, int layer, size_t start,
                                 const cuda_host_range *src, int n, size_t *off, hm_error *err) {
    return host_none(err, "cuda_copy_lane_copy_at");
}

hm_status cuda_copy_lane_copy_rows(cuda_copy_lane *l, int b, int layer, const cuda_host_rows *r,
                                   int n, hm_error *err) {
    return host_none(err, "cuda_copy_lane_copy_rows");
}

hm_status cuda_copy_lane_query_buf(cuda_copy_lane *l, int b, bool *done, hm_error *err) {
    *done = false;
    return host_none(err, "cuda_copy_lane_query_buf");
}

hm_status cuda_copy_lane_sync_buf(cuda_copy_lane *l, int b, hm_error *err) {
    return host_none(err, "cuda_copy_lane_sync_buf");
}

void *cuda_copy_lane_buf(const cuda_copy_lane *l, int b) { return NULL; }

int cuda_copy_lane_layer(const cuda_copy_lane *l, int b) { return -1; }

hm_status cuda_copy_lane_wait(cuda_copy_lane *l, int b, void *stream, hm_error *err) {
    return host_none(err, "cuda_copy_lane_wait");
}

hm_status cuda_copy_lane_release(cuda_copy_lane *l, int b, void *stream, hm_error *err) {
    return host_none(err, "cuda_copy_lane_release");
}

hm_status cuda_copy_lane_sync(cuda_copy_lane *l, hm_error *err) {
    return host_none(err, "cuda_copy_lane_sync");
}

void cuda_copy_lane_get_stats(const cuda_copy_lane *l, cuda_copy_lane_stats *s) {
    s->copies = s->ranges = s->bytes_direct = s->bytes_staged = s->batches = 0;
}

bool cuda_copy_lane_direct(const cuda_copy_lane *l, const void *p, size_t n) { return false; }

hm_status cuda_copy_lane_measure(cuda_copy_lane *l, const void *src, size_t n, int reps,
                                 double *bytes_per_s, hm_error *err) {
    *bytes_per_s = 0;
    return host_none(err, "cuda_copy_lane_measure");
}

/* ---- cuda_handoff.h: the tiered step's hand-off needs CUDA ---- */
#include "cuda/cuda_handoff.h"

int cuda_engine_host_layers(const struct cuda_engine *e) { return 0; }

hm_status cuda_engine_handoff_view(struct cuda_engine *e, cuda_handoff_view *v, hm_error *err) {
    return hm_error_set(err, HM_ERR_UNSUPPORTED, "built without CUDA");
}

hm_status cuda_engine_handoff_attach(struct cuda_engine *e, bool on, hm_error *err) {
    return hm_error_set(err, HM_ERR_UNSUPPORTED, "built without CUDA");
}

hm_status cuda_engine_handoff_reset(struct cuda_engine *e, hm_error *err) {
    return hm_error_set(err, HM_ERR_UNSUPPORTED, "built without CUDA");
}

hm_status cuda_engine_handoff_check(const struct cuda_engine *e, hm_error *err) { return HM_OK; }

/* ---- cuda_fetch.h: fetched experts need CUDA ---- */
#include <string.h>

#include "cuda/cuda_fetch.h"

hm_status cuda_engine_fetch_set(struct cuda_engine *e, void *buf0, void *buf1, size_t cap,
                                int *n_eligible, hm_error *err) {
    if (n_eligible) *n_eligible = 0;
    return hm_error_set(err, HM_ERR_UNSUPPORTED, "built without CUDA");
}

hm_status cuda_engine_postfetch_set(struct cuda_engine *e, bool on, hm_error *err) {
    return host_none(err, "cuda_engine_postfetch_set");
}

bool cuda_engine_postfetch_layer(const struct cuda_engine *e, int il, size_t *bytes) {
    if (bytes) *bytes = 0;
    return false;
}

void cuda_engine_fetch_layout(const struct cuda_engine *e, int il, cuda_fetch_layout *out) {
    memset(out, 0, sizeof(*out));
}

/* ---- cuda_delta.h ---- */
#include "cuda/cuda_delta.h"

hm_status cuda_delta_net(const cuda_delta_args *a, void *stream, hm_error *err) {
    (void)a;
    (void)stream;
    return hm_error_set(err, HM_ERR_UNSUPPORTED, "cuda_delta_net: built without CUDA");
}
