//! Stacks folded to counts (flamegraphs, folded exports).
//!
//! A fold keeps a bounded number of distinct stacks ([`FoldBudget`]: the daemon's own memory is
//! at stake in an API request; the CLI reads in its own process and keeps ten times as many).
//! Past the budget the rarest stacks are not dropped into one bucket at the root: their leaf
//! folds into their parent frame, a level at a time, so every sample stays under its process
//! and its upper frames and the totals stay exact; where the leaves went, a `[… N more]` leaf
//! under the parent says how many distinct stacks it holds. Python frames merge by function
//! (`outer_loop (/srv/app.py)`) unless lines are asked for ([`Filter::lines`]): the line a
//! frame ran multiplies the stacks of a Python program by its lines.

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

/// How many distinct stacks, and bytes of folded text, a fold keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FoldBudget {
    pub max_stacks: usize,
    pub max_bytes: usize,
}

impl Default for FoldBudget {
    /// The API's (the daemon answers it in its own memory).
    fn default() -> Self {
        Self { max_stacks: budget::MAX_STACKS, max_bytes: budget::MAX_FOLDED_BYTES }
    }
}

/// The leaf of a line whose rarer leaves folded into their parent, while a fold is under way:
/// named `[… N more]` when it ends ([`Folded::name_folded`]).
const FOLDED_LEAF: &str = "[…]";

/// Stacks folded to counts, plus the per-CPU totals behind them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Folded {
    /// Folded line (without the count) → samples. (Fx: lines are long, and SipHash over
    /// kilobytes per line was a third of a query's time.)
    pub stacks: rustc_hash::FxHashMap<String, u64>,
    /// Matching samples per CPU: (non-idle, idle).
    pub per_cpu: BTreeMap<u32, (u64, u64)>,
    /// Distinct stacks whose leaves folded into a parent's `[… N more]` to keep the fold
    /// within its budget (a stack folded again later counts again).
    pub truncated_stacks: u64,
    /// Per line ending in the folded leaf, while the fold is under way: the distinct stacks it
    /// holds.
    folded_into: rustc_hash::FxHashMap<String, u64>,
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

/// One name of a folded line, by the folded format's rule (`untrusted::folded_frame`). `user`: the comm
/// or a user-space frame, which must not end like the kernel mark.
fn push_name(line: &mut String, name: &str, user: bool) {
    line.push_str(&crate::untrusted::folded_frame(name, user));
}

/// A user frame's name as a flamegraph shows it: a Python frame without the line it ran,
/// `work (/srv/app.py)`, unless `lines`.
fn frame_name(name: &str, lines: bool) -> std::borrow::Cow<'_, str> {
    match crate::interpreter::python::source(name).filter(|_| !lines) {
        Some((function, file, _)) => format!("{function} ({file})").into(),
        None => name.into(),
    }
}

/// The folded line of a stack given by name (as ClickHouse's `stacks` holds them): the comm,
/// then `(frame, kernel)` root first, by the same rules as [`fold_line`].
pub fn fold_names<'a>(comm: &str, frames: impl IntoIterator<Item = (&'a str, bool)>) -> String {
    fold_names_with(comm, frames, true)
}

/// [`fold_names`]; `lines`: Python frames keep the line they ran ([`Filter::lines`]).
pub fn fold_names_with<'a>(comm: &str, frames: impl IntoIterator<Item = (&'a str, bool)>, lines: bool) -> String {
    let mut line = String::with_capacity(256);
    push_name(&mut line, comm, true);
    for (name, kernel) in frames {
        line.push(';');
        push_piece(&mut line, name, kernel, lines);
    }
    line
}

/// One frame of a folded line as [`fold_names_with`] writes it after its `;`: what a reader of
/// many stacks sharing frames makes once per frame.
pub fn folded_piece(name: &str, kernel: bool, lines: bool) -> String {
    let mut piece = String::new();
    push_piece(&mut piece, name, kernel, lines);
    piece
}

fn push_piece(line: &mut String, name: &str, kernel: bool, lines: bool) {
    if kernel {
        push_name(line, name, false);
        line.push_str(KERNEL_SUFFIX);
    } else {
        push_name(line, &frame_name(name, lines), true);
    }
}

/// The folded line of one stored stack: comm, user frames, kernel frames marked `_[k]`
/// (Python frames with their lines).
pub fn fold_line(dict: &Dict, comm: u32, stack: u32) -> String {
    fold_line_with(dict, comm, stack, &mut Vec::new(), true)
}

