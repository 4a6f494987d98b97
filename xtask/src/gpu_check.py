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
seconds (issue 41: the daemon reads NVML's own samples, nvmlDeviceGetSamples, once a second; the
track's median gap between points says whether it kept their sub-second times, and status how
the daemon reads utilisation: a point off its time or on the wrong clock leaves the phase), the findings that began in it (gpu-starved expected in the first, none in the second),
the daemon's CPU and peak RSS (VmHWM), and keeps /metrics lines about unwinding, stack ends and
memory. Then the CUDA probes (issue 27), on a GPU only: a launch-bound loop of small kernels,
whose launches per step the daemon counts beside torch.profiler's `cudaLaunchKernel` events over
the same steps (within 5 %), the share of the launches named by their kernel (the `[gpu]` leaf
frame, issue 41: >= 90 % named, >= 90 % of those agreeing with torch.profiler's kernel names),
the top launching Python frame, and the loop's step time with the probes and without (a daemon with --no-cuda-probes), in alternating rounds. Without a GPU, `--standin LIB` runs the same check against the tests' stand-in NVML
(CPU-heavy Python worker processes in place of the PyTorch job; nvidia-smi's figures are what the
stand-in was told).

On a GPU, issue 41 adds:
  GPM:        per phase, the daemon's GPM tracks (SM active, SM occupancy, tensor activity, DRAM
              bandwidth, NVLink rx/tx) and PCIe tracks beside `nvidia-smi dmon --gpm-metrics` and
              `nvidia-smi dmon -s t` over the same seconds (shares within 5 points, throughputs
              within 10 %);
  shared GPU: two processes on GPU 0 at once, one GPU-bound and one light: the daemon's
              per-process tracks (`gpu.0.pid.P.sm_util`) beside `nvidia-smi pmon`, the heavy one
              first, and the findings of that phase.
The parsing of nvidia-smi's tables, of the folded launches and of the names is checked on canned
outputs by `gpu_check_test.py` (`cargo test -p xtask gpu_check`).
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


def workload_light(seconds):
    """A light user of the GPU beside a heavy one (the shared-GPU phase): a 4096² product, then
    50 ms asleep: a few percent of an H100's SMs."""
    import torch

    a = torch.randn(4096, 4096, device="cuda")
    end = time.time() + seconds
    while time.time() < end:
        b = a @ a
        torch.cuda.synchronize()
        time.sleep(0.05)
    del b


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


# ---- parsing (pure: `gpu_check_test.py` runs these on canned outputs) ----

def parse_folded(text):
    """`profiler flamegraph --format folded`: [(stack, count)]."""
    out = []
    for line in text.splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            out.append((stack, int(n)))
    return out


def names_share(counts, torch_kernels):
    """The launches named by their kernel (a `[gpu] NAME` leaf, not `[gpu] kernel in LIB` nor
    `[gpu] kernel 0x...` nor `[gpu] graph`) and how many of those agree with torch.profiler's
    kernels, compared without return types, template arguments and parameters."""
    total = sum(n for _, n in counts)
    named = {}
    for stack, n in counts:
        leaf = stack.rsplit(";", 1)[-1]
        if leaf.startswith("[gpu] ") and not leaf.startswith(("[gpu] kernel in ", "[gpu] kernel 0x")) \
                and leaf != "[gpu] graph":
            named[leaf[6:]] = named.get(leaf[6:], 0) + n
    named_total = sum(named.values())
    bases = {kernel_base(k) for k in torch_kernels}
    agreeing = sum(n for k, n in named.items() if kernel_base(k) in bases)
    named_share = named_total / max(total, 1)
    agree_share = agreeing / max(named_total, 1)
    return {"total": total, "named_share": named_share, "agree_share": agree_share,
            "ok": total > 0 and named_share >= 0.9 and agree_share >= 0.9,
            "top": sorted(named.items(), key=lambda kv: (-kv[1], kv[0]))[:3], "torch": sorted(bases)}


