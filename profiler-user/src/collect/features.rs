//! What the daemon needs from the kernel, the first Linux release that has each piece, and a
//! probe for it at start (docs/kernels.md has the same table for readers).
//!
//! The decision rests on the probes, not on the version number: distributions backport BPF
//! features (RHEL 8's 4.18 has the ring buffer), and a kernel can be built without one (BTF).
//! The release is only quoted in the sentence, so that the reader knows what to upgrade to.
//! A missing required feature stops the daemon with one sentence naming it; a missing optional
//! one is logged with what is lost, and the daemon runs without it.

use aya::{
    maps::MapType,
    programs::ProgramType,
    sys::{BpfHelper, is_helper_supported, is_map_supported, is_program_supported},
};

/// How a feature is looked for.
#[derive(Debug, Clone, Copy)]
pub enum Probe {
    Program(ProgramType),
    Map(MapType),
    /// A helper callable from a `perf_event` program.
    Helper(BpfHelper),
    /// A file the kernel exposes (`/sys/kernel/btf/vmlinux`).
    Path(&'static str),
    /// A tracepoint, by category and name, in tracefs.
    Tracepoint(&'static str, &'static str),
}

/// One thing the daemon uses from the kernel.
#[derive(Debug)]
pub struct Feature {
    pub name: &'static str,
    /// The first mainline release that has it (major, minor).
    pub since: (u32, u32),
    pub used_for: &'static str,
    /// `None`: the daemon cannot run without it. `Some(lost)`: what is lost without it.
    pub without: Option<&'static str>,
    pub probe: Probe,
}

pub const FEATURES: &[Feature] = &[
    Feature {
        name: "perf_event BPF programs",
        since: (4, 9),
        used_for: "sampling each CPU on its cpu-clock",
        without: None,
        probe: Probe::Program(ProgramType::PerfEvent),
    },
    Feature {
        name: "the BPF ring buffer",
        since: (5, 8),
        used_for: "delivering samples and events",
        without: None,
        probe: Probe::Map(MapType::RingBuf),
    },
    Feature {
        name: "bpf_get_stack",
        since: (4, 18),
        used_for: "kernel and user stacks (BPF_F_USER_STACK)",
        without: None,
        probe: Probe::Helper(BpfHelper::BPF_FUNC_get_stack),
    },
    Feature {
        name: "bpf_ktime_get_boot_ns",
        since: (5, 8),
        used_for: "sample times that count suspend",
        without: None,
        probe: Probe::Helper(BpfHelper::BPF_FUNC_ktime_get_boot_ns),
    },
    Feature {
        name: "bpf_get_current_cgroup_id",
        since: (4, 18),
        used_for: "the cgroup (pod, container, unit) of each sample",
        without: None,
        probe: Probe::Helper(BpfHelper::BPF_FUNC_get_current_cgroup_id),
    },
    Feature {
        name: "per-CPU array maps",
        since: (4, 6),
        used_for: "counters and the per-CPU record buffer",
        without: None,
        probe: Probe::Map(MapType::PerCpuArray),
    },
    Feature {
        name: "tail calls (program arrays)",
        since: (4, 2),
        used_for: "unwind-table walks and Python frames",
        without: Some("user stacks of code without frame pointers are cut short and Python frames are missing"),
        probe: Probe::Map(MapType::ProgramArray),
    },
    Feature {
        name: "bpf_probe_read_user",
        since: (5, 5),
        used_for: "unwind-table walks and Python frames",
        without: Some("user stacks of code without frame pointers are cut short and Python frames are missing"),
        probe: Probe::Helper(BpfHelper::BPF_FUNC_probe_read_user),
    },
    Feature {
        name: "kernel BTF (/sys/kernel/btf/vmlinux)",
        since: (5, 4),
        used_for: "bpf_get_current_task_btf, for user registers when a sample lands in the kernel",
        without: Some("samples taken in the kernel get no table-walked user stack"),
        probe: Probe::Path("/sys/kernel/btf/vmlinux"),
    },
    Feature {
        name: "bpf_task_pt_regs",
        since: (5, 15),
        used_for: "user registers when a sample lands in the kernel",
        without: Some("samples taken in the kernel get no table-walked user stack"),
        probe: Probe::Helper(BpfHelper::BPF_FUNC_task_pt_regs),
    },
    Feature {
        name: "tracepoint irq:softirq_raise",
        since: (2, 6),
        used_for: "the NET_RX starvation detector",
        without: Some("no NET_RX/NAPI starvation detection"),
        probe: Probe::Tracepoint("irq", "softirq_raise"),
    },
    Feature {
        name: "tracepoint irq:softirq_entry",
        since: (2, 6),
        used_for: "the NET_RX starvation detector",
        without: Some("no NET_RX/NAPI starvation detection"),
        probe: Probe::Tracepoint("irq", "softirq_entry"),
    },
    Feature {
        name: "tracepoint napi:napi_poll (work, budget)",
        since: (4, 7),
        used_for: "the NAPI starvation detector",
        without: Some("no NET_RX/NAPI starvation detection"),
        probe: Probe::Tracepoint("napi", "napi_poll"),
    },
    Feature {
        name: "tracepoints cgroup:cgroup_mkdir/rmdir/release",
        since: (4, 13),
        used_for: "attributing zombie cgroups",
        without: Some("zombie cgroups are counted but not attributed"),
        probe: Probe::Tracepoint("cgroup", "cgroup_release"),
    },
    Feature {
        name: "tracepoints sched:sched_wakeup/sched_switch",
        since: (2, 6),
        used_for: "the run-queue starvation detector",
        without: Some("no run-queue starvation detection"),
        probe: Probe::Tracepoint("sched", "sched_switch"),
    },
    Feature {
        name: "tracepoints vmscan:mm_vmscan_memcg_reclaim_begin/end",
        since: (2, 6),
        used_for: "the reclaim-stall detector",
        without: Some("no reclaim-stall detection"),
        probe: Probe::Tracepoint("vmscan", "mm_vmscan_memcg_reclaim_begin"),
    },
    Feature {
        name: "tracepoint sched:sched_process_exec",
        since: (3, 4),
        used_for: "reading a new program's mappings at exec",
        without: Some("processes that live only milliseconds may show unnamed frames"),
        probe: Probe::Tracepoint("sched", "sched_process_exec"),
    },
];

/// A probe's answer: `None` when the probe itself could not run (then nothing is concluded:
/// loading will say what is wrong, e.g. a missing capability).
pub type Answer = Option<bool>;

pub fn run_probe(probe: Probe) -> Answer {
    match probe {
        Probe::Program(t) => is_program_supported(t).ok(),
        Probe::Map(t) => is_map_supported(t).ok(),
        Probe::Helper(h) => is_helper_supported(ProgramType::PerfEvent, h).ok(),
        Probe::Path(p) => Some(std::path::Path::new(p).exists()),
        Probe::Tracepoint(cat, name) => {
            let root = super::tracefs::root()?;
            Some(root.join("events").join(cat).join(name).is_dir())
        }
    }
}

/// What the probes found.
#[derive(Debug)]
pub struct Report {
    /// `uname -r`.
    pub release: String,
    pub missing: Vec<&'static Feature>,
}

/// Probes every feature of [`FEATURES`].
pub fn probe() -> Report {
    evaluate(kernel_release(), FEATURES, run_probe)
}

/// The features of `features` that `answer` says are absent.
pub fn evaluate(release: String, features: &'static [Feature], answer: impl Fn(Probe) -> Answer) -> Report {
    let missing = features.iter().filter(|f| answer(f.probe) == Some(false)).collect();
    Report { release, missing }
}

impl Report {
    /// The sentence that stops the daemon, when a required feature is missing.
    pub fn refusal(&self) -> Option<String> {
        let required: Vec<_> = self.missing.iter().filter(|f| f.without.is_none()).collect();
        let newest = required.iter().map(|f| f.since).max()?;
        let named: Vec<String> = required
            .iter()
            .map(|f| format!("{} (Linux {}.{}+, for {})", f.name, f.since.0, f.since.1, f.used_for))
            .collect();
        Some(format!(
            "this kernel (Linux {}) lacks {}: run the profiler on Linux {}.{} or later, or a kernel with these backported",
            self.release,
            named.join(" and "),
            newest.0,
            newest.1
        ))
    }

