//! `profiler flamegraph`: a window (or the window around a finding) as SVG or folded stacks,
//! or against a baseline window.

use std::path::PathBuf;

use clap::ValueEnum;
use profiler::{
    collect::kmsg,
    export::flamegraph,
    query::{Filter, FoldBudget, Window},
    timespec,
};

use super::{
    args::{FilterArgs, Opened, Samples, Source, fold},
    output::open_output,
};

// The command's help is the doc comment of its `Command` variant.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub source: Source,
    /// Start: RFC 3339, unix seconds, `now`, or relative (-30s, -5m, -1h).
    #[arg(long, allow_hyphen_values = true, required_unless_present = "around")]
    pub from: Option<String>,
    /// End (exclusive), same forms as --from [default: now].
    #[arg(long, allow_hyphen_values = true)]
    pub to: Option<String>,
    /// The window around a finding or event (its id, from `profiler findings` or
    /// `profiler events`); --cpu defaults to the finding's CPU.
    #[arg(long, conflicts_with_all = ["from", "to"])]
    pub around: Option<String>,
    /// With --around: how much before the finding's start or the event.
    #[arg(long, default_value = "5s", requires = "around")]
    pub before: String,
    /// With --around: how much after the event (or the finding's end).
    #[arg(long, default_value = "1s", requires = "around")]
    pub after: String,
    #[command(flatten)]
    pub filter: FilterArgs,
    /// What the flamegraph counts: CPU samples, or (from the CUDA probes) GPU launches,
    /// microseconds blocked waiting on the GPU, bytes copied.
    #[arg(long, value_enum, default_value_t = Samples::Cpu)]
    pub samples: Samples,
    /// Show idle samples (as `[idle]`).
    #[arg(long)]
    pub include_idle: bool,
    /// Python frames one per line they ran (`work (app.py:12)`), not one per function.
    #[arg(long)]
    pub lines: bool,
    /// Distinct stacks kept; past it the rarest leaves fold into their parent (`[… N more]`).
    #[arg(long, default_value_t = CLI_MAX_STACKS)]
    pub max_stacks: usize,
    /// Differential flamegraph: compare the window with this baseline window (start)...
    #[arg(long, allow_hyphen_values = true, requires = "baseline_to")]
    pub baseline_from: Option<String>,
    /// ...and end.
    #[arg(long, allow_hyphen_values = true, requires = "baseline_from")]
    pub baseline_to: Option<String>,
    #[arg(long, value_enum, default_value_t = Format::Svg)]
    pub format: Format,
    /// Output file (default: stdout).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

/// Distinct stacks `profiler flamegraph` keeps by default: it reads in its own process, not in
/// the daemon's memory (the API keeps `budget::MAX_STACKS`).
const CLI_MAX_STACKS: usize = 200_000;

#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    Svg,
    Folded,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let Args {
        source,
        from,
        to,
        around,
        before,
        after,
        filter,
        samples,
        include_idle,
        lines,
        max_stacks,
        baseline_from,
        baseline_to,
        format,
        output,
    } = args;
    let (given_from, given_to) = (from.as_deref().unwrap_or("-30s"), to.as_deref().unwrap_or("now"));
    let now = match around {
        Some(_) => timespec::now_ns(),
        None => super::args::now_for(&source, &[given_from, given_to]),
    };
    let mut filter = filter.filter();
    let src = source.open_nodes()?;
    let window = match around {
        Some(_) if let Some(nodes) = src.several_nodes() => {
            anyhow::bail!("--around looks a finding up in one node's findings: {nodes} are asked; name one with --node")
        }
        Some(id) => {
            let (window, finding_cpu) = around_window(&src, &id, &before, &after)?;
            if filter.cpus.is_empty() {
                filter.cpus.extend(finding_cpu);
            }
            window
        }
        None => Window::new(timespec::parse(given_from, now)?, timespec::parse(given_to, now)?)?,
    };
    let filter = Filter { include_idle, lines, ..filter };
    // The CLI reads in its own process: ten times the daemon's budget, bytes alike.
    let budget = FoldBudget {
        max_stacks: max_stacks.max(1),
        max_bytes: profiler::budget::MAX_FOLDED_BYTES
            .saturating_mul(max_stacks.max(1))
            .div_ceil(profiler::budget::MAX_STACKS),
    };
    let baseline = match (baseline_from, baseline_to) {
        (Some(bf), Some(bt)) => Some(Window::new(timespec::parse(&bf, now)?, timespec::parse(&bt, now)?)?),
        _ => None,
    };
    let kind = samples.kind();
    let mut reader = src.reader(kind)?;
    let folded = fold(&mut reader, window, &filter, budget)?;
    if folded.truncated_stacks > 0 {
        eprintln!(
            "note: {} rare stacks folded into their parents ([… N more]): --max-stacks {max_stacks} keeps that many \
             distinct stacks",
            folded.truncated_stacks,
        );
    }
    let mut out = open_output(output.as_deref())?;
    if let Some(base_window) = baseline {
        let baseline = fold(&mut reader, base_window, &filter, budget)?;
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
        flamegraph::write_diff_svg(kind, &baseline, &folded, &kind.flamegraph_title(true), &subtitle, &mut out)?;
        out.finish()?;
        return Ok(());
    }
    match format {
        Format::Folded => flamegraph::write_folded(&folded, &mut out)?,
        Format::Svg => {
            let what = kind.flamegraph_title(false);
            let title = match filter.cpus.as_slice() {
                [] => what,
                cpus => format!("{what}, CPU {}", cpus.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")),
            };
            let subtitle = format!(
                "{} to {} ({}), {}",
                timespec::format(window.from_ns),
                timespec::format(window.to_ns),
                timespec::format_duration(window.to_ns - window.from_ns),
                flamegraph::total_text(kind, folded.total()),
            );
            flamegraph::write_svg_of(kind, &folded, &title, &subtitle, &mut out)?
        }
    }
    out.finish()
}

/// The window around a finding (from `before` its start to `after` its end) or an event: the
/// node's own, from its store or from ClickHouse.
pub(super) fn around_window(
    src: &Opened,
    id: &str,
    before: &str,
    after: &str,
) -> anyhow::Result<(Window, Option<u32>)> {
    let reader = src.reader(profiler::model::SampleKind::Cpu)?;
    let dur = |what: &str, v: &str| {
        timespec::parse_duration_ns(v)
            .ok_or_else(|| anyhow::anyhow!("{what} '{v}' is not a duration: use 5s, 500ms, 1m"))
    };
    let (before, after) = (dur("--before", before)?, dur("--after", after)?);
    let all = Window::new(0, u64::MAX)?;
    if let Some(f) = reader.findings(all)?.into_iter().find(|f| f.id == id) {
        let end = f.end_ns.unwrap_or_else(timespec::now_ns);
        return Ok((Window::new(f.start_ns.saturating_sub(before), end + after)?, f.cpu));
    }
    let events: Vec<kmsg::Event> = reader.events(all)?;
    if let Some(e) = events.into_iter().find(|e| e.id == id) {
        return Ok((Window::new(e.ts_ns.saturating_sub(before), e.ts_ns + after)?, None));
    }
    anyhow::bail!(
        "no finding or event has the id '{id}' in {}; `profiler findings` and `profiler events` list them",
        src.describe()
    )
}
