//! The per-sample path: a ring-buffer record is parsed, its stacks symbolized, and the sample
//! handed to the detectors and to the store writer.
//!
//! It lives apart from the daemon so that the daemon and the replay benchmark
//! (`benches/replay.rs`) run the very same code: nothing here touches BPF, so records built in
//! memory go through exactly what the ring buffer's records go through. The daemon owns the
//! timing (when to drain, when to flush) and everything around it (lost counters, findings on
//! disk, publishing the pipeline's [`Figures`] to /metrics): `daemon::stage` runs it on its own
//! thread, fed by the ring reader's queue.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use profiler_common::{COMM_LEN, FLAG_IDLE, FLAG_USER_MODE, SampleHeader};

use crate::{
    collect::{comm_str, parse_record_python},
    detect::{Changes, Engine, Tick},
    exec_context::Context,
    model::Sample,
    store::{StoreError, StoreWriter, writer::Flushed},
    symbolize::Symbolizer,
};

/// Most distinct comms kept interned; past it the table starts over (comms are per thread, and
/// a node with churn would otherwise grow it forever).
const COMMS_MAX: usize = 65_536;

/// The fields are private: the daemon's stage and the CUDA recorder (`gpu::cuda`) go through
/// the methods below, those that hand the detectors what is not a sample (`detectors`), and
/// [`Pipeline::figures`] for /metrics (`figures`).
pub struct Pipeline {
    /// Not `Send` (blazesym): the pipeline stays on the thread that built it.
    symbolizer: Symbolizer,
    writer: StoreWriter,
    engine: Engine,
    /// `CLOCK_REALTIME - CLOCK_BOOTTIME` in ns: BPF stamps samples with boot time, the store
    /// keeps wall-clock time. The daemon re-reads it on every flush, so NTP steps are followed.
    offset: i128,
    /// Busy and idle samples handled since start.
    samples: u64,
    idle: u64,
    /// Records too short for what their header announces (skipped).
    bad_records: u64,
    /// Per CPU since start: busy, idle, lost.
    per_cpu: BTreeMap<u32, (u64, u64, u64)>,
    /// Comm bytes → shared name, so a busy thread's name is not re-allocated per sample.
    comms: HashMap<[u8; COMM_LEN], Arc<str>>,
    /// Scratch for the addresses of the record being handled (reused: no allocation per record).
    kernel: Vec<u64>,
    user: Vec<u64>,
    python: Vec<u64>,
    /// Runs before each stack is symbolized. For tests only: a hook that sleeps stands in for a
    /// slow symbolizer (a stalled stage), see `PROFILER_TEST_SYMBOLIZE_DELAY_US`.
    before_symbolize: Option<Box<dyn FnMut() + Send>>,
    /// Told which processes run user code, so their unwind tables get built.
    unwind: Option<crate::unwind::Notifier>,
    /// The container, pod or unit of each process (none: samples carry no workload).
    workloads: Option<crate::identity::Workloads>,
    /// Time of the oldest sample handled since the last successful flush (wall-clock ns).
    oldest_unflushed_ns: Option<u64>,
    /// Ring-to-disk latency of the last flush that wrote samples: its time minus the time of
    /// the oldest sample it wrote, ns.
    last_latency_ns: Option<u64>,
    /// The flight recorder: samples of CPUs it records go there, and at the base frequency on.
    flight: Option<crate::flight::Flight>,
    /// Processes that ran since the CUDA recorder last looked (`None`: it is off).
    active: Option<std::collections::HashSet<u32>>,
    /// Ring-to-disk latencies of the flushes since start, for /metrics.
    latencies: figures::Latencies,
}

