//! Per-minute rollups of the per-CPU counts (`cpu_seconds`) and the GPU utilisation tracks
//! (`counters`' `gpu.N.util`), made by ClickHouse itself like the sample rollups
//! ([`super::schema`]): materialized views of the inserts, nothing of ours on a schedule. A
//! day of a fleet's raw rows is 1.4 G `cpu_seconds` rows (1,000 nodes x 16 CPUs x 86,400 s)
//! and 10 GPU readings a second; these keep a row per (node, minute, CPU) and per (node,
//! minute, GPU track), so the fleet page and `profiler fleet` read 60 times fewer rows for the
//! whole minutes of a window (`fleet::minutes` picks them, raw rows at the edges).
//!
//! `cpu_1m` is an `AggregatingMergeTree`: sums of busy, idle, lost ticks and of the blocks'
//! spans (the raw rows' sums over any set of whole minutes), the busiest block's share (`max`,
//! of [`block_ticks`]), and which seconds of the minute had a CPU
//! at least 90 % busy (`groupBitOr` of a 60-bit mask: OR-ed over CPUs it is the node's
//! saturated seconds, as `profiler fleet` counts them). 18.16 has no `SimpleAggregateFunction`,
//! and its `uniqExactArray` states read back wrong after a round trip through a table: a bit
//! mask is what both servers merge alike. `gpu_util_1m` is a `SummingMergeTree` of readings,
//! their sum, those below the detectors' idle line ([`IDLE_BELOW_PERCENT`]) and the seconds
//! read (distinct seconds per inserted block: a second split across two inserts counts twice).
//!
//! The time column is `minute`, not `ts`: 18.16 reads `s.ts` inside an aggregate's argument as
//! the `ts` alias of the minute (every block's offset in its minute then read 0).
//!
//! A retried batch's rows collapse in `cpu_seconds` and `counters` (ReplacingMergeTree) but
//! are summed twice here, as `samples_1m` sums a re-sent sample block: shares hold (busy and
//! idle both double), peaks and saturated seconds are unaffected.

use super::schema::{Layout, quote_ident};
use crate::ship::clickhouse::schema::{COUNTERS, CPU_SECONDS, DAY_NS, HOUR_NS, MINUTE_NS};

/// Per (node, minute, CPU): busy, idle and lost ticks, the blocks' spans, the busiest block's
/// share, the saturated seconds' mask.
pub const CPU_1M: &str = "cpu_1m";
/// Per (node, minute, `gpu.N.util` track): readings, their sum (percent), readings below
/// [`IDLE_BELOW_PERCENT`], seconds read.
pub const GPU_UTIL_1M: &str = "gpu_util_1m";
/// Per (node, hour, CPU): busy and idle ticks. What the fleet page ranks every node by for a
/// window's whole hours (a day of 1,000 nodes of 16 CPUs: 384,000 rows, not 23 M minutes).
pub const CPU_1H: &str = "cpu_1h";
/// Per (node, hour, `gpu.N.util` track): as [`GPU_UTIL_1M`].
pub const GPU_UTIL_1H: &str = "gpu_util_1h";
/// Per (node, minute): `cpu_1m`'s figures with the node's CPUs folded in (busy, idle, lost
/// ticks summed, the busiest block's share, the saturated seconds' masks OR-ed) and the seconds
/// the blocks covered. What `profiler fleet` reads per node: a day of 1,000 nodes is 1.44 M rows
/// where `cpu_1m` holds 23 M for 16 CPUs each (`fleet::node_minutes`).
pub const CPU_NODE_1M: &str = "cpu_node_1m";
/// Per (node, five minutes): each CPU's busy and idle ticks, as arrays by CPU (`sumForEach`),
/// `minute` the five minutes' first. What the page's per-CPU cells read where its columns are
/// whole five minutes (a day's columns are 5 minutes at the least): a day of 1,000 nodes is
/// 288,000 rows, one a cell, where `cpu_1m` holds 23 M rows for 16 CPUs that the read had to
/// group into 4.6 M (node, column, CPU) cells (`fleet::minutes`). Arrays, not a row per CPU:
/// 18.16 groups 4.6 M keys in 2.8 s, these rows' 288,000 with their arrays in 0.6 s.
pub const CPU_5M: &str = "cpu_5m";
/// [`CPU_5M`]'s unit.
pub const FIVE_MINUTES_NS: u64 = 5 * MINUTE_NS;
/// Every table here (the shipper's retention on servers without `TTL` drops their days).
pub const TABLES: [&str; 6] = [CPU_1M, GPU_UTIL_1M, CPU_1H, GPU_UTIL_1H, CPU_NODE_1M, CPU_5M];

