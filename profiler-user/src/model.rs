//! The symbolized sample: what the collector hands to the store, and what queries see.

use std::sync::Arc;

/// A symbolized call stack, root first: user frames, then kernel frames.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Stack {
    pub frames: Vec<Arc<str>>,
    /// `frames[..user_len]` are user frames, the rest kernel frames.
    pub user_len: usize,
    /// Where user frame `i` lives (`locations[i]`), as `perf script` prints it; shorter than the
    /// user frames (empty) when not known: stacks from before store format 5, or read back
    /// from ClickHouse.
    pub locations: Vec<Location>,
}

/// The file a user frame's code is mapped from (the path `/proc/PID/maps` shows, `[vdso]`, a
/// JIT's `/tmp/perf-PID.map`) and the address of its function there (an ELF virtual address; the
/// frame's own address when nothing names it). The store keeps functions, not instructions, so
/// it is the function's start. An empty file: nothing is known.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Location {
    pub file: Arc<str>,
    pub addr: u64,
}

impl Stack {
    pub fn new(frames: Vec<Arc<str>>, user_len: usize) -> Self {
        Self { frames, user_len, locations: Vec::new() }
    }
    pub fn user(&self) -> &[Arc<str>] {
        &self.frames[..self.user_len]
    }
    pub fn kernel(&self) -> &[Arc<str>] {
        &self.frames[self.user_len..]
    }
}

/// One non-idle sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Nanoseconds since the unix epoch (UTC).
    pub ts_ns: u64,
    pub cpu: u32,
    pub pid: u32,
    pub tid: u32,
    pub cgroup_id: u64,
    pub comm: Arc<str>,
    pub stack: Arc<Stack>,
    /// Who the process belongs to (container, pod, unit: `identity::Identity` as JSON), or
    /// empty when nothing is known.
    pub workload: Arc<str>,
}
