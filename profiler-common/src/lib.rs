//! The contract between the kernel sampler (`profiler-ebpf`) and userspace (`profiler-user`).
//!
//! A sample travels through the BPF ring buffer as one variable-length record: a fixed
//! [`SampleHeader`] followed by `kernel_frames` kernel addresses and then `user_frames` user
//! addresses (each a `u64`, leaf first, as the kernel's unwinder returns them), then `python_frames`
//! pairs of words (see [`python`]). The stacks are
//! copied into the record itself, never referenced through a stack-map id, so a record can not be
//! paired with a stack it did not have.
#![no_std]

pub mod cuda;
pub mod offcpu;
pub mod python;
#[cfg(feature = "test-skip")]
pub mod test_skip;
pub mod unwind;

/// Deepest kernel stack copied per sample (the kernel's default `perf_event_max_stack` is 127).
pub const MAX_KERNEL_FRAMES: usize = 127;
/// Deepest user stack copied per sample.
pub const MAX_USER_FRAMES: usize = 127;
/// Length of `task_struct::comm`.
pub const COMM_LEN: usize = 16;

/// The sample was taken while the CPU ran its idle task (pid 0); it carries no stacks.
pub const FLAG_IDLE: u32 = 1 << 0;
/// The CPU was in user mode, so no kernel stack was walked (it would be empty).
pub const FLAG_USER_MODE: u32 = 1 << 1;
/// The kernel stack could not be captured.
pub const FLAG_KERNEL_STACK_ERROR: u32 = 1 << 2;
/// The user stack could not be captured.
pub const FLAG_USER_STACK_ERROR: u32 = 1 << 3;
/// Bits of `flags` that name the softirq the sample interrupted, as its vector plus one (0: none,
/// the sample ran in task context). See [`softirq_of`].
pub const FLAG_SOFTIRQ_MASK: u32 = 0xF << FLAG_SOFTIRQ_SHIFT;
/// Position of [`FLAG_SOFTIRQ_MASK`] in `flags`.
pub const FLAG_SOFTIRQ_SHIFT: u32 = 8;
/// Softirq vectors the kernel has (`NR_SOFTIRQS`), named as its `softirq_to_name` names them
/// (`include/linux/interrupt.h`; the same in every kernel since 4.x).
pub const SOFTIRQ_NAMES: [&str; 10] =
    ["HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU"];

/// The softirq vector a sample with these flags interrupted, or `None` for task context.
#[inline(always)]
pub fn softirq_of(flags: u32) -> Option<u32> {
    match (flags & FLAG_SOFTIRQ_MASK) >> FLAG_SOFTIRQ_SHIFT {
        0 => None,
        v => Some(v - 1),
    }
}

