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
mod tests {
    use super::*;

    fn sel(whole_fleet: bool) -> Selection {
        Selection { nodes: Vec::new(), whole_fleet }
    }

    const T0: u64 = 1_795_000_000 * 1_000_000_000 / HOUR_NS * HOUR_NS;

    fn w(a: u64, b: u64) -> Window {
        Window { from_ns: a, to_ns: b }
    }

    #[test]
    fn a_window_followed_by_no_row_reads_its_last_unit_whole() {
        let from = T0 + 59 * MINUTE_NS + 30_500_000_000;
        let to = T0 + 3 * HOUR_NS + MINUTE_NS + 10_000_000_000;
        let quiet = Coverage {
            minutes_from: Some(0),
            hours_from: Some(0),
            quiet_until: Some(T0 + 4 * HOUR_NS),
            ..Default::default()
        };
        let got = |c: Coverage, from, to| -> Vec<(Source, u64, u64)> {
            plan(w(from, to), &Filter::default(), &sel(true), c)
                .iter()
                .map(|p| (p.source, p.window.from_ns, p.window.to_ns))
                .collect()
        };
        // The last hour from the hours: no row after `to` in it.
        assert_eq!(
            got(quiet, from, to),
            vec![(Source::Raw, from, T0 + HOUR_NS), (Source::Hours, T0 + HOUR_NS, T0 + 4 * HOUR_NS)]
        );
        // Rows later in that hour, none in its minute: the minute.
        let minute = Coverage { quiet_until: Some(T0 + 3 * HOUR_NS + 2 * MINUTE_NS), ..quiet };
        let minutes = (Source::Minutes, T0 + 3 * HOUR_NS, T0 + 3 * HOUR_NS + 2 * MINUTE_NS);
        assert_eq!(got(minute, from, to).last(), Some(&minutes));
        // A unit starting before the window, or one the rollup does not hold whole: as asked.
        let inside = (T0 + 10 * SECOND_NS, T0 + 20 * SECOND_NS);
        assert_eq!(got(quiet, inside.0, inside.1), vec![(Source::Raw, inside.0, inside.1)]);
        let late = Coverage { hours_from: Some(T0 + 4 * HOUR_NS), ..quiet };
        assert_eq!(
            got(late, from, to).last(),
            Some(&(Source::Minutes, T0 + HOUR_NS, T0 + 3 * HOUR_NS + 2 * MINUTE_NS))
        );
        // `--cpu` reads raw rows: nothing widened.
        let cpu = Filter { cpus: vec![1], ..Filter::default() };
        assert_eq!(plan(w(from, to), &cpu, &sel(true), quiet)[0].window, w(from, to));
    }

    #[test]
    fn the_rows_after_a_window_are_looked_for_where_none_can_arrive_meanwhile() {
        let to = T0 + 3 * HOUR_NS + 10 * SECOND_NS;
        let mut asked = Vec::new();
        let rows_after = |after: u64| {
            move |a: u64, b: u64| -> Result<bool, FleetError> {
                assert_eq!(a, to);
                Ok(b > to.saturating_add(after))
            }
        };
        let day_end = to.div_ceil(schema::DAY_NS) * schema::DAY_NS;
        // Ending now: the coarsest unit with no row after the end.
        assert_eq!(quiet_until(w(T0, to), to + 500_000_000, rows_after(u64::MAX)).unwrap(), Some(day_end));
        assert_eq!(
            quiet_until(w(T0, to), to, rows_after(120 * SECOND_NS)).unwrap(),
            Some(T0 + 3 * HOUR_NS + MINUTE_NS)
        );
        assert_eq!(quiet_until(w(T0, to), to, rows_after(30 * SECOND_NS)).unwrap(), None, "rows in the minute");
        // Ended 10 s ago: every unit holding its end is still being filled; nothing is asked.
        let log = |a: u64, b: u64| -> Result<bool, FleetError> {
            asked.push((a, b));
            Ok(false)
        };
        assert_eq!(quiet_until(w(T0, to), to + 10 * SECOND_NS, log).unwrap(), None);
        assert!(asked.is_empty(), "{asked:?}");
        // Long settled (the fleet's data stops there): looked for.
        assert_eq!(quiet_until(w(T0, to), to + 2 * schema::DAY_NS, rows_after(u64::MAX)).unwrap(), Some(day_end));
        // On a unit's end: nothing to widen.
        let nothing = |_, _| -> Result<bool, FleetError> { panic!("nothing to look for") };
        assert_eq!(quiet_until(w(T0, day_end), T0, nothing).unwrap(), None);
    }

