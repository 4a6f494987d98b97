//! The on-disk format, version 3. `docs/store.md` describes it for other readers.
//!
//! A segment file holds one wall-clock minute: a 24-byte header, then blocks appended as the
//! daemon flushes. A block covers one wall-clock second (a second may have several blocks: each
//! flush writes what arrived since the last) or, in a rolled-up segment, ten seconds.
//!
//! Each block has three separately compressed sections, so a reader decodes only what it needs:
//! - `dict`: the strings and stack nodes first used in this block. Ids are per segment: a block may
//!   use any entry of the blocks before it in the same file (unless it sets `FLAG_RESET_DICT`,
//!   which starts the dictionary over; the writer does so to bound its memory).
//! - `summary`: per-CPU busy/idle/lost counts and busy samples per 10 ms of the second, enough
//!   for status and subsecond heatmaps without touching the samples.
//! - `samples`: one column per field, sorted by CPU then time.
//!
//! Every block is written with a single `write` and carries a CRC-32 over its header and
//! sections, so a reader that races the writer, or opens a file whose writer was killed,
//! recognises a torn tail and stops there.

use serde::{Deserialize, Serialize};

/// Magic at the start of every segment file.
pub const SEGMENT_MAGIC: [u8; 8] = *b"PROFSEG\0";
/// Bumped on any incompatible change to segment, block or section layout.
pub const FORMAT_VERSION: u32 = 4;
/// The oldest version this build still reads (version 3 has no identity blocks).
pub const OLDEST_READABLE_VERSION: u32 = 3;
pub const SEGMENT_HEADER_LEN: usize = 24;
pub const BLOCK_MAGIC: [u8; 4] = *b"PBLK";
pub const BLOCK_HEADER_LEN: usize = 48;
/// Wall-clock span of one segment file.
pub const SEGMENT_NS: u64 = 60 * NS_PER_SEC;
pub const NS_PER_SEC: u64 = 1_000_000_000;
pub const NS_PER_US: u64 = 1_000;
/// Subsecond resolution of the per-block summary.
pub const BUCKETS_PER_SEC: usize = 100;
pub const BUCKET_NS: u64 = NS_PER_SEC / BUCKETS_PER_SEC as u64;

/// The block's dictionary starts over: ids count from 0 again.
pub const FLAG_RESET_DICT: u32 = 1 << 0;
/// A rolled-up block: samples carry counts and the block's start as their time.
pub const FLAG_ROLLUP: u32 = 1 << 1;
/// An identity block (format 4): how the blocks after it were recorded (see `store::identity`).
pub const FLAG_IDENTITY: u32 = 1 << 2;

/// Refuse to allocate for absurd lengths found in a corrupt header.
const MAX_SECTION: u32 = 256 << 20;
/// Decompressed sections larger than this are refused (a corrupt or hostile frame could
/// otherwise claim gigabytes: a 31 KB segment expanding to 1e9 entries killed the CLI at
/// 2 GiB). One second of 192 CPUs at 999 Hz decodes to about 15 MB.
const MAX_DECOMPRESSED: usize = 64 << 20;
/// Most frames a stored stack may have (the kernel side copies at most 127 + 127): a crafted
/// dictionary chaining a million nodes would otherwise fold into lines of megabytes.
pub const MAX_STACK_FRAMES: usize = 512;
/// Longest name a reader keeps (longer ones are cut): no real symbol comes near it, and a
/// crafted dictionary of huge names would make every query build gigabytes of text.
pub const MAX_NAME_BYTES: usize = 4096;

/// The most bytes a block's sample section may decode to, by what its header announces: a row
/// is at most 7 varints of 10 bytes and a count, so the header bounds the allocation.
pub fn samples_bound(header: &BlockHeader) -> usize {
    (header.samples as usize).saturating_mul(96).saturating_add(4096).min(MAX_DECOMPRESSED)
}

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("not a profiler segment (bad magic)")]
    BadMagic,
    #[error("segment format version {0}, this build reads versions {OLDEST_READABLE_VERSION} to {FORMAT_VERSION}")]
    Version(u32),
    #[error("file shorter than a segment header")]
    Short,
    #[error("block section does not decode: {0}")]
    Section(String),
    #[error("block refers to dictionary entries that do not exist")]
    DanglingId,
}

