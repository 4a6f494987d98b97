//! The symbolized sample: what the collector hands to the store, and what queries see.

use std::sync::Arc;

/// A symbolized call stack, root first: user frames, then kernel frames.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Stack {
    pub frames: Vec<Arc<str>>,
    /// `frames[..user_len]` are user frames, the rest kernel frames.
    pub user_len: usize,
}

impl Stack {
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
