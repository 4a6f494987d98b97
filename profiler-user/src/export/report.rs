//! `profiler report`: one self-contained HTML file (no network, no external assets) with the
//! heatmap, CPU x time, findings, events and the flamegraph of each finding's window — what
//! someone attaches to an incident ticket. Flamegraphs are embedded as SVG images, so each
//! keeps its own ids and the page runs no script.

use std::io::Write;

use base64::Engine as _;

use super::{ExportError, heatmap::escape};
use crate::{collect::kmsg::Event, detect::Finding, timespec};

pub struct Report {
    pub title: String,
    pub from_ns: u64,
    pub to_ns: u64,
    /// PNG: a heatmap of hours has hundreds of thousands of cells, too many for SVG.
    pub heatmap_png: Vec<u8>,
    pub cputime_svg: Vec<u8>,
    pub findings: Vec<Finding>,
    pub events: Vec<Event>,
    /// (caption, SVG)
    pub flamegraphs: Vec<(String, Vec<u8>)>,
}

fn image(svg: &[u8], alt: &str) -> String {
    embed(svg, "image/svg+xml", alt)
}

fn embed(bytes: &[u8], mime: &str, alt: &str) -> String {
    format!(
        r#"<img alt="{}" style="max-width:100%" src="data:{mime};base64,{}">"#,
        escape(alt),
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

pub fn write_html(r: &Report, mut out: impl Write) -> Result<(), ExportError> {
    writeln!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>",
        escape(&r.title)
    )?;
    writeln!(
        out,
        "<style>body{{font:13px sans-serif;margin:16px;color:#222}}h2{{font-size:15px;margin-top:22px}}td,th{{padding:2px 8px;text-align:left;vertical-align:top}}</style></head><body>"
    )?;
    writeln!(out, "<h1 style=\"font-size:18px\">{}</h1>", escape(&r.title))?;
    writeln!(
        out,
        "<p>{} to {} ({})</p>",
        timespec::format(r.from_ns),
        timespec::format(r.to_ns),
        timespec::format_duration(r.to_ns - r.from_ns)
    )?;
    writeln!(out, "<h2>Findings</h2>")?;
    if r.findings.is_empty() {
        writeln!(out, "<p>None in this window.</p>")?;
    } else {
        writeln!(out, "<table><tr><th>id</th><th>severity</th><th>from</th><th>to</th><th>summary</th></tr>")?;
        for f in &r.findings {
            writeln!(
                out,
                "<tr><td>{}</td><td>{:?}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&f.id),
                f.severity,
                timespec::format(f.start_ns),
                f.end_ns.map_or("open".to_string(), timespec::format),
                escape(&f.summary)
            )?;
        }
        writeln!(out, "</table>")?;
    }
    writeln!(out, "<h2>Kernel log events</h2>")?;
    if r.events.is_empty() {
        writeln!(out, "<p>None in this window.</p>")?;
    }
    for e in &r.events {
        writeln!(
            out,
            "<div>{} &nbsp; {} &nbsp; <code>{}</code></div>",
            timespec::format(e.ts_ns),
            escape(&e.id),
            escape(&e.message)
        )?;
    }
    writeln!(
        out,
        "<h2>Subsecond heatmap (all CPUs; a column per second, offset 0 at the bottom)</h2>{}",
        embed(&r.heatmap_png, "image/png", "subsecond heatmap")
    )?;
    writeln!(out, "<h2>CPU x time (outlined: findings)</h2>{}", image(&r.cputime_svg, "CPU x time"))?;
    for (caption, svg) in &r.flamegraphs {
        writeln!(out, "<h2>{}</h2>{}", escape(caption), image(svg, caption))?;
    }
    writeln!(out, "</body></html>")?;
    Ok(())
}