/// The column of an hourly row's hour (its start, ns).
pub const HOUR: &str = "hour";

/// The column of a rollup row's minute (its start, ns).
pub const MINUTE: &str = "minute";

/// The idle line `gpu_util_1m` counts readings below, percent: the detectors' default
/// (`detect::thresholds`' `gpu_idle_below`), what the fleet page colours `gpu-idle` with. Fixed
/// when the view is created: a changed default reads raw rows (`fleet::minutes`).
pub const IDLE_BELOW_PERCENT: f64 = 50.0;

/// The `gpu.N.util` tracks (`gpu::nvml::poll`), as an RE2 pattern.
pub const GPU_UTIL_TRACK: &str = "^gpu\\.[0-9]+\\.util$";

/// A raw block's ticks on one CPU, what its busy share divides by: its busy, idle and lost
/// ticks, or Hz x its span where it counted fewer. Where an idle CPU gets no cpu-clock ticks
/// (some VMs: one here had 30,291 busy and 0 idle over 688 s), busy / (busy + idle) reads a
/// block with one busy tick 100 % busy; the node's detectors divide by Hz x seconds too.
pub fn block_ticks(busy: &str, idle: &str, lost: &str, hz: &str, span: &str) -> String {
    format!("greatest(toUInt64({busy}) + {idle} + {lost}, intDiv(toUInt64({hz}) * {span}, 1000000000))")
}

/// A raw block's idle ticks on one CPU as the fleet reads them: the ticks of [`block_ticks`]
/// neither busy nor lost. Its idle ticks where it counted Hz x its span; more where it counted
/// fewer: a CPU whose idle takes no cpu-clock ticks (some VMs: every CPU of a 2-vCPU node
/// here) then reads its busy share, not 100 %, in every rollup and per-CPU cell, also where no
/// CPU of its node ticks through idle. The node's own reads (`profiler cputime`, its summary)
/// keep the idle ticks counted, as its store does.
pub fn idle_ticks(busy: &str, idle: &str, lost: &str, hz: &str, span: &str) -> String {
    format!("toUInt64({} - toUInt64({busy}) - {lost})", block_ticks(busy, idle, lost, hz, span))
}

/// [`idle_ticks`] of a `cpu_seconds` row.
fn row_idle() -> String {
    idle_ticks("busy", "idle", "lost", "hz", "span")
}

/// A block's saturated seconds in its minute as a 60-bit mask (bit `k`: second `k`), or 0 for
/// a block under 90 % busy (of [`block_ticks`]). A block reaching past its minute's end keeps
/// its seconds inside it.
fn saturated_mask() -> String {
    let t = block_ticks("busy", "idle", "lost", "hz", "span");
    format!(
        "if({t} > 0 AND busy * 10 >= {t} * 9, \
         bitShiftLeft(toUInt64(bitShiftLeft(toUInt64(1), least(toUInt8(least(intDiv(span, 1000000000), 60)), \
         toUInt8(60 - intDiv(ts, 1000000000) % 60))) - 1), toUInt8(intDiv(ts, 1000000000) % 60)), toUInt64(0))"
    )
}

/// A block's busy share of [`block_ticks`] (0 for none), what `peak` keeps the largest of.
fn block_share() -> String {
    let t = block_ticks("busy", "idle", "lost", "hz", "span");
    format!("if({t} = 0, toFloat64(0), busy / {t})")
}

struct Rollup {
    name: &'static str,
    source: &'static str,
    columns: &'static str,
    engine: &'static str,
    select: String,
}