    /// Missing features the daemon runs without, each with what is lost.
    pub fn degraded(&self) -> impl Iterator<Item = (&'static Feature, &'static str)> + '_ {
        self.missing.iter().filter_map(|f| f.without.map(|lost| (*f, lost)))
    }
}

/// The running kernel's release (`uname -r`), or "unknown".
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map_or_else(|_| "unknown".into(), |s| s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name_of(p: Probe) -> String {
        format!("{p:?}")
    }

    #[test]
    fn all_present_neither_refuses_nor_degrades() {
        let r = evaluate("6.1.0".into(), FEATURES, |_| Some(true));
        assert!(r.missing.is_empty());
        assert_eq!(r.refusal(), None);
        assert_eq!(r.degraded().count(), 0);
    }

    #[test]
    fn no_ring_buffer_refuses_with_one_sentence_naming_it() {
        let r = evaluate("5.4.0-150-generic".into(), FEATURES, |p| Some(!name_of(p).contains("RingBuf")));
        let s = r.refusal().expect("the ring buffer is required");
        assert!(s.contains("Linux 5.4.0-150-generic"), "{s}");
        assert!(s.contains("the BPF ring buffer (Linux 5.8+"), "{s}");
        assert!(s.contains("run the profiler on Linux 5.8 or later"), "{s}");
        assert!(!s.contains('\n'));
    }

    #[test]
    fn several_required_missing_are_all_named_and_the_newest_release_asked_for() {
        let r = evaluate("4.14".into(), FEATURES, |p| {
            Some(!(name_of(p).contains("RingBuf") || name_of(p).contains("get_stack")))
        });
        let s = r.refusal().unwrap();
        assert!(s.contains("the BPF ring buffer") && s.contains("bpf_get_stack"), "{s}");
        assert!(s.contains("on Linux 5.8 or later"), "{s}");
    }

    #[test]
    fn optional_features_degrade_without_refusing() {
        let r = evaluate("5.10".into(), FEATURES, |p| {
            Some(!(name_of(p).contains("task_pt_regs") || name_of(p).contains("napi")))
        });
        assert_eq!(r.refusal(), None);
        let lost: Vec<_> = r.degraded().map(|(f, _)| f.name).collect();
        assert_eq!(lost, ["bpf_task_pt_regs", "tracepoint napi:napi_poll (work, budget)"]);
    }

    #[test]
    fn a_probe_that_cannot_run_concludes_nothing() {
        let r = evaluate("6.1".into(), FEATURES, |_| None);
        assert!(r.missing.is_empty());
    }
}
