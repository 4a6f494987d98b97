//! Once a drain (every [`super::DRAIN_EVERY`]): the kernel's counts into the CUDA stores, as
//! weighted rows under each call's stack (scaled where the rate guard had the probes on part of
//! the time), into per-process counter tracks, and into the figures the detectors read.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Instant,
};

use profiler_common::cuda::{CudaKey, kind};

use super::{Interval, ROWS_HELD, Recorder, THREADS_MAX, TRACKS_MAX, kernels};
use crate::{
    collect::{Collector, counters::Point},
    detect::cuda::{CudaThread, python_line},
    model::{Sample, SampleKind, Stack},
    pipeline::Pipeline,
    store::{self, StoreWriter, counters::CountersWriter},
};

impl Recorder {
    /// Drains the counts into the stores; returns each process's calls a second, and each
    /// thread's calls for the detectors (the most blocked and the busiest, [`THREADS_MAX`] each).
    /// What it holds is bounded by the kernel's keys: one row a key, its count a number.
    pub(super) fn drain(
        &mut self,
        collector: &mut Collector,
        pipeline: &mut Pipeline,
        now_ns: u64,
        elapsed: f64,
        read: &HashMap<u32, Interval>,
    ) -> (HashMap<u32, f64>, Vec<CudaThread>) {
        let mut rates: HashMap<u32, f64> = HashMap::new();
        let mut threads: BTreeMap<u32, CudaThread> = BTreeMap::new();
        // What the look-ups named, before the counts (of the generation before) are named.
        self.kernels.learn(collector.cuda_lookups());
        let cached = &self.stacks;
        let drained = collector.cuda_drain(|h| cached.contains(&h), pipeline.offset());
        for &(uid, n) in &drained.dropped {
            self.status.add_dropped(uid, n);
        }
        let now = Instant::now();
        // The stacks of synchronisations still blocked: their count comes after the kernel's
        // copy is gone.
        let counted: std::collections::HashSet<u64> = drained.counts.iter().map(|d| d.key.hash).collect();
        for (h, record) in drained.stacks.iter().filter(|(h, _)| !counted.contains(h)) {
            if let Some(s) = pipeline.cuda_sample(record_bytes(record), now_ns, now) {
                self.stacks.put(*h, s);
            }
        }
        if drained.counts.is_empty() {
            return (rates, Vec::new());
        }
        for d in drained.counts {
            let interval = read.get(&d.key.pid).copied().unwrap_or_default();
            let covered = interval.covered(elapsed);
            *rates.entry(d.key.pid).or_default() += super::guard::hits(&d.key, d.count.calls) as f64 / covered;
            let (kind, weight) = match d.key.kind {
                kind::LAUNCH => {
                    self.status.launches += d.count.calls;
                    (SampleKind::CudaLaunches, d.count.calls)
                }
                kind::SYNC => {
                    self.status.syncs += d.count.calls;
                    self.status.sync_ns = self.status.sync_ns.saturating_add(d.count.ns);
                    (SampleKind::CudaSync, d.count.ns / 1_000)
                }
                kind::COPY => {
                    self.status.copies += d.count.calls;
                    self.status.copy_bytes = self.status.copy_bytes.saturating_add(d.count.bytes);
                    (SampleKind::CudaCopies, d.count.bytes)
                }
                _ => continue,
            };
            // Counted part of the time (the process's guard): scaled to the whole time, and
            // marked, by the state of the interval these counts were made in.
            // (Over the interval's length: the probes may have come on late in it.)
            let estimate = Some(interval).filter(|i| i.estimating && i.fraction > 0.0);
            let scale = estimate.map_or(1.0, |i| elapsed / covered / i.fraction);
            // A number, however large: the kernel bounds each call's bytes (1 TiB) and a u64
            // holds millions of them; saturating past that.
            let weight = (weight as f64 * scale).round().min(u64::MAX as f64) as u64;
            let sample = match self.stacks.get(&d.key.hash) {
                Some(s) => Some(s.clone()),
                None => match drained.stacks.get(&d.key.hash) {
                    Some(record) => {
                        let bytes = record_bytes(record);
                        let s = pipeline.cuda_sample(bytes, now_ns, now);
                        if let Some(s) = &s {
                            self.stacks.put(d.key.hash, s.clone());
                        }
                        s
                    }
                    None => None,
                },
            };
            // In the second of the calls (a drain reads them one to two seconds later); never
            // after now, whatever the clock did meanwhile.
            let ts_ns = d.ts_ns.min(now_ns);
            let mut sample = match sample {
                Some(mut s) => {
                    s.ts_ns = ts_ns;
                    s
                }
                None => {
                    self.status.stacks_lost += 1;
                    // The process's name from its other counts of this drain, if it is gone.
                    let known = threads.values().find(|t| t.pid == d.key.pid && !t.comm.is_empty());
                    lost_stack(d.key.pid, d.key.tid, ts_ns, known.map(|t| t.comm.clone()))
                }
            };
            // The CPU of these calls: the stack kept is its first call's, made anywhere.
            sample.cpu = d.key.cpu;
            // A launch's kernel as the leaf.
            let sample = self.name_kernel(pipeline, &d.key, sample);
            let th = threads.entry(d.key.tid).or_insert_with(|| CudaThread {
                pid: d.key.pid,
                tid: d.key.tid,
                comm: sample.comm.clone(),
                workload: sample.workload.clone(),
                ..Default::default()
            });
            let line = python_line(sample.stack.user());
            match d.key.kind {
                kind::LAUNCH => {
                    th.launches = th.launches.saturating_add(weight);
                    if let Some(l) = line {
                        th.launch_lines.push((l, weight));
                    }
                    if d.key.func != 0
                        && let Some(k) = sample.stack.user().last()
                    {
                        th.launch_kernels.push((k.clone(), weight));
                    }
                }
                kind::SYNC => {
                    let ns = (d.count.ns as f64 * scale) as u64;
                    th.sync_ns = th.sync_ns.saturating_add(ns);
                    if let Some(l) = line {
                        th.sync_lines.push((l, ns));
                    }
                }
                _ => {}
            }
            let sample = match estimate {
                Some(i) => self.estimated((d.key.hash, d.key.func), sample, i.fraction),
                None => sample,
            };
            if weight > 0
                && let Some(writer) = self.writer(kind)
            {
                writer.push_weighted(&sample, weight);
            }
        }
        for (kind, w) in &mut self.writers {
            if let Err(e) = w.flush(now_ns) {
                tracing::warn!(samples = kind.name(), error = %e, "cannot write CUDA counts; they are held and written later");
            }
        }
        (rates, busiest(threads.into_values().collect()))
    }

