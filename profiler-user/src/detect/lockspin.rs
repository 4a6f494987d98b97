//! Detector 6: lock spinning. One kernel spin-lock slow path holding a large share of SEVERAL
//! CPUs at once: many CPUs contend for one lock. One CPU spinning is `hotfunc`'s business (it
//! may be one long holder); several at once is contention, and the finding names the callers
//! that contend (the function right above the lock frames) and the processes.
//!
//! Thresholds (`[detect]`): `lock_share` of each of at least `lock_min_cpus` CPUs over
//! `lock_window_secs`. Defaults 20 % of 2 CPUs over 5 s: a healthy busy machine spends a few
//! percent at most in a spin-lock slow path (contended locks are rare and short), so 20 % on two
//! CPUs at once for 5 s is contention, not noise.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use serde_json::json;

use super::{
    finding::{Active, Kind, Severity},
    seconds::{Machine, Second, Tick, Top, percent, top_processes},
    thresholds::Thresholds,
};

/// Spin-lock slow paths and lock entry points: the single list of lock frames. The finding
/// names the leaf-most of them in a stack (the slow path when it is there, else the
/// `_raw_spin_lock*` entry the sample caught spinning).
const LOCK_FRAMES: &[&str] = &[
    "native_queued_spin_lock_slowpath",
    "queued_spin_lock_slowpath",
    "__pv_queued_spin_lock_slowpath",
    "pv_queued_spin_lock_slowpath",
    "queued_read_lock_slowpath",
    "queued_write_lock_slowpath",
    "do_raw_spin_lock",
    "do_raw_read_lock",
    "do_raw_write_lock",
];

/// `_raw_spin_lock`, `_raw_spin_lock_irqsave`, `_raw_read_lock_bh`...: entry points of every
/// flavour, matched by prefix.
const LOCK_PREFIXES: &[&str] = &["_raw_spin_lock", "_raw_read_lock", "_raw_write_lock"];

/// A frame of the spin-lock machinery.
pub fn is_lock_frame(name: &str) -> bool {
    // `native_queued_spin_lock_slowpath.part.0` and the like: compiler-made copies.
    let base = name.split('.').next().unwrap_or(name);
    LOCK_FRAMES.contains(&base) || LOCK_PREFIXES.iter().any(|p| base.starts_with(p))
}

/// In a tick's kernel stack (root first): the leaf-most lock frame, and the caller right above
/// the run of lock frames it belongs to (`None`: nothing above it).
pub fn lock_and_caller(tick: &Tick) -> Option<(&str, Option<&str>)> {
    let kernel = tick.stack.kernel();
    let i = kernel.iter().rposition(|f| is_lock_frame(f))?;
    let caller = kernel[..i].iter().rev().find(|f| !is_lock_frame(f)).map(|f| &**f);
    Some((&kernel[i], caller))
}

#[derive(Debug, Default)]
pub struct LockSpin {
    /// Per lock function: the onset of the current spell.
    since: FxHashMap<String, u64>,
    /// Each second of the window searched once, by its start: per CPU, its busy ticks in a lock
    /// (their indices). Every tick searched at each of the window's evaluations was 3 % of the
    /// daemon's CPU per Python sample; a second in the history does not change.
    found: VecDeque<(u64, Vec<Vec<u32>>)>,
}

/// Per CPU, the indices of the second's busy ticks that are in a lock.
fn lock_ticks(s: &Second) -> Vec<Vec<u32>> {
    s.cpus
        .iter()
        .map(|c| (0..c.busy.len() as u32).filter(|&i| lock_and_caller(&c.busy[i as usize]).is_some()).collect())
        .collect()
}

