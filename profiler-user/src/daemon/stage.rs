//! The pipeline stage: its own thread, where the `!Send` [`Pipeline`] is built and lives. It
//! takes batches from the reader's queue (samples; exec and cgroup events), and on every flush
//! tick reads the kernel's counters, runs the detectors, records findings, publishes the live
//! figures and writes what it holds. It ends when the reader is gone and the queue is empty,
//! with a last flush and the open findings written.

use std::{
    collections::VecDeque,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc::{Receiver, RecvTimeoutError},
    },
    time::{Duration, Instant},
};

use profiler_common::event::PROCESS_EXEC;

use super::{
    clock,
    drops::Drops,
    queue::{Batch, Outlet, QueueStats, Source},
    self_report::Report,
    tally::{Reading, Tally},
};
use crate::{
    collect::{CgroupFields, Collector, memcg::MemcgCount, parse_event},
    detect::{Changes, Engine, Machine, Thresholds},
    pipeline::Pipeline,
    serve::metrics::{Live, Sampling},
    store::{StoreWriter, writer::WriterLimits},
    timespec::now_ns,
};

/// How often the set of online CPUs is compared with the CPUs sampled (sysfs) and the CPUs'
/// busy time read (`/proc/stat`, for the throttling estimate and the stall check), and where the
/// NIC and GPU interrupts go (`collect::irqs`). Not on every
/// flush: at 99 Hz these file reads were a visible part of the daemon's fixed cost per second.
const CPU_CHECKS_EVERY: Duration = Duration::from_secs(5);
/// A sampled CPU whose sampler has not run for this long gets a new perf event.
const STALL_SECS: f64 = 3.0;
/// While handling a batch of samples, look for exec events this often (records).
const EVENTS_EVERY: usize = 16;

/// What the supervisor and the upkeep stage tell the pipeline stage.
pub enum Control {
    /// Boxed: the thresholds are most of the enum's size, and are sent once per SIGHUP.
    Thresholds(Box<Thresholds>),
    /// Memory cgroup counts read by the upkeep stage (`None`: unreadable).
    Zombies(u64, Option<MemcgCount>),
    /// Cgroups with a CPU quota and their throttling counters, read by the upkeep stage
    /// (`None`: no hierarchy has the cpu controller).
    Throttle(u64, Option<Vec<crate::detect::throttle::scan::Reading>>),
}

pub struct StageConfig {
    pub data_dir: PathBuf,
    pub machine: Machine,
    pub thresholds: Thresholds,
    pub limits: WriterLimits,
    pub flush_interval: Duration,
    pub report_interval: Duration,
    /// Test only: a sleep before each stack is symbolized (a slow symbolizer).
    pub symbolize_delay: Option<Duration>,
    /// The host's /var/log, where the kubelet names pods and containers.
    pub kubelet_logs: PathBuf,
    pub flight: crate::flight::Settings,
    /// This node's name, in flight recordings' meta.json.
    pub node: String,
    /// Probe `libcuda.so.1` (`gpu::cuda`).
    pub cuda: bool,
    /// The CUDA rate guard's limit, calls a second per process.
    pub cuda_max_calls: Option<f64>,
    /// Off-CPU waits at least this long are recorded (`offcpu`); 0: off.
    pub offcpu_threshold_ns: u64,
}

/// The stage's connections to the others.
pub struct Links {
    pub outlet: Outlet,
    pub queue: Arc<QueueStats>,
    pub drops: Arc<Mutex<Drops>>,
    pub control: Receiver<Control>,
    /// What /metrics shows: the stage writes its own parts (`sampling`, `pipeline`, `cuda`)
    /// and reads the store's size from the upkeep stage's, for its report.
    pub live: Live,
    /// Set while the store cannot be written (retention then frees space first).
    pub write_failing: Arc<AtomicBool>,
    /// The unwind stage, when unwind tables are in use.
    pub unwind: Option<crate::unwind::Notifier>,
    /// Where the latest run-queue waits go for the kernel counters' tracks.
    pub runq_latest: crate::collect::counters::LatestRunq,
    /// Where the latest reclaim stalls go for the kernel counters' tracks.
    pub reclaim_latest: crate::collect::counters::LatestReclaim,
    /// What the GPU poller read, for the GPU detectors; `None`: GPU tracks off.
    pub gpu: Option<crate::gpu::Shared>,
}

/// What the stage did, for its caller (tests; the supervisor's last log line).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub samples: u64,
    pub idle: u64,
    pub queue_full: u64,
}

