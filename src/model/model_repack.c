/* model_repack.c - hm_model_params.repack: the CPU's matrices held repacked by eights.
 *
 * DESIGN: on AVX-512 CPUs quant_x8's kernels multiply rows repacked by eights (quant_x8.h)
 * faster than the dot tiles do from the file's layout, with the same bits, for one activation
 * row (decode) and for batches. So with repack every matrix of a repackable type gets such a
 * copy at load (hm_tensor.x8), made on a pool of all CPUs, and every CPU product of it reads the
 * copy. The file's pages of that matrix are then released (MADV_DONTNEED on the read-only file
 * mapping: if anything reads them again they come back from the file), so RAM holds about the
 * model's size, plus one matrix while loading. Each copy is its own anonymous mapping advised
 * for transparent huge pages (fewer TLB misses on a stream). Only where the fast kernel runs
 * (quant_x8_fast): elsewhere the copies would be slower. The GPU engine does not repack.
 */
#include <stddef.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/cpu.h"
#include "base/log.h"
#include "model/model_internal.h"
#include "quant/qtypes.h"
#include "quant/quant_x8.h"

struct model_x8_copy {
    void *p;
    size_t bytes;
};

/* The matrices a CPU forward pass multiplies, per layer (offsets into hm_layer). */
static const size_t k_layer_mats[] = {
    offsetof(hm_layer, wq),        offsetof(hm_layer, wk),      offsetof(hm_layer, wv),
    offsetof(hm_layer, wo),        offsetof(hm_layer, gate_exps), offsetof(hm_layer, up_exps),
    offsetof(hm_layer, down_exps), offsetof(hm_layer, sh_gate), offsetof(hm_layer, sh_up),
    offsetof(hm_layer, sh_down),
};
enum { N_LAYER_MATS = sizeof(k_layer_mats) / sizeof(k_layer_mats[0]) };

static hm_tensor *mat_at(hm_model *m, int i) {
    if (i == 0) return &m->output;
    i--;
    return (hm_tensor *)(void *)((char *)&m->layers[i / N_LAYER_MATS] +
                                 k_layer_mats[i % N_LAYER_MATS]);
}

static int n_mats(const hm_model *m) { return 1 + (int)m->hp.n_layer * N_LAYER_MATS; }

/* Rows of t (every expert's) in whole groups of 8 per matrix, of a type with a fast kernel. */
static bool wanted(const hm_tensor *t) {
    if (!t->data || !quant_x8_supported(t->type))
        return false;
    return t->ne[1] % QUANT_X8_ROWS == 0 && quant_x8_group_size(t->type, t->ne[0]) > 0 &&
           t->ne[3] <= 1;
}

static size_t mat_bytes(const hm_tensor *t) {
    return t->row_size * (size_t)(t->ne[1] * (t->ne[2] > 0 ? t->ne[2] : 1));
}

uint64_t model_repack_bytes(const hm_model *m, uint64_t *extra) {
    uint64_t largest = 0, kept = 0;
    *extra = 0;
    if (!quant_x8_fast()) { /* the reference path would be slower than the dot tiles */
        HM_LOGW("--repack: this CPU (or HOTMOE_ISA) has no AVX-512 VNNI+VBMI kernel for "
                "repacked rows; the weights stay as they are");
        return 0;
    }
    uint64_t n = 0;
    for (int i = 0; i < n_mats(m); i++) {
        const hm_tensor *t = mat_at((hm_model *)m, i);
        if (!wanted(t)) continue;
        n += mat_bytes(t);
        if (!m->g || !gguf_in_file_map(m->g, t->data, mat_bytes(t))) kept += mat_bytes(t);
        else if (mat_bytes(t) > largest) largest = mat_bytes(t);
    }
    *extra = largest + kept;
    return n;
}

/* The whole pages of [p, p + n) dropped from this process when they are the file's mapping. */
static void model_release_pages(const hm_model *m, const void *p, size_t n) {
    if (!m->g || !gguf_in_file_map(m->g, p, n)) return;
    const long pg = sysconf(_SC_PAGESIZE);
    const uintptr_t page = pg > 0 ? (uintptr_t)pg : 4096;
    const uintptr_t a = ((uintptr_t)p + page - 1) / page * page, b = ((uintptr_t)p + n) / page * page;
    if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED); /* advice: on failure they stay */
}

hm_status model_repack(hm_model *m, hm_error *err) {
    const int n = n_mats(m);
    m->x8_copies = calloc((size_t)n, sizeof(*m->x8_copies));
    if (!m->x8_copies) return hm_error_set(err, HM_ERR_NOMEM, "repack: out of memory");
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    tp_pool *pool = NULL;
    hm_status st = tp_init(ncpu < 1 ? 1 : ncpu > 256 ? 256 : (int)ncpu, &pool, err);
    for (int i = 0; i < n && st == HM_OK; i++) {
        hm_tensor *t = mat_at(m, i);
        if (!wanted(t)) continue;
        const size_t bytes = mat_bytes(t);
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            char b[32];
            st = hm_error_set(err, HM_ERR_NOMEM, "repack: out of memory for %s (%s)", t->name,
                              hm_bytes_str(bytes, b));
            break;
        }
        (void)madvise(p, bytes, MADV_HUGEPAGE); /* advice only: 4 KiB pages work too */
        m->x8_copies[m->n_x8_copies++] = (struct model_x8_copy){p, bytes};
        /* experts' rows follow each other: each expert has whole groups, none straddles two */
        const int64_t nx = t->ne[2] > 0 ? t->ne[2] : 1;
        if (!t->expert_stride) {
            st = quant_x8_repack_rows(t->type, t->ne[0], t->data, t->row_size, t->ne[1] * nx, p,
                                      pool, err);
        } else { /* a view in a fused gate/up tensor: each expert's rows to their place */
            const size_t eb = t->row_size * (size_t)t->ne[1];
            for (int64_t e = 0; e < nx && st == HM_OK; e++)
                st = quant_x8_repack_rows(t->type, t->ne[0],
                                          (const char *)t->data + (size_t)e * t->expert_stride,
                                          t->row_size, t->ne[1], (char *)p + (size_t)e * eb, pool,
                                          err);
        }
        if (st != HM_OK) break;
        t->x8 = p;
        /* a view's span holds the other view's rows too: those come back from the file if read */
        model_release_pages(m, t->data, t->expert_stride ? (size_t)(nx - 1) * t->expert_stride +
                                                               t->row_size * (size_t)t->ne[1]
                                                         : bytes);
    }
    tp_free(pool);
    return st;
}

void model_repack_free(hm_model *m) {
    for (int i = 0; i < m->n_x8_copies; i++) munmap(m->x8_copies[i].p, m->x8_copies[i].bytes);
    free(m->x8_copies);
    m->x8_copies = NULL;
    m->n_x8_copies = 0;
}
