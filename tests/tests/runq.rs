//! Detector 7 on this kernel: a thread that wakes every 2 ms on CPU 1 while a SCHED_FIFO
//! spinner holds that CPU waits up to ~950 ms each time (real-time throttling leaves normal
//! threads 5 % of a second): a runq-starvation finding names it, the spinner with its policy
//! and the p99 wait of every CPU. The same napper beside a normal spinner on CPU 1 (time
//! sharing: the scheduler gives a briefly waking thread the CPU within milliseconds) raises
//! nothing.

use std::{process::Command, time::Duration};

use integration_tests::{Daemon, Kill, bin, helper_bin, now_secs, privileged, profiler, status_json, wait_for_every};
use serde_json::Value;

fn runq_findings(dir: &str) -> Vec<Value> {
    let out = profiler(&["findings", "--data-dir", dir, "--from", "-15m", "--format", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let all: Vec<Value> = serde_json::from_slice(&out.stdout).expect("findings json");
    all.into_iter().filter(|f| f["kind"] == "runq-starvation").collect()
}

/// A per-CPU kernel thread of CPU 1: `kworker/1:4`, `ksoftirqd/1`, `migration/1`.
fn of_cpu_1(thread: &str) -> bool {
    thread.split_once('/').is_some_and(|(name, cpu)| {
        !name.is_empty() && (cpu == "1" || cpu.strip_prefix("1:").is_some_and(|n| !n.is_empty()))
    })
}

#[test]
fn a_kernel_thread_of_cpu_1_is_told_from_others() {
    for name in ["kworker/1:4", "ksoftirqd/1", "migration/1", "kworker/1:0H"] {
        assert!(of_cpu_1(name), "{name}");
    }
    for name in ["napper", "kworker/11:2", "kworker/u4:1", "ksoftirqd/0", "kworker/1:", "/1"] {
        assert!(!of_cpu_1(name), "{name}");
    }
}

fn spawn(cmd: &mut Command) -> Kill {
    Kill(cmd.stdout(std::process::Stdio::null()).spawn().expect("spawn"))
}

#[test]
fn a_thread_kept_off_its_cpu_by_a_realtime_spinner_is_found_and_time_sharing_is_not() {
    if !privileged("a_thread_kept_off_its_cpu_by_a_realtime_spinner_is_found_and_time_sharing_is_not") {
        return;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    // CPU 0 must have room for CPU 1's waits to count (waits everywhere are overload).
    if cpus < 2 {
        integration_tests::skip("one CPU: the scenario starves CPU 1");
        return;
    }
    let (_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&[]);
    let dir = data.to_str().unwrap();

    // Healthy: the napper shares CPU 1 with a normal spinner while CPU 0 has room; the
    // scheduler gives a thread that wakes briefly the CPU within milliseconds.
    let start = now_secs();
    let mut busy = spawn(Command::new(helper_bin()).args(["1", "15"]));
    let _napper = spawn(Command::new(bin("napper")).args(["1", "15"]));
    assert!(busy.0.wait().unwrap().success());
    let judged = start + 15.0;
    wait_for_every(
        "the store to reach past the healthy run",
        Duration::from_secs(30),
        Duration::from_millis(250),
        || {
            let end = status_json(&data)?["summary"]["span"][1].as_u64()? as f64 / 1e9;
            (end > judged + 3.0).then_some(())
        },
    );
    let healthy = runq_findings(dir);
    assert!(healthy.is_empty(), "time sharing on a busy machine raised: {healthy:#?}");

    // Starved: the napper on CPU 1 behind a SCHED_FIFO spinner for 6 s.
    let _napper = spawn(Command::new(bin("napper")).args(["1", "20"]));
    let start = now_secs();
    let mut hog = spawn(Command::new("chrt").args(["-f", "50"]).arg(helper_bin()).args(["1", "6"]));
    let (f, seen) =
        wait_for_every("a runq-starvation finding", Duration::from_secs(20), Duration::from_millis(250), || {
            runq_findings(dir).into_iter().find(|f| f["cpu"] == 1).map(|f| (f, now_secs()))
        });
    assert!(hog.0.wait().unwrap().success(), "chrt -f 50 busy-helper");
    let summary = f["summary"].as_str().unwrap_or_default();
    eprintln!("runq-starvation after {:.1} s: {summary}", seen - start);
    let e = &f["evidence"];
    // The BPF side names the longest waiter of each second on the CPU. Behind the spinner every
    // normal thread of CPU 1 waits for the throttle's release, so the longest can be the
    // napper or one of CPU 1's own kernel threads (CI saw `kworker/1:4` wait 949 ms); never a
    // thread of another CPU.
    let (comm, thread) = (e["waiter"]["comm"].as_str().unwrap_or(""), e["waiter"]["thread"].as_str().unwrap_or(""));
    assert!(comm == "napper" || of_cpu_1(thread), "the waiter is neither the napper nor a kernel thread of CPU 1: {f}");
    assert!(summary.starts_with(&format!("CPU 1: {comm} (pid ")), "{f}");
    assert!(summary.contains("busy-helper (pid") && summary.contains("SCHED_FIFO 50"), "{f}");
    assert!(summary.contains("look next: the real-time thread on CPU 1"), "{f}");
    assert!(e["wait_max_ms"].as_f64().unwrap() >= 500.0, "{f}");
    assert_eq!(e["wait_p99_ms_per_cpu"].as_array().map(Vec::len), Some(cpus), "{f}");
    // The same waits as a kernel-counter track on the time axis (written once a second).
    let longest = || {
        let out = profiler(&[
            "counters",
            "--data-dir",
            dir,
            "--from",
            "-2m",
            "--to",
            "now",
            "--name",
            "sched.runq_wait_max",
            "--cpu",
            "1",
            "--format",
            "json",
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let tracks: Value = serde_json::from_slice(&out.stdout).expect("counters JSON");
        tracks["tracks"][0]["points"]
            .as_array()
            .map(|p| p.iter().filter_map(|p| p[1].as_f64()).fold(0.0, f64::max))
            .unwrap_or(0.0)
    };
    wait_for_every(
        "sched.runq_wait_max of CPU 1 over 500 ms",
        Duration::from_secs(15),
        Duration::from_millis(500),
        || (longest() >= 500.0).then_some(()),
    );
    assert!(daemon.stop().success());
}

/// The largest `ring_to_disk_max_ms` of the daemon's self reports: how far its pipeline fell
/// behind the ring.
fn lag_ms(log: &str) -> f64 {
    log.lines()
        .filter_map(|l| l.split("ring_to_disk_max_ms=").nth(1)?.split_whitespace().next()?.parse::<f64>().ok())
        .fold(0.0, f64::max)
}

/// Both CPUs saturated as the lock hammer saturates them (four nice -10 processes on each): the
/// daemon's own threads (nice 0) wait long for a CPU and its pipeline falls seconds behind the
/// ring, but no CPU had room: overload, not starvation. Before the detectors waited for a
/// second's samples to arrive, the seconds not yet handled read as idle CPUs and this raised
/// findings naming the daemon's threads, "the other CPUs were 0 % busy".
#[test]
fn a_machine_saturated_like_the_lock_hammer_raises_no_runq_finding() {
    if !privileged("a_machine_saturated_like_the_lock_hammer_raises_no_runq_finding") {
        return;
    }
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        integration_tests::skip("one CPU: no other CPU to have room");
        return;
    }
    let files = tempfile::tempdir().expect("tempdir");
    let (_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&["--listen", "off", "--report-secs", "2"]);
    let dir = data.to_str().unwrap();
    let start = now_secs();
    const SECS: f64 = 20.0;
    let mut hammer = spawn(Command::new("nice").args(["-n", "-10"]).arg(bin("lock-hammer")).args([
        "spread",
        "4",
        &SECS.to_string(),
        files.path().to_str().unwrap(),
        "100",
    ]));
    assert!(hammer.0.wait().unwrap().success(), "lock-hammer");
    // Every second of the run judged: the store reaches past it (the pipeline caught up).
    wait_for_every("the store to reach past the run", Duration::from_secs(120), Duration::from_millis(500), || {
        let end = status_json(&data)?["summary"]["span"][1].as_u64()? as f64 / 1e9;
        (end > start + SECS + 3.0).then_some(())
    });
    let found = runq_findings(dir);
    let log = daemon.log_text();
    eprintln!("the pipeline was up to {:.0} ms behind the ring", lag_ms(&log));
    assert!(found.is_empty(), "a saturated machine raised run-queue findings: {found:#?}");
    assert!(daemon.stop().success());
}
