//! One mapped file (a module), shared by every process that maps it: the checked file, its
//! debug file if one is installed, and the names found so far, by file offset.
//!
//! An address is named, first to last, by the debug file's `.symtab` (by build id or debug
//! link, see `debuginfo`), then by the file's own `.symtab`, MiniDebugInfo and `.dynsym` (all
//! three through blazesym). Where none of them names it, it shows as `module+0xVADDR`, VADDR
//! being the ELF virtual address: what `addr2line -e module` and `llvm-symbolizer` take, so the
//! frame can be named later on a machine with the debug file.

use std::{fs::File, os::fd::AsRawFd, path::PathBuf, sync::Arc, time::Instant};

use blazesym::symbolize::{Input, Symbolized, Symbolizer as Blaze, source::Elf, source::Source};

use super::{
    debuginfo,
    file::{self, ElfInfo},
    maps::Mapping,
};

pub(super) struct Module {
    /// The file name, which `module+0xVADDR` shows.
    pub base: Arc<str>,
    /// The checked file and the path blazesym opens it by (`/proc/self/fd/N`: it leads to this
    /// very inode for as long as we hold the file, whatever its owner does to its path).
    pub file: Option<(File, PathBuf)>,
    /// What the checks read of it (segments, build id, debug link).
    pub info: Option<ElfInfo>,
    /// Its debug file, held and named the same way.
    pub debug: Option<(File, PathBuf)>,
    /// When opening it failed for a reason that may pass (the process exited first): retried
    /// after `MAPS_REFRESH` through another process that maps it.
    pub failed_at: Option<Instant>,
    /// By file offset: the name and the address `Location` gives it.
    pub names: rustc_hash::FxHashMap<u64, (Arc<str>, u64)>,
    /// Its symbol tables' share of the memory budget, held while it is open.
    pub charge: Option<crate::memory::Charge>,
}

/// Anonymous memory blazesym holds per symbol once a file's tables are parsed: its sorted index
/// of addresses (the names stay in the file, which it maps). A 1 M-symbol file measured ~40 MiB
/// of RSS in all, 24 of it the mapped symbol table (file pages, which the kernel can reclaim).
pub(super) const BYTES_PER_SYMBOL: u64 = 16;

/// How opening a module went, for the caller's counters.
pub(super) enum Opened {
    Yes,
    /// May pass (the process exited, the mapping changed): try again later.
    NotYet,
    /// Refused by the checks: its frames are named by module.
    Refused,
}

impl Module {
    /// A module not opened (yet): its frames are named `module+0xOFFSET`.
    pub fn unopened(mapping: &Mapping) -> Self {
        let path = mapping.path.trim_end_matches(" (deleted)");
        let base = path.rsplit('/').next().unwrap_or(path);
        Module {
            base: Arc::from(base),
            file: None,
            info: None,
            debug: None,
            failed_at: None,
            names: Default::default(),
            charge: None,
        }
    }

    /// Opens the mapped file itself, checked (see `file`), whatever its path now holds, and
    /// looks for its debug file.
    pub fn open(pid: u32, mapping: &Mapping, now: Instant) -> (Self, Opened) {
        let mut module = Module::unopened(mapping);
        match file::open_mapped(pid, mapping) {
            Ok(checked) => {
                if let Some(debug) = debuginfo::find(pid, &mapping.path, &checked.info) {
                    tracing::debug!(pid, file = %mapping.path, "using its separate debug file");
                    module.debug = Some(by_fd(debug));
                }
                module.file = Some(by_fd(checked.file));
                module.info = Some(checked.info);
                (module, Opened::Yes)
            }
            // Gone before we looked, or a mapping that changed meanwhile: may pass.
            Err(file::Refused::Open(_) | file::Refused::Replaced) => {
                module.failed_at = Some(now);
                (module, Opened::NotYet)
            }
            Err(why) => {
                tracing::debug!(pid, file = %mapping.path, "not symbolizing: {why}");
                (module, Opened::Refused)
            }
        }
    }

    /// Files this module holds open (each also open in blazesym once used).
    pub fn open_files(&self) -> usize {
        usize::from(self.file.is_some()) + usize::from(self.debug.is_some())
    }

