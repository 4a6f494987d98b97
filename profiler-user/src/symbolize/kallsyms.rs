//! Kernel addresses → names, from `/proc/kallsyms`, read once.
//!
//! blazesym answers the same way (the first symbol listed at the greatest address not above
//! the one asked; kallsyms has no sizes), but costs a `stat` of `/proc/kallsyms` and a few
//! allocations per lookup. A tick lands on any instruction of a kernel function, so new
//! addresses keep coming for as long as the daemon runs: at 99 Hz that was the pipeline's
//! largest cost per sample after the stack cache. Here a lookup is one binary search.

use std::io::{BufRead, BufReader, Read};

/// Symbols by address: `(address, offset of the name in `names`, its length)`.
#[derive(Default)]
pub struct Kallsyms {
    symbols: Vec<(u64, u32, u32)>,
    names: String,
}

impl Kallsyms {
    pub fn read() -> std::io::Result<Self> {
        Ok(Self::parse(std::fs::File::open("/proc/kallsyms")?))
    }

    /// Lines `ADDRESS TYPE NAME [MODULE]`; address 0 (symbols hidden from this reader) skipped.
    pub fn parse(text: impl Read) -> Self {
        let mut symbols = Vec::new();
        let mut names = String::new();
        for line in BufReader::new(text).lines().map_while(Result::ok) {
            let mut fields = line.split_ascii_whitespace();
            let (Some(addr), Some(_), Some(name)) = (fields.next(), fields.next(), fields.next()) else { continue };
            let Ok(addr) = u64::from_str_radix(addr, 16) else { continue };
            if addr == 0 || names.len() + name.len() > u32::MAX as usize {
                continue;
            }
            symbols.push((addr, names.len() as u32, name.len() as u32));
            names.push_str(name);
        }
        // Stable: of the names at one address the first listed answers, as in blazesym.
        symbols.sort_by_key(|s| s.0);
        symbols.dedup_by_key(|s| s.0);
        symbols.shrink_to_fit();
        names.shrink_to_fit();
        Self { symbols, names }
    }

    /// The name of the symbol `addr` falls in, if any is at or below it.
    pub fn name(&self, addr: u64) -> Option<&str> {
        let i = self.symbols.partition_point(|s| s.0 <= addr).checked_sub(1)?;
        let (_, at, len) = self.symbols[i];
        self.names.get(at as usize..(at + len) as usize)
    }

    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_takes_the_first_name_listed_at_or_below_it() {
        let k = Kallsyms::parse(
            &b"ffffffff81000000 T _stext\nffffffff81000000 T _text\n0000000000000000 t hidden\n\
               ffffffff81000080 T entry_SYSCALL_64\nffffffffc0001000 t foo\t[mod]\nbad line\n"[..],
        );
        assert_eq!(k.name(0xffff_ffff_8100_0000), Some("_stext"));
        assert_eq!(k.name(0xffff_ffff_8100_007f), Some("_stext"));
        assert_eq!(k.name(0xffff_ffff_8100_0080), Some("entry_SYSCALL_64"));
        assert_eq!(k.name(0xffff_ffff_c000_2000), Some("foo"));
        assert_eq!(k.name(0x1000), None);
    }

    #[test]
    fn this_kernel_names_what_blazesym_names() {
        let ours = match Kallsyms::read() {
            Ok(k) if !k.is_empty() => k,
            // Addresses hidden (not root, or kptr_restrict 2): every line reads 0.
            Ok(_) => {
                profiler_common::test_skip::skip(
                    "this_kernel_names_what_blazesym_names: /proc/kallsyms hides its addresses (needs root, \
                     kernel.kptr_restrict below 2)",
                );
                return;
            }
            Err(e) => {
                profiler_common::test_skip::skip(&format!(
                    "this_kernel_names_what_blazesym_names: /proc/kallsyms cannot be read ({e})"
                ));
                return;
            }
        };
        use blazesym::symbolize::{
            Input, Symbolized, Symbolizer,
            source::{Kernel, Source},
        };
        let blaze = Symbolizer::new();
        let src = Source::Kernel(Kernel { vmlinux: blazesym::MaybeDefault::None, ..Kernel::default() });
        let step = (ours.symbols.len() / 500).max(1);
        // Past the first address: for the names there blazesym answers the last listed, not
        // the first, for addresses above it (its backward scan stops at index 0).
        let mut compared = 0;
        for &(addr, ..) in ours.symbols.iter().skip(1).step_by(step) {
            for probe in [addr, addr + 1] {
                if let Ok(Symbolized::Sym(sym)) = blaze.symbolize_single(&src, Input::AbsAddr(probe)) {
                    assert_eq!(ours.name(probe), Some(&*sym.name), "at {probe:#x}");
                    compared += 1;
                }
            }
        }
        // blazesym reads the same file: an answer for none of them is no comparison at all.
        assert!(compared > 0, "blazesym named none of {} addresses", ours.symbols.len().div_ceil(step) * 2);
        eprintln!("{compared} kernel addresses named alike");
    }
}
