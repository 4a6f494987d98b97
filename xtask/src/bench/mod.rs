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

pub mod churn;
pub mod cuda;
pub mod cuda_step;
pub mod memory;
pub mod nvml;
pub mod overhead;
pub mod python;
pub mod sched;
pub mod unwind;

pub(crate) fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

pub(crate) fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> anyhow::Result<T> {
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

/// `cargo xtask bench clickhouse-bytes`: bytes per sample of the `samples` table under the
/// schema's layouts and the ones tried against them (issue 39, part 3), on a current ClickHouse
/// embedded in Python (the PyPI package chdb, as the tests use). No daemon, no root: two
/// synthetic nodes of `minutes` each (`clickhouse_bytes.py` says how they are made).
pub fn clickhouse_bytes(root: &Path, minutes: u64) -> anyhow::Result<()> {
    let probe = Command::new("python3").args(["-c", "import chdb, pandas"]).output();
    if !probe.is_ok_and(|o| o.status.success()) {
        bail!("clickhouse-bytes needs Python's chdb and pandas: `pip install chdb pandas`");
    }
    let status = Command::new("python3")
        .arg(root.join("xtask/src/bench/clickhouse_bytes.py"))
        .args(["--minutes", &minutes.to_string()])
        .status()
        .context("python3")?;
    anyhow::ensure!(status.success(), "clickhouse_bytes.py failed ({status})");
    Ok(())
}

/// The release daemon of another revision of this repository, for side-by-side runs: its tree
/// (`git archive`, so nothing here changes) built in `target/baseline/REV` once, then reused.
pub fn build_at(root: &Path, rev: &str) -> anyhow::Result<std::path::PathBuf> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["rev-parse", "--verify", &format!("{rev}^{{commit}}")])
        .output()?;
    if !out.status.success() {
        bail!("'{rev}' is not a commit of this repository (a shallow clone may not have it: git fetch --unshallow)");
    }
    let commit = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let dir = root.join("target/baseline").join(&commit[..12]);
    let bin = dir.join("target/release/profiler");
    if bin.exists() {
        return Ok(bin);
    }
    let src = dir.join("src");
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src)?;
    let unpacked = Command::new("sh")
        .arg("-c")
        .arg("git -C \"$1\" archive \"$2\" | tar -x -C \"$3\"")
        .args(["sh"])
        .arg(root)
        .arg(&commit)
        .arg(&src)
        .status()?;
    if !unpacked.success() {
        bail!("could not unpack {commit} into {}", src.display());
    }
    eprintln!("xtask: building the baseline daemon at {commit} in {}", dir.display());
    let built = Command::new("cargo")
        .current_dir(&src)
        .args(["build", "--release", "--package", "profiler-user", "--bin", "profiler"])
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .status()?;
    if !built.success() || !bin.exists() {
        bail!("building the daemon at {commit} failed (see above)");
    }
    Ok(bin)
}

/// Open file descriptors of a process.
pub(crate) fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// The daemon's /metrics, as (series with labels, value) pairs.
pub(crate) fn metrics(addr: &str) -> anyhow::Result<Vec<(String, f64)>> {
    use std::io::{Read as _, Write as _};
    let mut conn = std::net::TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(conn, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    conn.read_to_string(&mut text)?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok(body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect())
}

/// Sum of the series whose name (with labels) starts with `prefix`.
pub(crate) fn metric_sum(m: &[(String, f64)], prefix: &str) -> f64 {
    m.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(_, v)| v).sum()
}

