//! `profiler`: the daemon (`profiler run`) and the engineer's CLI over what it stored.

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use profiler::{
    config::{self, ConfigFile},
    daemon::{self, DaemonConfig},
    flamegraph,
    query::{self, Filter, Window},
    store::writer::WriterLimits,
    store::{Meta, Store},
    timespec,
};

const DEFAULT_DATA_DIR: &str = "/var/lib/profiler";

#[derive(Parser)]
#[command(name = "profiler", version, about = "Always-on eBPF CPU profiler with a time axis")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args)]
struct DataDir {
    /// Where the daemon stores samples.
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
}

#[derive(Subcommand)]
enum Command {
    /// Run the profiling daemon in the foreground (needs root, or CAP_BPF + CAP_PERFMON).
    Run(RunArgs),
    /// Flamegraph (SVG) or folded stacks of a time window.
    Flamegraph {
        #[command(flatten)]
        dir: DataDir,
        /// Start: RFC 3339, unix seconds, `now`, or relative (-30s, -5m, -1h).
        #[arg(long, allow_hyphen_values = true)]
        from: String,
        /// End (exclusive), same forms as --from.
        #[arg(long, allow_hyphen_values = true, default_value = "now")]
        to: String,
        /// Only this CPU (repeat for several).
        #[arg(long)]
        cpu: Vec<u32>,
        /// Only this process id.
        #[arg(long)]
        pid: Option<u32>,
        /// Only processes with this comm.
        #[arg(long)]
        comm: Option<String>,
        /// Show idle samples (as `[idle]`).
        #[arg(long)]
        include_idle: bool,
        #[arg(long, value_enum, default_value_t = Format::Svg)]
        format: Format,
        /// Output file (default: stdout).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// What the store holds: time range, samples per CPU, lost samples, size.
    Status {
        #[command(flatten)]
        dir: DataDir,
        #[arg(long, value_enum, default_value_t = StatusFormat::Text)]
        format: StatusFormat,
    },
}

/// Flags of `profiler run`. Each overrides the config file, which overrides the defaults.
#[derive(clap::Args)]
struct RunArgs {
    /// TOML file with any of these settings (see README).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Where samples are stored [default: /var/lib/profiler].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Samples per second on each CPU [default: 99].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    frequency: Option<u64>,
    /// Size of the BPF ring buffer in KiB, a power of two [default: 4096].
    #[arg(long)]
    ring_buffer_kib: Option<u32>,
    /// How often samples are written to disk, in milliseconds [default: 500].
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
}

impl RunArgs {
    fn into_config(self) -> anyhow::Result<DaemonConfig> {
        let file = match &self.config {
            Some(path) => ConfigFile::load(path)?,
            None => ConfigFile::default(),
        };
        let store = file.store;
        let frequency = self.frequency.or(file.frequency).unwrap_or(99);
        if !(1..=10_000).contains(&frequency) {
            anyhow::bail!("frequency {frequency} Hz is out of range: use 1 to 10000");
        }
        let flush_ms = self.flush_ms.or(file.flush_ms).unwrap_or(500);
        if !(50..=1_000).contains(&flush_ms) {
            anyhow::bail!(
                "flush_ms {flush_ms} is out of range: use 50 to 1000 (at most 1 s of samples may wait in memory)"
            );
        }
        let retention = config::retention(
            self.max_size.or(store.max_size).as_deref().unwrap_or("1GiB"),
            self.max_age.or(store.max_age).as_deref().unwrap_or("7d"),
        )?;
        Ok(DaemonConfig {
            data_dir: self.data_dir.or(file.data_dir).unwrap_or_else(|| DEFAULT_DATA_DIR.into()),
            frequency_hz: frequency,
            ring_bytes: self.ring_buffer_kib.or(file.ring_buffer_kib).unwrap_or(4096).saturating_mul(1024),
            flush_interval: Duration::from_millis(flush_ms),
            report_interval: Duration::from_secs(self.report_secs.or(file.report_secs).unwrap_or(10).max(1)),
            retention,
            rollup_after: config::rollup_after(self.rollup_after.or(store.rollup_after).as_deref().unwrap_or("24h"))?,
            limits: WriterLimits {
                dict_cap: store.dict_cap.unwrap_or(WriterLimits::default().dict_cap),
                ..Default::default()
            },
        })
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Svg,
    Folded,
}

#[derive(Clone, Copy, ValueEnum)]
enum StatusFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).format_target(false).init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One sentence (with its causes), never a backtrace.
            let mut msg = e.to_string();
            for cause in e.chain().skip(1) {
                let c = cause.to_string();
                if !msg.contains(&c) {
                    msg.push_str(": ");
                    msg.push_str(&c);
                }
            }
            eprintln!("profiler: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => {
            let config = args.into_config()?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            rt.block_on(daemon::run(config))?;
            Ok(())
        }
        Command::Flamegraph { dir, from, to, cpu, pid, comm, include_idle, format, output } => {
            let now = timespec::now_ns();
            let window = Window::new(timespec::parse(&from, now)?, timespec::parse(&to, now)?)?;
            let filter = Filter { cpus: cpu, pid, comm, include_idle };
            let mut store = Store::open(&dir.data_dir)?;
            let result = query::fold(&mut store, window, &filter);
            for w in store.take_warnings() {
                log::warn!("{w}");
            }
            let folded = result?;
            let mut out = open_output(output.as_deref())?;
            match format {
                Format::Folded => flamegraph::write_folded(&folded, &mut out)?,
                Format::Svg => {
                    let title = match filter.cpus.as_slice() {
                        [] => "CPU flamegraph".to_string(),
                        cpus => format!(
                            "CPU flamegraph, CPU {}",
                            cpus.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
                        ),
                    };
                    let subtitle = format!(
                        "{} to {} ({}), {} samples",
                        timespec::format(window.from_ns),
                        timespec::format(window.to_ns),
                        timespec::format_duration(window.to_ns - window.from_ns),
                        folded.total()
                    );
                    flamegraph::write_svg(&folded, &title, &subtitle, &mut out)?
                }
            }
            Ok(())
        }
        Command::Status { dir, format } => status(&dir.data_dir, format),
    }
}

