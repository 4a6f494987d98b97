//! Reads the store: lists segments, walks the blocks that overlap a window, summarises.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use super::{
    StoreError, check_dir,
    format::{
        BlockHeader, Blocks, Dict, FLAG_IDENTITY, FLAG_RESET_DICT, SEGMENT_NS, SampleColumns, SegmentHeader, Summary,
        Tail, samples_bound, unpack_samples, unpack_summary,
    },
    identity::Identity,
    segments_dir,
};

/// How much of each block a scan decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Need {
    /// Headers only (time span, sample counts).
    Headers,
    /// Headers and the summary section (per-CPU counts, 10 ms buckets).
    Summary,
    /// Everything: dictionary, summary and sample columns.
    Samples,
}

/// One block as a visitor sees it.
pub struct BlockView<'a> {
    pub header: &'a BlockHeader,
    /// The segment's dictionary as of this block (empty unless `Need::Samples`).
    pub dict: &'a Dict,
    pub summary: Option<&'a Summary>,
    pub samples: Option<&'a SampleColumns>,
    /// How the block was recorded (`None` in segments older than format 4: see `Meta`).
    pub identity: Option<&'a Identity>,
}

impl BlockView<'_> {
    /// The block's sampling frequency, or `fallback` (from `meta.json`) when it has none.
    pub fn frequency_hz(&self, fallback: u64) -> u64 {
        self.identity.map_or(fallback, |i| i.frequency_hz).max(1)
    }
}

