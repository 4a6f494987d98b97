//! GPU detectors: why a GPU idles, said from the CPU side (issue 26).
//!
//! - `gpu-starved`: the GPU below `gpu_idle_below` for `gpu_secs` while the processes that feed
//!   it keep a CPU saturated: the holder's children (a DataLoader's workers) or the processes
//!   of the holder's pod. The input pipeline cannot keep up.
//! - `gpu-launch-bound`: the same idle GPU while the holding process itself keeps a core
//!   saturated and its helpers do not: one thread launching kernels one by one (a Python main
//!   loop). Samples carry the process, not the thread, so this is the holder's own threads;
//!   the scheduler's statistics (`GpuSecond::demand`) add the thread that ran plus waited
//!   runnable for a whole core, which a core shared with other work gives only in part.
//! - `gpu-throttled`: a busy GPU whose clocks were held down by power, heat or the hardware in
//!   most polls of each second, for `gpu_secs`.
//!
//! Nothing is said of a GPU nobody holds, nor of a busy one with free clocks. The figures are
//! kept per run (the consecutive seconds the condition held), bounded.

use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
    sync::Arc,
};

use serde_json::json;

use super::{Active, Kind, Machine, Second, Severity, Thresholds, Tick, percent};
use crate::{
    gpu_readings::{GpuSecond, Inventory, inventory::cpu_list},
    store::format::NS_PER_SEC,
};

/// What the detector reads besides the CPU samples.
pub struct Input<'a> {
    pub gpus: &'a [GpuSecond],
    pub inventory: &'a Inventory,
    /// `/proc` (a directory laid out like it in tests): parents of the busy processes.
    pub proc: &'a Path,
    /// Per process, its CUDA launches over the latest window (`detect::cuda`; empty without
    /// the probes).
    pub launches: &'a HashMap<u32, super::cuda::LaunchFigures>,
}

/// Functions kept per run at most (the rest are not counted).
const MAX_FUNCTIONS: usize = 4096;

#[derive(Debug, Default)]
struct Run {
    start_ns: u64,
    seconds: u64,
    util_sum: f64,
    /// Busy ticks of the feeding side, by process.
    procs: HashMap<(u32, Arc<str>), (u64, Arc<str>)>,
    /// Leaf functions and leaf-most Python frames of those ticks.
    functions: HashMap<Arc<str>, u64>,
    python: HashMap<Arc<str>, u64>,
    ticks: u64,
    busy_cpus: Vec<u32>,
    reasons: u64,
    /// SM clock: the sum of the run's per-second means and how many, and the highest seen.
    clock_sum: f64,
    clock_n: u64,
    clock_max: f64,
    /// The holders' CUDA launches a second (sum over the seconds that had figures, and how
    /// many), and the Python line that launched most at the latest.
    launches_sum: f64,
    launches_n: u64,
    launch_line: Option<(Arc<str>, f64)>,
    /// The holders' busiest thread (`GpuSecond::demand`): seconds read, the sums of the shares
    /// it ran and waited for a CPU, and the latest one's id.
    asked_n: u64,
    ran_sum: f64,
    waited_sum: f64,
    asked_tid: u32,
}

impl Run {
    /// The mean shares of a second the holders' busiest thread ran and waited for a CPU.
    fn shares(&self) -> (Option<f64>, Option<f64>) {
        let n = self.asked_n as f64;
        if self.asked_n == 0 { (None, None) } else { (Some(self.ran_sum / n), Some(self.waited_sum / n)) }
    }
}

/// A launcher waiting for a CPU this share of the time or more is said to share its core.
const SHARED_WAIT: f64 = 0.1;

#[derive(Debug, Default)]
pub struct GpuDetect {
    runs: BTreeMap<(u32, Kind), Run>,
    /// Per GPU: the highest SM clock seen in a second (what "held down" is measured against).
    clock_max: BTreeMap<u32, f64>,
}

/// Whose ticks feed a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Holder,
    Helper,
}

/// The parent pid from `/proc/PID/stat` (the field after the parenthesised comm).
fn ppid(proc: &Path, pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(proc.join(pid.to_string()).join("stat")).ok()?;
    stat.get(stat.rfind(')')? + 2..)?.split(' ').nth(1)?.parse().ok()
}

/// Whether `pid` descends from one of `holders` (up to 8 generations: workers of workers).
fn descends(proc: &Path, pid: u32, holders: &[u32], cache: &mut HashMap<u32, Option<u32>>) -> bool {
    // Everything descends from init: a holder that is pid 1 (or 0) says nothing of its children.
    let holders: Vec<u32> = holders.iter().copied().filter(|&h| h > 1).collect();
    let mut p = pid;
    for _ in 0..8 {
        let parent = *cache.entry(p).or_insert_with(|| ppid(proc, p));
        match parent {
            Some(pp) if holders.contains(&pp) => return true,
            Some(pp) if pp > 1 => p = pp,
            _ => return false,
        }
    }
    false
}

