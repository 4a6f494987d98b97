//! The ClickHouse schema (docs/clickhouse.md), created by the shipper if missing.
//!
//! Written for ClickHouse 18.16, what Debian ships: no `LowCardinality` (experimental there),
//! no `DateTime64` (20.1), no column codecs (19.1), no `TTL` (19.6). Time is `UInt64` ns since
//! the epoch, partitions are UTC days computed from it (independent of the server's time
//! zone), and a server that knows `TTL` gets one matching the node's retention.
//!
//! The rollups (`samples_1m`, `samples_1h`) are made by ClickHouse itself: materialized views
//! of the inserts into `samples` sum each inserted block into `SummingMergeTree` tables, whose
//! merges sum further; nothing of ours runs on a schedule. A view sees the inserts made after
//! its creation only: a database from before the views has rollups from the daemon start that
//! created them on. Their definitions are in `rollups`.

use col::*;

pub use super::rollups::{RollupKeep, WORKLOAD_CLASS_FIELDS, view_name, workload_class};
use super::{rollups::ROLLUPS, views};

/// Nanoseconds in a day: the partition key is `intDiv(ts, DAY_NS)`.
pub const DAY_NS: u64 = 86_400 * 1_000_000_000;

/// The first server version with table `TTL` expressions.
const TTL_SINCE: (u32, u32) = (19, 6);
/// A version with every codec `SAMPLES_CODECS` names (`DoubleDelta` and `T64` came in 19.x) and
/// `LowCardinality` out of experiment.
const CODECS_SINCE: (u32, u32) = (20, 1);

/// The first version that takes query settings in `CREATE TABLE ... SETTINGS` (25.1): the
/// statement itself then allows `LowCardinality(UInt64)` ([`STACK_DICTIONARY`]), which servers
/// refuse unless `allow_suspicious_low_cardinality_types` is set.
const STACK_DICTIONARY_SINCE: (u32, u32) = (25, 1);

/// `samples.stack_id` on servers from [`STACK_DICTIONARY_SINCE`] on: ids through a part's
/// dictionary, then zstd at level 6. A steady node repeats a few thousand stacks: a row is an
/// index into the dictionary (1.0 byte per sample instead of 2.0 for the 64-bit hash through
/// zstd(1)); a compile-heavy node's new stacks are in the dictionary once and level 6 finds the
/// repeats (5.8 instead of 5.1 bytes with zstd(1) alone: `LowCardinality` with zstd(1) took 6.0,
/// missing its goal). Same type to a reader (RowBinary, `Native` and joins read a `UInt64`).
const STACK_DICTIONARY: &str = "LowCardinality(UInt64) CODEC(ZSTD(6))";

