//! The profiling daemon, in stages that each run on their own thread, so that no slow step
//! delays draining the kernel's ring buffer:
//!
//! - `reader`: waits on the ring buffers and copies their records into a bounded queue
//!   (`queue`), nothing else; what does not fit is dropped and counted per CPU and second
//!   (`drops`);
//! - `stage`: the pipeline (symbolize → detect → store), fed by the queue; flushes on the flush
//!   interval, reads the kernel's counters (`counters`), writes findings, publishes /metrics;
//! - `upkeep`: retention, rollup, the store's size, the zombie cgroup count, the kernel log;
//! - the HTTP server, on a small runtime of its own;
//! - the OTLP shipper (`ship::otlp`), when an endpoint is set: it follows the store, so it
//!   never touches the stages above.
//!
//! [`run`] is the supervisor: it starts them, turns signals into a clean stop (reader first, so
//! the pipeline writes everything queued) or a reload, and says which stage died if one does.

mod clock;
pub mod counters;
pub mod drops;
mod kernel_counters;
pub mod queue;
mod reader;
mod report;
pub mod stage;
mod upkeep;

use std::{
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::Duration,
};

use tokio::signal::unix::{SignalKind, signal};

use crate::{
    collect::{CollectConfig, CollectError, Collector, kmsg::Kmsg},
    config::{ConfigFile, Reloadable, StoreFlags},
    detect::{self, Changes, Machine},
    store::{self, Meta, StoreError, format::FORMAT_VERSION, writer::WriterLimits},
    timespec::now_ns,
};

