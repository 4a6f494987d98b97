//! Compiles a binary's call frame information (`.eh_frame`, and `.debug_frame` for the code the
//! former does not cover) into the rows the sampler walks (`profiler_common::unwind::Row`): for
//! each address range, where the caller's frame starts (the CFA) and where the frame pointer was
//! saved. gimli evaluates the CFI programs; this keeps only what a stack walk needs and merges
//! neighbours that agree, so a table is a few bytes per function.
//!
//! Go writes its CFI only to `.debug_frame`, zlib-compressed, and says nothing there of the frame
//! pointer, which Go saves on amd64 in every function with a frame, 16 bytes below the CFA: the
//! rows of a Go binary's `.debug_frame` say so (a walk that goes on with frame pointers, into
//! code without a table, needs the caller's). A cgo binary has both sections: C code in
//! `.eh_frame`, Go code in `.debug_frame`.

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, EndianSlice, LittleEndian, Register, RegisterRule,
    UnwindContext, UnwindSection,
};
use object::{Object, ObjectSection, ObjectSegment, ReadRef};
use profiler_common::unwind::{Row, kind};

use crate::memory;

/// x86_64 DWARF register numbers.
const RBP: Register = Register(6);
const RSP: Register = Register(7);
const RIP: Register = Register(16);
/// Largest table built: 16.7 M rows, 64 MiB packed, six times libtorch_cpu.so's (what the
/// sampler's search bounds is the rows of one 64 KiB page: `packed`).
pub const MAX_ROWS: usize = 1 << 24;
/// Most bytes a compressed `.debug_frame` may inflate to (a 150 MB Go binary's is a few MB; a
/// few KB of zlib can claim gigabytes).
pub const MAX_DEBUG_FRAME_BYTES: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("not an ELF file the profiler can read: {0}")]
    Elf(#[from] object::Error),
    #[error("not an ELF file the profiler can read: {0}")]
    Malformed(&'static str),
    #[error("no .eh_frame or .debug_frame: nothing to unwind with")]
    NoCfi,
    #[error("malformed call frame information: {0}")]
    Cfi(#[from] gimli::Error),
    #[error("{0} unwind rows, more than the {MAX_ROWS} a table can hold")]
    TooLarge(usize),
    #[error("code spans more than 4 GiB")]
    TooWide,
    #[error(
        ".debug_frame is compressed in a format the profiler does not read, or inflates past {MAX_DEBUG_FRAME_BYTES} bytes"
    )]
    Compressed,
    #[error("the mapped file was refused: {0}")]
    Refused(String),
    #[error("cannot read the mapped file: {0}")]
    Unreadable(String),
    #[error(
        "building its table would hold {bytes} bytes, more than the unwind-build part of the memory budget has free ({pool} bytes in all): frame pointers for this file"
    )]
    OverBudget { bytes: u64, pool: u64 },
}

impl TableError {
    /// True when the file itself is at fault (trying it again gives the same answer), false
    /// when reading it failed for a reason of the moment.
    pub fn is_about_the_file(&self) -> bool {
        !matches!(self, TableError::Unreadable(_))
    }
}

/// One loadable segment: file offset, virtual address and size in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    pub offset: u64,
    pub vaddr: u64,
    pub size: u64,
    /// Mapped executable (`PF_X`).
    pub exec: bool,
}

/// A binary's compiled unwind table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    /// The lowest address covered; rows hold addresses relative to it.
    pub base: u64,
    pub rows: Vec<Row>,
    /// Loadable segments, to turn a mapping's file offset into a load bias.
    pub loads: Vec<Load>,
}

impl Table {
    /// What a mapping of this file at `start`, from file offset `offset`, must subtract from an
    /// address to get a row key; `None` when the offset is in no loadable segment.
    pub fn bias(&self, start: u64, offset: u64) -> Option<u64> {
        bias(self.base, &self.loads, start, offset)
    }

    /// Bytes the rows take in the kernel.
    pub fn bytes(&self) -> usize {
        self.rows.len() * std::mem::size_of::<Row>()
    }
}

