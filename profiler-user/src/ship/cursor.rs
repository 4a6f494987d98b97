//! A shipper's place in the store: `DATA_DIR/ship/NAME.cursor`, the end (ns since the epoch,
//! exclusive) of what it delivered. Written to a temporary file (0600, never through a link),
//! synced and renamed, in a directory only root reaches (0700): a crash leaves the old cursor
//! or the new one.
//!
//! A cursor may be bound to a target (where the rows went: a cursor for another server or
//! database starts over); it is then saved as JSON `{"target":…,"next_ns":…}`, otherwise as
//! decimal text. Both are the formats the shippers wrote before they shared this file, so a
//! daemon upgraded in place resumes where it left off: `otlp.cursor` is decimal,
//! `clickhouse.cursor` JSON.

use std::{
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

/// Longest cursor file read: a number, or a target (a URL and a database) and a number.
const MAX_CURSOR_BYTES: u64 = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum CursorError {
    #[error("cannot make the shipping cursor's directory {0}: {1}")]
    Io(PathBuf, #[source] std::io::Error),
    #[error("cannot write the shipping cursor: {0}")]
    Write(#[source] crate::store::StoreError),
    #[error("{0} is not a directory the daemon made (a symbolic link or another file): remove it")]
    NotADirectory(PathBuf),
}

/// A cursor bound to a target, as saved (and as `profiler status` shows it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Saved {
    /// Where the rows went.
    pub target: String,
    /// Samples before this time (ns since the epoch) are shipped.
    pub next_ns: u64,
}

pub struct Cursor {
    path: PathBuf,
    target: Option<String>,
}

/// Where shipper `name` keeps its cursor.
pub fn path(data_dir: &Path, name: &str) -> PathBuf {
    data_dir.join("ship").join(format!("{name}.cursor"))
}

/// The saved cursor of shipper `name` bound to a target, whatever the target (`profiler
/// status`); `None` when there is none or it is not bound to one.
pub fn read_saved(data_dir: &Path, name: &str) -> Option<Saved> {
    let bytes = crate::store::files::read_regular(&path(data_dir, name), MAX_CURSOR_BYTES).ok()?;
    serde_json::from_slice(&bytes).ok()
}

impl Cursor {
    /// The cursor of shipper `name` (decimal text), creating `DATA_DIR/ship/` (0700) if needed.
    pub fn open(data_dir: &Path, name: &str) -> Result<Self, CursorError> {
        let path = path(data_dir, name);
        let dir = path.parent().expect("a cursor's path has a parent");
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(CursorError::Io(dir.to_path_buf(), e)),
        }
        // The data directory is root's alone (`store::files`); a link here would still be ours to
        // refuse, since cursor writes would follow it.
        match std::fs::symlink_metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(CursorError::NotADirectory(dir.to_path_buf())),
            Err(e) => return Err(CursorError::Io(dir.to_path_buf(), e)),
        }
        Ok(Self { path, target: None })
    }

    /// The same, bound to `target` (saved as JSON): a cursor saved for another target loads
    /// as none.
    pub fn for_target(self, target: String) -> Self {
        Self { target: Some(target), ..self }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The saved cursor; `None` when there is none yet, it does not parse (said in the log),
    /// or it was saved for another target.
    pub fn load(&self) -> Option<u64> {
        let bytes = crate::store::files::read_regular(&self.path, MAX_CURSOR_BYTES).ok()?;
        let parsed = match &self.target {
            None => std::str::from_utf8(&bytes).ok().and_then(|s| s.trim().parse().ok()),
            Some(target) => {
                let saved = serde_json::from_slice::<Saved>(&bytes).ok();
                if saved.as_ref().is_some_and(|s| &s.target != target) {
                    return None;
                }
                saved.map(|s| s.next_ns)
            }
        };
        if parsed.is_none() {
            tracing::warn!(file = %self.path.display(), "the shipping cursor does not parse; starting over");
        }
        parsed
    }

    pub fn save(&self, ns: u64) -> Result<(), CursorError> {
        let text = match &self.target {
            None => format!("{ns}\n"),
            Some(target) => {
                serde_json::to_string(&Saved { target: target.clone(), next_ns: ns }).expect("a cursor serializes")
            }
        };
        crate::store::files::write_private_synced(&self.path, text.as_bytes()).map_err(CursorError::Write)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn the_cursor_survives_a_reopen_private_and_whole() {
        let dir = tempfile::tempdir().unwrap();
        let c = Cursor::open(dir.path(), "otlp").unwrap();
        assert_eq!(c.load(), None);
        c.save(1_795_000_010_000_000_000).unwrap();
        let again = Cursor::open(dir.path(), "otlp").unwrap();
        assert_eq!(again.load(), Some(1_795_000_010_000_000_000));
        assert_eq!(std::fs::read_to_string(again.path()).unwrap(), "1795000010000000000\n", "the format");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(again.path()), 0o600);
        assert_eq!(mode(&dir.path().join("ship")), 0o700);
        assert_eq!(std::fs::read_dir(dir.path().join("ship")).unwrap().count(), 1, "no temporary file left");
        std::fs::write(again.path(), "garbage").unwrap();
        assert_eq!(again.load(), None);
    }

    #[test]
    fn a_link_in_place_of_the_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/tmp", dir.path().join("ship")).unwrap();
        assert!(matches!(Cursor::open(dir.path(), "otlp"), Err(CursorError::NotADirectory(_))));
    }

    #[test]
    fn a_cursor_bound_to_a_target_reads_as_before_and_only_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let open = |t: &str| Cursor::open(dir.path(), "clickhouse").unwrap().for_target(t.into());
        assert_eq!(open("a").load(), None);
        // As the ClickHouse shipper wrote it before the cursor was shared.
        std::fs::write(path(dir.path(), "clickhouse"), r#"{"target":"a","next_ns":42}"#).unwrap();
        assert_eq!(open("a").load(), Some(42));
        open("a").save(43).unwrap();
        assert_eq!(std::fs::read_to_string(open("a").path()).unwrap(), r#"{"target":"a","next_ns":43}"#);
        assert_eq!(open("a").load(), Some(43));
        assert_eq!(open("b").load(), None);
        assert_eq!(read_saved(dir.path(), "clickhouse"), Some(Saved { target: "a".into(), next_ns: 43 }));
        assert_eq!(read_saved(dir.path(), "otlp"), None);
    }
}
