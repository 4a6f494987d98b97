//! Unwind tables for user code without frame pointers: userspace compiles each binary's
//! `.eh_frame` into sorted [`Row`]s (one table per file, shared by every process mapping it) and
//! describes each process's executable mappings in a [`ProcessTable`]; the sampler walks the
//! user stack with them, a few frames per program run, tail-calling itself for the rest.
//!
//! In the kernel a table is 4 bytes a row: the rules themselves are few (at most 1,394 distinct
//! ones in libtorch_cpu.so's 2.6 M rows), so they live once in a shared array of [`Rule`]s, and
//! a row keeps the low 12 bits of its address and its rule's index ([`packed`]). A page index
//! after the rows says where each 4 KiB of addresses starts, which gives back the high bits.
//!
//! The row format is architecture-neutral where it can be: the CFA is "stack pointer or frame
//! pointer plus an offset", the frame pointer's save slot is an offset from the CFA. On x86_64
//! the return address is always at CFA - 8; on arm64 it is saved beside the frame pointer (the
//! `stp x29, x30` prologue), which [`kind::FLAG_RA_AFTER_FP`] will describe when arm64 comes.

/// Executable mappings described per process; a process with more (hundreds of shared
/// libraries) has the rest walked with frame pointers.
pub const MAX_MAPPINGS: usize = 256;
/// Frames unwound per program run; the program tail-calls itself for more (the kernel allows 33
/// tail calls: 19 runs for `MAX_USER_FRAMES`, the Python reader and up to 8 for the stack scan).
/// A frame's step is a global function the verifier checks once (`unwind_step` in the eBPF
/// crate), so a run's frames cost it little: 6.18 verifies the walker in 41,929 instructions
/// (737,033 when every frame's searches were inlined).
pub const FRAMES_PER_RUN: usize = 7;
/// Frames per run of the walker loaded where the kernel's verifier refuses the first (6.1).
pub const FRAMES_PER_RUN_SMALL: usize = 4;
/// Binary-search steps over one page's rows: a 4 KiB page holds at most 4,095 (no file measured
/// comes near: code changes rule a few times per function), so 12 steps. The verifier walks
/// every step of every frame's search: at 17 steps over 64 KiB pages the 8-frame walker took
/// 997,059 of its million instructions on 6.18.
pub const ROW_SEARCH_STEPS: usize = 12;
/// Distinct rules the shared array holds (256 KiB; a row's 20 bits could name more); a table
/// needing more is walked with frame pointers.
pub const MAX_RULES: usize = 1 << 16;
/// Binary-search steps over a process's mappings (`MAX_MAPPINGS` = 2^8).
pub const MAPPING_SEARCH_STEPS: usize = 9;
/// Slot of the unwinder in the `PROGRAMS` program array.
pub const UNWIND_PROGRAM: u32 = 0;
/// Slot of the stack scan (`unwind_scan`): tried where a walk found no rule (below).
pub const SCAN_PROGRAM: u32 = 2;
/// Stack words the scan reads, from the stack pointer up, for a return address: 16 (an assembly
/// kernel that saved six registers and kept 9 words of locals). 6.18's verifier takes 45,150
/// instructions for them, the mapping and row searches being global functions it checks once
/// (840,719 when inlined).
pub const SCAN_WORDS: usize = 16;
/// Words of the scan loaded where the verifier refuses the first.
pub const SCAN_WORDS_SMALL: usize = 8;
/// Return addresses the scan may try in one walk (each costs one or two tail calls of the
/// kernel's 33).
pub const SCAN_MAX: u32 = 4;

/// Why a table walk ended: each is a counter slot (`counter::UNWIND_ENDS` + reason), so a node
/// says why its stacks end (`profiler_unwind_walk_ends_total{reason}`).
pub mod end {
    /// The outermost frame: an `END` rule (`_start`, a thread's entry) or a zero return address.
    pub const OUTERMOST: u32 = 0;
    /// Outside every table, a zero frame pointer: the thread's start where the code keeps frame
    /// pointers, or where code that does not keep them left a zero in the register.
    pub const FP_ZERO: u32 = 1;
    /// An address in a table without a row: code without unwind information (hand-written
    /// assembly, a stub) or past the table's end.
    pub const NO_ROW: u32 = 2;
    /// A row that knows no rule there (a gap between functions, a rule the table compiler
    /// could not follow).
    pub const NO_RULE: u32 = 3;
    /// A stack word the walk needed could not be read (a wrong rule, a broken frame pointer).
    pub const UNREADABLE: u32 = 4;
    /// The frame limit, or the kernel's limit of tail calls.
    pub const LIMIT: u32 = 5;
    pub const COUNT: usize = 6;
    const _: () = assert!(COUNT <= crate::counter::UNWIND_END_SLOTS);
    /// Label values, by reason.
    pub const NAMES: [&str; COUNT] = ["outermost", "fp_zero", "no_row", "no_rule", "unreadable", "limit"];

