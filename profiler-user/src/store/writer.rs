//! Appends samples to the store: buffers them per wall-clock second and, on each flush, writes
//! one block per second into that second's minute segment.
//!
//! Memory stays bounded whatever the rate and the number of distinct stacks: samples wait at
//! most one flush interval (or, while writing fails, up to `max_pending` rows, oldest dropped
//! first), and each segment's dictionary is capped: past `dict_cap` entries the next block
//! starts the dictionary over (`FLAG_RESET_DICT`).

use std::{
    collections::BTreeMap,
    fs::{self, File},
    io::{Read, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
    sync::Arc,
};

use std::hash::BuildHasher;

use hashbrown::{HashTable, hash_table};
use rustc_hash::{FxBuildHasher, FxHashMap};

use super::identity::Identity;
use super::{
    StoreError,
    format::{
        BUCKET_NS, BUCKETS_PER_SEC, BlockHeader, Blocks, CpuCounts, FLAG_RESET_DICT, FORMAT_VERSION, NS_PER_SEC,
        NS_PER_US, NodeLocations, SEGMENT_HEADER_LEN, SEGMENT_NS, SampleColumns, SegmentHeader, Summary, Tail,
        encode_block, pack,
    },
    segment_path,
};
use crate::model::{Sample, Stack};

/// Bounds on the writer's memory.
#[derive(Debug, Clone, Copy)]
pub struct WriterLimits {
    /// Dictionary entries (strings + stacks) per segment before it starts over.
    pub dict_cap: usize,
    /// Samples held while writing fails; beyond it the oldest seconds are dropped.
    pub max_pending: usize,
}

impl Default for WriterLimits {
    fn default() -> Self {
        Self { dict_cap: 200_000, max_pending: 2_000_000 }
    }
}

struct Row {
    ts_ns: u64,
    cpu: u32,
    pid: u32,
    tid: u32,
    cgroup: u64,
    comm: Arc<str>,
    stack: Arc<Stack>,
    workload: Arc<str>,
    /// Samples the row stands for (1 for a CPU sample; a CUDA store's launches, ns or bytes).
    count: u64,
}

/// One second of samples, waiting for the next flush.
#[derive(Default)]
struct Second {
    rows: Vec<Row>,
    idle: BTreeMap<u32, u64>,
    /// Samples lost in this second, per CPU ([`StoreWriter::add_lost_at`]).
    lost: BTreeMap<u32, u64>,
}

/// A block's new dictionary entries as the writer makes them: packed, the same bytes as the
/// [`DictDelta`](super::format::DictDelta) readers read, the names shared with the symbolizer
/// rather than copied (a copy per new name was 4 % of the daemon's CPU per Python sample).
#[derive(Default, serde::Serialize)]
struct NewEntries {
    strings: Vec<Arc<str>>,
    parent_delta: Vec<u32>,
    frame: Vec<u32>,
}

/// The dictionary of the segment being appended to.
#[derive(Default)]
struct SegmentDict {
    /// (hash of the text, text, id). The hash is kept so that the table grows without reading
    /// every name again (a minute's names, cold by then: 1.4 % of the daemon's CPU per Python
    /// sample), and a name new to the segment is hashed once.
    strings: HashTable<(u64, Arc<str>, u32)>,
    /// By allocation, for the `Arc`s that are held by `strings` (which keeps them, so an address
    /// cannot be reused while it is here): the symbolizer hands out one `Arc` per name, so a
    /// stack named again finds its names without hashing or comparing their bytes.
    string_ptrs: FxHashMap<usize, u32>,
    /// A node's path (see [`path_hash`]) → node; node 0 is the empty stack.
    nodes: FxHashMap<u128, u32>,
    /// A stack's frames as (path hash, frame, file, address), built in place between stacks.
    path: Vec<(u128, u32, u32, u64)>,
    /// By allocation: the symbolizer hands out one `Arc` per distinct stack, so this is the
    /// common hit. A `Weak` keeps the allocation (not the frames), so its address cannot be
    /// reused by another stack while it is here, and a stack the symbolizer forgot costs ~100
    /// bytes here, not its frames.
    stacks_by_ptr: FxHashMap<usize, (std::sync::Weak<Stack>, u32)>,
    /// The next block must reset readers' dictionaries (first block this writer writes here).
    reset: bool,
    /// Bytes of the strings, nodes and stacks it holds (the names are what a user shapes:
    /// 500-byte JIT names in 126-frame stacks), against [`DICT_MAX_BYTES`].
    bytes: usize,
}

/// Bytes a segment's dictionary may hold before it starts over, whatever its entry count:
/// about a minute of the most varied stacks a node makes, and a bound on what a user's names
/// cost the daemon.
pub const DICT_MAX_BYTES: usize = 8 << 20;

impl SegmentDict {
    /// A segment's dictionary, its tables sized as `like`'s (the last segment's) ended: grown
    /// from empty, every minute rehashed each table several times over.
    fn new(like: Option<&SegmentDict>) -> Self {
        let mut d = Self { reset: true, ..Default::default() };
        if let Some(l) = like {
            d.strings.reserve(l.strings.len(), |e| e.0);
            d.string_ptrs.reserve(l.string_ptrs.len());
            d.nodes.reserve(l.nodes.len());
            d.stacks_by_ptr.reserve(l.stacks_by_ptr.len());
        }
        d
    }

    fn entries(&self) -> usize {
        self.strings.len() + self.nodes.len()
    }

    fn string(&mut self, s: &Arc<str>, delta: &mut NewEntries) -> u32 {
        let ptr = Arc::as_ptr(s).cast::<u8>() as usize;
        if let Some(&id) = self.string_ptrs.get(&ptr) {
            return id;
        }
        let hash = FxBuildHasher.hash_one(&**s);
        let id = self.strings.len() as u32;
        match self.strings.entry(hash, |e| e.0 == hash && *e.1 == **s, |e| e.0) {
            hash_table::Entry::Occupied(e) => return e.get().2,
            hash_table::Entry::Vacant(e) => {
                e.insert((hash, s.clone(), id));
            }
        }
        self.string_ptrs.insert(ptr, id);
        // The map and the delta hold the name (shared with the symbolizer until it forgets
        // it), the pointer map a slot. Counted twice, as when the delta held a copy: counting
        // it once let a Python node's minute fit without the dictionary starting over, for
        // 1.5 % fewer store bytes, no less CPU and 7 MiB more RSS.
        self.bytes += 2 * s.len() + 64;
        delta.strings.push(s.clone());
        id
    }

    /// The leaf node of a stack, adding the nodes it lacks.
    fn stack(&mut self, s: &Arc<Stack>, delta: &mut NewEntries, locations: &mut NodeLocations) -> u32 {
        let ptr = Arc::as_ptr(s) as usize;
        if let Some((_, id)) = self.stacks_by_ptr.get(&ptr) {
            return *id;
        }
        // Two passes. First each frame's ids and path hash, then the nodes: a node is found by
        // its path's hash, not by its parent's id, so the lookups of one stack do not wait for
        // one another. Chained on the parent's id, each waited for the cache miss of the one
        // before: a third of a Python node's daemon CPU went to those waits.
        let mut path = std::mem::take(&mut self.path);
        path.clear();
        // Frames that the interpreter runs share its file: looked up once.
        let mut last_file: Option<(usize, u32)> = None;
        // The ids first, the hashes after: each id is a lookup of its own (a cache miss in a
        // busy minute's table), and with the hash chain out of the loop several are in flight
        // at once.
        for (i, f) in s.frames.iter().enumerate() {
            let frame = self.string(f, delta) * 2 + u32::from(i >= s.user_len);
            let (file, addr) = match s.locations.get(i).filter(|l| i < s.user_len && !l.file.is_empty()) {
                Some(l) => {
                    let p = Arc::as_ptr(&l.file).cast::<u8>() as usize;
                    let id = match last_file {
                        Some((q, id)) if q == p => id,
                        _ => self.string(&l.file, delta),
                    };
                    last_file = Some((p, id));
                    (id + 1, l.addr)
                }
                None => (0, 0),
            };
            path.push((0, frame, file, addr));
        }
        let mut hash = 0u128;
        for (h, frame, file, addr) in path.iter_mut() {
            hash = path_hash(hash, *frame, *file, *addr);
            *h = hash;
        }
        let mut node = 0u32;
        let added = self.nodes.len();
        for &(hash, frame, file, addr) in &path {
            let next = self.nodes.len() as u32 + 1;
            node = *self.nodes.entry(hash).or_insert_with(|| {
                delta.parent_delta.push(next - node);
                delta.frame.push(frame);
                locations.file.push(file);
                locations.addr.push(addr);
                next
            });
        }
        self.path = path;
        // A node is a map slot; a stack its slot and the allocation its `Weak` keeps.
        self.bytes += (self.nodes.len() - added) * 40 + 128;
        self.stacks_by_ptr.insert(ptr, (Arc::downgrade(s), node));
        node
    }
}

/// The hash of a node's path: its parent's path hash, its frame (string id × 2 + kernel), its
/// file (string id + 1, or 0) and address. 128-bit XXH3: two paths of one segment sharing a
/// hash is a 2^-128 chance per pair (10^-29 for the 10^5 nodes of a busy minute), the chance the
/// stack cache takes too.
fn path_hash(parent: u128, frame: u32, file: u32, addr: u64) -> u128 {
    let mut bytes = [0u8; 32];
    bytes[..16].copy_from_slice(&parent.to_le_bytes());
    bytes[16..20].copy_from_slice(&frame.to_le_bytes());
    bytes[20..24].copy_from_slice(&file.to_le_bytes());
    bytes[24..].copy_from_slice(&addr.to_le_bytes());
    xxhash_rust::xxh3::xxh3_128(&bytes)
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
    limits: WriterLimits,
    pending: BTreeMap<u64, Second>,
    pending_rows: usize,
    lost: BTreeMap<u32, u64>,
    /// Dictionaries of the segments written recently, by segment start.
    dicts: BTreeMap<u64, SegmentDict>,
    /// Samples dropped because writing failed for longer than `max_pending` allows.
    dropped: u64,
    /// How the samples are being recorded; written as an identity block before this writer's
    /// first block in each segment, and again after it changes (`None`: no identity blocks).
    identity: Option<Identity>,
    /// Segments that hold the current identity already.
    identity_written: std::collections::BTreeSet<u64>,
}

impl StoreWriter {
    /// `dir` is the store's segment directory; it must exist.
    pub fn new(dir: &Path) -> Self {
        Self::with_limits(dir, WriterLimits::default())
    }

    pub fn with_limits(dir: &Path, limits: WriterLimits) -> Self {
        Self {
            dir: dir.to_path_buf(),
            limits,
            pending: BTreeMap::new(),
            pending_rows: 0,
            lost: BTreeMap::new(),
            dicts: BTreeMap::new(),
            dropped: 0,
            identity: None,
            identity_written: Default::default(),
        }
    }

    /// Records `identity` with the blocks this writer writes (see `store::identity`).
    pub fn with_identity(mut self, identity: Identity) -> Self {
        self.identity = Some(identity);
        self
    }

    /// The online CPUs changed (hotplug): the next blocks carry the new set.
    pub fn set_online_cpus(&mut self, cpus: &[u32]) {
        let Some(id) = self.identity.as_mut() else { return };
        let list = super::identity::format_cpu_list(cpus);
        if id.online_cpus != list {
            id.online_cpus = list;
            self.identity_written.clear();
        }
    }

    pub fn push(&mut self, s: &Sample) {
        self.push_weighted(s, 1);
    }

    /// A row standing for `count` samples (a CUDA store's launches, nanoseconds or bytes).
    pub fn push_weighted(&mut self, s: &Sample, count: u64) {
        self.pending.entry(s.ts_ns / NS_PER_SEC).or_default().rows.push(Row {
            ts_ns: s.ts_ns,
            cpu: s.cpu,
            pid: s.pid,
            tid: s.tid,
            cgroup: s.cgroup_id,
            comm: s.comm.clone(),
            stack: s.stack.clone(),
            workload: s.workload.clone(),
            count,
        });
        self.pending_rows += 1;
        if self.pending_rows > self.limits.max_pending {
            self.drop_oldest();
        }
    }

    pub fn push_idle(&mut self, ts_ns: u64, cpu: u32) {
        *self.pending.entry(ts_ns / NS_PER_SEC).or_default().idle.entry(cpu).or_default() += 1;
    }

    /// Idle samples of a second (unix seconds), counted elsewhere (a copy of a store).
    pub fn add_idle_at(&mut self, second: u64, cpu: u32, count: u64) {
        if count > 0 {
            *self.pending.entry(second).or_default().idle.entry(cpu).or_default() += count;
        }
    }

    /// Samples the kernel side dropped; recorded with the next block written.
    pub fn add_lost(&mut self, cpu: u32, count: u64) {
        if count > 0 {
            *self.lost.entry(cpu).or_default() += count;
        }
    }

    /// Samples lost in a known second (unix seconds): recorded in that second's block, so a
    /// window's `lost` says when the loss happened, not when it was noticed.
    pub fn add_lost_at(&mut self, second: u64, cpu: u32, count: u64) {
        if count > 0 {
            *self.pending.entry(second).or_default().lost.entry(cpu).or_default() += count;
        }
    }

    /// Non-idle samples buffered and not yet written.
    pub fn pending_samples(&self) -> usize {
        self.pending_rows
    }

    /// The time of the oldest sample buffered and not yet written (wall-clock ns).
    pub fn oldest_pending_ns(&self) -> Option<u64> {
        let (second, s) = self.pending.first_key_value()?;
        Some(s.rows.iter().map(|r| r.ts_ns).min().unwrap_or(second * NS_PER_SEC))
    }

    /// Samples dropped so far because they could not be written in time.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    fn drop_oldest(&mut self) {
        while self.pending_rows > self.limits.max_pending {
            let Some((_, second)) = self.pending.pop_first() else { break };
            self.pending_rows -= second.rows.len();
            self.dropped += second.rows.len() as u64 + second.idle.values().sum::<u64>();
        }
    }

    /// Writes everything buffered. On failure nothing buffered is lost: it is written by a
    /// later flush (memory permitting). `now_ns` places lost counts when no sample is pending.
    pub fn flush(&mut self, now_ns: u64) -> Result<Flushed, StoreError> {
        self.flush_before(now_ns, u64::MAX)
    }

    /// [`Self::flush`], keeping the seconds from `hold_from` (unix seconds) on: a second still
    /// in progress is written whole by a later flush, as one block instead of one per flush.
    pub fn flush_before(&mut self, now_ns: u64, hold_from: u64) -> Result<Flushed, StoreError> {
        if self.pending.range(..hold_from).next().is_none() && !self.lost.is_empty() {
            self.pending.insert((now_ns / NS_PER_SEC).min(hold_from.saturating_sub(1)), Second::default());
        }
        let mut flushed = Flushed::default();
        let last = self.pending.range(..hold_from).next_back().map(|(s, _)| *s);
        // Seconds grouped by segment, in time order.
        let mut groups: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for &second in self.pending.range(..hold_from).map(|(s, _)| s) {
            groups.entry(second * NS_PER_SEC / SEGMENT_NS * SEGMENT_NS).or_default().push(second);
        }
        for (segment, seconds) in groups {
            // Retention may have removed the file since: its dictionary went with it.
            if !segment_path(&self.dir, segment).exists() {
                self.dicts.remove(&segment);
            }
            let known = self.dicts.contains_key(&segment);
            let mut dict = match self.dicts.remove(&segment) {
                Some(d) if d.entries() < self.limits.dict_cap && d.bytes < DICT_MAX_BYTES => d,
                _ => SegmentDict::new(self.dicts.values().next_back()),
            };
            let mut bytes = Vec::new();
            if let Some(id) = &self.identity
                && (!known || !self.identity_written.contains(&segment))
            {
                bytes.extend(id.encode_block(seconds[0] * NS_PER_SEC));
            }
            let mut stats = Flushed::default();
            for &second in &seconds {
                let pending = &self.pending[&second];
                let mut lost = pending.lost.clone();
                if Some(second) == last {
                    for (&cpu, &n) in &self.lost {
                        *lost.entry(cpu).or_default() += n;
                    }
                }
                let block = encode_second(pending, second * NS_PER_SEC, &mut dict, Some(&lost));
                stats.blocks += 1;
                stats.samples += u64::from(block.1.samples);
                stats.idle += u64::from(block.1.idle);
                bytes.extend(block.0);
            }
            // On failure the dictionary may hold entries no reader will see: drop it, so the
            // next attempt starts the segment's dictionary over.
            self.append(segment, &bytes, !known)?;
            self.dicts.insert(segment, dict);
            if self.identity.is_some() {
                self.identity_written.insert(segment);
            }
            for second in seconds {
                if let Some(s) = self.pending.remove(&second) {
                    self.pending_rows -= s.rows.len();
                }
                if Some(second) == last {
                    self.lost.clear();
                }
            }
            flushed.blocks += stats.blocks;
            flushed.samples += stats.samples;
            flushed.idle += stats.idle;
            flushed.bytes += bytes.len() as u64;
        }
        // Only the newest segments receive samples; keep their dictionaries, no more.
        while self.dicts.len() > 2 {
            self.dicts.pop_first();
        }
        self.identity_written.retain(|s| self.dicts.contains_key(s));
        Ok(flushed)
    }

    /// Appends whole blocks to a segment with one `write`, so readers see all or a torn tail.
    /// A failed write (a full disk) is undone, so no torn block is left before later ones.
    fn append(&mut self, segment_start: u64, bytes: &[u8], first_time: bool) -> Result<(), StoreError> {
        let path = segment_path(&self.dir, segment_start);
        let io = |e| StoreError::Io(path.clone(), e);
        let mut file = super::files::open_append(&path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            let header = SegmentHeader { version: FORMAT_VERSION, start_ns: segment_start }.encode();
            if let Err(e) = file.write_all(&header) {
                let _ = file.set_len(0);
                return Err(io(e));
            }
        } else if first_time {
            recover(&path, &mut file, segment_start)?;
        }
        let before = file.metadata().map_err(io)?.len();
        if let Err(e) = file.write_all(bytes) {
            let _ = file.set_len(before);
            return Err(io(e));
        }
        Ok(())
    }
}

