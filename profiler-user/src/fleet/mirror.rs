//! One node's window copied out of ClickHouse into a private temporary data directory, in the
//! store's own format: segments (samples, idle and lost counts, the frequency), `meta.json`,
//! findings and events. Every read command then answers from the copy with the code that
//! answers from the node's store, so both give the same answer line for line, and nothing
//! about flamegraphs, heatmaps or exports is written twice.
//!
//! What a copy cannot give back: rolled-up rows (one standing for several samples over ten
//! seconds) come back as that many samples at the row's time, so CPU x time at 1 s buckets
//! places them in one second rather than spread over ten; the cgroup id (not shipped).

use std::{collections::HashMap, os::unix::fs::DirBuilderExt, path::Path, sync::Arc};

use super::{Fleet, FleetError, Node};
use crate::{
    detect,
    model::{Location, Sample, SampleKind, Stack},
    query::Window,
    ship::clickhouse::schema::{self, col::*},
    store::{self, Meta, StoreWriter, format::FORMAT_VERSION, identity::Identity},
    timespec,
};

const SEC: u64 = 1_000_000_000;
/// Rows read per request: a minute of a 192-CPU node at 99 Hz is 1.1 M.
const CHUNK_NS: u64 = 60 * SEC;
/// Most samples one copy takes (about 10 minutes of a 192-CPU node at 99 Hz): the copy is
/// written to disk and read back, so its size is what a read of the node's store would cost.
pub const MAX_SAMPLES: u64 = 12_000_000;
/// Longest span of a stored block (a rolled-up one): blocks starting this long before a
/// window may overlap it.
const MAX_BLOCK_NS: u64 = 60 * SEC;
/// Frame of a sample whose stack is missing from `stacks`.
pub(super) const MISSING_STACK: &str = "[stack not in ClickHouse]";

/// A node's window, readable as a data directory; removed when dropped.
pub struct Mirror {
    dir: tempfile::TempDir,
    pub node: Node,
    /// Samples copied.
    pub samples: u64,
}

impl Mirror {
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }
}

/// Per CPU, from `cpu_seconds`: block start → (span, cpu, idle, lost, hz).
struct BlockCounts {
    start: u64,
    span: u64,
    cpu: u32,
    idle: u32,
    lost: u32,
    hz: u32,
}

impl Mirror {
    /// A private directory with the node's `meta.json`, findings and events (every one kept:
    /// a few per hour), and no samples yet ([`Mirror::copy`]).
    pub fn new(fleet: &Fleet, node: Node) -> Result<Self, FleetError> {
        let dir = tempfile::Builder::new().prefix("profiler-fleet-").tempdir().map_err(FleetError::Temp)?;
        std::fs::DirBuilder::new().mode(0o700).create(store::segments_dir(dir.path())).map_err(FleetError::Temp)?;
        Meta {
            format_version: FORMAT_VERSION,
            hostname: node.host.split('/').next().unwrap_or_default().to_string(),
            node: node.name.clone(),
            cpus: node.cpus.max(1),
            frequency_hz: u64::from(node.hz.max(1)),
            started_ns: 0,
        }
        .write(dir.path())?;
        copy_notes(fleet, &node, dir.path())?;
        Ok(Self { dir, node, samples: 0 })
    }

    /// Copies what ClickHouse holds of the node's samples in `window`: whole stored blocks, so
    /// a window that starts inside a second gets that second, as a scan of the node's store
    /// would. Call once: a second copy of an overlapping window would count its blocks twice.
    pub fn copy(&mut self, fleet: &Fleet, window: Window) -> Result<(), FleetError> {
        let node = &self.node;
        let blocks = fleet.rows(
            &format!(
                "SELECT {TS}, max({SPAN}), {CPU}, max({IDLE}), max({LOST}), max({HZ}) FROM {} WHERE {NODE} = {} \
                 AND {TS} >= {} AND {TS} < {} AND {TS} + {SPAN} > {} GROUP BY {TS}, {CPU} ORDER BY {TS}, {CPU}",
                fleet.table(schema::CPU_SECONDS),
                schema::quote_str(&node.name),
                window.from_ns.saturating_sub(MAX_BLOCK_NS),
                window.to_ns,
                window.from_ns
            ),
            |r| {
                Ok(BlockCounts {
                    start: r.u64()?,
                    span: r.u64()?,
                    cpu: u32::from(r.u16()?),
                    idle: r.u32()?,
                    lost: r.u32()?,
                    hz: r.u32()?,
                })
            },
        )?;
        // The blocks' whole span; whole seconds when nothing says more (rows shipped before
        // `cpu_seconds` existed).
        let lo = blocks.iter().map(|b| b.start).min().unwrap_or(u64::MAX).min(window.from_ns / SEC * SEC);
        let hi = blocks.iter().map(|b| b.start + b.span).max().unwrap_or(0).max(window.to_ns.div_ceil(SEC) * SEC);
        let count = format!(
            "SELECT count() FROM {} WHERE {}",
            fleet.table(schema::SAMPLES),
            Fleet::node_range(&node.name, lo, hi)
        );
        let rows = fleet.rows(&count, |r| r.u64())?.first().copied().unwrap_or(0);
        if rows > MAX_SAMPLES {
            return Err(FleetError::TooMany {
                node: node.name.clone(),
                rows,
                limit: MAX_SAMPLES,
                from: timespec::format(window.from_ns),
                to: timespec::format(window.to_ns),
            });
        }
        let segments = store::segments_dir(self.dir.path());
        let mut copier = Copier::new(fleet, node, &segments, SampleKind::Cpu);
        let mut chunk = lo;
        while chunk < hi {
            let end = (chunk + CHUNK_NS).min(hi);
            copier.counts(blocks.iter().filter(|b| (chunk..end).contains(&b.start)))?;
            copier.samples(chunk, end)?;
            if let Some(w) = copier.writer.as_mut() {
                w.flush(end)?;
            }
            chunk = end;
        }
        self.samples += copier.samples;
        Ok(())
    }

