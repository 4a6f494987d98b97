//! `profiler report`: one self-contained HTML file for an incident.

use std::path::{Path, PathBuf};

use profiler::{
    detect,
    export::{cputime, heatmap, report},
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
    let found = detect::journal::findings_in(src.data_dir(), w.from_ns, w.to_ns)?;
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
    let events = detect::journal::events_in(data_dir, w.from_ns, w.to_ns)?;
    let grid = query::subsecond_grid(store, w, 50, &Filter::default())?;
    let mut heat = Vec::new();
    heatmap::write_json_with(&grid, true, &mut heat)?;
    // The page's own bucket (1 s), widened by the cell budget for long windows.
    let ct = query::cpu_time(store, w, 1_000_000_000, cpus, hz)?;
    let cputime = serde_json::to_value(cputime::json(&ct, found))?;
    let counters =
        serde_json::to_value(profiler::store::counters::read(data_dir, w.from_ns, w.to_ns, &Default::default())?)?;
    let mut flamegraphs = Vec::new();
    let mut flame = |caption: String, win: Window, cpu: Option<u32>, store: &mut Store| -> anyhow::Result<()> {
        let filter = Filter { cpus: cpu.into_iter().collect(), ..Default::default() };
        match query::fold(store, win, &filter) {
            Ok(folded) => {
                let mut tree = Vec::new();
                profiler::serve::tree::write(&folded, &mut tree)?;
                flamegraphs.push(report::Flame { caption, from_ns: win.from_ns, to_ns: win.to_ns, cpu, tree });
            }
            Err(e) => tracing::warn!(section = %caption, error = %e, "report section left out"),
        }
        Ok(())
    };
    flame("the whole window, all CPUs".into(), w, None, store)?;
    // A finding's own span on its CPU: what the page asks for when its mark is clicked (the
    // store was read 5 s before it to 1 s after, `windows`, for the heatmap around it).
    for (f, win) in found.iter().zip(windows) {
        let end = f.end_ns.unwrap_or(win.to_ns).max(f.start_ns + 1_000_000);
        flame(format!("{}: {}", f.id, f.summary), Window::new(f.start_ns, end)?, f.cpu, store)?;
    }
    // Only what the window's data says: a report is read later, elsewhere, without the daemon.
    let node = meta.as_ref().map(|m| if m.node.is_empty() { m.hostname.clone() } else { m.node.clone() });
    let status = serde_json::json!({
        "meta": {"node": node, "cpus": cpus, "frequency_hz": hz},
        "summary": {"span": [w.from_ns, w.to_ns]},
        // The GPUs as the daemon last listed them (`gpus.json`): the page's GPU line and the
        // GPU-local CPUs in CPU x time; the GPU strips come with the counter tracks. A node
        // without GPUs has none to list: the report is the same from its store and from what it
        // shipped to ClickHouse (which keeps no `gpus.json`).
        "gpus": profiler::gpu::Inventory::read(data_dir).filter(|i| !i.gpus.is_empty()),
        "report": true,
    });
    let r = report::Report {
        from_ns: w.from_ns,
        to_ns: w.to_ns,
        status,
        heatmap: heat,
        cputime,
        findings: found.to_vec(),
        events,
        counters,
        flamegraphs,
    };
    let mut out = open_output(Some(output))?;
    report::write_html(&r, &profiler::serve::page(), &mut out)?;
    out.finish()?;
    Ok(())
}