/// The loadable segments of an ELF file.
pub fn loads<'data, R: ReadRef<'data>>(file: &object::File<'data, R>) -> Vec<Load> {
    file.segments()
        .map(|s| {
            let (offset, size) = s.file_range();
            let exec = matches!(s.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0);
            Load { offset, vaddr: s.address(), size, exec }
        })
        .collect()
}

/// [`Table::bias`] for a table whose rows are already elsewhere.
///
/// A mapping starts at a page boundary, so its file offset can lie before its segment's
/// (lld puts the code segment at a non-page-aligned offset, right after the read-only one): the
/// executable segment whose page-aligned start covers the offset is the one mapped.
pub fn bias(base: u64, loads: &[Load], start: u64, offset: u64) -> Option<u64> {
    const PAGE: u64 = 4096;
    let covers = |l: &&Load| (l.offset & !(PAGE - 1)..l.offset + l.size.max(1)).contains(&offset);
    let load = loads.iter().filter(|l| l.exec).find(covers).or_else(|| loads.iter().find(covers))?;
    let vaddr = (load.vaddr + offset).checked_sub(load.offset)?;
    Some(start.wrapping_sub(vaddr).wrapping_add(base))
}

/// The rule for one address range, before it becomes a row relative to the table's base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rule {
    kind: u8,
    cfa_offset: u16,
    fp_offset: i8,
}

const NONE: Rule = Rule { kind: kind::NONE, cfa_offset: 0, fp_offset: 0 };

/// Compiles the unwind table of the ELF file in `data` (a file or a mapped image like the vDSO),
/// drawing on the unwind-build pool of the memory budget for everything it reads and holds.
pub fn compile<'data, R: ReadRef<'data>>(data: R) -> Result<Table, TableError> {
    compile_within(data, &memory::UNWIND, Source::Read)
}

/// Where a build's bytes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Read into the daemon's memory (a `ReadCache`): the sections are charged.
    Read,
    /// A mapping of a file no user can change (root's, not writable by others): the sections
    /// are page cache, which the kernel reclaims, and are not charged. A user's file is never
    /// mapped: truncated under the mapping, it would kill the daemon with SIGBUS.
    Mapped,
}

/// [`compile`] charging `pool`. What a build holds at its peak is charged before it is read or
/// grown: the sections `object` reads whole (symbol tables, `.eh_frame`, `.debug_frame` and
/// its inflated copy, each checked against the file's length first, so that a section header
/// claiming a gigabyte of a sparse file costs nothing), an index of the FDEs (32 bytes each),
/// and the rows (8 bytes each), which FDE by FDE in address order go straight into the table:
/// no intermediate list of ranges. A build that does not fit fails with [`TableError::OverBudget`]
/// and its file is walked with frame pointers.
pub fn compile_within<'data, R: ReadRef<'data>>(
    data: R,
    pool: &'static memory::Pool,
    source: Source,
) -> Result<Table, TableError> {
    let mut meter = Meter::new(pool)?;
    let read = read_whole_bytes(data)?.0;
    meter.fixed = if source == Source::Read { read } else { 0 };
    meter.check()?;
    let file = object::File::parse(data)?;
    let loads = loads(&file);
    let eh_section = file.section_by_name(".eh_frame");
    let eh_bytes = match &eh_section {
        Some(section) => section.data()?,
        None => &[],
    };
    let mut eh = EhFrame::new(eh_bytes, LittleEndian);
    eh.set_address_size(8);
    let mut bases = BaseAddresses::default();
    if let Some(section) = &eh_section {
        bases = bases.set_eh_frame(section.address());
        if let Some(text) = file.section_by_name(".text") {
            bases = bases.set_text(text.address());
        }
        if let Some(got) = file.section_by_name(".got") {
            bases = bases.set_got(got.address());
        }
    }
    let debug_bytes = match file.section_by_name(".debug_frame") {
        Some(section) => {
            let compressed = section.compressed_data()?;
            // Inflated within what its header claims (charged first): a stream that inflates
            // past it is refused, not followed.
            let claimed = compressed.uncompressed_size.min(MAX_DEBUG_FRAME_BYTES);
            if compressed.format != object::CompressionFormat::None {
                meter.fixed += claimed;
                meter.check()?;
            }
            inflate(compressed, claimed)?
        }
        None => std::borrow::Cow::Borrowed(&[][..]),
    };
    let mut debug = DebugFrame::new(&debug_bytes, LittleEndian);
    debug.set_address_size(8);
    let debug_bases = BaseAddresses::default();
    let go = [".gopclntab", ".note.go.buildid", ".go.buildinfo"].iter().any(|s| file.section_by_name(s).is_some());

    // Every FDE's range, then the FDEs in address order: `.eh_frame`'s first where both
    // sections describe the same code (`Rows` keeps the first of overlapping ranges).
    let mut index: Vec<FdeAt> = Vec::new();
    if eh_section.is_some() {
        list(&eh, &bases, false, &mut index, &mut meter)?;
    }
    if !debug_bytes.is_empty() {
        list(&debug, &debug_bases, true, &mut index, &mut meter)?;
    }
    if index.is_empty() {
        return Err(TableError::NoCfi);
    }
    index.sort_unstable_by_key(|f| (f.start, std::cmp::Reverse(f.len), f.debug()));
    let mut rows = Rows::default();
    let mut ctx = UnwindContext::new();
    for at in &index {
        let result = if at.debug() {
            fde_rows(&debug, &debug_bases, at, go, &mut ctx, &mut rows, &mut meter, index.len())
        } else {
            fde_rows(&eh, &bases, at, false, &mut ctx, &mut rows, &mut meter, index.len())
        };
        result?;
    }
    let mut table = rows.finish()?;
    table.loads = loads;
    Ok(table)
}

