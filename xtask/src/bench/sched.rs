//! `cargo xtask bench sched`: what the run-queue programs (sched_wakeup, sched_switch; issue 16)
//! cost the scheduler. Two threads on two CPUs bounce a byte through a pair of pipes, a context
//! switch and a wakeup on each side per bounce: hundreds of thousands of switches a second, far
//! more than a busy node makes. Rounds alternate without and with the daemon; with it, the
//! kernel's own accounting of each program (`kernel.bpf_stats_enabled`, read from the daemon's
//! /metrics) gives the time per run, and the bounce rate what the scheduler lost.

use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::Context as _;

use super::{metric_sum, metrics, wait_for};

const ADDR: &str = "127.0.0.1:17072";
const PROGRAMS: [&str; 3] = ["sched_switch", "sched_wakeup", "sched_wakeup_new"];

fn pipe() -> anyhow::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for the two descriptors pipe writes.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe");
    }
    // SAFETY: both descriptors were just created and are owned here only.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays within it for cpu < 1024.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn bounce(from: &OwnedFd, to: &OwnedFd) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: one byte into and out of a live buffer.
    unsafe {
        libc::read(from.as_raw_fd(), b.as_mut_ptr().cast(), 1) == 1
            && b[0] != b'q'
            && libc::write(to.as_raw_fd(), b.as_ptr().cast(), 1) == 1
    }
}

/// Round trips a second between CPU 0 and CPU 1 over `secs`.
fn ping_pong(secs: f64) -> anyhow::Result<f64> {
    let ((r1, w1), (r2, w2)) = (pipe()?, pipe()?);
    let echo = std::thread::spawn(move || {
        pin(1);
        while bounce(&r1, &w2) {}
    });
    pin(0);
    let (start, mut trips) = (Instant::now(), 0u64);
    let mut b = [b'x'];
    while start.elapsed().as_secs_f64() < secs {
        for _ in 0..1000 {
            // SAFETY: one byte out of and into a live buffer.
            unsafe {
                libc::write(w1.as_raw_fd(), b.as_ptr().cast(), 1);
                libc::read(r2.as_raw_fd(), b.as_mut_ptr().cast(), 1);
            }
        }
        trips += 1000;
    }
    let elapsed = start.elapsed().as_secs_f64();
    // SAFETY: as above.
    unsafe { libc::write(w1.as_raw_fd(), b"q".as_ptr().cast(), 1) };
    echo.join().map_err(|_| anyhow::anyhow!("the echo thread panicked"))?;
    Ok(trips as f64 / elapsed)
}

fn program(m: &[(String, f64)], name: &str) -> (f64, f64) {
    let label = format!("{{program=\"{name}\"}}");
    (
        metric_sum(m, &format!("profiler_bpf_program_run_seconds_total{label}")),
        metric_sum(m, &format!("profiler_bpf_program_runs_total{label}")),
    )
}

pub fn run(profiler: &Path, seconds: u64, rounds: usize) -> anyhow::Result<()> {
    let sysctl = "/proc/sys/kernel/bpf_stats_enabled";
    let before = std::fs::read_to_string(sysctl).context("reading kernel.bpf_stats_enabled")?;
    std::fs::write(sysctl, "1").context("enabling kernel.bpf_stats_enabled")?;
    let result = rounds_of(profiler, seconds as f64, rounds);
    let _ = std::fs::write(sysctl, before.trim());
    result
}

fn rounds_of(profiler: &Path, secs: f64, rounds: usize) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("profiler-sched-{}", std::process::id()));
    println!("ping-pong between CPU 0 and CPU 1, {secs} s a run, {rounds} rounds; daemon at 99 Hz, defaults\n");
    println!(
        "| round | without daemon: round trips/s | with: round trips/s | change | context switches/s | sched_switch ns/run | sched_wakeup ns/run | run-queue programs, % of one CPU |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for round in 1..=rounds {
        let bare = ping_pong(secs)?;
        let _ = std::fs::remove_dir_all(&dir);
        let mut daemon = Command::new(profiler)
            .args(["run", "--listen", ADDR, "--data-dir"])
            .arg(&dir)
            .stderr(Stdio::null())
            .spawn()
            .context("starting the daemon")?;
        let measured = (|| -> anyhow::Result<()> {
            wait_for("the daemon's /metrics", Duration::from_secs(30), || metrics(ADDR).ok())?;
            std::thread::sleep(Duration::from_secs(2));
            let a = metrics(ADDR)?;
            let with = ping_pong(secs)?;
            // The daemon publishes its figures once a second.
            std::thread::sleep(Duration::from_millis(1500));
            let b = metrics(ADDR)?;
            let delta = |name: &str| {
                let (t0, n0) = program(&a, name);
                let (t1, n1) = program(&b, name);
                (t1 - t0, n1 - n0)
            };
            let (switch_s, switches) = delta(PROGRAMS[0]);
            let (wake_s, wakes) = delta(PROGRAMS[1]);
            let total_s: f64 = PROGRAMS.iter().map(|p| delta(p).0).sum();
            let window = secs + 3.5;
            println!(
                "| {round} | {bare:.0} | {with:.0} | {:+.1} % | {:.0} | {:.0} | {:.0} | {:.2} % |",
                (with / bare - 1.0) * 100.0,
                switches / window,
                switch_s * 1e9 / switches.max(1.0),
                wake_s * 1e9 / wakes.max(1.0),
                total_s / window * 100.0,
            );
            Ok(())
        })();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
        let _ = daemon.wait();
        measured?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