/// The pod of a workload string (`identity` JSON), if it names one.
fn pod_of(workload: &str) -> Option<String> {
    let id = crate::identity::workloads::decode(workload)?;
    id.pod_uid.or(id.pod_name).map(|p| p.to_string())
}

impl GpuDetect {
    pub fn evaluate(&mut self, now: &Second, input: &Input<'_>, m: Machine, t: &Thresholds) -> Vec<Active> {
        let mut out = Vec::new();
        let mut parents = HashMap::new();
        let mut seen: Vec<(u32, Kind)> = Vec::new();
        for g in input.gpus {
            if let Some(c) = g.sm_clock_mhz {
                let max = self.clock_max.entry(g.index).or_default();
                *max = max.max(c);
            }
            let Some(util) = g.util else { continue };
            let idle = util < t.gpu_idle_below * 100.0;
            if idle && !g.holders.is_empty() {
                if let Some(kind) = self.feed(now, g, util, input.proc, input.launches, &mut parents, m, t) {
                    seen.push((g.index, kind));
                }
            } else if !idle && g.slowed_polls * 2 > g.polls {
                let run = self.runs.entry((g.index, Kind::GpuThrottled)).or_default();
                run.start_ns = if run.seconds == 0 { now.start_ns } else { run.start_ns };
                run.seconds += 1;
                run.util_sum += util;
                run.reasons |= g.reasons;
                if let Some(c) = g.sm_clock_mhz {
                    run.clock_sum += c;
                    run.clock_n += 1;
                }
                seen.push((g.index, Kind::GpuThrottled));
            }
        }
        self.runs.retain(|k, _| seen.contains(k));
        for ((index, _), run) in self.runs.iter_mut() {
            run.clock_max = self.clock_max.get(index).copied().unwrap_or(0.0);
        }
        for ((index, kind), run) in &self.runs {
            if run.seconds >= u64::from(t.gpu_secs) {
                out.push(active(*index, *kind, run, input.inventory, m));
            }
        }
        out
    }

