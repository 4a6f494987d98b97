//! Turns raw addresses into names: kernel addresses through kallsyms, user addresses through the
//! ELF file that backs them (found via `/proc/PID/maps`) and its debug file (`module`), both
//! with blazesym, and JIT-compiled code through the process's perf map (`perfmap`). A user
//! address in a file that nothing names shows as `module+0xVADDR`; one in no mapping, or in
//! anonymous memory no perf map names, as `[unknown]`.
//!
//! Caches, so that the steady state does no repeated work:
//! - kernel: address → name;
//! - per process: its executable mappings, re-read only when an address falls outside them or
//!   the process `exec`ed (its comm changed); its perf map, read on from where it stopped when
//!   an address in anonymous executable memory is not named by what was read;
//! - per module (device, inode): file offset → name, shared by every process mapping the file;
//! - raw stack → symbolized stack, so a hot stack is resolved once.
//!
//! Every cache is bounded, because a node with heavy process churn (hundreds of short-lived
//! processes a second, each in its own binary) would otherwise grow them forever:
//! - a process the kernel says exited is forgotten once the samples read have passed its exit,
//!   and a sample taken after the exit starts a new process under the pid (`lifecycle`);
//! - a process that stopped being sampled keeps its mappings for a grace period (its late
//!   samples still resolve), then is forgotten if it is gone; at most `MAX_PROCESSES` are kept, the least recently sampled
//!   going first;
//! - a module no cached process maps any more is dropped, and blazesym is told to close its file;
//! - the name tables start over past their bounds; interned names nothing uses are released.
//!
//! Names, paths and files belong to whoever runs the process, so nothing here trusts them: a
//! mapped file is opened through `/proc/PID/map_files` and checked before blazesym parses it
//! (`file`), maps are read with bounds (`maps`), debug files and perf maps are opened without
//! following links or blocking and kept only when proven theirs (`debuginfo`, `perfmap`), and
//! a frame nothing could name is never cached as final (the loader may not have mapped its
//! library yet when the process was first seen, the JIT may not have written its map line).

pub mod debuginfo;
pub mod file;
mod kallsyms;
mod lifecycle;
pub mod maps;
mod memory;
mod module;
pub mod perfmap;
mod process;
#[cfg(test)]
mod tests;

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use blazesym::{
    MaybeDefault,
    symbolize::{
        Input, Symbolized, Symbolizer as Blaze,
        evict::{self, Evict},
        source::{Kernel, Source},
    },
};

use crate::{
    interpreter::{
        Runtime,
        python::{CPython, Layout, PyNames},
    },
    model::{Location, Stack},
};
use maps::Mapping;
use module::{Module, Opened};
pub use module::{module_offset, parse_module_offset};
use process::Process;

