//! The summary section of a block: per-CPU busy, idle and lost counts and busy samples per
//! 10 ms, which answer status and heatmap questions without decoding a sample.

use serde::{Deserialize, Serialize};

use super::{FormatError, MAX_DECOMPRESSED, decompress_bounded};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuCounts {
    pub cpu: u32,
    pub busy: u64,
    /// Busy samples taken in kernel mode (the stack has kernel frames).
    pub kernel: u64,
    pub idle: u64,
    /// Samples the kernel side could not deliver, counted since the previous block.
    pub lost: u64,
}

/// Counts that answer status and heatmap questions without decoding samples. Readers reject
/// summaries with more than [`BUCKETS_PER_SEC`](super::BUCKETS_PER_SEC) buckets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub cpus: Vec<CpuCounts>,
    /// Busy samples of all CPUs per 10 ms of the block's second (empty in rollups).
    pub buckets: Vec<u32>,
    /// Per CPU with any: `(cpu, busy samples in softirq context)` (their stacks start their
    /// kernel frames with a `[softirq:NAME]` marker, `crate::context`). Added after version 4
    /// without a version bump, as the workload column: summaries written before it end with
    /// `buckets` and read as having none ([`unpack_summary`]); older readers ignore it.
    pub softirq: Vec<(u32, u64)>,
}

/// The summary as blocks before the softirq counts have it.
#[cfg_attr(test, derive(Serialize))]
#[derive(Deserialize)]
pub(super) struct SummaryV4 {
    pub(super) cpus: Vec<CpuCounts>,
    pub(super) buckets: Vec<u32>,
}

/// Decodes a block's summary section, written with or without the softirq counts.
pub fn unpack_summary(bytes: &[u8]) -> Result<Summary, FormatError> {
    let raw = decompress_bounded(bytes, MAX_DECOMPRESSED)?;
    if let Ok(s) = postcard::from_bytes::<Summary>(&raw) {
        return Ok(s);
    }
    let v4: SummaryV4 = postcard::from_bytes(&raw).map_err(|e| FormatError::Section(e.to_string()))?;
    Ok(Summary { cpus: v4.cpus, buckets: v4.buckets, softirq: Vec::new() })
}

impl Summary {
    /// Busy samples of `cpu` in softirq context.
    pub fn softirq(&self, cpu: u32) -> u64 {
        self.softirq.iter().find(|(c, _)| *c == cpu).map_or(0, |(_, n)| *n)
    }
}
