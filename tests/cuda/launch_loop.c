/* Launch loops for `cargo xtask bench cuda`: dlopens a CUDA driver library (the stand-in) and
 * calls cuLaunchKernelEx.
 *
 *   launch_loop LIB tight SECONDS          as fast as it can: calls, ns per call
 *   launch_loop RT tight-runtime SECONDS   the same through the stand-in runtime RT's
 *                                          cudaLaunchKernel (which calls the driver's)
 *   launch_loop LIB rate SECONDS N         N calls a second (batches of 10 on absolute deadlines,
 *                                          sleeping between): calls, the process's CPU seconds
 *   launch_loop LIB step SECONDS WORK_US   steps of WORK_US of arithmetic then 20 launches:
 *                                          steps a second
 *   launch_loop LIB calibrate 0 WORK_US    the arithmetic iterations that take WORK_US of CPU
 *   launch_loop LIB serve 0 ITERS          steps of ITERS iterations then 20 launches, in rounds:
 *                                          prints `ready`, then for each line N read on stdin
 *                                          runs N steps and prints the process's CPU time and
 *                                          the wall time they took (`cargo xtask bench
 *                                          cuda-step`: CPU time, not steps a second, so that
 *                                          another process's load does not set the pace)
 *
 * Each first computes for 3 s (the profiler samples it and finds the library), then runs.
 * Prints one line of `key=value` pairs. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

typedef int (*launch_fn)(const void *, void *, void **, void **);
typedef struct { unsigned x, y, z; } dim3;
typedef int (*runtime_fn)(const void *, dim3, dim3, void **, size_t, void *);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static double cpu_seconds(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec / 1e6;
}

static volatile uint64_t sink;

/* The process's CPU time (user and system: a probe's trap and BPF program run in the kernel
 * on the calling thread), in nanoseconds. */
static uint64_t cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

/* A fixed amount of arithmetic: the same work whatever the load. */
static void work_iters(uint64_t iters) {
    uint64_t x = 1;
    for (uint64_t k = 0; k < iters; k++) {
        for (int i = 0; i < 100; i++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    }
    sink = x;
}

static void work(double us) {
    double end = now() + us / 1e6;
    uint64_t x = 1;
    while (now() < end) {
        for (int i = 0; i < 100; i++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    }
    sink = x;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: launch_loop LIB tight|rate|step SECONDS [N]\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    launch_fn launch = (launch_fn)dlsym(h, "cuLaunchKernelEx");
    /* `tight-runtime`: LIB is the stand-in runtime (tests/cuda/runtime.c), each call a
     * cudaLaunchKernel passing through the driver's cuLaunchKernel. */
    runtime_fn runtime = (runtime_fn)dlsym(h, "cudaLaunchKernel");
    work(3e6);
    double seconds = atof(argv[3]);
    double start = now(), cpu0 = cpu_seconds();
    uint64_t n = 0;
    if (!strcmp(argv[2], "tight")) {
        while (now() - start < seconds) {
            for (int i = 0; i < 1000; i++) launch(NULL, NULL, NULL, NULL);
            n += 1000;
        }
        double el = now() - start;
        printf("calls=%lu ns_per_call=%.1f\n", (unsigned long)n, el * 1e9 / n);
    } else if (!strcmp(argv[2], "tight-runtime")) {
        dim3 grid = { 1, 1, 1 }, block = { 1, 1, 1 };
        while (now() - start < seconds) {
            for (int i = 0; i < 1000; i++) runtime((const void *)main, grid, block, NULL, 0, NULL);
            n += 1000;
        }
        double el = now() - start;
        printf("calls=%lu ns_per_call=%.1f\n", (unsigned long)n, el * 1e9 / n);
    } else if (!strcmp(argv[2], "rate")) {
        double rate = atof(argv[4]);
        struct timespec next;
        clock_gettime(CLOCK_MONOTONIC, &next);
        long step_ns = (long)(1e9 * 10 / rate);
        while (now() - start < seconds) {
            for (int i = 0; i < 10; i++) launch(NULL, NULL, NULL, NULL);
            n += 10;
            next.tv_nsec += step_ns;
            while (next.tv_nsec >= 1000000000L) {
                next.tv_nsec -= 1000000000L;
                next.tv_sec++;
            }
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
        }
        printf("calls=%lu cpu_s=%.4f wall_s=%.3f\n", (unsigned long)n, cpu_seconds() - cpu0, now() - start);
    } else if (!strcmp(argv[2], "calibrate")) {
        /* The fewest CPU nanoseconds of five tries of 20,000 iterations: the least disturbed. */
        uint64_t best = UINT64_MAX;
        for (int t = 0; t < 5; t++) {
            uint64_t c0 = cpu_ns();
            work_iters(20000);
            uint64_t c = cpu_ns() - c0;
            if (c < best) best = c;
        }
        printf("iters=%.0f\n", atof(argv[4]) * 1e3 * 20000 / (double)best);
    } else if (!strcmp(argv[2], "serve")) {
        uint64_t iters = strtoull(argv[4], NULL, 10);
        char line[64];
        printf("ready\n");
        fflush(stdout);
        while (fgets(line, sizeof line, stdin)) {
            uint64_t steps = strtoull(line, NULL, 10);
            double w0 = now();
            uint64_t c0 = cpu_ns();
            for (uint64_t s = 0; s < steps; s++) {
                work_iters(iters);
                for (int i = 0; i < 20; i++) launch(NULL, NULL, NULL, NULL);
            }
            uint64_t c = cpu_ns() - c0;
            printf("steps=%lu cpu_ns=%lu wall_s=%.6f\n", (unsigned long)steps, (unsigned long)c, now() - w0);
            fflush(stdout);
        }
    } else {
        double us = atof(argv[4]);
        uint64_t steps = 0;
        while (now() - start < seconds) {
            work(us);
            for (int i = 0; i < 20; i++) launch(NULL, NULL, NULL, NULL);
            steps++;
        }
        printf("steps=%lu steps_per_s=%.2f\n", (unsigned long)steps, steps / (now() - start));
    }
    return 0;
}
