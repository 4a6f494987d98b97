//! The SQL of the fleet page ([`super::board`]), built apart from sending it (tested without a
//! server). Every query aggregates in the server and answers a bounded number of rows: one per
//! node for the ranking, one per (row, column) for the cells of the rows shown, whatever the
//! fleet's size. A row of the page is a node or a group of nodes; which node is in which row
//! goes into the SQL as `transform(node, [names], [rows], '')`, so the server sums each group.
//!
//! Runs on ClickHouse 18.16 and current servers: no newer functions, no alias that shadows a
//! column, integer and float results cast to what the decoder reads.

use super::{
    Fleet,
    minutes::{MOST_TICKS, PEAK_SHARE, Parts, Split, Tiers},
    node_minutes::NodeMinutes,
};
use crate::{
    query::Window,
    ship::clickhouse::{
        schema::{col::*, quote_str},
        track_rollups::CPU_1M,
    },
};

/// The GPU utilisation tracks (`gpu.N.util`, percent; `gpu::nvml::poll`), as an RE2 pattern.
pub use crate::ship::clickhouse::track_rollups::GPU_UTIL_TRACK;

/// How the nodes of a query are chosen and keyed into rows.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Rows {
    /// Every node, each its own row (the ranking queries).
    #[default]
    EachNode,
    /// These nodes, each its own row.
    Nodes(Vec<String>),
    /// These nodes, each in the row named beside it: `(node, row)`.
    Grouped(Vec<(String, String)>),
}

impl Rows {
    /// ` AND node IN (...)`, or nothing for every node.
    fn filter(&self) -> String {
        let names: Vec<String> = match self {
            Rows::EachNode => return String::new(),
            Rows::Nodes(n) => n.iter().map(|n| quote_str(n)).collect(),
            Rows::Grouped(g) => g.iter().map(|(n, _)| quote_str(n)).collect(),
        };
        if names.is_empty() {
            // No node at all: a condition nothing meets (not `IN ()`, a syntax error).
            return " AND 0".into();
        }
        format!(" AND {NODE} IN ({})", names.join(", "))
    }

    /// The row of a node named by the column `nd`.
    fn key(&self) -> String {
        match self {
            Rows::Grouped(g) => {
                let from: Vec<String> = g.iter().map(|(n, _)| quote_str(n)).collect();
                let to: Vec<String> = g.iter().map(|(_, r)| quote_str(r)).collect();
                format!("transform(nd, [{}], [{}], '')", from.join(", "), to.join(", "))
            }
            _ => "nd".into(),
        }
    }
}

/// The page's SQL for one window, in columns of `bucket_ns` from `start_ns`; the per-CPU counts
/// and GPU readings from the minute rollups where `cpu` and `gpu` say ([`super::minutes`]).
pub struct BoardSql<'a> {
    pub fleet: &'a Fleet,
    pub window: Window,
    pub bucket_ns: u64,
    /// Column 0's start ([`super::minutes::aligned_start`]).
    pub start_ns: u64,
    /// The per-CPU cells' tiers: `cpu_5m`'s five minutes (per-CPU cells only), the minutes of
    /// [`Self::cpu_minutes`], raw rows.
    pub cpu: Tiers,
    /// The minute rollup of [`Self::cpu`]: per node for the `busy` measure, whose cells sum
    /// each node's CPUs (their `peak` is then the node's share, not its busiest CPU's).
    pub cpu_minutes: NodeMinutes,
    pub gpu: Split,
    /// Where the ranking over every node reads ([`Tiers`]: hourly rollups first).
    pub rank: Tiers,
}

impl<'a> BoardSql<'a> {
    /// Columns from the window's start, every row raw.
    pub fn raw(fleet: &'a Fleet, window: Window, bucket_ns: u64) -> Self {
        let (cpu, gpu, rank) = (Tiers::raw(window), Split::raw(window), Tiers::raw(window));
        let cpu_minutes = NodeMinutes::PerCpu;
        Self { fleet, window, bucket_ns, start_ns: window.from_ns, cpu, cpu_minutes, gpu, rank }
    }
}