/// Test only: microseconds the pipeline sleeps before symbolizing each stack, to stand in for a
/// slow symbolizer (tests/tests/stages.rs). Not a setting: never set it in production.
pub const SYMBOLIZE_DELAY_ENV: &str = "PROFILER_TEST_SYMBOLIZE_DELAY_US";
/// Test only: the queue's bound in bytes (default [`QUEUE_BYTES`]), so a test can fill it.
pub const QUEUE_BYTES_ENV: &str = "PROFILER_TEST_QUEUE_BYTES";
/// The queue between the reader and the pipeline holds at most this many bytes of records
/// (samples of up to ~2 KiB each, ~300 bytes typical): 8 times the default ring, about half a second of a
/// 192-CPU node at 999 Hz with deep stacks, more of anything smaller.
pub const QUEUE_BYTES: u64 = 32 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Collect(#[from] CollectError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot install the {0} handler: {1}")]
    Signal(&'static str, #[source] std::io::Error),
    #[error("cannot start the {0} thread: {1}")]
    Thread(&'static str, #[source] std::io::Error),
    #[error(
        "the {0} stage stopped unexpectedly ({1}); the daemon stops with it: see the log above, and report it if it is a bug"
    )]
    StageDied(&'static str, String),
}

pub struct DaemonConfig {
    /// How the memory budget is spent (see `memory`).
    pub memory: crate::memory::Plan,
    pub data_dir: PathBuf,
    pub frequency_hz: u64,
    pub ring_bytes: u32,
    /// Rows of unwind tables in the kernel (0: frame pointers only).
    pub unwind_rows: u32,
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
    /// This node's name.
    pub node: String,
    /// The host's /var/log (the kubelet's `containers/` and `pods/`).
    pub kubelet_logs: PathBuf,
    /// Where profiles are pushed over OTLP; `None`: nowhere.
    pub otlp: Option<crate::config::Otlp>,
    /// Where to ship samples, if anywhere.
    pub clickhouse: Option<crate::ship::clickhouse::Config>,
    /// Whether kernel counters (softnet, softirqs, PSI, ...) are read each second and stored.
    pub kernel_counters: bool,
    /// The flight recorder's frequency, length and number of recordings kept.
    pub flight: crate::flight::Settings,
    /// The GPU poller's library and interval; `None`: GPU tracks off.
    pub gpu: Option<crate::config::Gpu>,
    /// Whether `libcuda.so.1` is probed in the processes mapping it (`gpu::cuda`).
    pub cuda: bool,
    /// The CUDA probes' rate guard: calls a second per process above which they are duty-cycled.
    pub cuda_max_calls: f64,
}

/// Runs until SIGINT/SIGTERM, then writes what it holds and returns.
pub async fn run(config: DaemonConfig) -> Result<(), DaemonError> {
    // First, so that a SIGTERM at any moment from here on is a clean stop.
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| DaemonError::Signal("SIGINT", e))?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| DaemonError::Signal("SIGTERM", e))?;
    let mut sighup = signal(SignalKind::hangup()).map_err(|e| DaemonError::Signal("SIGHUP", e))?;
    let _lock = store::create_and_lock(&config.data_dir)?;
    config.memory.apply();
    tracing::info!(
        limit_mib = config.memory.limit >> 20,
        pools_mib = config.memory.pools >> 20,
        "{}",
        config.memory.describe()
    );
    crate::memory::watch::spawn(config.memory.anon_target()).map_err(|e| DaemonError::Thread("memory-watch", e))?;
    // The symbolizer keeps up to ~770 files open and the server computes its connection cap
    // from the limit: raise the soft limit to the hard one whether or not the server runs.
    crate::serve::limits::raise_nofile();
    close_abandoned(&config.data_dir);
    let mut collector = Collector::start(&CollectConfig {
        frequency_hz: config.frequency_hz,
        ring_bytes: config.ring_bytes,
        unwind_rows: config.unwind_rows,
    })?;
    let rings = collector.take_rings().ok_or(CollectError::Missing("ring buffers"))?;
    // Unwind tables are built on their own thread; the stage ends with the pipeline.
    let (unwind, _unwind_stage) = match collector.take_unwind().map(crate::unwind::spawn) {
        Some(Ok((notifier, stage))) => (Some(notifier), Some(stage)),
        Some(Err(e)) => return Err(DaemonError::Thread("unwind", e)),
        None => (None, None),
    };
    let sampled = collector.cpus().len();
    let cpus = aya::util::nr_cpus().map(|n| n as u32).unwrap_or(sampled as u32);
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
    Meta {
        format_version: FORMAT_VERSION,
        hostname: hostname.clone(),
        node: config.node.clone(),
        cpus,
        frequency_hz: config.frequency_hz,
        started_ns: now_ns(),
    }
    .write(&config.data_dir)?;
    let queue_bytes = test_knob(QUEUE_BYTES_ENV).unwrap_or(QUEUE_BYTES);
    tracing::info!(
        cpus = sampled,
        frequency_hz = config.frequency_hz,
        data_dir = %config.data_dir.display(),
        flush_ms = config.flush_interval.as_millis() as u64,
        queue_bytes,
        "profiling started"
    );

    let live =
        Arc::new(Mutex::new(crate::serve::metrics::Live { frequency_hz: config.frequency_hz, ..Default::default() }));
    let stop = Arc::new(AtomicBool::new(false));
    let write_failing = Arc::new(AtomicBool::new(false));
    let drops = Arc::new(Mutex::new(drops::Drops::default()));
    let (intake, outlet, queue) = queue::bounded(queue_bytes);
    let (control, control_rx) = mpsc::channel();
    let symbolize_delay = test_knob(SYMBOLIZE_DELAY_ENV).map(Duration::from_micros);
    if let Some(d) = symbolize_delay {
        tracing::warn!(
            delay_us = d.as_micros() as u64,
            "{SYMBOLIZE_DELAY_ENV} is set: symbolizing is slowed (test only)"
        );
    }
    let gpu = config.gpu.as_ref().map(|_| crate::gpu::Shared::default());
    live.lock().unwrap_or_else(|p| p.into_inner()).gpu = gpu.clone();
    let runq_latest = kernel_counters::LatestRunq::default();
    let reclaim_latest = kernel_counters::LatestReclaim::default();
    let stage = stage::spawn(
        stage::StageConfig {
            data_dir: config.data_dir.clone(),
            machine: Machine { cpus, frequency_hz: config.frequency_hz },
            thresholds: config.settings.thresholds.clone(),
            limits: config.limits,
            flush_interval: config.flush_interval,
            report_interval: config.report_interval,
            symbolize_delay,
            kubelet_logs: config.kubelet_logs.clone(),
            flight: config.flight,
            node: config.node.clone(),
            cuda: config.cuda,
            cuda_max_calls: config.cuda_max_calls,
        },
        stage::Links {
            outlet,
            queue,
            drops: drops.clone(),
            control: control_rx,
            live: live.clone(),
            write_failing: write_failing.clone(),
            unwind,
            runq_latest: runq_latest.clone(),
            reclaim_latest: reclaim_latest.clone(),
            gpu: gpu.clone(),
        },
        Some(collector),
    )
    .map_err(|e| DaemonError::Thread("pipeline", e))?;
    let reader = reader::Reader {
        intake,
        drops,
        stop: stop.clone(),
        // One drain per flush, which the stage flushes right after: a sample waits at most a
        // flush interval for the store. Each drain wakes two threads, which costs ~150 µs of CPU
        // on a VM: at 99 Hz draining every 50 ms doubled the daemon's CPU per sample
        // (BENCHMARKS.md).
        flush_every: config.flush_interval,
    }
    .spawn(rings)
    .map_err(|e| DaemonError::Thread("ring reader", e))?;
    let settings = Arc::new(Mutex::new(config.settings.clone()));
    let kmsg = match Kmsg::open(&config.event_patterns) {
        Ok(k) => Some(k),
        Err(e) => {
            tracing::warn!(error = %e, "kernel log events will not be recorded");
            None
        }
    };
    let memcg_latest = kernel_counters::LatestMemcg::default();
    let counters = if config.kernel_counters {
        Some(
            kernel_counters::KernelCounters {
                data_dir: config.data_dir.clone(),
                stop: stop.clone(),
                memcg: memcg_latest.clone(),
                runq: runq_latest,
                reclaim: reclaim_latest,
            }
            .spawn()
            .map_err(|e| DaemonError::Thread("kernel counters", e))?,
        )
    } else {
        tracing::info!("kernel counters are off (kernel_counters = false)");
        None
    };
    // Its own thread: a slow or hung driver call delays only the next GPU poll.
    let _gpu_poller = match (&config.gpu, &gpu) {
        (Some(g), Some(shared)) => Some(
            crate::gpu::poll::Poller {
                data_dir: config.data_dir.clone(),
                stop: stop.clone(),
                interval: g.interval,
                library: g.library.clone(),
                shared: shared.clone(),
                kubelet_logs: config.kubelet_logs.clone(),
                live: live.clone(),
            }
            .spawn()
            .map_err(|e| DaemonError::Thread("GPU poller", e))?,
        ),
        _ => {
            tracing::info!("GPU tracks are off (nvml_library = off)");
            let off = crate::gpu::Inventory {
                unavailable: Some("GPU tracks are off (nvml_library = off)".into()),
                ..Default::default()
            };
            let _ = off.write(&config.data_dir);
            None
        }
    };
    let upkeep = upkeep::Upkeep {
        data_dir: config.data_dir.clone(),
        settings: settings.clone(),
        live: live.clone(),
        control: control.clone(),
        write_failing,
        stop: stop.clone(),
        kmsg,
        memcg_latest,
    }
    .spawn()
    .map_err(|e| DaemonError::Thread("upkeep", e))?;
    let (ship_stop, ship_stop_rx) = tokio::sync::watch::channel(false);
    let shipper = match config.otlp.clone() {
        Some(otlp) => Some(
            crate::ship::otlp::Shipper {
                data_dir: config.data_dir.clone(),
                config: otlp,
                host: hostname,
                frequency_hz: config.frequency_hz,
                // A sample reaches the store within a flush interval (the drain before each
                // flush takes it); the margin covers a slow flush.
                settle: config.flush_interval + Duration::from_secs(2),
                live: live.clone(),
                stop: ship_stop_rx,
            }
            .spawn()
            .map_err(|e| DaemonError::Thread("OTLP shipper", e))?,
        ),
        None => None,
    };
    // Its own thread: a slow or absent ClickHouse never holds the pipeline up.
    // Stopped after the pipeline, so the findings it closes on the way out are shipped too.
    let clickhouse_stop = Arc::new(AtomicBool::new(false));
    let clickhouse_shipper = match config.clickhouse.clone() {
        Some(c) => {
            let stats = Arc::new(crate::ship::clickhouse::Stats::default());
            live.lock().unwrap_or_else(|p| p.into_inner()).clickhouse = Some(stats.clone());
            Some(
                crate::ship::clickhouse::spawn(c, stats, clickhouse_stop.clone())
                    .map_err(|e| DaemonError::Thread("shipper", e))?,
            )
        }
        None => None,
    };
    if let Some(addr) = config.listen {
        serve(addr, &config.data_dir, live)?;
    }
    notify("READY=1");

    // A stage that died is noticed within this; every wakeup counts at 99 Hz.
    let mut check = tokio::time::interval(Duration::from_secs(5));
    let mut shipper_gone = false;
    let outcome = loop {
        tokio::select! {
            _ = sigint.recv() => break Ok("SIGINT"),
            _ = sigterm.recv() => break Ok("SIGTERM"),
            _ = sighup.recv() => reload(&config, &settings, &control),
            _ = check.tick() => {
                // The pipeline first: when it dies the reader and upkeep end too, as a consequence.
                let died = [
                    ("pipeline", stage.is_finished()),
                    ("ring reader", reader.is_finished()),
                    ("upkeep", upkeep.is_finished()),
                ];
                if let Some((name, _)) = died.iter().find(|(_, finished)| *finished) {
                    break Err(*name);
                }
                // Pushing is not worth stopping the profiling for: say it, once, and go on.
                if !shipper_gone && shipper.as_ref().is_some_and(|s| s.is_finished()) {
                    shipper_gone = true;
                    tracing::error!("the OTLP shipper stopped (see above); profiles are no longer pushed");
                }
            }
        }
    };
    // Reader first: once it is gone the pipeline writes everything queued, then ends.
    stop.store(true, Ordering::Release);
    notify("STOPPING=1");
    let reader_result = reader.join();
    let summary = stage.join();
    let upkeep_result = upkeep.join();
    // Counters are not worth failing the stop for: a panic there was logged when it happened.
    if counters.is_some_and(|c| c.join().is_err()) {
        tracing::error!("the kernel counters stage had stopped (it panicked)");
    }
    let _ = ship_stop.send(true);
    clickhouse_stop.store(true, Ordering::Release);
    if shipper.is_some_and(|s| s.join().is_err()) {
        tracing::error!("the OTLP shipper panicked");
    }
    // A shipper that panicked has only stopped shipping: the store has everything.
    if let Some(Err(_)) = clickhouse_shipper.map(|s| s.join()) {
        tracing::error!("the ClickHouse shipper had stopped (it panicked): see the log above");
    }
    let died = |name: &'static str, panic: Box<dyn std::any::Any + Send>| {
        let why = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "it panicked".into());
        DaemonError::StageDied(name, why)
    };
    reader_result.map_err(|p| died("ring reader", p))?;
    let summary = summary.map_err(|p| died("pipeline", p))?;
    upkeep_result.map_err(|p| died("upkeep", p))?;
    match outcome {
        Ok(signal) => {
            tracing::info!(signal, samples = summary.samples, idle = summary.idle, "flushed, exiting");
            Ok(())
        }
        Err(name) => Err(DaemonError::StageDied(name, "it ended by itself".into())),
    }
}

