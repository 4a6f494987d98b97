//! What the detectors report and the daemon keeps: a finding's kind and severity, the
//! condition a detector found true in one second ([`Active`]), the [`Finding`] it opens or
//! extends, and the id that names it. Apart from the engine that turns one into the other, so
//! that every detector and every reader of findings imports the model, not the engine.

use serde::{Deserialize, Serialize};

use crate::store::format::NS_PER_SEC;

/// Which check of the engine judges a kind: the engine closes a kind's open findings only
/// after the check that judges it ran without finding it true.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judged {
    /// Each evaluated second of samples, NET_RX, run-queue, reclaim and GPU figures
    /// (`Engine::tick`).
    EachSecond,
    /// The count of dying memory cgroups (`Engine::check_zombies`).
    ZombieCount,
    /// The cgroups' CPU statistics (`Engine::check_throttle`).
    ThrottleScan,
    /// Each drain of the CUDA probes (`Engine::check_cuda`).
    CudaDrain,
    /// Each drain of the off-CPU counts (`Engine::check_offcpu`).
    OffCpuDrain,
    /// Not by the engine: written as it is seen (a fatal Xid, `gpu::xid`).
    AsSeen,
}

/// Lists the finding kinds once: each variant with its name (in ids, on `/metrics`, in the
/// journal: serde writes the same) and the check that judges it; [`Kind::ALL`],
/// [`Kind::name`] and [`Kind::judged`] are made from the list.
macro_rules! kinds {
    ($($(#[doc = $doc:literal])+ $kind:ident = $name:literal, $judged:ident;)+) => {
        /// What a finding is about.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum Kind {
            $($(#[doc = $doc])+ #[serde(rename = $name)] $kind,)+
        }

        impl Kind {
            /// Every kind, in declaration order (metrics list them all, open or not).
            pub const ALL: [Kind; [$($name),+].len()] = [$(Kind::$kind),+];

            pub fn name(self) -> &'static str {
                match self {
                    $(Kind::$kind => $name,)+
                }
            }

            pub fn judged(self) -> Judged {
                match self {
                    $(Kind::$kind => Judged::$judged,)+
                }
            }
        }
    };
}

kinds! {
    /// A CPU saturated while the machine as a whole looks fine (`saturation`).
    SaturatedCore = "saturated-core", EachSecond;
    /// One kernel function holding a CPU (`hotfunc`).
    HotKernelFunction = "hot-kernel-function", EachSecond;
    /// NET_RX softirq or NAPI work starved on a CPU (`netrx`).
    NetrxStarvation = "netrx-starvation", EachSecond;
    /// Dying memory cgroups piling up (`zombies`).
    ZombieMemcgs = "zombie-memcgs", ZombieCount;
    /// A cgroup throttled by its CPU quota (`throttle`).
    CfsThrottling = "cfs-throttling", ThrottleScan;
    /// One kernel spin-lock slow path holding several CPUs (`lockspin`).
    LockSpinning = "lock-spinning", EachSecond;
    /// A runnable thread kept off a CPU for long (`runq`).
    RunqStarvation = "runq-starvation", EachSecond;
    /// A CPU's tasks stalled in reclaim or compaction (`reclaim`).
    ReclaimStall = "reclaim-stall", EachSecond;
    /// A GPU idle while its feeders keep CPUs saturated (`gpu`).
    GpuStarved = "gpu-starved", EachSecond;
    /// A GPU idle while the process holding it keeps a core busy launching (`gpu`).
    GpuLaunchBound = "gpu-launch-bound", EachSecond;
    /// A busy GPU with its clocks held down (`gpu`).
    GpuThrottled = "gpu-throttled", EachSecond;
    /// A GPU that reads busy while GPM says its SMs mostly idle: kernels too small (`gpu`).
    GpuUnderused = "gpu-underused", EachSecond;
    /// A fatal Xid in the kernel log or NVML's events (`gpu::xid`).
    GpuFault = "gpu-fault", AsSeen;
    /// A thread blocked in CUDA synchronisation while its GPU idles (`cuda`).
    GpuSyncStall = "gpu-sync-stall", CudaDrain;
    /// One rank of a job with its GPU busy while the others wait in synchronisation (`cuda`).
    GpuStraggler = "gpu-straggler", CudaDrain;
    /// A process blocked in I/O half the time while the CPUs idle (`iostall`).
    IoStall = "io-stall", OffCpuDrain;
}

impl Kind {
    /// The kind named `name` ([`Kind::name`]).
    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_its_name_and_serde_writes_the_same() {
        for kind in Kind::ALL {
            assert_eq!(Kind::parse(kind.name()), Some(kind));
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.name()));
            assert_eq!(serde_json::from_str::<Kind>(&json).unwrap(), kind);
        }
        let mut names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Kind::ALL.len(), "names are unique");
        assert_eq!(Kind::parse("saturated core"), None);
        assert_eq!(Kind::ALL[0], Kind::SaturatedCore, "in declaration order");
    }
}
