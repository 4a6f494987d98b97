//! User stacks for code without frame pointers: unwind tables compiled from each binary's call
//! frame information (`table`), placed in the kernel (`registry`, `kernel`) for the sampler to
//! walk. This stage runs on its own thread, off the sampling path: the pipeline tells it which
//! processes it sees (`Notifier`), and it describes them to the kernel. Until a process is
//! described, its stacks are walked with frame pointers as before.

pub mod packed;
pub mod registry;
pub mod table;

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap, VecDeque},
    fs::File,
    os::unix::fs::MetadataExt,
    sync::{
        Arc, Mutex,
        mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use registry::{Build, FileKey, MappedFile, Registry, Stats};

use crate::collect::unwind_maps::Maps;
use crate::interpreter::{
    Runtime,
    python::{CPython, Layout as PyLayout},
};
use crate::symbolize::{file, maps};

/// A process's mappings are read again when it is seen this long after the last read
/// (libraries loaded later with `dlopen` get their tables then), and then at twice the
/// interval each time, up to `REREAD_MAX`: most processes map their code once. A library
/// mapped later is found sooner by the symbolizer, which meets its addresses
/// ([`Notifier::mapped`]).
const REREAD_AFTER: Duration = Duration::from_secs(10);
const REREAD_MAX: Duration = Duration::from_secs(80);
/// How often exited processes are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// Freed table memory is handed back at most this often (`malloc_trim`).
const TRIM_EVERY: Duration = Duration::from_secs(10);
/// After an exec the loader maps the libraries within milliseconds: the process is described
/// again this long after its exec (and once more, later), so a short-lived one gets every table.
const AFTER_EXEC: [Duration; 2] = [Duration::from_millis(20), Duration::from_millis(500)];
/// Files larger than this are built by their own thread.
const LARGE_FILE: u64 = 16 << 20;
/// Tables waiting for a builder thread; past this a file is tried again at the next description.
const BUILDS_QUEUED: usize = 64;
/// Requests waiting for the stage; past this the pipeline drops them (a later sample asks again).
const QUEUE: usize = 4096;
/// A process's maps are read whole (the kernel's vm.max_map_count is 65,530; the byte bound of
/// `maps::read` stays), within this time: the description chooses among all its mappings, and
/// the ones it keeps first (the loader's) are listed last. This thread is off the sampling path.
const MAPS_MAPPINGS: usize = 65_536;
const MAPS_BUDGET: Duration = Duration::from_millis(250);
/// Files a description opens for the first time, at most; a process with more (thousands of
/// files mapped executable: each is opened once, 20 µs) is described again without the bound
/// this long after, so that the tables of its binary and libc, built meanwhile, go in first.
const FIRST_CHECKS: usize = 64;
const CHECK_THE_REST_AFTER: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Copy)]
enum Request {
    /// A sample of this process was handled.
    Seen(u32),
    /// The process exec'd, or mapped code since it was described: its mappings are new.
    Exec(u32),
}

/// The pipeline's side: cheap, never blocks.
pub struct Notifier {
    tx: SyncSender<Request>,
    /// When each process was last announced, and the interval to the next announcement.
    announced: HashMap<u32, (Instant, Duration)>,
    stats: Arc<Mutex<Stats>>,
    /// CPython minor version per process with Python frames.
    layouts: PyLayouts,
}

impl Notifier {
    /// A sample of `pid` with a user stack was seen.
    pub fn seen(&mut self, pid: u32, now: Instant) {
        let every = match self.announced.get(&pid) {
            Some(&(at, every)) if now.duration_since(at) < every => return,
            Some(&(_, every)) => (every * 2).min(REREAD_MAX),
            None => REREAD_AFTER,
        };
        if self.announced.len() >= 65_536 {
            self.announced.clear();
        }
        if self.send(Request::Seen(pid)) {
            self.announced.insert(pid, (now, every));
        }
    }

    /// `pid` mapped code since its mappings were last read (the symbolizer met an address
    /// outside them): describe it again now, and often again for a while.
    pub fn mapped(&mut self, pid: u32, now: Instant) {
        if self.send(Request::Exec(pid)) {
            self.announced.insert(pid, (now, REREAD_AFTER));
        }
    }

