//! Output formats: flamegraphs (inferno), subsecond heatmaps and CPU x time grids (FlameScope's
//! JSON, CSV, SVG, PNG, HTML), and sample exports other tools open (perf script, pprof,
//! speedscope, folded, OpenTelemetry profiles).

pub mod cputime;
pub mod flamegraph;
pub mod heatmap;
pub mod interner;
pub mod otlp;
pub mod perf_script;
pub mod pprof;
pub mod raster;
pub mod report;
pub mod speedscope;

/// A CUDA launch's kernel: its stack's leaf `[gpu] NAME` frame without the marker
/// (`gpu::cuda::kernels`), for the exports' `kernel` label; `None` for other kinds and frames.
pub fn kernel_of<'a>(kind: crate::model::SampleKind, frames: &[(&'a str, bool)]) -> Option<&'a str> {
    if kind != crate::model::SampleKind::CudaLaunches {
        return None;
    }
    frames.last().and_then(|&(name, kernel)| if kernel { None } else { name.strip_prefix("[gpu] ") })
}

/// Errors of every exporter: the output could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("writing the output failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Encodes `width x height` RGB pixels (row-major, 3 bytes each) as PNG.
pub fn write_rgb_png(width: usize, height: usize, pixels: &[u8], out: impl std::io::Write) -> Result<(), ExportError> {
    let mut enc = png::Encoder::new(out, width as u32, height as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header().map_err(std::io::Error::other)?;
    writer.write_image_data(pixels).map_err(std::io::Error::other)?;
    writer.finish().map_err(std::io::Error::other)?;
    Ok(())
}

/// Pixels a line of 11 px sans-serif text needs from `x` (a generous 7 px a character: digits
/// and ISO times are wide).
pub(crate) fn text_width(text: &str, x: usize) -> usize {
    x + text.chars().count() * 7 + 10
}
