//! `profiler export`: the samples of a window in a format other tools open.

use std::path::PathBuf;

use clap::ValueEnum;
use profiler::{
    export::{flamegraph, otlp, perf_script, pprof, speedscope},
    query,
    store::Meta,
    timespec,
};

use super::{
    args::{FilterArgs, Samples, Source, WindowArgs, window_of},
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
    let w = window_of(&window.from, &window.to)?;
    let mut src = source.open()?;
    let mut store = src.load_kind(&[w], kind)?;
    src.require_data(&mut store, w)?;
    let filter = filter.filter();
    let meta = Meta::read(src.data_dir());
    let hz = meta.as_ref().map_or(99, |m| m.frequency_hz);
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
            let mut b = pprof::Builder::new(hz).for_window(w).for_kind(kind);
            query::for_each_sample(&mut store, w, &filter, |s| b.add(s))?;
            b.finish(&mut out)?;
        }
        ExportFormat::Speedscope => {
            let mut b = speedscope::Builder::default().for_window(w);
            let period = 1_000_000_000 / hz.max(1);
            query::for_each_sample(&mut store, w, &filter, |s| b.add(s, period))?;
            b.finish(&format!("profiler {} to {}", timespec::format(w.from_ns), timespec::format(w.to_ns)), &mut out)?;
        }
        ExportFormat::Otlp => {
            let mut b = otlp::Builder::new(w, meta.as_ref().map_or("", |m| m.hostname.as_str()), hz).with_kind(kind);
            query::for_each_sample(&mut store, w, &filter, |s| b.add(s))?;
            b.write(&mut out)?;
        }
    }
    out.finish()?;
    Ok(())
}
