//! The kernel side's counters turned into figures that mean one thing each:
//! - lost: samples taken but never delivered: the ring was full (kernel), or the queue behind
//!   the reader was (userspace, counted by the reader);
//! - lost events: exec, fork, exit and cgroup records the kernel dropped (its events ring was
//!   full) or the reader could not queue;
//! - stack errors: samples delivered whose kernel or user stack could not be captured (not lost);
//! - throttled (an estimate): ticks a CPU should have had but the sampler never saw. The kernel
//!   throttles perf events that take too long (it lowers `perf_event_max_sample_rate` and skips
//!   interrupts) and tells no one per event, so this is estimated from what can be read: the
//!   CPU's non-idle time since it was attached (`/proc/stat`) × the frequency, minus the non-idle
//!   ticks the sampler saw (its tick count minus the idle samples), less a tolerance of one
//!   second's ticks plus 2 % for the frequency mode's period adjustments; never negative. Idle
//!   time is left out because on some VMs an idle vCPU gets no ticks at all, which is not
//!   throttling. Runs skipped because another BPF program was running on the CPU are part of
//!   this gap; the kernel counts those exactly per program (`recursion_misses`, see
//!   `collect::prog_info`), exported apart.

use std::collections::BTreeMap;

use crate::collect::CpuCounters;

// What /metrics shows of them; defined there, so that the server needs nothing of the daemon.
pub use crate::serve::metrics::CpuTotals;

/// A CPU's figures when it was attached (or when its estimate started over).
#[derive(Debug, Clone, Copy)]
struct Attached {
    /// Non-idle seconds (`/proc/stat`); NaN: start over at the next update.
    busy_s: f64,
    seen: u64,
    idle: u64,
    /// Estimate frozen from earlier attachments (a CPU offlined and back).
    before: u64,
}

/// What one update reads: per CPU (index = CPU) the kernel's counters; per CPU id the
/// non-idle seconds from `/proc/stat` (empty if unreadable) and the idle samples handled.
pub struct Reading<'a> {
    pub counters: &'a [CpuCounters],
    pub busy_s: &'a BTreeMap<u32, f64>,
    pub idle: &'a BTreeMap<u32, u64>,
    /// CPUs sampled now.
    pub sampled: &'a [u32],
    /// Any monotonic clock, seconds.
    pub now_s: f64,
}

#[derive(Debug, Default)]
pub struct Tally {
    frequency_hz: u64,
    last: Vec<CpuCounters>,
    attached: BTreeMap<u32, Attached>,
    /// Per CPU: the sampler's tick count, when it last moved, and the CPU's non-idle seconds then.
    progress: BTreeMap<u32, (u64, f64, f64)>,
    pub totals: BTreeMap<u32, CpuTotals>,
    /// Event records the kernel dropped, since the start (a cumulative counter, read as is).
    pub events_lost: u64,
    /// Event records the reader could not queue, since the start.
    pub events_dropped: u64,
}

impl Tally {
    pub fn new(frequency_hz: u64) -> Self {
        Self { frequency_hz, ..Default::default() }
    }

    /// Reads new cumulative counters. Returns the ring-full drops per CPU since the previous call.
    pub fn update(&mut self, r: &Reading<'_>) -> Vec<(u32, u64)> {
        let mut ring_full = Vec::new();
        for (cpu, c) in r.counters.iter().enumerate() {
            let cpu = cpu as u32;
            let prev = self.last.get(cpu as usize).copied().unwrap_or_default();
            let t = self.totals.entry(cpu).or_default();
            let full = c.ringbuf_full.saturating_sub(prev.ringbuf_full);
            t.ring_full += full;
            t.stacks.add_growth(&c.stacks, &prev.stacks);
            if full > 0 {
                ring_full.push((cpu, full));
            }
        }
        for (cpu, a) in &mut self.attached {
            if !r.sampled.contains(cpu) {
                // Gone offline: keep what was estimated, start over if it comes back.
                a.busy_s = f64::NAN;
            }
        }
        let freq = self.frequency_hz as f64;
        for &cpu in r.sampled {
            let seen = r.counters.get(cpu as usize).map_or(0, |c| c.seen);
            let idle = r.idle.get(&cpu).copied().unwrap_or(0);
            let Some(&busy_s) = r.busy_s.get(&cpu) else { continue };
            let p = self.progress.entry(cpu).or_insert((seen, r.now_s, busy_s));
            if p.0 != seen {
                *p = (seen, r.now_s, busy_s);
            }
            let a = self.attached.entry(cpu).or_insert(Attached { busy_s, seen, idle, before: 0 });
            if a.busy_s.is_nan() {
                let before = self.totals.get(&cpu).map_or(0, |t| t.throttled_estimate);
                *a = Attached { busy_s, seen, idle, before };
            }
            let expected = freq * (busy_s - a.busy_s);
            let busy_seen = seen.saturating_sub(a.seen).saturating_sub(idle.saturating_sub(a.idle)) as f64;
            let missing = expected - busy_seen - (freq + expected * 0.02);
            let estimate = a.before + missing.max(0.0) as u64;
            let t = self.totals.entry(cpu).or_default();
            t.throttled_estimate = t.throttled_estimate.max(estimate);
        }
        self.progress.retain(|cpu, _| r.sampled.contains(cpu));
        self.events_lost = r.counters.iter().map(|c| c.events_lost).sum();
        self.last = r.counters.to_vec();
        ring_full
    }

