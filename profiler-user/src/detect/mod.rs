//! Detectors of kernel hot spots. The daemon feeds them every sample as it is stored, plus the
//! NET_RX figures and cgroup events; once a second is complete they evaluate it, and what they
//! report opens, extends or closes a [`Finding`].
//!
//! - `saturation`: a CPU saturated while the machine as a whole looks fine;
//! - `hotfunc`: one kernel function holding a CPU;
//! - `netrx`: NET_RX softirq / NAPI work starved on a CPU;
//! - `zombies`: dying memory cgroups piling up, and who makes them;
//! - `throttle`: a cgroup throttled by its CPU quota, and what it ran meanwhile;
//! - `lockspin`: one kernel spin-lock slow path holding several CPUs, and who contends;
//! - `runq`: a runnable thread kept off a CPU for long, and what ran instead;
//! - `reclaim`: a CPU's tasks stalled in reclaim or compaction, and the memory cgroup;
//! - `gpu`: a GPU idle while its feeders' CPUs are saturated (input pipeline, launch thread),
//!   or busy with its clocks held down; a fatal Xid in the kernel log (`gpu::xid`).
//!
//! Beside them: `finding` (what they report), `seconds` (what they read), `thresholds` (every
//! figure that decides a finding), `journal` (where findings and kernel-log events are kept);
//! this file is the engine that feeds the detectors and turns what they report into findings.

pub mod cuda;
mod figures;
mod finding;
pub mod gpu;
pub mod hotfunc;
pub mod iostall;
pub mod journal;
pub mod lockspin;
pub mod netrx;
pub mod reclaim;
pub mod runq;
pub mod saturation;
mod seconds;
pub mod thresholds;
pub mod throttle;
pub mod zombies;

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::{
    collect::{
        NetRxCpu, latency,
        memcg::MemcgCount,
        reclaim::{self as reclaim_read, ReclaimCpu, ReclaimSecond},
        runq::{self as runq_read, RunqCpu, RunqSecond},
    },
    store::format::NS_PER_SEC,
};

pub use figures::Figures;
pub use finding::{Active, Finding, Judged, Kind, Labels, Severity, finding_id, finding_id_of, finding_id_time};
pub use seconds::{CpuSecond, LaunchFigures, Machine, NetRxSecond, Second, Tick, Top, percent, top_processes};
pub use thresholds::Thresholds;

/// A second is evaluated once every sample stamped up to this long after its end has arrived:
/// a sample is stamped a few microseconds before the BPF program commits it to the ring.
const ARRIVAL_SLACK_NS: u64 = 10_000_000;
/// A second whose samples have not all arrived this long after it ended is evaluated anyway
/// (its missing ticks counted as lost, never as idle), so that a pipeline that stopped hearing
/// from the reader does not hold seconds without end.
const MAX_WAIT_NS: u64 = 60 * NS_PER_SEC;
/// With a GPU poller, a second also waits for its GPU summary, which the poller makes at the
/// next second's first poll, after NVML's calls and the idle holders' threads are read: on a
/// real node (an H200, a 150-thread PyTorch holder with six workers) that came after the
/// samples, and the second was judged without its GPU, so `gpu-starved` never ran 10 s. A
/// poller that stopped delays the detectors by this much at most.
const GPU_WAIT_NS: u64 = 3 * NS_PER_SEC;
/// A finding closes after its condition has been false for this many evaluated seconds.
const CLOSE_AFTER_SECS: u64 = 2;

/// An open finding's latest figures reach the open list on disk at most this often (its
/// first state is written when it opens, its last when it closes).
const REWRITE_OPEN_SECS: u64 = 5;

struct Open {
    finding: Finding,
    last_active_ns: u64,
    /// When the open list last got this finding's figures.
    written_ns: u64,
}

/// Collects seconds, runs the detectors, and turns what they report into findings.
pub struct Engine {
    machine: Machine,
    thresholds: Thresholds,
    pending: BTreeMap<u64, Second>,
    history: VecDeque<Second>,
    saturation: saturation::Saturation,
    hotfunc: hotfunc::HotFunc,
    lockspin: lockspin::LockSpin,
    pub zombies: zombies::Zombies,
    pub throttle: throttle::Throttle,
    netrx_prev: Vec<NetRxCpu>,
    runq: runq_read::Tracker,
    reclaim: reclaim_read::Tracker,
    /// Real-time policies of processes on CPUs where NET_RX work waited, read while they ran.
    policies: HashMap<u32, String>,
    open: BTreeMap<(Kind, Option<u32>, Option<String>), Open>,
    /// Which CPUs take the NIC and GPU interrupts (set by the daemon, read again every few
    /// seconds): a finding on such a CPU says so.
    pub interrupts: crate::collect::irqs::Placement,
    /// What the GPU poller read (set by the daemon when GPU tracks are on).
    pub gpu: Option<crate::gpu_readings::Shared>,
    gpu_detect: gpu::GpuDetect,
    cuda_detect: cuda::CudaDetect,
    iostall: iostall::IoStall,
}

