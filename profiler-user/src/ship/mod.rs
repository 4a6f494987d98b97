//! Shipping the store elsewhere. The store is the source of truth and the buffer: a shipper
//! follows it from a cursor (the end of what was delivered), reads completed seconds with the
//! query API, and moves its cursor only once the receiver has them. So a shipper never holds
//! more than one batch, never slows the sampling stages (it runs on its own thread at low
//! priority), and a restart resumes where the last delivery ended.
//!
//! - `clickhouse`: samples, findings and events into ClickHouse tables (`docs/clickhouse.md`);
//! - `otlp`: OpenTelemetry profiles to a collector (OTLP/HTTP or OTLP/gRPC).

pub mod clickhouse;
pub mod otlp;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0} is not a directory the daemon made (a symbolic link or another file): remove it")]
    NotADirectory(PathBuf),
}

/// What a shipper reports on /metrics.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Requests the receiver accepted, and the samples and bytes (as sent) they held.
    pub batches: u64,
    pub samples: u64,
    pub bytes: u64,
    /// Findings' openings and closings sent as log records (OTLP only).
    pub log_records: u64,
    /// Samples of the CUDA profiles accepted (one per kind, second, thread and stack).
    pub cuda_samples: u64,
    /// Attempts that failed in a way worth another try (connection, timeout, 429, 502-504).
    pub retries: u64,
    /// Failures by reason: `rejected` (a batch refused for good, then skipped), `partial`
    /// (profiles the receiver said it dropped), `store` (the store could not be read).
    pub errors: BTreeMap<&'static str, u64>,
    /// Seconds between now and the cursor: how far behind the receiver is.
    pub lag_seconds: f64,
}

/// The end (ns since the epoch, exclusive) of what a shipper delivered, in
/// `DATA_DIR/ship/NAME.cursor`: decimal text, written to a temporary file and renamed, 0600.
pub struct Cursor {
    path: PathBuf,
}

impl Cursor {
    /// The cursor file of shipper `name`, creating `DATA_DIR/ship/` (0700) if needed.
    pub fn open(data_dir: &Path, name: &str) -> Result<Self, ShipError> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = data_dir.join("ship");
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(StoreError::Io(dir, e).into()),
        }
        // The data directory is root's alone (`store::files`); a link here would still be ours to
        // refuse, since cursor writes would follow it.
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(ShipError::NotADirectory(dir)),
            Err(e) => return Err(StoreError::Io(dir, e).into()),
        }
        Ok(Self { path: dir.join(format!("{name}.cursor")) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The saved cursor; `None` when there is none yet, or it does not parse (said in the log).
    pub fn load(&self) -> Option<u64> {
        let bytes = crate::store::files::read_regular(&self.path, 64).ok()?;
        let parsed = std::str::from_utf8(&bytes).ok().and_then(|s| s.trim().parse().ok());
        if parsed.is_none() {
            tracing::warn!(file = %self.path.display(), "the shipping cursor does not parse; starting from now");
        }
        parsed
    }

    pub fn save(&self, ns: u64) -> Result<(), StoreError> {
        crate::store::files::write_private(&self.path, format!("{ns}\n").as_bytes())
    }
}
