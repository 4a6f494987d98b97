//! Off-CPU time per stack (`profiler_common::offcpu`): `offcpu_switch`, on `sched_switch`,
//! notes when the thread leaving the CPU went off and in which state, and credits the thread
//! coming back on with the time it was off when that is at least the threshold. Its stack is
//! the one it left in: walked at the switch-out (the kernel's, then the user's with the
//! sampler's unwinder and Python frames, through tail calls of this program's own type) for
//! threads a long wait armed, within a per-CPU budget; a walk ends in `OFFCPU_STACKS_*` and in
//! the thread's `OFFCPU_SINCE` entry, not in the ring.

use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_F_USER_STACK,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_kernel,
        generated::{
            bpf_get_current_cgroup_id, bpf_get_current_task_btf, bpf_get_smp_processor_id, bpf_get_stack,
            bpf_ktime_get_boot_ns, bpf_task_pt_regs,
        },
    },
    macros::{map, tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, ProgramArray},
    programs::TracePointContext,
};
use profiler_common::{
    MAX_KERNEL_FRAMES, MAX_USER_FRAMES,
    offcpu::{
        ARMED_SHORT_WAITS, MAX_SECONDS, OFFCPU_COUNTS_MAX, OFFCPU_SINCE_MAX, OFFCPU_STACKS_MAX, Off, OffCount, OffKey,
        Place, SAMPLE_EVERY, WALK_RESERVE, flag, stat, state,
    },
    python::MAX_PYTHON_FRAMES,
    unwind::{FRAMES_PER_RUN_SMALL, SCAN_WORDS_SMALL, State},
};

use crate::{
    Record,
    arch::{self, Regs},
    python,
    runq::{SWITCH_NEXT_PID_OFFSET, SWITCH_PREV_STATE_OFFSET, offset},
    sink::Sink,
    unwind,
};

const NS: u64 = 1_000_000_000;

/// Tail-call slots for the walks (tracepoint programs: a program can only tail-call its own
/// type), the same slot numbers as the sampler's `PROGRAMS`.
#[map]
static OFFCPU_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(3, 0);

#[map]
static OFFCPU_SCRATCH: PerCpuArray<Record> = PerCpuArray::with_max_entries(1, 0);

#[map]
static OFFCPU_STATE: PerCpuArray<State> = PerCpuArray::with_max_entries(1, 0);

/// Threads by thread id: off their CPU since when, armed, their last walks' places. Updated
/// in place; LRU: a thread that exited never takes its entry out.
#[map]
static OFFCPU_SINCE: LruHashMap<u32, Off> = LruHashMap::with_max_entries(OFFCPU_SINCE_MAX, 0);

/// Walked stacks by hash, double-buffered with the counts (`OFFCPU_GEN`): userspace reads and
/// empties a generation's map a drain after the program left it, and keeps what it read. Not
/// an LRU: on a busy node (a build starting processes) an LRU evicted stacks before the drain
/// read them. A stack met again in the other generation is copied into the current one.
#[map]
static OFFCPU_STACKS_0: HashMap<u64, Record> = HashMap::with_max_entries(OFFCPU_STACKS_MAX, 0);

#[map]
static OFFCPU_STACKS_1: HashMap<u64, Record> = HashMap::with_max_entries(OFFCPU_STACKS_MAX, 0);

/// The generation the program writes (its low bit).
#[inline(always)]
fn generation() -> u32 {
    OFFCPU_GEN.get(0).copied().unwrap_or(0) & 1
}

#[inline(always)]
fn stacks(generation: u32) -> &'static HashMap<u64, Record> {
    if generation == 1 { &OFFCPU_STACKS_1 } else { &OFFCPU_STACKS_0 }
}

/// Whether stack `h` is in the current generation's map, copied there from the other one if
/// only there (userspace may empty the other next).
#[inline(always)]
fn keep_stack(h: u64) -> bool {
    let g = generation();
    if unsafe { stacks(g).get(&h) }.is_some() {
        return true;
    }
    match stacks(g ^ 1).get_ptr(&h) {
        Some(r) => stacks(g).insert(&h, unsafe { &*r }, 0).is_ok(),
        None => false,
    }
}

#[map]
static OFFCPU_COUNTS_0: HashMap<OffKey, OffCount> = HashMap::with_max_entries(OFFCPU_COUNTS_MAX, 0);

#[map]
static OFFCPU_COUNTS_1: HashMap<OffKey, OffCount> = HashMap::with_max_entries(OFFCPU_COUNTS_MAX, 0);

/// Which counts map is written (its low bit); userspace flips it before a drain.
#[map]
static OFFCPU_GEN: Array<u32> = Array::with_max_entries(1, 0);

