//! Detector 6 on this kernel: processes on both CPUs taking POSIX locks on one file spin on
//! its spin lock (`flc_lock`, in `posix_lock_inode`): a lock-spinning finding names the slow
//! path, `posix_lock_inode` as the contending caller and the processes. The same work on one
//! file per process (no lock shared: a busy, healthy machine) raises nothing.

use std::{process::Command, time::Duration};

use integration_tests::{Daemon, Kill, bin, in_own_autogroup, now_secs, privileged, profiler, status_json, wait_for};
use serde_json::Value;

fn lock_findings(dir: &str) -> Vec<Value> {
    let out = profiler(&["findings", "--data-dir", dir, "--from", "-15m", "--format", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let all: Vec<Value> = serde_json::from_slice(&out.stdout).expect("findings json");
    all.into_iter().filter(|f| f["kind"] == "lock-spinning").collect()
}

/// The session (scheduling autogroup) nice of the hammer and of the daemon.
const NICE: i32 = -20;

fn hammer(mode: &str, secs: u32, dir: &std::path::Path) -> Kill {
    // The hammer must hold both CPUs: contention needs two of its processes running at once.
    // Other sessions on this shared machine (builds, other test suites, daemons at nice -19)
    // otherwise take most of them: its own session at -20 (nice alone does not cross sessions
    // when autogroups are on; measured: 22-25 % of each CPU for the hammer at nice -10 against
    // two other sessions, 1-3 % of the CPU in the slow path). At nice -10 too, for a kernel
    // without autogroups.
    let hammer = bin("lock-hammer");
    let mut cmd = Command::new("nice");
    // 200 locks held: each call walks them under the spin lock. Measured with the hammer holding
    // both CPUs, 15 s windows: 22-31 % of each CPU in the slow path at 100 (the detector's
    // threshold is 20 %), 28-48 % at 200; `spread` 0 % at either.
    cmd.args(["-n", "-10"]).arg(hammer).args([mode, "4", &secs.to_string(), dir.to_str().unwrap(), "200"]);
    Kill(in_own_autogroup(&mut cmd, NICE).spawn().expect("spawn lock-hammer"))
}

#[test]
fn processes_on_both_cpus_contending_for_one_file_lock_are_found_and_the_same_work_unshared_is_not() {
    if !privileged("processes_on_both_cpus_contending_for_one_file_lock_are_found_and_the_same_work_unshared_is_not") {
        return;
    }
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        integration_tests::skip("one CPU: lock spinning needs two CPUs contending");
        return;
    }
    let files = tempfile::tempdir().expect("tempdir");
    // The daemon beside the hammer, as strong: its pipeline keeps up (starved, it fell 12-20 s
    // behind; the finding still comes once the samples arrive, but later).
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let mut daemon = Daemon::ready_in_own_autogroup(&data, &[], NICE);
    let dir = data.to_str().unwrap();

    // The healthy run first (a contended finding could still be open during it otherwise).
    let start = now_secs();
    let spread = hammer("spread", 15, files.path());
    let judged = start + 15.0;
    wait_for("the store to reach past the unshared run", Duration::from_secs(60), || {
        let end = status_json(&data)?["summary"]["span"][1].as_u64()? as f64 / 1e9;
        (end > judged + 3.0).then_some(())
    });
    drop(spread);
    let healthy = lock_findings(dir);
    assert!(healthy.is_empty(), "the same lock work on separate files raised: {healthy:#?}");

    let start = now_secs();
    let contend = hammer("contend", 120, files.path());
    let (f, seen) = wait_for("a lock-spinning finding", Duration::from_secs(90), || {
        lock_findings(dir).into_iter().next().map(|f| (f, now_secs()))
    });
    let summary = f["summary"].as_str().unwrap_or_default().to_string();
    eprintln!("lock-spinning after {:.1} s: {summary}", seen - start);
    let lock = f["evidence"]["function"].as_str().unwrap_or_default();
    assert!(lock.contains("spin_lock_slowpath") || lock.starts_with("_raw_spin_lock"), "{f:#}");
    assert_eq!(f["evidence"]["callers"][0]["function"], "posix_lock_inode", "{f:#}");
    assert!(f["evidence"]["cpus"].as_array().is_some_and(|c| c.len() >= 2), "{f:#}");
    assert_eq!(f["evidence"]["processes"][0]["comm"], "lock-hammer", "{f:#}");
    assert!(summary.contains("contending callers: posix_lock_inode"), "{summary}");
    // The command the finding suggests shows the slow path under posix_lock_inode.
    let cpu = f["evidence"]["cpus"][0]["cpu"].to_string();
    let id = f["id"].as_str().unwrap();
    assert!(summary.contains(&format!("profiler flamegraph --around {id} --cpu")), "{summary}");
    let stacks = integration_tests::folded(dir, &["--around", id, "--cpu", &cpu]).expect("flamegraph");
    assert!(stacks.iter().any(|(s, _)| s.contains("posix_lock_inode") && s.contains(lock)), "{stacks:?}");
    // The hammer first: under eight nice -10 processes the daemon (nice 0) gets about 1 % of
    // the CPUs, and the seconds its pipeline is behind are handled before it exits.
    drop(contend);
    assert!(daemon.stop().success());
}
