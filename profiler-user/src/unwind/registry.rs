//! Which tables are in the kernel, where, and which processes use them. One table per file
//! (device, inode, size, mtime), shared by every process that maps it; each process gets a
//! description of its executable mappings pointing into the shared rows.
//!
//! The rows array is bounded (`--unwind-table-mib`): a table that does not fit, after tables
//! no process uses any more were evicted, is counted and its mappings are walked with frame
//! pointers, as before tables existed.
//!
//! So is a process's description (`MAX_MAPPINGS`). A mapping without a table needs no place in
//! it (the sampler walks an address outside every described mapping with frame pointers, as it
//! does one in a mapping without a table), so the places go to the mappings with tables: the
//! process's executable and the vDSO first, then the highest addresses (mmap places mappings
//! top-down: the loader's, ld.so and the libraries the program was linked with, come before
//! what the program mapped later). What is left out is counted and logged once per process.

use std::{cmp::Reverse, collections::HashMap};

use profiler_common::unwind::{MAX_MAPPINGS, Mapping, ProcessTable};

use super::table::{Table, TableError};
use crate::collect::unwind_maps::Tables;

/// A file's identity: a path can be replaced, an inode reused, but not all four at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    /// The file's owner: the rows one owner's files hold are shared fairly (`rows.rs`).
    pub owner: u32,
}

/// One executable mapping of a process, with the file behind it.
#[derive(Debug, Clone)]
pub struct MappedFile {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub key: FileKey,
    /// The process's executable or the vDSO: described before any other mapping.
    pub preferred: bool,
}

/// Files remembered without a table (not ELF, no CFI, or not built): past this many, they are
/// forgotten (and checked again when a process maps them), so that processes mapping ever new
/// files do not grow the registry without end. ~100 bytes each.
pub const MAX_FILES_WITHOUT: usize = 32_768;

/// What building a file's table gave, or that it was handed to a builder ([`Registry::built`]
/// gets the result later), or, when only a check was asked for, that the file may have one.
pub enum Build {
    Done(Result<Table, TableError>),
    Queued,
    /// An ELF file, not built: it is past its process's bound.
    Checked,
}

#[derive(Debug)]
enum Entry {
    /// Handed to a builder; the processes mapping it wait in `Registry::waiting`.
    Building,
    Loaded {
        start: usize,
        len: usize,
        table: TableShape,
        users: u32,
        last_used: u64,
    },
    /// No table (no CFI, malformed, too large, did not fit): frame pointers for this file.
    Without,
    /// An ELF file not built yet: every process mapping it had it past its bound.
    Checked,
}

/// What a mapping needs of a table once its rows are in the kernel.
#[derive(Debug, Clone)]
struct TableShape {
    base: u64,
    loads: Vec<super::table::Load>,
    /// Its packed rows, and the pages of the index after them (`packed`).
    rows: u32,
    pages: u32,
}

impl TableShape {
    fn bias(&self, start: u64, offset: u64) -> Option<u64> {
        super::table::bias(self.base, &self.loads, start, offset)
    }
}

/// Counters for /metrics and the log.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub tables: u64,
    pub rows: u64,
    pub processes: u64,
    /// Files without a usable table (no CFI, malformed, over the size bound).
    pub without: u64,
    /// Tables that did not fit in the rows array.
    pub did_not_fit: u64,
    /// Mappings with (or maybe with) a table that processes' descriptions left out, as of each
    /// process's last description: walked with frame pointers.
    pub mappings_left_out: u64,
    /// Processes whose description made room for another's in the kernel's full process
    /// table: the least recently sampled go first.
    pub processes_evicted: u64,
    /// Descriptions the kernel refused even then: those processes are walked with frame pointers.
    pub processes_refused: u64,
}

