//! Opening the store's files safely. The daemon runs as root and the store's names are fixed,
//! so the danger is a directory another user can write: there a planted symlink turns the
//! daemon's writes into root writes anywhere (a copy of /etc/shadow was overwritten that way),
//! and a FIFO or /dev/zero in place of a segment makes readers block or read forever. So:
//! the data directory and every directory above it must be writable by root alone (as sshd's
//! StrictModes asks of ~/.ssh), files are opened without following symlinks, and only regular
//! files of bounded size are read.

use std::{
    fs::{File, OpenOptions},
    io::{self, Read},
    os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use super::StoreError;

/// Largest segment file read (one minute of 192 CPUs at 999 Hz is about 30 MB).
pub const MAX_SEGMENT_BYTES: u64 = 512 << 20;

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn unsafe_dir(path: &Path, why: String) -> StoreError {
    StoreError::Unsafe(path.to_path_buf(), why)
}

/// Why `meta` (of `path`, a directory the daemon writes under) is unsafe, if it is.
fn dir_problem(meta: &std::fs::Metadata, own: bool) -> Option<String> {
    let me = euid();
    if meta.uid() != me && meta.uid() != 0 {
        return Some(format!("it is owned by uid {}, not root", meta.uid()));
    }
    let mode = meta.mode();
    // A sticky directory owned by root (like /tmp) lets others add names but not replace ours.
    let sticky_ok = !own && mode & 0o1000 != 0 && meta.uid() == 0;
    if mode & 0o022 != 0 && !sticky_ok {
        return Some(format!(
            "it is writable by {} (mode {:o})",
            if mode & 0o002 != 0 { "everyone" } else { "its group" },
            mode & 0o7777
        ));
    }
    None
}

/// Checks the directories above `data_dir` (those that exist), then creates what is missing
/// and checks `data_dir` itself: a real directory (not a symlink), owned by root, writable
/// by root alone. Its mode is then set to 0700 (never through a link).
pub fn prepare_private_dir(data_dir: &Path) -> Result<(), StoreError> {
    let abs = if data_dir.is_absolute() {
        data_dir.to_path_buf()
    } else {
        std::env::current_dir().map_err(|e| StoreError::Io(data_dir.to_path_buf(), e))?.join(data_dir)
    };
    let mut ancestors: Vec<PathBuf> = abs.ancestors().skip(1).map(Path::to_path_buf).collect();
    ancestors.reverse();
    for dir in &ancestors {
        match std::fs::metadata(dir) {
            Ok(m) => {
                if let Some(why) = dir_problem(&m, false) {
                    return Err(unsafe_dir(data_dir, format!("{} above it: {why}", dir.display())));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => break,
            Err(e) => return Err(StoreError::Io(dir.clone(), e)),
        }
    }
    for dir in [abs.clone(), super::segments_dir(&abs)] {
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(unsafe_dir(&dir, "it is a symbolic link; pass the directory it points to".into()));
            }
            Ok(m) if !m.is_dir() => return Err(StoreError::NotADirectory(dir)),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&dir)
                    .map_err(|e| StoreError::Io(dir.clone(), e))?;
            }
            Err(e) => return Err(StoreError::Io(dir, e)),
        }
        let m = std::fs::symlink_metadata(&dir).map_err(|e| StoreError::Io(dir.clone(), e))?;
        if m.file_type().is_symlink() || !m.is_dir() {
            return Err(unsafe_dir(&dir, "it was replaced while the daemon started".into()));
        }
        if let Some(why) = dir_problem(&m, true) {
            return Err(unsafe_dir(&dir, why));
        }
        // Not a link (checked just above) and ours: samples name processes and their code.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| StoreError::Io(dir.clone(), e))?;
    }
    Ok(())
}

/// Opens `path` for appending (created 0600 if missing), refusing a symlink and a file
/// that is not a regular file of ours.
pub fn open_append(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    let m = f.metadata()?;
    if !m.is_file() || (m.uid() != euid() && m.uid() != 0) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a regular file owned by root"));
    }
    Ok(f)
}

/// Writes `bytes` as `path` (0600): a fresh temporary file (O_EXCL, no link followed), renamed
/// over `path`, so no planted link is written through and a reader never sees half of it.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    write_private_with(path, bytes, false)
}

