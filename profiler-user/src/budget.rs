//! What one query may cost. The daemon lives under a 256 MiB memory cap (the shipped unit and
//! DaemonSet) and its sampling must never stop for a request, so every API and CLI query is
//! held to the same limits: grids are coarsened to a cell budget, folds keep a bounded number
//! of distinct stacks, and scans that decode samples stop at a row budget or a deadline with a
//! sentence naming the limit.

use std::time::{Duration, Instant};

use crate::store::{
    Store, StoreError,
    format::{Dict, SEGMENT_NS},
    reader::{BlockView, Need, Visitor},
};

/// Cells of a subsecond heatmap (u32 each: 4 MB). Beyond it, columns span several seconds.
/// The UI draws at most ~900 columns; a million cells keep 4 days x 50 rows at 18 s a column.
pub const HEATMAP_CELLS: u64 = 1_000_000;
/// Cells of a CPU x time grid (two f64 each: 8 MB). Beyond it, buckets widen.
pub const CPUTIME_CELLS: u64 = 500_000;
/// Distinct folded stacks a flamegraph keeps; the rarest beyond it merge into [`TRUNCATED`].
pub const MAX_STACKS: usize = 20_000;
/// Bytes of folded lines a flamegraph keeps (deep stacks are kilobytes each). Measured: a
/// fold at this budget costs the daemon ~25 MB of peak RSS with its folded answer.
pub const MAX_FOLDED_BYTES: usize = 4 << 20;
/// Sample rows a query may decode: about 40 hours of a 2-CPU machine at 99 Hz, 1.5 min of a
/// 192-CPU one at 999 Hz; a second or so of CPU in a release build.
pub const MAX_DECODED_ROWS: u64 = 30_000_000;
/// Wall time a scan of samples may take (the machine may be loaded; the query runs niced).
pub const SCAN_DEADLINE: Duration = Duration::from_secs(20);

/// The frame the rarest stacks merge into when a fold is over [`MAX_STACKS`].
pub const TRUNCATED: &str = "[truncated]";

#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    #[error(
        "this window holds more than {max} samples to decode, the limit of one query (reached at {reached}): narrow the window or filter by --cpu"
    )]
    TooManyRows { max: u64, reached: String },
    #[error(
        "the query read samples for more than {secs} s, the limit of one query (reached at {reached}): narrow the window"
    )]
    Deadline { secs: u64, reached: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Counts the sample rows a scan decodes.
struct Counting<'v, V> {
    inner: &'v mut V,
    rows: u64,
}

impl<V: Visitor> Visitor for Counting<'_, V> {
    fn block(&mut self, b: BlockView<'_>) {
        // Rows, not what they weigh: a CUDA store's row stands for microseconds or bytes.
        self.rows += b.samples.map_or(u64::from(b.header.samples), |s| s.len() as u64);
        self.inner.block(b);
    }

    fn dict_done(&mut self, dict: &Dict) {
        self.inner.dict_done(dict);
    }
}

/// Limits of one scan that decodes samples.
#[derive(Debug, Clone, Copy)]
pub struct ScanBudget {
    pub max_rows: u64,
    pub deadline: Duration,
}

impl Default for ScanBudget {
    fn default() -> Self {
        Self { max_rows: MAX_DECODED_ROWS, deadline: SCAN_DEADLINE }
    }
}

/// An hour of segments per pass: the budget is checked between passes (each pass lists the
/// segment directory once, so passes cannot be much smaller on a week-long store).
const CHUNK_NS: u64 = 60 * SEGMENT_NS;

