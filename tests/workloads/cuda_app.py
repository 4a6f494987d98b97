"""Launches GPU work through a CUDA driver library (the tests' stand-in) from named functions,
for the CUDA probe tests (tests/tests/cuda.rs).

    python3 cuda_app.py LIB [--late] [--rate N]

Loads LIB with ctypes at once (or, with --late, after "go"), spins a little so the profiler
samples it, prints "ready", waits for a line "go" on stdin, then calls:
  launch_direct: cuLaunchKernelEx 3000 times;
  launch_nested: cuLaunchKernel 2000 times (which passes through cuLaunchKernelEx: one launch);
  copy_up: cuMemcpyHtoD_v2 100 times, 1 MiB each;
  wait_gpu: cuStreamSynchronize 50 times, measuring the time blocked;
  wait_context: cuCtxSynchronize_v2 (CUDA 13's) 50 times, likewise;
then prints one JSON line with what it did, and waits for stdin to close before exiting.
With --rate N it instead launches from launch_steady at N a second for 4 s and prints, in the
JSON line, when it loaded the library and how many launches it made after each 100 ms, and in
each wall-clock second (unix seconds, measured just after each launch), and when it ended.
With --stall S it spends S seconds in a step that computes 1 ms and then waits on the GPU
(log_loss: cuStreamSynchronize); with --launch-bound S, S seconds in a step that launches
kernels one by one between bits of Python work (train_step); with --busy S, S seconds of a
rank that computes and never waits: a step of 1 ms of Python work then 2 launches (forward,
about 2,000 launches a second: under the probes' rate guard).

With --runtime-rate N it loads the stand-in runtime and host stubs (as --names) and launches the
vecAdd stub from launch_runtime_steady at N a second for 4 s (--seconds S: S) (each launch through
cudaLaunchKernel and the driver's cuLaunchKernel), printing {"launches": n}.

With --runtime-first it loads the stand-in runtime and host stubs but not LIB (as PyTorch's
`import torch`); on "go", __cudaGetKernel for the transpose stub starts the runtime, which loads
the driver (LIB, beside it), and it prints {"started": true}; on "launch", launch_first launches
by that kernel 600 times through cudaLaunchKernel and prints {"launches": 600}.

With --names it also loads the stand-in runtime (libcudart.so.12) and host stubs (libkernels.so)
beside LIB, and instead calls:
  launch_runtime: the vecAdd stub 1000 times (cudaLaunchKernel, then the driver's cuLaunchKernel);
  launch_cuda13: __cudaGetKernel for the transpose stub once, cudaLaunchKernel by it 600 times;
  launch_looked_up: cuModuleGetFunction "triton_poi_fused_add_0" once, cuLaunchKernel 700 times;
  launch_library: cuLibraryGetKernel "ampere_sgemm_128x64_tn" and cuKernelGetFunction once,
    cuLaunchKernelEx by the function 300 times;
  launch_graph: cuGraphLaunch 200 times;
  launch_graph_runtime: the runtime's cudaGraphLaunch 100 times (which calls the driver's
    cuGraphLaunch: one graph launch each);
  launch_early: cuLaunchKernel 400 times by a handle cuModuleGetFunction gave for
    "early_kernel_do_not_name" at start, before "ready" (so before a daemon started after it).
"""
import ctypes
import json
import os
import sys
import time


def spin(seconds):
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1
    return x


def launch_direct(lib, n):
    for _ in range(n):
        lib.cuLaunchKernelEx(None, None, None, None)


def launch_nested(lib, n):
    for _ in range(n):
        lib.cuLaunchKernel(None, 1, 1, 1, 1, 1, 1, 0, None, None, None)


def copy_up(lib, n, size):
    for _ in range(n):
        lib.cuMemcpyHtoD_v2(ctypes.c_uint64(0), None, ctypes.c_size_t(size))


