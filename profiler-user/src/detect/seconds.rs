//! What the detectors read: a second of a CPU's samples (its busy ticks with their stacks,
//! processes and workloads), of its NET_RX work, the machine, the processes most sampled, and
//! the CUDA launch figures one detector makes for another ([`LaunchFigures`]).

use std::{collections::HashMap, sync::Arc};

use crate::{
    collect::{reclaim::ReclaimSecond, runq::RunqSecond},
    model::Stack,
};

/// One sampled tick of a busy CPU, as detectors keep it.
#[derive(Debug, Clone)]
pub struct Tick {
    pub stack: Arc<Stack>,
    pub pid: u32,
    pub comm: Arc<str>,
    /// The process's workload as stored (`model::Sample::workload`).
    pub workload: Arc<str>,
}

/// A process's CUDA launches over the latest window: made by `cuda` from the probes' drains,
/// quoted by `gpu-launch-bound` (`gpu`); the engine hands them from one to the other.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LaunchFigures {
    pub per_sec: f64,
    /// The Python line that launched most over the window, and its share.
    pub top_line: Option<(Arc<str>, f64)>,
    /// The kernels launched most (their `[gpu] ...` frames) and their shares, most first.
    pub top_kernels: Vec<(Arc<str>, f64)>,
}

/// One CPU during one second.
#[derive(Debug, Default, Clone)]
pub struct CpuSecond {
    pub busy: Vec<Tick>,
    pub idle: u32,
    /// Ticks whose sample never reached the detectors: lost (a full ring or queue), or not
    /// arrived when the second had to be evaluated anyway (see [`Engine::tick`]). Neither busy
    /// nor idle: a detector that asks whether a CPU had room must not read them as idle.
    pub lost: u32,
    /// NET_RX figures credited to this second: (runs, histogram of waits, longest wait ns,
    /// longest poll gap ns).
    pub netrx: Option<NetRxSecond>,
    /// Run-queue waits that ended on this CPU in this second.
    pub runq: Option<RunqSecond>,
    /// Reclaim and compaction stalls that ended on this CPU in this second.
    pub reclaim: Option<ReclaimSecond>,
}

impl CpuSecond {
    /// Busy ticks in kernel mode (the stack has kernel frames).
    pub fn kernel(&self) -> usize {
        self.busy.iter().filter(|t| t.stack.user_len < t.stack.frames.len()).count()
    }

    /// The share of the second the CPU may have been busy: busy ticks and ticks of unknown fate
    /// (lost, not arrived) over the ticks the frequency gives it. What "the other CPUs had room"
    /// must be judged from: a lost tick is no evidence of room.
    pub fn not_idle_share(&self, frequency_hz: u64) -> f64 {
        ((self.busy.len() as f64 + f64::from(self.lost)) / frequency_hz.max(1) as f64).min(1.0)
    }
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NetRxSecond {
    pub runs: u64,
    pub histogram: Vec<u64>,
    pub latency_max_ns: u64,
    pub poll_gap_max_ns: u64,
}

/// Everything sampled during one wall-clock second.
#[derive(Debug, Clone)]
pub struct Second {
    pub start_ns: u64,
    /// Indexed by CPU id.
    pub cpus: Vec<CpuSecond>,
}

/// The machine the detectors watch.
#[derive(Debug, Clone, Copy)]
pub struct Machine {
    pub cpus: u32,
    pub frequency_hz: u64,
}

/// Top processes of a set of ticks: `(comm, pid, ticks)`, most first.
/// A process among the busiest of some ticks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Top {
    pub comm: Arc<str>,
    pub pid: u32,
    pub samples: u64,
    pub workload: Arc<str>,
}

impl Top {
    /// `kubelet (pid 42)`, with its pod and container or unit when known, and `extra` after the
    /// pid: `trainer (pid 42, pod ml/trainer-0 container main)`.
    pub fn who(&self, extra: &str) -> String {
        let workload = self.workload().map(|w| w.describe()).filter(|d| !d.is_empty());
        let workload = workload.map_or(String::new(), |w| format!(", {w}"));
        format!("{} (pid {}{extra}{workload})", self.comm, self.pid)
    }

    /// For a finding's evidence: comm, pid, samples, and the workload's fields.
    pub fn json(&self) -> serde_json::Value {
        let mut p = serde_json::json!({"comm": &*self.comm, "pid": self.pid, "samples": self.samples});
        for (k, v) in self.workload().as_ref().map(|w| w.fields()).unwrap_or_default() {
            p[k] = serde_json::json!(v);
        }
        p
    }

    pub fn workload(&self) -> Option<crate::identity::Identity> {
        crate::identity::workloads::decode(&self.workload)
    }
}

pub fn top_processes<'a>(ticks: impl Iterator<Item = &'a Tick>, n: usize) -> Vec<Top> {
    let mut counts: HashMap<(u32, Arc<str>), (u64, Arc<str>)> = HashMap::new();
    for t in ticks {
        counts.entry((t.pid, t.comm.clone())).or_insert_with(|| (0, t.workload.clone())).0 += 1;
    }
    let mut v: Vec<Top> =
        counts.into_iter().map(|((pid, comm), (samples, workload))| Top { comm, pid, samples, workload }).collect();
    v.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.pid.cmp(&b.pid)));
    v.truncate(n);
    v
}

pub fn percent(x: f64) -> String {
    format!("{:.0} %", x * 100.0)
}
