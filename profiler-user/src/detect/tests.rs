use std::sync::Arc;

use super::*;
use crate::model::Stack;

#[test]
fn an_open_findings_new_figures_are_handed_out_at_most_every_few_seconds() {
    let mut e = Engine::new(Machine { cpus: 2, frequency_hz: 99 }, Thresholds::default());
    let s = |n: u64| n * NS_PER_SEC;
    let count = |at: u64, dying: u64| Some(MemcgCount { ts_ns: at, live: 4, dying, stat_read_ns: None });
    let first = e.check_zombies_count(s(1), count(s(1), 1069));
    assert_eq!(first.opened.len(), 1);
    assert!(e.check_zombies_count(s(2), count(s(2), 2000)).updated.is_empty(), "written a second ago");
    assert!(e.check_zombies_count(s(9), count(s(9), 2000)).updated.is_empty(), "the same figures");
    let later = e.check_zombies_count(s(10), count(s(10), 3000));
    assert_eq!(later.updated.len(), 1);
    assert!(later.updated[0].summary.starts_with("3000 dying"), "{}", later.updated[0].summary);
    assert_eq!(later.updated[0].id, first.opened[0].id);
}

#[test]
fn a_finding_on_a_cpu_that_takes_a_nic_queues_interrupts_says_so() {
    use crate::collect::irqs::{DeviceKind, Irq, Placement};
    let mut e = Engine::new(Machine { cpus: 2, frequency_hz: 99 }, Thresholds::default());
    e.interrupts = Placement {
        irqs: vec![Irq {
            number: 38,
            name: "ena-Tx-Rx-1".into(),
            device: "eth0".into(),
            kind: DeviceKind::Nic,
            cpus: vec![1],
        }],
    };
    let active = |cpu| Active {
        kind: Kind::SaturatedCore,
        cpu: Some(cpu),
        subject: None,
        onset_ns: 0,
        severity: Severity::Critical,
        summary: format!("CPU {cpu} saturated for 3 s: kubelet (pid 7) 100 %"),
        evidence: serde_json::json!({}),
    };
    let mut changes = Changes::default();
    e.reconcile(vec![active(1), active(0)], NS_PER_SEC, None, &mut changes);
    let on = |cpu| changes.opened.iter().find(|f| f.cpu == Some(cpu)).unwrap();
    assert_eq!(
        on(1).summary,
        "CPU 1 saturated for 3 s: kubelet (pid 7) 100 %; CPU 1 serves eth0's interrupts (ena-Tx-Rx-1)"
    );
    assert_eq!(on(1).evidence["interrupts"][0]["name"], "ena-Tx-Rx-1");
    assert_eq!(on(0).summary, "CPU 0 saturated for 3 s: kubelet (pid 7) 100 %", "CPU 0 takes none");
}

#[test]
fn two_throttled_cgroups_are_two_findings_and_close_when_the_throttling_stops() {
    use throttle::scan::{CpuStat, Quota, Reading, Version};
    let reading = |path: &str, periods: u64, throttled: u64| Reading {
        version: Version::V1,
        path: path.into(),
        quota: Quota { quota_us: 20_000, period_us: 100_000 },
        stat: CpuStat { nr_periods: periods, nr_throttled: throttled, throttled_ns: 0 },
        pids: vec![],
        ids: vec![],
    };
    let mut e = Engine::new(Machine { cpus: 2, frequency_hz: 99 }, Thresholds::default());
    let s = |n: u64| n * NS_PER_SEC;
    assert!(e.check_throttle(s(0), Some(vec![reading("/a", 0, 0), reading("/b", 0, 0)])).opened.is_empty());
    let opened = e.check_throttle(s(5), Some(vec![reading("/a", 50, 45), reading("/b", 50, 40)])).opened;
    assert_eq!(opened.len(), 2);
    assert_ne!(opened[0].id, opened[1].id);
    assert!(opened.iter().all(|f| f.id.starts_with("cfs-throttling-") && f.kind == Kind::CfsThrottling));
    assert_eq!(e.open_counts().get("cfs-throttling"), Some(&2));
    // /a stops being throttled; /b goes on.
    let later = e.check_throttle(s(10), Some(vec![reading("/a", 100, 45), reading("/b", 100, 80)]));
    assert!(later.opened.is_empty());
    let later = e.check_throttle(s(15), Some(vec![reading("/a", 150, 45), reading("/b", 150, 120)]));
    assert_eq!(later.closed.len(), 1, "{later:?}");
    assert_eq!(later.closed[0].evidence["path"], "/a");
    // Unreadable: nothing is known to be throttled any more.
    assert_eq!(e.check_throttle(s(20), None).closed.len(), 1);
}

