//! cgroup life cycle: mkdir, rmdir and release, each sent to userspace with the task that
//! caused it, so zombie (removed but never released) memory cgroups can be traced to their
//! maker. These events are rare (a few per second at most), so each goes out as it happens.

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_kernel_buf,
        generated::{bpf_get_smp_processor_id, bpf_ktime_get_boot_ns},
    },
    macros::{map, tracepoint},
    maps::RingBuf,
    programs::TracePointContext,
};
use profiler_common::{EVENT_DATA_LEN, EventHeader, PROCESS_DATA_LEN, event};

#[repr(C)]
struct Record<const N: usize> {
    header: EventHeader,
    data: [u8; N],
}

#[map]
/// Bursts of thousands of cgroups a second happen (a crash loop, a test), and a build machine
/// forks, execs and exits thousands of processes a second: room for ~8,700 cgroup or exec
/// records (240 bytes each in the ring) or ~21,800 forks and exits (96), read every flush. The
/// ring's pages are mapped twice into the daemon and count twice in its RSS.
static EVENTS: RingBuf = RingBuf::with_byte_size(2 * 1024 * 1024, 0);

/// Sends an event and wakes the reader: an exec must be read while the process lives. Forced:
/// the kernel's default wakes the reader only when the record is the first one it has not
/// read, and a fork's record (sent quietly) usually precedes the exec's.
#[inline(always)]
pub(crate) fn send(ctx: &TracePointContext, kind: u32) -> u32 {
    send_with::<EVENT_DATA_LEN>(ctx, kind, aya_ebpf::bindings::BPF_RB_FORCE_WAKEUP as u64)
}

/// Sends an event without waking the reader: it is read with the next drain (at most a flush
/// interval later), before the samples drained with it. A wakeup is a context switch of the
/// reader and the pipeline; a machine forks and exits hundreds of processes a second.
#[inline(always)]
pub(crate) fn send_quiet(ctx: &TracePointContext, kind: u32) -> u32 {
    send_with::<EVENT_DATA_LEN>(ctx, kind, aya_ebpf::bindings::BPF_RB_NO_WAKEUP as u64)
}

/// `send_quiet` with the first [`PROCESS_DATA_LEN`] bytes of the record: a fork or an exit.
#[inline(always)]
pub(crate) fn send_process(ctx: &TracePointContext, kind: u32) -> u32 {
    send_with::<PROCESS_DATA_LEN>(ctx, kind, aya_ebpf::bindings::BPF_RB_NO_WAKEUP as u64)
}

#[inline(always)]
fn send_with<const N: usize>(ctx: &TracePointContext, kind: u32, flags: u64) -> u32 {
    let Some(mut entry) = EVENTS.reserve::<Record<N>>(0) else {
        crate::count(profiler_common::counter::EVENTS_LOST);
        return 0;
    };
    let record = entry.as_mut_ptr();
    let pid_tgid = bpf_get_current_pid_tgid();
    unsafe {
        (*record).header = EventHeader {
            kind,
            pid: (pid_tgid >> 32) as u32,
            tid: pid_tgid as u32,
            cpu: bpf_get_smp_processor_id(),
            ts_ns: bpf_ktime_get_boot_ns(),
            comm: bpf_get_current_comm().unwrap_or([0; 16]),
        };
        // The raw tracepoint record; the path (a __data_loc string) lies inside it.
        if bpf_probe_read_kernel_buf(ctx.as_ptr() as *const u8, &mut (*record).data).is_err() {
            (*record).data = [0; N];
        }
    }
    entry.submit(flags);
    0
}

#[tracepoint]
pub fn cgroup_mkdir(ctx: TracePointContext) -> u32 {
    send_quiet(&ctx, event::CGROUP_MKDIR)
}

#[tracepoint]
pub fn cgroup_rmdir(ctx: TracePointContext) -> u32 {
    send_quiet(&ctx, event::CGROUP_RMDIR)
}

#[tracepoint]
pub fn cgroup_release(ctx: TracePointContext) -> u32 {
    send_quiet(&ctx, event::CGROUP_RELEASE)
}
