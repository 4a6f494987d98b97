//! Opening the file behind a process's mapping without trusting anything its owner controls.
//!
//! The path in `/proc/PID/maps` belongs to whoever runs the process: it can be renamed, deleted,
//! or replaced by a FIFO whose `open` blocks forever. So the file is opened through
//! `/proc/PID/map_files/START-END`, a magic link to the inode that is mapped (a FIFO cannot be
//! mapped), non-blocking anyway, and kept only when `fstat` says it is a regular file with the
//! device and inode the maps named. Opening `map_files` takes CAP_SYS_ADMIN (or
//! CAP_CHECKPOINT_RESTORE), which the least-privilege daemon does not hold; then the path is
//! opened inside the process's root instead, after `lstat` found there a regular file with the
//! mapped device and inode, without following a last-component link, non-blocking, and
//! checked again after opening. Before blazesym parses it, the ELF section headers are
//! checked against the real file size and the symbol tables against a bound: a 20 KB sparse file
//! whose symbol table claims 100 M entries would otherwise cost gigabytes and seconds. The same
//! holds for MiniDebugInfo (`.gnu_debugdata`, an xz-compressed ELF file of symbols): a few KB of
//! xz can claim gigabytes, so it is inflated here within a bound and its own tables checked
//! before blazesym inflates it again for the names.
//!
//! The check also reads what naming needs besides the symbol tables: the loadable segments (to
//! turn a file offset into the ELF virtual address `addr2line` takes), the build id and the
//! `.gnu_debuglink` (to find a separate debug file, see `debuginfo`).

use std::{
    fs::File,
    io::Read as _,
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::Path,
};

use object::{
    Endianness, FileKind, ReadCache, ReadRef, elf,
    read::elf::{FileHeader, ProgramHeader, SectionHeader},
};

use super::maps::Mapping;

/// Files larger than this are not parsed (the largest shared objects of a distribution are a
/// few hundred MiB).
pub const MAX_FILE_BYTES: u64 = 1 << 30;
/// Most entries a symbol table (`.symtab`, `.dynsym`) may have. blazesym keeps an index entry
/// per symbol: a million is tens of MiB, more than any program of a server distribution has.
pub const MAX_SYMBOLS: u64 = 1_000_000;
/// Most bytes MiniDebugInfo may inflate to. Distributions keep only the function symbols not in
/// `.dynsym` there: hundreds of KB for libc, a few MB for the largest libraries.
pub const MAX_DEBUGDATA_BYTES: u64 = 32 << 20;

/// Why a mapped file is not symbolized.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("cannot open the mapped file: {0}")]
    Open(#[from] std::io::Error),
    #[error("the mapped file is not a regular file")]
    NotRegular,
    #[error("the mapped file is not the one the maps named (device or inode differ)")]
    Replaced,
    #[error("the file is {0} bytes, over the {MAX_FILE_BYTES}-byte bound")]
    TooLarge(u64),
    #[error("not an ELF file")]
    NotElf,
    #[error("malformed ELF headers: {0}")]
    Malformed(&'static str),
    #[error("a section lies outside the file")]
    SectionOutsideFile,
    #[error("a symbol table claims {0} entries, over the {MAX_SYMBOLS} bound")]
    TooManySymbols(u64),
    #[error("MiniDebugInfo (.gnu_debugdata) does not inflate within {MAX_DEBUGDATA_BYTES} bytes")]
    DebugData,
}

impl Refused {
    /// True when the file's contents are at fault (reading it again gives the same answer),
    /// false when opening it failed or found another file, for a reason of the moment.
    pub fn is_about_the_file(&self) -> bool {
        !matches!(self, Refused::Open(_) | Refused::NotRegular | Refused::Replaced)
    }
}

/// One loadable segment: file bytes `[offset, offset + size)` are mapped at ELF virtual address
/// `vaddr` (before the load bias).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    pub offset: u64,
    pub size: u64,
    pub vaddr: u64,
}

/// What the checks read of an ELF file that naming uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ElfInfo {
    pub loads: Vec<Load>,
    /// The `NT_GNU_BUILD_ID` note's bytes.
    pub build_id: Option<Box<[u8]>>,
    /// `.gnu_debuglink`: the debug file's name and the CRC-32 of its contents.
    pub debuglink: Option<(Box<str>, u32)>,
    /// Entries of its symbol tables (`.symtab` and `.dynsym`): what parsing them will cost.
    pub symbols: u64,
}

