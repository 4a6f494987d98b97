//! Flags and checks several commands share: the data directory, the time window, the
//! sample filters, and the text/JSON choice.

use std::path::{Path, PathBuf};

use clap::ValueEnum;
use profiler::{
    fleet::{Fleet, FleetError, Selection, mirror::Mirror, pushdown},
    model::SampleKind,
    query::{self, Filter, FoldBudget, Folded, Window},
    store::Store,
    timespec,
};

pub const DEFAULT_DATA_DIR: &str = "/var/lib/profiler";

#[derive(clap::Args)]
pub struct DataDir {
    /// Where the daemon stores samples.
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
}

/// Where a read command reads: the node's store, or what a node shipped to ClickHouse.
#[derive(clap::Args)]
pub struct Source {
    #[command(flatten)]
    pub dir: DataDir,
    /// Read what a daemon shipped to this ClickHouse (http://[USER[:PASSWORD]@]HOST:PORT)
    /// instead of the data directory: the same answer, for any node of the fleet.
    #[arg(long, value_name = "URL")]
    pub clickhouse: Option<String>,
    /// With --clickhouse: the database the daemons ship to.
    #[arg(long, default_value = "profiler", requires = "clickhouse")]
    pub database: String,
    /// With --clickhouse: the node to read (its daemon's --node), or a glob (`gpu-*`); repeat
    /// for several. Flamegraphs of several nodes (or, without --node, of the whole fleet) are
    /// merged; the other commands read one node.
    #[arg(long, requires = "clickhouse")]
    pub node: Vec<String>,
}

/// A [`Source`] ready to read: a data directory, the node's store or a private copy.
pub struct Opened {
    data_dir: PathBuf,
    fleet: Option<FleetSource>,
}

/// What a read from ClickHouse covers: the nodes, and for one node the copy of its findings
/// and events (and, for the commands that read a copy, its samples).
struct FleetSource {
    fleet: Fleet,
    selection: Selection,
    mirror: Option<Mirror>,
}

impl Source {
    /// For a copy from ClickHouse: the node's findings and events now, its samples with
    /// [`Opened::load`]. One node only.
    pub fn open(&self) -> anyhow::Result<Opened> {
        let opened = self.open_nodes()?;
        match &opened.fleet {
            Some(f) if f.mirror.is_none() => Err(FleetError::WhichNode(
                f.selection.nodes.len(),
                f.selection.nodes.iter().take(10).map(|n| n.name.as_str()).collect::<Vec<_>>().join(", "),
            )
            .into()),
            _ => Ok(opened),
        }
    }

    /// As [`Source::open`], for a command that the server answers for any set of nodes
    /// ([`Opened::folder`]): one node gets its copy of findings and events, several none.
    pub fn open_nodes(&self) -> anyhow::Result<Opened> {
        let Some(url) = &self.clickhouse else {
            return Ok(Opened { data_dir: self.dir.data_dir.clone(), fleet: None });
        };
        let fleet = Fleet::new(url, &self.database)?;
        let selection = fleet.select(&self.node)?;
        let mirror = match selection.single() {
            Some(node) => Some(Mirror::new(&fleet, node.clone())?),
            None => None,
        };
        let data_dir = mirror.as_ref().map(|m| m.data_dir().to_path_buf()).unwrap_or_default();
        Ok(Opened { data_dir, fleet: Some(FleetSource { fleet, selection, mirror }) })
    }
}

/// Folds windows of one kind of samples: a node's store scanned here, or ClickHouse asked to
/// sum them ([`pushdown::fold`]) so that only the sums travel.
pub enum Folder<'a> {
    Store(Store),
    Fleet { fleet: &'a Fleet, selection: &'a Selection, kind: SampleKind },
}

