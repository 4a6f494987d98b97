//! `cargo xtask bench overhead`: what the daemon costs the machine, next to what operators use
//! today, measured in one run.
//!
//! 1. Throughput: a fixed hashing workload pinned to every CPU, run bare, under our daemon at
//!    99 Hz and 999 Hz, and under `perf record -F 99 -a -g`. Every round runs each configuration
//!    once, in a rotated order, and each one's loss is taken against the bare run of its own
//!    round, so machine drift cancels; the table gives the mean loss and its 95 % interval.
//!    At 99 Hz both tools cost far less than this VM's noise, so both also run at 4999 Hz, where
//!    the cost of a sample (the timer interrupt, what runs in it, and the tool's process) is
//!    fifty times larger and shows: loss x machine time / samples, the same yardstick for both.
//! 2. Direct accounting, which resolves far smaller costs than throughput can on a VM: the BPF
//!    program's run time (kernel.bpf_stats_enabled, read from the program's fdinfo) plus the
//!    daemon's CPU time (/proc/PID/task/*/schedstat, in ns), over the same runs once the workload
//!    has run 2 s (a new program's one-time symbol loading is the churn benchmark's), per sample and as a share of
//!    the machine. For perf, its process CPU time (its in-interrupt unwinding is not visible
//!    this way; only the throughput column holds it).
//!    With `--baseline-rev REV` another build of the daemon (e.g. the one issue 6 was measured
//!    on) is one more configuration of the same rounds: on this VM the cost of a sample drifts
//!    by 2-3x between hours, so only figures taken in one run compare.
//! 3. The BPF program against bpftrace's `profile:hz:99 { @[kstack, ustack] = count(); }`, both
//!    attached at once on a GPU-node-like mix (one CPU busy in user space, the other idle), so
//!    both see the same ticks: average run time per sample of each.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::Context as _;

use super::{bpf_stats, cpu_ns, thread_cpu_ns, usage, wait_for};

#[derive(Clone, Copy, PartialEq)]
enum Config {
    Bare,
    Ours(u32),
    /// Ours without unwind tables (`--unwind-table-mib 0`): frame pointers only, as before
    /// issue 12, so that the same run shows what the tables cost code that has frame pointers.
    OursFp(u32),
    /// Another build of the profiler (`--baseline-rev`, e.g. the one issue 6 was measured on),
    /// run like `Ours`, so that "not worse than then" is read in one run on one machine.
    Baseline(u32),
    Perf(u32),
    /// The sampling tick alone: bpftrace `profile:hz:N {}`, an empty BPF program on the same
    /// cpu-clock perf event, i.e. what any sampler pays before it does anything.
    Tick(u32),
}

impl Config {
    fn name(self) -> String {
        match self {
            Config::Bare => "bare".into(),
            Config::Ours(hz) => format!("profiler {hz} Hz"),
            Config::OursFp(hz) => format!("profiler {hz} Hz, frame pointers only (`--unwind-table-mib 0`)"),
            Config::Baseline(hz) => format!("profiler {hz} Hz, the baseline build"),
            Config::Perf(hz) => format!("perf record -F {hz} -a -g"),
            Config::Tick(hz) => format!("the tick alone (bpftrace `profile:hz:{hz} {{}}`)"),
        }
    }
}

/// What one configuration accumulated over its rounds.
#[derive(Default)]
struct Tally {
    passes_per_s: Vec<f64>,
    /// Per round: (bare − this) / bare.
    losses: Vec<f64>,
    wall_s: f64,
    /// Seconds over which the tool's CPU and BPF time are accounted (the run after SETTLE).
    accounted_s: f64,
    /// BPF program runs over the whole workload run (for the cost per sample at 4999 Hz).
    runs_whole: u64,
    /// CPU time of the tool's process (daemon or perf).
    cpu_s: f64,
    /// Of which the kernel-counter thread's (issue 16's counters, one read a second).
    counters_s: f64,
    bpf_ns: u64,
    bpf_runs: u64,
    /// Samples in perf.data (perf writes from just before the workload starts to after it ends).
    perf_samples: u64,
    rss_kib: u64,
}