    #[test]
    fn a_window_is_read_from_hours_then_minutes_then_raw_rows_at_its_edges() {
        let cover = Coverage { minutes_from: Some(0), hours_from: Some(0), ..Default::default() };
        // 00:59:30.5 to 03:01:10: raw, a minute, two hours, a minute, raw.
        let from = T0 + 59 * MINUTE_NS + 30_500_000_000;
        let to = T0 + 3 * HOUR_NS + MINUTE_NS + 10_000_000_000;
        let p = plan(w(from, to), &Filter::default(), &sel(true), cover);
        let got: Vec<(Source, u64, u64)> = p.iter().map(|p| (p.source, p.window.from_ns, p.window.to_ns)).collect();
        assert_eq!(
            got,
            vec![
                (Source::Raw, from, T0 + HOUR_NS),
                (Source::Hours, T0 + HOUR_NS, T0 + 3 * HOUR_NS),
                (Source::Minutes, T0 + 3 * HOUR_NS, T0 + 3 * HOUR_NS + MINUTE_NS),
                (Source::Raw, T0 + 3 * HOUR_NS + MINUTE_NS, to),
            ]
        );
        // The parts cover the window once.
        assert!(p.windows(2).all(|x| x[0].window.to_ns == x[1].window.from_ns));
        assert_eq!(describe(&p), "samples 39.500s, samples_1h 2h 0m, samples_1m 1m 0s");
    }

    #[test]
    fn no_raw_rows_are_read_before_the_data_begins() {
        // The data begins at 02:10:20 (its first minute and hour are the rollups' first): the
        // raw rows before it are not read; those at the end are.
        let begins = T0 + 2 * HOUR_NS + 10 * MINUTE_NS + 20 * SECOND_NS;
        let cover = Coverage {
            minutes_from: Some(begins / MINUTE_NS * MINUTE_NS),
            node_hours_from: Some(begins / HOUR_NS * HOUR_NS),
            raw_empty_until: Some(begins),
            ..Default::default()
        };
        let (from, to) = (T0 + 30 * SECOND_NS, T0 + 3 * HOUR_NS + 10 * SECOND_NS);
        let got = |p: Vec<Piece>| -> Vec<(Source, u64, u64)> {
            p.iter().map(|p| (p.source, p.window.from_ns, p.window.to_ns)).collect()
        };
        let minutes = (Source::Minutes, T0 + 2 * HOUR_NS + 10 * MINUTE_NS, T0 + 3 * HOUR_NS);
        assert_eq!(
            got(plan(w(from, to), &Filter::default(), &sel(false), cover)),
            vec![minutes, (Source::Raw, T0 + 3 * HOUR_NS, to)]
        );
        // `--cpu`: raw rows only, from where the data begins.
        let cpu = Filter { cpus: vec![1], ..Filter::default() };
        assert_eq!(got(plan(w(from, to), &cpu, &sel(false), cover)), vec![(Source::Raw, begins, to)]);
        // The nodes of a stack: the hour the data began in from the node hours.
        assert_eq!(
            got(plan_nodes(w(from, to), cover)),
            vec![
                (Source::NodeHours, T0 + 2 * HOUR_NS, T0 + 3 * HOUR_NS),
                (Source::Minutes, T0 + 3 * HOUR_NS, T0 + 3 * HOUR_NS + MINUTE_NS)
            ]
        );
        // No row after the window in its hour: that hour whole from the node hours.
        let quiet = Coverage { quiet_until: Some(T0 + 4 * HOUR_NS), ..cover };
        assert_eq!(got(plan_nodes(w(from, to), quiet)), vec![(Source::NodeHours, T0 + 2 * HOUR_NS, T0 + 4 * HOUR_NS)]);
        // Without it, as before: raw rows from the window's start.
        let unknown = Coverage { raw_empty_until: None, ..cover };
        assert_eq!(got(plan(w(from, to), &cpu, &sel(false), unknown)), vec![(Source::Raw, from, to)]);
    }

