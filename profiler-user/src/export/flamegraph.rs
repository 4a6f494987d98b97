//! Renders folded stacks: as text (Brendan Gregg's folded format) or as an inferno SVG.

use std::io::Write;

use crate::query::Folded;

use super::ExportError as RenderError;

/// `comm;frame;frame count` lines, sorted.
pub fn write_folded(folded: &Folded, mut out: impl Write) -> Result<(), RenderError> {
    for line in folded.lines() {
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    Ok(())
}

/// An interactive SVG flamegraph. Colours are derived from frame names (inferno's `hash`
/// mode), so the same input always gives the same picture.
pub fn write_svg(folded: &Folded, title: &str, subtitle: &str, out: impl Write) -> Result<(), RenderError> {
    let lines = folded.lines();
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_string();
    options.subtitle = Some(subtitle.to_string());
    options.hash = true;
    options.deterministic = true;
    options.count_name = "samples".into();
    // Callers reject empty input first: inferno would write an error picture instead.
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Folded {
        let mut f = Folded::default();
        f.stacks.insert("app;main;spin".into(), 7);
        f.stacks.insert("app;main;read;ksys_read_[k]".into(), 3);
        f
    }

    #[test]
    fn folded_is_sorted_with_counts() {
        let mut out = Vec::new();
        write_folded(&sample(), &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "app;main;read;ksys_read_[k] 3\napp;main;spin 7\n");
    }

    #[test]
    fn svg_is_deterministic_and_names_frames() {
        let render = || {
            let mut out = Vec::new();
            write_svg(&sample(), "t", "s", &mut out).unwrap();
            String::from_utf8(out).unwrap()
        };
        let a = render();
        // inferno reads the `_[k]` annotation: it colours the frame as kernel and drops the suffix.
        assert!(a.contains("<svg") && a.contains("spin (7 samples") && a.contains("ksys_read (3 samples"));
        assert_eq!(a, render());
    }
}
