//! What the daemon hands the detectors through the pipeline besides samples: the kernel's
//! per-second readings, the upkeep stage's scans, the CUDA recorder's drains, the settings.
//! The stage asks the pipeline, never its engine: the engine stays the pipeline's own.

use super::Pipeline;
use crate::{
    collect::{
        NetRxCpu, memcg::MemcgCount, reclaim::ReclaimCpu, reclaim::ReclaimSecond, runq::RunqCpu, runq::RunqSecond,
    },
    detect::{Changes, Finding, Thresholds, cuda::CudaThread, throttle::scan::Reading},
};

impl Pipeline {
    /// Thresholds reloaded (SIGHUP): the next evaluations use them.
    pub fn set_thresholds(&mut self, t: Thresholds) {
        self.engine.set_thresholds(t);
    }

    /// Which CPUs take the NIC and GPU interrupts, read again every few seconds (irqbalance
    /// moves them): a finding on such a CPU says so.
    pub fn set_interrupts(&mut self, placement: crate::collect::irqs::Placement) {
        self.engine.interrupts = placement;
    }

    /// What the GPU poller reads, for the GPU and CUDA detectors (`None`: GPU tracks off).
    pub fn set_gpu(&mut self, gpu: Option<crate::gpu_readings::Shared>) {
        self.engine.gpu = gpu;
    }

    /// Whether the GPU poller found a GPU on this node.
    pub fn has_gpus(&self) -> bool {
        self.engine.gpu.as_ref().is_some_and(|g| !g.lock().unwrap_or_else(|p| p.into_inner()).inventory.gpus.is_empty())
    }

    /// Cumulative NET_RX figures read at `ts_ns` (see `Engine::on_netrx`).
    pub fn on_netrx(&mut self, ts_ns: u64, now: Vec<NetRxCpu>) {
        self.engine.on_netrx(ts_ns, now);
    }

    /// Cumulative run-queue figures read at `ts_ns`; each CPU's waits of this read come back,
    /// for the kernel counters' tracks.
    pub fn on_runq(&mut self, ts_ns: u64, now: Vec<RunqCpu>) -> Vec<(u32, RunqSecond)> {
        self.engine.on_runq(ts_ns, now)
    }

    /// Cumulative reclaim and compaction stalls read at `ts_ns`; each CPU's stalls of this read
    /// come back, for the kernel counters' tracks.
    pub fn on_reclaim(&mut self, ts_ns: u64, now: Vec<ReclaimCpu>) -> Vec<(u32, ReclaimSecond)> {
        self.engine.on_reclaim(ts_ns, now)
    }

    /// Memory cgroup counts read by the upkeep stage (`None`: unreadable).
    pub fn check_zombies(&mut self, now_ns: u64, count: Option<MemcgCount>) -> Changes {
        self.engine.check_zombies_count(now_ns, count)
    }

    /// CPU quota cgroups' throttling counters read by the upkeep stage (`None`: unreadable).
    pub fn check_throttle(&mut self, now_ns: u64, readings: Option<Vec<Reading>>) -> Changes {
        self.engine.check_throttle(now_ns, readings)
    }

    /// One drain of the CUDA probes: `threads`' calls over `secs` ending at `now_ns`.
    /// One drain of the off-CPU counts (`offcpu`).
    pub fn check_offcpu(&mut self, now_ns: u64, waits: Vec<crate::detect::iostall::Wait>) -> Changes {
        self.engine.check_offcpu(now_ns, waits)
    }

    pub fn check_cuda(&mut self, now_ns: u64, secs: f64, threads: Vec<CudaThread>) -> Changes {
        self.engine.check_cuda(now_ns, secs, threads)
    }

    /// Findings still open (for a clean shutdown: they are written with their current end).
    pub fn open_findings(&self) -> Vec<Finding> {
        self.engine.open_findings()
    }
}