/// Shown for an address nothing could name.
pub const UNKNOWN: &str = "[unknown]";
/// Processes not sampled for this long are forgotten.
const PROCESS_TTL: Duration = Duration::from_secs(300);
/// A process that has exited is forgotten once it has not been sampled for this long (samples
/// still in the ring buffer when it exited resolve meanwhile: the daemon drains it at least
/// every second). Short, because under churn the binaries of exited processes stay open and
/// parsed for as long as their processes are remembered.
const EXITED_GRACE: Duration = Duration::from_secs(3);
/// Most processes whose mappings are cached; past it the least recently sampled are forgotten.
const MAX_PROCESSES: usize = 4096;
/// Bounds on the address → name tables (kernel; per module), which start over when full.
const KERNEL_NAMES_MAX: usize = 262_144;
const MODULE_NAMES_MAX: usize = 65_536;
/// How often the caches are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(2);
/// A process not sampled for `EXITED_GRACE` is looked at (alive? same program?) by the first
/// sweep after, then at most this often: each look costs two `/proc` lookups, and a quiet node
/// has dozens of such processes (an exited one still goes at its first look).
const IDLE_RECHECK: Duration = Duration::from_secs(10);
/// The sweep's walks over every cache (stacks, modules, names) run when it forgot a process or
/// a process image was replaced, and otherwise at most this often (for what a mapping change
/// or the stack cache's own evictions left unused).
const COLLECT_EVERY: Duration = Duration::from_secs(30);
/// An address outside every known mapping re-reads the maps at most this often per process.
const MAPS_REFRESH: Duration = Duration::from_secs(1);
/// ...and at most this often when its maps are over a bound (see `maps`): reading them is what
/// costs, and what is past the bound stays unknown anyway.
const MAPS_REFRESH_OVER_BOUND: Duration = Duration::from_secs(30);
/// Maps read as a process exec'd (or first met) are re-read at once on an address outside
/// them, until one such read finds its address, at most this many times...
const EXEC_REREADS: u8 = 8;
/// ...within this long of the first read: the loader maps a program's libraries in its first
/// milliseconds.
const EXEC_SETTLE: Duration = Duration::from_secs(1);
/// A stack with a frame nothing could name is answered from the cache this long, then resolved
/// again (the maps may have been read before the loader mapped the library it points into).
const UNRESOLVED_TTL: Duration = MAPS_REFRESH;
/// A process's perf map that does not name an address in its anonymous executable memory is
/// read on at most this often, and a stack with such a frame is resolved again this soon: a JIT
/// writes the line as it compiles the function, which then runs hot at once (at 1 s, a 6 s
/// Node hot loop had 121 of its ~400 samples `[unknown]`). Reading on costs the new lines only.
/// A process without a perf map is looked at every `MAPS_REFRESH`.
const PERF_MAP_REFRESH: Duration = Duration::from_millis(100);
/// Most mapped files (and debug files) held open at once; past it a new file is refused,
/// counted, and its frames named by module. Each is one descriptor of ours and one of
/// blazesym's: 384 leave a quarter of the default limit of 1,024 to the store and the API (a
/// busy node maps a few dozen files).
const MAX_OPEN_FILES: usize = 384;

/// A stack as the sampler sent it: its process image (0 for kernel-only) and the 128-bit XXH3
/// of its addresses and frame counts. The hash, not the addresses: a Python stack's 60 words
/// were a quarter of what a cached stack costs, and the cache holds a third more stacks
/// without them. Two stacks of one image sharing a hash is a 2^-128 chance per pair (about
/// 10^-27 for a million stacks): the collision a profiler of this kind accepts (the OTel
/// eBPF profiler keys its traces the same way).
type StackKey = (u64, u128);

/// A symbolized stack; `until` is set when it has an unnamed frame (see `UNRESOLVED_TTL`).
struct Cached {
    stack: Arc<Stack>,
    until: Option<Instant>,
}

/// Counters for the daemon's log.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub stack_hits: u64,
    pub stack_misses: u64,
    pub maps_reads: u64,
    /// Processes and modules forgotten so far.
    pub processes_evicted: u64,
    /// Processes forgotten because the kernel said they ended (see `lifecycle`; not counted
    /// in `processes_evicted`).
    pub processes_exited: u64,
    pub modules_evicted: u64,
    /// Mapped files not symbolized: not a regular file, over a size or symbol bound, malformed,
    /// or over the open-file bound. Their frames show `module+0xOFFSET` (the file offset: the
    /// segments of a refused file are not read).
    pub files_refused: u64,
    /// Perf map reads, and frames they named.
    pub perf_map_reads: u64,
    pub jit_frames: u64,
    /// Times every cache was dropped because the daemon's memory passed its budget.
    pub sheds: u64,
    /// Entries cached now.
    pub processes: usize,
    pub modules: usize,
    pub stacks: usize,
    pub names: usize,
}

