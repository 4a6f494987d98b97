//! Answers window queries over the store: which samples fall in `[from, to)` and match the
//! filters, folded into stacks with counts.

use std::{collections::BTreeMap, path::PathBuf};

use crate::{
    store::{
        Meta, Store, StoreError,
        format::Dict,
        reader::{BlockView, Need, Visitor},
    },
    timespec::{format, format_duration},
};

/// Root frame of idle samples when `--include-idle` brings them into a flamegraph.
pub const IDLE_FRAME: &str = "[idle]";
/// Suffix that marks kernel frames in folded output (as `stackcollapse-perf --all` does).
pub const KERNEL_SUFFIX: &str = "_[k]";

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("--from ({from}) is after --to ({to}): swap them")]
    Reversed { from: String, to: String },
    #[error("the window is empty: --from and --to are both {0}")]
    Empty(String),
    #[error("CPU {cpu} does not exist on the profiled machine (it has CPUs 0-{last})")]
    UnknownCpu { cpu: u32, last: u32 },
    #[error("no samples between {from} and {to} in {dir} ({held})")]
    NoData { from: String, to: String, dir: PathBuf, held: String },
    #[error(
        "no samples match {filter} between {from} and {to} ({total} samples of other processes or CPUs in that window)"
    )]
    NoMatch { filter: String, from: String, to: String, total: u64 },
    #[error(
        "the window is too long for this view ({cells} cells, at most {max}): narrow it, or use fewer rows or wider buckets"
    )]
    TooLong { cells: u64, max: u64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Cells a heatmap or CPU x time grid may have: enough for days of seconds, bounded memory.
pub const MAX_CELLS: u64 = 20_000_000;

/// Which samples a query keeps.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Empty: every CPU.
    pub cpus: Vec<u32>,
    pub pid: Option<u32>,
    pub comm: Option<String>,
    pub include_idle: bool,
}

impl Filter {
    fn cpu_ok(&self, cpu: u32) -> bool {
        self.cpus.is_empty() || self.cpus.contains(&cpu)
    }

    /// Idle samples belong to pid 0 and no comm.
    fn idle_ok(&self, cpu: u32) -> bool {
        self.include_idle && self.cpu_ok(cpu) && self.pid.is_none_or(|p| p == 0) && self.comm.is_none()
    }

    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.cpus.is_empty() {
            parts.push(self.cpus.iter().map(|c| format!("--cpu {c}")).collect::<Vec<_>>().join(" "));
        }
        if let Some(p) = self.pid {
            parts.push(format!("--pid {p}"));
        }
        if let Some(c) = &self.comm {
            parts.push(format!("--comm {c}"));
        }
        if parts.is_empty() { "the filters".into() } else { parts.join(" ") }
    }
}

/// A half-open time window `[from_ns, to_ns)`, ns since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub from_ns: u64,
    pub to_ns: u64,
}

impl Window {
    pub fn new(from_ns: u64, to_ns: u64) -> Result<Self, QueryError> {
        if from_ns > to_ns {
            return Err(QueryError::Reversed { from: format(from_ns), to: format(to_ns) });
        }
        if from_ns == to_ns {
            return Err(QueryError::Empty(format(from_ns)));
        }
        Ok(Self { from_ns, to_ns })
    }

    pub fn contains(&self, ts: u64) -> bool {
        (self.from_ns..self.to_ns).contains(&ts)
    }
}

/// Stacks folded to counts, plus the per-CPU totals behind them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Folded {
    /// Folded line (without the count) → samples. (Fx: lines are long, and SipHash over
    /// kilobytes per line was a third of a query's time.)
    pub stacks: rustc_hash::FxHashMap<String, u64>,
    /// Matching samples per CPU: (non-idle, idle).
    pub per_cpu: BTreeMap<u32, (u64, u64)>,
}

impl Folded {
    pub fn total(&self) -> u64 {
        self.stacks.values().sum()
    }

    /// `stack count` lines, sorted, as inferno and `flamegraph.pl` read them.
    pub fn lines(&self) -> Vec<String> {
        let mut v: Vec<_> = self.stacks.iter().map(|(s, c)| format!("{s} {c}")).collect();
        v.sort_unstable();
        v
    }
}

/// Frame names can not contain the folded format's separators: `;` becomes `:`, and control
/// characters (a process can put a newline in its comm) become `?`.
/// One name of a folded line, by the folded format's rule (`text::folded_frame`). `user`: the comm
/// or a user-space frame, which must not end like the kernel mark.
fn push_name(line: &mut String, name: &str, user: bool) {
    line.push_str(&crate::text::folded_frame(name, user));
}

/// The folded line of one stored stack: comm, user frames, kernel frames marked `_[k]`.
pub fn fold_line(dict: &Dict, comm: u32, stack: u32) -> String {
    fold_line_with(dict, comm, stack, &mut Vec::new())
}

/// [`fold_line`] with a caller-provided scratch buffer.
fn fold_line_with(dict: &Dict, comm: u32, stack: u32, frames: &mut Vec<(u32, bool)>) -> String {
    let mut line = String::with_capacity(256);
    push_name(&mut line, &dict.strings[comm as usize], true);
    dict.frames(stack, frames);
    for &(f, kernel) in frames.iter() {
        line.push(';');
        push_name(&mut line, &dict.strings[f as usize], !kernel);
        if kernel {
            line.push_str(KERNEL_SUFFIX);
        }
    }
    line
}

