//! A small index per hour of segments, so that `status`, the store's span and "is there any
//! data" cost a read of the index, not of every segment (a 1 GiB store is thousands of files).
//!
//! `DATA_DIR/index/<unix second of the hour>.idx` holds, for the sealed segments of that hour,
//! each file's identity (length, mtime, inode), span and block count, and the hour's per-CPU
//! counts. The daemon is its only writer ([`Indexer`]); readers ([`summarize`]) trust an hour's
//! index only while every file it names is still there, unchanged, and add what it does not
//! name (the segment being written, anything newer than the last refresh) by reading those
//! files. So a missing, stale or corrupt index costs time, never a wrong answer.
//!
//! The daemon keeps that invariant across its own changes: before retention removes a segment
//! or rollup rewrites one, the segment leaves its hour's index (its counts are read from the
//! file, still there, and subtracted), and only then is the file touched. A reader in between
//! sees a file the index does not name, and reads it.

use std::{
    collections::{BTreeMap, HashMap},
    os::unix::fs::{DirBuilderExt, MetadataExt},
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use super::{
    StoreError,
    format::{NS_PER_SEC, SEGMENT_NS, SegmentHeader},
    reader::{BlockView, CpuSummary, Need, Store, StoreSummary, scan_segment},
};

/// One index file covers the segments starting in one hour.
pub const HOUR_NS: u64 = 3600 * NS_PER_SEC;
/// A segment is indexed once its minute ended this long ago: the writer has moved on.
const SEALED_AFTER_NS: u64 = 10 * NS_PER_SEC;
/// An hour's index is a few KiB even at 192 CPUs; anything far larger is not ours.
const MAX_INDEX_BYTES: u64 = 1 << 20;
const MAGIC: &[u8; 8] = b"PRFIDX1\n";

/// The index directory inside a data directory.
pub fn index_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("index")
}

fn index_path(data_dir: &Path, hour_ns: u64) -> PathBuf {
    index_dir(data_dir).join(format!("{}.idx", hour_ns / NS_PER_SEC))
}

/// What tells a file apart from its earlier self: appended (length, mtime) or replaced by a
/// rollup (inode, mtime).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct FileId {
    len: u64,
    mtime_ns: u64,
    ino: u64,
}

impl FileId {
    fn of(m: &std::fs::Metadata) -> Self {
        let mtime_ns = (m.mtime() as u64).saturating_mul(NS_PER_SEC).saturating_add(m.mtime_nsec() as u64);
        Self { len: m.len(), mtime_ns, ino: m.ino() }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    start_ns: u64,
    file: FileId,
    span: Option<(u64, u64)>,
    blocks: u64,
}

/// The index of one hour: its sealed segments and their per-CPU counts added up.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct HourIndex {
    entries: Vec<Entry>,
    cpus: BTreeMap<u32, CpuSummary>,
}

/// What one segment adds to a summary.
#[derive(Debug, Default)]
struct SegmentCounts {
    span: Option<(u64, u64)>,
    blocks: u64,
    cpus: BTreeMap<u32, CpuSummary>,
}

/// A segment file as listed: start, path and identity.
struct Listed {
    start_ns: u64,
    path: PathBuf,
    file: FileId,
}

fn merge_span(a: Option<(u64, u64)>, b: Option<(u64, u64)>) -> Option<(u64, u64)> {
    match (a, b) {
        (Some((a0, a1)), Some((b0, b1))) => Some((a0.min(b0), a1.max(b1))),
        (x, None) | (None, x) => x,
    }
}

fn add_cpus(into: &mut BTreeMap<u32, CpuSummary>, from: &BTreeMap<u32, CpuSummary>) {
    for (cpu, c) in from {
        let e = into.entry(*cpu).or_default();
        e.samples += c.samples;
        e.idle += c.idle;
        e.lost += c.lost;
    }
}

fn sub_cpus(from: &mut BTreeMap<u32, CpuSummary>, what: &BTreeMap<u32, CpuSummary>) {
    for (cpu, c) in what {
        if let Some(e) = from.get_mut(cpu) {
            e.samples = e.samples.saturating_sub(c.samples);
            e.idle = e.idle.saturating_sub(c.idle);
            e.lost = e.lost.saturating_sub(c.lost);
        }
    }
    from.retain(|_, c| *c != CpuSummary::default());
}

/// Segment files with their identity, oldest first (a file removed meanwhile is left out).
fn list(data_dir: &Path) -> Result<Vec<Listed>, StoreError> {
    let mut out = Vec::new();
    for (start_ns, path) in super::reader::list_segments(data_dir)? {
        match std::fs::symlink_metadata(&path) {
            Ok(m) => out.push(Listed { start_ns, path, file: FileId::of(&m) }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StoreError::Io(path, e)),
        }
    }
    Ok(out)
}