/// `CLOCK_REALTIME - CLOCK_BOOTTIME` modulo a second (ns), as `CUDA_CLOCK`.
#[map]
static OFFCPU_CLOCK: Array<u64> = Array::with_max_entries(1, 0);

/// Settings, written by userspace before the program is attached (`profiler_common::offcpu`
/// names them): a map rather than globals because the feature loads after the object, and
/// its threshold is the daemon's flag. Slot 0: threshold (ns; 0 = off), 1: waits recorded a
/// second per CPU before sampling, 2: walks a second per CPU.
#[map]
static OFFCPU_CONFIG: Array<u64> = Array::with_max_entries(4, 0);

#[map]
static OFFCPU_STATS: PerCpuArray<[u64; stat::LEN]> = PerCpuArray::with_max_entries(1, 0);

/// The walks: built in `OFFCPU_SCRATCH`, ended in `OFFCPU_STACKS_*`.
pub(crate) struct Waits;

impl Sink for Waits {
    #[inline(always)]
    fn record() -> Option<*mut Record> {
        OFFCPU_SCRATCH.get_ptr_mut(0)
    }
    #[inline(always)]
    fn state() -> Option<*mut State> {
        OFFCPU_STATE.get_ptr_mut(0)
    }
    #[inline(always)]
    fn tail_call<C: EbpfContext>(ctx: &C, slot: u32) {
        let _ = unsafe { OFFCPU_PROGRAMS.tail_call(ctx, slot) };
    }
    #[inline(always)]
    fn finish(record: &mut Record, kernel: usize, user: usize) {
        end(record, kernel, user);
    }
}

#[tracepoint]
pub fn offcpu_switch(ctx: TracePointContext) -> u32 {
    switch(&ctx);
    0
}

#[tracepoint]
pub fn offcpu_unwind(ctx: TracePointContext) -> u32 {
    unwind::run::<FRAMES_PER_RUN_SMALL, Waits, _>(&ctx);
    0
}

#[tracepoint]
pub fn offcpu_scan(ctx: TracePointContext) -> u32 {
    unwind::scan::<SCAN_WORDS_SMALL, Waits, _>(&ctx);
    0
}

#[tracepoint]
pub fn offcpu_python(_ctx: TracePointContext) -> u32 {
    python::frames::<Waits>();
    0
}

#[inline(always)]
fn config(slot: u32) -> u64 {
    OFFCPU_CONFIG.get(slot).copied().unwrap_or(0)
}

