//! `cargo xtask bench unwind`: user stacks of code built without frame pointers (issue 12).
//!
//! For each workload of `tests/workloads` (C through a libc callback, C++ templates, a Rust
//! release binary), built without frame pointers and run `seconds` on an otherwise idle machine:
//! - the share of its samples whose stack reaches `main`, under the daemon with frame pointers
//!   only (`--unwind-table-mib 0`), with unwind tables (the default), and under
//!   `perf record --call-graph dwarf` (perf copies 8 KiB of stack per sample and unwinds later);
//! - the BPF program's run time per sample (kernel.bpf_stats_enabled; a tail-called unwinder's
//!   time counts in its caller's), both daemon configurations in the same run;
//! - the time from the workload's exec to its first complete stack.
//!
//! Then the table compiler's figures (`cargo bench --bench unwind`).

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};

use super::{bpf_stats, folded, now};

struct Workload {
    name: &'static str,
    bin: PathBuf,
}

fn build(root: &Path, out: &Path) -> anyhow::Result<Vec<Workload>> {
    std::fs::create_dir_all(out)?;
    let src = root.join("tests/workloads");
    let mut v = Vec::new();
    for (name, cmd, args, file, bin) in [
        (
            "C -O2 -fomit-frame-pointer, qsort callback",
            "gcc",
            &["-O2", "-fomit-frame-pointer"][..],
            "libc_callback.c",
            "cfi-c-qsort",
        ),
        (
            "C++ -O2 -fomit-frame-pointer, templates",
            "g++",
            &["-O2", "-fomit-frame-pointer"][..],
            "templates.cpp",
            "cfi-cpp-tmpl",
        ),
        (
            "Rust release (no frame pointers)",
            "rustc",
            &["-C", "opt-level=3", "-C", "force-frame-pointers=no"][..],
            "release.rs",
            "cfi-rust-rel",
        ),
    ] {
        let path = out.join(bin);
        let st = Command::new(cmd).args(args).arg(src.join(file)).arg("-o").arg(&path).status()?;
        if !st.success() {
            bail!("{cmd} {file} failed");
        }
        v.push(Workload { name, bin: path });
    }
    Ok(v)
}

fn reaches_main(stack: &str) -> bool {
    stack.split(';').any(|f| f == "main" || f.ends_with("::main"))
}

