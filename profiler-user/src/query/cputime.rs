//! CPU x time: per-CPU busy, kernel and softirq shares over time buckets.

use super::{QueryError, Window};
use crate::{
    budget,
    store::{
        Store,
        reader::{BlockView, Need},
    },
};

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
    /// `softirq[row][bucket]`: the part of `kernel` spent in softirqs (NET_RX, TIMER, ...),
    /// on whatever task they interrupted, the idle one included (`crate::context`).
    pub softirq: Vec<Vec<f64>>,
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
    use crate::store::format::NS_PER_SEC;
    let Buckets { requested_bucket_ns, bucket_ns, first_ns, n } = Buckets::of(window, bucket_ns, cpus);
    let rows = cpus.max(1) as usize;
    let mut busy = vec![vec![0f64; n]; rows];
    let mut kernel = vec![vec![0f64; n]; rows];
    let mut softirq = vec![vec![0f64; n]; rows];
    let col = |ts: u64| ((ts - first_ns) / bucket_ns) as usize;
    // Ticks a CPU gets in one bucket at the frequency its block was recorded with: each block
    // is read by its own frequency, so a window spanning a restart at another frequency reads
    // right on both sides (`frequency_hz` serves segments older than format 4).
    let ticks = |hz: u64| (hz.max(1) as f64 * bucket_ns as f64 / NS_PER_SEC as f64).max(1e-9);
    // Cells add up samples weighed by `frequency_hz / hz` (1 for blocks at the store's own
    // frequency) and are divided by the ticks once at the end: whole counts add up exactly, so
    // the answer does not depend on how a second was split into blocks (one flush or two, or a
    // copy of the store).
    let base_hz = frequency_hz.max(1);
    let weight = |hz: u64| base_hz as f64 / hz.max(1) as f64;
    if bucket_ns.is_multiple_of(NS_PER_SEC) {
        store.scan(window.from_ns, window.to_ns, Need::Summary, &mut |b: BlockView<'_>| {
            // A block's counts spread evenly over the buckets its span overlaps (a rolled-up
            // block spans ten seconds).
            let (start, end) = (b.header.start_ns.max(first_ns), b.header.end_ns.min(first_ns + n as u64 * bucket_ns));
            if end <= start {
                return;
            }
            let span = (b.header.end_ns - b.header.start_ns) as f64;
            let w = weight(b.frequency_hz(frequency_hz));
            let summary = b.summary.expect("summary decoded");
            for x in &summary.cpus {
                let soft = summary.softirq(x.cpu) as f64;
                let Some(row) = busy.get_mut(x.cpu as usize) else { continue };
                let mut t = start;
                while t < end {
                    let c = col(t);
                    let stop = (first_ns + (c as u64 + 1) * bucket_ns).min(end);
                    let part = (stop - t) as f64 / span;
                    row[c] += x.busy as f64 * part * w;
                    kernel[x.cpu as usize][c] += x.kernel as f64 * part * w;
                    softirq[x.cpu as usize][c] += soft * part * w;
                    t = stop;
                }
            }
        })?;
    } else {
        let budget = budget::ScanBudget::default();
        budget::scan(store, window.from_ns, window.to_ns, Need::Samples, budget, &mut |b: BlockView<'_>| {
            let s = b.samples.expect("samples decoded");
            let w = weight(b.frequency_hz(frequency_hz));
            // The context of each stack, derived once per stack of the block.
            let mut contexts: rustc_hash::FxHashMap<u32, bool> = Default::default();
            for (i, ts) in s.timestamps(b.header.start_ns).enumerate() {
                let cpu = s.cpu[i] as usize;
                if !window.contains(ts) || cpu >= rows {
                    continue;
                }
                busy[cpu][col(ts)] += s.count(i) as f64 * w;
                if b.dict.nodes.get(s.stack[i] as usize).is_some_and(|node| node.kernel) {
                    kernel[cpu][col(ts)] += s.count(i) as f64 * w;
                }
                let soft = *contexts.entry(s.stack[i]).or_insert_with(|| b.dict.context_of(s.stack[i]).is_softirq());
                if soft {
                    softirq[cpu][col(ts)] += s.count(i) as f64 * w;
                }
            }
        })?;
    }
    let b = Buckets { requested_bucket_ns, bucket_ns, first_ns, n };
    Ok(b.shares(busy, kernel, softirq, ticks(base_hz)))
}

/// The buckets of a CPU x time answer: the one asked for (10 ms or more), widened to keep the
/// window within the cell budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buckets {
    pub requested_bucket_ns: u64,
    pub bucket_ns: u64,
    /// Start of the first bucket.
    pub first_ns: u64,
    /// Buckets.
    pub n: usize,
}

impl Buckets {
    pub fn of(window: Window, bucket_ns: u64, cpus: u32) -> Self {
        use crate::store::format::BUCKET_NS;
        let requested_bucket_ns = bucket_ns.max(BUCKET_NS) / BUCKET_NS * BUCKET_NS;
        let bucket_ns = coarse_bucket(window, requested_bucket_ns, u64::from(cpus.max(1)));
        let first_ns = window.from_ns / bucket_ns * bucket_ns;
        let n = (window.to_ns - first_ns).div_ceil(bucket_ns) as usize;
        Self { requested_bucket_ns, bucket_ns, first_ns, n }
    }

    /// The answer from weighed sample counts per CPU row and bucket, `ticks` a CPU gets in a
    /// bucket: each count divided once, so whole counts give the same shares however they were
    /// summed.
    pub fn shares(self, busy: Vec<Vec<f64>>, kernel: Vec<Vec<f64>>, softirq: Vec<Vec<f64>>, ticks: f64) -> CpuTime {
        let share = |v: Vec<Vec<f64>>| -> Vec<Vec<f64>> {
            v.into_iter().map(|r| r.into_iter().map(|x| (x / ticks).min(1.0)).collect()).collect()
        };
        CpuTime {
            first_ns: self.first_ns,
            bucket_ns: self.bucket_ns,
            requested_bucket_ns: self.requested_bucket_ns,
            cpus: (0..busy.len() as u32).collect(),
            busy: share(busy),
            kernel: share(kernel),
            softirq: share(softirq),
        }
    }
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
