//! The page is one answer with its style and script inside, and names nothing external.

use super::*;

#[test]
fn the_page_is_one_self_contained_answer() {
    let p = page();
    assert!(!p.contains("/*STYLE*/") && !p.contains("/*SCRIPT*/"), "a placeholder was left");
    assert!(p.contains("prefers-color-scheme: dark") && p.contains("window.profilerUI"));
    assert!(p.contains("function drawFlame("), "flame.js is part of the script");
    assert!(p.contains("function drawHeatmap("), "heatmap.js is part of the script");
    // No external asset: nothing fetched from another origin, the page works offline.
    for external in ["http://", "https://", "src=\"//", "@import"] {
        assert!(!p.contains(external), "the page refers to '{external}'");
    }
}

#[test]
fn health_counts_lost_samples_and_dropped_events() {
    let l = metrics::Live::default();
    l.sampling.set(metrics::Sampling { events_lost: 2, events_dropped: 3, sampled_cpus: 4, ..Default::default() });
    let per_cpu = [(0, (10, 5, 7)), (1, (10, 5, 1))].into();
    l.pipeline.set(crate::pipeline::Figures { per_cpu, ..Default::default() });
    let h = health(&l);
    assert_eq!(h["lost_samples"], 8);
    assert_eq!(h["events_lost"], 5);
    assert_eq!(h["sampled_cpus"], 4);
}

#[test]
fn the_flamegraph_offers_every_kind_of_count_with_its_label() {
    let p = page();
    assert!(p.contains(r#"<select id="samples">"#), "the selector beside the flamegraph");
    for kind in crate::model::SampleKind::ALL {
        let option = format!(r#"<option value="{}">{}</option>"#, kind.name(), kind.label());
        assert!(p.contains(&option), "missing {option}");
        // The page's units for a tree that names none (a report's) are the server's.
        assert!(p.contains(&format!(r#""{}": "{}""#, kind.name(), kind.unit())) || kind.name() == "cpu");
    }
    assert!(p.contains(r#"UNITS = { cpu: "samples","#));
    // Sent with the flamegraph's request and kept in the address; the heatmap stays CPU.
    assert!(p.contains("q.samples = kind") && p.contains(r#"p.set("samples""#));
    assert!(p.contains(r#"get("/api/heatmap")"#));
}

#[test]
fn the_page_has_a_process_s_thread_timeline_under_the_heatmap() {
    let p = page();
    assert!(p.contains("function drawThreads("), "timeline.js is part of the script");
    assert!(p.contains(r#"<input id="tl-pid""#) && p.contains(r#"get("/api/threads""#));
    // On the heatmap's time axis (X), kept in the address, reloaded with the window.
    assert!(p.contains(r#"p.set("threads", tlPid())"#) && p.contains("loadThreads();"));
    for state in ["--tl-running", "--tl-runnable", "--tl-io", "--tl-sleep"] {
        assert!(p.contains(&format!("{state}:")), "{state} has a colour in both themes' root");
    }
}