/// (complete share, samples, BPF ns per sample, ms from exec to the first complete stack)
fn under_daemon(
    profiler: &Path,
    w: &Workload,
    secs: u64,
    extra: &[&str],
) -> anyhow::Result<(f64, u64, f64, Option<f64>)> {
    let dir = std::env::temp_dir().join(format!("profiler-bench-unwind-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let args: Vec<&str> = ["--listen", "off", "--flush-ms", "100"].into_iter().chain(extra.iter().copied()).collect();
    let mut daemon = super::start_daemon(profiler, &dir, &args, Stdio::null())?;
    let pid = daemon.id();
    std::thread::sleep(Duration::from_secs(2));
    let before = bpf_stats(pid);
    let start = now();
    let st = Command::new(&w.bin).arg(secs.to_string()).status()?;
    let end = now();
    let after = bpf_stats(pid);
    if !st.success() {
        bail!("{} failed", w.bin.display());
    }
    std::thread::sleep(Duration::from_millis(1500));
    let comm: String = w.bin.file_name().unwrap().to_string_lossy().chars().take(15).collect();
    let text = folded(profiler, &dir, start - 1.0, end + 1.0, &["--comm", &comm])?;
    // The first complete stack's time, from the per-sample export.
    let script = Command::new(profiler)
        .args(["export", "--format", "perf-script", "--data-dir"])
        .arg(&dir)
        .args(["--from", &format!("{:.3}", start - 1.0), "--to", &format!("{:.3}", end + 1.0), "--comm", &comm])
        .output()?;
    let script = String::from_utf8_lossy(&script.stdout);
    let first_complete = script
        .split("\n\n")
        .filter(|s| {
            s.lines().skip(1).any(|l| {
                let sym = l.split_whitespace().nth(1).unwrap_or("");
                sym == "main" || sym.ends_with("::main")
            })
        })
        .filter_map(|s| {
            let header = s.lines().find(|l| !l.starts_with('#') && !l.trim().is_empty())?;
            header
                .split_whitespace()
                .find(|f| f.ends_with(':') && f.contains('.'))?
                .trim_end_matches(':')
                .parse::<f64>()
                .ok()
        })
        .reduce(f64::min);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    daemon.wait()?;
    let _ = std::fs::remove_dir_all(&dir);
    let total = super::folded_count(&text, |_| true);
    let complete = super::folded_count(&text, reaches_main);
    let runs = after.1.saturating_sub(before.1).max(1);
    let ns = after.0.saturating_sub(before.0) as f64 / runs as f64;
    let exec_ms = first_complete.map(|t| (t - start) * 1e3);
    Ok((complete as f64 / total.max(1) as f64, total, ns, exec_ms))
}

/// Share of `perf record --call-graph dwarf` samples of the workload that reach main.
fn under_perf(w: &Workload, secs: u64) -> anyhow::Result<(f64, u64)> {
    let data = std::env::temp_dir().join(format!("profiler-bench-unwind-{}.perf", std::process::id()));
    let st = Command::new("perf")
        .args(["record", "-q", "-F", "99", "--call-graph", "dwarf", "-o"])
        .arg(&data)
        .arg("--")
        .arg(&w.bin)
        .arg(secs.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if !st.success() {
        bail!("perf record failed");
    }
    let out =
        Command::new("perf").args(["script", "-F", "comm,ip,sym", "-i"]).arg(&data).stderr(Stdio::null()).output()?;
    let _ = std::fs::remove_file(&data);
    let text = String::from_utf8_lossy(&out.stdout);
    let (mut total, mut complete) = (0u64, 0u64);
    // Samples are separated by blank lines; frames are "ip sym" lines.
    for sample in text.split("\n\n").filter(|s| !s.trim().is_empty()) {
        total += 1;
        if sample.lines().skip(1).any(|l| {
            let sym = l.split_whitespace().nth(1).unwrap_or("");
            sym == "main" || sym.ends_with("::main")
        }) {
            complete += 1;
        }
    }
    Ok((complete as f64 / total.max(1) as f64, total))
}

pub fn run(root: &Path, profiler: &Path, secs: u64) -> anyhow::Result<()> {
    let workloads = build(root, &root.join("target/bench-unwind"))?;
    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1").context("enabling kernel.bpf_stats_enabled")?;
    println!(
        "| workload ({secs} s, 99 Hz) | frame pointers only | unwind tables | perf --call-graph dwarf | BPF ns/sample, FP → tables | exec → first complete stack |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for w in &workloads {
        let (fp, fp_n, fp_ns, _) = under_daemon(profiler, w, secs, &["--unwind-table-mib", "0"])?;
        let (cfi, cfi_n, cfi_ns, exec_ms) = under_daemon(profiler, w, secs, &[])?;
        let perf =
            under_perf(w, secs).map(|(s, n)| format!("{:.1} % of {n}", s * 100.0)).unwrap_or_else(|e| format!("({e})"));
        println!(
            "| {} | {:.1} % of {fp_n} | {:.1} % of {cfi_n} | {perf} | {fp_ns:.0} → {cfi_ns:.0} ({:.1}x) | {} |",
            w.name,
            fp * 100.0,
            cfi * 100.0,
            cfi_ns / fp_ns.max(1.0),
            exec_ms.map_or("-".into(), |ms| format!("{ms:.0} ms")),
        );
    }
    let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "0");
    println!();
    let st = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root)
        .args(["bench", "-q", "--package", "profiler-user", "--bench", "unwind"])
        .status()?;
    if !st.success() {
        bail!("cargo bench --bench unwind failed");
    }
    Ok(())
}
