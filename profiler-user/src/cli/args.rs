//! Flags and checks several commands share: the data directory, the time window, the
//! sample filters, and the text/JSON choice.

use std::path::{Path, PathBuf};

use clap::ValueEnum;
use profiler::{
    fleet::{Fleet, FleetError, Selection, reader::Reader},
    model::SampleKind,
    query::{Filter, FoldBudget, Folded, Window},
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
    /// for several. Flamegraphs, heatmaps, exports, findings and events of several nodes (or,
    /// without --node, of the whole fleet) are merged; CPU x time and reports read one node.
    #[arg(long, requires = "clickhouse")]
    pub node: Vec<String>,
}

/// A [`Source`] ready to read: a data directory, or the nodes chosen in ClickHouse.
pub struct Opened {
    data_dir: PathBuf,
    fleet: Option<FleetSource>,
}

/// What a read from ClickHouse covers.
struct FleetSource {
    fleet: Fleet,
    selection: Selection,
}

impl Source {
    /// For a command that reads one node (CPU x time, a report): several are refused.
    pub fn open(&self) -> anyhow::Result<Opened> {
        let opened = self.open_nodes()?;
        match &opened.fleet {
            Some(f) if f.selection.single().is_none() => Err(FleetError::WhichNode(
                f.selection.nodes.len(),
                f.selection.nodes.iter().take(10).map(|n| n.name.as_str()).collect::<Vec<_>>().join(", "),
            )
            .into()),
            _ => Ok(opened),
        }
    }

    /// For a command that the server answers for any set of nodes ([`Opened::reader`]).
    pub fn open_nodes(&self) -> anyhow::Result<Opened> {
        let Some(url) = &self.clickhouse else {
            return Ok(Opened { data_dir: self.dir.data_dir.clone(), fleet: None });
        };
        let fleet = Fleet::new(url, &self.database)?;
        let selection = fleet.select(&self.node)?;
        Ok(Opened { data_dir: PathBuf::new(), fleet: Some(FleetSource { fleet, selection }) })
    }
}

/// Folds a window with `reader`, saying on stderr what answered from ClickHouse and what the
/// answer left out.
pub fn fold(reader: &mut Reader<'_>, window: Window, filter: &Filter, budget: FoldBudget) -> anyhow::Result<Folded> {
    let fold = reader.fold(window, filter, budget)?;
    if let Some(from) = &fold.read_from {
        eprintln!("note: ClickHouse answered from {from}");
    }
    if let Some(note) = &fold.note {
        eprintln!("note: {note}");
    }
    Ok(fold.folded)
}

impl Opened {
    /// The data directory (reading a store; empty when reading ClickHouse).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The fleet and the nodes asked, when reading from ClickHouse.
    pub fn fleet(&self) -> Option<(&Fleet, &Selection)> {
        self.fleet.as_ref().map(|f| (&f.fleet, &f.selection))
    }

    /// Several nodes are read (what one node's findings say is not there to look an id up in).
    pub fn several_nodes(&self) -> Option<String> {
        self.fleet.as_ref().filter(|f| f.selection.single().is_none()).map(|f| f.selection.describe())
    }

    /// What reads `kind`'s samples (and the node's findings and events): the store, or
    /// ClickHouse by SQL.
    pub fn reader(&self, kind: SampleKind) -> anyhow::Result<Reader<'_>> {
        if let Some(f) = &self.fleet {
            return Ok(Reader::clickhouse(&f.fleet, &f.selection, kind));
        }
        profiler::store::check_dir(&self.data_dir)?;
        if kind != SampleKind::Cpu && !kind.store_dir(&self.data_dir).is_dir() {
            anyhow::bail!(
                "no {} in {}: the daemon counts them only for processes that map CUDA's driver library (libcuda.so.1); `profiler status` says whether it probes one",
                kind.unit(),
                self.data_dir.display()
            );
        }
        Ok(Reader::store(&self.data_dir, kind)?)
    }

    /// What the data is, for sentences: the directory, or the node in ClickHouse.
    pub fn describe(&self) -> String {
        match &self.fleet {
            Some(f) => format!("what {} shipped to ClickHouse", f.selection.describe()),
            None => self.data_dir.display().to_string(),
        }
    }

    /// Refuses a window the data holds nothing of, saying what it does hold.
    pub fn require_data(&self, reader: &mut Reader<'_>, w: Window) -> anyhow::Result<()> {
        let store = match reader {
            Reader::ClickHouse { fleet, selection, kind } => {
                return Ok(profiler::fleet::samples::require_data(fleet, selection, *kind, w)?);
            }
            Reader::Store { store, .. } => store,
        };
        match store.span()? {
            Some((a, b)) if a < w.to_ns && b > w.from_ns => Ok(()),
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
    /// waiting for a CPU), the stacks' `[off-cpu: STATE]` root frame; or on this: lock (futex,
    /// kernel mutex), poll (poll/select/epoll), pipe, socket, timer (nanosleep), file (file
    /// systems, block devices), child (wait4), other, their `[wait: ON]` second frame.
    #[arg(
        long,
        value_name = "io|sleep|runnable|lock|poll|pipe|socket|timer|file|child|other",
        conflicts_with = "function"
    )]
    pub state: Option<profiler::offcpu::StateFilter>,
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

/// Now, for the times of a read of `source` (`times`: the ones given, as typed): to the whole
/// second when ClickHouse answers, so that a window relative to now (`--from -1h`) is whole
/// seconds and a fleet-wide read takes its edges from the fleet's seconds (`samples_fleet_1s`),
/// not raw rows (docs/clickhouse.md, "Which table answers"); said in a note when a time is
/// relative. Absolute times are read as given, to the nanosecond.
pub fn now_for(source: &Source, times: &[&str]) -> u64 {
    let now = timespec::now_ns();
    if source.clickhouse.is_none() {
        return now;
    }
    let relative = |t: &&str| t.trim().eq_ignore_ascii_case("now") || t.trim().starts_with('-');
    if times.iter().any(relative) {
        eprintln!("note: now taken to the whole second for ClickHouse ({})", timespec::format(now / SEC * SEC));
    }
    now / SEC * SEC
}

const SEC: u64 = 1_000_000_000;

pub fn window_of(from: &str, to: &str) -> anyhow::Result<Window> {
    let now = timespec::now_ns();
    Ok(Window::new(timespec::parse(from, now)?, timespec::parse(to, now)?)?)
}