pub struct Symbolizer {
    blaze: Blaze,
    kernel_source: Source<'static>,
    kernel: rustc_hash::FxHashMap<u64, Arc<str>>,
    /// `/proc/kallsyms`, read at the first kernel address (empty if unreadable: blazesym then).
    kallsyms: Option<kallsyms::Kallsyms>,
    processes: rustc_hash::FxHashMap<u32, Process>,
    modules: rustc_hash::FxHashMap<(u64, u64), Module>,
    /// Raw stacks (process image or 0 for kernel-only, hash of the addresses) → named.
    stacks: memory::StackCache,
    /// What the cached stacks hold, against `memory::STACKS`.
    stack_bytes: u64,
    /// Process images loaded so far (the last one's serial).
    images: u64,
    /// The live images when the stack cache was last walked, and `images` then.
    stacks_walked: (Vec<u64>, u64),
    names: HashMap<Box<str>, Arc<str>>,
    unknown: Arc<str>,
    stats: Stats,
    swept_at: Instant,
    /// When the sweep last walked every cache (see `COLLECT_EVERY`), and whether a process image
    /// was replaced since (its stacks are unreachable).
    collected_at: Instant,
    image_replaced: bool,
    /// The stack being resolved has a frame in JIT code that its perf map does not name yet.
    jit_missed: bool,
    /// A process found to have mapped code since its maps were read (see [`Self::take_mapped`]).
    mapped_since: Option<u32>,
    /// Memory the cached processes' perf maps hold (recounted at each sweep, which forgets
    /// processes, and grown by each read).
    perf_map_bytes: usize,
    /// Names of Python code objects.
    python: PyNames,
    /// Forks and exits: which process a pid is (see `lifecycle`).
    lifecycle: lifecycle::Lifecycle,
    /// Whether a file refused for want of symbol memory was logged (once a daemon).
    symbols_refusal_logged: bool,
    /// The last request of the memory watcher to shed that was served.
    sheds_seen: u64,
    /// Where a sample's stack key is built (see `stack_hash`).
    key_buf: Vec<u8>,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    pub fn new() -> Self {
        let kernel = Kernel { vmlinux: MaybeDefault::None, debug_syms: false, ..Kernel::default() };
        Self {
            // Names only: file/line and inlined frames would cost time and memory per address.
            // No auto reload: it would `stat` the path on every lookup, and our paths
            // (`/proc/self/fd/N`) lead to the checked file for as long as the module lives.
            blaze: Blaze::builder().enable_code_info(false).enable_inlined_fns(false).enable_auto_reload(false).build(),
            kernel_source: Source::Kernel(kernel),
            kernel: Default::default(),
            kallsyms: None,
            processes: Default::default(),
            modules: Default::default(),
            stacks: memory::stack_cache(),
            stack_bytes: 0,
            images: 0,
            stacks_walked: (Vec::new(), 0),
            names: HashMap::new(),
            unknown: Arc::from(UNKNOWN),
            stats: Stats::default(),
            swept_at: Instant::now(),
            collected_at: Instant::now(),
            image_replaced: false,
            jit_missed: false,
            mapped_since: None,
            perf_map_bytes: 0,
            python: PyNames::default(),
            lifecycle: lifecycle::Lifecycle::default(),
            symbols_refusal_logged: false,
            sheds_seen: crate::memory::watch::sheds(),
            key_buf: Vec::new(),
        }
    }

    pub fn stats(&self) -> Stats {
        Stats {
            processes: self.processes.len(),
            modules: self.modules.len(),
            stacks: self.stacks.len(),
            names: self.names.len() + self.kernel.len() + self.modules.values().map(|m| m.names.len()).sum::<usize>(),
            ..self.stats
        }
    }

    /// The symbolized stack of a sample. `kernel` and `user` are leaf first, as the kernel's
    /// unwinder returns them; the result is root first.
    pub fn stack(&mut self, pid: u32, comm: &str, kernel: &[u64], user: &[u64]) -> Arc<Stack> {
        self.stack_with_python(pid, comm, kernel, user, None, Instant::now())
    }

