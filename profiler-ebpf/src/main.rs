//! The kernel half of the profiler: one `perf_event` program, attached to the software
//! cpu-clock event of every CPU, that turns each tick into a ring-buffer record.
//!
//! Why the stacks are copied into the record instead of kept in a stack-trace map: a
//! `BPF_MAP_TYPE_STACK_TRACE` map hands out ids, and with `BPF_F_REUSE_STACKID` a bucket is
//! overwritten by the next stack that hashes to it. Userspace reads the id later, so it can
//! look up a stack that replaced the one the sample had, and nothing tells it so. Here
//! `bpf_get_stack` writes the addresses straight into this sample's own record (via a per-CPU
//! scratch buffer), which travels through the ring buffer as one unit: a sample can only ever be
//! paired with the stack it was taken with. The cost is bytes in the ring (8 per frame), which
//! userspace drains continuously.
#![no_std]
#![no_main]

mod arch;
mod cgroup;
mod context;
mod cuda;
mod exec;
mod lifecycle;
mod netrx;
mod offcpu;
mod python;
mod reclaim;
mod runq;
mod sink;
mod unwind;

use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_USER_STACK, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid,
        generated::{bpf_get_current_cgroup_id, bpf_get_smp_processor_id, bpf_get_stack, bpf_ktime_get_boot_ns},
    },
    macros::{map, perf_event},
    maps::{Array, PerCpuArray, ProgramArray, RingBuf},
    programs::PerfEventContext,
};
use profiler_common::{
    FLAG_IDLE, FLAG_KERNEL_STACK_ERROR, FLAG_SOFTIRQ_SHIFT, FLAG_USER_MODE, FLAG_USER_STACK_ERROR, HEADER_LEN,
    MAX_KERNEL_FRAMES, MAX_USER_FRAMES, counter,
};

/// Room for both stacks; the user stack starts right after the kernel one.
pub(crate) use profiler_common::{RECORD_WORDS as FRAME_SLOTS, Record};

/// Tail-call slots: the table unwinder, the Python frame reader and the stack scan
/// (`profiler_common::unwind::UNWIND_PROGRAM`, `profiler_common::python::PYTHON_PROGRAM`,
/// `profiler_common::unwind::SCAN_PROGRAM`).
#[map]
pub(crate) static PROGRAMS: ProgramArray = ProgramArray::with_max_entries(3, 0);

/// Default size; userspace sets the real one at load time (`--ring-buffer-kib`).
#[map]
static SAMPLES: RingBuf = RingBuf::with_byte_size(4 * 1024 * 1024, 0);

/// Per-CPU counters, one value per CPU with slots named in `profiler_common::counter`: one
/// value so that userspace reads them all with one syscall.
#[map]
static COUNTERS: PerCpuArray<[u64; counter::COUNT]> = PerCpuArray::with_max_entries(1, 0);

/// The current maxima epoch, bumped by userspace after each read (`profiler_common::MAXIMA_EPOCH`).
#[map]
static MAXIMA_EPOCH: Array<u64> = Array::with_max_entries(1, 0);

/// Raises `values[slot]` to `value`, first zeroing `maxima` if they belong to an older epoch
/// than the current one (userspace has read them since).
#[inline(always)]
pub(crate) fn raise_max(values: &mut [u64], epoch_slot: usize, maxima: &[usize], slot: usize, value: u64) {
    let epoch = MAXIMA_EPOCH.get(0).copied().unwrap_or(0);
    if let Some(stamp) = values.get_mut(epoch_slot)
        && *stamp != epoch
    {
        *stamp = epoch;
        for &m in maxima {
            if let Some(v) = values.get_mut(m) {
                *v = 0;
            }
        }
    }
    if let Some(v) = values.get_mut(slot)
        && value > *v
    {
        *v = value;
    }
}

/// A record is built here (too big for the 512-byte BPF stack), then copied to the ring with
/// its real length, so a shallow stack costs a shallow record.
#[map]
pub(crate) static SCRATCH: PerCpuArray<Record> = PerCpuArray::with_max_entries(1, 0);

/// Wake the reader only once this many bytes wait in the ring (0: on every record). Userspace
/// also drains on a timer, so samples never wait longer than its flush tick; this keeps the
/// per-sample cost of a wakeup (an irq_work and a context switch) off the hot path.
#[unsafe(no_mangle)]
static WAKEUP_BYTES: u64 = 0;

#[perf_event]
pub fn sample(ctx: PerfEventContext) -> u32 {
    try_sample(&ctx);
    0
}

/// The sampler's walks: built in `SCRATCH`, sent to the ring.
pub(crate) struct Sampler;

impl sink::Sink for Sampler {
    #[inline(always)]
    fn record() -> Option<*mut Record> {
        SCRATCH.get_ptr_mut(0)
    }
    #[inline(always)]
    fn state() -> Option<*mut profiler_common::unwind::State> {
        unwind::UNWIND_STATE.get_ptr_mut(0)
    }
    #[inline(always)]
    fn tail_call<C: EbpfContext>(ctx: &C, slot: u32) {
        let _ = unsafe { PROGRAMS.tail_call(ctx, slot) };
    }
    #[inline(always)]
    fn finish(record: &mut Record, kernel: usize, user: usize) {
        emit(record, kernel, user);
    }
}

