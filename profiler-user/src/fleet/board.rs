//! The fleet page's answer (`/api/fleet`, docs/clickhouse.md "The fleet page"): a nodes x time
//! grid coloured by a measure, and the fleet's findings grouped by signature
//! ([`super::signatures`]). Readable at any fleet size: at most `rows` rows, each a node or a
//! group of nodes (the pod namespace with the most samples on the node, or the node's pool),
//! the worst first by the measure, and how many more rows and nodes there are.
//!
//! Measures, all summed by the server ([`super::board_sql`]):
//! - `peak-cpu`: per cell, the busiest CPU's share (its busy ticks over the most ticks a CPU
//!   of its node had in the cell, the max over the row's nodes): one saturated core under a
//!   healthy average,
//!   the zombie signature, shows; rows rank by it (by the busiest CPU's share in a clock hour
//!   over a window's whole hours, from `cpu_1h`);
//! - `busy`: per cell, the share of all the row's CPUs busy: busy ticks over the ticks the
//!   nodes' CPUs x Hz give the seconds covered, where the nodes counted fewer (a CPU whose idle
//!   takes no cpu-clock ticks, as on some VMs, would read busier than it was);
//! - `gpu-util`: per cell, the mean of the `gpu.N.util` tracks (percent of the time a kernel ran);
//! - `gpu-idle`: per cell, the share of GPU-time below the detectors' idle line
//!   ([`crate::detect::thresholds`]' `gpu_idle_below`), with the `gpu-*` finding covering most
//!   of it as its cause. Rows rank by GPU-hours idle.
//!
//! Pools: nodes ship no labels, so a node's pool is its name's first DNS label without its
//! trailing number (`gpu-a100-017` and `gpu-a100-018` are pool `gpu-a100`; [`pool_of`]).

use std::{
    cmp::Ordering,
    collections::{BTreeMap, HashMap},
};

use serde::Serialize;

use super::{
    Fleet, FleetError, Selection,
    board_sql::{BoardSql, Rows},
    minutes,
    node_minutes::NodeMinutes,
    overview::choose_bucket,
    rollup::{self, Coverage},
    signatures::{self, Signature},
};
use crate::{query::Window, ship::clickhouse::schema::quote_str};

const SEC: u64 = 1_000_000_000;
/// Most rows an answer has.
pub const MAX_ROWS: usize = 200;
/// The row of nodes running no pod, when rows are namespaces.
pub const NO_POD: &str = "(no pod)";
/// Most `gpu-*` findings laid on the cells as causes.
const MAX_CAUSE_FINDINGS: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    PeakCpu,
    Busy,
    GpuUtil,
    GpuIdle,
}

impl Measure {
    pub const ALL: [Measure; 4] = [Measure::PeakCpu, Measure::Busy, Measure::GpuUtil, Measure::GpuIdle];

    pub fn name(self) -> &'static str {
        match self {
            Measure::PeakCpu => "peak-cpu",
            Measure::Busy => "busy",
            Measure::GpuUtil => "gpu-util",
            Measure::GpuIdle => "gpu-idle",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == s)
    }

    fn gpu(self) -> bool {
        matches!(self, Measure::GpuUtil | Measure::GpuIdle)
    }

    /// What a row's score counts.
    fn score_unit(self) -> &'static str {
        match self {
            Measure::GpuIdle => "GPU-hours idle",
            Measure::GpuUtil => "mean GPU utilisation",
            Measure::PeakCpu => "busiest CPU's share in a cell, or an hour over whole hours",
            Measure::Busy => "busy share",
        }
    }

    /// Whether score `a` is worse than `b` (shown first); rows without a score go last.
    pub fn worse(self, a: Option<f64>, b: Option<f64>) -> Ordering {
        match (a, b) {
            (Some(a), Some(b)) if self == Measure::GpuUtil => a.total_cmp(&b),
            (Some(a), Some(b)) => b.total_cmp(&a),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    Node,
    Namespace,
    Pool,
}

impl Group {
    pub const ALL: [Group; 3] = [Group::Node, Group::Namespace, Group::Pool];

    pub fn name(self) -> &'static str {
        match self {
            Group::Node => "node",
            Group::Namespace => "namespace",
            Group::Pool => "pool",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.name() == s)
    }
}

