//! What /metrics shows of the pipeline, read from it in one piece ([`Pipeline::figures`]): its
//! samples per CPU, the ring-to-disk latency of its flushes, what its writer holds, its
//! symbolizer's caches, the unwind stage's tables and the detectors' figures. The daemon's
//! stage publishes it on every flush tick; `serve::metrics` renders it.

use std::collections::{BTreeMap, VecDeque};

use super::Pipeline;

/// Flushes over which the ring-to-disk latency's p50 and maximum are taken.
const LATENCY_WINDOW: usize = 120;

/// The pipeline's figures at one moment.
#[derive(Debug, Default, Clone)]
pub struct Figures {
    /// Per CPU since start: busy, idle and lost samples.
    pub per_cpu: BTreeMap<u32, (u64, u64, u64)>,
    /// Ring-to-disk latency over the last flushes: p50 and maximum, seconds.
    pub ring_to_disk_seconds: Option<(f64, f64)>,
    /// Every flush's ring-to-disk latency since start: their sum (seconds) and count (the
    /// summary's `_sum` and `_count`).
    pub ring_to_disk_total: (f64, u64),
    /// Samples held in memory, not yet written.
    pub pending_samples: u64,
    /// The symbolizer's caches and counters.
    pub symbols: crate::symbolize::Stats,
    /// The unwind stage's tables, when unwind tables are in use.
    pub unwind: Option<crate::unwind::registry::Stats>,
    pub detectors: crate::detect::Figures,
}

impl Pipeline {
    pub fn figures(&self) -> Figures {
        Figures {
            per_cpu: self.per_cpu.clone(),
            ring_to_disk_seconds: self.latencies.p50_max(),
            ring_to_disk_total: (self.latencies.sum_ns as f64 / 1e9, self.latencies.count),
            pending_samples: self.writer.pending_samples() as u64,
            symbols: self.symbolizer.stats(),
            unwind: self.unwind.as_ref().map(crate::unwind::Notifier::stats),
            detectors: self.engine.figures(),
        }
    }
}

/// Ring-to-disk latencies of the flushes that wrote samples: the last [`LATENCY_WINDOW`], and
/// the sum and count of all since start.
#[derive(Debug, Default)]
pub(super) struct Latencies {
    window: VecDeque<u64>,
    sum_ns: u128,
    count: u64,
}

impl Latencies {
    pub(super) fn push(&mut self, ns: u64) {
        if self.window.len() == LATENCY_WINDOW {
            self.window.pop_front();
        }
        self.window.push_back(ns);
        self.sum_ns += u128::from(ns);
        self.count += 1;
    }

    /// The window's p50 and maximum, seconds (`None`: no flush wrote samples yet).
    fn p50_max(&self) -> Option<(f64, f64)> {
        let mut sorted: Vec<u64> = self.window.iter().copied().collect();
        sorted.sort_unstable();
        let p50 = sorted.get(sorted.len().saturating_sub(1) / 2)?;
        let max = sorted.last()?;
        Some((*p50 as f64 / 1e9, *max as f64 / 1e9))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_keeps_the_last_flushes_and_the_totals_keep_all() {
        let mut l = Latencies::default();
        assert_eq!(l.p50_max(), None);
        for ns in 1..=(LATENCY_WINDOW as u64 + 10) {
            l.push(ns * 1_000_000_000);
        }
        // 11..=130 s in the window: the lower middle and the last.
        assert_eq!(l.p50_max(), Some((70.0, 130.0)));
        assert_eq!(l.count, 130);
        assert_eq!(l.sum_ns, (1..=130u128).sum::<u128>() * 1_000_000_000);
    }
}
