//! NVML's own utilisation samples (issue 41, part 8: the poller wakes once a second and reads the
//! driver's sub-second samples, `gpu::nvml::samples`), with the real daemon and the stand-in NVML
//! (`tests/nvml/standin.c`: a sample every `sample_ms`, sample k reading the k-th value of
//! `util_samples`):
//! - the utilisation track's points are the samples' values at the samples' times (on the
//!   poller's 100 ms grid), several a second, and `profiler status` says where they come from;
//! - an idle GPU whose buffer runs dry (`NVML_ERROR_NOT_FOUND`) still reads, once a second;
//! - samples stamped on the time since boot (as some drivers stamp them) land at their wall-clock
//!   time, from a driver that refuses an array smaller than it asks for.
//!
//! A driver without samples is polled every 100 ms: `gpu`'s half-library test.

use std::time::Duration;

use integration_tests::{
    Daemon, now_secs,
    nvml::{StandIn, h100},
    privileged, profiler, status_json, wait_for,
};
use serde_json::Value;

/// The stand-in's utilisation samples: sample k (at k * 200 ms) reads `PATTERN[k % 5]`.
const PATTERN: [f64; 5] = [10.0, 90.0, 30.0, 70.0, 50.0];
const SAMPLE_MS: u64 = 200;

fn facts(extra: &str) -> String {
    h100(37, &[4242], 0) + &format!("0 sample_ms {SAMPLE_MS}\n0 util_samples 10,90,30,70,50\n{extra}")
}

/// `gpu.0.util`'s points over the last minute, (unix ms, %).
fn util_points(dir: &str) -> Vec<(u64, f64)> {
    let out = profiler(&["counters", "--data-dir", dir, "--last", "1m", "--name", "gpu.0.util", "--format", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("counters JSON");
    let Some(points) = v["tracks"][0]["points"].as_array() else { return Vec::new() };
    points.iter().map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap())).collect()
}

/// Waits for `seconds` of utilisation points.
fn points_over(dir: &str, seconds: u64) -> Vec<(u64, f64)> {
    wait_for(&format!("{seconds} s of utilisation points"), Duration::from_secs(20 + seconds), || {
        let p = util_points(dir);
        (p.len() >= 2 && p[p.len() - 1].0 - p[0].0 >= seconds * 1000).then_some(p)
    })
}

/// The points of the whole seconds covered, by second.
fn by_second(points: &[(u64, f64)]) -> std::collections::BTreeMap<u64, Vec<(u64, f64)>> {
    let mut out: std::collections::BTreeMap<u64, Vec<(u64, f64)>> = Default::default();
    for &(ms, v) in points {
        out.entry(ms / 1000).or_default().push((ms, v));
    }
    // The first and last seconds are partial.
    let first = out.keys().next().copied();
    let last = out.keys().next_back().copied();
    out.retain(|s, _| Some(*s) != first && Some(*s) != last);
    out
}

#[test]
fn utilisation_points_are_nvmls_samples_at_their_times_and_a_dry_buffer_still_reads() {
    let test = "utilisation_points_are_nvmls_samples_at_their_times_and_a_dry_buffer_still_reads";
    let tmp = tempfile::tempdir().unwrap();
    let Some(nvml) = StandIn::build_or_skip(tmp.path(), false, test) else { return };
    if !privileged(test) {
        return;
    }
    nvml.say(&facts(""));
    let data = tmp.path().join("data");
    let mut daemon = Daemon::start(&data, &["--nvml-library", nvml.lib_str()]);
    daemon.wait_ready();
    let dir = data.to_str().unwrap();

    let points = points_over(dir, 4);
    // Each point is the sample of its time: sample k at k * 200 ms, and between samples (a tick of
    // the values read once a second) the last one's value.
    let expect = |ms: u64| PATTERN[((ms / SAMPLE_MS) % PATTERN.len() as u64) as usize];
    for &(ms, v) in &points {
        assert_eq!(v, expect(ms), "the point at {ms} ms: {points:?}");
    }
    // Every sample of each whole second is a point at its own time: five values a second.
    let seconds = by_second(&points);
    assert!(seconds.len() >= 2, "{points:?}");
    for (second, p) in &seconds {
        let at_samples: Vec<f64> = p.iter().filter(|(ms, _)| ms % SAMPLE_MS == 0).map(|p| p.1).collect();
        assert_eq!(at_samples.len(), 5, "second {second}: {p:?}");
        let mut values = at_samples.clone();
        values.sort_by(f64::total_cmp);
        assert_eq!(values, [10.0, 30.0, 50.0, 70.0, 90.0], "second {second}: {p:?}");
    }
    let status = status_json(&data).expect("status");
    let how = status["gpus"]["utilisation"].as_str().unwrap_or_default().to_string();
    assert!(how.starts_with("NVML's own samples, read once a second, one every 200 ms"), "{status}");
    let text = String::from_utf8(profiler(&["status", "--data-dir", dir]).stdout).unwrap();
    assert!(text.contains("utilisation from NVML's own samples"), "{text}");
    assert!(!daemon.log_text().contains("no utilisation samples"), "{}", daemon.log_text());

    // The GPU idles and its buffer runs dry: one reading a second still says 0 %.
    let dry_ms = (now_secs() * 1000.0) as u64;
    nvml.say(&(h100(0, &[4242], 0) + "0 samples dry\n"));
    let idle = wait_for("the idle GPU's readings", Duration::from_secs(20), || {
        let p: Vec<(u64, f64)> = util_points(dir).into_iter().filter(|p| p.0 > dry_ms + 2500).collect();
        (p.len() >= 3 && p[p.len() - 1].0 - p[0].0 >= 2000).then_some(p)
    });
    assert!(idle.iter().all(|p| p.1 == 0.0), "{idle:?}");
    let gaps: Vec<u64> = idle.windows(2).map(|w| w[1].0 - w[0].0).collect();
    assert!(gaps.iter().all(|&g| g <= 2000), "a reading a second: {idle:?}");
}

#[test]
fn samples_stamped_since_boot_land_at_their_wall_clock_time_whatever_room_the_driver_wants() {
    let test = "samples_stamped_since_boot_land_at_their_wall_clock_time_whatever_room_the_driver_wants";
    let tmp = tempfile::tempdir().unwrap();
    let Some(nvml) = StandIn::build_or_skip(tmp.path(), false, test) else { return };
    if !privileged(test) {
        return;
    }
    // And a driver that refuses an array with less room than it asks for (`samples_room`).
    nvml.say(&facts("0 sample_clock boot\n0 samples_room 200\n"));
    let data = tmp.path().join("data");
    let mut daemon = Daemon::start(&data, &["--nvml-library", nvml.lib_str()]);
    daemon.wait_ready();
    let dir = data.to_str().unwrap();
    let points = points_over(dir, 3);
    let now_ms = (now_secs() * 1000.0) as u64;
    // On the wall clock (the last minute, not 1970), each second with the five samples' values.
    assert!(points.iter().all(|p| p.0 > now_ms - 60_000 && p.0 <= now_ms), "{points:?}");
    for (second, p) in by_second(&points) {
        let mut values: Vec<f64> = p.iter().map(|p| p.1).collect();
        values.sort_by(f64::total_cmp);
        values.dedup();
        assert!(values.len() >= 4, "second {second}: {p:?}");
        assert!(values.iter().all(|v| PATTERN.contains(v)), "second {second}: {p:?}");
    }
    assert!(daemon.log_text().contains("stamped on the time since boot"), "{}", daemon.log_text());
}