    /// Adds this second to the GPU's starved or launch-bound run, if its feeders were busy;
    /// returns which.
    #[allow(clippy::too_many_arguments)]
    fn feed(
        &mut self,
        now: &Second,
        g: &GpuSecond,
        util: f64,
        proc: &Path,
        launches: &HashMap<u32, super::cuda::LaunchFigures>,
        parents: &mut HashMap<u32, Option<u32>>,
        m: Machine,
        t: &Thresholds,
    ) -> Option<Kind> {
        let holder_pods: Vec<String> = now
            .cpus
            .iter()
            .flat_map(|c| c.busy.iter())
            .filter(|k| g.holders.contains(&k.pid))
            .filter_map(|k| pod_of(&k.workload))
            .collect();
        let side = |k: &Tick, parents: &mut HashMap<u32, Option<u32>>| {
            if g.holders.contains(&k.pid) {
                Some(Side::Holder)
            } else if descends(proc, k.pid, &g.holders, parents)
                || (!holder_pods.is_empty() && pod_of(&k.workload).is_some_and(|p| holder_pods.contains(&p)))
            {
                Some(Side::Helper)
            } else {
                None
            }
        };
        let freq = m.frequency_hz.max(1) as f64;
        let mut ticks: Vec<(u32, &Tick, Side)> = Vec::new();
        let mut per_cpu: Vec<(u32, usize, usize)> = Vec::new();
        for (cpu, c) in now.cpus.iter().enumerate() {
            let (mut own, mut helper) = (0, 0);
            for k in &c.busy {
                if let Some(s) = side(k, parents) {
                    ticks.push((cpu as u32, k, s));
                    if s == Side::Holder { own += 1 } else { helper += 1 }
                }
            }
            per_cpu.push((cpu as u32, own, helper));
        }
        let mut per_pid: HashMap<u32, (usize, Side)> = HashMap::new();
        for (_, k, s) in &ticks {
            per_pid.entry(k.pid).or_insert((0, *s)).0 += 1;
        }
        let busy = |n: usize| n as f64 / freq >= t.gpu_cpu_busy;
        // A CPU the feeders held, or a process that kept a core busy while it moved between CPUs.
        let helper_cpus: Vec<u32> = per_cpu.iter().filter(|c| busy(c.1 + c.2) && c.2 > 0).map(|c| c.0).collect();
        let helpers_busy = !helper_cpus.is_empty() || per_pid.values().any(|(n, s)| *s == Side::Helper && busy(*n));
        // A holder's thread that ran and waited runnable for a whole core asked for one, even when
        // a shared core gave it half: its samples alone would say "half busy".
        let asked = g
            .demand
            .iter()
            .filter(|d| g.holders.contains(&d.pid))
            .max_by(|a, b| a.asked().total_cmp(&b.asked()).then(b.tid.cmp(&a.tid)));
        let own_busy = per_pid.values().any(|(n, s)| *s == Side::Holder && busy(*n))
            || asked.is_some_and(|d| d.asked() >= t.gpu_cpu_busy);
        tracing::debug!(gpu = g.index, util, holders = ?g.holders, per_cpu = ?per_cpu, per_pid = ?per_pid, "GPU feeders this second");
        let kind = if helpers_busy {
            Kind::GpuStarved
        } else if own_busy {
            Kind::GpuLaunchBound
        } else {
            return None;
        };
        let run = self.runs.entry((g.index, kind)).or_default();
        if run.seconds == 0 {
            run.start_ns = now.start_ns;
        }
        let figures: Vec<&super::cuda::LaunchFigures> = g.holders.iter().filter_map(|p| launches.get(p)).collect();
        if !figures.is_empty() {
            run.launches_sum += figures.iter().map(|f| f.per_sec).sum::<f64>();
            run.launches_n += 1;
            if let Some(best) =
                figures.iter().filter(|f| f.top_line.is_some()).max_by(|a, b| a.per_sec.total_cmp(&b.per_sec))
            {
                run.launch_line = best.top_line.clone();
            }
        }
        run.seconds += 1;
        run.util_sum += util;
        if let Some(d) = asked {
            run.asked_n += 1;
            run.ran_sum += d.ran;
            run.waited_sum += d.waited;
            run.asked_tid = d.tid;
        }
        let busy_cpus: Vec<u32> = per_cpu.iter().filter(|c| busy(c.1 + c.2)).map(|c| c.0).collect();
        if busy_cpus.len() >= run.busy_cpus.len() {
            run.busy_cpus = busy_cpus;
        }
        for (_, k, s) in ticks {
            if kind == Kind::GpuLaunchBound && s != Side::Holder {
                continue;
            }
            run.ticks += 1;
            run.procs.entry((k.pid, k.comm.clone())).or_insert_with(|| (0, k.workload.clone())).0 += 1;
            let count = |map: &mut HashMap<Arc<str>, u64>, f: &Arc<str>| {
                if map.len() < MAX_FUNCTIONS || map.contains_key(f) {
                    *map.entry(f.clone()).or_default() += 1;
                }
            };
            if let Some(leaf) = k.stack.frames.last() {
                count(&mut run.functions, leaf);
            }
            if let Some(py) = k.stack.user().iter().rev().find(|f| f.ends_with(')') && f.contains(".py:")) {
                count(&mut run.python, py);
            }
        }
        Some(kind)
    }
}

fn top(map: &HashMap<Arc<str>, u64>, n: usize) -> Vec<(Arc<str>, u64)> {
    let mut v: Vec<(Arc<str>, u64)> = map.iter().map(|(k, v)| (k.clone(), *v)).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v.truncate(n);
    v
}

