//! Appends samples to the store: buffers them per wall-clock second and, on each flush, writes
//! one block per second into that second's minute segment.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fs::{self, File, OpenOptions},
    io::{Read, Seek, SeekFrom, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    sync::Arc,
};

use super::{
    StoreError,
    format::{
        BlockData, BlockHeader, Blocks, CpuCount, FORMAT_VERSION, NS_PER_SEC, SEGMENT_HEADER_LEN,
        SEGMENT_NS, SegmentHeader, StoredStack, Tail, encode_block,
    },
    segment_path,
};
use crate::model::{Sample, Stack};

/// Samples of one second, interned into the block's dictionaries as they arrive.
#[derive(Default)]
struct BlockBuilder {
    strings: Vec<Arc<str>>,
    string_ids: HashMap<Arc<str>, u32>,
    stacks: Vec<StoredStack>,
    stack_ids: HashMap<Arc<Stack>, u32>,
    /// (ts, cpu, pid, tid, comm, cgroup, stack)
    rows: Vec<(u64, u32, u32, u32, u32, u64, u32)>,
    idle: BTreeMap<u32, u64>,
}

impl BlockBuilder {
    fn intern(&mut self, s: &Arc<str>) -> u32 {
        if let Some(&id) = self.string_ids.get(s) {
            return id;
        }
        let id = self.strings.len() as u32;
        self.strings.push(s.clone());
        self.string_ids.insert(s.clone(), id);
        id
    }

    fn push(&mut self, s: &Sample) {
        let stack = match self.stack_ids.get(&s.stack) {
            Some(&id) => id,
            None => {
                let frames = s.stack.frames.iter().map(|f| self.intern(f)).collect();
                let id = self.stacks.len() as u32;
                self.stacks.push(StoredStack {
                    frames,
                    user_len: s.stack.user_len as u32,
                });
                self.stack_ids.insert(s.stack.clone(), id);
                id
            }
        };
        let comm = self.intern(&s.comm);
        self.rows
            .push((s.ts_ns, s.cpu, s.pid, s.tid, comm, s.cgroup_id, stack));
    }

    fn finish(mut self, start_ns: u64, lost: Vec<CpuCount>) -> (BlockHeader, Vec<u8>) {
        self.rows.sort_unstable_by_key(|r| r.0);
        let mut data = BlockData {
            strings: self.strings.iter().map(|s| s.to_string()).collect(),
            stacks: self.stacks,
            idle: self
                .idle
                .iter()
                .map(|(&cpu, &count)| CpuCount { cpu, count })
                .collect(),
            lost,
            ..Default::default()
        };
        let mut prev = start_ns;
        for &(ts, cpu, pid, tid, comm, cgroup, stack) in &self.rows {
            data.ts_delta.push(ts - prev);
            prev = ts;
            data.cpu.push(cpu);
            data.pid.push(pid);
            data.tid.push(tid);
            data.comm.push(comm);
            data.cgroup.push(cgroup);
            data.stack.push(stack);
        }
        let payload = data.encode();
        let header = BlockHeader {
            payload_len: payload.len() as u32,
            start_ns,
            end_ns: start_ns + NS_PER_SEC,
            samples: self.rows.len() as u32,
            idle: self.idle.values().sum::<u64>() as u32,
        };
        (header, payload)
    }
}

/// What one flush wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Flushed {
    pub blocks: usize,
    pub samples: u64,
    pub idle: u64,
    pub bytes: u64,
}

pub struct StoreWriter {
    dir: PathBuf,
    pending: BTreeMap<u64, BlockBuilder>,
    lost: BTreeMap<u32, u64>,
    /// Segments checked for a torn tail since this writer started.
    recovered: HashSet<u64>,
}