/// Slots of the per-CPU counters: `COUNTERS` holds one `[u64; counter::COUNT]` per CPU, so
/// userspace reads them all with one syscall.
pub mod counter {
    /// Samples the program saw (sent or not).
    pub const SEEN: usize = 0;
    /// Samples dropped because the ring buffer was full.
    pub const RINGBUF_FULL: usize = 1;
    /// Samples sent whose kernel stack could not be captured.
    pub const KERNEL_STACK_ERROR: usize = 2;
    /// Samples sent whose user stack could not be captured.
    pub const USER_STACK_ERROR: usize = 3;
    /// Most bytes seen waiting in the ring buffer during the maxima epoch in [`EPOCH`].
    pub const RING_USED_MAX: usize = 4;
    /// The `MAXIMA_EPOCH` value the maxima here belong to (see [`super::MAXIMA_EPOCH`]).
    pub const EPOCH: usize = 5;
    /// Samples whose user stack was walked with unwind tables.
    pub const UNWIND_TABLES: usize = 6;
    /// Unused since the ends are counted by reason (`UNWIND_ENDS`): userspace sums those that
    /// stopped before the outermost frame. Kept so that the other slots keep their numbers.
    pub const UNWIND_STOPPED: usize = 7;
    /// Event records (exec, fork, exit, cgroup) dropped because the `EVENTS` ring was full.
    pub const EVENTS_LOST: usize = 8;
    /// CUDA driver calls the probes counted (`cuda`).
    pub const CUDA_CALLS: usize = 9;
    /// Launch-probe hits inside a launch already counted (one launch through two functions).
    pub const CUDA_NESTED: usize = 10;
    /// CUDA calls or stacks not kept: a map was full.
    pub const CUDA_DROPPED: usize = 11;
    /// How table walks ended: `UNWIND_ENDS + reason` ([`crate::unwind::end`]), eight slots so
    /// that the program indexes them with a mask, not a branch per reason.
    pub const UNWIND_ENDS: usize = 12;
    pub const UNWIND_END_SLOTS: usize = 8;
    /// Return addresses the stack scan found (frames no rule could give), after `UNWIND_ENDS`.
    pub const UNWIND_SCANNED: usize = UNWIND_ENDS + UNWIND_END_SLOTS;
    /// Number of slots.
    pub const COUNT: usize = UNWIND_SCANNED + 1;
}

/// How maxima ("the longest wait since the last read") are reset without a racy write of the
/// whole per-CPU value, which would also wipe counters the kernel bumped meanwhile: userspace
/// bumps the one-entry array named here after each read; the kernel, before raising a
/// maximum, zeroes the maxima of a value whose `EPOCH` slot is older and stamps it. A value read
/// with an older stamp had no maximum in the epoch just ended.
pub const MAXIMA_EPOCH: &str = "MAXIMA_EPOCH";

/// Fixed part of a ring-buffer record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleHeader {
    /// `bpf_ktime_get_boot_ns()` at the sample (CLOCK_BOOTTIME).
    pub ts_ns: u64,
    /// cgroup v2 id of the sampled task.
    pub cgroup_id: u64,
    /// Process id (tgid); 0 for the idle task.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// CPU the sample was taken on.
    pub cpu: u32,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// Number of kernel addresses that follow the header.
    pub kernel_frames: u16,
    /// Number of user addresses that follow the kernel addresses.
    pub user_frames: u16,
    /// Number of Python frames (two words each, see `python`) after the user addresses.
    pub python_frames: u16,
    pub _pad: u16,
    /// The task's comm, NUL-padded.
    pub comm: [u8; COMM_LEN],
}

/// Size of the header in bytes.
pub const HEADER_LEN: usize = core::mem::size_of::<SampleHeader>();

/// Words of room after a record's header: both stacks, or a user stack and its Python pairs.
pub const RECORD_WORDS: usize = 384;
const _: () = assert!(MAX_KERNEL_FRAMES + MAX_USER_FRAMES <= RECORD_WORDS);

/// A whole record as the kernel builds it; the ring carries only its used prefix, a CUDA stack
/// (`cuda`) is kept whole in a map.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Record {
    pub header: SampleHeader,
    pub frames: [u64; RECORD_WORDS],
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for Record {}

#[cfg(feature = "user")]
unsafe impl aya::Pod for SampleHeader {}

/// Kinds of [`EventHeader`] records in the `EVENTS` ring buffer.
pub mod event {
    pub const CGROUP_MKDIR: u32 = 1;
    pub const CGROUP_RMDIR: u32 = 2;
    pub const CGROUP_RELEASE: u32 = 3;
    /// A process exec'd (`sched:sched_process_exec`): its mappings can be read now.
    pub const PROCESS_EXEC: u32 = 4;
    /// A new process (`task:task_newtask` without `CLONE_THREAD`): the header is the parent,
    /// the child's pid is in the record (`pid` field). A pid seen from then on is this child.
    pub const PROCESS_FORK: u32 = 5;
    /// A process ended (`sched:sched_process_exit` of its last thread, or of its leader on a
    /// kernel whose record has no `group_dead`): the header is the exiting task.
    pub const PROCESS_EXIT: u32 = 6;
}

