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
use profiler_common::unwind::{ROW_SEARCH_STEPS, Row, kind};

/// x86_64 DWARF register numbers.
const RBP: Register = Register(6);
const RSP: Register = Register(7);
const RIP: Register = Register(16);
/// Largest table the sampler's bounded binary search covers.
pub const MAX_ROWS: usize = 1 << ROW_SEARCH_STEPS;
/// Most bytes a compressed `.debug_frame` may inflate to (a 150 MB Go binary's is a few MB; a
/// few KB of zlib can claim gigabytes).
pub const MAX_DEBUG_FRAME_BYTES: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("not an ELF file the profiler can read: {0}")]
    Elf(#[from] object::Error),
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

/// Compiles the unwind table of the ELF file in `data` (a file or a mapped image like the vDSO).
pub fn compile<'data, R: ReadRef<'data>>(data: R) -> Result<Table, TableError> {
    let file = object::File::parse(data)?;
    let loads = loads(&file);
    let mut ranges = Vec::new();
    if let Some(section) = file.section_by_name(".eh_frame") {
        let bytes = section.data()?;
        let mut eh = EhFrame::new(bytes, LittleEndian);
        eh.set_address_size(8);
        let mut bases = BaseAddresses::default().set_eh_frame(section.address());
        if let Some(text) = file.section_by_name(".text") {
            bases = bases.set_text(text.address());
        }
        if let Some(got) = file.section_by_name(".got") {
            bases = bases.set_got(got.address());
        }
        collect(&eh, &bases, false, &mut ranges)?;
    }
    if let Some(section) = file.section_by_name(".debug_frame") {
        let bytes = inflate(section.compressed_data()?, MAX_DEBUG_FRAME_BYTES)?;
        let mut debug = DebugFrame::new(&bytes, LittleEndian);
        debug.set_address_size(8);
        // `build` keeps the first of overlapping ranges: `.eh_frame`'s, collected above.
        let go = [".gopclntab", ".note.go.buildid", ".go.buildinfo"].iter().any(|s| file.section_by_name(s).is_some());
        collect(&debug, &BaseAddresses::default(), go, &mut ranges)?;
    }
    if ranges.is_empty() {
        return Err(TableError::NoCfi);
    }
    let mut table = build(ranges)?;
    table.loads = loads;
    Ok(table)
}

/// A section's bytes, inflated within `MAX_DEBUG_FRAME_BYTES` when compressed (zlib only: Go and
/// `gcc -gz` use it).
fn inflate(data: object::CompressedData<'_>, max: u64) -> Result<std::borrow::Cow<'_, [u8]>, TableError> {
    use std::io::Read as _;
    match data.format {
        object::CompressionFormat::None => Ok(data.data.into()),
        object::CompressionFormat::Zlib => {
            let mut out = Vec::new();
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

/// Every FDE's rows as `(start, end, rule)`; `go`: the CFI was written by Go's linker.
fn collect<'a, S: UnwindSection<EndianSlice<'a, LittleEndian>>>(
    section: &S,
    bases: &BaseAddresses,
    go: bool,
    out: &mut Vec<(u64, u64, Rule)>,
) -> Result<(), TableError>
where
    S::Offset: gimli::UnwindOffset<usize>,
{
    let mut ctx = UnwindContext::new();
    let mut entries = section.entries(bases);
    while let Some(entry) = entries.next()? {
        let CieOrFde::Fde(partial) = entry else { continue };
        // One bad FDE costs its function, not the table.
        let Ok(fde) = partial.parse(S::cie_from_offset) else { continue };
        if fde.len() == 0 {
            continue;
        }
        if fde.is_signal_trampoline() {
            out.push((
                fde.initial_address(),
                fde.end_address(),
                Rule { kind: kind::SIGNAL, cfa_offset: 0, fp_offset: 0 },
            ));
            continue;
        }
        let Ok(mut rows) = fde.rows(section, bases, &mut ctx) else { continue };
        while let Ok(Some(row)) = rows.next_row() {
            let rule = rule(section, row, go);
            out.push((row.start_address(), row.end_address(), rule));
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

/// Sorts the ranges, fills the gaps between functions with "no rule", and merges neighbours
/// with the same rule.
fn build(mut ranges: Vec<(u64, u64, Rule)>) -> Result<Table, TableError> {
    // A malformed FDE can claim an empty or backwards range.
    ranges.retain(|r| r.0 < r.1);
    if ranges.is_empty() {
        return Err(TableError::NoCfi);
    }
    ranges.sort_by_key(|r| (r.0, std::cmp::Reverse(r.1)));
    let base = ranges[0].0;
    let mut rows: Vec<Row> = Vec::with_capacity(ranges.len());
    let mut covered_to = base;
    let push = |rows: &mut Vec<Row>, at: u64, rule: Rule| -> Result<(), TableError> {
        let pc = u32::try_from(at - base).map_err(|_| TableError::TooWide)?;
        match rows.last_mut() {
            Some(last) if last.pc == pc => {
                *last = Row { pc, cfa_offset: rule.cfa_offset, kind: rule.kind, fp_offset: rule.fp_offset }
            }
            Some(last)
                if (last.kind, last.cfa_offset, last.fp_offset) == (rule.kind, rule.cfa_offset, rule.fp_offset) => {}
            _ => rows.push(Row { pc, cfa_offset: rule.cfa_offset, kind: rule.kind, fp_offset: rule.fp_offset }),
        }
        Ok(())
    };
    for (start, end, rule) in ranges {
        if end <= covered_to && start < covered_to {
            // Inside a range already covered (overlapping FDEs): the first one wins.
            continue;
        }
        let start = start.max(covered_to);
        if start > covered_to {
            push(&mut rows, covered_to, NONE)?;
        }
        push(&mut rows, start, rule)?;
        covered_to = end;
    }
    push(&mut rows, covered_to, NONE)?;
    if rows.len() > MAX_ROWS {
        return Err(TableError::TooLarge(rows.len()));
    }
    Ok(Table { base, rows, loads: Vec::new() })
}

#[cfg(test)]
mod tests;
