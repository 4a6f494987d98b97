//! User stacks of code built without frame pointers (issue 12): each workload is built here
//! without them, run under the real daemon, and the share of its samples whose stack reaches
//! `main` is measured. Frame-pointer walking gets 0-15 % on these; the unwind tables must get
//! at least 95 %.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use integration_tests::{Daemon, folded_window, now_secs, privileged, skip, wait_for};

const WORKLOADS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/workloads");
/// How long each workload runs.
const SECS: f64 = 4.0;

fn build(dir: &Path, cmd: &str, args: &[&str], out: &str) -> PathBuf {
    let bin = dir.join(out);
    let st = Command::new(cmd).args(args).arg("-o").arg(&bin).status().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(st.success(), "{cmd} {args:?} failed");
    bin
}

/// Runs `bin` under a fresh daemon; returns its folded stacks.
fn profile(bin: &Path) -> Vec<(String, u64)> {
    let comm: String = bin.file_name().unwrap().to_string_lossy().chars().take(15).collect();
    let (_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&["--listen", "off"]);
    let dir = data.to_str().unwrap();
    let start = now_secs();
    let st = Command::new(bin).arg(SECS.to_string()).status().unwrap();
    assert!(st.success() || st.code() == Some(0), "{} failed", bin.display());
    let end = now_secs();
    // Every sample of the run is on disk once the daemon has flushed past its end.
    let stacks = wait_for("the workload's samples", Duration::from_secs(30), || {
        let stacks = folded_window(dir, start - 1.0, end + 1.0, &["--comm", &comm]).ok()?;
        let total: u64 = stacks.iter().map(|(_, n)| n).sum();
        (total as f64 >= SECS * 99.0 * 0.5).then_some(stacks)
    });
    assert!(daemon.stop().success());
    stacks
}

/// The stack holds the program's `main`: C's, Rust's (`crate::main`) or Go's (`main.main`, the
/// main goroutine's: other goroutines end at `runtime.goexit` without it).
fn reaches_main(stack: &str) -> bool {
    stack.split(';').any(|f| f == "main" || f.ends_with("::main") || f == "main.main")
}

/// (complete share, samples, the most common incomplete stack) of `bin`'s stacks that `keep`.
fn complete_share(stacks: &[(String, u64)], keep: impl Fn(&str) -> bool) -> (f64, u64, String) {
    let stacks: Vec<&(String, u64)> = stacks.iter().filter(|(s, _)| keep(s)).collect();
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    let complete: u64 = stacks.iter().filter(|(s, _)| reaches_main(s)).map(|(_, n)| n).sum();
    let worst =
        stacks.iter().filter(|(s, _)| !reaches_main(s)).max_by_key(|(_, n)| *n).map(|(s, n)| format!("{s} {n}"));
    (complete as f64 / total as f64, total, worst.unwrap_or_default())
}

fn check(name: &str, bin: &Path) {
    let (share, total, worst) = complete_share(&profile(bin), |_| true);
    eprintln!("{name}: {:.1} % of {total} samples reach main; most common incomplete: {worst}", share * 100.0);
    assert!(share >= 0.95, "{name}: only {:.1} % of {total} samples reach main; e.g. {worst}", share * 100.0);
}

#[test]
fn c_without_frame_pointers_through_a_libc_callback() {
    if !privileged("c_without_frame_pointers_through_a_libc_callback") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let src = format!("{WORKLOADS}/libc_callback.c");
    let bin = build(tmp.path(), "gcc", &["-O2", "-fomit-frame-pointer", &src], "cfi-c-qsort");
    check("C -O2 -fomit-frame-pointer (qsort callback)", &bin);
}

#[test]
fn cpp_templates_without_frame_pointers() {
    if !privileged("cpp_templates_without_frame_pointers") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let src = format!("{WORKLOADS}/templates.cpp");
    let bin = build(tmp.path(), "g++", &["-O2", "-fomit-frame-pointer", &src], "cfi-cpp-tmpl");
    check("C++ -O2 -fomit-frame-pointer (templates, std::sort, std::function)", &bin);
}