pub fn spawn(
    config: StageConfig,
    links: Links,
    collector: Option<Collector>,
) -> std::io::Result<std::thread::JoinHandle<Summary>> {
    std::thread::Builder::new().name("pipeline".into()).spawn(move || {
        let mut pipeline = Pipeline::new(
            StoreWriter::with_limits(&crate::store::segments_dir(&config.data_dir), config.limits)
                .with_identity(crate::store::identity::Identity::current(config.machine.frequency_hz)),
            Engine::new(config.machine, config.thresholds.clone()),
            clock::boot_to_unix_offset(),
        );
        pipeline.symbolizer_mut().load_kernel_symbols();
        let logs = &config.kubelet_logs;
        pipeline.set_workloads(crate::identity::Workloads::new(crate::identity::Resolver::new(
            "/proc",
            logs.join("containers"),
            logs.join("pods"),
        )));
        let flight = crate::flight::Flight::new(config.flight, config.machine.frequency_hz, &config.data_dir);
        if flight.enabled() && collector.is_some() {
            pipeline.set_flight(flight);
        }
        Stage::new(config, links, collector, pipeline).run()
    })
}

struct Stage {
    config: StageConfig,
    links: Links,
    collector: Option<Collector>,
    cgroup_fields: Option<CgroupFields>,
    process_fields: Option<crate::collect::lifecycle::ProcessFields>,
    pipeline: Pipeline,
    tally: Tally,
    started: Instant,
    report: Report,
    write_failing: bool,
    cpus_checked_at: Instant,
    next_tick: Instant,
    /// Sample batches taken from the queue while looking for events ([`Self::events_first`]).
    held: VecDeque<Batch>,
    /// The last tick: everything is written.
    stopping: bool,
    /// Every sample stamped before this (wall-clock ns) has been handled: the start of the
    /// reader's latest drain whose batches are all handled. The detectors judge a second only
    /// once it is past (a lagging pipeline's not-yet-arrived samples are not idle CPUs).
    arrived_ns: u64,
    /// CUDA launches, synchronisations and copies per stack, when on.
    cuda: Option<crate::gpu::cuda::Recorder>,
    /// Off-CPU time per stack, when on.
    offcpu: Option<crate::offcpu::Recorder>,
}

impl Stage {
    fn new(config: StageConfig, mut links: Links, collector: Option<Collector>, mut pipeline: Pipeline) -> Self {
        pipeline.set_unwind(links.unwind.take());
        pipeline.set_gpu(links.gpu.clone());
        if collector.is_some() {
            pipeline.set_interrupts(crate::collect::irqs::Placement::read());
        }
        if let Some(delay) = config.symbolize_delay {
            pipeline.set_before_symbolize(Box::new(move || std::thread::sleep(delay)));
        }
        let cpus = collector.as_ref().map_or(config.machine.cpus as usize, |c| c.cpus().len());
        let cuda = (config.cuda && collector.is_some())
            .then(|| crate::gpu::cuda::Recorder::new(&config.data_dir, config.cuda_max_calls));
        if cuda.is_some() {
            pipeline.track_active();
        }
        let offcpu = (config.offcpu_threshold_ns > 0 && collector.is_some()).then(|| {
            let settings = crate::collect::offcpu::Settings {
                threshold_ns: config.offcpu_threshold_ns,
                rate_limit: profiler_common::offcpu::RATE_LIMIT,
                walk_limit: profiler_common::offcpu::WALK_LIMIT,
            };
            crate::offcpu::Recorder::new(&config.data_dir, settings)
        });
        if offcpu.is_none() {
            // A previous run's figures would read as this one's.
            let _ = std::fs::remove_file(config.data_dir.join(crate::offcpu::status::FILE));
        }
        let config_flush = config.flush_interval;
        Self {
            cgroup_fields: collector.as_ref().map(Collector::cgroup_fields),
            process_fields: collector.as_ref().map(Collector::process_fields),
            tally: Tally::new(config.machine.frequency_hz),
            report: Report::new(cpus),
            config,
            links,
            collector,
            pipeline,
            started: Instant::now(),
            write_failing: false,
            cpus_checked_at: Instant::now(),
            next_tick: Instant::now() + fallback(config_flush),
            held: VecDeque::new(),
            stopping: false,
            arrived_ns: 0,
            cuda,
            offcpu,
        }
    }

