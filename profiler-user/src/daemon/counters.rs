//! The kernel side's counters turned into figures that mean one thing each:
//! - lost: samples taken but never delivered: the ring was full (kernel), or the queue behind
//!   the reader was (userspace, counted by the reader);
//! - stack errors: samples delivered whose kernel or user stack could not be captured (not lost);
//! - throttled (an estimate): ticks a CPU should have had at the sampling frequency but the
//!   program never saw. The kernel throttles perf events that take too long (it lowers
//!   `perf_event_max_sample_rate` and skips interrupts) and tells no one per event, so this is
//!   expected ticks (frequency × time attached) minus ticks seen, less a tolerance of one
//!   second's ticks plus 2 % for the frequency mode's period adjustments; never negative.
//!   Skips because another BPF program was running on the CPU are `recursion_misses`, read
//!   from the kernel per program (see `collect::prog_info`), and are part of this gap too.

use std::collections::BTreeMap;

use crate::collect::CpuCounters;

/// Cumulative figures of one CPU since the daemon started.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct CpuTotals {
    pub ring_full: u64,
    pub queue_full: u64,
    pub kernel_stack_errors: u64,
    pub user_stack_errors: u64,
    pub throttled_estimate: u64,
}

impl CpuTotals {
    pub fn lost(&self) -> u64 {
        self.ring_full + self.queue_full
    }
}

/// Since when a CPU is sampled, and the program's tick count then.
#[derive(Debug, Clone, Copy)]
struct Attached {
    at_s: f64,
    seen: u64,
    /// Estimate frozen from earlier attachments (a CPU offlined and back).
    before: u64,
}

#[derive(Debug, Default)]
pub struct Tally {
    frequency_hz: u64,
    last: Vec<CpuCounters>,
    attached: BTreeMap<u32, Attached>,
    /// Per CPU: the sampler's tick count and when it last moved.
    progress: BTreeMap<u32, (u64, f64)>,
    pub totals: BTreeMap<u32, CpuTotals>,
}

impl Tally {
    pub fn new(frequency_hz: u64) -> Self {
        Self { frequency_hz, ..Default::default() }
    }

    /// Reads new cumulative counters (index = CPU) at `now_s` (any monotonic seconds) with the
    /// CPUs sampled now. Returns the ring-full drops per CPU since the previous call.
    pub fn update(&mut self, now: &[CpuCounters], now_s: f64, sampled: &[u32]) -> Vec<(u32, u64)> {
        let mut ring_full = Vec::new();
        for (cpu, c) in now.iter().enumerate() {
            let cpu = cpu as u32;
            let prev = self.last.get(cpu as usize).copied().unwrap_or_default();
            let t = self.totals.entry(cpu).or_default();
            let full = c.ringbuf_full.saturating_sub(prev.ringbuf_full);
            t.ring_full += full;
            t.kernel_stack_errors += c.kernel_stack_errors.saturating_sub(prev.kernel_stack_errors);
            t.user_stack_errors += c.user_stack_errors.saturating_sub(prev.user_stack_errors);
            if full > 0 {
                ring_full.push((cpu, full));
            }
        }
        // The throttling estimate, per CPU sampled now.
        let freq = self.frequency_hz as f64;
        for (cpu, a) in &mut self.attached {
            if !sampled.contains(cpu) {
                // Gone offline: keep what was estimated, start over if it comes back.
                a.at_s = f64::NAN;
            }
        }
        for &cpu in sampled {
            let seen = now.get(cpu as usize).map_or(0, |c| c.seen);
            let a = self.attached.entry(cpu).or_insert(Attached { at_s: now_s, seen, before: 0 });
            if a.at_s.is_nan() {
                let before = self.totals.get(&cpu).map_or(0, |t| t.throttled_estimate);
                *a = Attached { at_s: now_s, seen, before };
            }
            let expected = freq * (now_s - a.at_s);
            let missing = expected - seen.saturating_sub(a.seen) as f64 - (freq + expected * 0.02);
            let estimate = a.before + missing.max(0.0) as u64;
            let t = self.totals.entry(cpu).or_default();
            t.throttled_estimate = t.throttled_estimate.max(estimate);
        }
        for &cpu in sampled {
            let seen = now.get(cpu as usize).map_or(0, |c| c.seen);
            let p = self.progress.entry(cpu).or_insert((seen, now_s));
            if p.0 != seen {
                *p = (seen, now_s);
            }
        }
        self.progress.retain(|cpu, _| sampled.contains(cpu));
        self.last = now.to_vec();
        ring_full
    }