    /// A notifier with no stage behind it, knowing the CPython layouts of `layouts`: the
    /// replay bench's, so that its Python records go through the daemon's very path. What it
    /// is told waits in the returned queue, which the caller empties as the stage would.
    pub fn detached(layouts: HashMap<u32, Arc<PyLayout>>) -> (Self, Detached) {
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
        let layouts = Arc::new(Mutex::new(layouts.into_iter().map(|(pid, l)| (pid, Some(l))).collect()));
        let notifier = Self { tx, announced: HashMap::new(), stats: Arc::default(), layouts };
        (notifier, Detached(rx))
    }

    /// The CPython layout of `pid`, when its samples carry Python frames.
    pub fn python_layout(&self, pid: u32) -> Option<Arc<PyLayout>> {
        self.layouts.lock().ok()?.get(&pid)?.clone()
    }

    /// The stage's figures as of its last sweep.
    pub fn stats(&self) -> Stats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }

    /// `pid` exec'd.
    pub fn exec(&mut self, pid: u32) {
        self.send(Request::Exec(pid));
    }

    fn send(&self, r: Request) -> bool {
        match self.tx.try_send(r) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    }
}

/// What a [`Notifier::detached`] was told, waiting.
pub struct Detached(Receiver<Request>);

impl Detached {
    /// Takes what waits; returns how many requests there were.
    pub fn drain(&self) -> usize {
        self.0.try_iter().count()
    }
}

pub struct Stage {
    pub stats: Arc<Mutex<Stats>>,
    pub thread: JoinHandle<()>,
}

/// Starts the stage with the kernel's maps; it stops when every `Notifier` is gone.
pub fn spawn(maps: Maps) -> std::io::Result<(Notifier, Stage)> {
    let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
    let stats = Arc::new(Mutex::new(Stats::default()));
    let shared = stats.clone();
    let pythons = Pythons::default();
    let layouts = pythons.layouts.clone();
    let (built_tx, built) = std::sync::mpsc::channel();
    // Two builders: one for large files, one for the rest, so that a new process's small
    // binary never waits behind a 150 MB library.
    let spawn_builder = |name: &str| -> std::io::Result<SyncSender<(FileKey, File)>> {
        let (jobs, job_rx) = std::sync::mpsc::sync_channel::<(FileKey, File)>(BUILDS_QUEUED);
        let built_tx = built_tx.clone();
        std::thread::Builder::new().name(name.into()).spawn(move || build_tables(job_rx, built_tx))?;
        Ok(jobs)
    };
    let jobs = spawn_builder("unwind-build")?;
    let large_jobs = spawn_builder("unwind-build-l")?;
    let builder = Builder { jobs, large_jobs, built, pending: 0 };
    let thread = std::thread::Builder::new()
        .name("unwind".into())
        .spawn(move || run(Registry::new(maps), pythons, builder, rx, shared))?;
    Ok((Notifier { tx, announced: HashMap::new(), stats: stats.clone(), layouts }, Stage { stats, thread }))
}

/// The table builder thread, seen from the stage: a table can take a second (a 150 MB binary
/// in a debug build, on a busy CPU), and descriptions of new processes must not wait for it.
struct Builder {
    jobs: SyncSender<(FileKey, File)>,
    /// Files over `LARGE_FILE` bytes.
    large_jobs: SyncSender<(FileKey, File)>,
    built: Receiver<(FileKey, Result<table::Table, table::TableError>)>,
    pending: usize,
}

/// A builder thread: compiles the tables of the files it is sent, smallest first, at nice 10
/// (the sampling stages come first when CPUs are scarce).
fn build_tables(
    job_rx: Receiver<(FileKey, File)>,
    built_tx: std::sync::mpsc::Sender<(FileKey, Result<table::Table, table::TableError>)>,
) {
    crate::threads::lower_this_thread();
    let mut queue: Vec<(FileKey, File)> = Vec::new();
    loop {
        if queue.is_empty() {
            match job_rx.recv() {
                Ok(job) => queue.push(job),
                Err(_) => return,
            }
        }
        queue.extend(job_rx.try_iter());
        let smallest = (0..queue.len()).min_by_key(|&i| queue[i].0.size).expect("not empty");
        let (key, file) = queue.swap_remove(smallest);
        let result = match trusted_map(&file) {
            Some(map) => table::compile_within(&map[..], &crate::memory::UNWIND, table::Source::Mapped),
            None => table::compile(&object::ReadCache::new(&file)),
        };
        if built_tx.send((key, result)).is_err() {
            return;
        }
    }
}

