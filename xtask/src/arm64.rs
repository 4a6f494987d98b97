//! `cargo xtask check-arm64`: the profiler compiles for arm64 (Graviton, Grace), the BPF
//! object included (aya-build builds it for the userspace target's architecture, so
//! `--target aarch64-unknown-linux-gnu` gives `bpf_target_arch = "aarch64"`). Compiled only:
//! nothing here runs on arm64 (docs/arm64.md says what is untested).
//!
//! Sets up what it needs, idempotently: rustup's aarch64 standard library and Debian's
//! aarch64 C cross compiler (zstd's C code is compiled even by `cargo check`); with `--unit-tests`,
//! Debian's qemu-user-static, which runs profiler-user's unit tests as arm64 code (no BPF: they
//! need no kernel support, but it is user-mode emulation on an x86_64 kernel).

use std::process::{Command, Stdio};

use anyhow::bail;

const TARGET: &str = "aarch64-unknown-linux-gnu";
const GCC: &str = "aarch64-linux-gnu-gcc";

fn ok(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

fn ensure_target() -> anyhow::Result<()> {
    let installed =
        Command::new("rustup").args(["target", "list", "--installed"]).current_dir(super::workspace_root()).output();
    if installed.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l.trim() == TARGET)) {
        return Ok(());
    }
    eprintln!("xtask: installing the {TARGET} standard library (rustup)");
    let added = Command::new("rustup").args(["target", "add", TARGET]).current_dir(super::workspace_root()).status();
    if !added.is_ok_and(|s| s.success()) {
        bail!(
            "cannot install Rust's {TARGET} standard library (`rustup target add {TARGET}` failed: no network to \
             static.rust-lang.org?). Without it: `cargo +nightly check -Z build-std=std,panic_abort --target {TARGET} \
             -p profiler-user` builds it from nightly's rust-src"
        );
    }
    Ok(())
}

/// Installs Debian's `package` unless `program --version` runs already.
fn ensure_debian(program: &str, package: &str, why: &str) -> anyhow::Result<()> {
    if ok(Command::new(program).arg("--version")) {
        return Ok(());
    }
    eprintln!("xtask: installing {package} (Debian) for {why}");
    let installed = ok(Command::new("apt-get").args(["update", "-qq"]))
        && ok(Command::new("apt-get").args(["install", "-y", "-qq", package]).env("DEBIAN_FRONTEND", "noninteractive"));
    if !installed || !ok(Command::new(program).arg("--version")) {
        bail!("cannot install {program}: run `apt-get install {package}` as root (Debian/Ubuntu), then retry");
    }
    Ok(())
}

/// What `check` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// `cargo check` (the BPF object is built in full by build.rs).
    Check,
    /// Build and link the binary.
    Build,
    /// Run profiler-user's unit tests under qemu-user.
    UnitTests,
}

/// Checks, builds or unit-tests profiler-user for arm64.
pub fn check(depth: Depth) -> anyhow::Result<()> {
    super::setup::ensure()?;
    ensure_target()?;
    ensure_debian(GCC, "gcc-aarch64-linux-gnu", "the C code of zstd")?;
    if depth == Depth::UnitTests {
        ensure_debian("qemu-aarch64-static", "qemu-user-static", "running arm64 unit tests")?;
    }
    let started = std::time::Instant::now();
    let mut cmd = super::cargo();
    match depth {
        Depth::Check => cmd.args(["check", "--package", "profiler-user", "--all-targets"]),
        Depth::Build => cmd.args(["build", "--package", "profiler-user", "--bin", "profiler"]),
        Depth::UnitTests => cmd.args(["test", "--package", "profiler-user", "--lib"]),
    };
    cmd.args(["--target", TARGET])
        .env("CC_aarch64_unknown_linux_gnu", GCC)
        .env("AR_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-ar")
        .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", GCC)
        // The arm64 C library and loader of Debian's cross toolchain.
        .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER", "qemu-aarch64-static -L /usr/aarch64-linux-gnu");
    super::status(cmd)?;
    let done = match depth {
        Depth::Check => "check",
        Depth::Build => "build",
        Depth::UnitTests => "unit tests pass under qemu-user",
    };
    println!(
        "arm64: profiler-user and its BPF object (bpf_target_arch=aarch64): {done} for {TARGET} in {:.0} s; not run on arm64 hardware (docs/arm64.md)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
