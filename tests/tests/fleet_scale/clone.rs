//! More nodes than the machine can write and ship in a session: the nodes that were shipped
//! (through the real shipper, where ingest is measured) are copied on their own shard under new
//! names by the servers themselves (`INSERT ... SELECT`), so the reads are timed over the whole
//! fleet's rows. A copy is a node of the same job with its own name and its own pod, container
//! and pod uid ids (its workload's class, namespace and container name, is the job's, as on a
//! real fleet); it goes through the same materialized views as a shipped batch, so the rollups
//! hold it too. Stacks are shared by the fleet and not copied.

use std::time::Instant;

use integration_tests::clickhouse::ClickHouse;

/// The per-node tables a copy is made in (each shard's `_local` table).
const TABLES: &[&str] = &["samples", "cpu_seconds", "counters", "cuda_samples", "findings", "events", "nodes"];

/// Shipped nodes' minutes copied per statement (10 nodes of one minute, one node of ten): each
/// statement stays well inside the harness's 30 s request timeout on a loaded 18.16, where 2 M
/// rows through every view take ~25 s of a server's CPU.
const NODE_MINUTES_PER_STATEMENT: u64 = 10;

/// Copies nodes `gpu-0000 .. gpu-{shipped-1}` into `gpu-{shipped} .. gpu-{total-1}`: node `i`
/// of copy round `k` becomes `i + k * shipped`, on the same shard as its source (`shipped` is
/// even, so the parity that placed a node on its shard is kept). Returns what it did, in words.
pub fn copies(shards: &[ClickHouse], shipped: u64, total: u64, secs: u64) -> String {
    assert!(shipped.is_multiple_of(2) && shipped > 0, "FLEET_SHIPPED must be even and positive");
    let rounds = total.div_ceil(shipped);
    let per_statement = (NODE_MINUTES_PER_STATEMENT * 60 / secs.max(1)).max(1);
    let t = Instant::now();
    // The shards copy at the same time, each its own nodes.
    let rows: u64 = std::thread::scope(|scope| {
        let each: Vec<_> =
            shards.iter().map(|s| scope.spawn(move || copy_on(s, shipped, total, rounds, per_statement))).collect();
        each.into_iter().map(|h| h.join().unwrap()).sum()
    });
    format!(
        "{shipped} shipped nodes copied by the servers into {} more ({} rounds): {rows} sample rows in {:.0} s",
        total - shipped,
        rounds - 1,
        t.elapsed().as_secs_f64()
    )
}

/// One shard's copies; the sample rows it added.
fn copy_on(s: &ClickHouse, shipped: u64, total: u64, rounds: u64, per_statement: u64) -> u64 {
    let mut rows = 0u64;
    {
        for table in TABLES {
            let local = format!("{table}_local");
            let columns: Vec<String> = s
                .query(&format!(
                    "SELECT name FROM system.columns WHERE database = 'profiler' AND table = '{local}' FORMAT TSV"
                ))
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect();
            if columns.is_empty() {
                continue;
            }
            for k in 1..rounds {
                let shift = k * shipped;
                // gpu-0005 -> gpu-0105: the number shifted, written back with four digits.
                let node = format!(
                    "concat('gpu-', substring(toString(toUInt32(substring(src_node, 5)) + {shift} + 10000), 2))"
                );
                let expr: Vec<String> = columns
                    .iter()
                    .map(|c| match c.as_str() {
                        "node" => format!("{node} AS node"),
                        // The node's own ids: pod name, pod uid, container id.
                        "workload" => format!(
                            "replaceAll(replaceAll(replaceAll(src_workload, '-worker-', '-worker-c{k}-'), \
                             '\"pod_uid\":\"', '\"pod_uid\":\"c{k}'), '\"container_id\":\"', '\"container_id\":\"c{k}') \
                             AS workload"
                        ),
                        c => c.to_string(),
                    })
                    .collect();
                for first in (0..shipped).step_by(per_statement as usize) {
                    let last = (first + per_statement).min(shipped).min(total.saturating_sub(shift));
                    if first >= last {
                        continue;
                    }
                    let names: Vec<String> = (first..last).map(|i| format!("'gpu-{i:04}'")).collect();
                    // The source rows' node and workload renamed in a subquery: a `SELECT`
                    // alias named like a column would be what `WHERE` reads.
                    let workload =
                        if columns.iter().any(|c| c == "workload") { ", workload AS src_workload" } else { "" };
                    let sql = format!(
                        "INSERT INTO profiler.{local} ({}) SELECT {} FROM (SELECT *, node AS src_node{workload} \
                         FROM profiler.{local} WHERE node IN ({}))",
                        columns.join(", "),
                        expr.join(", "),
                        names.join(", ")
                    );
                    let before = s.number(&format!("SELECT count() FROM profiler.{local}"));
                    s.query(&sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
                    if *table == "samples" {
                        rows += s.number(&format!("SELECT count() FROM profiler.{local}")) - before;
                    }
                }
            }
        }
    }
    rows
}
