use std::sync::Arc;

use super::*;

const S: u64 = NS_PER_SEC;

fn reading(path: &str, periods: u64, throttled: u64, pids: &[u32]) -> Reading {
    Reading {
        version: Version::V1,
        path: path.into(),
        quota: Quota { quota_us: 20_000, period_us: 100_000 },
        stat: CpuStat { nr_periods: periods, nr_throttled: throttled, throttled_ns: throttled * 80_000_000 },
        pids: pids.to_vec(),
        ids: Vec::new(),
    }
}

fn tick(pid: u32, comm: &str, frames: &[&str]) -> Tick {
    Tick {
        stack: Arc::new(Stack::new(frames.iter().map(|f| Arc::from(*f)).collect(), frames.len())),
        pid,
        comm: Arc::from(comm),
        workload: Default::default(),
    }
}

/// Scans every 5 s; each interval adds `per_interval` (periods, throttled) to the counters.
fn run(d: &mut Throttle, per_interval: &[(u64, u64)]) -> Vec<Vec<Active>> {
    let t = Thresholds::default();
    let (mut periods, mut throttled) = (1000, 10);
    let mut out = vec![d.evaluate(100 * S, Some(vec![reading("/busy", periods, throttled, &[42])]), &t)];
    for (i, (p, th)) in per_interval.iter().enumerate() {
        (periods, throttled) = (periods + p, throttled + th);
        let now = (105 + 5 * i as u64) * S;
        out.push(d.evaluate(now, Some(vec![reading("/busy", periods, throttled, &[42])]), &t));
    }
    out
}

#[test]
fn a_cgroup_throttled_in_most_periods_is_reported_with_what_it_ran() {
    let mut d = Throttle::default();
    d.evaluate(100 * S, Some(vec![reading("/busy", 1000, 10, &[42])]), &Thresholds::default());
    // What pid 42 ran meanwhile (pid 7 is in no quota cgroup).
    for i in 0..300 {
        let ts = 101 * S + i * 10_000_000;
        let t = if i % 10 == 0 { tick(42, "busy", &["main", "parse"]) } else { tick(42, "busy", &["main", "spin"]) };
        d.on_tick(ts, 0, &t);
        d.on_tick(ts, 0, &tick(7, "other", &["main", "elsewhere"]));
    }
    let out = d.evaluate(105 * S, Some(vec![reading("/busy", 1050, 55, &[42])]), &Thresholds::default());
    assert_eq!(out.len(), 1);
    let a = &out[0];
    assert_eq!((a.kind, a.cpu, a.severity, a.onset_ns), (Kind::CfsThrottling, None, Severity::Critical, 100 * S));
    assert_eq!(
        a.summary,
        format!(
            "cgroup v1 cpu:/busy throttled in 90 % of its CPU periods over 5 s (45 of 50; its threads waited 3.6 s \
             throttled) by its quota of 0.20 CPU (20 ms per 100 ms); it ran busy (pid 42) 100 %; hottest functions: \
             spin 90 %, parse 10 %; next: if the work is expected, raise cpu.cfs_quota_us (now 20000 per 100000 us); \
             else see what busy burns: profiler flamegraph --around {} --pid 42",
            super::super::finding::finding_id_of(Kind::CfsThrottling, None, a.subject.as_deref(), 100 * S)
        )
    );
    assert_eq!(a.evidence["top_stacks"][0]["stack"], "main;spin");
    assert_eq!(a.evidence["top_stacks"][0]["samples"], 270);
    assert_eq!(a.evidence["samples"], 300, "pid 7's samples are not the cgroup's");
    assert_eq!(a.evidence["throttled_share"], 0.9);
}

#[test]
fn onset_holds_while_throttled_and_a_healthy_cgroup_is_quiet() {
    // 20 % of periods throttled (below 25 %), then 60 %, then none.
    let out = run(&mut Throttle::default(), &[(50, 10), (50, 10), (50, 30), (50, 30), (50, 0), (50, 0), (50, 0)]);
    let fired: Vec<bool> = out.iter().map(|a| !a.is_empty()).collect();
    // The 10 s window reaches back two readings: at 115 s 40 of 100 periods, at 120 s 60, at
    // 125 s 30; at 130 s none.
    assert_eq!(fired, [false, false, false, true, true, true, false, false]);
    assert_eq!(out[3][0].onset_ns, 105 * S, "the start of the measured window");
    assert_eq!(out[4][0].onset_ns, 105 * S, "kept while the condition holds");
    assert_eq!(out[3][0].severity, Severity::Warning, "40 %");
    assert_eq!(out[4][0].severity, Severity::Critical, "60 %");
    assert_eq!(out[4][0].evidence["throttled_share"], 0.6);
}