fn active(index: u32, kind: Kind, run: &Run, inv: &Inventory, m: Machine) -> Active {
    let info = inv.gpus.iter().find(|g| g.index == index);
    let model = info.map_or("unknown model", |g| g.model.as_str());
    let util = run.util_sum / run.seconds.max(1) as f64;
    let secs = run.seconds;
    let name = format!("GPU {index} ({model}) {util:.0} % busy for {secs} s");
    let mut procs: Vec<super::Top> = run
        .procs
        .iter()
        .map(|((pid, comm), (samples, workload))| super::Top {
            comm: comm.clone(),
            pid: *pid,
            samples: *samples,
            workload: workload.clone(),
        })
        .collect();
    procs.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.pid.cmp(&b.pid)));
    let functions = top(&run.functions, 5);
    let python = top(&run.python, 5);
    // Python frames say more than the interpreter's C functions under them, when there are some.
    let lead = python.first().filter(|p| p.1 * 10 >= run.ticks * 3).or(functions.first());
    let lead_text =
        lead.map_or(String::new(), |(f, n)| format!(", {} in {f}", percent(*n as f64 / run.ticks.max(1) as f64)));
    let (severity, summary) = match kind {
        Kind::GpuStarved => {
            let cores = run.ticks as f64 / secs.max(1) as f64 / m.frequency_hz.max(1) as f64;
            let first = procs.first().map_or("its processes".to_string(), |p| p.who(""));
            (
                Severity::Warning,
                format!(
                    "{name} while {first} and {} other process(es) kept {} CPU(s) busy ({cores:.1} cores){lead_text}: \
                     the input pipeline is the bottleneck; look next: the number of workers, the transform's cost",
                    procs.len().saturating_sub(1),
                    run.busy_cpus.len().max(1),
                ),
            )
        }
        Kind::GpuLaunchBound => {
            // With the CUDA probes: how fast it launches, and from where.
            let rate = (run.launches_n > 0).then(|| run.launches_sum / run.launches_n as f64);
            let launch_text = match (rate, &run.launch_line) {
                (Some(r), Some((line, share))) if r > 0.0 => format!(
                    ", {r:.0} launches/s (one every {:.0} µs), {} of them from {line}",
                    1e6 / r,
                    percent(*share)
                ),
                (Some(r), None) if r > 0.0 => format!(", {r:.0} launches/s (one every {:.0} µs)", 1e6 / r),
                _ => String::new(),
            };
            // Waiting for a CPU is the other half of the story: a launcher on a shared core.
            let (ran, waited) = run.shares();
            let (busy_text, shared_text) = match (ran, waited) {
                (Some(r), Some(w)) if w >= SHARED_WAIT => (
                    format!(
                        "asked a core for itself (thread {} ran {}, waited for a CPU {})",
                        run.asked_tid,
                        percent(r),
                        percent(w)
                    ),
                    "; its core is shared: give it one (CPU pinning, fewer DataLoader workers on it)",
                ),
                _ => ("kept a core busy itself".to_string(), ""),
            };
            (
                Severity::Warning,
                format!(
                    "{name} while {} {busy_text}{lead_text}{launch_text}: kernels are launched one by \
                     one; look next: CUDA graphs, larger batches, a compiled model{shared_text}",
                    procs.first().map_or("the process holding it".to_string(), |p| p.who(""))
                ),
            )
        }
        _ => {
            // The SM clock against the highest this daemon saw: how much "held down" costs.
            let clock = (run.clock_n > 0).then(|| run.clock_sum / run.clock_n as f64);
            let clock_text = match clock {
                Some(c) if run.clock_max > 0.0 => {
                    format!(", SM clock {c:.0} MHz against {:.0} MHz at best", run.clock_max)
                }
                _ => String::new(),
            };
            (
                Severity::Warning,
                format!(
                    "{name} with its clocks held down ({}{clock_text}); look next: power limit, cooling, \
                     the node's power budget",
                    crate::gpu_readings::reason_names(run.reasons & crate::gpu_readings::SLOWDOWN_REASONS).join(", ")
                ),
            )
        }
    };
    Active {
        kind,
        cpu: None,
        subject: Some(format!("gpu{index}")),
        onset_ns: run.start_ns,
        severity,
        summary,
        evidence: json!({
            "gpu": index,
            "model": model,
            "uuid": info.map(|g| g.uuid.clone()),
            "bus_id": info.map(|g| g.bus_id.clone()),
            "local_cpus": info.map(|g| cpu_list(&g.local_cpus)),
            "utilization_percent": util,
            "seconds": secs,
            "busy_cpus": run.busy_cpus,
            "processes": procs.iter().take(10).map(|p| p.json()).collect::<Vec<_>>(),
            "top_functions": functions.iter().map(|(f, n)| json!({"function": &**f, "samples": n})).collect::<Vec<_>>(),
            "top_python": python.iter().map(|(f, n)| json!({"function": &**f, "samples": n})).collect::<Vec<_>>(),
            "clock_event_reasons": crate::gpu_readings::reason_names(run.reasons),
            "sm_clock_mhz": (run.clock_n > 0).then(|| run.clock_sum / run.clock_n as f64),
            "sm_clock_max_mhz": (run.clock_max > 0.0).then_some(run.clock_max),
            "launches_per_sec": (run.launches_n > 0).then(|| run.launches_sum / run.launches_n as f64),
            "launcher_tid": (run.asked_n > 0).then_some(run.asked_tid),
            "launcher_ran_share": run.shares().0,
            "launcher_waited_share": run.shares().1,
            "top_launch_line": run.launch_line.as_ref().map(|(l, s)| json!({"line": &**l, "share": s})),
            "since_ns": run.start_ns,
            "until_ns": run.start_ns + secs * NS_PER_SEC,
        }),
    }
}

#[cfg(test)]
#[path = "gpu_tests.rs"]
mod tests;
