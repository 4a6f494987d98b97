//! Hostile names on the real kernel (issue 14, E1-E3 and E12): a helper whose threads are named
//! with ESC, BEL, CR, LF, tab, `;`, trailing numbers and a fake kernel mark spins on one CPU in
//! functions named the same way, until the saturated-core detector names it in a finding. Then
//! every output is read back by its real parser (inferno's collapse-perf and flamegraph, an XML
//! parser for SVG, JSON for speedscope) and checked for raw control bytes in text outputs.

use std::{
    io::Read,
    os::unix::fs::PermissionsExt,
    process::{Command, Stdio},
    time::Duration,
};

use inferno::collapse::{Collapse, perf};
use integration_tests::{Daemon, Kill, bin, now_secs, privileged, profiler, wait_for};
use serde_json::Value;

/// The helper's thread names (see tests/src/bin/hostile-names.rs).
const COMMS: [&str; 5] = ["\x1b[31mE\x07\r\n;x 12", "t\tab;c 5", "\x07x_[k]", "a\nb 7", "\x1b]0;pwn\x07"];

/// Raw control bytes other than the line feed that ends each line.
fn controls(text: &str) -> Vec<char> {
    text.chars().filter(|&c| c.is_control() && c != '\n').collect()
}

fn run_ok(args: &[&str]) -> Vec<u8> {
    let out = profiler(args);
    assert!(out.status.success(), "profiler {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

fn svg_doc(svg: &str) {
    let opt = roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() };
    if let Err(e) = roxmltree::Document::parse_with_options(svg, opt) {
        panic!("an SVG is not valid XML ({e})");
    }
}

/// Folded lines: every frame kept (none split by a name), only kernel frames marked kernel.
fn check_folded(text: &str, what: &str) -> u64 {
    assert!(controls(text).is_empty(), "{what}: raw control characters {:?}", controls(text));
    let mut hostile = 0;
    for line in text.lines() {
        let (stack, count) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{what}: no count in {line:?}"));
        let count: u64 = count.parse().unwrap_or_else(|_| panic!("{what}: bad count in {line:?}"));
        let frames: Vec<&str> = stack.split(';').collect();
        // Kernel frames are the leaf end of a stack: a `_[k]` frame above a user frame is a fake.
        let first_kernel = frames.iter().position(|f| f.ends_with("_[k]")).unwrap_or(frames.len());
        assert!(
            frames[first_kernel..].iter().all(|f| f.ends_with("_[k]")),
            "{what}: a user frame reads as kernel in {line:?}"
        );
        if frames.iter().any(|f| f.contains("evil:name_{k}") || f.contains("spin\\x1b[2J\\nfake_12")) {
            hostile += count;
        }
    }
    hostile
}

#[test]
fn hostile_names_stay_well_formed_in_every_output() {
    if !privileged("hostile_names_stay_well_formed_in_every_output") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // The detector fires on the helper's CPU whatever the other CPUs do (other tests may load
    // them): the machine-wide bound is lifted. Five seconds, so that the helper's threads (every
    // name holds a control character) are the top of the finding's list.
    let config = tmp.path().join("profiler.toml");
    std::fs::write(&config, "[detect]\nmachine_busy_max = 1.0\nsaturated_secs = 5\nsaturated_kernel_min = 0.0\n")
        .unwrap();
    let mut daemon = Daemon::start(&data, &["--config", config.to_str().unwrap(), "--listen", "off"]);
    daemon.wait_ready();
    let dir = data.to_str().unwrap();
    let cpu = if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 { 1 } else { 0 };
    let start = now_secs();
    let _helper = Kill(
        Command::new(bin("hostile-names"))
            .args([&cpu.to_string(), "60"])
            .stdout(Stdio::null())
            .spawn()
            .expect("hostile-names"),
    );

    // A finding naming one of the hostile threads (raw in JSON, which escapes it).
    let finding = wait_for("a saturated-core finding naming a hostile comm", Duration::from_secs(45), || {
        let out = profiler(&["findings", "--data-dir", dir, "--from", "-5m", "--format", "json"]);
        let list: Vec<Value> = serde_json::from_slice(&out.stdout).ok()?;
        list.into_iter().find(|f| {
            f["kind"] == "saturated-core" && COMMS.iter().any(|c| f["summary"].as_str().unwrap_or("").contains(c))
        })
    });
    eprintln!("finding after {:.1} s: {}", now_secs() - start, finding["summary"]);
    // Samples of the hostile functions have reached the store.
    let from = format!("{start:.3}");
    wait_for("the hostile functions in a flamegraph", Duration::from_secs(20), || {
        let out = profiler(&["flamegraph", "--data-dir", dir, "--from", &from, "--format", "folded"]);
        (check_folded(&String::from_utf8_lossy(&out.stdout), "flamegraph folded") > 0).then_some(())
    });
    let to = format!("{:.3}", now_secs());
    let window = ["--data-dir", dir, "--from", &from, "--to", &to];
    let with = |extra: &[&'static str]| -> Vec<String> {
        window.iter().map(|s| s.to_string()).chain(extra.iter().map(|s| s.to_string())).collect()
    };
    let run = |args: Vec<String>| run_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());

    // E1: human text outputs show control characters as escapes.
    let text = String::from_utf8(run_ok(&["findings", "--data-dir", dir, "--from", "-5m"])).unwrap();
    assert!(controls(&text).is_empty(), "findings text: raw {:?} in\n{text}", controls(&text));
    assert!(["\\x1b", "\\x07", "\\t", "\\n"].iter().any(|e| text.contains(e)), "escapes shown: {text}");
    let status = String::from_utf8(run_ok(&["status", "--data-dir", dir])).unwrap();
    assert!(controls(&status).is_empty(), "status: {status}");

    // E3/E12: folded (ours, read as inferno reads it) and perf script through collapse-perf.
    let mut a = vec!["flamegraph".to_string()];
    a.extend(with(&["--format", "folded"]));
    let folded = String::from_utf8(run(a)).unwrap();
    assert!(check_folded(&folded, "flamegraph folded") > 0);
    let mut a = vec!["export".to_string()];
    a.extend(with(&["--format", "folded"]));
    assert!(check_folded(&String::from_utf8(run(a)).unwrap(), "export folded") > 0);
    let mut a = vec!["export".to_string()];
    a.extend(with(&["--format", "perf-script"]));
    let script = run(a);
    let records = String::from_utf8_lossy(&script)
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('\t'))
        .count() as u64;
    assert!(controls(&String::from_utf8_lossy(&script)).iter().all(|&c| c == '\t'), "perf-script: raw controls");
    let mut opt = perf::Options::default();
    opt.annotate_kernel = true;
    let mut collapsed = Vec::new();
    perf::Folder::from(opt).collapse(&script[..], &mut collapsed).unwrap();
    let collapsed = String::from_utf8(collapsed).unwrap();
    check_folded(&collapsed, "inferno-collapse-perf");
    let total: u64 = collapsed.lines().filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok()).sum();
    // Each record weighs its period, as perf's own output does (cpu-clock ns: 10101010 at 99 Hz).
    let period: u64 = String::from_utf8_lossy(&script)
        .lines()
        .find_map(|l| l.strip_suffix(" cpu-clock: ")?.rsplit_once(": ")?.1.parse().ok())
        .expect("an event line with its period");
    assert_eq!(period, 1_000_000_000 / 99, "the period of 99 Hz");
    assert_eq!(total, records * period, "inferno-collapse-perf reads one sample per record");
    assert!(collapsed.contains("evil:name_{k}"), "the hostile function reaches collapse-perf");

    // Structured formats keep names exactly (JSON escapes them).
    let mut a = vec!["export".to_string()];
    a.extend(with(&["--format", "speedscope"]));
    let v: Value = serde_json::from_slice(&run(a)).expect("speedscope JSON");
    let frames: Vec<&str> =
        v["shared"]["frames"].as_array().unwrap().iter().filter_map(|f| f["name"].as_str()).collect();
    assert!(frames.contains(&"evil;name_{k}"), "{frames:?}");
    assert!(frames.iter().all(|f| !f.ends_with("_[k]") && (!f.ends_with(" [k]") || !f.contains("evil"))));
    let profiles: Vec<&str> = v["profiles"].as_array().unwrap().iter().filter_map(|p| p["name"].as_str()).collect();
    assert!(profiles.iter().any(|p| COMMS.iter().any(|c| p.starts_with(c))), "{profiles:?}");
    let mut a = vec!["export".to_string()];
    a.extend(with(&["--format", "pprof"]));
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&run(a)[..]).read_to_end(&mut raw).expect("pprof is gzip");
    assert!(raw.windows(13).any(|w| w == b"evil;name_{k}"), "the hostile name in pprof's string table");

    // E2: SVG flamegraph and the report's images are valid XML.
    let mut a = vec!["flamegraph".to_string()];
    a.extend(with(&["--format", "svg"]));
    svg_doc(&String::from_utf8(run(a)).unwrap());
    let id = finding["id"].as_str().unwrap();
    let mut a = vec!["flamegraph".to_string(), "--data-dir".into(), dir.into(), "--around".into(), id.into()];
    a.extend(["--format".to_string(), "svg".into()]);
    svg_doc(&String::from_utf8(run(a)).unwrap());
    let report = tmp.path().join("report.html");
    run_ok(&["report", "--data-dir", dir, "--from", "-5m", "-o", report.to_str().unwrap()]);
    let mode = std::fs::metadata(&report).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "report files are root-only");
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(controls(&html).is_empty(), "report: raw {:?}", controls(&html));
    // The report is the page with its data as a script: no name may end the script element,
    // and the data reads back whole (the hostile names in it, escaped).
    let start = html.find("window.PROFILER_REPORT = ").expect("the report's data") + "window.PROFILER_REPORT = ".len();
    let end = start + html[start..].find(";\n").expect("the end of the report's data");
    let data = &html[start..end];
    assert!(!data.contains("</") && !data.contains("<!--"), "a name could end the report's script");
    // (Read as text: flamegraph trees nest deeper than serde_json's recursion limit.)
    assert!(data.starts_with('{') && data.ends_with("]}"), "the report's data is one object");
    let flamegraphs = data.split_once("\"flamegraphs\":[").expect("flamegraphs").1;
    assert!(flamegraphs.matches("{\"caption\":").count() >= 2, "the window's and the finding's flamegraphs");
    assert!(flamegraphs.contains("evil:name_{k}"), "the hostile function is in the report's flamegraphs");

    // -o never writes through a planted symlink.
    let victim = tmp.path().join("victim");
    std::fs::write(&victim, "keep").unwrap();
    let link = tmp.path().join("out.svg");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let mut a = vec!["flamegraph".to_string()];
    a.extend(with(&["--format", "svg", "-o"]));
    a.push(link.to_str().unwrap().into());
    let out = profiler(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("symbolic link"));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");

    // E1 in logs: the finding's line did not forge lines or carry escapes.
    let log = daemon.log_text();
    assert!(controls(&log).is_empty(), "daemon log: raw {:?}", controls(&log));
    assert!(log.lines().all(|l| l.len() > 24 && l.as_bytes()[4] == b'-'), "every log line starts with a time:\n{log}");
    assert!(daemon.stop().success());
}