#[inline(always)]
pub(crate) fn count(slot: usize) {
    if let Some(values) = COUNTERS.get_ptr_mut(0) {
        // Per-CPU value, and a perf_event program does not nest on its CPU: a plain add is safe.
        unsafe { (*values)[slot] += 1 };
    }
}

#[inline(always)]
fn try_sample(ctx: &PerfEventContext) {
    count(counter::SEEN);
    let Some(record) = SCRATCH.get_ptr_mut(0) else {
        return;
    };
    let record = unsafe { &mut *record };
    let pid_tgid = bpf_get_current_pid_tgid();
    let header = &mut record.header;
    header.ts_ns = unsafe { bpf_ktime_get_boot_ns() };
    header.cpu = unsafe { bpf_get_smp_processor_id() };
    header.pid = (pid_tgid >> 32) as u32;
    header.tid = pid_tgid as u32;
    header.kernel_frames = 0;
    header.user_frames = 0;
    header.python_frames = 0;

    // A softirq interrupted (see `context`): on the idle task that is work, not idleness (NET_RX
    // on an otherwise idle NIC-queue core), so it takes the busy path below, kernel stack only.
    let softirq = context::softirq_now();
    header.flags = softirq << FLAG_SOFTIRQ_SHIFT;
    if header.tid == 0 && softirq == 0 {
        // The idle task: only its existence matters (per-CPU utilisation), not its stack.
        header.flags = FLAG_IDLE;
        header.cgroup_id = 0;
        header.comm = [0; 16];
    } else {
        header.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
        header.comm = bpf_get_current_comm().unwrap_or([0; 16]);
        // In user mode the kernel stack is empty and walking it would only cost time.
        let user_mode = arch::user_mode(unsafe { &(*ctx.ctx).regs });
        let frames = record.frames.as_mut_ptr();
        let mut kernel = 0usize;
        if user_mode {
            header.flags |= FLAG_USER_MODE;
        } else {
            let ret =
                unsafe { bpf_get_stack(ctx.as_ptr(), frames.cast::<c_void>(), (MAX_KERNEL_FRAMES * 8) as u32, 0) };
            if ret < 0 {
                header.flags |= FLAG_KERNEL_STACK_ERROR;
                count(counter::KERNEL_STACK_ERROR);
            } else {
                kernel = (ret as usize / 8).min(MAX_KERNEL_FRAMES);
            }
        }
        if header.tid == 0 {
            // A softirq on the idle task: no user stack, no process to unwind.
            header.kernel_frames = kernel as u16;
            emit(record, kernel, 0);
            return;
        }
        // Tables for this process: the unwinder takes over (and sends the record) from here.
        unwind::start(ctx, record, kernel, user_mode);
        let frames = record.frames.as_mut_ptr();
        let ret = unsafe {
            bpf_get_stack(
                ctx.as_ptr(),
                frames.add(kernel).cast::<c_void>(),
                (MAX_USER_FRAMES * 8) as u32,
                BPF_F_USER_STACK as u64,
            )
        };
        let header = &mut record.header;
        let mut user = 0usize;
        if ret < 0 {
            // Kernel threads have no user stack and get 0 here, not an error.
            header.flags |= FLAG_USER_STACK_ERROR;
            count(counter::USER_STACK_ERROR);
        } else {
            user = (ret as usize / 8).min(MAX_USER_FRAMES);
        }
        header.kernel_frames = kernel as u16;
        header.user_frames = user as u16;
        let pid = header.pid;
        python::start::<Sampler, _>(ctx, pid);
        emit(record, kernel, user);
        return;
    }
    emit(record, 0, 0);
}

/// Sends the record with `kernel` + `user` frames to the ring.
#[inline(always)]
pub(crate) fn emit(record: &mut Record, kernel: usize, user: usize) {
    let python = (record.header.python_frames as usize).min(profiler_common::python::MAX_PYTHON_FRAMES);
    let len = HEADER_LEN + (kernel.min(MAX_KERNEL_FRAMES) + user.min(MAX_USER_FRAMES) + 2 * python) * 8;
    let threshold = unsafe { core::ptr::read_volatile(&WAKEUP_BYTES) };
    let used = SAMPLES.query(BPF_RB_AVAIL_DATA as u64) + len as u64;
    if let Some(values) = COUNTERS.get_ptr_mut(0) {
        // A high-water mark for /metrics: how close the ring came to dropping samples.
        raise_max(unsafe { &mut *values }, counter::EPOCH, &[counter::RING_USED_MAX], counter::RING_USED_MAX, used);
    }
    let flags = if threshold == 0 {
        0
    } else if used >= threshold {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    // `len` is bounded by the two `min`s above, which is what lets the verifier accept a
    // variable-length copy out of the scratch map.
    let bytes = unsafe { core::slice::from_raw_parts((record as *const Record).cast::<u8>(), len) };
    if SAMPLES.output::<[u8]>(bytes, flags as u64).is_err() {
        count(counter::RINGBUF_FULL);
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