/// Segment file header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    pub version: u32,
    /// Start of the minute the segment covers, ns since the epoch.
    pub start_ns: u64,
}

impl SegmentHeader {
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_LEN] {
        let mut b = [0u8; SEGMENT_HEADER_LEN];
        b[..8].copy_from_slice(&SEGMENT_MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&(SEGMENT_HEADER_LEN as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.start_ns.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, FormatError> {
        if b.len() < SEGMENT_HEADER_LEN {
            return Err(FormatError::Short);
        }
        if b[..8] != SEGMENT_MAGIC {
            return Err(FormatError::BadMagic);
        }
        let version = u32::from_le_bytes(b[8..12].try_into().unwrap());
        if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(FormatError::Version(version));
        }
        Ok(Self { version, start_ns: u64::from_le_bytes(b[16..24].try_into().unwrap()) })
    }
}

/// Fixed-size block header (little endian): magic, flags, start_ns, end_ns, samples, idle,
/// dict_len, summary_len, samples_len, then a CRC-32 of the 44 bytes before it and the three
/// sections that follow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockHeader {
    pub flags: u32,
    /// The span the block covers: `[start_ns, end_ns)`.
    pub start_ns: u64,
    pub end_ns: u64,
    /// Non-idle samples in the block (in a rollup: the sum of counts).
    pub samples: u32,
    /// Idle samples in the block.
    pub idle: u32,
    pub dict_len: u32,
    pub summary_len: u32,
    pub samples_len: u32,
}

impl BlockHeader {
    fn encode_without_crc(&self) -> [u8; BLOCK_HEADER_LEN] {
        let mut b = [0u8; BLOCK_HEADER_LEN];
        b[..4].copy_from_slice(&BLOCK_MAGIC);
        b[4..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.start_ns.to_le_bytes());
        b[16..24].copy_from_slice(&self.end_ns.to_le_bytes());
        b[24..28].copy_from_slice(&self.samples.to_le_bytes());
        b[28..32].copy_from_slice(&self.idle.to_le_bytes());
        b[32..36].copy_from_slice(&self.dict_len.to_le_bytes());
        b[36..40].copy_from_slice(&self.summary_len.to_le_bytes());
        b[40..44].copy_from_slice(&self.samples_len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; BLOCK_HEADER_LEN]) -> Self {
        let le32 = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let le64 = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        Self {
            flags: le32(4),
            start_ns: le64(8),
            end_ns: le64(16),
            samples: le32(24),
            idle: le32(28),
            dict_len: le32(32),
            summary_len: le32(36),
            samples_len: le32(40),
        }
    }

    pub fn body_len(&self) -> usize {
        self.dict_len as usize + self.summary_len as usize + self.samples_len as usize
    }
}

fn crc(header: &[u8; BLOCK_HEADER_LEN], body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&header[..44]);
    h.update(body);
    h.finalize()
}

/// A block's three compressed sections, as they lie in the file.
#[derive(Debug, Clone, Copy)]
pub struct Sections<'a> {
    pub dict: &'a [u8],
    pub summary: &'a [u8],
    pub samples: &'a [u8],
}

/// Header and sections as one buffer, ready for a single `write`. The header's lengths are
/// filled in from the sections.
pub fn encode_block(header: &BlockHeader, dict: &[u8], summary: &[u8], samples: &[u8]) -> Vec<u8> {
    let header = BlockHeader {
        dict_len: dict.len() as u32,
        summary_len: summary.len() as u32,
        samples_len: samples.len() as u32,
        ..*header
    };
    let mut out = Vec::with_capacity(BLOCK_HEADER_LEN + header.body_len());
    out.extend_from_slice(&header.encode_without_crc());
    out.extend_from_slice(dict);
    out.extend_from_slice(summary);
    out.extend_from_slice(samples);
    let head: &[u8; BLOCK_HEADER_LEN] = out[..BLOCK_HEADER_LEN].try_into().unwrap();
    let sum = crc(head, &out[BLOCK_HEADER_LEN..]);
    out[44..48].copy_from_slice(&sum.to_le_bytes());
    out
}

