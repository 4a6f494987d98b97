//! The profiling daemon: collect → pipeline (symbolize → detect → store), until SIGINT or SIGTERM.
//! The daemon owns the timing: it drains the ring buffer into the pipeline and flushes it.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use tokio::signal::unix::{SignalKind, signal};

use tokio::io::unix::AsyncFd;

use crate::{
    collect::{
        CollectConfig, CollectError, Collector, CpuCounters,
        kmsg::{Event, Kmsg},
    },
    config::{ConfigFile, Reloadable, StoreFlags},
    detect::{self, Changes, Engine, Machine},
    pipeline::Pipeline,
    store::{self, Meta, StoreError, StoreWriter, format::FORMAT_VERSION, writer::WriterLimits},
    timespec::now_ns,
};

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Collect(#[from] CollectError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot install the {0} handler: {1}")]
    Signal(&'static str, #[source] std::io::Error),
}

pub struct DaemonConfig {
    pub data_dir: PathBuf,
    pub frequency_hz: u64,
    pub ring_bytes: u32,
    /// How often buffered samples are written (and so how fresh queries are).
    pub flush_interval: Duration,
    /// How often the daemon logs a one-line report.
    pub report_interval: Duration,
    /// Thresholds and store bounds; SIGHUP re-reads them from `config_path`.
    pub settings: Reloadable,
    pub config_path: Option<PathBuf>,
    /// Store flags from the command line, which win over the file at every reload.
    pub store_flags: StoreFlags,
    pub limits: WriterLimits,
    /// Kernel log lines matching these become events.
    pub event_patterns: Vec<String>,
    /// Where the UI, JSON API and /metrics listen; `None`: no server.
    pub listen: Option<std::net::SocketAddr>,
}

/// `CLOCK_REALTIME - clock` in ns. BPF stamps samples with boot time (monotonic, counts
/// suspend) and the kernel log with monotonic time; the store keeps wall-clock time. Re-read on
/// every flush so NTP steps are followed.
fn unix_offset(clock: libc::clockid_t) -> i128 {
    let read = |clock| {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: valid clock id and pointer.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
    };
    let from = read(clock);
    read(libc::CLOCK_REALTIME) - from
}

fn boot_to_unix_offset() -> i128 {
    unix_offset(libc::CLOCK_BOOTTIME)
}

/// Resident set size and CPU time of this process, for the report line.
fn self_usage() -> (u64, Duration) {
    let rss = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096);
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (rss, tv(usage.ru_utime) + tv(usage.ru_stime))
}

fn drain(ring: &mut aya::maps::RingBuf<aya::maps::MapData>, pipeline: &mut Pipeline) {
    while let Some(item) = ring.next() {
        pipeline.handle(&item);
    }
}