    /// Whether a stack scan may go on from an end: only where no rule was found or a rule
    /// failed, never past the outermost frame or a limit.
    pub const fn scannable(reason: u32) -> bool {
        matches!(reason, NO_ROW | NO_RULE | UNREADABLE)
    }
}

/// How to find the caller's frame at one address range: valid from `pc` (relative to the
/// mapping's `bias`) to the next row's `pc`. The compiler's form; the kernel keeps it packed in 4 bytes ([`packed`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Row {
    pub pc: u32,
    /// The CFA's offset from its base register ([`kind::CFA_SP`], [`kind::CFA_FP`]); for
    /// [`kind::CFA_FP_DEREF`] the distance below the frame pointer of the slot holding the CFA.
    pub cfa_offset: u16,
    /// One of [`kind`]'s values.
    pub kind: u8,
    /// Where the caller's frame pointer was saved, in 8-byte words from the CFA (0: not saved
    /// here, it still holds the caller's value). For [`kind::PLT`]: the `rip & 15` threshold
    /// from which the PLT entry has pushed one more word.
    pub fp_offset: i8,
}

/// How to find the caller's frame, without its address: a [`Row`] as the kernel keeps it, in
/// the shared rules array under the index its packed rows name.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Rule {
    pub cfa_offset: u16,
    pub kind: u8,
    pub fp_offset: i8,
}

impl Row {
    pub fn rule(&self) -> Rule {
        Rule { cfa_offset: self.cfa_offset, kind: self.kind, fp_offset: self.fp_offset }
    }
}

/// The kernel's rows: one `u32` each, the low 12 bits of the row's address (relative to its
/// table's base) and, above them, its rule's index. A table's rows are followed by its page
/// index, `pages + 1` words: page `p` (addresses `p << 12` up to the next page's) holds rows
/// `index[p]` up to `index[p + 1]`, so the row in effect at an address is the last one at or
/// below it in its page, or the last row before the page.
pub mod packed {
    /// Bits of an address a row keeps: 4 KiB pages keep each page's search short (a word of
    /// index per 4 KiB of code, 2 % of libtorch_cpu.so's table).
    pub const PAGE_SHIFT: u32 = 12;
    const LOW: u32 = (1 << PAGE_SHIFT) - 1;

    pub const fn row(pc: u32, rule: u16) -> u32 {
        (pc & LOW) | ((rule as u32) << PAGE_SHIFT)
    }

    pub const fn low(row: u32) -> u32 {
        row & LOW
    }

    pub const fn rule(row: u32) -> u32 {
        row >> PAGE_SHIFT
    }
}

/// Values of [`Row::kind`].
pub mod kind {
    /// CFA = stack pointer + offset.
    pub const CFA_SP: u8 = 0;
    /// CFA = frame pointer + offset.
    pub const CFA_FP: u8 = 1;
    /// CFA = *(frame pointer - offset) (the stack-realigning prologue of some `main`s).
    pub const CFA_FP_DEREF: u8 = 2;
    /// A PLT stub: CFA = stack pointer + 8, + 8 more past the stub's push.
    pub const PLT: u8 = 3;
    /// A signal trampoline (`__restore_rt`): the interrupted registers are in the `ucontext`
    /// at the stack pointer.
    pub const SIGNAL: u8 = 4;
    /// The outermost frame (`_start`, a thread's entry: the return address is undefined).
    pub const END: u8 = 5;
    /// No rule known here (a gap between functions, or a rule the sampler cannot follow): the
    /// walk stops rather than guess.
    pub const NONE: u8 = 6;
    /// Reserved for arm64: the return address is saved in the word after the frame pointer.
    pub const FLAG_RA_AFTER_FP: u8 = 0x80;
}

/// One executable mapping of a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// Subtracted from an address to get the row key (`Row::pc`): the load bias plus the table's
    /// base address.
    pub bias: u64,
    /// First row of the mapping's table in `UNWIND_ROWS`.
    pub table_start: u32,
    /// Rows in the table; 0: no table (none built, or it did not fit): frame pointers.
    pub table_len: u32,
    /// Pages of its page index, which follows the rows ([`packed`]).
    pub table_pages: u32,
    pub _pad: u32,
}

/// A process's executable mappings, sorted by start, in `UNWIND_PROCS` under its pid.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessTable {
    pub len: u32,
    pub _pad: u32,
    pub mappings: [Mapping; MAX_MAPPINGS],
}

impl Default for ProcessTable {
    fn default() -> Self {
        Self { len: 0, _pad: 0, mappings: [Mapping::default(); MAX_MAPPINGS] }
    }
}

/// The unwinder's registers between program runs (per CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct State {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Kernel frames already in the record (the user frames go after them).
    pub kernel: u32,
    /// User frames written so far.
    pub user: u32,
    /// Program runs so far.
    pub runs: u32,
    /// 1 when `ip` is the exact address of the instruction (the leaf, or the interrupted
    /// address after a signal frame), not a return address.
    pub exact: u32,
    /// Why the walk ended so far ([`end`]).
    pub end: u32,
    /// Return addresses the stack scan found in this walk.
    pub scans: u32,
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for Row {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for Mapping {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for Rule {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for ProcessTable {}
