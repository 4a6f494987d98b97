//! The GPUs on the samples' time axis, in two rooms that read them and one vocabulary:
//! - `nvml`: NVIDIA's management library (NVML), read at run time (issue 26): per GPU its
//!   utilisation, clocks and why they are held down, power, temperature, memory, PCIe traffic,
//!   ECC counts and the processes holding it, polled into counter tracks, `/metrics` and the
//!   summaries the detectors read; which GPUs there are (`gpus.json`); NVML's Xid events;
//! - `cuda`: uprobes on `libcuda.so.1` (issue 27): launches, synchronisations and copies
//!   attributed to stacks, drained once a second into stores of their own;
//! - `xid`: the driver's Xid fault reports and what their numbers mean, from the kernel log or
//!   NVML's events.
//!
//! What was read (readings, per-second summaries, the inventory, the poller's shared state)
//! lives below the detectors, in `gpu_readings`, so that they read it without importing the
//! rooms that fill it in; it is named here too for the rooms above.
//!
//! A node without the library or without GPUs says so once (log, status) and runs as before.

pub mod cuda;
pub mod nvml;
pub mod xid;

pub use crate::gpu_readings::{
    GpuInfo, GpuSecond, Holder, Inventory, Reading, RowRemap, SECONDS_KEPT, SLOWDOWN_REASONS, Shared, State,
    reason_names,
};