    /// Copies what ClickHouse holds of the node's `kind` counts (`cuda_samples`) in the whole
    /// seconds of `window` into the copy's store of that kind ([`SampleKind::store_dir`]).
    /// Call once per kind. The rows are few (one per second, thread and stack), so the bound
    /// is the samples' own.
    pub fn copy_kind(&mut self, fleet: &Fleet, window: Window, kind: SampleKind) -> Result<(), FleetError> {
        let (lo, hi) = (window.from_ns / SEC * SEC, window.to_ns.div_ceil(SEC) * SEC);
        let dir = kind.store_dir(self.dir.path());
        let segments = store::segments_dir(&dir);
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&segments).map_err(FleetError::Temp)?;
        let mut copier = Copier::new(fleet, &self.node, &segments, kind);
        let mut chunk = lo;
        while chunk < hi {
            let end = (chunk + CHUNK_NS).min(hi);
            copier.samples(chunk, end)?;
            if let Some(w) = copier.writer.as_mut() {
                w.flush(end)?;
            }
            chunk = end;
            if copier.samples > MAX_SAMPLES {
                return Err(FleetError::TooMany {
                    node: self.node.name.clone(),
                    rows: copier.samples,
                    limit: MAX_SAMPLES,
                    from: timespec::format(window.from_ns),
                    to: timespec::format(window.to_ns),
                });
            }
        }
        Ok(())
    }
}

struct Copier<'a> {
    fleet: &'a Fleet,
    node: &'a Node,
    /// What is copied: the CPU samples, or a CUDA kind's weighted rows.
    kind: SampleKind,
    segments: &'a Path,
    writer: Option<StoreWriter>,
    /// The frequency the writer records.
    hz: u32,
    /// Stack id → stack, one `Arc` each (the writer interns stacks by pointer).
    stacks: HashMap<u64, Arc<Stack>>,
    strings: HashMap<String, Arc<str>>,
    samples: u64,
}

impl<'a> Copier<'a> {
    fn new(fleet: &'a Fleet, node: &'a Node, segments: &'a Path, kind: SampleKind) -> Self {
        Copier {
            fleet,
            node,
            kind,
            segments,
            writer: None,
            hz: 0,
            stacks: HashMap::new(),
            strings: HashMap::new(),
            samples: 0,
        }
    }

    /// The writer for blocks recorded at `hz`: a new identity (block) when it changes.
    fn writer(&mut self, hz: u32, now: u64) -> Result<&mut StoreWriter, FleetError> {
        if self.writer.is_none() || (hz != self.hz && hz != 0) {
            if let Some(mut w) = self.writer.take() {
                w.flush(now)?;
            }
            self.hz = if hz == 0 { self.node.hz.max(1) } else { hz };
            let identity = Identity {
                frequency_hz: u64::from(self.hz),
                online_cpus: self.node.online.clone(),
                boot_id: String::new(),
                host: self.node.host.clone(),
            };
            self.writer = Some(StoreWriter::new(self.segments).with_identity(identity));
        }
        Ok(self.writer.as_mut().expect("set above"))
    }

