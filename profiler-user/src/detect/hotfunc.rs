//! Detector 2: one kernel function holding a CPU. Over a sliding window, each kernel function's
//! inclusive share of a CPU's ticks; the finding names the most specific function that holds
//! the share (the deepest: fewest ticks among those above the threshold), never a generic entry
//! point. Known offenders get a lower threshold and a hint of the known cause.

use std::{collections::VecDeque, sync::Arc};

use rustc_hash::FxHashMap;

use serde_json::json;

use super::{
    finding::{Active, Kind, Severity},
    seconds::{Machine, Second, Top, percent, top_processes},
    thresholds::Thresholds,
};

/// Entry points and dispatchers that sit above whatever the kernel is really doing: those of
/// every architecture, then the running one's entry code (`ARCH_GENERIC`).
const GENERIC: &[&str] = &[
    "syscall_exit_to_user_mode",
    "irq_exit_rcu",
    "__irq_exit_rcu",
    "handle_softirqs",
    "__do_softirq",
    "ret_from_fork",
    "kthread",
    "worker_thread",
    "process_one_work",
    "ksys_read",
    "ksys_write",
    "vfs_read",
    "vfs_write",
    "do_sys_openat2",
    "seq_read",
    "seq_read_iter",
    "kernfs_fop_read_iter",
    "do_idle",
    "cpu_startup_entry",
];

/// x86_64: syscall, interrupt and page-fault entry, and CPU bring-up.
#[cfg(target_arch = "x86_64")]
const ARCH_GENERIC: &[&str] = &[
    "entry_SYSCALL_64",
    "entry_SYSCALL_64_after_hwframe",
    "do_syscall_64",
    "x64_sys_call",
    "asm_sysvec_apic_timer_interrupt",
    "sysvec_apic_timer_interrupt",
    "asm_common_interrupt",
    "common_interrupt",
    "asm_exc_page_fault",
    "exc_page_fault",
    "do_user_addr_fault",
    "ret_from_fork_asm",
    "__x64_sys_read",
    "__x64_sys_write",
    "__x64_sys_openat",
    "start_secondary",
    "common_startup_64",
];

/// arm64 (arch/arm64/kernel/entry*.{S,c}): the same roles; compiled, untested (docs/arm64.md).
#[cfg(target_arch = "aarch64")]
const ARCH_GENERIC: &[&str] = &[
    "el0t_64_sync",
    "el0t_64_sync_handler",
    "el0_svc",
    "do_el0_svc",
    "el0_svc_common",
    "invoke_syscall",
    "el0t_64_irq",
    "el0t_64_irq_handler",
    "el0_interrupt",
    "el1h_64_irq",
    "el1h_64_irq_handler",
    "el1_interrupt",
    "call_on_irq_stack",
    "do_interrupt_handler",
    "gic_handle_irq",
    "el0_da",
    "el0_ia",
    "do_mem_abort",
    "do_translation_fault",
    "do_page_fault",
    "__arm64_sys_read",
    "__arm64_sys_write",
    "__arm64_sys_openat",
    "secondary_start_kernel",
    "cpu_do_idle",
    "arch_cpu_idle",
];

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const ARCH_GENERIC: &[&str] = &[];

/// An entry point or dispatcher, never the finding's function.
pub fn is_generic(name: &str) -> bool {
    GENERIC.contains(&name) || ARCH_GENERIC.contains(&name)
}

/// Known offenders: a lower threshold, and what usually causes them.
pub const WATCHLIST: &[(&str, &str)] = &[
    (
        "mem_cgroup_node_nr_lru_pages",
        "walks every memory cgroup, dying ones included: leaked (zombie) memcgs make each memory.stat read slow; see zombie-memcgs findings",
    ),
    (
        "mem_cgroup_nr_lru_pages",
        "walks every memory cgroup, dying ones included: leaked (zombie) memcgs make each memory.stat read slow; see zombie-memcgs findings",
    ),
    ("memcg1_stat_format", "memory.stat of a cgroup v1 hierarchy with many (possibly dying) memcgs"),
    ("memcg_stat_show", "memory.stat of a hierarchy with many (possibly dying) memcgs"),
    ("mem_cgroup_css_rstat_flush", "memcg statistics flush: many cgroups, or stats read very often"),
    ("cgroup_rstat_flush_locked", "cgroup statistics flush: many cgroups, or stats read very often"),
    ("css_rstat_flush", "cgroup statistics flush: many cgroups, or stats read very often"),
    ("shrink_node", "memory reclaim on this CPU"),
    ("native_queued_spin_lock_slowpath", "spinlock contention"),
    ("queued_spin_lock_slowpath", "spinlock contention"),
];

fn hint(name: &str) -> Option<&'static str> {
    WATCHLIST.iter().find(|(n, _)| *n == name).map(|(_, h)| *h)
}

#[derive(Debug, Default)]
pub struct HotFunc {
    /// Per CPU: start of the window in which the current hot spell was first seen.
    since: Vec<Option<u64>>,
    /// Each second of the window counted once, by its start: the window slides one second at a
    /// time, and recounting all of it every second was most of the daemon's per-sample cost.
    counted: VecDeque<(u64, Vec<Counts>)>,
}