/// `Store::scan` in passes of an hour, stopping with a sentence once the rows decoded or the
/// time spent exceed `budget`. Passes are aligned to segments, so no segment is read twice.
pub fn scan(
    store: &mut Store,
    from_ns: u64,
    to_ns: u64,
    need: Need,
    budget: ScanBudget,
    visitor: &mut impl Visitor,
) -> Result<(), BudgetError> {
    let started = Instant::now();
    let mut counting = Counting { inner: visitor, rows: 0 };
    let mut t = from_ns;
    while t < to_ns {
        let end = (t / CHUNK_NS + 1).saturating_mul(CHUNK_NS).min(to_ns);
        store.scan(t, end, need, &mut counting)?;
        t = end;
        if t < to_ns {
            let reached = || crate::timespec::format(t);
            if counting.rows > budget.max_rows {
                return Err(BudgetError::TooManyRows { max: budget.max_rows, reached: reached() });
            }
            if started.elapsed() > budget.deadline {
                return Err(BudgetError::Deadline { secs: budget.deadline.as_secs(), reached: reached() });
            }
        }
    }
    Ok(())
}

/// How many seconds one column must span so that `columns x rows` cells fit in `max_cells`.
pub fn seconds_per_column(columns: u64, rows: u64, max_cells: u64) -> u64 {
    (columns.saturating_mul(rows)).div_ceil(max_cells.max(1)).max(1)
}

/// Hands freed memory back to the kernel after a heavy request: glibc keeps freed arenas
/// otherwise, and a daemon capped at 256 MiB cannot hold a big request's peak forever.
pub fn give_back_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        model::{Sample, Stack},
        store::{StoreWriter, format::NS_PER_SEC, segments_dir},
    };

    /// Three hours, one sample a second.
    fn store() -> (tempfile::TempDir, Store, u64) {
        let t0 = 1_795_000_000 / 3600 * 3600 * NS_PER_SEC;
        let dir = tempfile::tempdir().unwrap();
        crate::store::create_and_lock(dir.path()).unwrap();
        let mut w = StoreWriter::new(&segments_dir(dir.path()));
        let stack = Arc::new(Stack::new(vec![Arc::from("main")], 1));
        for i in 0..3 * 3600 {
            let ts_ns = t0 + i * NS_PER_SEC;
            w.push(&Sample {
                ts_ns,
                cpu: 0,
                pid: 1,
                tid: 1,
                cgroup_id: 0,
                comm: "a".into(),
                stack: stack.clone(),
                workload: "".into(),
            });
            if i % 60 == 59 {
                w.flush(ts_ns).unwrap();
            }
        }
        w.flush(t0).unwrap();
        let store = Store::open(dir.path()).unwrap();
        (dir, store, t0)
    }

    #[test]
    fn a_scan_stops_at_its_row_budget_with_a_sentence_and_passes_within_it() {
        let (_dir, mut store, t0) = store();
        let end = t0 + 3 * 3600 * NS_PER_SEC;
        let mut rows = 0u64;
        let mut count = |b: BlockView<'_>| rows += u64::from(b.header.samples);
        let small = ScanBudget { max_rows: 5000, deadline: Duration::from_secs(3600) };
        let err = scan(&mut store, t0, end, Need::Samples, small, &mut count).unwrap_err().to_string();
        assert!(err.contains("more than 5000 samples") && err.contains("narrow the window"), "{err}");
        // Stopped after the pass that crossed the budget: two hours read, not three.
        assert_eq!(rows, 2 * 3600);
        let mut all = 0u64;
        let mut count = |b: BlockView<'_>| all += u64::from(b.header.samples);
        scan(&mut store, t0, end, Need::Samples, ScanBudget::default(), &mut count).unwrap();
        assert_eq!(all, 3 * 3600, "passes read each sample once");
        let late = ScanBudget { max_rows: u64::MAX, deadline: Duration::ZERO };
        let err = scan(&mut store, t0, end, Need::Samples, late, &mut |_: BlockView<'_>| {}).unwrap_err();
        assert!(matches!(err, BudgetError::Deadline { .. }), "{err}");
    }

    #[test]
    fn columns_widen_just_enough() {
        assert_eq!(seconds_per_column(100, 50, 1_000_000), 1);
        assert_eq!(seconds_per_column(20_000, 50, 1_000_000), 1);
        assert_eq!(seconds_per_column(20_001, 50, 1_000_000), 2);
        // Four days of seconds at 50 rows.
        assert_eq!(seconds_per_column(4 * 86_400, 50, HEATMAP_CELLS), 18);
    }
}
