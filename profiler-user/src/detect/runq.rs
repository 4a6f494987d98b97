//! Detector 7: run-queue starvation. A thread runnable but kept off a CPU for long: the
//! longest wait of a second on a CPU, or that CPU's p99 wait, over its threshold, while the
//! other CPUs had room. The waits come from the scheduler tracepoints as per-CPU histograms
//! (`collect::runq`), the waiter's name with the longest one, and what held the CPU meanwhile
//! from the samples.
//!
//! Why "while the other CPUs had room": a machine with more runnable threads than CPUs (a
//! parallel build three times oversubscribed, measured here) makes every thread wait, up to a
//! second at times, and every CPU is busy: that is overload, which the CPU x time view shows,
//! not one CPU starving its threads. The pathology is a thread stuck behind a real-time hog, an
//! interrupt storm or a pinned neighbour on one CPU while others sit idle.

use std::collections::{HashMap, VecDeque};

use serde_json::json;

use super::{
    finding::{Active, Kind, Severity},
    seconds::{Machine, Second, Top, percent, top_processes},
    thresholds::Thresholds,
};
use crate::collect::runq::{RunqSecond, WaiterInfo};

/// Evaluates the latest second of `history`. `policies`: real-time policies of what ran on
/// the CPUs with long waits, read while it ran.
pub fn evaluate(
    history: &VecDeque<Second>,
    machine: Machine,
    t: &Thresholds,
    policies: &HashMap<u32, String>,
) -> Vec<Active> {
    let Some(second) = history.back() else { return Vec::new() };
    // Lost ticks are no room: only what was seen idle is.
    let busy: Vec<f64> = second.cpus.iter().map(|c| c.not_idle_share(machine.frequency_hz)).collect();
    let total: f64 = busy.iter().sum();
    let ms = |ns: u64| ns as f64 / 1e6;
    // Waits of microseconds and of seconds in one summary: enough digits for both.
    let text = |ns: u64| match ms(ns) {
        v if v >= 10.0 => format!("{v:.0} ms"),
        v if v >= 1.0 => format!("{v:.1} ms"),
        v => format!("{v:.2} ms"),
    };
    let p99_per_cpu: Vec<Option<f64>> =
        second.cpus.iter().map(|c| c.runq.as_ref().and_then(RunqSecond::p99_ns).map(ms)).collect();
    let mut out = Vec::new();
    for (cpu, c) in second.cpus.iter().enumerate() {
        let Some(r) = &c.runq else { continue };
        let p99 = r.p99_ns();
        let long = ms(r.max_ns) >= t.runq_max_ms;
        if !long && !p99.is_some_and(|p| ms(p) >= t.runq_p99_ms) {
            continue;
        }
        // The daemon lowers its own threads' priority on purpose (`threads::lower_this_thread`):
        // when the longest wait is its own, it yielded as designed; no finding names the
        // profiler as a victim of the machine it profiles.
        if r.waiter.as_ref().is_some_and(|w| w.pid == std::process::id()) {
            continue;
        }
        // One CPU alone has no elsewhere: its waits count as they are.
        let others = (busy.len() > 1).then(|| (total - busy[cpu]) / (busy.len() - 1) as f64);
        if others.is_some_and(|o| o > t.runq_others_busy_max) {
            continue;
        }
        let others_text = others.map_or(String::new(), |o| format!(" (the other CPUs were {} busy)", percent(o)));
        let busy = c.busy.len().max(1) as f64;
        let holders = top_processes(c.busy.iter(), 3);
        let realtime = holders.iter().filter_map(|h| policies.get(&h.pid).filter(|p| !p.is_empty())).count() > 0;
        let held: Vec<String> = holders
            .iter()
            .map(|h| {
                format!(
                    "{} {}",
                    h.who(policies.get(&h.pid).map_or("", String::as_str)),
                    percent(h.samples as f64 / busy)
                )
            })
            .collect();
        let held = if held.is_empty() { "nothing sampled".to_string() } else { held.join(", ") };
        let who = r.waiter.as_ref().map(|w| waiter_text(w, history));
        let p99_text = p99.map_or(String::new(), |p| format!(", p99 ≤{} over {} waits", text(p), r.waits));
        let what = match &who {
            Some(who) => format!("{who} waited {} runnable for the CPU{p99_text}", text(r.max_ns)),
            None => format!("runnable threads waited up to {} for the CPU{p99_text}", text(r.max_ns)),
        };
        let next = if realtime {
            format!(
                "look next: the real-time thread on CPU {cpu} (chrt -p PID): one that spins keeps normal threads off its CPU up to kernel.sched_rt_runtime_us"
            )
        } else {
            format!(
                "look next: more runnable threads than CPU {cpu} serves (taskset -p, cpusets, CPU quotas of the waiter), and `profiler flamegraph --cpu {cpu}`"
            )
        };
        out.push(Active {
            kind: Kind::RunqStarvation,
            cpu: Some(cpu as u32),
            subject: None,
            onset_ns: second.start_ns,
            severity: if ms(r.max_ns) >= t.runq_critical_factor * t.runq_max_ms {
                Severity::Critical
            } else {
                Severity::Warning
            },
            summary: format!("CPU {cpu}: {what} while the CPU ran {held}{others_text}; {next}"),
            evidence: json!({
                "waits": r.waits,
                "wait_max_ms": ms(r.max_ns),
                "wait_p99_ms": p99.map(ms),
                "wait_p99_ms_per_cpu": p99_per_cpu,
                "waiter": r.waiter.as_ref().map(|w| json!({
                    "tid": w.tid, "pid": w.pid, "comm": w.comm, "thread": w.thread,
                    "ran_before_it": {"tid": w.before_tid, "comm": w.before_comm},
                })),
                "held_by": holders.iter().map(Top::json).collect::<Vec<_>>(),
                "others_busy": others,
            }),
        });
    }
    out
}

