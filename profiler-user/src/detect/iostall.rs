//! `io-stall`, from the off-CPU counts (`offcpu`), once a drain: a process whose threads spent
//! at least `IO_SHARE` of the last `WINDOW_SECS` seconds blocked in I/O (uninterruptible
//! sleep), summed over its threads (one thread half the time, or two a quarter each), while the
//! machine's CPUs were mostly idle (below `IDLE_BUSY_BELOW` busy, from `/proc/stat`): the work
//! waits on a disk or a file system, not on the CPU, and a CPU profile shows nothing. It names
//! the kernel function the threads wait in, the file system it belongs to when its name says,
//! and the Python line that waits.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::Arc,
};

use serde_json::json;

use super::{Active, Kind, Severity, seconds::percent};
use crate::{model::OffState, store::format::NS_PER_SEC};

pub const WINDOW_SECS: u64 = 10;
pub const IO_SHARE: f64 = 0.5;
pub const IDLE_BUSY_BELOW: f64 = 0.5;

/// One thread's time off CPU from one stack in one second (a drained count).
#[derive(Debug, Clone)]
pub struct Wait {
    pub pid: u32,
    pub tid: u32,
    pub ts_ns: u64,
    pub ns: u64,
    pub state: OffState,
    pub comm: Arc<str>,
    /// The kernel function it waits in (`offcpu::waits_in`), when its stack was walked.
    pub waits_in: Option<Arc<str>>,
    /// The file system or device its kernel stack names (`offcpu::fs_of`).
    pub fs: Option<&'static str>,
    /// The leaf-most Python frame with its line.
    pub line: Option<Arc<str>>,
    /// Whether it waits on a queue (`detect::gpu::waiting::on_queue`): a worker waiting for work.
    pub queue: bool,
}

#[derive(Debug, Default)]
struct Process {
    comm: Arc<str>,
    /// (second's start ns, I/O ns) in the window.
    seconds: VecDeque<(u64, u64)>,
    functions: HashMap<Arc<str>, u64>,
    fs: HashMap<&'static str, u64>,
    lines: HashMap<Arc<str>, u64>,
}

#[derive(Debug, Default)]
pub struct IoStall {
    procs: BTreeMap<u32, Process>,
    /// (when, busy jiffies, all jiffies) of the machine, the window's worth.
    cpu: VecDeque<(u64, u64, u64)>,
}

/// Names kept per process (the rest are not counted).
const MAX_NAMES: usize = 64;

fn add<K: std::hash::Hash + Eq>(m: &mut HashMap<K, u64>, k: K, n: u64) {
    if m.len() < MAX_NAMES || m.contains_key(&k) {
        *m.entry(k).or_default() += n;
    }
}

fn top<K: Clone + Ord>(m: &HashMap<K, u64>) -> Option<(K, u64)> {
    m.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))).map(|(k, n)| (k.clone(), *n))
}

impl IoStall {
    /// One drain's waits, at `now_ns`; `busy`: the machine's busy share over the window, when
    /// known. Returns the stalls active now.
    pub fn evaluate(&mut self, now_ns: u64, waits: Vec<Wait>, busy: Option<f64>) -> Vec<Active> {
        let window_ns = WINDOW_SECS * NS_PER_SEC;
        let since = now_ns.saturating_sub(window_ns);
        for w in waits.into_iter().filter(|w| w.state == OffState::Io && w.ts_ns >= since) {
            let p = self.procs.entry(w.pid).or_default();
            p.comm = w.comm.clone();
            let sec = w.ts_ns / NS_PER_SEC * NS_PER_SEC;
            match p.seconds.iter_mut().find(|(s, _)| *s == sec) {
                Some((_, ns)) => *ns += w.ns,
                None => p.seconds.push_back((sec, w.ns)),
            }
            if let Some(f) = &w.waits_in {
                add(&mut p.functions, f.clone(), w.ns);
            }
            if let Some(fs) = w.fs {
                add(&mut p.fs, fs, w.ns);
            }
            if let Some(l) = &w.line {
                add(&mut p.lines, l.clone(), w.ns);
            }
        }
        let mut active = Vec::new();
        self.procs.retain(|_, p| {
            p.seconds.retain(|(s, _)| *s >= since);
            if p.seconds.is_empty() {
                return false;
            }
            true
        });
        let Some(busy) = busy else { return active };
        if busy >= IDLE_BUSY_BELOW {
            return active;
        }
        for (&pid, p) in &self.procs {
            let io: u64 = p.seconds.iter().map(|(_, ns)| ns).sum();
            let share = io as f64 / window_ns as f64;
            if share < IO_SHARE {
                continue;
            }
            let onset = p.seconds.iter().map(|(s, _)| *s).min().unwrap_or(since);
            let function = top(&p.functions);
            let fs = top(&p.fs);
            let line = top(&p.lines);
            let what = match (&function, fs) {
                (Some((f, _)), Some((fs, _))) => format!(" in {} ({fs})", f.trim_end_matches("_[k]")),
                (Some((f, _)), None) => format!(" in {}", f.trim_end_matches("_[k]")),
                (None, Some((fs, _))) => format!(" on {fs}"),
                (None, None) => String::new(),
            };
            let line_text = line.as_ref().map_or(String::new(), |(l, _)| format!(", waiting at {l}"));
            active.push(Active {
                kind: Kind::IoStall,
                cpu: None,
                subject: Some(format!("pid{pid}")),
                onset_ns: onset,
                severity: Severity::Warning,
                summary: format!(
                    "{} (pid {pid}) spent {} of {WINDOW_SECS} s blocked in I/O{what}{line_text} while the CPUs were {} \
                     busy: it waits on storage, not on the CPU; look next: the device's or file system's latency \
                     (iostat -x, nfsstat), read sizes, prefetching or more loader workers",
                    p.comm,
                    percent(share),
                    percent(busy),
                ),
                evidence: json!({
                    "pid": pid,
                    "comm": &*p.comm,
                    "io_share": share,
                    "machine_busy": busy,
                    "waits_in": function.as_ref().map(|(f, _)| f.to_string()),
                    "file_system": fs.map(|(f, _)| f),
                    "python_line": line.as_ref().map(|(l, _)| l.to_string()),
                }),
            });
        }
        active
    }