/// Bytes of a tracepoint's raw record copied after an [`EventHeader`]; userspace decodes them
/// with the offsets in the tracepoint's `format` file.
pub const EVENT_DATA_LEN: usize = 192;

/// Bytes of the record copied for a process fork or exit: the fields read (the child's pid,
/// the clone flags, `group_dead`) lie in the first 40 on 6.x kernels. A short record is 2.5x
/// less of the ring than a cgroup event's, and processes come and go far more often.
pub const PROCESS_DATA_LEN: usize = 64;

/// A kernel event (cgroup life cycle) with the task that caused it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventHeader {
    pub kind: u32,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    /// `bpf_ktime_get_boot_ns()`.
    pub ts_ns: u64,
    pub comm: [u8; COMM_LEN],
}

pub const EVENT_HEADER_LEN: usize = core::mem::size_of::<EventHeader>();

#[cfg(feature = "user")]
unsafe impl aya::Pod for EventHeader {}

/// `NET_RX_SOFTIRQ` in the kernel's softirq vector numbering.
pub const NET_RX_VEC: u32 = 3;
/// Sub-buckets per power of two of the NET_RX latency histogram (log2 of it): with 8, a
/// bucket's upper edge overstates a wait by at most 12.5 % (whole powers of two overstated a
/// 4.2 ms p99 as 8.4 ms, over a 5 ms threshold).
pub const LATENCY_SUB_BITS: u32 = 3;
/// Buckets of the NET_RX raise→entry latency histogram: for `2^e` ns and up, bucket
/// `e * 8 + m` holds `[2^e + m * 2^(e-3), 2^e + (m+1) * 2^(e-3))` ([`latency_bucket`]).
pub const LATENCY_BUCKETS: u32 = 36 << LATENCY_SUB_BITS;

/// The histogram bucket of a wait of `ns` (the same on both sides).
#[inline(always)]
pub fn latency_bucket(ns: u64) -> u32 {
    let ns = if ns == 0 { 1 } else { ns };
    let e = 63 - ns.leading_zeros();
    let m =
        if e >= LATENCY_SUB_BITS { ((ns >> (e - LATENCY_SUB_BITS)) & ((1 << LATENCY_SUB_BITS) - 1)) as u32 } else { 0 };
    let b = (e << LATENCY_SUB_BITS) + m;
    if b < LATENCY_BUCKETS { b } else { LATENCY_BUCKETS - 1 }
}

/// The upper edge (exclusive, ns) of histogram bucket `b`.
pub fn latency_bucket_end(b: u32) -> u64 {
    let (e, m) = (b >> LATENCY_SUB_BITS, (b & ((1 << LATENCY_SUB_BITS) - 1)) as u64);
    if e < LATENCY_SUB_BITS {
        return 1u64 << (e + 1);
    }
    (1u64 << e) + (m + 1) * (1u64 << (e - LATENCY_SUB_BITS))
}

/// Per-CPU NET_RX statistics: `NETRX` holds one `[u64; netrx::LEN]` per CPU, cumulative
/// counters and maxima (reset per epoch, see [`MAXIMA_EPOCH`]) at these slots.
pub mod netrx {
    /// NET_RX raises that started a wait (not counting raises while already pending).
    pub const RAISES: usize = 0;
    /// NET_RX softirq runs that ended a wait.
    pub const ENTRIES: usize = 1;
    /// Longest raise→entry wait in the epoch, ns.
    pub const LATENCY_MAX: usize = 2;
    /// NAPI polls.
    pub const POLLS: usize = 3;
    /// Longest time between two NAPI polls on a CPU with work pending across it (the first
    /// used its whole budget, or the second found a full budget waiting) in the epoch, ns.
    pub const POLL_GAP_MAX: usize = 4;
    /// The epoch the maxima belong to.
    pub const EPOCH: usize = 5;
    /// First histogram bucket; `LATENCY_BUCKETS` follow.
    pub const HISTOGRAM: usize = 8;
    /// Slots in the value.
    pub const LEN: usize = HISTOGRAM + super::LATENCY_BUCKETS as usize;
}