/// What stopped a walk over a segment's blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tail {
    /// Clean end of file.
    Clean,
    /// A block runs past the end of the file: a write in progress, or one cut short by a
    /// crash. Expected; not an error.
    Incomplete { offset: usize },
    /// Bytes that are not a valid block: corruption.
    Corrupt { offset: usize, reason: &'static str },
}

/// Iterates over the valid blocks of a segment held in memory, then reports its [`Tail`].
pub struct Blocks<'a> {
    data: &'a [u8],
    offset: usize,
    tail: Option<Tail>,
}

impl<'a> Blocks<'a> {
    /// `data` is the whole file, header included.
    pub fn new(data: &'a [u8]) -> Self {
        Self { data, offset: SEGMENT_HEADER_LEN.min(data.len()), tail: None }
    }

    /// Valid once `next` returned `None`.
    pub fn tail(&self) -> Option<&Tail> {
        self.tail.as_ref()
    }

    /// Byte offset just past the last valid block.
    pub fn valid_len(&self) -> usize {
        self.offset
    }

    fn stop(&mut self, tail: Tail) -> Option<(BlockHeader, Sections<'a>)> {
        self.tail = Some(tail);
        None
    }
}

impl<'a> Iterator for Blocks<'a> {
    type Item = (BlockHeader, Sections<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.tail.is_some() {
            return None;
        }
        let data = self.data;
        let rest = &data[self.offset..];
        let offset = self.offset;
        if rest.is_empty() {
            return self.stop(Tail::Clean);
        }
        if rest.len() < BLOCK_HEADER_LEN {
            return self.stop(Tail::Incomplete { offset });
        }
        let head: &[u8; BLOCK_HEADER_LEN] = rest[..BLOCK_HEADER_LEN].try_into().unwrap();
        if head[..4] != BLOCK_MAGIC {
            return self.stop(Tail::Corrupt { offset, reason: "bad block magic" });
        }
        let header = BlockHeader::decode(head);
        if [header.dict_len, header.summary_len, header.samples_len].iter().any(|&l| l > MAX_SECTION) {
            return self.stop(Tail::Corrupt { offset, reason: "block length out of range" });
        }
        if header.end_ns <= header.start_ns || header.end_ns - header.start_ns > SEGMENT_NS {
            return self.stop(Tail::Corrupt { offset, reason: "block times out of range" });
        }
        let end = BLOCK_HEADER_LEN + header.body_len();
        if rest.len() < end {
            return self.stop(Tail::Incomplete { offset });
        }
        let body = &rest[BLOCK_HEADER_LEN..end];
        if crc(head, body) != u32::from_le_bytes(head[44..48].try_into().unwrap()) {
            return self.stop(Tail::Corrupt { offset, reason: "checksum mismatch" });
        }
        self.offset += end;
        let (dict, body) = body.split_at(header.dict_len as usize);
        let (summary, samples) = body.split_at(header.summary_len as usize);
        Some((header, Sections { dict, summary, samples }))
    }
}

/// Index of a string in the segment's dictionary.
pub type StrId = u32;

/// Stacks are nodes of a call tree (a trie of frames): node `i` is the stack of its parent
/// plus one frame. Node 0 is the empty stack, implicit in every dictionary; stored nodes count
/// from 1. Stacks that share a prefix share its nodes, which is most of a deep stack's bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DictDelta {
    pub strings: Vec<String>,
    /// Per new node: its id minus its parent's id (ids are assigned in order, so children
    /// created with their parent are 1 apart and compress well).
    pub parent_delta: Vec<u32>,
    /// Per new node: string id of its frame, times two, plus one for a kernel frame.
    pub frame: Vec<u32>,
}

/// Where the user frames of new nodes live (`model::Location`), in a dictionary section after
/// its [`DictDelta`]. Optional: readers that predate it stop after the delta and never see it,
/// and a section without it (written before it existed) has no locations.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLocations {
    /// Per new node: 0 when unknown (and for kernel frames), else the file's string id + 1.
    pub file: Vec<u32>,
    /// Per new node: the function's address in that file.
    pub addr: Vec<u64>,
}

