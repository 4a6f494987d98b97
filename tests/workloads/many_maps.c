/* A process with more executable mappings than the unwinder describes: it maps every file of a
 * directory (argv[2]) PROT_READ|PROT_EXEC, one mapping per file, says how many on stdout, then
 * sorts with glibc's qsort for argv[1] seconds. Built -O2 -fomit-frame-pointer: a complete stack
 * needs the tables of this binary and of libc, which mmap placed above all those files. The
 * frame pointer register is zeroed before each sort, so that a frame-pointer walk from a frame
 * in libc (when libc is not described) ends there instead of finding main by chance. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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
        /* rbp is an ordinary callee-saved register here: the compiler saves and restores it. */
        __asm__ volatile("xor %%ebp, %%ebp" ::: "rbp");
        shuffle_and_sort(v, n);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 < secs);
}

__attribute__((noinline)) int map_all(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) { perror(dir); exit(2); }
    int mapped = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0) { perror(e->d_name); exit(2); }
        if (mmap(NULL, st.st_size, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) == MAP_FAILED) {
            perror("mmap");
            exit(2);
        }
        close(fd);
        mapped++;
    }
    closedir(d);
    return mapped;
}

int main(int argc, char **argv) {
    static double v[50000];
    if (argc < 3) { fprintf(stderr, "usage: %s SECONDS DIR\n", argv[0]); return 2; }
    printf("mapped %d\n", map_all(argv[2]));
    fflush(stdout);
    keep_sorting(v, 50000, atof(argv[1]));
    return 0;
}
