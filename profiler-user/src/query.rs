//! Answers window queries over the store: which samples fall in `[from, to)` and match the
//! filters, folded into stacks with counts.

use std::{collections::BTreeMap, path::PathBuf};

use crate::{
    budget,
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
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Budget(#[from] budget::BudgetError),
}

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
    /// Distinct stacks merged into [`budget::TRUNCATED`] to keep the fold within its budget.
    pub truncated_stacks: u64,
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
    /// Bytes of the folded lines held.
    bytes: usize,
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
            let line = fold_line_with(dict, comm, stack, &mut scratch);
            let len = line.len();
            let e = self.folded.stacks.entry(line).or_insert_with(|| {
                self.bytes += len;
                0
            });
            *e += n;
        }
        // Half again the budget before pruning, so a long scan does not prune at every segment.
        if self.folded.stacks.len() > budget::MAX_STACKS * 3 / 2 || self.bytes > budget::MAX_FOLDED_BYTES * 3 / 2 {
            self.bytes = self.folded.truncate(budget::MAX_STACKS, budget::MAX_FOLDED_BYTES);
        }
    }
}

impl Folded {
    /// Keeps the most frequent stacks within `max_stacks` lines and `max_bytes` of text; the
    /// others merge into one [`budget::TRUNCATED`] line. Returns the bytes kept. Pruned along
    /// a scan, a stack rare early and frequent later is counted partly under `[truncated]`:
    /// the answer says how many stacks were merged, never silently.
    pub fn truncate(&mut self, max_stacks: usize, max_bytes: usize) -> usize {
        let mut all: Vec<(String, u64)> = self.stacks.drain().collect();
        all.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let (mut bytes, mut merged) = (0usize, 0u64);
        for (line, n) in all {
            if line == budget::TRUNCATED {
                merged += n;
            } else if self.stacks.len() + 1 < max_stacks && bytes + line.len() <= max_bytes {
                bytes += line.len();
                self.stacks.insert(line, n);
            } else {
                merged += n;
                self.truncated_stacks += 1;
            }
        }
        if merged > 0 {
            self.stacks.insert(budget::TRUNCATED.to_string(), merged);
        }
        bytes
    }
}

/// Folds the samples of `window` that match `filter`.
pub fn fold(store: &mut Store, window: Window, filter: &Filter) -> Result<Folded, QueryError> {
    check_filter(filter, Meta::read(store.data_dir()).as_ref())?;
    let mut v =
        FoldVisitor { window, filter, counts: Default::default(), folded: Folded::default(), in_window: 0, bytes: 0 };
    budget::scan(store, window.from_ns, window.to_ns, Need::Samples, budget::ScanBudget::default(), &mut v)?;
    let FoldVisitor { mut folded, in_window, bytes, .. } = v;
    if folded.stacks.len() > budget::MAX_STACKS || bytes > budget::MAX_FOLDED_BYTES {
        folded.truncate(budget::MAX_STACKS, budget::MAX_FOLDED_BYTES);
    }
    if folded.stacks.is_empty() {
        let (from, to) = (format(window.from_ns), format(window.to_ns));
        if in_window == 0 {
            return Err(QueryError::NoData { from, to, dir: store.data_dir().to_path_buf(), held: held(store)? });
        }
        return Err(QueryError::NoMatch { filter: filter.describe(), from, to, total: in_window });
    }
    Ok(folded)
}

/// FlameScope's subsecond grid: busy samples per (column, offset-within-the-second row). A
/// column is one second, or `seconds_per_column` seconds when the window would exceed the cell
/// budget ([`budget::HEATMAP_CELLS`]); the grid is one flat vector of u32 (4 bytes a cell).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grid {
    /// Unix second of the first column.
    pub first_second: u64,
    pub rows: usize,
    pub columns: usize,
    /// 1 unless coarsened: then a column sums this many seconds, row by row.
    pub seconds_per_column: u64,
    /// `counts[column * rows + row]`, row 0 = offset 0.
    pub counts: Vec<u32>,
}

impl Grid {
    pub fn column(&self, c: usize) -> &[u32] {
        &self.counts[c * self.rows..(c + 1) * self.rows]
    }

    pub fn max(&self) -> u32 {
        self.counts.iter().copied().max().unwrap_or(0)
    }

    pub fn coarsened(&self) -> bool {
        self.seconds_per_column > 1
    }

