//! Reclaim and compaction stalls per CPU, as the `vmscan`/`compaction` programs aggregate them
//! (`profiler-ebpf/src/reclaim.rs`): read once a second with one syscall, then turned from
//! cumulative figures into each read's stalls ([`ReclaimSecond`]), the longest named with its
//! memory cgroup, which both the reclaim detector and the counters' tracks take.

use aya::maps::{MapData, PerCpuArray};
use profiler_common::reclaim;

use super::{
    latency,
    memcg::{self, Memcg},
};

/// The programs' tracepoints (`(name, category)`), attached in pairs: a begin without its end
/// would leave every stall open.
pub const TRACEPOINTS: [[(&str, &str); 2]; 3] = [
    [("mm_vmscan_direct_reclaim_end", "vmscan"), ("mm_vmscan_direct_reclaim_begin", "vmscan")],
    [("mm_vmscan_memcg_reclaim_end", "vmscan"), ("mm_vmscan_memcg_reclaim_begin", "vmscan")],
    [("mm_compaction_end", "compaction"), ("mm_compaction_begin", "compaction")],
];

/// The longest stall of a read on one CPU.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Staller {
    /// `profiler_common::reclaim::{DIRECT, MEMCG, COMPACT}`.
    pub kind: usize,
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// Its memory cgroup's id (cgroupfs inode number) at the stall; 0: unknown.
    pub memcg_id: u64,
}

/// One CPU's stalls: cumulative counts and time per kind, a cumulative histogram of their
/// durations, and the longest since the last read.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReclaimCpu {
    pub count: [u64; reclaim::KINDS],
    pub ns: [u64; reclaim::KINDS],
    /// Stalls of every kind per `profiler_common::latency_bucket` of their duration.
    pub histogram: Vec<u64>,
    pub max_ns: u64,
    pub staller: Option<Staller>,
}

/// Where the kernel keeps what leads from a task to its memory cgroup's id, for the programs'
/// globals (`profiler-ebpf/src/reclaim.rs`): from the kernel's BTF. Without BTF, or on a
/// kernel without the memory controller, `MEMCG_TASK_CGROUPS` stays `u64::MAX` and the
/// stalled task's cgroup is read from /proc, while it lives.
pub fn memcg_offsets() -> [(&'static str, u64); 5] {
    let read = || -> Result<[u64; 5], String> {
        let btf = super::btf::Btf::kernel().map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
        let off = |s: &str, m: &str| btf.member_offset(s, m).map_err(|e| e.to_string());
        let memory = btf.enum_value("memory_cgrp_id").map_err(|e| e.to_string())?;
        let subsys = off("css_set", "subsys")? + 8 * u64::try_from(memory).map_err(|e| e.to_string())?;
        Ok([
            off("task_struct", "cgroups")?,
            subsys,
            off("cgroup_subsys_state", "cgroup")?,
            off("cgroup", "kn")?,
            off("kernfs_node", "id")?,
        ])
    };
    let v = read().unwrap_or_else(|e| {
        tracing::info!(error = %e, "a stalled task's memory cgroup is read from /proc while it lives");
        [u64::MAX, 0, 0, 0, 0]
    });
    [
        ("MEMCG_TASK_CGROUPS", v[0]),
        ("MEMCG_CSS_SET_SUBSYS", v[1]),
        ("MEMCG_CSS_CGROUP", v[2]),
        ("MEMCG_CGROUP_KN", v[3]),
        ("MEMCG_KN_ID", v[4]),
    ]
}

pub struct Reclaim(pub PerCpuArray<MapData, [u64; reclaim::LEN]>);

impl Reclaim {
    /// Per CPU (index = CPU id), with the longest stall of maxima epoch `epoch` only.
    pub fn read(&self, epoch: u64) -> Option<Vec<ReclaimCpu>> {
        let values = self.0.get(&0, 0).ok()?;
        Some(values.iter().map(|v| decode(v, epoch)).collect())
    }
}

fn decode(v: &[u64; reclaim::LEN], epoch: u64) -> ReclaimCpu {
    let max_ns = if v[reclaim::EPOCH] == epoch { v[reclaim::MAX_NS] } else { 0 };
    let staller = (max_ns > 0).then(|| {
        let comm: Vec<u8> = v[reclaim::MAX_COMM..reclaim::MAX_COMM + 2]
            .iter()
            .flat_map(|w| w.to_ne_bytes())
            .take_while(|&b| b != 0)
            .collect();
        Staller {
            kind: (v[reclaim::MAX_KIND] as usize).min(reclaim::KINDS - 1),
            pid: (v[reclaim::MAX_PID_TGID] >> 32) as u32,
            tid: v[reclaim::MAX_PID_TGID] as u32,
            comm: String::from_utf8_lossy(&comm).into_owned(),
            memcg_id: v[reclaim::MAX_MEMCG],
        }
    });
    let at = |base: usize| std::array::from_fn(|k| v[base + k]);
    let histogram = v[reclaim::HISTOGRAM..].to_vec();
    ReclaimCpu { count: at(reclaim::COUNT), ns: at(reclaim::NS), histogram, max_ns, staller }
}

/// A stall shorter than this in a read does not make the daemon read /proc for its task.
const NAME_FROM_NS: u64 = 10_000_000;
/// Stalls in a second below which a median says little, and a p99 (below 100 it is the
/// longest one, which the finding names anyway).
const MIN_STALLS_FOR_MEDIAN: u64 = 20;
const MIN_STALLS_FOR_P99: u64 = 100;

/// The task that stalled longest in a read, named while it existed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StallerInfo {
    pub kind: usize,
    pub pid: u32,
    pub tid: u32,
    /// The process's name, the thread's when unreadable.
    pub comm: String,
    pub memcg: Option<Memcg>,
    /// The memory cgroup's id as the kernel read it at the stall (0: unknown).
    pub memcg_id: u64,
}

