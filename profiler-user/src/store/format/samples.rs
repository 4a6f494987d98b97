//! The samples section of a block: one column per field, sorted by CPU then time, and the
//! checks a reader makes before trusting them.

use serde::{Deserialize, Serialize};

use super::{FormatError, NS_PER_US, StrId, decompress_bounded};

/// The samples of a block, one column per field, sorted by CPU and then time.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleColumns {
    /// Per sample, microseconds since the previous sample of the same CPU (the first of each
    /// CPU: since the block's start). Sorting by CPU makes these near-constant (the sampling
    /// period), which is what lets them compress to a fraction of a byte.
    pub ts_delta_us: Vec<u64>,
    pub cpu: Vec<u32>,
    pub pid: Vec<u32>,
    pub tid: Vec<u32>,
    pub comm: Vec<StrId>,
    pub cgroup: Vec<u64>,
    pub stack: Vec<u32>,
    /// Samples each row stands for; empty means 1 each (rollups and the CUDA stores fill it:
    /// bytes copied pass a u32 in a second). Postcard writes every integer as a varint, so
    /// blocks written when this was a `Vec<u32>` read the same, with no version bump.
    pub count: Vec<u64>,
    /// Per sample, the string id of its workload (`model::Sample::workload`); empty when no
    /// sample of the block has one. Added after version 4 without a version bump: blocks
    /// written before it end with `count` and read as having none ([`unpack_samples`]).
    pub workload: Vec<StrId>,
}

/// The sample columns as blocks before the workload column have them.
#[cfg_attr(test, derive(Serialize))]
#[derive(Deserialize)]
pub(super) struct SampleColumnsV4 {
    pub(super) ts_delta_us: Vec<u64>,
    pub(super) cpu: Vec<u32>,
    pub(super) pid: Vec<u32>,
    pub(super) tid: Vec<u32>,
    pub(super) comm: Vec<StrId>,
    pub(super) cgroup: Vec<u64>,
    pub(super) stack: Vec<u32>,
    pub(super) count: Vec<u64>,
}

/// Decodes a block's sample section, written with or without the workload column.
pub fn unpack_samples(bytes: &[u8], max: usize) -> Result<SampleColumns, FormatError> {
    let raw = decompress_bounded(bytes, max)?;
    if let Ok(cols) = postcard::from_bytes::<SampleColumns>(&raw) {
        return Ok(cols);
    }
    let v4: SampleColumnsV4 = postcard::from_bytes(&raw).map_err(|e| FormatError::Section(e.to_string()))?;
    Ok(SampleColumns {
        ts_delta_us: v4.ts_delta_us,
        cpu: v4.cpu,
        pid: v4.pid,
        tid: v4.tid,
        comm: v4.comm,
        cgroup: v4.cgroup,
        stack: v4.stack,
        count: v4.count,
        workload: Vec::new(),
    })
}

impl SampleColumns {
    pub fn len(&self) -> usize {
        self.cpu.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cpu.is_empty()
    }

    pub fn count(&self, i: usize) -> u64 {
        self.count.get(i).copied().unwrap_or(1)
    }

    /// The string id of sample `i`'s workload, if the block records workloads.
    pub fn workload(&self, i: usize) -> Option<StrId> {
        self.workload.get(i).copied()
    }

    /// Sample timestamps in ns, undoing the per-CPU delta encoding.
    pub fn timestamps(&self, start_ns: u64) -> impl Iterator<Item = u64> + '_ {
        let mut prev_cpu = None;
        let mut t = start_ns;
        self.ts_delta_us.iter().zip(&self.cpu).map(move |(&d, &cpu)| {
            if prev_cpu != Some(cpu) {
                prev_cpu = Some(cpu);
                t = start_ns;
            }
            t = t.saturating_add(d.saturating_mul(NS_PER_US));
            t
        })
    }

    /// Checks the columns against each other and against a dictionary of the given sizes.
    pub fn validate(&self, strings: usize, stacks: usize) -> Result<(), FormatError> {
        let n = self.len();
        let lens = [
            self.ts_delta_us.len(),
            self.pid.len(),
            self.tid.len(),
            self.comm.len(),
            self.cgroup.len(),
            self.stack.len(),
        ];
        let optional = |l: usize| l == 0 || l == n;
        if lens.iter().any(|&l| l != n) || !optional(self.count.len()) || !optional(self.workload.len()) {
            return Err(FormatError::Section("sample columns differ in length".into()));
        }
        if self.comm.iter().chain(&self.workload).any(|&c| c as usize >= strings)
            || self.stack.iter().any(|&s| s as usize >= stacks)
        {
            return Err(FormatError::DanglingId);
        }
        Ok(())
    }
}
