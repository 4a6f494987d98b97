//! Answers window queries over the store: which samples fall in `[from, to)` and match the
//! filters, and what they add up to. One module per answer: `fold` (stacks with counts, for
//! flamegraphs), `grid` (the subsecond heatmap), `cputime` (per-CPU busy shares over time),
//! `samples` (each sample, for exports). Filters and windows are here, so every answer keeps
//! exactly the same samples.

mod cputime;
mod fold;
mod grid;
mod samples;

use std::path::PathBuf;

pub use cputime::{Buckets, CpuTime, cpu_time};
pub use fold::{
    FoldBudget, Folded, IDLE_FRAME, KERNEL_SUFFIX, fold, fold_line, fold_names, fold_names_with, fold_within,
    folded_piece,
};
pub use grid::{Grid, subsecond_grid};
pub use samples::{SampleRef, for_each_sample};

use crate::{
    budget,
    exec_context::ContextFilter,
    store::{
        Meta, Store, StoreError,
        format::{Dict, SampleColumns},
    },
    timespec::{format, format_duration},
};

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
    /// Pod, namespace, container, unit.
    pub workload: crate::identity::Filter,
    /// Task or softirq context (`--context`), from each stack's marker (`crate::context`).
    pub context: Option<ContextFilter>,
    /// Only stacks through a frame of this exact name (`--function`; the page's "only stacks
    /// through this frame").
    pub function: Option<String>,
    pub include_idle: bool,
    /// Python frames keep the line they ran in folds (`--lines`); otherwise one frame per
    /// function (pprof, OTLP and exports keep lines either way).
    pub lines: bool,
}

impl Filter {
    fn cpu_ok(&self, cpu: u32) -> bool {
        self.cpus.is_empty() || self.cpus.contains(&cpu)
    }

    /// Idle samples belong to pid 0 and no comm.
    pub(crate) fn idle_ok(&self, cpu: u32) -> bool {
        self.include_idle
            && self.cpu_ok(cpu)
            && self.pid.is_none_or(|p| p == 0)
            && self.comm.is_none()
            && self.workload.is_empty()
            && self.function.is_none()
            && self.context.is_none_or(|c| c == ContextFilter::Task)
    }

    /// Whether every sample passes (the summaries' fast paths need no sample then).
    pub(crate) fn keeps_everything(&self) -> bool {
        self.cpus.is_empty()
            && self.pid.is_none()
            && self.comm.is_none()
            && self.workload.is_empty()
            && self.context.is_none()
            && self.function.is_none()
    }

    pub(crate) fn describe(&self) -> String {
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
        let w = &self.workload;
        for (flag, v) in [("pod", &w.pod), ("namespace", &w.namespace), ("container", &w.container), ("unit", &w.unit)]
        {
            if let Some(v) = v {
                parts.push(format!("--{flag} {v}"));
            }
        }
        if let Some(c) = self.context {
            parts.push(format!("--context {c}"));
        }
        if let Some(f) = &self.function {
            parts.push(format!("--function {f}"));
        }
        if parts.is_empty() { "the filters".into() } else { parts.join(" ") }
    }
}

/// A [`Filter`] resolved against one block's dictionary (the comm as a string id): the one test
/// every query applies to a sample.
pub(crate) struct Matcher<'f> {
    filter: &'f Filter,
    dict: &'f Dict,
    /// `Some(None)`: a comm was asked for that this dictionary does not hold.
    comm: Option<Option<u32>>,
    /// With a workload filter: the string ids of the workloads it keeps, sorted.
    workloads: Option<Vec<u32>>,
    /// With a context filter: whether it keeps each stack node seen so far (derived once per
    /// interned stack, not once per sample).
    contexts: std::cell::RefCell<rustc_hash::FxHashMap<u32, bool>>,
    /// With a function filter: its string id (`Some(None)`: not in this dictionary, so no
    /// stack of the block passes), and per stack node seen, whether the stack passes through it.
    function: Option<Option<u32>>,
    through: std::cell::RefCell<rustc_hash::FxHashMap<u32, bool>>,
}

impl Filter {
    pub(crate) fn matcher<'d>(&'d self, dict: &'d Dict) -> Matcher<'d> {
        let comm = self.comm.as_deref().map(|c| dict.strings.iter().position(|s| s == c).map(|i| i as u32));
        let workloads = (!self.workload.is_empty()).then(|| {
            let keeps = |s: &String| crate::identity::workloads::decode(s).is_some_and(|w| w.matches(&self.workload));
            dict.strings.iter().enumerate().filter(|(_, s)| keeps(s)).map(|(i, _)| i as u32).collect()
        });
        let function = self.function.as_deref().map(|f| dict.strings.iter().position(|s| s == f).map(|i| i as u32));
        Matcher {
            filter: self,
            dict,
            comm,
            workloads,
            contexts: Default::default(),
            function,
            through: Default::default(),
        }
    }
}

impl Matcher<'_> {
    /// Whether sample `i` of `s` passes the CPU, pid, comm, workload and context filters.
    pub(crate) fn keeps(&self, s: &SampleColumns, i: usize) -> bool {
        self.filter.cpu_ok(s.cpu[i])
            && self.filter.pid.is_none_or(|p| p == s.pid[i])
            && self.comm.is_none_or(|id| id == Some(s.comm[i]))
            && self.workloads.as_ref().is_none_or(|ids| s.workload(i).is_some_and(|w| ids.binary_search(&w).is_ok()))
            && self.filter.context.is_none_or(|c| self.context_keeps(c, s.stack[i]))
            && self.function.is_none_or(|f| f.is_some_and(|id| self.passes_through(id, s.stack[i])))
    }

    /// Whether the stack ending at `node` has a frame named by string `id`.
    fn passes_through(&self, id: u32, node: u32) -> bool {
        *self.through.borrow_mut().entry(node).or_insert_with(|| {
            let (mut n, mut steps) = (node as usize, 0);
            while let Some(cur) =
                self.dict.nodes.get(n).filter(|_| n != 0 && steps < crate::store::format::MAX_STACK_FRAMES)
            {
                if cur.frame == id {
                    return true;
                }
                n = cur.parent as usize;
                steps += 1;
            }
            false
        })
    }

    fn context_keeps(&self, filter: ContextFilter, stack: u32) -> bool {
        *self.contexts.borrow_mut().entry(stack).or_insert_with(|| filter.keeps(self.dict.context_of(stack)))
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

#[cfg(test)]
mod crafted_tests;
#[cfg(test)]
mod properties;
#[cfg(test)]
mod tests;
