//! Where the UI's answers come from: the daemon's own store, or what daemons shipped to
//! ClickHouse (`profiler ui --clickhouse URL`). A request names a node, or none (the daemon's
//! own, the one `--node` chose, or the only one shipped), and a window. Either way it is
//! answered through the one read interface the commands use ([`Reader`]): from ClickHouse by
//! SQL that sums in the server (flamegraphs, heatmaps, CPU x time, findings, events, counter
//! tracks), so only answers travel and a node's hour is no bigger a request than its minute.
//! Nothing is copied or kept here: every request reads what the server holds then.

use std::path::{Path, PathBuf};

use crate::{
    fleet::{
        Fleet, FleetError, Selection,
        reader::{ReadError, Reader},
    },
    model::SampleKind,
    query::QueryError,
    store::{Meta, StoreSummary},
};

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(
        "this daemon profiles node '{own}' only: to read node '{asked}', open `profiler ui --clickhouse URL` where the nodes ship"
    )]
    OtherNode { own: String, asked: String },
    #[error("ClickHouse holds {0} nodes ({1}): type one in the node field")]
    WhichNode(usize, String),
    /// The daemon has no store of this kind: it never counted one (see `request::not_recorded`).
    #[error("no {} recorded on this node", .0.unit())]
    NotRecorded(SampleKind),
    #[error(transparent)]
    Fleet(FleetError),
    /// The window or the filters, said of the data (no samples, an unknown CPU).
    #[error(transparent)]
    Query(QueryError),
    /// What the reader could not do (a broken store, too many counter points).
    #[error(transparent)]
    Read(ReadError),
}

impl From<FleetError> for SourceError {
    fn from(e: FleetError) -> Self {
        match e {
            FleetError::WhichNode(n, names) => SourceError::WhichNode(n, names),
            e => SourceError::Fleet(e),
        }
    }
}

impl From<ReadError> for SourceError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Fleet(f) => f.into(),
            ReadError::Query(q) => SourceError::Query(q),
            e => SourceError::Read(e),
        }
    }
}

pub enum Source {
    /// The daemon's data directory.
    Store(PathBuf),
    /// What daemons shipped to ClickHouse.
    Fleet(FleetSource),
}

/// What the page's header says of a fleet: where it is read, and the node's summary (or why
/// there is none: several nodes and none chosen, an unknown one).
pub struct FleetStatus {
    pub source: String,
    pub summary: Result<StoreSummary, SourceError>,
}

pub struct FleetSource {
    fleet: Fleet,
    /// The node `--node` chose, when the request names none.
    node: Option<String>,
}

impl Source {
    pub fn fleet(fleet: Fleet, node: Option<String>) -> Self {
        Source::Fleet(FleetSource { fleet, node })
    }

    /// Runs `read` on what answers for `node` (empty: the default one) and `kind`'s samples:
    /// the daemon's store, or ClickHouse for the node, or (the fleet page's selections: `a,b`
    /// or globs) for several nodes summed where an answer can be (a flamegraph, a heatmap).
    pub fn read<T>(
        &self,
        node: Option<&str>,
        kind: SampleKind,
        read: impl FnOnce(&mut Reader<'_>) -> Result<T, ReadError>,
    ) -> Result<T, SourceError> {
        let asked = node.filter(|n| !n.is_empty());
        match self {
            Source::Store(dir) => {
                let dir = own_dir(dir, asked)?;
                if kind != SampleKind::Cpu && !kind.store_dir(dir).is_dir() {
                    return Err(SourceError::NotRecorded(kind));
                }
                let mut reader = Reader::store(dir, kind).map_err(ReadError::from)?;
                Ok(read(&mut reader)?)
            }
            Source::Fleet(f) => {
                let selection = f.selection(asked)?;
                Ok(read(&mut Reader::clickhouse(&f.fleet, &selection, kind))?)
            }
        }
    }

    /// The daemon's data directory, for what only a daemon has (its health, its GPUs' and
    /// interrupts' placement); `None` for a fleet. Another node's name is refused.
    pub fn daemon_dir(&self, node: Option<&str>) -> Result<Option<&Path>, SourceError> {
        match self {
            Source::Store(dir) => Ok(Some(own_dir(dir, node.filter(|n| !n.is_empty()))?)),
            Source::Fleet(_) => Ok(None),
        }
    }

    /// Every node this source answers for, by name.
    pub fn nodes(&self) -> Result<Vec<String>, SourceError> {
        match self {
            Source::Store(dir) => Ok(own_node(dir).into_iter().collect()),
            Source::Fleet(f) => Ok(f.fleet.nodes()?.into_iter().map(|n| n.name).collect()),
        }
    }

    /// For a fleet: what it is, and what ClickHouse holds of the node (for the page's header).
    pub fn fleet_status(&self, node: Option<&str>) -> Option<FleetStatus> {
        let Source::Fleet(f) = self else { return None };
        let summary = f.resolve(node.filter(|n| !n.is_empty())).and_then(|name| Ok(f.fleet.summary(&name)?));
        Some(FleetStatus { source: f.fleet.describe(), summary })
    }

    /// The fleet this source reads, if it is one.
    pub fn as_fleet(&self) -> Option<&Fleet> {
        match self {
            Source::Fleet(f) => Some(&f.fleet),
            Source::Store(_) => None,
        }
    }

    /// Whether `/` is the fleet page: a fleet, and no node chosen by `--node`.
    pub fn fleet_page(&self) -> bool {
        matches!(self, Source::Fleet(f) if f.node.is_none())
    }
}

/// The daemon's directory, when `asked` is its own node (or none).
fn own_dir<'a>(dir: &'a Path, asked: Option<&str>) -> Result<&'a Path, SourceError> {
    if let Some(asked) = asked {
        let own = own_node(dir);
        if own.as_deref() != Some(asked) {
            return Err(SourceError::OtherNode { own: own.unwrap_or_default(), asked: asked.into() });
        }
    }
    Ok(dir)
}