impl Pipeline {
    /// `offset`: `CLOCK_REALTIME - CLOCK_BOOTTIME` in ns (see the `offset` field).
    pub fn new(writer: StoreWriter, engine: Engine, offset: i128) -> Self {
        Self {
            symbolizer: Symbolizer::new(),
            writer,
            engine,
            offset,
            samples: 0,
            idle: 0,
            bad_records: 0,
            per_cpu: BTreeMap::new(),
            comms: HashMap::new(),
            kernel: Vec::new(),
            user: Vec::new(),
            python: Vec::new(),
            before_symbolize: None,
            unwind: None,
            workloads: None,
            oldest_unflushed_ns: None,
            last_latency_ns: None,
            flight: None,
            active: None,
            latencies: figures::Latencies::default(),
        }
    }

    /// One ring-buffer record: a `SampleHeader`, then its kernel and user addresses. `now`:
    /// the caller's clock reading for it (one per record, shared by every cache here).
    pub fn handle(&mut self, bytes: &[u8], now: std::time::Instant) {
        let header = match parse_record_python(bytes, &mut self.kernel, &mut self.user, &mut self.python) {
            Ok(h) => h,
            Err(e) => {
                self.bad_records += 1;
                tracing::debug!(error = %e, "malformed sample record skipped");
                return;
            }
        };
        let ts_ns = (header.ts_ns as i128 + self.offset).max(0) as u64;
        let (to_flight, to_main) = self.flight.as_mut().map_or((false, true), |f| f.route(header.cpu, ts_ns));
        self.oldest_unflushed_ns = Some(self.oldest_unflushed_ns.map_or(ts_ns, |o| o.min(ts_ns)));
        if header.flags & FLAG_IDLE != 0 {
            self.symbolizer.advance(header.ts_ns);
            if to_flight && let Some(f) = self.flight.as_mut() {
                f.push_idle(ts_ns, header.cpu);
            }
            if !to_main {
                return;
            }
            self.idle += 1;
            self.per_cpu.entry(header.cpu).or_default().1 += 1;
            self.writer.push_idle(ts_ns, header.cpu);
            self.engine.on_idle(ts_ns, header.cpu);
            return;
        }
        let sample = self.build(&header, ts_ns, now);
        if let Some(active) = self.active.as_mut() {
            active.insert(header.pid);
        }
        if to_flight && let Some(f) = self.flight.as_mut() {
            f.push(&sample);
        }
        if !to_main {
            return;
        }
        self.samples += 1;
        self.per_cpu.entry(header.cpu).or_default().0 += 1;
        let tick = Tick {
            stack: sample.stack.clone(),
            pid: sample.pid,
            comm: sample.comm.clone(),
            workload: sample.workload.clone(),
        };
        self.engine.on_cgroup(ts_ns, header.cgroup_id, &tick);
        self.engine.on_busy(ts_ns, header.cpu, tick);
        self.writer.push(&sample);
    }

    /// The sample of a parsed record (its addresses in the scratch vectors): comm, symbolized
    /// stack, workload.
    fn build(&mut self, header: &SampleHeader, ts_ns: u64, now: std::time::Instant) -> Sample {
        let comm = match self.comms.get(&header.comm) {
            Some(c) => c.clone(),
            None => {
                if self.comms.len() > COMMS_MAX {
                    self.comms.clear();
                }
                let c: Arc<str> = Arc::from(comm_str(&header.comm).as_ref());
                self.comms.insert(header.comm, c.clone());
                c
            }
        };
        if self.symbolizer.at_sample(header.pid, header.ts_ns) {
            // Another process under this pid than the one its workload and tables were read for.
            self.new_image(header.pid);
        }
        if let Some(unwind) = self.unwind.as_mut()
            && (header.user_frames > 0 || header.flags & FLAG_USER_MODE != 0)
        {
            unwind.seen(header.pid, now);
        }
        if let Some(hook) = self.before_symbolize.as_mut() {
            hook();
        }
        let layout = (!self.python.is_empty()).then(|| self.unwind.as_ref()?.python_layout(header.pid)).flatten();
        let python = layout.as_deref().map(|l| (l, self.python.as_slice()));
        let mut stack = self.symbolizer.stack_with_python(header.pid, &comm, &self.kernel, &self.user, python, now);
        if let Some(pid) = self.symbolizer.take_mapped()
            && let Some(unwind) = self.unwind.as_mut()
        {
            unwind.mapped(pid, now);
        }
        // Softirq work (on the idle task too: the BPF side sends it as busy) gets its context as
        // the root of its kernel frames (`context`).
        let context = Context::from_flags(header.flags);
        if context.is_softirq() {
            stack = Arc::new(context.mark(&stack));
        }
        let workload: Arc<str> = self.workloads.as_mut().map(|w| w.of(header.pid, now)).unwrap_or_default();
        Sample {
            ts_ns,
            cpu: header.cpu,
            pid: header.pid,
            tid: header.tid,
            cgroup_id: header.cgroup_id,
            comm,
            stack,
            workload,
        }
    }

