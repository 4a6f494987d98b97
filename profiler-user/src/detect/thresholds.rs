//! The detectors' thresholds: the config file's `[detect]` table, each with the reason for its
//! default where it is not obvious. Every figure that decides whether a detector reports a
//! finding, or how severe it is, lives here (and can be set there).

use serde::{Deserialize, Serialize};

/// Thresholds, from the config file's `[detect]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Thresholds {
    /// Detector 1: a CPU this busy (share of its ticks)...
    pub saturated_busy: f64,
    /// ...for this many consecutive seconds...
    pub saturated_secs: u32,
    /// ...while the whole machine is at most this busy...
    pub machine_busy_max: f64,
    /// ...with at least this share of its busy ticks in the kernel (system time and softirqs).
    /// A thread keeping a core busy in user space is a program at work, which per-core views
    /// show; what starved NAPI polls and reset NICs was a core held in the kernel. 0: any.
    pub saturated_kernel_min: f64,
    /// A saturated run this many seconds long is critical.
    pub saturated_critical_secs: u32,
    /// Detector 2: window over which a function's share of a CPU is measured.
    pub hot_window_secs: u32,
    /// Share of a CPU's samples (inclusive) that makes a kernel function hot.
    pub hot_share: f64,
    /// Lower share for the watchlist of known offenders.
    pub watch_share: f64,
    /// From this share of a CPU on, a hot kernel function is critical.
    pub hot_critical_share: f64,
    /// Detector 3: p99 of NET_RX raise→run waits in a second, ms.
    pub netrx_p99_ms: f64,
    /// Runs in a second below which the p99 says little (only the longest wait then counts).
    pub netrx_p99_min_runs: u64,
    /// Longest NET_RX wait or NAPI poll gap, ms.
    pub netrx_gap_ms: f64,
    /// A wait or gap this many times `netrx_gap_ms` is critical.
    pub netrx_critical_factor: f64,
    /// Detector 4: dying memory cgroups at least this many...
    pub zombie_min: u64,
    /// ...and at least this many times the live ones.
    pub zombie_ratio: f64,
    /// From this many dying memory cgroups on, the finding is critical.
    pub zombie_critical: u64,
    /// Detector 5: a cgroup's periods that ended throttled, at least this share...
    pub throttle_share: f64,
    /// ...over this window (its counters are read every 5 s)...
    pub throttle_window_secs: u32,
    /// ...of at least this many periods in which it ran. From this share of periods throttled
    /// on, the finding is critical (half the periods: the cgroup ran out of quota as often as
    /// not).
    pub throttle_min_periods: u64,
    pub throttle_critical_share: f64,
    /// Detector 6: a spin-lock slow path holding at least this share of each of...
    pub lock_share: f64,
    /// ...at least this many CPUs at once (one CPU is `hot_share`'s business)...
    pub lock_min_cpus: u32,
    /// ...over this window.
    pub lock_window_secs: u32,
    /// A spin-lock holding on average this share of the CPUs it holds is critical.
    pub lock_critical_share: f64,
    /// Detector 7: a runnable thread waited this long (ms) for a CPU...
    pub runq_max_ms: f64,
    /// ...or a CPU's p99 run-queue wait over a second (of at least 20 waits) is this long, ms.
    /// A parallel compile here (cargo -j 4 on 2 CPUs beside another build) peaked at 88 ms for
    /// one wait and 29 ms for a second's p99 (BENCHMARKS.md): the defaults are 5x and 3x that.
    /// Either counts only while the other CPUs have room (`detect::runq`): their mean busy share
    /// at most this (above it the waits are the machine's overload, which CPU x time shows).
    pub runq_p99_ms: f64,
    pub runq_others_busy_max: f64,
    /// A wait this many times `runq_max_ms` is critical. (The p99's floor of 20 waits is the
    /// statistic's, `collect::runq::MIN_WAITS_FOR_P99`, which the counters' p99 track shares.)
    pub runq_critical_factor: f64,
    /// Detector 8: how long a CPU's tasks stall in direct or memory-cgroup reclaim or compaction
    /// in one second, summed over the stalls (several tasks can stall at once), as a share of
    /// the second: 0.1 is 100 ms.
    pub reclaim_share: f64,
    /// From this share of the second stalled on, the finding is critical.
    pub reclaim_critical_share: f64,
    /// GPU detectors: a GPU below this utilisation (a share: 0.5 is 50 %) is idle...
    pub gpu_idle_below: f64,
    /// ...for this many consecutive seconds (also how long clocks must be held down)...
    pub gpu_secs: u32,
    /// ...while its feeders keep a CPU (or one process a core) at least this busy. A DataLoader
    /// worker in a CPU-bound transform shows 97-99 % of a core (issue 26's H100 node).
    pub gpu_cpu_busy: f64,
    /// ...or, with the off-CPU counts, while the holders' children keep no CPU that busy but
    /// are blocked off CPU (I/O, a socket or pipe read; not waiting on their own queue for
    /// work) at least this long a second, summed over them, over 5 s (0.5: one worker blocked
    /// half the time), and longer than they run.
    pub gpu_blocked_share: f64,
    /// `gpu-sync-stall`: a thread blocked in CUDA synchronisation at least this share of its
    /// time over `gpu_secs` while its GPU is below `gpu_idle_below`.
    pub gpu_sync_share: f64,
    /// `gpu-underused`: a GPU at least this busy by NVML's utilisation (a share)...
    pub gpu_busy_above: f64,
    /// ...while GPM's SM activity (Hopper and later) stays below this share, for `gpu_secs`.
    pub gpu_sm_active_below: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            saturated_busy: 0.9,
            saturated_secs: 3,
            machine_busy_max: 0.6,
            saturated_kernel_min: 0.5,
            saturated_critical_secs: 10,
            hot_window_secs: 5,
            hot_share: 0.5,
            watch_share: 0.2,
            hot_critical_share: 0.8,
            netrx_p99_ms: 5.0,
            netrx_p99_min_runs: 5,
            netrx_gap_ms: 100.0,
            netrx_critical_factor: 10.0,
            zombie_min: 1000,
            zombie_ratio: 10.0,
            zombie_critical: 10_000,
            throttle_share: 0.25,
            throttle_window_secs: 10,
            throttle_min_periods: 10,
            throttle_critical_share: 0.5,
            lock_share: 0.2,
            lock_min_cpus: 2,
            lock_window_secs: 5,
            lock_critical_share: 0.5,
            runq_max_ms: 500.0,
            runq_p99_ms: 100.0,
            runq_others_busy_max: 0.9,
            runq_critical_factor: 4.0,
            reclaim_share: 0.1,
            reclaim_critical_share: 0.5,
            gpu_idle_below: 0.5,
            gpu_secs: 10,
            gpu_cpu_busy: 0.9,
            gpu_blocked_share: 0.5,
            gpu_sync_share: 0.5,
            gpu_busy_above: 0.9,
            gpu_sm_active_below: 0.3,
        }
    }
}
