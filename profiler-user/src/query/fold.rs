//! Stacks folded to counts (flamegraphs, folded exports).

use std::collections::BTreeMap;

use super::{Filter, QueryError, Window, check_filter, held};
use crate::{
    budget,
    store::{
        Meta, Store,
        format::Dict,
        reader::{BlockView, Need, Visitor},
    },
    timespec::format,
};

/// Root frame of idle samples when `--include-idle` brings them into a flamegraph.
pub const IDLE_FRAME: &str = "[idle]";
/// Suffix that marks kernel frames in folded output (as `stackcollapse-perf --all` does).
pub const KERNEL_SUFFIX: &str = "_[k]";

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
    /// Per process (its name as the first frame of a line): the pods (`namespace/name`) its
    /// samples ran in, with their samples. The UI offers "only pod X" on a process's frame.
    pub pods: BTreeMap<String, BTreeMap<String, u64>>,
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

/// One name of a folded line, by the folded format's rule (`text::folded_frame`). `user`: the comm
/// or a user-space frame, which must not end like the kernel mark.
fn push_name(line: &mut String, name: &str, user: bool) {
    line.push_str(&crate::text::folded_frame(name, user));
}

/// The folded line of a stack given by name (as ClickHouse's `stacks` holds them): the comm,
/// then `(frame, kernel)` root first, by the same rules as [`fold_line`].
pub fn fold_names<'a>(comm: &str, frames: impl IntoIterator<Item = (&'a str, bool)>) -> String {
    let mut line = String::with_capacity(256);
    push_name(&mut line, comm, true);
    for (name, kernel) in frames {
        line.push(';');
        push_name(&mut line, name, !kernel);
        if kernel {
            line.push_str(KERNEL_SUFFIX);
        }
    }
    line
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

/// Pods kept per process in [`Folded::pods`] (Kubernetes' default limit is 110 pods a node).
const MAX_PODS_PER_PROCESS: usize = 256;

/// Folds blocks as a scan hands them over: counts per (comm, stack) id while a dictionary
/// lasts, turned into folded lines once per dictionary rather than once per block.
struct FoldVisitor<'a> {
    window: Window,
    filter: &'a Filter,
    counts: rustc_hash::FxHashMap<(u32, u32), u64>,
    /// Samples per (comm, workload) ids of the current dictionary, for [`Folded::pods`].
    workloads: rustc_hash::FxHashMap<(u32, u32), u64>,
    folded: Folded,
    in_window: u64,
    /// Bytes of the folded lines held.
    bytes: usize,
}

impl Visitor for FoldVisitor<'_> {
    fn block(&mut self, b: BlockView<'_>) {
        let (Some(samples), Some(summary)) = (b.samples, b.summary) else { return };
        let matcher = self.filter.matcher(b.dict);
        for (i, ts) in samples.timestamps(b.header.start_ns).enumerate() {
            if !self.window.contains(ts) {
                continue;
            }
            let n = samples.count(i);
            self.in_window += n;
            let cpu = samples.cpu[i];
            if !matcher.keeps(samples, i) {
                continue;
            }
            *self.counts.entry((samples.comm[i], samples.stack[i])).or_default() += n;
            if let Some(w) = samples.workload(i) {
                *self.workloads.entry((samples.comm[i], w)).or_default() += n;
            }
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
        for ((comm, workload), n) in self.workloads.drain() {
            let Some(pod) = crate::identity::workloads::decode(&dict.strings[workload as usize]).and_then(|w| w.pod())
            else {
                continue;
            };
            let process = crate::text::folded_frame(&dict.strings[comm as usize], true);
            // Bounded like the stacks: a process in more pods than a node runs is not offered.
            let pods = self.folded.pods.entry(process.into_owned()).or_default();
            if pods.len() < MAX_PODS_PER_PROCESS || pods.contains_key(&pod) {
                *pods.entry(pod).or_default() += n;
            }
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
    let mut v = FoldVisitor {
        window,
        filter,
        counts: Default::default(),
        workloads: Default::default(),
        folded: Folded::default(),
        in_window: 0,
        bytes: 0,
    };
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