/// A node's location as a reader holds it: the file's string id + 1 (0: unknown) and address.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeLocation {
    pub file: u32,
    pub addr: u64,
}

/// A stack node as a reader holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Node {
    pub parent: u32,
    pub frame: StrId,
    pub kernel: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuCounts {
    pub cpu: u32,
    pub busy: u64,
    /// Busy samples taken in kernel mode (the stack has kernel frames).
    pub kernel: u64,
    pub idle: u64,
    /// Samples the kernel side could not deliver, counted since the previous block.
    pub lost: u64,
}

/// Counts that answer status and heatmap questions without decoding samples. Readers reject
/// summaries with more than [`BUCKETS_PER_SEC`] buckets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub cpus: Vec<CpuCounts>,
    /// Busy samples of all CPUs per 10 ms of the block's second (empty in rollups).
    pub buckets: Vec<u32>,
    /// Per CPU with any: `(cpu, busy samples in softirq context)` (their stacks start their
    /// kernel frames with a `[softirq:NAME]` marker, `crate::context`). Added after version 4
    /// without a version bump, as the workload column: summaries written before it end with
    /// `buckets` and read as having none ([`unpack_summary`]); older readers ignore it.
    pub softirq: Vec<(u32, u64)>,
}

/// The summary as blocks before the softirq counts have it.
#[cfg_attr(test, derive(Serialize))]
#[derive(Deserialize)]
struct SummaryV4 {
    cpus: Vec<CpuCounts>,
    buckets: Vec<u32>,
}

/// Decodes a block's summary section, written with or without the softirq counts.
pub fn unpack_summary(bytes: &[u8]) -> Result<Summary, FormatError> {
    let raw = decompress_bounded(bytes, MAX_DECOMPRESSED)?;
    if let Ok(s) = postcard::from_bytes::<Summary>(&raw) {
        return Ok(s);
    }
    let v4: SummaryV4 = postcard::from_bytes(&raw).map_err(|e| FormatError::Section(e.to_string()))?;
    Ok(Summary { cpus: v4.cpus, buckets: v4.buckets, softirq: Vec::new() })
}

impl Summary {
    /// Busy samples of `cpu` in softirq context.
    pub fn softirq(&self, cpu: u32) -> u64 {
        self.softirq.iter().find(|(c, _)| *c == cpu).map_or(0, |(_, n)| *n)
    }
}

/// The samples of a block, one column per field, sorted by CPU and then time.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleColumns {
    /// Per sample, microseconds since the previous sample of the same CPU (the first of each
    /// CPU: since the block's start). Sorting by CPU makes these near-constant (the sampling
    /// period), which is what lets them compress to a fraction of a byte.
    pub ts_delta_us: Vec<u64>,
    pub cpu: Vec<u32>,
    pub pid: Vec<u32>,
    pub tid: Vec<u32>,
    pub comm: Vec<StrId>,
    pub cgroup: Vec<u64>,
    pub stack: Vec<u32>,
    /// Samples each row stands for; empty means 1 each (rollups fill it).
    pub count: Vec<u32>,
    /// Per sample, the string id of its workload (`model::Sample::workload`); empty when no
    /// sample of the block has one. Added after version 4 without a version bump: blocks
    /// written before it end with `count` and read as having none ([`unpack_samples`]).
    pub workload: Vec<StrId>,
}

/// The sample columns as blocks before the workload column have them.
#[cfg_attr(test, derive(Serialize))]
#[derive(Deserialize)]
struct SampleColumnsV4 {
    ts_delta_us: Vec<u64>,
    cpu: Vec<u32>,
    pid: Vec<u32>,
    tid: Vec<u32>,
    comm: Vec<StrId>,
    cgroup: Vec<u64>,
    stack: Vec<u32>,
    count: Vec<u32>,
}

/// Decodes a block's sample section, written with or without the workload column.
pub fn unpack_samples(bytes: &[u8], max: usize) -> Result<SampleColumns, FormatError> {
    let raw = decompress_bounded(bytes, max)?;
    if let Ok(cols) = postcard::from_bytes::<SampleColumns>(&raw) {
        return Ok(cols);
    }
    let v4: SampleColumnsV4 = postcard::from_bytes(&raw).map_err(|e| FormatError::Section(e.to_string()))?;
    Ok(SampleColumns {
        ts_delta_us: v4.ts_delta_us,
        cpu: v4.cpu,
        pid: v4.pid,
        tid: v4.tid,
        comm: v4.comm,
        cgroup: v4.cgroup,
        stack: v4.stack,
        count: v4.count,
        workload: Vec::new(),
    })
}

