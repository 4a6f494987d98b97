//! Starting the daemon's stages, each on its own thread, with the links between them; and
//! stopping them in the order that loses nothing: the reader first (so the pipeline writes
//! everything queued), the shippers last (so the findings closed on the way out are shipped).

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread::JoinHandle,
    time::Duration,
};

use super::{
    DaemonConfig, DaemonError, QUEUE_BYTES, QUEUE_BYTES_ENV, SYMBOLIZE_DELAY_ENV, drops, kernel_counters, notify,
    queue, reader, stage, test_knob, upkeep,
};
use crate::{
    collect::{CollectConfig, CollectError, Collector, Rings, kmsg::Kmsg},
    config::Reloadable,
    detect::Machine,
    serve::metrics::Live,
    store::{Meta, format::FORMAT_VERSION},
    timespec::now_ns,
};

/// The running stages, and what the supervisor needs to reload and stop them.
pub(super) struct Stages {
    pub stage: JoinHandle<stage::Summary>,
    pub reader: JoinHandle<()>,
    pub upkeep: JoinHandle<()>,
    /// The OTLP shipper, when an endpoint is set.
    pub shipper: Option<JoinHandle<()>>,
    /// What /metrics shows: each stage writes its own parts.
    pub live: Live,
    /// The thresholds and store bounds in force, which SIGHUP replaces.
    pub settings: Arc<Mutex<Reloadable>>,
    pub control: mpsc::Sender<stage::Control>,
    counters: Option<JoinHandle<()>>,
    clickhouse: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    /// Ends both shippers.
    ship_stop: tokio::sync::watch::Sender<bool>,
    /// Held, not joined: the poller ends with `stop`, and a hung driver call must not hold the
    /// daemon's exit.
    _gpu_poller: Option<JoinHandle<()>>,
    /// Lives as long as the daemon; it ends once the pipeline (its last notifier) is gone.
    _unwind_stage: Option<crate::unwind::Stage>,
}

/// The kernel side loaded and attached, and what the stages after it need to know of it.
struct Sampling {
    collector: Collector,
    rings: Rings,
    unwind: Option<crate::unwind::Notifier>,
    unwind_stage: Option<crate::unwind::Stage>,
    machine: Machine,
    hostname: String,
    queue_bytes: u64,
}

impl Stages {
    pub(super) fn start(config: &DaemonConfig) -> Result<Self, DaemonError> {
        let sampling = start_sampling(config)?;
        // The optional producers' parts exist from the start, so each is handed its own.
        let live = Live {
            frequency_hz: config.frequency_hz,
            gpu: config.gpu.as_ref().map(|_| Default::default()),
            otlp: config.otlp.as_ref().map(|_| Default::default()),
            clickhouse: config.clickhouse.as_ref().map(|_| Default::default()),
            ..Default::default()
        };
        let stop = Arc::new(AtomicBool::new(false));
        let write_failing = Arc::new(AtomicBool::new(false));
        let drops = Arc::new(Mutex::new(drops::Drops::default()));
        let (intake, outlet, queue) = queue::bounded(sampling.queue_bytes);
        let (control, control_rx) = mpsc::channel();
        let runq_latest = kernel_counters::LatestRunq::default();
        let reclaim_latest = kernel_counters::LatestReclaim::default();
        let links = stage::Links {
            outlet,
            queue,
            drops: drops.clone(),
            control: control_rx,
            live: live.clone(),
            write_failing: write_failing.clone(),
            unwind: sampling.unwind,
            runq_latest: runq_latest.clone(),
            reclaim_latest: reclaim_latest.clone(),
            gpu: live.gpu.clone(),
        };
        let reader = reader::Reader {
            intake,
            drops,
            stop: stop.clone(),
            // One drain per flush, which the stage flushes right after: a sample waits at most a
            // flush interval for the store. Each drain wakes two threads, which costs ~150 µs of
            // CPU on a VM: at 99 Hz draining every 50 ms doubled the daemon's CPU per sample
            // (BENCHMARKS.md).
            flush_every: config.flush_interval,
        }
        .spawn(sampling.rings)
        .map_err(|e| DaemonError::Thread("ring reader", e))?;
        let collector = sampling.collector;
        let sampled = collector.cpus().len();
        let stage = spawn_pipeline(config, sampling.machine, links, collector)?;
        // Every stage that the data path needs runs (the pipeline writes from here): the line
        // that says the daemon is up.
        tracing::info!(
            cpus = sampled,
            frequency_hz = config.frequency_hz,
            data_dir = %config.data_dir.display(),
            flush_ms = config.flush_interval.as_millis() as u64,
            queue_bytes = sampling.queue_bytes,
            "profiling started"
        );
        let settings = Arc::new(Mutex::new(config.settings.clone()));
        let kmsg = match Kmsg::open(&config.event_patterns) {
            Ok(k) => Some(k),
            Err(e) => {
                tracing::warn!(error = %e, "kernel log events will not be recorded");
                None
            }
        };
        let memcg_latest = kernel_counters::LatestMemcg::default();
        let counters = spawn_kernel_counters(config, &stop, &memcg_latest, runq_latest, reclaim_latest)?;
        let gpu_poller = spawn_gpu_poller(config, &live, &stop)?;
        let upkeep = upkeep::Upkeep {
            data_dir: config.data_dir.clone(),
            settings: settings.clone(),
            figures: live.upkeep.clone(),
            xids: live.gpu_xids.clone(),
            control: control.clone(),
            write_failing,
            stop: stop.clone(),
            kmsg,
            memcg_latest,
        }
        .spawn()
        .map_err(|e| DaemonError::Thread("upkeep", e))?;
        let (ship_stop, ship_stop_rx) = tokio::sync::watch::channel(false);
        let shipper = spawn_otlp(config, sampling.hostname, &live, ship_stop_rx.clone())?;
        let clickhouse = spawn_clickhouse(config, &live, ship_stop_rx)?;
        Ok(Self {
            stage,
            reader,
            upkeep,
            shipper,
            live,
            settings,
            control,
            counters,
            clickhouse,
            stop,
            ship_stop,
            _gpu_poller: gpu_poller,
            _unwind_stage: sampling.unwind_stage,
        })
    }

