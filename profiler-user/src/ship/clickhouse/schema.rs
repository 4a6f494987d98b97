//! The ClickHouse schema (docs/clickhouse.md), created by the shipper if missing.
//!
//! Written for ClickHouse 18.16, what Debian ships: no `LowCardinality` (experimental there),
//! no `DateTime64` (20.1), no column codecs (19.1), no `TTL` (19.6). Time is `UInt64` ns since
//! the epoch, partitions are UTC days computed from it (independent of the server's time
//! zone), and a server that knows `TTL` gets one matching the node's retention.

use col::*;

/// Nanoseconds in a day: the partition key is `intDiv(ts, DAY_NS)`.
pub const DAY_NS: u64 = 86_400 * 1_000_000_000;

/// The first server version with table `TTL` expressions.
const TTL_SINCE: (u32, u32) = (19, 6);
/// A version with every codec `SAMPLES_CODECS` names (`DoubleDelta` and `T64` came in 19.x) and
/// `LowCardinality` out of experiment.
const CODECS_SINCE: (u32, u32) = (20, 1);

/// `samples` on servers that have codecs: timestamps as deltas of deltas (a sample every ~10 ms
/// per CPU costs a byte or two instead of six), ids and names through a dictionary or zstd. 18
/// bytes per sample became 11 on a compile-heavy node's minute (30,000 distinct stacks in 58,000
/// samples; chdb 25.x, `min_bytes_for_wide_part = 0`); the stack id is most of what is left.
const SAMPLES_CODECS: &[(&str, &str)] = &[
    (NODE, "LowCardinality(String)"),
    (TS, "UInt64 CODEC(DoubleDelta, ZSTD(1))"),
    (CPU, "UInt16 CODEC(ZSTD(1))"),
    (PID, "UInt32 CODEC(T64, ZSTD(1))"),
    (TID, "UInt32 CODEC(T64, ZSTD(1))"),
    (COMM, "LowCardinality(String)"),
    (STACK_ID, "UInt64 CODEC(ZSTD(1))"),
    (WORKLOAD, "LowCardinality(String)"),
    (COUNT, "UInt32 CODEC(T64, ZSTD(1))"),
];

/// What the statements depend on.
#[derive(Debug, Clone)]
pub struct Layout<'a> {
    pub database: &'a str,
    /// A cluster name: tables become `<name>_local`, with a `Distributed` table of the plain
    /// name over the cluster's shards. Created on the server the node ships to, not `ON
    /// CLUSTER` (distributed DDL needs ZooKeeper): each shard gets its tables from its nodes.
    pub cluster: Option<&'a str>,
    /// Seconds rows are kept, when the server supports `TTL`.
    pub ttl_secs: Option<u64>,
    /// The server has column codecs ([`supports_codecs`]): `samples` uses them.
    pub codecs: bool,
}

