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
    daemon::{self, DaemonConfig},
    flamegraph,
    query::{self, Filter, Window},
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
    #[arg(long, default_value = DEFAULT_DATA_DIR, global = true)]
    data_dir: PathBuf,
}

#[derive(Subcommand)]
enum Command {
    /// Run the profiling daemon in the foreground (needs root, or CAP_BPF + CAP_PERFMON).
    Run {
        #[command(flatten)]
        dir: DataDir,
        /// Samples per second on each CPU.
        #[arg(long, default_value_t = 99, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        frequency: u64,
        /// Size of the BPF ring buffer in KiB (a power of two).
        #[arg(long, default_value_t = 4096)]
        ring_buffer_kib: u32,
        /// How often samples are written to disk, in milliseconds.
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(50..=10_000))]
        flush_ms: u64,
        /// How often the daemon logs its one-line report, in seconds.
        #[arg(long, default_value_t = 10)]
        report_secs: u64,
    },
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
        Command::Run { dir, frequency, ring_buffer_kib, flush_ms, report_secs } => {
            let config = DaemonConfig {
                data_dir: dir.data_dir,
                frequency_hz: frequency,
                ring_bytes: ring_buffer_kib.saturating_mul(1024),
                flush_interval: Duration::from_millis(flush_ms),
                report_interval: Duration::from_secs(report_secs.max(1)),
            };
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
