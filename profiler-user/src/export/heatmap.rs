//! The subsecond heatmap in FlameScope's layout: one column per second, rows are offsets within
//! the second (row 0 = offset 0, drawn at the bottom), cells count busy samples.
//! The page's heatmap, drawn in the browser from this JSON, is `serve/heatmap.js`.

use std::io::Write;

use super::ExportError;
use crate::query::Grid;

/// Writes the grid as FlameScope's `/heatmap/` JSON (`columns`: seconds since the first
/// column, `rows`: offsets in ms from the largest down to 0, `values[column][i]`, `maxvalue`),
/// number by number: a `serde_json::Value` of a big grid costs ten times the grid. A coarsened
/// grid adds `"coarsened": {"seconds_per_column": k, "reason": ...}`; `first_second` adds the
/// unix second of the first column (the UI needs it; FlameScope ignores unknown keys).
pub fn write_json_with(grid: &Grid, first_second: bool, mut out: impl Write) -> Result<(), ExportError> {
    let row_ms = 1000.0 / grid.rows as f64;
    out.write_all(b"{\"columns\":[")?;
    for c in 0..grid.columns as u64 {
        if c > 0 {
            out.write_all(b",")?;
        }
        write!(out, "{}", c * grid.seconds_per_column)?;
    }
    out.write_all(b"],\"rows\":[")?;
    for (i, r) in (0..grid.rows).rev().enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        // As serde writes an f64 (`980.0`), so FlameScope's readers see the same text.
        write!(out, "{:?}", r as f64 * row_ms)?;
    }
    out.write_all(b"],\"values\":[")?;
    let mut num = itoa_buf();
    for c in 0..grid.columns {
        out.write_all(if c > 0 { b",[" } else { b"[" })?;
        for (i, v) in grid.column(c).iter().rev().enumerate() {
            if i > 0 {
                out.write_all(b",")?;
            }
            out.write_all(num.format(*v))?;
        }
        out.write_all(b"]")?;
    }
    write!(out, "],\"maxvalue\":{}", grid.max())?;
    if first_second {
        write!(out, ",\"first_second\":{}", grid.first_second)?;
        // The page's own key (FlameScope's files stay as they were): columns without data.
        let gaps: Vec<String> = grid.gaps().map(|c| c.to_string()).collect();
        if !gaps.is_empty() {
            write!(out, ",\"gaps\":[{}]", gaps.join(","))?;
        }
    }
    if grid.coarsened() {
        write!(
            out,
            ",\"coarsened\":{{\"seconds_per_column\":{},\"reason\":\"{}\"}}",
            grid.seconds_per_column,
            coarsened_reason(grid)
        )?;
    }
    writeln!(out, "}}")?;
    Ok(())
}

/// FlameScope's JSON, exactly (plus `coarsened` when it was).
pub fn write_json(grid: &Grid, out: impl Write) -> Result<(), ExportError> {
    write_json_with(grid, false, out)
}

/// The sentence that says a grid was coarsened, for headers, JSON and the CLI.
pub fn coarsened_reason(grid: &Grid) -> String {
    format!(
        "one column per {} s: one per second would exceed {} cells, the limit of one heatmap",
        grid.seconds_per_column,
        crate::budget::HEATMAP_CELLS
    )
}

/// Formats u32s without allocating.
struct Itoa([u8; 10]);

fn itoa_buf() -> Itoa {
    Itoa([0; 10])
}

impl Itoa {
    fn format(&mut self, mut v: u32) -> &[u8] {
        let mut i = self.0.len();
        loop {
            i -= 1;
            self.0[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                return &self.0[i..];
            }
        }
    }
}

