//! Run-queue waits per CPU, as the `sched_switch`/`sched_wakeup` programs aggregate them
//! (`profiler-ebpf/src/runq.rs`): read once a second with one syscall, then turned from
//! cumulative figures into each read's waits ([`RunqSecond`]), which both the run-queue
//! detector and the counters' tracks take.

use aya::maps::{MapData, PerCpuArray};
use profiler_common::runq;

use super::{latency, tracefs};

/// The longest wait of a read on one CPU: who waited, and what the CPU switched from to run it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Waiter {
    pub tid: u32,
    pub comm: String,
    pub before_tid: u32,
    pub before_comm: String,
}

/// One CPU's run-queue figures: cumulative waits and histogram, and the longest wait since the
/// previous read.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RunqCpu {
    pub waits: u64,
    /// Cumulative waits per `profiler_common::latency_bucket`.
    pub histogram: Vec<u64>,
    pub max_ns: u64,
    pub waiter: Option<Waiter>,
}

/// The programs' tracepoints, attached in this order.
pub const TRACEPOINTS: [(&str, &str); 3] =
    [("sched_wakeup", "sched"), ("sched_wakeup_new", "sched"), ("sched_switch", "sched")];

/// Where this kernel puts the fields the programs read: `(global, offset)`.
pub fn offsets() -> [(&'static str, u64); 6] {
    let off =
        |ev: &str, field: &str, default: u64| tracefs::field("sched", ev, field).map_or(default, |(o, _)| o as u64);
    [
        ("WAKEUP_PID_OFFSET", off("sched_wakeup", "pid", 24)),
        ("SWITCH_PREV_COMM_OFFSET", off("sched_switch", "prev_comm", 8)),
        ("SWITCH_PREV_PID_OFFSET", off("sched_switch", "prev_pid", 24)),
        ("SWITCH_PREV_STATE_OFFSET", off("sched_switch", "prev_state", 32)),
        ("SWITCH_NEXT_COMM_OFFSET", off("sched_switch", "next_comm", 40)),
        ("SWITCH_NEXT_PID_OFFSET", off("sched_switch", "next_pid", 56)),
    ]
}

pub struct RunQueue(pub PerCpuArray<MapData, [u64; runq::LEN]>);

impl RunQueue {
    /// Per CPU (index = CPU id), the longest wait of maxima epoch `epoch` only.
    pub fn read(&self, epoch: u64) -> Option<Vec<RunqCpu>> {
        let values = self.0.get(&0, 0).ok()?;
        Some(values.iter().map(|v| decode(v, epoch)).collect())
    }
}

fn comm(words: &[u64]) -> String {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn decode(v: &[u64; runq::LEN], epoch: u64) -> RunqCpu {
    let current = v[runq::EPOCH] == epoch;
    let max_ns = if current { v[runq::WAIT_MAX] } else { 0 };
    let waiter = (max_ns > 0).then(|| Waiter {
        tid: v[runq::WAITER_TID] as u32,
        comm: comm(&v[runq::WAITER_COMM..runq::WAITER_COMM + 2]),
        before_tid: v[runq::BEFORE_TID] as u32,
        before_comm: comm(&v[runq::BEFORE_COMM..runq::BEFORE_COMM + 2]),
    });
    RunqCpu { waits: v[runq::WAITS], histogram: v[runq::HISTOGRAM..].to_vec(), max_ns, waiter }
}

/// Waits in a second below which a CPU's p99 says little. The statistic's own floor, shared
/// by the run-queue detector and the counters' p99 track, so it lives with the statistic.
pub const MIN_WAITS_FOR_P99: u64 = 20;

/// Who had a CPU's longest wait, named while the thread still existed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WaiterInfo {
    pub tid: u32,
    /// Its process (thread group) and that process's name; the thread's own if unreadable.
    pub pid: u32,
    pub comm: String,
    pub thread: String,
    /// What the CPU switched from to run it.
    pub before_tid: u32,
    pub before_comm: String,
}

/// The run-queue waits that ended on one CPU in one second.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RunqSecond {
    pub waits: u64,
    pub histogram: Vec<u64>,
    pub max_ns: u64,
    pub waiter: Option<WaiterInfo>,
}

impl RunqSecond {
    pub fn add(&mut self, other: RunqSecond) {
        self.waits += other.waits;
        latency::add(&mut self.histogram, &other.histogram);
        if other.max_ns > self.max_ns {
            self.max_ns = other.max_ns;
            self.waiter = other.waiter;
        }
    }