    #[test]
    fn the_nodes_of_a_stack_are_counted_from_node_hours_then_node_minutes_then_raw_rows() {
        let from = T0 + 59 * MINUTE_NS + 30_500_000_000;
        let to = T0 + 3 * HOUR_NS + MINUTE_NS + 10_000_000_000;
        // No fleet-wide table, whatever the coverage: they have no node.
        let all = Some(0);
        let cover = Coverage {
            minutes_from: all,
            hours_from: all,
            fleet_minutes_from: all,
            node_hours_from: all,
            ..Default::default()
        };
        let got: Vec<(Source, u64, u64)> =
            plan_nodes(w(from, to), cover).iter().map(|p| (p.source, p.window.from_ns, p.window.to_ns)).collect();
        // Widened to the minutes around its edges: no raw row.
        assert_eq!(
            got,
            vec![
                (Source::Minutes, T0 + 59 * MINUTE_NS, T0 + HOUR_NS),
                (Source::NodeHours, T0 + HOUR_NS, T0 + 3 * HOUR_NS),
                (Source::Minutes, T0 + 3 * HOUR_NS, T0 + 3 * HOUR_NS + 2 * MINUTE_NS),
            ]
        );
        // Minutes begun after the window's start: raw rows there, to the nanosecond.
        let cover_late = Coverage { minutes_from: Some(T0 + HOUR_NS), ..cover };
        let got: Vec<(Source, u64, u64)> =
            plan_nodes(w(from, to), cover_late).iter().map(|p| (p.source, p.window.from_ns, p.window.to_ns)).collect();
        assert_eq!(got[0], (Source::Raw, from, T0 + HOUR_NS));
        assert_eq!(got.last().unwrap().2, T0 + 3 * HOUR_NS + 2 * MINUTE_NS);
        // Node hours begun later (a database from before them): minutes until then.
        let late = Coverage { node_hours_from: Some(T0 + 2 * HOUR_NS), ..cover };
        let got: Vec<Source> = plan_nodes(w(T0, T0 + 3 * HOUR_NS), late).iter().map(|p| p.source).collect();
        assert_eq!(got, [Source::Minutes, Source::NodeHours]);
        // Neither: raw rows.
        assert_eq!(
            plan_nodes(w(from, to), Coverage::default()),
            vec![Piece { source: Source::Raw, window: w(from, to) }]
        );
    }