    fn add(&mut self, second: u64, row: usize, n: u64) {
        let Some(col) = second.checked_sub(self.first_second).map(|s| (s / self.seconds_per_column) as usize) else {
            return;
        };
        if col < self.columns && row < self.rows {
            let cell = &mut self.counts[col * self.rows + row];
            *cell = cell.saturating_add(u32::try_from(n).unwrap_or(u32::MAX));
        }
    }
}

/// The subsecond grid of `window`. Without filters, and when rows divide the 10 ms buckets of
/// the block summaries, it is computed from summaries alone (no sample is decoded); otherwise
/// the scan of samples is held to the per-query budget.
pub fn subsecond_grid(store: &mut Store, window: Window, rows: usize, filter: &Filter) -> Result<Grid, QueryError> {
    use crate::store::format::{BUCKET_NS, BUCKETS_PER_SEC, NS_PER_SEC};
    let rows = rows.clamp(1, 1000);
    let first = window.from_ns / NS_PER_SEC;
    let seconds = window.to_ns.div_ceil(NS_PER_SEC) - first;
    let k = budget::seconds_per_column(seconds, rows as u64, budget::HEATMAP_CELLS);
    let columns = seconds.div_ceil(k) as usize;
    let mut grid = Grid { first_second: first, rows, columns, seconds_per_column: k, counts: vec![0; columns * rows] };
    let unfiltered = filter.cpus.is_empty() && filter.pid.is_none() && filter.comm.is_none();
    // The 10 ms buckets the window covers whole come from summaries; only the slivers at its
    // edges (under 10 ms each) decode samples. A window of days costs no sample decoding.
    let inner = (window.from_ns.div_ceil(BUCKET_NS) * BUCKET_NS, window.to_ns / BUCKET_NS * BUCKET_NS);
    if unfiltered && inner.0 < inner.1 && BUCKETS_PER_SEC.is_multiple_of(rows) {
        let per_row = BUCKETS_PER_SEC / rows;
        let covered = Window { from_ns: inner.0, to_ns: inner.1 };
        store.scan(covered.from_ns, covered.to_ns, Need::Summary, &mut |b: BlockView<'_>| {
            let summary = b.summary.expect("summary decoded");
            let second = b.header.start_ns / NS_PER_SEC;
            for (i, &n) in summary.buckets.iter().enumerate() {
                if covered.contains(b.header.start_ns + i as u64 * BUCKET_NS) {
                    grid.add(second, i / per_row, u64::from(n));
                }
            }
        })?;
        for edge in [(window.from_ns, inner.0), (inner.1, window.to_ns)] {
            if edge.0 < edge.1 {
                grid_from_samples(store, Window { from_ns: edge.0, to_ns: edge.1 }, filter, &mut grid)?;
            }
        }
    } else {
        grid_from_samples(store, window, filter, &mut grid)?;
    }
    Ok(grid)
}

/// Adds the samples of `window` that match `filter` to `grid` (held to the scan budget).
fn grid_from_samples(store: &mut Store, window: Window, filter: &Filter, grid: &mut Grid) -> Result<(), QueryError> {
    use crate::store::format::NS_PER_SEC;
    let rows = grid.rows as u64;
    let comm = filter.comm.as_deref();
    budget::scan(
        store,
        window.from_ns,
        window.to_ns,
        Need::Samples,
        budget::ScanBudget::default(),
        &mut |b: BlockView<'_>| {
            // Rolled-up blocks keep no subsecond times: they have no place in a heatmap.
            if b.header.flags & crate::store::format::FLAG_ROLLUP != 0 {
                return;
            }
            let s = b.samples.expect("samples decoded");
            let comm_id = comm.map(|c| b.dict.strings.iter().position(|x| x == c));
            for (i, ts) in s.timestamps(b.header.start_ns).enumerate() {
                if !window.contains(ts)
                    || !filter.cpu_ok(s.cpu[i])
                    || filter.pid.is_some_and(|p| p != s.pid[i])
                    || comm_id.is_some_and(|id| id != Some(s.comm[i] as usize))
                {
                    continue;
                }
                let row = ((ts % NS_PER_SEC) * rows / NS_PER_SEC) as usize;
                grid.add(ts / NS_PER_SEC, row, s.count(i));
            }
        },
    )?;
    Ok(())
}

