//! The per-CPU counts and GPU readings of a window, read from the rollups
//! (`ship::clickhouse::track_rollups`: `cpu_1m`, `gpu_util_1m` for its whole minutes, `cpu_5m`
//! for its whole five minutes, the hourly ones for the ranking's whole hours) and from the
//! raw rows (`cpu_seconds`, `counters`) at its edges, as [`super::rollup`] does for samples. A
//! rollup holds whole minutes only after its first one (the view may have started mid-minute),
//! and a grid's columns take minutes only when they are whole minutes: a column width of a
//! multiple of 60 s from a start on a minute ([`aligned_start`]); otherwise every row is raw.
//!
//! The SQL here makes the parts each read sums: per (node, column) each CPU's busy and idle
//! ticks (arrays by CPU), per (node, hour, CPU) for the ranking, per (node, column) or per node
//! GPU readings, their sum and those idle. Runs on 18.16 and on current servers: aggregate
//! states merged with `-Merge` or finalized per row, every part's columns cast alike.

use super::{Fleet, FleetError};
use crate::{
    query::Window,
    ship::clickhouse::{
        schema::{self, HOUR_NS, MINUTE_NS, col::*, quote_str},
        track_rollups::{
            self, CPU_1H, CPU_1M, CPU_5M, FIVE_MINUTES_NS, GPU_UTIL_1H, GPU_UTIL_1M, GPU_UTIL_TRACK, HOUR,
            IDLE_BELOW_PERCENT, MINUTE,
        },
    },
};

const SEC: u64 = 1_000_000_000;

/// A raw `cpu_seconds` row's idle ticks as the rollups keep them ([`track_rollups::idle_ticks`]):
/// a CPU whose idle takes no ticks reads its busy share, in raw cells as in rolled-up ones.
pub(super) fn raw_idle() -> String {
    track_rollups::idle_ticks(BUSY, IDLE, LOST, HZ, SPAN)
}

/// A window cut for one rollup: its whole minutes the rollup answers, the rest raw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    pub minutes: Option<Window>,
    pub raw: Vec<Window>,
}

impl Split {
    /// Everything from raw rows.
    pub fn raw(w: Window) -> Self {
        Self { minutes: None, raw: vec![w] }
    }

    /// `w`'s whole minutes from `from` on (when the rollup holds whole minutes) to the rollup,
    /// the slivers before and after to raw rows.
    pub fn new(w: Window, from: Option<u64>) -> Self {
        let Some(from) = from else { return Self::raw(w) };
        let a = w.from_ns.max(from).div_ceil(MINUTE_NS) * MINUTE_NS;
        let b = w.to_ns / MINUTE_NS * MINUTE_NS;
        if a >= b {
            return Self::raw(w);
        }
        let mut raw = Vec::new();
        if w.from_ns < a {
            raw.push(Window { from_ns: w.from_ns, to_ns: a });
        }
        if b < w.to_ns {
            raw.push(Window { from_ns: b, to_ns: w.to_ns });
        }
        Self { minutes: Some(Window { from_ns: a, to_ns: b }), raw }
    }

    /// For a note: `cpu_1m 23h 55m, cpu_seconds 4m 59.000s`.
    pub fn describe(&self, rollup: &str, raw: &str) -> String {
        let mut out = Vec::new();
        if let Some(m) = self.minutes {
            out.push(format!("{rollup} {}", crate::timespec::format_duration(m.to_ns - m.from_ns)));
        }
        let r: u64 = self.raw.iter().map(|w| w.to_ns - w.from_ns).sum();
        if r > 0 || out.is_empty() {
            out.push(format!("{raw} {}", crate::timespec::format_duration(r)));
        }
        out.join(", ")
    }
}

/// A window cut for the rollups: its whole hours from an hourly rollup (`cpu_1h`,
/// `gpu_util_1h`: the ranking over every node), whole five minutes from `cpu_5m` around them (or
/// throughout: the page's per-CPU cells), the whole minutes around those from the minute rollup,
/// raw rows at the edges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tiers {
    pub hours: Option<Window>,
    pub fives: Vec<Window>,
    pub minutes: Vec<Window>,
    pub raw: Vec<Window>,
}

