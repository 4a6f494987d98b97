//! The flight recorder on this kernel: a finding that opens on CPU 1 (a thread starved there
//! by a SCHED_FIFO spinner, detector 7) raises CPU 1's sampling to 999 Hz for 5 s. The
//! recording the finding links to holds ~10x the samples the main store holds for the same
//! window and CPU, and the main store stays at the base 99 Hz (what its queries and detectors
//! assume).

use std::{process::Command, time::Duration};

use integration_tests::{Daemon, Kill, bin, folded_window, helper_bin, now_secs, privileged, profiler, wait_for_every};
use serde_json::Value;

fn spawn(cmd: &mut Command) -> Kill {
    Kill(cmd.stdout(std::process::Stdio::null()).spawn().expect("spawn"))
}

fn findings(dir: &str) -> Vec<Value> {
    let out = profiler(&["findings", "--data-dir", dir, "--from", "-15m", "--format", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("findings json")
}

fn samples(dir: &str, from: f64, to: f64) -> u64 {
    folded_window(dir, from, to, &["--cpu", "1"]).unwrap_or_default().iter().map(|(_, n)| n).sum()
}

#[test]
fn a_finding_on_a_cpu_records_it_at_999_hz_beside_a_main_store_kept_at_99() {
    if !privileged("a_finding_on_a_cpu_records_it_at_999_hz_beside_a_main_store_kept_at_99") {
        return;
    }
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        integration_tests::skip("one CPU: the scenario starves CPU 1");
        return;
    }
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), "[flight]\nhz = 999\nsecs = 5\nkeep = 3\n").unwrap();
    let (_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&["--config", config.path().to_str().unwrap()]);
    let dir = data.to_str().unwrap();

    let _napper = spawn(Command::new(bin("napper")).args(["1", "30"]));
    let mut hog = spawn(Command::new("chrt").args(["-f", "50"]).arg(helper_bin()).args(["1", "15"]));
    let f = wait_for_every(
        "a finding on CPU 1 with a flight recording",
        Duration::from_secs(25),
        Duration::from_millis(250),
        || findings(dir).into_iter().find(|f| f["cpu"] == 1 && f["evidence"]["flight_recording"].is_object()),
    );
    let link = f["evidence"]["flight_recording"].clone();
    assert_eq!(link["hz"], 999, "{link}");
    assert_eq!(link["cpu"], 1, "{link}");
    let recording = link["dir"].as_str().unwrap().to_string();
    assert!(recording.starts_with(&format!("{dir}/flight/")), "{link}");
    let (from, to) = (link["from_ns"].as_f64().unwrap() / 1e9, link["to_ns"].as_f64().unwrap() / 1e9);
    assert!((to - from - 5.0).abs() < 0.01, "{link}");
    // The recording is complete once the main store has passed its end.
    wait_for_every(
        "the store to pass the recording's end",
        Duration::from_secs(20),
        Duration::from_millis(250),
        || (now_secs() > to + 2.0 && samples(dir, to, to + 1.0) > 0).then_some(()),
    );
    assert!(hog.0.wait().unwrap().success(), "chrt -f 50 busy-helper");
    // Whole seconds inside the recording, where CPU 1 was the spinner's the whole time.
    let (a, b) = (from.ceil(), to.floor());
    let recorded = samples(&recording, a, b);
    let main = samples(dir, a, b);
    let secs = b - a;
    let bytes: u64 = std::fs::read_dir(format!("{recording}/segments"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    eprintln!(
        "flight recording {recording}: {recorded} samples on CPU 1 in {secs} s, {bytes} bytes on disk for its 5 s; main store {main}"
    );
    assert!(recorded as f64 >= 0.8 * 999.0 * secs, "{recorded} samples in {secs} s at 999 Hz");
    assert!((0.8 * 99.0 * secs..=1.1 * 99.0 * secs).contains(&(main as f64)), "main store: {main} in {secs} s");
    // The command the finding shows reads the recording.
    let command: Vec<&str> = link["command"].as_str().unwrap().split_whitespace().collect();
    assert_eq!(command[..2], ["profiler", "flamegraph"], "{link}");
    let mut args = command[1..].to_vec();
    args.extend(["--format", "folded"]);
    let out = profiler(&args);
    assert!(out.status.success(), "{}: {}", link["command"], String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("profiler_test_hot_loop"), "{link}");
    assert!(daemon.stop().success());
}

/// `dd` copying zeros to nothing on CPU 1 (time in the kernel: a saturated core), as root or as
/// user nobody, at nice -20 (set by root before it drops to nobody): whatever else the machine
/// runs, CPU 1 is dd's in the kernel while it runs, and not when it stops.
fn kernel_spinner(as_nobody: bool) -> Kill {
    let mut cmd = Command::new("nice");
    cmd.args(["-n", "-20", "setpriv"]);
    if as_nobody {
        cmd.args(["--reuid", "65534", "--regid", "65534", "--clear-groups"]);
    }
    cmd.args(["--", "taskset", "-c", "1", "dd", "if=/dev/zero", "of=/dev/null", "bs=4M"]);
    spawn(cmd.stderr(std::process::Stdio::null()))
}

/// Issue 25: a user who spins in the kernel again and again opens a finding each time, but
/// causes at most 3 recordings an hour, so that root's recording of the same kind (the kinds
/// are shared fairly, the newest of a kind kept) is not replaced.
#[test]
fn a_user_opening_findings_again_and_again_does_not_replace_roots_recording() {
    if !privileged("a_user_opening_findings_again_and_again_does_not_replace_roots_recording") {
        return;
    }
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        integration_tests::skip("one CPU: the scenario spins on CPU 1");
        return;
    }
    let config = tempfile::NamedTempFile::new().unwrap();
    // A core saturated in the kernel after 2 s whatever else runs, recordings of 2 s, 5 kept:
    // root's, the user's 3, and room for one more of root's (a finding about another process,
    // when something else shares the machine); without the bound the user's 5 replace root's.
    // No hot kernel function findings (a share of 1.0): dd's spin opened them too, now and then,
    // after dd had exited (their owner gone, not the user). Their recordings once replaced
    // root's (a suite of 2026-11-30); a user's recording no longer replaces root's (the unit
    // test `users_recordings_never_replace_roots_and_roots_replace_users_first`), but they
    // would still make this count of the user's recordings depend on timing.
    std::fs::write(
        config.path(),
        "[flight]\nhz = 999\nsecs = 2\nkeep = 5\n[detect]\nsaturated_secs = 2\nmachine_busy_max = 1.0\nsaturated_kernel_min = 0.6\n\
         hot_share = 1.0\nwatch_share = 1.0\nhot_critical_share = 1.0\n",
    )
    .unwrap();
    let (_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&["--config", config.path().to_str().unwrap()]);
    let dir = data.to_str().unwrap();
    let on_cpu1 = |dir: &str| -> Vec<Value> {
        findings(dir).into_iter().filter(|f| f["cpu"] == 1 && f["kind"] == "saturated-core").collect()
    };
    // One round: spin until a saturated-core finding about dd opens on CPU 1, stop, wait until
    // it closes; the finding. (Other findings, of the daemon's own start or of whatever else
    // shares the machine, are not the rounds'.)
    let mut seen: Vec<Value> = Vec::new();
    let mut round = |as_nobody: bool, n: usize| -> Value {
        let spinner = kernel_spinner(as_nobody);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let opened = loop {
            let all = on_cpu1(dir);
            let new = all.iter().find(|f| {
                f["end_ns"].is_null() && f["evidence"]["top_processes"][0]["comm"] == "dd" && !seen.contains(&f["id"])
            });
            if let Some(f) = new {
                break f.clone();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out after 60 s waiting for saturated-core finding #{n} about dd on CPU 1: {all:#?}\n{}",
                daemon.log_text()
            );
            std::thread::sleep(Duration::from_millis(250));
        };
        drop(spinner);
        let id = opened["id"].clone();
        seen.push(id.clone());
        wait_for_every("the finding to close", Duration::from_secs(60), Duration::from_millis(250), || {
            on_cpu1(dir).iter().any(|f| f["id"] == id && !f["end_ns"].is_null()).then_some(())
        });
        opened
    };
    let roots = round(false, 1);
    let root_recording = roots["evidence"]["flight_recording"]["dir"].as_str().expect("root's recording").to_string();
    let mut users = Vec::new();
    for n in 2..=6 {
        users.push(round(true, n));
    }
    let recorded = users.iter().filter(|f| f["evidence"]["flight_recording"].is_object()).count();
    let left: Vec<String> = std::fs::read_dir(format!("{dir}/flight"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    eprintln!("the user's 5 findings made {recorded} recordings; left: {left:?}");
    assert_eq!(recorded, 3, "the user's findings: {users:#?}");
    assert!(std::path::Path::new(&root_recording).is_dir(), "root's recording {root_recording} was replaced: {left:?}");
    assert!(left.len() <= 5, "{left:?}");
    assert!(daemon.log_text().contains("caused 3 flight recordings in the last hour"), "{}", daemon.log_text());
    // Named for their owner (what pruning goes by); root's for none.
    for f in users.iter().filter_map(|f| f["evidence"]["flight_recording"]["dir"].as_str()) {
        assert!(f.ends_with("-u65534"), "a recording of user nobody's dd: {f}");
    }
    let root_name = std::path::Path::new(&root_recording).file_name().unwrap().to_string_lossy().into_owned();
    // `KIND-cpuN-START`: its last part is the onset, not an owner (`uUID`, `gone`).
    let last = root_name.rsplit('-').next().unwrap_or_default();
    assert!(last.bytes().all(|b| b.is_ascii_digit()), "root's recording carries no owner: {root_recording}");
    assert!(daemon.stop().success());
}