/// [`fold_line`] with a caller-provided scratch buffer; `lines`: Python frames keep the line
/// they ran.
fn fold_line_with(dict: &Dict, comm: u32, stack: u32, frames: &mut Vec<(u32, bool)>, lines: bool) -> String {
    let mut line = String::with_capacity(256);
    push_name(&mut line, &dict.strings[comm as usize], true);
    dict.frames(stack, frames);
    for &(f, kernel) in frames.iter() {
        line.push(';');
        let name = &dict.strings[f as usize];
        if kernel {
            push_name(&mut line, name, false);
        } else {
            push_name(&mut line, &frame_name(name, lines), true);
        }
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
    budget: FoldBudget,
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
            let line = fold_line_with(dict, comm, stack, &mut scratch, self.filter.lines);
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
            self.folded.add_pod(&dict.strings[comm as usize], pod, n);
        }
        // Half again the budget before folding, so a long scan does not fold at every segment.
        let b = self.budget;
        if self.folded.stacks.len() > b.max_stacks * 3 / 2 || self.bytes > b.max_bytes * 3 / 2 {
            self.bytes = self.folded.fold_rarest(b.max_stacks, b.max_bytes);
        }
    }
}

impl Folded {
    /// `n` samples of process `comm` ran in `pod` ([`Folded::pods`]).
    pub(crate) fn add_pod(&mut self, comm: &str, pod: String, n: u64) {
        let process = crate::untrusted::folded_frame(comm, true);
        // Bounded like the stacks: a process in more pods than a node runs is not offered.
        let pods = self.pods.entry(process.into_owned()).or_default();
        if pods.len() < MAX_PODS_PER_PROCESS || pods.contains_key(&pod) {
            *pods.entry(pod).or_default() += n;
        }
    }

    /// A fold whose lines were counted elsewhere (a server aggregated them) kept within
    /// `budget`, by the rule a scan of the store keeps.
    pub fn within(mut self, budget: FoldBudget) -> Self {
        let bytes: usize = self.stacks.keys().map(String::len).sum();
        if self.stacks.len() > budget.max_stacks || bytes > budget.max_bytes {
            self.fold_rarest(budget.max_stacks, budget.max_bytes);
        }
        self.name_folded();
        self
    }

    /// Keeps the fold within `max_stacks` lines and `max_bytes` of text: the most frequent
    /// stacks stay whole; each of the others loses its leaf into its parent (`parent;[…]`,
    /// merging with its siblings), a level at a round, until the lines fit. Every sample stays
    /// under its process and its upper frames. Only when the processes alone are too many does
    /// the rest merge into [`budget::TRUNCATED`] at the root. Returns the bytes kept.
    pub fn fold_rarest(&mut self, max_stacks: usize, max_bytes: usize) -> usize {
        let mut bytes: usize = self.stacks.keys().map(String::len).sum();
        // Room for the parents that rarer stacks fold into, beside the stacks kept whole.
        let (keep_stacks, keep_bytes) = (max_stacks - max_stacks / 10, max_bytes - max_bytes / 10);
        // Round r folds 2^r levels at once: stacks hundreds of frames deep fit in a few
        // rounds (a level a round rebuilt megabytes of lines hundreds of times).
        let mut levels = 1;
        while self.stacks.len() > max_stacks || bytes > max_bytes {
            let mut all: Vec<(String, u64)> = self.stacks.drain().collect();
            all.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            bytes = 0;
            // This round's parents: (samples, distinct stacks held). Cut only next round.
            let mut parents: rustc_hash::FxHashMap<String, (u64, u64)> = Default::default();
            let mut floor = Vec::new();
            let mut rest = Vec::new();
            for (line, n) in all {
                if rest.is_empty() && self.stacks.len() < keep_stacks && bytes + line.len() <= keep_bytes {
                    bytes += line.len();
                    self.stacks.insert(line, n);
                } else {
                    rest.push((line, n));
                }
            }
            // Lines too long for the bytes left are cut to their share of them at once.
            let share = (max_bytes.saturating_sub(bytes) / rest.len().max(1)).max(1);
            for (line, n) in rest {
                match parent_of(&line, levels).map(|p| shorten(p, share)) {
                    Some(parent) => {
                        let held = self.folded_into.remove(&line).unwrap_or_else(|| {
                            self.truncated_stacks += 1;
                            1
                        });
                        let e = parents.entry(parent).or_default();
                        e.0 += n;
                        e.1 += held;
                    }
                    None => floor.push((line, n)),
                }
            }
            let cut = !parents.is_empty();
            for (parent, (n, held)) in parents {
                *self.folded_into.entry(parent.clone()).or_default() += held;
                let e = self.stacks.entry(parent).or_insert_with_key(|k| {
                    bytes += k.len();
                    0
                });
                *e += n;
            }
            // The floor (a process alone, `[idle]`) cannot fold further: kept while there is
            // room, the rest at the root, said so.
            for (line, n) in floor {
                // One line and its bytes kept for the root's bucket.
                let full =
                    self.stacks.len() + 1 >= max_stacks || bytes + line.len() + budget::TRUNCATED.len() > max_bytes;
                if !cut && full {
                    self.truncated_stacks += self.folded_into.remove(&line).unwrap_or(1);
                    *self.stacks.entry(budget::TRUNCATED.to_string()).or_default() += n;
                } else {
                    bytes += line.len();
                    *self.stacks.entry(line).or_default() += n;
                }
            }
            if !cut {
                break;
            }
            levels = (levels * 2).min(1024);
        }
        bytes
    }