/// A node's pool: its name's first DNS label without the trailing number and separators
/// (`gpu-a100-017.ec2` is `gpu-a100`); a name that is all number is its own pool.
pub fn pool_of(node: &str) -> String {
    let label = node.split('.').next().unwrap_or(node);
    let pool = label.trim_end_matches(|c: char| c.is_ascii_digit()).trim_end_matches(['-', '_']);
    if pool.is_empty() { label.to_string() } else { pool.to_string() }
}

#[derive(Debug, Clone)]
pub struct Request {
    pub window: Window,
    /// Node names or globs; empty: the whole fleet.
    pub nodes: Vec<String>,
    pub measure: Measure,
    pub group: Group,
    pub rows: usize,
}

/// What the server summed for a node, or a row of nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tally {
    /// (the busiest CPU's share in any cell, or clock hour over whole hours, busy ticks, idle ticks)
    pub cpu: Option<(f64, u64, u64)>,
    /// (GPU-seconds read, their utilisation summed in percent, GPU-seconds idle)
    pub gpu: Option<(u64, f64, f64)>,
}

impl Tally {
    pub fn add(&mut self, o: &Tally) {
        if let Some((p, b, i)) = o.cpu {
            let (p0, b0, i0) = self.cpu.unwrap_or_default();
            self.cpu = Some((p0.max(p), b0 + b, i0 + i));
        }
        if let Some((n, u, idle)) = o.gpu {
            let (n0, u0, idle0) = self.gpu.unwrap_or_default();
            self.gpu = Some((n0 + n, u0 + u, idle0 + idle));
        }
    }

    /// The row's score: its value over the whole window (GPU-hours for `gpu-idle`).
    pub fn score(&self, m: Measure) -> Option<f64> {
        match m {
            Measure::PeakCpu => self.cpu.filter(|c| c.1 + c.2 > 0).map(|c| c.0),
            Measure::Busy => self.cpu.and_then(|(_, b, i)| share(b as f64, (b + i) as f64)),
            Measure::GpuUtil => self.gpu.and_then(|(n, u, _)| share(u / 100.0, n as f64)),
            Measure::GpuIdle => self.gpu.filter(|g| g.0 > 0).map(|g| g.2 / 3600.0),
        }
    }
}

fn share(part: f64, whole: f64) -> Option<f64> {
    (whole > 0.0).then(|| part / whole)
}

/// A row of the grid.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BoardRow {
    /// The node's name, or the group's.
    pub label: String,
    /// Its nodes, by name (the merged flamegraph's selection).
    pub nodes: Vec<String>,
    pub score: Option<f64>,
    /// Per column, the measure (a share, 0 to 1); `None` where the row has no data.
    pub values: Vec<Option<f64>>,
    /// `gpu-idle`: per column, the index in [`Board::causes`] of the finding kind covering
    /// most of the cell's time, if any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<Option<usize>>,
}

/// The answer, as `/api/fleet` gives it.
#[derive(Debug, Clone, Serialize)]
pub struct Board {
    pub from_ns: u64,
    pub to_ns: u64,
    pub measure: &'static str,
    pub group: &'static str,
    pub score_unit: &'static str,
    pub bucket_seconds: u64,
    pub columns: u64,
    /// Column `c` starts at `start_ns + c * bucket_seconds`.
    pub start_ns: u64,
    pub rows: Vec<BoardRow>,
    /// Rows not shown (the least bad), and their nodes.
    pub more_rows: u64,
    pub more_nodes: u64,
    /// Nodes with data for the measure in the window, and those without (GPU measures: nodes
    /// without GPU tracks too).
    pub nodes_with_data: u64,
    pub nodes_without_data: u64,
    pub causes: Vec<String>,
    pub findings: Vec<Signature>,
    /// The tables the ranking and the cells were read from (`ranking cpu_1h 23h 0m, cpu_1m 59m 0s,
    /// cpu_seconds 1m 0s; cells cpu_1m 23h 59m, cpu_seconds 1m 0s`).
    pub read_from: String,
}

/// A row chosen: its label, its nodes, what they summed.
pub type Chosen = (String, Vec<String>, Tally);