/// What changed in one evaluation.
#[derive(Debug, Default)]
pub struct Changes {
    pub opened: Vec<Finding>,
    pub closed: Vec<Finding>,
    /// Open findings whose summary changed since they were last written: a reader of the
    /// open list sees "3000 dying cgroups", not the 1000 there were at onset.
    pub updated: Vec<Finding>,
}

impl Changes {
    pub fn extend(&mut self, other: Changes) {
        self.opened.extend(other.opened);
        self.closed.extend(other.closed);
        self.updated.extend(other.updated);
    }
}

impl Engine {
    pub fn new(machine: Machine, thresholds: Thresholds) -> Self {
        Self {
            machine,
            saturation: saturation::Saturation::default(),
            hotfunc: hotfunc::HotFunc::default(),
            lockspin: lockspin::LockSpin::default(),
            zombies: zombies::Zombies::default(),
            throttle: throttle::Throttle::default(),
            thresholds,
            pending: BTreeMap::new(),
            history: VecDeque::new(),
            netrx_prev: Vec::new(),
            runq: runq_read::Tracker::default(),
            reclaim: reclaim_read::Tracker::default(),
            policies: HashMap::new(),
            open: BTreeMap::new(),
            interrupts: Default::default(),
            gpu: None,
            gpu_detect: gpu::GpuDetect::default(),
            cuda_detect: cuda::CudaDetect::default(),
            iostall: iostall::IoStall::default(),
        }
    }

    pub fn set_thresholds(&mut self, t: Thresholds) {
        self.thresholds = t;
    }

    fn cpu(&mut self, ts_ns: u64, cpu: u32) -> Option<&mut CpuSecond> {
        let second = ts_ns / NS_PER_SEC;
        // Anything older than the last evaluated second is too late to count.
        if self.history.back().is_some_and(|s| s.start_ns / NS_PER_SEC >= second) {
            return None;
        }
        let n = self.machine.cpus as usize;
        let s = self
            .pending
            .entry(second)
            .or_insert_with(|| Second { start_ns: second * NS_PER_SEC, cpus: vec![CpuSecond::default(); n] });
        s.cpus.get_mut(cpu as usize)
    }

    pub fn on_busy(&mut self, ts_ns: u64, cpu: u32, tick: Tick) {
        if let Some(c) = self.cpu(ts_ns, cpu) {
            c.busy.push(tick);
        }
    }

    /// A busy sample's cgroup (the sampler's v2 cgroup id): the throttling detector keeps what
    /// runs in cgroups with a quota.
    pub fn on_cgroup(&mut self, ts_ns: u64, cgroup_id: u64, tick: &Tick) {
        self.throttle.on_tick(ts_ns, cgroup_id, tick);
    }

    pub fn on_idle(&mut self, ts_ns: u64, cpu: u32) {
        if let Some(c) = self.cpu(ts_ns, cpu) {
            c.idle += 1;
        }
    }

    /// `n` samples of `cpu` in the second of `ts_ns` never arrived (a full ring or queue).
    pub fn on_lost(&mut self, ts_ns: u64, cpu: u32, n: u64) {
        if let Some(c) = self.cpu(ts_ns, cpu) {
            c.lost = c.lost.saturating_add(n.min(u64::from(u32::MAX)) as u32);
        }
    }

