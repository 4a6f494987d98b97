//! Where the dying memory cgroups are heading: how fast they grow, and how long until a reader
//! of `memory.stat` would need a whole core.
//!
//! How the level is estimated. Reading a hierarchy's `memory.stat` walks its memory cgroups
//! (on v1 the root's `total_*` figures, on kernels before rstat every descendant, dying ones
//! included), so one read costs about `per_memcg × memcgs`. The upkeep stage times one read of
//! the hierarchy root's `memory.stat` (the CPU time of its own thread, so other load does not
//! inflate it) once a minute, beside the counts. The cost per memory cgroup is the slope of
//! those timings against the number of memory cgroups when that number has moved enough to
//! measure one ([`MIN_SPREAD`]); until then, the last timing divided by the number of memory
//! cgroups, live and dying: an upper bound, since part of a read's cost does not grow with them
//! (and kernels with rstat, 5.13 on, no longer walk dying ones for every read), so the warning
//! comes early rather than late. A core is saturated when a reader polling once a second
//! ([`READER_PERIOD_NS`]: node agents and the S2 scenario's reader do) spends the whole second
//! in one read: at `1 s / per_memcg` memory cgroups. The same figure by hand:
//!
//! ```text
//! python3 -c 'import time; t=time.thread_time_ns(); open("/sys/fs/cgroup/memory/memory.stat").read(); print(time.thread_time_ns()-t)'
//! ```
//!
//! divided by the `num_cgroups` of `memory` in /proc/cgroups (20.8 us for 156 memory cgroups on
//! the test machine, 6.18: 0.13 us each, a core at about 7.5 million).

use std::collections::VecDeque;

use crate::collect::memcg::MemcgCount;
use crate::store::format::NS_PER_SEC;

/// The reader a core's worth of reads is counted for: one read of `memory.stat` a second.
pub const READER_PERIOD_NS: f64 = 1e9;
/// Growth is measured over at most this long (the series' newest counts).
const GROWTH_WINDOW_NS: u64 = 600 * NS_PER_SEC;
/// ...and over at least this long.
const GROWTH_MIN_NS: u64 = 20 * NS_PER_SEC;
/// The timings' memory cgroup counts must spread over at least this many (and a fifth of
/// their mean) for a slope.
pub const MIN_SPREAD: u64 = 500;

/// Dying memory cgroups per minute over the last ten minutes of counts (as far as they reach,
/// at least 20 s), `None` without that span.
pub fn growth_per_minute(series: &VecDeque<MemcgCount>) -> Option<f64> {
    let last = series.back()?;
    let first = series.iter().find(|c| last.ts_ns.saturating_sub(c.ts_ns) <= GROWTH_WINDOW_NS)?;
    let span = last.ts_ns.checked_sub(first.ts_ns).filter(|&s| s >= GROWTH_MIN_NS)?;
    Some((last.dying as f64 - first.dying as f64) * 60e9 / span as f64)
}

/// How the cost per memory cgroup was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// The slope of read timings against memory cgroup counts.
    Slope,
    /// The last read's time over the memory cgroups (an upper bound).
    Average,
}

/// CPU ns of a `memory.stat` read per memory cgroup, from timings `(memcgs, ns)`.
pub fn cost_per_memcg_ns(timings: &[(u64, u64)]) -> Option<(f64, Method)> {
    let &(memcgs, ns) = timings.last()?;
    let n = timings.len() as f64;
    let mean_x = timings.iter().map(|t| t.0 as f64).sum::<f64>() / n;
    let (min, max) = timings.iter().fold((u64::MAX, 0), |(lo, hi), t| (lo.min(t.0), hi.max(t.0)));
    if max - min >= MIN_SPREAD.max((mean_x / 5.0) as u64) {
        let mean_y = timings.iter().map(|t| t.1 as f64).sum::<f64>() / n;
        let cov: f64 = timings.iter().map(|t| (t.0 as f64 - mean_x) * (t.1 as f64 - mean_y)).sum();
        let var: f64 = timings.iter().map(|t| (t.0 as f64 - mean_x).powi(2)).sum();
        let slope = cov / var;
        if slope.is_finite() && slope > 0.0 {
            return Some((slope, Method::Slope));
        }
    }
    (memcgs > 0 && ns > 0).then(|| (ns as f64 / memcgs as f64, Method::Average))
}

/// The growth and the level where a once-a-second reader saturates a core.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outlook {
    pub per_minute: Option<f64>,
    pub per_memcg_ns: Option<(f64, Method)>,
    /// Dying memory cgroups at which that reader needs a core (the live ones stay as they are).
    pub saturating_at: Option<u64>,
    /// Minutes until then at the current growth (`Some(0.0)`: already there).
    pub minutes_left: Option<f64>,
}

pub fn outlook(c: &MemcgCount, series: &VecDeque<MemcgCount>, timings: &[(u64, u64)]) -> Outlook {
    let per_minute = growth_per_minute(series);
    let per_memcg_ns = cost_per_memcg_ns(timings);
    let saturating_at = per_memcg_ns.map(|(ns, _)| ((READER_PERIOD_NS / ns) as u64).saturating_sub(c.live));
    let minutes_left = match (saturating_at, per_minute) {
        (Some(at), _) if c.dying >= at => Some(0.0),
        (Some(at), Some(rate)) if rate > 0.0 => Some((at - c.dying) as f64 / rate),
        _ => None,
    };
    Outlook { per_minute, per_memcg_ns, saturating_at, minutes_left }
}

