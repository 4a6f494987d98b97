//! The GPUs on the samples' time axis (issue 26): NVIDIA's management library (NVML), read at
//! run time, gives per GPU its utilisation, clocks and why they are held down, power,
//! temperature, memory, PCIe traffic, ECC counts and the processes holding it.
//!
//! - `nvml`: the library, opened by path (`libnvidia-ml.so.1` by default, `--nvml-library`);
//!   every call may be missing or unsupported (a driver, a GPU, a MIG slice) and is then skipped;
//! - `poll`: the poller thread, every 100 ms by default: counter tracks in the store (a file of
//!   their own beside the kernel counters', `DATA_DIR/counters/<minute>.gpu.cnt`), the latest
//!   reading for `/metrics`, and one summary per second for the detectors (`detect::gpu`);
//! - `inventory`: which GPUs there are (or why none), written to `DATA_DIR/gpus.json` for
//!   `profiler status` and for mapping a kernel log line's PCI address to a GPU;
//! - `holders`: the processes holding each GPU named through the identity module (pod,
//!   container) for `/metrics` and `profiler status`;
//! - `events`: NVML's Xid events where the library offers them (the same faults, for nodes
//!   whose kernel log the daemon cannot read);
//! - `xid`: the driver's `NVRM: Xid` kernel log lines and what their numbers mean.
//!
//! A node without the library or without GPUs says so once (log, status) and runs as before.

pub mod cuda;
pub mod events;
pub mod holders;
pub mod inventory;
pub mod nvml;
pub mod poll;
pub mod xid;

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
};

pub use inventory::{GpuInfo, Inventory};

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(
        "cannot load NVIDIA's management library {path}: {why} (no NVIDIA driver here, or it is installed \
         elsewhere: give its path with --nvml-library or [gpu] nvml_library)"
    )]
    Load { path: String, why: String },
    #[error("NVIDIA's management library {path} did not start: {why}")]
    Init { path: String, why: String },
    #[error("cannot write {0}: {1}")]
    Write(std::path::PathBuf, String),
}

/// Clock-event (throttle) reasons that mean the clocks are held down by heat or the hardware,
/// not by an idle GPU, an application's setting or the power cap (NVML's
/// `nvmlClocksEventReason*`): hardware slowdown (0x8), software and hardware thermal slowdown
/// (0x20, 0x40), the hardware power brake (0x80).
///
/// The software power cap (0x4) is left out on purpose: a GPU doing dense work runs at its power
/// limit, and the driver then trades clock for power as designed. On an H100 the GPU-bound phase
/// of `cargo xtask gpu-check` (BF16 8192² products) sat at its 700 W limit with the SM clock at
/// 1375 of 1980 MHz and that bit set for the whole run (BENCHMARKS.md): counted, every healthy
/// busy GPU would be a `gpu-throttled` finding. The bit is still stored (`gpu.N.clock_events`),
/// named in a finding's evidence and on `/metrics`; a lowered power limit shows in `power_w`.
pub const SLOWDOWN_REASONS: u64 = 0x8 | 0x20 | 0x40 | 0x80;

/// Names of the clock-event bits, for findings and status.
pub fn reason_names(bits: u64) -> Vec<&'static str> {
    const NAMES: [(u64, &str); 9] = [
        (0x1, "idle"),
        (0x2, "application clocks setting"),
        (0x4, "software power cap"),
        (0x8, "hardware slowdown"),
        (0x10, "sync boost"),
        (0x20, "software thermal slowdown"),
        (0x40, "hardware thermal slowdown"),
        (0x80, "hardware power brake"),
        (0x100, "display clock setting"),
    ];
    NAMES.iter().filter(|(b, _)| bits & b != 0).map(|(_, n)| *n).collect()
}

/// One process holding a GPU (a compute context), with its share of the GPU where NVML says.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Holder {
    pub pid: u32,
    pub mem_mib: Option<f64>,
    /// SM utilisation of this process, %, from the last per-process sample.
    pub sm_util: Option<f64>,
    /// Its command and who it belongs to (`holders::Namer`); `None` until named.
    pub comm: Option<std::sync::Arc<str>>,
    pub identity: Option<crate::identity::Identity>,
}

/// What one poll read of one GPU (`None`: the call is missing or unsupported there).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Reading {
    pub index: u32,
    pub util: Option<f64>,
    pub mem_util: Option<f64>,
    pub sm_clock_mhz: Option<f64>,
    pub mem_clock_mhz: Option<f64>,
    pub clock_events: Option<u64>,
    pub power_w: Option<f64>,
    pub temp_c: Option<f64>,
    pub mem_used_mib: Option<f64>,
    pub mem_total_mib: Option<f64>,
    pub pcie_rx_mbps: Option<f64>,
    pub pcie_tx_mbps: Option<f64>,
    pub ecc_corrected: Option<f64>,
    pub ecc_uncorrected: Option<f64>,
    /// Row remapping where the GPU has it (A100 and later).
    pub remap: Option<RowRemap>,
    /// Processes holding the GPU as of the last read of them (read once a second).
    pub holders: Option<Vec<Holder>>,
}

/// Rows of GPU memory replaced by spares because of errors (NVML's remapped rows): a pending
/// remap needs a GPU reset to take effect; a failed one means the GPU ran out of spares.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct RowRemap {
    /// Rows remapped after correctable errors, and after uncorrectable ones.
    pub corrected: u32,
    pub uncorrected: u32,
    pub pending: bool,
    pub failed: bool,
}

/// One GPU over one wall-clock second, as the detectors see it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuSecond {
    pub index: u32,
    /// Mean utilisation over the second's polls, %; `None` when none read it.
    pub util: Option<f64>,
    pub polls: u32,
    /// Polls whose clock-event reasons had a slowdown bit ([`SLOWDOWN_REASONS`]).
    pub slowed_polls: u32,
    /// Every clock-event bit seen in the second.
    pub reasons: u64,
    /// Mean SM clock over the second's polls, MHz (`None`: not read).
    pub sm_clock_mhz: Option<f64>,
    pub holders: Vec<u32>,
}

/// Seconds of GPU summaries kept for the detectors (they evaluate 1.5 s after a second ends).
pub const SECONDS_KEPT: usize = 30;

/// What the poller shares with the detectors and `/metrics`; bounded: the latest reading per
/// GPU and [`SECONDS_KEPT`] seconds of summaries.
#[derive(Debug, Default)]
pub struct State {
    pub inventory: Inventory,
    pub latest: Vec<Reading>,
    /// (start of the second, unix ns; one summary per GPU), oldest first.
    pub seconds: VecDeque<(u64, Vec<GpuSecond>)>,
    pub polls: u64,
    /// CPU time the poller spent reading NVML and writing the tracks, since the start.
    pub poll_cpu_seconds: f64,
}

impl State {
    /// The summaries of the second that starts at `start_ns`, if the poller made them.
    pub fn second(&self, start_ns: u64) -> Option<&[GpuSecond]> {
        self.seconds.iter().find(|(s, _)| *s == start_ns).map(|(_, g)| g.as_slice())
    }
}

pub type Shared = Arc<Mutex<State>>;
