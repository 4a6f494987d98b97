//! Which minute rollup a node's CPU figures come from, and its SQL: `cpu_node_1m` (one row per
//! node and minute, the CPUs folded in by the server's view) where it holds the window's whole
//! minutes, else `cpu_1m` (one row per CPU: 16 to 192 times the rows). `profiler fleet` sums
//! every node's busy, idle and lost ticks, its busiest block, its saturated and covered seconds
//! and its grid cells over the window: for a day of 1,000 nodes of 16 CPUs that is 1.44 M rows
//! from `cpu_node_1m` against 23 M from `cpu_1m`, which did not answer within the reader's
//! 30 s on this machine. The fleet page's ranking and cells read the busiest CPU, so they stay
//! on `cpu_1m` and `cpu_1h` ([`super::minutes`]).
//!
//! `cpu_node_1m` came after `cpu_1m`: on a server shipped to before it, a window reaching back
//! before its first minute reads `cpu_1m` (the same answers: `fleet_page.rs` compares both with
//! the raw rows), until those minutes age out.

use super::{
    Fleet, FleetError,
    minutes::{self, Parts, Split},
    rollup,
};
use crate::{
    query::Window,
    ship::clickhouse::{
        schema::{CPU_SECONDS, MINUTE_NS, col::*},
        track_rollups::{self, CPU_1M, CPU_NODE_1M, MINUTE},
    },
};

const SEC: u64 = 1_000_000_000;

/// The rollup a node's CPU minutes are read from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NodeMinutes {
    /// `cpu_1m`: per CPU, folded per node at read time.
    #[default]
    PerCpu,
    /// `cpu_node_1m`: per node.
    PerNode,
}

