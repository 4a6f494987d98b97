//! The SQL of the fleet page ([`super::board`]), built apart from sending it (tested without a
//! server). Every query aggregates in the server and answers a bounded number of rows: one per
//! node for the ranking, one per (row, column) for the cells of the rows shown, whatever the
//! fleet's size. A row of the page is a node or a group of nodes; which node is in which row
//! goes into the SQL as `transform(node, [names], [rows], '')`, so the server sums each group.
//!
//! Runs on ClickHouse 18.16 and current servers: no newer functions, no alias that shadows a
//! column, integer and float results cast to what the decoder reads.

use super::Fleet;
use crate::{
    query::Window,
    ship::clickhouse::schema::{self, col::*, quote_str},
};

const SEC: u64 = 1_000_000_000;

/// The GPU utilisation tracks (`gpu.N.util`, percent; `gpu::nvml::poll`), as an RE2 pattern.
pub const GPU_UTIL_TRACK: &str = "^gpu\\.[0-9]+\\.util$";

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

/// The page's SQL for one window, in columns of `bucket_ns` from the window's start.
pub struct BoardSql<'a> {
    pub fleet: &'a Fleet,
    pub window: Window,
    pub bucket_ns: u64,
}

impl BoardSql<'_> {
    fn range(&self, rows: &Rows) -> String {
        format!("{TS} >= {} AND {TS} < {}{}", self.window.from_ns, self.window.to_ns, rows.filter())
    }

    /// Per node, column and CPU: busy and idle ticks (a retried batch's copies counted once).
    /// Rows of groups (hundreds of nodes each) are summed without that dedup, as the ranking
    /// is ([`BoardSql::cpu_scores`]): a re-sent block repeats its busy and idle, shares hold.
    fn cpu_cells(&self, rows: &Rows) -> String {
        if let Rows::Grouped(_) = rows {
            return format!(
                "SELECT {NODE} AS nd, intDiv({TS} - {}, {}) AS col, {CPU} AS cp, sum({BUSY}) AS sb, sum({IDLE}) AS si \
                 FROM {} WHERE {} GROUP BY nd, col, cp",
                self.window.from_ns,
                self.bucket_ns,
                self.fleet.table(schema::CPU_SECONDS),
                self.range(rows)
            );
        }
        format!(
            "SELECT nd, col, sum(b) AS sb, sum(i) AS si FROM (SELECT {NODE} AS nd, intDiv({TS} - {}, {}) AS col, \
             {CPU} AS cp, max({BUSY}) AS b, max({IDLE}) AS i FROM {} WHERE {} GROUP BY {NODE}, {TS}, {CPU}) \
             GROUP BY nd, col, cp",
            self.window.from_ns,
            self.bucket_ns,
            self.fleet.table(schema::CPU_SECONDS),
            self.range(rows)
        )
    }

    /// Per node: the busiest CPU's share in any column, busy ticks, idle ticks. For the ranking
    /// only, over every node: summed without the per-block dedup the cells get (a retried batch
    /// sends a block's busy and idle again, so its shares hold; the fleet's millions of blocks
    /// are not grouped one by one).
    pub fn cpu_scores(&self, rows: &Rows) -> String {
        format!(
            "SELECT nd, toFloat64(max(if(sb + si > 0, sb / (sb + si), 0))), toUInt64(sum(sb)), toUInt64(sum(si)) \
             FROM (SELECT {NODE} AS nd, intDiv({TS} - {}, {}) AS col, {CPU} AS cp, sum({BUSY}) AS sb, sum({IDLE}) AS si \
             FROM {} WHERE {} GROUP BY nd, col, cp) GROUP BY nd",
            self.window.from_ns,
            self.bucket_ns,
            self.fleet.table(schema::CPU_SECONDS),
            self.range(rows)
        )
    }

    /// Per row and column: the busiest CPU's share (max over the row's nodes and their CPUs),
    /// busy ticks, idle ticks.
    pub fn cpu_grid(&self, rows: &Rows) -> String {
        format!(
            "SELECT {} AS rk, toUInt32(col) AS c, toFloat64(max(if(sb + si > 0, sb / (sb + si), 0))), \
             toUInt64(sum(sb)), toUInt64(sum(si)) FROM ({}) GROUP BY rk, c",
            rows.key(),
            self.cpu_cells(rows)
        )
    }

    /// Per node, GPU and second: its first time, mean utilisation (percent) and the share of
    /// its readings below `idle_below` percent (re-sent rows repeat every reading: shares hold).
    fn gpu_seconds(&self, rows: &Rows, idle_below: f64) -> String {
        format!(
            "SELECT {NODE} AS nd, {NAME} AS nm, intDiv({TS}, {SEC}) AS sec, min({TS}) AS t0, avg({VALUE}) AS u, \
             countIf({VALUE} < {idle_below}) / count() AS idf FROM {} WHERE {} AND {CPU} = -1 \
             AND match({NAME}, {}) GROUP BY nd, nm, sec",
            self.fleet.table(schema::COUNTERS),
            self.range(rows),
            quote_str(GPU_UTIL_TRACK)
        )
    }

    /// Per node: GPU-seconds read (`uniq`: approximate past a few thousand), their utilisation
    /// summed (percent) and those idle, from the readings' mean and idle share, and its GPUs.
    /// For the ranking only: one pass over the readings, no group per GPU-second.
    pub fn gpu_scores(&self, rows: &Rows, idle_below: f64) -> String {
        format!(
            "SELECT nd, toUInt64(s), toFloat64(u / n * s), toFloat64(i / n * s), toUInt64(g) FROM (SELECT {NODE} AS nd, \
             count() AS n, sum({VALUE}) AS u, countIf({VALUE} < {idle_below}) AS i, uniq({NAME}, intDiv({TS}, {SEC})) AS s, \
             uniqExact({NAME}) AS g FROM {} WHERE {} AND {CPU} = -1 AND match({NAME}, {}) GROUP BY {NODE})",
            self.fleet.table(schema::COUNTERS),
            self.range(rows),
            quote_str(GPU_UTIL_TRACK)
        )
    }

    /// Per row and column: GPU-seconds read, their utilisation summed, GPU-seconds idle. Rows of
    /// groups count readings instead of GPU-seconds (one pass, no group per GPU-second): the
    /// cell's shares are then the readings' shares.
    pub fn gpu_grid(&self, rows: &Rows, idle_below: f64) -> String {
        if let Rows::Grouped(_) = rows {
            return format!(
                "SELECT {} AS rk, toUInt32(intDiv(tt - {}, {})) AS c, toUInt64(count()), toFloat64(sum(v)), \
                 toFloat64(countIf(v < {idle_below})) FROM (SELECT {NODE} AS nd, {TS} AS tt, {VALUE} AS v FROM {} \
                 WHERE {} AND {CPU} = -1 AND match({NAME}, {})) GROUP BY rk, c",
                rows.key(),
                self.window.from_ns,
                self.bucket_ns,
                self.fleet.table(schema::COUNTERS),
                self.range(rows),
                quote_str(GPU_UTIL_TRACK)
            );
        }
        format!(
            "SELECT {} AS rk, toUInt32(intDiv(t0 - {}, {})) AS c, toUInt64(count()), toFloat64(sum(u)), \
             toFloat64(sum(idf)) FROM ({}) GROUP BY rk, c",
            rows.key(),
            self.window.from_ns,
            self.bucket_ns,
            self.gpu_seconds(rows, idle_below)
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

    fn sql(fleet: &Fleet) -> BoardSql<'_> {
        BoardSql { fleet, window: Window::new(1000 * SEC, 1600 * SEC).unwrap(), bucket_ns: 10 * SEC }
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
        let grid = s.cpu_grid(&Rows::Nodes(vec!["n1".into()]));
        assert!(grid.contains("intDiv(ts - 1000000000000, 10000000000) AS col"), "{grid}");
        assert!(grid.contains("max(busy) AS b, max(idle) AS i FROM `p`.`cpu_seconds` WHERE ts >= 1000000000000 AND ts < 1600000000000 AND node IN ('n1') GROUP BY node, ts, cpu"), "{grid}");
        assert!(grid.ends_with("GROUP BY rk, c"), "{grid}");
        assert!(s.cpu_scores(&Rows::EachNode).contains("sum(busy) AS sb, sum(idle) AS si FROM `p`.`cpu_seconds` WHERE ts >= 1000000000000 AND ts < 1600000000000 GROUP BY nd, col, cp) GROUP BY nd"));
        let gpu = s.gpu_grid(&Rows::EachNode, 50.0);
        assert!(gpu.contains("countIf(value < 50) / count() AS idf FROM `p`.`counters` WHERE ts >= 1000000000000 AND ts < 1600000000000 AND cpu = -1 AND match(name, '^gpu\\\\.[0-9]+\\\\.util$')"), "{gpu}");
        assert!(gpu.contains("toUInt32(intDiv(t0 - 1000000000000, 10000000000)) AS c"), "{gpu}");
        let ns = s.namespaces(&[("samples_1m", Window::new(1020 * SEC, 1560 * SEC).unwrap()), ("samples", s.window)]);
        assert!(ns.contains("FROM `p`.`samples_1m` WHERE ts >= 1020000000000 AND ts < 1560000000000 AND workload != '' UNION ALL SELECT"), "{ns}");
        assert!(ns.starts_with("SELECT nd, argMax(ns, total) FROM"), "{ns}");
    }
}