/// The server version `SELECT version()` returned, as (major, minor).
pub fn parse_version(v: &str) -> Option<(u32, u32)> {
    let mut it = v.trim().split('.');
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

pub fn supports_ttl(version: (u32, u32)) -> bool {
    version >= TTL_SINCE
}

pub fn supports_codecs(version: (u32, u32)) -> bool {
    version >= CODECS_SINCE
}

/// (table, columns, engine and keys; `{ttl}` where a TTL on column `ts` goes).
/// Names of the tables, as the shipper inserts into them and the fleet reads them.
pub const SAMPLES: &str = "samples";
pub const STACKS: &str = "stacks";
pub const STACK_LOCATIONS: &str = "stack_locations";
pub const FINDINGS: &str = "findings";
pub const EVENTS: &str = "events";
pub const CPU_SECONDS: &str = "cpu_seconds";
pub const COUNTERS: &str = "counters";
pub const CUDA_SAMPLES: &str = "cuda_samples";
pub const NODES: &str = "nodes";

/// Column names: what the shipper inserts and the fleet reads spell their SQL with these. A name
/// two tables share is one constant (`kernel`: a stack's kernel-frame flags, a CPU's kernel
/// samples).
pub mod col {
    pub const NODE: &str = "node";
    pub const TS: &str = "ts";
    pub const CPU: &str = "cpu";
    pub const PID: &str = "pid";
    pub const TID: &str = "tid";
    pub const COMM: &str = "comm";
    pub const STACK_ID: &str = "stack_id";
    pub const WORKLOAD: &str = "workload";
    pub const COUNT: &str = "count";
    pub const FRAMES: &str = "frames";
    pub const KERNEL: &str = "kernel";
    pub const FILES: &str = "files";
    pub const ADDRS: &str = "addrs";
    pub const ID: &str = "id";
    pub const KIND: &str = "kind";
    pub const END_TS: &str = "end_ts";
    pub const SEVERITY: &str = "severity";
    pub const SUMMARY: &str = "summary";
    pub const EVIDENCE: &str = "evidence";
    pub const VERSION: &str = "version";
    pub const PATTERN: &str = "pattern";
    pub const MESSAGE: &str = "message";
    pub const SPAN: &str = "span";
    pub const BUSY: &str = "busy";
    pub const IDLE: &str = "idle";
    pub const LOST: &str = "lost";
    pub const HZ: &str = "hz";
    pub const NAME: &str = "name";
    pub const UNIT: &str = "unit";
    pub const VALUE: &str = "value";
    pub const CPUS: &str = "cpus";
    pub const ONLINE: &str = "online";
    pub const HOST: &str = "host";
}

/// A table: its name, its columns and their types, its engine and keys (`{ttl}` where a TTL on
/// column `ts` goes).
type Table = (&'static str, &'static [(&'static str, &'static str)], &'static str);

const TABLES: &[Table] = &[
    (
        SAMPLES,
        &[
            (NODE, "String"),
            (TS, "UInt64"),
            (CPU, "UInt16"),
            (PID, "UInt32"),
            (TID, "UInt32"),
            (COMM, "String"),
            (STACK_ID, "UInt64"),
            (WORKLOAD, "String"),
            (COUNT, "UInt32"),
        ],
        "MergeTree PARTITION BY intDiv(ts, 86400000000000) ORDER BY (node, ts, cpu){ttl}",
    ),
    (
        // Shared by every node: the same binaries give the same stacks fleet-wide. Re-inserting a
        // stack is harmless, merges collapse the copies.
        STACKS,
        &[(STACK_ID, "UInt64"), (FRAMES, "Array(String)"), (KERNEL, "Array(UInt8)")],
        "ReplacingMergeTree ORDER BY stack_id",
    ),
    (
        // Where a stack's user frames live (`model::Location`), for the stacks that know it: a
        // table of its own, so that servers with `stacks` from before it need no ALTER.
        STACK_LOCATIONS,
        &[(STACK_ID, "UInt64"), (FILES, "Array(String)"), (ADDRS, "Array(UInt64)")],
        "ReplacingMergeTree ORDER BY stack_id",
    ),
    (
        // A finding is written when it opens and again when it closes: the highest version
        // (ns of the write) wins.
        FINDINGS,
        &[
            (NODE, "String"),
            (ID, "String"),
            (KIND, "String"),
            (TS, "UInt64"),
            (END_TS, "UInt64"),
            (CPU, "Int32"),
            (SEVERITY, "String"),
            (SUMMARY, "String"),
            (EVIDENCE, "String"),
            (VERSION, "UInt64"),
        ],
        "ReplacingMergeTree(version) PARTITION BY intDiv(ts, 86400000000000) ORDER BY (node, ts, id){ttl}",
    ),
    (
        EVENTS,
        &[(NODE, "String"), (TS, "UInt64"), (ID, "String"), (PATTERN, "String"), (MESSAGE, "String")],
        "ReplacingMergeTree PARTITION BY intDiv(ts, 86400000000000) ORDER BY (node, ts, id){ttl}",
    ),
    (
        // Per CPU per stored block (a second, ten in rolled-up data): what samples alone do not
        // say. Idle ticks and lost samples give busy shares; `hz` the ticks a CPU had. Sent again
        // with a retried batch, the copies collapse (read with `max`, as `fleet` does).
        CPU_SECONDS,
        &[
            (NODE, "String"),
            (TS, "UInt64"),
            (SPAN, "UInt64"),
            (CPU, "UInt16"),
            (BUSY, "UInt32"),
            (KERNEL, "UInt32"),
            (IDLE, "UInt32"),
            (LOST, "UInt32"),
            (HZ, "UInt32"),
        ],
        "ReplacingMergeTree PARTITION BY intDiv(ts, 86400000000000) ORDER BY (node, ts, cpu){ttl}",
    ),
    (
        // The counter tracks (kernel counters, GPU tracks) as `profiler counters` prints them:
        // one row per track and tick; `cpu` -1 for a track of no one CPU. Re-sent rows collapse.
        COUNTERS,
        &[(NODE, "String"), (TS, "UInt64"), (NAME, "String"), (CPU, "Int32"), (UNIT, "String"), (VALUE, "Float64")],
        "ReplacingMergeTree PARTITION BY intDiv(ts, 86400000000000) ORDER BY (node, name, cpu, ts){ttl}",
    ),
    (
        // The CUDA stores' rows (`model::SampleKind`): `kind` is `cuda-launches` (value:
        // launches), `cuda-sync` (microseconds blocked) or `cuda-copies` (bytes), one row per
        // kind, second, thread and stack, so a row sent again collapses in merges (read with
        // `max(value)` per key, as `fleet` does). Stacks are in `stacks` with the samples'.
        CUDA_SAMPLES,
        &[
            (NODE, "String"),
            (TS, "UInt64"),
            (KIND, "String"),
            (CPU, "UInt16"),
            (PID, "UInt32"),
            (TID, "UInt32"),
            (COMM, "String"),
            (STACK_ID, "UInt64"),
            (WORKLOAD, "String"),
            (VALUE, "UInt64"),
        ],
        "ReplacingMergeTree PARTITION BY intDiv(ts, 86400000000000) ORDER BY (node, kind, ts, tid, stack_id){ttl}",
    ),
    (
        // How each node records: one row per daemon start or change, the latest wins.
        NODES,
        &[
            (NODE, "String"),
            (CPUS, "UInt32"),
            (HZ, "UInt32"),
            (ONLINE, "String"),
            (HOST, "String"),
            (VERSION, "UInt64"),
        ],
        "ReplacingMergeTree(version) ORDER BY node",
    ),
];

/// Every statement, in order, each safe to run again.
pub fn statements(l: &Layout<'_>) -> Vec<String> {
    let db = quote_ident(l.database);
    let ttl = l
        .ttl_secs
        .map(|s| format!(" TTL toDateTime(intDiv(ts, 1000000000)) + toIntervalSecond({s})"))
        .unwrap_or_default();
    let mut out = vec![format!("CREATE DATABASE IF NOT EXISTS {db}")];
    for (name, columns, engine) in TABLES {
        let engine = engine.replace("{ttl}", &ttl);
        let columns = if l.codecs && *name == SAMPLES { SAMPLES_CODECS } else { columns };
        let columns = columns.iter().map(|(c, t)| format!("{c} {t}")).collect::<Vec<_>>().join(", ");
        let local = if l.cluster.is_some() { format!("{name}_local") } else { name.to_string() };
        out.push(format!("CREATE TABLE IF NOT EXISTS {db}.{} ({columns}) ENGINE = {engine}", quote_ident(&local)));
        if let Some(cluster) = l.cluster {
            // Rows of a node stay on one shard, so a node's window is read from one place.
            out.push(format!(
                "CREATE TABLE IF NOT EXISTS {db}.{} AS {db}.{} ENGINE = Distributed({}, {db}, {}, {})",
                quote_ident(name),
                quote_ident(&local),
                quote_ident(cluster),
                quote_ident(&local),
                if matches!(*name, STACKS | STACK_LOCATIONS) { "stack_id" } else { "cityHash64(node)" },
            ));
        }
    }
    out
}

/// An identifier in back quotes (names come from the config file).
pub fn quote_ident(s: &str) -> String {
    format!("`{}`", s.replace('\\', "\\\\").replace('`', "\\`"))
}

/// A string literal.
pub fn quote_str(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_ttl() {
        assert_eq!(parse_version("18.16.1"), Some((18, 16)));
        assert_eq!(parse_version("25.8.2.1\n"), Some((25, 8)));
        assert!(!supports_ttl((18, 16)));
        assert!(supports_ttl((19, 6)));
        assert!(supports_ttl((25, 1)));
        assert!(!supports_codecs((19, 16)) && supports_codecs((25, 8)));
    }

    #[test]
    fn plain_layout_has_no_distributed_and_quotes_names() {
        let s = statements(&Layout { database: "pro`f", cluster: None, ttl_secs: None, codecs: false });
        assert_eq!(s.len(), 1 + TABLES.len());
        assert!(s.iter().all(|q| !q.contains("Distributed") && !q.contains("TTL")));
        assert_eq!(s[0], "CREATE DATABASE IF NOT EXISTS `pro\\`f`");
    }

    #[test]
    fn cluster_layout_adds_local_tables_and_ttl_where_asked() {
        let s = statements(&Layout { database: "p", cluster: Some("c"), ttl_secs: Some(60), codecs: true });
        assert_eq!(s.len(), 1 + 2 * TABLES.len());
        assert!(s[1].contains("`samples_local` (") && s[1].contains("toIntervalSecond(60)"));
        assert!(s[2].contains("Distributed(`c`, `p`, `samples_local`, cityHash64(node))"));
        assert!(!s[3].contains("TTL"), "stacks are kept: {}", s[3]);
        assert!(s[1].contains("CODEC(DoubleDelta") && !s[3].contains("CODEC"), "codecs on samples only");
    }
}
