//! The on-disk format, version 1. `docs/store.md` describes it for other readers.
//!
//! A segment file holds one minute of wall-clock time. It starts with a 24-byte header and is
//! followed by blocks, appended as the daemon flushes. A block covers samples of one wall-clock
//! second (several blocks may cover the same second: each flush writes what arrived since the
//! last one). Every block is written with a single `write` and carries a CRC-32 over its header
//! and payload, so a reader that races the writer, or opens a file whose writer was killed,
//! recognises a torn tail and stops there.

use serde::{Deserialize, Serialize};

/// Magic at the start of every segment file.
pub const SEGMENT_MAGIC: [u8; 8] = *b"PROFSEG\0";
/// Bumped on any incompatible change to segment, block or payload layout.
pub const FORMAT_VERSION: u32 = 1;
pub const SEGMENT_HEADER_LEN: usize = 24;
pub const BLOCK_MAGIC: [u8; 4] = *b"PBLK";
pub const BLOCK_HEADER_LEN: usize = 40;
/// Wall-clock span of one segment file.
pub const SEGMENT_NS: u64 = 60 * NS_PER_SEC;
pub const NS_PER_SEC: u64 = 1_000_000_000;
/// Refuse to allocate for absurd lengths found in a corrupt header.
const MAX_PAYLOAD: u32 = 256 << 20;

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("not a profiler segment (bad magic)")]
    BadMagic,
    #[error("segment format version {0}, this build reads version {FORMAT_VERSION}")]
    Version(u32),
    #[error("file shorter than a segment header")]
    Short,
    #[error("block payload does not decode: {0}")]
    Payload(String),
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
        if version != FORMAT_VERSION {
            return Err(FormatError::Version(version));
        }
        Ok(Self {
            version,
            start_ns: u64::from_le_bytes(b[16..24].try_into().unwrap()),
        })
    }
}

/// Fixed-size block header. On disk: magic, payload_len, start_ns, end_ns, samples, idle,
/// 4 reserved bytes (zero), then a CRC-32 of the 36 bytes before it and the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHeader {
    pub payload_len: u32,
    /// The second the block covers: `[start_ns, end_ns)`.
    pub start_ns: u64,
    pub end_ns: u64,
    /// Non-idle samples in the block.
    pub samples: u32,
    /// Idle samples in the block.
    pub idle: u32,
}

impl BlockHeader {
    fn encode_without_crc(&self) -> [u8; BLOCK_HEADER_LEN] {
        let mut b = [0u8; BLOCK_HEADER_LEN];
        b[..4].copy_from_slice(&BLOCK_MAGIC);
        b[4..8].copy_from_slice(&self.payload_len.to_le_bytes());
        b[8..16].copy_from_slice(&self.start_ns.to_le_bytes());
        b[16..24].copy_from_slice(&self.end_ns.to_le_bytes());
        b[24..28].copy_from_slice(&self.samples.to_le_bytes());
        b[28..32].copy_from_slice(&self.idle.to_le_bytes());
        b
    }
}

fn crc(header: &[u8; BLOCK_HEADER_LEN], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&header[..36]);
    h.update(payload);
    h.finalize()
}

/// Header and payload as one buffer, ready for a single `write`.
pub fn encode_block(header: &BlockHeader, payload: &[u8]) -> Vec<u8> {
    let mut head = header.encode_without_crc();
    let sum = crc(&head, payload);
    head[36..40].copy_from_slice(&sum.to_le_bytes());
    let mut out = Vec::with_capacity(BLOCK_HEADER_LEN + payload.len());
    out.extend_from_slice(&head);
    out.extend_from_slice(payload);
    out
}

/// What stopped a walk over a segment's blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tail {
    /// Clean end of file.
    Clean,
    /// A block header or payload runs past the end of the file: a write in progress, or
    /// one cut short by a crash. Expected; not an error.
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
        Self {
            data,
            offset: SEGMENT_HEADER_LEN.min(data.len()),
            tail: None,
        }
    }

    /// Valid until `next` returned `None`.
    pub fn tail(&self) -> Option<&Tail> {
        self.tail.as_ref()
    }

    /// Byte offset just past the last valid block.
    pub fn valid_len(&self) -> usize {
        self.offset
    }
}

