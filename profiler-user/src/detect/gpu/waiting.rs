//! `gpu-starved` from the off-CPU side (issue 42): an input pipeline that waits rather than
//! computes. When a GPU idles and its feeders keep no CPU busy, a CPU profile has nothing to
//! name; the off-CPU counts (`offcpu`, drained about once a second) say where the processes
//! its holders started (a DataLoader's workers) were blocked: the kernel function they wait in
//! and its state (`pipe_read`, a socket receive, a network file system's read), the file
//! system or device their kernel stack names (`offcpu::fs_of`, as `io-stall` names it), the
//! Python line; and where the holder's training loop waits (on the workers' queue).
//!
//! Only the waits of the GPUs' holders and the processes they started are kept, for
//! [`WINDOW_SECS`]; a worker waiting on its own queue for the next index (a multiprocessing
//! queue or connection, `queue.py`) has nothing to do and is not counted as blocked. A wait
//! is credited when it ends (split over the seconds it covered), so a share is measured over
//! the window's seconds the drains have reached.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
};

use serde_json::json;

use crate::{
    detect::{iostall::Wait, percent},
    gpu_readings::GpuSecond,
    interpreter::python,
    model::OffState,
    store::format::NS_PER_SEC,
};

/// The seconds over which a blocked share is measured (up to the GPU second judged).
pub const WINDOW_SECS: u64 = 5;
/// Waits kept at most per process (the oldest go first), and processes kept at most.
const MAX_ENTRIES: usize = 1024;
const MAX_PROCS: usize = 256;

/// Python files whose frames wait on a queue: a multiprocessing queue or connection (a
/// worker's index queue, the loop's data queue) or a thread queue (the pin-memory thread's).
const QUEUE_FILES: [&str; 4] =
    ["multiprocessing/queues.py", "multiprocessing/connection.py", "multiprocessing/synchronize.py", "/queue.py"];

/// Whether a stack's user frames (root first) wait on a queue ([`QUEUE_FILES`]).
pub fn on_queue(user: &[Arc<str>]) -> bool {
    user.iter()
        .filter_map(|f| python::source(f))
        .any(|(_, file, _)| QUEUE_FILES.iter().any(|q| file.ends_with(q) || file == q.trim_start_matches('/')))
}

/// What a thread waited in: the kernel function, its state, the file system or device, the
/// Python line.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Call {
    waits_in: Option<Arc<str>>,
    state: OffState,
    fs: Option<&'static str>,
    line: Option<Arc<str>>,
    queue: bool,
}

#[derive(Debug, Default)]
struct Proc {
    comm: Arc<str>,
    /// The first second kept of it: a window does not reach back past it.
    since: u64,
    /// Blocked ns by (second, thread, call).
    waits: HashMap<(u64, u32, Call), u64>,
}

/// The helpers' and the loop's waits, as the finding names them.
#[derive(Debug, Clone, PartialEq)]
pub struct Blocked {
    /// The helpers' blocked time a second over the window (seconds: 2.0 is two workers blocked
    /// all the time), and the CPU they used this second (cores).
    pub blocked: f64,
    pub busy: f64,
    /// The blocked helpers, most blocked first: (pid, comm, seconds blocked a second).
    pub workers: Vec<(u32, Arc<str>, f64)>,
    /// The helpers' call that blocked longest, with its share of their blocked time.
    pub waits_in: Option<Arc<str>>,
    pub state: OffState,
    pub fs: Option<&'static str>,
    pub line: Option<Arc<str>>,
    pub share: f64,
    /// The holders' thread that waited longest (the one waiting on a queue first).
    pub loop_wait: Option<LoopWait>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LoopWait {
    pub pid: u32,
    pub tid: u32,
    pub comm: Arc<str>,
    /// Seconds blocked a second over the window.
    pub blocked: f64,
    pub waits_in: Option<Arc<str>>,
    pub line: Option<Arc<str>>,
    pub queue: bool,
}

/// A holder's thread over the window: ns blocked, ns of it on a queue, by call.
type ThreadWaits<'a> = (u64, u64, HashMap<&'a Call, u64>);

