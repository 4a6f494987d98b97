//! Output files (`-o PATH`): root-only and never through a link. Profiles name processes and
//! functions, so they are root's data: the file is created 0600. The CLI runs as root, often in
//! a directory others can write (`/tmp`), so a symlink or FIFO planted at the path is refused
//! rather than followed, and the file is written beside it under a temporary name and renamed
//! over the path when complete: no other file is ever truncated, and a failed export leaves no
//! half-written file.

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

#[derive(Debug, thiserror::Error)]
pub enum OutFileError {
    #[error("{0} is a symbolic link: refusing to write through it (remove it or choose another path)")]
    Symlink(PathBuf),
    #[error("{0} exists and is not a regular file: -o writes files (use the shell's > to write to a device or pipe)")]
    NotAFile(PathBuf),
    #[error("cannot create {0}: {1}")]
    Create(PathBuf, #[source] std::io::Error),
    #[error("cannot write {0}: {1}")]
    Write(PathBuf, #[source] std::io::Error),
}

/// A file being written; [`OutFile::finish`] puts it in place. Dropped unfinished (an error
/// on the way), the temporary file is removed and the path left as it was.
pub struct OutFile {
    path: PathBuf,
    tmp: BufWriter<tempfile::NamedTempFile>,
}

impl OutFile {
    pub fn create(path: &Path) -> Result<Self, OutFileError> {
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => return Err(OutFileError::Symlink(path.to_path_buf())),
            Ok(m) if !m.is_file() => return Err(OutFileError::NotAFile(path.to_path_buf())),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(OutFileError::Create(path.to_path_buf(), e)),
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        // tempfile creates with O_EXCL and mode 0600.
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .tempfile_in(dir)
            .map_err(|e| OutFileError::Create(path.to_path_buf(), e))?;
        Ok(Self { path: path.to_path_buf(), tmp: BufWriter::new(tmp) })
    }

    /// Flushes and renames the file over the path (replacing a regular file there).
    pub fn finish(self) -> Result<(), OutFileError> {
        let path = self.path;
        let tmp = self.tmp.into_inner().map_err(|e| OutFileError::Write(path.clone(), e.into_error()))?;
        tmp.as_file().sync_all().map_err(|e| OutFileError::Write(path.clone(), e))?;
        let _file: File = tmp.persist(&path).map_err(|e| OutFileError::Write(path.clone(), e.error))?;
        Ok(())
    }
}

impl Write for OutFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tmp.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.tmp.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    fn write(path: &Path, text: &str) -> Result<(), OutFileError> {
        let mut f = OutFile::create(path)?;
        f.write_all(text.as_bytes()).unwrap();
        f.finish()
    }

    #[test]
    fn files_are_root_only_and_replace_what_was_there() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.svg");
        write(&p, "one").unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        write(&p, "two").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "two");
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o600, "an old 0644 file is replaced");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file left");
    }

    #[test]
    fn links_and_special_files_are_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("shadow");
        std::fs::write(&victim, "secret").unwrap();
        let link = dir.path().join("out.svg");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let e = write(&link, "x").unwrap_err().to_string();
        assert!(e.contains("is a symbolic link"), "{e}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "secret");
        let e = write(Path::new("/dev/null"), "x").unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        assert!(write(dir.path(), "x").is_err());
    }

    #[test]
    fn an_unfinished_file_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.html");
        {
            let mut f = OutFile::create(&p).unwrap();
            f.write_all(b"half").unwrap();
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