    /// The machine's busy share since the oldest reading in the window, from `/proc/stat`
    /// (`None` until two readings or when it cannot be read).
    pub fn machine_busy(&mut self, now_ns: u64) -> Option<f64> {
        let (busy, all) = read_cpu_jiffies()?;
        self.cpu.push_back((now_ns, busy, all));
        let since = now_ns.saturating_sub(WINDOW_SECS * NS_PER_SEC);
        while self.cpu.len() > 2 && self.cpu.get(1).is_some_and(|c| c.0 <= since) {
            self.cpu.pop_front();
        }
        let first = self.cpu.front()?;
        let d_all = all.checked_sub(first.2).filter(|&d| d > 0)?;
        Some(busy.saturating_sub(first.1) as f64 / d_all as f64)
    }
}

/// (busy, all) jiffies of the `cpu` line: idle and iowait are not busy.
fn read_cpu_jiffies() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    if v.len() < 5 {
        return None;
    }
    let all: u64 = v.iter().take(8).sum();
    let idle = v[3] + v[4];
    Some((all - idle, all))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(pid: u32, sec: u64, ns: u64, state: OffState) -> Wait {
        Wait {
            pid,
            tid: pid,
            ts_ns: sec * NS_PER_SEC,
            ns,
            state,
            comm: Arc::from("loader"),
            waits_in: Some(Arc::from("fuse_simple_request_[k]")),
            fs: Some("fuse"),
            line: Some(Arc::from("load (data.py:12)")),
            queue: false,
        }
    }

    #[test]
    fn a_process_blocked_in_io_half_the_window_on_an_idle_machine_is_named() {
        let mut d = IoStall::default();
        let waits: Vec<Wait> = (100..110).map(|s| wait(7, s, 600_000_000, OffState::Io)).collect();
        let a = d.evaluate(110 * NS_PER_SEC, waits, Some(0.05));
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].kind, Kind::IoStall);
        assert!(a[0].summary.contains("fuse_simple_request (fuse)"), "{}", a[0].summary);
        assert!(a[0].summary.contains("data.py:12"), "{}", a[0].summary);
    }

    #[test]
    fn sleeping_or_a_busy_machine_or_short_waits_raise_nothing() {
        let mut d = IoStall::default();
        let sleeping: Vec<Wait> = (100..110).map(|s| wait(7, s, 900_000_000, OffState::Sleep)).collect();
        assert!(d.evaluate(110 * NS_PER_SEC, sleeping, Some(0.05)).is_empty());
        let io: Vec<Wait> = (100..110).map(|s| wait(8, s, 900_000_000, OffState::Io)).collect();
        assert!(d.evaluate(110 * NS_PER_SEC, io, Some(0.9)).is_empty());
        let mut d = IoStall::default();
        let short: Vec<Wait> = (100..110).map(|s| wait(9, s, 100_000_000, OffState::Io)).collect();
        assert!(d.evaluate(110 * NS_PER_SEC, short, Some(0.05)).is_empty());
    }
}