const CONFIGS: [Config; 9] = [
    Config::Bare,
    Config::Ours(99),
    Config::Ours(999),
    Config::OursFp(99),
    Config::Perf(99),
    Config::Ours(AMPLIFIED),
    Config::Perf(AMPLIFIED),
    Config::Tick(AMPLIFIED),
    // Last, and left out when no baseline is given: the columns below index the others.
    Config::Baseline(99),
];
/// How long the workload runs before the tools' costs are accounted.
const SETTLE: Duration = Duration::from_secs(2);
/// The rate at which a sample's cost rises above the noise of the throughput measurement.
const AMPLIFIED: u32 = 4999;

/// The two builds a run compares: this one and, if given, the baseline's.
pub struct Builds<'a> {
    pub profiler: &'a Path,
    pub baseline: Option<&'a Path>,
}

pub fn run(builds: Builds, hash_work: &Path, busy_helper: &Path, seconds: u64, rounds: usize) -> anyhow::Result<()> {
    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1").context("enabling kernel.bpf_stats_enabled")?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let configs = &CONFIGS[..CONFIGS.len() - usize::from(builds.baseline.is_none())];
    let mut tally: Vec<Tally> = configs.iter().map(|_| Tally::default()).collect();
    for round in 0..rounds {
        let mut this_round = vec![0.0; configs.len()];
        for k in 0..configs.len() {
            let i = (k + round) % configs.len();
            let config = configs[i];
            let dir = scratch_dir(&format!("{round}-{i}"));
            let tool = start(config, &builds, &dir)?;
            let runs_at_start = tool.as_ref().map_or(0, |c| bpf_stats(c.id()).1);
            let t0 = Instant::now();
            let children = spawn_hash(hash_work, cpus, seconds)?;
            // The costs are accounted once the workload has run SETTLE: a new program's first
            // samples make the daemon read its mappings and symbols once (xtask's own debug
            // binary among them), which the churn benchmark measures; this measures the steady
            // state. The throughput covers the whole run.
            // (A quarter of the run at most, so short runs still account most of it.)
            std::thread::sleep(SETTLE.min(Duration::from_secs_f64(seconds as f64 / 4.0)));
            let before = tool.as_ref().map(|c| (cpu_ns(c.id()), bpf_stats(c.id())));
            let counters0 = tool.as_ref().map_or(0, |c| thread_cpu_ns(c.id(), "counters"));
            let t1 = Instant::now();
            let passes = wait_hash(children)?;
            let (wall, accounted) = (t0.elapsed().as_secs_f64(), t1.elapsed().as_secs_f64());
            let t = &mut tally[i];
            let mut process = String::new();
            if let (Some(c), Some((cpu0, (ns0, runs0)))) = (tool.as_ref(), before) {
                let (cpu1, (_, rss, _)) = (cpu_ns(c.id()), usage(c.id())?);
                let (ns1, runs1) = bpf_stats(c.id());
                t.cpu_s += (cpu1 - cpu0) as f64 / 1e9;
                t.counters_s += thread_cpu_ns(c.id(), "counters").saturating_sub(counters0) as f64 / 1e9;
                process = format!(", tool's process {:.2} ms/s", (cpu1 - cpu0) as f64 / 1e6 / accounted);
                t.bpf_ns += ns1 - ns0;
                t.bpf_runs += runs1 - runs0;
                t.runs_whole += runs1 - runs_at_start;
                t.rss_kib = t.rss_kib.max(rss);
            }
            t.accounted_s += accounted;
            t.wall_s += wall;
            stop(tool, config)?;
            if matches!(config, Config::Perf(_)) {
                t.perf_samples += perf_samples(&dir.join("perf.data"))?;
            }
            let _ = std::fs::remove_dir_all(&dir);
            this_round[i] = passes as f64 / wall;
            t.passes_per_s.push(this_round[i]);
            eprintln!("round {}/{rounds}: {}: {:.0} passes/s{process}", round + 1, config.name(), this_round[i]);
        }
        for (i, t) in tally.iter_mut().enumerate() {
            t.losses.push((this_round[0] - this_round[i]) / this_round[0]);
        }
    }

    println!(
        "\n{cpus} CPUs busy hashing; {rounds} rounds of {seconds} s per configuration, order rotated each round.\n"
    );
    println!(
        "| configuration | passes/s (mean) | throughput loss vs bare, mean ± 95 % | tool's accounted cost, % of the machine |"
    );
    println!("|---|---|---|---|");
    for (config, t) in configs.iter().zip(&tally) {
        let (mean, half) = mean_ci(&t.losses);
        let accounted = match config {
            Config::Bare => "—".to_string(),
            Config::Ours(_) | Config::OursFp(_) | Config::Baseline(_) => format!(
                "{:.3} % (BPF {:.3} % + daemon {:.3} %)",
                share(t.cpu_s + t.bpf_ns as f64 / 1e9, t.accounted_s, cpus),
                share(t.bpf_ns as f64 / 1e9, t.accounted_s, cpus),
                share(t.cpu_s, t.accounted_s, cpus)
            ),
            Config::Perf(_) => format!("{:.3} % (perf's process only)", share(t.cpu_s, t.accounted_s, cpus)),
            Config::Tick(_) => {
                format!("{:.3} % (the empty program)", share(t.bpf_ns as f64 / 1e9, t.accounted_s, cpus))
            }
        };
        let loss = if *config == Config::Bare {
            "—".to_string()
        } else {
            format!("{:+.2} % ± {:.2} %", mean * 100.0, half * 100.0)
        };
        println!("| {} | {:.0} | {loss} | {accounted} |", config.name(), mean_ci(&t.passes_per_s).0);
    }
    // Per sample at the amplified rate: machine time lost over samples taken: ours counted by
    // bpf_stats over the workload's run, perf's from perf.data, which spans a little more (its
    // 1 s start-up wait and the stop), so its cost per sample is, if anything, understated.
    println!(
        "\n| at {AMPLIFIED} Hz | cost per sample, everything included (loss x machine time / samples), mean ± 95 % | beyond the tick alone |"
    );
    println!("|---|---|---|");
    let mut per_sample = Vec::new();
    for (config, t) in configs.iter().zip(&tally) {
        let samples = match config {
            Config::Ours(AMPLIFIED) | Config::Tick(AMPLIFIED) => t.runs_whole as f64,
            Config::Perf(AMPLIFIED) => t.perf_samples as f64,
            _ => continue,
        };
        let (loss, half) = mean_ci(&t.losses);
        let machine_s = t.wall_s * cpus as f64;
        let us = |l: f64| l * machine_s / samples.max(1.0) * 1e6;
        per_sample.push((*config, us(loss), us(half)));
    }
    let find = |want: fn(&Config) -> bool| per_sample.iter().find(|p| want(&p.0)).map_or(f64::NAN, |p| p.1);
    let tick = find(|c| matches!(c, Config::Tick(_)));
    for &(config, us, half) in &per_sample {
        let beyond = match config {
            Config::Tick(_) => "—".to_string(),
            _ => format!("{:.2} µs", us - tick),
        };
        println!("| {} | {us:.2} µs ± {half:.2} µs | {beyond} |", config.name());
    }
    let (ours, perf) = (find(|c| matches!(c, Config::Ours(_))), find(|c| matches!(c, Config::Perf(_))));
    println!("| ratio ours / perf | {:.2} | {:.2} |", ours / perf, (ours - tick) / (perf - tick));
    // 99 Hz, 999 Hz, 99 Hz without tables, and the baseline build at 99 Hz.
    let mut ours = vec![&tally[1], &tally[2], &tally[3]];
    print!("\n| per sample | 99 Hz | 999 Hz | 99 Hz, frame pointers only |");
    if let Some(b) = tally.get(CONFIGS.len() - 1) {
        ours.push(b);
        print!(" baseline build, 99 Hz |");
    }
    println!("\n|---|---|---|---|{}", if ours.len() > 3 { "---|" } else { "" });
    let per = |t: &Tally, v: f64| v / t.bpf_runs.max(1) as f64;
    let row = |what: &str, f: &dyn Fn(&Tally) -> String| {
        println!("| {what} | {} |", ours.iter().map(|t| f(t)).collect::<Vec<_>>().join(" | "));
    };
    row("BPF program run time", &|t| format!("{:.2} µs", per(t, t.bpf_ns as f64) / 1e3));
    row("daemon CPU time (userspace + its syscalls)", &|t| format!("{:.2} µs", per(t, t.cpu_s * 1e6)));
    row("of which the kernel-counter thread (one read a second, not per sample)", &|t| {
        format!("{:.2} µs", per(t, t.counters_s * 1e6))
    });
    row("samples measured", &|t| t.bpf_runs.to_string());
    row("daemon RSS (largest at the end of a run)", &|t| format!("{:.1} MiB", t.rss_kib as f64 / 1024.0));

    against_bpftrace(builds.profiler, busy_helper, seconds, rounds)
}