    /// Cumulative NET_RX figures read at `ts_ns`: their growth since the last read goes to
    /// that second.
    pub fn on_netrx(&mut self, ts_ns: u64, now: Vec<NetRxCpu>) {
        let prev = std::mem::replace(&mut self.netrx_prev, now.clone());
        for (cpu, n) in now.iter().enumerate() {
            let p = prev.get(cpu).cloned().unwrap_or_default();
            let runs = n.entries.saturating_sub(p.entries);
            let histogram = latency::growth(&n.histogram, &p.histogram);
            let waited = n.latency_max_ns.max(n.poll_gap_max_ns) as f64 >= self.thresholds.netrx_gap_ms * 1e6;
            if waited {
                self.note_policies(cpu);
            }
            if let Some(c) = self.cpu(ts_ns, cpu as u32) {
                let s = c.netrx.get_or_insert_with(NetRxSecond::default);
                s.runs += runs;
                latency::add(&mut s.histogram, &histogram);
                s.latency_max_ns = s.latency_max_ns.max(n.latency_max_ns);
                s.poll_gap_max_ns = s.poll_gap_max_ns.max(n.poll_gap_max_ns);
            }
        }
    }

    /// Notes the real-time policies of the processes most sampled on `cpu` in the seconds not
    /// yet evaluated: whoever holds the CPU now may be gone when its second is evaluated.
    fn note_policies(&mut self, cpu: usize) {
        if self.policies.len() > 4096 {
            self.policies.clear();
        }
        let ticks = self.pending.values().filter_map(|s| s.cpus.get(cpu)).flat_map(|c| c.busy.iter());
        for t in top_processes(ticks, 3) {
            self.policies.insert(t.pid, netrx::policy(t.pid));
        }
    }

    /// Cumulative run-queue figures read at `ts_ns`: their growth since the last read goes to
    /// that second. Returns each CPU's waits of this read (without names), for the counters.
    pub fn on_runq(&mut self, ts_ns: u64, now: Vec<RunqCpu>) -> Vec<(u32, RunqSecond)> {
        // The p99 can fire without one wait that long: name any wait that long.
        let name_from_ns = (self.thresholds.runq_max_ms.min(self.thresholds.runq_p99_ms) * 1e6) as u64;
        let mut waits = Vec::new();
        for (cpu, second) in self.runq.update(now, name_from_ns) {
            let unnamed = RunqSecond { waiter: None, histogram: second.histogram.clone(), ..second };
            waits.push((cpu as u32, unnamed));
            // A long wait's CPU: note the policies of what ran there while they still run.
            if second.waiter.is_some() {
                self.note_policies(cpu);
            }
            if let Some(c) = self.cpu(ts_ns, cpu as u32) {
                c.runq.get_or_insert_with(Default::default).add(second);
            }
        }
        waits
    }

    /// Cumulative reclaim and compaction stalls read at `ts_ns`: their growth goes to that second.
    /// Returns each CPU's stalls of this read, for the counters' tracks.
    pub fn on_reclaim(&mut self, ts_ns: u64, now: Vec<ReclaimCpu>) -> Vec<(u32, ReclaimSecond)> {
        let mut stalls = Vec::new();
        for (cpu, second) in self.reclaim.update(now) {
            stalls.push((cpu as u32, ReclaimSecond { staller: None, ..second.clone() }));
            if let Some(c) = self.cpu(ts_ns, cpu as u32) {
                c.reclaim.get_or_insert_with(Default::default).add(second);
            }
        }
        stalls
    }

