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
            candidates.push((format!("{root}{candidate}").into(), Proof::Crc(*crc)));
        }
    }
    candidates.into_iter().find_map(|(p, proof)| open_checked(&p, &proof))
}

enum Proof<'a> {
    BuildId(&'a [u8]),
    Crc(u32),
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
        Proof::Crc(crc) => crc32(&mut file).ok()? == *crc,
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

    #[test]
    fn a_file_with_neither_build_id_nor_link_has_no_debug_file() {
        assert!(find(std::process::id(), "/usr/bin/true", &ElfInfo::default()).is_none());
    }
}
