//! Store upkeep the daemon runs on its upkeep thread: retention (by size and age, and at once
//! while writes fail, since it may free space), tiering (rolling old minutes up) and the
//! hours' indexes (kept true across both).

use std::{
    path::Path,
    time::{Duration, Instant},
};

use super::{
    format::SEGMENT_NS,
    index::Indexer,
    reader,
    retention::{self, Retention, Why},
    rollup,
};
use crate::timespec::{self, now_ns};

/// Retention, tiering and indexing, each at its own pace.
pub struct Maintenance {
    last_retention: Option<Instant>,
    last_rollup: Option<Instant>,
    last_index: Option<Instant>,
    indexer: Indexer,
    /// Segments known to be rolled up already (or not worth trying again).
    rolled: std::collections::HashSet<u64>,
}

impl Maintenance {
    pub fn new(data_dir: &Path) -> Self {
        Self {
            last_retention: None,
            last_rollup: None,
            last_index: None,
            indexer: Indexer::new(data_dir),
            rolled: Default::default(),
        }
    }

    pub fn run(&mut self, data_dir: &Path, bounds: &Retention, rollup_after: Option<Duration>, write_failing: bool) {
        let due = |last: Option<Instant>, every: Duration| last.is_none_or(|t| t.elapsed() >= every);
        // While writing fails the disk may be full: apply retention at once, it may free space.
        if write_failing || due(self.last_retention, Duration::from_secs(5)) {
            self.last_retention = Some(Instant::now());
            let indexer = &mut self.indexer;
            match retention::enforce(data_dir, bounds, now_ns(), &mut |start, path| indexer.forget(start, path)) {
                Ok(removed) => {
                    for r in removed {
                        let why = match r.why {
                            Why::Size => format!("the store is over its {} byte limit", bounds.max_bytes),
                            Why::Age => {
                                format!("it is older than {}", timespec::format_duration(bounds.max_age_ns))
                            }
                        };
                        tracing::info!(
                            file = %r.path.display(),
                            bytes = r.bytes,
                            start = %timespec::format(r.start_ns),
                            "segment removed: {why}"
                        );
                    }
                }
                Err(e) => tracing::warn!(error = %e, "retention could not finish"),
            }
        }
        // The index lags the newest minute by at most this; readers read what it lacks.
        if due(self.last_index, Duration::from_secs(60)) {
            self.last_index = Some(Instant::now());
            match self.indexer.refresh(now_ns()) {
                Ok(r) if r.rebuilt > 0 => {
                    tracing::info!(hours = r.rebuilt, "index rebuilt for hours whose files changed")
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "the store's index could not be refreshed; readers read the segments")
                }
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
            // Rolled up by an earlier run: known from its first block header, for no budget.
            if matches!(rollup::is_rolled_up_file(&path), Ok(Some(true))) {
                continue;
            }
            budget -= 1;
            // Out of the index before the file is replaced; the next refresh indexes the new one.
            let indexer = &mut self.indexer;
            match rollup::rollup_segment_with(&path, &mut || indexer.forget(start, &path)) {
                Ok(Some(r)) => tracing::info!(
                    file = %path.display(),
                    samples = r.samples,
                    rows = r.rows,
                    bytes_before = r.bytes_before,
                    bytes_after = r.bytes_after,
                    "segment rolled up into 10 s aggregates"
                ),
                Ok(None) => {}
                Err(e) => tracing::warn!(file = %path.display(), error = %e, "segment not rolled up"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        model::{Sample, Stack},
        store::{StoreWriter, segments_dir},
    };

    /// A daemon that starts again over a week of rolled-up minutes rolls the few that are not
    /// in its first pass, instead of spending its budget re-reading the rolled ones.
    #[test]
    fn a_restart_rolls_the_unrolled_minute_first() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(segments_dir(dir.path())).unwrap();
        let stack = Arc::new(Stack { frames: vec![Arc::from("main")], user_len: 1 });
        // Ten minutes, an hour ago.
        let t0 = (now_ns() - 3600 * 1_000_000_000) / SEGMENT_NS * SEGMENT_NS;
        let mut w = StoreWriter::new(&segments_dir(dir.path()));
        for minute in 0..10 {
            let ts_ns = t0 + minute * SEGMENT_NS + 1_000_000_000;
            let comm: Arc<str> = Arc::from("app");
            w.push(&Sample {
                ts_ns,
                cpu: 0,
                pid: 1,
                tid: 1,
                cgroup_id: 0,
                comm,
                stack: stack.clone(),
                workload: Arc::from(""),
            });
            w.flush(ts_ns).unwrap();
        }
        let segments = reader::list_segments(dir.path()).unwrap();
        assert_eq!(segments.len(), 10);
        // An earlier run rolled all but the last.
        for (_, path) in &segments[..9] {
            rollup::rollup_segment(path).unwrap().expect("rolled");
            assert_eq!(rollup::is_rolled_up_file(path).unwrap(), Some(true));
        }
        let last = &segments[9].1;
        assert_eq!(rollup::is_rolled_up_file(last).unwrap(), Some(false));
        let mut m = Maintenance::new(dir.path());
        let keep = Retention { max_bytes: u64::MAX, max_age_ns: u64::MAX };
        m.run(dir.path(), &keep, Some(Duration::from_secs(60)), false);
        assert_eq!(rollup::is_rolled_up_file(last).unwrap(), Some(true), "the unrolled minute, in the first pass");
    }
}