def parse_smi_table(lines):
    """nvidia-smi dmon's and pmon's tables: the first `#` line names the columns, later `#`
    lines (units, repeated headers) are skipped; a `-` is no value. [dict]"""
    names, rows = None, []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            if names is None:
                names = line.lstrip("#").split()
            continue
        if names is None:
            continue
        cells = line.split()
        if len(cells) < len(names):
            continue
        # pmon's last column (the command) may hold spaces: keep the rest together.
        cells = cells[:len(names) - 1] + [" ".join(cells[len(names) - 1:])]
        rows.append({k: number(v) for k, v in zip(names, cells)})
    return rows


def number(v):
    if v == "-":
        return None
    try:
        return float(v)
    except ValueError:
        return v


# GPM metrics asked of `nvidia-smi dmon --gpm-metrics` (nvml.h's ids, the same as the daemon's
# tracks) and the daemon's track for each; dmon prints them in this order after its `gpu` column.
GPM = [(2, "sm_active"), (3, "sm_occupancy"), (5, "tensor_active"), (10, "dram_bw_util"),
       (60, "nvlink_rx_mbps"), (61, "nvlink_tx_mbps")]
# dmon -s t: PCIe throughput in MB/s.
PCIE = [("rxpci", "pcie_rx_mbps"), ("txpci", "pcie_tx_mbps")]
MIB_IN_MB = 1.048576


def dmon_means(stamped, t0, t1, gpu=0):
    """The mean of each daemon track's counterpart over dmon rows stamped in [t0, t1): GPM columns by
    position (the last len(GPM) columns: dmon's names for them vary between drivers), PCIe by
    name; NVLink from MiB/s to MB/s, the daemon's unit. {track: (mean, rows)}"""
    sums = {}
    for t, row in stamped:
        if not (t0 <= t < t1) or row.get("gpu") != gpu:
            continue
        keys = list(row.keys())
        values = {}
        if len(keys) > len(GPM) and not any(k in row for k, _ in PCIE):
            for (metric, track), key in zip(GPM, keys[-len(GPM):]):
                values[track] = row[key]
        for key, track in PCIE:
            if key in row:
                values[track] = row[key]
        for track, v in values.items():
            if isinstance(v, float):
                if track.startswith("nvlink"):
                    v *= MIB_IN_MB
                s = sums.setdefault(track, [0.0, 0])
                s[0] += v
                s[1] += 1
    return {k: (v[0] / v[1], v[1]) for k, v in sums.items()}


def gpm_verdict(daemon, smi):
    """The daemon's track means beside dmon's: shares within 5 points, throughputs within 10 % or
    5 MB/s: NVML's PCIe counter covers 20 ms of each second it is read, so two readers at other
    instants of a light, bursty link differ by that much (an H200: 11.3 and 8.3 MB/s). (ok, lines)"""
    lines, ok = [], True
    for track in [t for _, t in GPM] + [t for _, t in PCIE]:
        d, s = daemon.get(track), smi.get(track)
        if d is None or s is None:
            lines.append(f"  {track:<16} daemon {fmt(d and d[0], '')} dmon {fmt(s and s[0], '')}: not compared")
            continue
        diff = abs(d[0] - s[0])
        within = diff <= 5 if not track.endswith("mbps") else diff <= max(0.1 * s[0], 5.0)
        ok = ok and within
        lines.append(f"  {track:<16} daemon {d[0]:.1f} ({d[1]} points)  dmon {s[0]:.1f} ({s[1]} rows)  "
                     f"diff {diff:.1f}: {within}")
    return ok, lines


def pmon_means(stamped, t0, t1, gpu=0):
    """Per pid, the mean of pmon's `sm` % over rows stamped in [t0, t1). {pid: (mean, rows)}"""
    sums = {}
    for t, row in stamped:
        if t0 <= t < t1 and row.get("gpu") == gpu and isinstance(row.get("pid"), float):
            sm = row.get("sm")
            s = sums.setdefault(int(row["pid"]), [0.0, 0])
            s[0] += sm if isinstance(sm, float) else 0.0
            s[1] += 1
    return {p: (v[0] / v[1], v[1]) for p, v in sums.items()}


