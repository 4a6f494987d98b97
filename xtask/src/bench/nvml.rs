//! `cargo xtask bench nvml`: what the GPU poller costs (issue 41, part 8: NVML and GPM reads at
//! most 1 ms of CPU a second per GPU), with the tests' stand-in NVML (`tests/nvml/standin.c`)
//! describing 1 GPU, then 8, each with every quantity the poller reads (GPM included) and two
//! holders (real sleeping processes, whose scheduler statistics the poller reads too). The
//! poller is the daemon's thread named `gpu`; its CPU comes from `/proc/PID/task/TID/schedstat`
//! (nanoseconds) over rounds of `--seconds`.
//!
//! The stand-in answers each call from its facts file, kept in memory while `stat` says the file
//! is unchanged (a `stat` a call, where the real library makes an ioctl; it read and scanned the
//! file at every call before, more than the poller's own work): the figures are the poller's own
//! work plus the stand-in's, not NVIDIA's driver (`cargo xtask gpu-check` measures the daemon on
//! a node).

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::Context as _;

use super::{metrics, start_daemon, thread_cpu_ns};

const ADDR: &str = "127.0.0.1:17075";

/// Every fact the poller reads, for `gpus` GPUs held by `holders` (two a GPU).
fn facts(gpus: usize, holders: &[u32]) -> String {
    let mut f = format!("gpus {gpus}\ndriver 580.159.04\n");
    for i in 0..gpus {
        let mine = &holders[2 * i..2 * i + 2];
        let procs: Vec<String> = mine.iter().map(|p| format!("{p}:1073741824")).collect();
        let util: Vec<String> = mine.iter().map(|p| format!("{p}:40")).collect();
        f.push_str(&format!(
            "{i} name NVIDIA H100 80GB HBM3\n{i} uuid GPU-bench-{i}\n{i} bus 00000000:{:02X}:00.0\n{i} util 80\n\
             {i} mem_util 30\n{i} sm_clock 1980\n{i} mem_clock 2619\n{i} reasons 4\n{i} power_mw 650000\n\
             {i} temp 60\n{i} mem_total 85899345920\n{i} mem_used 2147483648\n{i} pcie_rx 1000\n\
             {i} pcie_tx 2000\n{i} ecc_corrected 0\n{i} ecc_uncorrected 0\n{i} remap 0,0,0,0\n\
             {i} procs {}\n{i} proc_util {}\n{i} affinity 3\n{i} gpm 70,40,20,30,100,200\n",
            0x1b + 0x10 * i,
            procs.join(","),
            util.join(",")
        ));
    }
    f
}

struct Holders(Vec<Child>);

impl Drop for Holders {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
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

pub fn run(root: &Path, profiler: &Path, rounds: usize, seconds: u64) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("profiler-bench-nvml-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let facts_file = dir.join("facts.txt");
    let lib = dir.join("libnvidia-ml.so.1");
    let st = Command::new("gcc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(format!("-DSTANDIN_FILE=\"{}\"", facts_file.display()))
        .arg(root.join("tests/nvml/standin.c"))
        .status()
        .context("running gcc")?;
    anyhow::ensure!(st.success(), "gcc failed building the NVML stand-in");
    let holders = Holders(
        (0..16)
            .map(|_| Command::new("sleep").arg("100000").stdout(Stdio::null()).spawn())
            .collect::<Result<_, _>>()
            .context("start the holders")?,
    );
    let pids: Vec<u32> = holders.0.iter().map(Child::id).collect();
    println!("Poller thread (`gpu`) CPU over {rounds} rounds of {seconds} s each; load (1, 5, 15 min) before each.\n");
    println!("| GPUs | round | load | polls/s | poller CPU, ms a second | per GPU |");
    println!("|---|---|---|---|---|---|");
    let mut per_gpu = Vec::new();
    for gpus in [1usize, 8] {
        std::fs::write(&facts_file, facts(gpus, &pids))?;
        let data = dir.join(format!("data-{gpus}"));
        let log = std::fs::File::create(dir.join(format!("daemon-{gpus}.log")))?;
        let args = ["--listen", ADDR, "--no-cuda-probes", "--nvml-library", lib.to_str().context("a UTF-8 path")?];
        let mut daemon = start_daemon(profiler, &data, &args, log.into())?;
        let pid = daemon.id();
        let result = (|| -> anyhow::Result<Vec<f64>> {
            super::wait_for("the daemon's /metrics", Duration::from_secs(30), || metrics(ADDR).ok())?;
            // GPM's first sample, the holders described, the files opened.
            std::thread::sleep(Duration::from_secs(5));
            let polls = || {
                metrics(ADDR).ok().and_then(|m| m.iter().find(|(k, _)| k == "profiler_gpu_polls_total").map(|m| m.1))
            };
            let mut ms = Vec::new();
            for round in 1..=rounds {
                let load = loadavg();
                let (c0, p0, t0) = (thread_cpu_ns(pid, "gpu"), polls(), Instant::now());
                std::thread::sleep(Duration::from_secs(seconds));
                let (c1, p1, wall) = (thread_cpu_ns(pid, "gpu"), polls(), t0.elapsed().as_secs_f64());
                let per_sec = (c1 - c0) as f64 / 1e6 / wall;
                let rate = match (p0, p1) {
                    (Some(a), Some(b)) => format!("{:.1}", (b - a) / wall),
                    _ => "n/a".into(),
                };
                println!("| {gpus} | {round} | {load} | {rate} | {per_sec:.3} | {:.3} |", per_sec / gpus as f64);
                ms.push(per_sec);
            }
            Ok(ms)
        })();
        let _ = daemon.kill();
        let _ = daemon.wait();
        let mut ms = result?;
        ms.sort_by(f64::total_cmp);
        per_gpu.push((gpus, ms[ms.len() / 2]));
    }
    let (one, eight) = (per_gpu[0].1, per_gpu[1].1);
    println!(
        "\nMedians: 1 GPU {one:.3} ms/s, 8 GPUs {eight:.3} ms/s ({:.3} ms/s per GPU); each GPU past the first {:.3} ms/s. Goal: <= 1 ms/s per GPU.",
        eight / 8.0,
        (eight - one) / 7.0
    );
    drop(holders);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