    /// Names each folded leaf after what it holds: `[… 12 more]`, twelve distinct stacks.
    pub(crate) fn name_folded(&mut self) {
        for (line, held) in std::mem::take(&mut self.folded_into) {
            let Some(n) = self.stacks.remove(&line) else { continue };
            let parent = line.strip_suffix(FOLDED_LEAF).unwrap_or(&line);
            *self.stacks.entry(format!("{parent}[… {held} more]")).or_default() += n;
        }
    }
}

/// `line` (`…;[…]`) cut further up until it is at most `max` bytes, but never past its process.
fn shorten(line: String, max: usize) -> String {
    if line.len() <= max {
        return line;
    }
    let base = &line[..line.len() - FOLDED_LEAF.len() - 1];
    let first = base.find(';').unwrap_or(base.len());
    let cut = max.saturating_sub(FOLDED_LEAF.len() + 1).max(first);
    let end = base.get(..=cut.min(base.len() - 1)).and_then(|b| b.rfind(';')).filter(|&e| e >= first);
    match end {
        Some(end) => format!("{};{FOLDED_LEAF}", &base[..end]),
        None => format!("{};{FOLDED_LEAF}", &base[..first]),
    }
}

/// `ancestor;[…]` of a line, `levels` frames up but never past its process (`comm;a;b` →
/// `comm;a;[…]` one level up, `comm;a;[…]` → `comm;[…]`); `None` for a line that is its
/// process alone.
fn parent_of(line: &str, levels: usize) -> Option<String> {
    let base = line.strip_suffix(FOLDED_LEAF).and_then(|l| l.strip_suffix(';')).unwrap_or(line);
    let mut end = base.rfind(';')?;
    for _ in 1..levels {
        match base[..end].rfind(';') {
            Some(i) => end = i,
            None => break,
        }
    }
    Some(format!("{};{FOLDED_LEAF}", &base[..end]))
}

/// Folds the samples of `window` that match `filter`, within the API's budget.
pub fn fold(store: &mut Store, window: Window, filter: &Filter) -> Result<Folded, QueryError> {
    fold_within(store, window, filter, FoldBudget::default())
}

/// [`fold`] within `budget`.
pub fn fold_within(
    store: &mut Store,
    window: Window,
    filter: &Filter,
    budget: FoldBudget,
) -> Result<Folded, QueryError> {
    check_filter(filter, Meta::read(store.data_dir()).as_ref())?;
    let mut v = FoldVisitor {
        window,
        filter,
        counts: Default::default(),
        workloads: Default::default(),
        folded: Folded::default(),
        in_window: 0,
        bytes: 0,
        budget,
    };
    budget::scan(store, window.from_ns, window.to_ns, Need::Samples, budget::ScanBudget::default(), &mut v)?;
    let FoldVisitor { mut folded, in_window, bytes, .. } = v;
    if folded.stacks.len() > budget.max_stacks || bytes > budget.max_bytes {
        folded.fold_rarest(budget.max_stacks, budget.max_bytes);
    }
    folded.name_folded();
    if folded.stacks.is_empty() {
        let (from, to) = (format(window.from_ns), format(window.to_ns));
        if in_window == 0 {
            return Err(QueryError::NoData { from, to, dir: store.data_dir().to_path_buf(), held: held(store)? });
        }
        return Err(QueryError::NoMatch { filter: filter.describe(), from, to, total: in_window });
    }
    Ok(folded)
}

#[cfg(test)]
mod frame_tests {
    use super::*;

    #[test]
    fn python_frames_merge_by_function_unless_lines_are_asked_for() {
        assert_eq!(frame_name("work (/srv/app.py:4)", false), "work (/srv/app.py)");
        assert_eq!(frame_name("work (/srv/app.py:4)", true), "work (/srv/app.py:4)");
        assert_eq!(frame_name("main", false), "main");
        assert_eq!(frame_name("libc.so.6+0x3fb9c", false), "libc.so.6+0x3fb9c");
        assert_eq!(parent_of("comm;a;b", 1), Some("comm;a;[…]".to_string()));
        assert_eq!(parent_of("comm;a;[…]", 1), Some("comm;[…]".to_string()));
        assert_eq!(parent_of("comm;a;b;c;d", 2), Some("comm;a;b;[…]".to_string()));
        assert_eq!(parent_of("comm;a;b", 8), Some("comm;[…]".to_string()));
        assert_eq!(parent_of("comm;[…]", 1), None);
        assert_eq!(parent_of("[idle]", 1), None);
        assert_eq!(shorten("comm;aaaa;bbbb;cccc;[…]".to_string(), 15), "comm;aaaa;[…]");
        assert_eq!(shorten("comm;aaaa;[…]".to_string(), 3), "comm;[…]");
        assert_eq!(shorten("comm;a;[…]".to_string(), 100), "comm;a;[…]");
    }
}