/// The daemon's node: its `--node`, else the host name.
fn own_node(dir: &Path) -> Option<String> {
    Meta::read(dir).map(|m| if m.node.is_empty() { m.hostname } else { m.node })
}

impl FleetSource {
    fn resolve(&self, asked: Option<&str>) -> Result<String, SourceError> {
        match asked.or(self.node.as_deref()) {
            Some(n) => Ok(n.to_string()),
            None => Ok(self.fleet.node(None)?.name),
        }
    }

    /// The nodes a request reads: one, or the fleet page's list or globs.
    fn selection(&self, asked: Option<&str>) -> Result<Selection, SourceError> {
        Ok(match asked {
            Some(list) if list.contains([',', '*', '?']) => self.fleet.select(&node_patterns(list))?,
            _ => Selection { nodes: vec![self.fleet.node(Some(&self.resolve(asked)?))?], whole_fleet: false },
        })
    }
}

/// `a,b,gpu-*` as patterns (a node named with a comma cannot be asked this way).
pub(super) fn node_patterns(list: &str) -> Vec<String> {
    list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_answers_for_its_own_node_only() {
        let dir = tempfile::tempdir().unwrap();
        let meta = |node: &str| Meta {
            format_version: crate::store::format::FORMAT_VERSION,
            hostname: "gpu-host-7".into(),
            node: node.into(),
            cpus: 2,
            frequency_hz: 99,
            started_ns: 0,
        };
        let source = Source::Store(dir.path().to_path_buf());
        for (node, own) in [("", "gpu-host-7"), ("gpu-7", "gpu-7")] {
            meta(node).write(dir.path()).unwrap();
            assert_eq!(source.nodes().unwrap(), [own]);
            for ok in [None, Some(""), Some(own)] {
                assert_eq!(source.daemon_dir(ok).unwrap(), Some(dir.path()), "{ok:?}");
                let read = source.read(ok, SampleKind::Cpu, |r| r.meta()).unwrap().unwrap();
                assert_eq!(read.cpus, 2, "{ok:?}");
            }
            let e = source.daemon_dir(Some("gpu-8")).err().unwrap().to_string();
            assert!(e.contains(&format!("profiles node '{own}' only")) && e.contains("--clickhouse"), "{e}");
            let e = source.read(Some("gpu-8"), SampleKind::Cpu, |r| r.meta()).err().unwrap().to_string();
            assert!(e.contains("only"), "{e}");
        }
        // A kind the daemon never counted: said before any store is opened.
        let e = source.read(None, SampleKind::CudaSync, |r| r.meta()).err().unwrap();
        assert!(matches!(e, SourceError::NotRecorded(SampleKind::CudaSync)), "{e}");
        assert!(source.fleet_status(None).is_none());
    }
}
