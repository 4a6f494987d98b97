//! Turns raw addresses into names: kernel addresses through kallsyms, user addresses through the
//! ELF file that backs them (found via `/proc/PID/maps`), both with blazesym.
//!
//! Caches, so that the steady state does no repeated work:
//! - kernel: address → name;
//! - per process: its executable mappings, re-read only when an address falls outside them or
//!   the process `exec`ed (its comm changed);
//! - per module (device, inode): file offset → name, shared by every process mapping the file;
//! - raw stack → symbolized stack, so a hot stack is resolved once.
//!
//! A process that exited keeps its mappings in the cache, so its late samples still resolve.

pub mod maps;

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use blazesym::{
    MaybeDefault,
    symbolize::{
        Input, Symbolized, Symbolizer as Blaze,
        source::{Elf, Kernel, Source},
    },
};

use crate::model::Stack;
use maps::Mapping;

/// Shown for an address nothing could name.
pub const UNKNOWN: &str = "[unknown]";
/// Bound on the raw-stack cache; when full it starts over (hot stacks return at once).
const STACK_CACHE_MAX: usize = 16_384;
/// Processes not sampled for this long are forgotten.
const PROCESS_TTL: Duration = Duration::from_secs(300);
/// An address outside every known mapping re-reads the maps at most this often per process.
const MAPS_REFRESH: Duration = Duration::from_secs(1);

struct Process {
    /// Thread names seen in this process (a comm is per thread: a new one is not an exec).
    comms: Vec<Arc<str>>,
    /// Target of /proc/PID/exe when the maps were read: it changes when the process execs.
    exe: Option<std::path::PathBuf>,
    maps: Vec<Mapping>,
    read_at: Instant,
    seen_at: Instant,
}

struct Module {
    /// `[unknown] (libfoo.so)`: what an unresolvable address in this module shows.
    unknown: Arc<str>,
    /// A path that opens this very file (device and inode checked), if one was found.
    path: Option<PathBuf>,
    names: HashMap<u64, Arc<str>>,
}

/// Counters for the daemon's log.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub stack_hits: u64,
    pub stack_misses: u64,
    pub maps_reads: u64,
    pub processes: usize,
    pub modules: usize,
}

