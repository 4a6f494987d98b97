//! `profiler report`: one self-contained HTML file for an incident ticket. It is the live page
//! itself (`serve::page`: the same heatmap, CPU x time, marks, counter tracks and interactive
//! flamegraph code) with the window's data embedded as `window.PROFILER_REPORT` instead of
//! fetched, so it opens offline from a file and reads as the page does. A report cannot fold
//! an arbitrary selection: it carries the flamegraphs of its whole window and of each finding's
//! window on its CPU, and the page says so for any other range. The CUDA and off-CPU counts
//! the node recorded in the window come as the whole window's flamegraph each, chosen with the
//! page's count selector as on the live page.

use std::io::Write;

use super::ExportError;
use crate::{collect::kmsg::Event, detect::Finding};

/// One precomputed flamegraph: the page's `{name, value, children}` tree of a window.
pub struct Flame {
    pub caption: String,
    pub from_ns: u64,
    pub to_ns: u64,
    /// The CPU it is of (a finding's), or every CPU.
    pub cpu: Option<u32>,
    /// What it counts (the page's `samples`: CPU samples, GPU launches, ...).
    pub samples: crate::model::SampleKind,
    /// `serve`'s tree JSON.
    pub tree: Vec<u8>,
}

pub struct Report {
    pub from_ns: u64,
    pub to_ns: u64,
    /// What `/api/status` would say of the store (meta, summary), for the page's header.
    pub status: serde_json::Value,
    /// `/api/heatmap`'s JSON of the window, all CPUs.
    pub heatmap: Vec<u8>,
    /// `/api/cputime`'s JSON of the window.
    pub cputime: serde_json::Value,
    pub findings: Vec<Finding>,
    pub events: Vec<Event>,
    /// `/api/counters`' JSON of the window.
    pub counters: serde_json::Value,
    pub flamegraphs: Vec<Flame>,
}

