//! Answers window queries over the store: which samples fall in `[from, to)` and match the
//! filters, folded into stacks with counts.

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
};

use crate::{
    store::{Meta, Store, StoreError, format::BlockData},
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
    #[error("no samples match {filter} between {from} and {to} ({total} samples of other processes or CPUs in that window)")]
    NoMatch { filter: String, from: String, to: String, total: u64 },
    #[error(transparent)]
    Store(#[from] StoreError),
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
    /// Folded line (without the count) → samples.
    pub stacks: HashMap<String, u64>,
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

/// Frame names can not contain the folded format's separators.
fn push_frame(line: &mut String, name: &str) {
    line.push(';');
    line.extend(name.chars().map(|c| if c == ';' { ':' } else { c }));
}

/// The folded line of one stored stack: comm, user frames, kernel frames marked `_[k]`.
pub fn fold_line(block: &BlockData, comm: u32, stack: u32) -> String {
    let mut line = String::new();
    line.extend(block.strings[comm as usize].chars().map(|c| if c == ';' { ':' } else { c }));
    let stack = &block.stacks[stack as usize];
    for (i, &f) in stack.frames.iter().enumerate() {
        push_frame(&mut line, &block.strings[f as usize]);
        if i >= stack.user_len as usize {
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

/// Folds the samples of `window` that match `filter`.
pub fn fold(store: &mut Store, window: Window, filter: &Filter) -> Result<Folded, QueryError> {
    check_filter(filter, Meta::read(store.data_dir()).as_ref())?;
    let mut folded = Folded::default();
    let mut in_window = 0u64;
    let mut blocks_seen = false;
    store.scan(window.from_ns, window.to_ns, true, |header, block| {
        let Some(block) = block else { return };
        blocks_seen = true;
        let mut counts: HashMap<(u32, u32), u64> = HashMap::new();
        for (i, ts) in block.timestamps(header.start_ns).enumerate() {
            if !window.contains(ts) {
                continue;
            }
            in_window += 1;
            let cpu = block.cpu[i];
            if !filter.cpu_ok(cpu)
                || filter.pid.is_some_and(|p| p != block.pid[i])
                || filter.comm.as_deref().is_some_and(|c| c != block.strings[block.comm[i] as usize])
            {
                continue;
            }
            *counts.entry((block.comm[i], block.stack[i])).or_default() += 1;
            folded.per_cpu.entry(cpu).or_default().0 += 1;
        }
        for ((comm, stack), n) in counts {
            *folded.stacks.entry(fold_line(block, comm, stack)).or_default() += n;
        }
        // Idle counts are per block (one second): kept when the block lies inside the window,
        // so a window that cuts a second in two does not count its idle samples twice.
        if header.start_ns >= window.from_ns && header.end_ns <= window.to_ns {
            for c in &block.idle {
                in_window += c.count;
                if filter.idle_ok(c.cpu) {
                    folded.per_cpu.entry(c.cpu).or_default().1 += c.count;
                    *folded.stacks.entry(IDLE_FRAME.to_string()).or_default() += c.count;
                }
            }
        }
    })?;
    if folded.stacks.is_empty() {
        let (from, to) = (format(window.from_ns), format(window.to_ns));
        if !blocks_seen || in_window == 0 {
            return Err(QueryError::NoData { from, to, dir: store.data_dir().to_path_buf(), held: held(store)? });
        }
        return Err(QueryError::NoMatch { filter: filter.describe(), from, to, total: in_window });
    }
    Ok(folded)
}
