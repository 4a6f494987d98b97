//! Detector 3: NET_RX softirq / NAPI work starved on one CPU — the wait from a NET_RX raise to
//! the softirq running (its p99 over a second, and its maximum), and gaps between NAPI polls
//! while work was pending. The finding names what held the CPU meanwhile, from the samples.

use serde_json::json;

use super::{
    finding::{Active, Kind, Severity},
    seconds::{Second, Top, percent, top_processes},
    thresholds::Thresholds,
};
use crate::collect::latency::quantile_ns;

/// `, SCHED_FIFO 50` etc. for a pid, from /proc (empty if it is gone or not real-time).
pub fn policy(pid: u32) -> String {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return String::new() };
    let Some((_, rest)) = stat.rsplit_once(')') else { return String::new() };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the comm: field 3 is f[0]; rt_priority is field 40, policy field 41.
    let (prio, pol) = (f.get(37).and_then(|v| v.parse::<u32>().ok()), f.get(38).and_then(|v| v.parse::<u32>().ok()));
    match (pol, prio) {
        (Some(1), Some(p)) => format!(", SCHED_FIFO {p}"),
        (Some(2), Some(p)) => format!(", SCHED_RR {p}"),
        _ => String::new(),
    }
}

/// `policies`: real-time policies of processes, read while they ran (they may be gone by now).
pub fn evaluate(second: &Second, t: &Thresholds, policies: &std::collections::HashMap<u32, String>) -> Vec<Active> {
    let mut out = Vec::new();
    for (cpu, c) in second.cpus.iter().enumerate() {
        let Some(n) = &c.netrx else { continue };
        let p99 = if n.runs >= t.netrx_p99_min_runs { quantile_ns(&n.histogram, 0.99) } else { None };
        let worst = n.latency_max_ns.max(n.poll_gap_max_ns);
        let gap_ns = (t.netrx_gap_ms * 1e6) as u64;
        let p99_hit = p99.is_some_and(|p| p as f64 >= t.netrx_p99_ms * 1e6);
        if !p99_hit && worst < gap_ns {
            continue;
        }
        let busy = c.busy.len().max(1) as f64;
        let holders = top_processes(c.busy.iter(), 3);
        let held: Vec<String> = holders
            .iter()
            .map(|t| {
                let pol = policies.get(&t.pid).cloned().unwrap_or_else(|| policy(t.pid));
                format!("{} {}", t.who(&pol), percent(t.samples as f64 / busy))
            })
            .collect();
        let held = if held.is_empty() { "nothing sampled (softirq time itself?)".to_string() } else { held.join(", ") };
        let ms = |ns: u64| ns as f64 / 1e6;
        let mut what = Vec::new();
        if n.latency_max_ns >= 1_000_000 {
            let p99_text = p99.map_or(String::new(), |p| format!(", p99 ≤{:.1} ms over {} runs", ms(p), n.runs));
            what.push(format!("NET_RX softirq waited up to {:.0} ms to run{p99_text}", ms(n.latency_max_ns)));
        }
        if n.poll_gap_max_ns > 0 {
            what.push(format!("NAPI polling stalled {:.0} ms with work pending", ms(n.poll_gap_max_ns)));
        }
        out.push(Active {
            kind: Kind::NetrxStarvation,
            cpu: Some(cpu as u32),
            subject: None,
            onset_ns: second.start_ns,
            severity: if worst as f64 >= t.netrx_critical_factor * gap_ns as f64 {
                Severity::Critical
            } else {
                Severity::Warning
            },
            summary: format!("CPU {cpu}: {} while the CPU ran {held}", what.join("; ")),
            evidence: json!({
                "runs": n.runs,
                "latency_max_ms": ms(n.latency_max_ns),
                "latency_p99_ms": p99.map(ms),
                "poll_gap_max_ms": ms(n.poll_gap_max_ns),
                "held_by": holders.iter().map(Top::json).collect::<Vec<_>>(),
            }),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::collect::latency::histogram;
    use crate::{
        detect::{CpuSecond, NetRxSecond, Tick},
        model::Stack,
    };

    /// A true p99 of 4.2 ms is under a 5 ms threshold (whole powers of two read it as 8.4 ms).
    #[test]
    fn a_p99_just_under_the_threshold_does_not_fire() {
        let h = histogram(&[(100_000, 900), (4_200_000, 100)]);
        let n = NetRxSecond { runs: 1000, histogram: h, latency_max_ns: 4_200_000, poll_gap_max_ns: 0 };
        assert!(evaluate(&second(n), &Thresholds::default(), &Default::default()).is_empty());
        let h = histogram(&[(100_000, 900), (5_600_000, 100)]);
        let n = NetRxSecond { runs: 1000, histogram: h, latency_max_ns: 5_600_000, poll_gap_max_ns: 0 };
        assert_eq!(evaluate(&second(n), &Thresholds::default(), &Default::default()).len(), 1);
    }

    fn second(netrx: NetRxSecond) -> Second {
        let spin = Arc::new(Stack::new(vec![Arc::from("spin")], 1));
        Second {
            start_ns: 0,
            cpus: vec![
                CpuSecond::default(),
                CpuSecond {
                    busy: (0..99)
                        .map(|_| Tick {
                            stack: spin.clone(),
                            pid: 4_000_000,
                            comm: Arc::from("hog"),
                            workload: Default::default(),
                        })
                        .collect(),
                    netrx: Some(netrx),
                    ..Default::default()
                },
            ],
        }
    }

    #[test]
    fn a_long_wait_names_what_held_the_cpu() {
        let n = NetRxSecond { runs: 3, histogram: vec![], latency_max_ns: 450_000_000, poll_gap_max_ns: 0 };
        let out = evaluate(&second(n), &Thresholds::default(), &Default::default());
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].cpu, Some(1));
        assert!(
            out[0]
                .summary
                .starts_with("CPU 1: NET_RX softirq waited up to 450 ms to run while the CPU ran hog (pid 4000000)"),
            "{}",
            out[0].summary
        );
    }

    #[test]
    fn healthy_softirqs_are_quiet() {
        let h = histogram(&[(5_000, 1000)]);
        let n = NetRxSecond { runs: 1000, histogram: h, latency_max_ns: 90_000, poll_gap_max_ns: 2_000_000 };
        assert!(evaluate(&second(n), &Thresholds::default(), &Default::default()).is_empty());
    }
}
