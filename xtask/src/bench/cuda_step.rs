//! `cargo xtask bench cuda-step`: what the daemon costs a launch-heavy training step (issue 41,
//! part 8: at most 1 % slower), measured so that 1 % can show on a loaded machine:
//! - a step is a fixed amount of arithmetic (calibrated once to about 1.5 ms of CPU) and 20
//!   launches through the stand-in driver (`tests/cuda/standin.c`), about 13,000 launches a
//!   second, over the default rate guard's 2,270 (the guard as users get it);
//! - what is measured is the launcher's own CPU time a step (`CLOCK_PROCESS_CPUTIME_ID`: user
//!   and system, so a probe's trap and BPF program count), not steps a second, which the other
//!   processes' load sets;
//! - two launchers run throughout, started once: one calls `libcuda.so.1` (probed), its twin
//!   the same code as `libnotcuda.so.1` (never probed: it shows what the machine did to both);
//! - in blocks, the daemon (the defaults) stopped then running, short rounds of each launcher
//!   alternately for `PHASE` in each phase. With the daemon, the phase starts once the rate
//!   guard has cut the launcher (its steady state: the probes on the share of each 10 s period
//!   the budget pays for) and lasts two whole periods, so that the seconds with the probes and
//!   those without are in it in their proportion.
//!
//! The figure is the launcher's mean CPU a step with the daemon against without (a mean, not a
//! median: the probes' cost is in some rounds of a period and not others), per block, and the
//! median of the blocks, with their spread; beside it the twin's (the daemon's effect on a
//! process it does not probe: sampling, and noise) and the probes alone (the launcher against
//! its twin, with against without).

use std::{
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::Duration,
};

use anyhow::Context as _;

use super::{
    cuda::{gcc, median},
    metric_sum, metrics, start_daemon,
};

const ADDR: &str = "127.0.0.1:17079";
/// Steps a round: about 0.3 s of CPU.
const STEPS: u64 = 200;
/// How long each phase of a block runs its rounds: two of the rate guard's periods.
const PHASE: Duration = Duration::from_secs(20);