/// [`write_private`], with the data synced before the rename: a crash leaves the old file or
/// the new one whole, never an empty one (what a shipper's cursor needs).
pub fn write_private_synced(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    write_private_with(path, bytes, true)
}

fn write_private_with(path: &Path, bytes: &[u8], sync: bool) -> Result<(), StoreError> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |e| StoreError::Io(p, e)
    };
    // A stale temporary (a crash) or a planted link: removing a link removes the link only.
    let _ = std::fs::remove_file(&tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(io(&tmp))?;
    f.write_all(bytes).map_err(io(&tmp))?;
    if sync {
        f.sync_all().map_err(io(&tmp))?;
    }
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// Reads a segment: a regular file (never a FIFO, device or symlink), at most
/// [`MAX_SEGMENT_BYTES`].
pub fn read_segment(path: &Path) -> io::Result<Vec<u8>> {
    read_regular(path, MAX_SEGMENT_BYTES)
}

/// Opens a regular file for reading (never a FIFO, device or symlink).
pub fn open_regular(path: &Path) -> io::Result<File> {
    let f =
        OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a regular file: skipped"));
    }
    Ok(f)
}

/// Reads a regular file (never a FIFO, device or symlink) of at most `max` bytes.
pub fn read_regular(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let f = open_regular(path)?;
    let m = f.metadata()?;
    if m.len() > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} bytes, more than such a file can hold ({max}): skipped", m.len()),
        ));
    }
    let mut data = Vec::with_capacity(m.len() as usize);
    f.take(max).read_to_end(&mut data)?;
    Ok(data)
}

/// Retention of time-partitioned files: removes those of `files` (start, path; oldest first)
/// that ended, `span_ns` after their start, by `cutoff_ns`. A file already gone (another
/// remover, a reader's cleanup) counts as removed by no one. Returns how many went, or the
/// file that could not be removed.
pub fn remove_ended(
    files: impl IntoIterator<Item = (u64, PathBuf)>,
    span_ns: u64,
    cutoff_ns: u64,
) -> Result<usize, (PathBuf, io::Error)> {
    let mut removed = 0;
    for (start, path) in files {
        // Oldest first: the first that has not ended yet is followed by none that has.
        if start.saturating_add(span_ns) > cutoff_ns {
            break;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err((path, e)),
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_that_is_a_link_or_a_device_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("1.seg");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let started = std::time::Instant::now();
        assert!(read_segment(&link).is_err());
        assert!(read_segment(Path::new("/dev/zero")).is_err());
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        let fifo = dir.path().join("2.seg");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: valid path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(read_segment(&fifo).is_err(), "a FIFO is refused without blocking");
    }

    #[test]
    fn private_files_are_not_written_through_links() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "secret").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("meta.json")).unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("meta.tmp")).unwrap();
        write_private(&dir.path().join("meta.json"), b"{}").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "secret");
        assert_eq!(std::fs::read(dir.path().join("meta.json")).unwrap(), b"{}");
        std::os::unix::fs::symlink(&victim, dir.path().join("findings.jsonl")).unwrap();
        assert!(open_append(&dir.path().join("findings.jsonl")).is_err());
    }

    #[test]
    fn data_directories_others_can_write_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let open = root.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = prepare_private_dir(&open.join("data")).unwrap_err().to_string();
        assert!(err.contains("writable by everyone"), "{err}");
        let theirs = root.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let err = prepare_private_dir(&theirs).unwrap_err().to_string();
        assert!(err.contains("owned by uid 65534"), "{err}");
        // A symlink as the data directory: refused, and its target's mode left alone.
        let target = root.path().join("target");
        std::fs::create_dir(&target).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(prepare_private_dir(&link).unwrap_err().to_string().contains("symbolic link"));
        assert_eq!(std::fs::metadata(&target).unwrap().mode() & 0o777, 0o755);
        // A good one is created 0700.
        let good = root.path().join("good");
        prepare_private_dir(&good).unwrap();
        assert_eq!(std::fs::metadata(&good).unwrap().mode() & 0o777, 0o700);
        assert!(super::super::segments_dir(&good).is_dir());
    }
}
