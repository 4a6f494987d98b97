//! The user-stack walk with unwind tables, for code built without frame pointers (see
//! `profiler_common::unwind` for the tables). The sampler hands over here when the sampled
//! process has a table; each run walks `FRAMES_PER_RUN` frames and tail-calls itself for more,
//! which keeps every run small for the verifier. A frame's step and the two binary searches
//! are global functions (`unwind_step`, `unwind_find_mapping`, `unwind_find_row`): the
//! verifier checks each once, for any argument, instead of at every call site of every
//! frame, which cut the walker's verification from 737,033 instructions to 41,929 and the
//! scan's from 840,719 to 45,150 (6.18). A frame in a mapping without a table is
//! walked with its frame pointer, so the two mix; an address with no rule stops the walk (a
//! short stack, never a wrong one).

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_probe_read_kernel, bpf_probe_read_user,
        generated::{bpf_get_current_task_btf, bpf_task_pt_regs},
    },
    macros::{map, perf_event},
    maps::{Array, HashMap, PerCpuArray},
    programs::PerfEventContext,
};
use profiler_common::{
    MAX_USER_FRAMES, counter,
    unwind::{
        FRAMES_PER_RUN, FRAMES_PER_RUN_SMALL, MAPPING_SEARCH_STEPS, MAX_MAPPINGS, MAX_RULES, Mapping, ProcessTable,
        ROW_SEARCH_STEPS, Rule, SCAN_MAX, SCAN_PROGRAM, SCAN_WORDS, SCAN_WORDS_SMALL, State, UNWIND_PROGRAM, end, kind,
        packed,
    },
};

use crate::{
    FRAME_SLOTS, Record, Sampler,
    arch::{self, Regs},
    count,
    sink::Sink,
};

/// Every table's packed rows and page index, back to back, two 4-byte words an element (an
/// array's elements are 8-byte aligned: `u32` elements would take 8 bytes each); userspace sizes
/// it at load (`--unwind-table-mib`).
#[map]
static UNWIND_ROWS: Array<u64> =
    Array::with_max_entries(1, 1024 /* BPF_F_MMAPABLE: userspace writes tables straight in */);

/// The rules every table's rows name by index.
#[map]
static UNWIND_RULES: Array<Rule> = Array::with_max_entries(MAX_RULES as u32, 0);

/// Processes with tables, by pid. Not preallocated: a value is 8 KiB.
#[map]
static UNWIND_PROCS: HashMap<u32, ProcessTable> = HashMap::with_max_entries(1024, 1 /* BPF_F_NO_PREALLOC */);

#[map]
pub(crate) static UNWIND_STATE: PerCpuArray<State> = PerCpuArray::with_max_entries(1, 0);

/// Whether `pid` has tables.
#[inline(always)]
pub fn has_tables(pid: u32) -> bool {
    unsafe { UNWIND_PROCS.get(&pid) }.is_some()
}

/// Starts a table walk when the process has tables: does not return if it did. `user_mode`:
/// the sample interrupted user code, so the context's registers are the user's.
#[inline(always)]
pub fn start(ctx: &PerfEventContext, record: &mut Record, kernel: usize, user_mode: bool) {
    if !has_tables(record.header.pid) {
        return;
    }
    let regs: Regs = if user_mode {
        unsafe { (*ctx.ctx).regs }
    } else {
        // In the kernel: the user registers saved at kernel entry.
        let task = unsafe { bpf_get_current_task_btf() };
        let regs = unsafe { bpf_task_pt_regs(task) } as *const Regs;
        match unsafe { bpf_probe_read_kernel(regs) } {
            Ok(r) => r,
            Err(_) => return,
        }
    };
    start_at::<Sampler, _>(ctx, record, kernel, &regs);
}