/// The lock hammer's load on a debug daemon: both CPUs saturated by nice -10 processes, the
/// daemon's own threads waiting long for a CPU, and its pipeline seconds behind the ring. The
/// second the waits were read in must not be judged before its samples arrive: its CPUs
/// would look idle ("the other CPUs were 0 % busy") and the waits a starvation.
#[test]
fn a_pipeline_behind_the_ring_raises_no_runq_finding_on_a_saturated_machine() {
    use crate::collect::runq::RunqCpu;
    let b = 1_800_000_000u64;
    let s = |secs: f64| (secs * NS_PER_SEC as f64) as u64;
    let spin = Arc::new(Stack::new(vec![Arc::from("posix_lock_inode_[k]")], 0));
    let tick = |pid: u32| Tick { stack: spin.clone(), pid, comm: Arc::from("lock-hammer"), workload: Arc::from("") };
    let waits = || {
        let mut histogram = vec![0u64; profiler_common::LATENCY_BUCKETS as usize];
        histogram[profiler_common::latency_bucket(930_000_000) as usize] = 3;
        vec![RunqCpu::default(), RunqCpu { waits: 3, histogram, max_ns: 930_000_000, waiter: None }]
    };
    // `busy_cpu0`: CPU 0's samples of second b are busy (the hammer) or idle (room).
    let run = |busy_cpu0: bool| {
        let mut e = Engine::new(Machine { cpus: 2, frequency_hz: 99 }, Thresholds::default());
        e.tick(s(b as f64), s(b as f64));
        e.on_runq(s(b as f64 + 0.5), waits());
        // 11.7 s later by the wall clock the pipeline has handed on nothing of second b.
        let early = e.tick(s(b as f64), s(b as f64 + 11.7));
        assert!(early.opened.is_empty(), "judged before its samples arrived: {:?}", early.opened);
        for i in 0..99u64 {
            let ts = s(b as f64) + i * NS_PER_SEC / 99;
            e.on_busy(ts, 1, tick(40));
            if busy_cpu0 {
                e.on_busy(ts, 0, tick(41));
            } else {
                e.on_idle(ts, 0);
            }
        }
        e.tick(s(b as f64 + 1.03), s(b as f64 + 12.0)).opened
    };
    let saturated = run(true);
    assert!(saturated.iter().all(|f| f.kind != Kind::RunqStarvation), "{saturated:#?}");
    // The same waits with CPU 0 seen idle: a starvation, as before.
    let room = run(false);
    let found = room.iter().find(|f| f.kind == Kind::RunqStarvation && f.cpu == Some(1)).expect("a finding");
    assert!(found.summary.contains("(the other CPUs were 0 % busy)"), "{}", found.summary);
}

/// A second whose samples never arrive (the reader gone quiet) is judged after a while, with
/// its missing ticks as lost: no room is read into them.
#[test]
fn a_second_whose_samples_never_arrive_is_judged_late_with_its_ticks_unknown() {
    use crate::collect::runq::RunqCpu;
    let b = 1_800_000_000u64;
    let mut e = Engine::new(Machine { cpus: 2, frequency_hz: 99 }, Thresholds::default());
    e.tick(b * NS_PER_SEC, b * NS_PER_SEC);
    let mut histogram = vec![0u64; profiler_common::LATENCY_BUCKETS as usize];
    histogram[profiler_common::latency_bucket(930_000_000) as usize] = 3;
    e.on_runq(
        b * NS_PER_SEC,
        vec![RunqCpu::default(), RunqCpu { waits: 3, histogram, max_ns: 930_000_000, waiter: None }],
    );
    assert!(e.tick(b * NS_PER_SEC, (b + 50) * NS_PER_SEC).opened.is_empty());
    assert!(e.history.is_empty(), "second b judged before it was due");
    let late = e.tick(b * NS_PER_SEC, (b + 61) * NS_PER_SEC);
    assert!(late.opened.iter().all(|f| f.kind != Kind::RunqStarvation), "{:#?}", late.opened);
    let judged = e.history.iter().find(|s| s.start_ns == b * NS_PER_SEC).expect("judged");
    assert_eq!(judged.cpus.iter().map(|c| c.lost).collect::<Vec<_>>(), vec![99, 99]);
    // A sample of that second arriving now is too late to count.
    e.on_busy(
        b * NS_PER_SEC + 1,
        0,
        Tick { stack: Arc::new(Stack::new(vec![], 0)), pid: 1, comm: Arc::from("x"), workload: Arc::from("") },
    );
    assert!(e.pending.keys().all(|&k| k > b));
}

