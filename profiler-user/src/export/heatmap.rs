//! The subsecond heatmap in FlameScope's layout: one column per second, rows are offsets within
//! the second (row 0 = offset 0, drawn at the bottom), cells count busy samples.

use std::io::Write;

use serde::Serialize;

use super::ExportError;
use crate::query::Grid;

/// Exactly what FlameScope's `/heatmap/` endpoint returns, so tools built for it read ours.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FlameScope {
    /// Seconds since the first column.
    pub columns: Vec<u64>,
    /// Row offsets in ms, from the largest down to 0.
    pub rows: Vec<f64>,
    /// `values[column][i]`: samples whose offset falls in row `rows[i]`.
    pub values: Vec<Vec<u64>>,
    pub maxvalue: u64,
}

pub fn flamescope(grid: &Grid) -> FlameScope {
    let row_ms = 1000.0 / grid.rows as f64;
    FlameScope {
        columns: (0..grid.counts.len() as u64).collect(),
        rows: (0..grid.rows).rev().map(|r| r as f64 * row_ms).collect(),
        values: grid.counts.iter().map(|col| col.iter().rev().copied().collect()).collect(),
        maxvalue: grid.counts.iter().flatten().copied().max().unwrap_or(0),
    }
}

pub fn write_json(grid: &Grid, mut out: impl Write) -> Result<(), ExportError> {
    serde_json::to_writer(&mut out, &flamescope(grid)).map_err(std::io::Error::from)?;
    writeln!(out)?;
    Ok(())
}

/// `unix_second,offset_ms,samples`, one line per cell.
pub fn write_csv(grid: &Grid, mut out: impl Write) -> Result<(), ExportError> {
    writeln!(out, "unix_second,offset_ms,samples")?;
    let row_ms = 1000.0 / grid.rows as f64;
    for (c, col) in grid.counts.iter().enumerate() {
        for (r, n) in col.iter().enumerate() {
            writeln!(out, "{},{},{n}", grid.first_second + c as u64, r as f64 * row_ms)?;
        }
    }
    Ok(())
}

/// White through yellow to dark red, by share of the maximum.
pub fn color(v: u64, max: u64) -> [u8; 3] {
    if v == 0 || max == 0 {
        return [250, 250, 250];
    }
    let x = (v as f64 / max as f64).sqrt();
    let lerp = |a: f64, b: f64, t: f64| (a + (b - a) * t).round() as u8;
    if x < 0.5 {
        let t = x * 2.0;
        [lerp(255.0, 253.0, t), lerp(245.0, 141.0, t), lerp(200.0, 60.0, t)]
    } else {
        let t = (x - 0.5) * 2.0;
        [lerp(253.0, 165.0, t), lerp(141.0, 0.0, t), lerp(60.0, 38.0, t)]
    }
}

const CELL_W: usize = 8;
const CELL_H: usize = 6;

