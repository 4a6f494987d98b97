//! Ships the node's samples, findings, events and counter tracks to ClickHouse
//! (docs/clickhouse.md). A thread of its own follows
//! the store with a cursor persisted in the data directory: ClickHouse being slow, down or
//! restarted costs lag, never samples, and sampling never waits for it.

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

pub use crate::config::ClickHouseFile as FileConfig;

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

/// Rows one insert may carry. At most half of ClickHouse's `max_insert_block_size` (1 M rows),
/// with room for one read step beyond it, so that an insert is one block, hence one part per
/// partition, and lands whole or not at all.
pub const BATCH_ROWS: std::ops::RangeInclusive<usize> = 1_000..=500_000;

#[derive(Debug, Clone)]
pub struct Config {
    pub url: String,
    pub database: String,
    pub user: Option<String>,
    pub password: Option<String>,
    pub batch_rows: usize,
    pub cluster: Option<String>,
    pub node: String,
    pub data_dir: PathBuf,
    /// The store's age limit: rows get the same TTL where the server supports it.
    pub max_age_secs: u64,
}

impl Config {
    /// The settings from `--clickhouse URL` (which wins) and the file's table; `None` when
    /// neither names a URL.
    pub fn resolve(
        flag_url: Option<String>,
        file: Option<&FileConfig>,
        node: &str,
        data_dir: PathBuf,
        max_age_secs: u64,
    ) -> Result<Option<Self>, ShipError> {
        let file = file.cloned().unwrap_or_default();
        let Some(url) = flag_url.or(file.url) else { return Ok(None) };
        if !url.starts_with("http://") || url.len() <= "http://".len() {
            return Err(ShipError::Url(url));
        }
        let batch_rows = file.batch_rows.unwrap_or(50_000);
        if !BATCH_ROWS.contains(&batch_rows) {
            return Err(ShipError::Range {
                key: "clickhouse.batch_rows",
                value: batch_rows.to_string(),
                allowed: "1000 to 500000 rows",
            });
        }
        Ok(Some(Self {
            url,
            database: file.database.unwrap_or_else(|| "profiler".into()),
            user: file.user,
            password: file.password,
            batch_rows,
            cluster: file.cluster,
            node: node.to_string(),
            data_dir,
            max_age_secs,
        }))
    }

    /// What a cursor is valid for. Credentials in the URL (`http://user:pass@host`) are left
    /// out: `profiler status` shows the target.
    fn target(&self) -> String {
        let rest = &self.url["http://".len()..];
        let host = rest.split_once('@').filter(|(auth, _)| !auth.contains('/')).map_or(rest, |(_, host)| host);
        format!("http://{host} {}", self.database)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_wins_and_limits_are_checked() {
        let file = FileConfig { url: Some("http://a:8123".into()), batch_rows: Some(2000), ..Default::default() };
        let c = Config::resolve(Some("http://b:8123".into()), Some(&file), "n", "/d".into(), 60).unwrap().unwrap();
        assert_eq!((c.url.as_str(), c.database.as_str(), c.batch_rows), ("http://b:8123", "profiler", 2000));
        assert!(Config::resolve(None, None, "n", "/d".into(), 60).unwrap().is_none());
        let big = FileConfig { batch_rows: Some(2_000_000), ..file.clone() };
        let e = Config::resolve(None, Some(&big), "n", "/d".into(), 60).unwrap_err().to_string();
        assert!(e.contains("clickhouse.batch_rows"), "{e}");
        let secret = Config::resolve(Some("http://u:pw@h:1/".into()), None, "n", "/d".into(), 60).unwrap().unwrap();
        assert_eq!(secret.target(), "http://h:1/ profiler");
        let e = Config::resolve(Some("https://x".into()), None, "n", "/d".into(), 60).unwrap_err().to_string();
        assert!(e.contains("TLS proxy"), "{e}");
    }
}