/// Per-CPU busy and kernel-mode shares over time buckets.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CpuTime {
    /// Start of the first bucket, ns since the epoch.
    pub first_ns: u64,
    pub bucket_ns: u64,
    /// The bucket asked for: smaller than `bucket_ns` when the window would have exceeded the
    /// cell budget and the buckets were widened.
    pub requested_bucket_ns: u64,
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
    let requested_bucket_ns = bucket_ns.max(BUCKET_NS) / BUCKET_NS * BUCKET_NS;
    let rows = cpus.max(1) as usize;
    let bucket_ns = coarse_bucket(window, requested_bucket_ns, rows as u64);
    let first_ns = window.from_ns / bucket_ns * bucket_ns;
    let n = (window.to_ns - first_ns).div_ceil(bucket_ns) as usize;
    let mut busy = vec![vec![0f64; n]; rows];
    let mut kernel = vec![vec![0f64; n]; rows];
    let col = |ts: u64| ((ts - first_ns) / bucket_ns) as usize;
    // Ticks a CPU gets in one bucket at the frequency its block was recorded with: each block
    // is read by its own frequency, so a window spanning a restart at another frequency reads
    // right on both sides (`frequency_hz` serves segments older than format 4).
    let ticks = |hz: u64| (hz.max(1) as f64 * bucket_ns as f64 / NS_PER_SEC as f64).max(1e-9);
    if bucket_ns.is_multiple_of(NS_PER_SEC) {
        store.scan(window.from_ns, window.to_ns, Need::Summary, &mut |b: BlockView<'_>| {
            // A block's counts spread evenly over the buckets its span overlaps (a rolled-up
            // block spans ten seconds).
            let (start, end) = (b.header.start_ns.max(first_ns), b.header.end_ns.min(first_ns + n as u64 * bucket_ns));
            if end <= start {
                return;
            }
            let span = (b.header.end_ns - b.header.start_ns) as f64;
            let per_tick = 1.0 / ticks(b.frequency_hz(frequency_hz));
            for x in &b.summary.expect("summary decoded").cpus {
                let Some(row) = busy.get_mut(x.cpu as usize) else { continue };
                let mut t = start;
                while t < end {
                    let c = col(t);
                    let stop = (first_ns + (c as u64 + 1) * bucket_ns).min(end);
                    let part = (stop - t) as f64 / span;
                    row[c] += x.busy as f64 * part * per_tick;
                    kernel[x.cpu as usize][c] += x.kernel as f64 * part * per_tick;
                    t = stop;
                }
            }
        })?;
    } else {
        let budget = budget::ScanBudget::default();
        budget::scan(store, window.from_ns, window.to_ns, Need::Samples, budget, &mut |b: BlockView<'_>| {
            let s = b.samples.expect("samples decoded");
            let per_tick = 1.0 / ticks(b.frequency_hz(frequency_hz));
            for (i, ts) in s.timestamps(b.header.start_ns).enumerate() {
                let cpu = s.cpu[i] as usize;
                if !window.contains(ts) || cpu >= rows {
                    continue;
                }
                busy[cpu][col(ts)] += s.count(i) as f64 * per_tick;
                if b.dict.nodes.get(s.stack[i] as usize).is_some_and(|node| node.kernel) {
                    kernel[cpu][col(ts)] += s.count(i) as f64 * per_tick;
                }
            }
        })?;
    }
    let share = |v: Vec<Vec<f64>>| -> Vec<Vec<f64>> {
        v.into_iter().map(|r| r.into_iter().map(|x| x.min(1.0)).collect()).collect()
    };
    Ok(CpuTime {
        first_ns,
        bucket_ns,
        requested_bucket_ns,
        cpus: (0..rows as u32).collect(),
        busy: share(busy),
        kernel: share(kernel),
    })
}

