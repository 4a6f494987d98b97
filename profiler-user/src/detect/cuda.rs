//! From the CUDA probes (`gpu::cuda`), once a drain:
//! - `gpu-sync-stall`: a thread blocked in CUDA synchronisation for at least `gpu_sync_share` of
//!   its time over `gpu_secs` while the GPU its process holds was not busy (below
//!   `gpu_idle_below`): the CPU waits on a GPU that waits on the CPU, the pattern of a `.item()`,
//!   a `.cpu()` or a printed tensor in the training step. It names the Python line that waits.
//! - the launch figures `gpu-launch-bound` quotes (`LaunchFigures`): launches a second per
//!   process, the mean gap between them, the Python line that launches most; and each
//!   process's top kernels by launches (`CudaDetect::kernels`, the `[gpu]` leaf frames).
//!
//! Without the GPU's utilisation (no NVML) nothing is said: a thread waiting on a busy GPU is a
//! GPU-bound program, not a stall.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::Arc,
};

use serde_json::json;

use super::{Active, Kind, LaunchFigures, Severity, Thresholds, Top, percent};
use crate::{gpu_readings::State, store::format::NS_PER_SEC};

/// One thread's CUDA calls in one drain.
#[derive(Debug, Clone, Default)]
pub struct CudaThread {
    pub pid: u32,
    pub tid: u32,
    pub comm: Arc<str>,
    pub workload: Arc<str>,
    pub launches: u64,
    pub sync_ns: u64,
    /// The leaf-most Python frame (with its line) of the launching and the waiting stacks, with
    /// launches and nanoseconds blocked.
    pub launch_lines: Vec<(Arc<str>, u64)>,
    pub sync_lines: Vec<(Arc<str>, u64)>,
    /// The kernels launched (the launches' `[gpu] ...` leaf frames), with launches.
    pub launch_kernels: Vec<(Arc<str>, u64)>,
}

#[derive(Debug, Default)]
struct Window {
    /// (drain end ns, seconds covered, the thread's calls).
    drains: VecDeque<(u64, f64, CudaThread)>,
}

/// Lines kept per window (the rest are not counted).
const MAX_LINES: usize = 256;

#[derive(Debug, Default)]
pub struct CudaDetect {
    threads: BTreeMap<u32, Window>,
    /// Per process, over the latest window.
    launches: HashMap<u32, LaunchFigures>,
    /// Per process, its most launched kernels over the latest window and their shares.
    kernels: HashMap<u32, Vec<(Arc<str>, f64)>>,
}

/// Kernels named per process in [`CudaDetect::kernels`].
pub const TOP_KERNELS: usize = 3;

/// The leaf-most Python frame of a stack's user frames: `step (train.py:42)`
/// ([`crate::interpreter::python::leaf_frame`]).
pub fn python_line(frames: &[Arc<str>]) -> Option<Arc<str>> {
    crate::interpreter::python::leaf_frame(frames).cloned()
}

fn add_line(lines: &mut HashMap<Arc<str>, u64>, line: &Arc<str>, n: u64) {
    if lines.len() < MAX_LINES || lines.contains_key(line) {
        *lines.entry(line.clone()).or_default() += n;
    }
}

fn top(lines: &HashMap<Arc<str>, u64>) -> Option<(Arc<str>, u64)> {
    lines.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))).map(|(l, n)| (l.clone(), *n))
}

