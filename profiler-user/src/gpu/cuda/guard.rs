//! The rate guard. A uprobe is a trap: every hit costs the calling thread time whether or not
//! the program counts it (about 2.5 µs here with the walk, far more where the probed instruction
//! must be single-stepped), so a process launching faster than the budget allows gets its
//! probes for part of the time only: duty cycling over periods of `PERIOD_SECS`, attached for
//! the seconds the budget pays for (a budget of hits per period, so that a burst is exact), with the counts of those seconds scaled to the period and
//! marked as estimates. Counting without stacks would not help: the trap is the cost.
//!
//! Each process has its own cycle (`super::Proc`): off, it is switched off in the kernel's
//! `CUDA_GATE` while others keep the file's probes, so its flood turns no other process's
//! counts into estimates; the file's probes come off only while all its processes are.
//!
//! Probes come off on a thread of their own (`Collector::cuda_detach`: each waits on the
//! kernel, about 110 ms), and a process is switched on only once its probes are attached
//! again, at a time noted so that its counts are read over the part of the second they cover.

use std::{collections::HashMap, time::Instant};

use profiler_common::cuda::{CudaKey, func, kind};

use super::{Interval, Recorder, attach};
use crate::collect::Collector;

/// Seconds per duty cycle.
pub const PERIOD_SECS: u32 = 10;

/// The default budget: this share of the process's own CPU time spent in probe hits, so that a
/// launch-bound step is at most that much slower, however much of a core the process gets.
pub const BUDGET_SHARE: f64 = 0.01;
/// What a hit is taken to cost the calling process in all: the trap the kernel emulates, the
/// walk, and what the program loses to them after (caches, predictors). The trap and the walk
/// alone are 0.9 µs for a shallow C stack and 2.4-2.7 µs for a Python one in a tight loop
/// (`cargo xtask bench cuda`); a launch-bound step loop (`cargo xtask bench cuda-step`) lost
/// 1.16 % of its CPU at 2,640 hits a second on one core, over the 1 % a budget in hits of
/// 3.3 µs was for: 4.4 µs a hit.
pub const HIT_COST_SECS: f64 = 4.4e-6;
/// Hits a second any process may spend whatever its CPU (a third of a percent of a core):
/// a program that mostly waits on its GPU keeps exact counts at a modest launch rate.
pub const FLOOR_PER_SEC: f64 = 1_000.0;

/// The default budget of a process using `cpu` cores: hits a second.
pub fn budget(cpu: f64) -> f64 {
    (BUDGET_SHARE * cpu.max(0.0) / HIT_COST_SECS).max(FLOOR_PER_SEC)
}

/// A process's CPU time, read once a second from `/proc/PID/stat` (user and system, every
/// thread, the traps included), smoothed over about a period.
#[derive(Debug, Clone, Default)]
pub struct CpuUse {
    last: Option<(u64, std::time::Instant)>,
    /// Cores used, smoothed.
    pub cores: f64,
}

impl CpuUse {
    /// Reads `pid`'s CPU time; the cores it used, smoothed (0 until two readings).
    pub fn update(&mut self, pid: u32) -> f64 {
        let Some(ticks) = cpu_ticks(pid) else { return self.cores };
        let now = std::time::Instant::now();
        if let Some((before, at)) = self.last.replace((ticks, now)) {
            let secs = now.duration_since(at).as_secs_f64();
            if secs > 0.0 {
                let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
                let cores = ticks.saturating_sub(before) as f64 / hz / secs;
                // An average over about a period: the clock ticks are 10 ms apart.
                self.cores = if self.cores == 0.0 { cores } else { 0.8 * self.cores + 0.2 * cores };
            }
        }
        self.cores
    }
}

/// utime + stime of `pid`, clock ticks (fields 14 and 15 of `/proc/PID/stat`, after the comm,
/// which may hold spaces and parentheses).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut f = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    Some(f.next()?.parse::<u64>().ok()? + f.next()?.parse::<u64>().ok()?)
}

/// The probe hits (traps) behind `calls` counted under `key`, what the budget is spent in: a
/// launch through the runtime (`cudaLaunchKernel`, its host stub in the key) hit the runtime's
/// probe and then the driver's, and is counted once; every other count, one hit a call. (The
/// look-ups are one each per kernel and process, not a rate.)
pub fn hits(key: &CudaKey, calls: u64) -> u64 {
    if key.kind == kind::LAUNCH && func::tag(key.func) == func::STUB { calls.saturating_mul(2) } else { calls }
}

/// One process's duty cycle. The budget is spent over a period, not a second: a burst (a
/// program's start, a few thousand launches at once) that stays within the period's hits is
/// counted exactly; a sustained rate over the budget is cut as soon as it has spent it.
#[derive(Debug, Clone, PartialEq)]
pub struct DutyCycle {
    /// Seconds into the current period.
    second: u32,
    /// Seconds of the period the probes are attached (the first ones).
    on_secs: u32,
    /// Hits counted in this period's attached seconds, and how many seconds those were.
    spent: f64,
    measured: u32,
    /// Seconds off a period must have at least: its probes' last detach took that long, and
    /// they cannot be attached again before it ends.
    pub min_off: u32,
}