impl NodeMinutes {
    pub fn table(self) -> &'static str {
        match self {
            Self::PerCpu => CPU_1M,
            Self::PerNode => CPU_NODE_1M,
        }
    }

    /// The whole minutes of `w` and the rollup that answers them; raw rows elsewhere. The
    /// per-node rollup wherever it holds minutes from no later than the per-CPU one.
    pub fn split(fleet: &Fleet, w: Window) -> Result<(Split, Self), FleetError> {
        let per_node = minutes::whole_from(fleet, CPU_NODE_1M, w)?;
        // Whole minutes from the window's first: nothing could start sooner.
        if per_node == Some(w.from_ns / MINUTE_NS * MINUTE_NS) {
            return Ok((Split::new(w, per_node), Self::PerNode));
        }
        let per_cpu = minutes::whole_from(fleet, CPU_1M, w)?;
        Ok(match (per_node, per_cpu) {
            (Some(n), Some(c)) if n > c => (Split::new(w, Some(c)), Self::PerCpu),
            (Some(n), _) => (Split::new(w, Some(n)), Self::PerNode),
            (None, c) => (Split::new(w, c), Self::PerCpu),
        })
    }

    /// As [`Self::split`], `w`'s end moved to its minute's end where no per-CPU row follows it
    /// there ([`rollup::quiet_until`] on `cpu_seconds`: a window ending now, or where the
    /// fleet's data stops), so that the rollup answers that minute whole. Its rows are those of
    /// `w`, and a raw sliver at the end read every node's granule around it (`cpu_seconds` is
    /// sorted by node: 9.3 M rows, 0.32 s a shard for a day of 1,000 nodes).
    pub fn split_quiet(fleet: &Fleet, w: Window) -> Result<(Split, Self), FleetError> {
        let end = w.to_ns.div_ceil(MINUTE_NS).saturating_mul(MINUTE_NS);
        if end == w.to_ns {
            return Self::split(fleet, w);
        }
        let rows_in = |a, b| rollup::rows_in(fleet, CPU_SECONDS, a, b);
        match rollup::quiet_until(w, rollup::now_ns(), rows_in)? {
            Some(quiet) if quiet >= end => Self::split(fleet, Window { from_ns: w.from_ns, to_ns: end }),
            _ => Self::split(fleet, w),
        }
    }

    /// As [`Self::split`] for columns of `parts`: raw rows where they are not whole minutes.
    pub fn split_for(parts: &Parts<'_>, w: Window) -> Result<(Split, Self), FleetError> {
        match parts.whole_minutes() {
            true => Self::split(parts.fleet, w),
            false => Ok((Split::raw(w), Self::PerCpu)),
        }
    }

    /// Per node and column (`col` makes it of `minute`) over the whole minutes `m`: `nd, col,
    /// bs, iss, ls, upk, usat, usp`: busy, idle, lost ticks, the busiest block's share, ns with
    /// a CPU at least 90 % busy (whole seconds), ns covered.
    fn units(self, fleet: &Fleet, col: &str, m: Window, nodes: &str) -> String {
        match self {
            // Per minute the CPUs' sums, the longest CPU's spans (every CPU is in every block),
            // the seconds saturated on any CPU (their masks OR-ed): the CPUs' masks overlap.
            Self::PerCpu => format!(
                "SELECT {NODE} AS nd, {col} AS col, bs, iss, ls, mpk AS upk, \
                 toUInt64(length(bitmaskToArray(mask)) * {SEC}) AS usat, msp AS usp FROM \
                 (SELECT {NODE}, {MINUTE}, toUInt64(sum(b)) AS bs, toUInt64(sum(i)) AS iss, toUInt64(sum(l)) AS ls, \
                 toUInt64(max(sp)) AS msp, max(pk) AS mpk, groupBitOr(sm) AS mask FROM \
                 (SELECT {NODE}, {MINUTE}, {CPU}, sumMerge(busy_ticks) AS b, sumMerge(idle_ticks) AS i, \
                 sumMerge(lost_ticks) AS l, sumMerge(span_ns) AS sp, toFloat64(maxMerge(peak)) AS pk, \
                 groupBitOrMerge(saturated) AS sm FROM {} WHERE {MINUTE} >= {} AND {MINUTE} < {}{nodes} \
                 GROUP BY {NODE}, {MINUTE}, {CPU}) GROUP BY {NODE}, {MINUTE})",
                fleet.table(CPU_1M),
                m.from_ns,
                m.to_ns
            ),
            // Each row's own figures, summed into the columns once by the caller (grouping
            // 1.44 M node-minutes first to OR their masks took 3 times as long, grouping per
            // column here too 1.5 times): its saturated seconds counted on their own, as a
            // minute's rows not merged yet come from different batches, which hold different
            // seconds. A batch sent twice counts its seconds twice until the table merges it,
            // as its ticks and spans are summed twice.
            Self::PerNode => format!(
                "SELECT {NODE} AS nd, {col} AS col, toUInt64(finalizeAggregation(busy_ticks)) AS bs, \
                 toUInt64(finalizeAggregation(idle_ticks)) AS iss, toUInt64(finalizeAggregation(lost_ticks)) AS ls, \
                 toFloat64(finalizeAggregation(peak)) AS upk, \
                 toUInt64(length(bitmaskToArray(finalizeAggregation(saturated))) * {SEC}) AS usat, \
                 toUInt64(finalizeAggregation(span_ns)) AS usp FROM {} WHERE {MINUTE} >= {} AND {MINUTE} < {}{nodes}",
                fleet.table(CPU_NODE_1M),
                m.from_ns,
                m.to_ns
            ),
        }
    }
}