/// A launch loop in `serve` mode: runs rounds of steps on request.
struct Launcher {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Launcher {
    fn start(bin: &Path, lib: &Path, iters: u64) -> anyhow::Result<Self> {
        let mut child = Command::new(bin)
            .arg(lib)
            .args(["serve", "0", &iters.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("start launch_loop")?;
        let stdin = child.stdin.take().context("its stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("its stdout")?);
        let mut l = Self { child, stdin, stdout };
        let mut line = String::new();
        l.stdout.read_line(&mut line)?;
        anyhow::ensure!(line.trim() == "ready", "launch_loop said {line:?}, not ready");
        Ok(l)
    }

    /// Runs `steps` steps; the CPU nanoseconds a step and the wall seconds a step.
    fn round(&mut self, steps: u64) -> anyhow::Result<(f64, f64)> {
        writeln!(self.stdin, "{steps}")?;
        self.stdin.flush()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('=')?.parse::<f64>().ok())
                .with_context(|| format!("launch_loop said {line:?}"))
        };
        Ok((field("cpu_ns")? / steps as f64, field("wall_s")? / steps as f64))
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The value at quantile `q` of `v` (nearest rank).
fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { f64::NAN } else { v[((v.len() - 1) as f64 * q).round() as usize] }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// One phase: rounds of each launcher for [`PHASE`], alternating which goes first. The CPU
/// nanoseconds a step of each round, (probed, twin), and the wall of the probed ones.
fn phase(probed: &mut Launcher, twin: &mut Launcher) -> anyhow::Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let (mut a, mut b, mut wall) = (Vec::new(), Vec::new(), Vec::new());
    let start = std::time::Instant::now();
    for i in 0.. {
        if start.elapsed() >= PHASE {
            break;
        }
        if i % 2 == 0 {
            let (c, w) = probed.round(STEPS)?;
            a.push(c);
            wall.push(w);
            b.push(twin.round(STEPS)?.0);
        } else {
            b.push(twin.round(STEPS)?.0);
            let (c, w) = probed.round(STEPS)?;
            a.push(c);
            wall.push(w);
        }
    }
    Ok((a, b, wall))
}

pub fn run(root: &Path, profiler: &Path, blocks: usize) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("profiler-bench-cuda-step-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let standin = root.join("tests/cuda/standin.c");
    let probed_lib = dir.join("probed/libcuda.so.1");
    let twin_lib = dir.join("twin/libnotcuda.so.1");
    gcc(&["-shared", "-fPIC", "-O0"], &probed_lib, &standin)?;
    gcc(&["-shared", "-fPIC", "-O0"], &twin_lib, &standin)?;
    let bin = dir.join("launch_loop");
    gcc(&["-O2"], &bin, &root.join("tests/cuda/launch_loop.c"))?;
    let out = Command::new(&bin).arg(&twin_lib).args(["calibrate", "0", "1500"]).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let iters: u64 = text.trim().strip_prefix("iters=").and_then(|v| v.parse().ok()).context("calibration")?;
    let (mut probed, mut twin) = (Launcher::start(&bin, &probed_lib, iters)?, Launcher::start(&bin, &twin_lib, iters)?);
    println!(
        "{blocks} blocks; in each, the daemon stopped then running (its defaults; from the rate guard's first cut), {} s of rounds of {STEPS} steps of each launcher alternately; \
         a step: {iters} x 100 multiply-adds (~1.5 ms of CPU) and 20 launches. Launcher CPU a step, means of a phase.\n",
        PHASE.as_secs()
    );
    println!(
        "| block | load | without daemon, µs CPU a step | with | launcher | twin (not probed) | probes alone | wall a step, with |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let (mut launcher, mut twin_d, mut alone) = (Vec::new(), Vec::new(), Vec::new());
    let (mut all_off, mut all_on) = (Vec::new(), Vec::new());
    for block in 1..=blocks {
        let load = loadavg();
        let (off_a, off_b, _) = phase(&mut probed, &mut twin)?;
        let log = std::fs::File::create(dir.join(format!("daemon-{block}.log")))?;
        let mut daemon = start_daemon(profiler, &dir.join(format!("data-{block}")), &["--listen", ADDR], log.into())?;
        let on = (|| -> anyhow::Result<_> {
            super::wait_for("the daemon's /metrics", Duration::from_secs(30), || metrics(ADDR).ok())?;
            // The probes attach once the daemon has sampled the launcher and found the
            // library: warm rounds until its calls are counted.
            let calls = || metric_sum(&metrics(ADDR).unwrap_or_default(), "profiler_cuda_calls_total");
            super::wait_for("the probes on the launcher", Duration::from_secs(60), || {
                let before = calls();
                probed.round(100).ok()?;
                std::thread::sleep(Duration::from_millis(1500)); // a drain
                (calls() > before).then_some(())
            })?;
            // The guard's steady state: the launcher cut to its share (or, under a budget it
            // stays within, always on: then 12 s of it).
            let warm = std::time::Instant::now();
            let cut = || metric_sum(&metrics(ADDR).unwrap_or_default(), "profiler_cuda_estimated_processes") >= 1.0;
            while !cut() && warm.elapsed() < Duration::from_secs(12) {
                probed.round(100)?;
                twin.round(100)?;
            }
            phase(&mut probed, &mut twin)
        })();
        let _ = daemon.kill();
        let _ = daemon.wait();
        let (on_a, on_b, wall) = on?;
        let (ma0, mb0, ma1, mb1) = (mean(&off_a), mean(&off_b), mean(&on_a), mean(&on_b));
        let pct = |x: f64, y: f64| (x / y - 1.0) * 100.0;
        launcher.push(pct(ma1, ma0));
        twin_d.push(pct(mb1, mb0));
        alone.push(pct(ma1 / mb1, ma0 / mb0));
        all_off.extend(off_a);
        all_on.extend(on_a);
        println!(
            "| {block} | {load} | {:.1} | {:.1} | {:+.2} % | {:+.2} % | {:+.2} % | {:.2} ms |",
            ma0 / 1e3,
            ma1 / 1e3,
            launcher[block - 1],
            twin_d[block - 1],
            alone[block - 1],
            median(wall) * 1e3
        );
    }
    let spread = |v: &[f64]| {
        format!(
            "{:+.2} % (median of {} blocks; blocks from {:+.2} to {:+.2} %)",
            median(v.to_vec()),
            v.len(),
            quantile(v.to_vec(), 0.0),
            quantile(v.to_vec(), 1.0)
        )
    };
    println!(
        "\nRounds pooled: launcher without the daemon {:.1} µs a step (interquartile {:.1}-{:.1}), with {:.1} µs ({:.1}-{:.1}).",
        median(all_off.clone()) / 1e3,
        quantile(all_off.clone(), 0.25) / 1e3,
        quantile(all_off, 0.75) / 1e3,
        median(all_on.clone()) / 1e3,
        quantile(all_on.clone(), 0.25) / 1e3,
        quantile(all_on, 0.75) / 1e3
    );
    println!("The twin (never probed) with against without: {}.", spread(&twin_d));
    println!("The probes alone (launcher against twin, with against without): {}.", spread(&alone));
    println!("Step slowdown of the launcher with the daemon against without: {}. Goal: <= 1 %.", spread(&launcher));
    drop((probed, twin));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