impl LockSpin {
    pub fn evaluate(&mut self, history: &VecDeque<Second>, m: Machine, t: &Thresholds) -> Vec<Active> {
        let w = (t.lock_window_secs.max(1) as usize).min(history.len());
        if w == 0 {
            return Vec::new();
        }
        let window: Vec<&Second> = history.iter().skip(history.len() - w).collect();
        let cpus = window.last().map_or(0, |s| s.cpus.len());
        self.found.retain(|(start, _)| window.iter().any(|s| s.start_ns == *start));
        for s in &window {
            if !self.found.iter().any(|(start, _)| *start == s.start_ns) {
                self.found.push_back((s.start_ns, lock_ticks(s)));
            }
        }
        // Per lock function, per CPU: the ticks spinning in it.
        let mut spins: FxHashMap<&str, Vec<Vec<&Tick>>> = FxHashMap::default();
        let mut denom = vec![0f64; cpus];
        for (cpu, d) in denom.iter_mut().enumerate() {
            let busy: u64 = window.iter().filter_map(|s| s.cpus.get(cpu)).map(|c| c.busy.len() as u64).sum();
            let idle: u64 = window.iter().filter_map(|s| s.cpus.get(cpu)).map(|c| u64::from(c.idle)).sum();
            // As hotfunc: over the ticks the CPU had or should have had, so that a nearly idle
            // CPU's few ticks are not a "share".
            *d = (busy + idle).max(m.frequency_hz * w as u64) as f64;
            for s in &window {
                let (Some(c), Some((_, found))) =
                    (s.cpus.get(cpu), self.found.iter().find(|(start, _)| *start == s.start_ns))
                else {
                    continue;
                };
                for tick in found.get(cpu).into_iter().flatten().filter_map(|&i| c.busy.get(i as usize)) {
                    if let Some((lock, _)) = lock_and_caller(tick) {
                        spins.entry(lock).or_insert_with(|| vec![Vec::new(); cpus])[cpu].push(tick);
                    }
                }
            }
        }
        let mut out = Vec::new();
        let mut seen = Vec::new();
        for (lock, per_cpu) in &spins {
            let held: Vec<(usize, f64)> = per_cpu
                .iter()
                .enumerate()
                .map(|(cpu, ticks)| (cpu, ticks.len() as f64 / denom[cpu]))
                .filter(|(_, share)| *share >= t.lock_share)
                .collect();
            if held.len() < t.lock_min_cpus as usize {
                continue;
            }
            seen.push(lock.to_string());
            let onset = *self.since.entry(lock.to_string()).or_insert(window[0].start_ns);
            let ticks = || held.iter().flat_map(|(cpu, _)| per_cpu[*cpu].iter().copied());
            let total = ticks().count().max(1) as f64;
            let callers = rank_callers(ticks(), 3);
            let processes = top_processes(ticks(), 3);
            // The CPU spinning most (the lowest-numbered of equals).
            let worst = held.iter().copied().reduce(|a, b| if b.1 > a.1 { b } else { a }).expect("lock_min_cpus >= 2");
            let mean = held.iter().map(|(_, s)| s).sum::<f64>() / held.len() as f64;
            let id = super::finding::finding_id_of(Kind::LockSpinning, None, Some(lock), onset);
            let shares: Vec<String> = held.iter().map(|(cpu, s)| format!("{} of CPU {cpu}", percent(*s))).collect();
            let callers_text: Vec<String> =
                callers.iter().map(|(f, n)| format!("{f} {}", percent(*n as f64 / total))).collect();
            let procs_text: Vec<String> =
                processes.iter().map(|p| format!("{} {}", p.who(""), percent(p.samples as f64 / total))).collect();
            let first_caller = callers.first().map_or("the callers", |(f, _)| f.as_str());
            let summary = format!(
                "spin-lock contention: {lock} holds {} over {w} s; contending callers: {}; in {}; \
                 next: profiler flamegraph --around {id} --cpu {}, and which lock {first_caller} takes and who else takes it",
                shares.join(", "),
                if callers_text.is_empty() { "unknown".to_string() } else { callers_text.join(", ") },
                procs_text.join(", "),
                worst.0,
            );
            out.push(Active {
                kind: Kind::LockSpinning,
                cpu: None,
                subject: Some(lock.to_string()),
                onset_ns: onset,
                severity: if mean >= t.lock_critical_share { Severity::Critical } else { Severity::Warning },
                summary,
                evidence: json!({
                    "function": lock,
                    "window_secs": w,
                    "cpus": held.iter().map(|(cpu, s)| json!({"cpu": cpu, "share": s})).collect::<Vec<_>>(),
                    "callers": callers.iter().map(|(f, n)| json!({"function": f, "samples": n, "share": *n as f64 / total})).collect::<Vec<_>>(),
                    "processes": processes.iter().map(Top::json).collect::<Vec<_>>(),
                }),
            });
        }
        self.since.retain(|lock, _| seen.contains(lock));
        out.sort_by(|a, b| a.subject.cmp(&b.subject));
        out
    }
}

