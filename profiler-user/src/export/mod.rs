//! Output formats: flamegraphs (inferno), subsecond heatmaps and CPU x time grids (FlameScope's
//! JSON, CSV, SVG, PNG, HTML), and sample exports other tools open (perf script, pprof,
//! speedscope, folded).

pub mod cputime;
pub mod flamegraph;
pub mod heatmap;
pub mod perf_script;
pub mod pprof;
pub mod report;
pub mod speedscope;

/// Errors of every exporter: the output could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("writing the output failed: {0}")]
    Io(#[from] std::io::Error),
}