    /// CPUs sampled whose sampler has not run for `after_s` seconds. The cpu-clock event fires
    /// on idle CPUs too, so this means the event is dead: a CPU that went offline and came
    /// back between two looks at the online set keeps an event the kernel turned off. The
    /// caller attaches a new one (and [`Self::restart`]s the CPU's clock).
    pub fn stalled(&self, now_s: f64, after_s: f64) -> Vec<u32> {
        self.progress.iter().filter(|(_, (_, at))| now_s - at >= after_s).map(|(cpu, _)| *cpu).collect()
    }

    /// A CPU got a new event: its silence so far is not a stall, nor throttling.
    pub fn restart(&mut self, cpu: u32, now_s: f64) {
        if let Some(p) = self.progress.get_mut(&cpu) {
            p.1 = now_s;
        }
        if let Some(a) = self.attached.get_mut(&cpu) {
            a.at_s = f64::NAN;
        }
    }

    pub fn add_queue_full(&mut self, cpu: u32, n: u64) {
        self.totals.entry(cpu).or_default().queue_full += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(seen: u64, full: u64, kerr: u64, uerr: u64) -> CpuCounters {
        CpuCounters { seen, ringbuf_full: full, kernel_stack_errors: kerr, user_stack_errors: uerr, ring_used_max: 0 }
    }

    #[test]
    fn lost_is_only_what_was_not_delivered() {
        let mut t = Tally::new(100);
        assert!(t.update(&[c(0, 0, 0, 0), c(0, 0, 0, 0)], 0.0, &[0, 1]).is_empty());
        let full = t.update(&[c(100, 0, 5, 7), c(100, 3, 0, 0)], 1.0, &[0, 1]);
        assert_eq!(full, vec![(1, 3)]);
        t.add_queue_full(0, 4);
        assert_eq!(t.totals[&0], CpuTotals { queue_full: 4, kernel_stack_errors: 5, user_stack_errors: 7, ..Default::default() });
        assert_eq!(t.totals[&0].lost(), 4, "stack errors were delivered: not lost");
        assert_eq!(t.totals[&1].lost(), 3);
        // Deltas, not totals: the same cumulative value again adds nothing.
        assert!(t.update(&[c(200, 0, 5, 7), c(200, 3, 0, 0)], 2.0, &[0, 1]).is_empty());
        assert_eq!(t.totals[&1].ring_full, 3);
    }

    #[test]
    fn a_cpu_whose_sampler_stopped_is_reported_once_its_silence_is_long_enough() {
        let mut t = Tally::new(100);
        t.update(&[c(0, 0, 0, 0), c(0, 0, 0, 0)], 0.0, &[0, 1]);
        t.update(&[c(100, 0, 0, 0), c(100, 0, 0, 0)], 1.0, &[0, 1]);
        t.update(&[c(200, 0, 0, 0), c(100, 0, 0, 0)], 2.0, &[0, 1]);
        assert!(t.stalled(2.0, 3.0).is_empty());
        t.update(&[c(400, 0, 0, 0), c(100, 0, 0, 0)], 4.0, &[0, 1]);
        assert_eq!(t.stalled(4.0, 3.0), vec![1]);
        t.restart(1, 4.0);
        assert!(t.stalled(4.5, 3.0).is_empty());
    }

    #[test]
    fn throttling_is_estimated_from_ticks_missing_beyond_the_tolerance() {
        let mut t = Tally::new(100);
        t.update(&[c(0, 0, 0, 0), c(0, 0, 0, 0)], 0.0, &[0, 1]);
        // 10 s: CPU 0 saw all its 1000 ticks, CPU 1 only 500.
        t.update(&[c(1000, 0, 0, 0), c(500, 0, 0, 0)], 10.0, &[0, 1]);
        assert_eq!(t.totals[&0].throttled_estimate, 0);
        // 1000 expected - 500 seen - (100 + 20) tolerance.
        assert_eq!(t.totals[&1].throttled_estimate, 380);
        // CPU 1 goes offline for 10 s: no ticks expected meanwhile, and the estimate stays.
        t.update(&[c(2000, 0, 0, 0), c(500, 0, 0, 0)], 20.0, &[0]);
        t.update(&[c(2000, 0, 0, 0), c(500, 0, 0, 0)], 20.0, &[0, 1]);
        t.update(&[c(3000, 0, 0, 0), c(1500, 0, 0, 0)], 30.0, &[0, 1]);
        assert_eq!(t.totals[&1].throttled_estimate, 380);
        assert_eq!(t.totals[&0].throttled_estimate, 0);
    }
}