/// The callers right above the lock frames, most ticks first (ties by name).
fn rank_callers<'a>(ticks: impl Iterator<Item = &'a Tick>, n: usize) -> Vec<(String, u64)> {
    let mut counts: FxHashMap<&str, u64> = FxHashMap::default();
    for t in ticks {
        if let Some((_, Some(caller))) = lock_and_caller(t) {
            *counts.entry(caller).or_default() += 1;
        }
    }
    let mut v: Vec<(String, u64)> = counts.into_iter().map(|(f, c)| (f.to_string(), c)).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v.truncate(n);
    v
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

    const M: Machine = Machine { cpus: 2, frequency_hz: 100 };

    fn stack(kernel: &[&str]) -> Arc<Stack> {
        let frames: Vec<Arc<str>> = ["main"].iter().chain(kernel).map(|f| Arc::from(*f)).collect();
        Arc::new(Stack::new(frames, 1))
    }

    fn spin(caller: &str) -> Arc<Stack> {
        stack(&["entry_SYSCALL_64", "do_syscall_64", caller, "_raw_spin_lock", "native_queued_spin_lock_slowpath"])
    }

    /// `n` seconds; per CPU, the stacks and how many ticks of each per second.
    fn seconds(n: u64, per_cpu: &[Vec<(Arc<Stack>, usize)>]) -> VecDeque<Second> {
        (0..n)
            .map(|i| Second {
                start_ns: i * NS_PER_SEC,
                cpus: per_cpu
                    .iter()
                    .enumerate()
                    .map(|(cpu, stacks)| CpuSecond {
                        busy: stacks
                            .iter()
                            .flat_map(|(s, k)| {
                                (0..*k).map(move |_| Tick {
                                    stack: s.clone(),
                                    pid: 100 + cpu as u32,
                                    comm: Arc::from("hammer"),
                                    workload: Default::default(),
                                })
                            })
                            .collect(),
                        ..Default::default()
                    })
                    .collect(),
            })
            .collect()
    }

    #[test]
    fn fires_on_two_cpus_spinning_under_one_caller() {
        let busy = stack(&["entry_SYSCALL_64", "do_syscall_64", "ep_poll"]);
        let cpu = vec![(spin("do_epoll_ctl"), 40), (busy, 60)];
        let out = LockSpin::default().evaluate(&seconds(5, &[cpu.clone(), cpu]), M, &Thresholds::default());
        assert_eq!(out.len(), 1, "{out:?}");
        let a = &out[0];
        assert_eq!(
            (a.kind, a.cpu, a.subject.as_deref()),
            (Kind::LockSpinning, None, Some("native_queued_spin_lock_slowpath"))
        );
        assert!(
            a.summary.starts_with(
                "spin-lock contention: native_queued_spin_lock_slowpath holds 40 % of CPU 0, 40 % of CPU 1 over 5 s; \
                 contending callers: do_epoll_ctl 100 %; in hammer (pid 100) 50 %, hammer (pid 101) 50 %; \
                 next: profiler flamegraph --around lock-spinning-native_queued_spin_lock_slowpath-"
            ),
            "{}",
            a.summary
        );
        assert!(
            a.summary.ends_with("--cpu 0, and which lock do_epoll_ctl takes and who else takes it"),
            "{}",
            a.summary
        );
        assert_eq!(a.severity, Severity::Warning);
        assert_eq!(a.evidence["callers"][0]["function"], "do_epoll_ctl");
        assert_eq!(a.evidence["cpus"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn one_cpu_spinning_is_not_contention() {
        let idle = vec![(stack(&["entry_SYSCALL_64", "do_syscall_64", "ep_poll"]), 10)];
        let h = seconds(5, &[vec![(spin("do_epoll_ctl"), 90)], idle]);
        assert!(LockSpin::default().evaluate(&h, M, &Thresholds::default()).is_empty());
    }

    #[test]
    fn a_small_share_of_slow_path_is_not_contention() {
        // A healthy busy machine: a few percent in the slow path on each CPU.
        let cpu = vec![(spin("do_epoll_ctl"), 5), (stack(&["entry_SYSCALL_64", "do_syscall_64", "ksys_read"]), 95)];
        let h = seconds(5, &[cpu.clone(), cpu]);
        assert!(LockSpin::default().evaluate(&h, M, &Thresholds::default()).is_empty());
        // User-space busy with no lock at all.
        let user = vec![(stack(&[]), 100)];
        assert!(LockSpin::default().evaluate(&seconds(5, &[user.clone(), user]), M, &Thresholds::default()).is_empty());
        // Two CPUs each spinning in a different slow path, each below the share: nothing either.
        let a = vec![(spin("f"), 15)];
        let b = vec![(stack(&["g", "queued_write_lock_slowpath"]), 15)];
        assert!(LockSpin::default().evaluate(&seconds(5, &[a, b]), M, &Thresholds::default()).is_empty());
    }

    #[test]
    fn callers_are_ranked_and_the_lock_is_the_leaf_most_lock_frame() {
        let cpu = vec![
            (spin("do_epoll_ctl"), 30),
            (spin("ep_poll_callback"), 20),
            (spin("timerfd_settime"), 10),
            (spin("x"), 5),
        ];
        let out = LockSpin::default().evaluate(&seconds(5, &[cpu.clone(), cpu]), M, &Thresholds::default());
        let callers: Vec<_> =
            out[0].evidence["callers"].as_array().unwrap().iter().map(|c| c["function"].clone()).collect();
        assert_eq!(callers, ["do_epoll_ctl", "ep_poll_callback", "timerfd_settime"]);
        assert!(
            out[0].summary.contains("do_epoll_ctl 46 %, ep_poll_callback 31 %, timerfd_settime 15 %"),
            "{}",
            out[0].summary
        );
        assert_eq!(out[0].severity, Severity::Critical, "65 % of each CPU");
        // A bare `_raw_spin_lock_irqsave` leaf is itself the lock frame; its caller is above it.
        let tick = Tick {
            stack: stack(&["f", "_raw_spin_lock_irqsave"]),
            pid: 1,
            comm: Arc::from("x"),
            workload: Default::default(),
        };
        assert_eq!(lock_and_caller(&tick), Some(("_raw_spin_lock_irqsave", Some("f"))));
        assert!(is_lock_frame("native_queued_spin_lock_slowpath.part.0") && !is_lock_frame("spin_lock_init_x"));
    }

    #[test]
    fn the_onset_holds_while_the_spell_lasts() {
        let cpu = vec![(spin("f"), 50)];
        let mut h = seconds(7, &[cpu.clone(), cpu]);
        let mut d = LockSpin::default();
        let t = Thresholds::default();
        let first = d.evaluate(&h.iter().take(5).cloned().collect(), M, &t);
        h.pop_front();
        h.pop_front();
        let later = d.evaluate(&h, M, &t);
        assert_eq!(first[0].onset_ns, later[0].onset_ns);
    }
}
