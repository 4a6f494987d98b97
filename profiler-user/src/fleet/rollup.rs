//! Which table answers which part of a window: ClickHouse rolls the raw samples up by itself
//! (materialized views: per minute per node, per hour fleet-wide; docs/clickhouse.md), and a
//! read takes the coarsest table that still resolves the window. The window's whole hours come
//! from the hourly table, the whole minutes around them from the minutes, for the whole fleet
//! the whole seconds around those from the fleet's seconds, and only the slivers at the edges
//! from the raw rows, so the totals are those of the raw rows, to the sample. A fleet-wide
//! window of whole seconds (the CLI takes times relative to now to the second) reads no raw row.
//!
//! A rollup resolves only what it keeps: neither CPU nor pid (`--cpu`, `--pid` read raw rows),
//! no node in the hourly one (a read of some nodes uses minutes), nor a pod or a container id
//! (its workload is a class, `schema::workload_class`: namespace, container name, unit; `--pod`
//! and `--container ID` use minutes), and nothing before the view was created (its first unit
//! may hold part of one; [`Coverage`] starts after it).

use super::{Fleet, FleetError, select::Selection};
use crate::{
    query::{Filter, Window},
    ship::clickhouse::schema::{self, col::TS},
};

pub use schema::{HOUR_NS, MINUTE_NS, SECOND_NS, TEN_MINUTES_NS};

/// A table a part of a window is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Raw,
    Minutes,
    /// Fleet-wide minutes by workload class (`samples_fleet_1m`).
    FleetMinutes,
    /// Fleet-wide 10 minutes by workload class (`samples_fleet_10m`).
    FleetTenMinutes,
    Hours,
    /// Fleet-wide days by workload class (`samples_1d`).
    Days,
    /// Fleet-wide seconds by workload class (`samples_fleet_1s`): a window's edges.
    FleetSeconds,
    /// Per hour, stack and node, no workload (`stack_nodes_1h`): only which nodes ran a stack
    /// ([`plan_nodes`]); no fold reads it.
    NodeHours,
}

impl Source {
    pub fn table(self) -> &'static str {
        match self {
            Self::Raw => schema::SAMPLES,
            Self::Minutes => schema::SAMPLES_1M,
            Self::FleetMinutes => schema::SAMPLES_FLEET_1M,
            Self::FleetTenMinutes => schema::SAMPLES_FLEET_10M,
            Self::Hours => schema::SAMPLES_1H,
            Self::Days => schema::SAMPLES_1D,
            Self::FleetSeconds => schema::SAMPLES_FLEET_1S,
            Self::NodeHours => schema::STACK_NODES_1H,
        }
    }

    fn unit_ns(self) -> u64 {
        match self {
            Self::Raw => 1,
            Self::FleetSeconds => SECOND_NS,
            Self::Minutes | Self::FleetMinutes => MINUTE_NS,
            Self::FleetTenMinutes => TEN_MINUTES_NS,
            Self::Hours | Self::NodeHours => HOUR_NS,
            Self::Days => schema::DAY_NS,
        }
    }

    /// Whether its rows have no node (and a workload class, not a pod): it answers for the
    /// whole fleet only.
    pub fn fleet_wide(self) -> bool {
        matches!(self, Self::FleetMinutes | Self::FleetTenMinutes | Self::Hours | Self::Days | Self::FleetSeconds)
    }
}

/// The rollups, coarsest first: a window takes whole units of the first that resolves them.
/// The fleet's seconds come last, for what no minute resolves (a fleet-wide read takes node
/// minutes only where the fleet minutes began later than they did).
const TIERS: [Source; 6] =
    [Source::Days, Source::Hours, Source::FleetTenMinutes, Source::FleetMinutes, Source::Minutes, Source::FleetSeconds];

/// From when each rollup holds whole units: the unit after the first one it has rows for
/// (`None`: it does not exist, or holds nothing yet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Coverage {
    pub minutes_from: Option<u64>,
    pub hours_from: Option<u64>,
    pub fleet_minutes_from: Option<u64>,
    pub fleet_ten_minutes_from: Option<u64>,
    pub days_from: Option<u64>,
    pub fleet_seconds_from: Option<u64>,
    pub node_hours_from: Option<u64>,
    /// No raw row is in `[window end, quiet_until)` ([`Coverage::read`]): the window's last
    /// unit may be read whole from a rollup ([`plan`]). `None`: rows follow the window's end
    /// in every unit it falls in, or it is on a unit's end.
    pub quiet_until: Option<u64>,
    /// No raw row is in `[window start, raw_empty_until)`: a rollup's first unit is inside the
    /// window and the raw rows hold nothing before it ([`Coverage::read`]), so the fleet's data
    /// begins there. [`plan`] reads no raw rows there: `samples` is sorted by node and CPU, so
    /// a time range in a day that holds data reads every CPU's granules around it (the nodes
    /// of the top stacks of a day that began before a thousand nodes' data did: 0.48 s a
    /// shard, for no row).
    pub raw_empty_until: Option<u64>,
}

