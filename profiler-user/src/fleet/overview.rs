//! `profiler fleet`: the questions a node cannot answer alone, asked of ClickHouse for a window
//! and a set of nodes. Every figure is aggregated by the server (a few thousand rows come
//! back whatever the fleet's size; raw samples never do):
//!
//! - per node: CPUs, mean busy share, the busiest CPU-second, seconds with a saturated core
//!   (from `cpu_seconds`), busy samples, findings by kind, events;
//! - a nodes x time grid of busy shares (the fleet heatmap), at most [`MAX_COLUMNS`] columns;
//! - the stacks that cost the most across the nodes, and on how many nodes each ran;
//! - with an event pattern: for each matching kernel log event, the CPU that spent most
//!   samples in the kernel in the [`EVENT_LOOKBACK_NS`] before it, and what ran there.
//!
//! The SQL runs on ClickHouse 18.16 and on current servers: no newer functions, no alias
//! that shadows a column (newer analyzers read those differently), integer results cast to
//! the width the decoder reads.

mod events;

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::{
    Fleet, FleetError, Node,
    minutes::{self, Parts, Split},
    node_minutes::{NodeMinutes, node_cells},
    rollup::{self, Piece, Source},
    select::Selection,
};
use crate::{
    query::{Window, fold_names},
    ship::clickhouse::schema::{self, MINUTE_NS, col::*, quote_str},
    timespec,
};

