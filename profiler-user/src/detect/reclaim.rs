//! Detector 8: reclaim stalls. A CPU whose tasks stall long in a second in direct reclaim,
//! memory-cgroup reclaim or compaction (the `vmscan`/`compaction` tracepoints, summed per CPU
//! in BPF: `collect::reclaim`; several tasks can stall at once, so a second can hold more than a
//! second of stalls), named with the task that stalled longest, the memory cgroup it is charged
//! to (its limit and usage), and from the samples of the last seconds the share of the CPU in
//! reclaim code and the kernel paths that allocated.

use std::collections::{HashMap, VecDeque};

use serde_json::json;

use super::{
    finding::{Active, Kind, Severity},
    seconds::{Second, Tick, Top, percent},
    thresholds::Thresholds,
};
use profiler_common::reclaim::{COMPACT, DIRECT, KINDS, MEMCG};

/// Where a task that allocates or charges memory enters reclaim or compaction itself: a sample
/// under one of them is the CPU spent in a stall. Reclaim's inner functions (`shrink_node`,
/// `shrink_folio_list`, `compact_zone`) alone are not enough: kswapd, kcompactd and DAMON's
/// kdamond (`damon_pa_apply_scheme` → `reclaim_pages`) run them in the background, and that
/// stalls no one (kdamond's proactive reclaim on this machine was once named as "what
/// allocated"). The cross-file entries (`try_to_free_pages`, `try_to_free_mem_cgroup_pages`,
/// `try_to_compact_pages`, `mem_cgroup_handle_over_high`) cannot be inlined into their callers.
const STALL_ENTRIES: &[&str] = &[
    "try_to_free_mem_cgroup_pages",
    "try_to_free_pages",
    "__alloc_pages_direct_reclaim",
    "__perform_reclaim",
    "mem_cgroup_handle_over_high",
    "reclaim_high",
    "__alloc_pages_direct_compact",
    "try_to_compact_pages",
];

fn is_stall_entry(name: &str) -> bool {
    // `try_to_free_pages.part.0` and the like: compiler-made copies.
    let base = name.split('.').next().unwrap_or(name);
    STALL_ENTRIES.contains(&base)
}

/// A sample of a task stalled in reclaim or compaction (not background reclaim).
fn in_stall(tick: &Tick) -> bool {
    tick.stack.kernel().iter().any(|f| is_stall_entry(f))
}

fn kind_name(kind: usize) -> &'static str {
    match kind {
        DIRECT => "direct reclaim",
        MEMCG => "memory-cgroup reclaim",
        COMPACT => "compaction",
        _ => "reclaim",
    }
}

/// Frames of the allocator and the memory controller themselves, skipped on the way up to
/// what allocated (`try_charge_memcg ← charge_memcg ← __mem_cgroup_charge` says nothing).
const ALLOCATOR_PARTS: &[&str] = &["charge", "alloc", "mem_cgroup", "folio", "get_page", "memcg"];

/// The kernel frames above (root-side of) a sample's reclaim code and the allocator: what
/// allocated, e.g. `generic_perform_write ← ext4_buffered_write_iter ← vfs_write`.
fn allocating_path(tick: &Tick) -> Option<String> {
    let kernel = tick.stack.kernel();
    let first = kernel.iter().position(|f| is_stall_entry(f))?;
    let above: Vec<&str> = kernel[..first]
        .iter()
        .rev()
        .map(|f| &**f)
        .skip_while(|f| ALLOCATOR_PARTS.iter().any(|p| f.contains(p)))
        .take(3)
        .collect();
    (!above.is_empty()).then(|| above.join(" ← "))
}

/// The evidence with the staller as `processes` and the memory cgroup's pod, namespace,
/// container (or unit) at the top, where `Finding::pod` and the metrics' labels look.
fn with_identity(
    mut evidence: serde_json::Value,
    identity: &crate::identity::Identity,
    staller: Option<&Top>,
) -> serde_json::Value {
    evidence["processes"] = json!(staller.map(Top::json).into_iter().collect::<Vec<_>>());
    for (k, v) in identity.fields() {
        evidence[k] = json!(v);
    }
    evidence
}