/// Units the rows after a window's end are looked for in, coarsest first: each tier's.
const QUIET_UNITS: [u64; 5] = [schema::DAY_NS, HOUR_NS, TEN_MINUTES_NS, MINUTE_NS, SECOND_NS];

/// How long after a second's end its rows may still be on their way (the shipper sends a
/// second 5 s after it ended, in batches of 5 s or more, each a request of up to 30 s): a
/// unit that ended longer ago than this, or one after the reader's now, is not being filled
/// while the read runs.
const SETTLED_NS: u64 = 60 * SECOND_NS;

/// The end of the coarsest unit holding `window`'s end in which no raw row follows it
/// (`rows_in(a, b)`: whether `[a, b)` holds any), among units that are not being filled now:
/// the window ends now (or later), or the unit is settled. A read that runs for more than
/// about 4 s may then count rows sent meanwhile after a window that ends now, as a read of
/// raw rows counts rows sent meanwhile inside it. A window ending now, or where the fleet's
/// data stops, thus reads its last unit whole from the rollups, which hold only the rows
/// before its end; the fleet's seconds for a last minute still being merged cost ~0.4 s a
/// shard at 1,000 nodes.
pub fn quiet_until(
    window: Window,
    now_ns: u64,
    mut rows_in: impl FnMut(u64, u64) -> Result<bool, FleetError>,
) -> Result<Option<u64>, FleetError> {
    let to = window.to_ns;
    for unit in QUIET_UNITS {
        let end = to.div_ceil(unit).saturating_mul(unit);
        // A window that ends now (the CLI's `now`, read a moment before this) is followed by
        // rows no shipper sends before 5 s have passed.
        let filling = to.saturating_add(SECOND_NS) < now_ns && end.saturating_add(SETTLED_NS) > now_ns;
        if end > to && !filling && !rows_in(to, end)? {
            return Ok(Some(end));
        }
    }
    Ok(None)
}

/// How far into a window the first look for a rollup's rows goes (the partitions it reads):
/// rows there settle the question for a rollup that has run for a while.
const FIRST_LOOK_NS: u64 = 86_400 * 1_000_000_000;