    /// [`Self::stack`] with the sampler's Python frame words (`profiler_common::python`) and
    /// the process's CPython layout.
    pub fn stack_with_python(
        &mut self,
        pid: u32,
        comm: &str,
        kernel: &[u64],
        user: &[u64],
        python: Option<(&Layout, &[u64])>,
        now: Instant,
    ) -> Arc<Stack> {
        if crate::memory::watch::shed_requested(&mut self.sheds_seen) {
            self.shed();
        }
        if now.duration_since(self.swept_at) >= SWEEP_EVERY {
            self.sweep(now);
        }
        // Pid 0 (softirq work on the idle task) has kernel frames only and no /proc entry.
        if pid != 0 {
            self.note_process(pid, comm, now);
        }
        let python_words = python.map_or(&[][..], |p| p.1);
        // User addresses only mean something within their process image; kernel-only stacks
        // are shared by all. The instruction a Python frame is at gives its line: part of the key.
        let image = if user.is_empty() { 0 } else { self.processes.get(&pid).map_or(u64::MAX, |p| p.image) };
        let key = (image, self.stack_hash(kernel, user, python_words));
        if let Some(cached) = self.stacks.get(&key).filter(|c| c.until.is_none_or(|t| now < t)) {
            self.stats.stack_hits += 1;
            return cached.stack.clone();
        }
        self.stats.stack_misses += 1;
        self.jit_missed = false;
        let mut named: Vec<(Arc<str>, Location)> = Vec::with_capacity(user.len());
        for (i, &addr) in user.iter().enumerate().rev() {
            named.push(self.user_frame(pid, lookup_addr(addr, i), now));
        }
        let unresolved = named.iter().any(|f| Arc::ptr_eq(&f.0, &self.unknown));
        if let Some((layout, words)) = python.filter(|p| !p.1.is_empty()) {
            named = CPython::name_frames(&mut self.python, pid, layout, named, words);
        }
        let user_len = named.len();
        let mut frames = Vec::with_capacity(kernel.len() + user_len);
        let mut locations = Vec::with_capacity(user_len);
        for (name, location) in named {
            frames.push(name);
            locations.push(location);
        }
        for (i, &addr) in kernel.iter().enumerate().rev() {
            frames.push(self.kernel_frame(lookup_addr(addr, i)));
        }
        let stack = Arc::new(Stack { frames, user_len, locations });
        let until = unresolved.then(|| now + if self.jit_missed { PERF_MAP_REFRESH } else { UNRESOLVED_TTL });
        self.cache_stack(key, Cached { stack: stack.clone(), until });
        stack
    }

    /// The hash of a stack's addresses (see [`StackKey`]), made in a buffer kept between
    /// samples: no allocation per sample.
    fn stack_hash(&mut self, kernel: &[u64], user: &[u64], python: &[u64]) -> u128 {
        let buf = &mut self.key_buf;
        buf.clear();
        let counts = [kernel.len() as u64, user.len() as u64, python.len() as u64];
        for words in [&counts[..], kernel, user, python] {
            buf.extend_from_slice(bytemuck::cast_slice(words));
        }
        xxhash_rust::xxh3::xxh3_128(buf)
    }

    /// The process, if any, whose last stack had an address in code mapped since its maps were
    /// read before (a `dlopen`): its unwind tables are due too.
    pub fn take_mapped(&mut self) -> Option<u32> {
        self.mapped_since.take()
    }

    /// A process just exec'd: read its mappings and find its files now, while `/proc/PID` still
    /// leads to them (a process living milliseconds is gone before its samples are read).
    pub fn note_exec(&mut self, pid: u32, comm: &str) {
        self.exec_replaces_fork(pid);
        self.load_process(pid, comm, Instant::now());
        if let Some(p) = self.processes.get_mut(&pid) {
            p.read_at_exec = true;
        }
        let maps = self.processes.get(&pid).map(|p| p.maps.clone()).unwrap_or_default();
        let now = Instant::now();
        for m in maps.iter().filter(|m| m.is_file()) {
            if !self.modules.contains_key(&(m.dev, m.inode)) {
                let module = self.open_module(pid, m, now);
                self.modules.insert((m.dev, m.inode), module);
            }
        }
    }

    /// Forgets what is no longer needed (see the module comment).
    pub fn expire(&mut self) {
        self.collected_at = Instant::now() - COLLECT_EVERY;
        self.sweep(Instant::now());
    }