/// The bucket that keeps `window` within [`budget::CPUTIME_CELLS`]: the requested one, or a
/// multiple of it (whole seconds once it reaches a second, so summaries answer).
fn coarse_bucket(window: Window, bucket_ns: u64, rows: u64) -> u64 {
    use crate::store::format::NS_PER_SEC;
    let n = (window.to_ns - window.from_ns / bucket_ns * bucket_ns).div_ceil(bucket_ns) + 1;
    let k = budget::seconds_per_column(n, rows, budget::CPUTIME_CELLS);
    if k == 1 {
        return bucket_ns;
    }
    let wide = bucket_ns.saturating_mul(k);
    if wide >= NS_PER_SEC { wide.div_ceil(NS_PER_SEC) * NS_PER_SEC } else { wide }
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
    /// The frequency the sample was taken at, when its segment records it (format 4).
    pub frequency_hz: Option<u64>,
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
    let budget = budget::ScanBudget::default();
    budget::scan(store, window.from_ns, window.to_ns, Need::Samples, budget, &mut |b: BlockView<'_>| {
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
                frequency_hz: b.identity.map(|id| id.frequency_hz.max(1)),
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
        // Edges inside a 10 ms bucket: summaries for the inside, samples for the slivers.
        let odd = Window::new(T0 + 7 * NS_PER_SEC + 303_456_789, T0 + 99 * NS_PER_SEC + 5_000_001).unwrap();
        assert_eq!(
            subsecond_grid(&mut store, odd, 50, &Filter::default()).unwrap(),
            subsecond_grid(&mut store, odd, 50, &all_cpus).unwrap()
        );
        let tiny = Window::new(T0 + 7 * NS_PER_SEC + 1, T0 + 7 * NS_PER_SEC + 2_000_000).unwrap();
        assert_eq!(
            subsecond_grid(&mut store, tiny, 50, &Filter::default()).unwrap(),
            subsecond_grid(&mut store, tiny, 50, &all_cpus).unwrap()
        );
        let mut naive = vec![vec![0u64; 50]; 130];
        for s in &input {
            let off = s.ts_ns - T0;
            naive[(off / NS_PER_SEC) as usize][((off % NS_PER_SEC) / 20_000_000) as usize] += 1;
        }
        let got: Vec<Vec<u64>> =
            (0..fast.columns).map(|c| fast.column(c).iter().map(|&v| u64::from(v)).collect()).collect();
        assert_eq!(got, naive);
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
            let mut text = Vec::new();
            crate::export::heatmap::write_json(&grid, &mut text).unwrap();
            let fs: serde_json::Value = serde_json::from_slice(&text).unwrap();
            let rows: Vec<f64> = serde_json::from_value(fs["rows"].clone()).unwrap();
            let values: Vec<Vec<u64>> = serde_json::from_value(fs["values"].clone()).unwrap();
            assert_eq!(grid.first_second, from / NS_PER_SEC);
            let mut naive = vec![vec![0u64; 50]; fs["columns"].as_array().unwrap().len()];
            for s in
                input.iter().filter(|s| w.contains(s.ts_ns) && (filter.cpus.is_empty() || filter.cpus.contains(&s.cpu)))
            {
                let col = (s.ts_ns / NS_PER_SEC - grid.first_second) as usize;
                let row_ms = (s.ts_ns % NS_PER_SEC) / 20_000_000 * 20;
                // rows[i] is the row's offset in ms, listed from 980 down to 0.
                let i = rows.iter().position(|&r| r == row_ms as f64).unwrap();
                naive[col][i] += 1;
            }
            assert_eq!(values, naive);
            assert_eq!(fs["maxvalue"], naive.iter().flatten().copied().max().unwrap());
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
        // 56 years of seconds: coarsened to the cell budget, not refused, not 20 GB.
        let w = Window::new(NS_PER_SEC, T0).unwrap();
        let g = subsecond_grid(&mut store, w, 50, &Filter::default()).unwrap();
        assert!(g.coarsened() && g.counts.len() as u64 <= budget::HEATMAP_CELLS, "{}", g.seconds_per_column);
        assert_eq!(g.columns as u64, (T0 / NS_PER_SEC - 1).div_ceil(g.seconds_per_column));
        let c = cpu_time(&mut store, w, 10_000_000, 4, 99).unwrap();
        assert_eq!(c.requested_bucket_ns, 10_000_000);
        assert!(c.bucket_ns.is_multiple_of(NS_PER_SEC) && (c.busy[0].len() * 4) as u64 <= budget::CPUTIME_CELLS);
        // Sample counts survive coarsening: the same total in 10 s columns as in 1 s ones.
        let w = Window::new(T0, T0 + 130 * NS_PER_SEC).unwrap();
        let fine = subsecond_grid(&mut store, w, 50, &Filter { cpus: vec![0, 1, 2], ..Default::default() }).unwrap();
        let sum = |g: &Grid| g.counts.iter().map(|&v| u64::from(v)).sum::<u64>();
        assert_eq!(sum(&fine), 10);
    }

    #[test]
    fn a_fold_over_its_stack_budget_keeps_the_frequent_ones_and_says_how_many_merged() {
        let mut f = Folded::default();
        for i in 0..100u64 {
            f.stacks.insert(format!("app;f{i:03}"), i + 1);
        }
        let total = f.total();
        f.truncate(11, usize::MAX);
        assert_eq!(f.stacks.len(), 11);
        assert_eq!(f.truncated_stacks, 90);
        assert_eq!(f.total(), total, "no sample is lost, only merged");
        assert_eq!(f.stacks[budget::TRUNCATED], (1..=90).sum::<u64>());
        assert!(f.stacks.contains_key("app;f099") && !f.stacks.contains_key("app;f089"));
        // A byte budget cuts too; merging again keeps the earlier merged count.
        f.truncate(1000, 3 * "app;f099".len());
        assert_eq!((f.stacks.len(), f.truncated_stacks), (4, 97));
        assert_eq!(f.total(), total);
    }

    /// A CPU busy all along, recorded at 99 Hz and then, after a restart, at 999 Hz (in the same
    /// minute and in the next): each part reads 100 % busy by its own frequency, also after
    /// rollup, and pprof weighs each sample by its own period.
    #[test]
    fn a_restart_at_another_frequency_reads_each_part_by_its_own() {
        use crate::store::identity::Identity;
        let dir = tempfile::tempdir().unwrap();
        crate::store::create_and_lock(dir.path()).unwrap();
        let busy = |hz: u64, from_s: u64, to_s: u64| -> Vec<Sample> {
            let period = NS_PER_SEC / hz;
            (from_s * hz..to_s * hz)
                .map(|i| Sample {
                    ts_ns: T0 + i * period,
                    cpu: 1,
                    pid: 7,
                    tid: 7,
                    cgroup_id: 0,
                    comm: Arc::from("spin"),
                    stack: stack(&["main", "spin"], &[]),
                })
                .collect()
        };
        let id = |hz| Identity { frequency_hz: hz, online_cpus: "0-1".into(), boot_id: "b".into(), host: "h".into() };
        // 0-30 s at 99 Hz; the daemon restarts at 999 Hz for 30-90 s (30-60 s is the same minute).
        for (hz, from, to) in [(99, 0, 30), (999, 30, 90)] {
            let mut w = StoreWriter::new(&segments_dir(dir.path())).with_identity(id(hz));
            for s in busy(hz, from, to) {
                w.push(&s);
            }
            w.flush(T0).unwrap();
        }
        let mut store = Store::open(dir.path()).unwrap();
        let check = |store: &mut Store, bucket: u64| {
            let w = Window::new(T0, T0 + 90 * NS_PER_SEC).unwrap();
            // The fallback frequency (meta.json's, the last daemon's) must not matter.
            let ct = cpu_time(store, w, bucket, 2, 999).unwrap();
            // Per second, or on average over each part (a 100 ms bucket at 99 Hz holds 9 or 10).
            let per_part = (NS_PER_SEC / bucket).max(1) as usize * 30;
            for (part, shares) in ct.busy[1].chunks(per_part).enumerate() {
                let mean = shares.iter().sum::<f64>() / shares.len() as f64;
                assert!((mean - 1.0).abs() < 0.02, "part {part} in {bucket} ns buckets reads {mean}");
                if bucket >= NS_PER_SEC {
                    assert!(shares.iter().all(|s| (s - 1.0).abs() < 0.02), "{shares:?}");
                }
            }
        };
        check(&mut store, NS_PER_SEC);
        check(&mut store, 100_000_000);
        let mut pprof = crate::export::pprof::Builder::new(999);
        let w = Window::new(T0, T0 + 90 * NS_PER_SEC).unwrap();
        for_each_sample(&mut store, w, &Filter::default(), |s| pprof.add(s)).unwrap();
        let cpu_ns: i64 = pprof.profile.sample.iter().map(|s| s.value[1]).sum();
        // 90 s of one busy CPU, whichever the frequency: 30 s at 99 Hz + 60 s at 999 Hz.
        assert!((cpu_ns as f64 / 90e9 - 1.0).abs() < 0.01, "pprof says {cpu_ns} ns of CPU");
        for (_, path) in store.segments().unwrap() {
            crate::store::rollup::rollup_segment(&path).unwrap().expect("rolls up");
        }
        check(&mut store, 10 * NS_PER_SEC);
        assert!(store.take_warnings().is_empty());
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