impl Tiers {
    pub fn raw(w: Window) -> Self {
        Self { raw: vec![w], ..Default::default() }
    }

    /// `w`'s whole hours from `hours_from` on to the hourly rollup, then as [`Split::new`].
    pub fn new(w: Window, hours_from: Option<u64>, minutes_from: Option<u64>) -> Self {
        Self::cut(w, hours_from, None, minutes_from)
    }

    /// `w`'s whole hours from `hours_from` on, whole five minutes from `fives_from` on around
    /// them, then as [`Split::new`].
    pub fn cut(w: Window, hours_from: Option<u64>, fives_from: Option<u64>, minutes_from: Option<u64>) -> Self {
        let (hours, rest) = whole_units(w, HOUR_NS, hours_from);
        let mut t = Self { hours, ..Default::default() };
        for e in rest {
            let (five, rest) = whole_units(e, FIVE_MINUTES_NS, fives_from);
            t.fives.extend(five);
            for r in rest {
                let s = Split::new(r, minutes_from);
                t.minutes.extend(s.minutes);
                t.raw.extend(s.raw);
            }
        }
        t
    }

    /// For a note: `cpu_1h 23h 0m, cpu_5m 55m 0s, cpu_1m 4m 0s, cpu_seconds 1m 0s`.
    pub fn describe(&self, hours: &str, minutes: &str, raw: &str) -> String {
        let span = |ws: &[Window]| ws.iter().map(|w| w.to_ns - w.from_ns).sum::<u64>();
        let mut out = Vec::new();
        for (table, ns) in [
            (hours, self.hours.map_or(0, |w| w.to_ns - w.from_ns)),
            (CPU_5M, span(&self.fives)),
            (minutes, span(&self.minutes)),
            (raw, span(&self.raw)),
        ] {
            if ns > 0 {
                out.push(format!("{table} {}", crate::timespec::format_duration(ns)));
            }
        }
        out.join(", ")
    }
}

/// `w`'s whole `unit`s from `from` on, and the slivers before and after them (all of `w` when
/// there are none).
fn whole_units(w: Window, unit: u64, from: Option<u64>) -> (Option<Window>, Vec<Window>) {
    let Some(from) = from else { return (None, vec![w]) };
    let a = w.from_ns.max(from).div_ceil(unit) * unit;
    let b = w.to_ns / unit * unit;
    if a >= b {
        return (None, vec![w]);
    }
    let edges = [(w.from_ns, a), (b, w.to_ns)].into_iter().filter(|(x, y)| x < y);
    (Some(Window { from_ns: a, to_ns: b }), edges.map(|(from_ns, to_ns)| Window { from_ns, to_ns }).collect())
}

impl From<Split> for Tiers {
    fn from(s: Split) -> Self {
        Self { minutes: s.minutes.into_iter().collect(), raw: s.raw, ..Default::default() }
    }
}

/// Column 0's start for columns of `bucket_ns` over `w`: the window's start, or, for columns of
/// whole minutes, the bucket it falls in (columns on round times, each whole minutes, so the
/// rollups answer them).
pub fn aligned_start(w: Window, bucket_ns: u64) -> u64 {
    if bucket_ns.is_multiple_of(MINUTE_NS) { w.from_ns / bucket_ns * bucket_ns } else { w.from_ns }
}

/// `w` widened to whole columns where columns of `bucket_ns` are whole minutes (the first and
/// last cells then hold their whole minutes, as every other cell does): the rollups answer all
/// of it, a day's five-minute columns from `cpu_5m` alone. A day's page read the minutes at its
/// edges from raw rows and `cpu_1m`, whose rows are node by node: a minute of every node is a
/// granule of each (8,192 rows), 8.7 M of the 8.9 M rows its cells read at 1,000 nodes. The
/// views roll each insert up as it lands, so the current minute is there as soon as its raw
/// rows are.
pub fn whole_columns(w: Window, bucket_ns: u64) -> Window {
    if !bucket_ns.is_multiple_of(MINUTE_NS) {
        return w;
    }
    let to_ns = w.to_ns.div_ceil(bucket_ns).saturating_mul(bucket_ns).max(w.to_ns);
    Window { from_ns: w.from_ns / bucket_ns * bucket_ns, to_ns }
}