impl SampleColumns {
    pub fn len(&self) -> usize {
        self.cpu.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cpu.is_empty()
    }

    pub fn count(&self, i: usize) -> u64 {
        self.count.get(i).map_or(1, |&c| u64::from(c))
    }

    /// The string id of sample `i`'s workload, if the block records workloads.
    pub fn workload(&self, i: usize) -> Option<StrId> {
        self.workload.get(i).copied()
    }

    /// Sample timestamps in ns, undoing the per-CPU delta encoding.
    pub fn timestamps(&self, start_ns: u64) -> impl Iterator<Item = u64> + '_ {
        let mut prev_cpu = None;
        let mut t = start_ns;
        self.ts_delta_us.iter().zip(&self.cpu).map(move |(&d, &cpu)| {
            if prev_cpu != Some(cpu) {
                prev_cpu = Some(cpu);
                t = start_ns;
            }
            t = t.saturating_add(d.saturating_mul(NS_PER_US));
            t
        })
    }

    /// Checks the columns against each other and against a dictionary of the given sizes.
    pub fn validate(&self, strings: usize, stacks: usize) -> Result<(), FormatError> {
        let n = self.len();
        let lens = [
            self.ts_delta_us.len(),
            self.pid.len(),
            self.tid.len(),
            self.comm.len(),
            self.cgroup.len(),
            self.stack.len(),
        ];
        let optional = |l: usize| l == 0 || l == n;
        if lens.iter().any(|&l| l != n) || !optional(self.count.len()) || !optional(self.workload.len()) {
            return Err(FormatError::Section("sample columns differ in length".into()));
        }
        if self.comm.iter().chain(&self.workload).any(|&c| c as usize >= strings)
            || self.stack.iter().any(|&s| s as usize >= stacks)
        {
            return Err(FormatError::DanglingId);
        }
        Ok(())
    }
}

thread_local! {
    // zstd contexts are costly to set up (tens of KB each): one per thread, reused.
    static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> = const { std::cell::RefCell::new(None) };
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { std::cell::RefCell::new(None) };
}

/// Serialises and compresses one section.
pub fn pack<T: Serialize>(value: &T) -> Vec<u8> {
    let raw = postcard::to_stdvec(value).expect("serialising to memory cannot fail");
    COMPRESSOR.with_borrow_mut(|c| {
        let c = c.get_or_insert_with(|| zstd::bulk::Compressor::new(3).expect("zstd context"));
        c.compress(&raw).expect("zstd compression into memory cannot fail")
    })
}

/// Decompresses and deserialises one section.
pub fn unpack<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, FormatError> {
    unpack_bounded(bytes, MAX_DECOMPRESSED)
}

/// A dictionary section: its delta, then the nodes' locations when the writer recorded them.
pub fn unpack_dict(bytes: &[u8]) -> Result<(DictDelta, NodeLocations), FormatError> {
    let raw = decompress_bounded(bytes, MAX_DECOMPRESSED)?;
    let bad = |e: postcard::Error| FormatError::Section(e.to_string());
    let (delta, rest) = postcard::take_from_bytes::<DictDelta>(&raw).map_err(bad)?;
    let locations = if rest.is_empty() { NodeLocations::default() } else { postcard::from_bytes(rest).map_err(bad)? };
    Ok((delta, locations))
}

/// [`unpack`], refusing a section that claims more than `max` bytes decompressed.
pub fn unpack_bounded<T: for<'de> Deserialize<'de>>(bytes: &[u8], max: usize) -> Result<T, FormatError> {
    let raw = decompress_bounded(bytes, max)?;
    postcard::from_bytes(&raw).map_err(|e| FormatError::Section(e.to_string()))
}