/// Reads one segment's counts from its block summaries.
fn count(path: &Path, warnings: &mut Vec<String>) -> Result<SegmentCounts, StoreError> {
    let mut counts = SegmentCounts::default();
    let data = match super::files::read_segment(path) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(counts),
        Err(e) => return Err(StoreError::Io(path.to_path_buf(), e)),
    };
    if let Err(e) = SegmentHeader::decode(&data) {
        warnings.push(format!("skipped {}: {e}", path.display()));
        return Ok(counts);
    }
    scan_segment(
        path,
        &data,
        0,
        u64::MAX,
        Need::Summary,
        &mut |b: BlockView<'_>| {
            counts.blocks += 1;
            counts.span = merge_span(counts.span, Some((b.header.start_ns, b.header.end_ns)));
            for c in &b.summary.expect("summary decoded").cpus {
                let e = counts.cpus.entry(c.cpu).or_default();
                e.samples += c.busy;
                e.idle += c.idle;
                e.lost += c.lost;
            }
        },
        warnings,
    );
    Ok(counts)
}

/// An hour's index from disk; `None` when missing, unreadable or not ours.
fn load(data_dir: &Path, hour_ns: u64) -> Option<HourIndex> {
    let bytes = super::files::read_regular(&index_path(data_dir, hour_ns), MAX_INDEX_BYTES).ok()?;
    let body = bytes.strip_prefix(MAGIC.as_slice())?;
    let (crc, body) = body.split_first_chunk::<4>()?;
    if u32::from_le_bytes(*crc) != crc32fast::hash(body) {
        return None;
    }
    postcard::from_bytes(body).ok()
}

fn store(data_dir: &Path, hour_ns: u64, index: &HourIndex) -> Result<(), StoreError> {
    let body = postcard::to_stdvec(index).expect("serialising to memory cannot fail");
    let mut bytes = Vec::with_capacity(MAGIC.len() + 4 + body.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    bytes.extend_from_slice(&body);
    super::files::write_private(&index_path(data_dir, hour_ns), &bytes)
}

/// Whether every file `index` names is listed, unchanged.
fn still_true(index: &HourIndex, files: &HashMap<u64, FileId>) -> bool {
    index.entries.iter().all(|e| files.get(&e.start_ns) == Some(&e.file))
}

impl Store {
    /// Span, sizes and per-CPU counts of the whole store: from the hours' indexes where they
    /// hold, from block summaries where they do not. (Here, not beside the reader: the index
    /// is built from what the reader scans.)
    pub fn summary(&mut self) -> Result<StoreSummary, StoreError> {
        summarize(&self.data_dir, &mut self.warnings)
    }

    /// `[first, last)` covered (from the index, as [`Store::summary`]).
    pub fn span(&mut self) -> Result<Option<(u64, u64)>, StoreError> {
        Ok(self.summary()?.span)
    }
}

/// Span, sizes and per-CPU counts of the whole store: from each hour's index where it holds,
/// from the segments themselves where it does not.
pub fn summarize(data_dir: &Path, warnings: &mut Vec<String>) -> Result<StoreSummary, StoreError> {
    let mut summary = StoreSummary::default();
    let mut by_hour: BTreeMap<u64, Vec<Listed>> = BTreeMap::new();
    for l in list(data_dir)? {
        summary.segments += 1;
        summary.bytes += l.file.len;
        by_hour.entry(l.start_ns - l.start_ns % HOUR_NS).or_default().push(l);
    }
    for (hour, files) in by_hour {
        let ids: HashMap<u64, FileId> = files.iter().map(|l| (l.start_ns, l.file)).collect();
        let index = load(data_dir, hour).filter(|i| still_true(i, &ids)).unwrap_or_default();
        let indexed: HashMap<u64, &Entry> = index.entries.iter().map(|e| (e.start_ns, e)).collect();
        for e in &index.entries {
            summary.span = merge_span(summary.span, e.span);
            summary.blocks += e.blocks;
        }
        add_cpus(&mut summary.cpus, &index.cpus);
        for l in files.iter().filter(|l| !indexed.contains_key(&l.start_ns)) {
            let c = count(&l.path, warnings)?;
            summary.span = merge_span(summary.span, c.span);
            summary.blocks += c.blocks;
            add_cpus(&mut summary.cpus, &c.cpus);
        }
    }
    Ok(summary)
}

/// What one refresh did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Refreshed {
    /// Segments newly indexed.
    pub added: usize,
    /// Hours whose index no longer matched the files and was rebuilt.
    pub rebuilt: usize,
}