def track_means(counters, prefix):
    """`profiler counters --format json`'s tracks under `prefix`: {name minus prefix: (mean, points)}."""
    out = {}
    for t in counters.get("tracks", []):
        if t["name"].startswith(prefix) and t["points"]:
            v = [p[1] for p in t["points"]]
            out[t["name"][len(prefix):]] = (sum(v) / len(v), len(v))
    return out


def shared_verdict(tracks, pmon, heavy, light):
    """Two processes on one GPU: both have a per-process track, the heavy one's mean above the light
    one's, each within 10 points of pmon's where pmon saw it. (ok, lines)"""
    lines = []
    got = {pid: tracks.get(f"pid.{pid}.sm_util") for pid in (heavy, light)}
    ok = all(v is not None for v in got.values())
    ok = ok and got[heavy][0] > got[light][0]
    for pid, name in ((heavy, "heavy"), (light, "light")):
        d, p = got[pid], pmon.get(pid)
        near = d is not None and p is not None and abs(d[0] - p[0]) <= 10
        if p is not None:
            ok = ok and near
        lines.append(f"  {name} pid {pid}: daemon gpu.0.pid.{pid}.sm_util {fmt(d and d[0])} "
                     f"({d[1] if d else 0} points)  pmon sm {fmt(p and p[0])} ({p[1] if p else 0} rows)")
    return ok, lines


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


