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
//! Each section's shape and decoding lives in its own file (`format/dict.rs`, `summary.rs`,
//! `samples.rs`); this one holds the framing (headers, CRC, the block iterator) and the
//! compression every section shares.
//!
//! Every block is written with a single `write` and carries a CRC-32 over its header and
//! sections, so a reader that races the writer, or opens a file whose writer was killed,
//! recognises a torn tail and stops there.

use serde::{Deserialize, Serialize};

mod dict;
mod samples;
mod summary;

pub use dict::{Dict, DictDelta, Node, NodeLocation, NodeLocations, unpack_dict};
pub use samples::{SampleColumns, unpack_samples};
pub use summary::{CpuCounts, Summary, unpack_summary};
#[cfg(test)]
use {samples::SampleColumnsV4, summary::SummaryV4};

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

thread_local! {
    // zstd contexts are costly to set up (tens of KB each): one per thread, reused.
    static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> = const { std::cell::RefCell::new(None) };
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { std::cell::RefCell::new(None) };
}

/// Serialises and compresses one section. zstd level 1: against level 3, the store bench's
/// bytes grew 1.8 % (3.40 bytes a sample against 3.34) and its ingest went from 3.2 to 4.1 M
/// samples a second; the Python replay node's bytes did not grow at all (a block's columns and
/// names leave level 3 little more to find).
pub fn pack<T: Serialize>(value: &T) -> Vec<u8> {
    let raw = postcard::to_stdvec(value).expect("serialising to memory cannot fail");
    COMPRESSOR.with_borrow_mut(|c| {
        let c = c.get_or_insert_with(|| zstd::bulk::Compressor::new(1).expect("zstd context"));
        c.compress(&raw).expect("zstd compression into memory cannot fail")
    })
}

/// Decompresses and deserialises one section.
pub fn unpack<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, FormatError> {
    unpack_bounded(bytes, MAX_DECOMPRESSED)
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

#[cfg(test)]
mod tests;
