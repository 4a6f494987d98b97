//! Shipping the store elsewhere. The store is the source of truth and the buffer: a shipper
//! follows it from a cursor (the end of what was delivered), reads completed seconds with the
//! query API, and moves its cursor only once the receiver has them. So a shipper never holds
//! more than one batch, never slows the sampling stages (it runs on its own thread at low
//! priority), and a restart resumes where the last delivery ended.
//!
//! Every shipper is a [`Shipper`] with one [`Cursor`] and one [`Stats`]; each implementation
//! keeps its settings beside it (`NAME/config.rs`):
//! - `clickhouse`: samples, findings and events into ClickHouse tables (`docs/clickhouse.md`),
//!   whose names `clickhouse::schema` owns;
//! - `otlp`: OpenTelemetry profiles to a collector (OTLP/HTTP or OTLP/gRPC).

pub mod clickhouse;
pub mod cursor;
pub mod otlp;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

pub use cursor::{Cursor, CursorError};

/// One way of shipping the store: a follower of the store from its [`Cursor`] that reports its
/// figures as [`Stats`]. Each runs on a thread of its own ([`spawn`]), so a slow or absent
/// receiver never holds the pipeline up; it ends soon after the daemon's stop signal.
pub trait Shipper: Send + 'static {
    /// Its name: the thread's (`ship-NAME`) and the cursor's (`DATA_DIR/ship/NAME.cursor`).
    const NAME: &'static str;

    /// Follows the store until the daemon stops; what cannot go on is said in the log.
    fn run(self);
}

/// Starts `shipper` on a thread of its own.
pub fn spawn<S: Shipper>(shipper: S) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name(format!("ship-{}", S::NAME)).spawn(move || shipper.run())
}

/// A shipper's figures, shared with `/metrics`.
pub type SharedStats = Arc<Mutex<Stats>>;

/// What a shipper reports on /metrics (each shipper's lines name what it fills in).
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Requests the receiver accepted, and the samples and bytes (as sent) they held; for
    /// ClickHouse, the bytes of the sample inserts (the stack inserts' in `stack_bytes`).
    pub batches: u64,
    pub samples: u64,
    pub bytes: u64,
    /// ClickHouse's rows by table: samples, stacks (each new stack once per daemon run),
    /// findings and events (findings again while open), counter tracks (one per track and tick).
    pub sample_rows: u64,
    pub stacks: u64,
    pub stack_bytes: u64,
    pub findings: u64,
    pub events: u64,
    pub counter_rows: u64,
    /// Findings' openings and closings sent as log records (OTLP).
    pub log_records: u64,
    /// CUDA samples (or rows) accepted: one per kind, second, thread and stack.
    pub cuda_samples: u64,
    /// Attempts that failed in a way worth another try (connection, timeout, 429, 502-504).
    pub retries: u64,
    /// Failures by reason: `rejected` (a batch refused for good, then skipped), `partial`
    /// (profiles the receiver said it dropped), `store` (the store could not be read),
    /// `request` (a request that failed, to be retried).
    pub errors: BTreeMap<&'static str, u64>,
    /// Batches found delivered already after a delivery of unknown outcome, not sent again.
    pub batches_already_there: u64,
    /// The cursor: samples before it are delivered (ns since the epoch; 0 before the first).
    pub cursor_ns: u64,
    /// Seconds between now and the cursor when last published: how far behind the receiver is.
    pub lag_seconds: f64,
}
