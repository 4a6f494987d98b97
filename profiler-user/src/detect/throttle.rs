//! Detector 5: a cgroup (container, pod, systemd unit or any other) throttled by its CPU quota
//! (CFS bandwidth control), with the profile of what it ran while it hit the quota.
//!
//! Counters: each cgroup with a quota, read every few seconds by the upkeep stage
//! ([`scan::Scanner`]: cgroup v1 `cpu.stat` `nr_periods`/`nr_throttled`/`throttled_time`, v2
//! `throttled_usec`). Profile: the pipeline hands every busy sample to [`Throttle::on_tick`],
//! which keeps, per second, the stacks and threads of samples whose process is in such a
//! cgroup (by pid from `cgroup.procs`; on v2 also by the sample's cgroup id).
//!
//! Decision: over the last `throttle_window_secs` (10 s by default), the share of the
//! cgroup's enforcement periods that ended throttled (`Δnr_throttled / Δnr_periods`) is at
//! least `throttle_share` (25 %, the threshold of kubernetes-mixin's `CPUThrottlingHigh`
//! alert), over at least `throttle_min_periods` (10) periods in which it ran. `nr_periods`
//! counts only periods in which the cgroup had work, so idle time does not dilute the share,
//! and a cgroup that ran for a moment is not judged on two periods. Critical from half the
//! periods on. The measured span must be at least [`MIN_SPAN_NS`] (two readings apart).

pub mod scan;

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
};

use rustc_hash::FxHashMap;
use serde_json::json;

use super::{
    finding::{Active, Kind, Severity},
    seconds::{Tick, Top, percent},
    thresholds::Thresholds,
};
use crate::{exec_context::Context, model::Stack, store::format::NS_PER_SEC};
use scan::{CpuStat, Quota, Reading, Version};

/// The shortest span of counters a decision is made on.
pub const MIN_SPAN_NS: u64 = 2 * NS_PER_SEC;
/// Cgroups reported at once (the most throttled first).
const MAX_FINDINGS: usize = 20;
/// Distinct stacks kept per cgroup and second; more are counted, not kept.
const MAX_STACKS: usize = 1024;
/// Seconds of profile kept beyond the window (readings are a few seconds apart).
const PROFILE_SLACK_SECS: u64 = 10;

/// A cgroup, as findings name it: its hierarchy and its path below the mount point.
fn key(version: Version, path: &str) -> Arc<str> {
    match version {
        Version::V1 => Arc::from(format!("v1 cpu:{path}")),
        Version::V2 => Arc::from(path),
    }
}

#[derive(Debug)]
struct Series {
    version: Version,
    path: String,
    quota: Quota,
    pids: Vec<u32>,
    /// (read at, counters), oldest first.
    readings: VecDeque<(u64, CpuStat)>,
}

/// What the samples of one cgroup's processes ran during one second.
#[derive(Debug, Default)]
struct Bucket {
    second: u64,
    /// By the stack's address: the symbolizer hands out one `Arc` per distinct stack it has
    /// cached, so this costs no hashing of frames per sample; equal stacks under two addresses
    /// are merged when a finding is made.
    stacks: FxHashMap<usize, (Arc<Stack>, u64)>,
    /// (pid, comm) → (samples, workload)
    threads: FxHashMap<(u32, Arc<str>), (u64, Arc<str>)>,
    samples: u64,
}

#[derive(Debug, Default)]
pub struct Throttle {
    series: HashMap<Arc<str>, Series>,
    /// Pid → the innermost cgroup with a quota that holds it.
    by_pid: FxHashMap<u32, Arc<str>>,
    /// v2 cgroup id → the innermost cgroup with a quota at or above it.
    by_id: FxHashMap<u64, Arc<str>>,
    profiles: HashMap<Arc<str>, VecDeque<Bucket>>,
    onsets: HashMap<Arc<str>, u64>,
    keep_secs: u64,
}

/// The throttling figures of one cgroup over a span.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub from_ns: u64,
    pub to_ns: u64,
    pub periods: u64,
    pub throttled: u64,
    pub throttled_ns: u64,
}

impl Window {
    pub fn share(&self) -> f64 {
        self.throttled as f64 / self.periods.max(1) as f64
    }

    /// Throttled enough, over enough periods, to report.
    pub fn is_throttled(&self, t: &Thresholds) -> bool {
        self.to_ns.saturating_sub(self.from_ns) >= MIN_SPAN_NS
            && self.periods >= t.throttle_min_periods
            && self.share() >= t.throttle_share
    }
}

