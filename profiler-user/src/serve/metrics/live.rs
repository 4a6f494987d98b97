//! What `/metrics` reads: a part per producer, each written whole by the one stage that
//! produces it and read by the exposition, so that no stage writes another's figures and no
//! figure is listed twice. The parts are handles: [`Live`] is cloned into each stage at start
//! and into the server, and a stage holds only the parts it writes.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard},
};

use crate::collect::StackCounts;

/// One producer's figures, shared with the server. Written whole ([`Part::set`]), so a reader
/// never sees half of one update.
#[derive(Debug)]
pub struct Part<T>(Arc<Mutex<T>>);

impl<T> Clone for Part<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T: Default> Default for Part<T> {
    fn default() -> Self {
        Self(Arc::default())
    }
}

impl<T> Part<T> {
    pub fn set(&self, value: T) {
        *self.lock() = value;
    }

    /// Reads a figure or two without copying the rest.
    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&self.lock())
    }

    // A producer that panicked mid-write left whole figures behind (`set` swaps in a finished
    // value): they are still worth showing.
    fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<T: Clone> Part<T> {
    pub fn get(&self) -> T {
        self.lock().clone()
    }
}

/// Every part /metrics shows, by producer.
#[derive(Debug, Default, Clone)]
pub struct Live {
    /// Samples per second per CPU (set at start).
    pub frequency_hz: u64,
    /// The pipeline stage, of the kernel side and the queue in front of it.
    pub sampling: Part<Sampling>,
    /// The pipeline stage, of its pipeline (`Pipeline::figures`).
    pub pipeline: Part<crate::pipeline::Figures>,
    /// The pipeline stage, of the CUDA probes (`gpu::cuda`), when on.
    pub cuda: Part<Option<crate::gpu::cuda::status::Status>>,
    /// The pipeline stage, of the off-CPU counts (`offcpu`), when on.
    pub offcpu: Part<Option<crate::offcpu::Status>>,
    /// The upkeep stage.
    pub upkeep: Part<Upkeep>,
    /// The GPU poller, when GPU tracks are on.
    pub gpu: Option<crate::gpu::Shared>,
    /// NVIDIA Xid lines seen in the kernel log (the upkeep stage) or by NVML (the GPU poller),
    /// by (Xid, fatal).
    pub gpu_xids: crate::gpu_readings::XidCounts,
    /// The OTLP shipper, when it runs.
    pub otlp: Option<crate::ship::SharedStats>,
    /// The ClickHouse shipper, when it runs.
    pub clickhouse: Option<crate::ship::SharedStats>,
}

/// The kernel side and the queue behind its ring reader, as the pipeline stage reads them on
/// each flush tick.
#[derive(Debug, Default, Clone)]
pub struct Sampling {
    /// Per CPU: losses by cause, stack capture, the throttling estimate (`daemon::tally`).
    pub per_cpu: BTreeMap<u32, CpuTotals>,
    /// Runs of the sampler the kernel skipped: another BPF program was running on the CPU.
    pub recursion_misses: Option<u64>,
    /// Per BPF program: its run time (ns) and runs, while `kernel.bpf_stats_enabled` is 1.
    pub programs: Vec<(String, u64, u64)>,
    /// CPUs the sampler is attached to now.
    pub sampled_cpus: u64,
    /// Most bytes waiting in the sample ring buffer over the last flush interval, and its size.
    pub ring_used_bytes: u64,
    pub ring_size_bytes: u64,
    /// Event records (exec, fork, exit, cgroup) the kernel dropped: its ring was full.
    pub events_lost: u64,
    /// The queue between the ring reader and the pipeline.
    pub queue: Depth,
    /// Event records (exec, cgroup) the reader could not queue.
    pub events_dropped: u64,
}

/// What the upkeep stage measures every few seconds: the store and the daemon's own cost.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Upkeep {
    pub store_bytes: u64,
    /// Seconds of data the store spans.
    pub store_span_seconds: f64,
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
}

/// Cumulative figures of one CPU since the daemon started.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct CpuTotals {
    pub ring_full: u64,
    pub queue_full: u64,
    pub stacks: StackCounts,
    pub throttled_estimate: u64,
}

impl CpuTotals {
    pub fn lost(&self) -> u64 {
        self.ring_full + self.queue_full
    }
}

/// The queue between the daemon's ring reader and its pipeline, read at one moment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Depth {
    pub records: u64,
    pub bytes: u64,
    /// High-water marks since start.
    pub max_records: u64,
    pub max_bytes: u64,
    pub capacity_bytes: u64,
}
