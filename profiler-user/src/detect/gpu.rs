//! GPU detectors: why a GPU idles, said from the CPU side (issue 26).
//!
//! - `gpu-starved`: the GPU below `gpu_idle_below` for `gpu_secs` while the processes that feed
//!   it keep a CPU saturated: the holder's children (a DataLoader's workers) or the processes
//!   of the holder's pod. The input pipeline cannot keep up. Or, with the off-CPU counts, while
//!   the holder's children keep no CPU busy but are blocked (`waiting`): the pipeline waits on
//!   storage or the network rather than computes, and the finding names the call they wait in.
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
//!
//! Everything besides the samples comes in as data ([`Input`]): the GPU poller's seconds (with
//! the processes the holders started and what their threads asked of the CPUs, read by
//! `gpu::nvml`), and the launch figures the CUDA detector made (handed over by the engine).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
};

use serde_json::json;

use super::{Active, Kind, LaunchFigures, Machine, Second, Severity, Thresholds, Tick, Top, percent};
use crate::{
    gpu_readings::{GpuSecond, Inventory, ThreadDemand, inventory::cpu_list},
    interpreter::python,
    store::format::NS_PER_SEC,
};

/// What the detector reads besides the CPU samples.
pub struct Input<'a> {
    pub gpus: &'a [GpuSecond],
    pub inventory: &'a Inventory,
    /// Per process, its CUDA launches over the latest window (made by `detect::cuda`; empty
    /// without the probes).
    pub launches: &'a HashMap<u32, LaunchFigures>,
}

/// Functions kept per run at most (the rest are not counted).
const MAX_FUNCTIONS: usize = 4096;
/// Holders' SM shares kept per run at most (the poller reads 64 a GPU).
const MAX_HOLDERS_KEPT: usize = 64;

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
    /// The holders' most launched kernels at the latest (`[gpu] ...`, share).
    kernels: Vec<(Arc<str>, f64)>,
    /// The holders' busiest thread (`GpuSecond::demand`): seconds read, the sums of the shares
    /// it ran and waited for a CPU, and the latest one's id.
    asked_n: u64,
    ran_sum: f64,
    waited_sum: f64,
    asked_tid: u32,
    /// GPM's figures (`gpu-underused`): the sums of the seconds' SM activity, occupancy and
    /// tensor activity (%), and how many seconds had each.
    gpm: underused::GpmSums,
    /// Per holder, its share of the SMs (NVML's per-process samples): the sum over the seconds
    /// that had one, and how many. A GPU shared by several processes says who used it.
    holder_sm: BTreeMap<u32, (f64, u64)>,
    /// The GPU's holders seen in the run (bounded like `holder_sm`): the feeders a finding
    /// names beside them are the others.
    holders: std::collections::BTreeSet<u32>,
    /// The holders' workers that asked for a core (`workers`, issue 41 part 7).
    workers: workers::Sums,
    /// Seconds its feeders were blocked off CPU rather than busy (`waiting`), and the latest
    /// such second's figures.
    blocked_secs: u64,
    blocked: Option<waiting::Blocked>,
}

/// Counts `f` in `map`, unless the map is full and `f` new.
fn count(map: &mut HashMap<Arc<str>, u64>, f: &Arc<str>) {
    if map.len() < MAX_FUNCTIONS || map.contains_key(f) {
        *map.entry(f.clone()).or_default() += 1;
    }
}

impl Run {
    /// Adds a second of `util` % that began at `start_ns`, and its holders' shares of the SMs.
    fn add_second(&mut self, start_ns: u64, util: f64, g: &GpuSecond) {
        if self.seconds == 0 {
            self.start_ns = start_ns;
        }
        self.seconds += 1;
        self.util_sum += util;
        for &pid in &g.holders {
            if self.holders.len() < MAX_HOLDERS_KEPT {
                self.holders.insert(pid);
            }
        }
        for &(pid, sm) in &g.holder_sm {
            if self.holder_sm.len() < MAX_HOLDERS_KEPT || self.holder_sm.contains_key(&pid) {
                let e = self.holder_sm.entry(pid).or_default();
                e.0 += sm;
                e.1 += 1;
            }
        }
    }