impl Outlook {
    /// `; growing 500 a minute; a reader of memory.stat once a second would need a whole core
    /// at about 7.5 million dying (in about 4 h 10 min at this rate; a read costs 0.13 us per
    /// memory cgroup here, measured)`.
    pub fn describe(&self) -> String {
        let mut out = match self.per_minute {
            Some(r) if r >= 0.5 => format!("; growing {r:.0} a minute"),
            Some(r) if r <= -0.5 => format!("; shrinking {:.0} a minute", -r),
            Some(_) => "; not growing".to_string(),
            None => String::new(),
        };
        let (Some(at), Some((ns, method))) = (self.saturating_at, self.per_memcg_ns) else { return out };
        let how = match method {
            Method::Slope => "measured as reads slowed with the count",
            Method::Average => "the last read's time over the memory cgroups, an upper bound",
        };
        let when = match (self.minutes_left, self.per_minute) {
            (Some(m), _) if m <= 0.0 => "already there".to_string(),
            (Some(m), _) => format!("in about {} at this rate", duration(m)),
            (None, Some(_)) => "not at this rate".to_string(),
            (None, None) => "the growth is not measured yet".to_string(),
        };
        out.push_str(&format!(
            "; a reader of memory.stat once a second would need a whole core at about {} dying ({when}; a read \
             costs {:.2} us per memory cgroup here, {how})",
            count(at),
            ns / 1000.0
        ));
        out
    }
}

fn count(n: u64) -> String {
    match n {
        0..10_000 => n.to_string(),
        10_000..995_000 => format!("{:.0} thousand", n as f64 / 1e3),
        _ => format!("{:.1} million", n as f64 / 1e6),
    }
}

fn duration(minutes: f64) -> String {
    let m = minutes.round() as u64;
    match m {
        0 => "a minute".to_string(),
        1..60 => format!("{m} min"),
        60..2880 => format!("{} h {} min", m / 60, m % 60),
        _ => format!("{} days", m / 1440),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(points: &[(u64, u64)]) -> VecDeque<MemcgCount> {
        points
            .iter()
            .map(|&(s, dying)| MemcgCount { ts_ns: s * NS_PER_SEC, live: 100, dying, stat_read_ns: None })
            .collect()
    }

    #[test]
    fn growth_is_per_minute_over_the_last_ten_minutes() {
        // 1000 more every 5 s for 20 minutes: the last 10 minutes say 12,000 a minute.
        let points: Vec<(u64, u64)> = (0..=240).map(|i| (i * 5, i * 1000)).collect();
        assert_eq!(growth_per_minute(&series(&points)), Some(12_000.0));
        assert_eq!(growth_per_minute(&series(&[(0, 0), (10, 500)])), None, "10 s is too short to say");
        assert_eq!(growth_per_minute(&series(&[(0, 3000), (60, 1000)])), Some(-2000.0));
    }

    #[test]
    fn the_cost_per_cgroup_is_a_slope_once_the_count_has_moved() {
        // 2 us fixed + 0.5 us per memory cgroup, as the count grows from 1000 to 5000.
        let timings: Vec<(u64, u64)> = (1..=5).map(|k| (k * 1000, 2000 + k * 500)).collect();
        let (ns, method) = cost_per_memcg_ns(&timings).unwrap();
        assert_eq!(method, Method::Slope);
        assert!((ns - 0.5).abs() < 1e-9, "{ns}");
        // One timing: the whole read over the memory cgroups (fixed cost included).
        assert_eq!(cost_per_memcg_ns(&[(156, 20_800)]), Some((20_800.0 / 156.0, Method::Average)));
        // A count that barely moved gives no slope.
        assert_eq!(cost_per_memcg_ns(&[(1000, 500), (1010, 900)]).unwrap().1, Method::Average);
        assert_eq!(cost_per_memcg_ns(&[]), None);
    }

    #[test]
    fn the_time_left_is_the_distance_to_a_core_over_the_growth() {
        // 1 us per memory cgroup: a once-a-second reader needs a core at 1,000,000 of them, of
        // which 100 are live. 10,000 dying now, growing 1000 a minute.
        let c = MemcgCount { ts_ns: 60 * NS_PER_SEC, live: 100, dying: 10_000, stat_read_ns: None };
        let o = outlook(&c, &series(&[(0, 9000), (60, 10_000)]), &[(10_100, 10_100_000)]);
        assert_eq!(o.per_minute, Some(1000.0));
        assert_eq!(o.saturating_at, Some(999_900));
        assert!((o.minutes_left.unwrap() - 989.9).abs() < 1e-6, "{o:?}");
        assert_eq!(
            o.describe(),
            "; growing 1000 a minute; a reader of memory.stat once a second would need a whole core at about 1.0 \
             million dying (in about 16 h 30 min at this rate; a read costs 1.00 us per memory cgroup here, the \
             last read's time over the memory cgroups, an upper bound)"
        );
        // Past the level, or not growing.
        let past = MemcgCount { dying: 2_000_000, ..c };
        assert_eq!(
            outlook(&past, &series(&[(0, 9000), (60, 10_000)]), &[(10_100, 10_100_000)]).minutes_left,
            Some(0.0)
        );
        let flat = outlook(&c, &series(&[(0, 10_000), (60, 10_000)]), &[(10_100, 10_100_000)]);
        assert_eq!(flat.minutes_left, None);
        assert!(flat.describe().starts_with("; not growing; ") && flat.describe().contains("(not at this rate;"));
        let early = outlook(&c, &series(&[(0, 9000), (10, 10_000)]), &[(10_100, 10_100_000)]);
        assert!(
            early.describe().starts_with("; a reader") && early.describe().contains("(the growth is not measured yet;")
        );
        // Without a timing: the growth alone.
        assert_eq!(outlook(&c, &series(&[(0, 9000), (60, 10_000)]), &[]).describe(), "; growing 1000 a minute");
    }
}
