//! The eBPF toolchain: nightly's rust-src and a bpf-linker built against nightly's own LLVM
//! (the recipe verified on this kind of machine). Idempotent: each step checks first.

use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn run(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let st = cmd.status().with_context(|| format!("cannot start the command that installs {what}"))?;
    if !st.success() {
        bail!("could not install {what} ({st}); see the output above");
    }
    Ok(())
}

pub fn ensure() -> anyhow::Result<()> {
    if output(Command::new("rustup").arg("--version")).is_none() {
        bail!("rustup was not found: the eBPF build needs rustup's nightly toolchain (https://rustup.rs)");
    }
    let toolchains = output(Command::new("rustup").args(["toolchain", "list"])).unwrap_or_default();
    if !toolchains.lines().any(|l| l.starts_with("nightly")) {
        eprintln!("xtask: installing the nightly toolchain");
        run(
            Command::new("rustup").args(["toolchain", "install", "nightly", "--profile", "minimal"]),
            "the nightly Rust toolchain",
        )?;
    }
    let components =
        output(Command::new("rustup").args(["component", "list", "--toolchain", "nightly", "--installed"]))
            .unwrap_or_default();
    if !components.lines().any(|l| l.starts_with("rust-src")) {
        eprintln!("xtask: installing rust-src for nightly");
        run(
            Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]),
            "nightly's rust-src",
        )?;
    }
    if output(Command::new("bpf-linker").arg("--version")).is_none() {
        install_bpf_linker()?;
    }
    Ok(())
}

fn install_bpf_linker() -> anyhow::Result<()> {
    let sysroot = output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))
        .context("cannot ask nightly rustc for its sysroot")?;
    let sysroot = std::path::PathBuf::from(sysroot.trim());
    let version = output(Command::new("rustc").args(["+nightly", "-vV"])).context("cannot run nightly rustc")?;
    let Some(major) = version
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .map(str::to_string)
    else {
        bail!("nightly rustc does not report its LLVM version, so bpf-linker cannot be matched to it");
    };
    // llvm-sys links against a plain libLLVM.so; the toolchain ships only the versioned name.
    let lib = sysroot.join("lib");
    let versioned = std::fs::read_dir(&lib)
        .with_context(|| format!("cannot list {}", lib.display()))?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("libLLVM.so.") || (n.starts_with("libLLVM-") && n.ends_with(".so")));
    let Some(versioned) = versioned else {
        bail!("nightly's {} has no libLLVM shared library to build bpf-linker against", lib.display());
    };
    let plain = lib.join("libLLVM.so");
    if !plain.exists() {
        std::os::unix::fs::symlink(&versioned, &plain).with_context(|| format!("cannot create {}", plain.display()))?;
    }
    eprintln!("xtask: building bpf-linker against nightly's LLVM {major} (about a minute)");
    run(
        Command::new("cargo")
            .args(["install", "bpf-linker", "--no-default-features", "--features"])
            .arg(format!("llvm-{major}"))
            .env("LLVM_PREFIX", &sysroot),
        "bpf-linker",
    )?;
    if output(Command::new("bpf-linker").arg("--version")).is_none() {
        bail!("bpf-linker was installed but does not run; is ~/.cargo/bin on PATH?");
    }
    Ok(())
}

/// What the tests need besides Rust: Debian's chromium and chromedriver for the UI test
/// (browsers cannot be downloaded here; Debian's packages can), Go for the unwinder's Go
/// workload and `go tool pprof` (Go's own toolchain downloads are not reachable either), gcc and
/// binutils for the symbolizer's C program, Prometheus' promtool for the alerting rules, and the
/// PyPI packages other tests check against. A test missing one of these skips only outside CI
/// (`profiler_common::test_skip`).
pub fn ensure_test_tools() -> anyhow::Result<()> {
    // kubernetes-validate (PyPI) carries the Kubernetes JSON schemas: it validates offline.
    if output(Command::new("kubernetes-validate").arg("--version")).is_none() {
        eprintln!("xtask: installing kubernetes-validate (PyPI) for the DaemonSet test");
        run(
            Command::new("python3").args(["-m", "pip", "install", "-q", "kubernetes-validate"]),
            "kubernetes-validate",
        )?;
    }
    // opentelemetry-proto (PyPI): the official OTLP definitions the OTLP tests decode with,
    // pinned to the release whose profiles messages `export::otlp::proto` follows (the profiles
    // signal is still in development: its wire format changes between releases); grpcio serves
    // its ProfilesService as the reference gRPC receiver.
    let check = "import grpc, importlib.metadata as m; assert m.version('opentelemetry-proto').startswith('1.45.')";
    if output(Command::new("python3").args(["-c", check])).is_none() {
        eprintln!("xtask: installing opentelemetry-proto and grpcio (PyPI) for the OTLP tests");
        run(
            Command::new("python3").args([
                "-m",
                "pip",
                "install",
                "-q",
                "opentelemetry-proto==1.45.*",
                "grpcio>=1.63.2",
            ]),
            "opentelemetry-proto and grpcio",
        )?;
    }
    // chdb (PyPI) is today's ClickHouse, embedded: the schema test runs the DDL on it.
    if output(Command::new("python3").args(["-c", "import chdb"])).is_none() {
        eprintln!("xtask: installing chdb (PyPI) for the ClickHouse schema test");
        run(Command::new("python3").args(["-m", "pip", "install", "-q", "chdb"]), "chdb")?;
    }
    let have = |p: &str| std::path::Path::new(p).exists();
    let mut missing = Vec::new();
    // Debian's ClickHouse (18.16): the shipping test starts a private server of its own.
    if !have("/usr/sbin/clickhouse-server") {
        missing.extend(["clickhouse-server", "clickhouse-client"]);
    }
    if !(have("/usr/bin/chromium") && have("/usr/bin/chromedriver")) {
        missing.extend(["chromium", "chromium-driver"]);
    }
    if output(Command::new("go").arg("version")).is_none() {
        missing.push("golang-go");
    }
    // The symbolizer's tests build a C program, strip it and split off its debug file.
    if output(Command::new("gcc").arg("--version")).is_none() {
        missing.push("gcc");
    }
    if ["strip", "objcopy"].iter().any(|tool| output(Command::new(tool).arg("--version")).is_none()) {
        missing.push("binutils");
    }
    // promtool checks and unit-tests the shipped alerting rules (deploy/prometheus).
    if output(Command::new("promtool").arg("--version")).is_none() {
        missing.push("prometheus");
    }
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!(
        "xtask: installing {} (Debian) for the UI, unwinder, symbolizer and alerting rules tests",
        missing.join(" ")
    );
    apt_install(&missing, "the test tools")
}

/// Installs Debian packages (the package lists updated first).
pub fn apt_install(packages: &[&str], what: &str) -> anyhow::Result<()> {
    run(Command::new("apt-get").args(["update", "-qq"]), "the Debian package lists")?;
    run(
        Command::new("apt-get").args(["install", "-y", "-qq"]).args(packages).env("DEBIAN_FRONTEND", "noninteractive"),
        what,
    )
}

/// What the benchmarks compare against: perf (Debian's linux-perf) and bpftrace.
pub fn ensure_bench_tools() -> anyhow::Result<()> {
    let missing: Vec<&str> = [("perf", "linux-perf"), ("bpftrace", "bpftrace")]
        .into_iter()
        .filter(|(bin, _)| output(Command::new(bin).arg("--version")).is_none())
        .map(|(_, package)| package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing {} (Debian) for the benchmarks", missing.join(" and "));
    apt_install(&missing, "the benchmark tools")
}