    /// CPUs whose sampler has not run for `after_s` seconds while the CPU was busy for at least
    /// half of that time: the cpu-clock event would have fired, so it is dead. That happens when
    /// a CPU went offline and came back between two looks at the online set: its old event
    /// stays off. The caller attaches a new one and [`Self::restart`]s the CPU. (An idle CPU
    /// without ticks is not stalled: some VMs give an idle vCPU no ticks at all.)
    pub fn stalled(&self, now_s: f64, busy_s: &BTreeMap<u32, f64>, after_s: f64) -> Vec<u32> {
        self.progress
            .iter()
            .filter(|(cpu, (_, at, busy_at))| {
                now_s - at >= after_s && busy_s.get(cpu).is_some_and(|b| b - busy_at >= after_s / 2.0)
            })
            .map(|(cpu, _)| *cpu)
            .collect()
    }

    /// A CPU got a new event: its silence so far is not a stall, nor throttling.
    pub fn restart(&mut self, cpu: u32, now_s: f64, busy_s: &BTreeMap<u32, f64>) {
        if let Some(p) = self.progress.get_mut(&cpu) {
            p.1 = now_s;
            p.2 = busy_s.get(&cpu).copied().unwrap_or(p.2);
        }
        if let Some(a) = self.attached.get_mut(&cpu) {
            a.busy_s = f64::NAN;
        }
    }

    pub fn add_queue_full(&mut self, cpu: u32, n: u64) {
        self.totals.entry(cpu).or_default().queue_full += n;
    }

