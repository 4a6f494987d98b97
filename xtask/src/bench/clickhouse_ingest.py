"""Where an 18.16 server's CPU goes on the shipper's inserts into `samples` (issue 39 part 5).

`python3 xtask/src/bench/clickhouse_ingest.py DIR` (a scratch directory, emptied): starts Debian's
/usr/sbin/clickhouse-server on DIR, makes 2 M synthetic rows of one 16-CPU node (99 Hz, 30 comms,
a pod's JSON identity as `workload`), dumps them as four `Native` blocks of 500,000 rows, then for
each set of views on `samples` (CONFIGS) inserts them gzipped over HTTP as the shipper does and
runs `OPTIMIZE TABLE ... FINAL` on every table; prints the server's utime + stime
(`/proc/PID/stat`) for the inserts and the merges. Env: ROWS (2000000), SORT (the rows' order in
the inserts: "ts, cpu" or "cpu, ts"), ONLY (config names, `|`-separated). The views' SQL mirrors
profiler-user/src/ship/clickhouse/schema.rs at the time of writing.
"""
import os, subprocess, sys, time, urllib.request, urllib.parse, gzip, shutil, json

from ingest_rows import source_table

D = sys.argv[1]
HTTP, TCP = 18123, 19000 + os.getpid() % 1000  # loopback only (config below)
ROWS = int(os.environ.get("ROWS", "2000000"))
BATCH = 500_000
SORT = os.environ.get("SORT", "ts, cpu")

