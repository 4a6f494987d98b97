//! Exports read by the tools users open them with (issue 14 A), on a store written directly (no
//! BPF, no root): what the tool shows must be what the store holds.

use std::{path::Path, process::Command, sync::Arc};

use integration_tests::{now_secs, profiler, skip};
use profiler::{
    model::{Sample, Stack},
    store::{StoreWriter, create_and_lock, segments_dir},
};

const SEC: u64 = 1_000_000_000;

/// 2 s of samples at 99 Hz on CPUs 0 and 1 (pid 0 is the idle task, so pids start at 1),
/// ending `end`; CPU 0 runs a C++ template method.
fn store(data: &Path, end: u64) {
    let _lock = create_and_lock(data).unwrap();
    let stack = |frames: &[&str]| Arc::new(Stack::new(frames.iter().map(|f| Arc::from(*f)).collect(), frames.len()));
    let templ = stack(&["main", "Scoped<T>::set"]);
    let other = stack(&["main", "other_work"]);
    let mut w = StoreWriter::new(&segments_dir(data));
    let mut ts = end - 2 * SEC;
    while ts < end {
        for cpu in 0..2u32 {
            w.push(&Sample {
                ts_ns: ts,
                cpu,
                pid: 10 + cpu,
                tid: 10 + cpu,
                cgroup_id: 0,
                comm: Arc::from("app"),
                stack: if cpu == 0 { templ.clone() } else { other.clone() },
                workload: Arc::from(""),
            });
        }
        ts += SEC / 99;
    }
    w.flush(end).unwrap();
}

fn go() -> bool {
    let ok = Command::new("go").arg("version").output().is_ok_and(|o| o.status.success());
    ok || skip("`go tool pprof` is needed: `apt-get install golang-go` (cargo xtask test installs it)")
}

#[test]
fn go_tool_pprof_focuses_on_cpu_0_keeps_template_names_and_the_window() {
    if !go() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let end = (now_secs() as u64 - 60) * SEC;
    store(&data, end);
    // A 10 s window around 2 s of samples.
    let (from, to) = (((end - 6 * SEC) / SEC).to_string(), ((end + 4 * SEC) / SEC).to_string());
    let pb = tmp.path().join("p.pb.gz");
    let out = profiler(&[
        "export",
        "--data-dir",
        data.to_str().unwrap(),
        "--from",
        &from,
        "--to",
        &to,
        "--format",
        "pprof",
        "-o",
        pb.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let pprof = |args: &[&str]| {
        let out = Command::new("go").args(["tool", "pprof"]).args(args).arg(&pb).output().unwrap();
        assert!(out.status.success(), "go tool pprof {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    };
    let cpu0 = pprof(&["-tagfocus=cpu=0", "-top"]);
    assert!(!cpu0.contains("matched no samples"), "cpu=0 must match CPU 0's samples:\n{cpu0}");
    assert!(cpu0.contains("Scoped<T>::set") && !cpu0.contains("other_work"), "CPU 0 only, names whole:\n{cpu0}");
    assert!(pprof(&["-top"]).contains("Duration: 10s"), "the window's duration:\n{}", pprof(&["-top"]));
}
