/* An unprivileged user's attack on the CUDA probes (issue 38): dlopens a CUDA driver library
 * (the stand-in, or a copy of anything under its name) and calls it from many threads through
 * many distinct stacks.
 *
 *   flood LIB copy|launch THREADS STACKS CALLS_PER_SEC SECONDS
 *
 * copy: cuMemcpyHtoD_v2 with a size of 1 TiB (the stand-in copies nothing); launch:
 * cuLaunchKernel. Each thread cycles through STACKS call depths (a distinct stack each), the
 * whole process calling CALLS_PER_SEC times a second (batches on absolute deadlines). Loads the
 * library, computes for a second (the profiler finds processes by sampling them), prints
 * "ready", then "calls=N" at the end. Built with frame pointers, as the stand-in. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*copy_fn)(uint64_t, const void *, size_t);
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                         void **, void **);

static copy_fn copy;
static launch_fn launch;
static int stacks, threads, seconds;
static double per_thread;
static volatile uint64_t total;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void sleep_until(double t) {
    double d = t - now();
    if (d <= 0) return;
    struct timespec s = { (time_t)d, (long)((d - (time_t)d) * 1e9) };
    nanosleep(&s, NULL);
}

__attribute__((noinline)) static void call(void) {
    if (copy) copy(0, 0, (size_t)1 << 40);
    else launch(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
}

/* Depth d: a stack d frames deeper than depth 0, so each depth is a distinct stack. */
__attribute__((noinline)) static void descend(int d) {
    if (d <= 0) call();
    else descend(d - 1);
    __asm__ volatile("" ::: "memory");
}

static void *run(void *arg) {
    (void)arg;
    double start = now(), step = 0.01;
    uint64_t n = 0;
    for (int b = 0; now() < start + seconds; b++) {
        int calls = (int)(per_thread * step + 0.5);
        for (int i = 0; i < calls; i++) descend((int)(n++ % stacks));
        sleep_until(start + (b + 1) * step);
    }
    __atomic_add_fetch(&total, n, __ATOMIC_RELAXED);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: flood LIB copy|launch THREADS STACKS CALLS_PER_SEC SECONDS\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    if (!strcmp(argv[2], "copy")) copy = (copy_fn)dlsym(h, "cuMemcpyHtoD_v2");
    else launch = (launch_fn)dlsym(h, "cuLaunchKernel");
    threads = atoi(argv[3]);
    stacks = atoi(argv[4]);
    per_thread = atof(argv[5]) / threads;
    seconds = atoi(argv[6]);
    volatile uint64_t x = 1;
    for (double end = now() + 1.0; now() < end;)
        for (int i = 0; i < 1000; i++) x = x * 6364136223846793005ULL + 1;
    printf("ready\n");
    fflush(stdout);
    if (!copy && !launch) {
        /* Not a driver (a copy of another library under its name): hold the mapping. */
        sleep_until(now() + seconds);
        printf("calls=0\n");
        return 0;
    }
    pthread_t t[256];
    if (threads > 256) threads = 256;
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, run, NULL);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    printf("calls=%llu\n", (unsigned long long)total);
    return 0;
}
