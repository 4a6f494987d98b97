//! CUDA launches, synchronisations and copies attributed to stacks (issue 27), with no restart
//! and no change to the processes: every `libcuda.so.1` a process maps gets uprobes
//! (`collect::cuda`), once per file however many processes map it, found
//! - at the daemon's start, for the processes already running;
//! - for every process that runs: its `/proc/PID/statm` is read at most once a second and its
//!   maps only when its size changed (a late `dlopen` of the library is found within a second
//!   of the process running again);
//! - again after an exec.
//!
//! Once a second the counts are drained into stores of their own
//! (`model::SampleKind::store_dir`): launches, microseconds blocked, bytes, as weighted rows the
//! same queries, filters and exports read. A file no process maps any more loses its probes.
//! A process calling faster than the budget is counted part of the time (`guard`, per process);
//! what a drain does with the counts is `drain`. What a user controls is bounded: a file that
//! fails the checks (`library`) is refused once and takes no slot, the kernel's maps are shared
//! per user (`profiler_common::cuda::OwnerUse`), and a drain holds a row a key.
//!
//! A process's `libcudart.so.*` is probed too (its launches name their kernel by host stub),
//! beside its driver, from the moment it is mapped (`discover`); launches are counted under
//! their kernel's name (`kernels`).

mod discover;
mod drain;
pub mod guard;
pub mod kernels;
pub mod library;
pub mod status;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    num::NonZeroUsize,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use lru::LruCache;

use crate::{
    collect::{
        Collector,
        cuda::{Detaching, Links, Probe},
    },
    detect::Changes,
    model::{Sample, SampleKind, Stack},
    pipeline::Pipeline,
    store::StoreWriter,
};
use library::FileId;

/// How often the counts are drained (a little less than a second: the stage ticks once a
/// second by default, and a tick a millisecond early must not make it two).
pub const DRAIN_EVERY: Duration = Duration::from_millis(900);
/// How often the processes holding probed files are checked for life (their exit event may be
/// lost).
const ALIVE_EVERY: Duration = Duration::from_secs(5);
/// The least time between two reads of one process's maps.
const MAPS_EVERY: Duration = Duration::from_millis(500);
/// The least time between two looks for the runtime library in a process probed without it
/// (a `dlopen` after the driver's is rare: PyTorch maps the runtime first).
const RUNTIME_EVERY: Duration = Duration::from_secs(10);
/// Processes given tracks per drain at most (the busiest launchers).
const TRACKS_MAX: usize = 32;
/// Stacks kept symbolized between drains (a launch site is drained every second for as long as
/// it launches). Twice what the kernel's stack map holds (`CUDA_STACKS_MAX`): a stack it no
/// longer holds cannot be drained under a new hash anyway, and each entry shares its frames
/// with the symbolizer's cache.
const STACKS_KEPT: usize = 1024;

/// Probe hits a second per process above which the rate guard duty-cycles the probes, when
/// none is configured: a budget of time, 1 % of the process's own CPU time spent in hits of
/// about 4.4 µs, at least 1,000 a second (`guard::budget`): 2,270 a second for a process on
/// one core. A launch-bound step loop is then at most 1 % slower (`cargo xtask bench
/// cuda-step`); a process launching faster is counted part of the time, its counts scaled
/// estimates. A fixed 12,000, before, let such a loop lose 3-4 %.
pub const MAX_CALLS_PER_SEC: Option<f64> = None;

/// Library files probed at most: each holds an open file and its probes' file descriptors.
/// Only files that passed the checks count (a refused file takes no slot).
const FILES_MAX: usize = 16;
/// Refused files remembered (by device and inode), so that none is opened and parsed again
/// each time a process maps it; the least recently seen is forgotten past this.
const REFUSED_KEPT: usize = 1024;
/// Processes waiting for a slot (more probed libraries than `FILES_MAX`), looked at again
/// when one frees.
const WAITING_MAX: usize = 4096;
/// Refused or waiting libraries listed in the status (the rest are counted).
const LISTED_MAX: usize = 32;
/// Threads handed to the detectors per drain: the most blocked and the busiest launchers.
const THREADS_MAX: usize = 128;
/// Rows each CUDA store holds while writing fails: three drains' worth of the kernel's keys
/// (a row a key and kind), the oldest dropped past it. About 100 bytes a row, stacks shared.
const ROWS_HELD: usize = 3 * profiler_common::cuda::CUDA_COUNTS_MAX as usize;

