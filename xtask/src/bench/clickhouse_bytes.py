"""Bytes per sample of ClickHouse's `samples` table under several layouts (issue 39, part 3).

Run by `cargo xtask bench clickhouse-bytes` (or directly: `python3 clickhouse_bytes.py
[--minutes M] [--sets steady,compile] [--layouts a,b]`). Needs the PyPI package chdb (an
embedded current ClickHouse, what the tests use for one): `pip install chdb pandas`.

Two synthetic nodes, generated here with a fixed seed:
- steady: 16 CPUs at 99 Hz, half busy in runs (a CPU keeps a thread ~0.5 s), 40 long-lived
  processes of 30 comms in 4 workloads, 2,000 distinct stacks with Zipf-like popularity split
  among the processes;
- compile: 16 CPUs at 99 Hz, ~61 % busy (~58,000 samples a minute), short-lived processes
  (0.05-8 s, new pids; a CPU idle ~4 s between jobs) of 16 comms, ~45 % of the samples a stack never seen before and the rest
  drawn from the stacks seen lately (~30,000 distinct stacks a minute, as measured on a machine
  busy compiling).
A busy CPU's sample times lie on its own 99 Hz grid (`cpu-clock` hrtimers) plus a latency of
1.5 us on average with a tail (3 % of ticks 15 us more): `perf record -e cpu-clock -F 99 -a` on
the 2-vCPU build VM gave ticks off the grid by 1.3 us (median), 4 us (p90), 18 us (p99). The samples are inserted as the shipper does, one insert per 5 s, into a table with
`min_bytes_for_wide_part = 0` (per-column sizes for small parts), merges stopped; then measured
again after `OPTIMIZE TABLE ... FINAL`. Figures: compressed bytes of each column
(`system.parts_columns`) and the parts' bytes on disk (`system.parts`: marks, index and
checksums included), divided by the samples; "CPU s": the engine's CPU time (this process's,
chdb runs in it) for the 120 inserts (each an `INSERT ... SELECT` of its 5 s), then for the merge.
"""

import argparse
import random
import sys
import tempfile
import time

import pandas as pd
from chdb.session import Session

HZ = 99
PERIOD = 1_000_000_000 // HZ
START = 1_795_392_000_000_000_000  # a UTC midnight: one day partition
CPUS = 16
BATCH_NS = 5_000_000_000
COLUMNS = ["node", "ts", "cpu", "pid", "tid", "comm", "stack_id", "workload", "count"]


def latency(rng):
    """How late a tick's sample is, ns."""
    late = rng.expovariate(1 / 1500)
    if rng.random() < 0.03:
        late += rng.expovariate(1 / 15000)
    return int(late)


def zipf_weights(n, s=1.1):
    return [1.0 / (k + 1) ** s for k in range(n)]


def steady(minutes, rng):
    """A node with a steady workload: the same processes and stacks all along."""
    comms = [f"comm-{i:02}" for i in range(30)]
    workloads = ["kubepods/burstable/pod-a/trainer", "kubepods/besteffort/pod-b/exporter", "system.slice/kubelet.service", "system.slice/containerd.service"]
    procs = []
    for p in range(40):
        pid = 1000 + p * 37
        threads = [pid] + [pid + 1 + t for t in range(rng.randint(0, 7))]
        procs.append((pid, threads, comms[p % len(comms)], workloads[p % len(workloads)]))
    # 2,000 stacks, each owned by one process; popularity Zipf-like over all of them.
    stack_ids = [rng.getrandbits(64) for _ in range(2000)]
    owner = [min(int(rng.paretovariate(1.0)) - 1, 39) for _ in stack_ids]
    weights = zipf_weights(len(stack_ids))
    pools = {p: ([], []) for p in range(40)}
    for sid, o, w in zip(stack_ids, owner, weights):
        pools[o][0].append(sid)
        pools[o][1].append(w)
    live = [p for p in range(40) if pools[p][0]]
    proc_weight = [sum(pools[p][1]) for p in live]
    rows = []
    for cpu in range(CPUS):
        phase = rng.randrange(PERIOD)
        busy, thread, stack = False, None, None
        for k in range(minutes * 60 * HZ):
            if busy and rng.random() < 0.02:
                busy = False
            elif not busy and rng.random() < 0.02:
                busy, thread = True, None
            if not busy:
                continue
            if thread is None or rng.random() < 0.05:
                p = rng.choices(live, proc_weight)[0]
                thread = (p, rng.choice(procs[p][1]))
                stack = None
            p, tid = thread
            if stack is None or rng.random() > 0.2:
                stack = rng.choices(pools[p][0], pools[p][1])[0]
            ts = START + k * PERIOD + phase + latency(rng)
            pid, _, comm, workload = procs[p]
            rows.append((ts, cpu, pid, tid, comm, stack, workload))
    return rows