/// From which minute `table` holds whole minutes in `w`: the minute after its first row there,
/// or `w`'s first minute when it has rows in the minute before (`None`: no rows, or no table).
/// The window's first day is looked at first, the rest only if that holds none.
pub fn whole_from(fleet: &Fleet, table: &str, w: Window) -> Result<Option<u64>, FleetError> {
    whole_units_from(fleet, table, MINUTE, MINUTE_NS, w)
}

/// As [`whole_from`], for an hourly rollup.
pub fn whole_hours_from(fleet: &Fleet, table: &str, w: Window) -> Result<Option<u64>, FleetError> {
    whole_units_from(fleet, table, HOUR, HOUR_NS, w)
}

/// Per cell of [`Parts::cpu_cells`]: the busiest CPU's share of the cell's ticks, its busy
/// ticks over the most ticks any of the node's CPUs had there (0 for a cell with none). Not
/// each CPU's busy / (busy + idle): where an idle CPU gets no cpu-clock ticks (some VMs: one
/// here had 30,291 busy and 0 idle over 688 s), that CPU reads 100 % busy in every cell it ran
/// in. A CPU that ticks through idle gives the cell's ticks, as the node's detectors divide by
/// Hz x seconds. `max(b) / max(b + i)`: each CPU over the same most ticks, and 18.16 reads no
/// outer column inside a lambda.
pub const PEAK_SHARE: &str = "if(arrayReduce('max', arrayMap((b, i) -> b + i, sb, si)) > 0, \
     arrayReduce('max', sb) / arrayReduce('max', arrayMap((b, i) -> b + i, sb, si)), 0)";

/// Per cell of [`Parts::cpu_cells`]: the most ticks any CPU of the node had there. The node's
/// CPUs times this is its ticks where a CPU whose idle takes none counted fewer.
pub const MOST_TICKS: &str = "arrayReduce('max', arrayMap((b, i) -> b + i, sb, si))";

/// `v` at index `cpu` of an array of zeros: what `sumForEach` sums per CPU.
fn per_cpu(cpu: &str, v: &str) -> String {
    format!("arrayPushBack(arrayResize(emptyArrayUInt64(), {cpu}), toUInt64({v}))")
}

/// As [`whole_from`], for `cpu_5m`'s five minutes.
pub fn whole_fives_from(fleet: &Fleet, w: Window) -> Result<Option<u64>, FleetError> {
    whole_units_from(fleet, CPU_5M, MINUTE, FIVE_MINUTES_NS, w)
}

