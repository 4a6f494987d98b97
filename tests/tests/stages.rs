//! The staged daemon with the real BPF program: a slow pipeline never leaves the kernel's ring
//! undrained (the reader thread keeps draining; the queue behind it absorbs or counts), and a
//! CPU taken offline and brought back is sampled again.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::Duration,
};

use integration_tests::{Daemon, Kill, helper_bin, privileged, skip, wait_for};

/// `/metrics` as (series, value) pairs, or `None` while the daemon does not answer.
fn metrics(port: u16) -> Option<Vec<(String, f64)>> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let body = text.split_once("\r\n\r\n")?.1;
    Some(
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect(),
    )
}

/// Sum of the series whose name (with labels) starts with `prefix` and contains `part`.
fn sum(m: &[(String, f64)], prefix: &str, part: &str) -> f64 {
    m.iter().filter(|(k, _)| k.starts_with(prefix) && k.contains(part)).map(|(_, v)| v).sum()
}

#[test]
fn a_slow_symbolizer_never_fills_the_kernel_ring() {
    if !privileged("a_slow_symbolizer_never_fills_the_kernel_ring") {
        return;
    }
    const PORT: u16 = 17381;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // 20 ms per busy sample: the pipeline handles 50 a second while a spinning CPU gives 99.
    // A 64 KiB ring holds about a second of them: a daemon that symbolized on the thread that
    // drains the ring would fill it within seconds.
    let mut daemon = Daemon::start_wrapped(
        &["env", "PROFILER_TEST_SYMBOLIZE_DELAY_US=20000", "PROFILER_TEST_QUEUE_BYTES=16384"],
        &data,
        &["--listen", &format!("127.0.0.1:{PORT}"), "--ring-buffer-kib", "64"],
        200,
    );
    daemon.wait_ready();
    let _spin = Kill(std::process::Command::new(helper_bin()).args(["0", "60"]).spawn().unwrap());
    let m = wait_for("the queue to fill and count its drops", Duration::from_secs(60), || {
        let m = metrics(PORT)?;
        (sum(&m, "profiler_lost_samples_total", "queue_full") > 0.0).then_some(m)
    });
    assert_eq!(sum(&m, "profiler_lost_samples_total", "ring_full"), 0.0, "the kernel's ring was never full: {m:?}");
    let capacity = sum(&m, "profiler_queue_capacity_bytes", "");
    assert_eq!(capacity, 16384.0);
    assert!(sum(&m, "profiler_queue_bytes_max", "") > capacity / 2.0, "the queue absorbed first: {m:?}");
    let counted = sum(&m, "profiler_lost_samples_total", "queue_full");
    assert!(daemon.log_text().contains("PROFILER_TEST_SYMBOLIZE_DELAY_US is set"));
    // What was counted is in the store too, as lost (a clean stop writes everything held; the
    // queue is small so that symbolizing what it holds at 20 ms a sample fits the stop's 10 s).
    assert!(daemon.stop().success(), "{}", daemon.log_text());
    let status = integration_tests::status_json(&data).expect("status");
    let cpus = status["summary"]["cpus"].as_object().expect("per-CPU summary");
    let stored: u64 = cpus.values().map(|c| c["lost"].as_u64().unwrap_or(0)).sum();
    assert!(stored as f64 >= counted, "store says {stored} lost, /metrics said {counted}: {status}");
}

/// Brings a CPU back online when dropped, however the test ends.
struct Offline(u32);

impl Offline {
    fn take(cpu: u32) -> Result<Self, std::io::Error> {
        std::fs::write(format!("/sys/devices/system/cpu/cpu{cpu}/online"), "0")?;
        Ok(Self(cpu))
    }
}

impl Drop for Offline {
    fn drop(&mut self) {
        let _ = std::fs::write(format!("/sys/devices/system/cpu/cpu{}/online", self.0), "1");
    }
}

#[test]
fn a_cpu_taken_offline_and_back_is_sampled_again() {
    if !privileged("a_cpu_taken_offline_and_back_is_sampled_again") {
        return;
    }
    const PORT: u16 = 17382;
    if !std::path::Path::new("/sys/devices/system/cpu/cpu1/online").exists() {
        skip(
            "a_cpu_taken_offline_and_back_is_sampled_again: CPU 1 is not hotpluggable here (no cpu1/online); collect::cpus has the unit test",
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut daemon = Daemon::start(&data, &["--listen", &format!("127.0.0.1:{PORT}")]);
    daemon.wait_ready();
    let cpu1 = |m: &[(String, f64)]| sum(m, "profiler_samples_total{cpu=\"1\"", "");
    let offline = match Offline::take(1) {
        Ok(o) => o,
        Err(e) => {
            skip(&format!(
                "a_cpu_taken_offline_and_back_is_sampled_again: this VM refuses to take CPU 1 offline ({e})"
            ));
            return;
        }
    };
    wait_for("the daemon to let go of CPU 1", Duration::from_secs(10), || {
        (sum(&metrics(PORT)?, "profiler_sampled_cpus", "") == 1.0).then_some(())
    });
    drop(offline);
    let before = cpu1(&metrics(PORT).unwrap());
    // Kept busy: on this VM a CPU brought back online delivers cpu-clock samples while it runs
    // but hardly any while it idles (CPU 0, never hotplugged, delivers both), so only busy
    // samples prove the daemon attached to it again.
    let _spin = Kill(std::process::Command::new(helper_bin()).args(["1", "30"]).spawn().unwrap());
    // A second's worth at 99 Hz, all taken after CPU 1 came back.
    wait_for("samples on CPU 1 again", Duration::from_secs(20), || {
        let m = metrics(PORT)?;
        (sum(&m, "profiler_sampled_cpus", "") == 2.0 && cpu1(&m) >= before + 99.0).then_some(())
    });
    assert!(daemon.log_text().contains("CPUs came online or went offline"), "{}", daemon.log_text());
}