/// Validates the filter against the machine the store came from.
pub fn check_filter(filter: &Filter, meta: Option<&Meta>) -> Result<(), QueryError> {
    if let Some(meta) = meta
        && let Some(&cpu) = filter.cpus.iter().find(|&&c| c >= meta.cpus)
    {
        return Err(QueryError::UnknownCpu { cpu, last: meta.cpus.saturating_sub(1) });
    }
    Ok(())
}

/// What the store holds, as the tail of a "no data" sentence.
fn held(store: &mut Store) -> Result<String, StoreError> {
    Ok(match store.span()? {
        None => "the store is empty: is the daemon running?".into(),
        Some((a, b)) => format!("it holds {} to {}, {}", format(a), format(b), format_duration(b - a)),
    })
}

/// Folds blocks as a scan hands them over: counts per (comm, stack) id while a dictionary
/// lasts, turned into folded lines once per dictionary rather than once per block.
struct FoldVisitor<'a> {
    window: Window,
    filter: &'a Filter,
    counts: rustc_hash::FxHashMap<(u32, u32), u64>,
    folded: Folded,
    in_window: u64,
}

impl Visitor for FoldVisitor<'_> {
    fn block(&mut self, b: BlockView<'_>) {
        let (Some(samples), Some(summary)) = (b.samples, b.summary) else { return };
        let comm_id = self.filter.comm.as_deref().map(|c| b.dict.strings.iter().position(|s| s == c));
        for (i, ts) in samples.timestamps(b.header.start_ns).enumerate() {
            if !self.window.contains(ts) {
                continue;
            }
            let n = samples.count(i);
            self.in_window += n;
            let cpu = samples.cpu[i];
            if !self.filter.cpu_ok(cpu)
                || self.filter.pid.is_some_and(|p| p != samples.pid[i])
                || comm_id.is_some_and(|id| id != Some(samples.comm[i] as usize))
            {
                continue;
            }
            *self.counts.entry((samples.comm[i], samples.stack[i])).or_default() += n;
            self.folded.per_cpu.entry(cpu).or_default().0 += n;
        }
        // Idle counts are per block (one second): kept when the block lies inside the window,
        // so a window that cuts a second in two does not count its idle samples twice.
        if b.header.start_ns >= self.window.from_ns && b.header.end_ns <= self.window.to_ns {
            for c in summary.cpus.iter().filter(|c| c.idle > 0) {
                self.in_window += c.idle;
                if self.filter.idle_ok(c.cpu) {
                    self.folded.per_cpu.entry(c.cpu).or_default().1 += c.idle;
                    *self.folded.stacks.entry(IDLE_FRAME.to_string()).or_default() += c.idle;
                }
            }
        }
    }

    fn dict_done(&mut self, dict: &Dict) {
        let mut scratch = Vec::new();
        for ((comm, stack), n) in self.counts.drain() {
            *self.folded.stacks.entry(fold_line_with(dict, comm, stack, &mut scratch)).or_default() += n;
        }
    }
}

/// Folds the samples of `window` that match `filter`.
pub fn fold(store: &mut Store, window: Window, filter: &Filter) -> Result<Folded, QueryError> {
    check_filter(filter, Meta::read(store.data_dir()).as_ref())?;
    let mut v = FoldVisitor { window, filter, counts: Default::default(), folded: Folded::default(), in_window: 0 };
    store.scan(window.from_ns, window.to_ns, Need::Samples, &mut v)?;
    let FoldVisitor { folded, in_window, .. } = v;
    if folded.stacks.is_empty() {
        let (from, to) = (format(window.from_ns), format(window.to_ns));
        if in_window == 0 {
            return Err(QueryError::NoData { from, to, dir: store.data_dir().to_path_buf(), held: held(store)? });
        }
        return Err(QueryError::NoMatch { filter: filter.describe(), from, to, total: in_window });
    }
    Ok(folded)
}

/// FlameScope's subsecond grid: busy samples per (second, offset-within-the-second row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grid {
    /// Unix second of the first column.
    pub first_second: u64,
    pub rows: usize,
    /// `counts[column][row]`, row 0 = offset 0.
    pub counts: Vec<Vec<u64>>,
}