/// What the registry knows of a described process.
#[derive(Debug)]
struct Process {
    /// Files whose tables its description uses.
    keys: Vec<FileKey>,
    /// Its description, (mapping, file, file offset) sorted by start: tables it waits for are
    /// patched in as they come, without reading the process's maps again (thousands of
    /// mappings, a hundred tables), and a read of its maps cut short keeps what lies past the cut.
    described: Vec<(Mapping, FileKey, u64)>,
    /// Mappings its last description left out.
    left_out: u32,
    /// Whether that was logged.
    warned: bool,
    /// When a sample of it was last seen ([`Registry::touch`]), on the registry's clock, and
    /// in time.
    seen: u64,
    seen_at: std::time::Instant,
}

/// Processes remembered as sampled, past this the set starts over (a running process is
/// announced again within 80 s).
const MAX_SAMPLED: usize = 65_536;

/// A process not sampled for this long may lose the tables it uses to one that runs, when
/// the rows array is full: a user's thousand sleeping processes cannot hold the rows that
/// root's new program needs.
pub const STALE: std::time::Duration = std::time::Duration::from_secs(30);

pub struct Registry<T: Tables> {
    tables: T,
    files: HashMap<FileKey, Entry>,
    /// Free row ranges `(start, len)`, sorted by start, never adjacent.
    free: Vec<(usize, usize)>,
    processes: HashMap<u32, Process>,
    /// Processes a sample of which was seen, described or not (evicted, not yet described). A
    /// full table's places go to them first: a description alone (an exec, a re-read of the
    /// maps) makes a process recent, and a user's thousand new sleepers would otherwise push
    /// out root's running program, which the pipeline announces only every 10 to 80 s.
    sampled: std::collections::HashSet<u32>,
    /// Processes to describe again once a file's table is built.
    waiting: HashMap<FileKey, Vec<u32>>,
    clock: u64,
    did_not_fit: u64,
    processes_evicted: u64,
    processes_refused: u64,
    /// Processes forgotten so that their tables give way (`rows.rs`): not sampled lately, or
    /// of an owner past its share.
    stale_evicted: u64,
    share_evicted: u64,
    /// The shared rules array's contents (`packed`).
    rules: super::packed::Rules,
}

impl<T: Tables> Registry<T> {
    pub fn new(tables: T) -> Self {
        let capacity = tables.capacity();
        Self {
            tables,
            files: HashMap::new(),
            free: if capacity > 0 { vec![(0, capacity)] } else { Vec::new() },
            processes: HashMap::new(),
            sampled: std::collections::HashSet::new(),
            waiting: HashMap::new(),
            clock: 0,
            did_not_fit: 0,
            processes_evicted: 0,
            processes_refused: 0,
            stale_evicted: 0,
            share_evicted: 0,
            rules: super::packed::Rules::default(),
        }
    }

    pub fn is_known(&self, pid: u32) -> bool {
        self.processes.contains_key(&pid)
    }

    pub fn pids(&self) -> Vec<u32> {
        self.processes.keys().copied().collect()
    }

    /// Describes process `pid`'s mappings to the sampler, building (`build`) the tables of
    /// files not seen before; a mapping whose table is still being built is walked with frame
    /// pointers until then. Replaces what was known of the process. At most `MAX_MAPPINGS`
    /// mappings with tables are described, chosen as the module comment says; past them, a file
    /// not seen before is only checked (`build`'s second argument is false), so that what is
    /// left out counts files that have (or may have) a table, not data files.
    pub fn set_process(
        &mut self,
        pid: u32,
        mappings: &[MappedFile],
        build: impl FnMut(&MappedFile, bool) -> Build,
    ) -> Result<(), String> {
        self.set_process_within(pid, mappings, usize::MAX, build).map(|_| ())
    }

