//! Detector 1: a CPU saturated while the machine as a whole looks fine — what per-core views
//! show and aggregate CPU graphs hide.
//!
//! A CPU's busy share in a second is its busy ticks over the ticks the sampling frequency gives
//! it (not over busy + idle ticks: an idle vCPU may get no ticks at all).

use std::collections::VecDeque;

use serde_json::json;

use super::{
    finding::{Active, Kind, Severity},
    seconds::{Machine, Second, Top, percent, top_processes},
    thresholds::Thresholds,
};
use crate::{exec_context::Context, store::format::NS_PER_SEC};

#[derive(Debug, Default)]
pub struct Saturation {
    /// Per CPU: first second of the current run of saturated seconds.
    runs: Vec<Option<u64>>,
}

fn share(ticks: usize, freq: u64) -> f64 {
    (ticks as f64 / freq.max(1) as f64).min(1.0)
}

impl Saturation {
    pub fn evaluate(&mut self, history: &VecDeque<Second>, m: Machine, t: &Thresholds) -> Vec<Active> {
        let Some(now) = history.back() else { return Vec::new() };
        // Lost ticks count as busy here: "the machine looks fine" needs seen idle time.
        let machine_busy: f64 =
            now.cpus.iter().map(|c| c.not_idle_share(m.frequency_hz)).sum::<f64>() / m.cpus.max(1) as f64;
        self.runs.resize(now.cpus.len(), None);
        let mut out = Vec::new();
        for (cpu, c) in now.cpus.iter().enumerate() {
            let busy = share(c.busy.len(), m.frequency_hz);
            if busy < t.saturated_busy || machine_busy > t.machine_busy_max {
                self.runs[cpu] = None;
                continue;
            }
            let start = *self.runs[cpu].get_or_insert(now.start_ns);
            let secs = (now.start_ns + NS_PER_SEC - start) / NS_PER_SEC;
            if secs < u64::from(t.saturated_secs) {
                continue;
            }
            // Figures over the run (as far as history reaches).
            let run: Vec<_> = history.iter().filter(|s| s.start_ns >= start).filter_map(|s| s.cpus.get(cpu)).collect();
            let ticks: usize = run.iter().map(|c| c.busy.len()).sum();
            let kernel: usize = run.iter().map(|c| c.kernel()).sum();
            let kernel_share = kernel as f64 / ticks.max(1) as f64;
            if kernel_share < t.saturated_kernel_min {
                continue;
            }
            // Softirq work is busy wherever it ran, the idle task included: say how much of the
            // run it was (NET_RX on a NIC-queue core), since the top "process" may be swapper/N.
            let softirq = run.iter().flat_map(|c| c.busy.iter()).filter(|t| Context::of_stack(&t.stack).is_softirq());
            let softirq_share = softirq.count() as f64 / ticks.max(1) as f64;
            let softirq_text =
                if softirq_share > 0.0 { format!(", {} in softirqs", percent(softirq_share)) } else { String::new() };
            let top = top_processes(run.iter().flat_map(|c| c.busy.iter()), 3);
            let mode = if kernel_share >= 0.5 { "kernel" } else { "user" };
            let top_text: Vec<String> = top
                .iter()
                .map(|t| format!("{} {}", t.who(""), percent(t.samples as f64 / ticks.max(1) as f64)))
                .collect();
            out.push(Active {
                kind: Kind::SaturatedCore,
                cpu: Some(cpu as u32),
                subject: None,
                onset_ns: start,
                severity: if secs >= u64::from(t.saturated_critical_secs) { Severity::Critical } else { Severity::Warning },
                summary: format!(
                    "CPU {cpu} saturated for {secs} s ({} busy, {} of it in the {mode}{softirq_text}) while the machine is {} busy; top: {}",
                    percent(busy),
                    percent(if mode == "kernel" { kernel_share } else { 1.0 - kernel_share }),
                    percent(machine_busy),
                    top_text.join(", ")
                ),
                evidence: json!({
                    "busy_share": busy,
                    "kernel_share": kernel_share,
                    "softirq_share": softirq_share,
                    "machine_busy_share": machine_busy,
                    "seconds": secs,
                    "mode": mode,
                    "top_processes": top.iter().map(Top::json).collect::<Vec<_>>(),
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
    };

    pub fn second(i: u64, busy: &[(usize, bool)]) -> Second {
        // busy[cpu] = (ticks, kernel)
        let user = Arc::new(Stack::new(vec![Arc::from("main")], 1));
        let kernel = Arc::new(Stack::new(vec![Arc::from("main"), Arc::from("clear_user")], 1));
        Second {
            start_ns: i * NS_PER_SEC,
            cpus: busy
                .iter()
                .map(|&(n, k)| CpuSecond {
                    busy: (0..n)
                        .map(|_| Tick {
                            stack: if k { kernel.clone() } else { user.clone() },
                            pid: 7,
                            comm: Arc::from("dd"),
                            workload: Default::default(),
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
        }
    }

    fn run(seconds: &[Second]) -> Vec<Vec<Active>> {
        let m = Machine { cpus: 2, frequency_hz: 100 };
        let mut d = Saturation::default();
        let mut h = VecDeque::new();
        seconds
            .iter()
            .map(|s| {
                h.push_back(s.clone());
                d.evaluate(&h, m, &Thresholds::default())
            })
            .collect()
    }

    #[test]
    fn one_saturated_cpu_on_a_quiet_machine_fires_after_three_seconds() {
        let seconds: Vec<_> = (0..5).map(|i| second(i, &[(2, false), (100, true)])).collect();
        let out = run(&seconds);
        assert!(out[0].is_empty() && out[1].is_empty());
        let a = &out[2][0];
        assert_eq!((a.kind, a.cpu, a.onset_ns), (Kind::SaturatedCore, Some(1), 0));
        assert!(a.summary.contains("CPU 1 saturated for 3 s") && a.summary.contains("in the kernel"), "{}", a.summary);
        assert!(a.summary.contains("dd (pid 7)"), "{}", a.summary);
    }

    /// A program keeping a core busy in user space (a compile's serial step, a data loader) is
    /// not a finding by default; with `saturated_kernel_min = 0` it is.
    #[test]
    fn a_core_busy_in_user_space_is_a_finding_only_when_asked() {
        let seconds: Vec<_> = (0..5).map(|i| second(i, &[(2, false), (100, false)])).collect();
        assert!(run(&seconds).iter().all(Vec::is_empty));
        let m = Machine { cpus: 2, frequency_hz: 100 };
        let t = Thresholds { saturated_kernel_min: 0.0, ..Thresholds::default() };
        let (mut d, mut h) = (Saturation::default(), VecDeque::new());
        let out: Vec<Vec<Active>> = seconds
            .iter()
            .map(|s| {
                h.push_back(s.clone());
                d.evaluate(&h, m, &t)
            })
            .collect();
        assert!(out[2][0].summary.contains("CPU 1 saturated for 3 s") && out[2][0].summary.contains("in the user"));
    }

    #[test]
    fn the_finding_names_the_pod_and_container_of_its_processes() {
        let pod = crate::identity::Identity {
            pod_namespace: Some("ml".into()),
            pod_name: Some("trainer-0".into()),
            container_name: Some("main".into()),
            ..Default::default()
        };
        let workload: Arc<str> = crate::identity::workloads::encode(&pod).into();
        let seconds: Vec<_> = (0..3)
            .map(|i| {
                let mut s = second(i, &[(2, false), (100, true)]);
                s.cpus[1].busy.iter_mut().for_each(|t| t.workload = workload.clone());
                s
            })
            .collect();
        let a = &run(&seconds)[2][0];
        assert!(a.summary.contains("dd (pid 7, pod ml/trainer-0 container main) 100 %"), "{}", a.summary);
        assert_eq!(a.evidence["top_processes"][0]["pod"], "trainer-0");
        assert_eq!(a.evidence["top_processes"][0]["namespace"], "ml");
    }

    #[test]
    fn net_rx_on_the_idle_task_saturates_a_core_and_says_so() {
        let stack = Context::Softirq(3).mark(&Stack::new(vec![Arc::from("net_rx_action")], 0));
        let seconds: Vec<_> = (0..3)
            .map(|i| {
                let mut s = second(i, &[(2, false), (100, true)]);
                s.cpus[1].busy.iter_mut().for_each(|t| {
                    (t.stack, t.pid, t.comm) = (Arc::new(stack.clone()), 0, Arc::from("swapper/1"));
                });
                s
            })
            .collect();
        let a = &run(&seconds)[2][0];
        assert!(a.summary.contains("100 % of it in the kernel, 100 % in softirqs"), "{}", a.summary);
        assert!(a.summary.contains("swapper/1 (pid 0) 100 %"), "{}", a.summary);
        assert_eq!(a.evidence["softirq_share"], 1.0);
    }

    #[test]
    fn a_busy_machine_or_a_short_burst_does_not() {
        let busy: Vec<_> = (0..10).map(|i| second(i, &[(100, false), (100, false)])).collect();
        assert!(run(&busy).iter().all(Vec::is_empty));
        let mut burst: Vec<_> = (0..2).map(|i| second(i, &[(0, false), (100, true)])).collect();
        burst.push(second(2, &[(0, false), (50, true)]));
        burst.extend((3..5).map(|i| second(i, &[(0, false), (100, true)])));
        assert!(run(&burst).iter().all(Vec::is_empty));
    }
}
