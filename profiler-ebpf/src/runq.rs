//! Run-queue waits: how long a runnable thread waited for a CPU, from its wakeup (or from
//! being preempted while still runnable) to the `sched_switch` that runs it. Context switches
//! happen tens of thousands of times a second on a busy node: each wait goes into a per-CPU
//! histogram here, and only the longest one of each read (with who waited and what the CPU ran
//! just before) keeps its names. Userspace reads the histograms once a second.

use aya_ebpf::{
    helpers::generated::bpf_ktime_get_boot_ns,
    macros::{map, tracepoint},
    maps::{LruHashMap, PerCpuArray},
    programs::TracePointContext,
};
use profiler_common::{LATENCY_BUCKETS, runq};

#[map]
static RUNQ: PerCpuArray<[u64; runq::LEN]> = PerCpuArray::with_max_entries(1, 0);

/// When each runnable thread started waiting, by thread id. LRU: a thread that exits while
/// runnable never takes its entry out; the oldest such entries make room.
#[map]
static RUNQ_SINCE: LruHashMap<u32, u64> = LruHashMap::with_max_entries(16384, 0);

/// Offsets into the tracepoints' records, from their `format` files (set by userspace).
#[unsafe(no_mangle)]
static WAKEUP_PID_OFFSET: u64 = 24;
#[unsafe(no_mangle)]
static SWITCH_PREV_COMM_OFFSET: u64 = 8;
#[unsafe(no_mangle)]
static SWITCH_PREV_PID_OFFSET: u64 = 24;
#[unsafe(no_mangle)]
pub(crate) static SWITCH_PREV_STATE_OFFSET: u64 = 32;
#[unsafe(no_mangle)]
static SWITCH_NEXT_COMM_OFFSET: u64 = 40;
#[unsafe(no_mangle)]
pub(crate) static SWITCH_NEXT_PID_OFFSET: u64 = 56;

#[inline(always)]
pub(crate) fn offset(o: &u64) -> usize {
    unsafe { core::ptr::read_volatile(o) as usize }
}

#[inline(always)]
fn waiting_from(ctx: &TracePointContext) -> u32 {
    if let Ok(pid) = unsafe { ctx.read_at::<i32>(offset(&WAKEUP_PID_OFFSET)) }
        && pid > 0
    {
        let now = unsafe { bpf_ktime_get_boot_ns() };
        let _ = RUNQ_SINCE.insert(&(pid as u32), &now, 0);
    }
    0
}

#[tracepoint]
pub fn sched_wakeup(ctx: TracePointContext) -> u32 {
    waiting_from(&ctx)
}

#[tracepoint]
pub fn sched_wakeup_new(ctx: TracePointContext) -> u32 {
    waiting_from(&ctx)
}

#[tracepoint]
pub fn sched_switch(ctx: TracePointContext) -> u32 {
    let now = unsafe { bpf_ktime_get_boot_ns() };
    let prev = unsafe { ctx.read_at::<i32>(offset(&SWITCH_PREV_PID_OFFSET)) }.unwrap_or(0);
    let state = unsafe { ctx.read_at::<i64>(offset(&SWITCH_PREV_STATE_OFFSET)) }.unwrap_or(1) as u64;
    // Preempted (or yielding) and still runnable: it waits for a CPU from now.
    if prev > 0 && state & runq::SLEEP_STATE_MASK == 0 {
        let _ = RUNQ_SINCE.insert(&(prev as u32), &now, 0);
    }
    let next = unsafe { ctx.read_at::<i32>(offset(&SWITCH_NEXT_PID_OFFSET)) }.unwrap_or(0);
    if next <= 0 {
        return 0;
    }
    let next = next as u32;
    let Some(since) = (unsafe { RUNQ_SINCE.get(&next) }).copied() else { return 0 };
    let _ = RUNQ_SINCE.remove(&next);
    let waited = now.saturating_sub(since);
    // Per-CPU value, and sched_switch does not nest on a CPU.
    let Some(s) = RUNQ.get_ptr_mut(0).map(|p| unsafe { &mut *p }) else { return 0 };
    s[runq::WAITS] += 1;
    let bucket = profiler_common::latency_bucket(waited).min(LATENCY_BUCKETS - 1);
    if let Some(n) = s.get_mut(runq::HISTOGRAM + bucket as usize) {
        *n += 1;
    }
    crate::raise_max(s, runq::EPOCH, &[runq::WAIT_MAX], runq::WAIT_MAX, waited);
    if s[runq::WAIT_MAX] == waited {
        let comm = |off: &u64| unsafe { ctx.read_at::<[u64; 2]>(offset(off)) }.unwrap_or([0; 2]);
        let (next_comm, prev_comm) = (comm(&SWITCH_NEXT_COMM_OFFSET), comm(&SWITCH_PREV_COMM_OFFSET));
        s[runq::WAITER_TID] = u64::from(next);
        s[runq::WAITER_COMM] = next_comm[0];
        s[runq::WAITER_COMM + 1] = next_comm[1];
        s[runq::BEFORE_TID] = prev.max(0) as u64;
        s[runq::BEFORE_COMM] = prev_comm[0];
        s[runq::BEFORE_COMM + 1] = prev_comm[1];
    }
    0
}