/// Rows: each node or group with its tally, worst first, cut at `limit`: the rows shown, and
/// (rows, nodes) left out.
pub fn choose_rows(
    tallies: &BTreeMap<String, Tally>,
    group_of: impl Fn(&str) -> String,
    measure: Measure,
    limit: usize,
) -> (Vec<Chosen>, u64, u64) {
    let mut groups: BTreeMap<String, (Vec<String>, Tally)> = BTreeMap::new();
    for (node, t) in tallies {
        if t.score(measure).is_none() {
            continue;
        }
        let g = groups.entry(group_of(node)).or_default();
        g.0.push(node.clone());
        g.1.add(t);
    }
    let mut rows: Vec<Chosen> = groups.into_iter().map(|(k, (n, t))| (k, n, t)).collect();
    rows.sort_by(|a, b| measure.worse(a.2.score(measure), b.2.score(measure)).then_with(|| a.0.cmp(&b.0)));
    let rest = rows.split_off(limit.min(rows.len()));
    let more_nodes = rest.iter().map(|r| r.1.len() as u64).sum();
    (rows, rest.len() as u64, more_nodes)
}

/// Lays `gpu-*` findings `(row, kind, from_ns, to_ns)` on the cells: per cell, the kind (index
/// in the returned list) that covers most of it.
pub fn causes(
    findings: &[(usize, String, u64, u64)],
    rows: usize,
    start_ns: u64,
    bucket_ns: u64,
    columns: usize,
) -> (Vec<String>, Vec<Vec<Option<usize>>>) {
    let mut kinds: Vec<String> = findings.iter().map(|f| f.1.clone()).collect();
    kinds.sort();
    kinds.dedup();
    let mut cover: HashMap<(usize, usize, usize), u64> = HashMap::new();
    for (row, kind, a, b) in findings {
        let k = kinds.binary_search(kind).unwrap_or(0);
        let first = (a.saturating_sub(start_ns) / bucket_ns) as usize;
        for col in first..columns {
            let (c0, c1) = (start_ns + col as u64 * bucket_ns, start_ns + (col as u64 + 1) * bucket_ns);
            if c0 >= *b {
                break;
            }
            let overlap = (*b).min(c1).saturating_sub((*a).max(c0));
            if overlap > 0 {
                *cover.entry((*row, col, k)).or_default() += overlap;
            }
        }
    }
    let mut out = vec![vec![None; columns]; rows];
    let mut best: HashMap<(usize, usize), (u64, usize)> = HashMap::new();
    for ((row, col, k), ns) in cover {
        let e = best.entry((row, col)).or_insert((0, usize::MAX));
        if ns > e.0 || (ns == e.0 && k < e.1) {
            *e = (ns, k);
        }
    }
    for ((row, col), (_, k)) in best {
        if let Some(cell) = out.get_mut(row).and_then(|r| r.get_mut(col)) {
            *cell = Some(k);
        }
    }
    (kinds, out)
}