/// One CPU's stalls in one second.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReclaimSecond {
    pub count: [u64; reclaim::KINDS],
    pub ns: [u64; reclaim::KINDS],
    /// Stalls per `profiler_common::latency_bucket` of their duration.
    pub histogram: Vec<u64>,
    pub max_ns: u64,
    pub staller: Option<StallerInfo>,
}

impl ReclaimSecond {
    pub fn add(&mut self, other: ReclaimSecond) {
        for k in 0..reclaim::KINDS {
            self.count[k] += other.count[k];
            self.ns[k] += other.ns[k];
        }
        latency::add(&mut self.histogram, &other.histogram);
        let longer = other.max_ns > self.max_ns;
        self.max_ns = self.max_ns.max(other.max_ns);
        // The longest stall's task where it was named, else any named one: a read whose stalls
        // summed under `NAME_FROM_NS` names nobody, though it may hold the second's longest
        // stall (a CI run's finding of 152 ms a second named no task and no cgroup).
        if other.staller.is_some() && (longer || self.staller.is_none()) {
            self.staller = other.staller;
        }
    }

    pub fn total_ns(&self) -> u64 {
        self.ns.iter().sum()
    }

    /// At most how long the stalls up to quantile `q` took (the upper edge of a histogram
    /// bucket, at most 12.5 % over): how long one allocation hangs, which the sum does not say
    /// (4,000 stalls of 50 µs and two of 100 ms both sum to 200 ms).
    pub fn quantile_ns(&self, q: f64) -> Option<u64> {
        let v = latency::quantile_ns(&self.histogram, q)?;
        // No stall took longer than the longest (when it was caught in this epoch): the bucket's
        // edge may be over it.
        Some(if self.max_ns > 0 { v.min(self.max_ns) } else { v })
    }

    fn stalls(&self) -> u64 {
        self.count.iter().sum()
    }

    /// The median stall, from enough stalls to say something.
    pub fn median_ns(&self) -> Option<u64> {
        (self.stalls() >= MIN_STALLS_FOR_MEDIAN).then(|| self.quantile_ns(0.5)).flatten()
    }

    /// The p99 stall, from enough stalls to differ from the longest.
    pub fn p99_ns(&self) -> Option<u64> {
        (self.stalls() >= MIN_STALLS_FOR_P99).then(|| self.quantile_ns(0.99)).flatten()
    }
}

/// Turns cumulative per-CPU figures into per-read growth.
#[derive(Debug, Default)]
pub struct Tracker {
    prev: Vec<ReclaimCpu>,
    memcgs: memcg::Index,
}

