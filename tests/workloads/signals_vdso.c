/* -O2 -fomit-frame-pointer: time spent in a signal handler (the walk crosses the kernel's
 * signal frame through __restore_rt) and in the vDSO (clock_gettime), both below main. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static volatile double sink;

static void on_tick(int sig) {
    (void)sig;
    double x = 1;
    for (int i = 0; i < 1000000; i++) x = x * 1.0000001 + 1e-9;
    sink = x;
}

__attribute__((noinline)) double read_clocks(double secs) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    double elapsed = 0, acc = 0;
    while (elapsed < secs) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        elapsed = (t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9;
        acc += elapsed;
    }
    return acc;
}

int main(int argc, char **argv) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_tick;
    sigaction(SIGPROF, &sa, NULL);
    struct itimerval every = {{0, 3000}, {0, 3000}};
    setitimer(ITIMER_PROF, &every, NULL);
    sink = read_clocks(argc > 1 ? atof(argv[1]) : 5);
    return 0;
}