/// The growth of the counters from the oldest reading within the window to the newest.
/// `None` without two readings in it, or when the counters went back (a cgroup made anew).
fn window(readings: &VecDeque<(u64, CpuStat)>, window_ns: u64) -> Option<Window> {
    let &(to_ns, last) = readings.back()?;
    // A reading a little older than the window still counts: readings come every few seconds.
    let &(from_ns, first) = readings.iter().find(|(ts, _)| to_ns.saturating_sub(*ts) <= window_ns + NS_PER_SEC)?;
    if from_ns == to_ns || last.nr_periods < first.nr_periods || last.nr_throttled < first.nr_throttled {
        return None;
    }
    Some(Window {
        from_ns,
        to_ns,
        periods: last.nr_periods - first.nr_periods,
        throttled: last.nr_throttled - first.nr_throttled,
        throttled_ns: last.throttled_ns.saturating_sub(first.throttled_ns),
    })
}

impl Throttle {
    /// Nothing to match samples against: the pipeline need not ask.
    pub fn is_idle(&self) -> bool {
        self.by_pid.is_empty() && self.by_id.is_empty()
    }

    /// One busy sample: kept if its process is in a cgroup with a quota.
    pub fn on_tick(&mut self, ts_ns: u64, cgroup_id: u64, tick: &Tick) {
        if self.is_idle() {
            return;
        }
        let Some(key) = self.by_id.get(&cgroup_id).or_else(|| self.by_pid.get(&tick.pid)) else { return };
        // Softirq work interrupting the cgroup's thread is not charged to its quota.
        if Context::of_stack(&tick.stack).is_softirq() {
            return;
        }
        let second = ts_ns / NS_PER_SEC;
        let buckets = self.profiles.entry(key.clone()).or_default();
        // Samples arrive about in order: a late one finds its second near the back.
        let at = match buckets.iter().rposition(|b| b.second <= second) {
            Some(i) if buckets[i].second == second => i,
            Some(i) => {
                buckets.insert(i + 1, Bucket { second, ..Default::default() });
                i + 1
            }
            None => {
                buckets.push_front(Bucket { second, ..Default::default() });
                0
            }
        };
        let b = &mut buckets[at];
        b.samples += 1;
        let addr = Arc::as_ptr(&tick.stack) as usize;
        if b.stacks.len() < MAX_STACKS || b.stacks.contains_key(&addr) {
            b.stacks.entry(addr).or_insert_with(|| (tick.stack.clone(), 0)).1 += 1;
        }
        b.threads.entry((tick.pid, tick.comm.clone())).or_insert_with(|| (0, tick.workload.clone())).0 += 1;
        let newest = buckets.back().map_or(second, |b| b.second);
        while buckets.front().is_some_and(|b| b.second + self.keep_secs.max(PROFILE_SLACK_SECS) < newest) {
            buckets.pop_front();
        }
    }

    /// A scan's readings (`None`: none could be made) at `now_ns`: updates the counters and the
    /// processes to watch, and reports the cgroups throttled over the window.
    pub fn evaluate(&mut self, now_ns: u64, readings: Option<Vec<Reading>>, t: &Thresholds) -> Vec<Active> {
        let window_ns = u64::from(t.throttle_window_secs.max(1)) * NS_PER_SEC;
        self.keep_secs = u64::from(t.throttle_window_secs) + PROFILE_SLACK_SECS;
        let Some(readings) = readings else {
            self.series.clear();
            self.by_pid.clear();
            self.by_id.clear();
            self.onsets.clear();
            return Vec::new();
        };
        self.by_pid.clear();
        self.by_id.clear();
        // Innermost first wins: a deeper cgroup's own quota is the one its processes meet first.
        let mut sorted: Vec<&Reading> = readings.iter().collect();
        sorted.sort_by_key(|r| std::cmp::Reverse(r.path.matches('/').count()));
        let mut present = HashSet::new();
        for r in sorted {
            let k = key(r.version, &r.path);
            for &pid in &r.pids {
                self.by_pid.entry(pid).or_insert_with(|| k.clone());
            }
            for &id in &r.ids {
                self.by_id.entry(id).or_insert_with(|| k.clone());
            }
            let s = self.series.entry(k.clone()).or_insert_with(|| Series {
                version: r.version,
                path: r.path.clone(),
                quota: r.quota,
                pids: Vec::new(),
                readings: VecDeque::new(),
            });
            (s.quota, s.pids) = (r.quota, r.pids.clone());
            if s.readings.back().is_some_and(|(_, last)| r.stat.nr_periods < last.nr_periods) {
                s.readings.clear(); // removed and made again under the same path
            }
            s.readings.push_back((now_ns, r.stat));
            while s.readings.len() > 2 && s.readings[1].0 + 2 * window_ns < now_ns {
                s.readings.pop_front();
            }
            present.insert(k);
        }
        self.series.retain(|k, _| present.contains(k));
        self.onsets.retain(|k, _| present.contains(k));
        self.profiles.retain(|k, _| present.contains(k));

        let mut throttled: Vec<(Arc<str>, Window)> = self
            .series
            .iter()
            .filter_map(|(k, s)| Some((k.clone(), window(&s.readings, window_ns)?)))
            .filter(|(_, w)| w.is_throttled(t))
            .collect();
        self.onsets.retain(|k, _| throttled.iter().any(|(t, _)| t == k));
        throttled.sort_by(|a, b| b.1.share().total_cmp(&a.1.share()).then(a.0.cmp(&b.0)));
        throttled.truncate(MAX_FINDINGS);
        throttled
            .into_iter()
            .map(|(k, w)| {
                let onset = *self.onsets.entry(k.clone()).or_insert(w.from_ns);
                self.active(&k, w, onset, t.throttle_critical_share)
            })
            .collect()
    }

