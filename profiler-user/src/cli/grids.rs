//! `profiler heatmap` and `profiler cputime`: the two grids over time.

use std::path::PathBuf;

use clap::ValueEnum;
use profiler::{
    export::{cputime, heatmap},
    model::SampleKind,
    timespec,
};

use super::{
    args::{FilterArgs, Source, WindowArgs, window_of},
    output::open_output,
};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GridFormat {
    Json,
    Csv,
    Svg,
    Png,
    Html,
}

// The commands' help is the doc comment of their `Command` variants.
#[derive(clap::Args)]
pub struct HeatmapArgs {
    #[command(flatten)]
    pub source: Source,
    #[command(flatten)]
    pub window: WindowArgs,
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Rows per second (50 rows = 20 ms each).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub rows: u32,
    #[arg(long, value_enum, default_value_t = GridFormat::Json)]
    pub format: GridFormat,
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct CputimeArgs {
    #[command(flatten)]
    pub source: Source,
    #[command(flatten)]
    pub window: WindowArgs,
    /// Bucket width (10ms and up).
    #[arg(long, default_value = "1s")]
    pub bucket: String,
    #[arg(long, value_enum, default_value_t = GridFormat::Json)]
    pub format: GridFormat,
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

pub fn heatmap(args: HeatmapArgs) -> anyhow::Result<()> {
    let HeatmapArgs { source, window, filter, rows, format, output } = args;
    let w = window_of(&window.from, &window.to)?;
    let src = source.open_nodes()?;
    let filter = filter.filter();
    let mut reader = src.reader(SampleKind::Cpu)?;
    let grid = match src.fleet() {
        // The server sums the cells, for one node or many.
        Some(_) => {
            let grid = reader.grid(w, rows as usize, &filter)?;
            if grid.recorded.iter().all(|&r| r == 0) {
                anyhow::bail!(
                    "no samples between {} and {} in {}",
                    timespec::format(w.from_ns),
                    timespec::format(w.to_ns),
                    src.describe()
                );
            }
            grid
        }
        None => {
            src.require_data(&mut reader, w)?;
            reader.grid(w, rows as usize, &filter)?
        }
    };
    if grid.coarsened() {
        eprintln!("note: {}", heatmap::coarsened_reason(&grid));
    }
    let title = format!("Subsecond heatmap, {} to {}", timespec::format(w.from_ns), timespec::format(w.to_ns));
    let mut out = open_output(output.as_deref())?;
    match format {
        GridFormat::Json => heatmap::write_json(&grid, &mut out)?,
        GridFormat::Csv => heatmap::write_csv(&grid, &mut out)?,
        GridFormat::Svg => heatmap::write_svg(&grid, &title, &mut out)?,
        GridFormat::Png => heatmap::write_png(&grid, &title, &mut out)?,
        GridFormat::Html => {
            let mut svg = Vec::new();
            heatmap::write_svg(&grid, &title, &mut svg)?;
            heatmap::write_html(&svg, &title, &mut out)?;
        }
    }
    out.finish()?;
    Ok(())
}

pub fn cputime(args: CputimeArgs) -> anyhow::Result<()> {
    let CputimeArgs { source, window, bucket, format, output } = args;
    let w = window_of(&window.from, &window.to)?;
    let bucket_ns = timespec::parse_duration_ns(&bucket).filter(|&b| b >= 10_000_000).ok_or_else(|| {
        anyhow::anyhow!("--bucket '{bucket}' must be a duration of 10ms or more (10ms, 100ms, 1s, 1m)")
    })?;
    let src = source.open()?;
    // From ClickHouse the server sums the buckets, whatever the window and the bucket.
    let mut reader = src.reader(SampleKind::Cpu)?;
    if src.fleet().is_none() {
        src.require_data(&mut reader, w)?;
    }
    let grid = reader.cpu_time(w, bucket_ns)?;
    if let Some(c) = cputime::coarsened(&grid) {
        eprintln!("note: {}", c.reason);
    }
    let found = reader.findings(w)?;
    let title = format!("CPU x time, {} to {}", timespec::format(w.from_ns), timespec::format(w.to_ns));
    let mut out = open_output(output.as_deref())?;
    match format {
        GridFormat::Json => cputime::write_json(&grid, &found, &mut out)?,
        GridFormat::Csv => cputime::write_csv(&grid, &mut out)?,
        GridFormat::Svg => cputime::write_svg(&grid, &found, &title, &mut out)?,
        GridFormat::Png => cputime::write_png(&grid, &title, &mut out)?,
        GridFormat::Html => {
            let mut svg = Vec::new();
            cputime::write_svg(&grid, &found, &title, &mut svg)?;
            heatmap::write_html(&svg, &title, &mut out)?;
        }
    }
    out.finish()?;
    Ok(())
}