/// Whether building the table of the ELF file in `data` could fit in `pool` at all: what it
/// would read whole and inflate, from the section headers alone (a few KB read). A file that
/// claims more is refused at once, never queued for a builder.
pub fn precheck<'data, R: ReadRef<'data>>(data: R, pool: &memory::Pool, source: Source) -> Result<(), TableError> {
    let (read, inflated) = read_whole_bytes(data)?;
    let read = if source == Source::Read { read } else { 0 };
    let bytes = read + inflated.min(MAX_DEBUG_FRAME_BYTES);
    if bytes > pool.limit() {
        return Err(TableError::OverBudget { bytes, pool: pool.limit() });
    }
    Ok(())
}

/// Bytes `object::File::parse` and the sections this module asks for read whole: the symbol
/// tables (object reads them as it parses), `.eh_frame` and the stored `.debug_frame`; and
/// what a compressed `.debug_frame` claims to inflate to. An error when one lies past the end
/// of the file.
fn read_whole_bytes<'data, R: ReadRef<'data>>(data: R) -> Result<(u64, u64), TableError> {
    use object::read::elf::{CompressionHeader as _, FileHeader as _, SectionHeader as _};
    let len = data.len().map_err(|()| TableError::Malformed("cannot read the file's length"))?;
    let header = object::elf::FileHeader64::<object::Endianness>::parse(data)?;
    let endian = header.endian()?;
    let sections = header.sections(endian, data)?;
    let (mut total, mut inflated) = (0u64, 0u64);
    for section in sections.iter() {
        let kind = section.sh_type(endian);
        let name = sections.section_name(endian, section).unwrap_or_default();
        let wanted = matches!(kind, object::elf::SHT_SYMTAB | object::elf::SHT_DYNSYM)
            || matches!(name, b".eh_frame" | b".debug_frame");
        if !wanted || kind == object::elf::SHT_NOBITS {
            continue;
        }
        let (offset, size) = (section.sh_offset(endian), section.sh_size(endian));
        if offset.checked_add(size).is_none_or(|end| end > len) {
            return Err(TableError::Malformed("a section lies past the end of the file"));
        }
        total += size;
        if name == b".debug_frame"
            && let Ok(Some((chdr, _, _))) = section.compression(endian, data)
        {
            inflated += chdr.ch_size(endian);
        }
    }
    Ok((total, inflated))
}

