//! The kernel feature probe at daemon start, on the real kernel (docs/kernels.md): every probe
//! runs against the kernel, so a probe that misjudges this kernel (a helper it thinks missing, a
//! tracepoint it looks for in the wrong place) fails here. Other kernels: `cargo xtask test kernels`.

use integration_tests::{Daemon, privileged};

#[test]
fn the_probe_finds_every_feature_of_this_kernel_and_every_tracepoint_group_attaches() {
    if !privileged("kernel_features") {
        return;
    }
    // Every feature of docs/kernels.md is in mainline since 5.15; this machine runs newer.
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if version < (5, 15) {
        integration_tests::skip(&format!("kernel_features: Linux {} predates 5.15", release.trim()));
        return;
    }
    let (_tmp, _data, mut daemon) = Daemon::ready_in_tempdir(&[]);
    let log = daemon.log_text();
    daemon.stop();
    let probed = log.lines().find(|l| l.contains("kernel features probed")).unwrap_or_else(|| {
        panic!("no `kernel features probed` line in the daemon's log:\n{log}");
    });
    assert!(probed.contains(&format!("kernel={}", release.trim())), "{probed}");
    assert!(probed.contains("missing=0"), "a feature this kernel has was judged missing: {probed}\n{log}");
    assert!(!log.contains("this kernel lacks"), "{log}");
    let attached = log.lines().find(|l| l.contains("tracepoint detectors")).expect("a `tracepoint detectors` line");
    assert!(attached.contains("attached=NET_RX/NAPI,runq,reclaim,cgroup,exec"), "{attached}");
}
