//! Run-queue waits per CPU, as the `sched_switch`/`sched_wakeup` programs aggregate them
//! (`profiler-ebpf/src/runq.rs`): read once a second with one syscall.

use aya::maps::{MapData, PerCpuArray};
use profiler_common::runq;

use super::tracefs;

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
}
