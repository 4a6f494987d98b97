//! Reads the store: lists segments, walks the blocks that overlap a window, summarises.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use super::{
    StoreError, check_dir,
    format::{BlockData, BlockHeader, Blocks, SEGMENT_NS, SegmentHeader, Tail},
    segments_dir,
};

/// A read-only view of a data directory.
pub struct Store {
    data_dir: PathBuf,
    /// Problems met while reading (corrupt or unreadable files), one sentence each, naming
    /// the file. Reading goes on past them.
    warnings: Vec<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CpuSummary {
    pub samples: u64,
    pub idle: u64,
    pub lost: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct StoreSummary {
    /// Earliest and latest second covered, `[first, last)` in ns since the epoch.
    pub span: Option<(u64, u64)>,
    pub segments: usize,
    pub bytes: u64,
    pub blocks: u64,
    /// Per CPU: non-idle samples, idle samples, lost samples.
    pub cpus: BTreeMap<u32, CpuSummary>,
}

impl Store {
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        check_dir(data_dir)?;
        Ok(Self {
            data_dir: data_dir.to_path_buf(),
            warnings: Vec::new(),
        })
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    /// Segment files with their start time, oldest first.
    pub fn segments(&self) -> Result<Vec<(u64, PathBuf)>, StoreError> {
        let dir = segments_dir(&self.data_dir);
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(StoreError::Io(dir, e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| StoreError::Io(dir.clone(), e))?;
            let name = entry.file_name();
            let Some(secs) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".seg"))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            out.push((secs * 1_000_000_000, entry.path()));
        }
        out.sort();
        Ok(out)
    }

    /// Calls `visit` for every valid block overlapping `[from_ns, to_ns)`, in time order per
    /// segment. With `decode == false` the payload is not decoded and `visit` gets `None`.
    pub fn scan(
        &mut self,
        from_ns: u64,
        to_ns: u64,
        decode: bool,
        mut visit: impl FnMut(&BlockHeader, Option<&BlockData>),
    ) -> Result<(), StoreError> {
        for (start, path) in self.segments()? {
            if start >= to_ns || start + SEGMENT_NS <= from_ns {
                continue;
            }
            let data = match std::fs::read(&path) {
                Ok(d) => d,
                // Removed between listing and reading (retention): nothing to show.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(StoreError::Io(path, e)),
            };
            if let Err(e) = SegmentHeader::decode(&data) {
                self.warnings
                    .push(format!("skipped {}: {e}", path.display()));
                continue;
            }
            let mut blocks = Blocks::new(&data);
            for (header, payload) in blocks.by_ref() {
                if header.start_ns >= to_ns || header.end_ns <= from_ns {
                    continue;
                }
                if !decode {
                    visit(&header, None);
                    continue;
                }
                match BlockData::decode(payload) {
                    Ok(block) => visit(&header, Some(&block)),
                    Err(e) => self
                        .warnings
                        .push(format!("skipped a block of {}: {e}", path.display())),
                }
            }
            if let Some(Tail::Corrupt { offset, reason }) = blocks.tail() {
                self.warnings.push(format!(
                    "{}: {reason} at byte {offset}; the {} bytes after it were skipped",
                    path.display(),
                    data.len() - offset
                ));
            }
        }
        Ok(())
    }

    /// Span, sizes and per-CPU counts of the whole store.
    pub fn summary(&mut self) -> Result<StoreSummary, StoreError> {
        let mut summary = StoreSummary::default();
        for (_, path) in self.segments()? {
            summary.segments += 1;
            summary.bytes += std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        }
        let mut span: Option<(u64, u64)> = None;
        let mut cpus = BTreeMap::<u32, CpuSummary>::new();
        let mut blocks = 0;
        self.scan(0, u64::MAX, true, |h, block| {
            blocks += 1;
            span = Some(match span {
                None => (h.start_ns, h.end_ns),
                Some((a, b)) => (a.min(h.start_ns), b.max(h.end_ns)),
            });
            let Some(block) = block else { return };
            for &cpu in &block.cpu {
                cpus.entry(cpu).or_default().samples += 1;
            }
            for c in &block.idle {
                cpus.entry(c.cpu).or_default().idle += c.count;
            }
            for c in &block.lost {
                cpus.entry(c.cpu).or_default().lost += c.count;
            }
        })?;
        summary.span = span;
        summary.cpus = cpus;
        summary.blocks = blocks;
        Ok(summary)
    }

    /// `[first, last)` second held, from block headers only.
    pub fn span(&mut self) -> Result<Option<(u64, u64)>, StoreError> {
        let mut span: Option<(u64, u64)> = None;
        self.scan(0, u64::MAX, false, |h, _| {
            span = Some(match span {
                None => (h.start_ns, h.end_ns),
                Some((a, b)) => (a.min(h.start_ns), b.max(h.end_ns)),
            });
        })?;
        Ok(span)
    }
}
