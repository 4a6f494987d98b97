/* A stand-in for the CUDA runtime library (libcudart.so.12), for tests without a GPU: the same
 * names and signatures as cuda_runtime_api.h declares them, built against the stand-in driver
 * (standin.c), which each launch passes through as the real runtime's does.
 *
 * cudaLaunchKernel(func, ...) gets the kernel's host stub (or, from CUDA 13's generated code,
 * the handle __cudaGetKernel gave for it) and launches a driver handle of its own (here: a
 * value that is neither), so a daemon naming the launch by the driver's handle would not find
 * the stub's name: it must take the stub the runtime was given, and count the launch once.
 *
 * Like the real runtime, it loads the driver when it starts (its first call that needs the GPU),
 * not when it is loaded: a process that only loaded the runtime (`import torch`) maps no driver
 * yet. The driver is CUDA_DRIVER beside this file (default libcuda.so.1). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef CUDA_DRIVER
#define CUDA_DRIVER "libcuda.so.1"
#endif

typedef int cudaError_t;
typedef int CUresult;
typedef void *CUfunction;
typedef void *cudaStream_t;
typedef void *cudaKernel_t;
typedef void *cudaGraphExec_t;
typedef struct { unsigned x, y, z; } dim3;

typedef CUresult (*launch_fn)(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                              unsigned bz, unsigned shared, void *s, void **params, void **extra);
typedef CUresult (*graph_fn)(void *g, void *s);
static launch_fn cuLaunchKernel;
static graph_fn cuGraphLaunch;

/* The runtime's start: the driver beside this file, loaded once. 0 when it is there. */
static int start(void) {
    if (cuLaunchKernel && cuGraphLaunch) return 0;
    Dl_info self;
    if (!dladdr((void *)start, &self) || !self.dli_fname) return 1;
    const char *slash = strrchr(self.dli_fname, '/');
    size_t dir = slash ? (size_t)(slash - self.dli_fname) + 1 : 0;
    char path[4096];
    if (dir + sizeof CUDA_DRIVER > sizeof path) return 1;
    memcpy(path, self.dli_fname, dir);
    memcpy(path + dir, CUDA_DRIVER, sizeof CUDA_DRIVER);
    void *driver = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!driver) return 1;
    cuLaunchKernel = (launch_fn)dlsym(driver, "cuLaunchKernel");
    cuGraphLaunch = (graph_fn)dlsym(driver, "cuGraphLaunch");
    return cuLaunchKernel && cuGraphLaunch ? 0 : 1;
}

/* The runtime's other entry point the daemon checks for before it probes a file. */
cudaError_t cudaGetDeviceCount(int *n) {
    if (n) *n = 1;
    return 0;
}

/* The driver's handle for a kernel: the runtime's own (registered at load in the real one). */
static CUfunction driver_handle(const void *func) {
    return (CUfunction)((uintptr_t)func ^ 0x5a5a0000u);
}

__attribute__((noinline)) cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args,
                                                        size_t shared, cudaStream_t stream) {
    if (start()) return 3; /* cudaErrorInitializationError */
    return cuLaunchKernel(driver_handle(func), grid.x, grid.y, grid.z, block.x, block.y, block.z, (unsigned)shared,
                          stream, args, NULL);
}

/* CUDA 13: the generated code asks once for the kernel of a stub, then launches by it. */
__attribute__((noinline)) cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *stub) {
    if (!kernel || !stub) return 1; /* cudaErrorInvalidValue */
    if (start()) return 3;
    *kernel = malloc(16);
    return 0;
}

__attribute__((noinline)) cudaError_t cudaGraphLaunch(cudaGraphExec_t g, cudaStream_t s) {
    if (start()) return 3;
    return cuGraphLaunch(g, s);
}
