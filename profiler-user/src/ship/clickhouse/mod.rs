//! Ships the node's samples, findings, events and counter tracks to ClickHouse
//! (docs/clickhouse.md). A thread of its own follows
//! the store with a cursor persisted in the data directory: ClickHouse being slow, down or
//! restarted costs lag, never samples, and sampling never waits for it.

mod config;
mod counters;
pub mod http;
pub mod metrics;
mod notes;
pub mod rows;
pub mod schema;
mod shipper;

use tokio::sync::watch;

use super::SharedStats;

pub use config::{BATCH_ROWS, Config, FileConfig};

#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    #[error("ClickHouse did not answer: {0}")]
    Http(String),
    #[error("ClickHouse refused (HTTP {status}): {message}")]
    Server { status: u16, message: String },
    #[error("ClickHouse answered {0:?} where a number was expected")]
    Answer(String),
    #[error(transparent)]
    Cursor(#[from] crate::ship::CursorError),
    #[error(transparent)]
    Query(#[from] crate::query::QueryError),
    #[error("{key} = {value} is out of range: use {allowed}")]
    Range { key: &'static str, value: String, allowed: &'static str },
    #[error("ClickHouse URL '{0}' is not http://HOST:PORT (HTTPS is not built in: put a local TLS proxy in front)")]
    Url(String),
}

/// The name of its cursor (`DATA_DIR/ship/clickhouse.cursor`), bound to the target.
const CURSOR: &str = "clickhouse";

/// The saved cursor, whatever its target (`profiler status`).
pub fn read_cursor(data_dir: &std::path::Path) -> Option<crate::ship::cursor::Saved> {
    crate::ship::cursor::read_saved(data_dir, CURSOR)
}

/// The ClickHouse shipper: samples, findings, events and counter tracks into ClickHouse.
pub struct Shipper {
    pub config: Config,
    pub stats: SharedStats,
    /// Becomes true when the daemon stops.
    pub stop: watch::Receiver<bool>,
}

impl super::Shipper for Shipper {
    const NAME: &'static str = CURSOR;

    fn run(self) {
        match shipper::Follower::new(self.config, self.stats, self.stop) {
            Ok(s) => s.run(),
            Err(e) => tracing::error!(error = %e, "the ClickHouse shipper cannot keep its cursor; nothing is shipped"),
        }
    }
}
