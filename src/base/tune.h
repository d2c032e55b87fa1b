/* tune.h - CPU backend tuning constants.
 *
 * DESIGN: the numbers that benchmarks chose (or that trade speed against something), as plain
 * macros in one place, each with what it trades and where it is used; a constant changes here,
 * nowhere else. No build-time switches: an A/B experiment edits a value here on its own branch.
 */
#ifndef HM_BASE_TUNE_H
#define HM_BASE_TUNE_H

/* ---- waiting threads (base/spin.h, base/threadpool.c) ----
 * A thread that waits for another thread's store spins (pause) for a while, then sleeps on a
 * futex until the store's thread wakes it. Spinning answers within ~0.1 us; a futex wake-up
 * takes 5-50 us (more under a hypervisor), so the spin must outlast the waits of a quiet run.
 * But a spinning thread holds its core: with more runnable threads than cores (other programs,
 * or -t above the CPU count) it keeps out the very thread it waits for, so the spin must also
 * be short against a scheduler time slice (milliseconds). */

/* An idle worker waiting for the next job (between a decode step's jobs, or tokens). */
#define HM_TUNE_SPIN_IDLE_NS 300000
/* The tiered CPU side's idle workers (runtime/tiered.c): its jobs are a decode step's host
 * layers, with gaps of the GPU's own layers, the output and the next step's start between them
 * (a half-GPU qwen3-30b-a3b step: ~2 ms without a job), so a 300 us spin sleeps and wakes the
 * pool every token. 5 ms: tg128, -t 15, H200 machine, 2026-11-28, same call (bench/RESULTS.md):
 * q3 --n-cpu-moe 24 125.2 -> 145.0, --cpu-moe 73.7 -> 77.3, gpt-oss-20b --cpu-moe 81.0 -> 78.9. */
#define HM_TUNE_SPIN_IDLE_TIERED_NS 5000000
/* Inside a job: stage gates, barriers, the end of a job, one item waiting on another's flag.
 * The 16-core host's pool traces (bench/results/2026-11-23h/i-host-cpu-trace-*) give mean gate
 * waits of 4-18 us for most stages and 100-290 us for a few (a thread held up); a wait longer
 * than this sleeps and pays a wake-up. Not yet measured against other values on the host. */
#define HM_TUNE_SPIN_WAIT_NS 100000
/* Both, when a pool has more threads than the process has CPUs: then the thread a waiter waits
 * for is often runnable on the waiter's own core, so every spin delays it (as libgomp, which
 * spins far less when threads outnumber CPUs). */
#define HM_TUNE_SPIN_OVERSUB_NS 5000
/* Pauses between two reads of the clock while spinning (the first read comes after this many,
 * so a short wait never reads it). */
#define HM_TUNE_SPIN_CLOCK_EVERY 64
/* hm_spin_until sleeps at most this long at a time: a flag stored without hm_spin_set wakes no
 * one, and its waiter then notices it after this. */
#define HM_TUNE_FLAG_SLEEP_NS 200000

/* ---- the pool's active thread count (base/threadpool.c, tp_adapt) ----
 * A pool thread that shares a core with another program loses whole time slices (ms) while it
 * holds an item, and each of a decode step's ~250 stages waits for it: beside 2 busy loops the
 * 16-thread decode on 16 CPUs fell from 52 to 4.5 tok/s, while -t 14 ran 44.8. The pool measures
 * its threads' run delay (time runnable but not running) and runs item jobs on fewer threads
 * while it is high. */
/* Each active thread reads its run delay at most this often (one pread of its schedstat). */
#define HM_TUNE_POOL_SAMPLE_NS 5000000
/* A window of the control: the run delay of at least this long (and whole jobs) is compared. */
#define HM_TUNE_POOL_WINDOW_NS 50000000
/* Excess: run delay / window, the threads kept waiting on average. A quiet machine gives ~0.001
 * (kernel threads' microseconds); one busy program beside n threads on n cores ~n / (n + 1). */
#define HM_TUNE_POOL_EXCESS 0.5
/* Windows in a row with excess before the count drops (a burst of another program's work is
 * no reason; a probe that shows excess in its first window goes back at once). */
#define HM_TUNE_POOL_SHRINK_WINDOWS 2
/* Below the pool's size: one thread more is tried this long after the last change, and kept
 * after this many windows without excess; each failed probe doubles the wait, up to the max. */
#define HM_TUNE_POOL_PROBE_NS 250000000
#define HM_TUNE_POOL_PROBE_MAX_NS 4000000000
#define HM_TUNE_POOL_PROBE_WINDOWS 2

/* ---- matrix products (cpu/matmul.c, quant/quant_simd_common.h, quant/quant_x8_avx512.c) ---- */

/* Work items per thread of a product cut into equal chunks (mm_chunk_rows: the expert
 * products; the FFN's down items are cut from it). Fewer items: fewer cold stream starts; more:
 * a late or slow thread holds up the end of a stage less. 4 and 6 were no faster than 8 on the
 * 16-core host (bench/RESULTS.md, two-distance prefetch in the x8 kernels). */
#define HM_TUNE_MM_ITEMS_PER_THREAD 8
/* The dot tiles (quant_simd_*.h) prefetch the weight stream this many bytes ahead into L1:
 * without it a core cannot keep enough misses in flight (a 16-core matvec of 4-bit types stayed
 * near 0.65 of read bandwidth); 8 KiB gave no consistent gain. */
#define HM_TUNE_SIMD_PF_DIST 4096
/* The repacked-row kernels (quant_x8_avx512.c) prefetch the weight stream at two distances:
 * this many bytes ahead into L1, and HM_TUNE_X8_PF_L2 bytes ahead into L2 only (more misses in
 * flight than the L1 fill buffers allow). 2 KiB + 12 KiB streamed q4_K 8% faster than 4 KiB into
 * L1 alone on the 16-core host; 16 and 24 KiB for the second were no better. */
#define HM_TUNE_X8_PF_L1 2048
#define HM_TUNE_X8_PF_L2 12288

#endif
