//! Ships the node's samples, findings, events and counter tracks to ClickHouse
//! (docs/clickhouse.md). A thread of its own follows
//! the store with a cursor persisted in the data directory: ClickHouse being slow, down or
//! restarted costs lag, never samples, and sampling never waits for it.

mod binary;
mod config;
mod counters;
mod error;
pub mod frames;
pub mod http;
mod known;
pub mod metrics;
mod notes;
mod pace;
mod rollups;
pub mod rows;
pub mod schema;
mod shipper;
pub mod track_rollups;
pub mod views;

use tokio::sync::watch;

use super::SharedStats;

pub use config::{BATCH_ROWS, Config, FileConfig};
pub use error::ShipError;

/// The saved cursor, whatever its target (`profiler status`).
pub fn read_cursor(data_dir: &std::path::Path) -> Option<crate::ship::cursor::Saved> {
    crate::ship::cursor::read_saved(data_dir, shipper::CURSOR)
}

/// The ClickHouse shipper: samples, findings, events and counter tracks into ClickHouse.
pub struct Shipper {
    pub config: Config,
    pub stats: SharedStats,
    /// Becomes true when the daemon stops.
    pub stop: watch::Receiver<bool>,
}

impl super::Shipper for Shipper {
    const NAME: &'static str = shipper::CURSOR;

    fn run(self) {
        match shipper::Follower::new(self.config, self.stats, self.stop) {
            Ok(s) => s.run(),
            Err(e) => tracing::error!(error = %e, "the ClickHouse shipper cannot keep its cursor; nothing is shipped"),
        }
    }
}
