//! CUDA driver calls attributed to stacks (`profiler_common::cuda`): userspace attaches
//! `cuda_call` to the launch, copy and synchronisation functions of every `libcuda.so.1` a
//! process maps (what each probe counts is in its attach cookie) and `cuda_return` to the
//! synchronisations' returns. The calling thread's stack is walked by the sampler's unwinder
//! (tables, frame pointers, Python frames) into a scratch record of its own; the walk's end
//! adds to per-stack counters instead of sending a record.
//!
//! A launch is counted with its kernel (`CudaKey::func`): the handle the driver's launch passed,
//! or the host stub the runtime's `cudaLaunchKernel` passed on its way to the driver
//! (`cuda_lookup` at the runtime's entry leaves it in `CUDA_RUNTIME` for the thread's driver
//! launch within the call). `cuda_lookup` and `cuda_lookup_return` on the look-up calls
//! (`cuModuleGetFunction`, `cuLibraryGetKernel`, `cuKernelGetFunction`, `__cudaGetKernel`)
//! remember what each handle is, for userspace to name the launches.

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_F_USER_STACK,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_uid_gid, bpf_probe_read_kernel_buf,
        bpf_probe_read_user, bpf_probe_read_user_str_bytes,
        generated::{
            bpf_get_attach_cookie, bpf_get_current_cgroup_id, bpf_get_smp_processor_id, bpf_get_stack,
            bpf_ktime_get_boot_ns,
        },
    },
    macros::{map, uprobe, uretprobe},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, ProgramArray},
    programs::{ProbeContext, RetProbeContext},
};
use profiler_common::{
    FLAG_USER_MODE, MAX_USER_FRAMES, RECORD_WORDS, counter,
    cuda::{
        CUDA_COUNTS_MAX, CUDA_GATE_MAX, CUDA_LOOKUPS_MAX, CUDA_OWNERS_MAX, CUDA_PENDING_MAX, CUDA_STACKS_MAX,
        CudaCount, CudaKey, Looking, Lookup, LookupKey, OWNER_KEYS_MAX, OWNER_STACKS_MAX, OwnerKey, OwnerUse, Pending,
        RUNTIME_WITHIN_NS, RuntimeLaunch, cookie, func, kind, lookup,
    },
    python::MAX_PYTHON_FRAMES,
    unwind::{FRAMES_PER_RUN_SMALL, State},
};

use crate::{
    Record,
    arch::{self, Regs},
    count, python,
    sink::Sink,
    unwind,
};

/// Tail-call slots for the probes' walks (kprobe-type programs: a uprobe can only tail-call
/// its own type), the same slot numbers as the sampler's `PROGRAMS`.
#[map]
static CUDA_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(3, 0);

#[map]
static CUDA_SCRATCH: PerCpuArray<Record> = PerCpuArray::with_max_entries(1, 0);

/// The probe's registers, copied out of its context.
#[map]
static CUDA_REGS: PerCpuArray<Regs> = PerCpuArray::with_max_entries(1, 0);

#[map]
static CUDA_STATE: PerCpuArray<State> = PerCpuArray::with_max_entries(1, 0);

/// The call being walked: what it counts.
#[repr(C)]
#[derive(Clone, Copy)]
struct Call {
    kind: u32,
    _pad: u32,
    bytes: u64,
    /// A launch's kernel (`CudaKey::func`).
    func: u64,
}

#[map]
static CUDA_CALL: PerCpuArray<Call> = PerCpuArray::with_max_entries(1, 0);

/// The stacks of each generation's counts (by [`CudaKey::hash`]), emptied by userspace with
/// them: not an LRU, whose eviction let one user's stacks push out another's (and the
/// kernel's LRU keeps per-CPU free lists, so it evicts before it is full).
#[map]
static CUDA_STACKS_0: HashMap<u64, Record> = HashMap::with_max_entries(CUDA_STACKS_MAX, 0);

#[map]
static CUDA_STACKS_1: HashMap<u64, Record> = HashMap::with_max_entries(CUDA_STACKS_MAX, 0);

