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
    collect::kmsg,
    config::{self, ConfigFile},
    daemon::{self, DaemonConfig},
    detect,
    export::{cputime, flamegraph, heatmap, perf_script, pprof, report, speedscope},
    logs,
    outfile::OutFile,
    query::{self, Filter, Window},
    store::writer::WriterLimits,
    store::{Meta, Store},
    text, timespec,
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
        #[arg(long, allow_hyphen_values = true, required_unless_present = "around")]
        from: Option<String>,
        /// End (exclusive), same forms as --from [default: now].
        #[arg(long, allow_hyphen_values = true)]
        to: Option<String>,
        /// The window around a finding or event (its id, from `profiler findings` or
        /// `profiler events`); --cpu defaults to the finding's CPU.
        #[arg(long, conflicts_with_all = ["from", "to"])]
        around: Option<String>,
        /// With --around: how much before the finding's start or the event.
        #[arg(long, default_value = "5s", requires = "around")]
        before: String,
        /// With --around: how much after the event (or the finding's end).
        #[arg(long, default_value = "1s", requires = "around")]
        after: String,
        #[command(flatten)]
        filter: FilterArgs,
        /// Show idle samples (as `[idle]`).
        #[arg(long)]
        include_idle: bool,
        /// Differential flamegraph: compare the window with this baseline window (start)...
        #[arg(long, allow_hyphen_values = true, requires = "baseline_to")]
        baseline_from: Option<String>,
        /// ...and end.
        #[arg(long, allow_hyphen_values = true, requires = "baseline_from")]
        baseline_to: Option<String>,
        #[arg(long, value_enum, default_value_t = Format::Svg)]
        format: Format,
        /// Output file (default: stdout).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Subsecond heatmap (FlameScope's layout): a column per second, rows within the second.
    Heatmap {
        #[command(flatten)]
        dir: DataDir,
        #[command(flatten)]
        window: WindowArgs,
        #[command(flatten)]
        filter: FilterArgs,
        /// Rows per second (50 rows = 20 ms each).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
        rows: u32,
        #[arg(long, value_enum, default_value_t = GridFormat::Json)]
        format: GridFormat,
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// CPU x time: busy (and kernel-mode) share per CPU per time bucket, findings marked.
    Cputime {
        #[command(flatten)]
        dir: DataDir,
        #[command(flatten)]
        window: WindowArgs,
        /// Bucket width (10ms and up).
        #[arg(long, default_value = "1s")]
        bucket: String,
        #[arg(long, value_enum, default_value_t = GridFormat::Json)]
        format: GridFormat,
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// The samples of a window in a format other tools open.
    Export {
        #[command(flatten)]
        dir: DataDir,
        #[command(flatten)]
        window: WindowArgs,
        #[command(flatten)]
        filter: FilterArgs,
        #[arg(long, value_enum)]
        format: ExportFormat,
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// One self-contained HTML file for an incident: heatmap, CPU x time, findings, events, and
    /// the flamegraph of the window and of each finding.
    Report {
        #[command(flatten)]
        dir: DataDir,
        #[command(flatten)]
        window: WindowArgs,
        #[arg(short, long)]
        output: PathBuf,
    },
    /// The live UI's address, with the token its API requires (root only).
    Ui {
        #[command(flatten)]
        dir: DataDir,
    },
    /// Findings of the detectors in a time window.
    Findings {
        #[command(flatten)]
        dir: DataDir,
        #[arg(long, allow_hyphen_values = true, default_value = "-1h")]
        from: String,
        #[arg(long, allow_hyphen_values = true, default_value = "now")]
        to: String,
        #[arg(long, value_enum, default_value_t = StatusFormat::Text)]
        format: StatusFormat,
    },
    /// Kernel log events (resets, watchdogs) in a time window.
    Events {
        #[command(flatten)]
        dir: DataDir,
        #[arg(long, allow_hyphen_values = true, default_value = "-1h")]
        from: String,
        #[arg(long, allow_hyphen_values = true, default_value = "now")]
        to: String,
        #[arg(long, value_enum, default_value_t = StatusFormat::Text)]
        format: StatusFormat,
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
    /// Size of the BPF ring buffer in KiB, a power of two from 4 to 1048576 [default: 4096].
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
    /// Address of the UI, JSON API and /metrics, or `off` [default: 127.0.0.1:7070].
    #[arg(long)]
    listen: Option<String>,
    /// Log lines on stderr as text or JSON objects [default: the journal when stderr is the
    /// journal, else text].
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
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
        let flush_ms = self.flush_ms.or(file.flush_ms).unwrap_or(500);
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
        Ok(DaemonConfig {
            listen,
            data_dir: self.data_dir.or(file.data_dir).unwrap_or_else(|| DEFAULT_DATA_DIR.into()),
            frequency_hz: frequency,
            ring_bytes: config::ring_buffer_bytes(self.ring_buffer_kib.or(file.ring_buffer_kib).unwrap_or(4096))?,
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

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Svg,
    Folded,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum GridFormat {
    Json,
    Csv,
    Svg,
    Png,
    Html,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ExportFormat {
    /// `perf script` text (FlameScope, speedscope)
    PerfScript,
    /// Brendan Gregg's folded stacks
    Folded,
    /// gzipped pprof protobuf (`go tool pprof`)
    Pprof,
    /// speedscope JSON
    Speedscope,
}

/// `--from`/`--to`.
#[derive(clap::Args)]
struct WindowArgs {
    /// Start: RFC 3339, unix seconds, `now`, or relative (-30s, -5m, -1h).
    #[arg(long, allow_hyphen_values = true)]
    from: String,
    /// End (exclusive), same forms as --from.
    #[arg(long, allow_hyphen_values = true, default_value = "now")]
    to: String,
}

/// Sample filters.
#[derive(clap::Args)]
struct FilterArgs {
    /// Only this CPU (repeat for several).
    #[arg(long)]
    cpu: Vec<u32>,
    /// Only this process id.
    #[arg(long)]
    pid: Option<u32>,
    /// Only processes with this comm.
    #[arg(long)]
    comm: Option<String>,
}

impl FilterArgs {
    fn filter(self) -> Filter {
        Filter { cpus: self.cpu, pid: self.pid, comm: self.comm, include_idle: false }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum StatusFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before anything can log. Under systemd the journal, unless a format was asked for.
    let log_format = match &cli.command {
        Command::Run(args) => args.log_format.map(|f| match f {
            LogFormat::Text => logs::Format::Text,
            LogFormat::Json => logs::Format::Json,
        }),
        _ => None,
    };
    logs::init(log_format);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // A reader that went away (`| head`) is not an error worth a message.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::SUCCESS
        }
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
            // Errors can name a comm or a file a user chose: no raw control bytes on the terminal.
            eprintln!("profiler: {}", text::visible(&msg));
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
        Command::Flamegraph {
            dir,
            from,
            to,
            around,
            before,
            after,
            filter,
            include_idle,
            baseline_from,
            baseline_to,
            format,
            output,
        } => {
            let now = timespec::now_ns();
            let mut filter = filter.filter();
            let window = match around {
                Some(id) => {
                    let (window, finding_cpu) = around_window(&dir.data_dir, &id, &before, &after)?;
                    if filter.cpus.is_empty() {
                        filter.cpus.extend(finding_cpu);
                    }
                    window
                }
                None => Window::new(
                    timespec::parse(from.as_deref().unwrap_or("-30s"), now)?,
                    timespec::parse(to.as_deref().unwrap_or("now"), now)?,
                )?,
            };
            let filter = Filter { include_idle, ..filter };
            let mut store = Store::open(&dir.data_dir)?;
            let result = query::fold(&mut store, window, &filter);
            for w in store.take_warnings() {
                tracing::warn!("{w}");
            }
            let folded = result?;
            if folded.truncated_stacks > 0 {
                eprintln!(
                    "note: {} rare stacks merged into {}: a flamegraph keeps at most {} distinct stacks",
                    folded.truncated_stacks,
                    profiler::budget::TRUNCATED,
                    profiler::budget::MAX_STACKS
                );
            }
            let mut out = open_output(output.as_deref())?;
            if let (Some(bf), Some(bt)) = (baseline_from, baseline_to) {
                let base_window = Window::new(timespec::parse(&bf, now)?, timespec::parse(&bt, now)?)?;
                let baseline = query::fold(&mut store, base_window, &filter)?;
                if let Format::Folded = format {
                    anyhow::bail!("a differential flamegraph is SVG only: drop --format folded");
                }
                let subtitle = format!(
                    "{} to {} against {} to {} (red: more than the baseline, blue: less)",
                    timespec::format(window.from_ns),
                    timespec::format(window.to_ns),
                    timespec::format(base_window.from_ns),
                    timespec::format(base_window.to_ns)
                );
                flamegraph::write_diff_svg(&baseline, &folded, "Differential CPU flamegraph", &subtitle, &mut out)?;
                out.finish()?;
                return Ok(());
            }
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
            out.finish()
        }
        Command::Status { dir, format } => status(&dir.data_dir, format),
        Command::Findings { dir, from, to, format } => findings(&dir.data_dir, &from, &to, format),
        Command::Report { dir, window, output } => report(&dir.data_dir, &window, &output),
        Command::Ui { dir } => {
            profiler::store::check_dir(&dir.data_dir)?;
            let path = dir.data_dir.join(profiler::serve::URL_FILE);
            let url = std::fs::read_to_string(&path).with_context(|| {
                format!("no UI address in {} (is the daemon running with its UI on?)", path.display())
            })?;
            println!("{}", text::visible(url.trim()));
            Ok(())
        }
        Command::Heatmap { dir, window, filter, rows, format, output } => {
            let w = window_of(&window.from, &window.to)?;
            let mut store = Store::open(&dir.data_dir)?;
            require_data(&mut store, w)?;
            let filter = filter.filter();
            query::check_filter(&filter, Meta::read(&dir.data_dir).as_ref())?;
            let grid = query::subsecond_grid(&mut store, w, rows as usize, &filter)?;
            if grid.coarsened() {
                eprintln!("note: {}", heatmap::coarsened_reason(&grid));
            }
            let title = format!("Subsecond heatmap, {} to {}", timespec::format(w.from_ns), timespec::format(w.to_ns));
            let mut out = open_output(output.as_deref())?;
            match format {
                GridFormat::Json => heatmap::write_json(&grid, &mut out)?,
                GridFormat::Csv => heatmap::write_csv(&grid, &mut out)?,
                GridFormat::Svg => heatmap::write_svg(&grid, &title, &mut out)?,
                GridFormat::Png => heatmap::write_png(&grid, &mut out)?,
                GridFormat::Html => {
                    let mut svg = Vec::new();
                    heatmap::write_svg(&grid, &title, &mut svg)?;
                    heatmap::write_html(&svg, &title, &mut out)?;
                }
            }
            out.finish()?;
            Ok(())
        }
        Command::Cputime { dir, window, bucket, format, output } => {
            let w = window_of(&window.from, &window.to)?;
            let bucket_ns = timespec::parse_duration_ns(&bucket).filter(|&b| b >= 10_000_000).ok_or_else(|| {
                anyhow::anyhow!("--bucket '{bucket}' must be a duration of 10ms or more (10ms, 100ms, 1s, 1m)")
            })?;
            let mut store = Store::open(&dir.data_dir)?;
            require_data(&mut store, w)?;
            let (cpus, hz) = Meta::cpus_and_frequency(&dir.data_dir);
            let grid = query::cpu_time(&mut store, w, bucket_ns, cpus, hz)?;
            if let Some(c) = cputime::coarsened(&grid) {
                eprintln!("note: {}", c.reason);
            }
            let found = detect::log::findings_in(&dir.data_dir, w.from_ns, w.to_ns)?;
            let title = format!("CPU x time, {} to {}", timespec::format(w.from_ns), timespec::format(w.to_ns));
            let mut out = open_output(output.as_deref())?;
            match format {
                GridFormat::Json => cputime::write_json(&grid, &found, &mut out)?,
                GridFormat::Csv => cputime::write_csv(&grid, &mut out)?,
                GridFormat::Svg => cputime::write_svg(&grid, &found, &title, &mut out)?,
                GridFormat::Png => cputime::write_png(&grid, &mut out)?,
                GridFormat::Html => {
                    let mut svg = Vec::new();
                    cputime::write_svg(&grid, &found, &title, &mut svg)?;
                    heatmap::write_html(&svg, &title, &mut out)?;
                }
            }
            out.finish()?;
            Ok(())
        }
        Command::Export { dir, window, filter, format, output } => {
            let w = window_of(&window.from, &window.to)?;
            let mut store = Store::open(&dir.data_dir)?;
            require_data(&mut store, w)?;
            let filter = filter.filter();
            let hz = Meta::read(&dir.data_dir).map_or(99, |m| m.frequency_hz);
            let mut out = open_output(output.as_deref())?;
            match format {
                ExportFormat::Folded => {
                    let folded = query::fold(&mut store, w, &filter)?;
                    flamegraph::write_folded(&folded, &mut out)?;
                }
                ExportFormat::PerfScript => {
                    perf_script::write_header(&mut out)?;
                    let mut err = None;
                    query::for_each_sample(&mut store, w, &filter, |s| {
                        if err.is_none() {
                            err = perf_script::write_sample(s, &mut out).err();
                        }
                    })?;
                    if let Some(e) = err {
                        return Err(e.into());
                    }
                }
                ExportFormat::Pprof => {
                    let mut b = pprof::Builder::new(hz);
                    query::for_each_sample(&mut store, w, &filter, |s| b.add(s))?;
                    b.finish(&mut out)?;
                }
                ExportFormat::Speedscope => {
                    let mut b = speedscope::Builder::default();
                    let period = 1_000_000_000 / hz.max(1);
                    query::for_each_sample(&mut store, w, &filter, |s| b.add(s, period))?;
                    b.finish(
                        &format!("profiler {} to {}", timespec::format(w.from_ns), timespec::format(w.to_ns)),
                        &mut out,
                    )?;
                }
            }
            out.finish()?;
            Ok(())
        }
        Command::Events { dir, from, to, format } => events(&dir.data_dir, &from, &to, format),
    }
}

/// The window around a finding (from `before` its start to `after` its end) or an event.
fn around_window(data_dir: &Path, id: &str, before: &str, after: &str) -> anyhow::Result<(Window, Option<u32>)> {
    profiler::store::check_dir(data_dir)?;
    let dur = |what: &str, v: &str| {
        timespec::parse_duration_ns(v)
            .ok_or_else(|| anyhow::anyhow!("{what} '{v}' is not a duration: use 5s, 500ms, 1m"))
    };
    let (before, after) = (dur("--before", before)?, dur("--after", after)?);
    if let Some(f) = detect::log::findings(data_dir)?.into_iter().find(|f| f.id == id) {
        let end = f.end_ns.unwrap_or_else(timespec::now_ns);
        return Ok((Window::new(f.start_ns.saturating_sub(before), end + after)?, f.cpu));
    }
    let events: Vec<kmsg::Event> = detect::log::read_all(data_dir, detect::log::EVENTS)?;
    if let Some(e) = events.into_iter().find(|e| e.id == id) {
        return Ok((Window::new(e.ts_ns.saturating_sub(before), e.ts_ns + after)?, None));
    }
    anyhow::bail!(
        "no finding or event has the id '{id}' in {}; `profiler findings` and `profiler events` list them",
        data_dir.display()
    )
}

fn report(data_dir: &Path, window: &WindowArgs, output: &Path) -> anyhow::Result<()> {
    let w = window_of(&window.from, &window.to)?;
    let mut store = Store::open(data_dir)?;
    require_data(&mut store, w)?;
    let meta = Meta::read(data_dir);
    let (cpus, hz) = Meta::cpus_and_frequency(data_dir);
    let now = timespec::now_ns();
    let found = detect::log::findings_in(data_dir, w.from_ns, w.to_ns)?;
    let events = detect::log::events_in(data_dir, w.from_ns, w.to_ns)?;
    let mut heat = Vec::new();
    let grid = query::subsecond_grid(&mut store, w, 50, &Filter::default())?;
    heatmap::write_png(&grid, &mut heat)?;
    let mut cpu = Vec::new();
    let bucket = ((w.to_ns - w.from_ns) / 600).max(1_000_000_000) / 1_000_000_000 * 1_000_000_000;
    let ct = query::cpu_time(&mut store, w, bucket, cpus, hz)?;
    cputime::write_svg(&ct, &found, "CPU x time", &mut cpu)?;
    let mut flamegraphs = Vec::new();
    let mut flame = |title: String, win: Window, filter: Filter, store: &mut Store| -> anyhow::Result<()> {
        match query::fold(store, win, &filter) {
            Ok(folded) => {
                let mut svg = Vec::new();
                let sub = format!("{} to {}", timespec::format(win.from_ns), timespec::format(win.to_ns));
                flamegraph::write_svg(&folded, &title, &sub, &mut svg)?;
                flamegraphs.push((title, svg));
            }
            Err(e) => tracing::warn!(section = %title, error = %e, "report section left out"),
        }
        Ok(())
    };
    flame("Flamegraph of the whole window".into(), w, Filter::default(), &mut store)?;
    for f in found.iter().take(12) {
        let win = Window::new(
            f.start_ns.saturating_sub(5_000_000_000),
            f.end_ns.unwrap_or(now).max(f.start_ns) + 1_000_000_000,
        )?;
        let filter = Filter { cpus: f.cpu.into_iter().collect(), ..Default::default() };
        flame(format!("{}: {}", f.id, f.summary), win, filter, &mut store)?;
    }
    let r = report::Report {
        title: format!("CPU profile of {}", meta.as_ref().map_or("this machine", |m| m.hostname.as_str())),
        from_ns: w.from_ns,
        to_ns: w.to_ns,
        heatmap_png: heat,
        cputime_svg: cpu,
        findings: found,
        events,
        flamegraphs,
    };
    let mut out = open_output(Some(output))?;
    report::write_html(&r, &mut out)?;
    out.finish()?;
    Ok(())
}

/// Refuses a window the store holds nothing of, saying what it does hold.
fn require_data(store: &mut Store, w: Window) -> anyhow::Result<()> {
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

fn window_of(from: &str, to: &str) -> anyhow::Result<Window> {
    let now = timespec::now_ns();
    Ok(Window::new(timespec::parse(from, now)?, timespec::parse(to, now)?)?)
}

fn findings(data_dir: &Path, from: &str, to: &str, format: StatusFormat) -> anyhow::Result<()> {
    profiler::store::check_dir(data_dir)?;
    let w = window_of(from, to)?;
    print_list(&detect::log::findings_in(data_dir, w.from_ns, w.to_ns)?, "findings", w, format, |f| {
        let end = match f.end_ns {
            Some(e) => format!("{} ({})", timespec::format(e), timespec::format_duration(e.saturating_sub(f.start_ns))),
            None => "open".to_string(),
        };
        // Summaries name processes (comm) and functions: untrusted text.
        format!(
            "{}  {:?}  {} .. {}\n    {}",
            text::visible(&f.id),
            f.severity,
            timespec::format(f.start_ns),
            end,
            text::visible(&f.summary)
        )
    })
}

fn events(data_dir: &Path, from: &str, to: &str, format: StatusFormat) -> anyhow::Result<()> {
    profiler::store::check_dir(data_dir)?;
    let w = window_of(from, to)?;
    print_list(&detect::log::events_in(data_dir, w.from_ns, w.to_ns)?, "events", w, format, |e| {
        format!("{}  {}  {}", text::visible(&e.id), timespec::format(e.ts_ns), text::visible(&e.message))
    })
}

/// A list as JSON, or one text line per item (a sentence when there is none).
fn print_list<T: serde::Serialize>(
    list: &[T],
    what: &str,
    w: Window,
    format: StatusFormat,
    line: impl Fn(&T) -> String,
) -> anyhow::Result<()> {
    if let StatusFormat::Json = format {
        println!("{}", serde_json::to_string_pretty(list)?);
    } else if list.is_empty() {
        println!("no {what} between {} and {}", timespec::format(w.from_ns), timespec::format(w.to_ns));
    } else {
        for item in list {
            println!("{}", line(item));
        }
    }
    Ok(())
}

fn open_output(path: Option<&Path>) -> anyhow::Result<Output> {
    Ok(match path {
        None => Output::Stdout(std::io::BufWriter::new(std::io::stdout().lock())),
        Some(p) => Output::File(OutFile::create(p)?),
    })
}

/// Where a command's output goes: stdout, or an `-o` file (0600, put in place by `finish`).
enum Output {
    Stdout(std::io::BufWriter<std::io::StdoutLock<'static>>),
    File(OutFile),
}

impl Output {
    fn finish(self) -> anyhow::Result<()> {
        match self {
            Output::Stdout(mut w) => w.flush()?,
            Output::File(f) => f.finish()?,
        }
        Ok(())
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Output::Stdout(w) => w.write(buf),
            Output::File(f) => f.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Output::Stdout(w) => w.flush(),
            Output::File(f) => f.flush(),
        }
    }
}

fn status(data_dir: &Path, format: StatusFormat) -> anyhow::Result<()> {
    let mut store = Store::open(data_dir)?;
    let summary = store.summary()?;
    for w in store.take_warnings() {
        tracing::warn!("{w}");
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
    println!("data dir     {}", text::visible(&data_dir.display().to_string()));
    println!("daemon       {}", if daemon_running { "running" } else { "not running" });
    if let Some(m) = &meta {
        println!("machine      {} ({} CPUs), sampled at {} Hz", text::visible(&m.hostname), m.cpus, m.frequency_hz);
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
