//! Off-CPU time per stack (`profiler-ebpf/src/offcpu.rs`): a `sched_switch` program notes when
//! each thread leaves its CPU and in which state, and when it comes back after at least
//! `OFFCPU_THRESHOLD_NS` adds the time it was off to a per-(thread, stack, state, second) count
//! in the kernel, so a wait costs no ring-buffer record.
//!
//! A stack walk (kernel, user with the sampler's unwinder, Python) costs microseconds and a
//! context switch happens hundreds of thousands of times a second on a busy node, so the walk
//! is not done at every switch-out: a thread is *armed* by a wait at least the threshold long,
//! and an armed thread's stack is walked when it leaves its CPU (the stack it waits in), within a
//! per-CPU budget of walks a second; [`ARMED_SHORT_WAITS`] short waits in a row after walks
//! disarm it. The first long wait of a thread after a run of short ones is counted without its
//! stack (hash 0).
//!
//! These maps carry the counts to userspace:
//! - `OFFCPU_COUNTS_0` / `OFFCPU_COUNTS_1`: [`OffCount`] by [`OffKey`], double-buffered by
//!   `OFFCPU_GEN` as the CUDA counts are (`crate::cuda`);
//! - `OFFCPU_STACKS_0` / `OFFCPU_STACKS_1` (by [`OffKey::hash`], double-buffered with the
//!   counts): each walked stack, a [`crate::Record`] (header, kernel addresses, user addresses,
//!   Python pairs), read by the sampler's parser;
//! - `OFFCPU_STATS` (per CPU, `[u64; stat::LEN]`): the rate limit's state and what was dropped.
//! - `OFFCPU_CLOCK`: as `CUDA_CLOCK`, the boot-to-wall offset's fraction of a second.

/// The state a thread left its CPU in (from `prev_state`).
pub mod state {
    /// Still runnable: preempted or yielding; it waited for a CPU.
    pub const RUNNABLE: u32 = 0;
    /// `TASK_INTERRUPTIBLE`: sleeping until woken (futex, poll, pipe or socket read, nanosleep).
    pub const SLEEP: u32 = 1;
    /// `TASK_UNINTERRUPTIBLE` (D state): disk or network file system I/O, or a kernel lock.
    pub const IO: u32 = 2;
    pub const COUNT: usize = 3;
    /// `TASK_INTERRUPTIBLE`.
    pub const TASK_INTERRUPTIBLE: u64 = 0x1;
    /// `TASK_UNINTERRUPTIBLE`.
    pub const TASK_UNINTERRUPTIBLE: u64 = 0x2;
    /// `TASK_NOLOAD`: with `TASK_UNINTERRUPTIBLE`, `TASK_IDLE`, a kernel thread with nothing to
    /// do (not a wait anyone waits on): not counted.
    pub const TASK_NOLOAD: u64 = 0x400;

    /// The state recorded for a `prev_state`; `None` for an idle kernel thread.
    #[inline(always)]
    pub fn of(prev_state: u64) -> Option<u32> {
        if prev_state & TASK_NOLOAD != 0 {
            None
        } else if prev_state & TASK_UNINTERRUPTIBLE != 0 {
            Some(IO)
        } else if prev_state & TASK_INTERRUPTIBLE != 0 {
            Some(SLEEP)
        } else if prev_state & 0xff == 0 {
            Some(RUNNABLE)
        } else {
            // Stopped, traced, dead: not a wait.
            None
        }
    }
}

/// Slots of `OFFCPU_STATS` (per CPU).
pub mod stat {
    /// The second (boot time) the two budgets below count in.
    pub const SECOND: usize = 0;
    /// Waits recorded on this CPU in that second (the rate limit's count).
    pub const RECORDED: usize = 1;
    /// Stacks walked on this CPU in that second.
    pub const WALKS: usize = 2;
    /// Waits at least the threshold long, ever.
    pub const LONG_WAITS: usize = 3;
    /// Waits above the rate limit left out by the sampling (their time is in the kept ones').
    pub const SAMPLED_OUT: usize = 4;
    /// Armed switch-outs not walked: the walk budget was spent.
    pub const WALKS_SKIPPED: usize = 5;
    /// Waits whose count did not fit the counts map.
    pub const DROPPED: usize = 6;
    /// Stacks walked, ever.
    pub const WALKED: usize = 7;
    /// Switch-outs seen, ever.
    pub const SWITCHES: usize = 8;
    /// Armed switch-outs from the place of the thread's last walk: its stack taken unwalked.
    pub const REUSED: usize = 9;
    pub const LEN: usize = 10;
}