    /// Evaluates every second whose samples have all arrived: `arrived_ns` (wall clock) is a
    /// time before which every sample stamped has been handed to the engine (the daemon knows
    /// it from the reader's drains, not from the clock: a pipeline behind the ring has not seen
    /// the last seconds' samples yet, and an empty second read as idle CPUs made the run-queue
    /// detector see "room elsewhere" on a saturated machine). A second still incomplete
    /// [`MAX_WAIT_NS`] after its end by `now_ns` is evaluated with its missing ticks as lost.
    pub fn tick(&mut self, arrived_ns: u64, now_ns: u64) -> Changes {
        let mut changes = Changes::default();
        // The newest second the GPU poller summarised: outer `None` without a poller.
        let gpu_newest = self.gpu.as_ref().map(|g| {
            let state = g.lock().unwrap_or_else(|p| p.into_inner());
            state.seconds.back().map(|(start, _)| *start / NS_PER_SEC)
        });
        let gpu_in = |second: u64| {
            gpu_newest.is_none_or(|n| n.is_some_and(|n| n >= second))
                || (second + 1) * NS_PER_SEC + GPU_WAIT_NS <= now_ns
        };
        let complete = |second: u64| (second + 1) * NS_PER_SEC + ARRIVAL_SLACK_NS <= arrived_ns;
        let overdue = |second: u64| (second + 1) * NS_PER_SEC + MAX_WAIT_NS <= now_ns;
        // Seconds with no sample at all still count (an idle vCPU may get no ticks).
        if let Some(last) = self.history.back().map(|s| s.start_ns / NS_PER_SEC) {
            let ready =
                arrived_ns.saturating_sub(ARRIVAL_SLACK_NS).max(now_ns.saturating_sub(MAX_WAIT_NS)) / NS_PER_SEC;
            for second in last + 1..ready.min(last + 120) {
                let n = self.machine.cpus as usize;
                self.pending
                    .entry(second)
                    .or_insert_with(|| Second { start_ns: second * NS_PER_SEC, cpus: vec![CpuSecond::default(); n] });
            }
        }
        while let Some((&second, _)) = self.pending.first_key_value() {
            let ready = complete(second) && gpu_in(second);
            if !ready && !overdue(second) {
                break;
            }
            let mut s = self.pending.remove(&second).expect("present");
            if !complete(second) {
                // What has not arrived is unknown, not idle.
                let hz = self.machine.frequency_hz.min(u64::from(u32::MAX)) as u32;
                for c in &mut s.cpus {
                    let seen = (c.busy.len() as u32).saturating_add(c.idle).saturating_add(c.lost);
                    c.lost += hz.saturating_sub(seen);
                }
            }
            self.history.push_back(s);
            let t = &self.thresholds;
            let keep = t.hot_window_secs.max(t.saturated_secs).max(t.lock_window_secs).max(1) as usize + 1;
            while self.history.len() > keep {
                self.history.pop_front();
            }
            let mut active = Vec::new();
            active.extend(self.saturation.evaluate(&self.history, self.machine, &self.thresholds));
            active.extend(self.hotfunc.evaluate(&self.history, self.machine, &self.thresholds));
            active.extend(self.lockspin.evaluate(&self.history, self.machine, &self.thresholds));
            active.extend(netrx::evaluate(self.history.back().expect("pushed"), &self.thresholds, &self.policies));
            active.extend(runq::evaluate(&self.history, self.machine, &self.thresholds, &self.policies));
            active.extend(reclaim::evaluate(&self.history, &self.thresholds));
            if let Some(shared) = &self.gpu {
                let state = shared.lock().unwrap_or_else(|p| p.into_inner());
                let now = self.history.back().expect("pushed");
                if let Some(gpus) = state.second(now.start_ns) {
                    // The CUDA detector's latest launch figures, handed over as data.
                    let input = gpu::Input { gpus, inventory: &state.inventory, launches: self.cuda_detect.launches() };
                    active.extend(self.gpu_detect.evaluate(now, &input, self.machine, &self.thresholds));
                }
            }
            let end = (second + 1) * NS_PER_SEC;
            self.reconcile(active, end, Some(Judged::EachSecond), &mut changes);
        }
        changes
    }

    /// Runs the zombie-memcg detector (it reads /proc and cgroupfs: call every few seconds).
    pub fn check_zombies(&mut self, now_ns: u64) -> Changes {
        let mut changes = Changes::default();
        let active = self.zombies.evaluate(now_ns, &self.thresholds);
        self.reconcile(active.into_iter().collect(), now_ns, Some(Judged::ZombieCount), &mut changes);
        changes
    }

    /// As [`Self::check_zombies`], with counts read by the daemon's upkeep stage (`None`: they
    /// could not be read).
    pub fn check_zombies_count(&mut self, now_ns: u64, count: Option<MemcgCount>) -> Changes {
        let mut changes = Changes::default();
        let active = count.and_then(|c| self.zombies.evaluate_count(c, now_ns, &self.thresholds));
        self.reconcile(active.into_iter().collect(), now_ns, Some(Judged::ZombieCount), &mut changes);
        changes
    }

    /// One drain of the off-CPU counts (`offcpu`): the waits drained at `now_ns`.
    pub fn check_offcpu(&mut self, now_ns: u64, waits: Vec<iostall::Wait>) -> Changes {
        let mut changes = Changes::default();
        // The GPUs' feeders' waits first: the blocked side of `gpu-starved`.
        if let Some(shared) = &self.gpu {
            let state = shared.lock().unwrap_or_else(|p| p.into_inner());
            let feeders: std::collections::HashSet<u32> = state
                .seconds
                .iter()
                .flat_map(|(_, gpus)| gpus.iter())
                .flat_map(|g| g.holders.iter().chain(g.descendants.iter()).copied())
                .collect();
            drop(state);
            self.gpu_detect.on_waits(&waits, &feeders);
        }
        let busy = self.iostall.machine_busy(now_ns);
        let active = self.iostall.evaluate(now_ns, waits, busy);
        self.reconcile(active, now_ns, Some(Judged::OffCpuDrain), &mut changes);
        changes
    }