    fn sweep(&mut self, now: Instant) {
        self.swept_at = now;
        let before = self.processes.len();
        self.processes.retain(|&pid, p| {
            let idle = now.duration_since(p.seen_at);
            if idle < EXITED_GRACE {
                return true;
            }
            if idle >= PROCESS_TTL {
                return false;
            }
            if p.checked_at > p.seen_at && now.duration_since(p.checked_at) < IDLE_RECHECK {
                return true;
            }
            p.checked_at = now;
            // Alive means this pid still runs the same program: pids wrap around (every few
            // minutes under churn), and a reused one must not keep a gone process's mappings.
            std::fs::read_link(format!("/proc/{pid}/exe")).ok() == p.exe
                && std::path::Path::new(&format!("/proc/{pid}")).exists()
        });
        if self.processes.len() > MAX_PROCESSES {
            let mut seen: Vec<Instant> = self.processes.values().map(|p| p.seen_at).collect();
            let cut = seen.len() - MAX_PROCESSES * 3 / 4;
            let (_, &mut oldest_kept, _) = seen.select_nth_unstable(cut);
            self.processes.retain(|_, p| p.seen_at >= oldest_kept);
        }
        self.bound_names();
        self.sweep_forks();
        let forgot = self.processes.len() != before || std::mem::take(&mut self.image_replaced);
        if !forgot && now.duration_since(self.collected_at) < COLLECT_EVERY {
            return;
        }
        self.collected_at = now;
        let known: std::collections::HashSet<u32> = self.processes.keys().copied().collect();
        let stale = self.take_python_stale();
        self.python.retain(|pid| known.contains(&pid) && !stale.contains(&pid));
        self.stats.processes_evicted += (before - self.processes.len()) as u64;
        self.perf_map_bytes = self.processes.values().map(|p| p.perf_map.bytes()).sum();
        crate::memory::PERF_MAPS.set_used(self.perf_map_bytes as u64);
        // One pass over the stack cache per sweep, not one per exec: a walk of the LRU's list,
        // and only when an image it may hold stacks of is gone (every image of the last walk
        // still live, and every one made since): walked at every report, a training node's
        // 60,000 stacks cost 3 % of the daemon's CPU per Python sample. (Stacks of a process not
        // known yet, image `u64::MAX`, wait for the next walk; the cache's bound holds them.)
        let live: rustc_hash::FxHashSet<u64> = self.processes.values().map(|p| p.image).collect();
        let (walked, images_then) = &self.stacks_walked;
        let made_since_live = live.iter().filter(|&&i| i > *images_then).count() as u64;
        if !(walked.iter().all(|i| live.contains(i)) && made_since_live == self.images - images_then) {
            self.stacks.retain(|k, _| k.0 == 0 || live.contains(&k.0));
            self.stacks_walked = (live.iter().copied().collect(), self.images);
        }
        self.stack_bytes = self.stacks.weight();
        crate::memory::STACKS.set_used(self.stack_bytes);
        let mapped: std::collections::HashSet<(u64, u64)> =
            self.processes.values().flat_map(|p| p.maps.iter().map(|m| (m.dev, m.inode))).collect();
        let gone: Vec<(u64, u64)> = self.modules.keys().filter(|k| !mapped.contains(k)).copied().collect();
        let mut evicted_modules = false;
        for key in gone {
            if let Some(module) = self.modules.remove(&key) {
                self.evict(module);
            }
            self.stats.modules_evicted += 1;
            evicted_modules = true;
        }
        if evicted_modules {
            // A module's parsed symbols are large and freed all at once; glibc keeps such holes
            // in its heap. Handing them back keeps RSS flat under process churn.
            #[cfg(target_env = "gnu")]
            // SAFETY: malloc_trim only releases free memory.
            unsafe {
                libc::malloc_trim(0);
            }
        }
        // Interned names held only by this table belong to nothing cached any more.
        self.names.retain(|_, n| Arc::strong_count(n) > 1);
    }

    /// The address → name tables start over past their bounds.
    fn bound_names(&mut self) {
        if self.kernel.len() > KERNEL_NAMES_MAX {
            self.kernel.clear();
        }
        for m in self.modules.values_mut() {
            if m.names.len() > MODULE_NAMES_MAX {
                m.names.clear();
            }
        }
    }