    #[test]
    fn the_fleet_reads_its_class_tables_around_the_hours_and_some_nodes_do_not() {
        let all = Some(0);
        let cover = Coverage {
            minutes_from: all,
            hours_from: all,
            fleet_minutes_from: all,
            fleet_ten_minutes_from: all,
            days_from: None,
            fleet_seconds_from: None,
            node_hours_from: None,
            quiet_until: None,
            raw_empty_until: None,
        };
        // 00:42:10 to 02:13:30: raw, fleet minutes to 00:50, 10 minutes to 01:00, an hour,
        // 10 minutes to 02:10, fleet minutes to 02:13, raw.
        let from = T0 + 42 * MINUTE_NS + 10_000_000_000;
        let to = T0 + 2 * HOUR_NS + 13 * MINUTE_NS + 30_000_000_000;
        let got: Vec<(Source, u64, u64)> = plan(w(from, to), &Filter::default(), &sel(true), cover)
            .iter()
            .map(|p| (p.source, p.window.from_ns, p.window.to_ns))
            .collect();
        let m = |n: u64| T0 + n * MINUTE_NS;
        assert_eq!(
            got,
            vec![
                (Source::Raw, from, m(43)),
                (Source::FleetMinutes, m(43), m(50)),
                (Source::FleetTenMinutes, m(50), m(60)),
                (Source::Hours, m(60), m(120)),
                (Source::FleetTenMinutes, m(120), m(130)),
                (Source::FleetMinutes, m(130), m(133)),
                (Source::Raw, m(133), to),
            ]
        );
        // Days where a window holds whole ones.
        let cover = Coverage { days_from: all, ..cover };
        let day = schema::DAY_NS;
        let d0 = T0 / day * day;
        let p = plan(w(d0 + day - HOUR_NS, d0 + 3 * day + HOUR_NS), &Filter::default(), &sel(true), cover);
        let got: Vec<Source> = p.iter().map(|p| p.source).collect();
        assert_eq!(got, [Source::Hours, Source::Days, Source::Hours]);
        assert_eq!(p[1].window, w(d0 + day, d0 + 3 * day));
        // Some nodes, or a pod: the per-node minutes only.
        let p = plan(w(from, to), &Filter::default(), &sel(false), cover);
        assert!(p.iter().all(|p| matches!(p.source, Source::Raw | Source::Minutes)), "{p:?}");
        // Fleet minutes begun later than the node minutes: the node minutes before them.
        let late = Coverage { fleet_minutes_from: Some(m(46)), fleet_ten_minutes_from: None, days_from: None, ..cover };
        let p = plan(w(m(40), m(50)), &Filter::default(), &sel(true), late);
        assert_eq!(
            p,
            vec![
                Piece { source: Source::Minutes, window: w(m(40), m(46)) },
                Piece { source: Source::FleetMinutes, window: w(m(46), m(50)) },
            ]
        );
    }

    #[test]
    fn the_fleet_reads_its_seconds_at_the_edges_and_raw_rows_only_within_a_second() {
        let all = Some(0);
        let cover = Coverage {
            minutes_from: all,
            hours_from: all,
            fleet_minutes_from: all,
            fleet_ten_minutes_from: all,
            days_from: all,
            fleet_seconds_from: all,
            node_hours_from: all,
            quiet_until: None,
            raw_empty_until: None,
        };
        let m = |n: u64| T0 + n * MINUTE_NS;
        let s = |n: u64| T0 + n * SECOND_NS;
        // 00:42:10.25 to 00:51:03.5: raw to 00:42:11, seconds to 00:43, fleet minutes to
        // 00:51, seconds to 00:51:03, raw.
        let (from, to) = (s(42 * 60 + 10) + SECOND_NS / 4, s(51 * 60 + 3) + SECOND_NS / 2);
        let p = plan(w(from, to), &Filter::default(), &sel(true), cover);
        assert_eq!(
            p,
            vec![
                Piece { source: Source::Raw, window: w(from, s(42 * 60 + 11)) },
                Piece { source: Source::FleetSeconds, window: w(s(42 * 60 + 11), m(43)) },
                Piece { source: Source::FleetMinutes, window: w(m(43), m(51)) },
                Piece { source: Source::FleetSeconds, window: w(m(51), s(51 * 60 + 3)) },
                Piece { source: Source::Raw, window: w(s(51 * 60 + 3), to) },
            ]
        );
        assert_eq!(describe(&p), "samples 1.250s, samples_fleet_1s 52.000s, samples_fleet_1m 8m 0s");
        // Whole seconds (a window relative to now, taken to the second): no raw row.
        let p = plan(w(s(42 * 60 + 10), s(51 * 60 + 3)), &Filter::default(), &sel(true), cover);
        assert!(p.iter().all(|p| p.source != Source::Raw), "{p:?}");
        assert_eq!(p.iter().map(|p| p.window.to_ns - p.window.from_ns).sum::<u64>(), 533 * SECOND_NS);
        // An hour of whole seconds: an hour's edges, seconds within the minutes.
        let p = plan(w(s(59 * 60 + 30), s(2 * 3600 + 45)), &Filter::default(), &sel(true), cover);
        let got: Vec<Source> = p.iter().map(|p| p.source).collect();
        assert_eq!(got, [Source::FleetSeconds, Source::Hours, Source::FleetSeconds]);
        // Some nodes, a pod, or a CPU: no fleet seconds (they keep neither node, pod nor CPU).
        let pod = crate::identity::Filter { pod: Some("trainer-0".into()), ..Default::default() };
        for (f, whole) in [
            (Filter::default(), false),
            (Filter { workload: pod, ..Default::default() }, true),
            (Filter { cpus: vec![1], ..Default::default() }, true),
        ] {
            let p = plan(w(from, to), &f, &sel(whole), cover);
            assert!(p.iter().all(|p| p.source != Source::FleetSeconds), "{p:?}");
            assert_eq!(p.first().map(|p| p.source), Some(Source::Raw));
        }
        // Seconds begun at 00:42:30 (a view created then): raw rows before.
        let late = Coverage { fleet_seconds_from: Some(s(42 * 60 + 30)), ..cover };
        let p = plan(w(from, to), &Filter::default(), &sel(true), late);
        assert_eq!(p[0], Piece { source: Source::Raw, window: w(from, s(42 * 60 + 30)) });
        assert_eq!(p[1], Piece { source: Source::FleetSeconds, window: w(s(42 * 60 + 30), m(43)) });
    }