    /// Samples the queue had no room for, on every CPU.
    pub fn queue_full(&self) -> u64 {
        self.totals.values().map(|t| t.queue_full).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::StackCounts;

    fn c(seen: u64, full: u64, kerr: u64, uerr: u64) -> CpuCounters {
        let stacks = StackCounts { kernel_stack_errors: kerr, user_stack_errors: uerr, ..Default::default() };
        CpuCounters { seen, ringbuf_full: full, stacks, ..Default::default() }
    }

    /// One update: counters per CPU, (busy seconds, idle samples) per CPU, CPUs sampled, time.
    fn update(
        t: &mut Tally,
        counters: &[CpuCounters],
        cpus: &[(f64, u64)],
        sampled: &[u32],
        now_s: f64,
    ) -> Vec<(u32, u64)> {
        let busy_s = cpus.iter().enumerate().map(|(i, c)| (i as u32, c.0)).collect();
        let idle = cpus.iter().enumerate().map(|(i, c)| (i as u32, c.1)).collect();
        t.update(&Reading { counters, busy_s: &busy_s, idle: &idle, sampled, now_s })
    }

    #[test]
    fn lost_is_only_what_was_not_delivered() {
        let mut t = Tally::new(100);
        assert!(update(&mut t, &[c(0, 0, 0, 0), c(0, 0, 0, 0)], &[(0.0, 0); 2], &[0, 1], 0.0).is_empty());
        let full = update(&mut t, &[c(100, 0, 5, 7), c(100, 3, 0, 0)], &[(1.0, 0); 2], &[0, 1], 1.0);
        assert_eq!(full, vec![(1, 3)]);
        t.add_queue_full(0, 4);
        assert_eq!(
            t.totals[&0],
            CpuTotals {
                queue_full: 4,
                stacks: StackCounts { kernel_stack_errors: 5, user_stack_errors: 7, ..Default::default() },
                ..Default::default()
            }
        );
        assert_eq!(t.totals[&0].lost(), 4, "stack errors were delivered: not lost");
        assert_eq!(t.totals[&1].lost(), 3);
        // Deltas, not totals: the same cumulative value again adds nothing.
        assert!(update(&mut t, &[c(200, 0, 5, 7), c(200, 3, 0, 0)], &[(2.0, 0); 2], &[0, 1], 2.0).is_empty());
        assert_eq!(t.totals[&1].ring_full, 3);
    }

    #[test]
    fn throttling_is_estimated_from_busy_time_and_busy_ticks() {
        let mut t = Tally::new(100);
        update(&mut t, &[c(0, 0, 0, 0); 3], &[(0.0, 0); 3], &[0, 1, 2], 0.0);
        // 10 s. CPU 0: busy 10 s, 1000 ticks. CPU 1: busy 10 s, 500 ticks. CPU 2: idle all along
        // and a vCPU that gets no ticks when idle: not throttled.
        update(
            &mut t,
            &[c(1000, 0, 0, 0), c(500, 0, 0, 0), c(0, 0, 0, 0)],
            &[(10.0, 0), (10.0, 0), (0.0, 0)],
            &[0, 1, 2],
            10.0,
        );
        assert_eq!(t.totals[&0].throttled_estimate, 0);
        // 1000 expected - 500 seen - (100 + 20) tolerance.
        assert_eq!(t.totals[&1].throttled_estimate, 380);
        assert_eq!(t.totals[&2].throttled_estimate, 0);
        // CPU 1 offline for 10 s, then back: the estimate stays; idle ticks are not busy ticks.
        update(
            &mut t,
            &[c(2000, 0, 0, 0), c(500, 0, 0, 0), c(0, 0, 0, 0)],
            &[(20.0, 0), (10.0, 0), (0.0, 0)],
            &[0, 2],
            20.0,
        );
        update(
            &mut t,
            &[c(2000, 0, 0, 0), c(500, 0, 0, 0), c(0, 0, 0, 0)],
            &[(20.0, 0), (10.0, 0), (0.0, 0)],
            &[0, 1, 2],
            20.0,
        );
        update(
            &mut t,
            &[c(3000, 0, 0, 0), c(1500, 0, 0, 0), c(0, 0, 0, 0)],
            &[(25.0, 500), (20.0, 0), (0.0, 0)],
            &[0, 1, 2],
            30.0,
        );
        assert_eq!(t.totals[&1].throttled_estimate, 380);
        assert_eq!(t.totals[&0].throttled_estimate, 0);
    }

    #[test]
    fn a_busy_cpu_whose_sampler_stopped_is_reported_but_an_idle_one_is_not() {
        let mut t = Tally::new(100);
        let busy = |b0: f64, b1: f64| BTreeMap::from([(0, b0), (1, b1)]);
        update(&mut t, &[c(0, 0, 0, 0); 2], &[(0.0, 0), (0.0, 0)], &[0, 1], 0.0);
        update(&mut t, &[c(100, 0, 0, 0), c(100, 0, 0, 0)], &[(1.0, 0), (1.0, 0)], &[0, 1], 1.0);
        // From 1 s on CPU 0 gets no ticks while idle; CPU 1 none while busy.
        update(&mut t, &[c(100, 0, 0, 0), c(100, 0, 0, 0)], &[(1.0, 0), (2.0, 0)], &[0, 1], 2.0);
        assert!(t.stalled(2.0, &busy(1.0, 2.0), 3.0).is_empty());
        update(&mut t, &[c(100, 0, 0, 0), c(100, 0, 0, 0)], &[(1.0, 0), (4.0, 0)], &[0, 1], 4.0);
        assert_eq!(t.stalled(4.0, &busy(1.0, 4.0), 3.0), vec![1]);
        t.restart(1, 4.0, &busy(1.0, 4.0));
        assert!(t.stalled(4.5, &busy(1.0, 4.5), 3.0).is_empty());
    }
}