impl Coverage {
    /// Read from the server for `window`: from which unit each rollup holds whole units there.
    /// A rollup with rows in the unit before the window ran before it (all of it resolves);
    /// otherwise its first unit in the window may be its first ever, and is left out, unless
    /// the raw rows hold nothing before it either (from the unit before the window): then the
    /// data begins there, and the view saw all of it (a fleet's first minutes; the scale bench).
    /// Only the partitions of the window's first day are read first, the rest only if those
    /// hold none.
    pub fn read(fleet: &Fleet, window: Window) -> Result<Self, FleetError> {
        let raw_before = |a: u64, b: u64| rows_in(fleet, schema::SAMPLES, a, b);
        let first = |s: Source| -> Result<(Option<u64>, Option<u64>), FleetError> {
            let unit = s.unit_ns();
            let start = window.from_ns / unit * unit;
            // The usual answer first: rows in the unit before the window (a rollup that has run
            // for a while). `LIMIT 1` stops at the first row met, where the first row of the
            // window's first day reads all of that day's `ts` (a day of a thousand nodes'
            // `samples_1m` is billions of rows).
            match rows_in(fleet, s.table(), start.saturating_sub(unit), start) {
                Ok(true) => return Ok((Some(start), None)),
                Ok(false) => {}
                // A server shipped to before the rollups existed has no such table.
                Err(FleetError::NoNodes(_)) => return Ok((None, None)),
                Err(e) => return Err(e),
            }
            let look = |a: u64, b: u64| -> Result<Option<u64>, FleetError> {
                let sql = format!(
                    "SELECT count(), min({TS}) FROM {} WHERE {TS} >= {a} AND {TS} < {b}",
                    fleet.table(s.table())
                );
                let rows = fleet.rows(&sql, |r| Ok((r.u64()?, r.u64()?)))?;
                Ok(rows.first().filter(|(n, _)| *n > 0).map(|(_, ts)| *ts))
            };
            let near = start.saturating_add(FIRST_LOOK_NS).min(window.to_ns);
            let found = match look(start.saturating_sub(unit), near) {
                Ok(Some(ts)) => Some(ts),
                Ok(None) if near < window.to_ns => look(near, window.to_ns)?,
                Ok(None) => None,
                // A server shipped to before the rollups existed has no such table.
                Err(FleetError::NoNodes(_)) => return Ok((None, None)),
                Err(e) => return Err(e),
            };
            // From when it holds whole units, and until when no raw row is in the window.
            match found {
                Some(ts) if ts < start => Ok((Some(start), None)),
                Some(ts) if !raw_before(start.saturating_sub(unit), ts)? => Ok((Some(ts), Some(ts))),
                Some(ts) => Ok((Some(ts + unit), None)),
                None => Ok((None, None)),
            }
        };
        let now_ns = now_ns();
        // The rollups at once: each is one to three small requests, ~70 ms in a row.
        const ALL: [Source; 7] = [
            Source::Minutes,
            Source::Hours,
            Source::FleetMinutes,
            Source::FleetTenMinutes,
            Source::Days,
            Source::FleetSeconds,
            Source::NodeHours,
        ];
        let (firsts, quiet) = std::thread::scope(|s| {
            let quiet = s.spawn(|| quiet_until(window, now_ns, &raw_before));
            let firsts = ALL
                .map(|source| s.spawn(move || first(source)))
                .map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
            (firsts, quiet.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        });
        let firsts: Vec<(Option<u64>, Option<u64>)> = firsts.into_iter().collect::<Result<_, _>>()?;
        let from = |i: usize| firsts[i].0;
        Ok(Self {
            minutes_from: from(0),
            hours_from: from(1),
            fleet_minutes_from: from(2),
            fleet_ten_minutes_from: from(3),
            days_from: from(4),
            fleet_seconds_from: from(5),
            node_hours_from: from(6),
            quiet_until: quiet?,
            raw_empty_until: firsts.iter().filter_map(|f| f.1).max(),
        })
    }

    fn from(&self, s: Source) -> Option<u64> {
        match s {
            Source::Raw => None,
            Source::Minutes => self.minutes_from,
            Source::FleetMinutes => self.fleet_minutes_from,
            Source::FleetTenMinutes => self.fleet_ten_minutes_from,
            Source::Hours => self.hours_from,
            Source::Days => self.days_from,
            Source::FleetSeconds => self.fleet_seconds_from,
            Source::NodeHours => self.node_hours_from,
        }
    }
}

/// A part of a window and the table that answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub source: Source,
    pub window: Window,
}

/// The parts of `window` and their tables, in time order: the coarsest table that resolves
/// each part, raw rows where none does.
pub fn plan(window: Window, filter: &Filter, selection: &Selection, cover: Coverage) -> Vec<Piece> {
    let rolled = filter.cpus.is_empty() && filter.pid.is_none();
    let whole_fleet = selection.whole_fleet && class_resolves(&filter.workload);
    // The fleet-wide tables only for a read of the whole fleet that a class decides.
    let tiers: Vec<Source> =
        TIERS.into_iter().filter(|s| rolled && (whole_fleet || !s.fleet_wide()) && cover.from(*s).is_some()).collect();
    let mut out = Vec::new();
    split(widened_end(window, &tiers, cover), &tiers, cover, &mut out);
    out
}

/// `w` with its end moved to the end of the unit it falls in, for the coarsest of `tiers`
/// that holds that unit whole inside `[w.from_ns, ...)` and where no row follows `w`'s end
/// in it (`cover.quiet_until`): that unit's rows are all in `w`.
fn widened_end(w: Window, tiers: &[Source], cover: Coverage) -> Window {
    let Some(quiet) = cover.quiet_until else { return w };
    for &s in tiers {
        let unit = s.unit_ns();
        let end = w.to_ns.div_ceil(unit).saturating_mul(unit);
        let start = end - unit;
        if end > w.to_ns && end <= quiet && start >= w.from_ns && cover.from(s).is_some_and(|f| f <= start) {
            return Window { from_ns: w.from_ns, to_ns: end };
        }
    }
    w
}