/// What the probes were for one process during one drain's interval.
#[derive(Debug, Clone, Copy, Default)]
struct Interval {
    /// Counted the whole interval (a rate measured then is the process's).
    attached: bool,
    /// Counts of the interval are estimates, to be scaled by `1 / fraction`.
    estimating: bool,
    fraction: f64,
    /// Seconds into the interval its counting began (the gate opened once the probes were
    /// attached): the counts cover the rest of it.
    late_secs: f64,
}

impl Interval {
    /// The seconds of the interval, `elapsed` long, its counts cover.
    fn covered(&self, elapsed: f64) -> f64 {
        (elapsed - self.late_secs).max(0.001)
    }
}

/// A library file accepted for probes.
struct File {
    path: PathBuf,
    role: library::Role,
    /// The file itself, opened once through `map_files` and checked (`library::open`): probes
    /// are attached through it (`/proc/self/fd/N`), never by a path that could change.
    open: std::fs::File,
    /// The functions found in it, at their offsets (read once, when it was accepted).
    probes: Vec<Probe>,
    links: Option<Links>,
    pids: BTreeSet<u32>,
    /// Why its probes could not be attached, said once.
    failed: Option<String>,
    /// Its first attachment was logged (the guard detaches and attaches again).
    said: bool,
    /// Its probes last detached, maybe still going (a detach waits on the kernel).
    detaching: Option<Detaching>,
    /// Whole seconds its probes' last detach took.
    detach_secs: u32,
}

impl File {
    /// A file accepted, with the probes found in it: none attached yet, no process yet.
    fn new(path: PathBuf, role: library::Role, open: std::fs::File, probes: Vec<Probe>) -> Self {
        Self {
            path,
            role,
            open,
            probes,
            links: None,
            pids: BTreeSet::new(),
            failed: None,
            said: false,
            detaching: None,
            detach_secs: 0,
        }
    }

    /// Whether its probes may be attached now: not refused, and none left from a detach (two
    /// sets would count each call twice).
    fn attachable(&self) -> bool {
        self.failed.is_none() && self.detaching.as_ref().is_none_or(Detaching::done)
    }

    fn detach(&mut self, collector: &mut Collector) {
        if let Some(links) = self.links.take() {
            self.detaching = Some(collector.cuda_detach(links));
        }
    }

    /// Notes a detach that ended, and how long it took.
    fn settle(&mut self) {
        if self.detaching.as_ref().is_some_and(Detaching::done)
            && let Some(took) = self.detaching.take().and_then(Detaching::took)
        {
            self.detach_secs = took.as_secs_f64().ceil() as u32;
        }
    }
}

/// A process mapping an accepted file: the rate guard is its own, so that one process's flood
/// turns no other process's counts into estimates.
struct Proc {
    file: FileId,
    /// Its runtime library, once found (probed or refused).
    runtime: Option<FileId>,
    /// When its maps were last read for the runtime.
    runtime_looked: Instant,
    /// Its `map_files` entry for the library: gone once the process unmapped it.
    map_files: PathBuf,
    duty: guard::DutyCycle,
    /// Its CPU time, which its budget is a share of.
    cpu: guard::CpuUse,
    /// Its hits a second allowed, as last worked out.
    limit: f64,
    /// Switched off in the kernel (`CUDA_GATE`) for the coming second.
    gated: bool,
    /// Its calls a second, last measured while counted.
    rate: f64,
    /// The state of the last intervals, newest last: the counts a drain reads were written
    /// the interval before the last (`collect::cuda`), so that one says how to read them.
    intervals: VecDeque<Interval>,
}