/// Per-CPU run-queue waits (`profiler-ebpf/src/runq.rs`): `RUNQ` holds one `[u64; runq::LEN]`
/// per CPU, the CPU a thread finally ran on after waiting runnable; cumulative counters, and
/// the longest wait of the epoch (see [`MAXIMA_EPOCH`]) with who waited and what the CPU ran
/// just before.
pub mod runq {
    /// Waits that ended (a runnable thread got the CPU).
    pub const WAITS: usize = 0;
    /// Longest wait in the epoch, ns.
    pub const WAIT_MAX: usize = 1;
    /// The epoch the maxima belong to.
    pub const EPOCH: usize = 2;
    /// The longest waiter: its thread id.
    pub const WAITER_TID: usize = 3;
    /// Its comm, 16 bytes.
    pub const WAITER_COMM: usize = 4;
    /// The thread the CPU switched from to run it, and that thread's comm (16 bytes).
    pub const BEFORE_TID: usize = 6;
    pub const BEFORE_COMM: usize = 7;
    /// First histogram bucket (`latency_bucket` of the wait); `LATENCY_BUCKETS` follow.
    pub const HISTOGRAM: usize = 10;
    /// Slots in the value.
    pub const LEN: usize = HISTOGRAM + super::LATENCY_BUCKETS as usize;
    /// A `prev_state` of `sched_switch` with none of these bits set is a thread still runnable
    /// (0, "R") or preempted (`TASK_REPORT_MAX`, "R+"): it waits from then on.
    pub const SLEEP_STATE_MASK: u64 = 0xff;
}

/// Per-CPU reclaim and compaction stalls (`profiler-ebpf/src/reclaim.rs`): `RECLAIM` holds one
/// `[u64; reclaim::LEN]` per CPU (the CPU the stall ended on): per kind a count and the time
/// stalled, cumulative; a histogram of stall durations (all kinds); and the longest stall of
/// the epoch (see [`MAXIMA_EPOCH`]) with its kind, thread, comm and memory cgroup.
pub mod reclaim {
    /// Kinds of stall: direct reclaim (the zone is short), memory-cgroup reclaim (the cgroup is
    /// at its limit), compaction.
    pub const DIRECT: usize = 0;
    pub const MEMCG: usize = 1;
    pub const COMPACT: usize = 2;
    pub const KINDS: usize = 3;
    /// Stalls of kind `k` at `COUNT + k`, their ns at `NS + k`.
    pub const COUNT: usize = 0;
    pub const NS: usize = 3;
    pub const EPOCH: usize = 6;
    /// The longest stall of the epoch: ns, kind, `pid_tgid`, comm (16 bytes).
    pub const MAX_NS: usize = 7;
    pub const MAX_KIND: usize = 8;
    pub const MAX_PID_TGID: usize = 9;
    pub const MAX_COMM: usize = 10;
    /// The id of the memory cgroup the longest stall's task was in (its cgroupfs directory's
    /// inode number; 0: unknown), read by the kernel at the stall: the task may be gone by the
    /// time userspace could read its /proc/PID/cgroup.
    pub const MAX_MEMCG: usize = 12;
    /// First histogram bucket (`latency_bucket` of a stall's duration); `LATENCY_BUCKETS`
    /// follow. The sum says how long stalls took; a p99 says how long one allocation can hang.
    pub const HISTOGRAM: usize = 13;
    /// Slots in the value.
    pub const LEN: usize = HISTOGRAM + super::LATENCY_BUCKETS as usize;
}
