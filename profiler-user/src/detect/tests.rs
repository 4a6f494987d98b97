use super::*;

#[test]
fn an_open_findings_new_figures_are_handed_out_at_most_every_few_seconds() {
    let mut e = Engine::new(Machine { cpus: 2, frequency_hz: 99 }, Thresholds::default());
    let s = |n: u64| n * NS_PER_SEC;
    let count = |at: u64, dying: u64| Some(zombies::MemcgCount { ts_ns: at, live: 4, dying, stat_read_ns: None });
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