impl ElfInfo {
    /// The ELF virtual address of a file offset, which `addr2line -e FILE` and `llvm-symbolizer`
    /// take (the file offset is not: the two differ by a page or more in most binaries).
    pub fn vaddr(&self, offset: u64) -> Option<u64> {
        self.loads
            .iter()
            .find(|l| l.offset <= offset && offset - l.offset < l.size)
            .map(|l| l.vaddr.wrapping_add(offset - l.offset))
    }
}

/// A mapped file once opened and checked.
#[derive(Debug)]
pub struct Checked {
    pub file: File,
    pub info: ElfInfo,
}

/// Opens the file `mapping` of process `pid` maps, checked as the module comment says.
pub fn open_mapped(pid: u32, mapping: &Mapping) -> Result<Checked, Refused> {
    let link = format!("/proc/{pid}/map_files/{:x}-{:x}", mapping.start, mapping.end);
    // No O_NOFOLLOW: map_files entries are (magic) links by design; what they lead to is the
    // mapped inode itself, whatever the path now holds.
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(link);
    let file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => open_by_path(pid, mapping)?,
        Err(e) => return Err(e.into()),
    };
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(Refused::NotRegular);
    }
    if meta.dev() != mapping.dev || meta.ino() != mapping.inode {
        return Err(Refused::Replaced);
    }
    let info = check_elf(&file, meta.len())?;
    Ok(Checked { file, info })
}

/// Opens a regular file at a path someone else may control (a debug file beside a user's
/// binary, a perf map in a process's /tmp): only if `lstat` finds a regular file there, without
/// following a last-component link, non-blocking (a FIFO swapped in meanwhile does not hang us),
/// and only if what was opened is what `lstat` saw. The caller checks contents and owner.
pub fn open_regular(path: &Path) -> Result<File, Refused> {
    let before = std::fs::symlink_metadata(path)?;
    if !before.file_type().is_file() {
        return Err(Refused::NotRegular);
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NOFOLLOW)
        .open(path)?;
    let after = file.metadata()?;
    if !after.file_type().is_file() || after.dev() != before.dev() || after.ino() != before.ino() {
        return Err(Refused::Replaced);
    }
    Ok(file)
}

/// Without the capability `map_files` needs: the mapped path inside the process's root, opened
/// only when it already is the mapped regular file (checked again by the caller after opening).
fn open_by_path(pid: u32, mapping: &Mapping) -> Result<File, Refused> {
    let path = format!("/proc/{pid}/root{}", mapping.path);
    let before = std::fs::symlink_metadata(&path)?;
    if !before.file_type().is_file() {
        return Err(Refused::NotRegular);
    }
    if before.dev() != mapping.dev || before.ino() != mapping.inode {
        return Err(Refused::Replaced);
    }
    Ok(std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NOFOLLOW)
        .open(&path)?)
}

/// Refuses an ELF file whose section headers or symbol tables would make parsing it cost more
/// than its size justifies; returns what naming needs of it.
pub fn check_elf(file: &File, size: u64) -> Result<ElfInfo, Refused> {
    if size > MAX_FILE_BYTES {
        return Err(Refused::TooLarge(size));
    }
    let data = ReadCache::new(file);
    inspect(&data, size, true)
}

fn inspect<'a, R: ReadRef<'a>>(data: R, size: u64, outer: bool) -> Result<ElfInfo, Refused> {
    match FileKind::parse(data) {
        Ok(FileKind::Elf32) => check_sections::<elf::FileHeader32<Endianness>, R>(data, size, outer),
        Ok(FileKind::Elf64) => check_sections::<elf::FileHeader64<Endianness>, R>(data, size, outer),
        _ => Err(Refused::NotElf),
    }
}