impl Folder<'_> {
    pub fn fold(&mut self, window: Window, filter: &Filter, budget: FoldBudget) -> anyhow::Result<Folded> {
        match self {
            Self::Store(store) => {
                let result = query::fold_within(store, window, filter, budget);
                for w in store.take_warnings() {
                    tracing::warn!("{w}");
                }
                Ok(result?)
            }
            Self::Fleet { fleet, selection, kind } => {
                let fold = pushdown::fold(fleet, selection, *kind, window, filter, budget)?;
                eprintln!("note: ClickHouse answered from {}", fold.read_from);
                Ok(fold.folded)
            }
        }
    }
}

impl Opened {
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The fleet and the nodes asked, when reading from ClickHouse.
    pub fn fleet(&self) -> Option<(&Fleet, &Selection)> {
        self.fleet.as_ref().map(|f| (&f.fleet, &f.selection))
    }

    /// Several nodes are read (no copy of findings and events to look an id up in).
    pub fn several_nodes(&self) -> Option<String> {
        self.fleet.as_ref().filter(|f| f.mirror.is_none()).map(|f| f.selection.describe())
    }

    /// What folds `kind`'s samples over `windows`.
    pub fn folder(&mut self, windows: &[Window], kind: SampleKind) -> anyhow::Result<Folder<'_>> {
        if self.fleet.is_none() {
            return Ok(Folder::Store(self.load_kind(windows, kind)?));
        }
        let f = self.fleet.as_ref().expect("a fleet source");
        Ok(Folder::Fleet { fleet: &f.fleet, selection: &f.selection, kind })
    }

    /// The store of `kind`'s samples (the CPU samples: [`Opened::load`]).
    pub fn load_kind(&mut self, windows: &[Window], kind: SampleKind) -> anyhow::Result<Store> {
        if kind == SampleKind::Cpu {
            return self.load(windows);
        }
        if let Some(FleetSource { fleet, mirror: Some(mirror), .. }) = &mut self.fleet {
            let from = windows.iter().map(|w| w.from_ns).min().expect("a window");
            let to = windows.iter().map(|w| w.to_ns).max().expect("a window");
            mirror.copy_kind(fleet, Window::new(from, to)?, kind)?;
        }
        let dir = kind.store_dir(&self.data_dir);
        if !dir.is_dir() {
            profiler::store::check_dir(&self.data_dir)?;
            anyhow::bail!(
                "no {} in {}: the daemon counts them only for processes that map CUDA's driver library (libcuda.so.1); `profiler status` says whether it probes one",
                kind.unit(),
                self.data_dir.display()
            );
        }
        Ok(Store::open(&dir)?)
    }

    /// Copies the samples of the span of `windows` when reading from ClickHouse; opens the store.
    pub fn load(&mut self, windows: &[Window]) -> anyhow::Result<Store> {
        if let Some(FleetSource { fleet, mirror: Some(mirror), .. }) = &mut self.fleet {
            let from = windows.iter().map(|w| w.from_ns).min().expect("a window");
            let to = windows.iter().map(|w| w.to_ns).max().expect("a window");
            mirror.copy(fleet, Window::new(from, to)?)?;
        }
        Ok(Store::open(&self.data_dir)?)
    }

    /// What the data is, for sentences: the directory, or the node in ClickHouse.
    pub fn describe(&self) -> String {
        match &self.fleet {
            Some(f) => format!("what {} shipped to ClickHouse", f.selection.describe()),
            None => self.data_dir.display().to_string(),
        }
    }

    /// Refuses a window the data holds nothing of, saying what it does hold.
    pub fn require_data(&self, store: &mut Store, w: Window) -> anyhow::Result<()> {
        match store.span()? {
            Some((a, b)) if a < w.to_ns && b > w.from_ns => Ok(()),
            // The copy holds the window only: what it spans says nothing.
            _ if self.fleet.is_some() => anyhow::bail!(
                "no samples between {} and {} in {}",
                timespec::format(w.from_ns),
                timespec::format(w.to_ns),
                self.describe()
            ),
            Some((a, b)) => anyhow::bail!(
                "no samples between {} and {} in {} (it holds {} to {})",
                timespec::format(w.from_ns),
                timespec::format(w.to_ns),
                self.describe(),
                timespec::format(a),
                timespec::format(b)
            ),
            None => anyhow::bail!("the store in {} is empty: is the daemon running?", self.describe()),
        }
    }
}