/// Runs until SIGINT/SIGTERM, then writes what it holds and returns.
pub async fn run(config: DaemonConfig) -> Result<(), DaemonError> {
    // First, so that a SIGTERM at any moment from here on is a clean stop.
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| DaemonError::Signal("SIGINT", e))?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| DaemonError::Signal("SIGTERM", e))?;
    let mut sighup = signal(SignalKind::hangup()).map_err(|e| DaemonError::Signal("SIGHUP", e))?;
    let mut settings = config.settings.clone();
    let _lock = store::create_and_lock(&config.data_dir)?;
    let mut collector =
        Collector::start(&CollectConfig { frequency_hz: config.frequency_hz, ring_bytes: config.ring_bytes })?;
    let cpus = aya::util::nr_cpus().map(|n| n as u32).unwrap_or(collector.cpus.len() as u32);
    Meta {
        format_version: FORMAT_VERSION,
        hostname: std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string(),
        cpus,
        frequency_hz: config.frequency_hz,
        started_ns: now_ns(),
    }
    .write(&config.data_dir)?;
    tracing::info!(
        cpus = collector.cpus.len(),
        frequency_hz = config.frequency_hz,
        data_dir = %config.data_dir.display(),
        flush_ms = config.flush_interval.as_millis() as u64,
        "profiling started"
    );

    let mut pipeline = Pipeline::new(
        StoreWriter::with_limits(&store::segments_dir(&config.data_dir), config.limits),
        Engine::new(Machine { cpus, frequency_hz: config.frequency_hz }, config.settings.thresholds.clone()),
        boot_to_unix_offset(),
    );
    let live = std::sync::Arc::new(std::sync::Mutex::new(crate::serve::metrics::Live {
        frequency_hz: config.frequency_hz,
        ..Default::default()
    }));
    if let Some(addr) = config.listen {
        let token = crate::serve::new_token().map_err(|e| StoreError::Io("/dev/urandom".into(), e))?;
        let mut hosts = vec!["localhost".to_string(), "127.0.0.1".to_string(), "[::1]".to_string()];
        hosts.push(match addr.ip() {
            std::net::IpAddr::V6(ip) => format!("[{ip}]"),
            ip => ip.to_string(),
        });
        let state = crate::serve::AppState {
            data_dir: config.data_dir.clone(),
            live: live.clone(),
            token: token.clone(),
            hosts,
        };
        match crate::serve::spawn(addr, state).await {
            Ok(bound) => {
                let url = format!("http://{bound}/#token={token}");
                write_private(&config.data_dir.join(crate::serve::URL_FILE), &url)?;
                tracing::info!(
                    url = %format_args!("http://{bound}/"),
                    "UI, JSON API and /metrics listening (`profiler ui` prints the address with its token)"
                );
            }
            // Profiling matters more than the UI: go on without it.
            Err(e) => tracing::error!(
                address = %addr,
                error = %e,
                "cannot listen; running without the UI (use --listen to pick another address)"
            ),
        }
    }
    let mut store_size = (0u64, 0f64, Instant::now() - Duration::from_secs(60));
    let mut kmsg = match Kmsg::open(&config.event_patterns) {
        // SAFETY: the Kmsg owns its fd for as long as the AsyncFd owns the Kmsg.
        Ok(k) => unsafe { AsyncFd::register_with_interest(k, tokio::io::Interest::READABLE) }.ok(),
        Err(e) => {
            tracing::warn!(error = %e, "kernel log events will not be recorded");
            None
        }
    };
    notify("READY=1");
    let mut last_zombie_check = Instant::now();
    let cgroup_fields = collector.cgroup_fields();
    let mut flush = tokio::time::interval(config.flush_interval);
    flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut report = Report::new(collector.cpus.len());
    let mut last_counters: Vec<CpuCounters> = Vec::new();
    let mut write_failing = false;
    let mut maintenance = store::maintenance::Maintenance::default();

    enum Event {
        Data,
        Cgroup,
        Kmsg,
        Reload,
        Tick,
        Stop(&'static str),
    }
    loop {
        let event = tokio::select! {
            ready = collector.ring.readable_mut() => {
                match ready {
                    Ok(mut guard) => guard.clear_ready(),
                    Err(e) => return Err(CollectError::Poll(e).into()),
                }
                Event::Data
            }
            ready = readable(collector.events.as_mut()) => {
                if let Ok(mut guard) = ready { guard.clear_ready() }
                Event::Cgroup
            }
            ready = readable(kmsg.as_mut()) => {
                if let Ok(mut guard) = ready { guard.clear_ready() }
                Event::Kmsg
            }
            _ = flush.tick() => Event::Tick,
            _ = sigint.recv() => Event::Stop("SIGINT"),
            _ = sigterm.recv() => Event::Stop("SIGTERM"),
            _ = sighup.recv() => Event::Reload,
        };
        drain(collector.ring.get_mut(), &mut pipeline);
        match event {
            Event::Data => continue,
            Event::Cgroup => {
                if let Some(events) = collector.events.as_mut() {
                    let ring = events.get_mut();
                    while let Some(item) = ring.next() {
                        if let Some(mut e) = crate::collect::parse_event(cgroup_fields, &item) {
                            if e.kind == profiler_common::event::PROCESS_EXEC {
                                pipeline.symbolizer.note_exec(e.pid, &e.comm);
                                continue;
                            }
                            e.ts_ns = (e.ts_ns as i128 + pipeline.offset).max(0) as u64;
                            pipeline.engine.zombies.on_event(&e);
                        }
                    }
                }
                continue;
            }
            Event::Kmsg => {
                if let Some(k) = kmsg.as_mut() {
                    record_kmsg(k.get_mut(), &config.data_dir);
                }
                continue;
            }
            Event::Reload => {
                // Sampling and writing go on: only thresholds and bounds change.
                match &config.config_path {
                    None => tracing::info!("SIGHUP: no --config file to reload"),
                    Some(path) => {
                        match ConfigFile::load(path).and_then(|f| Reloadable::from(&f, &config.store_flags)) {
                            Ok(new) => {
                                let thresholds =
                                    if new.thresholds == settings.thresholds { "unchanged" } else { "changed" };
                                let bounds = if new.retention == settings.retention
                                    && new.rollup_after == settings.rollup_after
                                {
                                    "unchanged"
                                } else {
                                    "changed"
                                };
                                tracing::info!(
                                    file = %path.display(),
                                    "SIGHUP: reloaded; detector thresholds {thresholds}, store bounds {bounds}"
                                );
                                pipeline.engine.set_thresholds(new.thresholds.clone());
                                settings = new;
                            }
                            Err(e) => tracing::error!(
                                file = %path.display(),
                                error = %e,
                                "SIGHUP: cannot reload; keeping the previous settings"
                            ),
                        }
                    }
                }
                continue;
            }
            _ => {}
        }
        // Counters: what the kernel side could not deliver since the last tick.
        let mut ring_used_max = 0;
        match collector.counters() {
            Ok(now) => {
                ring_used_max = now.iter().map(|c| c.ring_used_max).max().unwrap_or(0);
                for (cpu, c) in now.iter().enumerate() {
                    let prev = last_counters.get(cpu).copied().unwrap_or_default();
                    let lost = (c.ringbuf_full - prev.ringbuf_full)
                        + (c.kernel_stack_errors - prev.kernel_stack_errors)
                        + (c.user_stack_errors - prev.user_stack_errors);
                    pipeline.writer.add_lost(cpu as u32, lost);
                    pipeline.per_cpu.entry(cpu as u32).or_default().2 += lost;
                    report.lost += lost;
                }
                last_counters = now;
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the kernel side's counters of lost samples"),
        }
        pipeline.offset = boot_to_unix_offset();
        // Detectors: NET_RX figures for this moment, then every second that is complete.
        let now = now_ns();
        if let Some(n) = collector.netrx() {
            pipeline.engine.on_netrx(now, n);
        }
        collector.next_epoch();
        let mut changes = pipeline.tick(now);
        if last_zombie_check.elapsed() >= Duration::from_secs(5) {
            last_zombie_check = Instant::now();
            let z = pipeline.engine.check_zombies(now);
            changes.opened.extend(z.opened);
            changes.closed.extend(z.closed);
        }
        record_findings(&changes, &config.data_dir);
        // The daemon's own figures for /metrics: cheap, but files to open and read, so they go
        // with the store size every 5 s rather than on every tick.
        let measure_self = store_size.2.elapsed() >= Duration::from_secs(5);
        if measure_self {
            let segments = store::reader::list_segments(&config.data_dir).unwrap_or_default();
            let bytes = segments.iter().map(|(_, p)| std::fs::metadata(p).map_or(0, |m| m.len())).sum();
            let span = segments.first().map_or(0.0, |(s, _)| now.saturating_sub(*s) as f64 / 1e9);
            store_size = (bytes, span, Instant::now());
        }
        if let Ok(mut l) = live.lock() {
            if measure_self {
                let (rss, cpu_time) = self_usage();
                l.cpu_seconds = cpu_time.as_secs_f64();
                l.rss_bytes = rss;
            }
            l.cpus = pipeline.per_cpu.clone();
            l.busy_share = pipeline.engine.last_busy_shares().into_iter().collect();
            l.dying_memcgs = pipeline.engine.zombies.series.back().map(|c| c.dying);
            l.open_findings = pipeline.engine.open_counts();
            l.store_bytes = store_size.0;
            l.store_span_seconds = store_size.1;
            l.pending_samples = pipeline.writer.pending_samples() as u64;
            l.ring_used_bytes = ring_used_max;
            l.ring_size_bytes = collector.ring_bytes();
            let symbols = pipeline.symbolizer.stats();
            l.cached_processes = symbols.processes as u64;
            l.cached_modules = symbols.modules as u64;
            l.cached_stacks = symbols.stacks as u64;
            l.cached_names = symbols.names as u64;
        }
        match pipeline.flush(now_ns()) {
            Ok(f) => {
                report.bytes += f.bytes;
                if write_failing {
                    tracing::info!(
                        data_dir = %config.data_dir.display(),
                        dropped_total = pipeline.writer.dropped(),
                        "writing works again; the samples held meanwhile are written"
                    );
                    write_failing = false;
                }
            }
            Err(e) => {
                // Keep sampling and hold what cannot be written (bounded; the oldest go first
                // past the bound); the log says so once, and again when writing works.
                if !write_failing {
                    tracing::error!(
                        error = %e,
                        max_held = config.limits.max_pending,
                        "cannot write samples. Sampling goes on; samples are held in memory (at most max_held, the \
                         oldest dropped beyond that) and written when space returns"
                    );
                    write_failing = true;
                }
            }
        }
        maintenance.run(&config.data_dir, &settings.retention, settings.rollup_after, write_failing);
        if let Event::Stop(signal) = event {
            // Open findings are written with the end they have so far.
            let open = Changes { opened: Vec::new(), closed: pipeline.engine.open_findings() };
            record_findings(&open, &config.data_dir);
            notify("STOPPING=1");
            tracing::info!(signal, "flushed, exiting");
            report.log(&pipeline, store_size.0);
            return Ok(());
        }
        if report.due(config.report_interval) {
            report.log(&pipeline, store_size.0);
            pipeline.symbolizer.expire();
        }
    }
}

/// Writes a root-only file.
fn write_private(path: &std::path::Path, text: &str) -> Result<(), StoreError> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| StoreError::Io(path.to_path_buf(), e))?;
    f.write_all(text.as_bytes()).map_err(|e| StoreError::Io(path.to_path_buf(), e))
}

