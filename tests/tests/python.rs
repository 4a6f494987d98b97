//! Python frames (issue 12): CPython's own functions replace the interpreter's
//! `_PyEval_EvalFrameDefault` frames, in order with the native frames around them (a C
//! function calling back into Python: the interpreter's `sorted()`, and libc's `qsort` through
//! the `_ctypes` extension module and libffi). Each interpreter found on this machine runs
//! `workloads/nested.py` under the real daemon; the share of its samples that reach the
//! outermost Python function is measured.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use integration_tests::{Daemon, folded_window, now_secs, privileged, status_json, wait_for_every};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/workloads/nested.py");
const SECS: f64 = 3.0;
/// CPU seconds of each warm-up run.
const WARMUP_SECS: f64 = 0.5;

/// One run of the script: the interpreter's pid, and when it ran (unix seconds).
struct Run {
    pid: String,
    start: f64,
    end: f64,
}

/// CPU seconds a measured run works before its samples count: the daemon describes a new
/// process (a thread of its own, seconds late on a loaded machine) and until then walks it
/// with frame pointers alone, which the interpreters built without them do not keep.
const SETTLE_SECS: f64 = 0.5;

/// Runs the script for `settle` and then `secs` of its own CPU time; the run's window starts
/// when the script says it has settled.
fn run_script(exe: &Path, secs: f64, settle: f64) -> Run {
    use std::io::BufRead;
    let mut child = Command::new(exe)
        .arg(SCRIPT)
        .arg(secs.to_string())
        .arg(settle.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let said = lines.next().and_then(Result::ok);
    let start = now_secs();
    assert_eq!(said.as_deref(), Some("measuring"), "{} said", exe.display());
    assert!(child.wait().unwrap().success(), "{} failed", exe.display());
    Run { pid, start, end: now_secs() }
}

/// The folded stacks of a run, once every sample of it is in the store (a debug daemon on a
/// loaded machine is seconds behind the ring: 20 s measured under the lock hammer's load), and
/// at least 40 % of the `secs` x 99 expected.
fn samples_of(data: &Path, daemon: &mut Daemon, run: &Run, secs: f64) -> Vec<(String, u64)> {
    let (dir, pid) = (data.to_str().unwrap(), &run.pid);
    // What the polls see, now and then, so that a timeout says why.
    let mut polls = 0u32;
    wait_for_every("the interpreter's samples", Duration::from_secs(90), Duration::from_millis(500), || {
        polls += 1;
        // A daemon that died (a panic in its pipeline did, reading a torn-down frame) writes
        // no more: say so at once, with its log.
        if let Some(Ok(Some(status))) = daemon.child.as_mut().map(|c| c.try_wait()) {
            let log = daemon.log_text();
            let tail: Vec<&str> = log.lines().filter(|l| !l.contains("DEBUG")).collect();
            panic!("the daemon exited ({status}):\n{}", tail[tail.len().saturating_sub(40)..].join("\n"));
        }
        let written = status_json(data).and_then(|s| s["summary"]["span"][1].as_u64()).unwrap_or(0) as f64 / 1e9;
        let answer =
            (written > run.end + 1.0).then(|| folded_window(dir, run.start, run.end + 0.5, &["--pid", pid, "--lines"]));
        if polls.is_multiple_of(20) {
            let seen = answer.as_ref().map(|a| a.as_ref().map(|s| s.iter().map(|(_, n)| n).sum::<u64>()));
            eprintln!("pid {pid}: store written to {:.1} s after the run, {seen:?} samples", written - run.end);
        }
        let stacks = answer?.ok()?;
        let total: u64 = stacks.iter().map(|(_, n)| n).sum();
        (total as f64 >= secs * 99.0 * 0.4).then_some(stacks)
    })
}

/// Samples walked Python → _ctypes → libffi → libc's qsort (no frame pointers) → libffi →
/// Python.
fn through_libc(stacks: &[(String, u64)]) -> u64 {
    let position = |f: &[&str], name: &str| f.iter().position(|x| x.starts_with(name));
    stacks
        .iter()
        .filter(|(s, _)| {
            let f: Vec<&str> = s.split(';').collect();
            let qsort = f.iter().position(|x| x.contains("qsort") || x.contains("msort"));
            matches!(
                (position(&f, "sort_through_libc ("), qsort, position(&f, "compare_in_python (")),
                (Some(a), Some(b), Some(c)) if a < b && b < c
            )
        })
        .map(|(_, n)| n)
        .sum()
}

/// Interpreters to try: the first `python3` on PATH and Debian's, which must exist, then
/// other CPython versions installed under pyenv, if any.
fn interpreters() -> Vec<(PathBuf, bool)> {
    let on_path = Command::new("sh").args(["-c", "command -v python3"]).output().unwrap();
    let on_path = PathBuf::from(String::from_utf8_lossy(&on_path.stdout).trim());
    let mut v = vec![(on_path, true), (PathBuf::from("/usr/bin/python3"), true)];
    let home = std::env::var("HOME").unwrap_or_default();
    for minor in ["3.9", "3.10", "3.12", "3.13"] {
        let dir = PathBuf::from(format!("{home}/.pyenv/versions"));
        let found = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join(format!("bin/python{minor}")))
            .find(|p| p.exists());
        if let Some(p) = found {
            v.push((p, false));
        }
    }
    v
}

