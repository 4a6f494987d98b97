//! Process exec: tells userspace a program started, through the same EVENTS ring as the cgroup
//! events. A process that lives a few milliseconds has usually exited by the time the daemon
//! drains its samples, and then its `/proc/PID/maps` is gone and its frames cannot be named;
//! told at exec, the daemon reads the mappings while the process lives.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use profiler_common::event;

#[tracepoint]
pub fn sched_process_exec(ctx: TracePointContext) -> u32 {
    crate::cgroup::send(&ctx, event::PROCESS_EXEC)
}