#[derive(Debug, Default)]
pub struct Waiting {
    procs: BTreeMap<u32, Proc>,
    /// The newest second any drained wait was credited to: the drains' reach.
    newest: u64,
}

fn name(f: &Option<Arc<str>>) -> Option<&str> {
    f.as_deref().map(|f| f.trim_end_matches("_[k]"))
}

impl Waiting {
    /// One drain's waits; `feeders`: the GPUs' holders and the processes they started (the
    /// others' waits are not kept).
    pub fn on_waits(&mut self, waits: &[Wait], feeders: &HashSet<u32>) {
        for w in waits {
            let sec = w.ts_ns / NS_PER_SEC;
            self.newest = self.newest.max(sec);
            if w.state == OffState::Runnable || !feeders.contains(&w.pid) {
                continue;
            }
            if self.procs.len() >= MAX_PROCS && !self.procs.contains_key(&w.pid) {
                continue;
            }
            let p = self.procs.entry(w.pid).or_insert_with(|| Proc { since: sec, ..Default::default() });
            p.since = p.since.min(sec);
            p.comm = w.comm.clone();
            let call =
                Call { waits_in: w.waits_in.clone(), state: w.state, fs: w.fs, line: w.line.clone(), queue: w.queue };
            let key = (sec, w.tid, call);
            if p.waits.len() >= MAX_ENTRIES && !p.waits.contains_key(&key) {
                // The oldest second's go first.
                let Some(oldest) = p.waits.keys().map(|k| k.0).min() else { continue };
                p.waits.retain(|k, _| k.0 != oldest);
            }
            *p.waits.entry(key).or_default() += w.ns;
        }
        // Late credits for the window are still wanted: keep twice its length.
        let since = self.newest.saturating_sub(2 * WINDOW_SECS);
        self.procs.retain(|pid, p| {
            p.waits.retain(|k, _| k.0 >= since);
            !p.waits.is_empty() && feeders.contains(pid)
        });
    }

    /// Whether `g`'s helpers were mostly blocked rather than busy over the window up to the
    /// second starting at `start_ns`: blocked at least `share` of a second, and longer than the
    /// `busy` cores they used this second.
    pub fn blocked(&self, g: &GpuSecond, start_ns: u64, busy: f64, share: f64) -> Option<Blocked> {
        let end = start_ns / NS_PER_SEC;
        // Nor the seconds before its helpers' waits were first kept (the poller names a GPU's
        // helpers once it idles).
        let first = g.descendants.iter().filter_map(|p| self.procs.get(p)).map(|p| p.since).min()?;
        let from = end.saturating_sub(WINDOW_SECS - 1).max(first);
        // Only the seconds the drains reached count: a wait is credited when it ends.
        let reached = (from..=end.min(self.newest)).count() as f64;
        if reached == 0.0 {
            return None;
        }
        let in_window = |k: &(u64, u32, Call)| (from..=end).contains(&k.0);
        let mut workers = Vec::new();
        let mut calls: HashMap<&Call, u64> = HashMap::new();
        let mut total = 0u64;
        for pid in &g.descendants {
            let Some(p) = self.procs.get(pid) else { continue };
            let mut ns = 0;
            // A worker waiting on its queue for work is idle, not blocked.
            for (k, n) in p.waits.iter().filter(|(k, _)| in_window(k) && !k.2.queue) {
                ns += n;
                *calls.entry(&k.2).or_default() += n;
            }
            if ns > 0 {
                workers.push((*pid, p.comm.clone(), ns as f64 / NS_PER_SEC as f64 / reached));
                total += ns;
            }
        }
        let blocked = total as f64 / NS_PER_SEC as f64 / reached;
        if blocked < share || blocked <= busy {
            return None;
        }
        workers.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
        workers.truncate(5);
        let (call, n) = calls
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.waits_in.cmp(&a.0.waits_in)))
            .expect("some waits");
        Some(Blocked {
            blocked,
            busy,
            workers,
            waits_in: call.waits_in.clone(),
            state: call.state,
            fs: call.fs,
            line: call.line.clone(),
            share: n as f64 / total.max(1) as f64,
            loop_wait: self.loop_wait(&g.holders, from, end, reached),
        })
    }

    /// The holders' thread whose waits most say "the loop waits on its input": one waiting on
    /// a queue, else the process's main thread, else the longest waiting; with its top call.
    fn loop_wait(&self, holders: &[u32], from: u64, end: u64, reached: f64) -> Option<LoopWait> {
        let mut threads: BTreeMap<(u32, u32), ThreadWaits<'_>> = BTreeMap::new();
        for pid in holders {
            let Some(p) = self.procs.get(pid) else { continue };
            for (k, n) in p.waits.iter().filter(|(k, _)| (from..=end).contains(&k.0)) {
                let t = threads.entry((*pid, k.1)).or_default();
                t.0 += n;
                if k.2.queue {
                    t.1 += n;
                }
                *t.2.entry(&k.2).or_default() += n;
            }
        }
        let rank = |(pid, tid): &(u32, u32), t: &ThreadWaits<'_>| (t.1, pid == tid, t.0);
        let ((pid, tid), t) = threads.iter().max_by(|a, b| rank(a.0, a.1).cmp(&rank(b.0, b.1)))?;
        let (call, _) = t.2.iter().max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.waits_in.cmp(&a.0.waits_in)))?;
        Some(LoopWait {
            pid: *pid,
            tid: *tid,
            comm: self.procs.get(pid).map_or_else(|| Arc::from(""), |p| p.comm.clone()),
            blocked: t.0 as f64 / NS_PER_SEC as f64 / reached,
            waits_in: call.waits_in.clone(),
            line: call.line.clone(),
            queue: call.queue,
        })
    }
}