/// A section's bytes, inflated within `MAX_DEBUG_FRAME_BYTES` when compressed (zlib only: Go and
/// `gcc -gz` use it).
fn inflate(data: object::CompressedData<'_>, max: u64) -> Result<std::borrow::Cow<'_, [u8]>, TableError> {
    use std::io::Read as _;
    match data.format {
        object::CompressionFormat::None => Ok(data.data.into()),
        object::CompressionFormat::Zlib => {
            // The size the header claims, within the bound (charged before): no doubling.
            let mut out = Vec::with_capacity(data.uncompressed_size.min(max) as usize);
            flate2::read::ZlibDecoder::new(data.data)
                .take(max + 1)
                .read_to_end(&mut out)
                .map_err(|_| TableError::Compressed)?;
            if out.len() as u64 > max {
                return Err(TableError::Compressed);
            }
            Ok(out.into())
        }
        _ => Err(TableError::Compressed),
    }
}

/// Where one FDE is and what it claims to cover: 16 bytes (a 200 MB library has 160,000).
#[derive(Clone, Copy)]
struct FdeAt {
    start: u64,
    len: u32,
    /// Offset in its section, with [`IN_DEBUG_FRAME`] set for `.debug_frame`'s.
    at: u32,
}

/// Sections are read within the memory budget, far below 2 GiB: the top bit says which.
const IN_DEBUG_FRAME: u32 = 1 << 31;

impl FdeAt {
    fn end(&self) -> u64 {
        self.start + u64::from(self.len)
    }

    fn debug(&self) -> bool {
        self.at & IN_DEBUG_FRAME != 0
    }

    fn offset(&self) -> usize {
        (self.at & !IN_DEBUG_FRAME) as usize
    }
}

/// What a build holds, against its charge.
struct Meter {
    /// `None`: not charged (tables made by hand, and the last row of one already charged).
    charge: Option<memory::Charge>,
    /// Bytes read whole (sections) and inflated.
    fixed: u64,
    index_cap: usize,
    rows_cap: usize,
}

impl Meter {
    fn new(pool: &'static memory::Pool) -> Result<Self, TableError> {
        let charge = pool.try_charge(0).ok_or(TableError::OverBudget { bytes: 0, pool: pool.limit() })?;
        Ok(Self { charge: Some(charge), fixed: 0, index_cap: 0, rows_cap: 0 })
    }

    fn unmetered() -> Self {
        Self { charge: None, fixed: 0, index_cap: 0, rows_cap: 0 }
    }

    fn total(&self) -> u64 {
        self.fixed + (self.index_cap * size_of::<FdeAt>()) as u64 + (self.rows_cap * size_of::<Row>()) as u64
    }

    fn check(&mut self) -> Result<(), TableError> {
        let total = self.total();
        match &mut self.charge {
            Some(charge) => match charge.grow_to(total) {
                true => Ok(()),
                false => Err(TableError::OverBudget { bytes: total, pool: charge.pool().limit() }),
            },
            None => Ok(()),
        }
    }

    /// Room for one more element in `v`, charged before the vector grows.
    fn room<T>(&mut self, v: &mut Vec<T>, cap: fn(&mut Self) -> &mut usize) -> Result<(), TableError> {
        if v.len() < v.capacity() {
            return Ok(());
        }
        // By half again, not double: the overshoot is charged too.
        let next = (v.capacity() + v.capacity() / 2).max(4096);
        *cap(self) = next;
        self.check()?;
        v.reserve_exact(next - v.len());
        Ok(())
    }
}

/// Lists every FDE of `section` into `index`.
fn list<'a, S: UnwindSection<EndianSlice<'a, LittleEndian>>>(
    section: &S,
    bases: &BaseAddresses,
    debug: bool,
    index: &mut Vec<FdeAt>,
    meter: &mut Meter,
) -> Result<(), TableError>
where
    S::Offset: gimli::UnwindOffset<usize>,
{
    let mut entries = section.entries(bases);
    while let Some(entry) = entries.next()? {
        let CieOrFde::Fde(partial) = entry else { continue };
        // One bad FDE costs its function, not the table.
        let Ok(fde) = partial.parse(S::cie_from_offset) else { continue };
        if fde.len() == 0 || fde.initial_address() >= fde.end_address() {
            continue;
        }
        let len = u32::try_from(fde.len()).map_err(|_| TableError::TooWide)?;
        let offset = u32::try_from(fde.offset()).ok().filter(|o| o & IN_DEBUG_FRAME == 0).ok_or(TableError::TooWide)?;
        meter.room(index, |m| &mut m.index_cap)?;
        index.push(FdeAt { start: fde.initial_address(), len, at: offset | if debug { IN_DEBUG_FRAME } else { 0 } });
    }
    Ok(())
}

/// The rows of the FDE at `at`, into `rows`; `go`: the CFI was written by Go's linker.
#[allow(clippy::too_many_arguments)]
fn fde_rows<'a, S: UnwindSection<EndianSlice<'a, LittleEndian>>>(
    section: &S,
    bases: &BaseAddresses,
    at: &FdeAt,
    go: bool,
    ctx: &mut UnwindContext<usize>,
    rows: &mut Rows,
    meter: &mut Meter,
    fdes: usize,
) -> Result<(), TableError>
where
    S::Offset: gimli::UnwindOffset<usize>,
{
    let offset = S::Offset::from(at.offset());
    let Ok(fde) = section.fde_from_offset(bases, offset, S::cie_from_offset) else { return Ok(()) };
    if fde.is_signal_trampoline() {
        return rows.push(at.start, at.end(), Rule { kind: kind::SIGNAL, cfa_offset: 0, fp_offset: 0 }, meter);
    }
    let Ok(mut table) = fde.rows(section, bases, ctx) else { return Ok(()) };
    while let Ok(Some(row)) = table.next_row() {
        let rule = rule(section, row, go);
        rows.push(row.start_address(), row.end_address(), rule, meter)?;
        if rows.rows.len() > MAX_ROWS {
            return Err(TableError::TooLarge(rows.rows.len().max(fdes)));
        }
    }
    Ok(())
}

/// What the sampler can do with one row of gimli's table. `go`: Go's CFI, which leaves the frame
/// pointer out.
fn rule<'a, S: UnwindSection<EndianSlice<'a, LittleEndian>>>(
    section: &S,
    row: &gimli::UnwindTableRow<usize>,
    go: bool,
) -> Rule {
    match row.register(RIP) {
        Some(RegisterRule::Undefined) => return Rule { kind: kind::END, cfa_offset: 0, fp_offset: 0 },
        // x86_64: the return address is the word below the CFA, always.
        None | Some(RegisterRule::Offset(-8)) => {}
        Some(_) => return NONE,
    }
    let fp_offset = match row.register(RBP) {
        None | Some(RegisterRule::SameValue) | Some(RegisterRule::Undefined) => 0,
        Some(RegisterRule::Offset(o))
            if o % 8 == 0 && (i8::MIN as i64..=i8::MAX as i64).contains(&(o / 8)) && o != 0 =>
        {
            (o / 8) as i8
        }
        Some(_) => return NONE,
    };
    match row.cfa() {
        // Go on amd64 (cmd/internal/obj/x86): a function with a frame stores the caller's frame
        // pointer in the word below the return address. A frameless one (CFA = rsp + 8) does
        // not touch it.
        CfaRule::RegisterAndOffset { register: RSP, offset } if go && row.register(RBP).is_none() && *offset > 8 => {
            let Ok(cfa_offset) = u16::try_from(*offset) else { return NONE };
            Rule { kind: kind::CFA_SP, cfa_offset, fp_offset: -2 }
        }
        CfaRule::RegisterAndOffset { register, offset } => {
            let Ok(cfa_offset) = u16::try_from(*offset) else { return NONE };
            match *register {
                RSP => Rule { kind: kind::CFA_SP, cfa_offset, fp_offset },
                RBP => Rule { kind: kind::CFA_FP, cfa_offset, fp_offset },
                _ => NONE,
            }
        }
        CfaRule::Expression(e) => match e.get(section) {
            Ok(expr) => expression(expr.0.slice(), fp_offset),
            Err(_) => NONE,
        },
    }
}

/// The two CFA expressions compilers emit on x86_64 that a walk can follow.
fn expression(bytes: &[u8], fp_offset: i8) -> Rule {
    const DW_OP_BREG6: u8 = 0x76;
    const DW_OP_BREG7: u8 = 0x77;
    const DW_OP_BREG16: u8 = 0x80;
    const DW_OP_DEREF: u8 = 0x06;
    const DW_OP_LIT0: u8 = 0x30;
    const DW_OP_GE: u8 = 0x2a;
    match bytes {
        // The stack-realigning prologue: CFA = *(rbp + off), off < 0 (one-byte SLEB128).
        [DW_OP_BREG6, off, DW_OP_DEREF] if *off >= 0x40 && *off < 0x80 => {
            let off = (*off as i64) - 0x80;
            Rule { kind: kind::CFA_FP_DEREF, cfa_offset: (-off) as u16, fp_offset }
        }
        // A PLT: rsp + 8 + ((rip & 15) >= N) << 3.
        [DW_OP_BREG7, 8, DW_OP_BREG16, 0, lit_15, _and, lit_n, DW_OP_GE, ..]
            if *lit_15 == DW_OP_LIT0 + 15 && (DW_OP_LIT0..DW_OP_LIT0 + 32).contains(lit_n) =>
        {
            Rule { kind: kind::PLT, cfa_offset: 8, fp_offset: (lit_n - DW_OP_LIT0) as i8 }
        }
        _ => NONE,
    }
}

/// A table's rows as ranges come in, by start: the gaps between functions get "no rule",
/// neighbours with the same rule merge, and of overlapping ranges the first one wins.
#[derive(Default)]
struct Rows {
    base: Option<u64>,
    rows: Vec<Row>,
    covered_to: u64,
}

impl Rows {
    fn push(&mut self, start: u64, end: u64, rule: Rule, meter: &mut Meter) -> Result<(), TableError> {
        // A malformed FDE can claim an empty or backwards range.
        if start >= end {
            return Ok(());
        }
        let base = *self.base.get_or_insert(start);
        if start < base || (end <= self.covered_to && start < self.covered_to) {
            // Inside a range already covered (overlapping FDEs): the first one wins.
            return Ok(());
        }
        let start = start.max(self.covered_to);
        if start > self.covered_to && !self.rows.is_empty() {
            self.row(self.covered_to, NONE, meter)?;
        }
        self.row(start, rule, meter)?;
        self.covered_to = end;
        Ok(())
    }

    fn row(&mut self, at: u64, rule: Rule, meter: &mut Meter) -> Result<(), TableError> {
        let base = self.base.unwrap_or(at);
        let pc = u32::try_from(at - base).map_err(|_| TableError::TooWide)?;
        let row = Row { pc, cfa_offset: rule.cfa_offset, kind: rule.kind, fp_offset: rule.fp_offset };
        match self.rows.last_mut() {
            Some(last) if last.pc == pc => *last = row,
            Some(last)
                if (last.kind, last.cfa_offset, last.fp_offset) == (rule.kind, rule.cfa_offset, rule.fp_offset) => {}
            _ => {
                meter.room(&mut self.rows, |m| &mut m.rows_cap)?;
                self.rows.push(row);
            }
        }
        Ok(())
    }

    fn finish(mut self) -> Result<Table, TableError> {
        let Some(base) = self.base else { return Err(TableError::NoCfi) };
        let end = self.covered_to;
        let mut meter = Meter::unmetered();
        self.row(end, NONE, &mut meter)?;
        if self.rows.len() > MAX_ROWS {
            return Err(TableError::TooLarge(self.rows.len()));
        }
        self.rows.shrink_to_fit();
        Ok(Table { base, rows: self.rows, loads: Vec::new() })
    }
}

/// The rows of `ranges` in any order (tests, and tables made by hand).
#[cfg(test)]
fn build(mut ranges: Vec<(u64, u64, Rule)>) -> Result<Table, TableError> {
    ranges.sort_by_key(|r| (r.0, std::cmp::Reverse(r.1)));
    let mut rows = Rows::default();
    let mut meter = Meter::unmetered();
    for (start, end, rule) in ranges {
        rows.push(start, end, rule, &mut meter)?;
    }
    rows.finish()
}

#[cfg(test)]
pub(super) mod tests;