    /// One drain of the CUDA probes (`gpu::cuda`): `threads`' calls over `secs` ending at `now_ns`.
    pub fn check_cuda(&mut self, now_ns: u64, secs: f64, threads: Vec<cuda::CudaThread>) -> Changes {
        let mut changes = Changes::default();
        let state = self.gpu.as_ref().map(|s| s.lock().unwrap_or_else(|p| p.into_inner()));
        let active = self.cuda_detect.evaluate(now_ns, secs, threads, state.as_deref(), &self.thresholds);
        drop(state);
        self.reconcile(active, now_ns, Some(Judged::CudaDrain), &mut changes);
        changes
    }

    /// Runs the CFS throttling detector on the cgroups read by the upkeep stage (`None`: they
    /// could not be read; open throttling findings then close).
    pub fn check_throttle(&mut self, now_ns: u64, readings: Option<Vec<throttle::scan::Reading>>) -> Changes {
        let mut changes = Changes::default();
        let active = self.throttle.evaluate(now_ns, readings, &self.thresholds);
        self.reconcile(active, now_ns, Some(Judged::ThrottleScan), &mut changes);
        changes
    }

    /// Opens findings for new conditions, refreshes open ones, closes those whose condition
    /// has been false for a while. Only findings of the kinds `judged` judges are considered for
    /// closing (`None`: all).
    fn reconcile(&mut self, active: Vec<Active>, now_ns: u64, judged: Option<Judged>, changes: &mut Changes) {
        for a in active {
            let a = self.with_interrupts(a);
            let key = (a.kind, a.cpu, a.subject.clone());
            match self.open.get_mut(&key) {
                Some(o) => {
                    o.last_active_ns = now_ns;
                    // Keep the worst severity and the latest figures.
                    let changed = o.finding.summary != a.summary || a.severity > o.finding.severity;
                    o.finding.severity = o.finding.severity.max(a.severity);
                    o.finding.summary = a.summary;
                    o.finding.evidence = a.evidence;
                    if changed && now_ns.saturating_sub(o.written_ns) >= REWRITE_OPEN_SECS * NS_PER_SEC {
                        o.written_ns = now_ns;
                        changes.updated.push(o.finding.clone());
                    }
                }
                None => {
                    let finding = Finding {
                        id: finding_id_of(a.kind, a.cpu, a.subject.as_deref(), a.onset_ns),
                        kind: a.kind,
                        start_ns: a.onset_ns,
                        end_ns: None,
                        cpu: a.cpu,
                        severity: a.severity,
                        summary: a.summary,
                        evidence: a.evidence,
                    };
                    changes.opened.push(finding.clone());
                    self.open.insert(key, Open { finding, last_active_ns: now_ns, written_ns: now_ns });
                }
            }
        }
        let stale: Vec<_> = self
            .open
            .iter()
            .filter(|(k, o)| {
                judged.is_none_or(|j| k.0.judged() == j)
                    && now_ns.saturating_sub(o.last_active_ns) > CLOSE_AFTER_SECS * NS_PER_SEC
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in stale {
            let mut o = self.open.remove(&key).expect("listed");
            o.finding.end_ns = Some(o.last_active_ns);
            changes.closed.push(o.finding);
        }
    }

    /// A CPU finding on a CPU that takes a NIC's or GPU's interrupts says so: that is how the
    /// ENA resets began (a NIC queue's CPU held at 100 % by kubelet).
    fn with_interrupts(&self, mut a: Active) -> Active {
        let Some(cpu) = a.cpu else { return a };
        let Some(served) = self.interrupts.describe(cpu) else { return a };
        a.summary = format!("{}; CPU {cpu} serves {served}", a.summary);
        if let Some(evidence) = a.evidence.as_object_mut() {
            evidence.insert("interrupts".into(), serde_json::json!(self.interrupts.serving(cpu)));
        }
        a
    }

    /// Findings still open (for a clean shutdown: they are written with their current end).
    pub fn open_findings(&self) -> Vec<Finding> {
        self.open.values().map(|o| Finding { end_ns: Some(o.last_active_ns), ..o.finding.clone() }).collect()
    }
}

#[cfg(test)]
mod tests;