#[inline(always)]
fn switch(ctx: &TracePointContext) {
    let threshold = config(0);
    if threshold == 0 {
        return;
    }
    let Some(stats) = OFFCPU_STATS.get_ptr_mut(0) else { return };
    // Per-CPU value, and sched_switch does not nest on a CPU: plain adds.
    let stats = unsafe { &mut *stats };
    let now = unsafe { bpf_ktime_get_boot_ns() };
    let second = now / NS;
    if stats[stat::SECOND] != second {
        stats[stat::SECOND] = second;
        stats[stat::RECORDED] = 0;
        stats[stat::WALKS] = 0;
    }
    stats[stat::SWITCHES] += 1;
    // The thread coming on first: the walk of the one leaving ends in tail calls. Its entry is
    // written in place (one thread is switched by one CPU at a time, and a woken thread is not
    // switched in before its switch-out is done).
    let next = unsafe { ctx.read_at::<i32>(offset(&SWITCH_NEXT_PID_OFFSET)) }.unwrap_or(0);
    if next > 0
        && let Some(o) = OFFCPU_SINCE.get_ptr_mut(&(next as u32))
    {
        let o = unsafe { &mut *o };
        if o.start_ns != 0 {
            came_back(next as u32, o, now, threshold, stats);
            o.start_ns = 0;
        }
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let (pid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if tid == 0 {
        return;
    }
    let prev_state = unsafe { ctx.read_at::<i64>(offset(&SWITCH_PREV_STATE_OFFSET)) }.unwrap_or(0) as u64;
    let Some(st) = state::of(prev_state) else { return };
    let o = match OFFCPU_SINCE.get_ptr_mut(&tid) {
        Some(o) => o,
        None => {
            // A thread first seen leaving: its one insert.
            let _ = OFFCPU_SINCE.insert(&tid, &Off { pid, ..Off::default() }, 0);
            let Some(o) = OFFCPU_SINCE.get_ptr_mut(&tid) else { return };
            o
        }
    };
    let o = unsafe { &mut *o };
    if o.pid != pid {
        // A thread id reused by another process: nothing of the old one's holds.
        *o = Off { pid, ..Off::default() };
    }
    o.start_ns = now;
    o.hash = 0;
    o.state = st;
    o.flags &= !flag::LEFT_ARMED;
    if o.left == 0 {
        return;
    }
    o.flags |= flag::LEFT_ARMED;
    // Where it left user code (the registers saved at kernel entry).
    let task = unsafe { bpf_get_current_task_btf() };
    let regs = unsafe { bpf_task_pt_regs(task) } as *const Regs;
    let Ok(regs) = (unsafe { bpf_probe_read_kernel(regs) }) else { return };
    let f = arch::frame(&regs);
    // From where one of its last walks started: the same stack, unwalked, unless that walk had
    // no unwind tables and the process has them now (walked again if the budget allows).
    let mut stale = 0u64;
    for i in 0..2usize {
        let p = &o.places[i];
        if p.hash == 0 || p.ip != f.ip || p.sp != f.sp {
            continue;
        }
        let no_tables = if i == 0 { flag::NO_TABLES_0 } else { flag::NO_TABLES_1 };
        if o.flags & no_tables != 0 && unwind::has_tables(pid) {
            stale = p.hash;
            continue;
        }
        if keep_stack(p.hash) {
            stats[stat::REUSED] += 1;
            o.hash = p.hash;
            if i == 1 {
                o.flags |= flag::NEWER_1
            } else {
                o.flags &= !flag::NEWER_1
            }
            return;
        }
    }
    // The budget: preempted switch-outs (a CPU-bound thread's random places) take half of it,
    // a blocking one whose thread's last long wait went unwalked may go past it.
    let limit = config(2);
    let cap = if st == state::RUNNABLE {
        limit / 2
    } else if o.flags & flag::STARVED != 0 {
        limit + limit * WALK_RESERVE / 100
    } else {
        limit
    };
    if stats[stat::WALKS] >= cap {
        stats[stat::WALKS_SKIPPED] += 1;
        if stale != 0 && keep_stack(stale) {
            // Walked without the tables: better than no stack.
            stats[stat::REUSED] += 1;
            o.hash = stale;
        }
        return;
    }
    stats[stat::WALKS] += 1;
    stats[stat::WALKED] += 1;
    // Into the older place (the same one when re-walking a stale place is the older's luck).
    let into_1 = o.flags & flag::NEWER_1 == 0;
    let no_tables = if unwind::has_tables(pid) {
        0
    } else if into_1 {
        flag::NO_TABLES_1
    } else {
        flag::NO_TABLES_0
    };
    if into_1 {
        o.places[1] = Place { ip: f.ip, sp: f.sp, hash: 0 };
        o.flags = (o.flags & !flag::NO_TABLES_1) | flag::NEWER_1 | flag::WALKING_1 | no_tables;
    } else {
        o.places[0] = Place { ip: f.ip, sp: f.sp, hash: 0 };
        o.flags = (o.flags & !(flag::NO_TABLES_0 | flag::NEWER_1 | flag::WALKING_1)) | no_tables;
    }
    walk(ctx, pid, tid, now, &regs);
}

/// Thread `tid` is back on a CPU after being off since `o.start_ns`.
#[inline(always)]
fn came_back(tid: u32, o: &mut Off, now: u64, threshold: u64, stats: &mut [u64; stat::LEN]) {
    let waited = now.saturating_sub(o.start_ns);
    if waited < threshold {
        // Armed (walked or not) for a short wait: after ARMED_SHORT_WAITS of them in a row its
        // switch-outs are not walked until a long wait again (its places are kept).
        if o.flags & flag::LEFT_ARMED != 0 && o.left > 0 {
            o.left -= 1;
        }
        return;
    }
    stats[stat::LONG_WAITS] += 1;
    if o.hash != 0 {
        // Walked in the other generation: its stack follows the count into this one (or,
        // emptied from both since, userspace holds it from its drain).
        keep_stack(o.hash);
        o.flags &= !flag::STARVED;
    } else if o.flags & flag::LEFT_ARMED != 0 {
        o.flags |= flag::STARVED;
    }
    o.left = ARMED_SHORT_WAITS;
    // The rate limit: past it, one wait in SAMPLE_EVERY is kept and weighs that many.
    let recorded = stats[stat::RECORDED];
    stats[stat::RECORDED] = recorded + 1;
    let limit = config(1);
    let weight = if recorded < limit {
        1
    } else if (recorded - limit) % SAMPLE_EVERY == 0 {
        SAMPLE_EVERY
    } else {
        stats[stat::SAMPLED_OUT] += 1;
        return;
    };
    // Split over the wall-clock seconds it covered, the last MAX_SECONDS of them.
    let frac = OFFCPU_CLOCK.get(0).copied().unwrap_or(0);
    let start = o.start_ns.wrapping_add(frac);
    let mut to = now.wrapping_add(frac);
    let map = if generation() == 1 { &OFFCPU_COUNTS_1 } else { &OFFCPU_COUNTS_0 };
    for i in 0..MAX_SECONDS {
        if to <= start {
            break;
        }
        let sec = (to - 1) / NS;
        let from = if sec * NS > start { sec * NS } else { start };
        let key = OffKey { pid: o.pid, tid, state: o.state, sec: sec as u32, hash: o.hash };
        let ns = (to - from) * weight;
        let waits = if i == 0 { weight } else { 0 };
        match map.get_ptr_mut(&key) {
            // One thread is on one CPU at a time and the key holds the thread: no atomics.
            Some(v) => unsafe {
                (*v).ns += ns;
                (*v).waits += waits;
            },
            None => {
                if map.insert(&key, &OffCount { ns, waits }, 0).is_err() {
                    stats[stat::DROPPED] += 1;
                }
            }
        }
        to = from;
    }
}

/// Walks the stack of the thread leaving the CPU (current): the kernel's, then the user's.
#[inline(always)]
fn walk(ctx: &TracePointContext, pid: u32, tid: u32, now: u64, regs: &Regs) {
    let Some(record) = OFFCPU_SCRATCH.get_ptr_mut(0) else { return };
    let record = unsafe { &mut *record };
    let header = &mut record.header;
    header.ts_ns = now;
    header.cpu = unsafe { bpf_get_smp_processor_id() };
    header.pid = pid;
    header.tid = tid;
    header.flags = 0;
    header.kernel_frames = 0;
    header.user_frames = 0;
    header.python_frames = 0;
    header.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    header.comm = bpf_get_current_comm().unwrap_or([0; 16]);
    let frames = record.frames.as_mut_ptr();
    let ret = unsafe { bpf_get_stack(ctx.as_ptr(), frames.cast::<c_void>(), (MAX_KERNEL_FRAMES * 8) as u32, 0) };
    let kernel = if ret < 0 { 0 } else { (ret as usize / 8).min(MAX_KERNEL_FRAMES) };
    record.header.kernel_frames = kernel as u16;
    if unwind::has_tables(pid) {
        // Does not return if the table walk took over.
        unwind::start_at::<Waits, _>(ctx, record, kernel, regs);
    }
    let frames = record.frames.as_mut_ptr();
    let ret = unsafe {
        bpf_get_stack(
            ctx.as_ptr(),
            frames.add(kernel).cast::<c_void>(),
            (MAX_USER_FRAMES * 8) as u32,
            BPF_F_USER_STACK as u64,
        )
    };
    let user = if ret < 0 { 0 } else { (ret as usize / 8).min(MAX_USER_FRAMES) };
    record.header.user_frames = user as u16;
    python::start::<Waits, _>(ctx, pid);
    end(record, kernel, user);
}

/// The walk is done: the stack into the generation's `OFFCPU_STACKS_*` (once), its hash into the thread's entry.
#[inline(always)]
fn end(record: &mut Record, kernel: usize, user: usize) {
    let python = (record.header.python_frames as usize).min(MAX_PYTHON_FRAMES);
    let n = kernel.min(MAX_KERNEL_FRAMES) + user.min(MAX_USER_FRAMES) + 2 * python;
    let (pid, tid) = (record.header.pid, record.header.tid);
    // Seeded with the process, not the thread: a pool's threads share their stacks' entries
    // (the counts keep the thread).
    let mut h = offcpu_hash(record, pid as u64, kernel as u64, n as u64);
    if h == 0 {
        h = 1;
    }
    let map = stacks(generation());
    if unsafe { map.get(&h) }.is_none() && map.insert(&h, &*record, 0).is_err() {
        // The generation's map is full: the wait is counted without its stack.
        return;
    }
    if let Some(o) = OFFCPU_SINCE.get_ptr_mut(&tid) {
        let o = unsafe { &mut *o };
        o.hash = h;
        o.flags &= !flag::STARVED;
        if o.flags & flag::WALKING_1 != 0 {
            o.places[1].hash = h;
        } else {
            o.places[0].hash = h;
        }
    }
}

/// FNV-1a over the stack's first `n` words, seeded with the thread and the kernel frames'
/// count (as the CUDA counts' stacks). A global function: the verifier checks the loop once,
/// not at every walk's end (inlined into the Python reader's, it passed the million
/// instructions).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn offcpu_hash(record: *const Record, thread: u64, kernel: u64, n: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ thread;
    h = (h ^ kernel).wrapping_mul(0x0000_0100_0000_01b3);
    if record.is_null() {
        return h;
    }
    let frames = unsafe { &(*record).frames };
    for (i, w) in frames.iter().enumerate() {
        if i as u64 >= n {
            break;
        }
        h = (h ^ *w).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}
