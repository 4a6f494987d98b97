//! Where the UI's answers come from: the daemon's own store, or what daemons shipped to
//! ClickHouse (`profiler ui --clickhouse URL`). A request names a node, or none (the daemon's
//! own, the one `--node` chose, or the only one shipped), and a window. A node's window in
//! ClickHouse is copied into a private data directory ([`Mirror`]) and every endpoint answers
//! from it with the store's own code, so the page shows what the CLI prints for the node.
//!
//! Copies are kept a moment and reused for any window inside them: a page load asks for the
//! heatmap and CPU x time of one window, then flamegraphs of selections inside it.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use crate::{
    fleet::{Fleet, FleetError, Selection, mirror::Mirror, pushdown},
    model::SampleKind,
    query::Window,
    store::{Meta, StoreSummary},
    timespec,
};

const SEC: u64 = 1_000_000_000;
/// How long a copy answers for data that may still be arriving (the daemons ship every few
/// seconds), and how long findings and events copied with it stand.
const FRESH_NS: u64 = 10 * SEC;
/// A window that ended this long before its copy was made is complete in it for good.
const SETTLED_NS: u64 = 60 * SEC;
/// Copies kept: each is at most [`crate::fleet::mirror::MAX_SAMPLES`] samples on disk.
const KEEP: usize = 3;

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(
        "this daemon profiles node '{own}' only: to read node '{asked}', open `profiler ui --clickhouse URL` where the nodes ship"
    )]
    OtherNode { own: String, asked: String },
    #[error("ClickHouse holds {0} nodes ({1}): type one in the node field")]
    WhichNode(usize, String),
    #[error(transparent)]
    Fleet(FleetError),
}