impl CudaDetect {
    /// One drain: `threads` over `secs` seconds ending at `now_ns`. Returns the stalls active now.
    pub fn evaluate(
        &mut self,
        now_ns: u64,
        secs: f64,
        threads: Vec<CudaThread>,
        gpu: Option<&State>,
        t: &Thresholds,
    ) -> Vec<Active> {
        let window_ns = u64::from(t.gpu_secs) * NS_PER_SEC;
        for th in threads {
            self.threads.entry(th.tid).or_default().drains.push_back((now_ns, secs, th));
        }
        for w in self.threads.values_mut() {
            while w.drains.front().is_some_and(|d| d.0 + window_ns <= now_ns) {
                w.drains.pop_front();
            }
        }
        self.threads.retain(|_, w| !w.drains.is_empty());
        self.launch_figures(window_ns);
        let Some(gpu) = gpu else { return Vec::new() };
        let mut out = Vec::new();
        for (&tid, w) in &self.threads {
            let covered: f64 = w.drains.iter().map(|d| d.1).sum();
            let first = w.drains.front().map_or(now_ns, |d| d.0.saturating_sub((d.1 * 1e9) as u64));
            // The window must be covered: a thread seen for two seconds is not judged yet.
            if now_ns.saturating_sub(first) + NS_PER_SEC / 2 < window_ns || covered <= 0.0 {
                continue;
            }
            // Over the whole span since the window's first drain, not only the drains the thread
            // appears in: a thread blocked 0.6 s every other second waits 30 %, not 60 %.
            let span = (now_ns.saturating_sub(first) as f64 / 1e9).max(covered);
            // A thread waits at most the whole span: an estimate scaled from part of the time
            // (the rate guard) or a wait that began before the window can read more.
            let blocked = w.drains.iter().map(|d| d.2.sync_ns).fold(0u64, u64::saturating_add).min((span * 1e9) as u64);
            let share = (blocked as f64 / (span * 1e9)).min(1.0);
            if share < t.gpu_sync_share {
                continue;
            }
            let last = &w.drains.back().expect("not empty").2;
            let Some((index, util)) = held_gpu_util(gpu, last.pid, first, now_ns) else { continue };
            if util >= t.gpu_idle_below * 100.0 {
                continue;
            }
            let mut lines = HashMap::new();
            for d in &w.drains {
                for (l, n) in &d.2.sync_lines {
                    add_line(&mut lines, l, *n);
                }
            }
            out.push(stall(tid, last, index, util, share, first, now_ns, top(&lines), blocked, gpu));
        }
        out.extend(self.stragglers(now_ns, gpu, t));
        out
    }

    /// Per process, its launches over the latest window (what `gpu-launch-bound` quotes; the
    /// engine hands them to the GPU detector).
    pub fn launches(&self) -> &HashMap<u32, LaunchFigures> {
        &self.launches
    }

    /// Per process, its [`TOP_KERNELS`] most launched kernels over the latest window (the
    /// frame, `[gpu] ...`, and its share of the process's launches), most first.
    pub fn kernels(&self) -> &HashMap<u32, Vec<(Arc<str>, f64)>> {
        &self.kernels
    }

    fn launch_figures(&mut self, window_ns: u64) {
        // Per process: launches, seconds covered, launches per Python line.
        type Launches = (u64, f64, HashMap<Arc<str>, u64>);
        let mut per_pid: HashMap<u32, Launches> = HashMap::new();
        let mut kernels: HashMap<u32, HashMap<Arc<str>, u64>> = HashMap::new();
        for w in self.threads.values() {
            for (_, secs, th) in &w.drains {
                let e = per_pid.entry(th.pid).or_default();
                e.0 += th.launches;
                for (l, n) in &th.launch_lines {
                    add_line(&mut e.2, l, *n);
                }
                for (k, n) in &th.launch_kernels {
                    add_line(kernels.entry(th.pid).or_default(), k, *n);
                }
                let _ = secs;
            }
        }
        self.kernels = kernels
            .into_iter()
            .filter_map(|(pid, k)| {
                let n = per_pid.get(&pid).map_or(0, |e| e.0);
                if n == 0 {
                    return None;
                }
                let mut k: Vec<(Arc<str>, u64)> = k.into_iter().collect();
                k.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
                k.truncate(TOP_KERNELS);
                Some((pid, k.into_iter().map(|(name, c)| (name, c as f64 / n as f64)).collect()))
            })
            .collect();
        let window = window_ns as f64 / 1e9;
        self.launches = per_pid
            .into_iter()
            .filter(|(_, e)| e.0 > 0)
            .map(|(pid, (n, _, lines))| {
                let top_line = top(&lines).map(|(l, k)| (l, k as f64 / n as f64));
                let top_kernels = self.kernels.get(&pid).cloned().unwrap_or_default();
                (pid, LaunchFigures { per_sec: n as f64 / window, top_line, top_kernels })
            })
            .collect();
    }
}

