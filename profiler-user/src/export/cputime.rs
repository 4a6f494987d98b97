//! CPU x time: rows are CPUs, columns time buckets, cells the busy share (and the kernel-mode
//! and softirq parts of it); findings on a CPU are outlined over their span.

use std::io::Write;

use super::{ExportError, heatmap::escape};
use crate::{detect::Finding, query::CpuTime};

/// The JSON of CPU x time, serialized from borrowed fields (no `serde_json::Value` copy of the
/// grid). `coarsened` appears when the buckets were widened to fit the cell budget.
#[derive(serde::Serialize)]
pub struct Json<'a> {
    pub first_ns: u64,
    pub bucket_ns: u64,
    pub cpus: &'a [u32],
    pub busy: &'a [Vec<f64>],
    pub kernel: &'a [Vec<f64>],
    /// The part of `kernel` spent in softirqs (on any task, the idle one included).
    pub softirq: &'a [Vec<f64>],
    pub findings: &'a [Finding],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coarsened: Option<Coarsened>,
}

#[derive(serde::Serialize)]
pub struct Coarsened {
    pub requested_bucket_ns: u64,
    pub bucket_ns: u64,
    pub reason: String,
}

/// Says why the buckets are wider than asked, or `None` when they are not.
pub fn coarsened(grid: &CpuTime) -> Option<Coarsened> {
    (grid.bucket_ns != grid.requested_bucket_ns).then(|| Coarsened {
        requested_bucket_ns: grid.requested_bucket_ns,
        bucket_ns: grid.bucket_ns,
        reason: format!(
            "buckets of {} instead of {}: the window would exceed {} cells, the limit of one CPU x time view",
            crate::timespec::format_duration(grid.bucket_ns),
            crate::timespec::format_duration(grid.requested_bucket_ns),
            crate::budget::CPUTIME_CELLS
        ),
    })
}

pub fn json<'a>(grid: &'a CpuTime, findings: &'a [Finding]) -> Json<'a> {
    Json {
        first_ns: grid.first_ns,
        bucket_ns: grid.bucket_ns,
        cpus: &grid.cpus,
        busy: &grid.busy,
        kernel: &grid.kernel,
        softirq: &grid.softirq,
        findings,
        coarsened: coarsened(grid),
    }
}

pub fn write_json(grid: &CpuTime, findings: &[Finding], mut out: impl Write) -> Result<(), ExportError> {
    serde_json::to_writer(&mut out, &json(grid, findings)).map_err(std::io::Error::from)?;
    writeln!(out)?;
    Ok(())
}

/// `start_ns,cpu,busy_share,kernel_share,softirq_share`, one line per cell (the new column last,
/// so readers of the first four keep working).
pub fn write_csv(grid: &CpuTime, mut out: impl Write) -> Result<(), ExportError> {
    writeln!(out, "start_ns,cpu,busy_share,kernel_share,softirq_share")?;
    for (row, cpu) in grid.cpus.iter().enumerate() {
        for (b, busy) in grid.busy[row].iter().enumerate() {
            writeln!(
                out,
                "{},{cpu},{busy:.3},{:.3},{:.3}",
                grid.first_ns + b as u64 * grid.bucket_ns,
                grid.kernel[row][b],
                grid.softirq[row][b]
            )?;
        }
    }
    Ok(())
}

const W: usize = 6;
const H: usize = 14;

/// Busy in shades of blue; the kernel part of it turns the cell magenta.
fn rgb(busy: f64, kernel: f64) -> [u8; 3] {
    let light = 255 - (busy.clamp(0.0, 1.0) * 200.0) as u8;
    let red = (light as f64 + (kernel / busy.max(1e-9)).clamp(0.0, 1.0) * busy * (255.0 - light as f64)) as u8;
    [red, light, 255]
}

