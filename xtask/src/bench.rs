//! `cargo xtask bench spine`: the figures issue 2 asks for, measured on this machine with the
//! release build. A helper spins on CPU 1 while the daemon profiles the machine at 99 Hz; then
//! the per-CPU sample rate, lost samples, the daemon's CPU time and RSS, and the latency of a
//! 30 s flamegraph query are printed as a Markdown table.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, bail};

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> anyhow::Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// utime + stime in seconds, and VmRSS / VmHWM in KiB, of a process.
fn usage(pid: u32) -> anyhow::Result<(f64, u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat.rsplit_once(')').context("stat")?.1.split_whitespace().collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu = (fields[11].parse::<u64>()? + fields[12].parse::<u64>()?) as f64 / hz;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    Ok((cpu, kib("VmRSS:"), kib("VmHWM:")))
}

fn folded_total(profiler: &Path, dir: &Path, from: f64, to: f64, extra: &[&str]) -> anyhow::Result<u64> {
    let out = Command::new(profiler)
        .args(["flamegraph", "--format", "folded", "--include-idle", "--data-dir"])
        .arg(dir)
        .args(["--from", &format!("{from:.3}"), "--to", &format!("{to:.3}")])
        .args(extra)
        .output()?;
    if !out.status.success() {
        bail!("profiler flamegraph failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok()).sum())
}

pub fn spine(profiler: &Path, helper: &Path, seconds: u64) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("profiler-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let log = std::fs::File::create(dir.with_extension("log"))?;
    let mut daemon = Command::new(profiler)
        .args(["run", "--frequency", "99", "--data-dir"])
        .arg(&dir)
        .stderr(log)
        .spawn()
        .context("start the daemon")?;
    let pid = daemon.id();
    wait_for("the daemon's first block", Duration::from_secs(30), || {
        std::fs::read_dir(dir.join("segments")).ok()?.next().map(|_| ())
    })?;
    let (cpu0, _, _) = usage(pid)?;
    let start = now();
    eprintln!("bench: busy helper on CPU 1 for {seconds} s while the daemon profiles at 99 Hz");
    let st = Command::new(helper).args(["1", &seconds.to_string()]).stdout(Stdio::null()).status()?;
    if !st.success() {
        bail!("busy-helper failed: {st}");
    }
    let end = now();
    std::thread::sleep(Duration::from_millis(1200)); // two flushes: everything sampled is on disk
    let (cpu1, rss, hwm) = usage(pid)?;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let exit = daemon.wait()?;
    if !exit.success() {
        bail!("the daemon exited with {exit}");
    }

    let status = Command::new(profiler).args(["status", "--format", "json", "--data-dir"]).arg(&dir).output()?;
    let status: serde_json::Value = serde_json::from_slice(&status.stdout)?;
    let cpus = status["summary"]["cpus"].as_object().cloned().unwrap_or_default();
    let lost: u64 = cpus.values().filter_map(|c| c["lost"].as_u64()).sum();

    // Whole seconds inside the run, so per-second idle counts are complete.
    let (from, to) = ((start + 1.0).ceil(), (end - 1.0).floor());
    let mut rates = Vec::new();
    for cpu in cpus.keys() {
        let n = folded_total(profiler, &dir, from, to, &["--cpu", cpu])?;
        rates.push(format!("CPU {cpu}: {:.1} Hz", n as f64 / (to - from)));
    }

    let mut times = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        let out = Command::new(profiler)
            .args(["flamegraph", "--data-dir"])
            .arg(&dir)
            .args(["--from", &format!("{:.3}", end - 30.0), "--to", &format!("{end:.3}"), "-o", "/dev/null"])
            .output()?;
        if !out.status.success() {
            bail!("profiler flamegraph failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    let store_bytes = status["summary"]["bytes"].as_u64().unwrap_or(0);
    let samples: u64 = cpus.values().filter_map(|c| Some(c["samples"].as_u64()? + c["idle"].as_u64()?)).sum();
    let secs = end - start;

    println!("| figure | value |");
    println!("|---|---|");
    println!("| run | {secs:.1} s at 99 Hz, busy helper pinned to CPU 1 |");
    println!("| sample rate per CPU | {} |", rates.join(", "));
    println!("| lost samples | {lost} |");
    println!("| daemon CPU time | {:.2} s = {:.3} % of one CPU |", cpu1 - cpu0, (cpu1 - cpu0) / secs * 100.0);
    println!("| daemon RSS | {:.1} MiB (peak {:.1} MiB) |", rss as f64 / 1024.0, hwm as f64 / 1024.0);
    println!(
        "| store | {store_bytes} bytes for {samples} samples = {:.1} bytes/sample |",
        store_bytes as f64 / samples.max(1) as f64
    );
    println!(
        "| flamegraph, 30 s window, SVG | median {:.0} ms (min {:.0}, max {:.0}, 7 runs) |",
        times[3], times[0], times[6]
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