impl<'a> Iterator for Blocks<'a> {
    type Item = (BlockHeader, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        if self.tail.is_some() {
            return None;
        }
        let rest = &self.data[self.offset..];
        let stop = |this: &mut Self, tail| {
            this.tail = Some(tail);
            None
        };
        if rest.is_empty() {
            return stop(self, Tail::Clean);
        }
        if rest.len() < BLOCK_HEADER_LEN {
            return stop(
                self,
                Tail::Incomplete {
                    offset: self.offset,
                },
            );
        }
        let head: &[u8; BLOCK_HEADER_LEN] = rest[..BLOCK_HEADER_LEN].try_into().unwrap();
        if head[..4] != BLOCK_MAGIC {
            return stop(
                self,
                Tail::Corrupt {
                    offset: self.offset,
                    reason: "bad block magic",
                },
            );
        }
        let le32 = |r: std::ops::Range<usize>| u32::from_le_bytes(head[r].try_into().unwrap());
        let le64 = |r: std::ops::Range<usize>| u64::from_le_bytes(head[r].try_into().unwrap());
        let header = BlockHeader {
            payload_len: le32(4..8),
            start_ns: le64(8..16),
            end_ns: le64(16..24),
            samples: le32(24..28),
            idle: le32(28..32),
        };
        if header.payload_len > MAX_PAYLOAD {
            return stop(
                self,
                Tail::Corrupt {
                    offset: self.offset,
                    reason: "block length out of range",
                },
            );
        }
        let end = BLOCK_HEADER_LEN + header.payload_len as usize;
        if rest.len() < end {
            return stop(
                self,
                Tail::Incomplete {
                    offset: self.offset,
                },
            );
        }
        let payload = &rest[BLOCK_HEADER_LEN..end];
        if crc(head, payload) != le32(36..40) {
            return stop(
                self,
                Tail::Corrupt {
                    offset: self.offset,
                    reason: "checksum mismatch",
                },
            );
        }
        self.offset += end;
        Some((header, payload))
    }
}

/// Index of a string in [`BlockData::strings`].
pub type StrId = u32;

/// A stack as stored: string ids, root first; `frames[..user_len]` are user frames.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StoredStack {
    pub frames: Vec<StrId>,
    pub user_len: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuCount {
    pub cpu: u32,
    pub count: u64,
}

/// A block's payload (postcard, then zstd). Samples are columns, sorted by time; strings and
/// stacks are dictionaries local to the block, so every block decodes on its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BlockData {
    pub strings: Vec<String>,
    pub stacks: Vec<StoredStack>,
    /// Per sample: ns since the previous sample (the first: since the block's start).
    pub ts_delta: Vec<u64>,
    pub cpu: Vec<u32>,
    pub pid: Vec<u32>,
    pub tid: Vec<u32>,
    pub comm: Vec<StrId>,
    pub cgroup: Vec<u64>,
    pub stack: Vec<u32>,
    /// Idle samples per CPU in this block.
    pub idle: Vec<CpuCount>,
    /// Samples the kernel side could not deliver, per CPU, counted since the previous block.
    pub lost: Vec<CpuCount>,
}

impl BlockData {
    pub fn encode(&self) -> Vec<u8> {
        let raw = postcard::to_stdvec(self).expect("serialising to memory cannot fail");
        zstd::bulk::compress(&raw, 3).expect("zstd compression into memory cannot fail")
    }

    pub fn decode(payload: &[u8]) -> Result<Self, FormatError> {
        // A block's uncompressed size is bounded by what one second of samples can hold.
        let raw =
            zstd::stream::decode_all(payload).map_err(|e| FormatError::Payload(e.to_string()))?;
        let data: Self =
            postcard::from_bytes(&raw).map_err(|e| FormatError::Payload(e.to_string()))?;
        let n = data.ts_delta.len();
        let columns = [
            data.cpu.len(),
            data.pid.len(),
            data.tid.len(),
            data.comm.len(),
            data.cgroup.len(),
            data.stack.len(),
        ];
        if columns.iter().any(|&l| l != n)
            || data.comm.iter().any(|&c| c as usize >= data.strings.len())
            || data.stack.iter().any(|&s| s as usize >= data.stacks.len())
            || data.stacks.iter().any(|s| {
                s.user_len as usize > s.frames.len()
                    || s.frames.iter().any(|&f| f as usize >= data.strings.len())
            })
        {
            return Err(FormatError::Payload(
                "columns or dictionary ids inconsistent".into(),
            ));
        }
        Ok(data)
    }

