//! `profiler export`: the samples of a window in a format other tools open.

use std::path::PathBuf;

use clap::ValueEnum;
use profiler::{
    export::{flamegraph, otlp, perf_script, pprof, speedscope},
    query::{FoldBudget, Window},
    timespec,
};

use super::{
    args::{FilterArgs, Samples, Source, WindowArgs, fold},
    output::open_output,
};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// `perf script` text (FlameScope, speedscope)
    PerfScript,
    /// Brendan Gregg's folded stacks
    Folded,
    /// gzipped pprof protobuf (`go tool pprof`)
    Pprof,
    /// speedscope JSON
    Speedscope,
    /// OpenTelemetry profiles: a binary protobuf `ExportProfilesServiceRequest` (OTLP
    /// v1development)
    Otlp,
}

// The command's help is the doc comment of its `Command` variant.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub source: Source,
    #[command(flatten)]
    pub window: WindowArgs,
    #[command(flatten)]
    pub filter: FilterArgs,
    #[arg(long, value_enum)]
    pub format: ExportFormat,
    /// What the profile counts: CPU samples, or (from the CUDA probes) GPU launches, time
    /// blocked waiting on the GPU, bytes copied (pprof and OTLP sample types
    /// `cuda_launches/count`, `cuda_sync/nanoseconds`, `cuda_copies/bytes`).
    #[arg(long, value_enum, default_value_t = Samples::Cpu)]
    pub samples: Samples,
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let Args { source, window, filter, format, samples, output } = args;
    let kind = samples.kind();
    let now = super::args::now_for(&source, &[&window.from, &window.to]);
    let w = Window::new(timespec::parse(&window.from, now)?, timespec::parse(&window.to, now)?)?;
    // One node or several: from ClickHouse the folded stacks are summed by the server, the
    // formats that keep each sample's time stream them a chunk at a time.
    let src = source.open_nodes()?;
    let mut reader = src.reader(kind)?;
    src.require_data(&mut reader, w)?;
    let filter = filter.filter();
    let node = reader.node()?;
    let hz = node.hz;
    let mut out = open_output(output.as_deref())?;
    match format {
        ExportFormat::Folded => {
            // The API's budget, as the node's store answers it.
            let folded = fold(&mut reader, w, &filter, FoldBudget::default())?;
            flamegraph::write_folded(&folded, &mut out)?;
        }
        ExportFormat::PerfScript => {
            perf_script::write_header(&mut out)?;
            let mut err = None;
            reader.for_each_sample(w, &filter, |s| {
                if err.is_none() {
                    err = perf_script::write_sample(s, &mut out).err();
                }
            })?;
            if let Some(e) = err {
                return Err(e.into());
            }
        }
        ExportFormat::Pprof => {
            let mut b = pprof::Builder::new(hz).for_window(w).for_kind(kind);
            reader.for_each_sample(w, &filter, |s| b.add(s))?;
            b.finish(&mut out)?;
        }
        ExportFormat::Speedscope => {
            let mut b = speedscope::Builder::default().for_window(w);
            let period = 1_000_000_000 / hz.max(1);
            reader.for_each_sample(w, &filter, |s| b.add(s, period))?;
            b.finish(&format!("profiler {} to {}", timespec::format(w.from_ns), timespec::format(w.to_ns)), &mut out)?;
        }
        ExportFormat::Otlp => {
            let mut b = otlp::Builder::new(w, &node.hostname, hz).with_kind(kind);
            reader.for_each_sample(w, &filter, |s| b.add(s))?;
            b.write(&mut out)?;
        }
    }
    out.finish()?;
    Ok(())
}