pub fn write_svg(grid: &Grid, title: &str, mut out: impl Write) -> Result<(), ExportError> {
    let (cols, rows) = (grid.counts.len(), grid.rows);
    let max = grid.counts.iter().flatten().copied().max().unwrap_or(0);
    let (w, h) = (cols * CELL_W + 60, rows * CELL_H + 50);
    writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    )?;
    writeln!(out, r#"<text x="50" y="14">{}</text>"#, escape(title))?;
    writeln!(out, r#"<text x="2" y="{}">0 ms</text><text x="2" y="30">1 s</text>"#, 24 + rows * CELL_H)?;
    let row_ms = 1000 / rows.max(1);
    for (c, col) in grid.counts.iter().enumerate() {
        for (r, &v) in col.iter().enumerate() {
            let [red, g, b] = color(v, max);
            let (x, y) = (50 + c * CELL_W, 20 + (rows - 1 - r) * CELL_H);
            writeln!(
                out,
                r#"<rect x="{x}" y="{y}" width="{CELL_W}" height="{CELL_H}" fill="rgb({red},{g},{b})" data-second="{}" data-offset-ms="{}" data-samples="{v}"><title>{} +{} ms: {v} samples</title></rect>"#,
                grid.first_second + c as u64,
                r * row_ms,
                crate::timespec::format((grid.first_second + c as u64) * 1_000_000_000),
                r * row_ms
            )?;
        }
    }
    writeln!(
        out,
        r#"<text x="50" y="{}">{} s from {}</text>"#,
        40 + rows * CELL_H,
        cols,
        crate::timespec::format(grid.first_second * 1_000_000_000)
    )?;
    writeln!(out, "</svg>")?;
    Ok(())
}

pub fn write_png(grid: &Grid, out: impl Write) -> Result<(), ExportError> {
    let (cols, rows) = (grid.counts.len().max(1), grid.rows.max(1));
    let (w, h) = (cols * 4, rows * 4);
    let max = grid.counts.iter().flatten().copied().max().unwrap_or(0);
    let mut pixels = vec![0u8; w * h * 3];
    for (c, col) in grid.counts.iter().enumerate() {
        for (r, &v) in col.iter().enumerate() {
            let rgb = color(v, max);
            for dy in 0..4 {
                for dx in 0..4 {
                    let (x, y) = (c * 4 + dx, (rows - 1 - r) * 4 + dy);
                    pixels[(y * w + x) * 3..(y * w + x) * 3 + 3].copy_from_slice(&rgb);
                }
            }
        }
    }
    super::write_rgb_png(w, h, &pixels, out)
}

/// Text for SVG/HTML: control characters (which XML 1.0 forbids, and which names can hold) made
/// visible first, then the markup characters escaped.
pub fn escape(s: &str) -> String {
    crate::text::visible(s).replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A self-contained page around an SVG.
pub fn write_html(svg: &[u8], title: &str, mut out: impl Write) -> Result<(), ExportError> {
    writeln!(out, "<!doctype html><html><head><meta charset=\"utf-8\"><title>{}</title></head><body>", escape(title))?;
    out.write_all(svg)?;
    writeln!(out, "</body></html>")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid() -> Grid {
        // Two seconds, 50 rows; second 0 has 3 samples at offset 0 and 1 at 990 ms.
        let mut counts = vec![vec![0u64; 50]; 2];
        counts[0][0] = 3;
        counts[0][49] = 1;
        counts[1][10] = 7;
        Grid { first_second: 1_795_000_000, rows: 50, counts }
    }

    #[test]
    fn flamescope_layout() {
        let f = flamescope(&grid());
        assert_eq!(f.columns, vec![0, 1]);
        assert_eq!(f.rows.len(), 50);
        assert_eq!((f.rows[0], f.rows[49]), (980.0, 0.0));
        // values[col][i] counts row rows[i]: offset 0 is the last entry, 980 ms the first.
        assert_eq!((f.values[0][49], f.values[0][0]), (3, 1));
        assert_eq!(f.values[1][49 - 10], 7);
        assert_eq!(f.maxvalue, 7);
        let json = serde_json::to_value(&f).unwrap();
        let keys: Vec<_> = json.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, vec!["columns", "maxvalue", "rows", "values"]);
    }

    #[test]
    fn csv_svg_png_render() {
        let mut csv = Vec::new();
        write_csv(&grid(), &mut csv).unwrap();
        let csv = String::from_utf8(csv).unwrap();
        assert!(csv.contains("1795000000,0,3\n") && csv.contains("1795000001,200,7\n"), "{csv}");
        let mut svg = Vec::new();
        write_svg(&grid(), "t", &mut svg).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        assert_eq!(svg.matches("<rect").count(), 100);
        assert!(svg.contains(r#"data-second="1795000001" data-offset-ms="200" data-samples="7""#));
        let mut png = Vec::new();
        write_png(&grid(), &mut png).unwrap();
        assert_eq!(&png[1..4], b"PNG");
    }
}