    /// [`Self::set_process`], calling `build` for at most `checks` files not seen before: the
    /// other ones get no place this time. Returns how many that was; described again, they
    /// get theirs.
    // `finish` decides whether a file is remembered (a failure of the moment is not), so the
    // map cannot be filled through `entry`.
    #[allow(clippy::map_entry)]
    pub fn set_process_within(
        &mut self,
        pid: u32,
        mappings: &[MappedFile],
        mut checks: usize,
        mut build: impl FnMut(&MappedFile, bool) -> Build,
    ) -> Result<usize, String> {
        let mut unchecked = 0;
        self.clock += 1;
        if self.files.len() > MAX_FILES_WITHOUT {
            let unused = |e: &Entry| matches!(e, Entry::Without | Entry::Checked);
            if self.files.values().filter(|e| unused(e)).count() > MAX_FILES_WITHOUT {
                self.files.retain(|_, e| !unused(e));
            }
        }
        let mut keys: Vec<FileKey> = Vec::new();
        let mut described: Vec<(Mapping, FileKey, u64)> = Vec::new();
        let mut left_out = 0u32;
        let mut ranked: Vec<&MappedFile> = mappings.iter().collect();
        ranked.sort_by_key(|m| (!m.preferred, Reverse(m.start)));
        for m in ranked {
            let full = described.len() >= MAX_MAPPINGS;
            let known = self.files.get(&m.key);
            if known.is_none() || (!full && matches!(known, Some(Entry::Checked))) {
                if checks == 0 {
                    unchecked += 1;
                    continue;
                }
                checks -= 1;
                match build(m, !full) {
                    Build::Done(result) => self.finish(m.key, result, pid),
                    Build::Queued => {
                        self.files.insert(m.key, Entry::Building);
                    }
                    Build::Checked => {
                        self.files.insert(m.key, Entry::Checked);
                    }
                }
            }
            let mut mapping = Mapping { start: m.start, end: m.end, ..Mapping::default() };
            match self.files.get_mut(&m.key) {
                Some(Entry::Without) => continue,
                _ if full => {
                    left_out += 1;
                    continue;
                }
                Some(Entry::Building) => {
                    // Patched in once the table is in (`built`).
                    let waiting = self.waiting.entry(m.key).or_default();
                    if !waiting.contains(&pid) {
                        waiting.push(pid);
                    }
                }
                Some(Entry::Loaded { start, table: shape, users, last_used, .. }) => {
                    let Some(bias) = shape.bias(m.start, m.offset) else { continue };
                    if !keys.contains(&m.key) {
                        *users += 1;
                        keys.push(m.key);
                    }
                    *last_used = self.clock;
                    mapping.bias = bias;
                    mapping.table_start = *start as u32;
                    (mapping.table_len, mapping.table_pages) = (shape.rows, shape.pages);
                }
                // Not read now (the builder is busy, the process exited): it keeps its place,
                // walked with frame pointers, and is tried again at the next description.
                Some(Entry::Checked) | None => {}
            }
            described.push((mapping, m.key, m.offset));
        }
        described.sort_by_key(|m| m.0.start);
        let table = process_table(&described);
        let mut warned = false;
        // The old description's users go after the new one took its own.
        if let Some(old) = self.processes.remove(&pid) {
            self.release(&old.keys);
            warned = old.warned;
        }
        if left_out > 0 && !warned && unchecked == 0 {
            warned = true;
            tracing::warn!(
                pid,
                described = MAX_MAPPINGS,
                left_out,
                "a process maps more files with unwind tables than its description holds: the rest (mapped last) \
                 are walked with frame pointers"
            );
        }
        self.clock += 1;
        let seen_at = std::time::Instant::now();
        self.processes.insert(pid, Process { keys, described, left_out, warned, seen: self.clock, seen_at });
        self.insert_process(pid, &table).map(|()| unchecked)
    }

    /// A sample of `pid` was seen: the last process to give up its place in the kernel.
    pub fn touch(&mut self, pid: u32) {
        self.clock += 1;
        if let Some(p) = self.processes.get_mut(&pid) {
            p.seen = self.clock;
            p.seen_at = std::time::Instant::now();
        }
        if self.sampled.len() >= MAX_SAMPLED {
            self.sampled.clear();
        }
        self.sampled.insert(pid);
    }

    /// `pid` exited: forgotten, its sampled mark too (pids are reused).
    pub fn exited(&mut self, pid: u32) {
        self.remove_process(pid);
        self.sampled.remove(&pid);
    }

    /// Forgets the sampled marks of processes not described that `alive` says are gone.
    pub fn keep_sampled(&mut self, mut alive: impl FnMut(u32) -> bool) {
        let processes = &self.processes;
        self.sampled.retain(|pid| processes.contains_key(pid) || alive(*pid));
    }