/// `victim (pid 42, thread worker-3 43, pod ml/trainer-0 container main)`: the workload from
/// the waiter's own samples when it was sampled.
fn waiter_text(w: &WaiterInfo, history: &VecDeque<Second>) -> String {
    let workload = history
        .iter()
        .rev()
        .flat_map(|s| s.cpus.iter().flat_map(|c| c.busy.iter()))
        .find(|t| t.pid == w.pid)
        .map(|t| t.workload.clone())
        .unwrap_or_else(|| std::sync::Arc::from(""));
    let thread = if w.tid != w.pid { format!(", thread {} {}", w.thread, w.tid) } else { String::new() };
    Top { comm: w.comm.as_str().into(), pid: w.pid, samples: 0, workload }.who(&thread)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::collect::latency::histogram;
    use crate::{
        detect::{CpuSecond, Tick},
        model::Stack,
    };

    fn history(r: RunqSecond) -> VecDeque<Second> {
        let spin = Arc::new(Stack::new(vec![Arc::from("spin")], 1));
        let tick =
            |pid: u32, comm: &str| Tick { stack: spin.clone(), pid, comm: Arc::from(comm), workload: Arc::from("") };
        let mut busy: Vec<Tick> = (0..95).map(|_| tick(7, "fifo-hog")).collect();
        busy.extend((0..4).map(|_| tick(42, "victim")));
        VecDeque::from([Second {
            start_ns: 0,
            cpus: vec![CpuSecond::default(), CpuSecond { busy, runq: Some(r), ..Default::default() }],
        }])
    }

    const MACHINE: Machine = Machine { cpus: 2, frequency_hz: 99 };

    fn waiter() -> WaiterInfo {
        WaiterInfo {
            tid: 43,
            pid: 42,
            comm: "victim".into(),
            thread: "worker".into(),
            before_tid: 7,
            before_comm: "fifo-hog".into(),
        }
    }

    #[test]
    fn a_long_wait_names_the_waiter_and_what_held_the_cpu() {
        let r = RunqSecond {
            waits: 3,
            histogram: histogram(&[(930_000_000, 1), (1_000, 2)]),
            max_ns: 930_000_000,
            waiter: Some(waiter()),
        };
        let policies = HashMap::from([(7, ", SCHED_FIFO 50".to_string())]);
        let out = evaluate(&history(r), MACHINE, &Thresholds::default(), &policies);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].cpu, Some(1));
        let s = &out[0].summary;
        assert!(
            s.starts_with("CPU 1: victim (pid 42, thread worker 43) waited 930 ms runnable for the CPU while the CPU ran fifo-hog (pid 7, SCHED_FIFO 50) 96 %"),
            "{s}"
        );
        assert!(s.contains("look next: the real-time thread on CPU 1"), "{s}");
        assert_eq!(out[0].evidence["waiter"]["ran_before_it"]["comm"], "fifo-hog");
    }

    #[test]
    fn a_high_p99_fires_without_one_very_long_wait() {
        let r = RunqSecond {
            waits: 400,
            histogram: histogram(&[(150_000_000, 40), (2_000_000, 360)]),
            max_ns: 160_000_000,
            waiter: None,
        };
        let out = evaluate(&history(r), MACHINE, &Thresholds::default(), &HashMap::new());
        assert_eq!(out.len(), 1);
        assert!(
            out[0].summary.contains("runnable threads waited up to 160 ms for the CPU, p99 ≤"),
            "{}",
            out[0].summary
        );
        assert!(out[0].summary.contains("more runnable threads than CPU 1 serves"), "{}", out[0].summary);
    }

    /// A busy CPU sharing its time among a few threads: waits of a few ms, quiet.
    #[test]
    fn ordinary_time_sharing_is_quiet() {
        let r = RunqSecond {
            waits: 2000,
            histogram: histogram(&[(3_000_000, 1990), (40_000_000, 10)]),
            max_ns: 45_000_000,
            waiter: Some(waiter()),
        };
        assert!(evaluate(&history(r), MACHINE, &Thresholds::default(), &HashMap::new()).is_empty());
        // Few waits: no p99, and the longest is under the threshold.
        let r = RunqSecond { waits: 5, histogram: histogram(&[(300_000_000, 5)]), max_ns: 300_000_000, waiter: None };
        assert!(evaluate(&history(r), MACHINE, &Thresholds::default(), &HashMap::new()).is_empty());
    }

    /// Every CPU busy: the long waits are the machine's overload, not one CPU's starvation.
    #[test]
    fn long_waits_on_a_machine_with_no_room_elsewhere_are_overload() {
        let r = RunqSecond {
            waits: 3,
            histogram: histogram(&[(930_000_000, 3)]),
            max_ns: 930_000_000,
            waiter: Some(waiter()),
        };
        let mut h = history(r.clone());
        let spin = Arc::new(Stack::new(vec![Arc::from("cc1")], 1));
        h[0].cpus[0].busy = (0..95)
            .map(|_| Tick { stack: spin.clone(), pid: 9, comm: Arc::from("cc1"), workload: Arc::from("") })
            .collect();
        assert!(evaluate(&h, MACHINE, &Thresholds::default(), &HashMap::new()).is_empty());
        // With room on CPU 0 (half busy) it is a finding, and says how busy the others were.
        h[0].cpus[0].busy.truncate(50);
        let out = evaluate(&h, MACHINE, &Thresholds::default(), &HashMap::new());
        assert!(out[0].summary.contains("(the other CPUs were 51 % busy)"), "{}", out[0].summary);
    }
}