/// The subsecond grid of `window`. Without filters, and when rows divide the 10 ms buckets of
/// the block summaries, it is computed from summaries alone (no sample is decoded).
pub fn subsecond_grid(store: &mut Store, window: Window, rows: usize, filter: &Filter) -> Result<Grid, QueryError> {
    use crate::store::format::{BUCKET_NS, BUCKETS_PER_SEC, NS_PER_SEC};
    let rows = rows.clamp(1, 1000);
    let first = window.from_ns / NS_PER_SEC;
    let columns = (window.to_ns.div_ceil(NS_PER_SEC) - first) as usize;
    let cells = columns as u64 * rows as u64;
    if cells > MAX_CELLS {
        return Err(QueryError::TooLong { cells, max: MAX_CELLS });
    }
    let mut counts = vec![vec![0u64; rows]; columns];
    let unfiltered = filter.cpus.is_empty() && filter.pid.is_none() && filter.comm.is_none();
    let aligned = window.from_ns.is_multiple_of(BUCKET_NS) && window.to_ns.is_multiple_of(BUCKET_NS);
    if unfiltered && aligned && BUCKETS_PER_SEC.is_multiple_of(rows) {
        let per_row = BUCKETS_PER_SEC / rows;
        store.scan(window.from_ns, window.to_ns, Need::Summary, &mut |b: BlockView<'_>| {
            let summary = b.summary.expect("summary decoded");
            let Some(col) = (b.header.start_ns / NS_PER_SEC).checked_sub(first).map(|c| c as usize) else { return };
            for (i, &n) in summary.buckets.iter().enumerate() {
                let t = b.header.start_ns + i as u64 * BUCKET_NS;
                if let Some(cell) = counts.get_mut(col).and_then(|c| c.get_mut(i / per_row))
                    && window.contains(t)
                {
                    *cell += u64::from(n);
                }
            }
        })?;
    } else {
        let comm = filter.comm.clone();
        store.scan(window.from_ns, window.to_ns, Need::Samples, &mut |b: BlockView<'_>| {
            // Rolled-up blocks keep no subsecond times: they have no place in a heatmap.
            if b.header.flags & crate::store::format::FLAG_ROLLUP != 0 {
                return;
            }
            let s = b.samples.expect("samples decoded");
            let comm_id = comm.as_deref().map(|c| b.dict.strings.iter().position(|x| x == c));
            for (i, ts) in s.timestamps(b.header.start_ns).enumerate() {
                if !window.contains(ts)
                    || !filter.cpu_ok(s.cpu[i])
                    || filter.pid.is_some_and(|p| p != s.pid[i])
                    || comm_id.is_some_and(|id| id != Some(s.comm[i] as usize))
                {
                    continue;
                }
                let col = (ts / NS_PER_SEC - first) as usize;
                let row = ((ts % NS_PER_SEC) * rows as u64 / NS_PER_SEC) as usize;
                counts[col][row] += s.count(i);
            }
        })?;
    }
    Ok(Grid { first_second: first, rows, counts })
}

/// Per-CPU busy and kernel-mode shares over time buckets.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CpuTime {
    /// Start of the first bucket, ns since the epoch.
    pub first_ns: u64,
    pub bucket_ns: u64,
    /// CPU ids, one row each.
    pub cpus: Vec<u32>,
    /// `busy[row][bucket]`: busy ticks over the ticks the frequency gives a CPU in a bucket.
    pub busy: Vec<Vec<f64>>,
    /// `kernel[row][bucket]`: the part of `busy` spent in kernel mode.
    pub kernel: Vec<Vec<f64>>,
}

/// CPU x time for `window` in buckets of `bucket_ns` (10 ms or more). Buckets of whole seconds
/// come from block summaries; finer ones from the samples.
pub fn cpu_time(
    store: &mut Store,
    window: Window,
    bucket_ns: u64,
    cpus: u32,
    frequency_hz: u64,
) -> Result<CpuTime, QueryError> {
    use crate::store::format::{BUCKET_NS, NS_PER_SEC};
    let bucket_ns = bucket_ns.max(BUCKET_NS) / BUCKET_NS * BUCKET_NS;
    let first_ns = window.from_ns / bucket_ns * bucket_ns;
    let n = (window.to_ns - first_ns).div_ceil(bucket_ns) as usize;
    let rows = cpus.max(1) as usize;
    let cells = n as u64 * rows as u64;
    if cells > MAX_CELLS {
        return Err(QueryError::TooLong { cells, max: MAX_CELLS });
    }
    let mut busy = vec![vec![0f64; n]; rows];
    let mut kernel = vec![vec![0f64; n]; rows];
    let col = |ts: u64| ((ts - first_ns) / bucket_ns) as usize;
    if bucket_ns.is_multiple_of(NS_PER_SEC) {
        store.scan(window.from_ns, window.to_ns, Need::Summary, &mut |b: BlockView<'_>| {
            // A block's counts spread evenly over the buckets its span overlaps (a rolled-up
            // block spans ten seconds).
            let (start, end) = (b.header.start_ns.max(first_ns), b.header.end_ns.min(first_ns + n as u64 * bucket_ns));
            if end <= start {
                return;
            }
            let span = (b.header.end_ns - b.header.start_ns) as f64;
            for x in &b.summary.expect("summary decoded").cpus {
                let Some(row) = busy.get_mut(x.cpu as usize) else { continue };
                let mut t = start;
                while t < end {
                    let c = col(t);
                    let stop = (first_ns + (c as u64 + 1) * bucket_ns).min(end);
                    let part = (stop - t) as f64 / span;
                    row[c] += x.busy as f64 * part;
                    kernel[x.cpu as usize][c] += x.kernel as f64 * part;
                    t = stop;
                }
            }
        })?;
    } else {
        store.scan(window.from_ns, window.to_ns, Need::Samples, &mut |b: BlockView<'_>| {
            let s = b.samples.expect("samples decoded");
            for (i, ts) in s.timestamps(b.header.start_ns).enumerate() {
                let cpu = s.cpu[i] as usize;
                if !window.contains(ts) || cpu >= rows {
                    continue;
                }
                busy[cpu][col(ts)] += s.count(i) as f64;
                if b.dict.nodes.get(s.stack[i] as usize).is_some_and(|node| node.kernel) {
                    kernel[cpu][col(ts)] += s.count(i) as f64;
                }
            }
        })?;
    }
    let expected = (frequency_hz.max(1) as f64 * bucket_ns as f64 / NS_PER_SEC as f64).max(1e-9);
    let share = |v: Vec<Vec<f64>>| -> Vec<Vec<f64>> {
        v.into_iter().map(|r| r.into_iter().map(|x| (x / expected).min(1.0)).collect()).collect()
    };
    Ok(CpuTime { first_ns, bucket_ns, cpus: (0..rows as u32).collect(), busy: share(busy), kernel: share(kernel) })
}