impl From<FleetError> for SourceError {
    fn from(e: FleetError) -> Self {
        match e {
            FleetError::WhichNode(n, names) => SourceError::WhichNode(n, names),
            e => SourceError::Fleet(e),
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
    copies: Mutex<Vec<Copy>>,
}

struct Copy {
    node: String,
    /// The samples copied: the CPU's, or a CUDA kind's (a copy of its own).
    kind: SampleKind,
    /// `None`: findings, events and the node's description, no samples.
    window: Option<Window>,
    made_ns: u64,
    mirror: Arc<Mirror>,
}

/// A data directory answering one request; a copy lives at least as long as this.
pub struct Dir {
    path: PathBuf,
    _copy: Option<Arc<Mirror>>,
}

impl Dir {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Source {
    pub fn fleet(fleet: Fleet, node: Option<String>) -> Self {
        Source::Fleet(FleetSource { fleet, node, copies: Mutex::new(Vec::new()) })
    }

    /// The data directory that answers for `node` (empty: the default one) over `window`
    /// (`None`: its findings, events and description only).
    pub fn dir(&self, node: Option<&str>, window: Option<Window>) -> Result<Dir, SourceError> {
        self.dir_of(node, window, SampleKind::Cpu)
    }

    /// As [`Source::dir`], with `kind`'s samples in it (a CUDA kind: in `kind.store_dir`).
    pub fn dir_of(&self, node: Option<&str>, window: Option<Window>, kind: SampleKind) -> Result<Dir, SourceError> {
        let asked = node.filter(|n| !n.is_empty());
        match self {
            Source::Store(dir) => {
                if let Some(asked) = asked {
                    let own = own_node(dir);
                    if own.as_deref() != Some(asked) {
                        return Err(SourceError::OtherNode { own: own.unwrap_or_default(), asked: asked.into() });
                    }
                }
                Ok(Dir { path: dir.clone(), _copy: None })
            }
            Source::Fleet(f) => f.dir(asked, window, kind),
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

    /// Removes the copies (their directories) not in use by a request.
    pub fn clear(&self) {
        if let Source::Fleet(f) = self {
            f.copies.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }
}

/// The daemon's node: its `--node`, else the host name.
fn own_node(dir: &Path) -> Option<String> {
    Meta::read(dir).map(|m| if m.node.is_empty() { m.hostname } else { m.node })
}

impl Source {
    /// For a fleet: the asked node's fold summed by ClickHouse (`fleet::pushdown`: no copy, the
    /// rollups where they resolve the window); `None` for a node's own store.
    pub fn fold(
        &self,
        node: Option<&str>,
        kind: SampleKind,
        window: Window,
        filter: &crate::query::Filter,
        budget: crate::query::FoldBudget,
    ) -> Option<Result<pushdown::Fold, SourceError>> {
        let Source::Fleet(f) = self else { return None };
        let fold = || -> Result<pushdown::Fold, SourceError> {
            let asked = node.filter(|n| !n.is_empty());
            let selection = match asked {
                // The fleet page's selections: several nodes (`a,b`) or globs, summed together.
                Some(list) if list.contains([',', '*', '?']) => {
                    f.fleet.select(&super::fleet_api::node_patterns(list))?
                }
                _ => Selection { nodes: vec![f.fleet.node(Some(&f.resolve(asked)?))?], whole_fleet: false },
            };
            Ok(pushdown::fold(&f.fleet, &selection, kind, window, filter, budget)?)
        };
        Some(fold())
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

impl FleetSource {
    fn resolve(&self, asked: Option<&str>) -> Result<String, SourceError> {
        match asked.or(self.node.as_deref()) {
            Some(n) => Ok(n.to_string()),
            None => Ok(self.fleet.node(None)?.name),
        }
    }

    fn dir(&self, asked: Option<&str>, window: Option<Window>, kind: SampleKind) -> Result<Dir, SourceError> {
        let name = self.resolve(asked)?;
        // Held while copying: the page's concurrent requests for one window wait for one copy.
        let mut copies = self.copies.lock().unwrap_or_else(|e| e.into_inner());
        let now = timespec::now_ns();
        let found = copies.iter().find(|c| {
            c.node == name && (c.kind == kind || window.is_none()) && covers(c.window, c.made_ns, window, now)
        });
        if let Some(c) = found {
            return Ok(Dir { path: c.mirror.data_dir().to_path_buf(), _copy: Some(c.mirror.clone()) });
        }
        let node = self.fleet.node(Some(&name))?;
        let mut mirror = Mirror::new(&self.fleet, node)?;
        match (window, kind) {
            (Some(w), SampleKind::Cpu) => mirror.copy(&self.fleet, w)?,
            (Some(w), kind) => mirror.copy_kind(&self.fleet, w, kind)?,
            (None, _) => {}
        }
        let mirror = Arc::new(mirror);
        if copies.len() >= KEEP {
            copies.remove(0);
        }
        copies.push(Copy { node: name, kind, window, made_ns: now, mirror: mirror.clone() });
        Ok(Dir { path: mirror.data_dir().to_path_buf(), _copy: Some(mirror) })
    }
}

/// Whether a copy answers for `want` at `now`: its findings and events while fresh; samples
/// of a window inside its own, for good once ClickHouse had all of it, else while fresh. A
/// fresh copy that reached its making answers up to now too (the page's requests of one
/// load each say `now` a few milliseconds apart).
fn covers(have: Option<Window>, made_ns: u64, want: Option<Window>, now: u64) -> bool {
    let fresh = now.saturating_sub(made_ns) < FRESH_NS;
    match (have, want) {
        (_, None) => fresh,
        (None, Some(_)) => false,
        (Some(have), Some(want)) => {
            let inside = have.from_ns <= want.from_ns && want.to_ns <= have.to_ns;
            let to_now = have.to_ns + SEC >= made_ns && have.from_ns <= want.from_ns && want.to_ns <= now;
            (inside && (fresh || want.to_ns + SETTLED_NS <= made_ns)) || (to_now && fresh)
        }
    }
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
                assert_eq!(source.dir(ok, None).unwrap().path(), dir.path(), "{ok:?}");
            }
            let e = source.dir(Some("gpu-8"), None).err().unwrap().to_string();
            assert!(e.contains(&format!("profiles node '{own}' only")) && e.contains("--clickhouse"), "{e}");
        }
        assert!(source.fleet_status(None).is_none());
    }

    #[test]
    fn a_copy_answers_inside_its_window_for_good_once_settled_and_up_to_now_while_fresh() {
        let t = 1_700_000_000 * SEC;
        let w = |a: u64, b: u64| Window::new(t + a * SEC, t + b * SEC).unwrap();
        let copy = |window: Option<Window>, made: u64| (window, t + made * SEC);
        let covers = |c: &(Option<Window>, u64), want, now| covers(c.0, c.1, want, now);
        let at = |s: u64| t + s * SEC;
        // An old window, copied long after it ended: any window inside, whenever.
        let old = copy(Some(w(0, 300)), 1000);
        assert!(covers(&old, Some(w(10, 20)), at(5000)));
        assert!(!covers(&old, Some(w(10, 301)), at(1001)), "beyond its end");
        assert!(!covers(&old, None, at(1011)), "findings go stale");
        assert!(covers(&old, None, at(1005)));
        // The last five minutes, copied at their end: the same again a moment later, not later.
        let recent = copy(Some(w(700, 1000)), 1000);
        assert!(covers(&recent, Some(w(700, 1000)), at(1000)));
        assert!(covers(&recent, Some(w(701, 1001)), at(1001)), "a load's second request");
        assert!(!covers(&recent, Some(w(710, 1010)), at(1010)), "stale for recent data");
        assert!(!covers(&recent, Some(w(699, 1001)), at(1001)), "before its start");
        assert!(covers(&recent, Some(w(800, 900)), at(1005)));
        assert!(!covers(&recent, Some(w(800, 990)), at(1010)), "not settled, not fresh");
        let notes = copy(None, 1000);
        assert!(!covers(&notes, Some(w(800, 900)), at(1000)), "no samples in it");
    }
}