/// The daemon's side: keeps the hours' indexes up to date, and takes a segment out of its
/// index before the segment is removed or rewritten.
pub struct Indexer {
    data_dir: PathBuf,
    hours: BTreeMap<u64, HourIndex>,
}

impl Indexer {
    pub fn new(data_dir: &Path) -> Self {
        Self { data_dir: data_dir.to_path_buf(), hours: BTreeMap::new() }
    }

    fn ensure_dir(&self) -> Result<(), StoreError> {
        let dir = index_dir(&self.data_dir);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(StoreError::Unsafe(dir, "it is not a directory".into())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::DirBuilder::new().mode(0o700).create(&dir).map_err(|e| StoreError::Io(dir, e))
            }
            Err(e) => Err(StoreError::Io(dir, e)),
        }
    }

    fn hour(&mut self, hour: u64) -> &mut HourIndex {
        let data_dir = &self.data_dir;
        self.hours.entry(hour).or_insert_with(|| load(data_dir, hour).unwrap_or_default())
    }

    /// Indexes every sealed segment not indexed yet, rebuilds hours whose index no longer
    /// matches their files, and removes the indexes of hours that have no segment left.
    pub fn refresh(&mut self, now_ns: u64) -> Result<Refreshed, StoreError> {
        self.ensure_dir()?;
        let mut done = Refreshed::default();
        let mut by_hour: BTreeMap<u64, Vec<Listed>> = BTreeMap::new();
        for l in list(&self.data_dir)? {
            by_hour.entry(l.start_ns - l.start_ns % HOUR_NS).or_default().push(l);
        }
        let mut warnings = Vec::new();
        for (&hour, files) in &by_hour {
            let ids: HashMap<u64, FileId> = files.iter().map(|l| (l.start_ns, l.file)).collect();
            let mut changed = false;
            let index = self.hour(hour);
            if !still_true(index, &ids) {
                *index = HourIndex::default();
                done.rebuilt += 1;
                changed = true;
            }
            for l in files {
                let sealed = l.start_ns.saturating_add(SEGMENT_NS).saturating_add(SEALED_AFTER_NS) <= now_ns;
                if !sealed || index.entries.iter().any(|e| e.start_ns == l.start_ns) {
                    continue;
                }
                let c = count(&l.path, &mut warnings)?;
                add_cpus(&mut index.cpus, &c.cpus);
                index.entries.push(Entry { start_ns: l.start_ns, file: l.file, span: c.span, blocks: c.blocks });
                done.added += 1;
                changed = true;
            }
            if changed {
                index.entries.sort_by_key(|e| e.start_ns);
                let index = index.clone();
                store(&self.data_dir, hour, &index)?;
            }
        }
        // Hours without segments: in memory and on disk.
        self.hours.retain(|h, _| by_hour.contains_key(h));
        if let Ok(entries) = std::fs::read_dir(index_dir(&self.data_dir)) {
            for e in entries.flatten() {
                let name = e.file_name();
                let hour = name.to_str().and_then(|n| n.strip_suffix(".idx")).and_then(|n| n.parse::<u64>().ok());
                if hour.is_some_and(|h| !by_hour.contains_key(&h.saturating_mul(NS_PER_SEC))) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        for w in warnings {
            tracing::warn!("{w}");
        }
        Ok(done)
    }

    /// Takes the segment starting at `start_ns` out of its hour's index, before it is removed
    /// or rewritten: its counts are read from the file and subtracted. If the index did not
    /// match the file any more, the hour's index is dropped (readers then read that hour).
    pub fn forget(&mut self, start_ns: u64, path: &Path) -> Result<(), StoreError> {
        let hour = start_ns - start_ns % HOUR_NS;
        let data_dir = self.data_dir.clone();
        let index = self.hour(hour);
        let Some(pos) = index.entries.iter().position(|e| e.start_ns == start_ns) else { return Ok(()) };
        let now = std::fs::symlink_metadata(path).ok().map(|m| FileId::of(&m));
        if now == Some(index.entries[pos].file) {
            let c = count(path, &mut Vec::new())?;
            sub_cpus(&mut index.cpus, &c.cpus);
            index.entries.remove(pos);
            let index = index.clone();
            store(&data_dir, hour, &index)
        } else {
            self.hours.remove(&hour);
            match std::fs::remove_file(index_path(&data_dir, hour)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(StoreError::Io(index_path(&data_dir, hour), e))
                }
                _ => Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests;