    /// What the cgroup's processes ran during `w` (seconds overlapping it), its descendants'
    /// included: its quota limits them all.
    fn profile(&self, key: &str, w: &Window) -> Profile {
        let (from, to) = (w.from_ns / NS_PER_SEC, w.to_ns / NS_PER_SEC);
        let below = if key.ends_with('/') { key.to_string() } else { format!("{key}/") };
        let mut p = Profile::default();
        let buckets = self
            .profiles
            .iter()
            .filter(|(k, _)| &***k == key || k.starts_with(&below))
            .flat_map(|(_, b)| b)
            .filter(|b| (from..=to).contains(&b.second));
        for b in buckets {
            p.samples += b.samples;
            for (stack, n) in b.stacks.values() {
                *p.stacks.entry(stack.clone()).or_default() += n;
            }
            for (thread, (n, workload)) in &b.threads {
                p.threads.entry(thread.clone()).or_insert_with(|| (0, workload.clone())).0 += n;
            }
        }
        p
    }

    fn active(&self, key: &Arc<str>, w: Window, onset: u64, critical_share: f64) -> Active {
        let s = &self.series[key];
        let p = self.profile(key, &w);
        let threads = p.top_threads(3);
        let functions = p.top_functions(3);
        let stacks = p.top_stacks(3);
        let share_of = |n: u64| percent(n as f64 / p.samples.max(1) as f64);
        let identity = identify(&s.path, &threads);
        let in_pod = identity.pod_uid.is_some() || identity.pod_name.is_some();
        let who = identity.describe();
        let who = if who.is_empty() { who } else { format!(" ({who})") };
        let span_s = (w.to_ns - w.from_ns) as f64 / 1e9;
        let quota = s.quota;
        let mut summary = format!(
            "cgroup {key}{who} throttled in {} of its CPU periods over {span_s:.0} s ({} of {}; its threads waited \
             {:.1} s throttled) by its quota of {:.2} CPU ({} ms per {} ms)",
            percent(w.share()),
            w.throttled,
            w.periods,
            w.throttled_ns as f64 / 1e9,
            quota.cpus(),
            quota.quota_us / 1000,
            quota.period_us / 1000,
        );
        if threads.is_empty() {
            summary.push_str(&format!("; {} processes in it, none sampled in the window", s.pids.len()));
        } else {
            let ran: Vec<String> = threads.iter().map(|t| format!("{} {}", t.who(""), share_of(t.samples))).collect();
            let hot: Vec<String> = functions.iter().map(|(f, n)| format!("{f} {}", share_of(*n))).collect();
            summary.push_str(&format!("; it ran {}; hottest functions: {}", ran.join(", "), hot.join(", ")));
        }
        let id = super::finding::finding_id_of(Kind::CfsThrottling, None, Some(&subject(key)), onset);
        summary.push_str("; next: ");
        summary.push_str(&next_steps(s, threads.first(), in_pod, &id));
        let mut evidence = json!({
            "cgroup": &**key,
            "path": s.path,
            "cgroup_version": match s.version { Version::V1 => 1, Version::V2 => 2 },
            "quota_us": quota.quota_us,
            "period_us": quota.period_us,
            "quota_cpus": quota.cpus(),
            "window_secs": span_s,
            "periods": w.periods,
            "throttled_periods": w.throttled,
            "throttled_share": w.share(),
            "throttled_seconds": w.throttled_ns as f64 / 1e9,
            "pids": s.pids.iter().take(50).collect::<Vec<_>>(),
            "processes_in_cgroup": s.pids.len(),
            "samples": p.samples,
            "top_processes": threads.iter().map(Top::json).collect::<Vec<_>>(),
            "top_functions": functions.iter().map(|(f, n)| json!({"function": &**f, "samples": n})).collect::<Vec<_>>(),
            "top_stacks": stacks.iter().map(|(s, n)| json!({"stack": s, "samples": n})).collect::<Vec<_>>(),
        });
        // The cgroup's own identity (pod, namespace, container, unit), as labels take it.
        for (k, v) in identity.fields() {
            evidence[k] = json!(v);
        }
        Active {
            kind: Kind::CfsThrottling,
            cpu: None,
            subject: Some(subject(key)),
            onset_ns: onset,
            severity: if w.share() >= critical_share { Severity::Critical } else { Severity::Warning },
            summary,
            evidence,
        }
    }
}