/// Encodes one second as a block, interning into the segment's dictionary.
fn encode_second(
    second: &Second,
    start_ns: u64,
    dict: &mut SegmentDict,
    lost: Option<&BTreeMap<u32, u64>>,
) -> (Vec<u8>, BlockHeader) {
    let mut delta = NewEntries::default();
    let mut locations = NodeLocations::default();
    let flags = if std::mem::take(&mut dict.reset) { FLAG_RESET_DICT } else { 0 };
    let mut order: Vec<&Row> = second.rows.iter().collect();
    order.sort_unstable_by_key(|r| (r.cpu, r.ts_ns));
    let n = order.len();
    let mut cols = SampleColumns {
        ts_delta_us: Vec::with_capacity(n),
        cpu: Vec::with_capacity(n),
        pid: Vec::with_capacity(n),
        tid: Vec::with_capacity(n),
        comm: Vec::with_capacity(n),
        cgroup: Vec::with_capacity(n),
        stack: Vec::with_capacity(n),
        count: Vec::new(),
        workload: Vec::new(),
    };
    // The columns are written only when a sample of the second has a workload or a weight.
    let workloads = order.iter().any(|r| !r.workload.is_empty());
    let weighted = order.iter().any(|r| r.count != 1);
    let mut cpus: BTreeMap<u32, CpuCounts> = BTreeMap::new();
    let mut softirq: BTreeMap<u32, u64> = BTreeMap::new();
    let mut buckets = vec![0u32; BUCKETS_PER_SEC];
    let mut prev: Option<(u32, u64)> = None;
    for r in order {
        let us = (r.ts_ns - start_ns) / NS_PER_US;
        let base = match prev {
            Some((cpu, t)) if cpu == r.cpu => t,
            _ => 0,
        };
        prev = Some((r.cpu, us));
        cols.ts_delta_us.push(us - base);
        cols.cpu.push(r.cpu);
        cols.pid.push(r.pid);
        cols.tid.push(r.tid);
        cols.comm.push(dict.string(&r.comm, &mut delta));
        cols.cgroup.push(r.cgroup);
        cols.stack.push(dict.stack(&r.stack, &mut delta, &mut locations));
        if workloads {
            cols.workload.push(dict.string(&r.workload, &mut delta));
        }
        if weighted {
            cols.count.push(r.count);
        }
        let w = r.count;
        let counts = cpus.entry(r.cpu).or_insert(CpuCounts { cpu: r.cpu, ..Default::default() });
        counts.busy += w;
        counts.kernel += w * u64::from(r.stack.user_len < r.stack.frames.len());
        if crate::exec_context::Context::of_stack(&r.stack).is_softirq() {
            *softirq.entry(r.cpu).or_default() += w;
        }
        let bucket = &mut buckets[(((r.ts_ns - start_ns) / BUCKET_NS) as usize).min(BUCKETS_PER_SEC - 1)];
        *bucket = bucket.saturating_add(u32::try_from(r.count).unwrap_or(u32::MAX));
    }
    for (&cpu, &count) in &second.idle {
        cpus.entry(cpu).or_insert(CpuCounts { cpu, ..Default::default() }).idle += count;
    }
    for (&cpu, &count) in lost.into_iter().flatten() {
        cpus.entry(cpu).or_insert(CpuCounts { cpu, ..Default::default() }).lost += count;
    }
    let header = BlockHeader {
        flags,
        start_ns,
        end_ns: start_ns + NS_PER_SEC,
        samples: if weighted {
            second.rows.iter().map(|r| r.count).fold(0u64, u64::saturating_add).min(u64::from(u32::MAX)) as u32
        } else {
            n as u32
        },
        idle: second.idle.values().sum::<u64>() as u32,
        ..Default::default()
    };
    let summary = Summary { cpus: cpus.into_values().collect(), buckets, softirq: softirq.into_iter().collect() };
    let dict_section = if locations.file.iter().all(|&f| f == 0) { pack(&delta) } else { pack(&(&delta, &locations)) };
    let bytes = encode_block(&header, &dict_section, &pack(&summary), &pack(&cols));
    (bytes, header)
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
        // Unique, so a second damaged file of the same minute does not replace the first;
        // retention removes these once they are older than its age limit.
        let aside = path.with_extension(format!("{}.corrupt", crate::timespec::now_ns() / 1_000_000_000));
        tracing::warn!(file = %path.display(), error = %e, moved_to = %aside.display(), "damaged segment set aside");
        fs::rename(path, &aside).map_err(io)?;
        *file = super::files::open_append(path).map_err(io)?;
        let header = SegmentHeader { version: FORMAT_VERSION, start_ns: segment_start };
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
        tracing::warn!(
            file = %path.display(),
            offset = valid,
            cut_bytes = data.len() - valid,
            reason = what,
            "segment tail cut: left by an earlier run that stopped mid-write"
        );
        file.set_len(valid as u64).map_err(io)?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "writer_tests.rs"]
mod tests;