    /// A CUDA probe's stack (`collect::cuda`), read like a ring record, as a sample at `ts_ns`.
    pub fn cuda_sample(&mut self, bytes: &[u8], ts_ns: u64, now: std::time::Instant) -> Option<Sample> {
        let header = match parse_record_python(bytes, &mut self.kernel, &mut self.user, &mut self.python) {
            Ok(h) => h,
            Err(e) => {
                self.bad_records += 1;
                tracing::debug!(error = %e, "malformed CUDA stack skipped");
                return None;
            }
        };
        Some(self.build(&header, ts_ns, now))
    }

    /// A process called exec: its names, workload and unwind tables are read again.
    pub fn on_exec(&mut self, pid: u32, comm: &str) {
        self.symbolizer.note_exec(pid, comm);
        self.new_image(pid);
    }

    /// Another program runs under `pid` than the one its workload and unwind tables were read
    /// for; both the exec event and the symbolizer's own check on a sample come here.
    fn new_image(&mut self, pid: u32) {
        if let Some(w) = self.workloads.as_mut() {
            w.exec(pid);
        }
        if let Some(unwind) = self.unwind.as_mut() {
            unwind.exec(pid);
        }
    }

    /// A process forked: the child shares its parent's mappings until it execs.
    pub fn on_fork(&mut self, parent: u32, child: u32, ts_ns: u64) {
        self.symbolizer.note_fork(parent, child, ts_ns);
    }

    /// A process ended: the symbolizer tells the processes under one pid apart.
    pub fn on_exit(&mut self, pid: u32, ts_ns: u64) {
        self.symbolizer.note_exit(pid, ts_ns);
    }

    /// A cgroup event from the kernel (boot-time stamp), for the dying-cgroup detector.
    pub fn on_cgroup_event(&mut self, mut e: crate::collect::CgroupEvent) {
        e.ts_ns = (e.ts_ns as i128 + self.offset).max(0) as u64;
        self.engine.zombies.on_event(&e);
    }

    /// `n` samples of `cpu` lost around `ts_ns` (wall-clock): the detectors, the store and the
    /// per-CPU figures all count them.
    pub fn on_lost(&mut self, ts_ns: u64, cpu: u32, n: u64) {
        self.engine.on_lost(ts_ns, cpu, n);
        self.writer.add_lost_at(ts_ns / 1_000_000_000, cpu, n);
        self.per_cpu.entry(cpu).or_default().2 += n;
    }

    /// The boot-to-wall-clock offset read again (see the `offset` field): NTP steps are followed.
    pub fn set_offset(&mut self, offset: i128) {
        self.offset = offset;
    }

    /// `CLOCK_REALTIME - CLOCK_BOOTTIME` (ns), as last read.
    pub fn offset(&self) -> i128 {
        self.offset
    }

    /// The CPUs sampled changed (hotplug): the blocks written from now on say so.
    pub fn set_online_cpus(&mut self, cpus: &[u32]) {
        tracing::debug!(?cpus, "CPUs sampled now");
        self.writer.set_online_cpus(cpus);
    }

