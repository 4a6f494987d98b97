/* C built -O2 -fomit-frame-pointer: the time goes into a comparator called back by glibc's
 * qsort (itself built without frame pointers), so a complete stack crosses libc twice. */
#include <stdlib.h>
#include <time.h>

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    for (int i = 0; i < 20; i++) { x *= 1.0000001; y *= 1.0000001; }
    return (x > y) - (x < y);
}

__attribute__((noinline)) void shuffle_and_sort(double *v, int n) {
    for (int i = 0; i < n; i++) v[i] = rand();
    qsort(v, n, sizeof *v, by_value);
}

__attribute__((noinline)) void keep_sorting(double *v, int n, double secs) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        shuffle_and_sort(v, n);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 < secs);
}

int main(int argc, char **argv) {
    static double v[50000];
    keep_sorting(v, 50000, argc > 1 ? atof(argv[1]) : 5);
    return 0;
}