    /// Each holder's mean share of the SMs, the largest first (ties: the lower pid).
    fn holder_shares(&self) -> Vec<(u32, f64)> {
        let mut v: Vec<(u32, f64)> =
            self.holder_sm.iter().filter(|(_, (_, n))| *n > 0).map(|(&p, &(s, n))| (p, s / n as f64)).collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }

    /// The mean shares of a second the holders' busiest thread ran and waited for a CPU.
    fn shares(&self) -> (Option<f64>, Option<f64>) {
        let n = self.asked_n as f64;
        if self.asked_n == 0 { (None, None) } else { (Some(self.ran_sum / n), Some(self.waited_sum / n)) }
    }

    /// The mean SM clock over the seconds that read it.
    fn clock(&self) -> Option<f64> {
        (self.clock_n > 0).then(|| self.clock_sum / self.clock_n as f64)
    }

    /// The holders' mean launches a second over the seconds that had figures.
    fn launch_rate(&self) -> Option<f64> {
        (self.launches_n > 0).then(|| self.launches_sum / self.launches_n as f64)
    }

    /// `; top kernels: [gpu] a 60 %, [gpu] b 25 %`, or nothing without kernel names.
    fn kernels_text(&self) -> String {
        if self.kernels.is_empty() {
            return String::new();
        }
        let list: Vec<String> = self.kernels.iter().map(|(k, s)| format!("{k} {}", percent(*s))).collect();
        format!("; top kernels: {}", list.join(", "))
    }

    /// The holders' launches this second, as the CUDA detector figured them.
    fn add_launches(&mut self, holders: &[u32], launches: &HashMap<u32, LaunchFigures>) {
        let figures: Vec<&LaunchFigures> = holders.iter().filter_map(|p| launches.get(p)).collect();
        if figures.is_empty() {
            return;
        }
        self.launches_sum += figures.iter().map(|f| f.per_sec).sum::<f64>();
        self.launches_n += 1;
        if let Some(best) =
            figures.iter().filter(|f| f.top_line.is_some()).max_by(|a, b| a.per_sec.total_cmp(&b.per_sec))
        {
            self.launch_line = best.top_line.clone();
        }
        if let Some(best) =
            figures.iter().filter(|f| !f.top_kernels.is_empty()).max_by(|a, b| a.per_sec.total_cmp(&b.per_sec))
        {
            self.kernels = best.top_kernels.clone();
        }
    }

    fn add_demand(&mut self, d: &ThreadDemand) {
        self.asked_n += 1;
        self.ran_sum += d.ran;
        self.waited_sum += d.waited;
        self.asked_tid = d.tid;
    }

    /// A feeding tick: its process, leaf function and leaf-most Python frame.
    fn add_tick(&mut self, k: &Tick) {
        self.ticks += 1;
        self.procs.entry((k.pid, k.comm.clone())).or_insert_with(|| (0, k.workload.clone())).0 += 1;
        if let Some(leaf) = k.stack.frames.last() {
            count(&mut self.functions, leaf);
        }
        if let Some(py) = python::leaf_frame(k.stack.user()) {
            count(&mut self.python, py);
        }
    }
}

/// A launcher waiting for a CPU this share of the time or more is said to share its core.
const SHARED_WAIT: f64 = 0.1;

#[derive(Debug, Default)]
pub struct GpuDetect {
    runs: BTreeMap<(u32, Kind), Run>,
    /// Per GPU: the highest SM clock seen in a second (what "held down" is measured against).
    clock_max: BTreeMap<u32, f64>,
    /// The feeders' off-CPU waits (`offcpu`), when they are recorded.
    waiting: waiting::Waiting,
}

/// Whose ticks feed a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Holder,
    Helper,
}

/// The pod of a workload string (`identity` JSON), if it names one.
fn pod_of(workload: &str) -> Option<String> {
    let id = crate::identity::workloads::decode(workload)?;
    id.pod_uid.or(id.pod_name).map(|p| p.to_string())
}

