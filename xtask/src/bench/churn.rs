//! `cargo xtask bench churn`: the daemon under heavy process churn. A few hundred short-lived
//! processes a second, each from a binary the daemon has never seen (tests/src/bin/churn.rs),
//! while it profiles at 99 Hz: its CPU, memory, open files and symbol caches every 5 s, before,
//! during and after the churn. Bounded means: caches stop growing during the churn and shrink
//! after it, RSS and file descriptors come back.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::Context as _;

use super::{cpu_ns, fds, folded, folded_count, metric_sum, metrics, now, usage, wait_for};

const ADDR: &str = "127.0.0.1:17071";

struct Snapshot {
    at: Instant,
    cpu_ns: u64,
    samples: f64,
    rss_kib: u64,
    fds: usize,
    processes: f64,
    modules: f64,
    /// Most records waiting between the ring reader and the pipeline, since the daemon started.
    queue_max: f64,
    /// Ring-to-disk latency over the daemon's last 120 flushes: p50 and max, seconds.
    latency: (f64, f64),
    lost: f64,
}

fn snapshot(pid: u32) -> anyhow::Result<Snapshot> {
    let m = metrics(ADDR)?;
    Ok(Snapshot {
        at: Instant::now(),
        cpu_ns: cpu_ns(pid),
        samples: metric_sum(&m, "profiler_samples_total"),
        rss_kib: usage(pid)?.1,
        fds: fds(pid),
        processes: metric_sum(&m, "profiler_symbol_cache_entries{kind=\"processes\"}"),
        modules: metric_sum(&m, "profiler_symbol_cache_entries{kind=\"modules\"}"),
        queue_max: metric_sum(&m, "profiler_queue_records_max"),
        latency: (
            metric_sum(&m, "profiler_ring_to_disk_latency_seconds{quantile=\"0.5\"}"),
            metric_sum(&m, "profiler_ring_to_disk_latency_seconds{quantile=\"1\"}"),
        ),
        lost: metric_sum(&m, "profiler_lost_samples_total"),
    })
}

fn row(phase: &str, t0: Instant, a: &Snapshot, b: &Snapshot) {
    let secs = b.at.duration_since(a.at).as_secs_f64();
    let samples = b.samples - a.samples;
    println!(
        "| {:.0} | {phase} | {:.0} | {:.3} % | {:.1} | {:.1} | {} | {} | {} |",
        b.at.duration_since(t0).as_secs_f64(),
        samples / secs,
        (b.cpu_ns - a.cpu_ns) as f64 / 1e9 / secs * 100.0,
        (b.cpu_ns - a.cpu_ns) as f64 / 1e3 / samples.max(1.0),
        b.rss_kib as f64 / 1024.0,
        b.fds,
        b.processes,
        b.modules
    );
}

pub fn run(profiler: &Path, churn: &Path, hz: u32, rate: u32, seconds: u64) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("profiler-churn-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut daemon = Command::new(profiler)
        .args(["run", "--frequency", &hz.to_string(), "--listen", ADDR, "--data-dir"])
        .arg(&dir)
        .stderr(Stdio::null())
        .spawn()?;
    let pid = daemon.id();
    let result = (|| -> anyhow::Result<()> {
        wait_for("the daemon's /metrics", Duration::from_secs(30), || metrics(ADDR).ok())?;
        std::thread::sleep(Duration::from_secs(3));
        let t0 = Instant::now();
        println!("daemon at {hz} Hz; churn: {rate} processes/s for {seconds} s, each a fresh binary every 5 s\n");
        println!(
            "| t (s) | phase | samples/s | daemon CPU (% of one CPU) | daemon CPU per sample (µs) | RSS (MiB) | open fds | cached processes | cached modules |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        let mut last = snapshot(pid)?;
        let first = snapshot(pid)?;
        let step = |phase: &str, last: &mut Snapshot| -> anyhow::Result<Snapshot> {
            std::thread::sleep(Duration::from_secs(5));
            let s = snapshot(pid)?;
            row(phase, t0, last, &s);
            Ok(std::mem::replace(last, s))
        };
        for _ in 0..4 {
            step("quiet", &mut last)?;
        }
        let quiet = snapshot(pid)?;
        let churn_from = now();
        let mut load = Command::new(churn)
            .args([rate.to_string(), seconds.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .context("running churn")?;
        let mut peak = (0.0f64, 0.0f64, 0u64);
        let mut latency = (0.0f64, 0.0f64);
        while load.try_wait()?.is_none() {
            step("churn", &mut last)?;
            peak = (peak.0.max(last.processes), peak.1.max(last.modules), peak.2.max(last.rss_kib));
            latency = (latency.0.max(last.latency.0), latency.1.max(last.latency.1));
        }
        let churn_to = now();
        let spawned = String::from_utf8_lossy(&load.wait_with_output()?.stdout).trim().to_string();
        let during = snapshot(pid)?;
        for _ in 0..6 {
            step("after", &mut last)?;
        }
        let after = snapshot(pid)?;
        let text = folded(profiler, &dir, churn_from, churn_to, &[])?;
        let ours = folded_count(&text, |s| s.starts_with("churn-"));
        let named = folded_count(&text, |s| s.starts_with("churn-") && s.contains("churn_child_spin"));
        let per = |a: &Snapshot, b: &Snapshot| (b.cpu_ns - a.cpu_ns) as f64 / 1e3 / (b.samples - a.samples).max(1.0);
        println!("\nchurn: {spawned}");
        println!("\n| figure | value |\n|---|---|");
        println!(
            "| daemon CPU per sample, quiet / during churn | {:.1} µs / {:.1} µs |",
            per(&first, &quiet),
            per(&quiet, &during)
        );
        println!(
            "| daemon CPU during churn | {:.2} % of one CPU |",
            (during.cpu_ns - quiet.cpu_ns) as f64 / 1e7 / during.at.duration_since(quiet.at).as_secs_f64()
        );
        println!(
            "| cached processes: quiet / peak / 30 s after | {} / {} / {} |",
            quiet.processes, peak.0, after.processes
        );
        println!("| cached modules: quiet / peak / 30 s after | {} / {} / {} |", quiet.modules, peak.1, after.modules);
        println!(
            "| RSS: quiet / peak / 30 s after | {:.1} / {:.1} / {:.1} MiB |",
            quiet.rss_kib as f64 / 1024.0,
            peak.2 as f64 / 1024.0,
            after.rss_kib as f64 / 1024.0
        );
        println!("| open fds: quiet / 30 s after | {} / {} |", quiet.fds, after.fds);
        println!(
            "| ring-to-disk latency during churn (worst p50 / worst max of the last 120 flushes, seen every 5 s) | {:.0} ms / {:.0} ms |",
            latency.0 * 1e3,
            latency.1 * 1e3
        );
        println!("| queue depth, most records waiting at once since start | {:.0} |", after.queue_max);
        println!("| samples lost (ring full + queue full) over the whole run | {:.0} |", after.lost);
        println!(
            "| churn children's samples with their function named | {named} of {ours} ({:.0} %) |",
            named as f64 * 100.0 / ours.max(1) as f64
        );
        Ok(())
    })();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    daemon.wait()?;
    let _ = std::fs::remove_dir_all(&dir);
    result
}
