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
//! [`run`] is the supervisor: it starts them (`stages`), turns signals into a clean stop (reader first, so
//! the pipeline writes everything queued) or a reload, and says which stage died if one does.

mod clock;
pub mod drops;
mod kernel_counters;
pub mod queue;
mod reader;
mod self_report;
pub mod stage;
mod stages;
pub mod tally;
mod upkeep;

use std::{
    path::PathBuf,
    sync::{Arc, Mutex, mpsc},
    time::Duration,
};

use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::{
    collect::CollectError,
    config::{ConfigFile, Reloadable, StoreFlags},
    detect::{self, Changes},
    store::{self, StoreError, writer::WriterLimits},
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
    pub cuda_max_calls: Option<f64>,
    /// Off-CPU waits at least this long are recorded (`offcpu`); 0: off.
    pub offcpu_threshold_ns: u64,
}

/// Runs until SIGINT/SIGTERM, then writes what it holds and returns.
pub async fn run(config: DaemonConfig) -> Result<(), DaemonError> {
    // First, so that a SIGTERM at any moment from here on is a clean stop.
    let mut signals = Signals::install()?;
    let _lock = store::create_and_lock(&config.data_dir)?;
    apply_memory_plan(&config.memory)?;
    // The symbolizer keeps up to ~770 files open and the server computes its connection cap
    // from the limit: raise the soft limit to the hard one whether or not the server runs.
    crate::serve::limits::raise_nofile();
    close_abandoned(&config.data_dir);
    let stages = stages::Stages::start(&config)?;
    if let Some(addr) = config.listen {
        serve(addr, &config.data_dir, stages.live.clone())?;
    }
    notify("READY=1");
    let outcome = supervise(&config, &mut signals, &stages).await;
    stages.stop(outcome)
}

/// The signals the supervisor answers: SIGINT and SIGTERM stop, SIGHUP reloads.
struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl Signals {
    fn install() -> Result<Self, DaemonError> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).map_err(|e| DaemonError::Signal("SIGINT", e))?,
            terminate: signal(SignalKind::terminate()).map_err(|e| DaemonError::Signal("SIGTERM", e))?,
            hangup: signal(SignalKind::hangup()).map_err(|e| DaemonError::Signal("SIGHUP", e))?,
        })
    }
}

/// Caps the daemon's memory as planned and starts the thread that watches it.
fn apply_memory_plan(plan: &crate::memory::Plan) -> Result<(), DaemonError> {
    plan.apply();
    tracing::info!(limit_mib = plan.limit >> 20, pools_mib = plan.pools >> 20, "{}", plan.describe());
    crate::memory::watch::spawn(plan.anon_target()).map_err(|e| DaemonError::Thread("memory-watch", e))?;
    Ok(())
}

/// Waits for a signal to stop (`Ok`: its name) or a stage that died (`Err`: its name),
/// reloading on SIGHUP meanwhile.
async fn supervise(
    config: &DaemonConfig,
    signals: &mut Signals,
    stages: &stages::Stages,
) -> Result<&'static str, &'static str> {
    // A stage that died is noticed within this; every wakeup counts at 99 Hz.
    let mut check = tokio::time::interval(Duration::from_secs(5));
    let mut shipper_gone = false;
    loop {
        tokio::select! {
            _ = signals.interrupt.recv() => return Ok("SIGINT"),
            _ = signals.terminate.recv() => return Ok("SIGTERM"),
            _ = signals.hangup.recv() => reload(config, &stages.settings, &stages.control),
            _ = check.tick() => {
                if let Some(name) = stages.died() {
                    return Err(name);
                }
                // Pushing is not worth stopping the profiling for: say it, once, and go on.
                if !shipper_gone && stages.shipper.as_ref().is_some_and(|s| s.is_finished()) {
                    shipper_gone = true;
                    tracing::error!("the OTLP shipper stopped (see above); profiles are no longer pushed");
                }
            }
        }
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
    let _ = control.send(stage::Control::Thresholds(Box::new(new.thresholds.clone())));
    *current = new;
}

/// Starts the UI, API and /metrics. The server runs on a thread and runtime of its own at low
/// CPU priority (`serve::listener`), so a slow request never takes a thread the daemon's stages
/// need. Profiling matters more than the UI: when it cannot listen, the daemon goes on without.
fn serve(
    addr: std::net::SocketAddr,
    data_dir: &std::path::Path,
    live: crate::serve::metrics::Live,
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
