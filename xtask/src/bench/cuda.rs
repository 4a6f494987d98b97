//! `cargo xtask bench cuda`: what the CUDA probes cost (issue 27), with the stand-in driver
//! library (`tests/cuda/standin.c`) and C launch loops (`tests/cuda/launch_loop.c`), in
//! interleaved rounds against the same code under a name the daemon does not probe
//! (`libnotcuda.so.1`), one daemon running throughout:
//! - per hit: a tight loop's ns per call, probed minus not, with the BPF program's own share
//!   (`kernel.bpf_stats_enabled`), for a function whose first instruction the kernel emulates
//!   (`push %rbp`) and one it must single-step (a RIP-relative load: `-O1`);
//! - 10,000 launches a second: the loop's own CPU time with and without, as % of one core, and
//!   whether every launch was counted;
//!
//! Both run under a daemon whose guard never engages (they measure the probes). What a
//! launch-heavy step loses to the daemon with its defaults is `cargo xtask bench cuda-step`
//! (`cuda_step.rs`).

use std::{path::Path, process::Command, time::Duration};

use anyhow::Context as _;

use super::{cpu_ns, metric_sum, metrics, start_daemon};

const ADDR: &str = "127.0.0.1:17074";

/// `libs` come after the source (the linker keeps a library only for what precedes it).
pub(super) fn gcc_with(args: &[&str], out: &Path, source: &Path, libs: &[&str]) -> anyhow::Result<()> {
    std::fs::create_dir_all(out.parent().expect("a directory"))?;
    let st = Command::new("gcc")
        .args(args)
        .arg("-o")
        .arg(out)
        .arg(source)
        .args(libs)
        .arg("-ldl")
        .arg(format!("-L{}", out.parent().expect("a directory").display()))
        .arg("-Wl,-rpath,$ORIGIN")
        .status()
        .context("running gcc")?;
    anyhow::ensure!(st.success(), "gcc failed building {}", out.display());
    Ok(())
}

pub(super) fn gcc(args: &[&str], out: &Path, source: &Path) -> anyhow::Result<()> {
    gcc_with(args, out, source, &[])
}

/// Runs the loop; its `key=value` output as pairs, and its pid.
fn run_loop(bin: &Path, lib: &Path, args: &[&str]) -> anyhow::Result<(Vec<(String, f64)>, u32)> {
    let child = Command::new(bin).arg(lib).args(args).stdout(std::process::Stdio::piped()).spawn()?;
    let pid = child.id();
    let out = child.wait_with_output()?;
    anyhow::ensure!(out.status.success(), "launch_loop failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let pairs = text
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect();
    Ok((pairs, pid))
}

fn get(pairs: &[(String, f64)], key: &str) -> f64 {
    pairs.iter().find(|(k, _)| k == key).map_or(f64::NAN, |(_, v)| *v)
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
}

/// Launches the daemon stored for `pid`.
fn counted(profiler: &Path, data: &Path, pid: u32) -> u64 {
    let out = Command::new(profiler)
        .args(["flamegraph", "--data-dir"])
        .arg(data)
        .args(["--samples", "cuda-launches", "--from", "-10m", "--format", "folded", "--pid", &pid.to_string()])
        .output();
    let Ok(out) = out else { return 0 };
    String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok()).sum()
}

fn program(addr: &str) -> (f64, f64) {
    let m = metrics(addr).unwrap_or_default();
    (
        metric_sum(&m, "profiler_bpf_program_run_seconds_total{program=\"cuda_call\"}"),
        metric_sum(&m, "profiler_bpf_program_runs_total{program=\"cuda_call\"}"),
    )
}

