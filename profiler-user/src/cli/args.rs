//! Flags and checks several commands share: the data directory, the time window, the
//! sample filters, and the text/JSON choice.

use std::path::PathBuf;

use clap::ValueEnum;
use profiler::{
    query::{Filter, Window},
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
            include_idle: false,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum StatusFormat {
    Text,
    Json,
}

/// Refuses a window the store holds nothing of, saying what it does hold.
pub fn require_data(store: &mut Store, w: Window) -> anyhow::Result<()> {
    match store.span()? {
        Some((a, b)) if a < w.to_ns && b > w.from_ns => Ok(()),
        Some((a, b)) => anyhow::bail!(
            "no samples between {} and {} in {} (it holds {} to {})",
            timespec::format(w.from_ns),
            timespec::format(w.to_ns),
            store.data_dir().display(),
            timespec::format(a),
            timespec::format(b)
        ),
        None => anyhow::bail!("the store in {} is empty: is the daemon running?", store.data_dir().display()),
    }
}

pub fn window_of(from: &str, to: &str) -> anyhow::Result<Window> {
    let now = timespec::now_ns();
    Ok(Window::new(timespec::parse(from, now)?, timespec::parse(to, now)?)?)
}