/// Tells systemd (`Type=notify`) about the daemon's state, when it runs under systemd.
fn notify(state: &str) {
    use std::os::{linux::net::SocketAddrExt, unix::net::UnixDatagram};
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let Ok(sock) = UnixDatagram::unbound() else { return };
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str());
    let sent = match bytes.strip_prefix(b"@") {
        Some(name) => std::os::unix::net::SocketAddr::from_abstract_name(name)
            .and_then(|a| sock.send_to_addr(state.as_bytes(), &a)),
        None => sock.send_to(state.as_bytes(), &path),
    };
    if let Err(e) = sent {
        tracing::warn!(state, error = %e, "cannot notify systemd");
    }
}

/// Readiness of an optional fd; never ready when there is none.
async fn readable<T: std::os::fd::AsRawFd>(
    fd: Option<&mut AsyncFd<T>>,
) -> std::io::Result<tokio::io::unix::AsyncFdReadyMutGuard<'_, T>> {
    match fd {
        Some(fd) => fd.readable_mut().await,
        None => std::future::pending().await,
    }
}

/// Logs and stores what the detectors opened and closed.
fn record_findings(changes: &Changes, data_dir: &std::path::Path) {
    for f in &changes.opened {
        tracing::warn!(finding = %f.id, kind = f.kind.name(), cpu = f.cpu, "finding opened: {}", f.summary);
    }
    for f in &changes.closed {
        let secs = f.end_ns.unwrap_or(f.start_ns).saturating_sub(f.start_ns) as f64 / 1e9;
        tracing::info!(
            finding = %f.id,
            kind = f.kind.name(),
            cpu = f.cpu,
            duration_s = secs.round() as u64,
            "finding closed: {}",
            f.summary
        );
    }
    for f in changes.opened.iter().chain(&changes.closed) {
        if let Err(e) = detect::log::append(data_dir, detect::log::FINDINGS, f) {
            tracing::error!(finding = %f.id, error = %e, "cannot record a finding");
        }
    }
}