    /// `s` with a root frame saying it was counted while the guard had the probes on `fraction`
    /// of the time, so estimates never merge with exact counts; the marked stack is kept per
    /// stack and share, not copied a row.
    fn estimated(&mut self, (hash, func): (u64, u64), mut s: Sample, fraction: f64) -> Sample {
        let percent = (fraction * 100.0).round() as u32;
        s.stack = self.estimates.get_or_insert((hash, func, percent), || marked(&s.stack, percent)).clone();
        s
    }

    /// `s` with its kernel's frame (`kernels`) as the leaf, for a launch; as it is otherwise.
    /// The named stack is kept per stack and kernel, while the kernel's name stays the same.
    fn name_kernel(&mut self, pipeline: &mut Pipeline, key: &CudaKey, mut s: Sample) -> Sample {
        if key.kind != kind::LAUNCH || key.func == 0 {
            return s;
        }
        let comm = s.comm.clone();
        let frame = self.kernels.frame(key.pid, key.func, &s.stack, |addr| {
            // The host stub's own symbol: a one-address "stack" (a leaf: not moved back a byte
            // as a return address is).
            let stack = pipeline.symbolizer_mut().stack(key.pid, &comm, &[], &[addr]);
            let name = stack.frames.first()?.clone();
            let file = stack.locations.first().map(|l| l.file.clone()).unwrap_or_default();
            let unnamed = &*name == crate::symbolize::UNKNOWN || crate::symbolize::parse_module_offset(&name).is_some();
            let name = (!unnamed).then(|| Arc::from(kernels::demangle(&name)));
            Some(kernels::Symbol { name, file })
        });
        let Some(frame) = frame else { return s };
        match self.named.get(&(key.hash, key.func)) {
            Some((f, stack)) if Arc::ptr_eq(f, &frame) => s.stack = stack.clone(),
            _ => {
                let stack = Arc::new(kernels::with_leaf(&s.stack, frame.clone()));
                self.named.put((key.hash, key.func), (frame, stack.clone()));
                s.stack = stack;
            }
        }
        s
    }

