//! `profiler run`: the daemon's flags, merged with its config file.

use std::{path::PathBuf, time::Duration};

use anyhow::Context as _;
use clap::ValueEnum;
use profiler::{
    collect::kmsg,
    config::{self, ConfigFile},
    daemon::{self, DaemonConfig},
    logs,
    store::writer::WriterLimits,
};

use super::args::DEFAULT_DATA_DIR;

/// Flags of `profiler run`. Each overrides the config file, which overrides the defaults.
#[derive(clap::Args)]
pub struct RunArgs {
    /// TOML file with any of these settings (see README).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Where samples are stored [default: /var/lib/profiler].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Samples per second on each CPU [default: 99].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    frequency: Option<u64>,
    /// Size of the BPF ring buffer in KiB, a power of two from 4 to 1048576 [default: CPUs x Hz,
    /// from 1024 to 4096].
    #[arg(long)]
    ring_buffer_kib: Option<u32>,
    /// Kernel memory for unwind tables of code without frame pointers, in MiB; 0: frame
    /// pointers only [default: 80].
    #[arg(long)]
    unwind_table_mib: Option<u32>,
    /// The daemon's memory budget in MiB: what it may hold in all, its BPF maps included
    /// [default: its memory cgroup's limit (the unit's MemoryMax), else 256].
    #[arg(long, value_parser = clap::value_parser!(u64).range(64..=1_048_576))]
    memory_mib: Option<u64>,
    /// How often samples are written to disk, in milliseconds [default: 1000: each second as one block,
    /// written just after it ends].
    #[arg(long, value_parser = clap::value_parser!(u64).range(50..=1_000))]
    flush_ms: Option<u64>,
    /// How often the daemon logs its one-line report, in seconds [default: 10].
    #[arg(long)]
    report_secs: Option<u64>,
    /// Size limit of the store; the oldest minutes go first [default: 1GiB].
    #[arg(long)]
    max_size: Option<String>,
    /// Age limit of the store [default: 7d].
    #[arg(long)]
    max_age: Option<String>,
    /// Roll minutes older than this up into 10 s aggregates, or `off` [default: 24h].
    #[arg(long)]
    rollup_after: Option<String>,
    /// Address of the UI, JSON API and /metrics, or `off` [default: 127.0.0.1:7070].
    #[arg(long)]
    listen: Option<String>,
    /// This node's name in exports and fleet stores [default: the host name; in a DaemonSet,
    /// the Kubernetes node name from the downward API].
    #[arg(long)]
    node: Option<String>,
    /// The host's /var/log: the kubelet's `containers/` and `pods/` there name each sampled
    /// process's pod and container [default: /var/log].
    #[arg(long)]
    kubelet_logs: Option<PathBuf>,
    /// Push profiles to this OpenTelemetry collector (http://HOST:PORT), as `[otlp] endpoint`
    /// in the config file, which holds the other OTLP settings [default: no push].
    #[arg(long)]
    otlp_endpoint: Option<String>,
    /// Ship samples to ClickHouse at this HTTP URL (e.g. http://127.0.0.1:8123), or set
    /// `[clickhouse] url` in the config file [default: no shipping].
    #[arg(long)]
    clickhouse: Option<String>,
    /// Do not read kernel counters (softnet, softirqs, interrupts, PSI, cgroups, NICs) each
    /// second; as `kernel_counters = false` in the config file [default: read them].
    #[arg(long)]
    no_kernel_counters: bool,
    /// NVIDIA's management library for the GPU tracks: a file name the loader finds, a path
    /// (a driver installed elsewhere), or `off`; as `[gpu] nvml_library` [default:
    /// libnvidia-ml.so.1]. A node without it runs as before and says so.
    #[arg(long)]
    nvml_library: Option<String>,
    /// How often the GPUs are read, ms; as `[gpu] poll_ms` [default: 100].
    #[arg(long)]
    gpu_poll_ms: Option<u64>,
    /// Do not probe CUDA's driver library (launches, synchronisations and copies per stack);
    /// as `[gpu] cuda_probes = false` [default: probe every process that maps libcuda.so.1].
    #[arg(long)]
    no_cuda_probes: bool,
    /// CUDA probe hits a second per process above which the probes are on only part of the
    /// time (their cost is a trap per call; counts then are scaled estimates, marked); as
    /// `[gpu] cuda_max_calls_per_sec` [default: 0, 1 % of the process's CPU time: 3,000 on a
    /// core, at least 1,000].
    #[arg(long)]
    cuda_max_calls_per_sec: Option<u32>,
    /// Off-CPU time: waits at least this long (ms) are recorded by stack, state and second
    /// (`--samples off-cpu`); 0 turns it off; as `off_cpu_threshold_ms` in the config file
    /// [default: 1].
    #[arg(long)]
    off_cpu_threshold_ms: Option<f64>,
    /// Log lines on stderr as text or JSON objects [default: the journal when stderr is the
    /// journal, else text].
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum LogFormat {
    /// One line per event: time, level, sentence, key=value fields
    Text,
    /// One JSON object per event (`timestamp`, `level`, `fields` with `message`)
    Json,
}

impl RunArgs {
    fn into_config(self) -> anyhow::Result<DaemonConfig> {
        let file = match &self.config {
            Some(path) => ConfigFile::load(path)?,
            None => ConfigFile::default(),
        };
        let store = file.store.clone();
        if let Some(p) = &file.events.patterns {
            kmsg::Kmsg::validate(p)?;
        }
        let frequency = self.frequency.or(file.frequency).unwrap_or(99);
        if !(1..=10_000).contains(&frequency) {
            anyhow::bail!("frequency {frequency} Hz is out of range: use 1 to 10000");
        }
        let flush_ms = self.flush_ms.or(file.flush_ms).unwrap_or(1_000);
        if !(50..=1_000).contains(&flush_ms) {
            anyhow::bail!(
                "flush_ms {flush_ms} is out of range: use 50 to 1000 (at most 1 s of samples may wait in memory)"
            );
        }
        let report_secs = self.report_secs.or(file.report_secs).unwrap_or(10);
        if !(1..=86_400).contains(&report_secs) {
            anyhow::bail!("report_secs {report_secs} is out of range: use 1 to 86400 seconds");
        }
        let store_flags =
            config::StoreFlags { max_size: self.max_size, max_age: self.max_age, rollup_after: self.rollup_after };
        let settings = config::Reloadable::from(&file, &store_flags)?;
        let listen = self.listen.or(file.listen).unwrap_or_else(|| "127.0.0.1:7070".to_string());
        let listen = if listen.eq_ignore_ascii_case("off") {
            None
        } else {
            Some(listen.parse().map_err(|_| {
                anyhow::anyhow!("listen address '{listen}' is not IP:PORT (e.g. 127.0.0.1:7070) or off")
            })?)
        };
        let node = match self.node.or(file.node) {
            Some(n) if n.trim().is_empty() || n.len() > 253 => {
                anyhow::bail!("node name '{n}' is empty or longer than 253 bytes: give the Kubernetes node name")
            }
            Some(n) => n,
            None => std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string(),
        };
        let otlp = config::otlp(&file.otlp, self.otlp_endpoint.as_deref())?;
        let data_dir = self.data_dir.or(file.data_dir).unwrap_or_else(|| DEFAULT_DATA_DIR.into());
        let clickhouse = profiler::ship::clickhouse::Config::resolve(
            self.clickhouse,
            file.clickhouse.as_ref(),
            &node,
            data_dir.clone(),
            settings.retention.max_age_ns / 1_000_000_000,
        )?;
        let unwind_mib = self.unwind_table_mib.or(file.unwind_table_mib).unwrap_or(config::UNWIND_MIB_DEFAULT);
        let ring_bytes =
            config::ring_buffer_bytes(self.ring_buffer_kib.or(file.ring_buffer_kib).unwrap_or_else(|| {
                let cpus = aya::util::online_cpus().map_or(64, |c| c.len() as u32);
                config::default_ring_kib(cpus, frequency)
            }))?;
        let (limit, source) = match self.memory_mib.or(file.memory_mib) {
            Some(mib) => (mib << 20, "flag"),
            None => match profiler::memory::cgroup_limit() {
                Some(bytes) => (bytes, "cgroup"),
                None => (profiler::memory::DEFAULT_LIMIT, "default"),
            },
        };
        let memory = profiler::memory::Plan::new(limit, source, u64::from(unwind_mib) << 20, u64::from(ring_bytes))?;
        let gpu = config::gpu(&file.gpu, self.nvml_library, self.gpu_poll_ms)?;
        Ok(DaemonConfig {
            memory,
            cuda: !self.no_cuda_probes && file.gpu.cuda_probes.unwrap_or(true),
            offcpu_threshold_ns: offcpu_threshold(
                self.off_cpu_threshold_ms.or(file.off_cpu_threshold_ms).unwrap_or(DEFAULT_THRESHOLD_MS),
            )?,
            cuda_max_calls: config::cuda_max_calls(self.cuda_max_calls_per_sec.or(file.gpu.cuda_max_calls_per_sec))?,
            gpu,
            kernel_counters: !self.no_kernel_counters && file.kernel_counters.unwrap_or(true),
            flight: file.flight,
            clickhouse,
            listen,
            otlp,
            node,
            kubelet_logs: self.kubelet_logs.or(file.kubelet_logs).unwrap_or_else(|| "/var/log".into()),
            data_dir,
            frequency_hz: frequency,
            ring_bytes,
            unwind_rows: config::unwind_rows(unwind_mib)?,
            flush_interval: Duration::from_millis(flush_ms),
            report_interval: Duration::from_secs(report_secs),
            settings,
            config_path: self.config,
            store_flags,
            limits: WriterLimits {
                dict_cap: config::dict_cap(store.dict_cap.unwrap_or(WriterLimits::default().dict_cap))?,
                ..Default::default()
            },
            event_patterns: file
                .events
                .patterns
                .unwrap_or_else(|| kmsg::DEFAULT_PATTERNS.iter().map(|p| p.to_string()).collect()),
        })
    }
}

impl LogFormat {
    pub fn logs(self) -> logs::Format {
        match self {
            LogFormat::Text => logs::Format::Text,
            LogFormat::Json => logs::Format::Json,
        }
    }
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = args.into_config()?;
    let rt =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
    rt.block_on(daemon::run(config))?;
    Ok(())
}

/// `--off-cpu-threshold-ms` or `off_cpu_threshold_ms` when neither is given.
const DEFAULT_THRESHOLD_MS: f64 = profiler::offcpu::DEFAULT_THRESHOLD_NS as f64 / 1e6;

/// `--off-cpu-threshold-ms` / `off_cpu_threshold_ms`, checked: 0 (off) or from 10 µs to 10 s.
fn offcpu_threshold(ms: f64) -> anyhow::Result<u64> {
    if ms == 0.0 {
        return Ok(0);
    }
    if !(0.01..=10_000.0).contains(&ms) {
        anyhow::bail!(
            "off-CPU threshold {ms} ms (--off-cpu-threshold-ms, off_cpu_threshold_ms) is out of range: give 0 (off) \
             or 0.01 to 10000 ms"
        );
    }
    Ok((ms * 1e6) as u64)
}
