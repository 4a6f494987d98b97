//! Process fork and exit, sent through the `EVENTS` ring like exec: with them the daemon knows
//! when a pid stops being one process and starts being another (pids are reused, and a child
//! that forks without exec has the same comm and executable as the process it may replace).
//!
//! Both fire for threads too, which can be thousands a second (thread pools, a build's
//! linkers): only process creations and process ends are sent.

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext};
use profiler_common::event;

/// `CLONE_THREAD`: a new thread in the parent's process, not a new process.
const CLONE_THREAD: u64 = 0x0001_0000;

/// Offsets into the records, from the `format` files (set by userspace). Recent kernels have
/// `group_dead` in the exit record; u64::MAX: this one does not.
#[unsafe(no_mangle)]
static NEWTASK_FLAGS_OFFSET: u64 = 32;
#[unsafe(no_mangle)]
static EXIT_GROUP_DEAD_OFFSET: u64 = u64::MAX;

/// `task:task_newtask` rather than `sched:sched_process_fork`: its record carries the clone
/// flags, so new threads are left out here instead of crossing the ring.
#[tracepoint]
pub fn task_newtask(ctx: TracePointContext) -> u32 {
    let off = unsafe { core::ptr::read_volatile(&NEWTASK_FLAGS_OFFSET) } as usize;
    match unsafe { ctx.read_at::<u64>(off) } {
        Ok(flags) if flags & CLONE_THREAD == 0 => crate::cgroup::send_process(&ctx, event::PROCESS_FORK),
        _ => 0,
    }
}

/// The process ends with its last thread (`group_dead`); a kernel without that field tells
/// only which task exits, and then the thread-group leader's exit stands for the process's.
#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    let off = unsafe { core::ptr::read_volatile(&EXIT_GROUP_DEAD_OFFSET) };
    let ends_process = if off == u64::MAX {
        let pid_tgid = bpf_get_current_pid_tgid();
        (pid_tgid >> 32) as u32 == pid_tgid as u32
    } else {
        matches!(unsafe { ctx.read_at::<u8>(off as usize) }, Ok(dead) if dead != 0)
    };
    if ends_process { crate::cgroup::send_process(&ctx, event::PROCESS_EXIT) } else { 0 }
}