impl BoardSql<'_> {
    fn parts(&self, rows: &Rows) -> Parts<'_> {
        Parts { fleet: self.fleet, start_ns: self.start_ns, bucket_ns: self.bucket_ns, nodes: rows.filter() }
    }

    /// Per node, column and CPU: busy and idle ticks (a retried batch's copies counted once).
    /// Rows of groups (hundreds of nodes each) are summed without that dedup, as the ranking
    /// is ([`BoardSql::cpu_scores`]): a re-sent block repeats its busy and idle, shares hold.
    fn cpu_cells(&self, rows: &Rows, spans: bool) -> String {
        self.parts(rows).cpu_cells_from(&self.cpu, !matches!(rows, Rows::Grouped(_)), self.cpu_minutes.table(), spans)
    }

    /// Per node: the busiest CPU's share in any column (in any clock hour where `rank` has
    /// whole hours: a day of a fleet's columns is too many rows), busy ticks, idle ticks. For the
    /// ranking only, over every node: summed without the per-block dedup the cells get (a
    /// retried batch sends a block's busy and idle again, so its shares hold; the fleet's
    /// millions of blocks are not grouped one by one).
    pub fn cpu_scores(&self, rows: &Rows) -> String {
        if self.rank.hours.is_some() {
            return self.parts(rows).cpu_ranking(&self.rank);
        }
        format!(
            "SELECT nd, toFloat64(max({PEAK_SHARE})), toUInt64(sum(arraySum(sb))), toUInt64(sum(arraySum(si))), \
             toUInt64(sum({MOST_TICKS})) FROM ({}) GROUP BY nd",
            self.parts(rows).cpu_cells_from(&self.cpu, false, CPU_1M, false)
        )
    }

    /// Per row and column: the busiest CPU's share (max over the row's nodes and their CPUs),
    /// busy ticks, idle ticks. `ticks`: per node its CPUs x Hz, to count as idle the ticks a
    /// cell's seconds should have had and did not (a CPU whose idle takes no cpu-clock ticks, as
    /// on some VMs, would read the node busier than it was): what the mean busy share needs.
    pub fn cpu_grid(&self, rows: &Rows, ticks: Option<&[(String, u64)]>) -> String {
        let idle = match ticks {
            Some(t) => {
                let (names, k): (Vec<String>, Vec<String>) =
                    t.iter().map(|(n, k)| (quote_str(n), k.to_string())).unzip();
                format!(
                    "toUInt64(sum(greatest(arraySum(sb) + arraySum(si), intDiv(arrayReduce('max', ssp) * \
                     transform(nd, [{}], [{}], toUInt64(0)), 1000000000))) - sum(arraySum(sb)))",
                    names.join(", "),
                    k.join(", ")
                )
            }
            None => "toUInt64(sum(arraySum(si)))".into(),
        };
        format!(
            "SELECT {} AS rk, toUInt32(col) AS c, toFloat64(max({PEAK_SHARE})) AS cpk, \
             toUInt64(sum(arraySum(sb))) AS cb, {idle} AS ci FROM ({}) GROUP BY rk, c",
            rows.key(),
            self.cpu_cells(rows, ticks.is_some())
        )
    }

    /// Per node: GPU-seconds read (`uniq` over raw rows: approximate past a few thousand; the
    /// rollup's seconds), their utilisation summed (percent) and those idle, from the readings'
    /// mean and idle share, and its GPUs. Re-sent rows repeat every reading: shares hold.
    pub fn gpu_scores(&self, rows: &Rows, idle_below: f64) -> String {
        format!(
            "SELECT nd, toUInt64(s), toFloat64(u / n * s), toFloat64(i / n * s), toUInt64(g) FROM ({})",
            self.parts(rows).gpu_nodes(&self.rank, idle_below)
        )
    }

    /// Per row and column: readings, their utilisation summed (percent), readings idle: the
    /// cell's shares are the readings' shares (a GPU reads at a steady rate).
    pub fn gpu_grid(&self, rows: &Rows, idle_below: f64) -> String {
        format!(
            "SELECT {} AS rk, toUInt32(col) AS c, toUInt64(sum(pn)), toFloat64(sum(pu)), toFloat64(sum(pi)) \
             FROM ({}) GROUP BY rk, c",
            rows.key(),
            self.parts(rows).gpu_cells(&self.gpu, idle_below)
        )
    }

    /// Per node, the pod namespace with the most samples in the window (nodes running no pod
    /// are left out), from `tables`: `(table, window)` parts, as [`super::rollup::plan`] cuts them.
    pub fn namespaces(&self, tables: &[(&str, Window)]) -> String {
        let parts: Vec<String> = tables
            .iter()
            .map(|(t, w)| {
                format!(
                    "SELECT {NODE} AS nd, visitParamExtractString({WORKLOAD}, 'pod_namespace') AS ns, \
                     toUInt64({COUNT}) AS n FROM {} WHERE {TS} >= {} AND {TS} < {} AND {WORKLOAD} != ''",
                    self.fleet.table(t),
                    w.from_ns,
                    w.to_ns
                )
            })
            .collect();
        format!(
            "SELECT nd, argMax(ns, total) FROM (SELECT nd, ns, sum(n) AS total FROM ({}) WHERE ns != '' \
             GROUP BY nd, ns) GROUP BY nd",
            parts.join(" UNION ALL ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    fn sql(fleet: &Fleet) -> BoardSql<'_> {
        BoardSql::raw(fleet, Window::new(1000 * SEC, 1600 * SEC).unwrap(), 10 * SEC)
    }

    #[test]
    fn rows_are_chosen_and_keyed_in_quoted_sql() {
        assert_eq!(Rows::EachNode.filter(), "");
        assert_eq!(Rows::Nodes(vec![]).filter(), " AND 0");
        assert_eq!(Rows::Nodes(vec!["a'b".into()]).filter(), " AND node IN ('a\\'b')");
        let g = Rows::Grouped(vec![("n1".into(), "pool 'x".into()), ("n2".into(), "pool 'x".into())]);
        assert_eq!(g.filter(), " AND node IN ('n1', 'n2')");
        assert_eq!(g.key(), "transform(nd, ['n1', 'n2'], ['pool \\'x', 'pool \\'x'], '')");
        assert_eq!(Rows::Nodes(vec!["n1".into()]).key(), "nd");
    }

    #[test]
    fn cells_fall_in_columns_of_the_window_and_each_cpu_block_counts_once() {
        let fleet = Fleet::new("http://h:1", "p").unwrap();
        let s = sql(&fleet);
        let grid = s.cpu_grid(&Rows::Nodes(vec!["n1".into()]), None);
        assert!(grid.contains("intDiv(ts - 1000000000000, 10000000000) AS col"), "{grid}");
        assert!(grid.contains("toUInt64(max(busy)) AS pb, toUInt64(max(toUInt64(greatest(toUInt64(busy) + idle + lost, intDiv(toUInt64(hz) * span, 1000000000)) - toUInt64(busy) - lost))) AS pi, toUInt64(max(span)) AS ps FROM `p`.`cpu_seconds` WHERE ts >= 1000000000000 AND ts < 1600000000000 AND node IN ('n1') GROUP BY node, ts, cpu"), "{grid}");
        assert!(grid.ends_with("GROUP BY rk, c") && !grid.contains("ssp"), "{grid}");
        // The mean's idle: the ticks each node's CPUs x Hz give its seconds covered, at least.
        let busy = s.cpu_grid(&Rows::Nodes(vec!["n1".into()]), Some(&[("n1".into(), 16 * 99)]));
        assert!(busy.contains("arrayReduce('max', ssp) * transform(nd, ['n1'], [1584], toUInt64(0))"), "{busy}");
        assert!(busy.contains("sumForEach(asp) AS ssp"), "{busy}");
        assert!(s.cpu_scores(&Rows::EachNode).contains("toUInt64(sum(busy)) AS pb, toUInt64(sum(toUInt64(greatest(toUInt64(busy) + idle + lost, intDiv(toUInt64(hz) * span, 1000000000)) - toUInt64(busy) - lost))) AS pi, toUInt64(sum(span)) AS ps FROM `p`.`cpu_seconds` WHERE ts >= 1000000000000 AND ts < 1600000000000 GROUP BY nd, col, cp"));
        let gpu = s.gpu_grid(&Rows::EachNode, 50.0);
        assert!(gpu.contains("toUInt64(countIf(value < 50)) AS pi"), "{gpu}");
        assert!(gpu.contains("FROM `p`.`counters` WHERE ts >= 1000000000000 AND ts < 1600000000000 AND cpu = -1 AND match(name, '^gpu\\\\.[0-9]+\\\\.util$')"), "{gpu}");
        // Whole minutes from the rollups.
        let w = Window::new(1020 * SEC, 1560 * SEC).unwrap();
        let rank = Tiers::new(s.window, None, Some(0));
        let rolled = BoardSql {
            cpu: Split::new(s.window, Some(0)).into(),
            gpu: Split::new(s.window, Some(0)),
            rank,
            ..sql(&fleet)
        };
        assert_eq!(rolled.cpu.minutes, vec![w]);
        assert!(
            rolled
                .cpu_scores(&Rows::EachNode)
                .contains("FROM `p`.`cpu_1m` WHERE minute >= 1020000000000 AND minute < 1560000000000")
        );
        assert!(
            rolled.gpu_grid(&Rows::EachNode, 50.0).contains("FROM `p`.`gpu_util_1m` WHERE minute >= 1020000000000")
        );
        let ns = s.namespaces(&[("samples_1m", Window::new(1020 * SEC, 1560 * SEC).unwrap()), ("samples", s.window)]);
        assert!(ns.contains("FROM `p`.`samples_1m` WHERE ts >= 1020000000000 AND ts < 1560000000000 AND workload != '' UNION ALL SELECT"), "{ns}");
        assert!(ns.starts_with("SELECT nd, argMax(ns, total) FROM"), "{ns}");
    }
}