/// Part 3: ours and bpftrace attached at once; one CPU busy in user space, the other idle.
fn against_bpftrace(profiler: &Path, busy_helper: &Path, seconds: u64, rounds: usize) -> anyhow::Result<()> {
    let (mut ours, mut theirs) = ((0u64, 0u64), (0u64, 0u64));
    let mut ratios = Vec::new();
    for round in 0..rounds {
        let dir = scratch_dir(&format!("bpftrace-{round}"));
        let daemon = start(Config::Ours(99), &Builds { profiler, baseline: None }, &dir)?;
        let mut bpftrace = bpftrace("profile:hz:99 { @[kstack, ustack] = count(); }")?;
        let mut busy = Command::new(busy_helper)
            .args(["1", &(seconds + 2).to_string()])
            .stdout(Stdio::null())
            .spawn()
            .context("busy-helper")?;
        std::thread::sleep(Duration::from_millis(500));
        let pid = daemon.as_ref().map_or(0, |c| c.id());
        let (o0, t0) = (bpf_stats(pid), bpf_stats(bpftrace.id()));
        std::thread::sleep(Duration::from_secs(seconds));
        let (o1, t1) = (bpf_stats(pid), bpf_stats(bpftrace.id()));
        let o = (o1.0 - o0.0, o1.1 - o0.1);
        let t = (t1.0 - t0.0, t1.1 - t0.1);
        ours = (ours.0 + o.0, ours.1 + o.1);
        theirs = (theirs.0 + t.0, theirs.1 + t.1);
        let (on, tn) = (o.0 as f64 / o.1.max(1) as f64, t.0 as f64 / t.1.max(1) as f64);
        ratios.push(on / tn);
        eprintln!(
            "round {}/{rounds}: ours {:.2} µs x {} samples, bpftrace {:.2} µs x {}",
            round + 1,
            on / 1e3,
            o.1,
            tn / 1e3,
            t.1
        );
        // SAFETY: signalling our own children.
        unsafe { libc::kill(bpftrace.id() as i32, libc::SIGINT) };
        bpftrace.wait()?;
        let _ = busy.kill();
        busy.wait()?;
        stop(daemon, Config::Ours(99))?;
        let _ = std::fs::remove_dir_all(&dir);
    }
    let avg = |(ns, runs): (u64, u64)| ns as f64 / runs.max(1) as f64 / 1e3;
    let (r, half) = mean_ci(&ratios);
    println!(
        "\nBPF program against bpftrace, both attached at once, {rounds} rounds of {seconds} s; CPU 1 busy in user space, CPU 0 idle.\n"
    );
    println!("| program | run time per sample | samples |\n|---|---|---|");
    println!("| ours | {:.2} µs | {} |", avg(ours), ours.1);
    println!("| bpftrace `profile:hz:99 {{ @[kstack, ustack] = count(); }}` | {:.2} µs | {} |", avg(theirs), theirs.1);
    println!("| ratio (ours / bpftrace), over all samples | {:.2} | |", avg(ours) / avg(theirs));
    println!("| ratio, mean of rounds ± 95 % | {r:.2} ± {half:.2} | |");
    Ok(())
}

