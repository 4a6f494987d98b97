//! Least privilege: the daemon runs with exactly the capabilities README.md lists (no other
//! root power: `setpriv` empties the bounding set but for them), symbolizes user and kernel
//! frames, and without a required capability says which one it lacks.

use std::{process::Command, time::Duration};

use integration_tests::{Daemon, Kill, folded_window, helper_bin, now_secs, privileged, wait_for};

const CAPS: &str = "-all,+bpf,+perfmon,+sys_ptrace,+dac_read_search,+syslog";

#[test]
fn runs_with_only_the_documented_capabilities() {
    if !privileged("runs_with_only_the_documented_capabilities") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let wrapper = ["setpriv", "--bounding-set", CAPS, "--inh-caps=-all", "--"];
    let mut daemon = Daemon::start_wrapped(&wrapper, &data, &["--listen", "off"], 200);
    daemon.wait_ready();
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.child.as_ref().unwrap().id())).unwrap();
    let eff = status.lines().find_map(|l| l.strip_prefix("CapEff:")).unwrap().trim().to_string();
    let eff = u64::from_str_radix(&eff, 16).unwrap();
    let allowed: u64 = [39, 38, 19, 2, 34].iter().map(|b| 1u64 << b).sum();
    assert_eq!(eff & !allowed, 0, "the daemon holds more than the documented capabilities: {eff:#x}");

    // A user-space spinner on CPU 1, then a kernel-space one: both symbolized. The kernel
    // spinner runs until its samples are on disk: a fixed amount of work (`dd count=N`) took
    // 0.19 s on one machine and left no sample to check.
    let start = now_secs();
    let st = Command::new(helper_bin()).args(["1", "2"]).stdout(std::process::Stdio::null()).status().unwrap();
    assert!(st.success());
    let user_end = now_secs();
    let dd = Kill(
        Command::new("taskset")
            .args(["-c", "1", "dd", "if=/dev/zero", "of=/dev/null", "bs=1M"])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let in_kernel = |s: &str| s.starts_with("dd;") && s.contains("_[k]");
    let stacks = wait_for("100 samples of dd on CPU 1", Duration::from_secs(20), || {
        let stacks = folded_window(data.to_str().unwrap(), start, now_secs(), &["--cpu", "1"]).ok()?;
        let dd: u64 = stacks.iter().filter(|(s, _)| in_kernel(s)).map(|(_, n)| n).sum();
        (dd >= 100).then_some(stacks)
    });
    drop(dd);
    assert!(
        stacks.iter().any(|(s, _)| s.contains(";profiler_test_hot_loop")),
        "user frames not symbolized (spinner ran {start:.3}..{user_end:.3}): {stacks:?}"
    );
    assert!(
        stacks.iter().any(|(s, _)| in_kernel(s) && !s.contains("[unknown]_[k]")),
        "kernel frames not symbolized: {stacks:?}"
    );
    assert!(daemon.stop().success(), "{}", daemon.log_text());
}

#[test]
fn a_missing_capability_is_named() {
    if !privileged("a_missing_capability_is_named") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new("setpriv")
        .args(["--bounding-set", "-all,+perfmon,+sys_ptrace,+syslog", "--inh-caps=-all", "--"])
        .arg(integration_tests::profiler_bin())
        .args(["run", "--listen", "off", "--data-dir"])
        .arg(tmp.path().join("data"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("lacks CAP_BPF") && !err.contains("panicked"), "{err}");
}