/// `83.1 ms`, `45 µs`.
fn duration(ns: u64) -> String {
    if ns >= 1_000_000 { format!("{:.1} ms", ns as f64 / 1e6) } else { format!("{} µs", ns / 1000) }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / 1048576.0)
}

/// Evaluates the latest second of `history`; the samples of every second there (a few) say how
/// much of the CPU went to reclaim code and what allocated.
pub fn evaluate(history: &VecDeque<Second>, t: &Thresholds) -> Vec<Active> {
    let Some(second) = history.back() else { return Vec::new() };
    let mut out = Vec::new();
    for (cpu, c) in second.cpus.iter().enumerate() {
        let Some(r) = &c.reclaim else { continue };
        let share = r.total_ns() as f64 / 1e9;
        if share < t.reclaim_share {
            continue;
        }
        let kind = (0..KINDS).max_by_key(|&k| r.ns[k]).unwrap_or(MEMCG);
        let stalls: u64 = r.count.iter().sum();
        let busy: Vec<&Tick> = history.iter().filter_map(|s| s.cpus.get(cpu)).flat_map(|c| c.busy.iter()).collect();
        let in_reclaim: Vec<&Tick> = busy.iter().copied().filter(|t| in_stall(t)).collect();
        let sampled = in_reclaim.len() as f64 / busy.len().max(1) as f64;
        let mut paths: HashMap<String, u64> = HashMap::new();
        for t in &in_reclaim {
            if let Some(p) = allocating_path(t) {
                *paths.entry(p).or_default() += 1;
            }
        }
        let mut paths: Vec<(String, u64)> = paths.into_iter().collect();
        paths.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        paths.truncate(3);
        let ms = |ns: u64| ns as f64 / 1e6;
        let staller = r.staller.as_ref().map(|s| {
            let workload = busy.iter().find(|t| t.pid == s.pid).map(|t| t.workload.clone()).unwrap_or_default();
            Top { comm: s.comm.as_str().into(), pid: s.pid, samples: 0, workload }
        });
        let who = staller.as_ref().zip(r.staller.as_ref()).map(|(top, s)| {
            let thread = if s.tid != s.pid { format!(", thread {}", s.tid) } else { String::new() };
            top.who(&thread)
        });
        let memcg = r.staller.as_ref().and_then(|s| s.memcg.as_ref());
        // The pod and container the memory cgroup belongs to (its path names them, and the
        // staller's workload their names), as the metrics' pod label takes it: the staller may
        // never have been sampled (its stalls slept), so its own workload can be unknown.
        let identity = memcg.map(|m| super::throttle::identify(&m.path, staller.as_slice())).unwrap_or_default();
        let memcg_text = memcg.map_or(String::new(), |m| {
            let fill = match (m.usage_bytes, m.limit_bytes) {
                (Some(u), Some(l)) => format!(" ({} of its {} limit)", mib(u), mib(l)),
                (Some(u), None) => format!(" ({}, no limit)", mib(u)),
                _ => String::new(),
            };
            format!(" in memory cgroup {}{fill}", m.path)
        });
        let median = r.median_ns().map_or(String::new(), |p| format!("median ≤{}, ", duration(p)));
        let p99_text = format!("{median}{}", r.p99_ns().map_or(String::new(), |p| format!("p99 ≤{}, ", duration(p))));
        let longest = who.as_ref().map_or(format!("{p99_text}longest {}", duration(r.max_ns)), |w| {
            format!("{p99_text}longest {}: {w}", duration(r.max_ns))
        });
        let sampled_text = if in_reclaim.is_empty() {
            String::new()
        } else {
            let under = paths.first().map_or(String::new(), |(p, _)| format!(", under {p}"));
            // Stalled time far over the CPU time in reclaim: the tasks slept in it (throttled,
            // waiting for writeback or I/O), which is a different fix from scanning too much.
            let slept = r.total_ns() as f64 / 1e9 >= 4.0 * sampled;
            let slept = if slept { " (the stalls mostly waited, for writeback or I/O, rather than ran)" } else { "" };
            format!("; sampled over {} s: {} of the CPU in reclaim code{slept}{under}", history.len(), percent(sampled))
        };
        let next = match (kind, memcg) {
            (MEMCG, Some(m)) => format!(
                "look next: the limit of {} and what fills it (page cache of its file I/O counts: memory.stat), or `profiler flamegraph --cpu {cpu}`",
                m.path
            ),
            (COMPACT, _) => format!(
                "look next: memory fragmentation (/proc/buddyinfo, huge page allocations), or `profiler flamegraph --cpu {cpu}`"
            ),
            _ => format!(
                "look next: free memory and who holds it (/proc/meminfo, the largest cgroups), or `profiler flamegraph --cpu {cpu}`"
            ),
        };
        out.push(Active {
            kind: Kind::ReclaimStall,
            cpu: Some(cpu as u32),
            subject: None,
            onset_ns: second.start_ns,
            severity: if share >= t.reclaim_critical_share { Severity::Critical } else { Severity::Warning },
            summary: format!(
                "CPU {cpu}: its tasks stalled {:.0} ms in {} in one second ({stalls} stalls, {longest}){memcg_text}{sampled_text}; {next}",
                ms(r.total_ns()),
                kind_name(kind)
            ),
            evidence: with_identity(json!({
                "stalled_ms_per_second": ms(r.total_ns()),
                "stalls": {"direct_reclaim": r.count[DIRECT], "memcg_reclaim": r.count[MEMCG], "compaction": r.count[COMPACT]},
                "stalled_ms": {"direct_reclaim": ms(r.ns[DIRECT]), "memcg_reclaim": ms(r.ns[MEMCG]), "compaction": ms(r.ns[COMPACT])},
                "longest_ms": ms(r.max_ns),
                // From any number of stalls: with few, the p99 is the longest.
                "stall_p50_ms": r.quantile_ns(0.5).map(ms),
                "stall_p99_ms": r.quantile_ns(0.99).map(ms),
                "staller": r.staller.as_ref().map(|s| json!({"pid": s.pid, "tid": s.tid, "comm": s.comm, "kind": kind_name(s.kind)})),
                "memcg": memcg.map(|m| json!({
                    "path": m.path,
                    "limit_bytes": m.limit_bytes,
                    "usage_bytes": m.usage_bytes,
                    "id": r.staller.as_ref().map(|s| s.memcg_id).filter(|&id| id != 0),
                })),
                "sampled_share": sampled,
                "allocating_paths": paths.iter().map(|(p, n)| json!({"path": p, "samples": n})).collect::<Vec<_>>(),
            }), &identity, staller.as_ref()),
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
        collect::{
            memcg::Memcg,
            reclaim::{ReclaimSecond, StallerInfo},
        },
        detect::CpuSecond,
        model::Stack,
    };

    fn tick(kernel: &[&str]) -> Tick {
        let frames: Vec<Arc<str>> = ["dd"].iter().chain(kernel).map(|f| Arc::from(*f)).collect();
        Tick { stack: Arc::new(Stack::new(frames, 1)), pid: 4242, comm: Arc::from("dd"), workload: Arc::from("") }
    }

    fn second(r: ReclaimSecond) -> Second {
        let reclaiming = tick(&[
            "do_syscall_64",
            "ksys_write",
            "generic_perform_write",
            "try_charge_memcg",
            "try_to_free_mem_cgroup_pages",
            "shrink_node",
        ]);
        let mut busy: Vec<Tick> = (0..30).map(|_| reclaiming.clone()).collect();
        busy.extend((0..70).map(|_| tick(&["do_syscall_64", "ksys_write", "copy_page_from_iter"])));
        Second {
            start_ns: 0,
            cpus: vec![CpuSecond::default(), CpuSecond { busy, reclaim: Some(r), ..Default::default() }],
        }
    }

    fn stalls(ns: u64) -> ReclaimSecond {
        ReclaimSecond {
            count: [0, 400, 0],
            ns: [0, ns, 0],
            // Mostly short, the slowest 2.5 % around 5 ms, one of 14.6 ms.
            histogram: histogram(&[(100_000, 390), (5_000_000, 9), (14_600_000, 1)]),
            max_ns: 14_600_000,
            staller: Some(StallerInfo {
                kind: MEMCG,
                pid: 4242,
                tid: 4242,
                comm: "dd".into(),
                memcg: Some(Memcg { path: "/rtest".into(), limit_bytes: Some(16 << 20), usage_bytes: Some(16 << 20) }),
                memcg_id: 2041,
            }),
        }
    }

    #[test]
    fn a_cpu_stalled_in_memcg_reclaim_names_the_cgroup_and_the_allocating_path() {
        let out = evaluate(&VecDeque::from([second(stalls(180_000_000))]), &Thresholds::default());
        assert_eq!(out.len(), 1);
        let s = &out[0].summary;
        assert!(
            s.starts_with("CPU 1: its tasks stalled 180 ms in memory-cgroup reclaim in one second (400 stalls, median ≤106 µs, p99 ≤5.2 ms, longest 14.6 ms: dd (pid 4242)) in memory cgroup /rtest (16.0 MiB of its 16.0 MiB limit); sampled over 1 s: 30 % of the CPU in reclaim code, under generic_perform_write ← ksys_write ← do_syscall_64"),
            "{s}"
        );
        assert!(s.contains("look next: the limit of /rtest"), "{s}");
        assert_eq!(out[0].evidence["memcg"]["path"], "/rtest");
        assert_eq!(
            (out[0].evidence["stall_p50_ms"].as_f64(), out[0].evidence["stall_p99_ms"].as_f64()),
            (Some(0.106496), Some(5.24288))
        );
    }

    #[test]
    fn the_p99_needs_enough_stalls_and_never_exceeds_the_longest() {
        let mut r = stalls(180_000_000);
        r.count = [0, 50, 0];
        assert_eq!(r.p99_ns(), None, "50 stalls: the p99 would be the longest");
        assert_eq!(r.median_ns(), Some(106_496));
        r.count = [0, 10, 0];
        assert_eq!(r.median_ns(), None);
        // All 400 in the 14.6 ms bucket, whose upper edge is 14.68 ms: the longest caps it.
        let mut r = stalls(180_000_000);
        r.histogram = histogram(&[(14_600_000, 400)]);
        assert_eq!(r.p99_ns(), Some(14_600_000));
        r.max_ns = 0;
        assert_eq!(r.p99_ns(), Some(14_680_064), "no longest caught in this epoch: the bucket's edge");
        let out = evaluate(&VecDeque::from([second(stalls(180_000_000))]), &Thresholds::default());
        let mut few = stalls(180_000_000);
        few.count = [0, 3, 0];
        few.histogram = histogram(&[(100_000, 2), (14_600_000, 1)]);
        let quiet_p99 = evaluate(&VecDeque::from([second(few)]), &Thresholds::default());
        let s = &quiet_p99[0].summary;
        assert!(out[0].summary.contains("p99 ≤") && !s.contains("p99") && !s.contains("median"), "{s}");
        // The evidence has them all the same (the p99 of three stalls is the longest).
        assert_eq!(quiet_p99[0].evidence["stall_p99_ms"], 14.6);
        let mut none = stalls(180_000_000);
        none.histogram.clear();
        let none = evaluate(&VecDeque::from([second(none)]), &Thresholds::default());
        assert!(none[0].evidence["stall_p99_ms"].is_null());
    }

    /// kswapd and DAMON's kdamond reclaim in the background: their samples are neither the
    /// share of the CPU in stalls nor what allocated (kdamond was once named so on this machine).
    #[test]
    fn background_reclaim_is_not_a_stall() {
        let mut s = second(stalls(180_000_000));
        let kthread = |comm: &str, kernel: &[&str]| Tick { comm: Arc::from(comm), pid: 71, ..tick(kernel) };
        let busy = &mut s.cpus[1].busy;
        busy.truncate(30);
        busy.extend((0..40).map(|_| {
            let damon = ["ret_from_fork", "kthread", "kdamond_fn", "damon_pa_apply_scheme", "reclaim_pages"];
            kthread("kdamond.0", &[&damon[..], &["reclaim_folio_list", "shrink_folio_list"]].concat())
        }));
        busy.extend(
            (0..30)
                .map(|_| kthread("kswapd0", &["ret_from_fork", "kthread", "kswapd", "balance_pgdat", "shrink_node"])),
        );
        let out = evaluate(&VecDeque::from([s]), &Thresholds::default());
        assert!(
            out[0].summary.contains("30 % of the CPU in reclaim code, under generic_perform_write"),
            "{}",
            out[0].summary
        );
        let paths = out[0].evidence["allocating_paths"].to_string();
        assert!(!paths.contains("kdamond") && !paths.contains("kswapd"), "{paths}");
    }

    /// Stalls that sum to far more than the CPU sampled in reclaim slept in it: the finding
    /// says so (seen on this machine: 1100 ms stalled a second, 2 % of the CPU in reclaim code).
    #[test]
    fn stalls_that_slept_are_told_from_stalls_that_ran() {
        let ran = evaluate(&VecDeque::from([second(stalls(180_000_000))]), &Thresholds::default());
        let slept = evaluate(&VecDeque::from([second(stalls(1_500_000_000))]), &Thresholds::default());
        assert!(!ran[0].summary.contains("mostly waited"), "{}", ran[0].summary);
        assert!(
            slept[0].summary.contains("30 % of the CPU in reclaim code (the stalls mostly waited, for writeback or I/O, rather than ran), under generic_perform_write"),
            "{}",
            slept[0].summary
        );
    }

    /// A container's memory cgroup gives the finding its pod label, even when the staller was
    /// never sampled (its workload unknown).
    #[test]
    fn the_pod_of_the_memory_cgroup_labels_the_finding() {
        let uid = "0b3c6d1e-8f2a-4c5b-9d7e-112233445566";
        let cid = "3f2a9c01b7d4".repeat(5) + "3f2a";
        let mut r = stalls(180_000_000);
        r.staller.as_mut().unwrap().memcg.as_mut().unwrap().path = format!("/kubepods/burstable/pod{uid}/{cid}");
        let a = evaluate(&VecDeque::from([second(r)]), &Thresholds::default()).remove(0);
        assert_eq!((a.evidence["pod_uid"].as_str(), a.evidence["container_id"].as_str()), (Some(uid), Some(&*cid)));
        assert_eq!(a.evidence["processes"][0]["comm"], "dd");
        let f = crate::detect::Finding {
            id: String::new(),
            kind: a.kind,
            start_ns: 0,
            end_ns: None,
            cpu: a.cpu,
            severity: a.severity,
            summary: a.summary,
            evidence: a.evidence,
        };
        assert_eq!(f.pod().as_deref(), Some(uid));
        // A host cgroup: no pod.
        let host = evaluate(&VecDeque::from([second(stalls(180_000_000))]), &Thresholds::default()).remove(0);
        assert!(host.evidence.get("pod_uid").is_none(), "{}", host.evidence);
    }

    #[test]
    fn a_little_reclaim_is_quiet() {
        assert!(evaluate(&VecDeque::from([second(stalls(40_000_000))]), &Thresholds::default()).is_empty());
    }
}
