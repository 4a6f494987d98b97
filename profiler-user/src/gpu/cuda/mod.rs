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

pub mod library;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    num::NonZeroUsize,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use lru::LruCache;
use profiler_common::cuda::kind;

use crate::{
    collect::{Collector, cuda::Links},
    model::{Sample, SampleKind},
    pipeline::Pipeline,
    store::StoreWriter,
};
use library::FileId;

/// How often the counts are drained and the processes looked at.
pub const DRAIN_EVERY: Duration = Duration::from_secs(1);
/// How often the processes holding probed files are checked for life (their exit event may be
/// lost).
const ALIVE_EVERY: Duration = Duration::from_secs(5);
/// Stacks kept symbolized between drains (a launch site is drained every second for as long as
/// it launches).
const STACKS_KEPT: usize = 4096;

struct File {
    path: PathBuf,
    links: Option<Links>,
    pids: BTreeSet<u32>,
    /// Why it is not probed, said once.
    failed: Option<String>,
}

/// What the recorder did, for `/metrics` and `profiler status`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Stats {
    /// Library files with probes now.
    pub files: usize,
    /// Probes attached now (entries and returns).
    pub probes: usize,
    /// Processes mapping a probed file.
    pub processes: usize,
    /// Since start: launches, synchronisations and copies counted.
    pub launches: u64,
    pub syncs: u64,
    pub copies: u64,
    /// Counts whose stack the kernel no longer held (drained under `[stack lost]`).
    pub stacks_lost: u64,
    /// The last error attaching, if any.
    pub last_error: Option<String>,
}

pub struct Recorder {
    data_dir: PathBuf,
    files: BTreeMap<FileId, File>,
    by_pid: HashMap<u32, FileId>,
    /// Each process's VM size (pages) when its maps were last read.
    sizes: HashMap<u32, u64>,
    writers: HashMap<SampleKind, StoreWriter>,
    stacks: LruCache<u64, Sample>,
    started: bool,
    last_drain: Instant,
    last_alive: Instant,
    pub stats: Stats,
}