fn rollups() -> [Rollup; 6] {
    [
        Rollup {
            name: CPU_1M,
            source: CPU_SECONDS,
            columns: "node String, minute UInt64, cpu UInt16, busy_ticks AggregateFunction(sum, UInt64), \
                      idle_ticks AggregateFunction(sum, UInt64), lost_ticks AggregateFunction(sum, UInt64), \
                      span_ns AggregateFunction(sum, UInt64), peak AggregateFunction(max, Float64), \
                      saturated AggregateFunction(groupBitOr, UInt64)",
            engine: "AggregatingMergeTree PARTITION BY intDiv(minute, 86400000000000) ORDER BY (node, minute, cpu)",
            select: format!(
                "SELECT node, intDiv(ts, {MINUTE_NS}) * {MINUTE_NS} AS minute, cpu, sumState(toUInt64(busy)) AS busy_ticks, \
                 sumState({}) AS idle_ticks, sumState(toUInt64(lost)) AS lost_ticks, sumState(span) AS span_ns, \
                 maxState({}) AS peak, \
                 groupBitOrState({}) AS saturated FROM {{source}} GROUP BY node, minute, cpu",
                row_idle(),
                block_share(),
                saturated_mask()
            ),
        },
        Rollup {
            name: GPU_UTIL_1M,
            source: COUNTERS,
            columns: "node String, minute UInt64, name String, readings UInt64, total Float64, below UInt64, seconds UInt64",
            engine: "SummingMergeTree PARTITION BY intDiv(minute, 86400000000000) ORDER BY (node, minute, name)",
            select: format!(
                "SELECT node, intDiv(ts, {MINUTE_NS}) * {MINUTE_NS} AS minute, name, count() AS readings, sum(value) AS total, \
                 countIf(value < {IDLE_BELOW_PERCENT}) AS below, uniqExact(intDiv(ts, 1000000000)) AS seconds FROM {{source}} \
                 WHERE cpu = -1 AND match(name, {}) GROUP BY node, minute, name",
                super::schema::quote_str(GPU_UTIL_TRACK)
            ),
        },
        Rollup {
            name: CPU_1H,
            source: CPU_SECONDS,
            columns: "node String, hour UInt64, cpu UInt16, busy_ticks UInt64, idle_ticks UInt64",
            engine: "SummingMergeTree PARTITION BY intDiv(hour, 86400000000000) ORDER BY (node, hour, cpu)",
            select: format!(
                "SELECT node, intDiv(ts, {HOUR_NS}) * {HOUR_NS} AS hour, cpu, sum(toUInt64(busy)) AS busy_ticks, \
                 sum({}) AS idle_ticks FROM {{source}} GROUP BY node, hour, cpu",
                row_idle()
            ),
        },
        Rollup {
            name: GPU_UTIL_1H,
            source: COUNTERS,
            columns: "node String, hour UInt64, name String, readings UInt64, total Float64, below UInt64, seconds UInt64",
            engine: "SummingMergeTree PARTITION BY intDiv(hour, 86400000000000) ORDER BY (node, hour, name)",
            select: format!(
                "SELECT node, intDiv(ts, {HOUR_NS}) * {HOUR_NS} AS hour, name, count() AS readings, sum(value) AS total, \
                 countIf(value < {IDLE_BELOW_PERCENT}) AS below, uniqExact(intDiv(ts, 1000000000)) AS seconds FROM {{source}} \
                 WHERE cpu = -1 AND match(name, {}) GROUP BY node, hour, name",
                super::schema::quote_str(GPU_UTIL_TRACK)
            ),
        },
        Rollup {
            name: CPU_NODE_1M,
            source: CPU_SECONDS,
            columns: "node String, minute UInt64, busy_ticks AggregateFunction(sum, UInt64), \
                      idle_ticks AggregateFunction(sum, UInt64), lost_ticks AggregateFunction(sum, UInt64), \
                      span_ns AggregateFunction(sum, UInt64), peak AggregateFunction(max, Float64), \
                      saturated AggregateFunction(groupBitOr, UInt64)",
            engine: "AggregatingMergeTree PARTITION BY intDiv(minute, 86400000000000) ORDER BY (node, minute)",
            // The seconds covered are the raw rows' span per block (`ts`), summed: an insert's
            // distinct (block, span) pairs, summed. Not the spans over the CPUs' count: a block
            // lacks the CPUs that took no sample in it (a real daemon's minute read 48-56 s so
            // against 55-60 s). A block whose CPUs carry two spans (a second written in two
            // flushes, a CPU in one only) counts both; a batch the server cuts inside a
            // block's rows (over `max_insert_block_size`, a million rows) counts that block
            // twice. `arrayReduce` makes the sum a sum's state (an aggregate cannot take
            // another's result, and 18.16 reads a subquery's aliases in a view as the source's
            // columns). A re-sent batch counts its spans twice, as `cpu_1m`'s do.
            select: format!(
                "SELECT node, intDiv(ts, {MINUTE_NS}) * {MINUTE_NS} AS minute, sumState(toUInt64(busy)) AS busy_ticks, \
                 sumState({}) AS idle_ticks, sumState(toUInt64(lost)) AS lost_ticks, \
                 arrayReduce('sumState', [toUInt64(arraySum(arrayMap(p -> tupleElement(p, 2), groupUniqArray((ts, span)))))]) AS span_ns, \
                 maxState({}) AS peak, \
                 groupBitOrState({}) AS saturated FROM {{source}} GROUP BY node, minute",
                row_idle(),
                block_share(),
                saturated_mask()
            ),
        },
        Rollup {
            name: CPU_5M,
            source: CPU_SECONDS,
            columns: "node String, minute UInt64, busy_cpus AggregateFunction(sumForEach, Array(UInt64)), \
                      idle_cpus AggregateFunction(sumForEach, Array(UInt64))",
            engine: "AggregatingMergeTree PARTITION BY intDiv(minute, 86400000000000) ORDER BY (node, minute)",
            // A row's ticks at its CPU's index of an array of zeros (18.16 reads no outer column
            // inside a lambda: `arrayResize`, not `arrayMap`).
            select: format!(
                "SELECT node, intDiv(ts, {FIVE_MINUTES_NS}) * {FIVE_MINUTES_NS} AS minute, \
                 sumForEachState(arrayPushBack(arrayResize(emptyArrayUInt64(), cpu), toUInt64(busy))) AS busy_cpus, \
                 sumForEachState(arrayPushBack(arrayResize(emptyArrayUInt64(), cpu), {})) AS idle_cpus \
                 FROM {{source}} GROUP BY node, minute",
                row_idle()
            ),
        },
    ]
}