def start():
    shutil.rmtree(D, ignore_errors=True)
    os.makedirs(D + "/data")
    open(D + "/config.xml", "w").write(f"""<yandex><logger><level>warning</level><log>{D}/server.log</log><errorlog>{D}/server.err</errorlog></logger>
<http_port>{HTTP}</http_port><tcp_port>{TCP}</tcp_port><listen_host>127.0.0.1</listen_host>
<path>{D}/data/</path><tmp_path>{D}/tmp/</tmp_path><users_config>users.xml</users_config>
<default_profile>default</default_profile><default_database>default</default_database>
<mark_cache_size>5368709</mark_cache_size><uncompressed_cache_size>0</uncompressed_cache_size></yandex>""")
    open(D + "/users.xml", "w").write("""<yandex><profiles><default></default></profiles><quotas><default></default></quotas>
<users><default><password></password><networks><ip>127.0.0.1</ip></networks><profile>default</profile><quota>default</quota></default></users></yandex>""")
    p = subprocess.Popen(["/usr/sbin/clickhouse-server", f"--config-file={D}/config.xml"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            if q("SELECT 1").strip() == b"1":
                return p
        except Exception:
            time.sleep(0.1)
    raise SystemExit("server did not start")

def q(sql, body=None, gz=False):
    url = f"http://127.0.0.1:{HTTP}/"
    if body is None:
        req = urllib.request.Request(url, data=sql.encode())
    else:
        req = urllib.request.Request(url + "?" + urllib.parse.urlencode({"query": sql}), data=gzip.compress(body, 1) if gz else body)
        if gz:
            req.add_header("Content-Encoding", "gzip")
    try:
        return urllib.request.urlopen(req, timeout=600).read()
    except urllib.error.HTTPError as e:
        raise SystemExit(f"{sql[:200]}: {e.read()[:500]}")

def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

def workload_class(w):
    fields = [f"if(visitParamExtractRaw({w}, '{f}') IN ('', 'null'), '', concat('\"{f}\":', visitParamExtractRaw({w}, '{f}')))" for f in ["pod_namespace", "container_name", "unit"]]
    s = f"arrayStringConcat(arrayFilter(x -> x != '', [{', '.join(fields)}]), ',')"
    return f"if({s} = '', '', concat('{{', {s}, '}}'))"

SAMPLES = "CREATE TABLE p.samples (node String, ts UInt64, cpu UInt16, pid UInt32, tid UInt32, comm String, stack_id UInt64, workload String, count UInt32) ENGINE = MergeTree PARTITION BY intDiv(ts, 86400000000000) ORDER BY (node, cpu, ts)"
M1 = ["CREATE TABLE p.samples_1m (node String, ts UInt64, comm String, stack_id UInt64, workload String, count UInt64) ENGINE = SummingMergeTree(count) PARTITION BY intDiv(ts, 86400000000000) ORDER BY (node, ts, comm, stack_id, workload)",
      "CREATE MATERIALIZED VIEW p.samples_1m_mv TO p.samples_1m AS SELECT node, intDiv(s.ts, 60000000000) * 60000000000 AS ts, comm, stack_id, workload, sum(s.count) AS count FROM p.samples AS s GROUP BY node, ts, comm, stack_id, workload"]
H1 = ["CREATE TABLE p.samples_1h (ts UInt64, comm String, stack_id UInt64, workload String, count UInt64) ENGINE = SummingMergeTree(count) PARTITION BY intDiv(ts, 86400000000000 * 30) ORDER BY (ts, comm, stack_id, workload)",
      f"CREATE MATERIALIZED VIEW p.samples_1h_mv TO p.samples_1h AS SELECT intDiv(s.ts, 3600000000000) * 3600000000000 AS ts, comm, stack_id, {workload_class('s.workload')} AS workload, sum(s.count) AS count FROM p.samples AS s GROUP BY ts, comm, stack_id, workload"]
# samples_1h fed by samples_1m's inserts instead (the class once per minute row, not per sample).
H1_FROM_1M = [H1[0], f"CREATE MATERIALIZED VIEW p.samples_1h_mv TO p.samples_1h AS SELECT intDiv(s.ts, 3600000000000) * 3600000000000 AS ts, comm, stack_id, {workload_class('s.workload')} AS workload, sum(s.count) AS count FROM p.samples_1m AS s GROUP BY ts, comm, stack_id, workload"]
FLEET1M = ["CREATE TABLE p.samples_fleet_1m (ts UInt64, comm String, stack_id UInt64, workload String, count UInt64) ENGINE = SummingMergeTree(count) PARTITION BY intDiv(ts, 86400000000000) ORDER BY (ts, comm, stack_id, workload)",
      f"CREATE MATERIALIZED VIEW p.samples_fleet_1m_mv TO p.samples_fleet_1m AS SELECT intDiv(s.ts, 60000000000) * 60000000000 AS ts, comm, stack_id, {workload_class('s.workload')} AS workload, sum(s.count) AS count FROM p.samples AS s GROUP BY ts, comm, stack_id, workload"]

def fleet(name, unit_ns, partition="86400000000000"):
    """A fleet-wide rollup by class read from `samples` (schema.rs's `samples_fleet_*`, `samples_1d`)."""
    return [f"CREATE TABLE p.{name} (ts UInt64, comm String, stack_id UInt64, workload String, count UInt64) ENGINE = SummingMergeTree(count) PARTITION BY intDiv(ts, {partition}) ORDER BY (ts, comm, stack_id, workload)",
            f"CREATE MATERIALIZED VIEW p.{name}_mv TO p.{name} AS SELECT intDiv(s.ts, {unit_ns}) * {unit_ns} AS ts, comm, stack_id, {workload_class('s.workload')} AS workload, sum(s.count) AS count FROM p.samples AS s GROUP BY ts, comm, stack_id, workload"]

FLEET10M = fleet("samples_fleet_10m", 600000000000)
D1 = fleet("samples_1d", 86400000000000, "86400000000000 * 30")
# The fleet's seconds (issue 39, the edges of a fleet-wide window), and 10 seconds tried beside them.
FLEET1S = fleet("samples_fleet_1s", 1000000000)
FLEET10S = fleet("samples_fleet_10s", 10000000000)
EVERY = M1 + H1 + FLEET1M + FLEET10M + D1
# Which nodes ran a stack, by hour (schema.rs's `stack_nodes_1h`).
NODES1H = ["CREATE TABLE p.stack_nodes_1h (ts UInt64, stack_id UInt64, comm String, node String, count UInt64) ENGINE = SummingMergeTree(count) PARTITION BY intDiv(ts, 86400000000000 * 30) ORDER BY (ts, stack_id, comm, node)",
           "CREATE MATERIALIZED VIEW p.stack_nodes_1h_mv TO p.stack_nodes_1h AS SELECT intDiv(s.ts, 3600000000000) * 3600000000000 AS ts, stack_id, comm, node, sum(s.count) AS count FROM p.samples AS s GROUP BY ts, stack_id, comm, node"]

M1_HASHED = [M1[0], "CREATE MATERIALIZED VIEW p.samples_1m_mv TO p.samples_1m AS SELECT any(s.node) AS node, intDiv(s.ts, 60000000000) * 60000000000 AS ts, any(s.comm) AS comm, s.stack_id AS stack_id, any(s.workload) AS workload, sum(s.count) AS count FROM p.samples AS s GROUP BY ts, s.stack_id, cityHash64(s.node), cityHash64(s.comm), cityHash64(s.workload)"]
CONFIGS = {
    "samples only": [],
    "+ samples_1m": M1,
    "+ samples_1h": H1,
    "+ 1m + 1h (today)": M1 + H1,
    "+ 1m + 1h + fleet_1m": M1 + H1 + FLEET1M,
    "+ 1m + 1h from 1m": M1 + H1_FROM_1M,
    "+ 1m hashed": M1_HASHED,
    "+ 1m hashed + 1h from 1m": M1_HASHED + H1_FROM_1M,
    "every view (d9944cf)": EVERY,
    "every view + fleet_1s": EVERY + FLEET1S,
    "every view + 1s + 10s": EVERY + FLEET1S + FLEET10S,
    "every view + 1s + stack_nodes_1h": EVERY + FLEET1S + NODES1H,
}
ROLLUPS = ["samples_1m", "samples_1h", "samples_fleet_1m", "samples_fleet_10m", "samples_1d", "samples_fleet_1s", "samples_fleet_10s", "stack_nodes_1h"]

def main():
    p = start()
    try:
        q("CREATE DATABASE src")
        q(source_table("src.s", ROWS))
        batches = []
        for b in range(ROWS // BATCH):
            batches.append(q(f"SELECT node, ts, cpu, pid, tid, comm, stack_id, workload, count FROM src.s WHERE n >= {b * BATCH} AND n < {(b + 1) * BATCH} ORDER BY {SORT} FORMAT Native"))
        print(f"18.16: {ROWS} rows in {len(batches)} inserts of {BATCH}, {sum(map(len, batches)) / ROWS:.1f} B/row Native; server CPU s (utime+stime):")
        print(f"{'config':<24} {'inserts':>8} {'merges':>8} {'total':>8} {'M rows/s/core':>14}")
        for name, stmts in CONFIGS.items():
            if os.environ.get("ONLY") and name not in os.environ["ONLY"].split("|"):
                continue
            q("DROP DATABASE IF EXISTS p")
            q("CREATE DATABASE p")
            for s in [SAMPLES] + stmts:
                q(s)
            time.sleep(0.5)
            c0 = cpu(p.pid)
            for b in batches:
                q("INSERT INTO p.samples FORMAT Native", b, gz=True)
            c1 = cpu(p.pid)
            for t in ["samples"] + ROLLUPS:
                if t == "samples" or any(f"p.{t} " in s for s in stmts):
                    q(f"OPTIMIZE TABLE p.{t} FINAL")
            c2 = cpu(p.pid)
            extra = {t: q(f"SELECT sum(count), count() FROM p.{t}").strip().decode() for t in ROLLUPS if any(f"p.{t} " in s for s in stmts)}
            print(extra)
            print(f"{name:<24} {c1 - c0:>8.2f} {c2 - c1:>8.2f} {c2 - c0:>8.2f} {ROWS / (c2 - c0) / 1e6:>14.2f}")
            sys.stdout.flush()
    finally:
        p.terminate()
        p.wait()

main()
