//! Issue 41, part 8: the probes added for kernel names stay inside the rate guard. A launch
//! through the runtime (`cudaLaunchKernel`, then the driver's `cuLaunchKernel`) is counted once
//! but traps twice (the runtime's probe and the driver's): the guard's budget is spent in hits,
//! so at the same launch rate a runtime launcher is cut where a driver launcher is not, and the
//! runtime library's probes are under the same duty cycle. Stand-in libraries, real uprobes.

use std::{path::PathBuf, time::Duration};

use integration_tests::{
    Daemon,
    cuda::{self, settled, status, wait_probed},
    privileged, wait_for_every,
};

const WARNING: &str = "CUDA calls faster than the probes' budget";

/// The stand-in libraries, and a daemon whose guard allows 500 probe hits a second.
fn guarded_daemon() -> Option<(tempfile::TempDir, PathBuf, PathBuf, Daemon)> {
    if !privileged("cuda_guard") {
        return None;
    }
    let tmp = tempfile::tempdir().unwrap();
    let lib = cuda::build_or_skip(&tmp.path().join("lib"), "cuda_guard")?;
    let data = tmp.path().join("data");
    let mut daemon = Daemon::start(&data, &["--listen", "off", "--cuda-max-calls-per-sec", "500"]);
    daemon.wait_ready();
    Some((tmp, lib, data, daemon))
}

#[test]
fn runtime_launches_spend_two_probe_hits_of_the_guards_budget() {
    // Launchers at 1,000 launches a second against a budget of 500 hits a second, spent over
    // periods of 10 s: 5,000 hits a period.
    let Some((_tmp, lib, data, mut daemon)) = guarded_daemon() else { return };

    // Straight to the driver for 4 s: 4,000 hits, within the period's budget, every launch
    // counted.
    let mut direct = cuda::App::start(&lib, &["--rate", "1000"], 1000);
    wait_probed(&data, 1);
    let made = direct.go()["launches"].as_u64().unwrap();
    assert_eq!(settled(&data, "cuda-launches", direct.pid(), "launch_steady", made), made, "within the budget");
    assert!(!daemon.log_text().contains(WARNING), "1,000 driver launches a second cut:\n{}", daemon.log_text());
    direct.finish();

    // Through the runtime: 2,000 hits a second, over the period's budget by the third second.
    // For 12 s: the seconds attached after the cut measure the steady rate.
    let mut runtime = cuda::App::start(&lib, &["--runtime-rate", "1000", "--seconds", "12"], 1000);
    let pid = runtime.pid();
    wait_probed(&data, 2);
    runtime.start_work();
    let log = wait_for_every("the guard's warning", Duration::from_secs(20), Duration::from_millis(100), || {
        let log = daemon.log_text();
        log.lines().any(|l| l.contains(WARNING) && l.contains(&format!("pid={pid}"))).then_some(log)
    });
    let line = log.lines().find(|l| l.contains(WARNING)).unwrap();
    let rate: f64 = line
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("calls_per_sec="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no calls_per_sec in {line}"));
    // The period's budget is spent by the third second, whose rate is the launcher's: more
    // than one hit a launch (1,500 allows for a second it only began in: CI saw 1,547), under
    // three; the steady rate, re-measured in the seconds the probes stay attached, is the one
    // that must be two.
    assert!((1500.0..2400.0).contains(&rate), "more than one hit a launch, under three: {line}");
    // Both libraries' probes under the process's duty cycle, at two hits a launch.
    let libs = wait_for_every(
        "both libraries cut at two hits a launch",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            let libs = status(&data)["libraries"].as_array()?.clone();
            let cut = |name: &str| {
                libs.iter().any(|l| {
                    l["path"].as_str().is_some_and(|p| p.contains(name))
                        && l["fraction"].as_f64().is_some_and(|f| f < 1.0)
                })
            };
            let steady = libs.iter().any(|l| {
                l["path"].as_str().is_some_and(|p| p.contains("libcuda.so.1"))
                    && l["calls_per_sec"].as_f64().is_some_and(|r| (1600.0..2400.0).contains(&r))
            });
            (cut("libcuda.so.1") && cut("libcudart.so.12") && steady).then_some(libs)
        },
    );
    eprintln!("{line}\n{libs:?}");
    runtime.report();
    runtime.finish();
    daemon.stop();
}

/// The estimates add up: a process cut to a tenth of the time still shows about the launches it
/// made. (On an H200, a PyTorch loop of 62,700 launches a second through the runtime was shown
/// as a third of them, while each cut held the daemon's stage for the probes' detach.)
#[test]
fn a_cut_processs_estimated_launches_add_up_to_what_it_made() {
    let Some((_tmp, lib, data, mut daemon)) = guarded_daemon() else { return };
    // 3,000 launches a second through the runtime, 6,000 hits against 500: attached one second
    // in ten for 30 s, three periods.
    let mut runtime = cuda::App::start(&lib, &["--runtime-rate", "3000", "--seconds", "30"], 1000);
    let pid = runtime.pid();
    wait_probed(&data, 2);
    let made = runtime.go()["launches"].as_u64().unwrap();
    // The last counts are drained a second or two after the launches: wait for the store to stop
    // growing.
    let dir = data.to_str().unwrap().to_string();
    let count = || -> (u64, u64) {
        let lines = integration_tests::folded(
            &dir,
            &["--samples", "cuda-launches", "--from", "-5m", "--pid", &pid.to_string()],
        )
        .unwrap_or_default();
        let estimated = lines.iter().filter(|(s, _)| s.contains("[estimate: probes on")).map(|(_, n)| n).sum();
        (lines.iter().map(|(_, n)| n).sum(), estimated)
    };
    let mut last = (0, 0);
    let (total, estimated) =
        wait_for_every("the counts settled", Duration::from_secs(20), Duration::from_millis(1500), || {
            let now = count();
            let settled = now == last && now.0 > 0;
            last = now;
            settled.then_some(now)
        });
    eprintln!("made {made}, shown {total} ({estimated} of them estimated)\n{}", daemon.log_text());
    assert!(estimated > total / 2, "most counts estimates: {estimated} of {total}");
    let ratio = total as f64 / made as f64;
    assert!((0.8..1.25).contains(&ratio), "{made} launches made, {total} shown: {:.0} %", ratio * 100.0);
    runtime.finish();
    daemon.stop();
}
