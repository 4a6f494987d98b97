//! The rate guard. A uprobe is a trap: every hit costs the calling thread time whether or not
//! the program counts it (about 2.5 µs here with the walk, far more where the probed instruction
//! must be single-stepped), so a process launching faster than the budget allows gets its
//! probes for part of the time only: duty cycling over periods of `PERIOD_SECS`, attached for
//! the seconds the budget pays for, with the counts of those seconds scaled to the period and
//! marked as estimates. Counting without stacks would not help: the trap is the cost.
//!
//! Each process has its own cycle (`super::Proc`): off, it is switched off in the kernel's
//! `CUDA_GATE` while others keep the file's probes, so its flood turns no other process's
//! counts into estimates; the file's probes come off only while all its processes are.

use profiler_common::cuda::{CudaKey, func, kind};

/// Seconds per duty cycle.
pub const PERIOD_SECS: u32 = 10;

/// The probe hits (traps) behind `calls` counted under `key`, what the budget is spent in: a
/// launch through the runtime (`cudaLaunchKernel`, its host stub in the key) hit the runtime's
/// probe and then the driver's, and is counted once; every other count, one hit a call. (The
/// look-ups are one each per kernel and process, not a rate.)
pub fn hits(key: &CudaKey, calls: u64) -> u64 {
    if key.kind == kind::LAUNCH && func::tag(key.func) == func::STUB { calls.saturating_mul(2) } else { calls }
}

/// One process's duty cycle.
#[derive(Debug, Clone, PartialEq)]
pub struct DutyCycle {
    /// Seconds into the current period.
    second: u32,
    /// Seconds of the period the probes are attached (the first ones).
    on_secs: u32,
    /// Highest per-process rate (calls a second) seen while attached in this period.
    peak: f64,
}

impl Default for DutyCycle {
    fn default() -> Self {
        Self { second: 0, on_secs: PERIOD_SECS, peak: 0.0 }
    }
}

impl DutyCycle {
    /// The fraction of the time the probes are attached.
    pub fn fraction(&self) -> f64 {
        f64::from(self.on_secs) / f64::from(PERIOD_SECS)
    }

    /// Whether counts are estimates (the probes are off part of the time).
    pub fn estimating(&self) -> bool {
        self.on_secs < PERIOD_SECS
    }

    /// A second passed; `rate`: the busiest process's calls in it, when the probes were attached
    /// (`None`: they were not). Returns whether they are attached for the next second.
    pub fn next(&mut self, rate: Option<f64>, limit: f64) -> bool {
        if let Some(r) = rate {
            self.peak = self.peak.max(r);
            // Over the budget while fully on: cut now, not at the period's end.
            if !self.estimating() && r > limit {
                self.start_period(limit);
                return self.second < self.on_secs;
            }
        }
        self.second += 1;
        if self.second >= PERIOD_SECS {
            self.start_period(limit);
        }
        self.second < self.on_secs
    }

    fn start_period(&mut self, limit: f64) {
        let fraction = if self.peak <= limit { 1.0 } else { limit / self.peak };
        self.on_secs = ((fraction * f64::from(PERIOD_SECS)).floor() as u32).clamp(1, PERIOD_SECS);
        self.second = 0;
        self.peak = 0.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_within_the_budget_keeps_its_probes_and_exact_counts() {
        let mut d = DutyCycle::default();
        for _ in 0..35 {
            assert!(d.next(Some(9_000.0), 10_000.0));
        }
        assert!(!d.estimating());
        assert_eq!(d.fraction(), 1.0);
    }

    #[test]
    fn a_process_over_the_budget_is_probed_the_share_of_time_the_budget_pays_for() {
        let mut d = DutyCycle::default();
        // 25,000 launches a second against 10,000: 4 seconds of 10.
        assert!(d.next(Some(25_000.0), 10_000.0));
        assert!(d.estimating());
        assert_eq!(d.fraction(), 0.4);
        let mut on = 0;
        for _ in 0..PERIOD_SECS * 3 {
            let rate = Some(25_000.0);
            if d.next(rate, 10_000.0) {
                on += 1;
            }
        }
        assert_eq!(on, 12, "4 of every 10 seconds");
    }

    #[test]
    fn the_probes_come_back_fully_once_the_rate_falls() {
        let mut d = DutyCycle::default();
        d.next(Some(50_000.0), 10_000.0);
        assert_eq!(d.on_secs, 2);
        let mut attached = true;
        for _ in 0..PERIOD_SECS * 2 {
            attached = d.next(attached.then_some(1_000.0), 10_000.0);
        }
        assert!(!d.estimating() && attached);
    }

    #[test]
    fn a_launch_through_the_runtime_spends_two_hits_of_the_budget() {
        let key = |kind, f| CudaKey { kind, func: f, ..Default::default() };
        assert_eq!(hits(&key(kind::LAUNCH, func::STUB | 0x1000), 1000), 2000);
        assert_eq!(hits(&key(kind::LAUNCH, func::HANDLE | 0x1000), 1000), 1000);
        assert_eq!(hits(&key(kind::LAUNCH, func::GRAPH), 1000), 1000);
        assert_eq!(hits(&key(kind::SYNC, 0), 50), 50);
        // 7,000 runtime launches a second are 14,000 hits: over a 12,000 budget.
        let mut d = DutyCycle::default();
        d.next(Some(hits(&key(kind::LAUNCH, func::STUB | 1), 7_000) as f64), 12_000.0);
        assert!(d.estimating());
    }

    #[test]
    fn even_a_flood_keeps_one_second_of_ten() {
        let mut d = DutyCycle::default();
        d.next(Some(10_000_000.0), 10_000.0);
        assert_eq!(d.on_secs, 1);
    }
}
