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
