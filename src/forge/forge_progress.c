/* forge_progress.c - a progress bar on stderr, drawn at most ten times a second and only when
 * stderr is a terminal (the caller decides); otherwise silent, the CLI prints a summary. */
#include <stdio.h>
#include <time.h>

#include "forge/forge.h"

double forge_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void draw(forge_progress *pr, bool final) {
    const int width = 30;
    double frac = pr->total ? (double)pr->done / (double)pr->total : 1.0;
    if (frac > 1) frac = 1;
    int fill = (int)(frac * width);
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    double el = forge_now() - pr->t0;
    double rate = el > 0 ? (double)pr->done / el : 0;
    double eta = rate > 0 ? (double)(pr->total - pr->done) / rate : 0;
    fprintf(stderr, "\r%s [%s] %3d%% %.2f/%.2f GiB %.2f GB/s ETA %4.0fs%s", pr->label, bar,
            (int)(frac * 100), (double)pr->done / 1073741824.0, (double)pr->total / 1073741824.0,
            rate / 1e9, final ? 0.0 : eta, final ? "\n" : "");
    fflush(stderr);
}

void forge_progress_begin(forge_progress *pr, const char *label, uint64_t total, bool tty) {
    pr->tty = tty;
    pr->total = total;
    pr->done = 0;
    pr->t0 = pr->last_draw = forge_now();
    pr->label = label;
}

void forge_progress_add(forge_progress *pr, uint64_t n) {
    pr->done += n;
    if (!pr->tty) return;
    double t = forge_now();
    if (t - pr->last_draw < 0.1) return;
    pr->last_draw = t;
    draw(pr, false);
}

void forge_progress_end(forge_progress *pr) {
    if (pr->tty) draw(pr, true);
}