    /// Closes blazesym's files of a module and drops their parsed symbols; best effort by
    /// design. Before ours close: a descriptor's number, so its path, is then reused.
    fn evict(&mut self, module: Module) {
        for path in module.paths() {
            let _ = self.blaze.evict(&Evict::Elf(evict::Elf::new(path.clone())));
        }
        drop(module);
    }

    fn intern(&mut self, name: &str) -> Arc<str> {
        if let Some(n) = self.names.get(name) {
            return n.clone();
        }
        let n: Arc<str> = Arc::from(name);
        self.names.insert(name.into(), n.clone());
        n
    }

    /// Reads `/proc/kallsyms` now rather than at the first kernel address: the read takes tens
    /// of milliseconds (the kernel formats 200,000 lines), which would otherwise land on a sample
    /// at some random moment of the steady state, and delay that sample's flush.
    pub fn load_kernel_symbols(&mut self) {
        self.kallsyms.get_or_insert_with(|| kallsyms::Kallsyms::read().unwrap_or_default());
    }

    fn kernel_frame(&mut self, addr: u64) -> Arc<str> {
        if let Some(name) = self.kernel.get(&addr) {
            return name.clone();
        }
        let kallsyms = self.kallsyms.get_or_insert_with(|| kallsyms::Kallsyms::read().unwrap_or_default());
        let name = if !kallsyms.is_empty() {
            match kallsyms.name(addr).map(str::to_owned) {
                Some(n) => self.intern(&n),
                None => self.unknown.clone(),
            }
        } else {
            match self.blaze.symbolize_single(&self.kernel_source, Input::AbsAddr(addr)) {
                Ok(Symbolized::Sym(sym)) => {
                    let owned = sym.name.into_owned();
                    self.intern(&owned)
                }
                _ => self.unknown.clone(),
            }
        };
        self.kernel.insert(addr, name.clone());
        name
    }

    fn read_maps(&mut self, pid: u32, wanted: Option<u64>) -> maps::Read {
        self.stats.maps_reads += 1;
        let mut read = maps::read(pid, wanted);
        // One `Arc` per path across processes (forks and workers map the same files): the
        // store's dictionary finds a frame's file by its pointer, and the text is held once.
        let mut last: Option<(Arc<str>, Arc<str>)> = None;
        for m in read.maps.iter_mut().filter(|m| !m.path.is_empty()) {
            m.path = match &last {
                Some((read, shared)) if Arc::ptr_eq(read, &m.path) => shared.clone(),
                _ => {
                    let shared = self.intern(&m.path);
                    last = Some((m.path.clone(), shared.clone()));
                    shared
                }
            };
        }
        read
    }