impl Proc {
    /// The interval whose counts the coming drain reads.
    fn read_interval(&self) -> Interval {
        let n = self.intervals.len();
        if n >= 2 { self.intervals[n - 2] } else { Interval::default() }
    }
}

/// A file that failed the checks, remembered so that it is neither parsed again nor probed.
struct Refused {
    path: PathBuf,
    reason: String,
    pids: BTreeSet<u32>,
}

pub struct Recorder {
    data_dir: PathBuf,
    files: BTreeMap<FileId, File>,
    procs: HashMap<u32, Proc>,
    refused: LruCache<FileId, Refused>,
    /// Processes mapping a refused file (so that their exit is noted there).
    refused_by_pid: HashMap<u32, FileId>,
    /// Processes mapping a library that found no free slot, looked at again when one frees.
    waiting: BTreeMap<u32, library::Mapped>,
    /// Processes mapping an accepted runtime library before the driver (`import torch` loads
    /// the runtime; CUDA's start, right before the first launches, loads the driver): their
    /// runtime's probes are attached now, so that the look-ups of those launches (CUDA 13's
    /// `__cudaGetKernel`) are seen. By the `map_files` entry that shows they still map it.
    early: HashMap<u32, PathBuf>,
    /// Processes forgotten while switched off in the kernel: their gate is lifted next tick.
    ungate: Vec<u32>,
    /// Each process's VM size (pages) when its maps were last read, and when.
    sizes: HashMap<u32, (u64, Instant)>,
    writers: HashMap<SampleKind, StoreWriter>,
    stacks: LruCache<u64, Sample>,
    /// Stacks marked as estimates, by hash, kernel and the share of time counted (percent).
    estimates: LruCache<(u64, u64, u32), Arc<Stack>>,
    started: bool,
    /// The probes' programs were loaded for a node with GPUs.
    preloaded: bool,
    last_drain: Instant,
    /// How long the probes wrote the counts map the next drain reads: the interval before the
    /// last drain (a map is read a drain after the probes left it).
    written_for: f64,
    last_alive: Instant,
    /// A fixed budget (`--cuda-max-calls-per-sec`), or `None`: a share of each process's CPU.
    max_calls_per_sec: Option<f64>,
    /// `cuda.<pid>.launches` and `cuda.<pid>.sync_ms` tracks, beside the GPUs' (`None` until
    /// the first drain with counts, or when the counters directory cannot be written).
    tracks: Option<crate::store::counters::CountersWriter>,
    /// What each process's look-ups named.
    kernels: kernels::Kernels,
    /// Stacks with their kernel's leaf frame, by stack hash and `CudaKey::func`.
    named: LruCache<(u64, u64), (Arc<str>, Arc<Stack>)>,
    pub status: status::Status,
    /// The daemon's own pid, never looked at (`look_at`).
    own_pid: u32,
}

impl Recorder {
    /// `max_calls_per_sec`: the rate guard's limit per process, or `None` for the default
    /// ([`MAX_CALLS_PER_SEC`]: a share of each process's CPU time).
    pub fn new(data_dir: &Path, max_calls_per_sec: Option<f64>) -> Self {
        let kept = |n| NonZeroUsize::new(n).expect("non-zero");
        Self {
            data_dir: data_dir.to_path_buf(),
            files: BTreeMap::new(),
            procs: HashMap::new(),
            refused: LruCache::new(kept(REFUSED_KEPT)),
            refused_by_pid: HashMap::new(),
            waiting: BTreeMap::new(),
            early: HashMap::new(),
            ungate: Vec::new(),
            sizes: HashMap::new(),
            writers: HashMap::new(),
            stacks: LruCache::new(kept(STACKS_KEPT)),
            estimates: LruCache::new(kept(STACKS_KEPT)),
            started: false,
            preloaded: false,
            last_drain: Instant::now(),
            written_for: 1.0,
            last_alive: Instant::now(),
            max_calls_per_sec,
            tracks: None,
            kernels: kernels::Kernels::default(),
            named: LruCache::new(kept(STACKS_KEPT)),
            status: status::Status { max_calls_per_sec: max_calls_per_sec.unwrap_or(0.0), ..Default::default() },
            own_pid: std::process::id(),
        }
    }