    /// The stage that ended by itself, if one did. The pipeline first: when it dies the reader
    /// and upkeep end too, as a consequence.
    pub(super) fn died(&self) -> Option<&'static str> {
        [
            ("pipeline", self.stage.is_finished()),
            ("ring reader", self.reader.is_finished()),
            ("upkeep", self.upkeep.is_finished()),
        ]
        .into_iter()
        .find_map(|(name, finished)| finished.then_some(name))
    }

    /// Stops every stage, reader first, and says how the daemon ended. `outcome`: the signal
    /// that stopped it, or the stage that died.
    pub(super) fn stop(self, outcome: Result<&'static str, &'static str>) -> Result<(), DaemonError> {
        // Reader first: once it is gone the pipeline writes everything queued, then ends.
        self.stop.store(true, Ordering::Release);
        notify("STOPPING=1");
        let reader_result = self.reader.join();
        let summary = self.stage.join();
        let upkeep_result = self.upkeep.join();
        // Counters are not worth failing the stop for: a panic there was logged when it happened.
        if self.counters.is_some_and(|c| c.join().is_err()) {
            tracing::error!("the kernel counters stage had stopped (it panicked)");
        }
        let _ = self.ship_stop.send(true);
        if self.shipper.is_some_and(|s| s.join().is_err()) {
            tracing::error!("the OTLP shipper panicked");
        }
        // A shipper that panicked has only stopped shipping: the store has everything.
        if let Some(Err(_)) = self.clickhouse.map(|s| s.join()) {
            tracing::error!("the ClickHouse shipper had stopped (it panicked): see the log above");
        }
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
}

/// A stage's thread that panicked, as the error the daemon exits with.
fn died(name: &'static str, panic: Box<dyn std::any::Any + Send>) -> DaemonError {
    let why = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "it panicked".into());
    DaemonError::StageDied(name, why)
}