/// Starts a table walk from `regs` (user registers) for sink `S`; returns only if the tail
/// call failed (no program in the slot): the caller then walks frame pointers.
#[inline(always)]
pub fn start_at<S: Sink, C: EbpfContext>(ctx: &C, record: &mut Record, kernel: usize, regs: &Regs) {
    let Some(state) = S::state() else { return };
    let state = unsafe { &mut *state };
    let f = arch::frame(regs);
    *state = State {
        ip: f.ip,
        sp: f.sp,
        bp: f.fp,
        kernel: kernel as u32,
        user: 0,
        runs: 0,
        exact: 1,
        end: end::OUTERMOST,
        scans: 0,
    };
    record.header.kernel_frames = kernel as u16;
    count(counter::UNWIND_TABLES);
    S::tail_call(ctx, UNWIND_PROGRAM);
}

#[perf_event]
pub fn unwind_user(ctx: PerfEventContext) -> u32 {
    run::<FRAMES_PER_RUN, Sampler, _>(&ctx);
    0
}

/// The same walk in shorter runs, for verifiers that give up on `unwind_user` (Linux 6.1
/// stops at a million instructions processed, which 6.18 never reaches); userspace loads it
/// into the slot instead. Deep stacks then run out of tail calls sooner.
#[perf_event]
pub fn unwind_user_small(ctx: PerfEventContext) -> u32 {
    run::<FRAMES_PER_RUN_SMALL, Sampler, _>(&ctx);
    0
}

/// One run of the walk for sink `S`: `N` frames, then a tail call for more, a stack scan
/// where no rule went on, or the end.
#[inline(always)]
pub(crate) fn run<const N: usize, S: Sink, C: EbpfContext>(ctx: &C) {
    let (Some(record), Some(state)) = (S::record(), S::state()) else { return };
    let (record, state) = unsafe { (&mut *record, &mut *state) };
    let mut more = false;
    if let Some(process) = unsafe { UNWIND_PROCS.get(&record.header.pid) } {
        more = walk::<N>(record, state, process);
    }
    state.runs += 1;
    if more {
        // At most 33 tail calls happen anyway; `MAX_USER_FRAMES` ends the walk long before.
        S::tail_call(ctx, UNWIND_PROGRAM);
        state.end = end::LIMIT;
    } else if end::scannable(state.end) && state.scans < SCAN_MAX {
        // Only after every rule failed; returns only if the scan is not loaded.
        S::tail_call(ctx, SCAN_PROGRAM);
    }
    finish::<S, C>(ctx, record, state);
}

/// The walk is over: counts why, then the Python frames (a tail call) or the sink.
#[inline(always)]
fn finish<S: Sink, C: EbpfContext>(ctx: &C, record: &mut Record, state: &State) {
    // Constant slots: a computed index costs the verifier more here than the six branches.
    match state.end {
        end::OUTERMOST => count(counter::UNWIND_ENDS + end::OUTERMOST as usize),
        end::FP_ZERO => count(counter::UNWIND_ENDS + end::FP_ZERO as usize),
        end::NO_ROW => count(counter::UNWIND_ENDS + end::NO_ROW as usize),
        end::NO_RULE => count(counter::UNWIND_ENDS + end::NO_RULE as usize),
        end::UNREADABLE => count(counter::UNWIND_ENDS + end::UNREADABLE as usize),
        _ => count(counter::UNWIND_ENDS + end::LIMIT as usize),
    }
    let kernel = (state.kernel as usize).min(MAX_USER_FRAMES);
    let user = (state.user as usize).min(MAX_USER_FRAMES);
    record.header.user_frames = user as u16;
    crate::python::start::<S, C>(ctx, record.header.pid);
    S::finish(record, kernel, user);
}

#[perf_event]
pub fn unwind_scan(ctx: PerfEventContext) -> u32 {
    scan::<SCAN_WORDS, Sampler, _>(&ctx);
    0
}

/// The scan over fewer words, for verifiers that refuse `unwind_scan`.
#[perf_event]
pub fn unwind_scan_small(ctx: PerfEventContext) -> u32 {
    scan::<SCAN_WORDS_SMALL, Sampler, _>(&ctx);
    0
}

