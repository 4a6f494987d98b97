//! The execution context a sample interrupted: task, or which softirq.
//!
//! The sampler fires from the cpu-clock hrtimer, so it always runs in hardirq context itself and
//! sees the context below it. Hardirq handlers run with interrupts off and the cpu-clock event is
//! not an NMI, so what it interrupts is task or softirq code, never another hardirq handler or an
//! NMI (a tick that lands in an interrupts-off region is taken when they are back on: the usual
//! cpu-clock skid). That leaves one question: was a softirq running?
//!
//! The kernel knows it in `preempt_count` (`SOFTIRQ_OFFSET`), a per-CPU variable (`__preempt_count`
//! or `pcpu_hot.preempt_count`, by kernel) that a BPF program reads through a typed ksym and
//! `bpf_this_cpu_ptr`, which aya 0.14 cannot relocate. It would also not say which softirq.
//! Instead the softirq tracepoints keep one per-CPU slot: `irq:softirq_entry` writes the vector
//! plus one, `irq:softirq_exit` writes 0. Softirqs do not nest on a CPU (they run with bottom
//! halves disabled), and the sampler preempts both tracepoints, so the slot it reads is exactly
//! the softirq it interrupted, on the idle task (at irq exit), on any task, and in
//! `ksoftirqd/N`, which runs the same handlers in task context. Between two handlers of one
//! `handle_softirqs` loop (bookkeeping, no handler) the slot is 0: task context.

use aya_ebpf::{
    macros::{map, tracepoint},
    maps::PerCpuArray,
    programs::TracePointContext,
};

/// Per CPU: the softirq running now, as its vector plus one; 0 when none.
#[map]
static SOFTIRQ_NOW: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// `irq:softirq_entry` of vector `vec`.
#[inline(always)]
pub(crate) fn enter(vec: u32) {
    set(if vec < profiler_common::SOFTIRQ_NAMES.len() as u32 { vec + 1 } else { 0 });
}

/// `irq:softirq_exit`.
#[inline(always)]
pub(crate) fn exit() {
    set(0);
}

/// `irq:softirq_exit`, every vector (`softirq_entry` lives with the NET_RX timing in `netrx`).
#[tracepoint]
pub fn softirq_exit(_ctx: TracePointContext) -> u32 {
    exit();
    0
}

#[inline(always)]
fn set(value: u32) {
    if let Some(slot) = SOFTIRQ_NOW.get_ptr_mut(0) {
        // Per-CPU, and the tracepoints that write it do not nest on a CPU.
        unsafe { *slot = value };
    }
}

/// The softirq the sampler interrupted (vector plus one), 0 for task context: one per-CPU
/// lookup. Userspace attaches `softirq_exit` before `softirq_entry`, so the slot is never left
/// set by an entry whose exit is not watched.
#[inline(always)]
pub(crate) fn softirq_now() -> u32 {
    SOFTIRQ_NOW.get(0).copied().unwrap_or(0) & 0xF
}