    fn run(mut self) -> Summary {
        loop {
            let wait = self.next_tick.saturating_duration_since(Instant::now());
            let next = match self.held.pop_front() {
                Some(batch) => Ok(batch),
                None => self.links.outlet.recv_timeout(wait),
            };
            let stopping = match next {
                Ok(batch) => {
                    self.handle(&batch);
                    self.links.outlet.release(&batch);
                    if let Some(at) = batch.drained_at_ns {
                        self.arrived_ns = self.arrived_ns.max(at);
                    }
                    if batch.flush {
                        self.tick();
                    }
                    false
                }
                Err(RecvTimeoutError::Timeout) => false,
                Err(RecvTimeoutError::Disconnected) => {
                    // The reader drained the ring one last time and is gone: all has arrived.
                    self.arrived_ns = now_ns();
                    true
                }
            };
            self.stopping = stopping;
            if stopping || Instant::now() >= self.next_tick {
                self.tick();
            }
            if stopping {
                // Open findings are written with the end they have so far.
                let open = Changes { closed: self.pipeline.open_findings(), ..Changes::default() };
                super::record_findings(&open, &self.config.data_dir);
                self.log_report();
                return Summary {
                    samples: self.pipeline.samples(),
                    idle: self.pipeline.idle(),
                    queue_full: self.tally.queue_full(),
                };
            }
        }
    }

    fn handle(&mut self, batch: &Batch) {
        match batch.source {
            Source::Samples => {
                for (i, record) in batch.records().enumerate() {
                    if i % EVENTS_EVERY == 0 {
                        self.events_first();
                    }
                    let now = Instant::now();
                    // A batch can take long to symbolize (new binaries, a slow disk): the flush
                    // keeps its pace, so what was handled is written on time.
                    if now >= self.next_tick {
                        self.tick();
                    }
                    self.pipeline.handle(record, now);
                }
            }
            Source::Events => {
                let Some(fields) = self.cgroup_fields else { return };
                for record in batch.records() {
                    if let Some(p) = self.process_fields.and_then(|f| crate::collect::lifecycle::parse(f, record)) {
                        self.process_event(p);
                        continue;
                    }
                    let Some(e) = parse_event(fields, record) else { continue };
                    if e.kind == PROCESS_EXEC {
                        self.pipeline.on_exec(e.pid, &e.comm);
                        if let Some(c) = self.cuda.as_mut() {
                            c.note_exec(e.pid);
                        }
                        continue;
                    }
                    self.pipeline.on_cgroup_event(e);
                }
            }
        }
    }

    /// A process created or ended: the symbolizer tells the processes under one pid apart.
    fn process_event(&mut self, e: crate::collect::lifecycle::ProcessEvent) {
        use crate::collect::lifecycle::ProcessEvent;
        match e {
            ProcessEvent::Fork { parent, child, ts_ns } => self.pipeline.on_fork(parent, child, ts_ns),
            ProcessEvent::Exit { pid, ts_ns } => {
                self.pipeline.on_exit(pid, ts_ns);
                if let Some(c) = self.cuda.as_mut() {
                    c.note_exit(pid);
                }
            }
        }
    }

    /// Handles the event batches waiting in the queue now, ahead of the samples queued before
    /// them: an exec must be seen while the process lives (its mappings are read then), and a
    /// 30 ms process is gone if its exec waits behind a second of sample backlog. Sample
    /// batches met on the way are held, in order, and still count against the queue's bound.
    fn events_first(&mut self) {
        while let Ok(batch) = self.links.outlet.try_recv() {
            match batch.source {
                Source::Events => {
                    self.handle(&batch);
                    self.links.outlet.release(&batch);
                }
                Source::Samples => self.held.push_back(batch),
            }
        }
    }

    fn tick(&mut self) {
        self.next_tick = Instant::now() + fallback(self.config.flush_interval);
        let mut changes = Changes::default();
        // Thresholds reloaded; zombie counts from the upkeep stage.
        while let Ok(c) = self.links.control.try_recv() {
            match c {
                Control::Thresholds(t) => self.pipeline.set_thresholds(*t),
                Control::Zombies(at, count) => changes.extend(self.pipeline.check_zombies(at, count)),
                Control::Throttle(at, readings) => changes.extend(self.pipeline.check_throttle(at, readings)),
            }
        }
        // Lost in userspace: the reader knows the second of each record it dropped. Counted
        // before the detectors run: the reader counts a drop before it queues the drain's end.
        let drops = self.links.drops.lock().map(|mut d| std::mem::take(&mut *d)).unwrap_or_default();
        for ((second, cpu), n) in drops.samples {
            self.pipeline.on_lost(second * 1_000_000_000, cpu, n);
            self.tally.add_queue_full(cpu, n);
            self.report.lost += n;
        }
        self.tally.events_dropped += drops.events;
        let now = now_ns();
        let ring_used_max = self.read_kernel(now, &mut changes);
        self.pipeline.set_offset(clock::boot_to_unix_offset());
        changes.extend(self.pipeline.tick(self.arrived_ns, now));
        self.flight_findings(&mut changes, now);
        super::record_findings(&changes, &self.config.data_dir);
        self.flush();
        self.publish(ring_used_max);
        if self.report.due(self.config.report_interval) {
            self.log_report();
            self.pipeline.symbolizer_mut().expire();
        }
    }