/// Receives the blocks of a scan.
pub trait Visitor {
    fn block(&mut self, block: BlockView<'_>);
    /// Called before the dictionary is reset or dropped (end of a segment), with the
    /// dictionary the blocks since the previous call used.
    fn dict_done(&mut self, _dict: &Dict) {}
}

impl<F: FnMut(BlockView<'_>)> Visitor for F {
    fn block(&mut self, block: BlockView<'_>) {
        self(block)
    }
}

/// A read-only view of a data directory.
pub struct Store {
    pub(super) data_dir: PathBuf,
    /// Problems met while reading (corrupt or unreadable files), one sentence each, naming
    /// the file. Reading goes on past them.
    pub(super) warnings: Vec<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CpuSummary {
    pub samples: u64,
    pub idle: u64,
    pub lost: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct StoreSummary {
    /// Earliest and latest time covered, `[first, last)` in ns since the epoch.
    pub span: Option<(u64, u64)>,
    pub segments: usize,
    pub bytes: u64,
    pub blocks: u64,
    /// Per CPU: non-idle samples, idle samples, lost samples.
    pub cpus: BTreeMap<u32, CpuSummary>,
}

/// Segment files with their start time, oldest first.
pub fn list_segments(data_dir: &Path) -> Result<Vec<(u64, PathBuf)>, StoreError> {
    let dir = segments_dir(data_dir);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(StoreError::Io(dir, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| StoreError::Io(dir.clone(), e))?;
        let name = entry.file_name();
        let Some(secs) = name.to_str().and_then(|n| n.strip_suffix(".seg")).and_then(|n| n.parse::<u64>().ok()) else {
            continue;
        };
        let Some(start) = secs.checked_mul(1_000_000_000) else { continue };
        out.push((start, entry.path()));
    }
    out.sort();
    Ok(out)
}

impl Store {
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        check_dir(data_dir)?;
        Ok(Self { data_dir: data_dir.to_path_buf(), warnings: Vec::new() })
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    pub fn segments(&self) -> Result<Vec<(u64, PathBuf)>, StoreError> {
        list_segments(&self.data_dir)
    }

    /// Visits every valid block overlapping `[from_ns, to_ns)`, in time order per segment,
    /// decoded as far as `need` asks.
    pub fn scan(&mut self, from_ns: u64, to_ns: u64, need: Need, visitor: &mut impl Visitor) -> Result<(), StoreError> {
        for (start, path) in self.segments()? {
            if start >= to_ns || start.saturating_add(SEGMENT_NS) <= from_ns {
                continue;
            }
            let data = match super::files::read_segment(&path) {
                Ok(d) => d,
                // Removed between listing and reading (retention): nothing to show.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(StoreError::Io(path, e)),
            };
            if let Err(e) = SegmentHeader::decode(&data) {
                self.warnings.push(format!("skipped {}: {e}", path.display()));
                continue;
            }
            scan_segment(&path, &data, from_ns, to_ns, need, visitor, &mut self.warnings);
        }
        Ok(())
    }

    /// End of the newest block: reads only the newest segment that holds one.
    pub fn last_end(&mut self) -> Result<Option<u64>, StoreError> {
        for (start, _) in self.segments()?.into_iter().rev() {
            let mut end = None;
            self.scan(start, start.saturating_add(SEGMENT_NS), Need::Headers, &mut |b: BlockView<'_>| {
                end = end.max(Some(b.header.end_ns))
            })?;
            if end.is_some() {
                return Ok(end);
            }
        }
        Ok(None)
    }

    /// Start of the first block (the headers of the first segment that has one).
    pub fn first_start(&mut self) -> Result<Option<u64>, StoreError> {
        for (start, _) in self.segments()? {
            let mut first = None;
            self.scan(start, start.saturating_add(SEGMENT_NS), Need::Headers, &mut |b: BlockView<'_>| {
                first = Some(first.map_or(b.header.start_ns, |f: u64| f.min(b.header.start_ns)))
            })?;
            if first.is_some() {
                return Ok(first);
            }
        }
        Ok(None)
    }
}

/// Walks one segment held in memory (header already checked), as `Store::scan` does for each
/// file. Problems become sentences in `warnings`; nothing here panics on any input.
pub fn scan_segment(
    path: &Path,
    data: &[u8],
    from_ns: u64,
    to_ns: u64,
    need: Need,
    visitor: &mut impl Visitor,
    warnings: &mut Vec<String>,
) {
    let overlaps = |h: &BlockHeader| h.start_ns < to_ns && h.end_ns > from_ns;
    // Headers first (no decompression): the dictionary only needs replaying from the last
    // reset before the first block in the window, and no further than the last one in it.
    let (mut replay_from, mut last_needed) = (0usize, None);
    if need == Need::Samples {
        let mut first_overlap = None;
        let mut headers = Blocks::new(data);
        for (i, (h, _)) in headers.by_ref().enumerate() {
            if first_overlap.is_none() && h.flags & FLAG_RESET_DICT != 0 {
                replay_from = i;
            }
            if overlaps(&h) {
                first_overlap.get_or_insert(i);
                last_needed = Some(i);
            }
        }
        if last_needed.is_none() {
            warn_corrupt(path, data, headers.tail(), warnings);
            return;
        }
    }
    let mut dict = Dict::default();
    let mut identity: Option<Identity> = None;
    let mut blocks = Blocks::new(data);
    for (i, (header, sections)) in blocks.by_ref().enumerate() {
        // How the blocks after it were recorded: read wherever it lies (before the window
        // too), and never handed to the visitor as a block of samples.
        if header.flags & FLAG_IDENTITY != 0 {
            match Identity::decode(sections.dict) {
                Ok(id) => identity = Some(id),
                Err(e) => warnings.push(format!("{}: an identity block does not decode ({e})", path.display())),
            }
            continue;
        }
        let overlaps = overlaps(&header);
        if need == Need::Samples {
            if i < replay_from {
                continue;
            }
            if last_needed.is_some_and(|l| i > l) {
                break;
            }
            if header.flags & FLAG_RESET_DICT != 0 {
                visitor.dict_done(&dict);
            }
            // Every block's dictionary counts, even outside the window: later ids build on it.
            if let Err(e) = dict.apply(&header, sections.dict) {
                warnings.push(format!("{}: {e}; skipped the rest of the file", path.display()));
                visitor.dict_done(&dict);
                return;
            }
        }
        if !overlaps {
            continue;
        }
        let summary = if need >= Need::Summary {
            match unpack_summary(sections.summary) {
                Ok(s) => Some(s),
                Err(e) => {
                    warnings.push(format!("skipped a block of {}: {e}", path.display()));
                    continue;
                }
            }
        } else {
            None
        };
        let samples = if need == Need::Samples {
            match unpack_samples(sections.samples, samples_bound(&header))
                .and_then(|c| c.validate(dict.strings.len(), dict.nodes.len()).map(|()| c))
                .and_then(|c| {
                    // Rows never outnumber the samples the header announces (a rollup row
                    // stands for one or more).
                    if c.len() > header.samples as usize {
                        Err(super::format::FormatError::Section("more rows than the header announces".into()))
                    } else {
                        Ok(c)
                    }
                }) {
                Ok(c) => Some(c),
                Err(e) => {
                    warnings.push(format!("skipped a block of {}: {e}", path.display()));
                    continue;
                }
            }
        } else {
            None
        };
        visitor.block(BlockView {
            header: &header,
            dict: &dict,
            summary: summary.as_ref(),
            samples: samples.as_ref(),
            identity: identity.as_ref(),
        });
    }
    if need == Need::Samples {
        visitor.dict_done(&dict);
    }
    warn_corrupt(path, data, blocks.tail(), warnings);
}

fn warn_corrupt(path: &Path, data: &[u8], tail: Option<&Tail>, warnings: &mut Vec<String>) {
    if let Some(Tail::Corrupt { offset, reason }) = tail {
        warnings.push(format!(
            "{}: {reason} at byte {offset}; the {} bytes after it were skipped",
            path.display(),
            data.len() - offset
        ));
    }
}
