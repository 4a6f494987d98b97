//! Tiering: segments older than a threshold are rewritten as 10-second aggregates (stack →
//! count per CPU and process), which keep flamegraphs of old windows and drop subsecond detail.
//! The rewrite goes to a temporary file renamed over the segment, so a reader sees either the
//! old file or the new one, and a crash leaves the old one.

use std::{
    collections::{BTreeMap, HashMap},
    io::Write,
    os::unix::fs::OpenOptionsExt,
    path::Path,
};

use super::{
    StoreError,
    format::{
        BlockHeader, Blocks, CpuCounts, Dict, DictDelta, FLAG_IDENTITY, FLAG_RESET_DICT, FLAG_ROLLUP, FORMAT_VERSION,
        NS_PER_SEC, NodeLocations, SampleColumns, SegmentHeader, Summary, encode_block, pack,
    },
};

/// Span of one rollup block.
pub const ROLLUP_NS: u64 = 10 * NS_PER_SEC;

/// Whether a segment's first block is a rollup block (rolled segments are never rolled again).
pub fn is_rolled_up(data: &[u8]) -> bool {
    Blocks::new(data).find(|(h, _)| h.flags & FLAG_IDENTITY == 0).is_some_and(|(h, _)| h.flags & FLAG_ROLLUP != 0)
}