    /// Sample timestamps, undoing the delta encoding.
    pub fn timestamps(&self, start_ns: u64) -> impl Iterator<Item = u64> + '_ {
        self.ts_delta.iter().scan(start_ns, |t, d| {
            *t = t.saturating_add(*d);
            Some(*t)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment_with(blocks: &[(BlockHeader, Vec<u8>)]) -> Vec<u8> {
        let mut file = SegmentHeader {
            version: FORMAT_VERSION,
            start_ns: 0,
        }
        .encode()
        .to_vec();
        for (h, p) in blocks {
            file.extend(encode_block(h, p));
        }
        file
    }

    fn header(len: usize) -> BlockHeader {
        BlockHeader {
            payload_len: len as u32,
            start_ns: 1,
            end_ns: 2,
            samples: 3,
            idle: 4,
        }
    }

    #[test]
    fn blocks_round_trip_and_torn_tail_is_incomplete() {
        let file = segment_with(&[(header(5), b"hello".to_vec()), (header(3), b"abc".to_vec())]);
        let mut it = Blocks::new(&file);
        assert_eq!(it.next().unwrap().1, b"hello");
        assert_eq!(it.next().unwrap(), (header(3), &b"abc"[..]));
        assert!(it.next().is_none());
        assert_eq!(it.tail(), Some(&Tail::Clean));

        for cut in SEGMENT_HEADER_LEN + 1..file.len() {
            let mut it = Blocks::new(&file[..cut]);
            let n = it.by_ref().count();
            assert!(n <= 1);
            assert!(
                matches!(it.tail(), Some(Tail::Incomplete { .. }) | Some(Tail::Clean)),
                "cut {cut}"
            );
        }
    }

    #[test]
    fn flipped_byte_is_corrupt() {
        let file = segment_with(&[(header(5), b"hello".to_vec())]);
        for i in SEGMENT_HEADER_LEN..file.len() {
            let mut bad = file.clone();
            bad[i] ^= 0x40;
            let mut it = Blocks::new(&bad);
            let got: Vec<_> = it.by_ref().collect();
            assert!(got.is_empty(), "byte {i} flipped still decoded");
            assert!(it.tail().is_some());
        }
    }

    #[test]
    fn segment_header_checks() {
        let h = SegmentHeader {
            version: FORMAT_VERSION,
            start_ns: 42,
        };
        assert_eq!(SegmentHeader::decode(&h.encode()).unwrap(), h);
        assert!(matches!(
            SegmentHeader::decode(b"short"),
            Err(FormatError::Short)
        ));
        let mut v2 = h.encode();
        v2[8] = 2;
        assert!(matches!(
            SegmentHeader::decode(&v2),
            Err(FormatError::Version(2))
        ));
        let mut bad = h.encode();
        bad[0] = b'X';
        assert!(matches!(
            SegmentHeader::decode(&bad),
            Err(FormatError::BadMagic)
        ));
    }

    #[test]
    fn payload_validation_rejects_dangling_ids() {
        let mut d = BlockData {
            strings: vec!["a".into()],
            ..Default::default()
        };
        d.stacks.push(StoredStack {
            frames: vec![0],
            user_len: 1,
        });
        d.ts_delta = vec![1];
        d.cpu = vec![0];
        d.pid = vec![1];
        d.tid = vec![1];
        d.comm = vec![0];
        d.cgroup = vec![0];
        d.stack = vec![0];
        assert_eq!(BlockData::decode(&d.encode()).unwrap(), d);
        d.stack = vec![7];
        assert!(BlockData::decode(&d.encode()).is_err());
        assert!(BlockData::decode(b"not zstd").is_err());
    }
}
