/* A thread that spends its time in a library's assembly without unwind information
 * (asm_leaf_lib.c), as a BLAS worker thread does. Argument: seconds to run. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

unsigned long asm_lib_gemm(unsigned long n);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static double seconds;
volatile unsigned long sink;

__attribute__((noinline)) static void asm_worker_loop(void) {
    double end = now() + seconds;
    while (now() < end) sink += asm_lib_gemm(2000000);
}

static void *asm_thread_main(void *arg) {
    (void)arg;
    asm_worker_loop();
    return NULL;
}

int main(int argc, char **argv) {
    seconds = argc > 1 ? atof(argv[1]) : 4.0;
    pthread_t t;
    pthread_create(&t, NULL, asm_thread_main, NULL);
    pthread_join(t, NULL);
    return 0;
}
