//! Store upkeep the daemon runs from its flush tick: retention (by size and age, and at once
//! while writes fail, since it may free space) and tiering (rolling old minutes up).

use std::{
    path::Path,
    time::{Duration, Instant},
};

use super::{
    format::SEGMENT_NS,
    reader,
    retention::{self, Retention, Why},
    rollup,
};
use crate::timespec::{self, now_ns};

/// Retention and tiering, run from the flush tick at their own pace.
#[derive(Default)]
pub struct Maintenance {
    last_retention: Option<Instant>,
    last_rollup: Option<Instant>,
    /// Segments known to be rolled up already (or not worth trying again).
    rolled: std::collections::HashSet<u64>,
}

impl Maintenance {
    pub fn run(&mut self, data_dir: &Path, bounds: &Retention, rollup_after: Option<Duration>, write_failing: bool) {
        let due = |last: Option<Instant>, every: Duration| last.is_none_or(|t| t.elapsed() >= every);
        // While writing fails the disk may be full: apply retention at once, it may free space.
        if write_failing || due(self.last_retention, Duration::from_secs(5)) {
            self.last_retention = Some(Instant::now());
            match retention::enforce(data_dir, bounds, now_ns()) {
                Ok(removed) => {
                    for r in removed {
                        let why = match r.why {
                            Why::Size => format!("the store is over its {} byte limit", bounds.max_bytes),
                            Why::Age => {
                                format!("it is older than {}", timespec::format_duration(bounds.max_age_ns))
                            }
                        };
                        log::info!(
                            "removed {} ({} bytes, {}): {why}",
                            r.path.display(),
                            r.bytes,
                            timespec::format(r.start_ns)
                        );
                    }
                }
                Err(e) => log::warn!("retention: {e}"),
            }
        }
        let Some(after) = rollup_after else { return };
        if !due(self.last_rollup, Duration::from_secs(30)) {
            return;
        }
        self.last_rollup = Some(Instant::now());
        let cutoff = now_ns().saturating_sub(after.as_nanos() as u64);
        let Ok(segments) = reader::list_segments(data_dir) else { return };
        // A few per run, so a backlog (after downtime) never stalls sampling for long.
        let mut budget = 2;
        for (start, path) in segments {
            if budget == 0 {
                break;
            }
            if start + SEGMENT_NS > cutoff || !self.rolled.insert(start) {
                continue;
            }
            budget -= 1;
            match rollup::rollup_segment(&path) {
                Ok(Some(r)) => log::info!(
                    "rolled up {} into 10 s aggregates: {} samples in {} rows, {} -> {} bytes",
                    path.display(),
                    r.samples,
                    r.rows,
                    r.bytes_before,
                    r.bytes_after
                ),
                Ok(None) => {}
                Err(e) => log::warn!("rollup: {e}"),
            }
        }
    }
}
