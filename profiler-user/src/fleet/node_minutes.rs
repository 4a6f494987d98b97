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

use super::{Fleet, FleetError, minutes};
use crate::{
    query::Window,
    ship::clickhouse::{
        schema::col::*,
        track_rollups::{CPU_1M, CPU_NODE_1M, MINUTE},
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
    pub fn split(fleet: &Fleet, w: Window) -> Result<(minutes::Split, Self), FleetError> {
        let per_cpu = minutes::whole_from(fleet, CPU_1M, w)?;
        let per_node = minutes::whole_from(fleet, CPU_NODE_1M, w)?;
        Ok(match (per_node, per_cpu) {
            (Some(n), Some(c)) if n > c => (minutes::Split::new(w, Some(c)), Self::PerCpu),
            (Some(n), _) => (minutes::Split::new(w, Some(n)), Self::PerNode),
            (None, c) => (minutes::Split::new(w, c), Self::PerCpu),
        })
    }

    /// Per node over the whole minutes `m`: `nd, pb, pi, pl, pp, psat, pspan` (busy, idle, lost
    /// ticks, the busiest block's share, ns with a CPU at least 90 % busy, ns covered). Each
    /// minute's saturated seconds are its CPUs' masks OR-ed, counted in whole seconds.
    pub fn busy(self, fleet: &Fleet, m: Window, nodes: &str) -> String {
        let per_minute = match self {
            // The CPUs' sums, the longest CPU's spans (every CPU is in every block), the
            // saturated seconds of any CPU.
            Self::PerCpu => format!(
                "SELECT {NODE}, {MINUTE}, toUInt64(sum(b)) AS bs, toUInt64(sum(i)) AS iss, toUInt64(sum(l)) AS ls, \
                 max(sp) AS span, max(pk) AS peak, groupBitOr(sm) AS mask FROM \
                 (SELECT {NODE}, {MINUTE}, {CPU}, sumMerge(busy_ticks) AS b, sumMerge(idle_ticks) AS i, \
                 sumMerge(lost_ticks) AS l, sumMerge(span_ns) AS sp, toFloat64(maxMerge(peak)) AS pk, \
                 groupBitOrMerge(saturated) AS sm FROM {} WHERE {MINUTE} >= {} AND {MINUTE} < {}{nodes} \
                 GROUP BY {NODE}, {MINUTE}, {CPU}) GROUP BY {NODE}, {MINUTE}",
                fleet.table(CPU_1M),
                m.from_ns,
                m.to_ns
            ),
            Self::PerNode => format!(
                "SELECT {NODE}, {MINUTE}, toUInt64(sumMerge(busy_ticks)) AS bs, toUInt64(sumMerge(idle_ticks)) AS iss, \
                 toUInt64(sumMerge(lost_ticks)) AS ls, sumMerge(span_ns) AS span, toFloat64(maxMerge(peak)) AS pk, \
                 groupBitOrMerge(saturated) AS mask FROM {} WHERE {MINUTE} >= {} AND {MINUTE} < {}{nodes} \
                 GROUP BY {NODE}, {MINUTE}",
                fleet.table(CPU_NODE_1M),
                m.from_ns,
                m.to_ns
            ),
        };
        let peak = if self == Self::PerCpu { "peak" } else { "pk" };
        format!(
            "SELECT {NODE} AS nd, sum(bs) AS pb, sum(iss) AS pi, sum(ls) AS pl, max({peak}) AS pp, \
             toUInt64(sum(length(bitmaskToArray(mask))) * {SEC}) AS psat, toUInt64(sum(span)) AS pspan FROM \
             ({per_minute}) GROUP BY {NODE}"
        )
    }

    /// Per node and column over the whole minutes `m`: `nd, col, cp, pb, pi` (busy and idle
    /// ticks; `cp` 0 from the per-node rollup), `col` the column of `minute` as `col` makes it.
    pub fn cells(self, fleet: &Fleet, col: &dyn Fn(&str) -> String, m: Window, nodes: &str) -> String {
        let cpu = match self {
            Self::PerCpu => CPU.to_string(),
            Self::PerNode => "toUInt16(0)".to_string(),
        };
        format!(
            "SELECT {NODE} AS nd, {} AS col, {cpu} AS cp, toUInt64(sumMerge(busy_ticks)) AS pb, \
             toUInt64(sumMerge(idle_ticks)) AS pi FROM {} WHERE {MINUTE} >= {} AND {MINUTE} < {}{nodes} GROUP BY nd, col, cp",
            col(MINUTE),
            fleet.table(self.table()),
            m.from_ns,
            m.to_ns
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_per_node_rollup_is_read_without_its_cpus() {
        let fleet = Fleet::new("http://h:1", "p").unwrap();
        let m = Window { from_ns: 60 * SEC, to_ns: 600 * SEC };
        let busy = NodeMinutes::PerNode.busy(&fleet, m, " AND node IN ('a')");
        assert!(
            busy.contains(
                "FROM `p`.`cpu_node_1m` WHERE minute >= 60000000000 AND minute < 600000000000 AND node IN ('a') \
                 GROUP BY node, minute)"
            ),
            "{busy}"
        );
        assert!(!busy.contains("GROUP BY node, minute, cpu"), "{busy}");
        let per_cpu = NodeMinutes::PerCpu.busy(&fleet, m, "");
        assert!(per_cpu.contains("FROM `p`.`cpu_1m` WHERE") && per_cpu.contains("GROUP BY node, minute, cpu)"), "{per_cpu}");
        let col = |ts: &str| format!("intDiv({ts} - 0, 60000000000)");
        let cells = NodeMinutes::PerNode.cells(&fleet, &col, m, "");
        assert!(cells.contains("toUInt16(0) AS cp") && cells.contains("FROM `p`.`cpu_node_1m`"), "{cells}");
        assert!(NodeMinutes::PerCpu.cells(&fleet, &col, m, "").contains("cpu AS cp"));
    }
}
