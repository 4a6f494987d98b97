//! `cargo xtask`: everything that is not a plain `cargo build`.
//!
//!   setup   install what a fresh machine lacks to build the eBPF program
//!   build   build the profiler (release)
//!   run     setup, build, and run the daemon in the foreground
//!   test    setup, build, and run every test (unit, real-BPF integration, soak, arm64 check);
//!           `test kernels`: boot Debian's kernels in qemu and check the profiler on each
//!   bench   measure (see bench.rs)
//!   check-arm64  check that the profiler and its BPF object compile for arm64
//!   gpu-check    the profiler on a real GPU node (PyTorch, nvidia-smi); see gpu_check.rs

mod arm64;
mod bench;
mod gpu_check;
mod kernels;
mod python_roots;
mod setup;
mod soak;
mod steal;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install nightly's rust-src and bpf-linker, and the Python test's interpreter roots (skips what
    /// is already there).
    Setup,
    /// Build the profiler in release mode.
    Build,
    /// Build and run the daemon (arguments after `--` go to `profiler run`).
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Measure: `spine` (sample rate, lost, daemon CPU and RSS, query time), `store` (ingest,
    /// bytes/sample, query latency, memory on synthetic data), `perf` (bytes/sample next to
    /// `perf record`), `replay` (CPU per sample of the daemon's path, 2 to 192 CPUs, on one core;
    /// REPLAY_QUICK=1 for a short run), `status` (`profiler status` on a 1 GiB store, with and
    /// without its index), `fleet` (`--nodes` (1000) GPU training nodes of `--cpus` (16) and
    /// `--gpus` (8) x `--minutes` (10) shipped into two private ClickHouse 18.16 shards, plus 30
    /// days of hourly rollups: ingest per server core, bytes per sample, the fleet's reads;
    /// `fleet-one-server`: the earlier 50 nodes of 2 CPUs into one server), `sched` (what the
    /// run-queue programs cost a context switch: a ping-pong between two CPUs without and with the daemon), `memory` (the daemon in a 256
    /// MiB memory cgroup while one process maps three copies of a 200 MB library: peak RSS), `nvml`
    /// (the GPU poller's CPU a second with the stand-in NVML describing 1 GPU, then 8: `--rounds`
    /// of `--seconds` (20)), `cuda-step` (a launch-heavy step's CPU time with the daemon against
    /// without, in `--rounds` blocks of alternating phases: the <= 1 % goal),
    /// `clickhouse-bytes` (bytes per sample of ClickHouse's `samples` table on chdb, a steady
    /// and a compile-heavy synthetic node of `--minutes` (default 10), under several layouts).
    Bench {
        #[arg(default_value = "spine")]
        which: String,
        /// Length of the profiled run (spine, perf: 60; overhead: 15 per configuration and round).
        #[arg(long)]
        seconds: Option<u64>,
        /// Rounds of each configuration (overhead).
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Span of the synthetic store (store: 60; fleet, clickhouse-bytes: 10).
        #[arg(long)]
        minutes: Option<u64>,
        /// fleet: synthetic nodes (default 1000).
        #[arg(long)]
        nodes: Option<u64>,
        /// fleet: CPUs per node (default 16).
        #[arg(long)]
        cpus: Option<u32>,
        /// fleet: GPUs per node (default 8).
        #[arg(long)]
        gpus: Option<u32>,
        /// overhead: also run the daemon built from this git revision, side by side (e.g.
        /// 852759a, the build issue 6 was measured on); built once under target/baseline/.
        #[arg(long, value_name = "REV")]
        baseline_rev: Option<String>,
    },
    /// The daemon for N minutes at 999 Hz with process churn and a full store: RSS, open files,
    /// lost samples and queries checked throughout (`cargo xtask test` runs 1.5 minutes of it).
    Soak {
        #[arg(long, default_value_t = 30.0)]
        minutes: f64,
    },
    /// Fuzz the segment reader with cargo-fuzz (installs it if missing).
    Fuzz {
        #[arg(long, default_value_t = 120)]
        seconds: u64,
    },
    /// Check that profiler-user and its BPF object compile for aarch64-unknown-linux-gnu
    /// (installs the target's standard library and Debian's cross gcc if missing). Untested on
    /// arm64: see docs/arm64.md.
    CheckArm64 {
        /// Build and link the binary instead of `cargo check`.
        #[arg(long, conflicts_with = "unit_tests")]
        build: bool,
        /// Run profiler-user's unit tests as arm64 code under qemu-user (installs
        /// qemu-user-static): about 3 minutes on top of the build.
        #[arg(long)]
        unit_tests: bool,
    },
    /// The profiler on a GPU node: the daemon's GPU utilisation beside nvidia-smi's and its
    /// findings in an input-bound and a GPU-bound PyTorch phase, its CPU and peak RSS. Not part
    /// of `test`. `--write-script DIR` prepares DIR for a node without cargo.
    GpuCheck {
        /// Write gpu_check.py and the stripped release binary into DIR instead of running.
        #[arg(long, value_name = "DIR")]
        write_script: Option<PathBuf>,
        /// Use this profiler binary instead of building the release one.
        #[arg(long, value_name = "PATH")]
        binary: Option<PathBuf>,
        /// No GPU: check against the tests' stand-in NVML with CPU-only Python workers.
        #[arg(long)]
        standin: bool,
        /// Where the results go.
        #[arg(long, default_value = "target/gpu-check")]
        out: PathBuf,
        /// Length of each phase.
        #[arg(long, default_value_t = 40)]
        seconds: u64,
    },
    /// Run every test: unit tests, then the integration tests that load the real BPF program.
    /// `test kernels [--flavour F]... [--seconds S] [--timeout S]`: boot Debian's 6.1 kernels in
    /// qemu/KVM and check sampling, stacks and tracepoints on each (docs/kernels.md).
    Test {
        /// Extra arguments for the test binaries (e.g. a test name filter); a first argument
        /// naming a file of tests/tests/ (`crash`, `pods`) runs that file's tests alone.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("xtask: {e:#}");
        std::process::exit(1);
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

/// Runs `cmd`, failing with its command line if it fails.
fn status(mut cmd: Command) -> anyhow::Result<()> {
    let shown = format!("{cmd:?}");
    let st = cmd.status().with_context(|| format!("cannot start {shown}"))?;
    if !st.success() {
        bail!("{shown} failed ({st})");
    }
    Ok(())
}

fn build(release: bool) -> anyhow::Result<PathBuf> {
    let mut cmd = cargo();
    cmd.args(["build", "--package", "profiler-user", "--bin", "profiler"]);
    if release {
        cmd.arg("--release");
    }
    status(cmd)?;
    Ok(workspace_root().join("target").join(if release { "release" } else { "debug" }).join("profiler"))
}

/// `name` is an integration test file, `tests/tests/NAME.rs` (a plain name, no path).
fn integration_test_file(name: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && workspace_root().join("tests/tests").join(format!("{name}.rs")).is_file()
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Cmd::Setup => {
            setup::ensure()?;
            // Cached: a second setup checks a marker per root and makes nothing.
            python_roots::ensure()
        }
        Cmd::Build => {
            setup::ensure()?;
            let bin = build(true)?;
            println!("built {}", bin.display());
            Ok(())
        }
        Cmd::Run { args } => {
            setup::ensure()?;
            let bin = build(true)?;
            link_on_path(&bin);
            let mut cmd = Command::new(&bin);
            cmd.arg("run").args(args);
            // exec: signals (Ctrl-C, SIGTERM) go straight to the daemon.
            use std::os::unix::process::CommandExt;
            Err(cmd.exec()).with_context(|| format!("cannot start {}", bin.display()))
        }
        Cmd::CheckArm64 { build, unit_tests } => arm64::check(match (build, unit_tests) {
            (_, true) => arm64::Depth::UnitTests,
            (true, false) => arm64::Depth::Build,
            (false, false) => arm64::Depth::Check,
        }),
        Cmd::Fuzz { seconds } => {
            setup::ensure()?;
            if Command::new("cargo").args(["fuzz", "--version"]).output().map(|o| !o.status.success()).unwrap_or(true) {
                let mut install = Command::new("cargo");
                install.args(["install", "cargo-fuzz"]);
                status(install)?;
            }
            let mut fuzz = Command::new("cargo");
            fuzz.current_dir(workspace_root().join("fuzz"))
                .args(["+nightly", "fuzz", "run", "segment_reader", "--"])
                .args([format!("-max_total_time={seconds}"), "-rss_limit_mb=2048".to_string()]);
            status(fuzz)
        }
        Cmd::Soak { minutes } => {
            setup::ensure()?;
            let (profiler, helpers) = (build(true)?, build_helpers()?);
            soak::run(&profiler, &helpers.join("busy-helper"), &helpers.join("churn"), minutes)
        }
        // Neither the daemon nor the eBPF toolchain: a current ClickHouse embedded in Python.
        Cmd::Bench { which, minutes, .. } if which == "clickhouse-bytes" => {
            bench::clickhouse_bytes(&workspace_root(), minutes.unwrap_or(10))
        }
        Cmd::Bench { which, seconds, minutes, rounds, baseline_rev, nodes, cpus, gpus } => {
            setup::ensure()?;
            setup::ensure_bench_tools()?;
            // PROFILER_BIN: a daemon built elsewhere (another revision, a stripped copy).
            let profiler = match std::env::var_os("PROFILER_BIN") {
                Some(bin) => PathBuf::from(bin),
                None => build(true)?,
            };
            // The benches that need no helper binaries (their build takes the cargo lock).
            match which.as_str() {
                "memory" => return bench::memory::run(&profiler),
                "cuda" => return bench::cuda::run(&workspace_root(), &profiler, rounds),
                "cuda-step" => return bench::cuda_step::run(&workspace_root(), &profiler, rounds),
                "nvml" => return bench::nvml::run(&workspace_root(), &profiler, rounds, seconds.unwrap_or(20)),
                _ => {}
            }
            let helpers = build_helpers()?;
            let helper = helpers.join("busy-helper");
            match which.as_str() {
                "spine" => bench::spine(&profiler, &helper, seconds.unwrap_or(60)),
                "store" => bench::store(&workspace_root(), minutes.unwrap_or(60)),
                "perf" => bench::perf(&profiler, &helper, seconds.unwrap_or(60)),
                "overhead" => {
                    let baseline = baseline_rev.map(|rev| bench::build_at(&workspace_root(), &rev)).transpose()?;
                    let builds = bench::overhead::Builds { profiler: &profiler, baseline: baseline.as_deref() };
                    bench::overhead::run(builds, &helpers.join("hash-work"), &helper, seconds.unwrap_or(15), rounds)
                }
                "status" => bench::status(&workspace_root(), &profiler),
                "sched" => bench::sched::run(&profiler, seconds.unwrap_or(10), rounds),
                "unwind" => bench::unwind::run(&workspace_root(), &profiler, seconds.unwrap_or(10)),
                "churn" => bench::churn::run(&profiler, &helpers.join("churn"), 99, 200, seconds.unwrap_or(60)),
                "python" => bench::python::run(&workspace_root(), &profiler, &helper, seconds.unwrap_or(20)),
                // An ignored test: it needs the test harness's private ClickHouse and the
                // synthetic stores it builds; the release test binary ships like the daemon. A
                // cluster of two 18.16 shards, `--nodes` GPU training nodes shipped into it and the
                // fleet's reads timed (tests/tests/fleet_scale.rs; FLEET_* knobs there).
                "fleet" => status({
                    let mut cmd = cargo();
                    cmd.args(["test", "--release", "--package", "integration-tests", "--test", "fleet_scale"])
                        .args(["fleet_scale_benchmark", "--", "--ignored", "--nocapture"])
                        .env("PROFILER_BIN", &profiler)
                        .env("FLEET_SECS", (minutes.unwrap_or(10) * 60).to_string());
                    for (knob, value) in [
                        ("FLEET_NODES", nodes),
                        ("FLEET_CPUS", cpus.map(u64::from)),
                        ("FLEET_GPUS", gpus.map(u64::from)),
                    ] {
                        if let Some(v) = value {
                            cmd.env(knob, v.to_string());
                        }
                    }
                    cmd
                }),
                // The earlier one-server bench: 50 nodes of 2 CPUs (FLEET_NODES, FLEET_CPUS).
                "fleet-one-server" => status({
                    let mut cmd = cargo();
                    cmd.args(["test", "--release", "--package", "integration-tests", "--test", "fleet_overview"])
                        .args(["fleet_benchmark", "--", "--ignored", "--nocapture"])
                        .env("PROFILER_BIN", &profiler)
                        .env("FLEET_SECS", (minutes.unwrap_or(10) * 60).to_string());
                    cmd
                }),
                "replay" => status({
                    let mut cmd = cargo();
                    cmd.args(["bench", "-q", "--package", "profiler-user", "--bench", "replay"]);
                    cmd
                }),
                other => {
                    bail!(
                        "unknown benchmark {other}; available: spine, store, perf, overhead, churn, python, cuda, nvml, replay, status, unwind, memory, fleet, fleet-one-server, sched, clickhouse-bytes"
                    )
                }
            }
        }
        Cmd::Test { args } if args.first().is_some_and(|a| a == "kernels") => {
            let opts = kernels::Options::parse_args(&args[1..])?;
            setup::ensure()?;
            let (profiler, helpers) = (build(true)?, build_helpers()?);
            kernels::run(&workspace_root(), &profiler, &helpers.join("busy-helper"), &opts)
        }
        Cmd::GpuCheck { write_script, binary, standin, out, seconds } => {
            gpu_check::run(gpu_check::Options { write_script, binary, standin, out, seconds }, || {
                setup::ensure()?;
                build(true)
            })
        }
        Cmd::Test { args } => {
            setup::ensure()?;
            setup::ensure_test_tools()?;
            // The CPythons of other distributions, in minimal roots.
            python_roots::ensure()?;
            let bin = build(false)?;
            // `cargo xtask test crash`: a first argument naming a file of tests/tests/ runs that
            // file's integration tests (the rest of the arguments filter them), not the tests
            // whose names contain it: no test in crash.rs says "crash" in its name, and the
            // README's `cargo xtask test crash` ran none of them (memory_budget, pods alike).
            let file = args.first().filter(|a| integration_test_file(a)).cloned();
            let filters = if file.is_some() { &args[1..] } else { &args[..] };
            // Unit tests first: fast, no root. Not for one integration file: it names none of them.
            if file.is_none() {
                let mut unit = cargo();
                unit.args(["test", "--workspace", "--exclude", "integration-tests", "--exclude", "profiler-ebpf"]);
                unit.arg("--").args(filters);
                status(unit)?;
            }
            // Then the real thing, one test at a time: each profiles the whole machine.
            let mut integration = cargo();
            integration.args(["test", "--package", "integration-tests"]);
            if let Some(file) = &file {
                integration.args(["--test", file]);
            }
            integration.args(["--", "--test-threads=1"]).args(filters).env("PROFILER_BIN", &bin);
            status(integration)?;
            // Last, unless a filter picked some tests: two minutes of the soak, release build,
            // then the arm64 build check.
            if args.is_empty() {
                let (profiler, helpers) = (build(true)?, build_helpers()?);
                soak::run(&profiler, &helpers.join("busy-helper"), &helpers.join("churn"), 2.0)?;
                // The arm64 build still compiles (about 15 s warm; 6 min into a fresh target/).
                arm64::check(arm64::Depth::Check)?;
                // Another kernel than the host's: Debian's 6.1 cloud kernel in qemu (about a
                // minute; all three flavours are `cargo xtask test kernels`).
                kernels::run(
                    &workspace_root(),
                    &profiler,
                    &helpers.join("busy-helper"),
                    &kernels::Options::in_suite(),
                )?;
            }
            Ok(())
        }
    }
}

/// The release builds of the workload helpers the benchmarks and the soak run; their directory.
fn build_helpers() -> anyhow::Result<PathBuf> {
    let mut helper = cargo();
    helper.args(["build", "--release", "--package", "integration-tests"]);
    for bin in ["busy-helper", "hash-work", "churn"] {
        helper.args(["--bin", bin]);
    }
    status(helper)?;
    Ok(workspace_root().join("target/release"))
}

/// `profiler` on PATH for the second terminal: a symlink in cargo's bin directory.
fn link_on_path(bin: &Path) {
    let Some(home) = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
    else {
        return;
    };
    let link = home.join("bin").join("profiler");
    let _ = std::fs::remove_file(&link);
    match std::os::unix::fs::symlink(bin, &link) {
        Ok(()) => eprintln!("xtask: `profiler` now points at {} (via {})", bin.display(), link.display()),
        Err(e) => eprintln!("xtask: could not link {} ({e}); use {} directly", link.display(), bin.display()),
    }
}