/// Decompresses one section, refusing one that claims more than `max` bytes.
fn decompress_bounded(bytes: &[u8], max: usize) -> Result<Vec<u8>, FormatError> {
    let size = zstd::zstd_safe::get_frame_content_size(bytes)
        .map_err(|_| FormatError::Section("not a zstd frame".into()))?
        .ok_or_else(|| FormatError::Section("zstd frame without a content size".into()))?;
    if size > max as u64 {
        return Err(FormatError::Section(format!("claims {size} bytes uncompressed")));
    }
    let raw = DECOMPRESSOR
        .with_borrow_mut(|d| {
            let d = match d {
                Some(d) => d,
                None => d.insert(zstd::bulk::Decompressor::new()?),
            };
            d.decompress(bytes, size as usize)
        })
        .map_err(|e| FormatError::Section(e.to_string()))?;
    Ok(raw)
}

/// A segment's dictionary as a reader rebuilds it block by block.
#[derive(Debug)]
pub struct Dict {
    pub strings: Vec<String>,
    /// Stack nodes; `nodes[0]` is the empty stack.
    pub nodes: Vec<Node>,
    /// Per node, where its frame lives; may be shorter than `nodes` (unknown past its end).
    pub locations: Vec<NodeLocation>,
}

impl Default for Dict {
    fn default() -> Self {
        Self {
            strings: Vec::new(),
            nodes: vec![Node { parent: 0, frame: 0, kernel: false }],
            locations: vec![NodeLocation::default()],
        }
    }
}

impl Dict {
    /// Applies a block's dictionary section.
    pub fn apply(&mut self, header: &BlockHeader, section: &[u8]) -> Result<(), FormatError> {
        if header.flags & FLAG_RESET_DICT != 0 {
            *self = Self::default();
        }
        let (delta, locations) = unpack_dict(section)?;
        if delta.parent_delta.len() != delta.frame.len() {
            return Err(FormatError::Section("node columns differ in length".into()));
        }
        let located = !locations.file.is_empty();
        if located && (locations.file.len() != delta.frame.len() || locations.addr.len() != delta.frame.len()) {
            return Err(FormatError::Section("location columns differ in length from the nodes".into()));
        }
        let strings = self.strings.len() + delta.strings.len();
        self.strings.extend(delta.strings.into_iter().map(|s| crate::text::cut(s, MAX_NAME_BYTES)));
        self.nodes.reserve(delta.frame.len());
        for (&d, &f) in delta.parent_delta.iter().zip(&delta.frame) {
            let id = self.nodes.len() as u32;
            if d == 0 || d > id || (f / 2) as usize >= strings {
                return Err(FormatError::DanglingId);
            }
            self.nodes.push(Node { parent: id - d, frame: f / 2, kernel: f % 2 == 1 });
        }
        if located {
            self.locations.resize(self.nodes.len() - delta.frame.len(), NodeLocation::default());
            for (&file, &addr) in locations.file.iter().zip(&locations.addr) {
                if file as usize > strings {
                    return Err(FormatError::DanglingId);
                }
                self.locations.push(NodeLocation { file, addr });
            }
        }
        Ok(())
    }

    /// The locations of a stack node's frames, root first, as [`Self::frames`] lists them.
    pub fn locations(&self, node: u32, out: &mut Vec<NodeLocation>) {
        out.clear();
        let mut n = node as usize;
        while n != 0 && n < self.nodes.len() && out.len() < MAX_STACK_FRAMES {
            out.push(self.locations.get(n).copied().unwrap_or_default());
            n = self.nodes[n].parent as usize;
        }
        out.reverse();
    }

    /// The file of a location, or "" when unknown.
    pub fn file(&self, l: NodeLocation) -> &str {
        l.file.checked_sub(1).and_then(|i| self.strings.get(i as usize)).map_or("", String::as_str)
    }

    /// The frames of a stack node, root first, with their kernel flags.
    pub fn frames(&self, node: u32, out: &mut Vec<(StrId, bool)>) {
        out.clear();
        let mut n = node as usize;
        while n != 0 && n < self.nodes.len() && out.len() < MAX_STACK_FRAMES {
            let node = self.nodes[n];
            out.push((node.frame, node.kernel));
            n = node.parent as usize;
        }
        out.reverse();
    }
}

#[cfg(test)]
mod tests;