    /// A process exec'd: another program under the pid, whose maps are read afresh.
    pub fn note_exec(&mut self, pid: u32) {
        self.sizes.remove(&pid);
        self.forget(pid);
    }

    pub fn note_exit(&mut self, pid: u32) {
        self.sizes.remove(&pid);
        self.forget(pid);
    }

    fn forget(&mut self, pid: u32) {
        self.kernels.forget(pid);
        self.forget_early(pid);
        if let Some(p) = self.procs.remove(&pid) {
            if let Some(f) = self.files.get_mut(&p.file) {
                f.pids.remove(&pid);
            }
            if let Some(id) = &p.runtime {
                if let Some(f) = self.files.get_mut(id) {
                    f.pids.remove(&pid);
                }
                if let Some(r) = self.refused.peek_mut(id) {
                    r.pids.remove(&pid);
                }
            }
            // Its kernel gate goes too: a process reusing the pid starts counted.
            if p.gated {
                self.ungate.push(pid);
            }
        }
        if let Some(id) = self.refused_by_pid.remove(&pid)
            && let Some(r) = self.refused.peek_mut(&id)
        {
            r.pids.remove(&pid);
        }
        self.waiting.remove(&pid);
    }

    /// Once a second: looks at the processes that ran, attaches and detaches, drains the counts
    /// into the stores, each count in the second it was made in. `now_ns`: wall-clock time now.
    pub fn tick(&mut self, collector: &mut Collector, pipeline: &mut Pipeline, now_ns: u64) -> Changes {
        // A node with GPUs gets the probes' programs now (a second of the verifier's time), so
        // that a library first mapped later is probed within the tick; others when one is.
        if !self.preloaded && pipeline.has_gpus() {
            self.preloaded = true;
            let _ = collector.cuda_load();
        }
        // Every tick: the processes that ran, and probes for a library first seen (a `dlopen`
        // is probed within the tick); the counts and the guard once a second.
        let active: Vec<u32> = if self.started {
            pipeline.take_active()
        } else {
            self.started = true;
            all_pids()
        };
        for pid in active {
            if self.look_at(pid) {
                // Its stacks are walked from now on: its tables and Python frames are wanted
                // now, not once a sample happens to meet it (it may sleep until it launches).
                pipeline.want_tables(pid, Instant::now());
            }
        }
        for pid in self.ungate.drain(..) {
            collector.cuda_gate(pid, false);
        }
        self.attach_new(collector);
        // Where wall-clock seconds start, for the probes loaded (now or by an attach): their
        // counts are keyed by the second they were made in.
        collector.cuda_clock(pipeline.offset());
        if self.last_drain.elapsed() < DRAIN_EVERY {
            return Changes::default();
        }
        let elapsed = std::mem::replace(&mut self.written_for, self.last_drain.elapsed().as_secs_f64().max(0.001));
        self.last_drain = Instant::now();
        if self.last_alive.elapsed() >= ALIVE_EVERY {
            self.last_alive = Instant::now();
            self.check_alive();
        }
        if self.files.len() < FILES_MAX && !self.waiting.is_empty() {
            self.admit_waiting();
        }
        let read: HashMap<u32, Interval> = self.procs.iter().map(|(&pid, p)| (pid, p.read_interval())).collect();
        let (rates, threads) = self.drain(collector, pipeline, now_ns, elapsed, &read);
        self.write_tracks(&threads, now_ns, elapsed);
        self.guard(collector, &rates, &read);
        self.publish();
        pipeline.check_cuda(now_ns, elapsed, threads)
    }

    /// Forgets the processes that exited unseen (an exit event can be lost) or unmapped the
    /// library (`dlclose`): their `map_files` entry is gone.
    fn check_alive(&mut self) {
        let gone: Vec<u32> = self
            .procs
            .iter()
            .filter(|(_, p)| !p.map_files.exists())
            .map(|(&pid, _)| pid)
            .chain(self.refused_by_pid.keys().chain(self.waiting.keys()).copied().filter(|p| !alive(*p)))
            .chain(self.early.iter().filter(|(_, m)| !m.exists()).map(|(&pid, _)| pid))
            .collect();
        for pid in gone {
            self.note_exit(pid);
        }
        self.sizes.retain(|p, _| alive(*p));
    }