/// Where the rules ran out (code without unwind information: hand-written assembly in a vendor
/// library), looks up the stack for a word that returns into a described executable mapping
/// just after a call instruction and whose own rule leads to a caller that passes the same
/// checks (`plausible`), and goes on from there with the rules. A stale return address can still
/// pass, so this runs only after every rule failed, tries at most `SCAN_MAX` candidates a walk,
/// and each find is counted (`counter::UNWIND_SCANNED`).
#[inline(always)]
pub(crate) fn scan<const W: usize, S: Sink, C: EbpfContext>(ctx: &C) {
    let (Some(record), Some(state)) = (S::record(), S::state()) else { return };
    let (record, state) = unsafe { (&mut *record, &mut *state) };
    if let Some(process) = unsafe { UNWIND_PROCS.get(&record.header.pid) }
        && let Some((ra, at)) = return_address_above::<W>(process, state.sp)
    {
        // Every candidate counts against `SCAN_MAX`, taken or not.
        state.scans += 1;
        if plausible(process, ra, at + 8, state.bp) {
            state.ip = ra;
            state.sp = at + 8;
            state.exact = 0;
            state.end = end::OUTERMOST;
            count(counter::UNWIND_SCANNED);
            S::tail_call(ctx, UNWIND_PROGRAM);
            state.end = end::LIMIT;
        } else if state.scans < SCAN_MAX {
            // A stale return address: look further up, from the word after it.
            state.sp = at + 8;
            S::tail_call(ctx, SCAN_PROGRAM);
        }
    }
    finish::<S, C>(ctx, record, state);
}

/// Whether a scanned return address `ra`, with the stack pointer `sp` it implies, leads on by
/// its own rule to a caller that is one too (or to the outermost frame). A stale return
/// address left on the stack by an earlier call passes the scan's checks as easily as the
/// real one, but its caller's rule then reads an arbitrary word: without this check, a
/// Python program's stacks got two `[unknown]` frames in 6 % of samples. Needs a table for
/// `ra` (frame pointers after a scan would be guesses on guesses).
#[inline(always)]
fn plausible(process: &ProcessTable, ra: u64, sp: u64, bp: u64) -> bool {
    let Some(mapping) = find_mapping(process, ra - 1) else { return false };
    if mapping.table_len == 0 {
        return false;
    }
    let Some(row) = find_row(mapping, ra - 1) else { return false };
    let cfa = match row.kind {
        kind::CFA_SP => sp + row.cfa_offset as u64,
        kind::CFA_FP => bp + row.cfa_offset as u64,
        kind::END => return true,
        _ => return false,
    };
    match read(cfa - 8) {
        Some(0) => true,
        Some(caller) => caller > 8 && find_mapping(process, caller - 1).is_some() && arch::after_call(caller),
        None => false,
    }
}

/// The first of `W` stack words from `sp` up that returns into one of the process's
/// executable mappings right after a call: (the return address, where it was).
#[inline(always)]
fn return_address_above<const W: usize>(process: &ProcessTable, sp: u64) -> Option<(u64, u64)> {
    for i in 0..W as u64 {
        let at = sp + i * 8;
        let word = read(at)?;
        if word > 8 && find_mapping(process, word - 1).is_some() && arch::after_call(word) {
            return Some((word, at));
        }
    }
    None
}

/// Walks up to `N` frames; true when the walk should go on in another run.
///
/// The frame count lives in a local for the run, not in `state` (map memory): read back from
/// memory each frame it is a fresh unknown to the verifier every time, and its exploration of
/// runs of 8 grew past the million-instruction limit on 6.18 too.
#[inline(always)]
fn walk<const N: usize>(record: &mut Record, state: &mut State, process: &ProcessTable) -> bool {
    let kernel = state.kernel as usize;
    let mut user = state.user as usize;
    let mut more = true;
    for _ in 0..N {
        let slot = kernel + user;
        if user >= MAX_USER_FRAMES || slot >= FRAME_SLOTS {
            state.end = end::LIMIT;
            more = false;
            break;
        }
        if state.ip == 0 {
            state.end = end::OUTERMOST;
            more = false;
            break;
        }
        record.frames[slot] = state.ip;
        user += 1;
        match step(state, process) {
            Step::Next => {}
            Step::Done | Step::Stopped => {
                more = false;
                break;
            }
        }
    }
    state.user = user as u32;
    more
}