def compile_heavy(minutes, rng):
    """A node busy compiling: short-lived processes, most stacks new."""
    comms = ["cc1plus", "cc1", "rustc", "ld.lld", "as", "sh", "make", "cargo", "clang", "python3", "git", "build-script-bu", "ninja", "collect2", "ar", "sed"]
    comm_weight = [30, 10, 30, 5, 4, 3, 2, 2, 6, 2, 1, 2, 1, 1, 1, 1]
    workloads = ["user.slice/user-1000.slice/session-3.scope", "system.slice/buildkite-agent.service"]
    # What every process runs through (the allocator, memcpy, page faults, syscalls).
    hot = [rng.getrandbits(64) for _ in range(3000)]
    hot_weight = zipf_weights(len(hot))
    next_pid = [20_000]

    def spawn():
        pid = next_pid[0]
        next_pid[0] += rng.randint(1, 6)
        comm = rng.choices(comms, comm_weight)[0]
        life = int(HZ * rng.uniform(0.05, 8.0)) + 1
        return {"pid": pid, "comm": comm, "workload": rng.choice(workloads), "life": life, "mine": []}

    rows = []
    state = [None] * CPUS
    phases = [rng.randrange(PERIOD) for _ in range(CPUS)]
    for k in range(minutes * 60 * HZ):
        for cpu in range(CPUS):
            proc = state[cpu]
            if proc is None:
                # Idle until the build starts another job here (~4 s on average).
                if rng.random() > 0.0025:
                    continue
                proc = state[cpu] = spawn()
            proc["life"] -= 1
            if proc["life"] <= 0:
                state[cpu] = None if rng.random() < 0.6 else spawn()
            r, mine = rng.random(), proc["mine"]
            if r < 0.48 or (r < 0.8 and not mine):
                stack = rng.getrandbits(64)
                mine.append(stack)
            elif r < 0.8:
                # One of the process's own, the newest likelier.
                stack = mine[-min(int(rng.paretovariate(0.8)), len(mine))]
            else:
                stack = rng.choices(hot, hot_weight)[0]
            ts = START + k * PERIOD + phases[cpu] + latency(rng)
            rows.append((ts, cpu, proc["pid"], proc["pid"], proc["comm"], stack, proc["workload"]))
    return rows


def frame(rows):
    df = pd.DataFrame(rows, columns=["ts", "cpu", "pid", "tid", "comm", "stack_id", "workload"])
    df["node"] = "node-0001"
    df["count"] = 1
    df["batch"] = (df["ts"] - START) // BATCH_NS
    df = df.astype({"ts": "uint64", "cpu": "uint16", "pid": "uint32", "tid": "uint32", "stack_id": "uint64", "count": "uint32", "batch": "uint32"})
    return df.sort_values(["ts", "cpu"]).reset_index(drop=True)


