//! `/api/threads`: one process's threads over a window, each bucket of each thread split into
//! running (its CPU samples, at the sampling frequency), runnable (preempted, waiting for a CPU),
//! blocked in I/O and blocked otherwise (its off-CPU time by state, `model::OffState`): the
//! page draws it as a strip a thread under the heatmap, on the same time axis. Bounded: at most
//! [`MAX_COLUMNS`] buckets (a longer window gets longer buckets, said in `note`) and the
//! [`MAX_THREADS`] threads with the most time in the window (the others counted).

use std::collections::HashMap;

use axum::{
    extract::{Query, State},
    response::Response,
};
use serde::Serialize;

use super::{
    Shared, heavy, json,
    request::{Failure, Params, bad},
    source::SourceError,
};
use crate::{
    model::{OffState, SampleKind},
    query::{Filter, SampleRef, Window},
    timespec,
};

/// Buckets at most: a strip's cells stay a few pixels wide on a screen.
pub const MAX_COLUMNS: u64 = 600;
/// Threads drawn at most (the busiest and the most waiting first).
pub const MAX_THREADS: usize = 48;
/// What a CPU sample stands for when its segment does not record the frequency.
const DEFAULT_HZ: u64 = 99;

/// The states, in the order of each cell's numbers.
pub const STATES: [&str; 4] = ["running", "runnable", "io", "sleep"];
const RUNNING: usize = 0;