    /// Probes the files that some process counted by them maps and that have none yet.
    fn attach_new(&mut self, collector: &mut Collector) {
        for file in self.files.values_mut() {
            if file.links.is_some() || !file.attachable() {
                continue;
            }
            if file.pids.iter().any(|p| self.procs.get(p).is_some_and(|p| !p.gated) || self.early.contains_key(p)) {
                attach(collector, file);
            }
        }
    }

    fn publish(&mut self) {
        let mut libraries: Vec<status::Library> = self
            .files
            .values()
            .map(|f| {
                let procs = || f.pids.iter().filter_map(|p| self.procs.get(p));
                status::Library {
                    path: f.path.display().to_string(),
                    probes: f.probes.len() + f.probes.iter().filter(|p| p.returns).count(),
                    processes: f.pids.len(),
                    fraction: procs().map(|p| p.duty.fraction()).fold(1.0, f64::min),
                    calls_per_sec: procs().map(|p| p.rate).fold(0.0, f64::max),
                    error: f.failed.clone(),
                }
            })
            .collect();
        let mut refused: Vec<status::Library> = self
            .refused
            .iter()
            .filter(|(_, r)| !r.pids.is_empty())
            .map(|(_, r)| status::Library {
                path: r.path.display().to_string(),
                processes: r.pids.len(),
                error: Some(r.reason.clone()),
                ..Default::default()
            })
            .collect();
        let mut waiting: BTreeMap<&FileId, status::Library> = BTreeMap::new();
        for m in self.waiting.values() {
            waiting
                .entry(&m.id)
                .or_insert_with(|| status::Library {
                    path: m.path.display().to_string(),
                    error: Some(format!(
                        "more CUDA driver libraries than the daemon probes ({FILES_MAX}): probed once one is no longer \
                         mapped"
                    )),
                    ..Default::default()
                })
                .processes += 1;
        }
        let unprobed = status::Unprobed { refused: refused.len(), waiting: waiting.len() };
        refused.extend(waiting.into_values());
        refused.truncate(LISTED_MAX);
        libraries.extend(refused);
        let mut guarded: Vec<status::Guarded> = self
            .procs
            .iter()
            .filter(|(_, p)| p.duty.estimating())
            .map(|(&pid, p)| status::Guarded {
                pid,
                fraction: p.duty.fraction(),
                calls_per_sec: p.rate,
                limit: p.limit.round(),
            })
            .collect();
        guarded.sort_by(|a, b| b.calls_per_sec.total_cmp(&a.calls_per_sec));
        guarded.truncate(LISTED_MAX);
        let status = status::Status { libraries, unprobed, guarded, ..self.status.clone() };
        if status != self.status {
            status.write(&self.data_dir);
            self.status = status;
        }
    }
}

/// Attaches the probes to `file` (their programs loaded first, when none were), or records why
/// not.
fn attach(collector: &mut Collector, file: &mut File) {
    let target = PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file.open)));
    match collector.cuda_attach(&target, &file.probes) {
        Ok(links) => {
            if !std::mem::replace(&mut file.said, true) {
                match file.role {
                    library::Role::Driver => tracing::info!(
                        library = %file.path.display(),
                        probes = links.len(),
                        processes = file.pids.len(),
                        "CUDA driver library probed: launches, synchronisations and copies are counted per stack"
                    ),
                    library::Role::Runtime => tracing::info!(
                        library = %file.path.display(),
                        probes = links.len(),
                        processes = file.pids.len(),
                        "CUDA runtime library probed: its launches are named by their kernel's host stub"
                    ),
                }
            }
            file.links = Some(links);
        }
        Err(e) => {
            tracing::warn!(library = %file.path.display(), error = %e, "cannot probe the CUDA driver library");
            file.failed = Some(e.to_string());
        }
    }
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

fn all_pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()
}