fn check_sections<'a, H: FileHeader<Endian = Endianness>, R: ReadRef<'a>>(
    data: R,
    size: u64,
    outer: bool,
) -> Result<ElfInfo, Refused> {
    let header = H::parse(data).map_err(|_| Refused::Malformed("file header"))?;
    let endian = header.endian().map_err(|_| Refused::Malformed("byte order"))?;
    let mut info = ElfInfo::default();
    // object checks that the program and section header tables lie inside the file.
    for segment in header.program_headers(endian, data).map_err(|_| Refused::Malformed("program headers"))? {
        if segment.p_type(endian) == elf::PT_LOAD {
            let (offset, size, vaddr) =
                (segment.p_offset(endian).into(), segment.p_filesz(endian).into(), segment.p_vaddr(endian).into());
            info.loads.push(Load { offset, size, vaddr });
        }
    }
    let sections = header.section_headers(endian, data).map_err(|_| Refused::Malformed("section headers"))?;
    // Names only find the debug link and MiniDebugInfo: a file without them is still checked.
    let names = header.sections(endian, data).ok();
    for section in sections {
        let kind = section.sh_type(endian);
        if kind == elf::SHT_NOBITS || kind == elf::SHT_NULL {
            continue;
        }
        let (offset, len): (u64, u64) = (section.sh_offset(endian).into(), section.sh_size(endian).into());
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(Refused::SectionOutsideFile);
        }
        let symbols = kind == elf::SHT_SYMTAB || kind == elf::SHT_DYNSYM;
        // A compressed table would be inflated whole, to any size a few KB of zlib can claim.
        if (symbols || kind == elf::SHT_STRTAB) && section.sh_flags(endian).into() & u64::from(elf::SHF_COMPRESSED) != 0
        {
            return Err(Refused::Malformed("compressed symbol or string table"));
        }
        if symbols {
            let entry: u64 = section.sh_entsize(endian).into();
            let count = len / entry.max(1);
            if count > MAX_SYMBOLS {
                return Err(Refused::TooManySymbols(count));
            }
            info.symbols += count;
        }
        if kind == elf::SHT_NOTE
            && info.build_id.is_none()
            && let Ok(Some(mut notes)) = section.notes(endian, data)
        {
            while let Ok(Some(note)) = notes.next() {
                if note.name() == elf::ELF_NOTE_GNU && note.n_type(endian) == elf::NT_GNU_BUILD_ID {
                    info.build_id = Some(note.desc().into());
                    break;
                }
            }
        }
        let name = names.as_ref().and_then(|n| n.section_name(endian, section).ok()).unwrap_or_default();
        if name == b".gnu_debuglink" {
            info.debuglink = section.data(endian, data).ok().and_then(|d| debuglink(d, endian));
        } else if name == b".gnu_debugdata" && outer {
            // MiniDebugInfo inside MiniDebugInfo is not a thing; blazesym would not look.
            let xz = section.data(endian, data).map_err(|_| Refused::Malformed("section data"))?;
            let inner = inflate_xz(xz)?;
            inspect(inner.as_slice(), inner.len() as u64, false)?;
        }
    }
    Ok(info)
}

/// `.gnu_debuglink`: a file name, NUL, padding to 4 bytes, the CRC-32 in the file's byte order.
fn debuglink(data: &[u8], endian: Endianness) -> Option<(Box<str>, u32)> {
    let nul = data.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(&data[..nul]).ok()?;
    let at = (nul + 1).next_multiple_of(4);
    let crc: [u8; 4] = data.get(at..at + 4)?.try_into().ok()?;
    let crc = if endian == Endianness::Little { u32::from_le_bytes(crc) } else { u32::from_be_bytes(crc) };
    Some((name.into(), crc))
}

