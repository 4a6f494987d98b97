use super::*;

const S: u64 = 1_000_000_000;
const T0: u64 = 1_800_000_000 * S;

fn sample<'a>(ts_ns: u64, tid: u32, comm: &'a str, frames: &'a [(&'a str, bool)], count: u64) -> SampleRef<'a> {
    SampleRef { ts_ns, cpu: 0, pid: 7, tid, comm, frames, locations: &[], count, frequency_hz: Some(100), workload: "" }
}

fn window(from: u64, to: u64) -> Window {
    Window::new(from, to).unwrap()
}

#[test]
fn each_thread_s_buckets_hold_running_and_its_waits_by_state() {
    let mut b = Builder::new(window(T0 + S / 2, T0 + 3 * S), S);
    let cpu = [("main", false), ("work", false)];
    let (sleep, io, runnable) =
        ([("[off-cpu: sleep]", false), ("read", false)], [("[off-cpu: io]", false)], [("[off-cpu: runnable]", false)]);
    // 30 samples at 100 Hz in the first second: 300 ms running.
    for i in 0..30 {
        b.running(&sample(T0 + i * 10_000_000, 8, "loader", &cpu, 1));
    }
    b.waited(&sample(T0, 8, "proc-comm", &sleep, 600_000));
    b.waited(&sample(T0 + S, 8, "proc-comm", &io, 250_000));
    b.waited(&sample(T0 + S, 8, "proc-comm", &runnable, 1_500));
    // Another thread, only waiting: named by its wait.
    b.waited(&sample(T0 + 2 * S, 9, "worker", &io, 900_000));
    let t = b.finish(7, true);
    assert_eq!((t.first_ns, t.bucket_ns, t.columns, t.note.as_deref()), (T0, S, 3, None));
    assert_eq!(t.states, ["running", "runnable", "io", "sleep"]);
    assert_eq!(t.threads.len(), 2);
    let main = &t.threads[0];
    assert_eq!((main.tid, main.comm.as_str()), (8, "loader"), "the CPU sample names the thread");
    assert_eq!(main.cells, vec![[0.0, 300.0, 0.0, 0.0, 600.0], [1.0, 0.0, 1.5, 250.0, 0.0]]);
    assert_eq!(main.totals_ms, [300.0, 1.5, 250.0, 600.0]);
    assert_eq!((t.threads[1].tid, t.threads[1].comm.as_str()), (9, "worker"));
    assert_eq!(t.threads[1].cells, vec![[2.0, 0.0, 0.0, 900.0, 0.0]]);
}

#[test]
fn samples_outside_the_window_and_stacks_without_a_state_are_left_out() {
    let mut b = Builder::new(window(T0, T0 + 2 * S), S);
    let no_state = [("read", false)];
    let sleep = [("[off-cpu: sleep]", false)];
    b.waited(&sample(T0, 8, "x", &no_state, 5_000));
    b.waited(&sample(T0 - S, 8, "x", &sleep, 5_000));
    b.waited(&sample(T0 + 2 * S, 8, "x", &sleep, 5_000));
    b.running(&sample(T0 + 3 * S, 8, "x", &no_state, 1));
    assert!(b.finish(7, true).threads.is_empty());
}

#[test]
fn a_long_window_gets_longer_buckets_and_says_so() {
    let b = Builder::new(window(T0, T0 + 3600 * S), S);
    let t = b.finish(7, false);
    assert_eq!((t.bucket_ns, t.columns), (6 * S, 600));
    assert_eq!(t.note.as_deref(), Some("buckets of 6 s: a timeline has at most 600 columns"));
    assert!(!t.off_cpu);
    // Asked-for buckets are whole seconds, at least one.
    let b = Builder::new(window(T0, T0 + 10 * S), S / 2);
    assert_eq!(b.bucket_ns, S);
    let b = Builder::new(window(T0, T0 + 10 * S), 2 * S + 1);
    assert_eq!((b.bucket_ns, b.columns), (3 * S, 4));
}

#[test]
fn the_threads_with_the_most_time_are_kept_and_the_rest_counted() {
    let mut b = Builder::new(window(T0, T0 + S), S);
    let sleep = [("[off-cpu: sleep]", false)];
    for tid in 1..=(MAX_THREADS as u32 + 5) {
        b.waited(&sample(T0, tid, "t", &sleep, tid as u64 * 1_000));
    }
    let t = b.finish(7, true);
    assert_eq!(t.threads.len(), MAX_THREADS);
    assert_eq!(t.more_threads, 5);
    assert_eq!(t.threads[0].tid, MAX_THREADS as u32 + 5, "most time first");
    assert_eq!(t.threads.last().unwrap().tid, 6);
}

#[test]
fn the_answer_is_the_json_the_page_reads() {
    let mut b = Builder::new(window(T0, T0 + S), S);
    b.waited(&sample(T0, 8, "r", &[("[off-cpu: io]", false)], 1_234));
    let v = serde_json::to_value(b.finish(7, true)).unwrap();
    assert_eq!(
        v,
        serde_json::json!({
            "pid": 7, "first_ns": T0, "bucket_ns": S, "columns": 1,
            "states": ["running", "runnable", "io", "sleep"],
            "threads": [{"tid": 8, "comm": "r", "totals_ms": [0.0, 0.0, 1.2, 0.0], "cells": [[0.0, 0.0, 0.0, 1.2, 0.0]]}],
            "more_threads": 0, "off_cpu": true, "note": null
        })
    );
}