/// [`definitions`] for a schema made by hand: the views recorded as made
/// ([`super::views::by_hand`]).
pub fn statements(l: &Layout<'_>, keep_secs: u64) -> Vec<String> {
    super::views::by_hand(&quote_ident(l.database), definitions(l, keep_secs))
}

/// The tables, their `Distributed` tables on a cluster, and the views, each safe to run again;
/// rows kept `keep_secs` where the server has `TTL` (`l.ttl_secs` set).
pub fn definitions(l: &Layout<'_>, keep_secs: u64) -> Vec<String> {
    let db = quote_ident(l.database);
    let local = |name: &str| if l.cluster.is_some() { format!("{name}_local") } else { name.to_string() };
    let mut out = Vec::new();
    for r in rollups() {
        let column = if r.name.ends_with("_1h") { HOUR } else { MINUTE };
        let ttl = l
            .ttl_secs
            .map(|_| format!(" TTL toDateTime(intDiv({column}, 1000000000)) + toIntervalSecond({keep_secs})"))
            .unwrap_or_default();
        let table = quote_ident(&local(r.name));
        out.push(format!("CREATE TABLE IF NOT EXISTS {db}.{table} ({}) ENGINE = {}{ttl}", r.columns, r.engine));
        if let Some(cluster) = l.cluster {
            // A node's rows on one shard, as its raw rows.
            out.push(format!(
                "CREATE TABLE IF NOT EXISTS {db}.{} AS {db}.{table} ENGINE = Distributed({}, {db}, {table}, cityHash64(node))",
                quote_ident(r.name),
                quote_ident(cluster),
            ));
        }
        // With a cluster each shard rolls up the rows it receives, into its own table.
        let select = r.select.replace("{source}", &format!("{db}.{}", quote_ident(&local(r.source))));
        out.push(super::views::create(&db, &format!("{}_mv", r.name), &table, &select));
    }
    out
}

