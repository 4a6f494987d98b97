//! The upkeep stage: its own thread for the slow, file-heavy chores, so none of them delays the
//! pipeline: retention and rollup, the store's size, the zombie memory cgroup count (a walk of
//! cgroupfs under v1), the CPU quota cgroups' throttling counters, the daemon's own RSS and CPU,
//! and the kernel log.

use std::{
    os::fd::AsRawFd,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc::Sender,
    },
    time::{Duration, Instant},
};

use super::{clock, stage::Control};
use crate::{
    collect::{
        kmsg::{Event, Kmsg},
        memcg::MemcgCounter,
    },
    config::Reloadable,
    detect::{self, throttle::scan::Scanner},
    serve::metrics::{Part, Upkeep as Figures},
    store,
    timespec::now_ns,
};

/// How often retention and rollup are looked at (each has its own period, 5 s and more, and
/// its budget per run; while writing fails, retention runs at each look). Kernel log lines
/// wake the stage at once. Every wakeup counts at 99 Hz: this was 2 a second, then 1.
const MAINTAIN_EVERY: Duration = Duration::from_secs(5);
/// How often the store is measured, the zombie count read and the quota cgroups' counters.
const MEASURE_EVERY: Duration = Duration::from_secs(5);

pub struct Upkeep {
    pub data_dir: PathBuf,
    pub settings: Arc<Mutex<Reloadable>>,
    /// What /metrics shows of the store and the daemon's own cost: this stage's to write.
    pub figures: Part<Figures>,
    /// NVIDIA Xid faults the kernel log reports, counted for /metrics.
    pub xids: crate::gpu_readings::XidCounts,
    pub control: Sender<Control>,
    pub write_failing: Arc<AtomicBool>,
    pub stop: Arc<AtomicBool>,
    pub kmsg: Option<Kmsg>,
    /// Where the memory cgroup count goes for the kernel counters stage (read once, used twice).
    pub memcg_latest: super::kernel_counters::LatestMemcg,
}

impl Upkeep {
    pub fn spawn(self) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new().name("upkeep".into()).spawn(move || self.run())
    }

    fn run(mut self) {
        let mut maintenance = store::maintenance::Maintenance::new(&self.data_dir);
        let mut memcgs = MemcgCounter::default();
        let mut quotas = Scanner::default();
        let mut measured_at: Option<Instant> = None;
        let mut pruned_at: Option<Instant> = None;
        let mut first_sample: Option<(u64, u64)> = None;
        while !self.stop.load(Ordering::Acquire) {
            self.wait_for_kmsg(MAINTAIN_EVERY);
            if let Some(k) = self.kmsg.as_mut() {
                record_kmsg(k, &self.data_dir, &self.xids);
            }
            let (retention, rollup_after) = match self.settings.lock() {
                Ok(s) => (s.retention, s.rollup_after),
                Err(_) => continue,
            };
            maintenance.run(&self.data_dir, &retention, rollup_after, self.write_failing.load(Ordering::Relaxed));
            if pruned_at.is_none_or(|t| t.elapsed() >= PRUNE_EVERY) {
                pruned_at = Some(Instant::now());
                prune_findings(&self.data_dir, &retention);
            }
            if measured_at.is_none_or(|t| t.elapsed() >= MEASURE_EVERY) {
                measured_at = Some(Instant::now());
                let now = now_ns();
                let count = memcgs.read(now);
                if let Some(c) = count {
                    *self.memcg_latest.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), c));
                }
                if self.control.send(Control::Zombies(now, count)).is_err() {
                    return; // the pipeline stage is gone; the supervisor says why
                }
                let readings = quotas.read();
                if self.control.send(Control::Throttle(now_ns(), readings)).is_err() {
                    return;
                }
                self.measure(now, &mut first_sample);
            }
        }
    }

    /// Waits up to `timeout` for kernel log lines (or just waits, without /dev/kmsg).
    fn wait_for_kmsg(&self, timeout: Duration) {
        match &self.kmsg {
            Some(k) => {
                let mut fd = libc::pollfd { fd: k.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut fd, 1, timeout.as_millis() as i32) };
            }
            None => std::thread::sleep(timeout),
        }
    }

    /// The store's size and span and the daemon's own usage, for /metrics. The span runs from
    /// the first block, not the start of its minute's file; `first` keeps it per first file (it
    /// changes when retention removes that file).
    fn measure(&self, now: u64, first: &mut Option<(u64, u64)>) {
        let segments = store::reader::list_segments(&self.data_dir).unwrap_or_default();
        let bytes = segments.iter().map(|(_, p)| std::fs::metadata(p).map_or(0, |m| m.len())).sum();
        if let Some(&(segment, _)) = segments.first()
            && first.is_none_or(|(s, _)| s != segment)
        {
            let start = store::Store::open(&self.data_dir).and_then(|mut s| s.first_start()).ok().flatten();
            *first = start.map(|t| (segment, t));
        }
        let span = first.map_or(0.0, |(_, t)| now.saturating_sub(t) as f64 / 1e9);
        let (rss, cpu_time) = clock::self_usage();
        self.figures.set(Figures {
            store_bytes: bytes,
            store_span_seconds: span,
            cpu_seconds: cpu_time.as_secs_f64(),
            rss_bytes: rss,
        });
    }
}