/// What a finding's id carries to tell cgroups apart: the cgroup's last path component and a
/// hash of the whole key (`busy-3f2a9c01`).
fn subject(key: &str) -> String {
    let leaf = key.rsplit(['/', ':']).find(|s| !s.is_empty()).unwrap_or("root");
    let leaf: String = leaf
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' { c } else { '_' })
        .take(40)
        .collect();
    // FNV-1a: stable across runs and versions (std's hasher is not).
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    format!("{leaf}-{:08x}", hash as u32)
}

/// What the cgroup is, from its path and the identity of its processes (which know the
/// kubelet's names): a container, a pod, a unit, or nothing known.
pub(crate) fn identify(path: &str, threads: &[Top]) -> crate::identity::Identity {
    let from_path = crate::identity::cgroup::parse_path(path);
    let same_pod = |i: &crate::identity::Identity| {
        from_path.pod_uid.is_none() || i.pod_uid.as_deref() == from_path.pod_uid.as_deref()
    };
    let mut id = threads.iter().filter_map(Top::workload).find(same_pod).unwrap_or_default();
    if from_path.container_id.is_none() && from_path.pod_uid.is_some() {
        // A pod's cgroup (its quota is the sum of its containers'): the pod, not one container.
        (id.container_name, id.container_id, id.runtime) = (None, None, Default::default());
    }
    if id.pod_uid.is_none() && id.pod_name.is_none() {
        id.pod_uid = from_path.pod_uid.map(Arc::from);
    }
    if id.container_id.is_none() && id.container_name.is_none() && from_path.container_id.is_some() {
        id.container_id = from_path.container_id.map(Arc::from);
    }
    if id.pod_uid.is_some() || id.container_id.is_some() {
        id.unit = None;
    } else if id.unit.is_none() {
        id.unit = from_path.unit.map(Arc::from);
    }
    id
}

/// What to look at next: the quota (where it is set) and the busiest thread's profile.
fn next_steps(s: &Series, top: Option<&Top>, in_pod: bool, id: &str) -> String {
    let q = s.quota;
    let raise = if in_pod {
        format!(
            "if the work is expected, raise the pod's resources.limits.cpu (now {}m)",
            q.quota_us * 1000 / q.period_us.max(1)
        )
    } else {
        match s.version {
            Version::V1 => {
                format!("if the work is expected, raise cpu.cfs_quota_us (now {} per {} us)", q.quota_us, q.period_us)
            }
            Version::V2 => format!("if the work is expected, raise cpu.max (now \"{} {}\")", q.quota_us, q.period_us),
        }
    };
    match top {
        Some(t) => {
            format!("{raise}; else see what {} burns: profiler flamegraph --around {id} --pid {}", t.comm, t.pid)
        }
        None => raise,
    }
}

#[derive(Debug, Default)]
struct Profile {
    samples: u64,
    stacks: FxHashMap<Arc<Stack>, u64>,
    threads: FxHashMap<(u32, Arc<str>), (u64, Arc<str>)>,
}

impl Profile {
    fn top_threads(&self, n: usize) -> Vec<Top> {
        let mut v: Vec<Top> = self
            .threads
            .iter()
            .map(|((pid, comm), (samples, workload))| Top {
                comm: comm.clone(),
                pid: *pid,
                samples: *samples,
                workload: workload.clone(),
            })
            .collect();
        v.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.pid.cmp(&b.pid)).then(a.comm.cmp(&b.comm)));
        v.truncate(n);
        v
    }

    /// Functions by self samples (the stack's leaf).
    fn top_functions(&self, n: usize) -> Vec<(Arc<str>, u64)> {
        let mut by: FxHashMap<Arc<str>, u64> = FxHashMap::default();
        for (stack, count) in &self.stacks {
            if let Some(leaf) = stack.frames.last() {
                *by.entry(leaf.clone()).or_default() += count;
            }
        }
        let mut v: Vec<_> = by.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(n);
        v
    }

    /// Whole stacks, folded (`root;...;leaf`).
    fn top_stacks(&self, n: usize) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .stacks
            .iter()
            .map(|(s, c)| (s.frames.iter().map(|f| &**f).collect::<Vec<_>>().join(";"), *c))
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(n);
        v
    }
}

#[cfg(test)]
mod tests;