/// One sample as exporters see it.
pub struct SampleRef<'a> {
    pub ts_ns: u64,
    pub cpu: u32,
    pub pid: u32,
    pub tid: u32,
    pub comm: &'a str,
    /// Root first: (name, kernel frame?).
    pub frames: &'a [(&'a str, bool)],
    /// Samples this row stands for (1 but in rolled-up data).
    pub count: u64,
}

/// Calls `f` for every non-idle sample of `window` that matches `filter`, in time order per
/// block.
pub fn for_each_sample(
    store: &mut Store,
    window: Window,
    filter: &Filter,
    mut f: impl FnMut(&SampleRef<'_>),
) -> Result<u64, QueryError> {
    check_filter(filter, Meta::read(store.data_dir()).as_ref())?;
    let mut n = 0;
    let mut ids = Vec::new();
    store.scan(window.from_ns, window.to_ns, Need::Samples, &mut |b: BlockView<'_>| {
        let s = b.samples.expect("samples decoded");
        let comm_id = filter.comm.as_deref().map(|c| b.dict.strings.iter().position(|x| x == c));
        let mut order: Vec<(u64, usize)> = s.timestamps(b.header.start_ns).enumerate().map(|(i, t)| (t, i)).collect();
        order.sort_unstable();
        for (ts, i) in order {
            if !window.contains(ts)
                || !filter.cpu_ok(s.cpu[i])
                || filter.pid.is_some_and(|p| p != s.pid[i])
                || comm_id.is_some_and(|id| id != Some(s.comm[i] as usize))
            {
                continue;
            }
            b.dict.frames(s.stack[i], &mut ids);
            let frames: Vec<(&str, bool)> =
                ids.iter().map(|&(f, k)| (b.dict.strings[f as usize].as_str(), k)).collect();
            n += s.count(i);
            f(&SampleRef {
                ts_ns: ts,
                cpu: s.cpu[i],
                pid: s.pid[i],
                tid: s.tid[i],
                comm: &b.dict.strings[s.comm[i] as usize],
                frames: &frames,
                count: s.count(i),
            });
        }
    })?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        model::{Sample, Stack},
        store::{StoreWriter, format::NS_PER_SEC, segments_dir, writer::WriterLimits},
    };

    const T0: u64 = 1_795_000_000 * NS_PER_SEC; // on a minute boundary

    fn stack(user: &[&str], kernel: &[&str]) -> Arc<Stack> {
        let frames = user.iter().chain(kernel).map(|f| Arc::from(*f)).collect();
        Arc::new(Stack { frames, user_len: user.len() })
    }

    /// A deterministic mix: 3 CPUs, 4 processes, 3 stacks, spread over 130 s (3 segments).
    fn samples() -> Vec<Sample> {
        let stacks = [
            stack(&["main", "spin"], &[]),
            stack(&["main", "read"], &["ksys_read", "vfs_read"]),
            stack(&[], &["kthread", "worker"]),
        ];
        let comms: [Arc<str>; 4] = ["app".into(), "db".into(), "kworker/0:1".into(), "semi;colon".into()];
        (0..5000u64)
            .map(|i| {
                let x = i.wrapping_mul(2654435761) % 1000;
                Sample {
                    ts_ns: T0 + i * 26_000_000 + x * 1000,
                    cpu: (x % 3) as u32,
                    pid: 100 + (x % 4) as u32,
                    tid: 1000 + (x % 7) as u32,
                    cgroup_id: x % 5,
                    comm: comms[(x % 4) as usize].clone(),
                    stack: stacks[(x % 3) as usize].clone(),
                }
            })
            .collect()
    }

    fn write_store(samples: &[Sample], idle: &[(u64, u32)]) -> (tempfile::TempDir, Store) {
        write_store_with(samples, idle, WriterLimits::default())
    }

    fn write_store_with(samples: &[Sample], idle: &[(u64, u32)], limits: WriterLimits) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        crate::store::create_and_lock(dir.path()).unwrap();
        let mut w = StoreWriter::with_limits(&segments_dir(dir.path()), limits);
        for (i, s) in samples.iter().enumerate() {
            w.push(s);
            if i % 700 == 0 {
                w.flush(s.ts_ns).unwrap(); // several blocks per second, as the daemon writes them
            }
        }
        for &(ts, cpu) in idle {
            w.push_idle(ts, cpu);
        }
        w.add_lost(2, 5);
        w.flush(T0).unwrap();
        let store = Store::open(dir.path()).unwrap();
        (dir, store)
    }

    /// What `fold` should return, computed the obvious way.
    pub(super) fn naive(samples: &[Sample], w: Window, f: &Filter) -> rustc_hash::FxHashMap<String, u64> {
        let mut out = rustc_hash::FxHashMap::default();
        for s in samples.iter().filter(|s| {
            w.contains(s.ts_ns)
                && (f.cpus.is_empty() || f.cpus.contains(&s.cpu))
                && f.pid.is_none_or(|p| p == s.pid)
                && f.comm.as_deref().is_none_or(|c| c == &*s.comm)
        }) {
            let mut line = s.comm.replace(';', ":");
            for (i, fr) in s.stack.frames.iter().enumerate() {
                line.push(';');
                line.push_str(&fr.replace(';', ":"));
                if i >= s.stack.user_len {
                    line.push_str("_[k]");
                }
            }
            *out.entry(line).or_default() += 1;
        }
        out
    }

    #[test]
    fn store_round_trip_keeps_every_field() {
        let input = samples();
        let (_dir, mut store) = write_store(&input, &[]);
        let mut got = Vec::new();
        store
            .scan(0, u64::MAX, Need::Samples, &mut |v: BlockView<'_>| {
                let (b, h, d) = (v.samples.unwrap(), v.header, v.dict);
                for (i, ts) in b.timestamps(h.start_ns).enumerate() {
                    assert!((h.start_ns..h.end_ns).contains(&ts));
                    let mut nodes = Vec::new();
                    d.frames(b.stack[i], &mut nodes);
                    let user_len = nodes.iter().filter(|(_, k)| !k).count();
                    let frames = nodes.iter().map(|&(f, _)| Arc::from(d.strings[f as usize].as_str())).collect();
                    got.push(Sample {
                        ts_ns: ts,
                        cpu: b.cpu[i],
                        pid: b.pid[i],
                        tid: b.tid[i],
                        cgroup_id: b.cgroup[i],
                        comm: Arc::from(d.strings[b.comm[i] as usize].as_str()),
                        stack: Arc::new(Stack { frames, user_len }),
                    });
                }
            })
            .unwrap();
        got.sort_by_key(|s| (s.ts_ns, s.tid));
        let mut want = input.clone();
        want.sort_by_key(|s| (s.ts_ns, s.tid));
        assert_eq!(got, want);
        assert!(store.take_warnings().is_empty());
        assert_eq!(store.segments().unwrap().len(), 3);
    }

    #[test]
    fn fold_equals_naive_count_for_windows_and_filters() {
        let input = samples();
        let (_dir, mut store) = write_store(&input, &[]);
        let windows = [(0, 130), (5, 6), (59, 61), (17, 95), (0, 1)];
        let filters = [
            Filter::default(),
            Filter { cpus: vec![1], ..Default::default() },
            Filter { cpus: vec![0, 2], pid: Some(101), ..Default::default() },
            Filter { comm: Some("db".into()), ..Default::default() },
            Filter { comm: Some("semi;colon".into()), ..Default::default() },
        ];
        for (a, b) in windows {
            let w = Window::new(T0 + a * NS_PER_SEC + 123, T0 + b * NS_PER_SEC + 456).unwrap();
            for f in &filters {
                let want = naive(&input, w, f);
                match fold(&mut store, w, f) {
                    Ok(got) => assert_eq!(got.stacks, want, "window {a}..{b}, {f:?}"),
                    Err(e) => assert!(want.is_empty(), "window {a}..{b}, {f:?}: {e}"),
                }
            }
        }
    }

    #[test]
    fn subsecond_grid_from_summaries_equals_the_one_from_samples() {
        let input = samples();
        let (_dir, mut store) = write_store(&input, &[]);
        let w = Window::new(T0, T0 + 130 * NS_PER_SEC).unwrap();
        let fast = subsecond_grid(&mut store, w, 50, &Filter::default()).unwrap();
        // Forcing the sample path with a filter that keeps everything.
        let all_cpus = Filter { cpus: vec![0, 1, 2], ..Default::default() };
        let slow = subsecond_grid(&mut store, w, 50, &all_cpus).unwrap();
        assert_eq!(fast, slow);
        let mut naive = vec![vec![0u64; 50]; 130];
        for s in &input {
            let off = s.ts_ns - T0;
            naive[(off / NS_PER_SEC) as usize][((off % NS_PER_SEC) / 20_000_000) as usize] += 1;
        }
        assert_eq!(fast.counts, naive);
        assert_eq!(fast.first_second, T0 / NS_PER_SEC);
    }

    #[test]
    fn heatmap_json_equals_a_naive_count_cell_for_cell() {
        let input = samples();
        let (_dir, mut store) = write_store(&input, &[]);
        // A window that starts mid-second: the first column is the floor of its first second.
        let from = T0 + 7 * NS_PER_SEC + 300_000_000;
        let w = Window::new(from, T0 + 100 * NS_PER_SEC).unwrap();
        for filter in [Filter::default(), Filter { cpus: vec![2], ..Default::default() }] {
            let grid = subsecond_grid(&mut store, w, 50, &filter).unwrap();
            let fs = crate::export::heatmap::flamescope(&grid);
            assert_eq!(grid.first_second, from / NS_PER_SEC);
            let mut naive = vec![vec![0u64; 50]; fs.columns.len()];
            for s in
                input.iter().filter(|s| w.contains(s.ts_ns) && (filter.cpus.is_empty() || filter.cpus.contains(&s.cpu)))
            {
                let col = (s.ts_ns / NS_PER_SEC - grid.first_second) as usize;
                let row_ms = (s.ts_ns % NS_PER_SEC) / 20_000_000 * 20;
                // rows[i] is the row's offset in ms, listed from 980 down to 0.
                let i = fs.rows.iter().position(|&r| r == row_ms as f64).unwrap();
                naive[col][i] += 1;
            }
            assert_eq!(fs.values, naive);
            assert_eq!(fs.maxvalue, naive.iter().flatten().copied().max().unwrap());
        }
    }

    #[test]
    fn perf_script_export_parses_back_to_the_folded_counts() {
        let input = samples();
        let (_dir, mut store) = write_store(&input, &[]);
        let w = Window::new(T0, T0 + 130 * NS_PER_SEC).unwrap();
        let mut text = Vec::new();
        crate::export::perf_script::write_header(&mut text).unwrap();
        for_each_sample(&mut store, w, &Filter::default(), |s| {
            crate::export::perf_script::write_sample(s, &mut text).unwrap()
        })
        .unwrap();
        let parsed = crate::export::perf_script::parse(&String::from_utf8(text).unwrap());
        assert_eq!(parsed.len(), input.len());
        let mut got: rustc_hash::FxHashMap<String, u64> = Default::default();
        for p in &parsed {
            let mut line = p.comm.replace(';', ":");
            for (f, k) in &p.frames {
                line.push(';');
                line.push_str(&f.replace(';', ":"));
                if *k {
                    line.push_str("_[k]");
                }
            }
            *got.entry(line).or_default() += 1;
        }
        assert_eq!(got, naive(&input, w, &Filter::default()));
        let mut times: Vec<u64> = parsed.iter().map(|p| p.ts_us).collect();
        let mut want: Vec<u64> = input.iter().map(|s| s.ts_ns / 1000).collect();
        times.sort_unstable();
        want.sort_unstable();
        assert_eq!(times, want);
    }

    #[test]
    fn names_cannot_forge_folded_lines_and_huge_grids_are_refused() {
        let mut dict = Dict { strings: vec!["evil 999999\nfake".into(), "f;g".into()], ..Default::default() };
        dict.nodes.push(crate::store::format::Node { parent: 0, frame: 1, kernel: true });
        // Control characters are shown as escapes (`text::visible`), not `?`.
        assert_eq!(fold_line(&dict, 0, 1), "evil 999999\\nfake;f:g_[k]");
        let mut dict = Dict { strings: vec!["x 12".into(), "x_[k]".into()], ..Default::default() };
        dict.nodes.push(crate::store::format::Node { parent: 0, frame: 1, kernel: false });
        assert_eq!(fold_line(&dict, 0, 1), "x_12;x_{k}", "a user frame cannot pass for a kernel one");
        let (_dir, mut store) = write_store(&samples()[..10], &[]);
        let w = Window::new(1, T0).unwrap();
        assert!(matches!(subsecond_grid(&mut store, w, 50, &Filter::default()), Err(QueryError::TooLong { .. })));
        assert!(matches!(cpu_time(&mut store, w, 10_000_000, 4, 99), Err(QueryError::TooLong { .. })));
    }

    #[test]
    fn a_tiny_dictionary_cap_resets_often_and_loses_nothing() {
        let input = samples();
        let (_dir, mut store) = write_store_with(&input, &[], WriterLimits { dict_cap: 3, max_pending: 1 << 20 });
        let w = Window::new(T0, T0 + 200 * NS_PER_SEC).unwrap();
        let got = fold(&mut store, w, &Filter::default()).unwrap();
        assert_eq!(got.stacks, naive(&input, w, &Filter::default()));
        assert!(store.take_warnings().is_empty());
    }

    #[test]
    fn rolled_up_segments_keep_flamegraphs_at_ten_second_resolution() {
        let input = samples();
        let (_dir, mut store) = write_store(&input, &[(T0 + 5, 0), (T0 + 15 * NS_PER_SEC, 1)]);
        let before = store.summary().unwrap();
        for (_, path) in store.segments().unwrap() {
            let r = crate::store::rollup::rollup_segment(&path).unwrap().expect("raw segment rolls up");
            assert!(r.rows < r.samples && r.bytes_after < r.bytes_before, "{r:?}");
            assert_eq!(crate::store::rollup::rollup_segment(&path).unwrap(), None, "rolled twice");
        }
        let after = store.summary().unwrap();
        assert_eq!(before.cpus, after.cpus);
        let filters = [
            Filter::default(),
            Filter { cpus: vec![2], ..Default::default() },
            Filter { pid: Some(103), comm: Some("semi;colon".into()), ..Default::default() },
        ];
        for (a, b) in [(0, 130), (10, 60), (60, 120)] {
            let w = Window::new(T0 + a * NS_PER_SEC, T0 + b * NS_PER_SEC).unwrap();
            for f in &filters {
                assert_eq!(fold(&mut store, w, f).unwrap().stacks, naive(&input, w, f), "{a}..{b} {f:?}");
            }
        }
        let idle = fold(
            &mut store,
            Window::new(T0, T0 + 20 * NS_PER_SEC).unwrap(),
            &Filter { include_idle: true, ..Default::default() },
        );
        assert_eq!(idle.unwrap().stacks[IDLE_FRAME], 2);
        assert!(store.take_warnings().is_empty());
    }

    #[test]
    fn idle_counts_per_cpu_only_with_include_idle_and_whole_seconds() {
        let input = samples();
        // 10 idle samples on CPU 0 and 4 on CPU 1 in second 3; 7 on CPU 0 in second 4.
        let mut idle: Vec<(u64, u32)> = (0..10).map(|i| (T0 + 3 * NS_PER_SEC + i * 1_000_000, 0)).collect();
        idle.extend((0..4).map(|i| (T0 + 3 * NS_PER_SEC + i, 1)));
        idle.extend((0..7).map(|i| (T0 + 4 * NS_PER_SEC + i, 0)));
        let (_dir, mut store) = write_store(&input, &idle);
        let whole = Window::new(T0 + 3 * NS_PER_SEC, T0 + 5 * NS_PER_SEC).unwrap();
        let busy = fold(&mut store, whole, &Filter::default()).unwrap();
        assert!(!busy.stacks.contains_key(IDLE_FRAME));
        let with_idle = fold(&mut store, whole, &Filter { include_idle: true, ..Default::default() }).unwrap();
        assert_eq!(with_idle.stacks[IDLE_FRAME], 21);
        assert_eq!(with_idle.per_cpu[&0].1, 17);
        assert_eq!(with_idle.per_cpu[&1].1, 4);
        let cpu1 =
            fold(&mut store, whole, &Filter { include_idle: true, cpus: vec![1], ..Default::default() }).unwrap();
        assert_eq!(cpu1.stacks[IDLE_FRAME], 4);
        // Half of second 4 only: its idle count cannot be split, so it is left out.
        let half = Window::new(T0 + 3 * NS_PER_SEC, T0 + 4 * NS_PER_SEC + NS_PER_SEC / 2).unwrap();
        let h = fold(&mut store, half, &Filter { include_idle: true, ..Default::default() }).unwrap();
        assert_eq!(h.stacks[IDLE_FRAME], 14);
        // Idle samples belong to no process: a pid or comm filter drops them.
        let p = fold(&mut store, whole, &Filter { include_idle: true, pid: Some(100), ..Default::default() }).unwrap();
        assert!(!p.stacks.contains_key(IDLE_FRAME));
        // And the store's summary counts them, with the lost samples.
        let s = store.summary().unwrap();
        assert_eq!(s.cpus[&0].idle, 17);
        assert_eq!(s.cpus[&2].lost, 5);
        assert_eq!(s.cpus.values().map(|c| c.samples).sum::<u64>(), input.len() as u64);
    }

    #[test]
    fn empty_windows_say_what_the_store_holds() {
        let (_dir, mut store) = write_store(&samples(), &[]);
        let before = Window::new(T0 - 100 * NS_PER_SEC, T0 - 50 * NS_PER_SEC).unwrap();
        let err = fold(&mut store, before, &Filter::default()).unwrap_err().to_string();
        assert!(err.contains("no samples between") && err.contains("it holds 2026-"), "{err}");
        let w = Window::new(T0, T0 + 10 * NS_PER_SEC).unwrap();
        let err = fold(&mut store, w, &Filter { pid: Some(4242), ..Default::default() }).unwrap_err().to_string();
        assert!(err.contains("no samples match --pid 4242"), "{err}");
        assert!(matches!(Window::new(5, 4), Err(QueryError::Reversed { .. })));
        assert!(matches!(Window::new(5, 5), Err(QueryError::Empty(_))));
    }

    #[test]
    fn unknown_cpu_is_refused_when_the_machine_is_known() {
        let meta = Meta { format_version: 1, hostname: "h".into(), cpus: 2, frequency_hz: 99, started_ns: 0 };
        let f = Filter { cpus: vec![0, 7], ..Default::default() };
        let err = check_filter(&f, Some(&meta)).unwrap_err().to_string();
        assert_eq!(err, "CPU 7 does not exist on the profiled machine (it has CPUs 0-1)");
        assert!(check_filter(&f, None).is_ok());
    }

    #[test]
    fn torn_tail_is_cut_and_later_blocks_stay_readable() {
        let input = samples();
        let (dir, mut store) = write_store(&input[..100], &[]);
        let (_, path) = store.segments().unwrap()[0].clone();
        // A daemon killed mid-write: half a block at the end.
        let len = std::fs::metadata(&path).unwrap().len();
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        std::io::Write::write_all(&mut f, b"PBLK\x20\x00\x00\x00half a block").unwrap();
        let torn = fold(&mut store, Window::new(T0, T0 + 60 * NS_PER_SEC).unwrap(), &Filter::default()).unwrap();
        assert_eq!(torn.total(), 100);
        assert!(store.take_warnings().is_empty(), "an incomplete tail is not a warning");
        // The next daemon cuts the tail before appending.
        let mut w = StoreWriter::new(&segments_dir(dir.path()));
        for s in &input[100..200] {
            w.push(s);
        }
        w.flush(T0).unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() > len);
        let all = fold(&mut store, Window::new(T0, T0 + 60 * NS_PER_SEC).unwrap(), &Filter::default()).unwrap();
        assert_eq!(all.total(), 200);
        assert!(store.take_warnings().is_empty());
    }

    #[test]
    fn corrupt_bytes_are_skipped_with_a_warning_naming_the_file() {
        let (_dir, mut store) = write_store(&samples(), &[]);
        let (_, path) = store.segments().unwrap()[1].clone();
        let mut bytes = std::fs::read(&path).unwrap();
        // Inside the first block's first section (a flipped length field would look like a
        // write in progress instead).
        let inside = crate::store::format::SEGMENT_HEADER_LEN + crate::store::format::BLOCK_HEADER_LEN + 2;
        bytes[inside] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let w = Window::new(T0, T0 + 200 * NS_PER_SEC).unwrap();
        let got = fold(&mut store, w, &Filter::default()).unwrap();
        assert!(got.total() > 0 && got.total() < 5000);
        let warnings = store.take_warnings();
        assert!(warnings.iter().any(|w| w.contains("checksum mismatch")), "{warnings:?}");
        assert!(warnings.iter().any(|w| w.contains(path.to_str().unwrap())), "{warnings:?}");
        // A segment of another version is skipped, named.
        bytes[8] = 9;
        std::fs::write(&path, &bytes).unwrap();
        fold(&mut store, w, &Filter::default()).unwrap();
        let warnings = store.take_warnings();
        assert!(warnings.iter().any(|w| w.contains("version 9")), "{warnings:?}");
        // Zero-length and truncated-header files: skipped, named.
        std::fs::write(&path, b"").unwrap();
        fold(&mut store, w, &Filter::default()).unwrap();
        let warnings = store.take_warnings();
        assert!(warnings.iter().any(|w| w.contains(path.to_str().unwrap()) && w.contains("shorter")), "{warnings:?}");
    }
}

