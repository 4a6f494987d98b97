//! CPython frames (see `profiler_common::python`): run as a tail call just before a record of
//! a described Python process is sent, so both user-stack walks (frame pointers, tables) end here.

use aya_ebpf::{
    EbpfContext,
    helpers::bpf_probe_read_user,
    macros::{map, perf_event},
    maps::HashMap,
    programs::PerfEventContext,
};
use profiler_common::{
    MAX_KERNEL_FRAMES, MAX_USER_FRAMES,
    python::{CODE_TAG_BITS, ENTRY_FRAME, MAX_PYTHON_FRAMES, MAX_PYTHON_THREADS, NONE, PYTHON_PROGRAM, PyProc},
};

use crate::{FRAME_SLOTS, Record, Sampler, sink::Sink};

const _: () = assert!(MAX_KERNEL_FRAMES + MAX_USER_FRAMES + 2 * MAX_PYTHON_FRAMES <= FRAME_SLOTS);

#[map]
static PY_PROCS: HashMap<u32, PyProc> = HashMap::with_max_entries(1024, 1 /* BPF_F_NO_PREALLOC */);

#[inline(always)]
fn read<T>(addr: u64) -> Option<T> {
    unsafe { bpf_probe_read_user(addr as *const T) }.ok()
}

#[inline(always)]
fn field(base: u64, offset: u16) -> Option<u64> {
    if offset == NONE { None } else { read::<u64>(base + offset as u64) }
}

/// Hands the record to the Python program when its process runs CPython; returns if not.
#[inline(always)]
pub fn start<S: Sink, C: EbpfContext>(ctx: &C, pid: u32) {
    if unsafe { PY_PROCS.get(&pid) }.is_some() {
        S::tail_call(ctx, PYTHON_PROGRAM);
    }
}

#[perf_event]
pub fn python_frames(_ctx: PerfEventContext) -> u32 {
    frames::<Sampler>();
    0
}

/// Adds the Python frames to sink `S`'s record and finishes it.
#[inline(always)]
pub(crate) fn frames<S: Sink>() {
    let Some(record) = S::record() else { return };
    let record = unsafe { &mut *record };
    let kernel = (record.header.kernel_frames as usize).min(MAX_KERNEL_FRAMES);
    let user = (record.header.user_frames as usize).min(MAX_USER_FRAMES);
    let n = match unsafe { PY_PROCS.get(&record.header.pid) } {
        Some(p) => walk(record, p, kernel + user),
        None => 0,
    };
    record.header.python_frames = n as u16;
    S::finish(record, kernel, user);
}

/// Copies the sampled thread's Python frames after word `at`; returns how many.
#[inline(always)]
fn walk(record: &mut Record, p: &PyProc, at: usize) -> usize {
    let tid = record.header.tid as u64;
    let Some(interp) = field(p.runtime, p.interpreters_head) else { return 0 };
    let Some(mut tstate) = field(interp, p.threads_head) else { return 0 };
    let mut found = false;
    for _ in 0..MAX_PYTHON_THREADS {
        if tstate == 0 {
            break;
        }
        let id = if p.pthread_tid == NONE {
            field(tstate, p.tstate_native_thread_id)
        } else {
            field(tstate, p.tstate_native_thread_id)
                .and_then(|pthread| read::<u32>(pthread + p.pthread_tid as u64))
                .map(|t| t as u64)
        };
        if id == Some(tid) {
            found = true;
            break;
        }
        tstate = field(tstate, p.tstate_next).unwrap_or(0);
    }
    if !found {
        return 0;
    }
    let Some(mut frame) = field(tstate, p.tstate_frame) else { return 0 };
    if p.cframe_current != NONE && frame != 0 {
        frame = field(frame, p.cframe_current).unwrap_or(0);
    }
    // One pair per frame visited, at the loop's own index (a second counter would make every
    // iteration a new state for the verifier). A 3.12+ shim frame is written as (0, ENTRY):
    // userspace marks the frame before it as the start of an evaluation and drops the pair.
    let mut n = 0usize;
    for i in 0..MAX_PYTHON_FRAMES {
        if frame == 0 {
            break;
        }
        let slot = at + 2 * i;
        if slot + 1 >= FRAME_SLOTS {
            break;
        }
        let next = python_frame(record, p, frame, slot as u64);
        if next == NO_CODE {
            break;
        }
        n = i + 1;
        frame = next;
    }
    n
}

/// [`python_frame`]'s answer for a frame whose code could not be read: the walk ends before it.
const NO_CODE: u64 = u64::MAX;

/// Writes `frame`'s pair at `slot` and returns the frame before it (0: none), or `NO_CODE`.
/// A global function: the verifier checks its body once, not once for each of the
/// `MAX_PYTHON_FRAMES` frames.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn python_frame(record: *mut Record, p: *const PyProc, frame: u64, slot: u64) -> u64 {
    // A global function's pointer arguments may be null for the verifier.
    if record.is_null() || p.is_null() {
        return NO_CODE;
    }
    let (record, p) = unsafe { (&mut *record, &*p) };
    // Not `slot + 1 >= FRAME_SLOTS`: that wraps for a huge `slot`, as far as the compiler knows.
    let slot = slot as usize;
    if slot >= FRAME_SLOTS - 1 {
        return NO_CODE;
    }
    // 3.12+: frames of an `owner` at or above `owner_shim` are the interpreter's own (3.12 and
    // 3.13's C-stack shim, 3.14's entry frame), not a function's.
    let shim =
        p.owner_shim != NONE && read::<u8>(frame + p.frame_owner as u64).is_some_and(|o| o as u16 >= p.owner_shim);
    let (code, word) = if shim {
        (0, ENTRY_FRAME)
    } else {
        // 3.14's `f_executable` is a tagged `_PyStackRef`: the tag is not part of the address.
        let Some(code) = field(frame, p.frame_code).map(|c| c & !CODE_TAG_BITS) else { return NO_CODE };
        if p.every_frame_entry != 0 {
            // A frame object (before 3.11) keeps `int f_lasti`, an offset into its code: sent
            // shifted past the flag, whatever its sign.
            let lasti =
                if p.frame_instr == NONE { 0 } else { read::<u32>(frame + p.frame_instr as u64).unwrap_or(0) as u64 };
            (code, (lasti << 1) | ENTRY_FRAME)
        } else {
            let instr = if p.frame_instr == NONE { 0 } else { field(frame, p.frame_instr).unwrap_or(0) };
            let entry = p.frame_is_entry != NONE && read::<u8>(frame + p.frame_is_entry as u64).is_some_and(|e| e != 0);
            (code, (instr & !ENTRY_FRAME) | if entry { ENTRY_FRAME } else { 0 })
        }
    };
    record.frames[slot] = code;
    record.frames[slot + 1] = word;
    field(frame, p.frame_previous).unwrap_or(0)
}