def timed_calls(f, n):
    """The seconds spent in n calls of f(None), timed around the call alone: the function is
    looked up before (ctypes resolves a symbol at its first use, which the probes never see)."""
    blocked = 0.0
    for _ in range(n):
        t = time.perf_counter()
        f(None)
        blocked += time.perf_counter() - t
    return blocked


def wait_gpu(lib, n):
    return timed_calls(lib.cuStreamSynchronize, n)


def wait_context(lib, n):
    return timed_calls(lib.cuCtxSynchronize_v2, n)


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def look_up(lib, name):
    f = ctypes.c_void_p()
    assert lib.cuModuleGetFunction(ctypes.byref(f), None, name) == 0
    return f


def launch_runtime(kernels, n):
    p = ctypes.c_void_p()
    for _ in range(n):
        kernels._Z6vecAddPfS_S_i(p, p, p, 1024)


def launch_cuda13(rt, kernels, n):
    k = ctypes.c_void_p()
    stub = ctypes.cast(kernels._Z9transposePfPKfii, ctypes.c_void_p)
    get_kernel = getattr(rt, "__cudaGetKernel")
    assert get_kernel(ctypes.byref(k), stub) == 0
    grid, block = Dim3(32, 32, 1), Dim3(16, 16, 1)
    for _ in range(n):
        rt.cudaLaunchKernel(k, grid, block, None, ctypes.c_size_t(0), None)


def launch_first(rt, k, n):
    grid, block = Dim3(32, 32, 1), Dim3(16, 16, 1)
    for _ in range(n):
        assert rt.cudaLaunchKernel(k, grid, block, None, ctypes.c_size_t(0), None) == 0


def runtime_first(rt, kernels):
    k = ctypes.c_void_p()
    stub = ctypes.cast(kernels._Z9transposePfPKfii, ctypes.c_void_p)
    # The runtime starts: the driver is mapped now, right before the look-up.
    assert getattr(rt, "__cudaGetKernel")(ctypes.byref(k), stub) == 0
    print(json.dumps({"started": True}), flush=True)
    if sys.stdin.readline().strip() != "launch":
        return
    launch_first(rt, k, 600)
    print(json.dumps({"launches": 600}), flush=True)


def launch_looked_up(lib, n):
    f = look_up(lib, b"triton_poi_fused_add_0")
    for _ in range(n):
        lib.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, None, None, None)


def launch_library(lib, n):
    k, f = ctypes.c_void_p(), ctypes.c_void_p()
    assert lib.cuLibraryGetKernel(ctypes.byref(k), None, b"ampere_sgemm_128x64_tn") == 0
    assert lib.cuKernelGetFunction(ctypes.byref(f), k) == 0
    for _ in range(n):
        lib.cuLaunchKernelEx(None, f, None, None)


def launch_graph(lib, n):
    for _ in range(n):
        lib.cuGraphLaunch(None, None)


def launch_graph_runtime(rt, n):
    for _ in range(n):
        rt.cudaGraphLaunch(None, None)


def launch_early(lib, f, n):
    for _ in range(n):
        lib.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, None, None, None)


def names(lib, rt, kernels, early):
    launch_runtime(kernels, 1000)
    launch_cuda13(rt, kernels, 600)
    launch_looked_up(lib, 700)
    launch_library(lib, 300)
    launch_graph(lib, 200)
    launch_graph_runtime(rt, 100)
    launch_early(lib, early, 400)
    return {"runtime": 1000, "cuda13": 600, "looked_up": 700, "library": 300, "graph": 200, "graph_runtime": 100,
            "early": 400}


def launch_steady(lib, rate, seconds):
    start = time.time()
    after = []
    n = 0
    period = 1.0 / rate
    next_t = time.perf_counter()
    end = next_t + seconds
    per_second = {}
    while time.perf_counter() < end:
        lib.cuLaunchKernelEx(None, None, None, None)
        n += 1
        now = time.time()
        per_second[int(now)] = per_second.get(int(now), 0) + 1
        elapsed = now - start
        while len(after) < int(elapsed * 10):
            after.append(n - 1)
        next_t += period
        while time.perf_counter() < next_t:
            pass
    return start, n, after, per_second, time.time()


