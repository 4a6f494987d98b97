//! One read interface with two sources behind it: a node's own store, or what nodes shipped
//! to ClickHouse, answered by SQL that aggregates in the server ([`super::pushdown`],
//! [`super::notes`], [`super::samples`]). A window's folded stacks, its grids (the subsecond
//! heatmap, CPU x time), its findings and events, its counter tracks, and its samples one by
//! one: the commands and the node page (`serve`) call the same thing whichever source answers,
//! and where both can, both answer the same, byte for byte (tests/tests/fleet.rs, fleet_ui.rs).

use std::path::{Path, PathBuf};

use super::{Fleet, FleetError, Selection, counters, kind_grid, notes, pushdown, samples};
use crate::{
    collect::kmsg::Event,
    detect::{self, Finding},
    model::SampleKind,
    query::{self, CpuTime, Filter, FoldBudget, Folded, Grid, QueryError, SampleRef, Window},
    store::{
        Meta, Store, StoreError,
        counters::{CountersError, Tracks},
        format::FORMAT_VERSION,
    },
};

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Fleet(#[from] FleetError),
    #[error(transparent)]
    Query(#[from] QueryError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Counters(#[from] CountersError),
    #[error("{points} counter points in this window, more than {limit}: ask for a shorter one")]
    TooManyPoints { points: u64, limit: u64 },
}

/// A fold and, from ClickHouse, what answered it and why it may not be every stack.
pub struct Fold {
    pub folded: Folded,
    /// The tables that answered (`samples_1m 59 min, samples 1 s`); `None` from a store.
    pub read_from: Option<String>,
    /// Rows of the window the server did not send ([`pushdown::OTHER_STACKS`]).
    pub note: Option<String>,
}

/// The node a read describes (a report's header, an export's host).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// `--node`, else the host name; `None` when nothing says.
    pub name: Option<String>,
    pub hostname: String,
    pub cpus: u32,
    pub hz: u64,
}

/// Where a window is read from.
pub enum Reader<'a> {
    /// A node's data directory, and the store of the samples asked for in it (the CPU's, or a
    /// CUDA kind's).
    Store { dir: PathBuf, store: Store },
    /// The chosen nodes in ClickHouse.
    ClickHouse { fleet: &'a Fleet, selection: &'a Selection, kind: SampleKind },
}

impl<'a> Reader<'a> {
    /// The store of `kind`'s samples in `dir`.
    pub fn store(dir: &Path, kind: SampleKind) -> Result<Self, StoreError> {
        let store = match kind {
            SampleKind::Cpu => Store::open(dir)?,
            kind => Store::open(&kind.store_dir(dir))?,
        };
        Ok(Self::Store { dir: dir.to_path_buf(), store })
    }

    pub fn clickhouse(fleet: &'a Fleet, selection: &'a Selection, kind: SampleKind) -> Self {
        Self::ClickHouse { fleet, selection, kind }
    }

    /// The one node read: several need `--node` for what only one node answers (CPU x time, a
    /// report).
    fn one(selection: &Selection) -> Result<&super::Node, FleetError> {
        selection
            .single()
            .ok_or_else(|| FleetError::WhichNode(selection.nodes.len(), super::select::list(&selection.nodes)))
    }

    /// The node: its name, host, CPUs and frequency.
    pub fn node(&self) -> Result<NodeInfo, ReadError> {
        Ok(match self {
            Self::Store { dir, .. } => {
                let meta = Meta::read(dir);
                let (cpus, hz) = Meta::cpus_and_frequency(dir);
                NodeInfo {
                    name: meta.as_ref().map(|m| if m.node.is_empty() { m.hostname.clone() } else { m.node.clone() }),
                    hostname: meta.map(|m| m.hostname).unwrap_or_default(),
                    cpus,
                    hz,
                }
            }
            Self::ClickHouse { selection, .. } => {
                // Several nodes: the first one's frequency (each sample carries its own).
                let first = selection.nodes.first();
                let one = selection.single();
                NodeInfo {
                    name: one.map(|n| n.name.clone()),
                    hostname: one.map(|n| n.host.split('/').next().unwrap_or_default().to_string()).unwrap_or_default(),
                    cpus: one.map_or(0, |n| n.cpus.max(1)),
                    hz: first.map_or(99, |n| u64::from(n.hz.max(1))),
                }
            }
        })
    }

    /// The samples of `window` that pass `filter`, folded within `budget`.
    pub fn fold(&mut self, window: Window, filter: &Filter, budget: FoldBudget) -> Result<Fold, ReadError> {
        match self {
            Self::Store { store, .. } => {
                let result = query::fold_within(store, window, filter, budget);
                for w in store.take_warnings() {
                    tracing::warn!("{w}");
                }
                Ok(Fold { folded: result?, read_from: None, note: None })
            }
            Self::ClickHouse { fleet, selection, kind } => {
                let f = pushdown::fold(fleet, selection, *kind, window, filter, budget)?;
                Ok(Fold { folded: f.folded, read_from: Some(f.read_from), note: f.note })
            }
        }
    }