#[cfg(test)]
mod properties {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;
    use crate::{
        model::{Sample, Stack},
        store::{StoreWriter, format::NS_PER_SEC, segments_dir, writer::WriterLimits},
    };

    const T0: u64 = 1_795_000_000 * NS_PER_SEC;

    fn arb_sample() -> impl Strategy<Value = Sample> {
        let frame = prop::sample::select(vec!["main", "spin", "a;b", "read", "vfs_read", "x y", "é"]);
        (
            0u64..150_000_000, // µs within 150 s: three segments
            0u32..4,
            1u32..5,
            prop::sample::select(vec!["app", "db", "semi;colon"]),
            prop::collection::vec(frame, 0..6),
            0usize..6,
        )
            .prop_map(|(us, cpu, pid, comm, frames, user)| Sample {
                ts_ns: T0 + us * 1000,
                cpu,
                pid,
                tid: pid * 10 + cpu,
                cgroup_id: u64::from(pid),
                comm: Arc::from(comm),
                stack: Arc::new(Stack {
                    user_len: user.min(frames.len()),
                    frames: frames.into_iter().map(Arc::from).collect(),
                }),
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any samples, written in any flush pattern with any dictionary cap, then any window
        /// and filter: the store's answer equals a naive count over the same samples.
        #[test]
        fn store_answers_like_a_naive_count(
            samples in prop::collection::vec(arb_sample(), 1..300),
            flush_every in 1usize..100,
            dict_cap in 1usize..50,
            from_us in 0u64..160_000_000,
            len_us in 1u64..160_000_000,
            cpus in prop::collection::vec(0u32..4, 0..3),
            pid in prop::option::of(1u32..5),
            comm in prop::option::of(prop::sample::select(vec!["app", "db", "semi;colon"])),
        ) {
            let dir = tempfile::tempdir().unwrap();
            crate::store::create_and_lock(dir.path()).unwrap();
            let mut w = StoreWriter::with_limits(&segments_dir(dir.path()), WriterLimits { dict_cap, max_pending: 1 << 20 });
            for (i, s) in samples.iter().enumerate() {
                w.push(s);
                if i % flush_every == 0 {
                    w.flush(s.ts_ns).unwrap();
                }
            }
            w.flush(T0).unwrap();
            let mut store = Store::open(dir.path()).unwrap();
            let window = Window::new(T0 + from_us * 1000, T0 + (from_us + len_us) * 1000).unwrap();
            let filter = Filter { cpus, pid, comm: comm.map(String::from), include_idle: false };
            let want = super::tests::naive(&samples, window, &filter);
            match fold(&mut store, window, &filter) {
                Ok(got) => prop_assert_eq!(got.stacks, want),
                Err(e) => prop_assert!(want.is_empty(), "{}", e),
            }
            prop_assert!(store.take_warnings().is_empty());
        }
    }
}