const SEC: u64 = 1_000_000_000;
/// Most columns of the grid: a screen's width of cells, and a bounded answer for any window.
pub const MAX_COLUMNS: u64 = 600;
/// Column widths the grid picks from (seconds), so columns fall on round times.
const BUCKETS: &[u64] = &[1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
/// How far before an event `--event` looks for the CPU and the stacks behind it.
pub const EVENT_LOOKBACK_NS: u64 = 5 * SEC;
/// Most events `--event` explains (each costs two small queries); the rest are counted.
pub const MAX_EVENTS: usize = 100;
/// Stacks shown per event.
pub const EVENT_STACKS: usize = 3;
/// A CPU-second at least this busy (in tenths) is a saturated core.
const SATURATED_TENTHS: u64 = 9;

/// What to ask.
#[derive(Debug, Clone)]
pub struct Request {
    pub window: Window,
    /// Node names; empty: every node that shipped.
    pub nodes: Vec<String>,
    /// Stacks in the top list.
    pub top: usize,
    /// A regular expression (ClickHouse `match()`, RE2) over event messages.
    pub event: Option<String>,
}

/// The answer, as `--format json` prints it (docs/clickhouse.md).
#[derive(Debug, Clone, Serialize)]
pub struct Overview {
    pub from_ns: u64,
    pub to_ns: u64,
    pub from: String,
    pub to: String,
    pub nodes: Vec<NodeSummary>,
    /// Nodes that shipped once but have nothing in the window (left out of `nodes` unless named).
    pub nodes_without_data: u64,
    /// Busy samples of the selected nodes in the window.
    pub samples: u64,
    pub top_stacks: Vec<TopStack>,
    pub grid: Grid,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<EventAnswer>,
    /// The tables the samples and the per-CPU counts were read from (`samples_1m 23h 59m,
    /// samples 40.000s; cpu_1m 23h 59m, cpu_seconds 40.000s`).
    pub read_from: String,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct NodeSummary {
    pub node: String,
    pub cpus: u32,
    pub hz: u32,
    /// Busy ticks over the node's ticks in the window (busy, idle and lost, or CPUs x Hz x the
    /// seconds covered where they are fewer); `None` without data.
    pub busy_share: Option<f64>,
    /// The busiest single CPU over one stored block (a second).
    pub peak_cpu_busy_share: Option<f64>,
    /// Seconds in which at least one CPU was at least 90 % busy.
    pub saturated_seconds: f64,
    /// Seconds of the window the node has per-CPU counts for.
    pub seconds: f64,
    pub samples: u64,
    /// Samples the node's kernel side could not deliver.
    pub lost: u64,
    pub findings: u64,
    /// Findings per kind.
    pub finding_kinds: BTreeMap<String, u64>,
    pub events: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TopStack {
    /// Folded, as `profiler flamegraph --format folded` writes it.
    pub stack: String,
    pub samples: u64,
    /// Nodes it ran on (1 in an event's list).
    pub nodes: u64,
}

/// Busy share per node per column: `values[node][column]`, `None` where the node has no data.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Grid {
    pub bucket_seconds: u64,
    pub columns: u64,
    /// Start of column 0 (the window's start); column `c` starts `c * bucket_seconds` later.
    pub start_ns: u64,
    pub nodes: Vec<String>,
    pub values: Vec<Vec<Option<f64>>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct EventAnswer {
    pub pattern: String,
    /// Matching events in the window; more than `events.len()` when cut at [`MAX_EVENTS`].
    pub matched: u64,
    pub events: Vec<EventCause>,
}

#[derive(Debug, Clone, Serialize)]
pub struct EventCause {
    pub node: String,
    pub ts_ns: u64,
    pub time: String,
    pub id: String,
    pub message: String,
    /// The CPU with the most kernel-mode samples in the 5 whole seconds before the event's
    /// second (ties: most samples, then the lowest number); `None` when the node has no
    /// per-CPU counts there.
    pub cpu: Option<u32>,
    pub cpu_kernel_samples: u64,
    pub cpu_samples: u64,
    /// That CPU's top stacks in those 5 s.
    pub stacks: Vec<TopStack>,
}

/// Columns of `bucket` seconds covering the window, the smallest round bucket within
/// [`MAX_COLUMNS`] (whole days beyond a day's buckets).
pub fn choose_bucket(window: Window) -> (u64, u64) {
    let secs = (window.to_ns - window.from_ns).div_ceil(SEC).max(1);
    let bucket = BUCKETS
        .iter()
        .copied()
        .find(|b| secs.div_ceil(*b) <= MAX_COLUMNS)
        .unwrap_or_else(|| secs.div_ceil(MAX_COLUMNS).div_ceil(86_400) * 86_400);
    (bucket, secs.div_ceil(bucket))
}

/// ` AND node IN (...)` for the nodes asked for; nothing for all of them.
pub fn node_filter(nodes: &[String]) -> String {
    if nodes.is_empty() {
        return String::new();
    }
    let list: Vec<String> = nodes.iter().map(|n| quote_str(n)).collect();
    format!(" AND {NODE} IN ({})", list.join(", "))
}

/// The SQL `fleet` sends, built apart from sending it (tested without a server).
pub struct Sql<'a> {
    pub fleet: &'a Fleet,
    pub window: Window,
    /// [`node_filter`].
    pub nodes: String,
    /// Where the samples of each part of the window are read: the minute rollup where it
    /// resolves the part (it keeps the node: the top stacks say on how many nodes they ran),
    /// raw rows elsewhere ([`rollup::plan`]). Empty: raw rows for the whole window.
    pub pieces: Vec<Piece>,
    /// For the whole fleet, where the top stacks' totals are read: the fleet-wide tables by
    /// class ([`rollup::plan`] of the whole fleet: far fewer rows than the nodes' minutes);
    /// empty for named nodes (the totals then come from [`Self::pieces`], with the nodes).
    pub fleet_pieces: Vec<Piece>,
    /// Where [`Self::top_nodes`] counts the nodes a stack ran on ([`rollup::plan_nodes`]:
    /// `stack_nodes_1h`'s whole hours, read by the stack). Empty: [`Self::pieces`].
    pub node_pieces: Vec<Piece>,
    /// Where the per-CPU counts are read: a minute rollup for the whole minutes it holds, raw
    /// `cpu_seconds` at the edges ([`minutes`]).
    pub cpu: Split,
    /// The minute rollup of [`Self::cpu`]: `cpu_node_1m` where it holds the minutes.
    pub cpu_minutes: NodeMinutes,
}

impl<'a> Sql<'a> {
    /// Raw rows for the whole window: what the events read.
    fn raw(fleet: &'a Fleet, window: Window, nodes: String) -> Self {
        Sql {
            fleet,
            window,
            nodes,
            pieces: Vec::new(),
            fleet_pieces: Vec::new(),
            node_pieces: Vec::new(),
            cpu: Split::raw(window),
            cpu_minutes: NodeMinutes::default(),
        }
    }

    /// The window's sample rows as `(nd, cm, sid, n)`: node, comm, stack and count, from the
    /// table of each part (a `UNION ALL` of them).
    fn sample_rows(&self) -> String {
        self.rows_of(&self.pieces, "")
    }

    /// The rows of `pieces` (raw rows for the whole window where empty) as `(nd, cm, sid, n)`,
    /// each part's `WHERE` ending with `and`.
    fn rows_of(&self, pieces: &[Piece], and: &str) -> String {
        let whole = [Piece { source: Source::Raw, window: self.window }];
        let pieces = if pieces.is_empty() { &whole[..] } else { pieces };
        let parts: Vec<String> = pieces
            .iter()
            .map(|p| {
                format!(
                    "SELECT {NODE} AS nd, {COMM} AS cm, {STACK_ID} AS sid, toUInt64({COUNT}) AS n FROM {} \
                     WHERE {TS} >= {} AND {TS} < {}{}{and}",
                    self.fleet.table(p.source.table()),
                    p.window.from_ns,
                    p.window.to_ns,
                    self.nodes
                )
            })
            .collect();
        format!("({})", parts.join(" UNION ALL "))
    }

    fn range(&self) -> String {
        format!("{TS} >= {} AND {TS} < {}{}", self.window.from_ns, self.window.to_ns, self.nodes)
    }

    fn parts(&self, bucket_secs: u64) -> Parts<'_> {
        let bucket_ns = bucket_secs * SEC;
        Parts {
            fleet: self.fleet,
            start_ns: minutes::aligned_start(self.window, bucket_ns),
            bucket_ns,
            nodes: self.nodes.clone(),
        }
    }

    /// The CPU figures per node and column of `bucket_secs` in one scan ([`node_cells`]): `nd,
    /// c, b, i, l, pk, sat, span`. The grid is the cells; a node's figures are their sums.
    /// Columns of whole minutes start on their bucket and read the minute rollup; others raw rows.
    pub fn cells(&self, bucket_secs: u64) -> String {
        let parts = self.parts(bucket_secs);
        let raw = Split::raw(self.window);
        let split = if (bucket_secs * SEC).is_multiple_of(MINUTE_NS) { &self.cpu } else { &raw };
        node_cells(&parts, split, SATURATED_TENTHS, self.cpu_minutes)
    }

    /// Findings overlapping the window, latest state of each, counted per node and kind.
    pub fn findings(&self) -> String {
        format!(
            "SELECT {NODE}, k, toUInt64(count()) FROM (SELECT {NODE}, {ID}, argMax({KIND}, {VERSION}) AS k, \
             argMax({END_TS}, {VERSION}) AS e FROM {} WHERE {TS} < {}{} GROUP BY {NODE}, {ID}) \
             WHERE e = 0 OR e >= {} GROUP BY {NODE}, k ORDER BY {NODE}, k",
            self.fleet.table(schema::FINDINGS),
            self.window.to_ns,
            self.nodes,
            self.window.from_ns
        )
    }

    /// Distinct events per node.
    pub fn events(&self) -> String {
        format!(
            "SELECT {NODE}, toUInt64(uniqExact({TS}, {ID})) FROM {} WHERE {} GROUP BY {NODE} ORDER BY {NODE}",
            self.fleet.table(schema::EVENTS),
            self.range()
        )
    }

    /// The `top` (comm, stack) pairs with the most samples, and on how many nodes each ran
    /// (0 from [`Self::fleet_pieces`]: [`Self::top_nodes`] counts them).
    pub fn top(&self, top: usize) -> String {
        if !self.fleet_pieces.is_empty() {
            let parts: Vec<String> = self
                .fleet_pieces
                .iter()
                .map(|p| {
                    format!(
                        "SELECT {COMM} AS cm, {STACK_ID} AS sid, toUInt64({COUNT}) AS n FROM {} \
                         WHERE {TS} >= {} AND {TS} < {}",
                        self.fleet.table(p.source.table()),
                        p.window.from_ns,
                        p.window.to_ns
                    )
                })
                .collect();
            return format!(
                "SELECT cm, sid, toUInt64(sum(n)) AS total, toUInt64(0) FROM ({}) GROUP BY cm, sid \
                 ORDER BY total DESC, cm, sid LIMIT {top}",
                parts.join(" UNION ALL ")
            );
        }
        format!(
            "SELECT cm, sid, toUInt64(sum(n)) AS total, toUInt64(uniqExact(nd)) FROM {} GROUP BY cm, sid \
             ORDER BY total DESC, cm, sid LIMIT {top}",
            self.sample_rows()
        )
    }

    /// On how many nodes each of the stacks `ids` ran (per (comm, stack)): the nodes' rows of
    /// those stacks only, the stacks asked in each part (`stack_nodes_1h` finds them by its key).
    pub fn top_nodes(&self, ids: &[u64]) -> String {
        let list: Vec<String> = ids.iter().map(u64::to_string).collect();
        let pieces = if self.node_pieces.is_empty() { &self.pieces } else { &self.node_pieces };
        format!(
            "SELECT cm, sid, toUInt64(uniqExact(nd)) FROM {} GROUP BY cm, sid",
            self.rows_of(pieces, &format!(" AND {STACK_ID} IN ({})", list.join(", ")))
        )
    }

    /// The first [`MAX_EVENTS`] events whose message matches `pattern`, oldest first.
    pub fn matching_events(&self, pattern: &str) -> String {
        format!(
            "SELECT {NODE}, {TS}, {ID}, any({MESSAGE}) FROM {} WHERE {} AND match({MESSAGE}, {}) \
             GROUP BY {NODE}, {TS}, {ID} ORDER BY {TS}, {NODE}, {ID} LIMIT {MAX_EVENTS}",
            self.fleet.table(schema::EVENTS),
            self.range(),
            quote_str(pattern)
        )
    }

    /// How many events match `pattern` (asked when the list was cut).
    pub fn matching_count(&self, pattern: &str) -> String {
        format!(
            "SELECT toUInt64(uniqExact({NODE}, {TS}, {ID})) FROM {} WHERE {} AND match({MESSAGE}, {})",
            self.fleet.table(schema::EVENTS),
            self.range(),
            quote_str(pattern)
        )
    }
}

/// Answers `req`.
pub fn overview(fleet: &Fleet, req: &Request) -> Result<Overview, FleetError> {
    if let Some(p) = &req.event {
        // RE2 (ClickHouse) and Rust's regex agree on the syntax that matters here; checking
        // first turns a typo into a sentence instead of a server error.
        regex::Regex::new(p).map_err(|e| FleetError::Pattern { pattern: p.clone(), reason: e.to_string() })?;
    }
    let selection = fleet.select(&req.nodes)?;
    let w = req.window;
    // Named nodes (globs resolved) are filtered by name; the whole fleet needs no filter.
    let names: Vec<String> =
        if selection.whole_fleet { Vec::new() } else { selection.nodes.iter().map(|n| n.name.clone()).collect() };
    // The events beside the rest: they read raw rows of their own seconds only, and most of
    // the time of either is the server's answering many small requests, not its CPU.
    let raw = Sql::raw(fleet, w, node_filter(&names));
    std::thread::scope(|s| {
        let events = req.event.as_deref().map(|p| s.spawn(|| events::explain_events(&raw, p)));
        let mut o = summarize(fleet, req, selection, names)?;
        if let Some(e) = events {
            o.events = Some(e.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?);
        }
        Ok(o)
    })
}

/// Everything but the events, for the nodes of `selection` (`names`: none for the whole fleet).
fn summarize(fleet: &Fleet, req: &Request, selection: Selection, names: Vec<String>) -> Result<Overview, FleetError> {
    let w = req.window;
    // The top stacks and the samples per node from the minute rollup where it resolves the
    // window: it keeps the node (the hourly one does not).
    let some_nodes = Selection { whole_fleet: false, ..selection.clone() };
    let cover = rollup::Coverage::read(fleet, w)?;
    let pieces = rollup::plan(w, &crate::query::Filter::default(), &some_nodes, cover);
    // The whole fleet's top stacks are summed from its own tables (a day of a thousand nodes'
    // minutes grouped by stack took 6.3 s), the nodes they ran on counted for those few.
    let fleet_pieces = match selection.whole_fleet {
        true => rollup::plan(w, &crate::query::Filter::default(), &selection, cover),
        false => Vec::new(),
    };
    let (cpu, cpu_minutes) = NodeMinutes::split_quiet(fleet, w)?;
    let mut read_from =
        format!("{}; {}", rollup::describe(&pieces), minutes::describe_cpu_from(&cpu, cpu_minutes.table()));
    if !fleet_pieces.is_empty() {
        read_from.push_str(&format!("; top stacks {}", rollup::describe(&fleet_pieces)));
    }
    // The nodes of the top stacks: by the stack from the nodes' hours where they resolve.
    let node_pieces = match selection.whole_fleet {
        true => rollup::plan_nodes(w, cover),
        false => Vec::new(),
    };
    if !node_pieces.is_empty() {
        read_from.push_str(&format!("; their nodes {} (edges to the minute)", rollup::describe(&node_pieces)));
    }
    let sql = Sql { fleet, window: w, nodes: node_filter(&names), pieces, fleet_pieces, node_pieces, cpu, cpu_minutes };
    let nodes = selection.nodes;
    let mut by_node: BTreeMap<String, NodeSummary> = nodes
        .iter()
        .map(|n| (n.name.clone(), NodeSummary { node: n.name.clone(), cpus: n.cpus, hz: n.hz, ..Default::default() }))
        .collect();
    // The grid's cells, and each node's figures summed from its cells.
    let (bucket, _) = choose_bucket(w);
    let cells = fleet.rows(&sql.cells(bucket), |r| {
        Ok(Cell {
            node: r.string()?.to_string(),
            col: r.u32()?,
            busy: r.u64()?,
            idle: r.u64()?,
            lost: r.u64()?,
            peak: r.f64()?,
            saturated_ns: r.u64()?,
            span_ns: r.u64()?,
        })
    })?;
    let mut totals: HashMap<&str, Cell> = HashMap::new();
    for c in &cells {
        let t = totals.entry(c.node.as_str()).or_default();
        t.busy += c.busy;
        t.idle += c.idle;
        t.lost += c.lost;
        t.peak = t.peak.max(c.peak);
        t.saturated_ns += c.saturated_ns;
        t.span_ns += c.span_ns;
    }
    for (node, t) in totals {
        if let Some(s) = by_node.get_mut(node) {
            s.busy_share = t.busy_share(s.cpus, s.hz);
            s.peak_cpu_busy_share = s.busy_share.map(|_| t.peak);
            s.saturated_seconds = t.saturated_ns as f64 / SEC as f64;
            s.seconds = t.span_ns as f64 / SEC as f64;
            s.lost = t.lost;
            // The busy ticks are the busy samples, counted per CPU as each block was written
            // (`cpu_seconds`): a day of a thousand nodes' `samples_1m` summed per node took
            // 0.75 s of `profiler fleet`'s 1.86 s for the same figure.
            s.samples = t.busy;
        }
    }
    for (node, kind, n) in
        fleet.rows(&sql.findings(), |r| Ok((r.string()?.to_string(), r.string()?.to_string(), r.u64()?)))?
    {
        if let Some(s) = by_node.get_mut(&node) {
            s.findings += n;
            *s.finding_kinds.entry(kind).or_default() += n;
        }
    }
    for (node, n) in fleet.rows(&sql.events(), |r| Ok((r.string()?.to_string(), r.u64()?)))? {
        if let Some(s) = by_node.get_mut(&node) {
            s.events = n;
        }
    }
    // Every node that ever shipped stays in `nodes`: those with nothing in the window (gone,
    // replaced, not yet started) are counted, not listed, unless named with --node.
    let quiet = |s: &NodeSummary| s.seconds == 0.0 && s.samples == 0 && s.findings == 0 && s.events == 0;
    let before = by_node.len();
    if req.nodes.is_empty() {
        by_node.retain(|_, s| !quiet(s));
    }
    let nodes_without_data = (before - by_node.len()) as u64;
    let nodes: Vec<Node> = nodes.into_iter().filter(|n| by_node.contains_key(&n.name)).collect();
    let grid = grid(&sql, &nodes, &cells);
    let mut top = fleet.rows(&sql.top(req.top), |r| Ok((r.string()?.to_string(), r.u64()?, r.u64()?, r.u64()?)))?;
    if !sql.fleet_pieces.is_empty() && !top.is_empty() {
        let ids: Vec<u64> = top.iter().map(|t| t.1).collect();
        let on: HashMap<(String, u64), u64> = fleet
            .rows(&sql.top_nodes(&ids), |r| Ok(((r.string()?.to_string(), r.u64()?), r.u64()?)))?
            .into_iter()
            .collect();
        for (comm, id, _, nodes) in &mut top {
            *nodes = on.get(&(comm.clone(), *id)).copied().unwrap_or(0);
        }
    }
    let mut stacks = Stacks::default();
    stacks.fetch(&sql, top.iter().map(|t| t.1))?;
    let top_stacks: Vec<TopStack> =
        top.iter().map(|(comm, id, n, k)| TopStack { stack: stacks.line(comm, *id), samples: *n, nodes: *k }).collect();
    let nodes: Vec<NodeSummary> = by_node.into_values().collect();
    Ok(Overview {
        from_ns: w.from_ns,
        to_ns: w.to_ns,
        from: timespec::format(w.from_ns),
        to: timespec::format(w.to_ns),
        samples: nodes.iter().map(|n| n.samples).sum(),
        nodes,
        nodes_without_data,
        top_stacks,
        grid,
        events: None,
        read_from,
    })
}

impl Cell {
    /// Busy ticks over the node's ticks: busy, idle and lost, or Hz x the seconds covered x
    /// its CPUs where they counted fewer (an idle CPU that takes no cpu-clock ticks, as on some
    /// VMs, would otherwise read 100 % busy); `None` without ticks.
    fn busy_share(&self, cpus: u32, hz: u32) -> Option<f64> {
        let expected = u128::from(self.span_ns) * u128::from(hz) * u128::from(cpus) / u128::from(SEC);
        let ticks = u128::from(self.busy + self.idle + self.lost).max(expected);
        (ticks > 0).then(|| self.busy as f64 / ticks as f64)
    }
}

/// A node's CPU figures in one column of the grid ([`Sql::cells`]), or summed over them.
#[derive(Debug, Default)]
struct Cell {
    node: String,
    col: u32,
    busy: u64,
    idle: u64,
    lost: u64,
    peak: f64,
    saturated_ns: u64,
    span_ns: u64,
}

fn grid(sql: &Sql<'_>, nodes: &[Node], cells: &[Cell]) -> Grid {
    let (bucket, _) = choose_bucket(sql.window);
    let start_ns = minutes::aligned_start(sql.window, bucket * SEC);
    let columns = (sql.window.to_ns - start_ns).div_ceil(bucket * SEC);
    let row_of: HashMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
    let mut values = vec![vec![None; columns as usize]; nodes.len()];
    for c in cells {
        let Some(&row) = row_of.get(c.node.as_str()) else { continue };
        if let Some(v) = values[row].get_mut(c.col as usize) {
            *v = c.busy_share(nodes[row].cpus, nodes[row].hz);
        }
    }
    Grid { bucket_seconds: bucket, columns, start_ns, nodes: nodes.iter().map(|n| n.name.clone()).collect(), values }
}

/// Frames of the stacks the answer names (`stack_text`), fetched once each.
#[derive(Default)]
struct Stacks {
    frames: HashMap<u64, (Vec<String>, Vec<u8>)>,
}

impl Stacks {
    fn fetch(&mut self, sql: &Sql<'_>, ids: impl Iterator<Item = u64>) -> Result<(), FleetError> {
        let mut ids: Vec<u64> = ids.filter(|id| !self.frames.contains_key(id)).collect();
        ids.sort_unstable();
        ids.dedup();
        self.frames.extend(super::stack_text::by_id(sql.fleet, ids)?);
        Ok(())
    }

    /// The folded line of `comm` on stack `id` (the mirror's mark when the stack is missing).
    fn line(&self, comm: &str, id: u64) -> String {
        match self.frames.get(&id) {
            Some((frames, kernel)) => fold_names(
                comm,
                frames.iter().zip(kernel.iter().chain(std::iter::repeat(&0))).map(|(f, k)| (f.as_str(), *k == 1)),
            ),
            None => fold_names(comm, [(super::MISSING_STACK, false)]),
        }
    }
}

#[cfg(test)]
#[path = "overview_tests.rs"]
mod tests;
