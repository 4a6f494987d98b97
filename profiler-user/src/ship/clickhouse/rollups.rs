//! The rollups of `samples` (docs/clickhouse.md): each a table and the materialized view of
//! `samples` that fills it, with its retention and its sharding key; `schema` creates them.
//! Per node by minute; fleet-wide by workload class (no node) by second, minute, 10 minutes,
//! hour and day; per stack and node by hour (which nodes ran a stack).

use super::schema::{
    SAMPLES_1D, SAMPLES_1H, SAMPLES_1M, SAMPLES_FLEET_1M, SAMPLES_FLEET_1S, SAMPLES_FLEET_10M, STACK_NODES_1H, col::*,
};

/// How long the rollup tables keep rows, seconds (`[clickhouse] rollup_1m_days`,
/// `rollup_1h_days`); `samples` and the other tables keep the node's `max_age`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RollupKeep {
    pub minutes_secs: u64,
    pub hours_secs: u64,
}

impl RollupKeep {
    /// 30 days of minutes, a year of hours.
    pub const DEFAULT: Self = Self { minutes_secs: 30 * 86_400, hours_secs: 365 * 86_400 };
}

/// A rollup of `samples`: its table (as in [`TABLES`]), the view's `SELECT` over `{source}`
/// (the `samples` table the server receives inserts into) and its `Distributed` sharding key.
pub(super) struct Rollup {
    pub name: &'static str,
    pub columns: &'static [(&'static str, &'static str)],
    pub engine: &'static str,
    pub select: &'static str,
    pub shard_by: &'static str,
}

/// The columns of a fleet-wide rollup (no node; `workload` the class).
const FLEET_COLUMNS: &[(&str, &str)] =
    &[(TS, "UInt64"), (COMM, "String"), (STACK_ID, "UInt64"), (WORKLOAD, "String"), (COUNT, "UInt64")];