/// CPU time of every thread of a process, in seconds, at nanosecond precision (schedstat;
/// /proc/PID/stat counts in 10 ms ticks, too coarse for a daemon that uses 0.1 % of a CPU).
pub(crate) fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// [`cpu_ns`] of the threads of `pid` named `comm` only.
pub(crate) fn thread_cpu_ns(pid: u32, comm: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == comm))
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// utime + stime in seconds, and VmRSS / VmHWM in KiB, of a process.
pub(crate) fn usage(pid: u32) -> anyhow::Result<(f64, u64, u64)> {
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

/// `profiler flamegraph --format folded` of a window (unix seconds), idle included.
pub(crate) fn folded(profiler: &Path, dir: &Path, from: f64, to: f64, extra: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(profiler)
        .args(["flamegraph", "--format", "folded", "--include-idle", "--data-dir"])
        .arg(dir)
        .args(["--from", &format!("{from:.3}"), "--to", &format!("{to:.3}")])
        .args(extra)
        .output()?;
    if !out.status.success() {
        bail!("profiler flamegraph failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Samples in folded lines whose stack satisfies `keep`.
pub(crate) fn folded_count(text: &str, keep: impl Fn(&str) -> bool) -> u64 {
    text.lines()
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(stack, _)| keep(stack))
        .filter_map(|(_, n)| n.parse::<u64>().ok())
        .sum()
}

fn folded_total(profiler: &Path, dir: &Path, from: f64, to: f64, extra: &[&str]) -> anyhow::Result<u64> {
    Ok(folded_count(&folded(profiler, dir, from, to, extra)?, |_| true))
}

/// Starts `profiler run` on `dir` with `args` and waits for its first block on disk.
pub(crate) fn start_daemon(
    profiler: &Path,
    dir: &Path,
    args: &[&str],
    stderr: Stdio,
) -> anyhow::Result<std::process::Child> {
    let daemon = Command::new(profiler)
        .args(["run", "--data-dir"])
        .arg(dir)
        .args(args)
        .stderr(stderr)
        .spawn()
        .context("start the daemon")?;
    wait_for("the daemon's first block", Duration::from_secs(30), || {
        std::fs::read_dir(dir.join("segments")).ok()?.next().map(|_| ())
    })?;
    Ok(daemon)
}

pub fn spine(profiler: &Path, helper: &Path, seconds: u64) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("profiler-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let log = std::fs::File::create(dir.with_extension("log"))?;
    let mut daemon = start_daemon(profiler, &dir, &["--frequency", "99"], log.into())?;
    let pid = daemon.id();
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
            .args(["--from", &format!("{:.3}", end - 30.0), "--to", &format!("{end:.3}")])
            // `-o` writes regular files only (it refuses devices): the SVG goes to stdout.
            .stdout(std::process::Stdio::null())
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

/// `cargo xtask bench store`: the store benchmark (synthetic GPU-node samples), then the peak
/// memory of the store path at 64 CPUs x 999 Hz.
pub fn store(root: &Path, minutes: u64) -> anyhow::Result<()> {
    let bench = |args: &[&str]| -> anyhow::Result<()> {
        let st = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .current_dir(root)
            .args(["bench", "-q", "--package", "profiler-user", "--bench", "store", "--"])
            .args(args)
            .status()?;
        if !st.success() {
            bail!("the store benchmark failed ({st})");
        }
        Ok(())
    };
    bench(&["--minutes", &minutes.to_string()])?;
    bench(&["--rss-only", "--hz", "999", "--minutes", "2"])
}

/// `cargo xtask bench status`: a 1 GiB store (4 hours of synthetic samples at 64 CPUs x 99 Hz,
/// copied as later minutes up to 1 GiB, kept in the target directory so later runs reuse it),
/// `Store::summary` with and without the index in process, then the real `profiler status`
/// command timed both ways.
pub fn status(root: &Path, profiler: &Path) -> anyhow::Result<()> {
    let dir = root.join("target").join("bench-status-store");
    let st = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .current_dir(root)
        .args(["bench", "-q", "--package", "profiler-user", "--bench", "store", "--", "--minutes", "240", "--status"])
        .arg(&dir)
        .status()?;
    if !st.success() {
        bail!("the status benchmark failed ({st})");
    }
    let time = |label: &str| -> anyhow::Result<()> {
        let mut runs = Vec::new();
        for _ in 0..7 {
            let t = std::time::Instant::now();
            let out = Command::new(profiler).args(["status", "--data-dir"]).arg(&dir).output()?;
            runs.push(t.elapsed().as_secs_f64() * 1000.0);
            if !out.status.success() {
                bail!("profiler status failed: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
        runs.sort_by(f64::total_cmp);
        println!("| `profiler status` (the command, {label}), median of 7 | {:.1} ms |", runs[3]);
        Ok(())
    };
    time("with the index")?;
    let index = dir.join("index");
    let aside = dir.join("index.aside");
    std::fs::rename(&index, &aside)?;
    let without = time("no index");
    std::fs::rename(&aside, &index)?;
    without
}

/// `cargo xtask bench perf`: our daemon and `perf record -F 99 -a -g` side by side on the same
/// workload (a user-space spinner on CPU 1, a directory walker on CPU 0): bytes per sample.
pub fn perf(profiler: &Path, helper: &Path, seconds: u64) -> anyhow::Result<()> {
    if Command::new("perf").arg("--version").output().is_err() {
        bail!("perf is not installed (Debian: apt-get install linux-perf)");
    }
    let dir = std::env::temp_dir().join(format!("profiler-bench-perf-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let data = dir.join("store");
    let perf_data = dir.join("perf.data");
    let mut daemon = Command::new(profiler)
        .args(["run", "--frequency", "99", "--data-dir"])
        .arg(&data)
        .stderr(std::fs::File::create(dir.join("daemon.log"))?)
        .spawn()?;
    wait_for("the daemon's first block", Duration::from_secs(30), || {
        std::fs::read_dir(data.join("segments")).ok()?.next().map(|_| ())
    })?;
    let mut perf = Command::new("perf")
        .args(["record", "-F", "99", "-a", "-g", "-o"])
        .arg(&perf_data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let secs = seconds.to_string();
    let mut walker = Command::new("taskset")
        .args(["-c", "0", "timeout", &secs, "sh", "-c", "while :; do ls -lR /usr/lib /usr/share >/dev/null 2>&1; done"])
        .spawn()?;
    let spin = Command::new(helper).args(["1", &secs]).stdout(Stdio::null()).status()?;
    let _ = walker.wait();
    // SAFETY: signalling our own children.
    unsafe {
        libc::kill(perf.id() as i32, libc::SIGINT);
        libc::kill(daemon.id() as i32, libc::SIGTERM);
    }
    perf.wait()?;
    daemon.wait()?;
    if !spin.success() {
        bail!("busy-helper failed");
    }
    let perf_bytes = std::fs::metadata(&perf_data)?.len();
    let stats = Command::new("perf").args(["report", "--stats", "-i"]).arg(&perf_data).output()?;
    let perf_samples: u64 = String::from_utf8_lossy(&stats.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("SAMPLE events:")?.split_whitespace().next()?.parse().ok())
        .context("perf report --stats shows no SAMPLE events")?;
    let status = Command::new(profiler).args(["status", "--format", "json", "--data-dir"]).arg(&data).output()?;
    let status: serde_json::Value = serde_json::from_slice(&status.stdout)?;
    let ours_bytes = status["summary"]["bytes"].as_u64().unwrap_or(0);
    let cpus = status["summary"]["cpus"].as_object().cloned().unwrap_or_default();
    let busy: u64 = cpus.values().filter_map(|c| c["samples"].as_u64()).sum();
    let idle: u64 = cpus.values().filter_map(|c| c["idle"].as_u64()).sum();
    println!(
        "| tool ({seconds} s, 99 Hz, spinner on CPU 1, directory walker on CPU 0) | bytes | samples | bytes/sample |"
    );
    println!("|---|---|---|---|");
    println!(
        "| perf record -F 99 -a -g | {perf_bytes} | {perf_samples} | {:.1} |",
        perf_bytes as f64 / perf_samples.max(1) as f64
    );
    println!(
        "| profiler (this store) | {ours_bytes} | {} ({busy} busy, {idle} idle) | {:.1} ({:.1} per busy sample) |",
        busy + idle,
        ours_bytes as f64 / (busy + idle).max(1) as f64,
        ours_bytes as f64 / busy.max(1) as f64
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `run_time_ns` and `run_cnt` summed over the BPF perf_event programs a process holds
/// (from /proc/PID/fdinfo; needs kernel.bpf_stats_enabled).
pub(crate) fn bpf_stats(pid: u32) -> (u64, u64) {
    let mut total = (0, 0);
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return total };
    for fd in fds.flatten() {
        let Ok(info) = std::fs::read_to_string(fd.path()) else { continue };
        // prog_type 7 is BPF_PROG_TYPE_PERF_EVENT: the sampler, not the tracepoints.
        if !info.lines().any(|l| l.starts_with("prog_type:") && l.split_whitespace().nth(1) == Some("7")) {
            continue;
        }
        let get = |k: &str| info.lines().find_map(|l| l.strip_prefix(k)?.trim().parse::<u64>().ok()).unwrap_or(0);
        total.0 += get("run_time_ns:");
        total.1 += get("run_cnt:");
    }
    total
}
