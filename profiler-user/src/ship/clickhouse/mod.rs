//! Ships the node's samples, findings, events and counter tracks to ClickHouse
//! (docs/clickhouse.md). A thread of its own follows
//! the store with a cursor persisted in the data directory: ClickHouse being slow, down or
//! restarted costs lag, never samples, and sampling never waits for it.

mod config;
mod counters;
mod cursor;
pub mod http;
pub mod metrics;
mod notes;
pub mod rows;
pub mod schema;
mod shipper;

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

pub use cursor::{Cursor, path as cursor_path, read as read_cursor};

pub use config::{BATCH_ROWS, Config, FileConfig};

#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    #[error("ClickHouse did not answer: {0}")]
    Http(String),
    #[error("ClickHouse refused (HTTP {status}): {message}")]
    Server { status: u16, message: String },
    #[error("ClickHouse answered {0:?} where a number was expected")]
    Answer(String),
    #[error("cannot write the shipping cursor {0}: {1}")]
    Cursor(PathBuf, #[source] std::io::Error),
    #[error(transparent)]
    Query(#[from] crate::query::QueryError),
    #[error("{key} = {value} is out of range: use {allowed}")]
    Range { key: &'static str, value: String, allowed: &'static str },
    #[error("ClickHouse URL '{0}' is not http://HOST:PORT (HTTPS is not built in: put a local TLS proxy in front)")]
    Url(String),
}

/// The shipper's figures, for `/metrics`.
#[derive(Debug, Default)]
pub struct Stats {
    pub rows: AtomicU64,
    pub samples: AtomicU64,
    pub stacks: AtomicU64,
    /// Finding and event rows sent (findings again while open).
    pub findings: AtomicU64,
    pub events: AtomicU64,
    /// Counter-track rows sent (one per track and tick; again with a re-sent batch).
    pub counter_rows: AtomicU64,
    /// CUDA rows sent (`cuda_samples`: one per kind, second, thread and stack).
    pub cuda_rows: AtomicU64,
    /// Gzipped bytes sent: sample rows, stack rows.
    pub sample_bytes: AtomicU64,
    pub stack_bytes: AtomicU64,
    /// Failed requests (each is retried).
    pub errors: AtomicU64,
    pub retries: AtomicU64,
    /// Batches found already in ClickHouse after an uncertain insert, and not sent again.
    pub batches_already_there: AtomicU64,
    /// The cursor: samples before it are in ClickHouse (ns since the epoch; 0 before the first).
    pub shipped_to_ns: AtomicU64,
}

impl Stats {
    pub fn get(v: &AtomicU64) -> u64 {
        v.load(Ordering::Relaxed)
    }
}

/// Starts the shipper's thread; it ends soon after `stop` is set.
pub fn spawn(config: Config, stats: Arc<Stats>, stop: Arc<AtomicBool>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("ship-clickhouse".into())
        .spawn(move || shipper::Shipper::new(config, stats, stop).run())
}