pub struct Symbolizer {
    blaze: Blaze,
    kernel_source: Source<'static>,
    kernel: HashMap<u64, Arc<str>>,
    processes: HashMap<u32, Process>,
    modules: HashMap<(u64, u64), Module>,
    stacks: HashMap<(u32, Vec<u64>, usize), Arc<Stack>>,
    names: HashMap<Box<str>, Arc<str>>,
    unknown: Arc<str>,
    stats: Stats,
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
            blaze: Blaze::builder().enable_code_info(false).enable_inlined_fns(false).build(),
            kernel_source: Source::Kernel(kernel),
            kernel: HashMap::new(),
            processes: HashMap::new(),
            modules: HashMap::new(),
            stacks: HashMap::new(),
            names: HashMap::new(),
            unknown: Arc::from(UNKNOWN),
            stats: Stats::default(),
        }
    }

    pub fn stats(&self) -> Stats {
        Stats { processes: self.processes.len(), modules: self.modules.len(), ..self.stats }
    }

    /// The symbolized stack of a sample. `kernel` and `user` are leaf first, as the kernel's
    /// unwinder returns them; the result is root first.
    pub fn stack(&mut self, pid: u32, comm: &str, kernel: &[u64], user: &[u64]) -> Arc<Stack> {
        let now = Instant::now();
        self.note_process(pid, comm, now);
        let mut key_addrs = Vec::with_capacity(kernel.len() + user.len());
        key_addrs.extend_from_slice(kernel);
        key_addrs.extend_from_slice(user);
        // User addresses only mean something within their process; kernel-only stacks are
        // shared by all.
        let key = (if user.is_empty() { 0 } else { pid }, key_addrs, kernel.len());
        if let Some(stack) = self.stacks.get(&key) {
            self.stats.stack_hits += 1;
            return stack.clone();
        }
        self.stats.stack_misses += 1;
        let mut frames = Vec::with_capacity(kernel.len() + user.len());
        for (i, &addr) in user.iter().enumerate().rev() {
            frames.push(self.user_frame(pid, lookup_addr(addr, i), now));
        }
        for (i, &addr) in kernel.iter().enumerate().rev() {
            frames.push(self.kernel_frame(lookup_addr(addr, i)));
        }
        let stack = Arc::new(Stack { frames, user_len: user.len() });
        if self.stacks.len() >= STACK_CACHE_MAX {
            self.stacks.clear();
        }
        self.stacks.insert(key, stack.clone());
        stack
    }

    /// Forgets processes that have not been sampled for a while.
    pub fn expire(&mut self) {
        let now = Instant::now();
        self.processes.retain(|_, p| now.duration_since(p.seen_at) < PROCESS_TTL);
    }

    fn intern(&mut self, name: &str) -> Arc<str> {
        if let Some(n) = self.names.get(name) {
            return n.clone();
        }
        let n: Arc<str> = Arc::from(name);
        self.names.insert(name.into(), n.clone());
        n
    }

    fn kernel_frame(&mut self, addr: u64) -> Arc<str> {
        if let Some(name) = self.kernel.get(&addr) {
            return name.clone();
        }
        let name = match self.blaze.symbolize_single(&self.kernel_source, Input::AbsAddr(addr)) {
            Ok(Symbolized::Sym(sym)) => {
                let owned = sym.name.into_owned();
                self.intern(&owned)
            }
            _ => self.unknown.clone(),
        };
        self.kernel.insert(addr, name.clone());
        name
    }

    fn note_process(&mut self, pid: u32, comm: &str, now: Instant) {
        let exe = |pid: u32| std::fs::read_link(format!("/proc/{pid}/exe")).ok();
        let exec = match self.processes.get_mut(&pid) {
            Some(p) => {
                p.seen_at = now;
                if p.comms.iter().any(|c| &**c == comm) {
                    false
                } else if exe(pid) == p.exe {
                    // Another thread's name, same program: remember it, nothing to re-read.
                    if p.comms.len() < 64 {
                        let c = Arc::from(comm);
                        p.comms.push(c);
                    }
                    false
                } else {
                    true
                }
            }
            None => true,
        };
        if exec {
            let comm = self.intern(comm);
            let maps = self.read_maps(pid);
            self.processes.insert(pid, Process { comms: vec![comm], exe: exe(pid), maps, read_at: now, seen_at: now });
            // Stacks cached for this pid may belong to the image it replaced.
            self.stacks.retain(|k, _| k.0 != pid);
        }
    }

    fn read_maps(&mut self, pid: u32) -> Vec<Mapping> {
        self.stats.maps_reads += 1;
        std::fs::read_to_string(format!("/proc/{pid}/maps")).map(|t| maps::parse(&t)).unwrap_or_default()
    }

    fn user_frame(&mut self, pid: u32, addr: u64, now: Instant) -> Arc<str> {
        let Some(process) = self.processes.get(&pid) else {
            return self.unknown.clone();
        };
        let mut mapping = maps::find(&process.maps, addr).cloned();
        if mapping.is_none() && now.duration_since(process.read_at) >= MAPS_REFRESH {
            // Something mapped since we looked (dlopen, a JIT).
            let fresh = self.read_maps(pid);
            mapping = maps::find(&fresh, addr).cloned();
            if let Some(p) = self.processes.get_mut(&pid) {
                if !fresh.is_empty() {
                    p.maps = fresh;
                }
                p.read_at = now;
            }
        }
        let Some(mapping) = mapping else {
            return self.unknown.clone();
        };
        if !mapping.is_file() {
            return if mapping.path.starts_with('[') { self.intern(&mapping.path) } else { self.unknown.clone() };
        }
        let key = (mapping.dev, mapping.inode);
        if !self.modules.contains_key(&key) {
            let module = self.open_module(pid, &mapping);
            self.modules.insert(key, module);
        }
        let offset = mapping.file_offset(addr);
        let module = self.modules.get(&key).expect("inserted above");
        if let Some(name) = module.names.get(&offset) {
            return name.clone();
        }
        let name = match &module.path {
            Some(path) => {
                let src = Source::Elf(Elf { debug_syms: false, ..Elf::new(path.clone()) });
                match self.blaze.symbolize_single(&src, Input::FileOffset(offset)) {
                    Ok(Symbolized::Sym(sym)) => Some(sym.name.into_owned()),
                    _ => None,
                }
            }
            None => None,
        };
        let name = match name {
            Some(n) => self.intern(&n),
            None => module.unknown.clone(),
        };
        if let Some(m) = self.modules.get_mut(&key) {
            m.names.insert(offset, name.clone());
        }
        name
    }

    /// Finds a path that opens the mapped file itself: the plain path when the process shares
    /// our mount namespace, else through its root (containers), else its `map_files` entry.
    fn open_module(&mut self, pid: u32, mapping: &Mapping) -> Module {
        let path = mapping.path.trim_end_matches(" (deleted)");
        let base = path.rsplit('/').next().unwrap_or(path);
        let unknown = self.intern(&format!("{UNKNOWN} ({base})"));
        let candidates = [
            PathBuf::from(path),
            PathBuf::from(format!("/proc/{pid}/root{path}")),
            PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", mapping.start, mapping.end)),
        ];
        let path = candidates
            .into_iter()
            .find(|p| std::fs::metadata(p).is_ok_and(|m| m.dev() == mapping.dev && m.ino() == mapping.inode));
        Module { unknown, path, names: HashMap::new() }
    }
}

