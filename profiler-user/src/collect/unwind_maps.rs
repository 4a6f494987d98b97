//! The unwind tables' home in the kernel: the rows array (mapped into this process, so a table
//! is written with one copy instead of a syscall per row), the per-process mapping tables, and
//! the unwinder program in the sampler's tail-call slot.

use std::os::fd::{AsFd, AsRawFd};

use aya::{
    Ebpf,
    maps::{Array, HashMap, MapData, ProgramArray},
    programs::PerfEvent,
};
use profiler_common::{
    python::{PYTHON_PROGRAM, PyProc},
    unwind::{FRAMES_PER_RUN, FRAMES_PER_RUN_SMALL, ProcessTable, Rule, SCAN_PROGRAM, UNWIND_PROGRAM},
};

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("the BPF object has no {0}")]
    Missing(&'static str),
    #[error("the unwinder program was rejected: {0}")]
    Program(#[from] aya::programs::ProgramError),
    #[error("unwind map {0}: {1}")]
    Map(&'static str, #[source] aya::maps::MapError),
    #[error("cannot map the unwind rows into memory: {0}")]
    Mmap(#[source] std::io::Error),
}

/// Where tables and process descriptions are written.
pub trait Tables {
    /// Room for this many words (packed rows and page indexes) in all.
    fn capacity(&self) -> usize;
    /// Writes `words` from word `start` on; false if they could not be written.
    fn write_rows(&mut self, start: usize, words: &[u32]) -> bool;
    /// Puts `rule` in the shared rules array at `index`; false if it could not be written.
    fn set_rule(&mut self, index: u16, rule: &Rule) -> bool;
    fn set_process(&mut self, pid: u32, table: &ProcessTable) -> Result<(), String>;
    fn remove_process(&mut self, pid: u32);
    /// Describes (or, with `None`, forgets) the CPython interpreter of a process.
    fn set_python(&mut self, pid: u32, python: Option<&PyProc>);
}

/// The rows array. A table is written through a mapping of just its pages, unmapped right
/// after: a mapping of the whole array would count its every page (80 MiB by default) in the
/// daemon's RSS for as long as it lives, while the memory is the kernel's either way.
struct Rows {
    map: MapData,
    len: usize,
}

impl Rows {
    fn write(&self, start: usize, rows: &[u32]) -> std::io::Result<()> {
        const PAGE: usize = 4096;
        let (from, to) = (start * size_of::<u32>(), (start + rows.len()) * size_of::<u32>());
        let first_page = from / PAGE * PAGE;
        let bytes = (to - first_page).div_ceil(PAGE) * PAGE;
        // SAFETY: a shared mapping of pages of an mmapable array map, inside it (the allocator
        // hands out ranges within `len`); unmapped before returning.
        unsafe {
            let ptr = libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.map.fd().as_fd().as_raw_fd(),
                first_page as libc::off_t,
            );
            if ptr == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
            std::ptr::copy_nonoverlapping(
                rows.as_ptr().cast::<u8>(),
                ptr.cast::<u8>().add(from - first_page),
                std::mem::size_of_val(rows),
            );
            libc::munmap(ptr, bytes);
        }
        Ok(())
    }
}

pub struct Maps {
    rows: Rows,
    rules: Array<MapData, Rule>,
    procs: HashMap<MapData, u32, ProcessTable>,
    python: Option<HashMap<MapData, u32, PyProc>>,
}

impl Maps {
    /// Takes the maps the unwind stage fills. Their programs are loaded after the sampler is
    /// attached ([`load_walkers`]): until then stacks follow frame pointers.
    pub fn take(ebpf: &mut Ebpf) -> Result<Self, KernelError> {
        let rows_map = match ebpf.take_map("UNWIND_ROWS") {
            Some(aya::maps::Map::Array(m)) => m,
            _ => return Err(KernelError::Missing("map UNWIND_ROWS")),
        };
        // Two 4-byte words an element, laid out one after the other in the mapped array.
        let len = 2 * rows_map.info().map_err(|e| KernelError::Map("UNWIND_ROWS", e))?.max_entries() as usize;
        let rows = Rows { map: rows_map, len };
        // A first write tells at load time whether the kernel lets us map the array.
        rows.write(0, &[0]).map_err(KernelError::Mmap)?;
        let rules = ebpf.take_map("UNWIND_RULES").ok_or(KernelError::Missing("map UNWIND_RULES"))?;
        let rules = Array::try_from(rules).map_err(|e| KernelError::Map("UNWIND_RULES", e))?;
        let procs = ebpf.take_map("UNWIND_PROCS").ok_or(KernelError::Missing("map UNWIND_PROCS"))?;
        let procs = HashMap::try_from(procs).map_err(|e| KernelError::Map("UNWIND_PROCS", e))?;
        let python = ebpf.take_map("PY_PROCS").and_then(|m| HashMap::try_from(m).ok());
        Ok(Self { rows, rules, procs, python })
    }
}

/// Loads the walkers into the sampler's tail-call slots: the table walk, the stack scan and the
/// Python frames, each optional (a sample without one ends where frame pointers do). Returns
/// the programs loaded, with the time each took.
pub fn load_walkers(ebpf: &mut Ebpf) -> Vec<Loaded> {
    let mut loaded = Vec::new();
    let mut timed = |ebpf: &mut Ebpf, name: &'static str, slot: u32| {
        let t = std::time::Instant::now();
        let r = load_into_slot(ebpf, name, slot);
        if let Ok(insns) = r {
            loaded.push(Loaded { name, took: t.elapsed(), verified_insns: insns });
        }
        r
    };
    let mut small = false;
    if let Err(e) = timed(ebpf, "unwind_user", UNWIND_PROGRAM) {
        small = true;
        // Older verifiers (6.1) give up on the walk's runs of 7 frames; runs of 4 pass.
        let text = e.to_string();
        let verdict = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
        tracing::info!(
            verdict,
            "the unwinder's runs of {FRAMES_PER_RUN} frames were refused; loading runs of {FRAMES_PER_RUN_SMALL}"
        );
        if let Err(e) = timed(ebpf, "unwind_user_small", UNWIND_PROGRAM) {
            tracing::warn!(error = %e, "user stacks without frame pointers will be cut short: the table walk was refused");
            return loaded;
        }
    }
    // Python frames are a bonus: without the program, stacks are native only.
    if let Err(e) = timed(ebpf, "python_frames", PYTHON_PROGRAM) {
        tracing::warn!(error = %e, "Python frames unavailable: Python code shows as interpreter frames");
    }
    // The stack scan is a fallback: without it, walks end where the rules do. A verifier that
    // refused the walker's long runs refuses the long scan too: it is not asked (each refusal
    // is a million instructions explored, half a minute under an emulator).
    if (small || timed(ebpf, "unwind_scan", SCAN_PROGRAM).is_err())
        && let Err(e) = timed(ebpf, "unwind_scan_small", SCAN_PROGRAM)
    {
        tracing::warn!(error = %e, "the stack scan is unavailable: walks end where code has no unwind rule");
    }
    loaded
}

/// A walker loaded: how long the verifier took, and the instructions it processed.
pub struct Loaded {
    pub name: &'static str,
    pub took: std::time::Duration,
    pub verified_insns: Option<u32>,
}

/// Loads the perf-event program `name` and puts it in the sampler's tail-call slot `slot`;
/// the instructions the verifier processed, where the kernel says.
fn load_into_slot(ebpf: &mut Ebpf, name: &'static str, slot: u32) -> Result<Option<u32>, KernelError> {
    let program: &mut PerfEvent = ebpf.program_mut(name).ok_or(KernelError::Missing(name))?.try_into()?;
    program.load()?;
    let fd = program.fd()?.try_clone().map_err(|e| KernelError::Program(aya::programs::ProgramError::IOError(e)))?;
    let insns = {
        use std::os::fd::AsFd;
        super::prog_info::stats(fd.as_fd()).ok().and_then(|s| s.verified_insns)
    };
    let mut slots: ProgramArray<_> = ebpf
        .map_mut("PROGRAMS")
        .ok_or(KernelError::Missing("map PROGRAMS"))?
        .try_into()
        .map_err(|e| KernelError::Map("PROGRAMS", e))?;
    slots.set(slot, &fd, 0).map_err(|e| KernelError::Map("PROGRAMS", e))?;
    Ok(insns)
}

impl Tables for Maps {
    fn capacity(&self) -> usize {
        self.rows.len
    }

    fn write_rows(&mut self, start: usize, rows: &[u32]) -> bool {
        assert!(start + rows.len() <= self.rows.len, "the allocator hands out ranges inside the array");
        // The sampler only reads rows a process table points at, and a range is written before
        // any table points at it.
        match self.rows.write(start, rows) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "cannot write an unwind table into the kernel: frame pointers for its binary");
                false
            }
        }
    }

    fn set_rule(&mut self, index: u16, rule: &Rule) -> bool {
        match self.rules.set(u32::from(index), rule, 0) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "cannot write an unwind rule into the kernel: frame pointers for the binary needing it");
                false
            }
        }
    }

    fn set_process(&mut self, pid: u32, table: &ProcessTable) -> Result<(), String> {
        self.procs.insert(pid, table, 0).map_err(|e| e.to_string())
    }

    fn remove_process(&mut self, pid: u32) {
        let _ = self.procs.remove(&pid);
        self.set_python(pid, None);
    }

    fn set_python(&mut self, pid: u32, python: Option<&PyProc>) {
        let Some(map) = self.python.as_mut() else { return };
        match python {
            Some(p) => {
                if let Err(e) = map.insert(pid, p, 0) {
                    // Full (1,024 interpreters) or out of memory: said once a daemon.
                    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
                    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                        tracing::warn!(pid, error = %e, "a Python process could not be described to the sampler: its Python frames show as the interpreter's (the table of Python processes is full)");
                    }
                }
            }
            None => {
                let _ = map.remove(&pid);
            }
        }
    }
}