/// One row of 4x12-pixel cells per CPU, labelled, with the title, the first bucket's time and
/// the window's length, and a legend of the colours; findings are not marked (use SVG or HTML
/// for those).
pub fn write_png(grid: &CpuTime, title: &str, out: impl Write) -> Result<(), ExportError> {
    use super::raster::{Canvas, INK, LINE_H, text_px};
    let cols = grid.busy.first().map_or(0, Vec::len).max(1);
    let rows = grid.cpus.len().max(1);
    let labels: Vec<String> = grid.cpus.iter().map(|c| format!("CPU {c}")).collect();
    let left = labels.iter().map(|l| text_px(l)).max().unwrap_or(0) + 8;
    let top = LINE_H + 6;
    let (plot_w, plot_h) = (cols * 4, rows * 12);
    let start = crate::timespec::format(grid.first_ns);
    let span =
        format!("+{} s in {} ms buckets", cols as u64 * grid.bucket_ns / 1_000_000_000, grid.bucket_ns / 1_000_000);
    let legend = ["idle", "busy", "in the kernel"];
    let width = [
        left + plot_w + 8,
        text_px(title) + 8,
        left + text_px(&start) + text_px(&span) + 16,
        left + 3 * 16 + legend.iter().map(|l| text_px(l) + 8).sum::<usize>(),
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    let mut c = Canvas::new(width, top + plot_h + 2 * LINE_H + 12);
    c.text(4, 4, title, INK);
    for (row, busy) in grid.busy.iter().enumerate() {
        c.text_right(left - 4, top + row * 12 + 2, &labels[row], INK);
        for (b, &v) in busy.iter().enumerate() {
            c.fill(left + b * 4, top + row * 12, 4, 11, rgb(v, grid.kernel[row][b]));
        }
    }
    let below = top + plot_h + 4;
    c.text(left, below, &start, INK);
    c.text_right((left + plot_w).max(left + text_px(&start) + 8 + text_px(&span)), below, &span, INK);
    let mut x = left;
    for (label, colour) in legend.iter().zip([rgb(0.0, 0.0), rgb(1.0, 0.0), rgb(1.0, 1.0)]) {
        c.fill(x, below + LINE_H + 2, 12, 8, colour);
        c.text(x + 16, below + LINE_H + 2, label, INK);
        x += 16 + text_px(label) + 8;
    }
    c.write_png(out)
}

pub fn write_svg(grid: &CpuTime, findings: &[Finding], title: &str, mut out: impl Write) -> Result<(), ExportError> {
    let cols = grid.busy.first().map_or(0, Vec::len);
    // At least as wide as the title (11 px sans-serif: ~7 px a character), or it is clipped.
    let (w, h) = ((cols * W + 70).max(super::text_width(title, 60)), grid.cpus.len() * H + 50);
    writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    )?;
    writeln!(out, r#"<text x="60" y="14">{}</text>"#, escape(title))?;
    for (row, cpu) in grid.cpus.iter().enumerate() {
        let y = 20 + row * H;
        writeln!(out, r#"<text x="2" y="{}">CPU {cpu}</text>"#, y + H - 3)?;
        for (b, &busy) in grid.busy[row].iter().enumerate() {
            let (kernel, softirq) = (grid.kernel[row][b], grid.softirq[row][b]);
            let [red, light, _] = rgb(busy, kernel);
            writeln!(
                out,
                r#"<rect x="{}" y="{y}" width="{W}" height="{H}" fill="rgb({red},{light},255)" data-cpu="{cpu}" data-start-ns="{}" data-busy="{busy:.3}" data-kernel="{kernel:.3}" data-softirq="{softirq:.3}"><title>CPU {cpu} {}: {:.0} % busy, {:.0} % kernel, {:.0} % softirq</title></rect>"#,
                60 + b * W,
                grid.first_ns + b as u64 * grid.bucket_ns,
                crate::timespec::format(grid.first_ns + b as u64 * grid.bucket_ns),
                busy * 100.0,
                kernel * 100.0,
                softirq * 100.0
            )?;
        }
    }
    let end = grid.first_ns + cols as u64 * grid.bucket_ns;
    for f in findings {
        let (Some(cpu), start) = (f.cpu, f.start_ns) else { continue };
        let Some(row) = grid.cpus.iter().position(|&c| c == cpu) else { continue };
        let stop = f.end_ns.unwrap_or(end).min(end);
        if stop <= grid.first_ns || start >= end {
            continue;
        }
        let x0 = 60 + (start.max(grid.first_ns) - grid.first_ns) as usize / grid.bucket_ns as usize * W;
        let x1 = 60 + (stop - grid.first_ns).div_ceil(grid.bucket_ns) as usize * W;
        writeln!(
            out,
            r#"<rect x="{x0}" y="{}" width="{}" height="{H}" fill="none" stroke="black" stroke-width="2" data-finding="{}"><title>{}</title></rect>"#,
            20 + row * H,
            x1.saturating_sub(x0).max(W),
            escape(&f.id),
            escape(&f.summary)
        )?;
    }
    writeln!(out, "</svg>")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::{Kind, Severity};

    #[test]
    fn the_picture_is_as_wide_as_its_title() {
        let grid = CpuTime {
            first_ns: 0,
            bucket_ns: 1_000_000_000,
            requested_bucket_ns: 1_000_000_000,
            cpus: vec![0, 1],
            busy: vec![vec![1.0; 3], vec![0.5; 3]],
            kernel: vec![vec![0.0; 3], vec![0.0; 3]],
            softirq: vec![vec![0.0; 3], vec![0.0; 3]],
        };
        let title = "CPU x time, 2026-11-23T14:28:18.000Z to 2026-11-23T14:28:21.000Z";
        let mut svg = Vec::new();
        write_svg(&grid, &[], title, &mut svg).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        let width: usize = svg.split(r#"width=""#).nth(1).unwrap().split('"').next().unwrap().parse().unwrap();
        assert!(width >= 60 + title.len() * 7, "{width} px for a title of {} characters", title.len());
    }

    #[test]
    fn hostile_finding_summaries_keep_the_svg_valid_xml() {
        let grid = CpuTime {
            first_ns: 0,
            bucket_ns: 1_000_000_000,
            requested_bucket_ns: 1_000_000_000,
            cpus: vec![0],
            busy: vec![vec![1.0, 1.0]],
            kernel: vec![vec![0.0, 0.0]],
            softirq: vec![vec![0.0, 0.0]],
        };
        let evil = "CPU 0 saturated by evil\x1b]0;pwned\x07\r\n<b>&\u{1}\u{fffe}";
        let f = Finding {
            id: "f-1".into(),
            kind: Kind::SaturatedCore,
            start_ns: 0,
            end_ns: Some(2_000_000_000),
            cpu: Some(0),
            severity: Severity::Warning,
            summary: evil.into(),
            evidence: serde_json::Value::Null,
        };
        let mut out = Vec::new();
        write_svg(&grid, &[f], evil, &mut out).unwrap();
        let svg = String::from_utf8(out).unwrap();
        let doc = roxmltree::Document::parse(&svg).expect("valid XML");
        let title = doc.descendants().find(|n| n.has_tag_name("title") && n.text().is_some_and(|t| t.contains("evil")));
        assert_eq!(
            title.and_then(|n| n.text()),
            Some("CPU 0 saturated by evil\\x1b]0;pwned\\x07\\r\\n<b>&\\x01\\u{fffe}")
        );
    }
}
