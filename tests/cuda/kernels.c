/* Host stubs as nvcc generates them for `__global__` kernels, for tests without a GPU: each is a
 * host function whose ELF symbol is the kernel's mangled name and which launches itself through
 * the runtime (cudaLaunchKernel with its own address). The daemon names the launch from the
 * stub's symbol: `vecAdd(float*, float*, float*, int)`. */
#include <stddef.h>

typedef struct { unsigned x, y, z; } dim3;
int cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shared, void *stream);

/* __global__ void vecAdd(float *a, float *b, float *c, int n) */
__attribute__((noinline)) void _Z6vecAddPfS_S_i(float *a, float *b, float *c, int n) {
    void *args[] = { &a, &b, &c, &n };
    dim3 grid = { 128, 1, 1 }, block = { 256, 1, 1 };
    cudaLaunchKernel((const void *)_Z6vecAddPfS_S_i, grid, block, args, 0, NULL);
}

/* __global__ void transpose(float *out, const float *in, int rows, int cols) */
__attribute__((noinline)) void _Z9transposePfPKfii(float *out, const float *in, int rows, int cols) {
    void *args[] = { &out, &in, &rows, &cols };
    dim3 grid = { 32, 32, 1 }, block = { 16, 16, 1 };
    cudaLaunchKernel((const void *)_Z9transposePfPKfii, grid, block, args, 0, NULL);
}