    /// Names containers, pods and units of the processes sampled.
    pub fn set_workloads(&mut self, workloads: crate::identity::Workloads) {
        self.workloads = Some(workloads);
    }

    /// Sends the samples of the CPUs it records to the flight recorder.
    pub fn set_flight(&mut self, flight: crate::flight::Flight) {
        self.flight = Some(flight);
    }

    /// For tests: a hook run before each stack is symbolized (see the `before_symbolize` field).
    pub fn set_before_symbolize(&mut self, hook: Box<dyn FnMut() + Send>) {
        self.before_symbolize = Some(hook);
    }

    /// Keeps the set of processes that ran, for the CUDA recorder.
    pub fn track_active(&mut self) {
        self.active = Some(Default::default());
    }

    /// The processes that ran since the last call (none unless [`Self::track_active`]).
    pub fn take_active(&mut self) -> Vec<u32> {
        self.active.as_mut().map(|a| a.drain().collect()).unwrap_or_default()
    }

    /// The unwind stage, told which processes run user code (`None`: frame pointers only).
    pub fn set_unwind(&mut self, unwind: Option<crate::unwind::Notifier>) {
        self.unwind = unwind;
    }

    /// `pid`'s stacks will be walked (the CUDA probes attached to it): its unwind tables and
    /// Python frames are wanted now, not once a sample happens to meet it.
    pub fn want_tables(&mut self, pid: u32, now: std::time::Instant) {
        if let Some(unwind) = self.unwind.as_mut() {
            unwind.mapped(pid, now);
        }
    }

    pub fn symbolizer(&self) -> &Symbolizer {
        &self.symbolizer
    }

    pub fn symbolizer_mut(&mut self) -> &mut Symbolizer {
        &mut self.symbolizer
    }

    pub fn writer(&self) -> &StoreWriter {
        &self.writer
    }

    pub fn flight_mut(&mut self) -> Option<&mut crate::flight::Flight> {
        self.flight.as_mut()
    }

    /// Busy samples handled since start.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Idle samples handled since start.
    pub fn idle(&self) -> u64 {
        self.idle
    }

    /// Records skipped as malformed since start.
    pub fn bad_records(&self) -> u64 {
        self.bad_records
    }

    /// Per CPU since start: busy, idle, lost.
    pub fn per_cpu(&self) -> &BTreeMap<u32, (u64, u64, u64)> {
        &self.per_cpu
    }

    /// Ring-to-disk latency of the last flush that wrote samples, ns.
    pub fn last_latency_ns(&self) -> Option<u64> {
        self.last_latency_ns
    }

    /// Runs the detectors over every second whose samples have all been handled by
    /// `arrived_ns` (see [`Engine::tick`]; wall-clock ns). The daemon calls it on every flush
    /// tick, before [`Pipeline::flush`].
    pub fn tick(&mut self, arrived_ns: u64, now_ns: u64) -> Changes {
        self.engine.tick(arrived_ns, now_ns)
    }

    /// Writes what the writer holds, but the seconds from `hold_from` (unix seconds) on. On
    /// failure nothing is lost: a later flush writes it.
    pub fn flush(&mut self, now_ns: u64, hold_from: u64) -> Result<Flushed, StoreError> {
        let flushed = self.writer.flush_before(now_ns, hold_from)?;
        self.last_latency_ns = self.oldest_unflushed_ns.take().map(|oldest| now_ns.saturating_sub(oldest));
        if let Some(ns) = self.last_latency_ns {
            self.latencies.push(ns);
        }
        // What is held back counts from its own first sample at the flush that writes it.
        self.oldest_unflushed_ns = self.writer.oldest_pending_ns();
        Ok(flushed)
    }
}

mod detectors;
mod figures;
pub use figures::Figures;

#[cfg(test)]
mod tests;