/// Kernel log lines that match a pattern become events.
/// How often findings and events are pruned to the store's retention.
const PRUNE_EVERY: Duration = Duration::from_secs(300);

/// Findings and events live as long as the samples they describe: what ended before the oldest
/// segment the store keeps (or before the age limit) goes.
fn prune_findings(data_dir: &std::path::Path, retention: &store::retention::Retention) {
    let oldest = store::reader::list_segments(data_dir).ok().and_then(|s| s.first().map(|(start, _)| *start));
    let by_age = now_ns().saturating_sub(retention.max_age_ns);
    let cutoff = oldest.map_or(by_age, |o| o.max(by_age));
    match crate::detect::journal::prune(data_dir, cutoff) {
        Ok(0) => {}
        Ok(n) => tracing::info!(files = n, "hours of findings and events older than the store's data removed"),
        Err(e) => tracing::warn!(error = %e, "findings and events could not be pruned"),
    }
}

fn record_kmsg(k: &mut Kmsg, data_dir: &std::path::Path, xids: &crate::gpu_readings::XidCounts) {
    let offset = clock::unix_offset(libc::CLOCK_MONOTONIC);
    for (r, pattern) in k.read_matches() {
        let ts_ns = (i128::from(r.usec) * 1000 + offset).max(0) as u64;
        let id = format!("event-{}-{}", detect::finding_id_time(ts_ns), r.seq);
        let xid = crate::gpu::xid::parse(&r.message);
        let mut e = Event { id, ts_ns, pattern, message: r.message };
        // A GPU fault: which GPU, and what its number means, in the message itself (which
        // ClickHouse and OTLP carry as they are); a fatal one is also a finding.
        let fault = xid
            .as_ref()
            .map(|x| crate::gpu::xid::describe(x, &crate::gpu::Inventory::read(data_dir).unwrap_or_default(), &e));
        if let Some((text, finding)) = &fault {
            e.message = format!("{} [{text}]", e.message);
            // Counted for /metrics: a fatal one's finding closes at once, no open gauge shows it.
            let code = xid.as_ref().map_or(0, |x| x.code);
            crate::gpu_readings::count_xid(xids, code, finding.is_some());
        }
        tracing::warn!(event = %e.id, pattern = %e.pattern, "kernel log event: {}", e.message);
        if let Err(err) = detect::journal::record_event(data_dir, &e) {
            tracing::error!(event = %e.id, error = %err, "cannot record an event");
        }
        // NVML's Xid event may have raised this fault's finding already (`gpu::nvml`'s events).
        if let Some((_, Some(finding))) =
            fault.filter(|(_, f)| !f.as_ref().is_some_and(|f| crate::gpu::nvml::already_raised(data_dir, f)))
        {
            tracing::warn!(finding = %finding.id, "{}", finding.summary);
            if let Err(err) = detect::journal::record_finding(data_dir, &finding) {
                tracing::error!(finding = %finding.id, error = %err, "cannot record a finding");
            }
        }
    }
}