    /// The name of the user frame at `addr` and where it lives.
    fn user_frame(&mut self, pid: u32, addr: u64, now: Instant) -> (Arc<str>, Location) {
        if let Some(named) = self.user_frame_named(pid, addr, now) {
            return named;
        }
        let Some(process) = self.processes.get(&pid) else {
            return (self.unknown.clone(), Location::default());
        };
        let mut mapping = maps::find(&process.maps, addr).cloned();
        let every = if process.over_bound { MAPS_REFRESH_OVER_BOUND } else { MAPS_REFRESH };
        let settling = process.read_at_exec
            && process.exec_rereads < EXEC_REREADS
            && now.duration_since(process.loaded_at) < EXEC_SETTLE;
        if mapping.is_none() && (settling || now.duration_since(process.read_at) >= every) {
            // Something mapped since we looked (dlopen, a JIT, the loader after exec).
            let fresh = self.read_maps(pid, Some(addr));
            mapping = maps::find(&fresh.maps, addr).cloned();
            // (What the loader maps as the program starts is not a `dlopen`.)
            if mapping.is_some() && !settling {
                self.mapped_since = Some(pid);
            }
            if let Some(p) = self.processes.get_mut(&pid) {
                if !fresh.maps.is_empty() {
                    p.maps = fresh.maps;
                }
                p.read_at = now;
                p.over_bound = fresh.truncated;
                // A made-up frame finds nothing: the next address outside re-reads again.
                p.read_at_exec &= mapping.is_none();
                p.exec_rereads = p.exec_rereads.saturating_add(1);
            }
        }
        let Some(mapping) = mapping else {
            // JIT code in pages the runtime made executable since the maps were read (they are
            // re-read at most every `MAPS_REFRESH`): its perf map may name it already. (A
            // process that writes none is looked for one at most every `MAPS_REFRESH` too.)
            return match self.jit_frame(pid, addr, now) {
                Some(name) => (name, self.jit_location(pid, addr)),
                None => (self.unknown.clone(), Location::default()),
            };
        };
        if !mapping.is_file() {
            if let Some(name) = self.jit_frame(pid, addr, now) {
                return (name, self.jit_location(pid, addr));
            }
            // `[vdso]`, `[heap]`: perf names the frame and the file alike.
            if mapping.path.starts_with('[') {
                let name = self.intern(&mapping.path);
                return (name.clone(), Location { file: name, addr: addr - mapping.start });
            }
            return (self.unknown.clone(), Location::default());
        }
        let key = (mapping.dev, mapping.inode);
        let retry = self.modules.get(&key).map(|m| m.failed_at.is_some_and(|t| now.duration_since(t) >= MAPS_REFRESH));
        if retry != Some(false) {
            let module = self.open_module(pid, &mapping, now);
            if let Some(old) = self.modules.insert(key, module) {
                self.evict(old);
            }
        }
        let offset = mapping.file_offset(addr);
        let module = self.modules.get(&key).expect("inserted above");
        if let Some((name, at)) = module.names.get(&offset) {
            return (name.clone(), Location { file: mapping.path.clone(), addr: *at });
        }
        let (name, at) = match module.lookup(&self.blaze, offset) {
            Some((n, at)) => (self.intern(&n), at),
            // Final, unlike `[unknown]`: the file is the one mapped, and it has no name there.
            None => {
                let (unnamed, at) = module.unnamed(offset);
                (self.intern(&unnamed), at)
            }
        };
        if let Some(m) = self.modules.get_mut(&key) {
            m.names.insert(offset, (name.clone(), at));
        }
        (name, Location { file: mapping.path.clone(), addr: at })
    }

    /// [`Self::user_frame`] when its file is open and the address named already: what it
    /// returns then, without cloning the mapping (its path's count taken and given back: two
    /// locked instructions per frame, each a barrier to the lookups around it).
    fn user_frame_named(&self, pid: u32, addr: u64, now: Instant) -> Option<(Arc<str>, Location)> {
        let mapping = maps::find(&self.processes.get(&pid)?.maps, addr).filter(|m| m.is_file())?;
        let module = self.modules.get(&(mapping.dev, mapping.inode))?;
        if module.failed_at.is_some_and(|t| now.duration_since(t) >= MAPS_REFRESH) {
            return None; // due a retry
        }
        let (name, at) = module.names.get(&mapping.file_offset(addr))?;
        Some((name.clone(), Location { file: mapping.path.clone(), addr: *at }))
    }

    /// A JIT frame lives in its runtime's perf map, as perf prints it.
    fn jit_location(&mut self, pid: u32, addr: u64) -> Location {
        Location { file: self.intern(&format!("/tmp/perf-{pid}.map")), addr }
    }

    /// Opens a module, within the bound on open files.
    fn open_module(&mut self, pid: u32, mapping: &Mapping, now: Instant) -> Module {
        if self.modules.values().map(Module::open_files).sum::<usize>() >= MAX_OPEN_FILES {
            self.stats.files_refused += 1;
            return Module::unopened(mapping);
        }
        let (module, opened) = Module::open(pid, mapping, now);
        if let Opened::Refused = opened {
            self.stats.files_refused += 1;
        }
        self.charge_symbols(module, mapping)
    }
}

/// Return addresses point after the call; one byte back lands inside the calling function
/// (matters when the call is the function's last instruction). The leaf is the exact IP.
fn lookup_addr(addr: u64, index_from_leaf: usize) -> u64 {
    if index_from_leaf == 0 { addr } else { addr.saturating_sub(1) }
}
