//! NVIDIA's management library (NVML), read at run time: the GPUs' counter tracks.
//! - `library`: the library, opened by path (`libnvidia-ml.so.1` by default, `--nvml-library`);
//!   every call may be missing or unsupported (a driver, a GPU, a MIG slice) and is then skipped;
//! - `poll`: the poller thread, once a second: counter tracks in the store (a file of their own
//!   beside the kernel counters', `DATA_DIR/counters/<minute>.gpu.cnt`), the latest reading for
//!   `/metrics`, and one summary per second for the detectors (`detect::gpu`);
//! - `samples`: NVML's own utilisation samples, read a second at a time (a driver without them
//!   is polled every 100 ms instead); `timeline`: their ticks on the fast tracks, at their times;
//! - `holders`: the processes holding each GPU named through the identity module (pod,
//!   container) for `/metrics` and `profiler status`;
//! - `demand`: what each holder's busiest thread asked of the CPUs over each second (ran plus
//!   waited runnable, from the scheduler's statistics), for `gpu-launch-bound`;
//! - `family`: the processes each holder started (a DataLoader's workers), for `gpu-starved`;
//! - `events`: NVML's Xid events where the library offers them (the same faults, for nodes
//!   whose kernel log the daemon cannot read).
//!
//! Which GPUs there are (or why none) is written to `DATA_DIR/gpus.json`
//! (`gpu_readings::inventory`) when the poller starts.

mod demand;
mod events;
mod family;
mod gpm;
mod holders;
mod library;
mod poll;
mod samples;
mod timeline;

pub use events::already_raised;
pub use library::MAX_HOLDERS;
pub use poll::{POLL_MS, Poller};

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(
        "cannot load NVIDIA's management library {path}: {why} (no NVIDIA driver here, or it is installed \
         elsewhere: give its path with --nvml-library or [gpu] nvml_library)"
    )]
    Load { path: String, why: String },
    #[error("NVIDIA's management library {path} did not start: {why}")]
    Init { path: String, why: String },
}
