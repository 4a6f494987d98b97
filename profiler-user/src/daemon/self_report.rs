//! The periodic self report: one log event whose fields are the daemon's figures over the
//! interval.

use std::time::{Duration, Instant};

use super::{clock::self_usage, queue::Depth};
use crate::pipeline::Pipeline;

pub struct Report {
    cpus: usize,
    since: Instant,
    samples: u64,
    idle: u64,
    /// Samples lost over the interval (ring full, queue full).
    pub lost: u64,
    pub bytes: u64,
    /// Longest ring-to-disk latency of the interval, ns.
    pub latency_max_ns: u64,
    /// The queue's depth when the report is logged (its maxima are since start).
    pub queue: Depth,
    cpu_time: Duration,
}

impl Report {
    pub fn new(cpus: usize) -> Self {
        Self {
            cpus,
            since: Instant::now(),
            samples: 0,
            idle: 0,
            lost: 0,
            bytes: 0,
            latency_max_ns: 0,
            queue: Depth::default(),
            cpu_time: self_usage().1,
        }
    }

    pub fn due(&self, interval: Duration) -> bool {
        self.since.elapsed() >= interval
    }

    /// `store_bytes`: the store's size as the upkeep stage last measured it.
    pub fn log(&mut self, p: &Pipeline, store_bytes: u64) {
        let secs = self.since.elapsed().as_secs_f64().max(1e-3);
        let (busy, idle) = (p.samples() - self.samples, p.idle() - self.idle);
        let (rss, cpu_time) = self_usage();
        let s = p.symbolizer().stats();
        let samples_per_s = (busy + idle) as f64 / secs;
        tracing::info!(
            samples_per_s = round(samples_per_s, 1),
            per_cpu_hz = round(samples_per_s / self.cpus.max(1) as f64, 1),
            busy,
            idle,
            lost = self.lost,
            queue_records = self.queue.records,
            queue_records_max = self.queue.max_records,
            queue_bytes_max = self.queue.max_bytes,
            ring_to_disk_max_ms = round(self.latency_max_ns as f64 / 1e6, 1),
            bytes_written = self.bytes,
            held = p.writer().pending_samples(),
            cpu_pct = round((cpu_time - self.cpu_time).as_secs_f64() / secs * 100.0, 2),
            rss_mib = round(rss as f64 / 1048576.0, 1),
            store_bytes,
            cached_processes = s.processes,
            cached_modules = s.modules,
            cached_stacks = s.stacks,
            cached_names = s.names,
            files_refused = s.files_refused,
            stack_hits = s.stack_hits,
            stack_total = s.stack_hits + s.stack_misses,
            "self report"
        );
        *self = Self { samples: p.samples(), idle: p.idle(), ..Self::new(self.cpus) };
    }
}

/// `x` with at most `digits` decimals, so that log fields stay numbers but short.
fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}