/// The data as a script: JSON, with `</` and `<!--` broken up so that no name ends the script
/// element, and every control character escaped (serde_json leaves DEL and C1 raw, and a
/// terminal showing the file must not get them).
fn script_safe(json: &str) -> String {
    let mut out = String::with_capacity(json.len() + 64);
    let (mut in_string, mut escaped) = (false, false);
    for c in json.chars() {
        if !in_string {
            // Between values only JSON's own punctuation and whitespace (the heatmap's JSON
            // ends with a newline): as it is.
            in_string = c == '"';
            out.push(c);
            continue;
        }
        match c {
            _ if escaped => {
                escaped = false;
                out.push(c);
            }
            '\\' => {
                escaped = true;
                out.push(c);
            }
            '"' => {
                in_string = false;
                out.push(c);
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            '/' if out.ends_with('<') => out.push_str("\\/"),
            '!' if out.ends_with('<') => out.push_str("\\u0021"),
            c => out.push(c),
        }
    }
    out
}

fn put(b: &mut Vec<u8>, v: &impl serde::Serialize) -> Result<(), ExportError> {
    serde_json::to_writer(b, v).map_err(std::io::Error::from)?;
    Ok(())
}

/// The bundle the page reads in report mode, as JSON (the heatmap and trees are spliced in as
/// the bytes they already are).
fn bundle(r: &Report) -> Result<Vec<u8>, ExportError> {
    let mut b = Vec::with_capacity(r.heatmap.len() + r.flamegraphs.iter().map(|f| f.tree.len()).sum::<usize>() + 4096);
    write!(b, "{{\"from_ns\":{},\"to_ns\":{},\"status\":", r.from_ns, r.to_ns)?;
    put(&mut b, &r.status)?;
    b.extend_from_slice(b",\"heatmap\":");
    b.extend_from_slice(&r.heatmap);
    b.extend_from_slice(b",\"cputime\":");
    put(&mut b, &r.cputime)?;
    b.extend_from_slice(b",\"findings\":");
    put(&mut b, &r.findings)?;
    b.extend_from_slice(b",\"events\":");
    put(&mut b, &r.events)?;
    b.extend_from_slice(b",\"counters\":");
    put(&mut b, &r.counters)?;
    b.extend_from_slice(b",\"flamegraphs\":[");
    for (i, f) in r.flamegraphs.iter().enumerate() {
        if i > 0 {
            b.push(b',');
        }
        write!(b, "{{\"caption\":")?;
        put(&mut b, &f.caption)?;
        write!(b, ",\"from\":{},\"to\":{},\"cpu\":", f.from_ns as f64 / 1e9, f.to_ns as f64 / 1e9)?;
        put(&mut b, &f.cpu)?;
        write!(b, ",\"samples\":\"{}\"", f.samples.name())?;
        b.extend_from_slice(b",\"tree\":");
        b.extend_from_slice(&f.tree);
        b.push(b'}');
    }
    b.extend_from_slice(b"]}");
    Ok(b)
}

/// Writes the page (`page`: `serve::page`, with its `/*DATA*/` placeholder) with the report's
/// data in it.
pub fn write_html(r: &Report, page: &str, mut out: impl Write) -> Result<(), ExportError> {
    let data = bundle(r)?;
    let data = script_safe(&String::from_utf8_lossy(&data));
    let (head, tail) = page.split_once("/*DATA*/").ok_or_else(|| {
        ExportError::Io(std::io::Error::other("the page has no /*DATA*/ placeholder for a report's data"))
    })?;
    out.write_all(head.as_bytes())?;
    out.write_all(b"window.PROFILER_REPORT = ")?;
    out.write_all(data.as_bytes())?;
    out.write_all(b";\n")?;
    out.write_all(tail.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cannot_end_the_script_or_reach_a_terminal() {
        let json = serde_json::json!({"name": "</script><!-- \u{7f}\u{9b}x\u{1b}", "q": "a\\\"</"}).to_string() + "\n";
        let safe = script_safe(&json);
        assert!(!safe.contains("</") && !safe.contains("<!--"), "{safe}");
        assert!(!safe.chars().any(|c| c.is_control() && c != '\n'), "{safe:?}");
        // Still the same value for a JavaScript (and a JSON) reader.
        let back: serde_json::Value = serde_json::from_str(&safe.replace("\\/", "/")).unwrap();
        assert_eq!(back["name"], "</script><!-- \u{7f}\u{9b}x\u{1b}");
        assert_eq!(back["q"], "a\\\"</");
        // A newline between values stays one (a \u escape is valid only inside a string).
        assert!(safe.ends_with("}\n"), "{safe:?}");
    }

    #[test]
    fn the_data_goes_where_the_page_says() {
        let r = Report {
            from_ns: 1,
            to_ns: 2,
            status: serde_json::json!({}),
            heatmap: b"{}".to_vec(),
            cputime: serde_json::json!({}),
            findings: Vec::new(),
            events: Vec::new(),
            counters: serde_json::json!({"tracks": []}),
            flamegraphs: vec![Flame {
                caption: "all".into(),
                from_ns: 0,
                to_ns: 1_500_000_000,
                cpu: Some(3),
                samples: crate::model::SampleKind::CudaLaunches,
                tree: b"{}".to_vec(),
            }],
        };
        let mut out = Vec::new();
        write_html(&r, "<script>/*DATA*/ main()</script>", &mut out).unwrap();
        let html = String::from_utf8(out).unwrap();
        assert!(html.starts_with("<script>window.PROFILER_REPORT = {\"from_ns\":1,"), "{html}");
        assert!(
            html.contains(
                "\"flamegraphs\":[{\"caption\":\"all\",\"from\":0,\"to\":1.5,\"cpu\":3,\"samples\":\"cuda-launches\",\"tree\":{}}]};\n main()"
            ),
            "{html}"
        );
        assert!(write_html(&r, "<script></script>", Vec::new()).is_err());
    }
}
