//! `cargo xtask bench memory`: the daemon under the unit's memory limit (issue 25). The release
//! daemon runs in a memory cgroup of 256 MiB, joined before exec (its BPF maps are charged
//! there, as under systemd), while one process maps three copies of the largest library at hand
//! (the Rust toolchain's libLLVM, 200 MB, 1.4 M unwind rows each) and spins. Reported: the time
//! until all three tables are in the kernel, the daemon's peak RSS (VmHWM) and anonymous memory,
//! the cgroup's peak, OOM kills, and each pool of the memory budget at its peak.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::{metric_sum, metrics, wait_for};

const MEMCG: &str = "/sys/fs/cgroup/memory";

fn status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn libllvm() -> anyhow::Result<PathBuf> {
    let home = std::env::var("HOME").unwrap_or_default();
    for t in std::fs::read_dir(Path::new(&home).join(".rustup/toolchains"))?.flatten() {
        for e in std::fs::read_dir(t.path().join("lib")).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with("libLLVM.so.") {
                return Ok(e.path());
            }
        }
    }
    bail!("no libLLVM.so.* under ~/.rustup/toolchains/*/lib")
}

pub fn run(profiler: &Path) -> anyhow::Result<()> {
    if !Path::new(MEMCG).join("memory.limit_in_bytes").exists() {
        bail!("no cgroup v1 memory hierarchy at {MEMCG}");
    }
    let cg = Path::new(MEMCG).join(format!("profiler-bench-memory-{}", std::process::id()));
    std::fs::create_dir(&cg).context("creating a memory cgroup")?;
    std::fs::write(cg.join("memory.limit_in_bytes"), (256u64 << 20).to_string())?;
    let result = measure(profiler, &cg);
    let _ = std::fs::remove_dir(&cg);
    result
}

fn measure(profiler: &Path, cg: &Path) -> anyhow::Result<()> {
    let tmp = std::env::temp_dir().join(format!("profiler-bench-memory-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let llvm = libllvm()?;
    let copies: Vec<PathBuf> = (1..=3).map(|i| tmp.join(format!("libLLVM-copy{i}.so"))).collect();
    for c in &copies {
        std::fs::copy(&llvm, c).with_context(|| format!("copying {}", llvm.display()))?;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let addr = format!("127.0.0.1:{port}");
    let join = format!("echo $$ > {}/cgroup.procs && exec \"$@\"", cg.display());
    let mut daemon = Command::new("sh")
        .args(["-c", &join, "sh"])
        .arg(profiler)
        .args(["run", "--data-dir"])
        .arg(tmp.join("data"))
        .args(["--listen", &addr])
        .stderr(std::fs::File::create(tmp.join("daemon.log"))?)
        .spawn()
        .context("starting the daemon")?;
    let pid = daemon.id();
    wait_for("the daemon's /metrics", Duration::from_secs(30), || metrics(&addr).ok())?;
    let base_rows = metric_sum(&metrics(&addr)?, "profiler_unwind_table_rows");
    // One process maps the three copies executable and spins (it must be sampled to be
    // described again after its libraries appeared).
    let script = "import mmap, os, sys, time\nmaps = []\nfor p in sys.argv[1:]:\n    f = open(p, 'rb')\n    maps.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC))\nend = time.time() + 600\nwhile time.time() < end:\n    pass\n";
    let mut mapper = Command::new("python3").arg("-c").arg(script).args(&copies).stdout(Stdio::null()).spawn()?;
    let started = Instant::now();
    let built = wait_for("the three tables in the kernel", Duration::from_secs(300), || {
        let rows = metric_sum(&metrics(&addr).ok()?, "profiler_unwind_table_rows");
        (rows - base_rows >= 3.0 * 1.3e6).then_some(rows - base_rows)
    });
    let secs = started.elapsed().as_secs_f64();
    let m = metrics(&addr)?;
    let (hwm, anon) = (
        status_kib(pid, "VmHWM"),
        m.iter().find(|(k, _)| k == "profiler_memory_anon_bytes{at=\"peak\"}").map_or(0.0, |(_, v)| *v),
    );
    let cg_peak: u64 = std::fs::read_to_string(cg.join("memory.max_usage_in_bytes"))?.trim().parse().unwrap_or(0);
    let oom = std::fs::read_to_string(cg.join("memory.oom_control"))?
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let _ = mapper.kill();
    let _ = mapper.wait();
    let alive = daemon.try_wait()?.is_none();
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let _ = daemon.wait();
    let built = built?;
    println!("three copies of {} mapped by one process, daemon in a 256 MiB memory cgroup:", llvm.display());
    println!("| figure | value |\n|---|---|");
    println!("| unwind rows added while they were mapped (other programs' too) | {built:.0} |");
    println!("| from mapping to all three tables in the kernel | {secs:.1} s |");
    println!("| daemon peak RSS (VmHWM) | {:.1} MiB |", hwm as f64 / 1024.0);
    println!("| daemon peak anonymous memory | {:.1} MiB |", anon / (1 << 20) as f64);
    println!("| memory cgroup peak (BPF maps, page cache) | {:.1} MiB |", cg_peak as f64 / (1 << 20) as f64);
    println!("| OOM kills | {oom} |\n| daemon alive after | {alive} |");
    for (k, v) in m.iter().filter(|(k, _)| k.starts_with("profiler_memory_pool_peak_bytes")) {
        println!("| {k} | {:.1} MiB |", v / (1 << 20) as f64);
    }
    let _ = std::fs::remove_dir_all(&tmp);
    if !alive || oom > 0 {
        bail!("the daemon did not survive (alive {alive}, OOM kills {oom})");
    }
    Ok(())
}