    /// Puts a description into the kernel's process table. When the table is full (a node runs
    /// more processes than it holds, or a user started a thousand sleeping ones), a process never
    /// sampled gives up its place, else the one sampled least recently, counted and logged: the
    /// processes that run keep complete stacks.
    fn insert_process(&mut self, pid: u32, table: &ProcessTable) -> Result<(), String> {
        let Err(first) = self.tables.set_process(pid, table) else { return Ok(()) };
        let victim = self
            .processes
            .iter()
            .filter(|(p, _)| **p != pid)
            .min_by_key(|(p, v)| (self.sampled.contains(p), v.seen))
            .map(|(p, _)| *p);
        if let Some(victim) = victim {
            self.remove_process(victim);
            self.processes_evicted += 1;
            if self.processes_evicted == 1 || self.processes_evicted.is_power_of_two() {
                tracing::warn!(
                    pid,
                    evicted = victim,
                    evictions = self.processes_evicted,
                    "the kernel's table of processes with unwind tables is full: the least recently sampled process \
                     gave up its place (profiler_unwind_processes_evicted_total)"
                );
            }
            if self.tables.set_process(pid, table).is_ok() {
                return Ok(());
            }
        }
        self.processes_refused += 1;
        if self.processes_refused == 1 || self.processes_refused.is_power_of_two() {
            tracing::warn!(pid, error = %first, refused = self.processes_refused, "a process could not be described to the unwinder: frame pointers for it");
        }
        Err(first)
    }

    /// The mappings `pid`'s description holds from `start` up: a read of its maps that stopped
    /// there (a byte or time bound) misses them, and they are the loader's (ld.so, libc).
    pub fn described_from(&self, pid: u32, start: u64) -> Vec<MappedFile> {
        let Some(p) = self.processes.get(&pid) else { return Vec::new() };
        p.described
            .iter()
            .filter(|(m, _, _)| m.start >= start)
            .map(|(m, key, offset)| MappedFile {
                start: m.start,
                end: m.end,
                offset: *offset,
                key: *key,
                preferred: false,
            })
            .collect()
    }

    /// Describes the CPython interpreter of a described process (`None`: it has none).
    pub fn set_python(&mut self, pid: u32, python: Option<&profiler_common::python::PyProc>) {
        self.tables.set_python(pid, python);
    }

    /// A table handed to a builder is ready (or could not be built): patched into the
    /// descriptions of the processes that wait for it.
    pub fn built(&mut self, key: FileKey, result: Result<Table, TableError>) {
        if !matches!(self.files.get(&key), Some(Entry::Building)) {
            return;
        }
        self.files.remove(&key);
        self.finish(key, result, 0);
        for pid in self.waiting.remove(&key).unwrap_or_default() {
            let Some(p) = self.processes.get_mut(&pid) else { continue };
            if let Some(Entry::Loaded { start, table: shape, users, last_used, .. }) = self.files.get_mut(&key) {
                for (m, _, offset) in p.described.iter_mut().filter(|(_, k, _)| *k == key) {
                    let Some(bias) = shape.bias(m.start, *offset) else { continue };
                    (m.bias, m.table_start) = (bias, *start as u32);
                    (m.table_len, m.table_pages) = (shape.rows, shape.pages);
                    if !p.keys.contains(&key) {
                        *users += 1;
                        p.keys.push(key);
                    }
                    *last_used = self.clock;
                }
            }
            // Without a table, the mapping keeps its place until the next description.
            if let Err(e) = self.tables.set_process(pid, &process_table(&p.described)) {
                tracing::debug!(pid, error = %e, "cannot describe a process to the unwinder: frame pointers for it");
            }
        }
    }

