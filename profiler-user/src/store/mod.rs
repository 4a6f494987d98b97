//! The time-bucketed sample store: `DATA_DIR/segments/<unix second of the minute>.seg`.
//!
//! The daemon is the only writer (it holds `DATA_DIR/LOCK`); any number of CLI readers open the
//! files concurrently and see every block flushed so far (see `format` for why a reader never
//! sees half a block).

mod contexts;
pub mod counters;
mod counters_read;
pub mod files;
pub mod format;
pub mod identity;
pub mod index;
pub mod maintenance;
pub mod meta;
pub mod reader;
pub mod retention;
pub mod rollup;
pub mod writer;

use std::path::{Path, PathBuf};

pub use meta::Meta;
pub use reader::{CpuSummary, Store, StoreSummary};
pub use writer::{Flushed, StoreWriter};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "data directory {0} does not exist: start the daemon with `profiler run --data-dir {0}`, or pass the --data-dir it writes to"
    )]
    Missing(PathBuf),
    #[error("cannot read data directory {0}: permission denied (the store is readable by root only)")]
    PermissionDenied(PathBuf),
    #[error("{0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("another profiler daemon already writes to {0} (it holds {0}/LOCK); stop it or choose another --data-dir")]
    Locked(PathBuf),
    #[error("{0}: {1}")]
    Io(PathBuf, #[source] std::io::Error),
    #[error(
        "refusing the data directory {0}: {1}. Another user could plant links there and make the daemon (root) overwrite any file; use a directory owned by root and writable only by root"
    )]
    Unsafe(PathBuf, String),
}

/// Where the segment starting at `start_ns` lives.
pub fn segment_path(segments_dir: &Path, start_ns: u64) -> PathBuf {
    segments_dir.join(format!("{}.seg", start_ns / format::NS_PER_SEC))
}

/// The segment directory inside a data directory.
pub fn segments_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("segments")
}

/// Checks that `data_dir` is an existing, readable directory, with a sentence if not.
pub fn check_dir(data_dir: &Path) -> Result<(), StoreError> {
    match std::fs::metadata(data_dir) {
        Ok(m) if !m.is_dir() => Err(StoreError::NotADirectory(data_dir.to_path_buf())),
        Ok(_) => match std::fs::read_dir(data_dir) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                Err(StoreError::PermissionDenied(data_dir.to_path_buf()))
            }
            Err(e) => Err(StoreError::Io(data_dir.to_path_buf(), e)),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(StoreError::Missing(data_dir.to_path_buf())),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            Err(StoreError::PermissionDenied(data_dir.to_path_buf()))
        }
        Err(e) => Err(StoreError::Io(data_dir.to_path_buf(), e)),
    }
}

/// Creates the data directory (root-only) and takes the single-writer lock, held as long as
/// the returned file is open.
pub fn create_and_lock(data_dir: &Path) -> Result<std::fs::File, StoreError> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |e| StoreError::Io(p, e)
    };
    files::prepare_private_dir(data_dir)?;
    let lock_path = data_dir.join("LOCK");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&lock_path)
        .map_err(io(&lock_path))?;
    match lock.try_lock() {
        Ok(()) => Ok(lock),
        Err(std::fs::TryLockError::WouldBlock) => Err(StoreError::Locked(data_dir.to_path_buf())),
        Err(std::fs::TryLockError::Error(e)) => Err(StoreError::Io(lock_path, e)),
    }
}