    /// The kernel side's figures of this tick: CPUs on and offline, lost samples, stalled
    /// samplers, the per-second readings the detectors take, the CUDA probes. Returns the
    /// most bytes the sample ring held since the last tick.
    fn read_kernel(&mut self, now: u64, changes: &mut Changes) -> u64 {
        let Some(collector) = self.collector.as_mut() else { return 0 };
        let mut ring_used_max = 0;
        let check_cpus = self.cpus_checked_at.elapsed() >= CPU_CHECKS_EVERY;
        if check_cpus {
            self.cpus_checked_at = Instant::now();
            // irqbalance moves NIC queues between CPUs every 10 s or so.
            self.pipeline.set_interrupts(crate::collect::irqs::Placement::read());
            match collector.sync_cpus() {
                Ok(change) if !change.is_empty() => {
                    tracing::info!(added = ?change.added, removed = ?change.removed, "CPUs came online or went offline");
                    self.pipeline.set_online_cpus(&collector.cpus());
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "cannot follow CPU hotplug"),
            }
        }
        // Lost in the kernel: the counter is read now, so the loss is placed in this second.
        match collector.counters() {
            Ok(counters) => {
                ring_used_max = counters.iter().map(|c| c.ring_used_max).max().unwrap_or(0);
                let sampled = collector.cpus();
                let now_s = self.started.elapsed().as_secs_f64();
                // Between two checks, no busy times: the estimate and the stall check wait.
                let busy_s = if check_cpus { crate::collect::cpus::read_busy_seconds() } else { Default::default() };
                let idle = self.pipeline.per_cpu().iter().map(|(cpu, c)| (*cpu, c.1)).collect();
                let reading = Reading { counters: &counters, busy_s: &busy_s, idle: &idle, sampled: &sampled, now_s };
                for (cpu, n) in self.tally.update(&reading) {
                    self.pipeline.on_lost(now, cpu, n);
                    self.report.lost += n;
                }
                for cpu in self.tally.stalled(now_s, &busy_s, STALL_SECS) {
                    // Offline and back between two looks at the online set: the old event is off.
                    match collector.reattach(cpu) {
                        Ok(()) => tracing::info!(cpu, "the CPU's sampler had stopped; attached a new one"),
                        Err(e) => {
                            tracing::warn!(cpu, error = %e, "the CPU's sampler has stopped and cannot be replaced")
                        }
                    }
                    self.tally.restart(cpu, now_s, &busy_s);
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the kernel side's counters of lost samples"),
        }
        if let Some(n) = collector.netrx() {
            self.pipeline.on_netrx(now, n);
        }
        if let Some(r) = collector.reclaim() {
            let stalls = self.pipeline.on_reclaim(now, r);
            let mut latest = self.links.reclaim_latest.lock().unwrap_or_else(|p| p.into_inner());
            for (cpu, s) in stalls {
                latest.entry(cpu).or_default().add(s);
            }
        }
        if let Some(r) = collector.runq() {
            let waits = self.pipeline.on_runq(now, r);
            let mut latest = self.links.runq_latest.lock().unwrap_or_else(|p| p.into_inner());
            for (cpu, w) in waits {
                latest.entry(cpu).or_default().add(w);
            }
        }
        collector.next_epoch();
        if let Some(c) = self.cuda.as_mut() {
            changes.extend(c.tick(collector, &mut self.pipeline, now));
        }
        if let Some(o) = self.offcpu.as_mut() {
            changes.extend(o.tick(collector, &mut self.pipeline, now));
        }
        ring_used_max
    }

    fn log_report(&mut self) {
        self.report.queue = self.links.queue.depth();
        self.report.log(&self.pipeline, self.links.live.upkeep.read(|u| u.store_bytes));
    }

    fn flush(&mut self) {
        let now = now_ns();
        // With a flush a second or longer apart (on second boundaries, see the reader), the
        // second in progress waits for the next flush and is written as one block, not two.
        let hold_from = if self.config.flush_interval >= Duration::from_secs(1) && !self.stopping {
            now / 1_000_000_000
        } else {
            u64::MAX
        };
        if let Some(flight) = self.pipeline.flight_mut() {
            for cpu in flight.flush(now, hold_from) {
                self.sample_at(cpu, None);
            }
        }
        match self.pipeline.flush(now, hold_from) {
            Ok(f) => {
                self.report.bytes += f.bytes;
                if let Some(l) = self.pipeline.last_latency_ns() {
                    self.report.latency_max_ns = self.report.latency_max_ns.max(l);
                }
                if self.write_failing {
                    tracing::info!(
                        data_dir = %self.config.data_dir.display(),
                        dropped_total = self.pipeline.writer().dropped(),
                        "writing works again; the samples held meanwhile are written"
                    );
                    self.write_failing = false;
                }
            }
            Err(e) => {
                // Keep sampling and hold what cannot be written (bounded; the oldest go first
                // past the bound); the log says so once, and again when writing works.
                if !self.write_failing {
                    tracing::error!(
                        error = %e,
                        max_held = self.config.limits.max_pending,
                        "cannot write samples. Sampling goes on; samples are held in memory (at most max_held, the \
                         oldest dropped beyond that) and written when space returns"
                    );
                    self.write_failing = true;
                }
            }
        }
        self.links.write_failing.store(self.write_failing, Ordering::Relaxed);
    }

    /// Findings that open on a CPU start a flight recording there (a higher frequency for a
    /// while); every finding written links to the recording it has.
    fn flight_findings(&mut self, changes: &mut crate::detect::Changes, now: u64) {
        let Some(flight) = self.pipeline.flight_mut() else { return };
        let mut boost = Vec::new();
        for f in &changes.opened {
            match flight.start(f, now, self.config.machine.cpus, &self.config.node) {
                Ok(Some(started)) => boost.push(started.cpu),
                Ok(None) => {}
                Err(e) => tracing::warn!(finding = %f.id, error = %e, "no flight recording for the finding"),
            }
        }
        for f in changes.opened.iter_mut().chain(changes.updated.iter_mut()).chain(changes.closed.iter_mut()) {
            flight.annotate(f);
        }
        for f in &changes.closed {
            flight.forget(&f.id);
        }
        let hz = self.config.flight.hz;
        for cpu in boost {
            tracing::info!(cpu, hz, secs = self.config.flight.secs, "flight recording started");
            self.sample_at(cpu, Some(hz));
        }
    }

    /// Samples `cpu` at `hz` (`None`: the base frequency); its tick counts start over.
    fn sample_at(&mut self, cpu: u32, hz: Option<u64>) {
        let Some(collector) = self.collector.as_mut() else { return };
        if let Err(e) = collector.set_frequency(cpu, hz) {
            tracing::warn!(cpu, error = %e, "cannot change the CPU's sampling frequency");
        }
        let busy_s = crate::collect::cpus::read_busy_seconds();
        self.tally.restart(cpu, self.started.elapsed().as_secs_f64(), &busy_s);
    }

    /// The figures /metrics shows of this stage: the pipeline's own, the kernel side's and
    /// the queue's, the CUDA probes'.
    fn publish(&mut self, ring_used_max: u64) {
        let live = &self.links.live;
        live.pipeline.set(self.pipeline.figures());
        live.cuda.set(self.cuda.as_ref().map(|c| c.status.clone()));
        live.offcpu.set(self.offcpu.as_ref().map(|o| o.status.clone()));
        let collector = self.collector.as_ref();
        let programs = collector.map(Collector::program_stats).unwrap_or_default();
        live.sampling.set(Sampling {
            per_cpu: self.tally.totals.clone(),
            recursion_misses: collector.and_then(Collector::recursion_misses),
            programs: programs.into_iter().map(|(name, s)| (name, s.run_time_ns, s.run_cnt)).collect(),
            sampled_cpus: collector.map_or(0, |c| c.cpus().len() as u64),
            ring_used_bytes: ring_used_max,
            ring_size_bytes: collector.map_or(0, Collector::ring_bytes),
            events_lost: self.tally.events_lost,
            queue: self.links.queue.depth(),
            events_dropped: self.tally.events_dropped,
        });
    }
}

/// The stage flushes after each of the reader's timed drains (`Batch::flush`), once per flush
/// interval, so that one wakeup of each thread per interval does both. Past this, it flushes
/// without one: the marked batch can be lost to a full queue, or wait behind a slow batch.
fn fallback(flush_interval: Duration) -> Duration {
    flush_interval * 3 / 2
}

#[cfg(test)]
mod tests;
