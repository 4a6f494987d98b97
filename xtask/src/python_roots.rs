//! The CPython interpreters the Python test runs, each in a minimal root filesystem made with
//! `debootstrap` from its distribution's own archive: Debian bullseye's 3.9, Ubuntu jammy's
//! 3.10, Ubuntu noble's 3.12, Debian sid's 3.13, 3.14 and 3.15 (the machine's own python3 is the
//! 3.11). A root is also a container-like process tree for the profiler: its own libc, its
//! interpreter's files only under `/proc/PID/root`.
//!
//! Cached under [`ROOTS`] (about 0.9 GiB for the four): a root is made once (30-60 s each), into
//! `SUITE.tmp`, and renamed into place with a marker naming what it holds, so a root cut short
//! is made again and a root that holds what is asked is never touched. The Ubuntu archive's key
//! comes from Debian's `ubuntu-keyring` package, installed in the sid root (checked by Debian's
//! own key), so every root is checked against a key its distribution signs with.
//!
//! `tests/tests/python.rs` keeps the same list: under CI a root that is missing there fails.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

/// Where the roots live (`PROFILER_PYTHON_ROOTS` to move them).
pub const ROOTS: &str = "/var/cache/profiler-tests/roots";

const DEBIAN: &str = "http://deb.debian.org/debian";
const UBUNTU: &str = "http://archive.ubuntu.com/ubuntu";

struct Suite {
    name: &'static str,
    mirror: &'static str,
    packages: &'static [&'static str],
    /// Ubuntu's: checked with the key the sid root holds.
    ubuntu: bool,
    /// debootstrap's script, where the host's debootstrap predates the suite.
    script: Option<&'static str>,
}

/// sid first: its `ubuntu-keyring` checks the Ubuntu suites.
const SUITES: [Suite; 4] = [
    Suite {
        name: "sid",
        mirror: DEBIAN,
        packages: &["python3.13", "python3.14", "python3.15", "ubuntu-keyring"],
        ubuntu: false,
        script: None,
    },
    Suite { name: "bullseye", mirror: DEBIAN, packages: &["python3.9"], ubuntu: false, script: None },
    Suite { name: "jammy", mirror: UBUNTU, packages: &["python3.10"], ubuntu: true, script: None },
    // noble came after bookworm's debootstrap; it bootstraps as jammy does.
    Suite { name: "noble", mirror: UBUNTU, packages: &["python3.12"], ubuntu: true, script: Some("jammy") },
];

/// The marker of a finished root: the packages it was made with.
const MARKER: &str = ".profiler-root";

pub fn roots_dir() -> PathBuf {
    std::env::var_os("PROFILER_PYTHON_ROOTS").map_or_else(|| PathBuf::from(ROOTS), PathBuf::from)
}

/// Makes every root that is not there yet. A suite that cannot be made is reported and the
/// others go on: the Python test then fails under CI, naming the version it lacks.
pub fn ensure() -> anyhow::Result<()> {
    let dir = roots_dir();
    let wanted = |s: &Suite| s.packages.join(" ");
    let missing: Vec<&Suite> = SUITES
        .iter()
        .filter(|s| std::fs::read_to_string(dir.join(s.name).join(MARKER)).ok().as_deref() != Some(&*wanted(s)))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !Path::new("/usr/sbin/debootstrap").exists() {
        eprintln!("xtask: installing debootstrap (Debian) for the Python roots");
        crate::setup::apt_install(&["debootstrap"], "debootstrap")?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut failed = Vec::new();
    for suite in missing {
        eprintln!(
            "xtask: making the {} root ({}) under {} for the Python test (about a minute)",
            suite.name,
            suite.packages.join(", "),
            dir.display()
        );
        if let Err(e) = make(&dir, suite, &wanted(suite)) {
            eprintln!("xtask: the {} root was not made: {e:#}", suite.name);
            failed.push(suite.name);
        }
    }
    if !failed.is_empty() {
        eprintln!(
            "xtask: no root for {}: the Python test skips those versions, and fails under CI=true",
            failed.join(", ")
        );
    }
    Ok(())
}

fn make(dir: &Path, suite: &Suite, wanted: &str) -> anyhow::Result<()> {
    let (done, tmp) = (dir.join(suite.name), dir.join(format!("{}.tmp", suite.name)));
    for old in [&tmp, &done] {
        if old.exists() {
            remove_root(old)?;
        }
    }
    let mut cmd = Command::new("debootstrap");
    cmd.args(["--variant=minbase", &format!("--include={}", suite.packages.join(","))]);
    if suite.ubuntu {
        let key = dir.join("sid/usr/share/keyrings/ubuntu-archive-keyring.gpg");
        if !key.exists() {
            bail!("no Ubuntu archive key: the sid root (its ubuntu-keyring) was not made");
        }
        cmd.arg(format!("--keyring={}", key.display()));
    }
    cmd.arg(suite.name).arg(&tmp).arg(suite.mirror);
    if let Some(script) = suite.script {
        cmd.arg(format!("/usr/share/debootstrap/scripts/{script}"));
    }
    let out = cmd.output().context("cannot start debootstrap")?;
    if !out.status.success() {
        let log = String::from_utf8_lossy(&out.stdout);
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        bail!(
            "debootstrap {} failed ({}): {}",
            suite.name,
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        );
    }
    std::fs::write(tmp.join(MARKER), wanted)?;
    std::fs::rename(&tmp, &done).with_context(|| format!("cannot rename {} into place", tmp.display()))?;
    Ok(())
}

/// Removes a root, refusing one with anything mounted under it (debootstrap mounts `/proc`
/// and `/sys` while it works; a removal must never reach through them).
fn remove_root(root: &Path) -> anyhow::Result<()> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let prefix = format!("{}/", root.display());
    if let Some(m) = mounts.lines().filter_map(|l| l.split(' ').nth(1)).find(|m| m.starts_with(&prefix)) {
        bail!("{m} is mounted inside an unfinished root: unmount it, then run setup again");
    }
    std::fs::remove_dir_all(root).with_context(|| format!("cannot remove {}", root.display()))
}
