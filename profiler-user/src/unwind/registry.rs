//! Which tables are in the kernel, where, and which processes use them. One table per file
//! (device, inode, size, mtime), shared by every process that maps it; each process gets a
//! description of its executable mappings pointing into the shared rows.
//!
//! The rows array is bounded (`--unwind-table-mib`): a table that does not fit, after tables
//! no process uses any more were evicted, is counted and its mappings are walked with frame
//! pointers, as before tables existed.

use std::collections::HashMap;

use profiler_common::unwind::{MAX_MAPPINGS, Mapping, ProcessTable};

use super::{
    kernel::Tables,
    table::{Table, TableError},
};

/// A file's identity: a path can be replaced, an inode reused, but not all four at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
}

/// One executable mapping of a process, with the file behind it.
#[derive(Debug, Clone)]
pub struct MappedFile {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub key: FileKey,
}

/// What building a file's table gave, or that it was handed to a builder ([`Registry::built`]
/// gets the result later).
pub enum Build {
    Done(Result<Table, TableError>),
    Queued,
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
}

/// What a mapping needs of a table once its rows are in the kernel.
#[derive(Debug, Clone)]
struct TableShape {
    base: u64,
    loads: Vec<super::table::Load>,
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
}

pub struct Registry<T: Tables> {
    tables: T,
    files: HashMap<FileKey, Entry>,
    /// Free row ranges `(start, len)`, sorted by start, never adjacent.
    free: Vec<(usize, usize)>,
    processes: HashMap<u32, Vec<FileKey>>,
    /// Processes to describe again once a file's table is built.
    waiting: HashMap<FileKey, Vec<u32>>,
    clock: u64,
    did_not_fit: u64,
}

impl<T: Tables> Registry<T> {
    pub fn new(tables: T) -> Self {
        let capacity = tables.capacity();
        Self {
            tables,
            files: HashMap::new(),
            free: if capacity > 0 { vec![(0, capacity)] } else { Vec::new() },
            processes: HashMap::new(),
            waiting: HashMap::new(),
            clock: 0,
            did_not_fit: 0,
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
    /// pointers until then. Replaces what was known of the process.
    // `finish` decides whether a file is remembered (a failure of the moment is not), so the
    // map cannot be filled through `entry`.
    #[allow(clippy::map_entry)]
    pub fn set_process(
        &mut self,
        pid: u32,
        mappings: &[MappedFile],
        mut build: impl FnMut(&MappedFile) -> Build,
    ) -> Result<(), String> {
        self.clock += 1;
        let mut keys: Vec<FileKey> = Vec::new();
        let mut table = ProcessTable::default();
        let mut sorted: Vec<&MappedFile> = mappings.iter().collect();
        sorted.sort_by_key(|m| m.start);
        for m in sorted.into_iter().take(MAX_MAPPINGS) {
            if !self.files.contains_key(&m.key) {
                match build(m) {
                    Build::Done(result) => self.finish(m.key, result, pid),
                    Build::Queued => {
                        self.files.insert(m.key, Entry::Building);
                    }
                }
            }
            if let Some(Entry::Building) = self.files.get(&m.key) {
                let waiting = self.waiting.entry(m.key).or_default();
                if !waiting.contains(&pid) {
                    waiting.push(pid);
                }
            }
            let mut mapping = Mapping { start: m.start, end: m.end, ..Mapping::default() };
            if let Some(Entry::Loaded { start, len, table: shape, users, last_used }) = self.files.get_mut(&m.key)
                && let Some(bias) = shape.bias(m.start, m.offset)
            {
                if !keys.contains(&m.key) {
                    *users += 1;
                    keys.push(m.key);
                }
                *last_used = self.clock;
                mapping.bias = bias;
                mapping.table_start = *start as u32;
                mapping.table_len = *len as u32;
            }
            table.mappings[table.len as usize] = mapping;
            table.len += 1;
        }
        // The old description's users go after the new one took its own.
        if let Some(old) = self.processes.insert(pid, keys) {
            self.release(&old);
        }
        self.tables.set_process(pid, &table)
    }

    /// Describes the CPython interpreter of a described process (`None`: it has none).
    pub fn set_python(&mut self, pid: u32, python: Option<&profiler_common::python::PyProc>) {
        self.tables.set_python(pid, python);
    }

    /// A table handed to a builder is ready (or could not be built): the processes that wait
    /// for it, to be described again.
    pub fn built(&mut self, key: FileKey, result: Result<Table, TableError>) -> Vec<u32> {
        if !matches!(self.files.get(&key), Some(Entry::Building)) {
            return Vec::new();
        }
        self.files.remove(&key);
        self.finish(key, result, 0);
        self.waiting.remove(&key).unwrap_or_default().into_iter().filter(|p| self.processes.contains_key(p)).collect()
    }

    fn finish(&mut self, key: FileKey, result: Result<Table, TableError>, pid: u32) {
        match result {
            Ok(t) => {
                let entry = self.load(t);
                self.files.insert(key, entry);
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
        if let Some(keys) = self.processes.remove(&pid) {
            self.tables.remove_process(pid);
            self.release(&keys);
        }
    }

    fn release(&mut self, keys: &[FileKey]) {
        for k in keys {
            if let Some(Entry::Loaded { users, .. }) = self.files.get_mut(k) {
                *users = users.saturating_sub(1);
            }
        }
    }

    fn load(&mut self, table: Table) -> Entry {
        let len = table.rows.len();
        let start = match self.allocate(len) {
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
        if !self.tables.write_rows(start, &table.rows) {
            self.free_range(start, len);
            return Entry::Without;
        }
        Entry::Loaded {
            start,
            len,
            table: TableShape { base: table.base, loads: table.loads },
            users: 0,
            last_used: self.clock,
        }
    }

    /// First fit; evicts tables no process uses, least recently used first, until one fits.
    fn allocate(&mut self, len: usize) -> Option<usize> {
        if len == 0 {
            return None;
        }
        loop {
            if let Some(i) = self.free.iter().position(|&(_, l)| l >= len) {
                let (start, l) = self.free[i];
                if l == len {
                    self.free.remove(i);
                } else {
                    self.free[i] = (start + len, l - len);
                }
                return Some(start);
            }
            let victim = self
                .files
                .iter()
                .filter_map(|(k, e)| match e {
                    Entry::Loaded { users: 0, last_used, .. } => Some((*last_used, *k)),
                    _ => None,
                })
                .min()?;
            if let Some(Entry::Loaded { start, len, .. }) = self.files.remove(&victim.1) {
                self.free_range(start, len);
            }
        }
    }

    fn free_range(&mut self, start: usize, len: usize) {
        let i = self.free.partition_point(|&(s, _)| s < start);
        self.free.insert(i, (start, len));
        // Merge with the next, then with the previous.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
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
                Entry::Building => {}
            }
        }
        Stats { tables, rows, processes: self.processes.len() as u64, without, did_not_fit: self.did_not_fit }
    }

    #[cfg(test)]
    pub fn kernel(&self) -> &T {
        &self.tables
    }
}

#[cfg(test)]
mod tests;