/// How severe a finding is comes from the thresholds, like whether it opens at all.
#[test]
fn the_critical_cutoffs_are_thresholds() {
    let count = Some(MemcgCount { ts_ns: NS_PER_SEC, live: 4, dying: 2000, stat_read_ns: None });
    let mut e = Engine::new(Machine { cpus: 2, frequency_hz: 99 }, Thresholds::default());
    assert_eq!(e.check_zombies_count(NS_PER_SEC, count).opened[0].severity, Severity::Warning);
    let t = Thresholds { zombie_critical: 1500, ..Thresholds::default() };
    let mut e = Engine::new(Machine { cpus: 2, frequency_hz: 99 }, t);
    assert_eq!(e.check_zombies_count(NS_PER_SEC, count).opened[0].severity, Severity::Critical);
}

#[test]
fn a_check_closes_only_the_kinds_it_judges() {
    let mut e = Engine::new(Machine { cpus: 2, frequency_hz: 99 }, Thresholds::default());
    let saturated = Active {
        kind: Kind::SaturatedCore,
        cpu: Some(1),
        subject: None,
        onset_ns: 0,
        severity: Severity::Critical,
        summary: "CPU 1 saturated for 3 s".into(),
        evidence: serde_json::json!({}),
    };
    assert_eq!(Kind::SaturatedCore.judged(), Judged::EachSecond);
    let mut changes = Changes::default();
    e.reconcile(vec![saturated], NS_PER_SEC, Some(Judged::EachSecond), &mut changes);
    assert_eq!(changes.opened.len(), 1);
    // Ten seconds later, the dying-memcg count without a finding: not the saturation's judge.
    let mut changes = Changes::default();
    e.reconcile(Vec::new(), 10 * NS_PER_SEC, Some(Judged::ZombieCount), &mut changes);
    assert!(changes.closed.is_empty(), "{changes:?}");
    e.reconcile(Vec::new(), 10 * NS_PER_SEC, Some(Judged::EachSecond), &mut changes);
    assert_eq!(changes.closed.len(), 1, "{changes:?}");
}

/// A second waits for the GPU poller's summary of it (made at the next second's first poll,
/// which on a real node came after the samples: `gpu-starved` never ran 10 s), and no longer
/// than `GPU_WAIT_NS` for a poller that stopped.
#[test]
fn a_second_is_judged_with_its_gpu_summary_or_a_few_seconds_late_without() {
    let b = 1_800_000_000u64;
    let s = |secs: f64| (secs * NS_PER_SEC as f64) as u64;
    let shared: crate::gpu_readings::Shared = Default::default();
    let mut e = Engine::new(Machine { cpus: 2, frequency_hz: 99 }, Thresholds::default());
    e.gpu = Some(shared.clone());
    let summarised = |second: u64| shared.lock().unwrap().seconds.push_back((second * NS_PER_SEC, Vec::new()));
    let judged = |e: &Engine, second: u64| e.history.iter().any(|x| x.start_ns == second * NS_PER_SEC);
    e.on_idle(s(b as f64 - 0.5), 0);
    summarised(b - 1);
    e.tick(s(b as f64 + 0.02), s(b as f64 + 0.02));
    assert!(judged(&e, b - 1));
    e.on_idle(s(b as f64 + 0.5), 0);
    e.on_idle(s(b as f64 + 1.5), 0);
    // Every sample of second b is in; its GPU summary is not.
    e.tick(s(b as f64 + 1.05), s(b as f64 + 1.05));
    assert!(!judged(&e, b), "judged without its GPU");
    summarised(b);
    e.tick(s(b as f64 + 1.1), s(b as f64 + 1.1));
    assert!(judged(&e, b));
    // The poller stopped: second b + 1 waits, then is judged all the same.
    e.tick(s(b as f64 + 4.9), s(b as f64 + 4.9));
    assert!(!judged(&e, b + 1));
    e.tick(s(b as f64 + 5.1), s(b as f64 + 5.1));
    assert!(judged(&e, b + 1));
}