    #[test]
    fn some_nodes_read_minutes_and_cpu_or_pid_filters_read_raw_rows() {
        let cover = Coverage { minutes_from: Some(0), hours_from: Some(0), ..Default::default() };
        let day = w(T0, T0 + 24 * HOUR_NS);
        let p = plan(day, &Filter::default(), &sel(false), cover);
        assert_eq!(p, vec![Piece { source: Source::Minutes, window: day }]);
        for f in [Filter { cpus: vec![3], ..Default::default() }, Filter { pid: Some(9), ..Default::default() }] {
            assert_eq!(plan(day, &f, &sel(true), cover), vec![Piece { source: Source::Raw, window: day }]);
        }
    }

    #[test]
    fn a_pod_or_a_container_id_reads_minutes_a_namespace_or_a_container_name_hours() {
        let cover = Coverage { minutes_from: Some(0), hours_from: Some(0), ..Default::default() };
        let day = w(T0, T0 + 24 * HOUR_NS);
        let with = |workload: crate::identity::Filter| Filter { workload, ..Default::default() };
        type W = crate::identity::Filter;
        for f in [
            W { pod: Some("trainer-0".into()), ..Default::default() },
            W { container: Some("0123456789ab".into()), ..Default::default() },
        ] {
            assert_eq!(plan(day, &with(f), &sel(true), cover), vec![Piece { source: Source::Minutes, window: day }]);
        }
        for f in [
            W { namespace: Some("ml".into()), ..Default::default() },
            W { container: Some("trainer".into()), unit: Some("kubelet".into()), ..Default::default() },
        ] {
            assert_eq!(plan(day, &with(f), &sel(true), cover), vec![Piece { source: Source::Hours, window: day }]);
        }
    }

    #[test]
    fn nothing_before_a_rollup_began_is_read_from_it() {
        // Minutes from 00:30, no hours yet: 00:00-00:30 raw, then minutes.
        let cover = Coverage { minutes_from: Some(T0 + 30 * MINUTE_NS), ..Default::default() };
        let p = plan(w(T0, T0 + HOUR_NS), &Filter::default(), &sel(true), cover);
        assert_eq!(
            p,
            vec![
                Piece { source: Source::Raw, window: w(T0, T0 + 30 * MINUTE_NS) },
                Piece { source: Source::Minutes, window: w(T0 + 30 * MINUTE_NS, T0 + HOUR_NS) },
            ]
        );
        let none = plan(w(T0, T0 + HOUR_NS), &Filter::default(), &sel(true), Coverage::default());
        assert_eq!(none, vec![Piece { source: Source::Raw, window: w(T0, T0 + HOUR_NS) }]);
    }
}