impl Recorder {
    pub fn new(data_dir: &Path) -> Self {
        Self {
            data_dir: data_dir.to_path_buf(),
            files: BTreeMap::new(),
            by_pid: HashMap::new(),
            sizes: HashMap::new(),
            writers: HashMap::new(),
            stacks: LruCache::new(NonZeroUsize::new(STACKS_KEPT).expect("non-zero")),
            started: false,
            last_drain: Instant::now(),
            last_alive: Instant::now(),
            stats: Stats::default(),
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
    pub fn tick(&mut self, collector: &mut Collector, pipeline: &mut Pipeline, now_ns: u64) {
        if !collector.cuda_ready() {
            return;
        }
        if self.started && self.last_drain.elapsed() < DRAIN_EVERY {
            return;
        }
        self.last_drain = Instant::now();
        let active: Vec<u32> = if self.started {
            pipeline.active.as_mut().map(|a| a.drain().collect()).unwrap_or_default()
        } else {
            self.started = true;
            all_pids()
        };
        for pid in active {
            self.look_at(pid);
        }
        if self.last_alive.elapsed() >= ALIVE_EVERY {
            self.last_alive = Instant::now();
            let gone: Vec<u32> =
                self.by_pid.keys().copied().filter(|p| !Path::new(&format!("/proc/{p}")).exists()).collect();
            for pid in gone {
                self.note_exit(pid);
            }
            self.sizes.retain(|p, _| Path::new(&format!("/proc/{p}")).exists());
        }
        self.attach_and_detach(collector);
        self.drain(collector, pipeline, now_ns);
    }

    /// Reads the maps of `pid` if its size changed since the last look.
    fn look_at(&mut self, pid: u32) {
        if pid == 0 || self.by_pid.contains_key(&pid) {
            return;
        }
        let Some(size) = vm_pages(pid) else { return };
        if self.sizes.insert(pid, size) == Some(size) {
            return;
        }
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else { return };
        let Some(m) = library::find(pid, &maps) else { return };
        let file = self.files.entry(m.id.clone()).or_insert_with(|| File {
            path: m.path.clone(),
            links: None,
            pids: BTreeSet::new(),
            failed: None,
        });
        if file.pids.is_empty() {
            // The first process to map it (again): its path is the one that opens.
            file.path = m.path;
        }
        file.pids.insert(pid);
        self.by_pid.insert(pid, m.id);
    }

    fn attach_and_detach(&mut self, collector: &mut Collector) {
        for (id, file) in &mut self.files {
            if file.pids.is_empty() {
                if let Some(links) = file.links.take() {
                    tracing::info!(library = %file.path.display(), "no process maps the CUDA library any more: probes removed");
                    collector.cuda_detach(links);
                }
                continue;
            }
            if file.links.is_some() || file.failed.is_some() {
                continue;
            }
            let attached = library::probes(&file.path)
                .map_err(|e| e.to_string())
                .and_then(|probes| collector.cuda_attach(&file.path, &probes).map_err(|e| e.to_string()));
            match attached {
                Ok(links) => {
                    tracing::info!(
                        library = %file.path.display(),
                        inode = id.inode,
                        probes = links.len(),
                        processes = file.pids.len(),
                        "CUDA driver library probed: launches, synchronisations and copies are counted per stack"
                    );
                    file.links = Some(links);
                }
                Err(e) => {
                    tracing::warn!(library = %file.path.display(), error = %e, "cannot probe the CUDA driver library");
                    self.stats.last_error = Some(e.clone());
                    file.failed = Some(e);
                }
            }
        }
        self.files.retain(|_, f| !f.pids.is_empty() || f.links.is_some());
        self.stats.files = self.files.values().filter(|f| f.links.is_some()).count();
        self.stats.probes = self.files.values().filter_map(|f| f.links.as_ref()).map(Links::len).sum();
        self.stats.processes = self.by_pid.len();
    }

    fn drain(&mut self, collector: &mut Collector, pipeline: &mut Pipeline, now_ns: u64) {
        let drained = collector.cuda_drain();
        if drained.is_empty() {
            return;
        }
        let now = Instant::now();
        for d in drained {
            let (kind, weight) = match d.key.kind {
                kind::LAUNCH => {
                    self.stats.launches += d.count.calls;
                    (SampleKind::CudaLaunches, d.count.calls)
                }
                kind::SYNC => {
                    self.stats.syncs += d.count.calls;
                    (SampleKind::CudaSync, d.count.ns / 1_000)
                }
                kind::COPY => {
                    self.stats.copies += d.count.calls;
                    (SampleKind::CudaCopies, d.count.bytes)
                }
                _ => continue,
            };
            let sample = match self.stacks.get(&d.key.hash) {
                Some(s) => Some(s.clone()),
                None => match collector.cuda_stack(d.key.hash) {
                    Some(record) => {
                        let bytes = record_bytes(&record);
                        let s = pipeline.cuda_sample(bytes, now_ns, now);
                        if let Some(s) = &s {
                            self.stacks.put(d.key.hash, s.clone());
                        }
                        s
                    }
                    None => None,
                },
            };
            let sample = match sample {
                Some(mut s) => {
                    s.ts_ns = now_ns;
                    s
                }
                None => {
                    self.stats.stacks_lost += 1;
                    lost_stack(d.key.pid, d.key.tid, now_ns)
                }
            };
            let Some(writer) = self.writer(kind) else { continue };
            let mut left = weight;
            while left > 0 {
                let part = left.min(u64::from(u32::MAX));
                left -= part;
                writer.push_weighted(&sample, part as u32);
            }
        }
        for (kind, w) in &mut self.writers {
            if let Err(e) = w.flush(now_ns) {
                tracing::warn!(samples = kind.name(), error = %e, "cannot write CUDA counts; they are held and written later");
            }
        }
    }

    fn writer(&mut self, kind: SampleKind) -> Option<&mut StoreWriter> {
        if !self.writers.contains_key(&kind) {
            let dir = kind.store_dir(&self.data_dir);
            let segments = crate::store::segments_dir(&dir);
            if let Err(e) = crate::store::files::prepare_private_dir(&dir)
                .and_then(|()| crate::store::files::prepare_private_dir(&segments))
            {
                tracing::warn!(error = %e, "cannot create the CUDA store");
                return None;
            }
            self.writers.insert(kind, StoreWriter::new(&segments));
        }
        self.writers.get_mut(&kind)
    }
}

/// A record's bytes as the ring would carry them (the parser reads only what the header counts).
fn record_bytes(r: &profiler_common::Record) -> &[u8] {
    unsafe { std::slice::from_raw_parts((r as *const profiler_common::Record).cast::<u8>(), size_of_val(r)) }
}

/// Counts whose stack the kernel's map dropped before the drain (more distinct stacks in a
/// second than it holds): kept, under one frame that says so.
fn lost_stack(pid: u32, tid: u32, ts_ns: u64) -> Sample {
    let frame: Arc<str> = Arc::from("[stack lost: more distinct CUDA call stacks than the kernel map holds]");
    Sample {
        ts_ns,
        cpu: 0,
        pid,
        tid,
        cgroup_id: 0,
        comm: Arc::from(""),
        stack: Arc::new(crate::model::Stack::new(vec![frame], 1)),
        workload: Arc::from(""),
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

/// `HashSet` of the pids a pipeline saw run, for [`Pipeline::active`].
pub fn active_set() -> HashSet<u32> {
    HashSet::new()
}
