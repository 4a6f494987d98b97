//! Renders folded stacks: as text (Brendan Gregg's folded format) or as an inferno SVG.

use std::io::Write;

use crate::{model::SampleKind, query::Folded};

use super::ExportError as RenderError;

/// `comm;frame;frame count` lines, sorted.
pub fn write_folded(folded: &Folded, mut out: impl Write) -> Result<(), RenderError> {
    for line in folded.lines() {
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    Ok(())
}

/// inferno's image width and its title's font size (its font size + 5): a longer title or
/// subtitle would run off the picture.
const IMAGE_WIDTH: usize = 1200;
const TITLE_CHARS: usize = IMAGE_WIDTH / 11;
const SUBTITLE_CHARS: usize = IMAGE_WIDTH / 7;

/// `text` made visible and cut to `max` characters, with an ellipsis when cut.
fn fit(text: &str, max: usize) -> String {
    let text = crate::untrusted::visible(text);
    if text.chars().count() <= max {
        return text.into_owned();
    }
    text.chars().take(max - 1).chain(['…']).collect()
}

/// What a frame's tooltip counts for `kind`, and the factor its counts are shown with: time
/// (stored in µs) in milliseconds, so that a tooltip reads "9,117 ms blocked", not "samples".
pub fn tooltip_unit(kind: SampleKind) -> (&'static str, f64) {
    match kind {
        SampleKind::Cpu => ("samples", 1.0),
        SampleKind::CudaLaunches => ("launches", 1.0),
        SampleKind::CudaSync => ("ms blocked", 1e-3),
        SampleKind::CudaCopies => ("bytes", 1.0),
        SampleKind::OffCpu => ("ms off CPU", 1e-3),
    }
}

/// A window's total of `kind` for a subtitle: time in seconds (`9.12 s blocked`), counts as
/// they are (`4,000 launches`).
pub fn total_text(kind: SampleKind, total: u64) -> String {
    match kind {
        SampleKind::CudaSync => format!("{:.2} s blocked", total as f64 / 1e6),
        SampleKind::OffCpu => format!("{:.2} s off CPU", total as f64 / 1e6),
        _ => format!("{total} {}", kind.unit()),
    }
}

/// An interactive SVG flamegraph of CPU samples. Colours are derived from frame names
/// (inferno's `hash` mode), so the same input always gives the same picture.
pub fn write_svg(folded: &Folded, title: &str, subtitle: &str, out: impl Write) -> Result<(), RenderError> {
    write_svg_of(SampleKind::Cpu, folded, title, subtitle, out)
}

/// As [`write_svg`], its tooltips counting what `kind` counts.
pub fn write_svg_of(
    kind: SampleKind,
    folded: &Folded,
    title: &str,
    subtitle: &str,
    out: impl Write,
) -> Result<(), RenderError> {
    let lines = folded.lines();
    let mut options = inferno::flamegraph::Options::default();
    options.image_width = Some(IMAGE_WIDTH);
    options.title = fit(title, TITLE_CHARS);
    options.subtitle = Some(fit(subtitle, SUBTITLE_CHARS));
    options.hash = true;
    options.deterministic = true;
    let (count_name, factor) = tooltip_unit(kind);
    options.count_name = count_name.into();
    options.factor = factor;
    // Callers reject empty input first: inferno would write an error picture instead.
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)?;
    Ok(())
}