/// `profiler fleet`'s CPU figures in one scan: per node and column of `parts` (columns of whole
/// minutes when `s` has minutes), `nd, c, b, i, l, pk, sat, span`: busy, idle and lost ticks,
/// the busiest CPU block's share, ns with a CPU at least `saturated_tenths` busy, ns covered.
/// The grid is these cells; a node's figures are their sums (and the peak's max). Raw blocks sent
/// twice count once (`max` per block); the whole minutes from `by`'s rollup, whose saturated
/// seconds are whole seconds.
pub fn node_cells(parts: &Parts<'_>, s: &Split, saturated_tenths: u64, by: NodeMinutes) -> String {
    let col = |ts: &str| format!("intDiv({ts} - {}, {})", parts.start_ns, parts.bucket_ns);
    let mut units = Vec::new();
    for w in &s.raw {
        units.push(format!(
            "SELECT {NODE} AS nd, {} AS col, bs, iss, ls, peak AS upk, toUInt64(if(sat, span_ns, 0)) AS usat, \
             toUInt64(span_ns) AS usp FROM \
             (SELECT {NODE}, {TS}, max(sp) AS span_ns, toUInt64(sum(b)) AS bs, toUInt64(sum(i)) AS iss, toUInt64(sum(l)) AS ls, \
             toFloat64(max(if(t = 0, toFloat64(0), b / t))) AS peak, \
             max(t > 0 AND b * 10 >= t * {saturated_tenths}) AS sat FROM \
             (SELECT {NODE}, {TS}, {CPU}, sp, b, i, l, {} AS t FROM \
             (SELECT {NODE}, {TS}, {CPU}, max({SPAN}) AS sp, max({BUSY}) AS b, max({}) AS i, max({LOST}) AS l, \
             max({HZ}) AS h FROM {} WHERE {TS} >= {} AND {TS} < {}{} GROUP BY {NODE}, {TS}, {CPU})) GROUP BY {NODE}, {TS})",
            col(TS),
            track_rollups::block_ticks("b", "i", "l", "h", "sp"),
            super::minutes::raw_idle(),
            parts.fleet.table(crate::ship::clickhouse::schema::CPU_SECONDS),
            w.from_ns,
            w.to_ns,
            parts.nodes
        ));
    }
    if let Some(m) = s.minutes {
        units.push(by.units(parts.fleet, &col(MINUTE), m, &parts.nodes));
    }
    format!(
        "SELECT nd, toUInt32(col) AS c, toUInt64(sum(bs)), toUInt64(sum(iss)), toUInt64(sum(ls)), toFloat64(max(upk)), \
         toUInt64(sum(usat)), toUInt64(sum(usp)) FROM ({}) GROUP BY nd, c",
        units.join(" UNION ALL ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_per_node_rollup_is_read_without_its_cpus() {
        let fleet = Fleet::new("http://h:1", "p").unwrap();
        let parts = Parts { fleet: &fleet, start_ns: 0, bucket_ns: 300 * SEC, nodes: " AND node IN ('a')".into() };
        let s = Split::new(Window { from_ns: 30 * SEC, to_ns: 600 * SEC }, Some(0));
        let q = node_cells(&parts, &s, 9, NodeMinutes::PerNode);
        // The raw edge, each block once; the minutes from the per-node rollup, without CPUs.
        assert!(q.contains("FROM `p`.`cpu_seconds` WHERE ts >= 30000000000 AND ts < 60000000000 AND node IN ('a') GROUP BY node, ts, cpu"), "{q}");
        assert!(
            q.ends_with(
                "FROM `p`.`cpu_node_1m` WHERE minute >= 60000000000 AND minute < 600000000000 AND node IN ('a')) \
                 GROUP BY nd, c"
            ),
            "{q}"
        );
        assert!(q.contains("intDiv(minute - 0, 300000000000) AS col") && q.ends_with("GROUP BY nd, c"), "{q}");
        assert!(!q.contains("GROUP BY node, minute"), "{q}");
        let per_cpu = node_cells(&parts, &s, 9, NodeMinutes::PerCpu);
        assert!(
            per_cpu.contains("FROM `p`.`cpu_1m` WHERE") && per_cpu.contains("GROUP BY node, minute, cpu)"),
            "{per_cpu}"
        );
        // The fleet page's cells of the `busy` measure: each node's CPUs as one.
        let cells = parts.cpu_cells_from(&s.clone().into(), true, NodeMinutes::PerNode.table(), true);
        assert!(
            cells.contains("emptyArrayUInt64(), toUInt16(0))") && cells.contains("FROM `p`.`cpu_node_1m`"),
            "{cells}"
        );
        let per_cpu = parts.cpu_cells_from(&s.clone().into(), true, NodeMinutes::PerCpu.table(), false);
        assert!(per_cpu.contains("emptyArrayUInt64(), cpu), toUInt64(finalizeAggregation(busy_ticks)))"), "{per_cpu}");
    }
}