    pub fn p99_ns(&self) -> Option<u64> {
        if self.waits >= MIN_WAITS_FOR_P99 { latency::quantile_ns(&self.histogram, 0.99) } else { None }
    }
}

/// Turns cumulative per-CPU figures into per-read growth.
#[derive(Debug, Default)]
pub struct Tracker {
    prev: Vec<RunqCpu>,
}

impl Tracker {
    /// The growth of each CPU's figures since the previous read; the longest wait is named
    /// (its process read from /proc now: the thread may be gone by the evaluation) when it is
    /// at least `name_from_ns`.
    pub fn update(&mut self, now: Vec<RunqCpu>, name_from_ns: u64) -> Vec<(usize, RunqSecond)> {
        let prev = std::mem::replace(&mut self.prev, now);
        let mut out = Vec::with_capacity(self.prev.len());
        for (cpu, n) in self.prev.iter().enumerate() {
            let p = prev.get(cpu).cloned().unwrap_or_default();
            let histogram = latency::growth(&n.histogram, &p.histogram);
            let waiter = n.waiter.as_ref().filter(|_| n.max_ns >= name_from_ns).map(|w| {
                let (pid, comm) = process_of(w.tid).unwrap_or((w.tid, w.comm.clone()));
                WaiterInfo {
                    tid: w.tid,
                    pid,
                    comm,
                    thread: w.comm.clone(),
                    before_tid: w.before_tid,
                    before_comm: w.before_comm.clone(),
                }
            });
            out.push((cpu, RunqSecond { waits: n.waits.saturating_sub(p.waits), histogram, max_ns: n.max_ns, waiter }));
        }
        out
    }
}

/// A thread's process id and the process's name, from /proc.
fn process_of(tid: u32) -> Option<(u32, String)> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    let tgid: u32 = status.lines().find_map(|l| l.strip_prefix("Tgid:"))?.trim().parse().ok()?;
    let comm = std::fs::read_to_string(format!("/proc/{tgid}/comm")).ok()?;
    Some((tgid, comm.trim_end().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_wait_of_an_older_epoch_is_not_this_one() {
        let mut v = [0u64; runq::LEN];
        v[runq::WAITS] = 7;
        v[runq::WAIT_MAX] = 900_000_000;
        v[runq::EPOCH] = 3;
        v[runq::WAITER_TID] = 42;
        v[runq::WAITER_COMM..runq::WAITER_COMM + 2].copy_from_slice(&[u64::from_ne_bytes(*b"victim\0\0"), 0]);
        v[runq::BEFORE_COMM..runq::BEFORE_COMM + 2]
            .copy_from_slice(&[u64::from_ne_bytes(*b"fifo-hog"), u64::from_ne_bytes(*b"-long-na")]);
        let now = decode(&v, 3);
        assert_eq!(now.max_ns, 900_000_000);
        let w = now.waiter.expect("a waiter");
        assert_eq!((w.tid, w.comm.as_str(), w.before_comm.as_str()), (42, "victim", "fifo-hog-long-na"));
        let later = decode(&v, 4);
        assert_eq!((later.waits, later.max_ns, later.waiter), (7, 0, None));
    }

    #[test]
    fn the_tracker_reports_growth_and_the_longest_wait() {
        let mut tracker = Tracker::default();
        let h = |n: u64| {
            let mut v = vec![0; profiler_common::LATENCY_BUCKETS as usize];
            v[10] = n;
            v
        };
        let first = tracker.update(vec![RunqCpu { waits: 10, histogram: h(10), max_ns: 5, waiter: None }], 1);
        assert_eq!(first[0].1.waits, 10);
        let w = Waiter { tid: u32::MAX - 1, comm: "gone".into(), before_tid: 1, before_comm: "x".into() };
        let second = tracker.update(vec![RunqCpu { waits: 15, histogram: h(15), max_ns: 9, waiter: Some(w) }], 1);
        let (cpu, r) = &second[0];
        assert_eq!((*cpu, r.waits, r.histogram[10], r.max_ns), (0, 5, 5, 9));
        // A thread that is gone keeps the names the kernel gave.
        let named = r.waiter.as_ref().expect("named");
        assert_eq!((named.pid, named.comm.as_str(), named.thread.as_str()), (u32::MAX - 1, "gone", "gone"));
    }
}
