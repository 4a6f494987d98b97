//! A store outlives the daemon's settings: a window recorded at 99 Hz reads the same after the
//! daemon restarted at 999 Hz (issue 11). Before format 4, the old part read as 10 % busy,
//! because every window was read with the current daemon's frequency.

use std::{path::Path, process::Command};

use integration_tests::{Daemon, helper_bin, now_secs, privileged, profiler};

/// Spins on CPU 1 for `secs`; returns the whole seconds it certainly covered.
fn spin(secs: f64) -> (u64, u64) {
    let start = now_secs();
    let st =
        Command::new(helper_bin()).args(["1", &secs.to_string()]).stdout(std::process::Stdio::null()).status().unwrap();
    assert!(st.success());
    let end = now_secs();
    (start.ceil() as u64 + 1, end.floor() as u64 - 1)
}

/// CPU 1's mean busy share over whole seconds `[from, to)`, from `profiler cputime --format csv`.
fn busy_share(data: &Path, (from, to): (u64, u64)) -> f64 {
    let out = profiler(&[
        "cputime",
        "--data-dir",
        data.to_str().unwrap(),
        "--from",
        &from.to_string(),
        "--to",
        &to.to_string(),
        "--format",
        "csv",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let shares: Vec<f64> = text
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f.get(1) == Some(&"1")).then(|| f[2].parse::<f64>().unwrap())
        })
        .collect();
    assert!(!shares.is_empty(), "no CPU 1 rows in:\n{text}");
    shares.iter().sum::<f64>() / shares.len() as f64
}

#[test]
fn a_window_recorded_at_99_hz_reads_the_same_after_a_restart_at_999_hz() {
    if !privileged("a_window_recorded_at_99_hz_reads_the_same_after_a_restart_at_999_hz") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut daemon = Daemon::start(&data, &["--frequency", "99", "--listen", "off"]);
    daemon.wait_ready();
    let slow = spin(4.0);
    daemon.wait_ready_since(slow.1 as f64 + 1.0);
    let at_99 = busy_share(&data, slow);
    assert!(daemon.stop().success());

    let mut daemon = Daemon::start(&data, &["--frequency", "999", "--listen", "off"]);
    daemon.wait_ready_since(now_secs());
    let fast = spin(4.0);
    daemon.wait_ready_since(fast.1 as f64 + 1.0);
    let after = busy_share(&data, slow);
    let at_999 = busy_share(&data, fast);
    eprintln!("CPU 1 busy: 99 Hz part {at_99:.3} (read after the restart: {after:.3}), 999 Hz part {at_999:.3}");
    assert!(at_99 > 0.8 && at_999 > 0.8, "a spinning CPU reads {at_99} at 99 Hz and {at_999} at 999 Hz");
    assert!((after - at_99).abs() < 0.02, "the 99 Hz part reads {after} after the restart, {at_99} before");
    assert!(daemon.stop().success());
}
