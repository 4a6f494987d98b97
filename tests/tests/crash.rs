//! Crash safety on the real daemon: SIGKILL at random moments, restart, and check that the
//! store still opens, that at most the last flush interval of samples was lost, and that no
//! query fails or counts wrong. `CRASH_KILLS=200 cargo xtask test crash` soaks it longer.

use std::{collections::BTreeMap, process::Stdio, time::Duration};

use integration_tests::{
    Daemon, Kill, helper_bin, now_secs, parse_folded, privileged, profiler, status_json, wait_for,
};

const FLUSH_S: f64 = 0.5;

fn cpu_samples(dir: &str, from: f64, to: f64, cpu: &str) -> u64 {
    let (from, to) = (format!("{from:.3}"), format!("{to:.3}"));
    let out =
        profiler(&["flamegraph", "--data-dir", dir, "--from", &from, "--to", &to, "--cpu", cpu, "--format", "folded"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked") && !err.contains("WARN"), "query after a crash: {err}");
    if !out.status.success() {
        assert!(err.contains("no samples"), "query failed: {err}");
        return 0;
    }
    parse_folded(&String::from_utf8_lossy(&out.stdout)).iter().map(|(_, c)| c).sum()
}

/// CPU 1's samples in each 100 ms of `[from, to)`: where a failed kill's samples stop.
fn per_100ms(dir: &str, from: f64, to: f64) -> String {
    let steps = ((to - from) / 0.1).ceil() as usize;
    let counts: Vec<String> =
        (0..steps).map(|k| from + k as f64 * 0.1).map(|t| cpu_samples(dir, t, t + 0.1, "1").to_string()).collect();
    counts.join(" ")
}

#[test]
fn sigkill_at_random_moments_loses_at_most_one_flush_interval() {
    if !privileged("sigkill_at_random_moments_loses_at_most_one_flush_interval") {
        return;
    }
    let kills: usize = std::env::var("CRASH_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let mut seed = (now_secs() * 1e6) as u64 | 1;
    eprintln!("{kills} kills, seed {seed}");
    let mut random = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % 10_000) as f64 / 10_000.0
    };
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let dir = data.to_str().unwrap().to_string();
    // Something to sample all along: CPU 1 busy in user space, until the test ends (killed then,
    // or on a panic). Not for a guessed time: each start now verifies the BPF programs for ~5 s,
    // and a burner sized at 3 s a kill ended around kill 13 of 20, leaving CPU 1 idle and the
    // kills after it with nothing to find.
    let mut helper = Kill(
        std::process::Command::new(helper_bin())
            .args(["1", &format!("{}", kills as f64 * 60.0 + 60.0)])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );

    let mut worst_gap: f64 = 0.0;
    for i in 0..kills {
        let started = now_secs();
        let mut daemon = Daemon::start_with_flush(&data, &[], (FLUSH_S * 1000.0) as u64);
        daemon.wait_ready_since(started);
        // Sampling has begun once CPU 1 has samples from this run: loss is measured from there.
        let sampling = wait_for("samples of this run", Duration::from_secs(10), || {
            let now = now_secs();
            (cpu_samples(&dir, started, now, "1") > 0).then_some(now)
        });
        // A random moment: up to two flush intervals after the daemon's first block.
        std::thread::sleep(Duration::from_secs_f64(0.05 + random() * 2.0 * FLUSH_S + random() * 0.7));
        let killed = now_secs();
        daemon.kill9();
        assert!(matches!(helper.0.try_wait(), Ok(None)), "kill {i}: the burner on CPU 1 ended: nothing to measure");

        // The store opens and answers, with no warning, right after the crash.
        let status = status_json(&data).expect("status after SIGKILL");
        assert!(status["summary"]["span"].is_array(), "{status}");
        // What was flushed before the kill is there: the busy CPU has its samples up to one
        // flush interval (plus the drain tick) before the kill.
        let lag = FLUSH_S + 0.2;
        let from = (killed - lag - 0.5).max(started + 0.2);
        let to = killed - lag;
        // Not before samples of this run were seen: the first flush can come soon after the
        // daemon starts sampling (its flushes fall on the wall clock's flush boundaries).
        let from = from.max(sampling);
        if to - from >= 0.2 {
            let n = cpu_samples(&dir, from, to, "1");
            let expected = 99.0 * (to - from);
            assert!(
                n as f64 >= 0.8 * expected,
                "kill {i}: {n} samples on CPU 1 in [{from:.3}, {to:.3}), expected ~{expected:.0}; started \
                 {started:.3}, sampling seen at +{:.3}, killed at +{:.3}; CPU 1's samples per 100 ms since \
                 the start: {}\n{}",
                sampling - started,
                killed - started,
                per_100ms(&dir, started, killed),
                daemon.log_text()
            );
        }
        // Measure the actual loss: the newest CPU-1 sample before the kill.
        let mut newest = killed - 3.0;
        let mut t = killed;
        while t > sampling - 1.0 {
            if cpu_samples(&dir, t - 0.1, t, "1") > 0 {
                newest = t;
                break;
            }
            t -= 0.1;
        }
        worst_gap = worst_gap.max(killed - newest);
    }
    eprintln!("worst loss at a kill: the last {worst_gap:.1} s (flush interval {FLUSH_S} s)");
    assert!(worst_gap <= 1.0 + 0.1, "up to {worst_gap:.1} s of samples lost at a kill");

    // A clean run at the end, then the store must be self-consistent: the per-CPU counts of the
    // block summaries equal what folding the sample columns finds.
    let mut last = Daemon::start_with_flush(&data, &[], 500);
    last.wait_ready_since(now_secs());
    assert!(last.stop().success(), "{}", last.log_text());
    drop(helper);
    let status = status_json(&data).unwrap();
    let span = status["summary"]["span"].as_array().unwrap();
    let (first, end) = (span[0].as_u64().unwrap() as f64 / 1e9, span[1].as_u64().unwrap() as f64 / 1e9);
    let cpus: BTreeMap<String, serde_json::Value> = serde_json::from_value(status["summary"]["cpus"].clone()).unwrap();
    for (cpu, c) in cpus {
        let folded = cpu_samples(&dir, first, end, &cpu);
        assert_eq!(folded, c["samples"].as_u64().unwrap(), "CPU {cpu}: folded samples differ from the block summaries");
    }
}