#[test]
fn python_functions_replace_the_interpreter_frames() {
    if !privileged("python_functions_replace_the_interpreter_frames") {
        return;
    }
    let (_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&["--listen", "off"]);
    let mut failures = Vec::new();
    for (python, required) in interpreters() {
        if !python.exists() {
            assert!(!required, "{} is missing", python.display());
            continue;
        }
        let version = Command::new(&python).arg("--version").output().unwrap();
        let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
        // By pid: other Python processes may run on the machine. pyenv's `python3` is a shell
        // shim that runs the interpreter in a child: the interpreter itself is started.
        let exe = Command::new(&python).args(["-c", "import sys; print(sys.executable)"]).output().unwrap();
        let exe = PathBuf::from(String::from_utf8_lossy(&exe.stdout).trim());
        // The daemon compiles the unwind tables of the files a new interpreter maps (its
        // libpython; _ctypes and libffi, which `import ctypes` loads) on a thread at nice 10: on
        // a loaded machine that takes seconds, and until then the samples stop at the first
        // frame without a table (no walk through qsort in a whole 3 s run, seen under load).
        // Short runs until one walks through libc's qsort: then the tables are in place, and
        // the measured run says how the interpreter's stacks come out.
        let deadline = std::time::Instant::now() + Duration::from_secs(180);
        let mut warmups = 0;
        loop {
            warmups += 1;
            let warm = run_script(&exe, WARMUP_SECS, 0.0);
            let stacks = samples_of(&data, &mut daemon, &warm, WARMUP_SECS);
            if through_libc(&stacks) > 0 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{} ({version}): no walk through libc's qsort after {warmups} warm-up runs, e.g. {:?}",
                exe.display(),
                stacks.first()
            );
        }
        // SECS of the script's own CPU time (however loaded the machine is): about SECS x 99
        // samples.
        let run = run_script(&exe, SECS, SETTLE_SECS);
        let stacks = samples_of(&data, &mut daemon, &run, SECS);
        let total: u64 = stacks.iter().map(|(_, n)| n).sum();
        let frames = |s: &str| s.split(';').map(str::to_string).collect::<Vec<_>>();
        let position = |f: &[String], name: &str| f.iter().position(|x| x.starts_with(name));
        let reach: u64 = stacks.iter().filter(|(s, _)| s.contains(";outer_loop (")).map(|(_, n)| n).sum();
        // C between Python frames: sorted() calls the key function back through list_sort
        // (named where the interpreter has symbols; Debian's is stripped and has no debug file
        // here, so its frames read `python3.11+0x…`): native frames only, in between.
        let interleaved: u64 = stacks
            .iter()
            .filter(|(s, _)| {
                let f = frames(s);
                match (position(&f, "sort_through_c ("), position(&f, "weigh_item (")) {
                    (Some(a), Some(c)) if a + 1 < c => f[a + 1..c].iter().all(|x| !x.ends_with(')')),
                    _ => false,
                }
            })
            .map(|(_, n)| n)
            .sum();
        let through_libc = through_libc(&stacks);
        // 3.11+: the line a frame runs (weigh_item's loop body), before: the function's first.
        let minor: u32 = version.split('.').nth(1).and_then(|m| m.parse().ok()).unwrap_or(0);
        let lines = weigh_item_lines(&stacks);
        let (def, body) = weigh_item_source_lines();
        let in_body: u64 = lines.iter().filter(|(l, _)| body.contains(l)).map(|(_, n)| n).sum();
        let at_def: u64 = lines.iter().filter(|(l, _)| *l == def).map(|(_, n)| n).sum();
        let all: u64 = lines.iter().map(|(_, n)| n).sum();
        let lines_ok = if minor >= 11 { in_body as f64 >= 0.9 * all as f64 } else { at_def == all };
        if !lines_ok || all == 0 {
            failures.push(format!(
                "{} ({version}): weigh_item lines {lines:?} (def {def}, body {body:?})",
                python.display()
            ));
        }
        let share = reach as f64 / total as f64;
        eprintln!(
            "{} ({version}): {:.1} % of {total} samples reach outer_loop; {interleaved} show weigh_item called back by \
             sorted() in C, {through_libc} compare_in_python called back by libc's qsort (after {warmups} warm-up \
             runs)",
            python.display(),
            share * 100.0
        );
        if share < 0.9 || interleaved == 0 || through_libc == 0 {
            let example = stacks.iter().find(|(s, _)| !s.contains(";outer_loop (")).map(|(s, _)| s.clone());
            failures.push(format!(
                "{} ({version}): {:.1} % reach outer_loop, e.g. {example:?}",
                python.display(),
                share * 100.0
            ));
        }
    }
    let log = daemon.log_text();
    assert!(daemon.stop().success());
    if !failures.is_empty() {
        eprintln!(
            "daemon log:\n{}",
            log.lines().filter(|l| !l.contains("DEBUG mapping")).collect::<Vec<_>>().join("\n")
        );
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The lines weigh_item frames are at, with their sample counts.
fn weigh_item_lines(stacks: &[(String, u64)]) -> Vec<(u32, u64)> {
    let mut lines = std::collections::BTreeMap::new();
    for (s, n) in stacks {
        for f in s.split(';').filter(|f| f.starts_with("weigh_item (")) {
            if let Some(line) = f.trim_end_matches(')').rsplit(':').next().and_then(|l| l.parse().ok()) {
                *lines.entry(line).or_default() += n;
            }
        }
    }
    lines.into_iter().collect()
}

/// weigh_item's `def` line and the lines of its body, from the script itself.
fn weigh_item_source_lines() -> (u32, std::ops::RangeInclusive<u32>) {
    let text = std::fs::read_to_string(SCRIPT).unwrap();
    let def = text.lines().position(|l| l.starts_with("def weigh_item(")).expect("weigh_item in the script") as u32 + 1;
    (def, def + 1..=def + 4)
}
