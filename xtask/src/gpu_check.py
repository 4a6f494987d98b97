#!/usr/bin/env python3
"""The profiler on a real GPU node (issue 26), with nothing but python3 (with PyTorch) and
nvidia-smi there: `cargo xtask gpu-check --write-script DIR` writes this file and the release
binary into DIR; on the node, as root:

    python3 DIR/gpu_check.py --profiler DIR/profiler --out RESULTS

It runs the daemon, then a PyTorch job in two phases, each a process of its own holding the GPU:
  input-bound: a DataLoader with 6 worker processes whose dataset does CPU-heavy Python per item
               (the GPU waits for batches);
  gpu-bound:   large matrix products back to back.
It prints, per phase, the daemon's mean GPU utilisation beside nvidia-smi's over the same
seconds, the findings that began in it (gpu-starved expected in the first, none in the second),
the daemon's CPU and peak RSS (VmHWM), and keeps /metrics lines about unwinding, stack ends and
memory. Then the CUDA probes (issue 27), on a GPU only: a launch-bound loop of small kernels,
whose launches per step the daemon counts beside torch.profiler's `cudaLaunchKernel` events over
the same steps (within 5 %), the share of the launches named by their kernel (the `[gpu]` leaf
frame, issue 41: >= 90 % named, >= 90 % of those agreeing with torch.profiler's kernel names),
the top launching Python frame, and the loop's step time with the probes and without (a daemon with --no-cuda-probes), in alternating rounds. Without a GPU, `--standin LIB` runs the same check against the tests' stand-in NVML
(CPU-heavy Python worker processes in place of the PyTorch job; nvidia-smi's figures are what the
stand-in was told).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

PHASES = [("input-bound", "input"), ("gpu-bound", "gpu")]


# ---- the workloads (run as `gpu_check.py --workload KIND --seconds N`) ----

def augment(i):
    """CPU-heavy per-item work in Python, the kind a slow transform is."""
    x = i
    for k in range(400_000):
        x = (x * 1103515245 + k) & 0xFFFFFFFF
    return x


def workload_input(seconds):
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Heavy(Dataset):
        def __len__(self):
            return 1 << 30

        def __getitem__(self, i):
            return torch.full((3, 64, 64), float(augment(i) & 255))

    loader = DataLoader(Heavy(), batch_size=16, num_workers=6, persistent_workers=True, prefetch_factor=2)
    a = torch.randn(4096, 4096, device="cuda")
    end = time.time() + seconds
    for batch in loader:
        batch = batch.cuda(non_blocking=True)
        # A little GPU work a batch, while 6 workers make the next ones: the GPU idles, the workers
        # never wait. 8 FP32 products of 4096² a batch held an H100 at 50.7 % (BENCHMARKS.md, just
        # above the detector's 50 %); 3 aim at ~20 %.
        for _ in range(3):
            a = torch.tanh(a @ a) + batch.mean()
        torch.cuda.synchronize()
        if time.time() > end:
            break


def workload_gpu(seconds):
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(50):
            c = a @ b
        torch.cuda.synchronize()
    del c


def launch_step(x):
    """40 small elementwise kernels: the GPU finishes each before the next is launched."""
    import torch

    y = x
    for _ in range(40):
        y = torch.relu(y * 1.0001 + 0.0001)
    return y


def workload_launch(seconds):
    """Launch-bound steps for `seconds`; prints one JSON line: the measured window (unix s), the
    steps in it, and torch.profiler's cudaLaunchKernel count over 50 profiled steps."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(256, device="cuda")
    for _ in range(100):
        launch_step(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(50):
            launch_step(x)
        torch.cuda.synchronize()
    launches = sum(e.count for e in prof.key_averages() if e.key in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx"))
    # The kernels' names as CUPTI gives them (GPU-side events), for the daemon's [gpu] frames.
    kernels = sorted({e.name for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")})
    start = time.time()
    end = start + seconds
    steps = 0
    while time.time() < end:
        launch_step(x)
        steps += 1
    torch.cuda.synchronize()
    print(json.dumps({"start": start, "end": time.time(), "steps": steps, "torch_launches_per_step": launches / 50,
                      "torch_kernels": kernels}), flush=True)


def kernel_base(name):
    """A kernel's name without its return type, template arguments and parameters, so that the
    daemon's demangler and CUPTI's can be compared: `void at::native::foo<4, ...>(int, ...)` ->
    `at::native::foo`."""
    name = name.strip()
    if name.startswith("void "):
        name = name[5:]
    for stop in "<(":
        name = name.split(stop, 1)[0]
    return name.strip()


def fake_worker(seconds):
    end = time.time() + seconds
    i = 0
    while time.time() < end:
        augment(i)
        i += 1


def workload_fake(kind, seconds):
    """Without a GPU: the holder and, input-bound, two CPU-heavy worker processes (children)."""
    import multiprocessing

    workers = []
    if kind == "input":
        workers = [multiprocessing.Process(target=fake_worker, args=(seconds,)) for _ in range(2)]
    for w in workers:
        w.start()
    time.sleep(seconds)
    for w in workers:
        w.join()


# ---- the check ----

def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def profiler(args, prof, data):
    out = run([prof] + args + ["--data-dir", data])
    if out.returncode != 0:
        raise RuntimeError(f"profiler {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


def mount_tracefs():
    if not os.path.exists("/sys/kernel/tracing/events"):
        os.makedirs("/sys/kernel/tracing", exist_ok=True)
        run(["mount", "-t", "tracefs", "tracefs", "/sys/kernel/tracing"])


def find_nvml(given):
    if given:
        return given
    out = run(["ldconfig", "-p"]).stdout if os.path.exists("/sbin/ldconfig") or os.path.exists("/usr/sbin/ldconfig") else ""
    if "libnvidia-ml.so.1" in out:
        return "libnvidia-ml.so.1"
    for d in ["/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"]:
        for name in ["libnvidia-ml.so.1", "libnvidia-ml.so"]:
            if os.path.exists(os.path.join(d, name)):
                return os.path.join(d, name)
    return "libnvidia-ml.so.1"


class Smi:
    """nvidia-smi's utilisation every 200 ms, stamped on arrival; or the stand-in's facts."""

    def __init__(self, facts):
        self.samples = []
        self.facts = facts
        self.stop = False
        self.proc = None
        if facts is None:
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200"],
                stdout=subprocess.PIPE, text=True)
            threading.Thread(target=self.read, daemon=True).start()
        else:
            threading.Thread(target=self.poll_facts, daemon=True).start()

    def read(self):
        for line in self.proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and parts[0] == "0" and parts[1].isdigit():
                self.samples.append((time.time(), float(parts[1])))

    def poll_facts(self):
        while not self.stop:
            try:
                m = re.search(r"^0 util (\d+)", open(self.facts).read(), re.M)
                if m:
                    self.samples.append((time.time(), float(m.group(1))))
            except OSError:
                pass
            time.sleep(0.2)

    def mean(self, t0, t1):
        v = [u for t, u in self.samples if t0 <= t < t1]
        return sum(v) / len(v) if v else None

    def close(self):
        self.stop = True
        if self.proc:
            self.proc.terminate()


def proc_cpu_seconds(pid):
    f = open(f"/proc/{pid}/stat").read()
    fields = f[f.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def vm_hwm_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


def say_standin(facts, util, holder):
    procs = f"{holder}:1073741824" if holder else ""
    text = (f"gpus 1\ndriver 580.159.04\n0 name stand-in H100\n0 uuid GPU-standin\n0 bus 00000000:3B:00.0\n"
            f"0 util {util}\n0 mem_util 10\n0 sm_clock 1980\n0 reasons 0\n0 power_mw 300000\n0 temp 50\n"
            f"0 mem_total 85899345920\n0 mem_used 1073741824\n0 procs {procs}\n")
    with open(facts + ".tmp", "w") as f:
        f.write(text)
    os.rename(facts + ".tmp", facts)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profiler", help="the profiler binary")
    ap.add_argument("--out", default="gpu-check-results")
    ap.add_argument("--seconds", type=int, default=40, help="length of each phase")
    ap.add_argument("--nvml-library", help="NVIDIA's management library [libnvidia-ml.so.1, found]")
    ap.add_argument("--standin", help="the tests' stand-in NVML (no GPU): its facts file is LIB's STANDIN_FILE")
    ap.add_argument("--standin-facts", help="the stand-in's facts file")
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.workload:
        kind = a.workload
        if kind.startswith("fake-"):
            workload_fake(kind[5:], a.seconds)
        elif kind == "input":
            workload_input(a.seconds)
        elif kind == "launch":
            workload_launch(a.seconds)
        else:
            workload_gpu(a.seconds)
        return 0
    if not a.profiler:
        ap.error("--profiler PATH is needed")
    if os.geteuid() != 0:
        sys.exit("gpu_check.py runs the daemon: run it as root")
    os.makedirs(a.out, exist_ok=True)
    mount_tracefs()
    data = os.path.abspath(os.path.join(a.out, "data"))
    lib = a.standin or find_nvml(a.nvml_library)
    if a.standin:
        say_standin(a.standin_facts, 0, None)  # an idle GPU nobody holds, before the daemon looks
    port = 17077
    log = open(os.path.join(a.out, "daemon.log"), "w")
    daemon = subprocess.Popen([a.profiler, "run", "--data-dir", data, "--nvml-library", lib,
                               "--listen", f"127.0.0.1:{port}"], stderr=log, stdout=subprocess.DEVNULL)
    started = time.time()
    try:
        code = check(a, daemon, data, lib, port, started)
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    if not a.standin:
        text = step_ab(a, lib)
        print(text, flush=True)
        open(os.path.join(a.out, "report.txt"), "a").write(text + "\n")
    return code


def step_ab(a, lib, rounds=3, seconds=10):
    """The launch loop's steps a second under a daemon with the CUDA probes and one without, in
    alternating rounds (a fresh daemon each: the probes are attached when it finds the job)."""
    rates = {True: [], False: []}
    for i in range(rounds):
        for probes in ((True, False) if i % 2 == 0 else (False, True)):
            data = os.path.abspath(os.path.join(a.out, f"ab-{i}-{probes}"))
            args = [a.profiler, "run", "--data-dir", data, "--nvml-library", lib, "--listen", "off"]
            if not probes:
                args.append("--no-cuda-probes")
            d = subprocess.Popen(args, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            time.sleep(5)
            r = launch_job(a, seconds)
            rates[probes].append(r["steps"] / (r["end"] - r["start"]))
            d.terminate()
            d.wait(timeout=30)
    med = lambda v: sorted(v)[len(v) // 2]
    on, off = med(rates[True]), med(rates[False])
    return (f"cuda step rate: {off:.1f} steps/s without the probes, {on:.1f} with ({(on - off) / off * 100:+.2f} %), "
            f"medians of {rounds} alternating rounds of {seconds} s: {rates}")


def wait(what, seconds, f):
    end = time.time() + seconds
    while time.time() < end:
        v = f()
        if v:
            return v
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {seconds} s waiting for {what}")


def check(a, daemon, data, lib, port, started):
    prof = a.profiler

    def ready():
        if daemon.poll() is not None:
            raise RuntimeError("the daemon exited; see daemon.log")
        try:
            s = json.loads(profiler(["status", "--format", "json"], prof, data))
            return s["summary"]["span"] and s.get("gpus")
        except (RuntimeError, json.JSONDecodeError, KeyError, TypeError):
            return None
    gpus = wait("the daemon's first samples and its GPU list", 120, ready)
    print(f"daemon up after {time.time() - started:.1f} s; GPUs: {json.dumps(gpus)}", flush=True)
    cpu0 = proc_cpu_seconds(daemon.pid)
    t_cpu0 = time.time()
    smi = Smi(a.standin_facts if a.standin else None)
    results = []
    for name, kind in PHASES:
        job = [sys.executable, os.path.abspath(__file__), "--seconds", str(a.seconds),
               "--workload", ("fake-" + kind) if a.standin else kind]
        t0 = time.time()
        p = subprocess.Popen(job)
        if a.standin:
            say_standin(a.standin_facts, 25 if kind == "input" else 97, p.pid)
        # The first seconds are CUDA's start and the workers' first batches: not the phase.
        time.sleep(8)
        t_in = time.time()
        p.wait()
        t1 = time.time()
        results.append({"phase": name, "start": t_in, "end": t1, "job_start": t0})
        print(f"{name}: {t1 - t_in:.0f} s measured (job exit {p.returncode})", flush=True)
    time.sleep(4)  # the detectors' grace, the last counters
    cpu = proc_cpu_seconds(daemon.pid) - cpu0
    wall = time.time() - t_cpu0
    smi.close()
    report = []
    for r in results:
        t0, t1 = r["start"], r["end"]
        c = json.loads(profiler(["counters", "--from", iso(t0), "--to", iso(t1), "--name", "gpu.*.util",
                                 "--format", "json"], prof, data))
        pts = [p[1] for t in c["tracks"] if t["name"] == "gpu.0.util" for p in t["points"]]
        r["daemon_util"] = sum(pts) / len(pts) if pts else None
        r["daemon_points"] = len(pts)
        r["smi_util"] = smi.mean(t0, t1)
        r["smi_samples"] = len([1 for t, _ in smi.samples if t0 <= t < t1])
        f = json.loads(profiler(["findings", "--from", iso(r["job_start"]), "--to", iso(t1 + 4), "--format", "json"], prof, data))
        r["findings"] = [{"kind": x["kind"], "summary": x["summary"]} for x in f
                         if r["job_start"] * 1e9 <= x["start_ns"] < t1 * 1e9]
        d, s = r["daemon_util"], r["smi_util"]
        diff = abs(d - s) if d is not None and s is not None else None
        r["diff"] = diff
        kinds = sorted({x["kind"] for x in r["findings"]})
        report.append(f"{r['phase']:<12} daemon GPU util {fmt(d)} ({r['daemon_points']} points)  nvidia-smi {fmt(s)} "
                      f"({r['smi_samples']} samples)  diff {fmt(diff, '')}  findings: {', '.join(kinds) or 'none'}")
        for x in r["findings"]:
            report.append(f"             {x['kind']}: {x['summary']}")
        report.extend(stack_reach(prof, data, t0, t1))
    hwm = vm_hwm_mib(daemon.pid)
    report.append(f"daemon CPU {cpu:.2f} s over {wall:.0f} s ({100 * cpu / wall:.2f} % of one core), peak RSS (VmHWM) {hwm:.1f} MiB")
    try:
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    except OSError as e:
        metrics = f"# /metrics unreadable: {e}\n"
    keep = [l for l in metrics.splitlines()
            if re.search(r"unwind|stack|memory|rss|resident|gpu|lost|cpu_seconds|symbol_cache", l) and not l.startswith("# HELP")]
    open(os.path.join(a.out, "metrics.txt"), "w").write("\n".join(keep) + "\n")
    ok = [r["diff"] is not None and r["diff"] <= 5 for r in results]
    starved = any(x["kind"] == "gpu-starved" for x in results[0]["findings"])
    gpu_quiet = not any(x["kind"].startswith("gpu-") for x in results[1]["findings"])
    report.append(f"verdict: util within 5 points {ok}; gpu-starved in input-bound {starved}; no GPU finding in gpu-bound {gpu_quiet}")
    cuda_ok = True
    if not a.standin:
        cuda_ok, lines = check_cuda(a, prof, data)
        report.extend(lines)
    text = "\n".join(report)
    print(text, flush=True)
    open(os.path.join(a.out, "report.txt"), "w").write(text + "\n")
    json.dump({"phases": results, "daemon_cpu_s": cpu, "wall_s": wall, "vm_hwm_mib": hwm, "gpus": json.loads(profiler(["status", "--format", "json"], prof, data)).get("gpus")},
              open(os.path.join(a.out, "summary.json"), "w"), indent=1)
    return 0 if all(ok) and starved and gpu_quiet and cuda_ok else 1


# Frames a thread's stack starts at: the process's entry or a thread's (a libc without symbols
# names clone3 and start_thread `libc.so.6+0x...`).
STARTS = ("_start", "__clone3", "clone3", "__clone", "clone", "start_thread")


def stack_reach(prof, data, t0, t1, top=8):
    """Per thread name, the share of samples whose stack reaches the thread's start (issue 28:
    the autograd and OpenBLAS threads, the interpreter's main thread)."""
    folded = profiler(["flamegraph", "--from", iso(t0), "--to", iso(t1), "--format", "folded", "--max-stacks",
                       "1000000"], prof, data)
    per = {}
    for line in folded.splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if len(frames) < 2 or not n.isdigit() or frames[0].startswith("swapper"):
            continue
        user = [f for f in frames[1:] if not f.endswith("_[k]")]
        ok = bool(user) and (user[0] in STARTS or user[0].startswith("libc.so.6+"))
        c = per.setdefault(frames[0], [0, 0])
        c[0] += int(n)
        c[1] += int(n) if ok else 0
    rows = sorted(per.items(), key=lambda kv: -kv[1][0])[:top]
    return ["             stacks reaching their thread's start: " +
            ", ".join(f"{comm} {100 * ok / total:.0f} % of {total}" for comm, (total, ok) in rows)]


def launch_job(a, seconds):
    out = run([sys.executable, os.path.abspath(__file__), "--seconds", str(seconds), "--workload", "launch"])
    return json.loads(out.stdout.strip().splitlines()[-1])


def check_cuda(a, prof, data):
    """The CUDA probes against torch.profiler, and the step time with and without them."""
    lines = []
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--seconds", "20", "--workload", "launch"],
                         stdout=subprocess.PIPE, text=True)
    r = json.loads(p.communicate()[0].strip().splitlines()[-1])
    time.sleep(3)  # drained each second, read a drain later
    folded = profiler(["flamegraph", "--samples", "cuda-launches", "--from", iso(r["start"]), "--to", iso(r["end"]),
                       "--pid", str(p.pid), "--format", "folded"], prof, data)
    counts = [(l.rsplit(" ", 1)[0], int(l.rsplit(" ", 1)[1])) for l in folded.splitlines() if " " in l]
    total = sum(n for _, n in counts)
    per_step = total / max(r["steps"], 1)
    torch_per_step = r["torch_launches_per_step"]
    within = torch_per_step > 0 and abs(per_step - torch_per_step) <= 0.05 * torch_per_step
    frames = {}
    for stack, n in counts:
        py = [f for f in stack.split(";") if f.endswith(")") and ".py" in f]
        if py:
            frames[py[-1]] = frames.get(py[-1], 0) + n
    top = max(frames.items(), key=lambda kv: kv[1]) if frames else ("none", 0)
    lines.append(f"cuda launches: daemon {per_step:.1f} per step ({total} over {r['steps']} steps, "
                 f"{total / max(r['end'] - r['start'], 1e-9):.0f}/s), torch.profiler {torch_per_step:.1f} per step: "
                 f"within 5 % {within}; top launching Python frame {top[0]} ({top[1]})")
    # Issue 41: the launches' kernel names (the [gpu] leaf) beside torch.profiler's.
    named = {}
    for stack, n in counts:
        leaf = stack.rsplit(";", 1)[-1]
        if leaf.startswith("[gpu] ") and not leaf.startswith(("[gpu] kernel in ", "[gpu] kernel 0x")):
            named[leaf[6:]] = named.get(leaf[6:], 0) + n
    named_total = sum(named.values())
    torch_bases = {kernel_base(k) for k in r.get("torch_kernels", [])}
    agreeing = sum(n for k, n in named.items() if kernel_base(k) in torch_bases)
    named_share = named_total / max(total, 1)
    agree_share = agreeing / max(named_total, 1)
    names_ok = named_share >= 0.9 and agree_share >= 0.9
    top_names = sorted(named.items(), key=lambda kv: -kv[1])[:3]
    lines.append(f"cuda kernel names: {named_share * 100:.1f} % of launches named (goal >= 90 %), "
                 f"{agree_share * 100:.1f} % of those agreeing with torch.profiler's kernels: {names_ok}; "
                 f"top {top_names}; torch.profiler's {sorted(torch_bases)[:5]}")
    within = within and names_ok
    status = json.loads(profiler(["status", "--format", "json"], prof, data)).get("cuda") or {}
    lines.append(f"cuda probes: {json.dumps(status.get('libraries'))}")
    return within, lines


def fmt(v, unit=" %"):
    return "n/a" if v is None else f"{v:.1f}{unit}"


if __name__ == "__main__":
    sys.exit(main())
