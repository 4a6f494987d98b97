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
//! A process calling faster than the budget gets its probes part of the time (`guard`); what a
//! drain does with the counts is `drain`.

mod drain;
pub mod guard;
pub mod library;
pub mod status;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    num::NonZeroUsize,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use lru::LruCache;

use crate::{
    collect::{
        Collector,
        cuda::{Links, Probe},
    },
    detect::Changes,
    model::{Sample, SampleKind},
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
/// Processes given tracks per drain at most (the busiest launchers).
const TRACKS_MAX: usize = 32;
/// Stacks kept symbolized between drains (a launch site is drained every second for as long as
/// it launches). Twice what the kernel's stack map holds (`CUDA_STACKS_MAX`): a stack it no
/// longer holds cannot be drained under a new hash anyway, and each entry shares its frames
/// with the symbolizer's cache.
const STACKS_KEPT: usize = 1024;

/// Calls a second per process above which the rate guard duty-cycles the probes: 10,000 a
/// second stay exact with room to spare (a paced loop measures a little over its rate). At
/// 0.9-2.5 µs a hit (`cargo xtask bench cuda`: a shallow C stack, a deep Python one) that is
/// 1-3 % of one core.
pub const MAX_CALLS_PER_SEC: f64 = 12_000.0;

/// Library files probed at most: each holds an open file and its probes' file descriptors.
const FILES_MAX: usize = 16;

/// What the probes of a file were during one drain's interval.
#[derive(Debug, Clone, Copy, Default)]
struct Interval {
    /// Attached the whole interval (a rate measured then is the process's).
    attached: bool,
    /// Counts of the interval are estimates, to be scaled by `1 / fraction`.
    estimating: bool,
    fraction: f64,
}

struct File {
    path: PathBuf,
    /// Where a process maps it now (its `map_files` entry opens the very file).
    source: library::Mapped,
    /// The file itself, opened once through `map_files` and checked (`library::open`): probes
    /// are attached through it (`/proc/self/fd/N`), never by a path that could change.
    open: Option<std::fs::File>,
    /// The functions found in it, at their offsets (read once).
    probes: Option<Vec<Probe>>,
    links: Option<Links>,
    pids: BTreeSet<u32>,
    /// Why it is not probed, said once.
    failed: Option<String>,
    duty: guard::DutyCycle,
    /// The busiest process's calls a second, last measured with the probes on.
    rate: f64,
    /// The state of the last intervals, newest last: the counts a drain reads were written
    /// the interval before the last (`collect::cuda`), so that one says how to read them.
    intervals: std::collections::VecDeque<Interval>,
}

impl File {
    /// The interval whose counts the coming drain reads.
    fn read_interval(&self) -> Interval {
        let n = self.intervals.len();
        if n >= 2 { self.intervals[n - 2] } else { Interval::default() }
    }
}

pub struct Recorder {
    data_dir: PathBuf,
    files: BTreeMap<FileId, File>,
    by_pid: HashMap<u32, FileId>,
    /// Each process's VM size (pages) when its maps were last read, and when.
    sizes: HashMap<u32, (u64, Instant)>,
    writers: HashMap<SampleKind, StoreWriter>,
    stacks: LruCache<u64, Sample>,
    started: bool,
    last_drain: Instant,
    /// How long the probes wrote the counts map the next drain reads: the interval before the
    /// last drain (a map is read a drain after the probes left it).
    written_for: f64,
    last_alive: Instant,
    max_calls_per_sec: f64,
    /// `cuda.<pid>.launches` and `cuda.<pid>.sync_ms` tracks, beside the GPUs' (`None` until
    /// the first drain with counts, or when the counters directory cannot be written).
    tracks: Option<crate::store::counters::CountersWriter>,
    pub status: status::Status,
}

impl Recorder {
    /// `max_calls_per_sec`: the rate guard's limit per process ([`MAX_CALLS_PER_SEC`] by default).
    pub fn new(data_dir: &Path, max_calls_per_sec: f64) -> Self {
        Self {
            data_dir: data_dir.to_path_buf(),
            files: BTreeMap::new(),
            by_pid: HashMap::new(),
            sizes: HashMap::new(),
            writers: HashMap::new(),
            stacks: LruCache::new(NonZeroUsize::new(STACKS_KEPT).expect("non-zero")),
            started: false,
            last_drain: Instant::now(),
            written_for: 1.0,
            last_alive: Instant::now(),
            max_calls_per_sec,
            tracks: None,
            status: status::Status { max_calls_per_sec, ..Default::default() },
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
        if let Some(id) = self.by_pid.remove(&pid)
            && let Some(f) = self.files.get_mut(&id)
        {
            f.pids.remove(&pid);
        }
    }

    /// Once a second: looks at the processes that ran, attaches and detaches, drains the counts
    /// into the stores. `now_ns`: wall-clock time the drained counts are stamped with.
    pub fn tick(&mut self, collector: &mut Collector, pipeline: &mut Pipeline, now_ns: u64) -> Changes {
        if !collector.cuda_ready() {
            return Changes::default();
        }
        // Every tick: the processes that ran, and probes for a library first seen (a `dlopen`
        // is probed within the tick); the counts and the guard once a second.
        let active: Vec<u32> = if self.started {
            pipeline.active.as_mut().map(|a| a.drain().collect()).unwrap_or_default()
        } else {
            self.started = true;
            all_pids()
        };
        for pid in active {
            if self.look_at(pid)
                && let Some(unwind) = pipeline.unwind.as_mut()
            {
                // Its stacks are walked from now on: its tables and Python frames are wanted
                // now, not once a sample happens to meet it (it may sleep until it launches).
                unwind.mapped(pid, Instant::now());
            }
        }
        if self.files.values().any(|f| f.links.is_none() && f.failed.is_none() && !f.duty.estimating()) {
            self.attach_new(collector);
        }
        if self.last_drain.elapsed() < DRAIN_EVERY {
            return Changes::default();
        }
        let elapsed = std::mem::replace(&mut self.written_for, self.last_drain.elapsed().as_secs_f64().max(0.001));
        self.last_drain = Instant::now();
        if self.last_alive.elapsed() >= ALIVE_EVERY {
            self.last_alive = Instant::now();
            let gone: Vec<u32> =
                self.by_pid.keys().copied().filter(|p| !Path::new(&format!("/proc/{p}")).exists()).collect();
            for pid in gone {
                self.note_exit(pid);
            }
            self.sizes.retain(|p, _| Path::new(&format!("/proc/{p}")).exists());
        }
        let read: HashMap<FileId, Interval> =
            self.files.iter().map(|(id, f)| (id.clone(), f.read_interval())).collect();
        let (rates, threads) = self.drain(collector, pipeline, now_ns, elapsed, &read);
        self.write_tracks(&threads, now_ns, elapsed);
        self.attach_and_detach(collector, &rates, &read);
        for f in self.files.values_mut() {
            let now =
                Interval { attached: f.links.is_some(), estimating: f.duty.estimating(), fraction: f.duty.fraction() };
            f.intervals.push_back(now);
            if f.intervals.len() > 3 {
                f.intervals.pop_front();
            }
        }
        self.publish();
        pipeline.engine.check_cuda(now_ns, elapsed, threads)
    }

    /// Reads the maps of `pid` if its size changed since the last look; true when it maps the
    /// library (newly).
    fn look_at(&mut self, pid: u32) -> bool {
        if pid == 0 || self.by_pid.contains_key(&pid) {
            return false;
        }
        let Some(size) = vm_pages(pid) else { return false };
        let now = Instant::now();
        match self.sizes.get(&pid) {
            Some(&(s, _)) if s == size => return false,
            // A process whose size keeps changing (an allocator's arenas) is read at most this
            // often: its maps can be megabytes (60,000 mappings) and take its mmap lock.
            Some(&(_, at)) if now.duration_since(at) < MAPS_EVERY => return false,
            _ => {}
        }
        self.sizes.insert(pid, (size, now));
        let Some(m) = library::find_in_maps(pid) else { return false };
        if !self.files.contains_key(&m.id) && self.files.len() >= FILES_MAX {
            tracing::debug!(library = %m.path.display(), "more CUDA driver libraries than the daemon probes ({FILES_MAX}): not probed");
            return false;
        }
        let file = self.files.entry(m.id.clone()).or_insert_with(|| File {
            path: m.path.clone(),
            source: m.clone(),
            open: None,
            probes: None,
            links: None,
            pids: BTreeSet::new(),
            failed: None,
            duty: guard::DutyCycle::default(),
            rate: 0.0,
            intervals: Default::default(),
        });
        if file.pids.is_empty() {
            // The first process to map it (again): the one its file is opened through.
            file.path = m.path.clone();
            file.source = m.clone();
        }
        file.pids.insert(pid);
        self.by_pid.insert(pid, m.id);
        true
    }

    /// Probes the files some process maps and that have none yet (outside the guard's cycle).
    fn attach_new(&mut self, collector: &mut Collector) {
        for (id, file) in &mut self.files {
            if file.pids.is_empty() || file.links.is_some() || file.failed.is_some() || file.duty.estimating() {
                continue;
            }
            attach(collector, id, file);
        }
    }

    /// Attaches what should be, by the processes mapping each file and its guard; detaches the
    /// rest. `rates`: calls a second per process in the drain just done.
    fn attach_and_detach(
        &mut self,
        collector: &mut Collector,
        rates: &HashMap<u32, f64>,
        read: &HashMap<FileId, Interval>,
    ) {
        for (id, file) in &mut self.files {
            if file.pids.is_empty() {
                if let Some(links) = file.links.take() {
                    tracing::info!(library = %file.path.display(), "no process maps the CUDA library any more: probes removed");
                    collector.cuda_detach(links);
                }
                continue;
            }
            if file.failed.is_some() {
                continue;
            }
            // Only an interval the probes covered whole says how fast the processes call.
            let measured = read
                .get(id)
                .is_some_and(|i| i.attached)
                .then(|| file.pids.iter().filter_map(|p| rates.get(p)).copied().fold(0.0, f64::max));
            if let Some(r) = measured {
                file.rate = r;
            }
            let was = file.duty.estimating();
            let want = file.duty.next(measured, self.max_calls_per_sec);
            if file.duty.estimating() != was {
                if file.duty.estimating() {
                    tracing::warn!(
                        library = %file.path.display(),
                        calls_per_sec = file.rate.round(),
                        limit = self.max_calls_per_sec,
                        attached_percent = (file.duty.fraction() * 100.0).round(),
                        "CUDA calls faster than the probes' budget: probes attached part of the time, counts are \
                         estimates scaled to the whole time"
                    );
                } else {
                    tracing::info!(library = %file.path.display(), "CUDA calls within the budget again: probes always on, counts exact");
                }
            }
            match (want, file.links.is_some()) {
                (false, true) => collector.cuda_detach(file.links.take().expect("attached")),
                (true, false) => attach(collector, id, file),
                _ => {}
            }
        }
        self.files.retain(|_, f| !f.pids.is_empty() || f.links.is_some());
    }

    fn publish(&mut self) {
        let libraries = self
            .files
            .values()
            .map(|f| status::Library {
                path: f.path.display().to_string(),
                probes: f.probes.as_ref().map_or(0, |p| p.len() + p.iter().filter(|p| p.returns).count()),
                processes: f.pids.len(),
                fraction: f.duty.fraction(),
                calls_per_sec: f.rate,
                error: f.failed.clone(),
            })
            .collect();
        let status = status::Status { libraries, ..self.status.clone() };
        if status != self.status {
            status.write(&self.data_dir);
            self.status = status;
        }
    }
}

/// Attaches the probes to `file` (its functions read once), or records why not.
fn attach(collector: &mut Collector, id: &FileId, file: &mut File) {
    if file.open.is_none() {
        match library::open(&file.source) {
            Ok(f) => file.open = Some(f),
            // The process it was opened through exited: the next one to map it opens it.
            Err(library::LibraryError::Read(..)) => return,
            Err(e) => {
                tracing::warn!(library = %file.path.display(), error = %e, "the CUDA driver library is not probed");
                file.failed = Some(e.to_string());
                return;
            }
        }
    }
    let Some(open) = file.open.as_ref() else { return };
    let target = PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(open)));
    let probes = match &file.probes {
        Some(p) => Ok(p.clone()),
        None => library::probes(open, &file.path).map_err(|e| e.to_string()),
    };
    let attached = probes.and_then(|probes| {
        let links = collector.cuda_attach(&target, &probes).map_err(|e| e.to_string());
        file.probes = Some(probes);
        links
    });
    match attached {
        Ok(links) => {
            if !file.duty.estimating() {
                tracing::info!(
                    library = %file.path.display(),
                    inode = id.inode,
                    probes = links.len(),
                    processes = file.pids.len(),
                    "CUDA driver library probed: launches, synchronisations and copies are counted per stack"
                );
            }
            file.links = Some(links);
        }
        Err(e) => {
            tracing::warn!(library = %file.path.display(), error = %e, "cannot probe the CUDA driver library");
            file.failed = Some(e);
        }
    }
}

fn all_pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()
}

/// The process's virtual size in pages (`/proc/PID/statm`'s first field): a cheap read that
/// changes when a library is mapped.
fn vm_pages(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    text.split_ascii_whitespace().next()?.parse().ok()
}