/// How many statements [`statements`] makes.
pub fn count(l: &Layout<'_>) -> usize {
    TABLES.len() * if l.cluster.is_some() { 3 } else { 2 }
}

/// `minute`'s partitions are UTC days, as the raw tables'.
pub const PARTITION_NS: u64 = DAY_NS;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_views_and_ttl() {
        let plain = Layout { database: "p", cluster: None, ttl_secs: None, codecs: false };
        let s = definitions(&plain, 120);
        assert_eq!(s.len(), count(&plain));
        assert!(s.iter().all(|q| !q.contains("TTL") && !q.contains("Distributed")));
        assert!(s[0].starts_with("CREATE TABLE IF NOT EXISTS `p`.`cpu_1m` (node String, minute UInt64, cpu UInt16,"));
        assert!(s[1].starts_with("CREATE MATERIALIZED VIEW IF NOT EXISTS `p`.`cpu_1m_mv` TO `p`.`cpu_1m` AS SELECT"));
        assert!(s[1].ends_with("FROM `p`.`cpu_seconds` GROUP BY node, minute, cpu"), "{}", s[1]);
        // Shares against the ticks a block should have had: Hz x its span where it counted fewer.
        let ticks = "greatest(toUInt64(busy) + idle + lost, intDiv(toUInt64(hz) * span, 1000000000))";
        assert!(s[1].contains(&format!("maxState(if({ticks} = 0, toFloat64(0), busy / {ticks})) AS peak")), "{}", s[1]);
        assert!(s[1].contains(&format!("groupBitOrState(if({ticks} > 0 AND busy * 10 >= {ticks} * 9,")), "{}", s[1]);
        // Idle: the ticks due neither busy nor lost, in every per-CPU rollup (no CPU of a node
        // need tick through idle for its shares to read right).
        let idle = format!("toUInt64({ticks} - toUInt64(busy) - lost)");
        assert!(s[1].contains(&format!("sumState({idle}) AS idle_ticks")), "{}", s[1]);
        assert!(s.iter().filter(|q| q.contains(&idle)).count() == 4, "cpu_1m, cpu_1h, cpu_node_1m, cpu_5m");
        assert!(!s.iter().any(|q| q.contains("toUInt64(idle)")));
        assert!(s[3].contains("countIf(value < 50) AS below") && s[3].contains("FROM `p`.`counters` WHERE cpu = -1"));
        let node = s.iter().find(|q| q.contains("`cpu_node_1m_mv`")).expect("the per-node view");
        assert!(
            node.starts_with("CREATE MATERIALIZED VIEW IF NOT EXISTS `p`.`cpu_node_1m_mv` TO `p`.`cpu_node_1m`"),
            "{node}"
        );
        assert!(node.contains("groupUniqArray((ts, span)))))]) AS span_ns"), "{node}");
        assert!(node.ends_with("FROM `p`.`cpu_seconds` GROUP BY node, minute"), "{node}");
        let five = &s[s.len() - 1];
        assert!(five.starts_with("CREATE MATERIALIZED VIEW IF NOT EXISTS `p`.`cpu_5m_mv` TO `p`.`cpu_5m`"), "{five}");
        assert!(five.contains("intDiv(ts, 300000000000) * 300000000000 AS minute"), "{five}");
        let ttl = Layout { ttl_secs: Some(60), ..plain.clone() };
        assert!(
            definitions(&ttl, 120)[0].ends_with("TTL toDateTime(intDiv(minute, 1000000000)) + toIntervalSecond(120)")
        );
        let cluster = Layout { cluster: Some("c"), ..plain };
        let s = definitions(&cluster, 120);
        assert_eq!(s.len(), count(&cluster));
        assert!(s[1].ends_with("Distributed(`c`, `p`, `cpu_1m_local`, cityHash64(node))"), "{}", s[1]);
        assert!(s[2].contains("TO `p`.`cpu_1m_local` AS") && s[2].contains("FROM `p`.`cpu_seconds_local`"));
    }

    #[test]
    fn the_idle_line_is_the_detectors_default() {
        let d = crate::detect::thresholds::Thresholds::default().gpu_idle_below * 100.0;
        assert_eq!(d, IDLE_BELOW_PERCENT);
    }
}