/// Answers `req`.
pub fn board(fleet: &Fleet, req: &Request) -> Result<Board, FleetError> {
    let sel = fleet.select(&req.nodes)?;
    let (bucket, _) = choose_bucket(req.window);
    // Columns of whole minutes are whole columns: the rollups answer all of it.
    let w = minutes::whole_columns(req.window, bucket * SEC);
    // Columns of whole minutes start on their bucket, so the minute rollups answer them.
    let start_ns = minutes::aligned_start(w, bucket * SEC);
    let columns = (w.to_ns - start_ns).div_ceil(bucket * SEC);
    let names: Vec<String> = sel.nodes.iter().map(|n| n.name.clone()).collect();
    let chosen = if sel.whole_fleet { Rows::EachNode } else { Rows::Nodes(names.clone()) };
    let idle_below = crate::detect::thresholds::Thresholds::default().gpu_idle_below * 100.0;
    let parts = minutes::Parts { fleet, start_ns, bucket_ns: bucket * SEC, nodes: String::new() };
    let gpu_line = req.measure.gpu().then_some(idle_below);
    // `busy` cells sum each node's CPUs: the per-node minutes answer them, 16-192 times fewer rows.
    // The others need each CPU's sums per cell: whole five minutes from `cpu_5m` (a day's
    // columns), a cell a row.
    let ((cpu, cpu_minutes), gpu) = match gpu_line {
        Some(_) => ((minutes::Tiers::raw(w), NodeMinutes::PerCpu), parts.gpu_split(w, idle_below)?),
        None if req.measure == Measure::Busy => {
            let (split, by) = NodeMinutes::split_for(&parts, w)?;
            ((split.into(), by), minutes::Split::raw(w))
        }
        None => ((parts.cpu_tiers(w)?, NodeMinutes::PerCpu), minutes::Split::raw(w)),
    };
    // The ranking over every node from the hourly rollups' whole hours.
    let rank = parts.tiers(w, gpu_line)?;
    let cells = match req.measure.gpu() {
        true => minutes::describe_gpu(&gpu),
        false => minutes::describe_cpu_tiers(&cpu, cpu_minutes.table()),
    };
    let read_from = format!("ranking {}; cells {cells}", minutes::describe_ranking(&rank, req.measure.gpu()));
    let sql = BoardSql { fleet, window: w, bucket_ns: bucket * SEC, start_ns, cpu, cpu_minutes, gpu, rank };
    let cpus_of: HashMap<&str, u64> = sel.nodes.iter().map(|n| (n.name.as_str(), u64::from(n.cpus))).collect();
    let mut tallies: BTreeMap<String, Tally> = names.iter().map(|n| (n.clone(), Tally::default())).collect();
    if req.measure.gpu() {
        let read = |r: &mut super::rowbinary::Reader<'_>| {
            let row = (r.string()?.to_string(), r.u64()?, r.f64()?, r.f64()?);
            r.u64()?; // GPUs
            Ok(row)
        };
        for (node, n, u, idle) in fleet.rows(&sql.gpu_scores(&chosen, idle_below), read)? {
            if let Some(t) = tallies.get_mut(&node) {
                t.gpu = Some((n, u, idle));
            }
        }
    } else {
        let read = |r: &mut super::rowbinary::Reader<'_>| {
            Ok((r.string()?.to_string(), r.f64()?, r.u64()?, r.u64()?, r.u64()?))
        };
        for (node, peak, b, i, most) in fleet.rows(&sql.cpu_scores(&chosen), read)? {
            if let Some(t) = tallies.get_mut(&node) {
                // Idle: the ticks the node's CPUs should have had as its best-ticking CPU did
                // (a CPU whose idle takes no cpu-clock ticks counts fewer), less the busy ones.
                let cpus = cpus_of.get(node.as_str()).copied().unwrap_or(0);
                t.cpu = Some((peak, b, (b + i).max(most * cpus) - b));
            }
        }
    }
    let with_data = tallies.values().filter(|t| t.score(req.measure).is_some()).count() as u64;
    let namespaces = match req.group {
        Group::Namespace => namespaces(fleet, &sql, &sel)?,
        _ => HashMap::new(),
    };
    let group_of = |node: &str| match req.group {
        Group::Node => node.to_string(),
        Group::Pool => pool_of(node),
        Group::Namespace => namespaces.get(node).cloned().unwrap_or_else(|| NO_POD.to_string()),
    };
    let (shown, more_rows, more_nodes) = choose_rows(&tallies, group_of, req.measure, req.rows.clamp(1, MAX_ROWS));
    let row_of: HashMap<&str, usize> = shown.iter().enumerate().map(|(i, r)| (r.0.as_str(), i)).collect();
    let keyed = match req.group {
        Group::Node => Rows::Nodes(shown.iter().map(|r| r.0.clone()).collect()),
        _ => {
            Rows::Grouped(shown.iter().flat_map(|(g, nodes, _)| nodes.iter().map(|n| (n.clone(), g.clone()))).collect())
        }
    };
    let mut rows: Vec<BoardRow> = shown
        .iter()
        .map(|(label, nodes, t)| BoardRow {
            label: label.clone(),
            nodes: nodes.clone(),
            score: t.score(req.measure),
            values: vec![None; columns as usize],
            causes: Vec::new(),
        })
        .collect();
    let mut cell = |rk: &str, c: u32, v: Option<f64>| {
        if let Some(slot) = row_of.get(rk).and_then(|&i| rows[i].values.get_mut(c as usize)) {
            *slot = v;
        }
    };
    if shown.is_empty() {
        // Nothing to colour.
    } else if req.measure.gpu() {
        let cells = fleet.rows(&sql.gpu_grid(&keyed, idle_below), |r| {
            Ok((r.string()?.to_string(), r.u32()?, r.u64()?, r.f64()?, r.f64()?))
        })?;
        for (rk, c, n, u, idle) in cells {
            let v = if req.measure == Measure::GpuUtil { share(u / 100.0, n as f64) } else { share(idle, n as f64) };
            cell(&rk, c, v);
        }
    } else {
        // The mean busy share counts the ticks a node's seconds should have had (CPUs x Hz).
        let ticks = (req.measure == Measure::Busy).then(|| {
            let shown: std::collections::HashSet<&str> =
                shown.iter().flat_map(|r| r.1.iter().map(|n| n.as_str())).collect();
            sel.nodes
                .iter()
                .filter(|n| shown.contains(n.name.as_str()))
                .map(|n| (n.name.clone(), u64::from(n.cpus) * u64::from(n.hz)))
                .collect::<Vec<_>>()
        });
        let cells = fleet.rows(&sql.cpu_grid(&keyed, ticks.as_deref()), |r| {
            Ok((r.string()?.to_string(), r.u32()?, r.f64()?, r.u64()?, r.u64()?))
        })?;
        for (rk, c, peak, b, i) in cells {
            let v =
                share(b as f64, (b + i) as f64).map(|busy| if req.measure == Measure::PeakCpu { peak } else { busy });
            cell(&rk, c, v);
        }
    }
    let mut kinds = Vec::new();
    if req.measure == Measure::GpuIdle && !rows.is_empty() {
        let row_of_node: HashMap<&str, usize> =
            rows.iter().enumerate().flat_map(|(i, r)| r.nodes.iter().map(move |n| (n.as_str(), i))).collect();
        let only: Vec<String> = row_of_node.keys().map(|n| quote_str(n)).collect();
        let q = format!(
            "SELECT nd, kd, t0, t1 FROM ({}) WHERE kd LIKE 'gpu-%' LIMIT {MAX_CAUSE_FINDINGS}",
            signatures::latest(fleet, w, &format!(" AND node IN ({})", only.join(", ")))
        );
        let found = fleet.rows(&q, |r| Ok((r.string()?.to_string(), r.string()?.to_string(), r.u64()?, r.u64()?)))?;
        let laid: Vec<(usize, String, u64, u64)> =
            found.into_iter().filter_map(|(n, k, a, b)| Some((*row_of_node.get(n.as_str())?, k, a, b))).collect();
        let (k, per_row) = causes(&laid, rows.len(), start_ns, bucket * SEC, columns as usize);
        kinds = k;
        for (row, c) in rows.iter_mut().zip(per_row) {
            row.causes = c;
        }
    }
    let nodes_filter = if sel.whole_fleet { String::new() } else { format!(" AND {}", sel.predicate()) };
    let findings = signatures::signatures(fleet, w, &nodes_filter)?;
    Ok(Board {
        from_ns: w.from_ns,
        to_ns: w.to_ns,
        measure: req.measure.name(),
        group: req.group.name(),
        score_unit: req.measure.score_unit(),
        bucket_seconds: bucket,
        columns,
        start_ns,
        rows,
        more_rows,
        more_nodes,
        nodes_with_data: with_data,
        nodes_without_data: names.len() as u64 - with_data,
        causes: kinds,
        findings,
        read_from,
    })
}