#[test]
fn too_few_periods_or_a_single_reading_say_nothing() {
    // 5 periods, all throttled: a cgroup that woke for half a second.
    assert!(run(&mut Throttle::default(), &[(5, 5), (4, 4)]).iter().all(Vec::is_empty));
    // One reading: no span to judge.
    let mut d = Throttle::default();
    assert!(d.evaluate(S, Some(vec![reading("/busy", 100, 100, &[1])]), &Thresholds::default()).is_empty());
    // Counters that went back (the cgroup was made anew): start over.
    assert!(d.evaluate(6 * S, Some(vec![reading("/busy", 10, 0, &[1])]), &Thresholds::default()).is_empty());
    let out = d.evaluate(11 * S, Some(vec![reading("/busy", 60, 50, &[1])]), &Thresholds::default());
    assert_eq!(out[0].evidence["periods"], 50);
}

#[test]
fn samples_go_to_the_innermost_quota_cgroup_and_the_pod_is_named() {
    let uid = "0b3c6d1e-1111-2222-3333-444455556666";
    let pod = format!("/kubepods/burstable/pod{uid}");
    let container = format!("{pod}/{}", "ab".repeat(32));
    let t = Thresholds::default();
    let mut d = Throttle::default();
    d.evaluate(0, Some(vec![reading(&pod, 0, 0, &[42, 43]), reading(&container, 0, 0, &[42])]), &t);
    let identity = crate::identity::Identity {
        pod_namespace: Some("ml".into()),
        pod_name: Some("trainer-0".into()),
        container_name: Some("main".into()),
        container_id: Some("ab".repeat(32).into()),
        pod_uid: Some(uid.into()),
        ..Default::default()
    };
    let workload: Arc<str> = crate::identity::workloads::encode(&identity).into();
    for i in 0..100 {
        let mut t42 = tick(42, "trainer", &["main", "step"]);
        t42.workload = workload.clone();
        d.on_tick(S + i * 10_000_000, 0, &t42);
        d.on_tick(S + i * 10_000_000, 0, &tick(43, "sidecar", &["main", "poll"]));
    }
    let out = d.evaluate(5 * S, Some(vec![reading(&pod, 50, 40, &[42, 43]), reading(&container, 50, 40, &[42])]), &t);
    assert_eq!(out.len(), 2);
    let on = |p: &str| out.iter().find(|a| a.evidence["path"] == p).unwrap();
    let c = on(&container);
    assert!(c.summary.contains("(pod ml/trainer-0 container main) throttled in 80 %"), "{}", c.summary);
    assert!(c.summary.contains("it ran trainer (pid 42, pod ml/trainer-0 container main) 100 %"), "{}", c.summary);
    assert!(c.summary.contains("raise the pod's resources.limits.cpu (now 200m)"), "{}", c.summary);
    let p = on(&pod);
    assert!(p.summary.contains("(pod ml/trainer-0) throttled"), "the pod, not one container: {}", p.summary);
    assert!(p.summary.contains("sidecar (pid 43) 50 %"), "the pod's profile has its containers': {}", p.summary);
    assert!(!c.summary.contains("sidecar"), "pid 43 is in the pod only: {}", c.summary);
    assert_ne!(c.subject, p.subject, "two findings, two ids");
}

#[test]
fn v2_samples_match_by_cgroup_id_and_softirq_work_is_left_out() {
    let t = Thresholds::default();
    let mut d = Throttle::default();
    let mut r = reading("/system.slice/batch.service", 0, 0, &[]);
    (r.version, r.ids) = (Version::V2, vec![777]);
    d.evaluate(0, Some(vec![r.clone()]), &t);
    d.on_tick(S, 777, &tick(99, "batch", &["main", "crunch"]));
    let softirq = Context::Softirq(3).mark(&Stack::new(vec![Arc::from("net_rx_action")], 0));
    d.on_tick(S, 777, &Tick { stack: Arc::new(softirq), ..tick(99, "batch", &[]) });
    r.stat = CpuStat { nr_periods: 40, nr_throttled: 30, throttled_ns: 2_000_000_000 };
    let a = &d.evaluate(5 * S, Some(vec![r]), &t)[0];
    assert!(
        a.summary.starts_with("cgroup /system.slice/batch.service (unit batch.service) throttled in 75 %"),
        "{}",
        a.summary
    );
    assert!(a.summary.contains("raise cpu.max (now \"20000 100000\")"), "{}", a.summary);
    assert_eq!(a.evidence["samples"], 1, "the softirq sample is not the cgroup's");
}

#[test]
fn subjects_are_safe_in_ids_and_tell_cgroups_apart() {
    let a = subject("v1 cpu:/kubepods/pod1/container");
    let b = subject("v1 cpu:/kubepods/pod2/container");
    assert!(a.starts_with("container-") && b.starts_with("container-") && a != b, "{a} {b}");
    assert_eq!(subject("/a b/c;d\"e").split('-').next(), Some("c_d_e"));
}

#[test]
fn profiles_are_bounded_in_time() {
    let mut d = Throttle::default();
    d.evaluate(0, Some(vec![reading("/busy", 0, 0, &[42])]), &Thresholds::default());
    for s in 0..200 {
        d.on_tick(s * S, 0, &tick(42, "busy", &["main"]));
    }
    let kept = d.profiles.values().next().unwrap();
    assert!(kept.len() <= 21, "{} seconds kept", kept.len());
    assert_eq!(kept.back().unwrap().second, 199);
}
