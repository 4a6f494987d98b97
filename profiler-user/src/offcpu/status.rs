//! What the off-CPU recorder is doing, in `DATA_DIR/offcpu.json` for `profiler status` and
//! for `/metrics`: its settings (threshold, rate limit and the sampling's weight above it, walk
//! budget) and totals since the daemon started (recorded waits, those sampled out by the rate
//! limit, stacks walked and not).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::collect::offcpu::Totals;

pub const FILE: &str = "offcpu.json";

/// The kernel's totals are cumulative since the program was loaded; the recorder's own since the
/// daemon started: both since this daemon started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Status {
    /// Waits shorter than this are not recorded.
    pub threshold_ns: u64,
    /// Waits recorded a second on one CPU before the sampling starts, and its weight: above the
    /// limit one wait in `sample_every` is kept, its time multiplied by it.
    pub rate_limit: u64,
    pub sample_every: u64,
    /// Stacks walked a second on one CPU, at most.
    pub walk_limit: u64,
    /// Microseconds recorded (weighted), waits recorded (weighted).
    pub recorded_us: u64,
    pub recorded_waits: u64,
    /// The kernel's totals, as the program keeps them (flattened: the file's keys are theirs).
    #[serde(flatten)]
    pub kernel: Totals,
    /// Counts stored without their stack (a thread's first long wait, or a stack the kernel's
    /// map had no room for).
    pub without_stack: u64,
}

impl Status {
    pub fn write(&self, data_dir: &Path) {
        let json = serde_json::to_vec_pretty(self).expect("status serialises");
        if let Err(e) = crate::store::files::write_private(&data_dir.join(FILE), &json) {
            tracing::debug!(error = %e, "cannot write the off-CPU status");
        }
    }

    /// `None` when no daemon recording off-CPU time wrote one here.
    pub fn read(data_dir: &Path) -> Option<Self> {
        serde_json::from_slice(&std::fs::read(data_dir.join(FILE)).ok()?).ok()
    }

    /// Lines for `profiler status`.
    pub fn describe(&self) -> Vec<String> {
        vec![
            format!(
                "waits of {} ms or more recorded; above {} a second on a CPU, one in {} kept (weight {}); \
                 at most {} stacks walked a second on a CPU",
                self.threshold_ns as f64 / 1e6,
                self.rate_limit,
                self.sample_every,
                self.sample_every,
                self.walk_limit
            ),
            format!(
                "since start: {} waits recorded ({:.1} s off CPU), {} sampled out by the rate limit, {} dropped \
                 (the kernel's map was full)",
                self.recorded_waits,
                self.recorded_us as f64 / 1e6,
                self.kernel.sampled_out,
                self.kernel.dropped
            ),
            format!(
                "stacks: {} walked, {} taken from the thread's last walk, {} not walked (the walk budget was \
                 spent), {} waits stored without a stack",
                self.kernel.walked, self.kernel.reused, self.kernel.walks_skipped, self.without_stack
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_file_round_trips_and_reads_as_sentences() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Status::read(dir.path()), None, "no daemon wrote one");
        let s = Status {
            threshold_ns: 1_000_000,
            rate_limit: 1000,
            sample_every: 8,
            walk_limit: 200,
            recorded_us: 2_500_000,
            recorded_waits: 40,
            kernel: Totals { sampled_out: 7, walked: 12, walks_skipped: 3, ..Default::default() },
            without_stack: 2,
        };
        s.write(dir.path());
        assert_eq!(Status::read(dir.path()), Some(s.clone()));
        let text = s.describe().join("\n");
        assert!(text.contains("waits of 1 ms or more recorded; above 1000 a second on a CPU, one in 8 kept"), "{text}");
        assert!(text.contains("40 waits recorded (2.5 s off CPU), 7 sampled out by the rate limit"), "{text}");
        assert!(text.contains("12 walked") && text.contains("3 not walked"), "{text}");
    }
}