impl Blocked {
    /// `python3 (pid 901) and 1 other worker(s) were blocked 1.9 s of each second (0.0 cores
    /// busy), 98 % of it in pipe_read (sleep) at load (loader.py:3); the training loop
    /// (thread 900 of python3, pid 900) waited 0.97 s of each second in pipe_read at next_batch
    /// (loader.py:12), on the workers' queue`.
    pub fn describe(&self) -> String {
        let who = match self.workers.first() {
            Some((pid, comm, _)) => format!("{comm} (pid {pid})"),
            None => "its workers".into(),
        };
        let mut call = match name(&self.waits_in) {
            Some(f) => format!(", {} of it in {f} ({})", percent(self.share), self.state.name()),
            None => format!(", {} of it in the {} state", percent(self.share), self.state.name()),
        };
        if let Some(fs) = self.fs {
            call.push_str(&format!(" on {fs}"));
        }
        if let Some(l) = &self.line {
            call.push_str(&format!(" at {l}"));
        }
        let loop_text = self.loop_wait.as_ref().map_or(String::new(), |l| {
            let mut s = format!(
                "; the training loop (thread {} of {}, pid {}) waited {:.2} s of each second",
                l.tid, l.comm, l.pid, l.blocked
            );
            if let Some(f) = name(&l.waits_in) {
                s.push_str(&format!(" in {f}"));
            }
            if let Some(line) = &l.line {
                s.push_str(&format!(" at {line}"));
            }
            if l.queue {
                s.push_str(", on the workers' queue");
            }
            s
        });
        format!(
            "{who} and {} other worker(s) were blocked {:.2} s of each second ({:.2} cores busy){call}{loop_text}",
            self.workers.len().saturating_sub(1),
            self.blocked,
            self.busy,
        )
    }

    pub fn json(&self) -> serde_json::Value {
        json!({
            "blocked_seconds_per_second": self.blocked,
            "busy_cores": self.busy,
            "workers": self.workers.iter().map(|(pid, comm, b)| json!({"pid": pid, "comm": &**comm, "blocked_seconds_per_second": b})).collect::<Vec<_>>(),
            "waits_in": self.waits_in.as_deref(),
            "state": self.state.name(),
            "file_system": self.fs,
            "python_line": self.line.as_deref(),
            "call_share": self.share,
            "loop": self.loop_wait.as_ref().map(|l| json!({
                "pid": l.pid,
                "tid": l.tid,
                "comm": &*l.comm,
                "blocked_seconds_per_second": l.blocked,
                "waits_in": l.waits_in.as_deref(),
                "python_line": l.line.as_deref(),
                "on_queue": l.queue,
            })),
        })
    }
}