// `ts` and `count` name the rollup's columns (a view writes into its table by name) and the
// source's: the source's are qualified (`s.ts`) so that no analyzer, old or new, reads them as
// the aliases, and `GROUP BY ts` names the alias (both read it so; grouping by the expression
// instead is refused by 18.16, which substitutes the alias into it). A subquery renaming the
// source, the other way out, fails on 18.16: its views run the outer `SELECT` on the inserted
// block, so the inner names are unknown, and the insert errs after the samples landed.
pub(super) const ROLLUPS: &[Rollup] = &[
    Rollup {
        name: SAMPLES_1M,
        columns: &[
            (NODE, "String"),
            (TS, "UInt64"),
            (COMM, "String"),
            (STACK_ID, "UInt64"),
            (WORKLOAD, "String"),
            (COUNT, "UInt64"),
        ],
        engine: "SummingMergeTree(count) PARTITION BY intDiv(ts, 86400000000000) \
                 ORDER BY (node, ts, comm, stack_id, workload){ttl}",
        select: "SELECT node, intDiv(s.ts, 60000000000) * 60000000000 AS ts, comm, stack_id, workload, \
                 sum(s.count) AS count FROM {source} AS s GROUP BY node, ts, comm, stack_id, workload",
        shard_by: "cityHash64(node)",
    },
    Rollup {
        name: SAMPLES_1H,
        columns: FLEET_COLUMNS,
        engine: "SummingMergeTree(count) PARTITION BY intDiv(ts, 86400000000000 * 30) \
                 ORDER BY (ts, comm, stack_id, workload){ttl}",
        // The workload's class, not its identity ([`workload_class`]): fleet-wide, an hour
        // holds a stack once per (namespace, container name, unit), not once per pod.
        select: "SELECT intDiv(s.ts, 3600000000000) * 3600000000000 AS ts, comm, stack_id, \
                 {workload_class} AS workload, sum(s.count) AS count FROM {source} AS s \
                 GROUP BY ts, comm, stack_id, workload",
        // Every shard has rows of every hour: any shard will do (reads sum).
        shard_by: "rand()",
    },
    // A fleet's minute and 10 minutes by class: what a fleet-wide read of a window that is not
    // whole hours takes, instead of `samples_1m`'s rows per node and pod (4.5 M rows for an
    // hour of 100 nodes; BENCHMARKS.md, the fleet at scale).
    Rollup {
        name: SAMPLES_FLEET_1M,
        columns: FLEET_COLUMNS,
        engine: "SummingMergeTree(count) PARTITION BY intDiv(ts, 86400000000000) \
                 ORDER BY (ts, comm, stack_id, workload){ttl}",
        select: "SELECT intDiv(s.ts, 60000000000) * 60000000000 AS ts, comm, stack_id, \
                 {workload_class} AS workload, sum(s.count) AS count FROM {source} AS s \
                 GROUP BY ts, comm, stack_id, workload",
        shard_by: "rand()",
    },
    // Each view reads `samples` itself: 18.16 does not run the views of a view's target table
    // (a view of the fleet minutes' inserts stayed empty there), so each computes the class.
    Rollup {
        name: SAMPLES_FLEET_10M,
        columns: FLEET_COLUMNS,
        engine: "SummingMergeTree(count) PARTITION BY intDiv(ts, 86400000000000) \
                 ORDER BY (ts, comm, stack_id, workload){ttl}",
        select: "SELECT intDiv(s.ts, 600000000000) * 600000000000 AS ts, comm, stack_id, \
                 {workload_class} AS workload, sum(s.count) AS count FROM {source} AS s \
                 GROUP BY ts, comm, stack_id, workload",
        shard_by: "rand()",
    },
    // Days: 30 days of a fleet are ~30 rows per stack and class, not 720 (39 M rows for 100
    // nodes' month of hours).
    Rollup {
        name: SAMPLES_1D,
        columns: FLEET_COLUMNS,
        engine: "SummingMergeTree(count) PARTITION BY intDiv(ts, 86400000000000 * 30) \
                 ORDER BY (ts, comm, stack_id, workload){ttl}",
        select: "SELECT intDiv(s.ts, 86400000000000) * 86400000000000 AS ts, comm, stack_id, \
                 {workload_class} AS workload, sum(s.count) AS count FROM {source} AS s \
                 GROUP BY ts, comm, stack_id, workload",
        shard_by: "rand()",
    },
    // Seconds, kept as the raw rows: a fleet-wide window's edges that are not whole minutes
    // are read from here instead of the raw rows (a fleet's second is ~30 times fewer rows:
    // per distinct stack and class, not per node, CPU and thread), raw rows only for the parts
    // of a second. Last in the list: the statements before it keep their places.
    Rollup {
        name: SAMPLES_FLEET_1S,
        columns: FLEET_COLUMNS,
        engine: "SummingMergeTree(count) PARTITION BY intDiv(ts, 86400000000000) \
                 ORDER BY (ts, comm, stack_id, workload){ttl}",
        select: "SELECT intDiv(s.ts, 1000000000) * 1000000000 AS ts, comm, stack_id, \
                 {workload_class} AS workload, sum(s.count) AS count FROM {source} AS s \
                 GROUP BY ts, comm, stack_id, workload",
        shard_by: "rand()",
    },
    // Which nodes ran a stack, by hour: sorted by hour then stack, so the nodes of a few stacks
    // over a day are a few granules an hour (counting them from `samples_1m`, sorted by node,
    // read every row of the day: 128 M for 1,000 nodes, ~2 s a shard). No workload: what it
    // answers is nodes. Last in the list, as the seconds were.
    Rollup {
        name: STACK_NODES_1H,
        columns: &[(TS, "UInt64"), (STACK_ID, "UInt64"), (COMM, "String"), (NODE, "String"), (COUNT, "UInt64")],
        engine: "SummingMergeTree(count) PARTITION BY intDiv(ts, 86400000000000 * 30) \
                 ORDER BY (ts, stack_id, comm, node){ttl}",
        select: "SELECT intDiv(s.ts, 3600000000000) * 3600000000000 AS ts, stack_id, comm, node, \
                 sum(s.count) AS count FROM {source} AS s GROUP BY ts, stack_id, comm, node",
        shard_by: "cityHash64(node)",
    },
];

/// The fields of a workload identity (stored JSON, `identity::Identity`) the hourly rollup
/// keeps: what a workload is across a fleet (the same job's pods on every node share them).
/// The pod's name and uid and the container id are each node's own: kept, an hour of a
/// thousand nodes would hold a training stack a thousand times.
pub const WORKLOAD_CLASS_FIELDS: [&str; 3] = ["pod_namespace", "container_name", "unit"];

/// SQL of the class of the stored workload identity `w` (an expression over a `String`): the
/// JSON object of [`WORKLOAD_CLASS_FIELDS`] that are set, each value as stored (still escaped:
/// `visitParamExtractRaw`), in that order; `''` for a workload of none (or not JSON). 18.16
/// functions only.
pub fn workload_class(w: &str) -> String {
    let field = |f: &str| {
        format!(
            "if(visitParamExtractRaw({w}, '{f}') IN ('', 'null'), '', concat('\"{f}\":', visitParamExtractRaw({w}, '{f}')))"
        )
    };
    let fields: Vec<String> = WORKLOAD_CLASS_FIELDS.iter().map(|f| field(f)).collect();
    let set = format!("arrayStringConcat(arrayFilter(x -> x != '', [{}]), ',')", fields.join(", "));
    format!("if({set} = '', '', concat('{{', {set}, '}}'))")
}

/// The name of a rollup's materialized view.
pub fn view_name(rollup: &str) -> String {
    format!("{rollup}_mv")
}