fn whole_units_from(fleet: &Fleet, table: &str, column: &str, unit: u64, w: Window) -> Result<Option<u64>, FleetError> {
    let start = w.from_ns / unit * unit;
    // The usual answer first: rows in the unit before the window (a rollup that has been filling
    // since). The tables are sorted by node, so a time range reads every row of its days (a
    // day's `cpu_1m` at 1,000 nodes: 23 M rows, 0.15 s); `LIMIT 1` stops at the first row met.
    let probe = format!(
        "SELECT toUInt64(count()) FROM (SELECT 1 FROM {} WHERE {column} >= {} AND {column} < {start} LIMIT 1)",
        fleet.table(table),
        start.saturating_sub(unit)
    );
    match fleet.rows(&probe, |r| r.u64()) {
        Ok(n) if n.first().is_some_and(|&n| n > 0) => return Ok(Some(start)),
        Ok(_) => {}
        // A server shipped to before the rollups existed has no such table.
        Err(FleetError::NoNodes(_)) => return Ok(None),
        Err(e) => return Err(e),
    }
    let look = |a: u64, b: u64| -> Result<Option<u64>, FleetError> {
        let sql = format!(
            "SELECT count(), min({column}) FROM {} WHERE {column} >= {a} AND {column} < {b}",
            fleet.table(table)
        );
        let rows = fleet.rows(&sql, |r| Ok((r.u64()?, r.u64()?)))?;
        Ok(rows.first().filter(|(n, _)| *n > 0).map(|(_, ts)| *ts))
    };
    let near = start.saturating_add(schema::DAY_NS).min(w.to_ns);
    let found = match look(start.saturating_sub(unit), near) {
        Ok(Some(ts)) => Some(ts),
        Ok(None) if near < w.to_ns => look(near, w.to_ns)?,
        Ok(None) => None,
        // A server shipped to before the rollups existed has no such table.
        Err(FleetError::NoNodes(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(found.map(|ts| if ts < start { start } else { ts + unit }))
}

/// Where a read's rows come from: columns of `bucket_ns` from `start_ns` over the window.
pub struct Parts<'a> {
    pub fleet: &'a Fleet,
    pub start_ns: u64,
    pub bucket_ns: u64,
    /// ` AND node IN (...)`, or nothing.
    pub nodes: String,
}

impl Parts<'_> {
    /// The split of `w` for `table` (`cpu_1m` or `gpu_util_1m`): raw rows only where the
    /// columns are not whole minutes.
    pub fn split(&self, table: &str, w: Window) -> Result<Split, FleetError> {
        if !self.whole_minutes() {
            return Ok(Split::raw(w));
        }
        Ok(Split::new(w, whole_from(self.fleet, table, w)?))
    }

    /// The per-CPU cells' tiers: `cpu_5m`'s whole five minutes where the columns are whole five
    /// minutes, `cpu_1m`'s whole minutes around them (or throughout), raw rows at the edges.
    pub fn cpu_tiers(&self, w: Window) -> Result<Tiers, FleetError> {
        if !self.whole_minutes() {
            return Ok(Tiers::raw(w));
        }
        let minutes_from = whole_from(self.fleet, CPU_1M, w)?;
        let fives_from = match minutes_from.is_some() && self.whole_units(FIVE_MINUTES_NS) {
            true => whole_fives_from(self.fleet, w)?,
            false => None,
        };
        Ok(Tiers::cut(w, None, fives_from, minutes_from))
    }

    /// Whether the columns are whole minutes (a rollup can answer them).
    pub fn whole_minutes(&self) -> bool {
        self.whole_units(MINUTE_NS)
    }

    fn whole_units(&self, unit: u64) -> bool {
        self.bucket_ns.is_multiple_of(unit) && self.start_ns.is_multiple_of(unit)
    }

    fn col(&self, ts: &str) -> String {
        format!("intDiv({ts} - {}, {})", self.start_ns, self.bucket_ns)
    }

    /// Per node and column: `nd, col, sb, si`, each CPU's busy and idle ticks (arrays by CPU:
    /// a day of a fleet's cells is one row per node and column, not one per CPU, which 18.16
    /// grouped 5 times slower; [`PEAK_SHARE`] is the busiest one's share). `dedup`: a raw
    /// block sent twice counted once (`max` per block), for a few nodes' cells; the ranking
    /// over every node sums (a re-sent block repeats its busy and idle: shares hold).
    pub fn cpu_cells(&self, s: &Split, dedup: bool) -> String {
        self.cpu_cells_from(&s.clone().into(), dedup, CPU_1M, false)
    }

    /// As [`Self::cpu_cells`] for `t`: the whole minutes from `rollup` (`cpu_1m`, or
    /// `cpu_node_1m`: arrays of one, a node's CPUs summed), the whole five minutes from `cpu_5m`.
    /// `spans`: also `ssp`, the ns each CPU's blocks covered (`cpu_node_1m`: the node's), the
    /// most of which is the seconds the node's cell covered (`cpu_5m` has none: empty).
    pub fn cpu_cells_from(&self, t: &Tiers, dedup: bool, rollup: &str, spans: bool) -> String {
        let span = |v: &str| if spans { format!(", {v} AS asp") } else { String::new() };
        let mut parts = Vec::new();
        for w in &t.raw {
            let range = format!("{TS} >= {} AND {TS} < {}{}", w.from_ns, w.to_ns, self.nodes);
            let table = self.fleet.table(schema::CPU_SECONDS);
            let rows = if dedup {
                format!(
                    "SELECT {NODE} AS nd, {} AS col, {CPU} AS cp, toUInt64(max({BUSY})) AS pb, toUInt64(max({})) AS pi, \
                     toUInt64(max({SPAN})) AS ps FROM {table} WHERE {range} GROUP BY {NODE}, {TS}, {CPU}",
                    self.col(TS),
                    raw_idle()
                )
            } else {
                format!(
                    "SELECT {NODE} AS nd, {} AS col, {CPU} AS cp, toUInt64(sum({BUSY})) AS pb, toUInt64(sum({})) AS pi, \
                     toUInt64(sum({SPAN})) AS ps FROM {table} WHERE {range} GROUP BY nd, col, cp",
                    self.col(TS),
                    raw_idle()
                )
            };
            parts.push(format!(
                "SELECT nd, col, {} AS ab, {} AS ai{} FROM ({rows})",
                per_cpu("cp", "pb"),
                per_cpu("cp", "pi"),
                span(&per_cpu("cp", "ps"))
            ));
        }
        let cpu = if rollup == CPU_1M { CPU } else { "toUInt16(0)" };
        for m in &t.minutes {
            // Each row's own figures, summed once by the grouping below: grouping here too took
            // twice as long (a day of 1,000 nodes' CPU columns is 4.6 M groups).
            parts.push(format!(
                "SELECT {NODE} AS nd, {} AS col, {} AS ab, {} AS ai{} FROM {} WHERE {MINUTE} >= {} AND {MINUTE} < {}{}",
                self.col(MINUTE),
                per_cpu(cpu, "finalizeAggregation(busy_ticks)"),
                per_cpu(cpu, "finalizeAggregation(idle_ticks)"),
                span(&per_cpu(cpu, "finalizeAggregation(span_ns)")),
                self.fleet.table(rollup),
                m.from_ns,
                m.to_ns,
                self.nodes
            ));
        }
        for f in &t.fives {
            parts.push(format!(
                "SELECT {NODE} AS nd, {} AS col, finalizeAggregation(busy_cpus) AS ab, finalizeAggregation(idle_cpus) AS ai{} \
                 FROM {} WHERE {MINUTE} >= {} AND {MINUTE} < {}{}",
                self.col(MINUTE),
                span("emptyArrayUInt64()"),
                self.fleet.table(CPU_5M),
                f.from_ns,
                f.to_ns,
                self.nodes
            ));
        }
        format!(
            "SELECT nd, col, sumForEach(ab) AS sb, sumForEach(ai) AS si{} FROM ({}) GROUP BY nd, col",
            if spans { ", sumForEach(asp) AS ssp" } else { "" },
            parts.join(" UNION ALL ")
        )
    }

    /// Whether `idle_below` (percent) is the line `gpu_util_1m` counts below.
    fn gpu_rollup_fits(idle_below: f64) -> bool {
        (idle_below - IDLE_BELOW_PERCENT).abs() < 1e-9
    }

    /// The GPU readings' parts: `nd, col, pn, pu, pi, ps, pg` (readings, their sum in percent,
    /// those below `idle_below`, GPU-seconds read, the tracks), per node and column (`by_col`)
    /// or per node; `rolled`: (table, its time column, window) of the rollups' parts.
    fn gpu_parts(&self, raw: &[Window], rolled: &[(&str, &str, Window)], idle_below: f64, by_col: bool) -> Vec<String> {
        let mut parts = Vec::new();
        let key = |ts: &str| if by_col { format!("{} AS col", self.col(ts)) } else { "toInt64(0) AS col".to_string() };
        for w in raw {
            parts.push(format!(
                "SELECT {NODE} AS nd, {}, toUInt64(count()) AS pn, toFloat64(sum({VALUE})) AS pu, \
                 toUInt64(countIf({VALUE} < {idle_below})) AS pi, toUInt64(uniq({NAME}, intDiv({TS}, {SEC}))) AS ps, \
                 groupUniqArray({NAME}) AS pg FROM {} WHERE {TS} >= {} AND {TS} < {}{} AND {CPU} = -1 \
                 AND match({NAME}, {}) GROUP BY nd, col",
                key(TS),
                self.fleet.table(schema::COUNTERS),
                w.from_ns,
                w.to_ns,
                self.nodes,
                quote_str(GPU_UTIL_TRACK)
            ));
        }
        for (table, column, w) in rolled {
            parts.push(format!(
                "SELECT {NODE} AS nd, {}, toUInt64(sum(readings)) AS pn, toFloat64(sum(total)) AS pu, \
                 toUInt64(sum(below)) AS pi, toUInt64(sum(seconds)) AS ps, groupUniqArray({NAME}) AS pg FROM {} \
                 WHERE {column} >= {} AND {column} < {}{} GROUP BY nd, col",
                key(column),
                self.fleet.table(table),
                w.from_ns,
                w.to_ns,
                self.nodes
            ));
        }
        parts
    }

    /// A split's rollup part, as [`Parts::gpu_parts`] takes it.
    fn gpu_minutes(s: &Split) -> Vec<(&'static str, &'static str, Window)> {
        s.minutes.iter().map(|m| (GPU_UTIL_1M, MINUTE, *m)).collect()
    }

    /// The split of `w` for the GPU readings at `idle_below`: raw rows only when the rollup's
    /// line is another.
    pub fn gpu_split(&self, w: Window, idle_below: f64) -> Result<Split, FleetError> {
        if !Self::gpu_rollup_fits(idle_below) {
            return Ok(Split::raw(w));
        }
        self.split(GPU_UTIL_1M, w)
    }

    /// Per node: `nd, n, u, i, s, g`: readings, their sum, those idle, GPU-seconds, GPUs.
    pub fn gpu_nodes(&self, t: &Tiers, idle_below: f64) -> String {
        let mut rolled: Vec<(&str, &str, Window)> = t.hours.iter().map(|h| (GPU_UTIL_1H, HOUR, *h)).collect();
        rolled.extend(t.minutes.iter().map(|m| (GPU_UTIL_1M, MINUTE, *m)));
        format!(
            "SELECT nd, sum(pn) AS n, sum(pu) AS u, sum(pi) AS i, sum(ps) AS s, length(groupUniqArrayArray(pg)) AS g \
             FROM ({}) GROUP BY nd",
            self.gpu_parts(&t.raw, &rolled, idle_below, false).join(" UNION ALL ")
        )
    }

    /// Per node and column: `nd, col, pn, pu, pi` (the parts, to be summed by the caller).
    pub fn gpu_cells(&self, s: &Split, idle_below: f64) -> String {
        self.gpu_parts(&s.raw, &Self::gpu_minutes(s), idle_below, true).join(" UNION ALL ")
    }

    /// The ranking's CPU figures per node: `nd, share, busy, idle, most`, the share the busiest CPU's
    /// in any clock hour of the window (its part in the window), from `cpu_1h`'s whole hours,
    /// `cpu_1m`'s whole minutes and raw rows, summed without the per-block dedup (a re-sent
    /// block repeats its busy and idle: shares hold); `most`: [`MOST_TICKS`] over its hours.
    pub fn cpu_ranking(&self, t: &Tiers) -> String {
        let hr = |ts: &str| format!("intDiv({ts}, {HOUR_NS})");
        // Each CPU's ticks in arrays, as the cells: grouped per (node, hour), 16-192 times fewer
        // keys than per CPU (0.15 s against 0.23 s for a day's 384,000 hourly rows on 18.16).
        let arrays = |busy: &str, idle: &str| format!("{} AS ab, {} AS ai", per_cpu(CPU, busy), per_cpu(CPU, idle));
        let mut parts = Vec::new();
        for w in &t.raw {
            // Summed per CPU first: a minute of a fleet's raw rows is ~1 M rows, 16,000 sums.
            parts.push(format!(
                "SELECT nd, hr, {} AS ab, {} AS ai FROM (SELECT {NODE} AS nd, {} AS hr, {CPU} AS cp, \
                 toUInt64(sum({BUSY})) AS pb, toUInt64(sum({})) AS pi FROM {} WHERE {TS} >= {} AND {TS} < {}{} \
                 GROUP BY nd, hr, cp)",
                per_cpu("cp", "pb"),
                per_cpu("cp", "pi"),
                hr(TS),
                raw_idle(),
                self.fleet.table(schema::CPU_SECONDS),
                w.from_ns,
                w.to_ns,
                self.nodes
            ));
        }
        for m in &t.minutes {
            parts.push(format!(
                "SELECT {NODE} AS nd, {} AS hr, {} FROM {} WHERE {MINUTE} >= {} AND {MINUTE} < {}{}",
                hr(MINUTE),
                arrays("finalizeAggregation(busy_ticks)", "finalizeAggregation(idle_ticks)"),
                self.fleet.table(CPU_1M),
                m.from_ns,
                m.to_ns,
                self.nodes
            ));
        }
        for f in &t.fives {
            parts.push(format!(
                "SELECT {NODE} AS nd, {} AS hr, finalizeAggregation(busy_cpus) AS ab, finalizeAggregation(idle_cpus) AS ai \
                 FROM {} WHERE {MINUTE} >= {} AND {MINUTE} < {}{}",
                hr(MINUTE),
                self.fleet.table(CPU_5M),
                f.from_ns,
                f.to_ns,
                self.nodes
            ));
        }
        if let Some(h) = t.hours {
            parts.push(format!(
                "SELECT {NODE} AS nd, {} AS hr, {} FROM {} WHERE {HOUR} >= {} AND {HOUR} < {}{}",
                hr(HOUR),
                arrays("busy_ticks", "idle_ticks"),
                self.fleet.table(CPU_1H),
                h.from_ns,
                h.to_ns,
                self.nodes
            ));
        }
        format!(
            "SELECT nd, toFloat64(max({PEAK_SHARE})), toUInt64(sum(arraySum(sb))), toUInt64(sum(arraySum(si))), \
             toUInt64(sum({MOST_TICKS})) FROM \
             (SELECT nd, hr, sumForEach(ab) AS sb, sumForEach(ai) AS si FROM ({}) GROUP BY nd, hr) GROUP BY nd",
            parts.join(" UNION ALL ")
        )
    }

    /// The ranking's tiers for `w`: `hourly` and `minutely` rollups' whole hours and minutes
    /// (the GPU ones only at their idle line), raw rows at the edges.
    pub fn tiers(&self, w: Window, gpu: Option<f64>) -> Result<Tiers, FleetError> {
        let (hourly, minutely) = match gpu {
            Some(idle_below) if !Self::gpu_rollup_fits(idle_below) => return Ok(Tiers::raw(w)),
            Some(_) => (GPU_UTIL_1H, GPU_UTIL_1M),
            None => (CPU_1H, CPU_1M),
        };
        let hours = whole_hours_from(self.fleet, hourly, w)?;
        let minutes = whole_from(self.fleet, minutely, w)?;
        // The CPU's hours have five minutes around them (a day's window: 2 h of edges, 1.9 M
        // `cpu_1m` rows at 1,000 nodes of 16 CPUs, 0.4 M in `cpu_5m`).
        let fives = match gpu.is_none() && minutes.is_some() {
            true => whole_fives_from(self.fleet, w)?,
            false => None,
        };
        Ok(Tiers::cut(w, hours, fives, minutes))
    }
}

/// The tables a read's CPU and GPU parts came from, for a note (`cpu_1m 23h 55m, cpu_seconds 5m 0s`).
pub fn describe_cpu(s: &Split) -> String {
    s.describe(CPU_1M, schema::CPU_SECONDS)
}

/// As [`describe_cpu`], the minutes from `rollup`.
pub fn describe_cpu_from(s: &Split, rollup: &str) -> String {
    s.describe(rollup, schema::CPU_SECONDS)
}

/// As [`describe_cpu_from`], for tiers: `cpu_5m 23h 50m, cpu_1m 9m 0s, cpu_seconds 1m 0s`.
pub fn describe_cpu_tiers(t: &Tiers, rollup: &str) -> String {
    t.describe(CPU_5M, rollup, schema::CPU_SECONDS)
}

pub fn describe_gpu(s: &Split) -> String {
    s.describe(GPU_UTIL_1M, schema::COUNTERS)
}

/// The tables the ranking was read from (`cpu_1h 23h 0m, cpu_1m 59m 0s, cpu_seconds 1m 0s`).
pub fn describe_ranking(t: &Tiers, gpu: bool) -> String {
    match gpu {
        true => t.describe(GPU_UTIL_1H, GPU_UTIL_1M, schema::COUNTERS),
        false => t.describe(CPU_1H, CPU_1M, schema::CPU_SECONDS),
    }
}

#[cfg(test)]
#[path = "minutes_tests.rs"]
mod tests;
