//! User stacks for code without frame pointers: unwind tables compiled from each binary's call
//! frame information (`table`), placed in the kernel (`registry`, `kernel`) for the sampler to
//! walk. This stage runs on its own thread, off the sampling path: the pipeline tells it which
//! processes it sees (`Notifier`), and it describes them to the kernel. Until a process is
//! described, its stacks are walked with frame pointers as before.

pub mod kernel;
pub mod registry;
pub mod table;

use std::{
    collections::{HashMap, VecDeque},
    fs::File,
    os::unix::fs::MetadataExt,
    sync::{
        Arc, Mutex,
        mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use registry::{FileKey, MappedFile, Registry, Stats};

use crate::symbolize::{file, maps};

/// A process's mappings are read again when it is seen this long after the last read
/// (libraries loaded later with `dlopen` get their tables then).
const REREAD_AFTER: Duration = Duration::from_secs(10);
/// How often exited processes are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// After an exec the loader maps the libraries within milliseconds: the process is described
/// again this long after its exec (and once more, later), so a short-lived one gets every table.
const AFTER_EXEC: [Duration; 2] = [Duration::from_millis(20), Duration::from_millis(500)];
/// Requests waiting for the stage; past this the pipeline drops them (a later sample asks again).
const QUEUE: usize = 4096;

#[derive(Debug, Clone, Copy)]
enum Request {
    /// A sample of this process was handled.
    Seen(u32),
    /// The process exec'd: its mappings are new.
    Exec(u32),
}

/// The pipeline's side: cheap, never blocks.
pub struct Notifier {
    tx: SyncSender<Request>,
    announced: HashMap<u32, Instant>,
    stats: Arc<Mutex<Stats>>,
}

impl Notifier {
    /// A sample of `pid` with a user stack was seen.
    pub fn seen(&mut self, pid: u32) {
        let now = Instant::now();
        match self.announced.get(&pid) {
            Some(at) if now.duration_since(*at) < REREAD_AFTER => return,
            _ => {}
        }
        if self.announced.len() >= 65_536 {
            self.announced.clear();
        }
        if self.send(Request::Seen(pid)) {
            self.announced.insert(pid, now);
        }
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

pub struct Stage {
    pub stats: Arc<Mutex<Stats>>,
    pub thread: JoinHandle<()>,
}

/// Starts the stage with the kernel's maps; it stops when every `Notifier` is gone.
pub fn spawn(maps: kernel::Maps) -> std::io::Result<(Notifier, Stage)> {
    let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
    let stats = Arc::new(Mutex::new(Stats::default()));
    let shared = stats.clone();
    let thread =
        std::thread::Builder::new().name("unwind".into()).spawn(move || run(Registry::new(maps), rx, shared))?;
    Ok((Notifier { tx, announced: HashMap::new(), stats: stats.clone() }, Stage { stats, thread }))
}

fn run(mut registry: Registry<kernel::Maps>, rx: Receiver<Request>, stats: Arc<Mutex<Stats>>) {
    // Tables are built at nice 10: the sampling stages come first when CPUs are scarce.
    crate::serve::limits::lower_this_thread();
    let mut read_at: HashMap<u32, Instant> = HashMap::new();
    let mut next_sweep = Instant::now() + SWEEP_EVERY;
    // Processes to describe again at a time: (when, pid), soonest last.
    let mut again: Vec<(Instant, u32)> = Vec::new();
    let mut pending: VecDeque<Request> = VecDeque::new();
    let vdso = Vdso::of_this_process();
    loop {
        let now = Instant::now();
        while again.last().is_some_and(|(at, _)| *at <= now) {
            let (_, pid) = again.pop().expect("checked");
            describe(&mut registry, pid, vdso.as_ref());
            read_at.insert(pid, Instant::now());
        }
        // Requests wait here; execs go first, and are looked for again after every
        // description, because one (a large binary's first table) can take a while.
        for r in rx.try_iter().take(QUEUE) {
            queue(&mut pending, r);
        }
        let Some(request) = pending.pop_front() else {
            let wake = again.last().map_or(next_sweep, |(at, _)| (*at).min(next_sweep));
            match rx.recv_timeout(wake.saturating_duration_since(now)) {
                Ok(r) => queue(&mut pending, r),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            sweep(&mut registry, &mut read_at, &mut next_sweep, &stats);
            continue;
        };
        match request {
            Request::Seen(pid) => {
                if read_at.get(&pid).is_none_or(|at| at.elapsed() >= REREAD_AFTER) {
                    describe(&mut registry, pid, vdso.as_ref());
                    read_at.insert(pid, Instant::now());
                }
            }
            Request::Exec(pid) => {
                describe(&mut registry, pid, vdso.as_ref());
                read_at.insert(pid, Instant::now());
                if again.len() < QUEUE {
                    again.extend(AFTER_EXEC.iter().map(|d| (Instant::now() + *d, pid)));
                    again.sort_by_key(|a| std::cmp::Reverse(a.0));
                }
            }
        }
        sweep(&mut registry, &mut read_at, &mut next_sweep, &stats);
    }
}

fn queue(pending: &mut VecDeque<Request>, r: Request) {
    match r {
        Request::Exec(_) => pending.push_front(r),
        Request::Seen(_) if pending.len() < QUEUE => pending.push_back(r),
        Request::Seen(_) => {}
    }
}

/// Forgets exited processes and publishes the figures, every `SWEEP_EVERY`.
fn sweep(
    registry: &mut Registry<kernel::Maps>,
    read_at: &mut HashMap<u32, Instant>,
    next_sweep: &mut Instant,
    stats: &Mutex<Stats>,
) {
    if Instant::now() < *next_sweep {
        return;
    }
    *next_sweep = Instant::now() + SWEEP_EVERY;
    for pid in registry.pids() {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            registry.remove_process(pid);
            read_at.remove(&pid);
        }
    }
    read_at.retain(|pid, _| registry.is_known(*pid));
    if let Ok(mut s) = stats.lock() {
        *s = registry.stats();
    }
}

/// Reads `pid`'s executable mappings and describes them to the kernel.
fn describe(registry: &mut Registry<kernel::Maps>, pid: u32, vdso: Option<&Vdso>) {
    let read = maps::read(pid, None);
    let mut mapped = Vec::new();
    for m in &read.maps {
        if &*m.path == "[vdso]" {
            if let Some(v) = vdso {
                mapped.push(MappedFile { start: m.start, end: m.end, offset: 0, key: v.key });
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
        };
        mapped.push(MappedFile { start: m.start, end: m.end, offset: m.offset, key });
    }
    if mapped.is_empty() {
        // A kernel thread, or a process already gone.
        registry.remove_process(pid);
        return;
    }
    let by_start: HashMap<u64, &maps::Mapping> = read.maps.iter().map(|m| (m.start, m)).collect();
    let result = registry.set_process(pid, &mapped, |m| {
        if vdso.is_some_and(|v| v.key == m.key) {
            return table::compile(vdso.expect("checked").image.as_slice());
        }
        let mapping = by_start.get(&m.start).expect("listed above");
        let f: File = file::open_mapped(pid, mapping).map_err(|e| table::TableError::Unreadable(e.to_string()))?.file;
        table::compile(&object::ReadCache::new(&f))
    });
    match result {
        Ok(()) => {
            tracing::debug!(pid, mappings = mapped.len(), age_ms = age_ms(pid), "process described to the unwinder")
        }
        Err(e) => tracing::debug!(pid, error = %e, "cannot describe a process to the unwinder: frame pointers for it"),
    }
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
        Some(Self { key: FileKey { dev: 0, ino: 0, size: image.len() as u64, mtime_ns: -1 }, image })
    }
}
