//! What the detectors report and the daemon keeps: a finding's kind and severity, the
//! condition a detector found true in one second ([`Active`]), the [`Finding`] it opens or
//! extends, and the id that names it. Apart from the engine that turns one into the other, so
//! that every detector and every reader of findings imports the model, not the engine.

use serde::{Deserialize, Serialize};

use crate::store::format::NS_PER_SEC;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    SaturatedCore,
    HotKernelFunction,
    NetrxStarvation,
    ZombieMemcgs,
    CfsThrottling,
    LockSpinning,
    RunqStarvation,
    ReclaimStall,
    GpuStarved,
    GpuLaunchBound,
    GpuThrottled,
    GpuFault,
    GpuSyncStall,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::SaturatedCore => "saturated-core",
            Kind::HotKernelFunction => "hot-kernel-function",
            Kind::NetrxStarvation => "netrx-starvation",
            Kind::ZombieMemcgs => "zombie-memcgs",
            Kind::CfsThrottling => "cfs-throttling",
            Kind::LockSpinning => "lock-spinning",
            Kind::RunqStarvation => "runq-starvation",
            Kind::ReclaimStall => "reclaim-stall",
            Kind::GpuStarved => "gpu-starved",
            Kind::GpuLaunchBound => "gpu-launch-bound",
            Kind::GpuThrottled => "gpu-throttled",
            Kind::GpuFault => "gpu-fault",
            Kind::GpuSyncStall => "gpu-sync-stall",
        }
    }

    /// Every kind, in declaration order (metrics list them all, open or not).
    pub const ALL: [Kind; 13] = [
        Kind::SaturatedCore,
        Kind::HotKernelFunction,
        Kind::NetrxStarvation,
        Kind::ZombieMemcgs,
        Kind::CfsThrottling,
        Kind::LockSpinning,
        Kind::RunqStarvation,
        Kind::ReclaimStall,
        Kind::GpuStarved,
        Kind::GpuLaunchBound,
        Kind::GpuThrottled,
        Kind::GpuFault,
        Kind::GpuSyncStall,
    ];
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

impl Severity {
    pub fn name(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

/// What metrics label an open finding with.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Labels {
    pub kind: Kind,
    pub cpu: Option<u32>,
    /// `namespace/name` (or the name, or the pod uid) of the pod the finding is about.
    pub pod: Option<String>,
    pub severity: Severity,
}

/// Something worth a human's attention, on the timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub id: String,
    pub kind: Kind,
    pub start_ns: u64,
    /// `None` while the condition still holds.
    pub end_ns: Option<u64>,
    pub cpu: Option<u32>,
    pub severity: Severity,
    /// One line a human can act on.
    pub summary: String,
    /// The figures behind the summary: function, processes, shares, counts.
    pub evidence: serde_json::Value,
}

impl Finding {
    /// The pod the finding is about: its own (`pod`, `namespace`, `pod_uid` in the evidence:
    /// a throttled pod or container) or that of the first process it names.
    pub fn pod(&self) -> Option<String> {
        let e = &self.evidence;
        let first = ["top_processes", "processes", "held_by"].iter().find_map(|k| e[*k].get(0));
        [e, first.unwrap_or(&serde_json::Value::Null)].into_iter().find_map(|v| {
            let (ns, name, uid) = (v["namespace"].as_str(), v["pod"].as_str(), v["pod_uid"].as_str());
            match (ns, name, uid) {
                (Some(ns), Some(name), _) => Some(format!("{ns}/{name}")),
                (None, Some(name), _) => Some(name.to_string()),
                (_, None, Some(uid)) => Some(uid.to_string()),
                _ => None,
            }
        })
    }
}

/// What a detector found true in the second it evaluated.
#[derive(Debug, Clone, PartialEq)]
pub struct Active {
    pub kind: Kind,
    pub cpu: Option<u32>,
    /// What else tells two findings of one kind apart (a cgroup): part of the finding's id.
    pub subject: Option<String>,
    /// When the condition began (it may have been confirmed only later).
    pub onset_ns: u64,
    pub severity: Severity,
    pub summary: String,
    pub evidence: serde_json::Value,
}

/// `saturated-core-cpu1-20261121T101502`: kind, CPU, and the second it began (UTC).
pub fn finding_id(kind: Kind, cpu: Option<u32>, onset_ns: u64) -> String {
    finding_id_of(kind, cpu, None, onset_ns)
}

/// As [`finding_id`], with what tells findings of one kind apart (`cfs-throttling-busy-3f2a9c01-20261121T101502`).
pub fn finding_id_of(kind: Kind, cpu: Option<u32>, subject: Option<&str>, onset_ns: u64) -> String {
    let when = finding_id_time(onset_ns);
    let subject = subject.map_or(String::new(), |s| format!("{s}-"));
    match cpu {
        Some(c) => format!("{}-cpu{c}-{subject}{when}", kind.name()),
        None => format!("{}-{subject}{when}", kind.name()),
    }
}

/// `20261121T101502`: the UTC second of `ns`, as ids show it.
pub fn finding_id_time(ns: u64) -> String {
    jiff::Timestamp::from_nanosecond(ns as i128)
        .map(|t| t.strftime("%Y%m%dT%H%M%S").to_string())
        .unwrap_or_else(|_| (ns / NS_PER_SEC).to_string())
}
