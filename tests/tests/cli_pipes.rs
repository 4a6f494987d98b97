//! Every read command writing into a pipe whose reader is gone (`profiler findings --from -30m
//! | head -1`): the output ends quietly, exit 0, no panic ("failed printing to stdout: Broken
//! pipe", exit 101 before). No root needed: a synthetic store of a few seconds, with findings.

use std::{
    os::fd::{FromRawFd, OwnedFd},
    process::{Command, Stdio},
};

use integration_tests::{now_secs, profiler_bin};
use profiler::{
    detect::{Finding, Kind, Severity},
    store::{StoreWriter, create_and_lock, format::NS_PER_SEC, segments_dir},
};

#[path = "../../profiler-user/benches/shared/synth.rs"]
#[allow(dead_code)] // each user takes part of it
mod synth;
use synth::{Rng, StackPool, Tick};

/// A pipe whose read end is already closed: any write to the other end fails with EPIPE.
fn widowed_pipe() -> OwnedFd {
    let mut fds = [0; 2];
    // SAFETY: a two-int buffer for pipe(2).
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe2");
    // SAFETY: both fds are new and owned here.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    write
}

/// Ten seconds of 2 CPUs at 99 Hz ending `end_s`, and 200 findings in them.
fn store(data: &std::path::Path, end_s: u64) {
    let lock = create_and_lock(data).expect("create the data directory");
    let mut w = StoreWriter::new(&segments_dir(data));
    let mut rng = Rng::new(28);
    let pool = StackPool::new(500, &mut rng);
    for s in end_s - 10..end_s {
        synth::second(&pool, &mut rng, s * NS_PER_SEC, 2, 99, |t| match t {
            Tick::Busy(sample) => w.push(&sample),
            Tick::Idle { ts_ns, cpu } => w.push_idle(ts_ns, cpu),
        });
    }
    w.flush(end_s * NS_PER_SEC).expect("write the synthetic seconds");
    for i in 0..200u64 {
        let start_ns = (end_s - 10) * NS_PER_SEC + i * 40_000_000;
        let f = Finding {
            id: format!("saturated-core-cpu1-{i}"),
            kind: Kind::SaturatedCore,
            start_ns,
            end_ns: Some(start_ns + NS_PER_SEC),
            cpu: Some(1),
            severity: Severity::Warning,
            summary: format!("CPU 1 saturated for 3 s, finding {i} of 200"),
            evidence: serde_json::json!({}),
        };
        profiler::detect::journal::record_finding(data, &f).expect("record a finding");
    }
    drop(lock);
}

#[test]
fn every_read_command_ends_quietly_when_its_reader_is_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let end_s = now_secs() as u64 - 5;
    store(&data, end_s);
    let dir = data.to_str().unwrap();
    let (from, to) = ((end_s - 10).to_string(), end_s.to_string());
    let window = ["--data-dir", dir, "--from", &from, "--to", &to];
    let commands: Vec<Vec<&str>> = vec![
        vec!["findings"],
        vec!["findings", "--format", "json"],
        vec!["events"],
        vec!["status"],
        vec!["status", "--format", "json"],
        vec!["counters"],
        vec!["flamegraph", "--format", "folded"],
        vec!["flamegraph"],
        vec!["heatmap", "--format", "csv"],
        vec!["cputime", "--format", "json"],
        vec!["export", "--format", "perf-script"],
        vec!["export", "--format", "pprof"],
    ];
    let mut failures = Vec::new();
    for command in commands {
        let mut args = command.clone();
        // status takes no window.
        args.extend_from_slice(if command[0] == "status" { &window[..2] } else { &window[..] });
        let out = Command::new(profiler_bin())
            .args(&args)
            .stdout(Stdio::from(widowed_pipe()))
            .stderr(Stdio::piped())
            .output()
            .expect("run profiler");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() || !stderr.is_empty() {
            failures.push(format!("profiler {}: {} {stderr}", command.join(" "), out.status));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
