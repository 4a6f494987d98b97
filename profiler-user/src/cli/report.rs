//! `profiler report`: one self-contained HTML file for an incident.

use std::path::{Path, PathBuf};

use profiler::{
    detect,
    export::{cputime, flamegraph, heatmap, report},
    query::{self, Filter, Window},
    store::{Meta, Store},
    timespec,
};

use super::{
    args::{Source, WindowArgs, window_of},
    output::open_output,
};

// The command's help is the doc comment of its `Command` variant.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub source: Source,
    #[command(flatten)]
    pub window: WindowArgs,
    #[arg(short, long)]
    pub output: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let w = window_of(&args.window.from, &args.window.to)?;
    let mut src = args.source.open()?;
    let now = timespec::now_ns();
    // The flamegraph of each finding reaches 5 s before it.
    let found = detect::log::findings_in(src.data_dir(), w.from_ns, w.to_ns)?;
    let reach =
        found.iter().take(MAX_FINDING_FLAMEGRAPHS).map(|f| finding_window(f, now)).collect::<Result<Vec<_>, _>>()?;
    let mut store = src.load(&[&[w][..], &reach].concat())?;
    src.require_data(&mut store, w)?;
    report(src.data_dir(), &mut store, w, &found, &reach, &args.output)
}

/// Findings a report draws a flamegraph of.
const MAX_FINDING_FLAMEGRAPHS: usize = 12;

/// 5 s before a finding to 1 s after its end.
fn finding_window(f: &detect::Finding, now: u64) -> Result<Window, query::QueryError> {
    Window::new(f.start_ns.saturating_sub(5_000_000_000), f.end_ns.unwrap_or(now).max(f.start_ns) + 1_000_000_000)
}

fn report(
    data_dir: &Path,
    store: &mut Store,
    w: Window,
    found: &[detect::Finding],
    windows: &[Window],
    output: &Path,
) -> anyhow::Result<()> {
    let meta = Meta::read(data_dir);
    let (cpus, hz) = Meta::cpus_and_frequency(data_dir);
    let events = detect::log::events_in(data_dir, w.from_ns, w.to_ns)?;
    let mut heat = Vec::new();
    let grid = query::subsecond_grid(store, w, 50, &Filter::default())?;
    heatmap::write_png(&grid, &mut heat)?;
    let mut cpu = Vec::new();
    let bucket = ((w.to_ns - w.from_ns) / 600).max(1_000_000_000) / 1_000_000_000 * 1_000_000_000;
    let ct = query::cpu_time(store, w, bucket, cpus, hz)?;
    cputime::write_svg(&ct, found, "CPU x time", &mut cpu)?;
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
    flame("Flamegraph of the whole window".into(), w, Filter::default(), store)?;
    for (f, &win) in found.iter().zip(windows) {
        let filter = Filter { cpus: f.cpu.into_iter().collect(), ..Default::default() };
        flame(format!("{}: {}", f.id, f.summary), win, filter, store)?;
    }
    let r = report::Report {
        title: format!("CPU profile of {}", meta.as_ref().map_or("this machine", |m| m.hostname.as_str())),
        from_ns: w.from_ns,
        to_ns: w.to_ns,
        heatmap_png: heat,
        cputime_svg: cpu,
        findings: found.to_vec(),
        events,
        flamegraphs,
    };
    let mut out = open_output(Some(output))?;
    report::write_html(&r, &mut out)?;
    out.finish()?;
    Ok(())
}