/// A regular file of root's that no one else may write: nothing a user does can change it while
/// it is mapped (package managers replace files by renaming, which leaves the mapped inode as it was).
fn trusted(file: &File) -> bool {
    use std::os::unix::fs::PermissionsExt;
    file.metadata().is_ok_and(|m| m.is_file() && m.uid() == 0 && m.permissions().mode() & 0o022 == 0)
}

/// A read-only mapping of `file` when it is [`trusted`].
fn trusted_map(file: &File) -> Option<memmap2::Mmap> {
    // SAFETY: read-only and private to this build; the file is root's and writable by root
    // alone, so no user can truncate it under the mapping.
    trusted(file).then(|| unsafe { memmap2::Mmap::map(file) }.ok()).flatten()
}

fn run(
    mut registry: Registry<Maps>,
    mut pythons: Pythons,
    mut builder: Builder,
    rx: Receiver<Request>,
    stats: Arc<Mutex<Stats>>,
) {
    let pythons_layouts = pythons.layouts.clone();
    // When each process was last described.
    let mut read_at: HashMap<u32, Instant> = HashMap::new();
    let mut next_sweep = Instant::now() + SWEEP_EVERY;
    // Processes to describe again at a time: (when, pid), soonest on top (a heap: a thousand
    // execs at once add two each).
    let mut again: BinaryHeap<Reverse<(Instant, u32)>> = BinaryHeap::new();
    let mut pending: VecDeque<Request> = VecDeque::new();
    let vdso = Vdso::of_this_process();
    // Processes whose next description opens all their files (`FIRST_CHECKS`).
    let mut unbounded: Vec<u32> = Vec::new();
    let mut describe_now = |registry: &mut Registry<Maps>,
                            builder: &mut Builder,
                            read_at: &mut HashMap<u32, Instant>,
                            again: &mut BinaryHeap<Reverse<(Instant, u32)>>,
                            pid: u32| {
        let checks = match unbounded.iter().position(|p| *p == pid) {
            Some(i) => {
                unbounded.swap_remove(i);
                usize::MAX
            }
            None => FIRST_CHECKS,
        };
        let unchecked = describe(registry, &mut pythons, builder, pid, vdso.as_ref(), checks);
        read_at.insert(pid, Instant::now());
        if unchecked > 0 && again.len() < QUEUE && unbounded.len() < QUEUE {
            unbounded.push(pid);
            again.push(Reverse((Instant::now() + CHECK_THE_REST_AFTER, pid)));
        }
    };
    // Tables received since memory was last handed back, and when that was.
    let mut built_since_trim = false;
    let mut trimmed_at = Instant::now();
    loop {
        while let Ok((key, result)) = builder.built.try_recv() {
            builder.pending = builder.pending.saturating_sub(1);
            registry.built(key, result);
            built_since_trim = true;
        }
        if built_since_trim && builder.pending == 0 && trimmed_at.elapsed() >= TRIM_EVERY {
            // A table is compiled in a builder's malloc arena and freed here once in the
            // kernel; glibc keeps the freed pages (~7 MiB resident after the start-up burst).
            // Not after every table: a build machine maps new files all the time, and a trim
            // walks every arena (20 a second cost 1 ms/s of CPU).
            built_since_trim = false;
            trimmed_at = Instant::now();
            crate::budget::give_back_memory();
        }
        let now = Instant::now();
        // Requests wait here; execs go first, and are looked for again after every
        // description, because one (a large binary's first table) can take a while.
        for r in rx.try_iter().take(QUEUE) {
            queue(&mut registry, &mut pending, r);
        }
        // Then the descriptions due again, one at a time: a thousand processes started at
        // once are each read again 20 and 500 ms after their exec, and a new program's exec
        // must not wait behind all of them (its samples are walked without a table meanwhile).
        let exec_waits = matches!(pending.front(), Some(Request::Exec(_)));
        if !exec_waits && again.peek().is_some_and(|Reverse((at, _))| *at <= now) {
            let Reverse((_, pid)) = again.pop().expect("checked");
            describe_now(&mut registry, &mut builder, &mut read_at, &mut again, pid);
            continue;
        }
        let Some(request) = pending.pop_front() else {
            let mut wake = again.peek().map_or(next_sweep, |Reverse((at, _))| (*at).min(next_sweep));
            if builder.pending > 0 {
                // Tables on their way: look for them often.
                wake = wake.min(now + Duration::from_millis(5));
            }
            match rx.recv_timeout(wake.saturating_duration_since(now)) {
                Ok(r) => queue(&mut registry, &mut pending, r),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            sweep(&mut registry, &pythons_layouts, &mut read_at, &mut next_sweep, &stats);
            continue;
        };
        match request {
            Request::Seen(pid) => {
                // Marked sampled when it arrived (`queue`). Not known any more (its place or its
                // tables went to a running process): now.
                let due = read_at.get(&pid).is_none_or(|at| at.elapsed() >= REREAD_AFTER);
                if due
                    || (!registry.is_known(pid)
                        && read_at.get(&pid).is_none_or(|at| at.elapsed() >= Duration::from_secs(1)))
                {
                    describe_now(&mut registry, &mut builder, &mut read_at, &mut again, pid);
                }
            }
            Request::Exec(pid) => {
                describe_now(&mut registry, &mut builder, &mut read_at, &mut again, pid);
                if again.len() < QUEUE {
                    again.extend(AFTER_EXEC.iter().map(|d| Reverse((Instant::now() + *d, pid))));
                }
            }
        }
        sweep(&mut registry, &pythons_layouts, &mut read_at, &mut next_sweep, &stats);
    }
}

/// A request waits its turn; a sample's process is marked sampled now, not when its turn
/// comes (behind a thousand execs, its place in the kernel could go meanwhile).
fn queue(registry: &mut Registry<Maps>, pending: &mut VecDeque<Request>, r: Request) {
    if let Request::Seen(pid) = r {
        registry.touch(pid);
    }
    match r {
        Request::Exec(_) => pending.push_front(r),
        Request::Seen(_) if pending.len() < QUEUE => pending.push_back(r),
        Request::Seen(_) => {}
    }
}

/// Forgets exited processes and publishes the figures, every `SWEEP_EVERY`.
fn sweep(
    registry: &mut Registry<Maps>,
    python_layouts: &Mutex<HashMap<u32, Option<Arc<PyLayout>>>>,
    read_at: &mut HashMap<u32, Instant>,
    next_sweep: &mut Instant,
    stats: &Mutex<Stats>,
) {
    if Instant::now() < *next_sweep {
        return;
    }
    *next_sweep = Instant::now() + SWEEP_EVERY;
    let alive = |pid: u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    for pid in registry.pids() {
        if !alive(pid) {
            registry.exited(pid);
            read_at.remove(&pid);
        }
    }
    registry.keep_sampled(alive);
    read_at.retain(|pid, _| registry.is_known(*pid));
    if let Ok(mut v) = python_layouts.lock() {
        v.retain(|pid, _| registry.is_known(*pid));
    }
    if let Ok(mut s) = stats.lock() {
        *s = registry.stats();
    }
}

/// Reads `pid`'s executable mappings and describes them to the kernel, opening at most
/// `checks` files for the first time; returns how many more there were.
fn describe(
    registry: &mut Registry<Maps>,
    pythons: &mut Pythons,
    builder: &mut Builder,
    pid: u32,
    vdso: Option<&Vdso>,
    checks: usize,
) -> usize {
    let started = Instant::now();
    let read = maps::read_within(pid, None, MAPS_MAPPINGS, MAPS_BUDGET);
    // Through the magic link, so a deleted or replaced executable is the one running.
    let exe = std::fs::metadata(format!("/proc/{pid}/exe")).ok().map(|m| (m.dev(), m.ino()));
    let mut mapped = Vec::new();
    for m in &read.maps {
        if &*m.path == "[vdso]" {
            if let Some(v) = vdso {
                mapped.push(MappedFile { start: m.start, end: m.end, offset: 0, key: v.key, preferred: true });
            }
            continue;
        }
        if !m.is_file() {
            continue;
        }
        // stat through the magic link: it never opens (a FIFO at the path cannot block it).
        let link = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
        let Ok(meta) = std::fs::metadata(&link) else { continue };
        if !meta.is_file() || meta.dev() != m.dev || meta.ino() != m.inode {
            continue;
        }
        let key = FileKey {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
            owner: meta.uid(),
        };
        let preferred = exe == Some((meta.dev(), meta.ino()));
        mapped.push(MappedFile { start: m.start, end: m.end, offset: m.offset, key, preferred });
    }
    if read.truncated {
        // The read stopped (byte or time bound) before the highest addresses: the loader's
        // mappings. What the last description had there stays.
        let cut = read.maps.last().map_or(0, |m| m.end);
        mapped.extend(registry.described_from(pid, cut));
    }
    if mapped.is_empty() {
        // A kernel thread, or a process already gone.
        registry.remove_process(pid);
        return 0;
    }
    let by_start: HashMap<u64, &maps::Mapping> = read.maps.iter().map(|m| (m.start, m)).collect();
    let result = registry.set_process_within(pid, &mapped, checks, |m, queue| {
        if let Some(v) = vdso.filter(|v| v.key == m.key) {
            return Build::Done(table::compile(v.image.as_slice()));
        }
        let Some(mapping) = by_start.get(&m.start) else {
            // Kept from the last description past a cut read, its file not read then either.
            return Build::Done(Err(table::TableError::Unreadable("past where the maps were read".into())));
        };
        let f: File = match file::open_mapped(pid, mapping) {
            Ok(checked) => checked.file,
            // Not ELF, malformed: remembered, not opened again while the file is unchanged (a
            // process mapping 10,000 data files executable costs 10,000 opens once).
            Err(e) if e.is_about_the_file() => return Build::Done(Err(table::TableError::Refused(e.to_string()))),
            Err(e) => return Build::Done(Err(table::TableError::Unreadable(e.to_string()))),
        };
        // A file whose sections could never fit in the memory budget is refused here, from its
        // headers, rather than wait its turn behind every smaller file for the same answer.
        let source = if trusted(&f) { table::Source::Mapped } else { table::Source::Read };
        if let Err(e) = table::precheck(&object::ReadCache::new(&f), &crate::memory::UNWIND, source) {
            return Build::Done(Err(e));
        }
        if !queue {
            return Build::Checked;
        }
        let jobs = if m.key.size > LARGE_FILE { &builder.large_jobs } else { &builder.jobs };
        match jobs.try_send((m.key, f)) {
            Ok(()) => {
                builder.pending += 1;
                Build::Queued
            }
            Err(_) => Build::Done(Err(table::TableError::Unreadable("the table builder is busy".into()))),
        }
    });
    // CPython: the first mapped file named like one whose `_PyRuntime` is found.
    let keys: HashMap<u64, FileKey> = mapped.iter().map(|f| (f.start, f.key)).collect();
    let mut interpreter = None;
    for m in &read.maps {
        let (Some(version), Some(key)) = (CPython::version_of(&m.path), keys.get(&m.start)) else { continue };
        if !pythons.files.contains_key(key) {
            // Not remembered when the file cannot be opened now (the process exited): only
            // what the file itself says is.
            let Ok(checked) = file::open_mapped(pid, m) else { continue };
            pythons.files.insert(*key, python_runtime(&object::ReadCache::new(&checked.file)));
        }
        let found = pythons.files.get(key).expect("inserted above");
        if let Some((vaddr, loads, eval_body)) = found
            // With a table base of 0, the bias is the load bias itself.
            && let Some(bias) = table::bias(0, loads, m.start, m.offset)
        {
            let state = bias.wrapping_add(*vaddr);
            interpreter = Some(
                CPython::layout(pid, version, state)
                    .map(|layout| PyLayout { eval_body: *eval_body, ..layout })
                    .map(|layout| CPython::describe(&layout, state).map(|p| (Arc::new(layout), p)))
                    .map_err(|why| (version, &m.path, *key, why)),
            );
            break;
        }
    }
    let (walked, refused) = match interpreter {
        Some(Ok(Some(found))) => (Some(found), None),
        // A process that exited since its maps were read cannot be read either: nothing to
        // say of its interpreter (said, it would hide the reason the next process gives).
        Some(Err((.., crate::interpreter::python::Refused::Unreadable)))
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() =>
        {
            (None, None)
        }
        Some(Err(refused)) => (None, Some(refused)),
        Some(Ok(None)) | None => (None, None),
    };
    registry.set_python(pid, walked.as_ref().map(|(_, p)| p));
    if let Ok(mut layouts) = pythons.layouts.lock() {
        match (&walked, refused) {
            (Some((layout, _)), _) => {
                layouts.insert(pid, Some(layout.clone()));
            }
            (None, Some((version, path, key, why))) => {
                // Counted once per process, said once per interpreter file.
                if layouts.insert(pid, None) != Some(None) {
                    crate::interpreter::python::note_unread(&why);
                }
                if pythons.refused.insert(key) {
                    tracing::warn!(pid, interpreter = %path, %version, "Python frames not read: {why}; native frames only");
                }
            }
            (None, None) => {
                layouts.remove(&pid);
            }
        }
    }
    let python = walked.as_ref().map(|(l, _)| l.minor);
    match result {
        Ok(unchecked) => {
            tracing::debug!(
                pid,
                mappings = mapped.len(),
                unchecked,
                maps_truncated = read.truncated,
                took_us = started.elapsed().as_micros() as u64,
                age_ms = age_ms(pid),
                python,
                "process described to the unwinder"
            );
            unchecked
        }
        Err(e) => {
            tracing::debug!(pid, error = %e, "cannot describe a process to the unwinder: frame pointers for it");
            0
        }
    }
}

/// What a CPython file says of itself: `_PyRuntime`'s address, its loadable segments, its
/// split-off evaluation loop.
type PyFile = (u64, Vec<table::Load>, Option<(u64, u64)>);

/// Each Python process's CPython layout (`None`: its frames are not read, and it was counted
/// so), shared with the symbolizer (it reads code objects with it).
type PyLayouts = Arc<Mutex<HashMap<u32, Option<Arc<PyLayout>>>>>;

/// CPython files seen (their `_PyRuntime`, segments and split-off evaluation loop, or `None`), the interpreters whose
/// frames are not read (said once each), and each Python process's layout.
#[derive(Default)]
pub struct Pythons {
    files: HashMap<FileKey, Option<PyFile>>,
    refused: std::collections::HashSet<FileKey>,
    pub layouts: PyLayouts,
}

/// `_PyRuntime`'s address in a CPython file (an ELF virtual address), the file's loadable
/// segments, which place it in a process, and its evaluation loop where a build split it off
/// its name (`interpreter::python::eval_body`).
fn python_runtime<'data, R: object::ReadRef<'data>>(data: R) -> Option<PyFile> {
    let file = object::File::parse(data).ok()?;
    Some((CPython::state_in(&file)?, table::loads(&file), crate::interpreter::python::eval_body(&file)))
}

/// How long ago `pid` started (its exec, for a process that exec'd), from `/proc/PID/stat`.
fn age_ms(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the comm, which may hold spaces and parentheses: starttime is field 22.
    let start_ticks: u64 = stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()?;
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec; starttime counts from boot, like CLOCK_BOOTTIME.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) };
    let now_ms = now.tv_sec as u64 * 1000 + now.tv_nsec as u64 / 1_000_000;
    Some(now_ms.saturating_sub(start_ticks * 1000 / hz))
}

/// This process's vDSO image: the kernel maps the same one into every process.
struct Vdso {
    key: FileKey,
    image: Vec<u8>,
}

impl Vdso {
    fn of_this_process() -> Option<Self> {
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        let line = maps.lines().find(|l| l.ends_with("[vdso]"))?;
        let (start, end) = line.split_once(' ')?.0.split_once('-')?;
        let (start, end) = (u64::from_str_radix(start, 16).ok()?, u64::from_str_radix(end, 16).ok()?);
        // SAFETY: the vDSO is mapped readable for the life of the process.
        let image = unsafe { std::slice::from_raw_parts(start as *const u8, (end - start) as usize) }.to_vec();
        Some(Self { key: FileKey { dev: 0, ino: 0, size: image.len() as u64, mtime_ns: -1, owner: 0 }, image })
    }
}