/// [`is_rolled_up`] from the block headers at the start of the file, without reading the rest:
/// a store of a week holds thousands of rolled-up minutes, and a daemon that starts again must
/// not read each whole to find the few that are not. `None`: no block to tell by yet.
pub fn is_rolled_up_file(path: &Path) -> std::io::Result<Option<bool>> {
    use std::os::unix::fs::FileExt;

    use super::format::{BLOCK_HEADER_LEN, SEGMENT_HEADER_LEN};
    let f = super::files::open_regular(path)?;
    let mut offset = SEGMENT_HEADER_LEN as u64;
    let mut head = [0u8; BLOCK_HEADER_LEN];
    // An identity block comes first in a segment, sometimes two (a restart within the minute).
    for _ in 0..8 {
        if f.read_exact_at(&mut head, offset).is_err() {
            return Ok(None);
        }
        let h = super::format::BlockHeader::decode(&head);
        if h.flags & FLAG_IDENTITY == 0 {
            return Ok(Some(h.flags & FLAG_ROLLUP != 0));
        }
        offset += (BLOCK_HEADER_LEN + h.body_len()) as u64;
    }
    Ok(None)
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RolledUp {
    pub samples: u64,
    pub rows: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// Builds the rolled-up segment's dictionary from the raw one's, node by node.
#[derive(Default)]
struct Interner {
    delta: DictDelta,
    locations: NodeLocations,
    strings: HashMap<String, u32>,
    nodes: HashMap<(u32, u32, u32, u64), u32>,
    /// Raw node → new node, for the raw dictionary in use (cleared when it resets).
    memo: HashMap<u32, u32>,
}

impl Interner {
    fn string(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.strings.get(s) {
            return id;
        }
        let id = self.strings.len() as u32;
        self.strings.insert(s.to_string(), id);
        self.delta.strings.push(s.to_string());
        id
    }

    fn node(&mut self, dict: &Dict, old: u32) -> u32 {
        // The raw ancestors not mapped yet, leaf first (parents have smaller ids: this ends).
        let mut chain = Vec::new();
        let mut o = old;
        while o != 0 && !self.memo.contains_key(&o) {
            chain.push(o);
            o = dict.nodes[o as usize].parent;
        }
        let mut parent = if o == 0 { 0 } else { self.memo[&o] };
        for &raw in chain.iter().rev() {
            let n = dict.nodes[raw as usize];
            let frame = self.string(&dict.strings[n.frame as usize]) * 2 + u32::from(n.kernel);
            let l = dict.locations.get(raw as usize).copied().unwrap_or_default();
            let file = if l.file == 0 { 0 } else { self.string(dict.file(l)) + 1 };
            let next = self.nodes.len() as u32 + 1;
            parent = *self.nodes.entry((parent, frame, file, l.addr)).or_insert_with(|| {
                self.delta.parent_delta.push(next - parent);
                self.delta.frame.push(frame);
                self.locations.file.push(file);
                self.locations.addr.push(l.addr);
                next
            });
            self.memo.insert(raw, parent);
        }
        parent
    }
}

/// (cpu, pid, comm, cgroup, stack, workload) in the new dictionary (workload: `None` when the
/// samples record none).
type Key = (u32, u32, u32, u64, u32, Option<u32>);

#[derive(Default)]
struct Window {
    counts: BTreeMap<Key, u64>,
    cpus: BTreeMap<u32, CpuCounts>,
    /// Busy samples in softirq context per CPU (`Summary::softirq`).
    softirq: BTreeMap<u32, u64>,
}

/// Rewrites one raw segment as rollup blocks. Returns `None` if it was rolled up already.
pub fn rollup_segment(path: &Path) -> Result<Option<RolledUp>, StoreError> {
    rollup_segment_with(path, &mut || Ok(()))
}

/// [`rollup_segment`], calling `before_replace` just before the rewritten file replaces the
/// segment (the index lets go of the segment there); if it fails, the segment stays as it was.
pub fn rollup_segment_with(
    path: &Path,
    before_replace: &mut dyn FnMut() -> Result<(), StoreError>,
) -> Result<Option<RolledUp>, StoreError> {
    let io = |e| StoreError::Io(path.to_path_buf(), e);
    let data = super::files::read_segment(path).map_err(io)?;
    let header = match SegmentHeader::decode(&data) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "segment not rolled up: it does not decode");
            return Ok(None);
        }
    };
    if is_rolled_up(&data) {
        return Ok(None);
    }
    let mut dict = Dict::default();
    let mut interner = Interner::default();
    // Windows are keyed by the identity they were recorded under too, so ten seconds that
    // span a restart at another frequency stay two blocks, each with its own identity.
    let mut identities: Vec<Vec<u8>> = Vec::new();
    let mut windows: BTreeMap<(usize, u64), Window> = BTreeMap::new();
    let mut stats = RolledUp { bytes_before: data.len() as u64, ..Default::default() };
    for (h, sections) in Blocks::new(&data) {
        if h.flags & FLAG_IDENTITY != 0 {
            identities.push(sections.dict.to_vec());
            continue;
        }
        if h.flags & FLAG_RESET_DICT != 0 {
            interner.memo.clear();
        }
        let decoded = dict.apply(&h, sections.dict).and_then(|()| {
            let summary = super::format::unpack_summary(sections.summary)?;
            let cols = super::format::unpack_samples(sections.samples, super::format::samples_bound(&h))?;
            cols.validate(dict.strings.len(), dict.nodes.len())?;
            Ok((summary, cols))
        });
        let (summary, cols) = match decoded {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "segment not rolled up: it does not decode");
                return Ok(None);
            }
        };
        let w = windows.entry((identities.len(), h.start_ns / ROLLUP_NS * ROLLUP_NS)).or_default();
        for &(cpu, n) in &summary.softirq {
            *w.softirq.entry(cpu).or_default() += n;
        }
        for c in summary.cpus {
            let e = w.cpus.entry(c.cpu).or_insert(CpuCounts { cpu: c.cpu, ..Default::default() });
            e.busy += c.busy;
            e.kernel += c.kernel;
            e.idle += c.idle;
            e.lost += c.lost;
        }
        for i in 0..cols.len() {
            let comm = interner.string(&dict.strings[cols.comm[i] as usize]);
            let stack = interner.node(&dict, cols.stack[i]);
            let workload = cols.workload(i).map(|s| interner.string(&dict.strings[s as usize]));
            let key = (cols.cpu[i], cols.pid[i], comm, cols.cgroup[i], stack, workload);
            *w.counts.entry(key).or_default() += cols.count(i);
            stats.samples += cols.count(i);
        }
    }
    let mut out = SegmentHeader { version: FORMAT_VERSION, start_ns: header.start_ns }.encode().to_vec();
    let mut written_identity = 0;
    // Interned before the first block goes out: it carries the whole dictionary.
    let no_workload = windows.values().any(|w| w.counts.keys().any(|k| k.5.is_some())).then(|| interner.string(""));
    for (i, ((identity, start), w)) in windows.into_iter().enumerate() {
        if identity != written_identity {
            written_identity = identity;
            let h = BlockHeader { flags: FLAG_IDENTITY, start_ns: start, end_ns: start + 1, ..Default::default() };
            let (summary, cols) = (Summary::default(), SampleColumns::default());
            out.extend(encode_block(&h, &identities[identity - 1], &pack(&summary), &pack(&cols)));
        }
        let mut cols = SampleColumns::default();
        let mut total = 0u64;
        // Rows without a workload get the empty string when others in the block have one.
        let has_workloads = w.counts.keys().any(|k| k.5.is_some());
        for ((cpu, pid, comm, cgroup, stack, workload), count) in w.counts {
            total = total.saturating_add(count);
            if let (true, Some(none)) = (has_workloads, no_workload) {
                cols.workload.push(workload.unwrap_or(none));
            }
            cols.cpu.push(cpu);
            cols.pid.push(pid);
            cols.comm.push(comm);
            cols.cgroup.push(cgroup);
            cols.stack.push(stack);
            cols.count.push(count);
        }
        let n = cols.cpu.len();
        cols.ts_delta_us = vec![0; n];
        cols.tid = vec![0; n];
        stats.rows += n as u64;
        let h = BlockHeader {
            flags: FLAG_ROLLUP | if i == 0 { FLAG_RESET_DICT } else { 0 },
            start_ns: start,
            end_ns: start + ROLLUP_NS,
            samples: total.min(u64::from(u32::MAX)) as u32,
            idle: w.cpus.values().map(|c| c.idle).sum::<u64>().min(u64::from(u32::MAX)) as u32,
            ..Default::default()
        };
        let summary = Summary {
            cpus: w.cpus.into_values().collect(),
            buckets: Vec::new(),
            softirq: w.softirq.into_iter().collect(),
        };
        // The whole dictionary goes with the first block; later blocks add nothing.
        let dict_section = match i {
            0 if interner.locations.file.iter().any(|&f| f != 0) => pack(&(&interner.delta, &interner.locations)),
            0 => pack(&interner.delta),
            _ => pack(&DictDelta::default()),
        };
        out.extend(encode_block(&h, &dict_section, &pack(&summary), &pack(&cols)));
    }
    let tmp = path.with_extension("rollup.tmp");
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        f.write_all(&out)?;
        f.sync_all()
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(StoreError::Io(tmp, e));
    }
    if let Err(e) = before_replace() {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    stats.bytes_after = out.len() as u64;
    Ok(Some(stats))
}