/// The answer.
#[derive(Debug, Serialize, PartialEq)]
pub struct Timeline {
    pub pid: u32,
    /// Start of the first bucket (unix ns; whole seconds).
    pub first_ns: u64,
    pub bucket_ns: u64,
    pub columns: u64,
    pub states: [&'static str; 4],
    pub threads: Vec<Thread>,
    /// Threads with time in the window that are not drawn ([`MAX_THREADS`]).
    pub more_threads: usize,
    /// Whether off-CPU time was read (false: the daemon records none, only running shows).
    pub off_cpu: bool,
    /// Why the buckets are longer than asked, when they are.
    pub note: Option<String>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct Thread {
    pub tid: u32,
    pub comm: String,
    /// Milliseconds in each of [`STATES`] over the window.
    pub totals_ms: [f64; 4],
    /// `[column, running, runnable, io, sleep]` in milliseconds, for the columns with any.
    pub cells: Vec<[f64; 5]>,
}

/// Adds samples up by thread and bucket, then shapes the answer.
pub struct Builder {
    first_ns: u64,
    bucket_ns: u64,
    columns: u64,
    note: Option<String>,
    threads: HashMap<u32, Acc>,
}

#[derive(Default)]
struct Acc {
    /// The thread's name from a CPU sample (the thread's own), else from a wait.
    comm: String,
    comm_from_cpu: bool,
    /// Microseconds by column and state.
    cells: HashMap<u64, [u64; 4]>,
}

impl Builder {
    /// Buckets of `bucket_ns` (whole seconds, at least one: off-CPU time is kept per second)
    /// over `window`, longer when that would make more than [`MAX_COLUMNS`].
    pub fn new(window: Window, bucket_ns: u64) -> Self {
        const S: u64 = 1_000_000_000;
        let first_ns = window.from_ns / S * S;
        let end_ns = window.to_ns.div_ceil(S) * S;
        let asked = bucket_ns.max(S).div_ceil(S) * S;
        let span = end_ns - first_ns;
        let fit = span.div_ceil(MAX_COLUMNS).div_ceil(S) * S;
        let bucket_ns = asked.max(fit);
        let note = (bucket_ns > asked)
            .then(|| format!("buckets of {} s: a timeline has at most {MAX_COLUMNS} columns", bucket_ns / S));
        Self { first_ns, bucket_ns, columns: span.div_ceil(bucket_ns), note, threads: HashMap::new() }
    }

    fn column(&self, ts_ns: u64) -> Option<u64> {
        let c = ts_ns.checked_sub(self.first_ns)? / self.bucket_ns;
        (c < self.columns).then_some(c)
    }

    /// A CPU sample: the thread ran for a sampling period.
    pub fn running(&mut self, s: &SampleRef<'_>) {
        let Some(col) = self.column(s.ts_ns) else { return };
        let hz = s.frequency_hz.unwrap_or(DEFAULT_HZ).max(1);
        let acc = self.threads.entry(s.tid).or_default();
        if !acc.comm_from_cpu {
            acc.comm = s.comm.to_string();
            acc.comm_from_cpu = true;
        }
        acc.cells.entry(col).or_default()[RUNNING] += s.count * 1_000_000 / hz;
    }

    /// An off-CPU sample (`count` microseconds): its state is its root frame.
    pub fn waited(&mut self, s: &SampleRef<'_>) {
        let Some(col) = self.column(s.ts_ns) else { return };
        let Some(state) = state_of(s.frames) else { return };
        let acc = self.threads.entry(s.tid).or_default();
        if acc.comm.is_empty() {
            acc.comm = s.comm.to_string();
        }
        acc.cells.entry(col).or_default()[state] += s.count;
    }

    /// The [`MAX_THREADS`] threads with the most time, most first (ties by thread id).
    pub fn finish(self, pid: u32, off_cpu: bool) -> Timeline {
        let mut threads: Vec<Thread> = self
            .threads
            .into_iter()
            .map(|(tid, acc)| {
                let ms = |us: u64| (us as f64 / 100.0).round() / 10.0;
                let mut totals = [0u64; 4];
                let mut cols: Vec<_> = acc.cells.into_iter().collect();
                cols.sort_unstable_by_key(|(c, _)| *c);
                let cells = cols
                    .into_iter()
                    .map(|(c, v)| {
                        (0..4).for_each(|i| totals[i] += v[i]);
                        [c as f64, ms(v[0]), ms(v[1]), ms(v[2]), ms(v[3])]
                    })
                    .collect();
                Thread { tid, comm: acc.comm, totals_ms: totals.map(ms), cells }
            })
            .collect();
        let total = |t: &Thread| t.totals_ms.iter().sum::<f64>();
        threads.sort_by(|a, b| total(b).total_cmp(&total(a)).then(a.tid.cmp(&b.tid)));
        let more_threads = threads.len().saturating_sub(MAX_THREADS);
        threads.truncate(MAX_THREADS);
        Timeline {
            pid,
            first_ns: self.first_ns,
            bucket_ns: self.bucket_ns,
            columns: self.columns,
            states: STATES,
            threads,
            more_threads,
            off_cpu,
            note: self.note,
        }
    }
}

/// The index in [`STATES`] of an off-CPU stack's state frame (its root, or under the comm).
fn state_of(frames: &[(&str, bool)]) -> Option<usize> {
    frames.iter().take(2).find_map(|(name, _)| {
        OffState::ALL.into_iter().find(|s| s.frame() == *name).map(|s| match s {
            OffState::Runnable => 1,
            OffState::Io => 2,
            OffState::Sleep => 3,
        })
    })
}

/// `GET /api/threads?pid=N&from=&to=[&bucket=1s][&node=]`.
pub(super) async fn threads_api(State(s): State<Shared>, Query(p): Query<Params>) -> Result<Response, Failure> {
    let app = s.app.clone();
    heavy(&s, move || {
        let pid = match p.pid {
            Some(pid) if pid > 0 => pid,
            Some(_) => return Err(bad("pid=0 is the idle task: give a process id")),
            None => return Err(bad("pid= is required: the timeline shows one process's threads")),
        };
        let w = p.window("-5m")?;
        let bucket = p.bucket.as_deref().unwrap_or("1s");
        let bucket_ns = timespec::parse_duration_ns(bucket)
            .filter(|&b| b >= 1_000_000_000)
            .ok_or_else(|| bad(format!("bucket '{bucket}' must be a duration of 1s or more")))?;
        let filter = Filter { pid: Some(pid), ..Filter::default() };
        let mut b = Builder::new(w, bucket_ns);
        let node = p.node.as_deref();
        app.source.read(node, SampleKind::Cpu, |r| r.for_each_sample(w, &filter, |s| b.running(s)))?;
        let off_cpu =
            match app.source.read(node, SampleKind::OffCpu, |r| r.for_each_sample(w, &filter, |s| b.waited(s))) {
                Ok(_) => true,
                // No off-CPU time recorded, or none in this window: the strip shows running only.
                Err(SourceError::NotRecorded(_)) => false,
                Err(SourceError::Query(crate::query::QueryError::NoData { .. })) => true,
                Err(e) => return Err(e.into()),
            };
        json(b.finish(pid, off_cpu))
    })
    .await
}

#[cfg(test)]
#[path = "threads_tests.rs"]
mod tests;