impl Tracker {
    pub fn update(&mut self, now: Vec<ReclaimCpu>) -> Vec<(usize, ReclaimSecond)> {
        let prev = std::mem::replace(&mut self.prev, now);
        let mut out = Vec::new();
        for (cpu, n) in self.prev.iter().enumerate() {
            let p = prev.get(cpu).cloned().unwrap_or_default();
            let count = std::array::from_fn(|k| n.count[k].saturating_sub(p.count[k]));
            let ns: [u64; reclaim::KINDS] = std::array::from_fn(|k| n.ns[k].saturating_sub(p.ns[k]));
            let histogram = latency::growth(&n.histogram, &p.histogram);
            if ns.iter().sum::<u64>() == 0 && n.max_ns == 0 {
                continue;
            }
            let staller = n.staller.as_ref().filter(|_| ns.iter().sum::<u64>() >= NAME_FROM_NS).map(|s| {
                let comm = std::fs::read_to_string(format!("/proc/{}/comm", s.pid))
                    .map(|c| c.trim_end().to_string())
                    .unwrap_or_else(|_| s.comm.clone());
                // The cgroup the kernel saw the task in at the stall; /proc while the task lives
                // only when the kernel could not say (the writer of a stall is often a short
                // process, gone by the read: `dd` in the test, a compiler in a pod).
                let memcg = self.memcgs.by_id(s.memcg_id).or_else(|| memcg::of_pid(s.pid));
                StallerInfo { kind: s.kind, pid: s.pid, tid: s.tid, comm, memcg, memcg_id: s.memcg_id }
            });
            out.push((cpu, ReclaimSecond { count, ns, histogram, max_ns: n.max_ns, staller }));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::latency::histogram;

    #[test]
    fn the_longest_stall_names_its_task_in_its_epoch_only() {
        let mut v = [0u64; reclaim::LEN];
        v[reclaim::COUNT + reclaim::MEMCG] = 12;
        v[reclaim::NS + reclaim::MEMCG] = 40_000_000;
        v[reclaim::EPOCH] = 5;
        v[reclaim::MAX_NS] = 9_000_000;
        v[reclaim::MAX_KIND] = reclaim::MEMCG as u64;
        v[reclaim::MAX_PID_TGID] = (4242u64 << 32) | 4243;
        v[reclaim::MAX_COMM] = u64::from_ne_bytes(*b"dd\0\0\0\0\0\0");
        v[reclaim::MAX_MEMCG] = 2041;
        v[reclaim::HISTOGRAM + profiler_common::latency_bucket(3_000_000) as usize] = 12;
        let r = decode(&v, 5);
        assert_eq!(r.histogram.len(), profiler_common::LATENCY_BUCKETS as usize);
        assert_eq!(r.histogram.iter().sum::<u64>(), 12);
        assert_eq!((r.count[reclaim::MEMCG], r.ns[reclaim::MEMCG], r.max_ns), (12, 40_000_000, 9_000_000));
        let s = r.staller.expect("named");
        assert_eq!((s.kind, s.pid, s.tid, s.comm.as_str(), s.memcg_id), (reclaim::MEMCG, 4242, 4243, "dd", 2041));
        assert_eq!(decode(&v, 6).staller, None);
    }

    #[test]
    fn a_second_keeps_a_named_staller_whichever_read_held_its_longest_stall() {
        let named = |pid: u32| StallerInfo {
            kind: reclaim::MEMCG,
            pid,
            tid: pid,
            comm: "python3".into(),
            memcg: None,
            memcg_id: 7,
        };
        let read = |max_ns: u64, staller: Option<StallerInfo>| ReclaimSecond {
            count: [0, 1, 0],
            ns: [0, max_ns, 0],
            histogram: Vec::new(),
            max_ns,
            staller,
        };
        // The longest stall in a read too small to name, before or after the named read.
        for order in [false, true] {
            let (a, b) = (read(5_500_000, None), read(3_000_000, Some(named(42))));
            let mut s = if order { b.clone() } else { a.clone() };
            s.add(if order { a } else { b });
            assert_eq!((s.max_ns, s.staller.as_ref().map(|s| s.pid)), (5_500_000, Some(42)), "order {order}");
        }
        // Both named: the longest stall's task.
        let mut s = read(3_000_000, Some(named(42)));
        s.add(read(5_500_000, Some(named(43))));
        assert_eq!(s.staller.as_ref().map(|s| s.pid), Some(43));
        s.add(read(4_000_000, Some(named(44))));
        assert_eq!(s.staller.as_ref().map(|s| s.pid), Some(43));
    }

    #[test]
    fn the_tracker_reports_growth() {
        let mut t = Tracker::default();
        let cpu = |ns: u64| ReclaimCpu {
            count: [0, ns / 1000, 0],
            ns: [0, ns, 0],
            histogram: histogram(&[(1000, ns / 1000)]),
            max_ns: 0,
            staller: None,
        };
        assert_eq!(t.update(vec![cpu(5_000)])[0].1.ns[reclaim::MEMCG], 5_000);
        let second = t.update(vec![cpu(8_000)]);
        assert_eq!((second[0].1.ns[reclaim::MEMCG], second[0].1.count[reclaim::MEMCG]), (3_000, 3));
        assert_eq!(second[0].1.histogram, histogram(&[(1000, 3)]), "the histogram's growth");
        // Nothing new: nothing reported.
        assert!(t.update(vec![cpu(8_000)]).is_empty());
    }
}