/// Inflates xz data, refusing it past `MAX_DEBUGDATA_BYTES`.
pub fn inflate_xz(data: &[u8]) -> Result<Vec<u8>, Refused> {
    let mut out = Vec::new();
    let read = xz2::read::XzDecoder::new(data).take(MAX_DEBUGDATA_BYTES + 1).read_to_end(&mut out);
    if read.is_err() || out.len() as u64 > MAX_DEBUGDATA_BYTES {
        return Err(Refused::DebugData);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A minimal ELF64 file: the header, then three section headers (null, a symbol table
    /// of `sym_bytes` at `sym_offset`, its string table), then `len` bytes in all (sparse).
    fn crafted_elf(sym_offset: u64, sym_bytes: u64, len: u64) -> tempfile::NamedTempFile {
        let mut out = Vec::new();
        out.extend_from_slice(b"\x7fELF\x02\x01\x01\0");
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(&3u16.to_le_bytes()); // e_type: ET_DYN
        out.extend_from_slice(&62u16.to_le_bytes()); // e_machine: x86-64
        out.extend_from_slice(&1u32.to_le_bytes()); // e_version
        out.extend_from_slice(&0u64.to_le_bytes()); // e_entry
        out.extend_from_slice(&0u64.to_le_bytes()); // e_phoff
        out.extend_from_slice(&64u64.to_le_bytes()); // e_shoff
        out.extend_from_slice(&0u32.to_le_bytes()); // e_flags
        for v in [64u16, 56, 0, 64, 3, 0] {
            // e_ehsize, e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx
            out.extend_from_slice(&v.to_le_bytes());
        }
        let section = |out: &mut Vec<u8>, kind: u32, offset: u64, size: u64, link: u32, entsize: u64| {
            out.extend_from_slice(&0u32.to_le_bytes()); // sh_name
            out.extend_from_slice(&kind.to_le_bytes());
            out.extend_from_slice(&0u64.to_le_bytes()); // sh_flags
            out.extend_from_slice(&0u64.to_le_bytes()); // sh_addr
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(&size.to_le_bytes());
            out.extend_from_slice(&link.to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes()); // sh_info
            out.extend_from_slice(&8u64.to_le_bytes()); // sh_addralign
            out.extend_from_slice(&entsize.to_le_bytes());
        };
        section(&mut out, elf::SHT_NULL, 0, 0, 0, 0);
        section(&mut out, elf::SHT_SYMTAB, sym_offset, sym_bytes, 2, 24);
        section(&mut out, elf::SHT_STRTAB, 256, 16, 0, 0);
        out.resize(272, 0);
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(&out).expect("write");
        f.as_file().set_len(len.max(out.len() as u64)).expect("set_len");
        f
    }

    fn check(f: &tempfile::NamedTempFile) -> Result<ElfInfo, Refused> {
        check_elf(f.as_file(), f.as_file().metadata().unwrap().len())
    }

    #[test]
    fn an_honest_small_elf_passes() {
        assert!(check(&crafted_elf(512, 24 * 10, 1024)).is_ok());
    }

    #[test]
    fn a_sparse_file_claiming_100m_symbols_is_refused() {
        // What the probe used: a few KB on disk, a size that holds the claimed table.
        let f = crafted_elf(4096, 24 * 100_000_000, 4096 + 24 * 100_000_000);
        assert!(matches!(check(&f), Err(Refused::TooLarge(_))), "{:?}", check(&f));
        // Under the size bound, the symbol bound catches it.
        let n = MAX_SYMBOLS * 2;
        let f = crafted_elf(4096, 24 * n, 4096 + 24 * n);
        assert!(matches!(check(&f), Err(Refused::TooManySymbols(c)) if c == n), "{:?}", check(&f));
    }

    #[test]
    fn a_symbol_table_past_the_end_of_the_file_is_refused() {
        let f = crafted_elf(512, 24 * 1000, 1024);
        assert!(matches!(check(&f), Err(Refused::SectionOutsideFile)), "{:?}", check(&f));
        let f = crafted_elf(u64::MAX - 8, 24, 1024);
        assert!(matches!(check(&f), Err(Refused::SectionOutsideFile)), "{:?}", check(&f));
    }

    #[test]
    fn a_compressed_symbol_table_is_refused() {
        use std::os::unix::fs::FileExt;
        let f = crafted_elf(512, 24 * 10, 1024);
        // The symbol table's header is the second one, at 64 + 64; its sh_flags 8 bytes in.
        f.as_file().write_all_at(&u64::from(elf::SHF_COMPRESSED).to_le_bytes(), 128 + 8).unwrap();
        assert!(matches!(check(&f), Err(Refused::Malformed(_))), "{:?}", check(&f));
    }

    #[test]
    fn not_an_elf_is_refused() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(b"#!/bin/sh\necho hi\n").unwrap();
        assert!(matches!(check(&f), Err(Refused::NotElf)));
    }

    #[test]
    fn without_map_files_the_path_route_opens_only_the_mapped_file() {
        let me = std::process::id();
        let maps = super::super::maps::read(me, None).maps;
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let text = maps.iter().find(|m| m.is_file() && *m.path == *exe.to_string_lossy()).expect("own text mapping");
        assert!(open_by_path(me, text).unwrap().metadata().unwrap().is_file());
        // Another file at the path (or the path naming a FIFO): refused before any open.
        let fifo = tempfile::tempdir().unwrap();
        let p = fifo.path().join("fifo");
        assert_eq!(unsafe { libc::mkfifo(std::ffi::CString::new(p.to_str().unwrap()).unwrap().as_ptr(), 0o600) }, 0);
        let other = Mapping { path: p.to_str().unwrap().into(), ..text.clone() };
        assert!(matches!(open_by_path(me, &other), Err(Refused::NotRegular)));
        let other = Mapping { path: "/proc/self/exe/../../../etc/hostname".into(), ..text.clone() };
        assert!(open_by_path(me, &other).is_err());
        let other = Mapping { inode: text.inode + 1, ..text.clone() };
        assert!(matches!(open_by_path(me, &other), Err(Refused::Replaced)));
    }

    #[test]
    fn this_test_binary_passes_through_its_map_files_entry() {
        let me = std::process::id();
        let maps = super::super::maps::read(me, None).maps;
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let text = maps.iter().find(|m| m.is_file() && *m.path == *exe.to_string_lossy()).expect("own text mapping");
        let checked = open_mapped(me, text).expect("own binary opens and passes the checks");
        assert!(checked.file.metadata().unwrap().is_file());
        // Its text lies in a loadable segment, and a linker-made binary has a build id.
        assert!(checked.info.vaddr(text.offset).is_some(), "{:?}", checked.info.loads);
        assert!(checked.info.build_id.is_some());
    }
}
