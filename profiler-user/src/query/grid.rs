//! FlameScope's subsecond heatmap.

use super::{Filter, QueryError, Window};
use crate::{
    budget,
    store::{
        Store,
        reader::{BlockView, Need},
    },
};

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
    /// Per column: 1 if a block of the store covers part of it, else 0. The daemon writes a
    /// block every second it runs (idle ticks count), so 0 means no data (the daemon was down,
    /// or retention removed it), which an empty column of an idle machine is not.
    pub recorded: Vec<u32>,
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

    /// The columns without data.
    pub fn gaps(&self) -> impl Iterator<Item = usize> + '_ {
        self.recorded.iter().enumerate().filter(|(_, n)| **n == 0).map(|(c, _)| c)
    }

    /// An empty grid of `window` with `rows` rows (clamped to 1-1000), its columns coarsened
    /// to the cell budget.
    pub fn empty(window: Window, rows: usize) -> Self {
        use crate::store::format::NS_PER_SEC;
        let rows = rows.clamp(1, 1000);
        let first = window.from_ns / NS_PER_SEC;
        let seconds = window.to_ns.div_ceil(NS_PER_SEC) - first;
        let k = budget::seconds_per_column(seconds, rows as u64, budget::HEATMAP_CELLS);
        let columns = seconds.div_ceil(k) as usize;
        Grid {
            first_second: first,
            rows,
            columns,
            seconds_per_column: k,
            counts: vec![0; columns * rows],
            recorded: vec![0; columns],
        }
    }

    /// Notes that the store holds `[start_ns, end_ns)` (a block).
    pub(crate) fn record(&mut self, start_ns: u64, end_ns: u64) {
        use crate::store::format::NS_PER_SEC;
        let last = end_ns.saturating_sub(1).max(start_ns) / NS_PER_SEC;
        for second in start_ns / NS_PER_SEC..=last {
            if let Some(col) = second.checked_sub(self.first_second).map(|s| (s / self.seconds_per_column) as usize)
                && let Some(n) = self.recorded.get_mut(col)
            {
                *n = 1;
            }
        }
    }

    pub(crate) fn add(&mut self, second: u64, row: usize, n: u64) {
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
    let mut grid = Grid::empty(window, rows);
    let rows = grid.rows;
    // Summaries count every sample: any filter, the context one included, needs the samples.
    let unfiltered = filter.keeps_everything();
    // The 10 ms buckets the window covers whole come from summaries; only the slivers at its
    // edges (under 10 ms each) decode samples. A window of days costs no sample decoding.
    let inner = (window.from_ns.div_ceil(BUCKET_NS) * BUCKET_NS, window.to_ns / BUCKET_NS * BUCKET_NS);
    if unfiltered && inner.0 < inner.1 && BUCKETS_PER_SEC.is_multiple_of(rows) {
        let per_row = BUCKETS_PER_SEC / rows;
        let covered = Window { from_ns: inner.0, to_ns: inner.1 };
        store.scan(covered.from_ns, covered.to_ns, Need::Summary, &mut |b: BlockView<'_>| {
            let summary = b.summary.expect("summary decoded");
            grid.record(b.header.start_ns, b.header.end_ns);
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
    budget::scan(
        store,
        window.from_ns,
        window.to_ns,
        Need::Samples,
        budget::ScanBudget::default(),
        &mut |b: BlockView<'_>| {
            grid.record(b.header.start_ns.max(window.from_ns), b.header.end_ns.min(window.to_ns));
            // Rolled-up blocks keep no subsecond times: they have no place in a heatmap.
            if b.header.flags & crate::store::format::FLAG_ROLLUP != 0 {
                return;
            }
            let s = b.samples.expect("samples decoded");
            let matcher = filter.matcher(b.dict);
            for (i, ts) in s.timestamps(b.header.start_ns).enumerate() {
                if !window.contains(ts) || !matcher.keeps(s, i) {
                    continue;
                }
                let row = ((ts % NS_PER_SEC) * rows / NS_PER_SEC) as usize;
                grid.add(ts / NS_PER_SEC, row, s.count(i));
            }
        },
    )?;
    Ok(())
}