/// A differential flamegraph: the shape of `after`, coloured by how each frame changed since
/// `baseline` (red: more, blue: less), counts normalised so a busier window is not all red.
pub fn write_diff_svg(
    kind: SampleKind,
    baseline: &Folded,
    after: &Folded,
    title: &str,
    subtitle: &str,
    out: impl Write,
) -> Result<(), RenderError> {
    let join = |f: &Folded| f.lines().join("\n").into_bytes();
    let mut diff = Vec::new();
    let opts = inferno::differential::Options { normalize: true, ..Default::default() };
    inferno::differential::from_readers(opts, &join(baseline)[..], &join(after)[..], &mut diff)?;
    let text = String::from_utf8_lossy(&diff);
    let mut options = inferno::flamegraph::Options::default();
    options.image_width = Some(IMAGE_WIDTH);
    options.title = fit(title, TITLE_CHARS);
    options.subtitle = Some(fit(subtitle, SUBTITLE_CHARS));
    let (count_name, factor) = tooltip_unit(kind);
    options.count_name = count_name.into();
    options.factor = factor;
    options.deterministic = true;
    inferno::flamegraph::from_lines(&mut options, text.lines(), out)?;
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
    fn differential_svg_colours_what_grew_red_and_what_shrank_blue() {
        let mut before = sample();
        before.stacks.insert("app;main;spin".into(), 1);
        let mut out = Vec::new();
        write_diff_svg(SampleKind::Cpu, &before, &sample(), "t", "s", &mut out).unwrap();
        let svg = String::from_utf8(out).unwrap();
        // Normalised: spin grew from 25 % to 70 % of the samples (red), the read shrank (blue).
        let fill_after = |title: &str| {
            let at = svg.find(title).unwrap_or_else(|| panic!("{title} in {svg}"));
            let rest = &svg[at..];
            let fill = &rest[rest.find("fill=\"rgb(").unwrap() + 10..];
            let rgb: Vec<u32> = fill[..fill.find(')').unwrap()].split(',').map(|v| v.parse().unwrap()).collect();
            (rgb[0], rgb[2])
        };
        let (r, b) = fill_after("<title>spin (7 samples, 70.00%; +50.00%)</title>");
        assert!(r > b, "spin grew: red, not rgb({r},_,{b})");
        let (r, b) = fill_after("<title>ksys_read (3 samples, 30.00%; -40.00%)</title>");
        assert!(b > r, "ksys_read shrank: blue, not rgb({r},_,{b})");
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

    #[test]
    fn hostile_titles_and_frames_keep_the_svg_valid_xml() {
        let evil = "evil\x1b[31m\x07\r\n<&>\u{1}";
        let mut f = Folded::default();
        let frame = crate::untrusted::folded_frame(evil, true);
        f.stacks.insert(format!("{frame};spin"), 5);
        for diff in [false, true] {
            let mut out = Vec::new();
            if diff {
                write_diff_svg(SampleKind::Cpu, &f, &f, evil, evil, &mut out).unwrap();
            } else {
                write_svg(&f, evil, evil, &mut out).unwrap();
            }
            let svg = String::from_utf8(out).unwrap();
            // inferno's SVG names the SVG 1.1 DTD.
            let opt = roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() };
            let doc = roxmltree::Document::parse_with_options(&svg, opt)
                .unwrap_or_else(|e| panic!("invalid XML ({e}): {svg}"));
            let texts: String = doc.descendants().filter_map(|n| n.text()).collect();
            assert!(texts.contains("evil\\x1b[31m\\x07\\r\\n<&>\\x01"), "{texts}");
        }
    }

    /// A finding's summary as a title is longer than the picture is wide: it is cut to fit.
    #[test]
    fn long_titles_are_cut_to_the_picture() {
        let long = "CPU 1 saturated ".repeat(20);
        let mut out = Vec::new();
        write_svg(&sample(), &long, &long, &mut out).unwrap();
        let svg = String::from_utf8(out).unwrap();
        assert!(svg.contains(&format!("{}…", &long[..TITLE_CHARS - 1])), "{svg}");
        assert!(!svg.contains(long.trim_end()), "the whole title would run off the picture");
        assert!(svg.contains(r#"width="1200""#));
    }

    /// inferno reads a folded line ending in two numbers as a differential one: a name ending in
    /// ` <digits>` would lose its digits and its count. The folded rule keeps both.
    #[test]
    fn a_trailing_number_in_a_name_keeps_its_count() {
        let mut f = Folded::default();
        let (comm, leaf) =
            (crate::untrusted::folded_frame("app 7", true), crate::untrusted::folded_frame("x 12", true));
        f.stacks.insert(format!("{comm};main;{leaf}"), 5);
        let mut out = Vec::new();
        write_svg(&f, "t", "s", &mut out).unwrap();
        let svg = String::from_utf8(out).unwrap();
        assert!(svg.contains("x_12 (5 samples") && svg.contains("app_7 (5 samples"), "{svg}");
    }

    /// Issue 41, part 7: a CUDA flamegraph's tooltips said "samples" for launches and for
    /// microseconds blocked.
    #[test]
    fn tooltips_count_what_the_kind_counts_and_time_in_milliseconds() {
        let mut f = Folded::default();
        f.stacks.insert("python3;train_step (train.py:93);cuStreamSynchronize".into(), 9_117_218);
        let mut svg = Vec::new();
        write_svg_of(SampleKind::CudaSync, &f, "t", "s", &mut svg).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        assert!(svg.contains("<title>cuStreamSynchronize (9,117 ms blocked, 100.00%)</title>"), "{svg}");
        assert!(!svg.contains(" samples, "), "{svg}");
        let mut f = Folded::default();
        f.stacks.insert("python3;train_step (train.py:93);[gpu] vecAdd".into(), 4000);
        let mut svg = Vec::new();
        write_svg_of(SampleKind::CudaLaunches, &f, "t", "s", &mut svg).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        assert!(svg.contains("<title>[gpu] vecAdd (4,000 launches, 100.00%)</title>"), "{svg}");
        assert_eq!(total_text(SampleKind::CudaSync, 9_117_218), "9.12 s blocked");
        assert_eq!(total_text(SampleKind::CudaLaunches, 4000), "4000 launches");
    }
}
