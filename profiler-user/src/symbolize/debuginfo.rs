//! Finding the separate debug file of a stripped binary, the way gdb and perf do: by build id
//! (`/usr/lib/debug/.build-id/xx/yyyy.debug`), then by `.gnu_debuglink` (beside the binary, in
//! its `.debug/`, or under `/usr/lib/debug` plus its directory).
//!
//! blazesym can follow debug links itself (`debug_syms`), but it opens the candidates by path
//! and blocks on whatever is there, and it then parses all the DWARF, where we only want the
//! debug file's `.symtab`. The directory of a user's binary is the user's, so a candidate is
//! opened as `file::open_regular` does (a FIFO or a device planted there is never opened for
//! real), bounded like a mapped file (`file::check_elf`), and kept only if it proves to be the
//! binary's own: the same build id, or the CRC-32 the debug link names.
//!
//! Paths are looked up inside the process's root (`/proc/PID/root`), where its package manager
//! put them; a build id also matches in the daemon's own `/usr/lib/debug` (a build id names one
//! build, wherever its debug file lies).

use std::{
    fs::File,
    io::{Read, Seek},
    path::PathBuf,
};

use super::file::{self, ElfInfo};

/// Largest debug file proven by CRC, which reads it whole: a binary's owner chooses its debug
/// link, and a link to a large file in each of many binaries would cost a read of each. (A debug
/// file by build id is proven by its header; distributions install theirs that way.)
pub const MAX_CRC_BYTES: u64 = 256 << 20;

/// The debug file of the binary at `path` (as the maps name it) in process `pid`, if one is
/// installed: checked and proven to belong to the binary.
pub fn find(pid: u32, path: &str, info: &ElfInfo) -> Option<File> {
    let path = path.trim_end_matches(" (deleted)");
    let root = format!("/proc/{pid}/root");
    let mut candidates: Vec<(PathBuf, Proof)> = Vec::new();
    if let Some(id) = info.build_id.as_deref().filter(|id| id.len() >= 2) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let rel = format!("/usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..]);
        candidates.push((format!("{root}{rel}").into(), Proof::BuildId(id)));
        candidates.push((rel.into(), Proof::BuildId(id)));
    }
    if let Some((name, crc)) = &info.debuglink
        && plain_name(name)
        && let Some((dir, _)) = path.rsplit_once('/')
    {
        for candidate in
            [format!("{dir}/{name}"), format!("{dir}/.debug/{name}"), format!("/usr/lib/debug{dir}/{name}")]
        {
            candidates.push((format!("{root}{candidate}").into(), Proof::Crc(*crc, info.build_id.as_deref())));
        }
    }
    candidates.into_iter().find_map(|(p, proof)| open_checked(&p, &proof))
}

enum Proof<'a> {
    BuildId(&'a [u8]),
    /// The CRC, and the binary's build id, which the debug file's must equal when it has one.
    Crc(u32, Option<&'a [u8]>),
}

/// A debug link names a file, never a path: one with `/` or `..` would lead out of the
/// directories searched.
fn plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/')
}

fn open_checked(path: &std::path::Path, proof: &Proof<'_>) -> Option<File> {
    let mut file = file::open_regular(path).ok()?;
    let size = file.metadata().ok()?.len();
    let info = file::check_elf(&file, size).ok()?;
    let proven = match proof {
        Proof::BuildId(id) => info.build_id.as_deref() == Some(*id),
        Proof::Crc(crc, id) => {
            let other_build = id.is_some() && info.build_id.is_some() && info.build_id.as_deref() != *id;
            !other_build && size <= MAX_CRC_BYTES && crc32(&mut file).ok()? == *crc
        }
    };
    if !proven {
        tracing::debug!(path = %path.display(), "not the binary's debug file");
        return None;
    }
    file.rewind().ok()?;
    Some(file)
}

/// CRC-32 of a whole file (already bounded in size by `check_elf`).
fn crc32(file: &mut File) -> std::io::Result<u32> {
    file.rewind()?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match file.read(&mut buf)? {
            0 => return Ok(hasher.finalize()),
            n => hasher.update(&buf[..n]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_link_names_are_plain_file_names() {
        assert!(plain_name("libc.so.6.debug"));
        for bad in ["", ".", "..", "../../etc/shadow", "/etc/shadow", "a/b"] {
            assert!(!plain_name(bad), "{bad}");
        }
    }

    /// The debug file beside the binary is found, and only while it is the one the link names:
    /// not with other contents (the CRC differs), not as a FIFO or a link planted in its place.
    #[test]
    fn a_debug_link_leads_only_to_the_proven_regular_file() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let Some(b) = crate::symbolize::tests::build_c_program(dir.path()) else { return };
        let linked = File::open(&b.linked).unwrap();
        let info = file::check_elf(&linked, linked.metadata().unwrap().len()).unwrap();
        assert_eq!(info.debuglink.as_ref().map(|(n, _)| &**n), Some("linked.debug"));
        let me = std::process::id();
        let path = b.linked.to_str().unwrap();
        let found = find(me, path, &info).expect("the debug file beside the binary");
        assert_eq!(found.metadata().unwrap().ino(), std::fs::metadata(&b.debug).unwrap().ino());

        let good = std::fs::read(&b.debug).unwrap();
        let mut other = good.clone();
        *other.last_mut().unwrap() ^= 1;
        std::fs::write(&b.debug, &other).unwrap();
        assert!(find(me, path, &info).is_none(), "other contents: the CRC differs");

        std::fs::remove_file(&b.debug).unwrap();
        let c = std::ffi::CString::new(b.debug.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let started = std::time::Instant::now();
        assert!(find(me, path, &info).is_none(), "a FIFO");
        assert!(started.elapsed() < std::time::Duration::from_secs(1), "did not block on the FIFO");

        std::fs::remove_file(&b.debug).unwrap();
        let real = dir.path().join("elsewhere.debug");
        std::fs::write(&real, &good).unwrap();
        std::os::unix::fs::symlink(&real, &b.debug).unwrap();
        assert!(find(me, path, &info).is_none(), "a symbolic link, even to the right contents");
    }

    #[test]
    fn a_file_with_neither_build_id_nor_link_has_no_debug_file() {
        assert!(find(std::process::id(), "/usr/bin/true", &ElfInfo::default()).is_none());
    }
}