#[test]
fn rust_release_binary_without_frame_pointers() {
    if !privileged("rust_release_binary_without_frame_pointers") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let src = format!("{WORKLOADS}/release.rs");
    // rustc directly: the workspace's frame-pointer flags do not reach it.
    let bin = build(tmp.path(), "rustc", &["-C", "opt-level=3", "-C", "force-frame-pointers=no", &src], "cfi-rust-rel");
    check("Rust release (sort_by closure)", &bin);
}

#[test]
fn signal_handlers_and_the_vdso_do_not_break_the_walk() {
    if !privileged("signal_handlers_and_the_vdso_do_not_break_the_walk") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let src = format!("{WORKLOADS}/signals_vdso.c");
    let bin = build(tmp.path(), "gcc", &["-O2", "-fomit-frame-pointer", &src], "cfi-c-signals");
    let stacks = profile(&bin);
    for (what, frame) in [("the signal handler", "on_tick"), ("the vDSO", "[vdso]")] {
        let (share, total, worst) = complete_share(&stacks, |s| s.split(';').any(|f| f == frame));
        eprintln!("{what}: {:.1} % of {total} samples reach main; most common incomplete: {worst}", share * 100.0);
        assert!(total >= 5, "too few samples in {what} to judge: {total}");
        assert!(share >= 0.95, "{what}: only {:.1} % of {total} samples reach main; e.g. {worst}", share * 100.0);
    }
}

/// `go build` of a workload, with the toolchain's caches in `dir` and no network; `None` (after
/// saying why, or failing under CI) when there is no `go`.
fn go_build(dir: &Path, src: &str, out: &str) -> Option<PathBuf> {
    if Command::new("go").arg("version").output().is_err() {
        skip(&format!("{out}: `go` is not installed (`cargo xtask test` installs Debian's golang-go)"));
        return None;
    }
    let bin = dir.join(out);
    let st = Command::new("go")
        .args(["build", "-o"])
        .arg(&bin)
        .arg(src)
        .env("GOCACHE", dir.join("gocache"))
        .env("GOPATH", dir.join("gopath"))
        .env("HOME", dir)
        .env("GOPROXY", "off")
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "")
        .status()
        .expect("go build");
    assert!(st.success(), "go build {src} failed");
    Some(bin)
}

#[test]
fn go_stacks_reach_main_main_and_keep_the_callers_of_frameless_leaves() {
    if !privileged("go_stacks_reach_main_main_and_keep_the_callers_of_frameless_leaves") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(bin) = go_build(tmp.path(), &format!("{WORKLOADS}/gowork.go"), "cfi-go") else { return };
    let stacks = profile(&bin);
    let (share, total, worst) = complete_share(&stacks, |_| true);
    eprintln!("Go: {:.1} % of {total} samples reach main.main; most common incomplete: {worst}", share * 100.0);
    assert!(share >= 0.95, "Go: only {:.1} % of {total} samples reach main.main; e.g. {worst}", share * 100.0);
    // `mix` never saves the frame pointer: a frame-pointer walk from it skips its caller (the
    // frame pointer still holds the caller's frame). The unwind table knows `mix`'s frame.
    let in_mix: Vec<&(String, u64)> = stacks.iter().filter(|(s, _)| s.ends_with(";main.mix")).collect();
    let total_mix: u64 = in_mix.iter().map(|(_, n)| n).sum();
    let callers = ["main.scramble", "main.sortOnce.func1"];
    let with_caller: u64 = in_mix
        .iter()
        .filter(|(s, _)| s.rsplit(';').nth(1).is_some_and(|caller| callers.contains(&caller)))
        .map(|(_, n)| n)
        .sum();
    let wrong = in_mix
        .iter()
        .filter(|(s, _)| !s.rsplit(';').nth(1).is_some_and(|caller| callers.contains(&caller)))
        .max_by_key(|(_, n)| *n)
        .map(|(s, n)| format!("{s} {n}"))
        .unwrap_or_default();
    let mix_share = with_caller as f64 / total_mix.max(1) as f64;
    eprintln!("Go: {:.1} % of {total_mix} samples in main.mix name its caller; e.g. wrong: {wrong}", mix_share * 100.0);
    assert!(total_mix >= 20, "too few samples in main.mix to judge: {total_mix}");
    assert!(mix_share >= 0.95, "only {:.1} % of {total_mix} samples in main.mix name its caller; e.g. {wrong}", mix_share * 100.0);
}