/// Per thread, stack, state and second: a thread runs on one CPU at a time, so the kernel adds
/// to an entry without atomics.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OffKey {
    pub pid: u32,
    pub tid: u32,
    /// One of [`state`].
    pub state: u32,
    /// The wall-clock second (less a whole offset, as [`crate::cuda::CudaKey::sec`]) the time
    /// was spent in: a wait over several seconds is split over them.
    pub sec: u32,
    /// Of the stack's words and pid (the key of `OFFCPU_STACKS`); 0: not walked.
    pub hash: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCount {
    /// Nanoseconds off CPU, already multiplied by the sampling's weight.
    pub ns: u64,
    /// Waits (each counted once, in the second it ended in), weighted too.
    pub waits: u64,
}

/// A thread as the program knows it, by thread id (`OFFCPU_SINCE`): whether it is off its CPU
/// now and since when, whether it is armed, and the places its last walks started from. One
/// entry a thread, updated in place at each switch (a hash map's insert and delete at every
/// switch were most of the program's cost).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Off {
    /// When it left its CPU; 0: on a CPU (or not seen leaving).
    pub start_ns: u64,
    /// This wait's stack hash (0: not walked).
    pub hash: u64,
    pub pid: u32,
    /// One of [`state`].
    pub state: u32,
    /// Short waits left before it is disarmed; 0: not armed.
    pub left: u32,
    /// [`flag`]s.
    pub flags: u32,
    /// Where its last two walks started, each with its stack's hash: a thread leaving its CPU
    /// again from one of them (a loop blocking in one or two calls: a read and a sleep, a poll
    /// and a read) takes the hash without a walk, outside the walk budget.
    pub places: [Place; 2],
}

/// Where a walk started (user instruction and stack pointers) and its stack's hash.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Place {
    pub ip: u64,
    pub sp: u64,
    /// 0: no walk finished from here yet.
    pub hash: u64,
}

/// Bits of [`Off::flags`].
pub mod flag {
    /// It left its CPU armed (its short wait counts against [`super::ARMED_SHORT_WAITS`]).
    pub const LEFT_ARMED: u32 = 1;
    /// Its last long wait was armed but not walked (the budget was spent): its next blocking
    /// switch-out may walk from the reserve ([`super::WALK_RESERVE`]).
    pub const STARVED: u32 = 2;
    /// `places[1]` is the newer (a walk replaces the older).
    pub const NEWER_1: u32 = 4;
    /// `places[i]` was walked before its process had unwind tables (frame pointers only): walked
    /// again once it has them, budget permitting.
    pub const NO_TABLES_0: u32 = 8;
    pub const NO_TABLES_1: u32 = 16;
    /// The walk under way ends in `places[1]`.
    pub const WALKING_1: u32 = 32;
}

/// Waits recorded a second on one CPU before sampling starts; above it one in
/// [`SAMPLE_EVERY`] is kept, its time multiplied by that.
pub const RATE_LIMIT: u64 = 1000;
pub const SAMPLE_EVERY: u64 = 8;
/// Stacks walked a second on one CPU, at most (armed threads' switch-outs). Preempted
/// switch-outs (a CPU-bound thread's random places) may take only half of it.
pub const WALK_LIMIT: u64 = 200;
/// Walks a second on one CPU past [`WALK_LIMIT`], in percent of it, for blocking switch-outs of
/// threads whose last long wait went unwalked (a thread that started blocking somewhere new
/// on a machine whose budget others spend early each second).
pub const WALK_RESERVE: u64 = 50;
/// A wait is split over at most this many seconds (its last ones): a thread asleep for an hour
/// is credited its last [`MAX_SECONDS`] seconds at its wakeup.
pub const MAX_SECONDS: u32 = 8;
/// Default threshold: waits shorter than this are not counted.
pub const DEFAULT_THRESHOLD_NS: u64 = 1_000_000;

/// Threads tracked at once (LRU: a thread that exited takes no entry for long).
pub const OFFCPU_SINCE_MAX: u32 = 8192;
/// Short waits after walks, in a row, that disarm a thread (a thread that blocks long now and
/// then and is preempted in between stays armed).
pub const ARMED_SHORT_WAITS: u32 = 16;
/// Distinct stacks a generation (a drain's interval) holds, each map (3.1 KiB each: 1.6 MiB): the walk budget
/// ([`WALK_LIMIT`] a CPU) fills it in a drain on 2-3 CPUs; past it a wait is counted without its
/// stack (`[stack not walked]`), and reused stacks take no room.
pub const OFFCPU_STACKS_MAX: u32 = 512;
/// Keys a generation (a drain's interval) holds, each map.
pub const OFFCPU_COUNTS_MAX: u32 = 2048;

#[cfg(feature = "user")]
unsafe impl aya::Pod for OffKey {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for OffCount {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for Off {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for Place {}