#[map]
static CUDA_COUNTS_0: HashMap<CudaKey, CudaCount> = HashMap::with_max_entries(CUDA_COUNTS_MAX, 0);

#[map]
static CUDA_COUNTS_1: HashMap<CudaKey, CudaCount> = HashMap::with_max_entries(CUDA_COUNTS_MAX, 0);

/// `CLOCK_REALTIME - CLOCK_BOOTTIME` modulo a second (ns), set by userspace: boot time plus it
/// turns over on wall-clock seconds, so a count's [`CudaKey::sec`] is the second it was made in.
#[map]
static CUDA_CLOCK: Array<u64> = Array::with_max_entries(1, 0);

/// Which counts map the probes add to (its low bit); userspace flips it before a drain.
#[map]
static CUDA_GEN: Array<u32> = Array::with_max_entries(1, 0);

#[map]
static CUDA_PENDING: LruHashMap<u32, Pending> = LruHashMap::with_max_entries(CUDA_PENDING_MAX, 0);

/// Each owner's use of the maps above in each generation (`profiler_common::cuda::OwnerUse`),
/// cleared by userspace with the generation's counts.
#[map]
static CUDA_OWNERS: HashMap<OwnerKey, OwnerUse> = HashMap::with_max_entries(CUDA_OWNERS_MAX, 0);

/// Processes the rate guard switched off (by pid): their calls still trap while another
/// process keeps the file's probes attached, but are neither walked nor counted, so one
/// process's flood turns no other process's counts into estimates.
#[map]
static CUDA_GATE: HashMap<u32, u32> = HashMap::with_max_entries(CUDA_GATE_MAX, 0);

/// What the look-ups named, by process and handle (userspace reads and empties it each drain).
#[map]
static CUDA_LOOKUPS: LruHashMap<LookupKey, Lookup> = LruHashMap::with_max_entries(CUDA_LOOKUPS_MAX, 0);

/// Look-up calls in progress, by thread: their arguments, read at the return.
#[map]
static CUDA_LOOKING: LruHashMap<u32, Looking> = LruHashMap::with_max_entries(CUDA_PENDING_MAX, 0);

/// A runtime launch on its way to the driver, by thread.
#[map]
static CUDA_RUNTIME: LruHashMap<u32, RuntimeLaunch> = LruHashMap::with_max_entries(CUDA_PENDING_MAX, 0);

/// A look-up's entry, built off the 512-byte BPF stack.
#[map]
static CUDA_LOOKUP_SCRATCH: PerCpuArray<Lookup> = PerCpuArray::with_max_entries(1, 0);

/// The probes' walks: built in `CUDA_SCRATCH`, ended in the counters.
pub(crate) struct Probes;

impl Sink for Probes {
    #[inline(always)]
    fn record() -> Option<*mut Record> {
        CUDA_SCRATCH.get_ptr_mut(0)
    }
    #[inline(always)]
    fn state() -> Option<*mut State> {
        CUDA_STATE.get_ptr_mut(0)
    }
    #[inline(always)]
    fn tail_call<C: EbpfContext>(ctx: &C, slot: u32) {
        let _ = unsafe { CUDA_PROGRAMS.tail_call(ctx, slot) };
    }
    #[inline(always)]
    fn finish(record: &mut Record, _kernel: usize, user: usize) {
        end(record, user);
    }
}

#[uprobe]
pub fn cuda_call(ctx: ProbeContext) -> u32 {
    enter(&ctx);
    0
}

#[uprobe]
pub fn cuda_unwind(ctx: ProbeContext) -> u32 {
    unwind::run::<FRAMES_PER_RUN_SMALL, Probes, _>(&ctx);
    0
}

#[uprobe]
pub fn cuda_scan(ctx: ProbeContext) -> u32 {
    unwind::scan::<{ profiler_common::unwind::SCAN_WORDS_SMALL }, Probes, _>(&ctx);
    0
}

