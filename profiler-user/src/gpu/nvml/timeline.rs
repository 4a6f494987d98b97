//! The fast tracks' ticks when their values come with times of their own (NVML's samples,
//! `samples`) rather than at each poll: every update is put at its time on the poller's grid
//! (`[gpu] poll_ms`, 100 ms by default: the tracks keep at most the points a second they had when
//! the poller woke ten times a second, whatever the driver's sampling and the GPUs' count), and
//! a tick carries every fast track's value as of that time (a counters tick ends a track it does
//! not name).
//!
//! Ticks are written in time order, once a second: what falls in the grid step of the read
//! (`cut`) or after waits for the next read, whose samples may still fall in that step. An update
//! that comes after its step was written (a sample NVML hands over late) goes to the next step,
//! never before a written one.

use super::samples::Sampled;
use crate::gpu_readings::Reading;

/// A fast quantity of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Util,
    MemUtil,
    SmClock,
    ClockEvents,
    Power,
}

/// A fast track's value (`None`: no value any more: the call failed, the GPU is gone) from
/// `ts_ns` on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Update {
    pub ts_ns: u64,
    pub gpu: u32,
    pub field: Field,
    pub value: Option<f64>,
}

pub struct Timeline {
    grid_ns: u64,
    /// Updates not written yet, in the step of the last read or after.
    pending: Vec<Update>,
    /// The step of the last tick written.
    last: Option<u64>,
    /// Each GPU's fast values as of the last tick, by index.
    state: Vec<Reading>,
}

impl Timeline {
    pub fn new(grid_ns: u64) -> Self {
        Self { grid_ns: grid_ns.max(1_000_000), pending: Vec::new(), last: None, state: Vec::new() }
    }

    pub fn add(&mut self, updates: impl IntoIterator<Item = Update>) {
        self.pending.extend(updates);
    }

    /// The GPUs the fast tracks are of.
    pub fn gpus(&self) -> Vec<u32> {
        self.state.iter().map(|r| r.index).collect()
    }

    /// The step an update at `ts_ns` is written at: its own, or the one after the last written.
    fn step(&self, ts_ns: u64) -> u64 {
        let own = ts_ns / self.grid_ns * self.grid_ns;
        match self.last {
            Some(last) if own <= last => last + self.grid_ns,
            _ => own,
        }
    }

    /// Writes, through `tick(step's time, every GPU's fast values then)`, the steps before the
    /// one holding `now_ns`, in time order; keeps the rest.
    pub fn drain<E>(&mut self, now_ns: u64, mut tick: impl FnMut(u64, &[Reading]) -> Result<(), E>) -> Result<(), E> {
        let cut = now_ns / self.grid_ns * self.grid_ns;
        self.pending.sort_by_key(|u| u.ts_ns);
        let mut i = 0;
        let mut result = Ok(());
        while i < self.pending.len() {
            let step = self.step(self.pending[i].ts_ns);
            if step >= cut {
                break;
            }
            while i < self.pending.len() && self.step(self.pending[i].ts_ns) == step {
                let u = self.pending[i];
                self.apply(u);
                i += 1;
            }
            self.last = Some(step);
            // A failed write is said by the caller; the next ticks are still tried.
            result = result.and(tick(step, &self.state));
        }
        self.pending.drain(..i);
        result
    }

    fn apply(&mut self, u: Update) {
        let at = match self.state.binary_search_by_key(&u.gpu, |r| r.index) {
            Ok(i) => i,
            Err(i) => {
                self.state.insert(i, Reading { index: u.gpu, ..Default::default() });
                i
            }
        };
        let r = &mut self.state[at];
        match u.field {
            Field::Util => r.util = u.value,
            Field::MemUtil => r.mem_util = u.value,
            Field::SmClock => r.sm_clock_mhz = u.value,
            Field::ClockEvents => r.clock_events = u.value.map(|v| v as u64),
            Field::Power => r.power_w = u.value,
        }
    }
}