/// Each node's namespace (the pod namespace with the most samples in the window), from the
/// minute rollup where it resolves the window.
fn namespaces(fleet: &Fleet, sql: &BoardSql<'_>, sel: &Selection) -> Result<HashMap<String, String>, FleetError> {
    // The hourly rollup has no node: a selection that is not the whole fleet reads minutes.
    let some = Selection { whole_fleet: false, ..sel.clone() };
    let plan = rollup::plan(sql.window, &Default::default(), &some, Coverage::read(fleet, sql.window)?);
    let tables: Vec<(&str, Window)> = plan.iter().map(|p| (p.source.table(), p.window)).collect();
    let rows = fleet.rows(&sql.namespaces(&tables), |r| Ok((r.string()?.to_string(), r.string()?.to_string())))?;
    Ok(rows.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(peak: f64, busy: u64, idle: u64) -> Tally {
        Tally { cpu: Some((peak, busy, idle)), gpu: None }
    }

    #[test]
    fn pools_are_names_without_their_number() {
        assert_eq!(pool_of("gpu-a100-017"), "gpu-a100");
        assert_eq!(pool_of("gpu-a100-017.ec2.internal"), "gpu-a100");
        assert_eq!(pool_of("node_12"), "node");
        assert_eq!(pool_of("web"), "web");
        assert_eq!(pool_of("1234"), "1234");
    }

    #[test]
    fn measures_score_and_rank_worst_first() {
        let t = Tally { cpu: Some((0.95, 30, 70)), gpu: Some((7200, 7200.0 * 25.0, 3600.0)) };
        assert_eq!(t.score(Measure::PeakCpu), Some(0.95));
        assert_eq!(t.score(Measure::Busy), Some(0.3));
        assert_eq!(t.score(Measure::GpuUtil), Some(0.25));
        assert_eq!(t.score(Measure::GpuIdle), Some(1.0));
        assert_eq!(Tally::default().score(Measure::Busy), None);
        // GPU utilisation: the least used first; the rest: the highest first; none last.
        assert_eq!(Measure::GpuUtil.worse(Some(0.1), Some(0.9)), Ordering::Less);
        assert_eq!(Measure::Busy.worse(Some(0.1), Some(0.9)), Ordering::Greater);
        assert_eq!(Measure::PeakCpu.worse(None, Some(0.0)), Ordering::Greater);
        for m in Measure::ALL {
            assert_eq!(Measure::parse(m.name()), Some(m));
        }
        assert_eq!(Group::parse("pool"), Some(Group::Pool));
        assert_eq!(Measure::parse("cpu"), None);
    }

    #[test]
    fn rows_are_the_worst_nodes_or_groups_and_a_count_of_the_rest() {
        let mut tallies = BTreeMap::new();
        // A zombie: one core saturated under a 10 % average.
        tallies.insert("web-1".to_string(), cpu(1.0, 10, 90));
        tallies.insert("web-2".to_string(), cpu(0.3, 30, 70));
        tallies.insert("gpu-1".to_string(), cpu(0.5, 50, 50));
        tallies.insert("gpu-2".to_string(), cpu(0.6, 60, 40));
        tallies.insert("gone".to_string(), Tally::default());
        let (rows, more, more_nodes) = choose_rows(&tallies, str::to_string, Measure::PeakCpu, 2);
        let labels: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        assert_eq!((labels, more, more_nodes), (vec!["web-1", "gpu-2"], 2, 2));
        let (rows, ..) = choose_rows(&tallies, str::to_string, Measure::Busy, 10);
        assert_eq!(rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(), ["gpu-2", "gpu-1", "web-2", "web-1"]);
        // Pools: the peak is the worst node's, the mean busy share is the pool's.
        let (rows, more, _) = choose_rows(&tallies, pool_of, Measure::PeakCpu, 10);
        assert_eq!(more, 0);
        assert_eq!(rows[0].0, "web");
        assert_eq!(rows[0].1, ["web-1", "web-2"]);
        assert_eq!(rows[0].2.score(Measure::PeakCpu), Some(1.0));
        assert_eq!(rows[0].2.score(Measure::Busy), Some(0.2));
        assert_eq!(rows[1].2.score(Measure::Busy), Some(0.55));
    }

    #[test]
    fn a_cell_takes_the_cause_covering_most_of_it() {
        let s = 1000 * SEC;
        let f = vec![
            (0, "gpu-starved".to_string(), s + 5 * SEC, s + 25 * SEC),
            (0, "gpu-launch-bound".to_string(), s + 18 * SEC, s + 40 * SEC),
            (1, "gpu-fault".to_string(), s - 100 * SEC, s + 5 * SEC),
        ];
        let (kinds, cells) = causes(&f, 2, s, 10 * SEC, 5);
        assert_eq!(kinds, ["gpu-fault", "gpu-launch-bound", "gpu-starved"]);
        // Row 0: 5-10 starved; 10-20 starved 8 s vs launch 2 s; 20-30 launch 10 s vs 5; 30-40 launch.
        assert_eq!(cells[0], [Some(2), Some(2), Some(1), Some(1), None]);
        assert_eq!(cells[1], [Some(0), None, None, None, None]);
    }
}