class SmiTable:
    """An `nvidia-smi dmon` or `pmon` running beside the check: its rows, each stamped on arrival
    (they carry no time of their own). A driver without the option says so on stderr, kept."""

    def __init__(self, cmd):
        self.cmd = cmd
        self.rows = []
        self.header = None
        try:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        except OSError as e:
            self.proc, self.error = None, str(e)
            return
        self.error = ""
        threading.Thread(target=self.read, daemon=True).start()

    def read(self):
        for line in self.proc.stdout:
            if line.lstrip().startswith("#"):
                self.header = self.header or line
                continue
            if self.header:
                self.rows.extend((time.time(), r) for r in parse_smi_table([self.header, line]))

    def close(self):
        if self.proc:
            self.proc.terminate()
            try:
                self.error = self.proc.communicate(timeout=5)[1].strip()
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def said(self):
        """What to print when it gave no rows."""
        return f"`{' '.join(self.cmd)}` gave {len(self.rows)} rows{': ' + self.error if self.error else ''}"


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
        elif kind == "light":
            workload_light(a.seconds)
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
    # The CUDA probes' attach and detach times in the log (each detach waits on the kernel).
    env = dict(os.environ, RUST_LOG="info,profiler::collect::cuda=debug")
    daemon = subprocess.Popen([a.profiler, "run", "--data-dir", data, "--nvml-library", lib,
                               "--listen", f"127.0.0.1:{port}"], stderr=log, stdout=subprocess.DEVNULL, env=env)
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
    # GPM and PCIe as nvidia-smi reads them, for the daemon's tracks (a GPU only).
    dmons = [] if a.standin else [
        SmiTable(["nvidia-smi", "dmon", "-i", "0", "-d", "1", "--gpm-metrics", ",".join(str(m) for m, _ in GPM)]),
        SmiTable(["nvidia-smi", "dmon", "-i", "0", "-d", "1", "-s", "t"]),
    ]
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
    for d in dmons:
        d.close()
    report = []
    for r in results:
        t0, t1 = r["start"], r["end"]
        c = json.loads(profiler(["counters", "--from", iso(t0), "--to", iso(t1), "--name", "gpu.*.util",
                                 "--format", "json"], prof, data))
        stamped = [p for t in c["tracks"] if t["name"] == "gpu.0.util" for p in t["points"]]
        pts = [p[1] for p in stamped]
        r["daemon_util"] = sum(pts) / len(pts) if pts else None
        r["daemon_points"] = len(pts)
        r["util_gap_ms"] = median_gap_ms(stamped)
        r["smi_util"] = smi.mean(t0, t1)
        r["smi_samples"] = len([1 for t, _ in smi.samples if t0 <= t < t1])
        f = json.loads(profiler(["findings", "--from", iso(r["job_start"]), "--to", iso(t1 + 4), "--format", "json"], prof, data))
        r["findings"] = [{"kind": x["kind"], "summary": x["summary"]} for x in f
                         if r["job_start"] * 1e9 <= x["start_ns"] < t1 * 1e9]
        d, s = r["daemon_util"], r["smi_util"]
        diff = abs(d - s) if d is not None and s is not None else None
        r["diff"] = diff
        kinds = sorted({x["kind"] for x in r["findings"]})
        report.append(f"{r['phase']:<12} daemon GPU util {fmt(d)} ({r['daemon_points']} points, median gap "
                      f"{fmt(r['util_gap_ms'], ' ms')})  nvidia-smi {fmt(s)} "
                      f"({r['smi_samples']} samples)  diff {fmt(diff, '')}  findings: {', '.join(kinds) or 'none'}")
        for x in r["findings"]:
            report.append(f"             {x['kind']}: {x['summary']}")
        report.extend(stack_reach(prof, data, t0, t1))
        if dmons:
            ok_gpm, lines = guarded("the GPM comparison", lambda: check_gpm(prof, data, dmons, t0, t1))
            r["gpm_ok"] = ok_gpm
            report.append(f"             GPM and PCIe tracks against nvidia-smi dmon: {ok_gpm}")
            report.extend("           " + l for l in lines)
    # Issue 41: utilisation from NVML's own samples (nvmlDeviceGetSamples), read once a second:
    # how the daemon says it reads them, and whether the track kept its sub-second points.
    how = (json.loads(profiler(["status", "--format", "json"], prof, data)).get("gpus") or {}).get("utilisation")
    gaps = [r["util_gap_ms"] for r in results if r["util_gap_ms"] is not None]
    sub_second = bool(gaps) and max(gaps) < 1000
    report.append(f"utilisation from {how}; sub-second points (median gap < 1000 ms in each phase) {sub_second}")
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
    report.append(f"verdict: util within 5 points {ok}; gpu-starved in input-bound {starved}; no GPU finding in gpu-bound {gpu_quiet}; "
                  f"sub-second utilisation {sub_second}")
    cuda_ok = shared_ok = True
    gpm_ok = all(r.get("gpm_ok", True) for r in results)
    if not a.standin:
        shared_ok, lines = guarded("the shared-GPU phase", lambda: check_shared(a, prof, data))
        report.extend(lines)
        cuda_ok, lines = check_cuda(a, prof, data)
        report.extend(lines)
        report.append(f"verdict (issue 41): GPM and PCIe tracks agree with dmon {gpm_ok}; shared GPU {shared_ok}; "
                      f"CUDA counts and names {cuda_ok}")
    text = "\n".join(report)
    print(text, flush=True)
    open(os.path.join(a.out, "report.txt"), "w").write(text + "\n")
    json.dump({"phases": results, "daemon_cpu_s": cpu, "wall_s": wall, "vm_hwm_mib": hwm, "gpus": json.loads(profiler(["status", "--format", "json"], prof, data)).get("gpus")},
              open(os.path.join(a.out, "summary.json"), "w"), indent=1)
    return 0 if all(ok) and starved and gpu_quiet and sub_second and cuda_ok and shared_ok and gpm_ok else 1


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


def guarded(what, f):
    """One part of the check failing (a driver's nvidia-smi without an option, a window without
    data) is a failed verdict with its reason, not the end of a run on a node lent for minutes."""
    try:
        return f()
    except Exception as e:  # noqa: BLE001 (reported, and the verdict fails)
        return False, [f"  {what} failed: {type(e).__name__}: {e}"]