fn scratch_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("profiler-overhead-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Starts the tool of a configuration, once it is sampling and past its start-up work.
fn start(config: Config, builds: &Builds, dir: &Path) -> anyhow::Result<Option<Child>> {
    match config {
        Config::Bare => Ok(None),
        Config::Ours(hz) | Config::OursFp(hz) | Config::Baseline(hz) => {
            let profiler = match config {
                Config::Baseline(_) => builds.baseline.context("no baseline build")?,
                _ => builds.profiler,
            };
            let mut cmd = Command::new(profiler);
            cmd.args(["run", "--listen", "off", "--frequency", &hz.to_string(), "--data-dir"]).arg(dir);
            if matches!(config, Config::OursFp(_)) {
                cmd.args(["--unwind-table-mib", "0"]);
            }
            let child = cmd.stderr(Stdio::null()).spawn()?;
            wait_for("the daemon's first block", Duration::from_secs(30), || {
                std::fs::read_dir(dir.join("segments")).ok()?.next().map(|_| ())
            })?;
            // Start-up (kallsyms parsed on the first kernel frame, first mappings read) is not
            // the steady state this measures.
            std::thread::sleep(Duration::from_secs(2));
            Ok(Some(child))
        }
        Config::Perf(hz) => {
            std::fs::create_dir_all(dir)?;
            let data = dir.join("perf.data");
            let child = Command::new("perf")
                .args(["record", "-F", &hz.to_string(), "-a", "-g", "-o"])
                .arg(&data)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("running perf (Debian package linux-perf)")?;
            wait_for("perf.data", Duration::from_secs(30), || data.exists().then_some(()))?;
            std::thread::sleep(Duration::from_secs(1));
            Ok(Some(child))
        }
        Config::Tick(hz) => Ok(Some(bpftrace(&format!("profile:hz:{hz} {{}}"))?)),
    }
}

/// Starts bpftrace with a program, once that program has run.
fn bpftrace(program: &str) -> anyhow::Result<Child> {
    let child = Command::new("bpftrace")
        .args(["-e", program])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("running bpftrace (Debian package bpftrace)")?;
    wait_for("bpftrace's program to run", Duration::from_secs(30), || (bpf_stats(child.id()).1 > 0).then_some(()))?;
    Ok(child)
}

fn stop(tool: Option<Child>, config: Config) -> anyhow::Result<()> {
    if let Some(mut c) = tool {
        let signal = if matches!(config, Config::Perf(_) | Config::Tick(_)) { libc::SIGINT } else { libc::SIGTERM };
        // SAFETY: signalling our own child.
        unsafe { libc::kill(c.id() as i32, signal) };
        c.wait()?;
    }
    Ok(())
}

/// Samples in a perf.data file (`perf report --stats`).
fn perf_samples(data: &Path) -> anyhow::Result<u64> {
    let out = Command::new("perf").arg("report").arg("-i").arg(data).arg("--stats").stderr(Stdio::null()).output()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("SAMPLE events:")?.split_whitespace().next()?.parse().ok())
        .context("no SAMPLE events count in `perf report --stats`")
}

