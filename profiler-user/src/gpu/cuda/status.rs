//! What the CUDA recorder is doing, in `DATA_DIR/cuda.json` for `profiler status` and for
//! `/metrics`: the probed library files, their processes, the rate guard's share, and totals.

use std::path::Path;

use serde::{Deserialize, Serialize};

pub const FILE: &str = "cuda.json";

/// One probed library file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Library {
    /// The path the daemon opened it by (`/proc/PID/root/...`).
    pub path: String,
    pub probes: usize,
    pub processes: usize,
    /// Share of the time the probes are attached (1: always; less: the rate guard cut them and
    /// the counts are estimates).
    pub fraction: f64,
    /// The busiest process's calls a second, last measured.
    pub calls_per_sec: f64,
    /// Why it is not probed, if it is not.
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub libraries: Vec<Library>,
    /// Since the daemon started.
    pub launches: u64,
    pub syncs: u64,
    pub copies: u64,
    /// Counts whose stack the kernel map had dropped (stored under `[stack lost: ...]`).
    pub stacks_lost: u64,
    /// The guard's limit, calls a second per process.
    pub max_calls_per_sec: f64,
}

impl Status {
    pub fn write(&self, data_dir: &Path) {
        let json = serde_json::to_vec_pretty(self).expect("status serialises");
        if let Err(e) = crate::store::files::write_private(&data_dir.join(FILE), &json) {
            tracing::debug!(error = %e, "cannot write the CUDA status");
        }
    }

    /// `None` when no daemon wrote one here.
    pub fn read(data_dir: &Path) -> Option<Self> {
        serde_json::from_slice(&std::fs::read(data_dir.join(FILE)).ok()?).ok()
    }

    /// Lines for `profiler status`.
    pub fn describe(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .libraries
            .iter()
            .map(|l| match &l.error {
                Some(e) => format!("{}: not probed: {e}", l.path),
                None if l.fraction < 1.0 => format!(
                    "{}: {} probes, {} processes; {:.0} calls/s over the limit of {:.0}: probes on {:.0} % of the \
                     time, counts are estimates",
                    l.path,
                    l.probes,
                    l.processes,
                    l.calls_per_sec,
                    self.max_calls_per_sec,
                    l.fraction * 100.0
                ),
                None => format!("{}: {} probes, {} processes", l.path, l.probes, l.processes),
            })
            .collect();
        if lines.is_empty() {
            lines.push("no process maps libcuda.so.1".into());
        }
        lines.push(format!(
            "counted since start: {} launches, {} synchronisations, {} copies{}",
            self.launches,
            self.syncs,
            self.copies,
            if self.stacks_lost > 0 { format!(", {} with their stack lost", self.stacks_lost) } else { String::new() }
        ));
        lines
    }
}