impl Default for DutyCycle {
    fn default() -> Self {
        Self { second: 0, on_secs: PERIOD_SECS, spent: 0.0, measured: 0, min_off: 0 }
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

    /// A second passed; `rate`: the process's hits in it, when the probes were attached
    /// (`None`: they were not). `limit`: hits a second, on average over a period. Returns
    /// whether they are attached for the next second.
    pub fn next(&mut self, rate: Option<f64>, limit: f64) -> bool {
        if let Some(r) = rate {
            self.spent += r;
            self.measured += 1;
            // The period's budget spent while fully on: cut now, not at the period's end.
            if !self.estimating() && self.spent > limit * f64::from(PERIOD_SECS) {
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

    /// A new period, attached for the share of it the budget pays for at the rate measured in
    /// the last one's attached seconds.
    fn start_period(&mut self, limit: f64) {
        let rate = if self.measured == 0 { 0.0 } else { self.spent / f64::from(self.measured) };
        let fraction = if rate <= limit { 1.0 } else { limit / rate };
        self.on_secs = ((fraction * f64::from(PERIOD_SECS)).floor() as u32).clamp(1, PERIOD_SECS);
        if self.on_secs < PERIOD_SECS {
            self.on_secs = self.on_secs.min(PERIOD_SECS.saturating_sub(self.min_off)).max(1);
        }
        self.second = 0;
        self.spent = 0.0;
        self.measured = 0;
    }
}

impl Recorder {
    /// The rate guard, per process: each decides from its own calls whether it is counted the
    /// coming second (`CUDA_GATE`); a file's probes stay attached while any of its processes
    /// is counted, and go while none is (the trap is what costs). `rates`: calls a second per
    /// process in the drain just done. Records each process's coming interval.
    pub(super) fn guard(
        &mut self,
        collector: &mut Collector,
        rates: &HashMap<u32, f64>,
        read: &HashMap<u32, Interval>,
    ) {
        for file in self.files.values_mut() {
            file.settle();
        }
        let mut wanted_on: HashMap<u32, bool> = HashMap::with_capacity(self.procs.len());
        for (&pid, p) in &mut self.procs {
            // Only an interval counted whole says how fast the process calls.
            let measured = read.get(&pid).is_some_and(|i| i.attached).then(|| rates.get(&pid).copied().unwrap_or(0.0));
            if let Some(r) = measured {
                p.rate = r;
            }
            let was = p.duty.estimating();
            p.limit = match self.max_calls_per_sec {
                Some(l) => l,
                None => budget(p.cpu.update(pid)),
            };
            // Off long enough for its libraries' probes to be gone before they come back.
            let files = [Some(&p.file), p.runtime.as_ref()].into_iter().flatten().filter_map(|f| self.files.get(f));
            p.duty.min_off = files.map(|f| f.detach_secs).max().unwrap_or(0);
            let on = p.duty.next(measured, p.limit);
            if p.duty.estimating() != was {
                let path = self.files.get(&p.file).map(|f| f.path.display().to_string()).unwrap_or_default();
                if p.duty.estimating() {
                    tracing::warn!(
                        library = %path,
                        pid,
                        calls_per_sec = p.rate.round(),
                        limit = p.limit.round(),
                        attached_percent = (p.duty.fraction() * 100.0).round(),
                        "CUDA calls faster than the probes' budget: probes attached part of the time, counts are \
                         estimates scaled to the whole time (this process's only)"
                    );
                } else {
                    tracing::info!(library = %path, pid, "CUDA calls within the budget again: probes always on, counts exact");
                }
            }
            // Off now; on below, once its probes are attached.
            if !on && !p.gated {
                collector.cuda_gate(pid, true);
                p.gated = true;
            }
            wanted_on.insert(pid, on);
        }
        for file in self.files.values_mut() {
            if file.pids.is_empty() {
                if file.links.is_some() {
                    tracing::info!(library = %file.path.display(), "no process maps the CUDA library any more: probes removed");
                    file.detach(collector);
                }
                continue;
            }
            // A process waiting for its driver has its runtime's probes (it calls nothing yet).
            let wanted =
                file.pids.iter().any(|p| wanted_on.get(p).copied().unwrap_or(false) || self.early.contains_key(p));
            match (wanted, file.links.is_some()) {
                (false, true) => file.detach(collector),
                (true, false) if file.attachable() => attach(collector, file),
                _ => {}
            }
        }
        let late = Instant::now().duration_since(self.last_drain).as_secs_f64();
        for (&pid, p) in &mut self.procs {
            let attached = self.files.get(&p.file).is_some_and(|f| f.links.is_some());
            let mut late_secs = 0.0;
            if wanted_on.get(&pid).copied().unwrap_or(false) && p.gated && attached {
                collector.cuda_gate(pid, false);
                p.gated = false;
                late_secs = late;
            }
            let counted = !p.gated && attached;
            let now =
                Interval { attached: counted, estimating: p.duty.estimating(), fraction: p.duty.fraction(), late_secs };
            p.intervals.push_back(now);
            if p.intervals.len() > 3 {
                p.intervals.pop_front();
            }
        }
        // A file whose probes are still going stays, so that a process mapping it meanwhile does
        // not get a second set.
        self.files
            .retain(|_, f| !f.pids.is_empty() || f.links.is_some() || f.detaching.as_ref().is_some_and(|d| !d.done()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `secs` seconds at `rate` (attached or not, as the cycle says); the seconds on.
    fn run(d: &mut DutyCycle, secs: u32, rate: f64, limit: f64) -> u32 {
        let mut attached = true;
        let mut on = 0;
        for _ in 0..secs {
            attached = d.next(attached.then_some(rate), limit);
            on += u32::from(attached);
        }
        on
    }

    #[test]
    fn a_process_within_the_budget_keeps_its_probes_and_exact_counts() {
        let mut d = DutyCycle::default();
        assert_eq!(run(&mut d, 35, 9_000.0, 10_000.0), 35);
        assert!(!d.estimating());
        assert_eq!(d.fraction(), 1.0);
    }

    #[test]
    fn a_burst_within_the_periods_budget_is_counted_exactly() {
        // A program's start: 25,000 launches in one second, then a few a second.
        let mut d = DutyCycle::default();
        assert!(d.next(Some(25_000.0), 3_000.0));
        assert_eq!(run(&mut d, 30, 100.0, 3_000.0), 30);
        assert!(!d.estimating());
    }

    #[test]
    fn a_process_over_the_budget_is_probed_the_share_of_time_the_budget_pays_for() {
        let mut d = DutyCycle::default();
        // 25,000 launches a second against 10,000: the period's 100,000 spent in the fifth
        // second, then 4 seconds of 10.
        for _ in 0..4 {
            assert!(d.next(Some(25_000.0), 10_000.0));
            assert!(!d.estimating());
        }
        assert!(d.next(Some(25_000.0), 10_000.0));
        assert!(d.estimating());
        assert_eq!(d.fraction(), 0.4);
        let mut on = 0;
        for _ in 0..PERIOD_SECS * 3 {
            if d.next(Some(25_000.0), 10_000.0) {
                on += 1;
            }
        }
        assert_eq!(on, 12, "4 of every 10 seconds");
    }

    #[test]
    fn a_launch_bound_loop_is_held_to_a_percent_of_its_cpu() {
        // `cargo xtask bench cuda-step`: 13,200 launches a second on a whole core.
        let mut d = DutyCycle::default();
        let limit = budget(1.0);
        assert!((2_200.0..2_350.0).contains(&limit), "{limit}");
        run(&mut d, 60, 13_200.0, limit);
        // 2,270 of 13,200 a second: 17 % of the time, one whole second of ten.
        assert_eq!(d.fraction(), 0.1);
        assert_eq!(run(&mut d, 100, 13_200.0, limit), 10);
        // Half a core, half the budget: the probes' share of its CPU is what is held.
        assert!((budget(0.5) - limit / 2.0).abs() < 1.0);
        // Eight cores, eight times; a process that waits on its GPU, the floor.
        assert!((budget(8.0) - 8.0 * limit).abs() < 1.0);
        assert_eq!(budget(0.02), FLOOR_PER_SEC);
    }

    #[test]
    fn a_process_cpu_time_is_read_from_its_stat() {
        let me = std::process::id();
        let before = cpu_ticks(me).expect("this process's stat");
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(100) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
        }
        assert!(cpu_ticks(me).unwrap() > before, "100 ms of CPU is at least a tick");
        assert_eq!(cpu_ticks(u32::MAX), None);
    }

    #[test]
    fn the_probes_come_back_fully_once_the_rate_falls() {
        let mut d = DutyCycle::default();
        run(&mut d, 3, 50_000.0, 10_000.0);
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
        run(&mut d, 10, hits(&key(kind::LAUNCH, func::STUB | 1), 7_000) as f64, 12_000.0);
        assert!(d.estimating());
    }

    #[test]
    fn the_off_seconds_cover_the_last_detach() {
        // 12,000 a second against 10,000: 8 seconds of 10, unless the probes take 3 s to go.
        let mut d = DutyCycle::default();
        run(&mut d, 20, 12_000.0, 10_000.0);
        assert_eq!(d.on_secs, 8);
        d.min_off = 3;
        run(&mut d, 10, 12_000.0, 10_000.0);
        assert_eq!(d.on_secs, 7);
        // Never below a second on; a process within its budget is not cut for it.
        d.min_off = 12;
        run(&mut d, 10, 12_000.0, 10_000.0);
        assert_eq!(d.on_secs, 1);
        let mut d = DutyCycle { min_off: 5, ..DutyCycle::default() };
        assert_eq!(run(&mut d, 20, 9_000.0, 10_000.0), 20);
    }

    #[test]
    fn even_a_flood_keeps_one_second_of_ten() {
        let mut d = DutyCycle::default();
        d.next(Some(10_000_000.0), 10_000.0);
        assert_eq!(d.on_secs, 1);
    }
}