/// The parts of `window` to count the nodes a stack ran on: whole hours from `stack_nodes_1h`,
/// the minutes around them from the per-node minutes, raw rows where no minute is kept (no
/// workload, CPU or pid filter: the node and the stack are all it keeps). Each edge is widened
/// to its whole minute where the minutes hold it: this is a count of nodes, not a sum, and a
/// fleet's raw edge reads every CPU's granule around it (`samples` is sorted by node and CPU:
/// ~2.3 s a shard at 1,000 nodes); a window ending now loses nothing by it (no minute holds
/// rows after now), one starting inside a minute counts that minute's first seconds too.
pub fn plan_nodes(window: Window, cover: Coverage) -> Vec<Piece> {
    let tiers: Vec<Source> =
        [Source::NodeHours, Source::Minutes].into_iter().filter(|s| cover.from(*s).is_some()).collect();
    // A window followed by no row: its last hour whole from the hours, as [`plan`] reads it
    // (the minutes of a thousand nodes' last half hour, read for a few stacks: 0.58 s a shard).
    let window = widened_end(window, &tiers, cover);
    let held = |minute: u64| cover.minutes_from.is_some_and(|m| minute >= m);
    let (a, b) = (window.from_ns / MINUTE_NS * MINUTE_NS, window.to_ns / MINUTE_NS * MINUTE_NS);
    let widened = Window {
        from_ns: if held(a) { a } else { window.from_ns },
        to_ns: if held(b) && b < window.to_ns { b + MINUTE_NS } else { window.to_ns },
    };
    let mut out = Vec::new();
    split(widened, &tiers, cover, &mut out);
    out
}

/// Whether a workload filter is decided by a workload's class (what the hourly rollup keeps):
/// not a pod, nor a container id (12 or more hex digits, as `identity::Identity::matches`
/// reads a container's name or id).
fn class_resolves(w: &crate::identity::Filter) -> bool {
    let id = |c: &String| c.len() >= 12 && c.bytes().all(|b| b.is_ascii_hexdigit());
    w.pod.is_none() && !w.container.as_ref().is_some_and(id)
}

/// Cuts `w` among `tiers` (coarsest first): the first tier's whole units, the slivers around
/// them by the finer tiers, raw rows where none is left.
fn split(w: Window, tiers: &[Source], cover: Coverage, out: &mut Vec<Piece>) {
    for (i, &source) in tiers.iter().enumerate() {
        let Some(from) = cover.from(source) else { continue };
        let unit = source.unit_ns();
        let a = w.from_ns.max(from).div_ceil(unit) * unit;
        let b = w.to_ns / unit * unit;
        if a >= b {
            continue;
        }
        // The slivers before and after go to the finer tables.
        let finer = &tiers[i + 1..];
        if w.from_ns < a {
            split(Window { from_ns: w.from_ns, to_ns: a }, finer, cover, out);
        }
        out.push(Piece { source, window: Window { from_ns: a, to_ns: b } });
        if b < w.to_ns {
            split(Window { from_ns: b, to_ns: w.to_ns }, finer, cover, out);
        }
        return;
    }
    // None where the raw rows are known to hold nothing (never all of a window: the rows a
    // rollup found are in it, after that).
    let from = cover.raw_empty_until.map_or(w.from_ns, |e| e.clamp(w.from_ns, w.to_ns));
    if from < w.to_ns {
        out.push(Piece { source: Source::Raw, window: Window { from_ns: from, to_ns: w.to_ns } });
    }
}

/// Whether `table` has rows with `ts` in `[a, b)`: the first one found answers (the parts'
/// ranges of `ts` skip the rest).
pub fn rows_in(fleet: &Fleet, table: &str, a: u64, b: u64) -> Result<bool, FleetError> {
    let sql = format!(
        "SELECT toUInt64(count()) FROM (SELECT 1 FROM {} WHERE {TS} >= {a} AND {TS} < {b} LIMIT 1)",
        fleet.table(table)
    );
    Ok(fleet.rows(&sql, |r| r.u64())?.first().is_some_and(|&n| n > 0))
}

/// Now, for the reads that ask whether rows can still arrive ([`quiet_until`]).
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// For a note: which tables answered (`samples_1h 2 h, samples_1m 58 min, samples 1.5 s`).
pub fn describe(plan: &[Piece]) -> String {
    let mut per: Vec<(Source, u64)> = Vec::new();
    for p in plan {
        let d = p.window.to_ns - p.window.from_ns;
        match per.iter_mut().find(|(s, _)| *s == p.source) {
            Some((_, t)) => *t += d,
            None => per.push((p.source, d)),
        }
    }
    per.iter()
        .map(|(s, d)| format!("{} {}", s.table(), crate::timespec::format_duration(*d)))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
#[path = "rollup_tests.rs"]
mod tests;