/// Kernel log lines that match a pattern become events.
fn record_kmsg(k: &mut Kmsg, data_dir: &std::path::Path) {
    let offset = unix_offset(libc::CLOCK_MONOTONIC);
    for (r, pattern) in k.read_matches() {
        let ts_ns = (i128::from(r.usec) * 1000 + offset).max(0) as u64;
        let id = format!("event-{}-{}", detect::finding_id_time(ts_ns), r.seq);
        let e = Event { id, ts_ns, pattern, message: r.message };
        tracing::warn!(event = %e.id, pattern = %e.pattern, "kernel log event: {}", e.message);
        if let Err(err) = detect::log::append(data_dir, detect::log::EVENTS, &e) {
            tracing::error!(event = %e.id, error = %err, "cannot record an event");
        }
    }
}

/// The periodic self report: one event whose fields are the daemon's figures over the interval.
struct Report {
    cpus: usize,
    since: Instant,
    samples: u64,
    idle: u64,
    lost: u64,
    bytes: u64,
    cpu_time: Duration,
}

impl Report {
    fn new(cpus: usize) -> Self {
        Self { cpus, since: Instant::now(), samples: 0, idle: 0, lost: 0, bytes: 0, cpu_time: self_usage().1 }
    }

    fn due(&self, interval: Duration) -> bool {
        self.since.elapsed() >= interval
    }

    /// `store_bytes`: the store's size as /metrics last measured it.
    fn log(&mut self, p: &Pipeline, store_bytes: u64) {
        let secs = self.since.elapsed().as_secs_f64().max(1e-3);
        let (busy, idle) = (p.samples - self.samples, p.idle - self.idle);
        let (rss, cpu_time) = self_usage();
        let s = p.symbolizer.stats();
        let samples_per_s = (busy + idle) as f64 / secs;
        tracing::info!(
            samples_per_s = round(samples_per_s, 1),
            per_cpu_hz = round(samples_per_s / self.cpus.max(1) as f64, 1),
            busy,
            idle,
            lost = self.lost,
            bytes_written = self.bytes,
            held = p.writer.pending_samples(),
            cpu_pct = round((cpu_time - self.cpu_time).as_secs_f64() / secs * 100.0, 2),
            rss_mib = round(rss as f64 / 1048576.0, 1),
            store_bytes,
            cached_processes = s.processes,
            cached_modules = s.modules,
            cached_stacks = s.stacks,
            cached_names = s.names,
            stack_hits = s.stack_hits,
            stack_total = s.stack_hits + s.stack_misses,
            "self report"
        );
        *self = Self { samples: p.samples, idle: p.idle, ..Self::new(self.cpus) };
    }
}

/// `x` with at most `digits` decimals, so that log fields stay numbers but short.
fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}
