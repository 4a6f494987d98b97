//! What the processes holding a GPU asked of the CPUs, once a second: per holder, the thread
//! that ran plus waited runnable the most, from `/proc/PID/task/TID/schedstat` (nanoseconds on
//! a CPU, nanoseconds waiting on a run queue, since the thread began).
//!
//! Why not the samples alone: they see a thread only while it runs. A Python loop launching
//! kernels one by one on a core it shares with a build gets half the core, and its samples say
//! "half busy", while the GPU idles for want of that thread. Ran plus waited says it asked for
//! the whole core (`detect::gpu`'s `gpu-launch-bound`), and the wait says the core was shared.
//!
//! Read only for the holders of a GPU that idled over the second (what the detectors judge),
//! 4-11 µs of the poller's CPU a thread (a 150-thread holder: 0.6-1.7 ms a second, BENCHMARKS.md).
//! Bounded: at most [`MAX_THREADS`] threads a process are read (a PyTorch process has 50 to 150),
//! and only the holders' threads of the latest read are kept. A kernel built without scheduler
//! statistics has no `schedstat` file: nothing is said, and the detector goes by its samples.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use crate::gpu_readings::ThreadDemand;

/// Threads read per process at most.
pub const MAX_THREADS: usize = 512;

/// Per thread id: its pid, and its run and wait nanoseconds.
type Threads = HashMap<u32, (u32, u64, u64)>;

pub struct Demand {
    proc_root: PathBuf,
    /// The latest read, and when.
    last: Option<(u64, Threads)>,
}

/// `run_ns wait_ns timeslices`.
fn parse(text: &str) -> Option<(u64, u64)> {
    let mut it = text.split_ascii_whitespace();
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

impl Demand {
    pub fn new(proc_root: &Path) -> Self {
        Self { proc_root: proc_root.to_path_buf(), last: None }
    }

    fn read_process(&self, pid: u32, into: &mut Threads) {
        let Ok(tasks) = std::fs::read_dir(self.proc_root.join(pid.to_string()).join("task")) else { return };
        for entry in tasks.flatten().take(MAX_THREADS) {
            let Some(tid) = entry.file_name().to_str().and_then(|t| t.parse::<u32>().ok()) else { continue };
            if let Some((run, wait)) =
                std::fs::read_to_string(entry.path().join("schedstat")).ok().as_deref().and_then(parse)
            {
                into.insert(tid, (pid, run, wait));
            }
        }
    }

    /// Reads the threads of `pids` at `now_ns`; returns, per process seen at the read before
    /// too, its thread that asked most over the time between. No pids: nothing is read, and
    /// the next read starts afresh (a GPU busy for an hour leaves no hour-old figures behind).
    pub fn read(&mut self, pids: &[u32], now_ns: u64) -> Vec<ThreadDemand> {
        if pids.is_empty() {
            self.last = None;
            return Vec::new();
        }
        let mut now = HashMap::new();
        for &pid in pids {
            self.read_process(pid, &mut now);
        }
        let mut out: HashMap<u32, ThreadDemand> = HashMap::new();
        if let Some((then_ns, then)) = &self.last {
            let span = now_ns.saturating_sub(*then_ns) as f64;
            for (tid, (pid, run, wait)) in &now {
                let Some((_, run0, wait0)) = then.get(tid).filter(|t| t.0 == *pid) else { continue };
                if span <= 0.0 {
                    break;
                }
                let d = ThreadDemand {
                    pid: *pid,
                    tid: *tid,
                    ran: (run.saturating_sub(*run0) as f64 / span).min(1.0),
                    waited: (wait.saturating_sub(*wait0) as f64 / span).min(1.0),
                };
                let best = out.entry(*pid).or_insert(d);
                if d.asked() > best.asked() || (d.asked() == best.asked() && d.tid < best.tid) {
                    *best = d;
                }
            }
        }
        self.last = Some((now_ns, now));
        let mut out: Vec<ThreadDemand> = out.into_values().collect();
        out.sort_by_key(|d| d.pid);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(root: &Path, pid: u32, tid: u32, run: u64, wait: u64) {
        let d = root.join(pid.to_string()).join("task").join(tid.to_string());
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("schedstat"), format!("{run} {wait} 17\n")).unwrap();
    }

    #[test]
    fn the_thread_that_ran_and_waited_most_over_the_second_speaks_for_its_process() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        thread(root, 812, 812, 5_000_000_000, 1_000_000_000);
        thread(root, 812, 830, 100, 0);
        let mut d = Demand::new(root);
        assert!(d.read(&[812], 10_000_000_000).is_empty(), "one read has no interval");
        // Over 1 s: the main thread ran 0.55 s and waited 0.40 s; the helper ran 0.3 s.
        thread(root, 812, 812, 5_550_000_000, 1_400_000_000);
        thread(root, 812, 830, 300_000_100, 0);
        // A thread new since the last read has no interval yet.
        thread(root, 812, 899, 900_000_000, 0);
        let got = d.read(&[812], 11_000_000_000);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!((got[0].pid, got[0].tid), (812, 812));
        assert!((got[0].ran - 0.55).abs() < 1e-9 && (got[0].waited - 0.40).abs() < 1e-9, "{got:?}");
        assert!((got[0].asked() - 0.95).abs() < 1e-9);
    }

    #[test]
    fn a_process_gone_or_a_kernel_without_scheduler_statistics_says_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("500/task/500")).unwrap();
        std::fs::write(root.join("500/task/500/schedstat"), "not numbers").unwrap();
        let mut d = Demand::new(root);
        for now in [1, 2, 3] {
            assert!(d.read(&[500, 501], now * 1_000_000_000).is_empty());
        }
    }

    #[test]
    fn a_second_without_pids_to_read_forgets_the_read_before() {
        let dir = tempfile::tempdir().unwrap();
        thread(dir.path(), 812, 812, 0, 0);
        let mut d = Demand::new(dir.path());
        d.read(&[812], 1_000_000_000);
        assert!(d.read(&[], 2_000_000_000).is_empty());
        thread(dir.path(), 812, 812, 900_000_000, 0);
        assert!(d.read(&[812], 3_000_000_000).is_empty(), "no interval since the busy second");
        thread(dir.path(), 812, 812, 1_800_000_000, 0);
        let got = d.read(&[812], 4_000_000_000);
        assert!((got[0].ran - 0.9).abs() < 1e-9, "{got:?}");
    }
}
