//! NET_RX softirq and NAPI timing, aggregated in the kernel: these tracepoints fire thousands
//! of times a second on a busy NIC, too often to send each one to userspace. `softirq_entry`
//! also marks the softirq running on its CPU for the sampler (`context`).

use aya_ebpf::{
    helpers::generated::bpf_ktime_get_boot_ns,
    macros::{map, tracepoint},
    maps::PerCpuArray,
    programs::TracePointContext,
};
use profiler_common::{LATENCY_BUCKETS, NET_RX_VEC, netrx};

/// Statistics per CPU, one value with slots named in `profiler_common::netrx`, read by userspace
/// with one syscall.
#[map]
static NETRX: PerCpuArray<[u64; netrx::LEN]> = PerCpuArray::with_max_entries(1, 0);

const MAXIMA: [usize; 2] = [netrx::LATENCY_MAX, netrx::POLL_GAP_MAX];

/// Per-CPU state: [0] time NET_RX was raised and not yet run (0: not pending), [1] time of the
/// last NAPI poll, [2] whether that poll used its whole budget.
#[map]
static NETRX_STATE: PerCpuArray<u64> = PerCpuArray::with_max_entries(3, 0);

/// Offsets into the tracepoints' records, from their `format` files (set by userspace).
#[unsafe(no_mangle)]
static SOFTIRQ_VEC_OFFSET: u64 = 8;
#[unsafe(no_mangle)]
static NAPI_WORK_OFFSET: u64 = 20;
#[unsafe(no_mangle)]
static NAPI_BUDGET_OFFSET: u64 = 24;

#[inline(always)]
fn slot(map: &PerCpuArray<u64>, i: u32) -> Option<&mut u64> {
    map.get_ptr_mut(i).map(|p| unsafe { &mut *p })
}

#[inline(always)]
fn stats() -> Option<&'static mut [u64; netrx::LEN]> {
    // Per-CPU value, and these tracepoints do not nest on a CPU.
    NETRX.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

#[inline(always)]
fn vec_of(ctx: &TracePointContext) -> u32 {
    let off = unsafe { core::ptr::read_volatile(&SOFTIRQ_VEC_OFFSET) } as usize;
    unsafe { ctx.read_at::<u32>(off) }.unwrap_or(u32::MAX)
}

#[tracepoint]
pub fn softirq_raise(ctx: TracePointContext) -> u32 {
    if vec_of(&ctx) != NET_RX_VEC {
        return 0;
    }
    if let Some(pending) = slot(&NETRX_STATE, 0)
        && *pending == 0
    {
        *pending = unsafe { bpf_ktime_get_boot_ns() };
        if let Some(s) = stats() {
            s[netrx::RAISES] += 1;
        }
    }
    0
}

#[tracepoint]
pub fn softirq_entry(ctx: TracePointContext) -> u32 {
    let vec = vec_of(&ctx);
    // Every vector: the sampler labels what it interrupts (`context`).
    crate::context::enter(vec);
    if vec != NET_RX_VEC {
        return 0;
    }
    let Some(pending) = slot(&NETRX_STATE, 0) else { return 0 };
    if *pending == 0 {
        return 0;
    }
    let waited = unsafe { bpf_ktime_get_boot_ns() }.saturating_sub(*pending);
    *pending = 0;
    let Some(s) = stats() else { return 0 };
    s[netrx::ENTRIES] += 1;
    crate::raise_max(s, netrx::EPOCH, &MAXIMA, netrx::LATENCY_MAX, waited);
    let bucket = profiler_common::latency_bucket(waited).min(LATENCY_BUCKETS - 1);
    if let Some(n) = s.get_mut(netrx::HISTOGRAM + bucket as usize) {
        *n += 1;
    }
    0
}

#[tracepoint]
pub fn napi_poll(ctx: TracePointContext) -> u32 {
    let now = unsafe { bpf_ktime_get_boot_ns() };
    let work_off = unsafe { core::ptr::read_volatile(&NAPI_WORK_OFFSET) } as usize;
    let budget_off = unsafe { core::ptr::read_volatile(&NAPI_BUDGET_OFFSET) } as usize;
    let work = unsafe { ctx.read_at::<i32>(work_off) }.unwrap_or(0);
    let budget = unsafe { ctx.read_at::<i32>(budget_off) }.unwrap_or(i32::MAX);
    let Some(s) = stats() else { return 0 };
    s[netrx::POLLS] += 1;
    let (Some(last), Some(full)) = (slot(&NETRX_STATE, 1), slot(&NETRX_STATE, 2)) else { return 0 };
    // A gap counts when work was pending across it: the poll before it left work behind (used
    // its whole budget), or this one finds a full budget's worth waiting. Quiet links, whose
    // polls are sparse and small, do not count.
    if (*full != 0 || work >= budget) && *last != 0 {
        crate::raise_max(s, netrx::EPOCH, &MAXIMA, netrx::POLL_GAP_MAX, now.saturating_sub(*last));
    }
    *last = now;
    *full = u64::from(work >= budget);
    0
}
