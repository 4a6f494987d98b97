"""What each rollup view on `samples` costs a current engine (issue 39, part 5: ingest).

`cargo test -q -p integration-tests --test clickhouse_views views_ingest_benchmark -- --ignored
--nocapture` writes the schema a current server gets (`schema::statements_with`: codecs, the
stack dictionary) to a file and runs `python3 clickhouse_views.py SCHEMA`. Needs the PyPI
package chdb (an embedded current ClickHouse; `cargo xtask setup` installs it for the tests).

The rows are those of `clickhouse_ingest.py` (the 18.16 measurement): 2 M synthetic samples of
one 16-CPU node (99 Hz, 30 comms, a pod's JSON identity as `workload`, ~5,000 stacks), inserted
as four inserts of 500,000 (`INSERT ... SELECT` from a table made first, sorted as the shipper
sends them), then `OPTIMIZE TABLE ... FINAL` of every table. Figure: the engine's CPU (this
process's: chdb runs in it) for the inserts and the merges, less the CPU of reading the same rows
into a `Null` table (the least of three), per configuration:
- `samples` alone, then `samples` with each rollup view alone, then with all of them (today);
- a cascade: one view of `samples` into per-(node, second, comm, stack, workload) rows of a
  `Null` table, every rollup's view reading those instead (current servers run the views of a
  view's target; 18.16 does not). Env: ROWS (2000000), ROUNDS (1).
"""
import os, re, resource, sys, tempfile
from chdb.session import Session

from ingest_rows import source_table

ROWS = int(os.environ.get("ROWS", "2000000"))
BATCH = 500_000
COLS = "node, ts, cpu, pid, tid, comm, stack_id, workload, count"


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    stmts = [l.strip() for l in open(sys.argv[1]) if l.strip()]
    s = Session(tempfile.mkdtemp(prefix="views"))
    q = lambda sql: s.query(sql, "TSV").bytes().decode().strip()
    q("CREATE DATABASE src")
    q(source_table("src.s", ROWS))
    tables = [st for st in stmts if st.startswith("CREATE TABLE")]
    views = [st for st in stmts if st.startswith("CREATE MATERIALIZED VIEW") and "FROM `p`.`samples` AS s" in st]
    samples = next(t for t in tables if "`p`.`samples` (" in t)
    name = lambda st: re.search(r"`p`\.`(\w+)`", st.split(" TO ")[-1] if " TO " in st else st).group(1)
    target = {name(v): next(t for t in tables if f"`p`.`{name(v)}` (" in t) for v in views}
    second = ("CREATE TABLE `p`.`samples_node_1s` (node LowCardinality(String), ts UInt64, comm LowCardinality(String), "
              "stack_id UInt64, workload String, count UInt64) ENGINE = Null")
    second_mv = ("CREATE MATERIALIZED VIEW `p`.`samples_node_1s_mv` TO `p`.`samples_node_1s` AS SELECT node, "
                 "intDiv(s.ts, 1000000000) * 1000000000 AS ts, comm, stack_id, workload, sum(s.count) AS count "
                 "FROM `p`.`samples` AS s GROUP BY node, ts, comm, stack_id, workload")
    configs = {"samples alone": [samples]}
    for v in views:
        configs[f"+ {name(v)} alone"] = [samples, target[name(v)], v]
    configs[f"+ all {len(views)} (today)"] = [samples, *target.values(), *views]
    configs["cascade through seconds"] = [samples, *target.values(), second, second_mv,
                                          *(v.replace("FROM `p`.`samples` AS s", "FROM `p`.`samples_node_1s` AS s") for v in views)]
    q("CREATE TABLE src.sink AS src.s ENGINE = Null")

    def insert_all(table):
        t0 = cpu()
        for b in range(ROWS // BATCH):
            q(f"INSERT INTO {table} ({COLS}) SELECT {COLS} FROM src.s WHERE n >= {b * BATCH} AND n < {(b + 1) * BATCH} ORDER BY cpu, ts")
        return cpu() - t0

    read = min(insert_all("src.sink") for _ in range(3))
    rows_1s = q("SELECT count() FROM (SELECT 1 FROM src.s GROUP BY node, intDiv(ts, 1000000000), comm, stack_id, workload)")
    print(f"chdb {q('SELECT version()')}: {ROWS} samples in {ROWS // BATCH} inserts, {rows_1s} rows of (node, second, comm, stack, "
          f"workload); reading them alone {read:.2f} s of CPU (subtracted)")
    print("| configuration | inserts | merges | µs per sample | M samples/s per core |\n|---|---|---|---|---|")
    for _ in range(int(os.environ.get("ROUNDS", "1"))):
        for label, sts in configs.items():
            q("DROP DATABASE IF EXISTS p SYNC")
            q("CREATE DATABASE p")
            for st in sts:
                q(st)
            ins = insert_all("p.samples") - read
            t0 = cpu()
            for st in sts:
                if st.startswith("CREATE TABLE") and "ENGINE = Null" not in st:
                    q(f"OPTIMIZE TABLE p.{name(st)} FINAL")
            merge = cpu() - t0
            for t in target:
                if any(f"`p`.`{t}` (" in st for st in sts):
                    got = int(q(f"SELECT sum(count) FROM p.{t}"))
                    assert got == ROWS, f"{label}: {t} holds {got} samples of {ROWS}"
            total = ins + merge
            print(f"| {label} | {ins:.2f} s | {merge:.2f} s | {total / ROWS * 1e6:.2f} | {ROWS / total / 1e6:.2f} |", flush=True)


main()