def launch_runtime_steady(kernels, rate, seconds):
    p = ctypes.c_void_p()
    n = 0
    period = 1.0 / rate
    next_t = time.perf_counter()
    end = next_t + seconds
    while time.perf_counter() < end:
        kernels._Z6vecAddPfS_S_i(p, p, p, 1024)
        n += 1
        next_t += period
        while time.perf_counter() < next_t:
            pass
    return n


def log_loss(lib):
    lib.cuStreamSynchronize(None)


def stall(lib, seconds):
    end = time.perf_counter() + seconds
    steps = 0
    while time.perf_counter() < end:
        spin(0.001)
        log_loss(lib)
        steps += 1
    return steps


def train_step(lib):
    x = 0
    for _ in range(8):
        lib.cuLaunchKernelEx(None, None, None, None)
        x += sum(range(200))
    return x


def forward(lib):
    spin(0.001)
    lib.cuLaunchKernelEx(None, None, None, None)
    lib.cuLaunchKernelEx(None, None, None, None)


def busy(lib, seconds):
    end = time.perf_counter() + seconds
    steps = 0
    while time.perf_counter() < end:
        forward(lib)
        steps += 1
    return steps


def launch_bound(lib, seconds):
    end = time.perf_counter() + seconds
    steps = 0
    while time.perf_counter() < end:
        train_step(lib)
        steps += 1
    return steps * 8


def main():
    path = sys.argv[1]
    late = "--late" in sys.argv
    rate = int(sys.argv[sys.argv.index("--rate") + 1]) if "--rate" in sys.argv else 0
    first = "--runtime-first" in sys.argv
    lib = None if late or first else ctypes.CDLL(path)
    if "--names" in sys.argv or "--runtime-rate" in sys.argv or first:
        here = os.path.dirname(path)
        rt = ctypes.CDLL(os.path.join(here, "libcudart.so.12"))
        kernels = ctypes.CDLL(os.path.join(here, "libkernels.so"))
        early = None if first else look_up(lib, b"early_kernel_do_not_name")
    spin(1.5)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    if late:
        loaded_at = time.time()
        lib = ctypes.CDLL(path)
    else:
        loaded_at = None
    if first:
        runtime_first(rt, kernels)
    elif "--names" in sys.argv:
        print(json.dumps(names(lib, rt, kernels, early)), flush=True)
    elif "--runtime-rate" in sys.argv:
        secs = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 4.0
        n = launch_runtime_steady(kernels, int(sys.argv[sys.argv.index("--runtime-rate") + 1]), secs)
        print(json.dumps({"launches": n}), flush=True)
    elif "--stall" in sys.argv:
        steps = stall(lib, float(sys.argv[sys.argv.index("--stall") + 1]))
        print(json.dumps({"steps": steps}), flush=True)
    elif "--busy" in sys.argv:
        steps = busy(lib, float(sys.argv[sys.argv.index("--busy") + 1]))
        print(json.dumps({"steps": steps}), flush=True)
    elif "--launch-bound" in sys.argv:
        n = launch_bound(lib, float(sys.argv[sys.argv.index("--launch-bound") + 1]))
        print(json.dumps({"launches": n}), flush=True)
    elif rate:
        start, n, after, per_second, end = launch_steady(lib, rate, 4.0)
        report = {"loaded_at": loaded_at, "start": start, "end": end, "launches": n, "after_tenths": after}
        print(json.dumps({**report, "per_second": per_second}), flush=True)
    else:
        launch_direct(lib, 3000)
        launch_nested(lib, 2000)
        copy_up(lib, 100, 1 << 20)
        blocked = wait_gpu(lib, 50)
        ctx = wait_context(lib, 50)
        print(json.dumps({"direct": 3000, "nested": 2000, "copied": 100 << 20, "blocked_us": blocked * 1e6,
                          "ctx_blocked_us": ctx * 1e6}), flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