/// Loads and attaches the kernel side, starts the unwind stage, and writes the store's meta.
fn start_sampling(config: &DaemonConfig) -> Result<Sampling, DaemonError> {
    let mut collector = Collector::start(&CollectConfig {
        frequency_hz: config.frequency_hz,
        ring_bytes: config.ring_bytes,
        unwind_rows: config.unwind_rows,
    })?;
    let rings = collector.take_rings().ok_or(CollectError::Missing("ring buffers"))?;
    // Unwind tables are built on their own thread; the stage ends with the pipeline.
    let (unwind, unwind_stage) = match collector.take_unwind().map(crate::unwind::spawn) {
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
    let machine = Machine { cpus, frequency_hz: config.frequency_hz };
    Ok(Sampling { collector, rings, unwind, unwind_stage, machine, hostname, queue_bytes })
}

/// The pipeline stage, fed by the reader's queue.
fn spawn_pipeline(
    config: &DaemonConfig,
    machine: Machine,
    links: stage::Links,
    collector: Collector,
) -> Result<JoinHandle<stage::Summary>, DaemonError> {
    let symbolize_delay = test_knob(SYMBOLIZE_DELAY_ENV).map(Duration::from_micros);
    if let Some(d) = symbolize_delay {
        tracing::warn!(
            delay_us = d.as_micros() as u64,
            "{SYMBOLIZE_DELAY_ENV} is set: symbolizing is slowed (test only)"
        );
    }
    let stage_config = stage::StageConfig {
        data_dir: config.data_dir.clone(),
        machine,
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
        offcpu_threshold_ns: config.offcpu_threshold_ns,
    };
    stage::spawn(stage_config, links, Some(collector)).map_err(|e| DaemonError::Thread("pipeline", e))
}

/// The kernel counters' stage (softnet, softirqs, PSI, ...), unless turned off.
fn spawn_kernel_counters(
    config: &DaemonConfig,
    stop: &Arc<AtomicBool>,
    memcg: &kernel_counters::LatestMemcg,
    runq: kernel_counters::LatestRunq,
    reclaim: kernel_counters::LatestReclaim,
) -> Result<Option<JoinHandle<()>>, DaemonError> {
    if !config.kernel_counters {
        tracing::info!("kernel counters are off (kernel_counters = false)");
        return Ok(None);
    }
    let counters = kernel_counters::KernelCounters {
        data_dir: config.data_dir.clone(),
        stop: stop.clone(),
        memcg: memcg.clone(),
        runq,
        reclaim,
    };
    Ok(Some(counters.spawn().map_err(|e| DaemonError::Thread("kernel counters", e))?))
}

/// The GPU poller, on its own thread: a slow or hung driver call delays only the next GPU poll.
/// With GPU tracks off, the inventory says so.
fn spawn_gpu_poller(
    config: &DaemonConfig,
    live: &Live,
    stop: &Arc<AtomicBool>,
) -> Result<Option<JoinHandle<()>>, DaemonError> {
    let (Some(g), Some(shared)) = (&config.gpu, &live.gpu) else {
        tracing::info!("GPU tracks are off (nvml_library = off)");
        let off = crate::gpu::Inventory {
            unavailable: Some("GPU tracks are off (nvml_library = off)".into()),
            ..Default::default()
        };
        let _ = off.write(&config.data_dir);
        return Ok(None);
    };
    let poller = crate::gpu::nvml::Poller {
        data_dir: config.data_dir.clone(),
        stop: stop.clone(),
        interval: g.interval,
        library: g.library.clone(),
        shared: shared.clone(),
        kubelet_logs: config.kubelet_logs.clone(),
        xids: live.gpu_xids.clone(),
        idle_below: config.settings.thresholds.gpu_idle_below * 100.0,
    };
    Ok(Some(poller.spawn().map_err(|e| DaemonError::Thread("GPU poller", e))?))
}

/// The OTLP shipper, when an endpoint is set. It follows the store, so it never touches the
/// stages above.
fn spawn_otlp(
    config: &DaemonConfig,
    host: String,
    live: &Live,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<Option<JoinHandle<()>>, DaemonError> {
    let (Some(otlp), Some(stats)) = (config.otlp.clone(), live.otlp.clone()) else { return Ok(None) };
    let latency = live.pipeline.clone();
    let shipper = crate::ship::otlp::Shipper {
        data_dir: config.data_dir.clone(),
        config: otlp,
        host,
        frequency_hz: config.frequency_hz,
        // A sample reaches the store within a flush interval (the drain before each flush takes
        // it); the margin covers a slow flush.
        settle: config.flush_interval + Duration::from_secs(2),
        stats,
        ring_to_disk_max: Arc::new(move || latency.read(|p| p.ring_to_disk_seconds.map(|(_, max)| max))),
        stop,
    };
    Ok(Some(crate::ship::spawn(shipper).map_err(|e| DaemonError::Thread("OTLP shipper", e))?))
}

/// The ClickHouse shipper, when set: its own thread, so a slow or absent ClickHouse never holds
/// the pipeline up. Stopped after the pipeline, so the findings it closes on the way out are
/// shipped too.
fn spawn_clickhouse(
    config: &DaemonConfig,
    live: &Live,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<Option<JoinHandle<()>>, DaemonError> {
    let (Some(config), Some(stats)) = (config.clickhouse.clone(), live.clickhouse.clone()) else { return Ok(None) };
    let shipper = crate::ship::spawn(crate::ship::clickhouse::Shipper { config, stats, stop })
        .map_err(|e| DaemonError::Thread("shipper", e))?;
    Ok(Some(shipper))
}
