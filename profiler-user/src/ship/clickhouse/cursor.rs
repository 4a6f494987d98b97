//! The shipper's place in the store: `DATA_DIR/ship/clickhouse.cursor`, the first nanosecond
//! not yet shipped to one target (URL and database). Written to a temporary file, synced and
//! renamed, mode 0600 (the store's rule): a crash leaves the old cursor or the new one.

use std::{
    io::Write,
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use super::ShipError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// Where the rows went: a cursor for another server or database starts over.
    pub target: String,
    /// Samples before this time (ns since the epoch) are shipped.
    pub next_ns: u64,
}

pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("ship").join("clickhouse.cursor")
}

/// The cursor for `target`, if one was saved for it.
pub fn load(data_dir: &Path, target: &str) -> Option<Cursor> {
    read(data_dir).filter(|c| c.target == target)
}

/// The saved cursor, whatever its target (`profiler status`).
pub fn read(data_dir: &Path) -> Option<Cursor> {
    serde_json::from_str(&std::fs::read_to_string(path(data_dir)).ok()?).ok()
}

pub fn save(data_dir: &Path, c: &Cursor) -> Result<(), ShipError> {
    let p = path(data_dir);
    let dir = p.parent().expect("cursor path has a parent");
    let io = |e| ShipError::Cursor(p.clone(), e);
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io)?;
    // tempfile creates 0600 with O_EXCL.
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
    tmp.write_all(serde_json::to_string(c).expect("cursor serializes").as_bytes()).map_err(io)?;
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist(&p).map_err(|e| io(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn saved_cursor_is_private_and_bound_to_its_target() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path(), "a"), None);
        let c = Cursor { target: "a".into(), next_ns: 42 };
        save(dir.path(), &c).unwrap();
        save(dir.path(), &Cursor { next_ns: 43, ..c.clone() }).unwrap();
        assert_eq!(load(dir.path(), "a").map(|c| c.next_ns), Some(43));
        assert_eq!(load(dir.path(), "b"), None);
        let mode = std::fs::metadata(path(dir.path())).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::read_dir(dir.path().join("ship")).unwrap().count(), 1, "no temporary file left");
    }
}