#[uprobe]
pub fn cuda_python(_ctx: ProbeContext) -> u32 {
    python::frames::<Probes>();
    0
}

/// A look-up's entry (its arguments kept for the return) or a runtime launch's (its stub kept
/// for the driver's launch probe): no stack walk, no count.
#[uprobe]
pub fn cuda_lookup(ctx: ProbeContext) -> u32 {
    let c = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let pid_tgid = bpf_get_current_pid_tgid();
    let (pid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if unsafe { CUDA_GATE.get(&pid) }.is_some() {
        return 0;
    }
    let Some(slot) = CUDA_REGS.get_ptr_mut(0) else { return 0 };
    let buf = unsafe { core::slice::from_raw_parts_mut(slot.cast::<u8>(), core::mem::size_of::<Regs>()) };
    if unsafe { bpf_probe_read_kernel_buf(ctx.regs as *const u8, buf) }.is_err() {
        return 0;
    }
    let regs = unsafe { &*slot };
    let what = cookie::kind(c);
    if what == lookup::RUNTIME_LAUNCH {
        let r = RuntimeLaunch {
            stub: arch::arg(regs, cookie::arg(c) as usize),
            sp: arch::frame(regs).sp,
            ra: arch::return_address(regs).unwrap_or(0),
            ts_ns: unsafe { bpf_ktime_get_boot_ns() },
        };
        let _ = CUDA_RUNTIME.insert(&tid, &r, 0);
        return 0;
    }
    let l = Looking { what, _pad: 0, out: arch::arg(regs, 0), arg: arch::arg(regs, cookie::arg(c) as usize) };
    let _ = CUDA_LOOKING.insert(&tid, &l, 0);
    0
}

/// A look-up returned: what the handle it wrote is goes into `CUDA_LOOKUPS`.
#[uretprobe]
pub fn cuda_lookup_return(ctx: RetProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (pid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    let Some(l) = (unsafe { CUDA_LOOKING.get(&tid) }).copied() else { return 0 };
    let _ = CUDA_LOOKING.remove(&tid);
    // CUresult / cudaError_t: 0 is success; the handle is not written otherwise.
    if ctx.ret::<u64>() as u32 != 0 || l.out == 0 {
        return 0;
    }
    let Ok(handle) = (unsafe { bpf_probe_read_user(l.out as *const u64) }) else { return 0 };
    if handle == 0 {
        return 0;
    }
    let Some(e) = CUDA_LOOKUP_SCRATCH.get_ptr_mut(0) else { return 0 };
    let e = unsafe { &mut *e };
    e.what = l.what;
    e.len = 0;
    e.target = 0;
    if l.what == lookup::NAMED {
        // Bounded: a longer name is cut (userspace says so rather than guess the rest).
        if let Ok(name) = unsafe { bpf_probe_read_user_str_bytes(l.arg as *const u8, &mut e.name) } {
            e.len = name.len() as u32 + 1;
        }
        if e.len == 0 {
            return 0;
        }
    } else {
        e.target = l.arg;
    }
    let _ = CUDA_LOOKUPS.insert(&LookupKey { pid, _pad: 0, handle }, &*e, 0);
    0
}

#[uretprobe]
pub fn cuda_return(_ctx: RetProbeContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(p) = (unsafe { CUDA_PENDING.get(&tid) }).copied() else { return 0 };
    let _ = CUDA_PENDING.remove(&tid);
    let now = unsafe { bpf_ktime_get_boot_ns() };
    // Entered in the other generation: its stack goes with the count into this one's map
    // (a wait longer than a drain is found pending by userspace, which keeps its stack).
    let generation = generation();
    if p.generation != generation
        && let Some(record) = stacks(p.generation).get_ptr(&p.hash)
        && unsafe { stacks(generation).get(&p.hash) }.is_none()
    {
        let _ = stacks(generation).insert(&p.hash, unsafe { &*record }, 0);
    }
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let key = CudaKey { pid: p.pid, tid, kind: kind::SYNC, cpu, sec: second(now), _pad: 0, hash: p.hash, func: 0 };
    add(&key, 0, now.saturating_sub(p.start_ns));
    0
}

#[inline(always)]
fn enter(ctx: &ProbeContext) {
    let c = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let k = cookie::kind(c);
    let pid_tgid = bpf_get_current_pid_tgid();
    let (pid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if unsafe { CUDA_GATE.get(&pid) }.is_some() {
        return;
    }
    // A uprobe fires in user mode at the function's first instruction: the context's registers
    // are the caller's user registers (`pt_regs` starts with what `Regs` names on both arches).
    // Copied with a helper (the verifier refuses loads through a ctx pointer the compiler
    // offset) into map memory: arm64's registers (272 bytes) do not fit the BPF stack beside
    // the rest.
    let Some(slot) = CUDA_REGS.get_ptr_mut(0) else { return };
    let buf = unsafe { core::slice::from_raw_parts_mut(slot.cast::<u8>(), core::mem::size_of::<Regs>()) };
    if unsafe { bpf_probe_read_kernel_buf(ctx.regs as *const u8, buf) }.is_err() {
        return;
    }
    let regs = unsafe { &*slot };
    let now = unsafe { bpf_ktime_get_boot_ns() };
    if inside_library(c, regs) {
        // Called by the library itself (`cuLaunchKernel` going through `cuLaunchKernelEx`):
        // the application's call was counted at its own entry.
        count(counter::CUDA_NESTED);
        return;
    }
    count(counter::CUDA_CALLS);
    let arg = cookie::arg(c) as usize;
    let bytes = match cookie::how(c) {
        // The caller sets the register: bounded (1 TiB a call), so no sum can overflow.
        cookie::BYTES_ARG => arch::arg(regs, arg).min(1 << 40),
        cookie::BYTES_2D => match arch::arg(regs, arg) {
            p if p != 0 => {
                let w = unsafe { bpf_probe_read_user((p + cookie::MEMCPY2D_WIDTH) as *const u64) }.unwrap_or(0);
                let h = unsafe { bpf_probe_read_user((p + cookie::MEMCPY2D_HEIGHT) as *const u64) }.unwrap_or(0);
                // Each bounded below 2^31 (a 2 GiB row): the product fits, and BPF has no 128-bit multiply.
                (w.min(1 << 31) * h.min(1 << 31)).min(1 << 40)
            }
            _ => 0,
        },
        _ => 0,
    };
    let f = match cookie::how(c) {
        cookie::GRAPH => func::GRAPH,
        cookie::FUNC_ARG => kernel(tid, arch::arg(regs, arg), arch::frame(regs).sp, now),
        _ => 0,
    };
    let (Some(call), Some(record)) = (CUDA_CALL.get_ptr_mut(0), CUDA_SCRATCH.get_ptr_mut(0)) else { return };
    unsafe { *call = Call { kind: k, _pad: 0, bytes, func: f } };
    let record = unsafe { &mut *record };
    let header = &mut record.header;
    header.ts_ns = now;
    header.cpu = unsafe { bpf_get_smp_processor_id() };
    header.pid = pid;
    header.tid = tid;
    header.flags = FLAG_USER_MODE;
    header.kernel_frames = 0;
    header.user_frames = 0;
    header.python_frames = 0;
    header.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    header.comm = bpf_get_current_comm().unwrap_or([0; 16]);
    if unwind::has_tables(pid) {
        // Does not return when the table walk took over.
        unwind::start_at::<Probes, _>(ctx, record, 0, regs);
    }
    let ret = unsafe {
        bpf_get_stack(
            ctx.as_ptr(),
            record.frames.as_mut_ptr().cast(),
            (MAX_USER_FRAMES * 8) as u32,
            BPF_F_USER_STACK as u64,
        )
    };
    let user = if ret < 0 { 0 } else { (ret as usize / 8).min(MAX_USER_FRAMES) };
    record.header.user_frames = user as u16;
    python::start::<Probes, _>(ctx, pid);
    end(record, user);
}

/// A driver launch's kernel: the stub of the runtime launch this thread is in, when the driver
/// was called from within it (deeper on the stack, its return address still in place, within
/// `RUNTIME_WITHIN_NS`), else the handle passed. The runtime's entry is taken either way: a
/// stale one (a runtime launch that failed before reaching the driver) names no later launch.
#[inline(always)]
fn kernel(tid: u32, handle: u64, sp: u64, now: u64) -> u64 {
    if let Some(r) = unsafe { CUDA_RUNTIME.get(&tid) }.copied() {
        let _ = CUDA_RUNTIME.remove(&tid);
        if sp < r.sp && now.wrapping_sub(r.ts_ns) < RUNTIME_WITHIN_NS && in_call(&r) {
            return func::STUB | (r.stub & func::ADDR);
        }
    }
    func::HANDLE | (handle & func::ADDR)
}

/// Whether the runtime's call is still on the stack: its return address still where its
/// entry found it (x86_64: at the entry's stack pointer; arm64 keeps it in a register, so only
/// the other checks apply there).
#[inline(always)]
fn in_call(r: &RuntimeLaunch) -> bool {
    #[cfg(bpf_target_arch = "x86_64")]
    {
        unsafe { bpf_probe_read_user(r.sp as *const u64) }.is_ok_and(|ra| ra == r.ra)
    }
    #[cfg(not(bpf_target_arch = "x86_64"))]
    {
        let _ = r;
        true
    }
}

/// Whether the probed function was called from its own library's code: at the entry the
/// return address is on top of the stack, and the cookie says where the function sits in its
/// executable segment, so the segment's bounds in this process follow from the address hit.
#[inline(always)]
fn inside_library(c: u64, regs: &Regs) -> bool {
    let size = cookie::segment(c);
    if size == 0 {
        return false;
    }
    let start = arch::frame(regs).ip.wrapping_sub(cookie::offset(c));
    match arch::return_address(regs) {
        // Within a few bytes of the bounds either way: `ip` may be past the breakpoint.
        Some(ra) => ra.wrapping_sub(start.wrapping_sub(16)) < size + 32,
        None => false,
    }
}

/// The walk is done: the stack goes into the generation's `CUDA_STACKS_*` (once), the call into the counters, or,
/// for a synchronisation, into `CUDA_PENDING` until it returns.
#[inline(always)]
fn end(record: &mut Record, user: usize) {
    let python = (record.header.python_frames as usize).min(MAX_PYTHON_FRAMES);
    let n = user.min(MAX_USER_FRAMES) + 2 * python;
    let (pid, tid) = (record.header.pid, record.header.tid);
    // FNV-1a over the words, seeded with the thread: 64 bits, so two stacks of one thread
    // sharing a hash (and so their counts) would take billions of distinct stacks.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ ((pid as u64) << 32 | tid as u64);
    for i in 0..RECORD_WORDS {
        if i >= n {
            break;
        }
        h = (h ^ record.frames[i]).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let generation = generation();
    let map = stacks(generation);
    if unsafe { map.get(&h) }.is_none() {
        // A new stack: within its owner's share of the generation (`OWNER_STACKS_MAX`), or
        // its counts go under `[stack lost]`, the owner's loss, not another's.
        let kept = match owner() {
            Some(o) if unsafe { (*o).stacks } < OWNER_STACKS_MAX => {
                map.insert(&h, &*record, 0).is_ok() && {
                    add32(unsafe { &raw mut (*o).stacks }, 1);
                    true
                }
            }
            _ => false,
        };
        if !kept {
            dropped();
        }
    }
    let Some(call) = CUDA_CALL.get_ptr_mut(0) else { return };
    let call = unsafe { *call };
    let now = unsafe { bpf_ktime_get_boot_ns() };
    if call.kind == kind::SYNC {
        let p = Pending { hash: h, start_ns: now, pid, generation };
        if CUDA_PENDING.insert(&tid, &p, 0).is_err() {
            count(counter::CUDA_DROPPED);
        }
        return;
    }
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let key = CudaKey { pid, tid, kind: call.kind, cpu, sec: second(now), _pad: 0, hash: h, func: call.func };
    add(&key, call.bytes, 0);
}

/// The second of boot time `now_ns` falls in, shifted onto wall-clock seconds (`CUDA_CLOCK`).
#[inline(always)]
fn second(now_ns: u64) -> u32 {
    let frac = CUDA_CLOCK.get(0).copied().unwrap_or(0);
    (now_ns.wrapping_add(frac) / 1_000_000_000) as u32
}

/// The generation the probes write (its low bit): userspace flips it before a drain.
#[inline(always)]
fn generation() -> u32 {
    CUDA_GEN.get(0).copied().unwrap_or(0) & 1
}

#[inline(always)]
fn stacks(generation: u32) -> &'static HashMap<u64, Record> {
    if generation == 1 { &CUDA_STACKS_1 } else { &CUDA_STACKS_0 }
}

/// One call more for `key` in the current generation's counts.
#[inline(always)]
fn add(key: &CudaKey, bytes: u64, ns: u64) {
    let map = if generation() == 1 { &CUDA_COUNTS_1 } else { &CUDA_COUNTS_0 };
    match map.get_ptr_mut(key) {
        Some(v) => {
            // One thread runs on one CPU at a time and the key holds the thread: no atomics.
            let v = unsafe { &mut *v };
            v.calls += 1;
            v.bytes += bytes;
            v.ns += ns;
        }
        None => {
            // A key that carries on into the next second (the same thread, stack and call a
            // second later) costs its owner no new share: a generation spans a second's turn,
            // and a flood that filled the share must not cut a thread's counts off there.
            let mut before = *key;
            before.sec = key.sec.wrapping_sub(1);
            let v = CudaCount { calls: 1, bytes, ns };
            if unsafe { map.get(&before) }.is_some() {
                if map.insert(key, &v, 0).is_err() {
                    dropped();
                }
                return;
            }
            // A new key: within its owner's share of the generation (`OWNER_KEYS_MAX`).
            let kept = match owner() {
                Some(o) if unsafe { (*o).keys } < OWNER_KEYS_MAX => {
                    map.insert(key, &v, 0).is_ok() && {
                        add32(unsafe { &raw mut (*o).keys }, 1);
                        true
                    }
                }
                _ => false,
            };
            if !kept {
                dropped();
            }
        }
    }
}

/// The calling user's entry in `CUDA_OWNERS` for the current generation, made if missing
/// (`None` when the map is full: more users than it holds).
#[inline(always)]
fn owner() -> Option<*mut OwnerUse> {
    let uid = bpf_get_current_uid_gid() as u32;
    let key = OwnerKey { uid, generation: generation() };
    if let Some(o) = CUDA_OWNERS.get_ptr_mut(&key) {
        return Some(o);
    }
    // BPF_NOEXIST: two CPUs making the entry at once keep the first.
    let _ = CUDA_OWNERS.insert(&key, &OwnerUse::default(), 1);
    CUDA_OWNERS.get_ptr_mut(&key)
}

/// A call not kept, counted for its owner (and in the global counter).
#[inline(always)]
fn dropped() {
    count(counter::CUDA_DROPPED);
    if let Some(o) = owner() {
        add64(unsafe { &raw mut (*o).dropped }, 1);
    }
}

/// Adds to an owner's figure. Not atomic (the BPF target has no atomics in `core`): threads
/// of one owner on several CPUs at once can lose an addition, so a share can be passed by a
/// few keys and a drop go uncounted, never more than the map's size.
#[inline(always)]
fn add32(p: *mut u32, v: u32) {
    unsafe { *p = (*p).wrapping_add(v) };
}

#[inline(always)]
fn add64(p: *mut u64, v: u64) {
    unsafe { *p = (*p).wrapping_add(v) };
}