    /// The node's description as its `meta.json` says it (from ClickHouse: its `nodes` row).
    pub fn meta(&self) -> Result<Option<Meta>, ReadError> {
        Ok(match self {
            Self::Store { dir, .. } => Meta::read(dir),
            Self::ClickHouse { selection, .. } => {
                let node = Self::one(selection)?;
                Some(Meta {
                    format_version: FORMAT_VERSION,
                    hostname: node.host.split('/').next().unwrap_or_default().to_string(),
                    node: node.name.clone(),
                    cpus: node.cpus.max(1),
                    frequency_hz: u64::from(node.hz.max(1)),
                    started_ns: 0,
                })
            }
        })
    }

    /// The subsecond heatmap of `window`, `rows` rows a second (several nodes: summed): of the
    /// CPU samples, or the weights of the kind read.
    pub fn grid(&mut self, window: Window, rows: usize, filter: &Filter) -> Result<Grid, ReadError> {
        match self {
            Self::Store { store, dir } => {
                query::check_filter(filter, Meta::read(dir).as_ref())?;
                Ok(query::subsecond_grid(store, window, rows, filter)?)
            }
            Self::ClickHouse { fleet, selection, kind: SampleKind::Cpu } => {
                Ok(pushdown::grid(fleet, selection, window, rows, filter)?)
            }
            Self::ClickHouse { fleet, selection, kind } => {
                Ok(kind_grid::grid(fleet, selection, *kind, window, rows, filter)?)
            }
        }
    }

    /// CPU x time of one node in buckets of `bucket_ns` (10 ms and up).
    pub fn cpu_time(&mut self, window: Window, bucket_ns: u64) -> Result<CpuTime, ReadError> {
        match self {
            Self::Store { store, dir } => {
                let (cpus, hz) = Meta::cpus_and_frequency(dir);
                Ok(query::cpu_time(store, window, bucket_ns, cpus, hz)?)
            }
            Self::ClickHouse { fleet, selection, .. } => {
                Ok(pushdown::cpu_time(fleet, Self::one(selection)?, window, bucket_ns)?)
            }
        }
    }

    /// One node's findings that overlap `window`, in start order.
    pub fn findings(&self, window: Window) -> Result<Vec<Finding>, ReadError> {
        match self {
            Self::Store { dir, .. } => Ok(detect::journal::findings_in(dir, window.from_ns, window.to_ns)?),
            Self::ClickHouse { fleet, selection, .. } => {
                let one = Selection { nodes: vec![Self::one(selection)?.clone()], whole_fleet: false };
                Ok(notes::findings(fleet, &one, Some(window))?.into_iter().map(|f| f.finding).collect())
            }
        }
    }

    /// One node's kernel log events in `window`, in time order.
    pub fn events(&self, window: Window) -> Result<Vec<Event>, ReadError> {
        match self {
            Self::Store { dir, .. } => Ok(detect::journal::events_in(dir, window.from_ns, window.to_ns)?),
            Self::ClickHouse { fleet, selection, .. } => {
                let one = Selection { nodes: vec![Self::one(selection)?.clone()], whole_fleet: false };
                Ok(notes::events(fleet, &one, Some(window))?.into_iter().map(|e| e.event).collect())
            }
        }
    }

    /// One node's counter tracks with points in `window`, ordered by name then CPU; more than
    /// `max_points` points are refused (from ClickHouse, counted by the server and not read).
    pub fn counters(&self, window: Window, max_points: u64) -> Result<Tracks, ReadError> {
        let tracks = match self {
            Self::Store { dir, .. } => {
                crate::store::counters::read(dir, window.from_ns, window.to_ns, &Default::default())?
            }
            Self::ClickHouse { fleet, selection, .. } => {
                let node = Self::one(selection)?;
                let points = counters::points(fleet, node, window)?;
                if points > max_points {
                    return Err(ReadError::TooManyPoints { points, limit: max_points });
                }
                counters::tracks(fleet, node, window)?
            }
        };
        let points = tracks.tracks.iter().map(|t| t.points.len() as u64).sum();
        if points > max_points {
            return Err(ReadError::TooManyPoints { points, limit: max_points });
        }
        Ok(tracks)
    }

    /// Calls `f` for each sample of `window` that passes `filter`, in time order; from
    /// ClickHouse streamed a chunk at a time, several nodes merged.
    pub fn for_each_sample(
        &mut self,
        window: Window,
        filter: &Filter,
        f: impl FnMut(&SampleRef<'_>),
    ) -> Result<u64, ReadError> {
        match self {
            Self::Store { store, .. } => Ok(query::for_each_sample(store, window, filter, f)?),
            Self::ClickHouse { fleet, selection, kind } => {
                Ok(samples::for_each_sample(fleet, selection, *kind, window, filter, f)?)
            }
        }
    }
}