    fn finish(&mut self, key: FileKey, result: Result<Table, TableError>, pid: u32) {
        match result {
            Ok(t) => {
                let entry = self.load(t, key.owner);
                self.files.insert(key, entry);
            }
            // Too large for the memory budget: said once per file, which is not tried again
            // while it is unchanged (counted in profiler_memory_refused_total).
            Err(e @ TableError::OverBudget { .. }) => {
                tracing::warn!(
                    pid,
                    file_bytes = key.size,
                    inode = key.ino,
                    error = %e,
                    "an unwind table was not built: frame pointers for its binary"
                );
                self.files.insert(key, Entry::Without);
            }
            // The file's own fault: not tried again while it is unchanged.
            Err(e) if e.is_about_the_file() => {
                tracing::debug!(pid, error = %e, "no unwind table for a mapping: frame pointers there");
                self.files.insert(key, Entry::Without);
            }
            // The process exited, or its file could not be opened now: next time.
            Err(e) => tracing::debug!(pid, error = %e, "cannot read a mapped file for its unwind table"),
        }
    }

    /// Forgets an exited process; its tables stay until their room is needed.
    pub fn remove_process(&mut self, pid: u32) {
        for waiting in self.waiting.values_mut() {
            waiting.retain(|p| *p != pid);
        }
        if let Some(p) = self.processes.remove(&pid) {
            self.tables.remove_process(pid);
            self.release(&p.keys);
        }
    }

    fn release(&mut self, keys: &[FileKey]) {
        for k in keys {
            if let Some(Entry::Loaded { users, .. }) = self.files.get_mut(k) {
                *users = users.saturating_sub(1);
            }
        }
    }

    fn load(&mut self, table: Table, owner: u32) -> Entry {
        let (packed, added) = match self.rules.pack(&table.rows) {
            Ok(p) => p,
            Err(e) => {
                self.did_not_fit += 1;
                tracing::warn!(rows = table.rows.len(), error = %e, "an unwind table cannot be packed: its binary is walked with frame pointers");
                return Entry::Without;
            }
        };
        // Rules first: no row names one before it is in.
        if !added.iter().all(|(id, rule)| self.tables.set_rule(*id, rule)) {
            return Entry::Without;
        }
        let len = packed.words.len();
        let start = match self.allocate(len, owner) {
            Some(s) => s,
            None => {
                self.did_not_fit += 1;
                tracing::warn!(
                    rows = len,
                    "an unwind table does not fit in --unwind-table-mib: its binary is walked with frame pointers"
                );
                return Entry::Without;
            }
        };
        if !self.tables.write_rows(start, &packed.words) {
            self.free_range(start, len);
            return Entry::Without;
        }
        Entry::Loaded {
            start,
            len,
            table: TableShape { base: table.base, loads: table.loads, rows: packed.rows, pages: packed.pages },
            users: 0,
            last_used: self.clock,
        }
    }

    pub fn stats(&self) -> Stats {
        let (mut tables, mut rows, mut without) = (0, 0, 0);
        for e in self.files.values() {
            match e {
                Entry::Loaded { len, .. } => {
                    tables += 1;
                    rows += *len as u64;
                }
                Entry::Without => without += 1,
                Entry::Building | Entry::Checked => {}
            }
        }
        Stats {
            tables,
            rows,
            processes: self.processes.len() as u64,
            without,
            did_not_fit: self.did_not_fit,
            processes_evicted: self.processes_evicted + self.stale_evicted + self.share_evicted,
            processes_refused: self.processes_refused,
            mappings_left_out: self.processes.values().map(|p| p.left_out as u64).sum(),
        }
    }

    /// Makes `pid` look sampled `ago` earlier than it was (tests of `STALE`).
    #[cfg(test)]
    pub fn age(&mut self, pid: u32, ago: std::time::Duration) {
        if let Some(p) = self.processes.get_mut(&pid) {
            p.seen_at -= ago;
        }
    }

    #[cfg(test)]
    pub fn kernel(&self) -> &T {
        &self.tables
    }
}

/// The kernel's description of mappings sorted by start, at most `MAX_MAPPINGS` of them.
fn process_table(described: &[(Mapping, FileKey, u64)]) -> ProcessTable {
    let mut table = ProcessTable::default();
    for (slot, (m, _, _)) in table.mappings.iter_mut().zip(described) {
        *slot = *m;
    }
    table.len = described.len().min(MAX_MAPPINGS) as u32;
    table
}

mod rows;
#[cfg(test)]
mod tests;
