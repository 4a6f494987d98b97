//! `cargo xtask check-arm64`: the profiler compiles for arm64 (Graviton, Grace), the BPF
//! object included (aya-build builds it for the userspace target's architecture, so
//! `--target aarch64-unknown-linux-gnu` gives `bpf_target_arch = "aarch64"`). Compiled only:
//! nothing here runs on arm64 (docs/arm64.md says what is untested).
//!
//! Sets up what it needs, idempotently: rustup's aarch64 standard library and Debian's
//! aarch64 C cross compiler (zstd's C code is compiled even by `cargo check`).

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

fn ensure_gcc() -> anyhow::Result<()> {
    if ok(Command::new(GCC).arg("--version")) {
        return Ok(());
    }
    eprintln!("xtask: installing {GCC} (Debian's gcc-aarch64-linux-gnu) for the C code of zstd");
    let installed = ok(Command::new("apt-get").args(["update", "-qq"]))
        && ok(Command::new("apt-get")
            .args(["install", "-y", "-qq", "gcc-aarch64-linux-gnu"])
            .env("DEBIAN_FRONTEND", "noninteractive"));
    if !installed || !ok(Command::new(GCC).arg("--version")) {
        bail!("cannot install {GCC}: run `apt-get install gcc-aarch64-linux-gnu` as root (Debian/Ubuntu), then retry");
    }
    Ok(())
}

/// Checks (or, with `build`, builds and links) profiler-user for arm64.
pub fn check(build: bool) -> anyhow::Result<()> {
    super::setup::ensure()?;
    ensure_target()?;
    ensure_gcc()?;
    let started = std::time::Instant::now();
    let mut cmd = super::cargo();
    if build {
        cmd.args(["build", "--package", "profiler-user", "--bin", "profiler"]);
    } else {
        cmd.args(["check", "--package", "profiler-user", "--all-targets"]);
    }
    cmd.args(["--target", TARGET])
        .env("CC_aarch64_unknown_linux_gnu", GCC)
        .env("AR_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-ar")
        .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", GCC);
    super::status(cmd)?;
    println!(
        "arm64: profiler-user and its BPF object (bpf_target_arch=aarch64) {} for {TARGET} in {:.0} s; untested on arm64 (docs/arm64.md)",
        if build { "build" } else { "check" },
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