pub fn run(root: &Path, profiler: &Path, rounds: usize) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("profiler-bench-cuda-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let standin = root.join("tests/cuda/standin.c");
    let emulated = dir.join("emulated/libcuda.so.1");
    let stepped = dir.join("stepped/libcuda.so.1");
    let plain = dir.join("plain/libnotcuda.so.1");
    gcc(&["-shared", "-fPIC", "-O0"], &emulated, &standin)?;
    gcc(&["-shared", "-fPIC", "-O1"], &stepped, &standin)?;
    gcc(&["-shared", "-fPIC", "-O0"], &plain, &standin)?;
    // The stand-in runtime over each (issue 41: its launches name their kernel by stub).
    let runtime = root.join("tests/cuda/runtime.c");
    let emulated_rt = dir.join("emulated/libcudart.so.12");
    let plain_rt = dir.join("plain/libnotcudart.so.12");
    gcc_with(&["-shared", "-fPIC", "-O0"], &emulated_rt, &runtime, &[])?;
    gcc_with(&["-shared", "-fPIC", "-O0", "-DCUDA_DRIVER=\"libnotcuda.so.1\""], &plain_rt, &runtime, &[])?;
    let bin = dir.join("launch_loop");
    gcc(&["-O2"], &bin, &root.join("tests/cuda/launch_loop.c"))?;
    let stats = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").unwrap_or_default();
    let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1");
    let data = dir.join("data");
    let log = std::fs::File::create(dir.join("daemon.log"))?;
    let unguarded = ["--frequency", "99", "--listen", ADDR, "--cuda-max-calls-per-sec", "10000000"];
    let mut daemon = start_daemon(profiler, &data, &unguarded, log.into())?;
    let daemon_pid = daemon.id();
    let result = (|| -> anyhow::Result<()> {
        super::wait_for("the daemon's /metrics", Duration::from_secs(30), || metrics(ADDR).ok())?;
        println!("Interleaved rounds: {rounds}; medians. Not probed: the same code as `libnotcuda.so.1`.\n");
        println!("| loop | not probed | probed | cost |");
        println!("|---|---|---|---|");
        for (name, lib) in
            [("first instruction emulated (push %rbp)", &emulated), ("first instruction single-stepped", &stepped)]
        {
            let (mut a, mut b, mut prog) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..rounds {
                a.push(get(&run_loop(&bin, &plain, &["tight", "2"])?.0, "ns_per_call"));
                let before = program(ADDR);
                b.push(get(&run_loop(&bin, lib, &["tight", "2"])?.0, "ns_per_call"));
                let after = program(ADDR);
                prog.push((after.0 - before.0) * 1e9 / (after.1 - before.1).max(1.0));
            }
            let (a, b, p) = (median(a), median(b), median(prog));
            println!(
                "| tight cuLaunchKernelEx, {name} | {a:.1} ns/call | {b:.0} ns/call | {:.2} µs per hit, of which the BPF program {:.2} µs |",
                (b - a) / 1e3,
                p / 1e3
            );
        }
        // Through the runtime: its probe (the stub kept for the driver's) and the driver's.
        let (mut a, mut b, mut driver) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            a.push(get(&run_loop(&bin, &plain_rt, &["tight-runtime", "2"])?.0, "ns_per_call"));
            b.push(get(&run_loop(&bin, &emulated_rt, &["tight-runtime", "2"])?.0, "ns_per_call"));
            let plain = get(&run_loop(&bin, &plain, &["tight", "2"])?.0, "ns_per_call");
            driver.push(get(&run_loop(&bin, &emulated, &["tight", "2"])?.0, "ns_per_call") - plain);
        }
        let (a, b, driver) = (median(a), median(b), median(driver));
        println!(
            "| tight cudaLaunchKernel through the runtime, both probed (emulated) | {a:.1} ns/call | {b:.0} ns/call | {:.2} µs per launch, {:.2} µs more than the driver's probe alone |",
            (b - a) / 1e3,
            (b - a - driver) / 1e3
        );
        let (mut a, mut b, mut d_a, mut d_b, mut exact) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let c0 = cpu_ns(daemon_pid);
            let (pa, _) = run_loop(&bin, &plain, &["rate", "5", "10000"])?;
            let c1 = cpu_ns(daemon_pid);
            let (pb, pid) = run_loop(&bin, &emulated, &["rate", "5", "10000"])?;
            let c2 = cpu_ns(daemon_pid);
            a.push(get(&pa, "cpu_s") / get(&pa, "wall_s") * 100.0);
            b.push(get(&pb, "cpu_s") / get(&pb, "wall_s") * 100.0);
            d_a.push((c1 - c0) as f64 / 1e9 / (get(&pa, "wall_s") + 3.0) * 100.0);
            d_b.push((c2 - c1) as f64 / 1e9 / (get(&pb, "wall_s") + 3.0) * 100.0);
            // Drained a second, read a drain later.
            std::thread::sleep(Duration::from_secs(3));
            exact.push((counted(profiler, &data, pid), get(&pb, "calls") as u64));
        }
        let (a, b) = (median(a), median(b));
        println!(
            "| 10,000 launches/s, the loop's CPU | {a:.2} % of a core | {b:.2} % of a core | {:.2} % of one core |",
            b - a
        );
        println!(
            "| 10,000 launches/s, the daemon's CPU (all threads) | {:.2} % | {:.2} % | {:.2} % of one core |",
            median(d_a.clone()),
            median(d_b.clone()),
            median(d_b) - median(d_a)
        );
        let all = exact.iter().filter(|(c, m)| c == m).count();
        println!(
            "| 10,000 launches/s, launches counted | | {} | {all} of {} rounds exact |",
            exact.iter().map(|(c, m)| format!("{c}/{m}")).collect::<Vec<_>>().join(", "),
            exact.len()
        );
        // The step (work and launches, the guard as users get it) is `bench cuda-step`: in steps a
        // second here, a loaded machine's pace read as the probes' (issue 41, part 8).
        Ok(())
    })();
    let _ = daemon.kill();
    let _ = daemon.wait();
    let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", stats.trim());
    let _ = std::fs::remove_dir_all(&dir);
    result
}
