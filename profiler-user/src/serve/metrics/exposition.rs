//! Prometheus' text exposition format: a family's HELP and TYPE lines and its series, and label
//! values escaped as the format takes them.

use std::fmt::Write;

/// One metric family in the exposition format: its HELP and TYPE lines, then a line per series.
pub fn write_family(out: &mut String, name: &str, kind: &str, help: &str, values: Vec<(String, f64)>) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, v) in values {
        let _ = writeln!(out, "{name}{labels} {v}");
    }
}

/// A label value as the text format takes it: backslash, double quote and line feed escaped.
pub fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}