/// One read's updates: each GPU's samples at their times, and what was read at the wake-up
/// (`now_ns`: SM clock, clock events, power); a GPU in `known` missing from `readings` (lost)
/// has its fast tracks ended.
pub fn updates(sampled: &[Sampled], readings: &[Reading], now_ns: u64, known: &[u32]) -> Vec<Update> {
    let mut out = Vec::new();
    let at = |ts_ns: u64, gpu: u32, field: Field, value: Option<f64>| Update { ts_ns, gpu, field, value };
    for g in sampled {
        out.extend(g.util.iter().map(|&(t, v)| at(t, g.index, Field::Util, Some(v))));
        out.extend(g.mem.iter().map(|&(t, v)| at(t, g.index, Field::MemUtil, Some(v))));
    }
    for r in readings {
        out.push(at(now_ns, r.index, Field::SmClock, r.sm_clock_mhz));
        out.push(at(now_ns, r.index, Field::ClockEvents, r.clock_events.map(|b| b as f64)));
        out.push(at(now_ns, r.index, Field::Power, r.power_w));
    }
    for &gpu in known.iter().filter(|&&g| !readings.iter().any(|r| r.index == g)) {
        let fields = [Field::Util, Field::MemUtil, Field::SmClock, Field::ClockEvents, Field::Power];
        out.extend(fields.map(|f| at(now_ns, gpu, f, None)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_795_000_000_000_000_000;
    const MS: u64 = 1_000_000;

    fn util(ms: u64, v: f64) -> Update {
        Update { ts_ns: S + ms * MS, gpu: 0, field: Field::Util, value: Some(v) }
    }

    fn ticks(t: &mut Timeline, now_ms: u64) -> Vec<(u64, Option<f64>, Option<f64>)> {
        let mut out = Vec::new();
        t.drain(now_ms * MS + S, |ts, state| -> Result<(), ()> {
            out.push(((ts - S) / MS, state[0].util, state[0].power_w));
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn samples_are_written_at_their_step_with_the_values_read_once_a_second() {
        let mut t = Timeline::new(100 * MS);
        // A second of samples every 1/6 s, and power read at the wake-up (1003 ms).
        t.add([0, 167, 333, 500, 667, 833, 1000].map(|ms| util(ms, ms as f64 / 10.0)));
        t.add([Update { ts_ns: S + 1003 * MS, gpu: 0, field: Field::Power, value: Some(350.0) }]);
        assert_eq!(
            ticks(&mut t, 1003),
            [
                (0, Some(0.0), None),
                (100, Some(16.7), None),
                (300, Some(33.3), None),
                (500, Some(50.0), None),
                (600, Some(66.7), None),
                (800, Some(83.3), None)
            ]
        );
        // The step of the read waited: the next second's samples may still fall in it.
        t.add([1100, 1167].map(|ms| util(ms, ms as f64 / 10.0)));
        assert_eq!(ticks(&mut t, 2002), [(1000, Some(100.0), Some(350.0)), (1100, Some(116.7), Some(350.0))]);
    }

    #[test]
    fn a_sample_handed_over_late_goes_after_the_ticks_written() {
        let mut t = Timeline::new(100 * MS);
        t.add([util(0, 1.0), util(150, 2.0)]);
        assert_eq!(ticks(&mut t, 1000).len(), 2);
        // 120 ms: its step (100) was written; it goes to 200, never before.
        t.add([util(120, 3.0), util(400, 4.0)]);
        assert_eq!(ticks(&mut t, 2000), [(200, Some(3.0), None), (400, Some(4.0), None)]);
    }

    #[test]
    fn two_gpus_share_the_ticks_and_a_gone_value_ends_its_track() {
        let mut t = Timeline::new(100 * MS);
        t.add([util(10, 5.0), Update { ts_ns: S + 30 * MS, gpu: 1, field: Field::Util, value: Some(7.0) }]);
        t.add([Update { ts_ns: S + 250 * MS, gpu: 1, field: Field::Util, value: None }]);
        let mut seen = Vec::new();
        t.drain(S + 1000 * MS, |ts, state| -> Result<(), ()> {
            seen.push(((ts - S) / MS, state.iter().map(|r| (r.index, r.util)).collect::<Vec<_>>()));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, [(0, vec![(0, Some(5.0)), (1, Some(7.0))]), (200, vec![(0, Some(5.0)), (1, None)])]);
        assert_eq!(t.gpus(), [0, 1]);
    }
}
