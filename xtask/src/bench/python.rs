//! `cargo xtask bench python`: the daemon's CPU time per sample on Python-heavy work (issue
//! 28), beside native work in the same run. Two phases of the same length, each keeping both
//! CPUs busy: native (`busy-helper`, a handful of stacks) and Python 3 running random call
//! chains over 2,000 functions (`tests/workloads/py_chains.py`: nearly every sample a stack not
//! seen before, as on a GPU node's input pipeline). Per phase: the daemon's CPU time (all its
//! threads, schedstat) over the samples it took, and its stack cache's hit rate (`/metrics`).
//! The Python phase runs under the machine's python3 (3.11) and then under each interpreter of
//! the Python test's roots (`python_roots`: 3.9, 3.10, 3.12, 3.13, 3.14), one phase each.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use super::{cpu_ns, metric_sum, metrics, start_daemon};

const ADDR: &str = "127.0.0.1:17073";

struct Reading {
    cpu_ns: u64,
    busy: f64,
    hits: f64,
    misses: f64,
}

fn read(pid: u32) -> anyhow::Result<Reading> {
    let m = metrics(ADDR)?;
    Ok(Reading {
        cpu_ns: cpu_ns(pid),
        busy: metric_sum(&m, "profiler_samples_total{cpu=\"0\",state=\"busy\"}")
            + metric_sum(&m, "profiler_samples_total{cpu=\"1\",state=\"busy\"}"),
        hits: metric_sum(&m, "profiler_symbol_stack_cache_lookups_total{result=\"hit\"}"),
        misses: metric_sum(&m, "profiler_symbol_stack_cache_lookups_total{result=\"miss\"}"),
    })
}

/// Runs `cmd` once per CPU (pinned) for the phase, and prints the phase's row.
fn phase(pid: u32, name: &str, cmd: impl Fn(u32) -> Command) -> anyhow::Result<()> {
    let a = read(pid)?;
    let t = Instant::now();
    let mut children = Vec::new();
    for cpu in 0..2u32 {
        let mut c = Command::new("taskset");
        let inner = cmd(cpu);
        c.arg("-c").arg(cpu.to_string()).arg(inner.get_program()).args(inner.get_args());
        children.push(c.stdout(Stdio::null()).spawn()?);
    }
    for mut c in children {
        c.wait()?;
    }
    // The samples of the phase's end are flushed within the daemon's flush interval.
    std::thread::sleep(Duration::from_secs(2));
    let b = read(pid)?;
    let samples = b.busy - a.busy;
    let lookups = (b.hits - a.hits) + (b.misses - a.misses);
    println!(
        "| {name} | {:.0} s | {samples:.0} | {:.2} s | {:.1} µs | {:.1} % |",
        t.elapsed().as_secs_f64(),
        (b.cpu_ns - a.cpu_ns) as f64 / 1e9,
        (b.cpu_ns - a.cpu_ns) as f64 / 1e3 / samples.max(1.0),
        (b.hits - a.hits) / lookups.max(1.0) * 100.0
    );
    Ok(())
}

pub fn run(root: &Path, profiler: &Path, helper: &Path, seconds: u64) -> anyhow::Result<()> {
    let python = Path::new("/usr/bin/python3");
    anyhow::ensure!(python.exists(), "the Python phase needs /usr/bin/python3 (Debian: apt-get install python3)");
    let script = root.join("tests/workloads/py_chains.py");
    let dir = std::env::temp_dir().join(format!("profiler-bench-python-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let log = std::fs::File::create(dir.with_extension("log"))?;
    let mut daemon = start_daemon(profiler, &dir, &["--frequency", "99", "--listen", ADDR], log.into())?;
    let pid = daemon.id();
    let run = || -> anyhow::Result<()> {
        super::wait_for("the daemon's /metrics", Duration::from_secs(30), || metrics(ADDR).ok())?;
        println!(
            "| phase (both CPUs busy) | length | samples | daemon CPU | daemon CPU per sample | stack cache hits |"
        );
        println!("|---|---|---|---|---|---|");
        phase(pid, "native (busy-helper)", |cpu| {
            let mut c = Command::new(helper);
            c.args([cpu.to_string(), seconds.to_string()]);
            c
        })?;
        let version = |argv: &[&str]| -> String {
            let out = Command::new(argv[0]).args(&argv[1..]).arg("--version").output();
            out.map(|o| String::from_utf8_lossy(&o.stdout).trim().replace("Python ", "")).unwrap_or_default()
        };
        let chains = "random 20-40 deep chains over 2,000 functions";
        phase(pid, &format!("Python {} (the machine's), {chains}", version(&["/usr/bin/python3"])), |cpu| {
            let mut c = Command::new(python);
            c.arg(&script).args([seconds.to_string(), (cpu + 1).to_string()]);
            c
        })?;
        let roots = crate::python_roots::roots_dir();
        for (suite, interpreter) in [
            ("bullseye", "python3.9"),
            ("jammy", "python3.10"),
            ("noble", "python3.12"),
            ("sid", "python3.13"),
            ("sid", "python3.14"),
        ] {
            let root = roots.join(suite);
            if !root.join("usr/bin").join(interpreter).exists() {
                println!("| {interpreter}: no {suite} root (cargo xtask setup makes it) | | | | | |");
                continue;
            }
            std::fs::create_dir_all(root.join("opt/profiler-tests"))?;
            std::fs::copy(&script, root.join("opt/profiler-tests/py_chains.py"))?;
            let root = root.to_string_lossy().into_owned();
            let v = version(&["chroot", &root, interpreter]);
            phase(pid, &format!("Python {v} ({suite}, chroot), {chains}"), |cpu| {
                let mut c = Command::new("chroot");
                c.args([&root, interpreter, "/opt/profiler-tests/py_chains.py"]);
                c.args([seconds.to_string(), (cpu + 1).to_string()]);
                c
            })?;
        }
        Ok(())
    };
    let result = run();
    let _ = daemon.kill();
    let _ = daemon.wait();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