/// One second's ticks of the processes that feed a GPU: its holders, the processes they
/// started, and the processes of their pods.
#[derive(Debug)]
struct Feeders<'a> {
    /// (CPU, tick, whose).
    ticks: Vec<(u32, &'a Tick, Side)>,
    /// Per CPU: (CPU, the holders' ticks, the helpers' ticks).
    per_cpu: Vec<(u32, usize, usize)>,
    /// Per process: its ticks, and whose.
    per_pid: HashMap<u32, (usize, Side)>,
}

impl<'a> Feeders<'a> {
    fn of(now: &'a Second, g: &GpuSecond) -> Self {
        let holder_pods: Vec<String> = now
            .cpus
            .iter()
            .flat_map(|c| c.busy.iter())
            .filter(|k| g.holders.contains(&k.pid))
            .filter_map(|k| pod_of(&k.workload))
            .collect();
        let descendants: HashSet<u32> = g.descendants.iter().copied().collect();
        let side = |k: &Tick| {
            if g.holders.contains(&k.pid) {
                Some(Side::Holder)
            } else if descendants.contains(&k.pid)
                || (!holder_pods.is_empty() && pod_of(&k.workload).is_some_and(|p| holder_pods.contains(&p)))
            {
                Some(Side::Helper)
            } else {
                None
            }
        };
        let mut ticks = Vec::new();
        let mut per_cpu = Vec::with_capacity(now.cpus.len());
        for (cpu, c) in now.cpus.iter().enumerate() {
            let (mut own, mut helper) = (0, 0);
            for k in &c.busy {
                if let Some(s) = side(k) {
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
        Self { ticks, per_cpu, per_pid }
    }

    /// The helpers' ticks this second.
    fn helper_ticks(&self) -> usize {
        self.per_pid.values().filter(|(_, s)| *s == Side::Helper).map(|(n, _)| n).sum()
    }

    /// Whether a process of `side` kept a core busy while it moved between CPUs.
    fn pid_busy(&self, side: Side, busy: impl Fn(usize) -> bool) -> bool {
        self.per_pid.values().any(|(n, s)| *s == side && busy(*n))
    }

    /// The CPUs the feeders kept busy.
    fn busy_cpus(&self, busy: impl Fn(usize) -> bool) -> Vec<u32> {
        self.per_cpu.iter().filter(|c| busy(c.1 + c.2)).map(|c| c.0).collect()
    }

    /// What the GPU idled for: helpers kept a CPU busy (a CPU the feeders held, or a helper
    /// busy across CPUs), or else the holder itself did (its samples, or its busiest thread
    /// `asked` a whole core, even when a shared core gave it half: its samples alone would say
    /// "half busy").
    /// `workers_asking`: a worker asked for a whole core (ran plus waited) whatever it was given.
    fn kind(
        &self,
        asked: Option<&ThreadDemand>,
        workers_asking: bool,
        busy: impl Fn(usize) -> bool,
        t: &Thresholds,
    ) -> Option<Kind> {
        let helper_cpu = self.per_cpu.iter().any(|c| busy(c.1 + c.2) && c.2 > 0);
        if helper_cpu || self.pid_busy(Side::Helper, &busy) || workers_asking {
            Some(Kind::GpuStarved)
        } else if self.pid_busy(Side::Holder, &busy) || asked.is_some_and(|d| d.asked() >= t.gpu_cpu_busy) {
            Some(Kind::GpuLaunchBound)
        } else {
            None
        }
    }
}

/// The holders' thread that asked most of the CPUs (ran plus waited), the lowest tid of a tie.
fn launcher(g: &GpuSecond) -> Option<&ThreadDemand> {
    g.demand
        .iter()
        .filter(|d| g.holders.contains(&d.pid))
        .max_by(|a, b| a.asked().total_cmp(&b.asked()).then(b.tid.cmp(&a.tid)))
}

impl GpuDetect {
    /// One drain of the off-CPU counts: the waits of `feeders` (the GPUs' holders and the
    /// processes they started) are kept for the blocked side of `gpu-starved`.
    pub fn on_waits(&mut self, waits: &[crate::detect::iostall::Wait], feeders: &HashSet<u32>) {
        self.waiting.on_waits(waits, feeders);
    }

    pub fn evaluate(&mut self, now: &Second, input: &Input<'_>, m: Machine, t: &Thresholds) -> Vec<Active> {
        let mut seen: Vec<(u32, Kind)> = Vec::new();
        for g in input.gpus {
            if let Some(c) = g.sm_clock_mhz {
                let max = self.clock_max.entry(g.index).or_default();
                *max = max.max(c);
            }
            let Some(util) = g.util else { continue };
            let idle = util < t.gpu_idle_below * 100.0;
            let kind = if idle && !g.holders.is_empty() {
                self.feed(now, g, util, input.launches, m, t)
            } else if !idle && g.slowed_polls * 2 > g.polls {
                self.throttled(now, g, util);
                Some(Kind::GpuThrottled)
            } else {
                None
            };
            seen.extend(kind.map(|k| (g.index, k)));
            if self.underused(now, g, util, input.launches, t) {
                seen.push((g.index, Kind::GpuUnderused));
            }
        }
        self.runs.retain(|k, _| seen.contains(k));
        for ((index, _), run) in self.runs.iter_mut() {
            run.clock_max = self.clock_max.get(index).copied().unwrap_or(0.0);
        }
        let confirmed = self.runs.iter().filter(|(_, run)| run.seconds >= u64::from(t.gpu_secs));
        confirmed.map(|((index, kind), run)| active(*index, *kind, run, input.inventory, m)).collect()
    }

    /// Adds this second to the GPU's throttled run.
    fn throttled(&mut self, now: &Second, g: &GpuSecond, util: f64) {
        let run = self.runs.entry((g.index, Kind::GpuThrottled)).or_default();
        run.add_second(now.start_ns, util, g);
        run.reasons |= g.reasons;
        if let Some(c) = g.sm_clock_mhz {
            run.clock_sum += c;
            run.clock_n += 1;
        }
    }

    /// Adds this second to the GPU's starved or launch-bound run, if its feeders were busy;
    /// returns which.
    fn feed(
        &mut self,
        now: &Second,
        g: &GpuSecond,
        util: f64,
        launches: &HashMap<u32, LaunchFigures>,
        m: Machine,
        t: &Thresholds,
    ) -> Option<Kind> {
        let feeders = Feeders::of(now, g);
        let freq = m.frequency_hz.max(1) as f64;
        let busy = |n: usize| n as f64 / freq >= t.gpu_cpu_busy;
        let asked = launcher(g);
        let asking = workers::asking(g, t.gpu_cpu_busy);
        tracing::debug!(gpu = g.index, util, holders = ?g.holders, per_cpu = ?feeders.per_cpu, per_pid = ?feeders.per_pid, "GPU feeders this second");
        // No feeder keeps a CPU busy: were the holder's children blocked instead?
        let (kind, blocked) = match feeders.kind(asked, !asking.is_empty(), busy, t) {
            Some(kind) => (kind, None),
            None => {
                let cores = feeders.helper_ticks() as f64 / freq;
                let b = self.waiting.blocked(g, now.start_ns, cores, t.gpu_blocked_share)?;
                (Kind::GpuStarved, Some(b))
            }
        };
        let run = self.runs.entry((g.index, kind)).or_default();
        if let Some(b) = blocked {
            run.blocked_secs += 1;
            run.blocked = Some(b);
        }
        run.add_second(now.start_ns, util, g);
        run.add_launches(&g.holders, launches);
        if let Some(d) = asked {
            run.add_demand(d);
        }
        if kind == Kind::GpuStarved {
            run.workers.add(&asking);
        }
        let busy_cpus = feeders.busy_cpus(busy);
        if busy_cpus.len() >= run.busy_cpus.len() {
            run.busy_cpus = busy_cpus;
        }
        // A launch-bound GPU is its holders' doing: their helpers' ticks are not counted.
        let counted = feeders.ticks.iter().filter(|(_, _, s)| kind != Kind::GpuLaunchBound || *s == Side::Holder);
        for (_, k, _) in counted {
            run.add_tick(k);
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

/// What a finding's summary and evidence say of a run.
struct Told<'a> {
    index: u32,
    run: &'a Run,
    /// `GPU 0 (NVIDIA H100) 20 % busy for 10 s`.
    name: String,
    /// The run's processes, most ticks first.
    procs: Vec<Top>,
    functions: Vec<(Arc<str>, u64)>,
    python: Vec<(Arc<str>, u64)>,
    /// `, 100 % in augment (dataset.py:14)`: the frame that leads, or nothing.
    lead: String,
}

impl<'a> Told<'a> {
    fn new(index: u32, model: &str, run: &'a Run) -> Self {
        let util = run.util_sum / run.seconds.max(1) as f64;
        let name = format!("GPU {index} ({model}) {util:.0} % busy for {} s", run.seconds);
        let mut procs: Vec<Top> = run
            .procs
            .iter()
            .map(|((pid, comm), (samples, workload))| Top {
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
        let lead =
            lead.map_or(String::new(), |(f, n)| format!(", {} in {f}", percent(*n as f64 / run.ticks.max(1) as f64)));
        Self { index, run, name, procs, functions, python, lead }
    }

    fn first(&self, otherwise: &str) -> String {
        self.procs.first().map_or(otherwise.to_string(), |p| p.who(""))
    }

    /// On a GPU several processes hold, who used it: `; the GPU is shared by 2 processes, by
    /// their share of its SMs: python3 (pid 900) 38 %, trainer (pid 812) 2 %`; nothing when one
    /// process (or none NVML measured) holds it.
    fn shared(&self) -> String {
        let shares = self.run.holder_shares();
        if shares.len() < 2 {
            return String::new();
        }
        let name = |pid: u32| {
            self.procs.iter().find(|p| p.pid == pid).map_or(format!("pid {pid}"), |p| format!("{} (pid {pid})", p.comm))
        };
        let list: Vec<String> = shares.iter().take(5).map(|&(pid, sm)| format!("{} {sm:.0} %", name(pid))).collect();
        let more = if shares.len() > 5 { format!(" and {} more", shares.len() - 5) } else { String::new() };
        format!(
            "; the GPU is shared by {} processes, by their share of its SMs: {}{more}",
            shares.len(),
            list.join(", ")
        )
    }

    fn starved(&self, m: Machine) -> String {
        let (run, name, lead) = (self.run, &self.name, &self.lead);
        let cores = run.ticks as f64 / run.seconds.max(1) as f64 / m.frequency_hz.max(1) as f64;
        // The feeders named are the holder's helpers: the holder is the one they feed.
        let helpers: Vec<&Top> = self.procs.iter().filter(|p| !run.holders.contains(&p.pid)).collect();
        let who = match helpers.as_slice() {
            [] => "its processes".to_string(),
            [one] => one.who(""),
            [first, rest @ ..] => format!("{} and {} other process(es)", first.who(""), rest.len()),
        };
        format!(
            "{name} while {who} kept {} CPU(s) busy ({cores:.1} cores){lead}{}: \
             the input pipeline is the bottleneck; look next: the number of workers, the transform's cost{}",
            run.busy_cpus.len().max(1),
            run.workers.text(),
            self.shared(),
        )
    }

    /// A run whose feeders mostly waited off CPU: what they waited in, and the loop's wait.
    fn starved_waiting(&self, b: &waiting::Blocked) -> String {
        format!(
            "{} while its input pipeline waits rather than computes: {}; look next: the storage or network the \
             workers read from (iostat -x, nfsstat, the object store's latency), read sizes, prefetching, more \
             workers, a local cache{}",
            self.name,
            b.describe(),
            self.shared(),
        )
    }

    fn launch_bound(&self) -> String {
        let (run, name, lead) = (self.run, &self.name, &self.lead);
        // With the CUDA probes: how fast it launches, and from where.
        let launch_text = match (run.launch_rate(), &run.launch_line) {
            (Some(r), Some((line, share))) if r > 0.0 => {
                format!(", {r:.0} launches/s (one every {:.0} µs), {} of them from {line}", 1e6 / r, percent(*share))
            }
            (Some(r), None) if r > 0.0 => format!(", {r:.0} launches/s (one every {:.0} µs)", 1e6 / r),
            _ => String::new(),
        };
        // Waiting for a CPU is the other half of the story: a launcher on a shared core.
        let (busy_text, shared_text) = match run.shares() {
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
        format!(
            "{name} while {} {busy_text}{lead}{launch_text}{}: kernels are launched one by \
             one; look next: CUDA graphs, larger batches, a compiled model{shared_text}{}",
            self.first("the process holding it"),
            run.kernels_text(),
            self.shared(),
        )
    }

    fn throttled(&self) -> String {
        let run = self.run;
        // The SM clock against the highest this daemon saw: how much "held down" costs.
        let clock_text = match run.clock() {
            Some(c) if run.clock_max > 0.0 => format!(", SM clock {c:.0} MHz against {:.0} MHz at best", run.clock_max),
            _ => String::new(),
        };
        format!(
            "{} with its clocks held down ({}{clock_text}); look next: power limit, cooling, \
             the node's power budget",
            self.name,
            crate::gpu_readings::reason_names(run.reasons & crate::gpu_readings::SLOWDOWN_REASONS).join(", ")
        )
    }

    fn evidence(&self, inv: &Inventory) -> serde_json::Value {
        let (index, run) = (self.index, self.run);
        let info = inv.gpus.iter().find(|g| g.index == index);
        let frames =
            |v: &[(Arc<str>, u64)]| v.iter().map(|(f, n)| json!({"function": &**f, "samples": n})).collect::<Vec<_>>();
        json!({
            "gpu": index,
            "model": info.map_or("unknown model", |g| g.model.as_str()),
            "uuid": info.map(|g| g.uuid.clone()),
            "bus_id": info.map(|g| g.bus_id.clone()),
            "local_cpus": info.map(|g| cpu_list(&g.local_cpus)),
            "utilization_percent": run.util_sum / run.seconds.max(1) as f64,
            "seconds": run.seconds,
            "busy_cpus": run.busy_cpus,
            "processes": self.procs.iter().take(10).map(|p| p.json()).collect::<Vec<_>>(),
            "top_functions": frames(&self.functions),
            "top_python": frames(&self.python),
            "clock_event_reasons": crate::gpu_readings::reason_names(run.reasons),
            "sm_clock_mhz": run.clock(),
            "sm_clock_max_mhz": (run.clock_max > 0.0).then_some(run.clock_max),
            "launches_per_sec": run.launch_rate(),
            "launcher_tid": (run.asked_n > 0).then_some(run.asked_tid),
            "launcher_ran_share": run.shares().0,
            "launcher_waited_share": run.shares().1,
            "top_launch_line": run.launch_line.as_ref().map(|(l, s)| json!({"line": &**l, "share": s})),
            "top_kernels": run.kernels.iter().map(|(k, s)| json!({"kernel": &**k, "share": s})).collect::<Vec<_>>(),
            "gpm": (run.gpm.seconds() > 0).then(|| self.gpm_evidence()),
            "workers_demand": run.workers.json(),
            "holders_sm_percent": run.holder_shares().iter().map(|(pid, sm)| json!({"pid": pid, "sm_percent": sm})).collect::<Vec<_>>(),
            "blocked": run.blocked.as_ref().map(|b| {
                let mut v = b.json();
                v["seconds"] = json!(run.blocked_secs);
                v
            }),
            "since_ns": run.start_ns,
            "until_ns": run.start_ns + run.seconds * NS_PER_SEC,
        })
    }
}

fn active(index: u32, kind: Kind, run: &Run, inv: &Inventory, m: Machine) -> Active {
    let model = inv.gpus.iter().find(|g| g.index == index).map_or("unknown model", |g| g.model.as_str());
    let told = Told::new(index, model, run);
    let summary = match kind {
        Kind::GpuStarved => match &run.blocked {
            Some(b) if run.blocked_secs * 2 > run.seconds => told.starved_waiting(b),
            _ => told.starved(m),
        },
        Kind::GpuLaunchBound => told.launch_bound(),
        Kind::GpuUnderused => told.underused(),
        _ => told.throttled(),
    };
    Active {
        kind,
        cpu: None,
        subject: Some(format!("gpu{index}")),
        onset_ns: run.start_ns,
        severity: Severity::Warning,
        summary,
        evidence: told.evidence(inv),
    }
}

mod underused;
pub mod waiting;
mod workers;

#[cfg(test)]
#[path = "gpu_tests.rs"]
mod tests;
