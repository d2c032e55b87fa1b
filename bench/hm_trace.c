/* hm_trace.c - a CUPTI injection library: the start and end of every kernel a process runs,
 * graph kernel nodes included, written as CSV when the process exits. Unlike Nsight Compute,
 * which replays kernels one at a time, this sees kernels as they run in the replayed decode
 * graph, overlapping under programmatic dependent launch.
 *
 * DESIGN: the CUDA driver loads the library named by CUDA_INJECTION64_PATH and calls its
 * InitializeInjection(); that enables CUPTI's concurrent-kernel activity records, whose buffers
 * CUPTI fills asynchronously and hands back through the two callbacks below; an atexit handler
 * flushes them. Records go to HM_TRACE_OUT (default hm_trace.csv): start_ns,end_ns,graph_id,"name"
 * in the order CUPTI delivers them (bench/device_trace_gpu.sh sorts and summarises).
 * Not part of the hotmoe build (it needs libcupti): the device script compiles it.
 */
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define TRACE_BUF (8u << 20)

typedef struct {
    FILE *out;
    unsigned long long records, dropped;
} trace_state;

static trace_state g_trace; /* one per process: CUPTI's callbacks take no user pointer */

static void CUPTIAPI trace_buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = (uint8_t *)aligned_alloc(8, TRACE_BUF);
    *size = *buf ? TRACE_BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI trace_buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf,
                                            size_t size, size_t valid) {
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
            rec->kind != CUPTI_ACTIVITY_KIND_KERNEL)
            continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        if (g_trace.out)
            fprintf(g_trace.out, "%llu,%llu,%u,\"%s\"\n", (unsigned long long)k->start,
                    (unsigned long long)k->end, k->graphId, k->name ? k->name : "?");
        g_trace.records++;
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(NULL, 0, &dropped) == CUPTI_SUCCESS)
        g_trace.dropped += dropped;
    free(buf);
}

static void trace_finish(void) {
    cuptiActivityFlushAll(1);
    if (g_trace.out) fclose(g_trace.out);
    g_trace.out = NULL;
    fprintf(stderr, "hm_trace: %llu kernel records, %llu dropped\n", g_trace.records,
            g_trace.dropped);
}

int InitializeInjection(void);
int InitializeInjection(void) {
    const char *path = getenv("HM_TRACE_OUT");
    g_trace.out = fopen(path && *path ? path : "hm_trace.csv", "w");
    if (!g_trace.out) {
        fprintf(stderr, "hm_trace: cannot write %s\n", path && *path ? path : "hm_trace.csv");
        return 0;
    }
    fprintf(g_trace.out, "start_ns,end_ns,graph_id,name\n");
    if (cuptiActivityRegisterCallbacks(trace_buffer_requested, trace_buffer_completed) !=
            CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "hm_trace: CUPTI activity tracing unavailable\n");
        return 0;
    }
    atexit(trace_finish);
    return 1;
}