/// Return addresses point after the call; one byte back lands inside the calling function
/// (matters when the call is the function's last instruction). The leaf is the exact IP.
fn lookup_addr(addr: u64, index_from_leaf: usize) -> u64 {
    if index_from_leaf == 0 { addr } else { addr.saturating_sub(1) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    #[unsafe(no_mangle)]
    extern "C" fn profiler_symbolize_test_marker() -> u64 {
        std::hint::black_box(42)
    }

    #[test]
    fn resolves_a_function_of_this_process() {
        let mut s = Symbolizer::new();
        let addr = profiler_symbolize_test_marker as *const () as u64;
        let pid = std::process::id();
        let stack = s.stack(pid, "test", &[], &[addr]);
        assert_eq!(stack.user_len, 1);
        assert_eq!(&*stack.frames[0], "profiler_symbolize_test_marker");
        // The second lookup is a cache hit and returns the same stack.
        let again = s.stack(pid, "test", &[], &[addr]);
        assert!(Arc::ptr_eq(&stack, &again));
        assert_eq!(s.stats().stack_hits, 1);
    }

    #[test]
    fn unmapped_address_is_unknown() {
        let mut s = Symbolizer::new();
        let stack = s.stack(std::process::id(), "test", &[], &[8]);
        assert_eq!(&*stack.frames[0], UNKNOWN);
    }

    #[test]
    fn roots_first_user_then_kernel() {
        let mut s = Symbolizer::new();
        let a = profiler_symbolize_test_marker as *const () as u64;
        // Leaf-first input: user [leaf, caller], kernel [leaf].
        let stack = s.stack(std::process::id(), "t", &[1], &[a, 8]);
        assert_eq!(stack.user_len, 2);
        assert_eq!(&*stack.frames[0], UNKNOWN);
        assert_eq!(&*stack.frames[1], "profiler_symbolize_test_marker");
        assert_eq!(stack.kernel().len(), 1);
    }
}
