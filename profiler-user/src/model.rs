//! The symbolized sample: what the collector hands to the store, and what queries see.

use std::sync::Arc;

use profiler_common::offcpu::state;

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

/// The frames' counts are prefetched before the frames drop: one locked decrement after the
/// other, each waited for its cache miss (`crate::prefetch`).
impl Drop for Stack {
    fn drop(&mut self) {
        self.frames.iter().for_each(crate::prefetch::arc_count);
    }
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

/// What a store's samples count. The CPU samples live in `DATA_DIR/segments`; each CUDA kind
/// in a store of its own under `DATA_DIR/cuda/<kind>` (see `gpu::cuda`), whose rows carry
/// weights (launches, nanoseconds blocked, bytes) and are read by the same queries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SampleKind {
    /// CPU time: one sample per tick.
    #[default]
    Cpu,
    /// GPU kernel launches, one per launch.
    CudaLaunches,
    /// Time blocked in CUDA synchronisation, stored in microseconds.
    CudaSync,
    /// Bytes copied by `cuMemcpy*`.
    CudaCopies,
    /// Time threads spent off their CPU (blocked or waiting for one), stored in microseconds,
    /// under the stack they left in (`offcpu`), its root frame naming the state.
    OffCpu,
}

impl SampleKind {
    pub const ALL: [SampleKind; 5] = [Self::Cpu, Self::CudaLaunches, Self::CudaSync, Self::CudaCopies, Self::OffCpu];
    pub const CUDA: [SampleKind; 3] = [Self::CudaLaunches, Self::CudaSync, Self::CudaCopies];
    /// The stores of weighted rows beside the CPU samples: what the shippers and the retention
    /// walk besides the CPU store.
    pub const WEIGHTED: [SampleKind; 4] = [Self::CudaLaunches, Self::CudaSync, Self::CudaCopies, Self::OffCpu];

    /// The name in flags, URLs and files (`--samples cuda-launches`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::CudaLaunches => "cuda-launches",
            Self::CudaSync => "cuda-sync",
            Self::CudaCopies => "cuda-copies",
            Self::OffCpu => "off-cpu",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == s)
    }

    /// The store holding this kind, inside a data directory (a fixed name: no request
    /// parameter becomes a path).
    pub fn store_dir(self, data_dir: &std::path::Path) -> std::path::PathBuf {
        match self {
            Self::Cpu => data_dir.to_path_buf(),
            Self::CudaLaunches => data_dir.join("cuda").join("launches"),
            Self::CudaSync => data_dir.join("cuda").join("sync"),
            Self::CudaCopies => data_dir.join("cuda").join("copies"),
            Self::OffCpu => data_dir.join("offcpu"),
        }
    }

    /// The pprof / OTLP sample type and unit.
    pub fn sample_type(self) -> (&'static str, &'static str) {
        match self {
            Self::Cpu => ("samples", "count"),
            Self::CudaLaunches => ("cuda_launches", "count"),
            Self::CudaSync => ("cuda_sync", "nanoseconds"),
            Self::CudaCopies => ("cuda_copies", "bytes"),
            Self::OffCpu => ("off_cpu", "nanoseconds"),
        }
    }

    /// What one stored unit is in the export's unit: the sync store keeps microseconds
    /// (a u32 row holds a thread's second many times over), exports say nanoseconds.
    pub fn stored_scale(self) -> i64 {
        match self {
            Self::CudaSync | Self::OffCpu => 1_000,
            _ => 1,
        }
    }

    /// What one unit of a folded count is, for titles and tooltips.
    pub fn unit(self) -> &'static str {
        match self {
            Self::Cpu => "samples",
            Self::CudaLaunches => "launches",
            Self::CudaSync => "µs blocked",
            Self::CudaCopies => "bytes",
            Self::OffCpu => "µs off CPU",
        }
    }

    /// The page's label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Cpu => "CPU",
            Self::CudaLaunches => "GPU launches",
            Self::CudaSync => "waiting on the GPU",
            Self::CudaCopies => "copies",
            Self::OffCpu => "off-CPU",
        }
    }

    /// A flamegraph's title: `CPU flamegraph`, `GPU launches flamegraph`; against a baseline,
    /// `Differential GPU launches flamegraph`.
    pub fn flamegraph_title(self, differential: bool) -> String {
        let what = self.label();
        if differential { format!("Differential {what} flamegraph") } else { format!("{what} flamegraph") }
    }
}

/// The state a thread waited off its CPU in (the off-CPU recorder's rows, `--state`), named
/// as the stacks' root frames name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OffState {
    /// Runnable: preempted, waiting for a CPU.
    Runnable,
    /// Interruptible sleep: futex, poll/epoll, pipe or socket read, nanosleep.
    Sleep,
    /// Uninterruptible (D state): disk or network file system I/O, or a kernel lock.
    Io,
}

impl OffState {
    pub const ALL: [OffState; 3] = [Self::Runnable, Self::Sleep, Self::Io];

    pub fn of(s: u32) -> Option<Self> {
        match s {
            state::RUNNABLE => Some(Self::Runnable),
            state::SLEEP => Some(Self::Sleep),
            state::IO => Some(Self::Io),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Runnable => "runnable",
            Self::Sleep => "sleep",
            Self::Io => "io",
        }
    }

    /// The root frame of its stacks: `[off-cpu: io]`.
    pub fn frame(self) -> &'static str {
        match self {
            Self::Runnable => "[off-cpu: runnable]",
            Self::Sleep => "[off-cpu: sleep]",
            Self::Io => "[off-cpu: io]",
        }
    }
}

impl std::str::FromStr for OffState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            let names: Vec<_> = Self::ALL.iter().map(|k| k.name()).collect();
            format!("state '{s}' is not one of {}", names.join(", "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flamegraphs_title_follows_what_it_counts() {
        assert_eq!(SampleKind::Cpu.flamegraph_title(false), "CPU flamegraph");
        assert_eq!(SampleKind::Cpu.flamegraph_title(true), "Differential CPU flamegraph");
        assert_eq!(SampleKind::CudaLaunches.flamegraph_title(false), "GPU launches flamegraph");
        assert_eq!(SampleKind::CudaLaunches.flamegraph_title(true), "Differential GPU launches flamegraph");
        for kind in SampleKind::CUDA {
            assert!(!kind.flamegraph_title(true).contains("CPU"), "{}", kind.flamegraph_title(true));
        }
    }

    #[test]
    fn every_sample_kind_round_trips_through_its_name() {
        for kind in SampleKind::ALL {
            assert_eq!(SampleKind::parse(kind.name()), Some(kind));
        }
    }
}