/// What a step did; where it ended, it wrote why in `State::end`.
enum Step {
    Next,
    /// The outermost frame was reached.
    Done,
    /// No way on: the stack is cut here.
    Stopped,
}

/// Ends the walk for `reason`.
#[inline(always)]
fn stop(state: &mut State, reason: u32) -> Step {
    state.end = reason;
    Step::Stopped
}

#[inline(always)]
fn read(addr: u64) -> Option<u64> {
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}

/// Moves `state` from a frame to its caller's.
#[inline(always)]
fn step(state: &mut State, process: &ProcessTable) -> Step {
    match unwind_step(state, process) {
        STEP_NEXT => Step::Next,
        STEP_DONE => Step::Done,
        _ => Step::Stopped,
    }
}

const STEP_NEXT: u32 = 0;
const STEP_DONE: u32 = 1;
const STEP_STOPPED: u32 = 2;

/// [`step`] as a global function: the verifier checks its body once, against any state and
/// process table, instead of once per frame of every run at every call site (each run's
/// frames then cost it a call, not a walk through both binary searches).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn unwind_step(state: *mut State, process: *const ProcessTable) -> u32 {
    // A global function's pointer arguments may be null for the verifier.
    if state.is_null() || process.is_null() {
        return STEP_STOPPED;
    }
    let (state, process) = unsafe { (&mut *state, &*process) };
    match step_inline(state, process) {
        Step::Next => STEP_NEXT,
        Step::Done => STEP_DONE,
        Step::Stopped => STEP_STOPPED,
    }
}

#[inline(always)]
fn step_inline(state: &mut State, process: &ProcessTable) -> Step {
    // A return address points after the call: look up the call itself (a call to a function
    // that never returns can be the last instruction of its function).
    let pc = if state.exact != 0 { state.ip } else { state.ip - 1 };
    let Some(mapping) = find_mapping(process, pc) else { return frame_pointer_step(state) };
    if mapping.table_len == 0 {
        return frame_pointer_step(state);
    }
    let Some(row) = find_row(mapping, pc) else { return stop(state, end::NO_ROW) };
    let cfa = match row.kind {
        kind::CFA_SP => state.sp + row.cfa_offset as u64,
        kind::CFA_FP => state.bp + row.cfa_offset as u64,
        kind::CFA_FP_DEREF => match read(state.bp - row.cfa_offset as u64) {
            Some(cfa) => cfa,
            None => return stop(state, end::UNREADABLE),
        },
        kind::PLT => state.sp + 8 + if (state.ip & 15) >= row.fp_offset as u64 { 8 } else { 0 },
        kind::SIGNAL => {
            let (Some(bp), Some(sp), Some(ip)) =
                (read(state.sp + arch::UC_FP), read(state.sp + arch::UC_SP), read(state.sp + arch::UC_IP))
            else {
                return stop(state, end::UNREADABLE);
            };
            *state = State { ip, sp, bp, exact: 1, ..*state };
            return Step::Next;
        }
        kind::END => {
            state.end = end::OUTERMOST;
            return Step::Done;
        }
        _ => return stop(state, end::NO_RULE),
    };
    let Some(ra) = read(cfa - 8) else { return stop(state, end::UNREADABLE) };
    if row.kind != kind::PLT && row.fp_offset != 0 {
        match read(cfa.wrapping_add((row.fp_offset as i64 * 8) as u64)) {
            Some(bp) => state.bp = bp,
            None => return stop(state, end::UNREADABLE),
        }
    }
    state.sp = cfa;
    state.ip = ra;
    state.exact = 0;
    if ra == 0 {
        state.end = end::OUTERMOST;
        Step::Done
    } else {
        Step::Next
    }
}

