//! The command line: one module per command group, each a thin layer over the library (its
//! flags, then a call into query / export / store). `main` only parses and reports errors.

/// `println!` that hands back the write's error instead of panicking: a reader that went away
/// (`profiler findings | head -1`) is EPIPE, which `main` treats as the end of the output.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// `print!` as [`outln!`].
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*)
    }};
}

mod args;
mod counters;
mod export;
mod flamegraph;
mod fleet;
mod grids;
mod lists;
mod output;
mod report;
mod run;
mod status;
mod ui;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use profiler::{logs, untrusted};

#[derive(Parser)]
#[command(name = "profiler", version, about = "Always-on eBPF CPU profiler with a time axis")]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the profiling daemon in the foreground (needs root, or CAP_BPF + CAP_PERFMON).
    Run(run::RunArgs),
    /// Flamegraph (SVG) or folded stacks of a time window.
    Flamegraph(flamegraph::Args),
    /// Subsecond heatmap (FlameScope's layout): a column per second, rows within the second.
    Heatmap(grids::HeatmapArgs),
    /// CPU x time: busy (and kernel-mode) share per CPU per time bucket, findings marked.
    Cputime(grids::CputimeArgs),
    /// The samples of a window in a format other tools open.
    Export(export::Args),
    /// One self-contained HTML file for an incident: heatmap, CPU x time, findings, events, and
    /// the flamegraph of the window and of each finding.
    Report(report::Args),
    /// The live UI's address, with the token its API requires (root only); with --clickhouse,
    /// the UI served here for any node that ships to ClickHouse (--node picks the first shown).
    Ui(ui::Args),
    /// Findings of the detectors in a time window.
    Findings(lists::Args),
    /// Kernel log events (resets, watchdogs) in a time window.
    Events(lists::Args),
    /// Kernel counters the daemon read each second, on the samples' time axis: softnet
    /// (processed, dropped, time_squeeze) and softirqs per CPU, NIC queue interrupts, PSI,
    /// live and dying memory cgroups, CFS throttling, NIC counters.
    Counters(counters::Args),
    /// What the store holds: time range, samples per CPU, lost samples, size.
    Status(status::Args),
    /// Liveness: exits 1 with a sentence unless a daemon holds the data directory and wrote
    /// samples recently (cheap: for probes and watchdogs).
    Health(status::HealthArgs),
    /// The fleet from ClickHouse: busy shares, saturated cores, findings and events per node,
    /// the nodes x time grid (JSON), the top stacks across nodes, and what ran before matching
    /// kernel log events.
    ///
    /// Which nodes had an ENA reset in the last day, and what ran on the NIC's CPU before it:
    /// `profiler fleet --clickhouse URL --from -1d --event 'ena.*[Rr]eset'`.
    Fleet(fleet::Args),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before anything can log. Under systemd the journal, unless a format was asked for.
    let log_format = match &cli.command {
        Command::Run(args) => args.log_format.map(run::LogFormat::logs),
        _ => None,
    };
    logs::init(log_format);
    match dispatch(cli) {
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
            eprintln!("profiler: {}", untrusted::visible(&msg));
            ExitCode::FAILURE
        }
    }
}

fn dispatch(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Flamegraph(args) => flamegraph::run(args),
        Command::Heatmap(args) => grids::heatmap(args),
        Command::Cputime(args) => grids::cputime(args),
        Command::Export(args) => export::run(args),
        Command::Report(args) => report::run(args),
        Command::Ui(args) => ui::run(args),
        Command::Findings(args) => lists::findings(args),
        Command::Events(args) => lists::events(args),
        Command::Counters(args) => counters::run(args),
        Command::Status(args) => status::run(args),
        Command::Health(args) => status::health(args),
        Command::Fleet(args) => fleet::run(args),
    }
}
