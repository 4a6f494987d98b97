//! The contract between the kernel sampler (`profiler-ebpf`) and userspace (`profiler-user`).
//!
//! A sample travels through the BPF ring buffer as one variable-length record: a fixed
//! [`SampleHeader`] followed by `kernel_frames` kernel addresses and then `user_frames` user
//! addresses (each a `u64`, leaf first, as the kernel's unwinder returns them). The stacks are
//! copied into the record itself, never referenced through a stack-map id, so a record can not be
//! paired with a stack it did not have.
#![no_std]

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

/// Index of each per-CPU counter in the `COUNTERS` map.
pub mod counter {
    /// Samples the program saw (sent or not).
    pub const SEEN: u32 = 0;
    /// Samples dropped because the ring buffer was full.
    pub const RINGBUF_FULL: u32 = 1;
    /// Samples sent whose kernel stack could not be captured.
    pub const KERNEL_STACK_ERROR: u32 = 2;
    /// Samples sent whose user stack could not be captured.
    pub const USER_STACK_ERROR: u32 = 3;
    /// Most bytes seen waiting in the ring buffer since userspace last reset it.
    pub const RING_USED_MAX: u32 = 4;
    /// Number of counters.
    pub const COUNT: u32 = 5;
}

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
    pub _pad: u32,
    /// The task's comm, NUL-padded.
    pub comm: [u8; COMM_LEN],
}

/// Size of the header in bytes.
pub const HEADER_LEN: usize = core::mem::size_of::<SampleHeader>();

#[cfg(feature = "user")]
unsafe impl aya::Pod for SampleHeader {}

/// Kinds of [`EventHeader`] records in the `EVENTS` ring buffer.
pub mod event {
    pub const CGROUP_MKDIR: u32 = 1;
    pub const CGROUP_RMDIR: u32 = 2;
    pub const CGROUP_RELEASE: u32 = 3;
    /// A process exec'd (`sched:sched_process_exec`): its mappings can be read now.
    pub const PROCESS_EXEC: u32 = 4;
}

/// Bytes of a tracepoint's raw record copied after an [`EventHeader`]; userspace decodes them
/// with the offsets in the tracepoint's `format` file.
pub const EVENT_DATA_LEN: usize = 192;

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
/// Log2 buckets of the NET_RX raise→entry latency histogram (bucket `i`: `[2^i, 2^(i+1))` ns).
pub const LATENCY_BUCKETS: u32 = 36;

/// Per-CPU NET_RX statistics in the `NETRX` array: cumulative counters at these indexes, and
/// maxima that userspace resets after reading.
pub mod netrx {
    /// NET_RX raises that started a wait (not counting raises while already pending).
    pub const RAISES: u32 = 0;
    /// NET_RX softirq runs that ended a wait.
    pub const ENTRIES: u32 = 1;
    /// Longest raise→entry wait since userspace last reset it, ns.
    pub const LATENCY_MAX: u32 = 2;
    /// NAPI polls.
    pub const POLLS: u32 = 3;
    /// Longest time between two NAPI polls on a CPU with work pending across it (the first
    /// used its whole budget, or the second found a full budget waiting), since the last
    /// reset, ns.
    pub const POLL_GAP_MAX: u32 = 4;
    /// First histogram bucket; `LATENCY_BUCKETS` follow.
    pub const HISTOGRAM: u32 = 8;
    /// Entries in the array.
    pub const LEN: u32 = HISTOGRAM + super::LATENCY_BUCKETS;
}