/// The GPU `pid` holds and its mean utilisation over `[from, to)`, from the poller's seconds.
fn held_gpu_util(gpu: &State, pid: u32, from: u64, to: u64) -> Option<(u32, f64)> {
    let mut per_gpu: BTreeMap<u32, (f64, u32)> = BTreeMap::new();
    for (start, seconds) in &gpu.seconds {
        if *start + NS_PER_SEC <= from || *start >= to {
            continue;
        }
        for g in seconds.iter().filter(|g| g.holders.contains(&pid)) {
            if let Some(u) = g.util {
                let e = per_gpu.entry(g.index).or_default();
                e.0 += u;
                e.1 += 1;
            }
        }
    }
    per_gpu.into_iter().filter(|(_, (_, n))| *n > 0).map(|(i, (sum, n))| (i, sum / f64::from(n))).next()
}

mod straggler;

#[allow(clippy::too_many_arguments)]
fn stall(
    tid: u32,
    th: &CudaThread,
    index: u32,
    util: f64,
    share: f64,
    since: u64,
    now: u64,
    line: Option<(Arc<str>, u64)>,
    blocked: u64,
    gpu: &State,
) -> Active {
    let info = gpu.inventory.gpus.iter().find(|g| g.index == index);
    let model = info.map_or("unknown model", |g| g.model.as_str());
    let who = Top { comm: th.comm.clone(), pid: th.pid, samples: 0, workload: th.workload.clone() }
        .who(&format!(", thread {tid}"));
    let secs = (now.saturating_sub(since) as f64 / 1e9).round();
    let line_text = line
        .as_ref()
        .map_or(String::new(), |(l, ns)| format!(", {} of it in {l}", percent(*ns as f64 / blocked.max(1) as f64)));
    Active {
        kind: Kind::GpuSyncStall,
        cpu: None,
        subject: Some(format!("tid{tid}")),
        onset_ns: since,
        severity: Severity::Warning,
        summary: format!(
            "{who} waited on GPU {index} ({model}) {} of {secs} s while the GPU was {util:.0} % busy{line_text}: the \
             CPU waits on the GPU, which waits on the CPU; look next: .item(), .cpu(), .numpy() or a printed tensor \
             in the step (they synchronise), torch.cuda.synchronize() in the loop",
            percent(share)
        ),
        evidence: json!({
            "gpu": index,
            "model": model,
            "uuid": info.map(|g| g.uuid.clone()),
            "pid": th.pid,
            "tid": tid,
            "comm": &*th.comm,
            "blocked_share": share,
            "blocked_ns": blocked,
            "gpu_utilization_percent": util,
            "python_line": line.as_ref().map(|(l, _)| l.to_string()),
            "since_ns": since,
            "until_ns": now,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu_readings::{GpuSecond, State};

    fn thread(sync_ns: u64, launches: u64) -> CudaThread {
        CudaThread {
            pid: 7,
            tid: 8,
            comm: "python3".into(),
            workload: "".into(),
            launches,
            sync_ns,
            launch_lines: vec![("step (train.py:12)".into(), launches)],
            sync_lines: vec![("log_loss (train.py:30)".into(), sync_ns)],
            launch_kernels: vec![
                ("[gpu] ampere_sgemm_128x64_tn".into(), launches * 3 / 4),
                ("[gpu] graph".into(), launches / 4),
            ],
        }
    }

    #[test]
    fn the_most_launched_kernels_of_a_process_are_named_with_their_share() {
        let mut d = CudaDetect::default();
        let t = Thresholds::default();
        d.evaluate(10 * NS_PER_SEC, 1.0, vec![thread(0, 1000)], None, &t);
        let k = &d.kernels()[&7];
        assert_eq!(&*k[0].0, "[gpu] ampere_sgemm_128x64_tn");
        assert!((k[0].1 - 0.75).abs() < 1e-9 && (k[1].1 - 0.25).abs() < 1e-9, "{k:?}");
    }

    fn gpu(util: f64, from_s: u64, to_s: u64) -> State {
        let mut s = State::default();
        for sec in from_s..to_s {
            let g = GpuSecond { index: 0, util: Some(util), polls: 10, holders: vec![7], ..Default::default() };
            s.seconds.push_back((sec * NS_PER_SEC, vec![g]));
        }
        s
    }

    fn run(d: &mut CudaDetect, state: &State, secs: u64, sync_ns: u64) -> Vec<Active> {
        let t = Thresholds::default();
        let mut last = Vec::new();
        for s in 1..=secs {
            last = d.evaluate(100 * NS_PER_SEC + s * NS_PER_SEC, 1.0, vec![thread(sync_ns, 500)], Some(state), &t);
        }
        last
    }

    #[test]
    fn a_thread_waiting_on_an_idle_gpu_for_the_window_is_a_stall_naming_its_line() {
        let mut d = CudaDetect::default();
        let state = gpu(20.0, 95, 120);
        let a = run(&mut d, &state, 12, 700_000_000);
        assert_eq!(a.len(), 1, "{a:?}");
        assert_eq!(a[0].kind, Kind::GpuSyncStall);
        assert!(a[0].summary.contains("70 %") && a[0].summary.contains("log_loss (train.py:30)"), "{}", a[0].summary);
        assert_eq!(a[0].evidence["tid"], 8);
    }

    #[test]
    fn waiting_on_a_busy_gpu_or_briefly_or_without_gpu_figures_is_not() {
        let mut d = CudaDetect::default();
        assert!(run(&mut d, &gpu(95.0, 95, 120), 12, 700_000_000).is_empty(), "GPU-bound: the wait is the work");
        let mut d = CudaDetect::default();
        assert!(run(&mut d, &gpu(20.0, 95, 120), 12, 300_000_000).is_empty(), "30 % is below the share");
        let mut d = CudaDetect::default();
        assert!(run(&mut d, &gpu(20.0, 95, 120), 5, 900_000_000).is_empty(), "5 s is not the window");
        let mut d = CudaDetect::default();
        let t = Thresholds::default();
        for s in 1..=12 {
            assert!(d.evaluate(s * NS_PER_SEC, 1.0, vec![thread(900_000_000, 1)], None, &t).is_empty());
        }
    }

    #[test]
    fn an_estimate_scaled_past_the_window_reads_at_most_all_of_it() {
        // 2.3 s blocked a second: counted a tenth of the time and scaled (issue 38: "waited
        // 231 % of 12 s").
        let mut d = CudaDetect::default();
        let a = run(&mut d, &gpu(20.0, 95, 120), 12, 2_310_000_000);
        assert_eq!(a.len(), 1, "{a:?}");
        assert!(a[0].summary.contains("100 %"), "{}", a[0].summary);
        assert!(a[0].evidence["blocked_share"].as_f64().unwrap() <= 1.0, "{}", a[0].evidence);
    }

    #[test]
    fn launch_figures_give_the_rate_and_the_line_that_launches_most() {
        let mut d = CudaDetect::default();
        run(&mut d, &gpu(20.0, 95, 120), 10, 0);
        let f = &d.launches()[&7];
        assert!((f.per_sec - 500.0).abs() < 1.0, "{f:?}");
        assert_eq!(f.top_line.as_ref().map(|(l, _)| &**l), Some("step (train.py:12)"));
    }
}