    /// The paths blazesym knows this module's files by, to evict them.
    pub fn paths(&self) -> impl Iterator<Item = &PathBuf> {
        self.file.iter().chain(self.debug.iter()).map(|(_, p)| p)
    }

    /// The name of the function at `offset` in the file, if anything names it.
    /// With the function's start (an ELF virtual address).
    pub fn lookup(&self, blaze: &Blaze, offset: u64) -> Option<(String, u64)> {
        let symbolize = |path: &PathBuf, input: Input<u64>| {
            // ELF symbols only: DWARF would cost time and memory per file, for names the
            // symbol tables already have.
            let src = Source::Elf(Elf { debug_syms: false, ..Elf::new(path.clone()) });
            match blaze.symbolize_single(&src, input) {
                Ok(Symbolized::Sym(sym)) => Some((sym.name.into_owned(), sym.addr)),
                _ => None,
            }
        };
        // A debug file holds no code, so no file offsets: it is asked by virtual address.
        let in_debug = || {
            let vaddr = self.info.as_ref()?.vaddr(offset)?;
            symbolize(&self.debug.as_ref()?.1, Input::VirtOffset(vaddr))
        };
        in_debug().or_else(|| symbolize(&self.file.as_ref()?.1, Input::FileOffset(offset)))
    }

    /// What an address nothing names shows: `module+0xVADDR`. Without the file's segments (it
    /// was refused or could not be opened) the file offset stands in for the virtual address:
    /// for most shared objects the two are the same.
    /// With that address.
    pub fn unnamed(&self, offset: u64) -> (String, u64) {
        let vaddr = self.info.as_ref().and_then(|i| i.vaddr(offset)).unwrap_or(offset);
        (module_offset(&self.base, vaddr), vaddr)
    }
}

fn by_fd(file: File) -> (File, PathBuf) {
    let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    (file, path)
}

/// `module+0xVADDR`, the name of an address in a module that nothing names.
pub fn module_offset(module: &str, vaddr: u64) -> String {
    format!("{module}+0x{vaddr:x}")
}

/// The module and address of a `module+0xVADDR` name (a function name of that form, which no
/// compiler emits, reads the same).
pub fn parse_module_offset(name: &str) -> Option<(&str, u64)> {
    let (module, hex) = name.rsplit_once("+0x")?;
    if module.is_empty() || module.contains(char::is_whitespace) || hex.is_empty() || hex.len() > 16 {
        return None;
    }
    Some((module, u64::from_str_radix(hex, 16).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(path: &str, offset: u64) -> Mapping {
        Mapping { start: 0x7f00_0000_0000, end: 0x7f00_0010_0000, offset, dev: 1, inode: 2, path: Arc::from(path) }
    }

    #[test]
    fn unnamed_addresses_show_the_module_and_elf_virtual_address() {
        let mut m = Module::unopened(&mapping("/usr/lib/x86_64-linux-gnu/libc.so.6 (deleted)", 0x28000));
        assert_eq!(&*m.base, "libc.so.6");
        // Not opened: the file offset stands in.
        assert_eq!(m.unnamed(0x3fb9c).0, "libc.so.6+0x3fb9c");
        // A non-PIE binary's text: file offset 0x1000 loads at 0x401000, which addr2line takes.
        m.info = Some(ElfInfo {
            loads: vec![
                file::Load { offset: 0, size: 0x1000, vaddr: 0x400000 },
                file::Load { offset: 0x1000, size: 0x2000, vaddr: 0x401000 },
            ],
            ..ElfInfo::default()
        });
        assert_eq!(m.unnamed(0x1139).0, "libc.so.6+0x401139");
        // Past every segment (cannot be mapped, but a file can lie): the offset.
        assert_eq!(m.unnamed(0x9000).0, "libc.so.6+0x9000");
    }

    #[test]
    fn module_offset_names_parse_back() {
        assert_eq!(parse_module_offset(&module_offset("libc.so.6", 0x3fb9c)), Some(("libc.so.6", 0x3fb9c)));
        assert_eq!(parse_module_offset("prog+0x401139"), Some(("prog", 0x401139)));
        for not in ["main", "[unknown]", "+0x10", "libc.so.6+0x", "a+0xzz", "LazyCompile:*f x.js+0x1"] {
            assert_eq!(parse_module_offset(not), None, "{not}");
        }
    }
}