impl StoreWriter {
    /// `dir` is the store's segment directory; it must exist.
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            pending: BTreeMap::new(),
            lost: BTreeMap::new(),
            recovered: HashSet::new(),
        }
    }

    pub fn push(&mut self, sample: &Sample) {
        self.pending
            .entry(sample.ts_ns / NS_PER_SEC)
            .or_default()
            .push(sample);
    }

    pub fn push_idle(&mut self, ts_ns: u64, cpu: u32) {
        *self
            .pending
            .entry(ts_ns / NS_PER_SEC)
            .or_default()
            .idle
            .entry(cpu)
            .or_default() += 1;
    }

    /// Samples the kernel side dropped; recorded with the next block written.
    pub fn add_lost(&mut self, cpu: u32, count: u64) {
        if count > 0 {
            *self.lost.entry(cpu).or_default() += count;
        }
    }

    /// Samples buffered and not yet written.
    pub fn pending_samples(&self) -> usize {
        self.pending
            .values()
            .map(|b| b.rows.len() + b.idle.len())
            .sum()
    }

    /// Writes everything buffered. `now_ns` places lost counts when no sample is pending.
    pub fn flush(&mut self, now_ns: u64) -> Result<Flushed, StoreError> {
        if self.pending.is_empty() && !self.lost.is_empty() {
            self.pending
                .insert(now_ns / NS_PER_SEC, BlockBuilder::default());
        }
        let mut flushed = Flushed::default();
        let last = self.pending.keys().next_back().copied();
        let mut by_segment: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        for (second, block) in std::mem::take(&mut self.pending) {
            let lost = if Some(second) == last {
                std::mem::take(&mut self.lost)
                    .into_iter()
                    .map(|(cpu, count)| CpuCount { cpu, count })
                    .collect()
            } else {
                Vec::new()
            };
            let (header, payload) = block.finish(second * NS_PER_SEC, lost);
            flushed.blocks += 1;
            flushed.samples += u64::from(header.samples);
            flushed.idle += u64::from(header.idle);
            let segment = second * NS_PER_SEC / SEGMENT_NS * SEGMENT_NS;
            by_segment
                .entry(segment)
                .or_default()
                .extend(encode_block(&header, &payload));
        }
        for (segment, bytes) in by_segment {
            self.append(segment, &bytes)?;
            flushed.bytes += bytes.len() as u64;
        }
        Ok(flushed)
    }

    /// Appends whole blocks to a segment with one `write`, so readers see all or a torn tail.
    fn append(&mut self, segment_start: u64, bytes: &[u8]) -> Result<(), StoreError> {
        let path = segment_path(&self.dir, segment_start);
        let io = |e| StoreError::Io(path.clone(), e);
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            file.write_all(
                &SegmentHeader {
                    version: FORMAT_VERSION,
                    start_ns: segment_start,
                }
                .encode(),
            )
            .map_err(io)?;
        } else if self.recovered.insert(segment_start) {
            recover(&path, &mut file, segment_start)?;
        }
        file.write_all(bytes).map_err(io)
    }
}

/// Cuts a torn tail (left by a writer that was killed mid-write) off a segment before more
/// blocks are appended after it.
fn recover(path: &Path, file: &mut File, segment_start: u64) -> Result<(), StoreError> {
    let io = |e| StoreError::Io(path.to_path_buf(), e);
    let mut data = Vec::new();
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    file.read_to_end(&mut data).map_err(io)?;
    if let Err(e) = SegmentHeader::decode(&data) {
        // Not ours to repair: set it aside and start the minute afresh.
        let aside = path.with_extension("corrupt");
        log::warn!("{}: {e}; moved to {}", path.display(), aside.display());
        fs::rename(path, &aside).map_err(io)?;
        *file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        let header = SegmentHeader {
            version: FORMAT_VERSION,
            start_ns: segment_start,
        };
        return file.write_all(&header.encode()).map_err(io);
    }
    let mut blocks = Blocks::new(&data);
    blocks.by_ref().for_each(drop);
    let valid = blocks.valid_len().max(SEGMENT_HEADER_LEN);
    if valid < data.len() {
        let what = match blocks.tail() {
            Some(Tail::Corrupt { reason, .. }) => reason,
            _ => "incomplete block",
        };
        log::warn!(
            "{}: cut {} bytes after offset {valid} ({what}), left by an earlier run that stopped mid-write",
            path.display(),
            data.len() - valid
        );
        file.set_len(valid as u64).map_err(io)?;
    }
    Ok(())
}
