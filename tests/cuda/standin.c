/* A stand-in for NVIDIA's CUDA driver library (libcuda.so.1), for tests on machines without a
 * GPU: the same symbol names and signatures as cuda.h declares them; launches and copies return
 * at once, synchronisations sleep STANDIN_SYNC_US microseconds (environment; default 2000).
 * Only NVIDIA's library is replaced: the daemon's uprobes, the kernel and the unwinder are real.
 *
 * cuLaunchKernel passes through cuLaunchKernelEx, as one launch can in the real driver: the
 * daemon must count it once. Built with frame pointers, as the real library is not: the tests
 * check the stack above the library (Python frames), not inside it.
 *
 * The look-ups (cuModuleGetFunction, cuLibraryGetKernel, cuKernelGetFunction) return a distinct
 * handle per call, as the real driver returns one per kernel: the daemon names launches by
 * handle from what it saw them looked up as. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

typedef int CUresult;
typedef void *CUfunction;
typedef void *CUstream;
typedef void *CUevent;
typedef void *CUcontext;
typedef void *CUgraphExec;
typedef void *CUmodule;
typedef void *CUlibrary;
typedef void *CUkernel;
typedef uint64_t CUdeviceptr;
typedef struct { size_t f[16]; } CUDA_MEMCPY2D;

static void nap(void) {
    const char *s = getenv("STANDIN_SYNC_US");
    long us = s ? atol(s) : 2000;
    struct timespec t = { us / 1000000, (us % 1000000) * 1000 };
    nanosleep(&t, NULL);
}

/* The driver's first entry point: the daemon probes only a file that exports it. */
CUresult cuInit(unsigned int flags) {
    (void)flags;
    return 0;
}

/* Keeps the compiler from folding a launch into nothing, so each has its own instructions. */
volatile uint64_t standin_launches;

__attribute__((noinline)) CUresult cuLaunchKernelEx(const void *config, CUfunction f, void **params, void **extra) {
    (void)config; (void)f; (void)params; (void)extra;
    standin_launches++;
    return 0;
}

__attribute__((noinline)) CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                                  unsigned by, unsigned bz, unsigned shared, CUstream s, void **params,
                                                  void **extra) {
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared; (void)s;
    return cuLaunchKernelEx(NULL, f, params, extra);
}

__attribute__((noinline)) CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                             unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                                             CUstream s, void **params) {
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared; (void)s; (void)params;
    standin_launches++;
    return 0;
}

__attribute__((noinline)) CUresult cuGraphLaunch(CUgraphExec g, CUstream s) {
    (void)g; (void)s;
    standin_launches++;
    return 0;
}

__attribute__((noinline)) CUresult cuStreamSynchronize(CUstream s) { (void)s; nap(); return 0; }
__attribute__((noinline)) CUresult cuEventSynchronize(CUevent e) { (void)e; nap(); return 0; }
__attribute__((noinline)) CUresult cuCtxSynchronize(void) { nap(); return 0; }
/* CUDA 13: the context given (NULL: the current one). */
__attribute__((noinline)) CUresult cuCtxSynchronize_v2(void *ctx) { (void)ctx; nap(); return 0; }

volatile size_t standin_bytes;

__attribute__((noinline)) CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    (void)dst; (void)src;
    standin_bytes += n;
    return 0;
}
__attribute__((noinline)) CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    (void)dst; (void)src;
    standin_bytes += n;
    return 0;
}
__attribute__((noinline)) CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    (void)dst; (void)src; (void)s;
    standin_bytes += n;
    return 0;
}
__attribute__((noinline)) CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n) {
    (void)dst; (void)dc; (void)src; (void)sc;
    standin_bytes += n;
    return 0;
}
__attribute__((noinline)) CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *p) {
    standin_bytes += p->f[14] * p->f[15];
    return 0;
}

/* A fresh handle: distinct from every other one the process holds (never freed: the process
 * keeps its kernels). */
static void *handle(void) {
    return malloc(16);
}

__attribute__((noinline)) CUresult cuModuleGetFunction(CUfunction *f, CUmodule mod, const char *name) {
    (void)mod;
    if (!f || !name) return 1; /* CUDA_ERROR_INVALID_VALUE */
    *f = handle();
    return 0;
}

__attribute__((noinline)) CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary lib, const char *name) {
    (void)lib;
    if (!k || !name) return 1;
    *k = handle();
    return 0;
}

__attribute__((noinline)) CUresult cuKernelGetFunction(CUfunction *f, CUkernel k) {
    if (!f || !k) return 1;
    *f = handle();
    return 0;
}