PLAIN = {"node": "String", "ts": "UInt64", "cpu": "UInt16", "pid": "UInt32", "tid": "UInt32", "comm": "String", "stack_id": "UInt64", "workload": "String", "count": "UInt32"}
# schema.rs SAMPLES_CODECS before issue 39 part 3 (servers from 20.1 on).
CODECS = {
    "node": "LowCardinality(String)",
    "ts": "UInt64 CODEC(DoubleDelta, ZSTD(1))",
    "cpu": "UInt16 CODEC(ZSTD(1))",
    "pid": "UInt32 CODEC(T64, ZSTD(1))",
    "tid": "UInt32 CODEC(T64, ZSTD(1))",
    "comm": "LowCardinality(String)",
    "stack_id": "UInt64 CODEC(ZSTD(1))",
    "workload": "LowCardinality(String)",
    "count": "UInt32 CODEC(T64, ZSTD(1))",
}
# schema.rs SAMPLES_CODECS (servers 20.1-24.x): per CPU in time order a CPU's ticks are ~10.1 ms apart
# (deltas of a few bytes) and it runs one thread for a while (pid, tid, comm, workload in runs).
NEW = {
    "node": "LowCardinality(String)",
    "ts": "UInt64 CODEC(Delta, ZSTD(1))",
    "cpu": "UInt16 CODEC(ZSTD(1))",
    "pid": "UInt32 CODEC(Delta, ZSTD(1))",
    "tid": "UInt32 CODEC(Delta, ZSTD(1))",
    "comm": "LowCardinality(String) CODEC(ZSTD(1))",
    "stack_id": "UInt64 CODEC(ZSTD(1))",
    "workload": "LowCardinality(String) CODEC(ZSTD(1))",
    "count": "UInt32 CODEC(T64, ZSTD(1))",
}
# schema.rs on servers from 25.1 on (STACK_DICTIONARY): the stack id through a part's dictionary.
DICT = dict(NEW, stack_id="LowCardinality(UInt64) CODEC(ZSTD(6))")
TS_ORDER = "(node, ts, cpu)"
CPU_ORDER = "(node, cpu, ts)"
MINUTE = "intDiv(ts, 60000000000)"


def with_(base, **over):
    d = dict(base)
    d.update(over)
    return d


# name: (columns, ORDER BY). The first five are the schema's, before and after.
LAYOUTS = {
    "18.16-before": (PLAIN, TS_ORDER),
    "18.16-now": (PLAIN, CPU_ORDER),
    "codecs-before": (CODECS, TS_ORDER),
    "codecs-20.1": (NEW, CPU_ORDER),
    "dict-25.1": (DICT, CPU_ORDER),
    # Tried against them:
    "before-codecs-cpu-order": (CODECS, CPU_ORDER),
    "now-minute-first": (NEW, f"(node, {MINUTE}, cpu, ts)"),
    "now-ts-doubledelta": (with_(NEW, ts="UInt64 CODEC(DoubleDelta, ZSTD(1))"), CPU_ORDER),
    "now-ts-delta-t64": (with_(NEW, ts="UInt64 CODEC(Delta, T64, ZSTD(1))"), CPU_ORDER),
    "now-zstd3": (with_(NEW, **{c: t.replace("ZSTD(1)", "ZSTD(3)") for c, t in NEW.items()}), CPU_ORDER),
    "now-stack-lowcard": (with_(NEW, stack_id="LowCardinality(UInt64) CODEC(ZSTD(1))"), CPU_ORDER),
    "dict-zstd1": (with_(NEW, stack_id="LowCardinality(UInt64) CODEC(ZSTD(1))"), CPU_ORDER),
    "dict-zstd3": (with_(NEW, stack_id="LowCardinality(UInt64) CODEC(ZSTD(3))"), CPU_ORDER),
    "dict-zstd15": (with_(NEW, stack_id="LowCardinality(UInt64) CODEC(ZSTD(15))"), CPU_ORDER),
    "now-stack-zstd9": (with_(NEW, stack_id="UInt64 CODEC(ZSTD(9))"), CPU_ORDER),
    "now-ts-zstd22": (with_(NEW, ts="UInt64 CODEC(Delta, ZSTD(22))"), CPU_ORDER),
    "now-minute-stack-cpu": (with_(NEW, stack_id="UInt64 CODEC(Delta, ZSTD(1))"), f"(node, {MINUTE}, stack_id, cpu, ts)"),
    "now-by-stack": (with_(NEW, stack_id="UInt64 CODEC(Delta, ZSTD(1))"), f"(node, {MINUTE}, comm, stack_id, ts)"),
}