/// `samples` on servers that have codecs. Sorted per CPU (`samples`' key, below), a CPU's
/// timestamps are ~10.1 ms apart at 99 Hz (`Delta`: about two bytes of jitter each;
/// `DoubleDelta` took 0.7 B more, its buckets jump from 12 to 32 bits) and it runs one thread for
/// a while (`pid`, `tid`, `comm` and `workload` in runs); ids and names through a dictionary or
/// zstd. On chdb 26.9 (`cargo xtask bench clickhouse-bytes`, merged parts): a steady node 4.7
/// bytes per sample (8.4 with the codecs and order before), a compile-heavy one 7.2 (9.6). The
/// stack id, a 64-bit hash, is 2.0 and 5.1 of those; with [`STACK_DICTIONARY`] (servers from
/// 25.1 on) 3.7 and 7.9 in all.
const SAMPLES_CODECS: &[(&str, &str)] = &[
    (NODE, "LowCardinality(String)"),
    (TS, "UInt64 CODEC(Delta, ZSTD(1))"),
    (CPU, "UInt16 CODEC(ZSTD(1))"),
    (PID, "UInt32 CODEC(Delta, ZSTD(1))"),
    (TID, "UInt32 CODEC(Delta, ZSTD(1))"),
    (COMM, "LowCardinality(String) CODEC(ZSTD(1))"),
    (STACK_ID, "UInt64 CODEC(ZSTD(1))"),
    (WORKLOAD, "LowCardinality(String) CODEC(ZSTD(1))"),
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
    /// Seconds the node's rows are kept, when the server supports `TTL` (`None`: no TTL clauses,
    /// the rollups' included; theirs come from [`RollupKeep`]).
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

/// The server can be given `samples.stack_id` as [`STACK_DICTIONARY`] by the statement alone.
pub fn supports_stack_dictionary(version: (u32, u32)) -> bool {
    version >= STACK_DICTIONARY_SINCE
}

/// (table, columns, engine and keys; `{ttl}` where a TTL on column `ts` goes).
/// Names of the tables, as the shipper inserts into them and the fleet reads them.
pub const SAMPLES: &str = "samples";
/// Stacks as text (`frames Array(String)`): what daemons before the frames dictionary wrote;
/// still created (empty) and read for the ids the dictionary lacks (`fleet::stack_text`).
pub const STACKS: &str = "stacks";
/// Stacks as frame ids (`frames::stack_row`), the frames' text in [`FRAME_DICT`].
pub const STACK_FRAMES: &str = "stack_frames";
/// The frames dictionary: each frame's text once fleet-wide, by its id (`frames::frame_id`).
pub const FRAME_DICT: &str = "frames";
pub const STACK_LOCATIONS: &str = "stack_locations";
pub const FINDINGS: &str = "findings";
pub const EVENTS: &str = "events";
pub const CPU_SECONDS: &str = "cpu_seconds";
pub const COUNTERS: &str = "counters";
pub const CUDA_SAMPLES: &str = "cuda_samples";
pub const NODES: &str = "nodes";
/// Per minute, per (node, workload, comm, stack): `sum(count)` of `samples`.
pub const SAMPLES_1M: &str = "samples_1m";
/// Per hour, fleet-wide (no node), per (workload, comm, stack).
pub const SAMPLES_1H: &str = "samples_1h";
/// Per minute, fleet-wide (no node), per (workload class, comm, stack): a fleet's minute is
/// rows per distinct stack, not per node and pod.
pub const SAMPLES_FLEET_1M: &str = "samples_fleet_1m";
/// Per 10 minutes, fleet-wide, per (workload class, comm, stack).
pub const SAMPLES_FLEET_10M: &str = "samples_fleet_10m";
/// Per UTC day, fleet-wide, per (workload class, comm, stack), kept as the hours.
pub const SAMPLES_1D: &str = "samples_1d";
/// Per second, fleet-wide, per (workload class, comm, stack), kept as the raw rows: the edges
/// of a fleet-wide window that are not whole minutes.
pub const SAMPLES_FLEET_1S: &str = "samples_fleet_1s";
/// Per hour, per (stack, comm, node), kept as the minutes: which nodes a stack ran on, read by
/// the stack (`profiler fleet`'s top stacks: a day of a thousand nodes' minutes held 128 M rows
/// to count them from).
pub const STACK_NODES_1H: &str = "stack_nodes_1h";

/// A rollup row's `ts` is the start of its second, minute or hour, ns.
pub const SECOND_NS: u64 = 1_000_000_000;
pub const MINUTE_NS: u64 = 60 * 1_000_000_000;
pub const HOUR_NS: u64 = 3_600 * 1_000_000_000;
pub const TEN_MINUTES_NS: u64 = 10 * MINUTE_NS;
/// `samples_1h`'s partitions are 30 days (`intDiv(ts, 86400000000000 * 30)`): a year is 13.
pub const HOUR_PARTITION_NS: u64 = 30 * DAY_NS;

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
    pub const FRAME_ID: &str = "frame_id";
    pub const FRAME_IDS: &str = "frame_ids";
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
        // A node's rows per CPU in time order, on every server: the order that compresses
        // (16-19 % fewer bytes without codecs too). Reads of a node and a window still skip the
        // rest: the primary key prunes `ts` within each CPU's run (generic exclusion over plain
        // columns, no function the server must know as monotonic). Tables created before keep
        // `(node, ts, cpu)`; no reader depends on either.
        "MergeTree PARTITION BY intDiv(ts, 86400000000000) ORDER BY (node, cpu, ts){ttl}",
    ),
    (
        // Shared by every node: the same binaries give the same stacks fleet-wide. Re-inserting a
        // stack is harmless, merges collapse the copies (the shipper sends only the ids the
        // server lacks). Read by id, a few thousand at a time: granules of 256 rows (a row is
        // ~2-4 KB of frames) so that a lookup reads the rows it names, not 8,192 rows around
        // each (tables created before keep 8,192).
        STACKS,
        &[(STACK_ID, "UInt64"), (FRAMES, "Array(String)"), (KERNEL, "Array(UInt8)")],
        "ReplacingMergeTree ORDER BY stack_id SETTINGS index_granularity = 256",
    ),
    (
        // A stack as the ids of its frames (8 bytes a frame, ~0.5 KB a Python training stack
        // instead of ~10 KB of text): what reads fetch by id, then only the distinct frames
        // they need from `frames`. Written, as `stacks` was, once per shard; granules of 256.
        STACK_FRAMES,
        &[(STACK_ID, "UInt64"), (FRAME_IDS, "Array(UInt64)"), (KERNEL, "Array(UInt8)")],
        "ReplacingMergeTree ORDER BY stack_id SETTINGS index_granularity = 256",
    ),
    (
        // Each frame's text once (a frame is ~60-150 bytes): granules of 1,024, a lookup's
        // ~100 KB around each id.
        FRAME_DICT,
        &[(FRAME_ID, "UInt64"), (NAME, "String")],
        "ReplacingMergeTree ORDER BY frame_id SETTINGS index_granularity = 1024",
    ),
    (
        // Where a stack's user frames live (`model::Location`), for the stacks that know it: a
        // table of its own, so that servers with `stacks` from before it need no ALTER.
        STACK_LOCATIONS,
        &[(STACK_ID, "UInt64"), (FILES, "Array(String)"), (ADDRS, "Array(UInt64)")],
        "ReplacingMergeTree ORDER BY stack_id SETTINGS index_granularity = 256",
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
        // kind, second, thread, stack and comm, so a row sent again collapses in merges (read
        // with `max(value)` per key, as `fleet` does). Stacks are in `stacks` with the samples'.
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
        "ReplacingMergeTree PARTITION BY intDiv(ts, 86400000000000) ORDER BY (node, kind, ts, tid, stack_id, comm){ttl}",
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

/// Every statement of a schema made by hand, in order, each safe to run again, the rollups
/// keeping [`RollupKeep::DEFAULT`]; the views recorded as made ([`views::by_hand`]).
pub fn statements(l: &Layout<'_>) -> Vec<String> {
    statements_keeping(l, RollupKeep::DEFAULT)
}

/// Every statement of a schema made by hand, in order, each safe to run again; with codecs,
/// `stack_id` as [`STACK_DICTIONARY`] (a server from 25.1 on: the shipper asks
/// [`statements_with`] for older ones).
pub fn statements_keeping(l: &Layout<'_>, keep: RollupKeep) -> Vec<String> {
    views::by_hand(&quote_ident(l.database), statements_with(l, keep, true))
}

/// The tables and views, in order, each safe to run again (the shipper runs them through
/// [`views::ensure`], which replaces views whose definition changed); `dictionary`: with
/// codecs, `samples`' `stack_id` is [`STACK_DICTIONARY`] ([`supports_stack_dictionary`]).
pub fn statements_with(l: &Layout<'_>, keep: RollupKeep, dictionary: bool) -> Vec<String> {
    let db = quote_ident(l.database);
    let ttl = |secs: Option<u64>| {
        secs.map(|s| format!(" TTL toDateTime(intDiv(ts, 1000000000)) + toIntervalSecond({s})")).unwrap_or_default()
    };
    let local = |name: &str| if l.cluster.is_some() { format!("{name}_local") } else { name.to_string() };
    let distributed = |name: &str, shard_by: &str| {
        l.cluster.map(|cluster| {
            format!(
                "CREATE TABLE IF NOT EXISTS {db}.{} AS {db}.{} ENGINE = Distributed({}, {db}, {}, {shard_by})",
                quote_ident(name),
                quote_ident(&local(name)),
                quote_ident(cluster),
                quote_ident(&local(name)),
            )
        })
    };
    let mut out = vec![format!("CREATE DATABASE IF NOT EXISTS {db}")];
    for (name, columns, engine) in TABLES {
        let engine = engine.replace("{ttl}", &ttl(l.ttl_secs));
        let columns = if l.codecs && *name == SAMPLES { SAMPLES_CODECS } else { columns };
        let dictionary = dictionary && l.codecs && *name == SAMPLES;
        let column = |(c, t): &(&str, &str)| match dictionary && *c == STACK_ID {
            true => format!("{c} {STACK_DICTIONARY}"),
            false => format!("{c} {t}"),
        };
        let columns = columns.iter().map(column).collect::<Vec<_>>().join(", ");
        // The `Distributed` table over it has the same columns: it needs the setting too.
        let settings = if dictionary { " SETTINGS allow_suspicious_low_cardinality_types = 1" } else { "" };
        out.push(format!(
            "CREATE TABLE IF NOT EXISTS {db}.{} ({columns}) ENGINE = {engine}{settings}",
            quote_ident(&local(name))
        ));
        // Rows of a node stay on one shard, so a node's window is read from one place.
        let shard_by = match *name {
            STACKS | STACK_LOCATIONS | STACK_FRAMES => STACK_ID,
            FRAME_DICT => FRAME_ID,
            _ => "cityHash64(node)",
        };
        out.extend(distributed(name, shard_by).map(|q| q + settings));
    }
    for r in ROLLUPS {
        let secs = match r.name {
            SAMPLES_1H | SAMPLES_1D => l.ttl_secs.map(|_| keep.hours_secs),
            // The seconds stand in for raw rows: kept as long as they are.
            SAMPLES_FLEET_1S => l.ttl_secs,
            _ => l.ttl_secs.map(|_| keep.minutes_secs),
        };
        let engine = r.engine.replace("{ttl}", &ttl(secs));
        let columns = r.columns.iter().map(|(c, t)| format!("{c} {t}")).collect::<Vec<_>>().join(", ");
        let table = quote_ident(&local(r.name));
        out.push(format!("CREATE TABLE IF NOT EXISTS {db}.{table} ({columns}) ENGINE = {engine}"));
        out.extend(distributed(r.name, r.shard_by));
        // With a cluster each shard rolls up the rows it receives, into its own table.
        let select = r
            .select
            .replace("{source}", &format!("{db}.{}", quote_ident(&local(SAMPLES))))
            .replace("{workload_class}", &workload_class("s.workload"));
        out.push(views::create(&db, &view_name(r.name), &table, &select));
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
    fn stack_ids_through_a_dictionary_where_the_statement_can_allow_it() {
        assert!(!supports_stack_dictionary((24, 12)) && supports_stack_dictionary((25, 1)));
        let keep = RollupKeep::DEFAULT;
        let l = Layout { database: "p", cluster: Some("c"), ttl_secs: None, codecs: true };
        let s = statements_with(&l, keep, true);
        let setting = " SETTINGS allow_suspicious_low_cardinality_types = 1";
        assert!(s[1].contains("stack_id LowCardinality(UInt64) CODEC(ZSTD(6))") && s[1].ends_with(setting), "{}", s[1]);
        assert!(s[2].contains("Distributed(") && s[2].ends_with(setting), "{}", s[2]);
        assert_eq!(s.iter().filter(|q| q.contains("LowCardinality(UInt64)") || q.contains(setting)).count(), 2);
        // A server before 25.1 gets the codecs without the dictionary; 18.16 neither.
        let s = statements_with(&l, keep, false);
        assert!(s[1].contains("stack_id UInt64 CODEC(ZSTD(1))") && !s.iter().any(|q| q.contains(setting)));
        let plain = statements_with(&Layout { codecs: false, ..l }, keep, true);
        assert!(plain[1].contains("stack_id UInt64,") && !plain.iter().any(|q| q.contains(setting)));
    }

    #[test]
    fn plain_layout_has_no_distributed_and_quotes_names() {
        let s = statements(&Layout { database: "pro`f", cluster: None, ttl_secs: None, codecs: false });
        // Made by hand: the table of view versions and a record of each view follow.
        assert_eq!(s.len(), 1 + TABLES.len() + 2 * ROLLUPS.len() + 1 + ROLLUPS.len());
        assert!(s.iter().all(|q| !q.contains("Distributed") && !q.contains("TTL")));
        assert!(s[s.len() - 1].starts_with("INSERT INTO `pro\\`f`.`schema_views`"), "{}", s[s.len() - 1]);
        assert_eq!(s[0], "CREATE DATABASE IF NOT EXISTS `pro\\`f`");
    }

    #[test]
    fn cluster_layout_adds_local_tables_and_ttl_where_asked() {
        let s = statements_with(
            &Layout { database: "p", cluster: Some("c"), ttl_secs: Some(60), codecs: true },
            RollupKeep::DEFAULT,
            true,
        );
        assert_eq!(s.len(), 1 + 2 * TABLES.len() + 3 * ROLLUPS.len());
        assert!(s[1].contains("`samples_local` (") && s[1].contains("toIntervalSecond(60)"));
        assert!(s[2].contains("Distributed(`c`, `p`, `samples_local`, cityHash64(node))"));
        assert!(!s[3].contains("TTL"), "stacks are kept: {}", s[3]);
        assert!(s[1].contains("ts UInt64 CODEC(Delta, ZSTD(1))") && !s[3].contains("CODEC"), "codecs on samples only");
        assert!(s[1].contains("ORDER BY (node, cpu, ts) TTL"), "{}", s[1]);
    }

    #[test]
    fn rollups_are_summing_tables_filled_by_views_of_samples() {
        let keep = RollupKeep { minutes_secs: 120, hours_secs: 7200 };
        let s = statements_keeping(&Layout { database: "p", cluster: None, ttl_secs: None, codecs: false }, keep);
        let rollups = &s[1 + TABLES.len()..];
        assert_eq!(
            &rollups[..4],
            [
                "CREATE TABLE IF NOT EXISTS `p`.`samples_1m` (node String, ts UInt64, comm String, stack_id UInt64, \
                 workload String, count UInt64) ENGINE = SummingMergeTree(count) PARTITION BY intDiv(ts, 86400000000000) \
                 ORDER BY (node, ts, comm, stack_id, workload)",
                "CREATE MATERIALIZED VIEW IF NOT EXISTS `p`.`samples_1m_mv` TO `p`.`samples_1m` AS SELECT node, \
                 intDiv(s.ts, 60000000000) * 60000000000 AS ts, comm, stack_id, workload, sum(s.count) AS count \
                 FROM `p`.`samples` AS s GROUP BY node, ts, comm, stack_id, workload",
                "CREATE TABLE IF NOT EXISTS `p`.`samples_1h` (ts UInt64, comm String, stack_id UInt64, workload String, \
                 count UInt64) ENGINE = SummingMergeTree(count) PARTITION BY intDiv(ts, 86400000000000 * 30) \
                 ORDER BY (ts, comm, stack_id, workload)",
                format!(
                    "CREATE MATERIALIZED VIEW IF NOT EXISTS `p`.`samples_1h_mv` TO `p`.`samples_1h` AS SELECT \
                     intDiv(s.ts, 3600000000000) * 3600000000000 AS ts, comm, stack_id, {} AS workload, \
                     sum(s.count) AS count FROM `p`.`samples` AS s GROUP BY ts, comm, stack_id, workload",
                    workload_class("s.workload")
                )
                .as_str(),
            ]
        );
        // The constants the shipper's retention and the readers use say the same.
        assert!(rollups[1].contains(&format!("intDiv(s.ts, {MINUTE_NS}) * {MINUTE_NS}")));
        assert!(rollups[3].contains(&format!("intDiv(s.ts, {HOUR_NS}) * {HOUR_NS}")));
        assert_eq!(HOUR_PARTITION_NS, DAY_NS * 30);
        // Each table its own TTL, where the server has TTL.
        let s = statements_keeping(&Layout { database: "p", cluster: None, ttl_secs: Some(60), codecs: true }, keep);
        let ttl = |q: &str| q.split(" TTL ").nth(1).and_then(|t| t.split(" SETTINGS ").next()).map(str::to_string);
        let of = |name: &str| s.iter().find(|q| q.contains(&format!("TABLE IF NOT EXISTS `p`.`{name}` ("))).unwrap();
        let expiry = "toDateTime(intDiv(ts, 1000000000)) + toIntervalSecond";
        assert_eq!(ttl(of(SAMPLES)), Some(format!("{expiry}(60)")));
        assert_eq!(ttl(of(SAMPLES_1M)), Some(format!("{expiry}(120)")));
        assert_eq!(ttl(of(SAMPLES_1H)), Some(format!("{expiry}(7200)")));
        assert!(!of(SAMPLES_1M).contains("LowCardinality") && !of(SAMPLES_1M).contains("CODEC"), "plain columns");
        for fleet in [SAMPLES_FLEET_1M, SAMPLES_FLEET_10M] {
            assert_eq!(ttl(of(fleet)), Some(format!("{expiry}(120)")), "kept as the minutes");
        }
        assert_eq!(ttl(of(SAMPLES_1D)), Some(format!("{expiry}(7200)")), "kept as the hours");
        assert_eq!(ttl(of(SAMPLES_FLEET_1S)), Some(format!("{expiry}(60)")), "kept as the raw rows");
        assert_eq!(ttl(of(STACK_NODES_1H)), Some(format!("{expiry}(120)")), "kept as the minutes");
    }

    #[test]
    fn the_fleet_rollups_are_classes_read_from_samples() {
        let s = statements(&Layout { database: "p", cluster: None, ttl_secs: None, codecs: false });
        let rollups = &s[1 + TABLES.len()..];
        assert_eq!(
            rollups[5],
            format!(
                "CREATE MATERIALIZED VIEW IF NOT EXISTS `p`.`samples_fleet_1m_mv` TO `p`.`samples_fleet_1m` AS SELECT \
                 intDiv(s.ts, {MINUTE_NS}) * {MINUTE_NS} AS ts, comm, stack_id, {} AS workload, \
                 sum(s.count) AS count FROM `p`.`samples` AS s GROUP BY ts, comm, stack_id, workload",
                workload_class("s.workload")
            )
        );
        assert_eq!(
            rollups[7],
            format!(
                "CREATE MATERIALIZED VIEW IF NOT EXISTS `p`.`samples_fleet_10m_mv` TO `p`.`samples_fleet_10m` AS SELECT \
                 intDiv(s.ts, {TEN_MINUTES_NS}) * {TEN_MINUTES_NS} AS ts, comm, stack_id, {} AS workload, \
                 sum(s.count) AS count FROM `p`.`samples` AS s GROUP BY ts, comm, stack_id, workload",
                workload_class("s.workload")
            )
        );
        assert_eq!(
            rollups[11],
            format!(
                "CREATE MATERIALIZED VIEW IF NOT EXISTS `p`.`samples_fleet_1s_mv` TO `p`.`samples_fleet_1s` AS SELECT \
                 intDiv(s.ts, {SECOND_NS}) * {SECOND_NS} AS ts, comm, stack_id, {} AS workload, \
                 sum(s.count) AS count FROM `p`.`samples` AS s GROUP BY ts, comm, stack_id, workload",
                workload_class("s.workload")
            )
        );
        assert!(rollups[4].starts_with("CREATE TABLE IF NOT EXISTS `p`.`samples_fleet_1m` (ts UInt64,"));
        assert!(
            rollups[6].ends_with("PARTITION BY intDiv(ts, 86400000000000) ORDER BY (ts, comm, stack_id, workload)")
        );
    }

    #[test]
    fn the_hourly_class_keeps_namespace_container_name_and_unit() {
        let c = workload_class("w");
        for f in WORKLOAD_CLASS_FIELDS {
            assert!(c.contains(&format!("visitParamExtractRaw(w, '{f}')")), "{c}");
        }
        assert!(["'pod_name'", "'pod_uid'", "'container_id'"].iter().all(|f| !c.contains(f)), "{c}");
        assert!(c.starts_with("if(arrayStringConcat(arrayFilter(x -> x != '', [if(") && c.ends_with("'}'))"), "{c}");
    }

    #[test]
    fn stacks_are_read_in_small_granules() {
        let s = statements(&Layout { database: "p", cluster: None, ttl_secs: None, codecs: false });
        let of = |name: &str| s.iter().find(|q| q.contains(&format!("`p`.`{name}` ("))).unwrap();
        for t in [STACKS, STACK_LOCATIONS, STACK_FRAMES] {
            assert!(of(t).ends_with("ORDER BY stack_id SETTINGS index_granularity = 256"), "{}", of(t));
        }
        assert_eq!(
            of(STACK_FRAMES),
            "CREATE TABLE IF NOT EXISTS `p`.`stack_frames` (stack_id UInt64, frame_ids Array(UInt64), \
             kernel Array(UInt8)) ENGINE = ReplacingMergeTree ORDER BY stack_id SETTINGS index_granularity = 256"
        );
        assert_eq!(
            of(FRAME_DICT),
            "CREATE TABLE IF NOT EXISTS `p`.`frames` (frame_id UInt64, name String) \
             ENGINE = ReplacingMergeTree ORDER BY frame_id SETTINGS index_granularity = 1024"
        );
        let c = statements(&Layout { database: "p", cluster: Some("c"), ttl_secs: None, codecs: true });
        assert!(c.iter().any(|q| q.ends_with("Distributed(`c`, `p`, `frames_local`, frame_id)")));
        assert!(c.iter().any(|q| q.ends_with("Distributed(`c`, `p`, `stack_frames_local`, stack_id)")));
    }

    #[test]
    fn cluster_rollups_read_the_shards_samples_and_are_read_through_distributed_tables() {
        let l = Layout { database: "p", cluster: Some("c"), ttl_secs: None, codecs: false };
        let s = statements_with(&l, RollupKeep::DEFAULT, true);
        let rollups = &s[1 + 2 * TABLES.len()..];
        assert_eq!(rollups.len(), 3 * ROLLUPS.len());
        assert!(rollups[0].starts_with("CREATE TABLE IF NOT EXISTS `p`.`samples_1m_local` (node String,"));
        assert_eq!(
            rollups[1],
            "CREATE TABLE IF NOT EXISTS `p`.`samples_1m` AS `p`.`samples_1m_local` \
             ENGINE = Distributed(`c`, `p`, `samples_1m_local`, cityHash64(node))"
        );
        assert!(
            rollups[2]
                .starts_with("CREATE MATERIALIZED VIEW IF NOT EXISTS `p`.`samples_1m_mv` TO `p`.`samples_1m_local` AS")
        );
        assert!(rollups[2].contains("FROM `p`.`samples_local` AS s"));
        assert!(rollups[3].starts_with("CREATE TABLE IF NOT EXISTS `p`.`samples_1h_local` (ts UInt64,"));
        assert!(rollups[4].ends_with("Distributed(`c`, `p`, `samples_1h_local`, rand())"));
        assert!(
            rollups[5].contains("TO `p`.`samples_1h_local` AS") && rollups[5].contains("FROM `p`.`samples_local` AS s")
        );
        // Tables before the views that read and fill them.
        let at = |q: &str| s.iter().position(|x| x.contains(q)).unwrap();
        assert!(at("`samples_local` (") < at("samples_1m_mv") && at("`samples_1h_local` (") < at("samples_1h_mv"));
        // Every view reads the shard's samples.
        assert!(
            rollups
                .iter()
                .filter(|q| q.contains("MATERIALIZED VIEW"))
                .all(|q| q.contains("FROM `p`.`samples_local` AS s"))
        );
    }
}