/// Starts the hashing workload pinned to every CPU at once.
fn spawn_hash(hash_work: &Path, cpus: usize, seconds: u64) -> anyhow::Result<Vec<Child>> {
    Ok((0..cpus)
        .map(|cpu| Command::new(hash_work).args([cpu.to_string(), seconds.to_string()]).stdout(Stdio::piped()).spawn())
        .collect::<Result<_, _>>()?)
}

/// Waits for the hashing workload; total passes.
fn wait_hash(children: Vec<Child>) -> anyhow::Result<u64> {
    let mut total = 0;
    for c in children {
        let out = c.wait_with_output()?;
        total += String::from_utf8_lossy(&out.stdout).trim().parse::<u64>().context("hash-work output")?;
    }
    Ok(total)
}

fn share(cpu_s: f64, wall_s: f64, cpus: usize) -> f64 {
    cpu_s / (wall_s * cpus as f64).max(1e-9) * 100.0
}

/// Mean and the half-width of its 95 % confidence interval (Student's t).
fn mean_ci(v: &[f64]) -> (f64, f64) {
    let n = v.len();
    if n == 0 {
        return (0.0, 0.0);
    }
    let mean = v.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (mean, f64::NAN);
    }
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    const T975: [f64; 10] = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23];
    let t = T975.get(n - 2).copied().unwrap_or(2.0);
    (mean, t * (var / n as f64).sqrt())
}