/// A frame outside every table: its frame pointer leads to the caller.
#[inline(always)]
fn frame_pointer_step(state: &mut State) -> Step {
    if state.bp == 0 {
        state.end = end::FP_ZERO;
        return Step::Done;
    }
    let (Some(bp), Some(ra)) = (read(state.bp), read(state.bp + 8)) else { return stop(state, end::UNREADABLE) };
    state.sp = state.bp + 16;
    state.bp = bp;
    state.ip = ra;
    state.exact = 0;
    if ra == 0 {
        state.end = end::OUTERMOST;
        Step::Done
    } else {
        Step::Next
    }
}

/// The mapping holding `pc`: the last one starting at or before it.
#[inline(always)]
fn find_mapping(process: &ProcessTable, pc: u64) -> Option<&Mapping> {
    process.mappings.get(unwind_find_mapping(process, pc) as usize)
}

/// [`find_mapping`] as a global function (verified once): its index, `MAX_MAPPINGS` for none.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn unwind_find_mapping(process: *const ProcessTable, pc: u64) -> u64 {
    if process.is_null() {
        return MAX_MAPPINGS as u64;
    }
    find_mapping_inline(unsafe { &*process }, pc).map_or(MAX_MAPPINGS as u64, |i| i as u64)
}

#[inline(always)]
fn find_mapping_inline(process: &ProcessTable, pc: u64) -> Option<usize> {
    let (mut lo, mut hi) = (0usize, (process.len as usize).min(MAX_MAPPINGS));
    for _ in 0..MAPPING_SEARCH_STEPS {
        if lo >= hi {
            break;
        }
        let mid = (lo + hi) / 2;
        let m = process.mappings.get(mid)?;
        if m.start <= pc {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let i = lo.checked_sub(1)?;
    let m = process.mappings.get(i)?;
    (pc < m.end).then_some(i)
}

/// Word `i` of `UNWIND_ROWS` (little-endian: the low half of an element comes first).
#[inline(always)]
fn word(i: u32) -> Option<u32> {
    let e = *UNWIND_ROWS.get(i / 2)?;
    // A shift, not a branch: each branch here is a state more for the verifier, per step of
    // every search of every frame.
    Some((e >> ((i & 1) * 32)) as u32)
}

/// The rule covering `pc`: the last row at or below it in its page, else the last row before
/// the page (`profiler_common::unwind::packed`).
#[inline(always)]
fn find_row(mapping: &Mapping, pc: u64) -> Option<Rule> {
    let r = unwind_find_row(mapping, pc);
    if r >> 32 == 0 {
        return None;
    }
    Some(Rule { cfa_offset: r as u16, kind: (r >> 16) as u8, fp_offset: (r >> 24) as u8 as i8 })
}

/// [`find_row`] as a global function (verified once): the rule's fields packed in the low 32
/// bits, bit 32 set when there is one.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn unwind_find_row(mapping: *const Mapping, pc: u64) -> u64 {
    if mapping.is_null() {
        return 0;
    }
    match find_row_inline(unsafe { &*mapping }, pc) {
        Some(r) => 1 << 32 | r.cfa_offset as u64 | (r.kind as u64) << 16 | (r.fp_offset as u8 as u64) << 24,
        None => 0,
    }
}

#[inline(always)]
fn find_row_inline(mapping: &Mapping, pc: u64) -> Option<Rule> {
    // Few branches: each is a state more for the verifier, per step of every search of every
    // frame (an address below the bias wraps past 32 bits and is refused with the rest).
    let key = pc.wrapping_sub(mapping.bias);
    if key >> 32 != 0 {
        return None;
    }
    let key = key as u32;
    let page = key >> packed::PAGE_SHIFT;
    if page >= mapping.table_pages {
        return None;
    }
    let index = mapping.table_start.wrapping_add(mapping.table_len).wrapping_add(page);
    let (mut lo, mut hi) = (word(index)?, word(index.wrapping_add(1))?);
    let low = packed::low(key);
    for _ in 0..ROW_SEARCH_STEPS {
        if lo >= hi {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        if packed::low(word(mapping.table_start.wrapping_add(mid))?) <= low {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if lo == 0 {
        return None;
    }
    let row = word(mapping.table_start.wrapping_add(lo - 1))?;
    UNWIND_RULES.get(packed::rule(row)).copied()
}