    /// Per process: launches a second and milliseconds a second blocked, as counter tracks
    /// (`profiler counters --name 'cuda*'`, the page's tracks under the GPUs').
    pub(super) fn write_tracks(&mut self, threads: &[CudaThread], now_ns: u64, elapsed: f64) {
        if threads.is_empty() {
            return;
        }
        let mut per_pid: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        // A pid alone says nothing on the page: each process's tracks say its name and pod.
        let mut about: HashMap<u32, String> = HashMap::new();
        for t in threads {
            let e = per_pid.entry(t.pid).or_default();
            e.0 += t.launches;
            e.1 += t.sync_ns;
            if !t.comm.is_empty() {
                about.entry(t.pid).or_insert_with(|| process_about(&t.comm, &t.workload));
            }
        }
        let mut busiest: Vec<(u32, (u64, u64))> = per_pid.into_iter().collect();
        busiest.sort_by_key(|b| std::cmp::Reverse((b.1.0, b.1.1)));
        busiest.truncate(TRACKS_MAX);
        let mut points = Vec::new();
        for &(pid, (launches, sync_ns)) in &busiest {
            points.push(Point {
                name: format!("cuda.{pid}.launches"),
                cpu: None,
                unit: "launches/s".into(),
                value: launches as f64 / elapsed,
            });
            points.push(Point {
                name: format!("cuda.{pid}.sync_ms"),
                cpu: None,
                unit: "ms/s".into(),
                value: sync_ns as f64 / 1e6 / elapsed,
            });
        }
        if self.tracks.is_none() {
            match CountersWriter::stream(&self.data_dir, "cuda") {
                Ok(w) => self.tracks = Some(w),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot write the CUDA tracks");
                    return;
                }
            }
        }
        let Some(w) = self.tracks.as_mut() else { return };
        for (pid, _) in &busiest {
            if let Some(text) = about.get(pid) {
                w.describe(&format!("cuda.{pid}.launches"), text);
                w.describe(&format!("cuda.{pid}.sync_ms"), text);
            }
        }
        if let Err(e) = w.append(now_ns, &points) {
            tracing::warn!(error = %e, "cannot write the CUDA tracks");
        }
    }

    fn writer(&mut self, kind: SampleKind) -> Option<&mut StoreWriter> {
        if !self.writers.contains_key(&kind) {
            let dir = kind.store_dir(&self.data_dir);
            let segments = store::segments_dir(&dir);
            if let Err(e) =
                store::files::prepare_private_dir(&dir).and_then(|()| store::files::prepare_private_dir(&segments))
            {
                tracing::warn!(error = %e, "cannot create the CUDA store");
                return None;
            }
            let limits = store::writer::WriterLimits { max_pending: ROWS_HELD, ..Default::default() };
            self.writers.insert(kind, StoreWriter::with_limits(&segments, limits));
        }
        self.writers.get_mut(&kind)
    }
}

/// A record's bytes as the ring would carry them (the parser reads only what the header counts).
/// What a process's tracks are of: its name, and its pod where known (`workload`:
/// `identity::Identity` as JSON, empty when nothing is known).
pub fn process_about(comm: &str, workload: &str) -> String {
    let identity: crate::identity::Identity = serde_json::from_str(workload).unwrap_or_default();
    match (identity.pod_namespace.as_deref(), identity.pod_name.as_deref()) {
        (Some(ns), Some(pod)) => format!("{comm} (pod {ns}/{pod})"),
        (None, Some(pod)) => format!("{comm} (pod {pod})"),
        _ => comm.to_string(),
    }
}

