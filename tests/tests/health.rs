//! `profiler health`, the liveness probe (issue 14 B2): cheap, and failing for a daemon that is
//! gone or hung, not only for one that never started.

use std::time::Duration;

use integration_tests::{Daemon, privileged, profiler, wait_for};

/// (healthy?, what it said).
fn health(data: &std::path::Path) -> (bool, String) {
    let out = profiler(&["health", "--data-dir", data.to_str().unwrap(), "--max-age", "2s"]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), said)
}

#[test]
fn health_fails_for_a_hung_or_stopped_daemon_and_recovers() {
    if !privileged("health_fails_for_a_hung_or_stopped_daemon_and_recovers") {
        return;
    }
    let (_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&["--listen", "off"]);
    let (ok, said) = health(&data);
    assert!(ok && said.contains("healthy"), "{said}");
    let pid = daemon.child.as_ref().unwrap().id() as i32;
    // Hung: every thread stopped, the lock still held.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let said = wait_for("health to fail for the stopped daemon", Duration::from_secs(20), || {
        let (ok, said) = health(&data);
        (!ok).then_some(said)
    });
    assert!(said.contains("wrote its newest samples") && said.contains("stopped"), "{said}");
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    wait_for("health to recover", Duration::from_secs(20), || health(&data).0.then_some(()));
    assert!(daemon.stop().success());
    let (ok, said) = health(&data);
    assert!(!ok && said.contains("no daemon holds"), "{said}");
}