/// `unix_second,offset_ms,samples`, one line per cell (the column's first second when coarsened).
pub fn write_csv(grid: &Grid, mut out: impl Write) -> Result<(), ExportError> {
    writeln!(out, "unix_second,offset_ms,samples")?;
    let row_ms = 1000.0 / grid.rows as f64;
    for c in 0..grid.columns {
        for (r, n) in grid.column(c).iter().enumerate() {
            writeln!(out, "{},{},{n}", grid.first_second + c as u64 * grid.seconds_per_column, r as f64 * row_ms)?;
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
    let (cols, rows, k) = (grid.columns, grid.rows, grid.seconds_per_column);
    let max = grid.max();
    // At least as wide as the title (11 px sans-serif: ~7 px a character), or it is clipped.
    let (w, h) = ((cols * CELL_W + 60).max(super::text_width(title, 50)), rows * CELL_H + 50);
    writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    )?;
    writeln!(out, r#"<text x="50" y="14">{}</text>"#, escape(title))?;
    writeln!(out, r#"<text x="2" y="{}">0 ms</text><text x="2" y="30">1 s</text>"#, 24 + rows * CELL_H)?;
    let row_ms = 1000 / rows.max(1);
    for c in 0..cols {
        for (r, &v) in grid.column(c).iter().enumerate() {
            let [red, g, b] = color(u64::from(v), u64::from(max));
            let (x, y) = (50 + c * CELL_W, 20 + (rows - 1 - r) * CELL_H);
            writeln!(
                out,
                r#"<rect x="{x}" y="{y}" width="{CELL_W}" height="{CELL_H}" fill="rgb({red},{g},{b})" data-second="{}" data-offset-ms="{}" data-samples="{v}"><title>{} +{} ms: {v} samples</title></rect>"#,
                grid.first_second + c as u64 * k,
                r * row_ms,
                crate::timespec::format((grid.first_second + c as u64 * k) * 1_000_000_000),
                r * row_ms
            )?;
        }
    }
    writeln!(
        out,
        r#"<text x="50" y="{}">{} s from {}{}</text>"#,
        40 + rows * CELL_H,
        cols as u64 * k,
        crate::timespec::format(grid.first_second * 1_000_000_000),
        if grid.coarsened() { format!(" ({})", coarsened_reason(grid)) } else { String::new() }
    )?;
    writeln!(out, "</svg>")?;
    Ok(())
}

/// Cells of 4x4 pixels, offsets up and seconds across, with the title, the offsets within the
/// second (0 ms at the bottom, as on the page and in FlameScope), the first second and the
/// window's length, and a legend from an empty cell to the fullest one.
pub fn write_png(grid: &Grid, title: &str, out: impl Write) -> Result<(), ExportError> {
    use super::raster::{Canvas, INK, LINE_H, text_px};
    const CELL: usize = 4;
    let (cols, rows, k) = (grid.columns.max(1), grid.rows.max(1), grid.seconds_per_column);
    let max = grid.max();
    let (left, top) = (text_px("500 ms") + 8, LINE_H + 6);
    let (plot_w, plot_h) = (cols * CELL, rows * CELL);
    let start = crate::timespec::format(grid.first_second * 1_000_000_000);
    let span = format!("+{} s", cols as u64 * k);
    let legend = format!("0 .. {max} samples in a cell");
    let note = if grid.coarsened() { coarsened_reason(grid) } else { String::new() };
    let width = [
        left + plot_w + 8,
        text_px(title) + 8,
        left + text_px(&start) + text_px(&span) + 16,
        left + 108 + text_px(&legend),
        left + text_px(&note) + 8,
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    let mut c = Canvas::new(width, top + plot_h + 3 * LINE_H + 12);
    c.text(4, 4, title, INK);
    for col in 0..grid.columns {
        for (r, &v) in grid.column(col).iter().enumerate() {
            c.fill(left + col * CELL, top + (rows - 1 - r) * CELL, CELL, CELL, color(u64::from(v), u64::from(max)));
        }
    }
    // The axes: a line left of and below the cells, the offsets beside them.
    c.fill(left - 2, top, 1, plot_h + 2, INK);
    c.fill(left - 2, top + plot_h + 1, plot_w + 2, 1, INK);
    c.text_right(left - 4, top, "1 s", INK);
    c.text_right(left - 4, top + plot_h / 2 - 4, "500 ms", INK);
    c.text_right(left - 4, top + plot_h - 8, "0 ms", INK);
    let below = top + plot_h + 4;
    c.text(left, below, &start, INK);
    c.text_right((left + plot_w).max(left + text_px(&start) + 8 + text_px(&span)), below, &span, INK);
    // The legend: the colours from one sample to the most, then what they mean.
    let bar = below + LINE_H + 2;
    for x in 0..100u64 {
        let v = (x * u64::from(max)).div_ceil(99).max(1);
        c.fill(left + x as usize, bar, 1, 8, if max == 0 { color(0, 0) } else { color(v, u64::from(max)) });
    }
    c.text(left + 108, bar, &legend, INK);
    c.text(left, bar + LINE_H + 2, &note, INK);
    c.write_png(out)
}

/// Text for SVG/HTML: control characters (which XML 1.0 forbids, and which names can hold) made
/// visible first, then the markup characters escaped.
pub fn escape(s: &str) -> String {
    crate::untrusted::visible(s).replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
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
        let mut counts = vec![0u32; 100];
        counts[0] = 3;
        counts[49] = 1;
        counts[50 + 10] = 7;
        Grid { first_second: 1_795_000_000, rows: 50, columns: 2, seconds_per_column: 1, counts, recorded: vec![1, 1] }
    }

    fn json(grid: &Grid, first_second: bool) -> serde_json::Value {
        let mut out = Vec::new();
        write_json_with(grid, first_second, &mut out).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn flamescope_layout() {
        let f = json(&grid(), false);
        assert_eq!(f["columns"], serde_json::json!([0, 1]));
        let rows = f["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 50);
        assert_eq!((rows[0].as_f64(), rows[49].as_f64()), (Some(980.0), Some(0.0)));
        // values[col][i] counts row rows[i]: offset 0 is the last entry, 980 ms the first.
        assert_eq!((f["values"][0][49].as_u64(), f["values"][0][0].as_u64()), (Some(3), Some(1)));
        assert_eq!(f["values"][1][49 - 10], 7);
        assert_eq!(f["maxvalue"], 7);
        let keys: Vec<_> = f.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, vec!["columns", "maxvalue", "rows", "values"]);
        // Written as serde writes the same numbers (FlameScope's readers see identical text).
        let mut out = Vec::new();
        write_json(&grid(), &mut out).unwrap();
        assert!(String::from_utf8(out).unwrap().contains(r#""rows":[980.0,960.0,"#));
    }

    #[test]
    fn a_coarsened_grid_says_so_and_numbers_columns_in_seconds() {
        let g = Grid { seconds_per_column: 18, ..grid() };
        let f = json(&g, true);
        assert_eq!(f["columns"], serde_json::json!([0, 18]));
        assert_eq!(f["first_second"], 1_795_000_000u64);
        assert_eq!(f["coarsened"]["seconds_per_column"], 18);
        assert!(f["coarsened"]["reason"].as_str().unwrap().contains("1000000 cells"));
        assert!(json(&grid(), true).get("coarsened").is_none());
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
        write_png(&grid(), "t", &mut png).unwrap();
        assert_eq!(&png[1..4], b"PNG");
    }

    /// A two-second grid is 76 px wide; its title, with two times in it, is not clipped.
    #[test]
    fn the_picture_is_as_wide_as_its_title() {
        let title = "Subsecond heatmap, 2026-11-23T14:28:18.000Z to 2026-11-23T14:28:20.000Z";
        let mut svg = Vec::new();
        write_svg(&grid(), title, &mut svg).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        let width: usize = svg.split(r#"width=""#).nth(1).unwrap().split('"').next().unwrap().parse().unwrap();
        assert!(width >= 50 + title.len() * 7, "{width} px for a title of {} characters", title.len());
    }

    fn decode(png: &[u8]) -> (usize, usize, Vec<u8>) {
        let mut reader = png::Decoder::new(std::io::Cursor::new(png)).read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        buf.truncate(info.buffer_size());
        (info.width as usize, info.height as usize, buf)
    }

    /// The PNG says what it shows, as the SVG does: its title, the offsets beside the cells,
    /// the first second below them, and a legend running to the fullest cell's colour.
    #[test]
    fn a_png_carries_its_title_axes_and_legend() {
        use crate::export::raster::{INK, LINE_H, text_px};
        let title = "Subsecond heatmap, 2026-11-23T14:28:18.000Z to 2026-11-23T14:28:20.000Z";
        let mut png = Vec::new();
        write_png(&grid(), title, &mut png).unwrap();
        let (w, h, px) = decode(&png);
        let at = |x: usize, y: usize| [px[(y * w + x) * 3], px[(y * w + x) * 3 + 1], px[(y * w + x) * 3 + 2]];
        let inked = |x0: usize, x1: usize, y0: usize, y1: usize| (y0..y1).any(|y| (x0..x1).any(|x| at(x, y) == INK));
        // 50 rows of 4 px: the cells are 200 px high.
        assert!(w >= text_px(title) && h > 200 + 3 * LINE_H, "{w}x{h}");
        let (left, top) = (text_px("500 ms") + 8, LINE_H + 6);
        assert!(inked(4, 4 + text_px(title), 4, 12), "the title");
        assert!(inked(0, left - 4, top, top + 8), "'1 s' beside the top row");
        assert!(inked(0, left - 4, top + 200 - 8, top + 200), "'0 ms' beside the bottom row");
        let below = top + 200 + 4;
        assert!(inked(left, w, below, below + 8), "the first second below the cells");
        // The fullest cell (7 samples: second 1, 200 ms) and the legend's last colour agree.
        let fullest = color(7, 7);
        assert_eq!(at(left + 4 + 1, top + (50 - 1 - 10) * 4 + 1), fullest);
        assert_eq!(at(left + 99, below + LINE_H + 2 + 4), fullest);
    }
}
