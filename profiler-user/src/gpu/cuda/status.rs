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

/// A process the rate guard counts part of the time (its counts are estimates; others' stay
/// exact).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Guarded {
    pub pid: u32,
    pub fraction: f64,
    pub calls_per_sec: f64,
    /// Its limit, hits a second (its own: a share of its CPU, unless one is configured).
    #[serde(default)]
    pub limit: f64,
}

/// Libraries some process maps that are not probed, by why.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Unprobed {
    /// Failed the checks (a file a user could change; not a CUDA driver).
    pub refused: usize,
    /// Passed them, but every slot is taken (`FILES_MAX`).
    pub waiting: usize,
}

/// Calls an owner (user id) lost to its share of the kernel's maps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OwnerDrops {
    pub uid: u32,
    pub dropped: u64,
}

/// Owners listed with their drops; the rest are added under `uid` [`u32::MAX`].
const OWNERS_LISTED: usize = 16;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The probed libraries, then (with an `error`) those some process maps that are not.
    pub libraries: Vec<Library>,
    #[serde(default)]
    pub unprobed: Unprobed,
    /// Processes whose counts are estimates (the busiest first).
    #[serde(default)]
    pub guarded: Vec<Guarded>,
    /// Per owner, calls not counted since the start: its share of the kernel's maps was used.
    #[serde(default)]
    pub dropped: Vec<OwnerDrops>,
    /// Since the daemon started.
    pub launches: u64,
    pub syncs: u64,
    pub copies: u64,
    /// Nanoseconds blocked in the synchronisations counted, and bytes the copies counted moved,
    /// since the start (`/metrics`' `profiler_cuda_sync_seconds_total`, `_copy_bytes_total`).
    #[serde(default)]
    pub sync_ns: u64,
    #[serde(default)]
    pub copy_bytes: u64,
    /// Counts whose stack the kernel map had no room for (its user's share was used) (stored under `[stack lost: ...]`).
    pub stacks_lost: u64,
    /// The guard's limit configured, calls a second per process; 0: the default, a share of
    /// each process's CPU time (`guard::budget`).
    pub max_calls_per_sec: f64,
}

impl Status {
    /// `n` more calls of `uid` not counted (a bounded list: past it, under `u32::MAX`).
    pub fn add_dropped(&mut self, uid: u32, n: u64) {
        let uid = if self.dropped.len() >= OWNERS_LISTED && !self.dropped.iter().any(|d| d.uid == uid) {
            u32::MAX
        } else {
            uid
        };
        match self.dropped.iter_mut().find(|d| d.uid == uid) {
            Some(d) => d.dropped += n,
            None => self.dropped.push(OwnerDrops { uid, dropped: n }),
        }
    }

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

    /// The limit, as the status says it.
    fn limit_words(&self) -> String {
        if self.max_calls_per_sec > 0.0 {
            format!("the limit of {:.0}", self.max_calls_per_sec)
        } else {
            "its budget (1 % of its CPU time)".to_string()
        }
    }

    /// Lines for `profiler status`.
    pub fn describe(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .libraries
            .iter()
            .map(|l| match &l.error {
                Some(e) => format!("{}: not probed ({} processes map it): {e}", l.path, l.processes),
                None if l.fraction < 1.0 => format!(
                    "{}: {} probes, {} processes; the busiest calls {:.0} times a second, over {}: counted {:.0} % \
                     of the time, its counts are estimates (the others' stay exact)",
                    l.path,
                    l.probes,
                    l.processes,
                    l.calls_per_sec,
                    self.limit_words(),
                    l.fraction * 100.0
                ),
                None => format!("{}: {} probes, {} processes", l.path, l.probes, l.processes),
            })
            .collect();
        if lines.is_empty() {
            lines.push("no process maps libcuda.so.1".into());
        }
        for g in &self.guarded {
            lines.push(format!(
                "pid {}: {:.0} calls/s over its limit of {:.0}: counted {:.0} % of the time, its counts are estimates",
                g.pid,
                g.calls_per_sec,
                if g.limit > 0.0 { g.limit } else { self.max_calls_per_sec },
                g.fraction * 100.0
            ));
        }
        for d in &self.dropped {
            let who = if d.uid == u32::MAX { "other users".to_string() } else { format!("uid {}", d.uid) };
            lines.push(format!(
                "{who}: {} calls not counted (more distinct stacks than its share of the kernel's maps)",
                d.dropped
            ));
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