/// `--samples`: which samples a command reads.
#[derive(Clone, Copy, Default, ValueEnum)]
pub enum Samples {
    /// CPU time (one sample per tick).
    #[default]
    Cpu,
    /// GPU kernel launches, per launching stack (count).
    CudaLaunches,
    /// Time blocked in CUDA synchronisations, per waiting stack (microseconds).
    CudaSync,
    /// Bytes copied by cuMemcpy*, per copying stack.
    CudaCopies,
    /// Time threads spent off their CPU, per stack they waited in (microseconds; `--state`).
    OffCpu,
}

impl Samples {
    pub fn kind(self) -> SampleKind {
        match self {
            Self::Cpu => SampleKind::Cpu,
            Self::CudaLaunches => SampleKind::CudaLaunches,
            Self::CudaSync => SampleKind::CudaSync,
            Self::CudaCopies => SampleKind::CudaCopies,
            Self::OffCpu => SampleKind::OffCpu,
        }
    }
}

/// `--from`/`--to`.
#[derive(clap::Args)]
pub struct WindowArgs {
    /// Start: RFC 3339, unix seconds, `now`, or relative (-30s, -5m, -1h).
    #[arg(long, allow_hyphen_values = true)]
    pub from: String,
    /// End (exclusive), same forms as --from.
    #[arg(long, allow_hyphen_values = true, default_value = "now")]
    pub to: String,
}

/// Sample filters.
#[derive(clap::Args)]
pub struct FilterArgs {
    /// Only this CPU (repeat for several).
    #[arg(long)]
    pub cpu: Vec<u32>,
    /// Only this process id.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Only processes with this comm.
    #[arg(long)]
    pub comm: Option<String>,
    /// Only processes of this pod: its name, namespace/name, or uid.
    #[arg(long)]
    pub pod: Option<String>,
    /// Only processes of pods in this Kubernetes namespace.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Only processes of this container: its name, or its id (12 or more hex digits will do).
    #[arg(long)]
    pub container: Option<String>,
    /// Only processes of this systemd unit (`kubelet` means `kubelet.service`).
    #[arg(long)]
    pub unit: Option<String>,
    /// Only samples in this kernel context: task, softirq (any), or softirq:NAME (NET_RX,
    /// TIMER, RCU, ...). Softirq samples carry a `[softirq:NAME]` frame.
    #[arg(long, value_name = "task|softirq[:NAME]")]
    pub context: Option<profiler::exec_context::ContextFilter>,
    /// Only stacks through a frame of this exact function name (as the flamegraph shows it,
    /// without the `_[k]` of kernel frames).
    #[arg(long, value_name = "NAME")]
    pub function: Option<String>,
    /// With --samples off-cpu: only waits in this state: io (uninterruptible: disk, network
    /// file systems), sleep (futex, poll, pipe or socket reads, nanosleep), runnable (preempted,
    /// waiting for a CPU). The stacks' `[off-cpu: STATE]` root frame.
    #[arg(long, value_name = "io|sleep|runnable", conflicts_with = "function")]
    pub state: Option<profiler::offcpu::OffState>,
}

impl FilterArgs {
    pub fn filter(self) -> Filter {
        Filter {
            cpus: self.cpu,
            pid: self.pid,
            comm: self.comm,
            workload: profiler::identity::Filter {
                pod: self.pod,
                namespace: self.namespace,
                container: self.container,
                unit: self.unit,
            },
            context: self.context,
            function: self.function.or(self.state.map(|s| s.frame().to_string())),
            include_idle: false,
            lines: false,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum StatusFormat {
    Text,
    Json,
}

pub fn window_of(from: &str, to: &str) -> anyhow::Result<Window> {
    let now = timespec::now_ns();
    Ok(Window::new(timespec::parse(from, now)?, timespec::parse(to, now)?)?)
}