fn open_output(path: Option<&Path>) -> anyhow::Result<Box<dyn Write>> {
    Ok(match path {
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?,
        )),
    })
}

fn status(data_dir: &Path, format: StatusFormat) -> anyhow::Result<()> {
    let mut store = Store::open(data_dir)?;
    let summary = store.summary()?;
    for w in store.take_warnings() {
        log::warn!("{w}");
    }
    let meta = Meta::read(data_dir);
    let daemon_running =
        std::fs::OpenOptions::new().write(true).open(data_dir.join("LOCK")).ok().is_some_and(|f| f.try_lock().is_err());
    if let StatusFormat::Json = format {
        let json = serde_json::json!({
            "data_dir": data_dir,
            "daemon_running": daemon_running,
            "meta": meta,
            "summary": summary,
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    println!("data dir     {}", data_dir.display());
    println!("daemon       {}", if daemon_running { "running" } else { "not running" });
    if let Some(m) = &meta {
        println!("machine      {} ({} CPUs), sampled at {} Hz", m.hostname, m.cpus, m.frequency_hz);
    }
    println!(
        "store        {:.2} MiB in {} segments, {} blocks",
        summary.bytes as f64 / 1048576.0,
        summary.segments,
        summary.blocks
    );
    let Some((first, last)) = summary.span else {
        println!("time range   empty: no samples yet");
        return Ok(());
    };
    println!(
        "time range   {} to {} ({})",
        timespec::format(first),
        timespec::format(last),
        timespec::format_duration(last - first)
    );
    let (mut busy, mut idle, mut lost) = (0, 0, 0);
    for (cpu, c) in &summary.cpus {
        let total = c.samples + c.idle;
        println!("cpu {cpu:<8} {total} samples ({} busy, {} idle), {} lost", c.samples, c.idle, c.lost);
        busy += c.samples;
        idle += c.idle;
        lost += c.lost;
    }
    println!("total        {} samples ({busy} busy, {idle} idle), {lost} lost", busy + idle);
    Ok(())
}