def check_gpm(prof, data, dmons, t0, t1):
    """The daemon's GPM and PCIe tracks of GPU 0 over [t0, t1) beside nvidia-smi dmon's rows."""
    c = json.loads(profiler(["counters", "--from", iso(t0), "--to", iso(t1), "--name", "gpu.0.*", "--format", "json"],
                            prof, data))
    daemon = track_means(c, "gpu.0.")
    smi = {}
    for d in dmons:
        smi.update(dmon_means(d.rows, t0, t1))
    ok, lines = gpm_verdict(daemon, smi)
    if "sm_active" not in daemon:
        lines.append("  no GPM tracks: " + json.dumps(json.loads(profiler(["status", "--format", "json"], prof, data))
                                                      .get("gpus", {}).get("unsupported")))
    for d in dmons:
        if not any(t0 <= t < t1 for t, _ in d.rows):
            lines.append("  " + d.said())
    return ok and "sm_active" in daemon, lines


def check_shared(a, prof, data):
    """Two processes on GPU 0 at once, a GPU-bound one and a light one: their per-process tracks
    beside nvidia-smi pmon's, and the findings of the phase."""
    pmon = SmiTable(["nvidia-smi", "pmon", "-i", "0", "-s", "u", "-d", "1"])
    job = lambda kind: subprocess.Popen([sys.executable, os.path.abspath(__file__), "--seconds", str(a.seconds),
                                         "--workload", kind])
    t0 = time.time()
    heavy, light = job("gpu"), job("light")
    time.sleep(8)  # CUDA's start in both
    t_in = time.time()
    heavy.wait()
    light.wait()
    t1 = time.time()
    time.sleep(4)  # the detectors' grace
    pmon.close()
    c = json.loads(profiler(["counters", "--from", iso(t_in), "--to", iso(t1), "--name", "gpu.0.*", "--format", "json"],
                            prof, data))
    tracks = track_means(c, "gpu.0.")
    ok, lines = shared_verdict(tracks, pmon_means(pmon.rows, t_in, t1), heavy.pid, light.pid)
    f = json.loads(profiler(["findings", "--from", iso(t0), "--to", iso(t1 + 4), "--format", "json"], prof, data))
    found = [x for x in f if t0 * 1e9 <= x["start_ns"] < t1 * 1e9]
    head = [f"shared GPU ({t1 - t_in:.0f} s measured, a GPU-bound and a light process on GPU 0): {ok}; "
            f"GPU util {fmt(tracks.get('util', (None,))[0])}"]
    if not pmon.rows:
        head.append("  " + pmon.said())
    return ok, head + lines + [f"  finding {x['kind']}: {x['summary']}" for x in found]


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
    counts = parse_folded(folded)
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
    names = names_share(counts, r.get("torch_kernels", []))
    names_ok = names["ok"]
    lines.append(f"cuda kernel names: {names['named_share'] * 100:.1f} % of launches named (goal >= 90 %), "
                 f"{names['agree_share'] * 100:.1f} % of those agreeing with torch.profiler's kernels: {names_ok}; "
                 f"top {names['top']}; torch.profiler's {names['torch'][:5]}")
    within = within and names_ok
    status = json.loads(profiler(["status", "--format", "json"], prof, data)).get("cuda") or {}
    lines.append(f"cuda probes: {json.dumps(status.get('libraries'))}")
    return within, lines


def median_gap_ms(points):
    """The median gap between a track's points ([unix ms, value] pairs), ms; None under three."""
    gaps = sorted(b[0] - a[0] for a, b in zip(points, points[1:]))
    return gaps[len(gaps) // 2] if len(gaps) >= 2 else None


def fmt(v, unit=" %"):
    return "n/a" if v is None else f"{v:.1f}{unit}"


if __name__ == "__main__":
    sys.exit(main())