/// A test-only number from the environment.
fn test_knob(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok()
}

/// SIGHUP: re-reads the file's thresholds and store bounds. Sampling and writing go on.
fn reload(config: &DaemonConfig, settings: &Mutex<Reloadable>, control: &mpsc::Sender<stage::Control>) {
    let Some(path) = &config.config_path else {
        tracing::info!("SIGHUP: no --config file to reload");
        return;
    };
    let new = match ConfigFile::load(path).and_then(|f| Reloadable::from(&f, &config.store_flags)) {
        Ok(new) => new,
        Err(e) => {
            tracing::error!(file = %path.display(), error = %e, "SIGHUP: cannot reload; keeping the previous settings");
            return;
        }
    };
    let Ok(mut current) = settings.lock() else { return };
    let thresholds = if new.thresholds == current.thresholds { "unchanged" } else { "changed" };
    let bounds = if new.retention == current.retention && new.rollup_after == current.rollup_after {
        "unchanged"
    } else {
        "changed"
    };
    tracing::info!(file = %path.display(), "SIGHUP: reloaded; detector thresholds {thresholds}, store bounds {bounds}");
    let _ = control.send(stage::Control::Thresholds(new.thresholds.clone()));
    *current = new;
}

/// Starts the UI, API and /metrics. The server runs on a thread and runtime of its own at low
/// CPU priority (`serve::listener`), so a slow request never takes a thread the daemon's stages
/// need. Profiling matters more than the UI: when it cannot listen, the daemon goes on without.
fn serve(
    addr: std::net::SocketAddr,
    data_dir: &std::path::Path,
    live: Arc<Mutex<crate::serve::metrics::Live>>,
) -> Result<(), DaemonError> {
    let token = crate::serve::new_token().map_err(|e| StoreError::Io("/dev/urandom".into(), e))?;
    let state = crate::serve::AppState {
        source: Arc::new(crate::serve::source::Source::Store(data_dir.to_path_buf())),
        live,
        token: token.clone(),
        hosts: crate::serve::hosts(addr),
        metrics_from_any_host: !addr.ip().is_loopback(),
    };
    match crate::serve::spawn(addr, state) {
        Ok(bound) => {
            let url = format!("http://{bound}/#token={token}");
            crate::store::files::write_private(&data_dir.join(crate::serve::URL_FILE), url.as_bytes())?;
            tracing::info!(
                url = %format_args!("http://{bound}/"),
                "UI, JSON API and /metrics listening (`profiler ui` prints the address with its token)"
            );
        }
        Err(e) => tracing::error!(
            address = %addr,
            error = %e,
            "cannot listen; running without the UI (use --listen to pick another address)"
        ),
    }
    Ok(())
}

/// Findings and events of the single-file layout move into hourly files; findings an earlier
/// daemon left open (killed, or the machine went down) end where its data ends.
fn close_abandoned(data_dir: &std::path::Path) {
    match crate::detect::journal::migrate(data_dir) {
        Ok(0) => {}
        Ok(n) => tracing::info!(records = n, "findings and events moved into hourly files"),
        Err(e) => tracing::warn!(error = %e, "findings and events of the single-file layout could not be moved"),
    }
    let end = store::Store::open(data_dir).and_then(|mut s| s.last_end()).ok().flatten();
    match crate::detect::journal::close_abandoned(data_dir, end.unwrap_or_else(crate::timespec::now_ns)) {
        Ok(closed) if !closed.is_empty() => tracing::info!(
            findings = closed.len(),
            "findings left open by an earlier run were closed at the end of its data"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "findings left open by an earlier run could not be closed"),
    }
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
        if let Err(e) = detect::journal::record_finding(data_dir, f) {
            tracing::error!(finding = %f.id, error = %e, "cannot record a finding");
        }
    }
    if let Err(e) = detect::journal::update_open(data_dir, &changes.updated) {
        tracing::error!(error = %e, "cannot record the latest figures of open findings");
    }
}