def measure(s, table, rows):
    parts = s.query(
        f"SELECT count(), sum(rows), sum(bytes_on_disk) FROM system.parts WHERE database = 'b' AND table = '{table}' AND active",
        "TSV",
    )
    nparts, prow, disk = (int(x) for x in str(parts).split())
    assert prow == rows, (table, prow, rows)
    cols = s.query(
        f"SELECT column, sum(column_data_compressed_bytes) FROM system.parts_columns WHERE database = 'b' AND table = '{table}' AND active GROUP BY column",
        "TSV",
    )
    per = {c: int(b) / rows for c, b in (line.split("\t") for line in str(cols).strip().splitlines())}
    return nparts, disk / rows, sum(per.values()), per


def run(s, name, df, layout):
    columns, order = LAYOUTS[layout]
    table = f"{name}_{layout}".replace("-", "_").replace(".", "_")
    cols = ", ".join(f"{c} {columns[c]}" for c in COLUMNS)
    s.query(f"DROP TABLE IF EXISTS b.{table}")
    s.query(
        f"CREATE TABLE b.{table} ({cols}) ENGINE = MergeTree PARTITION BY intDiv(ts, 86400000000000) ORDER BY {order} "
        "SETTINGS min_bytes_for_wide_part = 0, allow_suspicious_low_cardinality_types = 1"
    )
    s.query(f"SYSTEM STOP MERGES b.{table}")
    t = time.process_time()
    for batch in range(int(df["batch"].max()) + 1):
        s.query(f"INSERT INTO b.{table} SELECT {', '.join(COLUMNS)} FROM b.src_{name} WHERE batch = {batch}")
    out = {"inserted": measure(s, table, len(df)) + (time.process_time() - t,)}
    s.query(f"SYSTEM START MERGES b.{table}")
    t = time.process_time()
    s.query(f"OPTIMIZE TABLE b.{table} FINAL")
    out["merged"] = measure(s, table, len(df)) + (time.process_time() - t,)
    s.query(f"DROP TABLE b.{table}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=int, default=10)
    ap.add_argument("--sets", default="steady,compile")
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    args = ap.parse_args()
    s = Session(tempfile.mkdtemp(prefix="chbytes-"))
    print("server:", str(s.query("SELECT version()", "TSV")).strip())
    s.query("CREATE DATABASE IF NOT EXISTS b")
    for name in args.sets.split(","):
        gen = {"steady": steady, "compile": compile_heavy}[name]
        df = frame(gen(args.minutes, random.Random(39)))
        minute = df[df["ts"] < START + 60_000_000_000]
        print(
            f"\n{name}: {len(df)} samples in {args.minutes} min, {df['stack_id'].nunique()} distinct stacks "
            f"(first minute: {len(minute)} samples, {minute['stack_id'].nunique()} stacks), "
            f"{df['pid'].nunique()} pids, {df['comm'].nunique()} comms, {df['batch'].nunique()} inserts"
        )
        s.query(f"DROP TABLE IF EXISTS b.src_{name}")
        s.query(f"CREATE TABLE b.src_{name} ENGINE = MergeTree ORDER BY batch AS SELECT * FROM Python(df)")
        print(f"{'layout':<20} {'state':<9} {'parts':>5} {'disk B/sample':>13} {'cols B':>7} {'CPU s':>6}  per column (B/sample)")
        for layout in args.layouts.split(","):
            for state, (nparts, disk, colsum, per, cpu) in run(s, name, df, layout).items():
                detail = " ".join(f"{c}={per[c]:.2f}" for c in COLUMNS)
                print(f"{layout:<20} {state:<9} {nparts:>5} {disk:>13.2f} {colsum:>7.2f} {cpu:>6.2f}  {detail}")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
