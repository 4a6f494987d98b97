//! Reclaim and compaction stalls: the time a task spends in direct reclaim, memory-cgroup
//! reclaim or compaction, from the `vmscan`/`compaction` begin and end tracepoints. They fire
//! thousands of times a second under memory pressure: each stall is added to per-CPU sums and a
//! histogram of durations here, and only the longest of each read keeps the task's name;
//! userspace reads once a second.

use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_kernel,
        generated::{bpf_get_current_task, bpf_ktime_get_boot_ns},
    },
    macros::{map, tracepoint},
    maps::{LruHashMap, PerCpuArray},
    programs::TracePointContext,
};
use profiler_common::{LATENCY_BUCKETS, reclaim};

#[map]
static RECLAIM: PerCpuArray<[u64; reclaim::LEN]> = PerCpuArray::with_max_entries(1, 0);

/// When a task's stall of each kind began, by `tid << 2 | kind`: a stall can sleep (writeback,
/// throttling) and end on another CPU. LRU: a task killed mid-stall never takes its entry out.
#[map]
static RECLAIM_SINCE: LruHashMap<u64, u64> = LruHashMap::with_max_entries(16384, 0);

/// Where the running kernel keeps `task->cgroups`, `css_set->subsys[memory_cgrp_id]` (the index
/// folded in), `css->cgroup`, `cgroup->kn` and `kn->id`: from its BTF, set by userspace
/// (`collect::reclaim::memcg_offsets`); `u64::MAX` when unknown.
#[unsafe(no_mangle)]
static MEMCG_TASK_CGROUPS: u64 = u64::MAX;
#[unsafe(no_mangle)]
static MEMCG_CSS_SET_SUBSYS: u64 = 0;
#[unsafe(no_mangle)]
static MEMCG_CSS_CGROUP: u64 = 0;
#[unsafe(no_mangle)]
static MEMCG_CGROUP_KN: u64 = 0;
#[unsafe(no_mangle)]
static MEMCG_KN_ID: u64 = 0;

#[inline(always)]
fn global(g: &u64) -> u64 {
    unsafe { core::ptr::read_volatile(g) }
}

/// One pointer-sized word at `base + off` in kernel memory (0 if unreadable).
#[inline(always)]
fn word(base: u64, off: u64) -> u64 {
    if base == 0 {
        return 0;
    }
    unsafe { bpf_probe_read_kernel((base + off) as *const u64) }.unwrap_or(0)
}

/// The id of the current task's memory cgroup (0: unknown): five reads, done only for a new
/// longest stall.
#[inline(always)]
fn current_memcg() -> u64 {
    let cgroups = global(&MEMCG_TASK_CGROUPS);
    if cgroups == u64::MAX {
        return 0;
    }
    let task = unsafe { bpf_get_current_task() };
    let css_set = word(task, cgroups);
    let css = word(css_set, global(&MEMCG_CSS_SET_SUBSYS));
    let cgroup = word(css, global(&MEMCG_CSS_CGROUP));
    let kn = word(cgroup, global(&MEMCG_CGROUP_KN));
    word(kn, global(&MEMCG_KN_ID))
}

#[inline(always)]
fn key(kind: usize) -> u64 {
    (bpf_get_current_pid_tgid() & 0xffff_ffff) << 2 | kind as u64
}

#[inline(always)]
fn begin(kind: usize) -> u32 {
    let now = unsafe { bpf_ktime_get_boot_ns() };
    let _ = RECLAIM_SINCE.insert(&key(kind), &now, 0);
    0
}

#[inline(always)]
fn end(kind: usize) -> u32 {
    let k = key(kind);
    let Some(since) = (unsafe { RECLAIM_SINCE.get(&k) }).copied() else { return 0 };
    let _ = RECLAIM_SINCE.remove(&k);
    let stalled = unsafe { bpf_ktime_get_boot_ns() }.saturating_sub(since);
    // Per-CPU value; these tracepoints run in task context and do not nest on a CPU.
    let Some(s) = RECLAIM.get_ptr_mut(0).map(|p| unsafe { &mut *p }) else { return 0 };
    if let Some(n) = s.get_mut(reclaim::COUNT + kind) {
        *n += 1;
    }
    if let Some(ns) = s.get_mut(reclaim::NS + kind) {
        *ns += stalled;
    }
    let bucket = profiler_common::latency_bucket(stalled).min(LATENCY_BUCKETS - 1);
    if let Some(n) = s.get_mut(reclaim::HISTOGRAM + bucket as usize) {
        *n += 1;
    }
    crate::raise_max(s, reclaim::EPOCH, &[reclaim::MAX_NS], reclaim::MAX_NS, stalled);
    if s[reclaim::MAX_NS] == stalled {
        let comm = bpf_get_current_comm().unwrap_or([0; 16]);
        s[reclaim::MAX_KIND] = kind as u64;
        s[reclaim::MAX_PID_TGID] = bpf_get_current_pid_tgid();
        s[reclaim::MAX_COMM] =
            u64::from_ne_bytes([comm[0], comm[1], comm[2], comm[3], comm[4], comm[5], comm[6], comm[7]]);
        s[reclaim::MAX_COMM + 1] =
            u64::from_ne_bytes([comm[8], comm[9], comm[10], comm[11], comm[12], comm[13], comm[14], comm[15]]);
        s[reclaim::MAX_MEMCG] = current_memcg();
    }
    0
}

#[tracepoint]
pub fn mm_vmscan_direct_reclaim_begin(_ctx: TracePointContext) -> u32 {
    begin(reclaim::DIRECT)
}

#[tracepoint]
pub fn mm_vmscan_direct_reclaim_end(_ctx: TracePointContext) -> u32 {
    end(reclaim::DIRECT)
}

#[tracepoint]
pub fn mm_vmscan_memcg_reclaim_begin(_ctx: TracePointContext) -> u32 {
    begin(reclaim::MEMCG)
}

#[tracepoint]
pub fn mm_vmscan_memcg_reclaim_end(_ctx: TracePointContext) -> u32 {
    end(reclaim::MEMCG)
}

#[tracepoint]
pub fn mm_compaction_begin(_ctx: TracePointContext) -> u32 {
    begin(reclaim::COMPACT)
}

#[tracepoint]
pub fn mm_compaction_end(_ctx: TracePointContext) -> u32 {
    end(reclaim::COMPACT)
}