/// Per kernel function: inclusive ticks and the sum of its depths.
type Counts = FxHashMap<Arc<str>, Count>;

#[derive(Debug, Default, Clone, Copy)]
struct Count {
    ticks: u64,
    depth_sum: u64,
}

/// Per CPU, the inclusive counts of one second's busy ticks.
fn count_second(s: &Second) -> Vec<Counts> {
    s.cpus
        .iter()
        .map(|c| {
            let mut counts = Counts::default();
            for tick in &c.busy {
                let kernel = &tick.stack.frames[tick.stack.user_len..];
                for (depth, f) in kernel.iter().enumerate() {
                    // Inclusive: a recursive function counts once per tick.
                    if kernel[..depth].iter().any(|g| g == f) {
                        continue;
                    }
                    let e = counts.entry(f.clone()).or_default();
                    e.ticks += 1;
                    e.depth_sum += depth as u64;
                }
            }
            counts
        })
        .collect()
}

impl HotFunc {
    pub fn evaluate(&mut self, history: &VecDeque<Second>, m: Machine, t: &Thresholds) -> Vec<Active> {
        let w = (t.hot_window_secs.max(1) as usize).min(history.len());
        if w == 0 {
            return Vec::new();
        }
        let window: Vec<&Second> = history.iter().skip(history.len() - w).collect();
        let window_start = window[0].start_ns;
        let cpus = window.last().map_or(0, |s| s.cpus.len());
        self.since.resize(cpus, None);
        // Keep the counts of exactly the window's seconds, counting only the new ones.
        self.counted.retain(|(start, _)| window.iter().any(|s| s.start_ns == *start));
        for s in &window {
            if !self.counted.iter().any(|(start, _)| *start == s.start_ns) {
                self.counted.push_back((s.start_ns, count_second(s)));
            }
        }
        let mut out = Vec::new();
        for cpu in 0..cpus {
            let ticks = || window.iter().filter_map(|s| s.cpus.get(cpu)).flat_map(|c| c.busy.iter());
            let busy = window.iter().filter_map(|s| s.cpus.get(cpu)).map(|c| c.busy.len() as u64).sum::<u64>();
            let idle: u64 = window.iter().filter_map(|s| s.cpus.get(cpu)).map(|c| u64::from(c.idle)).sum();
            // Over the ticks the CPU had, or should have had: a nearly idle CPU with a few
            // samples all in one function is not "held" by it.
            let denom = (busy + idle).max(m.frequency_hz * u64::from(t.hot_window_secs.max(1))) as f64;
            let mut counts: FxHashMap<&str, Count> = FxHashMap::default();
            for (_, per_cpu) in &self.counted {
                for (f, c) in per_cpu.get(cpu).into_iter().flatten() {
                    let e = counts.entry(&**f).or_default();
                    e.ticks += c.ticks;
                    e.depth_sum += c.depth_sum;
                }
            }
            let pick = counts
                .iter()
                .filter(|(name, c)| {
                    let share = c.ticks as f64 / denom;
                    // A `[softirq:NAME]` marker is a context, not a function: what runs under it is.
                    !is_generic(name)
                        && !crate::exec_context::Context::is_marker(name)
                        && (share >= t.hot_share || (hint(name).is_some() && share >= t.watch_share))
                })
                .min_by(|a, b| {
                    // Fewest ticks = most specific; equal ticks: the deeper one.
                    let avg = |c: &Count| c.depth_sum as f64 / c.ticks.max(1) as f64;
                    a.1.ticks.cmp(&b.1.ticks).then(avg(b.1).total_cmp(&avg(a.1))).then(a.0.cmp(b.0))
                });
            let Some((&name, c)) = pick else {
                self.since[cpu] = None;
                continue;
            };
            let share = c.ticks as f64 / denom;
            // Onset: the first second of the window in which the function alone held its
            // threshold of the CPU (the window may reach back before it started).
            let threshold = if hint(name).is_some() { t.watch_share } else { t.hot_share };
            let first_hot = window
                .iter()
                .find(|s| {
                    s.cpus.get(cpu).is_some_and(|c| {
                        let n = c.busy.iter().filter(|t| t.stack.kernel().iter().any(|f| &**f == name)).count();
                        n as f64 >= threshold * m.frequency_hz as f64
                    })
                })
                .map_or(window_start, |s| s.start_ns);
            let onset = *self.since[cpu].get_or_insert(first_hot);
            let holders = top_processes(ticks().filter(|t| t.stack.kernel().iter().any(|f| &**f == name)), 3);
            let holders_text: Vec<String> =
                holders.iter().map(|t| format!("{} {}", t.who(""), percent(t.samples as f64 / denom))).collect();
            let mut summary =
                format!("{name} holds {} of CPU {cpu} over {w} s, in {}", percent(share), holders_text.join(", "));
            if let Some(h) = hint(name) {
                summary.push_str(&format!("; known offender: {h}"));
            }
            out.push(Active {
                kind: Kind::HotKernelFunction,
                cpu: Some(cpu as u32),
                subject: None,
                onset_ns: onset,
                severity: if share >= t.hot_critical_share { Severity::Critical } else { Severity::Warning },
                summary,
                evidence: json!({
                    "function": name,
                    "share": share,
                    "window_secs": w,
                    "watchlist": hint(name).is_some(),
                    "processes": holders.iter().map(Top::json).collect::<Vec<_>>(),
                }),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        detect::{CpuSecond, Tick},
        model::Stack,
        store::format::NS_PER_SEC,
    };

    /// The syscall dispatcher of the architecture the tests run on (a generic entry point).
    #[cfg(not(target_arch = "aarch64"))]
    const SYSCALL: &str = "do_syscall_64";
    #[cfg(target_arch = "aarch64")]
    const SYSCALL: &str = "invoke_syscall";

    fn stack(user: &[&str], kernel: &[&str]) -> Arc<Stack> {
        Arc::new(Stack::new(user.iter().chain(kernel).map(|f| Arc::from(*f)).collect(), user.len()))
    }

    fn seconds(n: u64, per_second: &[(Arc<Stack>, usize)]) -> VecDeque<Second> {
        (0..n)
            .map(|i| Second {
                start_ns: i * NS_PER_SEC,
                cpus: vec![
                    CpuSecond::default(),
                    CpuSecond {
                        busy: per_second
                            .iter()
                            .flat_map(|(s, k)| {
                                (0..*k).map(|_| Tick {
                                    stack: s.clone(),
                                    pid: 42,
                                    comm: Arc::from("cat"),
                                    workload: Default::default(),
                                })
                            })
                            .collect(),
                        ..Default::default()
                    },
                ],
            })
            .collect()
    }

    const M: Machine = Machine { cpus: 2, frequency_hz: 100 };

    #[test]
    fn names_the_deepest_function_holding_the_share_not_the_entry_point() {
        let read = ["entry_SYSCALL_64_after_hwframe", "do_syscall_64", "ksys_read", "vfs_read", "seq_read_iter"];
        let hot = stack(&["main", "read"], &[&read[..], &["memcg_stat_show", "mem_cgroup_node_nr_lru_pages"]].concat());
        let other = stack(&["main", "read"], &[&read[..], &["memcg_stat_show", "seq_printf"]].concat());
        let h = seconds(5, &[(hot, 70), (other, 25)]);
        let out = HotFunc::default().evaluate(&h, M, &Thresholds::default());
        assert_eq!(out.len(), 1);
        let a = &out[0];
        assert_eq!(a.evidence["function"], "mem_cgroup_node_nr_lru_pages");
        assert!(
            a.summary.starts_with("mem_cgroup_node_nr_lru_pages holds 70 % of CPU 1 over 5 s, in cat (pid 42)"),
            "{}",
            a.summary
        );
        assert!(a.summary.contains("known offender"), "{}", a.summary);
    }

    #[test]
    fn entry_points_of_this_architecture_are_generic() {
        assert!(is_generic("do_idle") && is_generic("handle_softirqs"));
        #[cfg(target_arch = "x86_64")]
        assert!(is_generic("entry_SYSCALL_64") && !is_generic("el0_svc"));
        #[cfg(target_arch = "aarch64")]
        assert!(is_generic("el0_svc") && !is_generic("entry_SYSCALL_64"));
        assert!(!is_generic("mem_cgroup_node_nr_lru_pages"));
    }

    #[test]
    fn below_the_threshold_or_only_generic_nothing() {
        let spread: Vec<_> = (0..10).map(|i| (stack(&["main"], &[SYSCALL, &format!("f{i}")]), 9)).collect();
        assert!(HotFunc::default().evaluate(&seconds(5, &spread), M, &Thresholds::default()).is_empty());
        // A user-space hog holds no kernel function.
        let user = seconds(5, &[(stack(&["main", "spin"], &[]), 100)]);
        assert!(HotFunc::default().evaluate(&user, M, &Thresholds::default()).is_empty());
        // A nearly idle CPU whose few ticks are all in one function is not held by it.
        let few = seconds(5, &[(stack(&["main"], &["clear_user"]), 3)]);
        assert!(HotFunc::default().evaluate(&few, M, &Thresholds::default()).is_empty());
    }

    #[test]
    fn watchlist_functions_fire_at_the_lower_share() {
        let hot = stack(&["kubelet"], &[SYSCALL, "mem_cgroup_nr_lru_pages"]);
        let rest = stack(&["kubelet", "gc"], &[]);
        let h = seconds(5, &[(hot, 25), (rest, 75)]);
        let out = HotFunc::default().evaluate(&h, M, &Thresholds::default());
        assert_eq!(out[0].evidence["function"], "mem_cgroup_nr_lru_pages");
        let plain = stack(&["x"], &[SYSCALL, "some_function"]);
        assert!(HotFunc::default().evaluate(&seconds(5, &[(plain, 25)]), M, &Thresholds::default()).is_empty());
    }
}
