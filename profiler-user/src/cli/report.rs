//! `profiler report`: one self-contained HTML file for an incident.

use std::path::{Path, PathBuf};

use profiler::{
    detect,
    export::{cputime, heatmap, report},
    fleet::reader::Reader,
    model::SampleKind,
    query::{self, Filter, FoldBudget, Window},
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
    // One node: its store, or its pieces read from ClickHouse (heatmap, CPU x time, findings,
    // events, flamegraphs), each summed by the server.
    let src = args.source.open()?;
    let mut reader = src.reader(SampleKind::Cpu)?;
    src.require_data(&mut reader, w)?;
    let now = timespec::now_ns();
    let found = reader.findings(w)?;
    let reach =
        found.iter().take(MAX_FINDING_FLAMEGRAPHS).map(|f| finding_window(f, now)).collect::<Result<Vec<_>, _>>()?;
    // Only what the window's data says: a report is read later, elsewhere, without the daemon.
    // The node's counters and GPUs are in its data directory (ClickHouse keeps neither).
    let (counters, gpus) = match src.fleet() {
        Some(_) => (Default::default(), None),
        None => {
            let dir = src.data_dir();
            let counters = profiler::store::counters::read(dir, w.from_ns, w.to_ns, &Default::default())?;
            (counters, profiler::gpu::Inventory::read(dir).filter(|i| !i.gpus.is_empty()))
        }
    };
    // The other counts the node recorded in the window (CUDA launches, synchronisations and
    // copies, off-CPU time): the whole window's flamegraph of each, for the page's selector.
    let mut others = Vec::new();
    for kind in SampleKind::WEIGHTED {
        // A kind the node never recorded has no store: nothing to offer, not an error.
        let Ok(mut r) = src.reader(kind) else { continue };
        match r.fold(w, &Filter::default(), FoldBudget::default()) {
            Ok(fold) if fold.folded.total() > 0 => {
                let mut tree = Vec::new();
                profiler::serve::tree::write(&fold.folded, &mut tree)?;
                others.push(report::Flame {
                    caption: format!("the whole window, all CPUs, {}", kind.label()),
                    from_ns: w.from_ns,
                    to_ns: w.to_ns,
                    cpu: None,
                    samples: kind,
                    tree,
                });
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(samples = kind.name(), error = %e, "report section left out"),
        }
    }
    report(&mut reader, w, &found, &reach, (counters, gpus), others, &args.output)
}

/// Findings a report draws a flamegraph of.
const MAX_FINDING_FLAMEGRAPHS: usize = 12;

/// 5 s before a finding to 1 s after its end.
fn finding_window(f: &detect::Finding, now: u64) -> Result<Window, query::QueryError> {
    Window::new(f.start_ns.saturating_sub(5_000_000_000), f.end_ns.unwrap_or(now).max(f.start_ns) + 1_000_000_000)
}

fn report(
    reader: &mut Reader<'_>,
    w: Window,
    found: &[detect::Finding],
    windows: &[Window],
    // The node's counter tracks and GPUs (from its data directory).
    (counters, gpus): (profiler::store::counters::Tracks, Option<profiler::gpu::Inventory>),
    others: Vec<report::Flame>,
    output: &Path,
) -> anyhow::Result<()> {
    let node = reader.node()?;
    let events = reader.events(w)?;
    let grid = reader.grid(w, 50, &Filter::default())?;
    let mut heat = Vec::new();
    heatmap::write_json_with(&grid, true, &mut heat)?;
    // The page's own bucket (1 s), widened by the cell budget for long windows.
    let ct = reader.cpu_time(w, 1_000_000_000)?;
    let cputime = serde_json::to_value(cputime::json(&ct, found))?;
    let counters = serde_json::to_value(counters)?;
    let mut flamegraphs = Vec::new();
    let mut flame = |caption: String, win: Window, cpu: Option<u32>, reader: &mut Reader<'_>| -> anyhow::Result<()> {
        let filter = Filter { cpus: cpu.into_iter().collect(), ..Default::default() };
        match reader.fold(win, &filter, FoldBudget::default()) {
            Ok(fold) => {
                let mut tree = Vec::new();
                profiler::serve::tree::write(&fold.folded, &mut tree)?;
                let samples = SampleKind::Cpu;
                flamegraphs.push(report::Flame { caption, from_ns: win.from_ns, to_ns: win.to_ns, cpu, samples, tree });
            }
            Err(e) => tracing::warn!(section = %caption, error = %e, "report section left out"),
        }
        Ok(())
    };
    flame("the whole window, all CPUs".into(), w, None, reader)?;
    // A finding's own span on its CPU: what the page asks for when its mark is clicked.
    for (f, win) in found.iter().zip(windows) {
        let end = f.end_ns.unwrap_or(win.to_ns).max(f.start_ns + 1_000_000);
        flame(format!("{}: {}", f.id, f.summary), Window::new(f.start_ns, end)?, f.cpu, reader)?;
    }
    flamegraphs.extend(others);
    let status = serde_json::json!({
        "meta": {"node": node.name, "cpus": node.cpus, "frequency_hz": node.hz},
        "summary": {"span": [w.from_ns, w.to_ns]},
        // The GPUs as the daemon last listed them (`gpus.json`): the page's GPU line and the
        // GPU-local CPUs in CPU x time; the GPU strips come with the counter tracks. A node
        // without GPUs has none to list: the report is the same from its store and from what it
        // shipped to ClickHouse (which keeps no `gpus.json`).
        "gpus": gpus,
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
