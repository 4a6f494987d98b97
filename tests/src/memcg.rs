//! A cgroup v1 memory cgroup of the test's own, for the daemon under its unit's limit, and
//! programs run as an unprivileged user: the attacks of a user on a node the daemon watches.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

pub const MEMCG_V1: &str = "/sys/fs/cgroup/memory";
/// The shipped unit's `MemoryMax`.
pub const UNIT_LIMIT: u64 = 256 << 20;
pub const NOBODY: &str = "65534";

/// A memory cgroup of its own, removed when the test ends.
pub struct Memcg(pub PathBuf);

impl Memcg {
    /// `None` where this machine has no cgroup v1 memory hierarchy (or it cannot be written).
    pub fn new(limit: u64) -> Option<Self> {
        if !Path::new(MEMCG_V1).join("memory.limit_in_bytes").exists() {
            return None;
        }
        let path = Path::new(MEMCG_V1).join(format!("profiler-test-{}-{}", std::process::id(), crate::now_secs()));
        std::fs::create_dir(&path).ok()?;
        std::fs::write(path.join("memory.limit_in_bytes"), limit.to_string()).ok()?;
        Some(Self(path))
    }

    pub fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.0.join(file)).unwrap_or_default()
    }

    /// OOM kills in this cgroup so far (`oom_kill` of `memory.oom_control`).
    pub fn oom_kills(&self) -> u64 {
        let text = self.read("memory.oom_control");
        text.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
    }

    /// The most memory the cgroup held (`memory.max_usage_in_bytes`).
    pub fn peak(&self) -> u64 {
        self.read("memory.max_usage_in_bytes").trim().parse().unwrap_or(0)
    }

    /// The wrapper that starts a program inside it (`Daemon::start_wrapped`).
    pub fn join_command(&self) -> String {
        format!("echo $$ > {}/cgroup.procs && exec \"$@\"", self.0.display())
    }
}

impl Drop for Memcg {
    fn drop(&mut self) {
        // Its processes are gone by now (the daemon is dropped first); a last straggler would
        // keep the directory, which a later run ignores (another name).
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// `exe ARGS` as user nobody (no groups), its output piped to the test.
pub fn as_nobody(exe: &Path, args: &[&str]) -> Child {
    Command::new("setpriv")
        .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups", "--"])
        .arg(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("setpriv")
}