    fn counts<'b>(&mut self, blocks: impl Iterator<Item = &'b BlockCounts>) -> Result<(), FleetError> {
        for b in blocks {
            let w = self.writer(b.hz, b.start)?;
            w.add_idle_at(b.start / SEC, b.cpu, u64::from(b.idle));
            w.add_lost_at(b.start / SEC, b.cpu, u64::from(b.lost));
        }
        Ok(())
    }

    fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.strings.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        self.strings.insert(s.to_string(), a.clone());
        a
    }

    fn samples(&mut self, from: u64, to: u64) -> Result<(), FleetError> {
        let (fleet, mut range) = (self.fleet, Fleet::node_range(&self.node.name, from, to));
        let table = match self.kind {
            SampleKind::Cpu => fleet.table(schema::SAMPLES),
            kind => {
                range = format!("{range} AND {KIND} = {}", schema::quote_str(kind.name()));
                fleet.table(schema::CUDA_SAMPLES)
            }
        };
        let stacks = fleet.rows(
            &format!(
                "SELECT {STACK_ID}, any({FRAMES}), any({KERNEL}) FROM {} WHERE {STACK_ID} GLOBAL IN \
                 (SELECT {STACK_ID} FROM {table} WHERE {range}) GROUP BY {STACK_ID}",
                fleet.table(schema::STACKS),
            ),
            |r| Ok((r.u64()?, r.strings()?.into_iter().map(String::from).collect::<Vec<_>>(), r.bytes()?.to_vec())),
        )?;
        let locations = fleet.rows(
            &format!(
                "SELECT {STACK_ID}, any({FILES}), any({ADDRS}) FROM {} WHERE {STACK_ID} GLOBAL IN \
                 (SELECT {STACK_ID} FROM {table} WHERE {range}) GROUP BY {STACK_ID}",
                fleet.table(schema::STACK_LOCATIONS),
            ),
            |r| Ok((r.u64()?, r.strings()?.into_iter().map(String::from).collect::<Vec<_>>(), r.u64s()?)),
        );
        // A server shipped to before locations were stored has no such table: no locations.
        let locations = match locations {
            Err(FleetError::NoNodes(_)) => Vec::new(),
            other => other?,
        };
        let mut locations: HashMap<u64, (Vec<String>, Vec<u64>)> =
            locations.into_iter().map(|(id, f, a)| (id, (f, a))).collect();
        for (id, frames, kernel) in stacks {
            let frames: Vec<Arc<str>> = frames.iter().map(|f| self.intern(f)).collect();
            // Kernel frames follow the user ones (root first).
            let user_len = kernel.iter().take_while(|&&k| k == 0).count().min(frames.len());
            let mut stack = Stack::new(frames, user_len);
            if let Some((files, addrs)) = locations.remove(&id) {
                stack.locations = files
                    .iter()
                    .zip(addrs)
                    .take(user_len)
                    .map(|(f, addr)| Location { file: self.intern(f), addr })
                    .collect();
            }
            self.stacks.entry(id).or_insert_with(|| Arc::new(stack));
        }
        let sql = match self.kind {
            SampleKind::Cpu => {
                format!(
                    "SELECT {TS}, {CPU}, {PID}, {TID}, {COMM}, {STACK_ID}, {WORKLOAD}, toUInt64({COUNT}) FROM {table} \
                     WHERE {range}"
                )
            }
            // A row sent twice is there twice until a merge: one per key.
            _ => format!(
                "SELECT {TS}, any({CPU}), any({PID}), {TID}, any({COMM}), {STACK_ID}, any({WORKLOAD}), max({VALUE}) \
                 FROM {table} WHERE {range} GROUP BY {TS}, {TID}, {STACK_ID}"
            ),
        };
        let bytes_rows = fleet.rows(&sql, |r| {
            Ok((
                r.u64()?,
                r.u16()?,
                r.u32()?,
                r.u32()?,
                r.string()?.to_string(),
                r.u64()?,
                r.string()?.to_string(),
                r.u64()?,
            ))
        })?;
        for (ts_ns, cpu, pid, tid, comm, stack_id, workload, count) in bytes_rows {
            let stack = match self.stacks.get(&stack_id) {
                Some(s) => s.clone(),
                None => {
                    let missing = Arc::new(Stack::new(vec![self.intern(MISSING_STACK)], 1));
                    self.stacks.insert(stack_id, missing.clone());
                    missing
                }
            };
            let sample = Sample {
                ts_ns,
                cpu: u32::from(cpu),
                pid,
                tid,
                cgroup_id: 0,
                comm: self.intern(&comm),
                stack,
                workload: self.intern(&workload),
            };
            let (hz, kind) = (self.hz, self.kind);
            let w = self.writer(hz, ts_ns)?;
            if kind == SampleKind::Cpu {
                // A rolled-up row comes back as the samples it stands for.
                for _ in 0..count.max(1) {
                    w.push(&sample);
                }
                self.samples += count.max(1);
            } else {
                // A weighted row, as the daemon writes it.
                w.push_weighted(&sample, count);
                self.samples += 1;
            }
        }
        Ok(())
    }
}

/// The node's findings (latest state of each) and events, into the copy's logs.
fn copy_notes(fleet: &Fleet, node: &Node, dir: &Path) -> Result<(), FleetError> {
    let one = super::Selection { nodes: vec![node.clone()], whole_fleet: false };
    for f in super::notes::findings(fleet, &one, None)? {
        detect::journal::record_finding(dir, &f.finding)?;
    }
    for e in super::notes::events(fleet, &one, None)? {
        detect::journal::record_event(dir, &e.event)?;
    }
    Ok(())
}