fn record_bytes(r: &profiler_common::Record) -> &[u8] {
    unsafe { std::slice::from_raw_parts((r as *const profiler_common::Record).cast::<u8>(), size_of_val(r)) }
}

/// `stack` under a root frame saying the share of the time it was counted.
fn marked(stack: &Stack, percent: u32) -> Arc<Stack> {
    let mark: Arc<str> = Arc::from(format!("[estimate: probes on {percent} % of the time]"));
    let mut stack = stack.clone();
    stack.frames.insert(0, mark);
    stack.user_len += 1;
    if !stack.locations.is_empty() {
        stack.locations.insert(0, Default::default());
    }
    Arc::new(stack)
}

/// The threads the detectors judge: the most blocked and the busiest launchers, [`THREADS_MAX`]
/// of each, so that a user's thousands of threads cost the detectors a bounded window.
fn busiest(mut threads: Vec<CudaThread>) -> Vec<CudaThread> {
    if threads.len() <= 2 * THREADS_MAX {
        return threads;
    }
    threads.sort_by_key(|t| std::cmp::Reverse(t.sync_ns));
    let mut rest = threads.split_off(THREADS_MAX);
    rest.sort_by_key(|t| std::cmp::Reverse(t.launches));
    rest.truncate(THREADS_MAX);
    threads.extend(rest);
    threads
}

/// Counts whose stack the kernel's map dropped before the drain (more distinct stacks in a
/// second than it holds): kept, under one frame that says so, with the process's name (`known`
/// from its other counts, else the kernel's, else `pid N`: never empty, which the flamegraph
/// showed as a blank root and pprof as `<unknown>`).
fn lost_stack(pid: u32, tid: u32, ts_ns: u64, known: Option<Arc<str>>) -> Sample {
    let frame: Arc<str> =
        Arc::from("[stack lost: more distinct CUDA call stacks in a second than this user's share of the kernel map]");
    Sample {
        ts_ns,
        cpu: 0,
        pid,
        tid,
        cgroup_id: 0,
        comm: known.unwrap_or_else(|| {
            let comm = comm_of(pid);
            Arc::from(if comm.is_empty() { format!("pid {pid}") } else { comm }.as_str())
        }),
        stack: Arc::new(Stack::new(vec![frame], 1)),
        workload: Arc::from(""),
    }
}

/// The process's name, as the kernel keeps it (16 bytes at most), or empty once it is gone.
fn comm_of(pid: u32) -> String {
    use std::io::Read;
    let mut buf = [0u8; 16];
    let n = std::fs::File::open(format!("/proc/{pid}/comm")).and_then(|mut f| f.read(&mut buf)).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 41, part 7: a lost stack's process had an empty name once the process was gone.
    #[test]
    fn a_lost_stack_always_names_its_process() {
        let gone = u32::MAX - 1;
        assert_eq!(&*lost_stack(gone, gone, 0, None).comm, format!("pid {gone}"));
        assert_eq!(&*lost_stack(gone, gone, 0, Some(Arc::from("python3"))).comm, "python3");
        let me = std::process::id();
        assert!(!lost_stack(me, me, 0, None).comm.is_empty());
        assert_eq!(lost_stack(me, me, 0, None).stack.frames.len(), 1);
    }

    /// Issue 41, part 7: `cuda.21440.launches` named a pid and no process.
    #[test]
    fn a_process_tracks_say_its_name_and_pod() {
        let pod = r#"{"pod_namespace":"ml","pod_name":"trainer-0","container_name":"main"}"#;
        assert_eq!(process_about("python3", pod), "python3 (pod ml/trainer-0)");
        assert_eq!(process_about("python3", r#"{"pod_name":"trainer-0"}"#), "python3 (pod trainer-0)");
        assert_eq!(process_about("python3", r#"{"unit":"session-3.scope"}"#), "python3");
        assert_eq!(process_about("python3", ""), "python3");
    }
}
