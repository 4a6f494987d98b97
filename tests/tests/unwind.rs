//! User stacks of code built without frame pointers (issue 12): each workload is built here
//! without them, run under the real daemon, and the share of its samples whose stack reaches
//! `main` is measured. Frame-pointer walking gets 0-15 % on these; the unwind tables must get
//! at least 95 %.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use integration_tests::{Daemon, Kill, folded_window, now_secs, privileged, skip, wait_for};

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
///
/// On a machine that another build loads, a new program's first seconds are walked with frame
/// pointers alone (53 % of a 4 s run's samples reached main): the daemon describes a process
/// when its pipeline hears of the exec (a debug daemon's pipeline then runs seconds behind)
/// and builds its files' tables on a thread at nice 10. So a run counts from its first stack
/// that reaches main, and runs until it has half `SECS` of samples at 99 Hz from there; runs
/// are made until one reaches main at 95 % (its tables are built: the first complete stack may
/// need only the binary's, not libc's), then the measured run starts, as a new process whose
/// files the daemon knows.
fn profile(bin: &Path) -> Vec<(String, u64)> {
    let comm: String = bin.file_name().unwrap().to_string_lossy().chars().take(15).collect();
    let (_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&["--listen", "off"]);
    let dir = data.to_str().unwrap();
    let run = || {
        let start = now_secs();
        let workload = Kill(Command::new(bin).arg("600").spawn().unwrap());
        let (stacks, took) = samples_from_first(dir, &comm, start, "stack reaching main", reaches_main);
        drop(workload);
        (stacks, took)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut warmups = 0;
    loop {
        warmups += 1;
        let (share, total, worst) = complete_share(&run().0, |_| true);
        if share >= 0.95 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{comm}: {:.1} % of {total} samples reach main after {warmups} warm-up runs; e.g. {worst}",
            share * 100.0
        );
    }
    let (stacks, took) = run();
    eprintln!("{comm}: after {warmups} warm-up runs, a first complete stack {took:.1} s after its start");
    assert!(daemon.stop().success());
    // This kernel's verifier takes the walker's runs of 8 frames; where one does not (6.1), the
    // daemon loads runs of 4, which cost more tail calls per deep stack: a change that pushes
    // the walker past the verifier's budget here must show.
    let log = daemon.log_text();
    assert!(!log.contains("frames were refused"), "the verifier refused the 8-frame walker:\n{log}");
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
    assert!(
        mix_share >= 0.95,
        "only {:.1} % of {total_mix} samples in main.mix name its caller; e.g. {wrong}",
        mix_share * 100.0
    );
}

/// Resident anonymous memory of process `pid`, in KiB (not the unwind rows: the daemon writes
/// them through a mapping of the BPF array, whose pages count as shared).
fn rss_anon_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("RssAnon:")?.trim().strip_suffix(" kB")?.parse().ok()).unwrap_or(0)
}

/// A process maps 10,000 files executable: 9,700 one-page data files and 300 copies of an ELF
/// file with CFI, more than the 256 mappings a description holds. Once it is described with all
/// of them (the description that logs what it left out) and its stacks are complete, its own
/// binary and libc (mapped before all of them, so above them) must stay described, the data files take no place, what is
/// left out is logged once, and the daemon lives on. Before that description its stacks are
/// complete too, unless the stage was still busy with the processes the daemon found at start
/// when this one exec'd (the first description of 10,000 mappings opens 10,000 files: ~0.2-0.7
/// s): that share is shown, not asserted.
#[test]
fn a_process_mapping_10000_files_keeps_its_binary_and_libc_described() {
    if !privileged("a_process_mapping_10000_files_keeps_its_binary_and_libc_described") {
        return;
    }
    const ELF_COPIES: usize = 300;
    let tmp = tempfile::tempdir().unwrap();
    let src = format!("{WORKLOADS}/many_maps.c");
    let bin = build(tmp.path(), "gcc", &["-O2", "-fomit-frame-pointer", &src], "cfi-many-maps");
    let files = tmp.path().join("files");
    std::fs::create_dir(&files).unwrap();
    for i in 0..10_000 - ELF_COPIES {
        std::fs::write(files.join(format!("data-{i}")), format!("{i:4096}")).unwrap();
    }
    for i in 0..ELF_COPIES {
        std::fs::copy(&bin, files.join(format!("elf-{i}"))).unwrap();
    }
    let (_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&["--listen", "off"]);
    let dir = data.to_str().unwrap();
    let daemon_pid = daemon.child.as_ref().unwrap().id();
    let rss_before = rss_anon_kib(daemon_pid);
    let start = now_secs();
    // Runs until killed below, once enough has been seen.
    let mut workload =
        Kill(Command::new(&bin).arg("600").arg(&files).stdout(std::process::Stdio::piped()).spawn().unwrap());
    let pid = workload.0.id();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(workload.0.stdout.take().unwrap()), &mut line).unwrap();
    assert_eq!(line.trim(), "mapped 10000");
    let pid_field = format!("pid={pid}");
    let warned = |log: &str| log.lines().filter(|l| l.contains(&pid_field) && l.contains("left_out")).count();
    wait_for("the log line about the mappings left out", Duration::from_secs(60), || {
        (warned(&daemon.log_text()) > 0).then_some(())
    });
    let described = now_secs();
    // The samples from its first complete stack after that description: a description made
    // while libc's table was still being built (at nice 10, seconds on a loaded machine) walks
    // libc with frame pointers until the next one.
    let (stacks, _) = samples_once_described(dir, "cfi-many-maps", described);
    let end = now_secs();
    let whole = folded_window(dir, start - 1.0, end, &["--comm", "cfi-many-maps"]).unwrap();
    let rss_after = rss_anon_kib(daemon_pid);
    drop(workload);
    let log = daemon.log_text();
    let (share, total, worst) = complete_share(&stacks, |_| true);
    let (whole_share, whole_total, _) = complete_share(&whole, |_| true);
    eprintln!(
        "10,000 mappings: {:.1} % of {total} samples after the full description reach main ({:.1} % of \
         {whole_total} since exec); most common incomplete: {worst}; daemon anonymous RSS {} -> {} MiB",
        share * 100.0,
        whole_share * 100.0,
        rss_before / 1024,
        rss_after / 1024
    );
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(&pid_field) && l.contains("left_out")).collect();
    eprintln!("{}", lines.join("\n"));
    assert!(share >= 0.95, "only {:.1} % of {total} samples reach main; e.g. {worst}", share * 100.0);
    assert_eq!(lines.len(), 1, "what was left out is logged once per process");
    // 304 mappings with tables (the copies, the binary, libc, ld.so, the vDSO) for 256 places; a
    // description made while the files were still being mapped saw fewer.
    let left_out: u64 = lines[0].split_once("left_out=").and_then(|(_, n)| n.split(' ').next()?.parse().ok()).unwrap();
    assert!((1..=ELF_COPIES as u64 + 4 - 256).contains(&left_out), "{}", lines[0]);
    assert!(daemon.child.as_mut().unwrap().try_wait().unwrap().is_none(), "the daemon died:\n{log}");
    assert!(rss_after < rss_before + 64 * 1024, "the daemon grew from {rss_before} to {rss_after} KiB");
    assert!(daemon.stop().success(), "{log}");
}

/// Samples of `comm` (a program that sorts with libc's `qsort`: `libc_callback.c`,
/// `many_maps.c`) from its first complete stack through `qsort` after `from` on, until there are
/// half `SECS` of them at 99 Hz; and how long that first stack took. Frame pointers reach main
/// through `qsort` in none of their samples: that stack says the tables of the binary and of
/// libc are in (a daemon describes a new process at once, but builds its files' tables at nice
/// 10: on a busy machine that can take seconds, and a stack outside `qsort` reaches main with
/// the binary's table alone).
fn samples_once_described(dir: &str, comm: &str, from: f64) -> (Vec<(String, u64)>, f64) {
    // The comparison function, which qsort calls: from it, only libc's table leads to main
    // (qsort's own frames may be unnamed: `many_maps.c` maps libc past what the symbolizer reads).
    samples_from_first(dir, comm, from, "a complete stack through qsort", |s| {
        reaches_main(s) && s.ends_with(";by_value")
    })
}

/// Samples of `comm` from its first stack that is `first` (`what`) after `from` on, until
/// there are half `SECS` of them at 99 Hz; and how long that first stack took.
fn samples_from_first(
    dir: &str,
    comm: &str,
    from: f64,
    what: &str,
    first: impl Fn(&str) -> bool,
) -> (Vec<(String, u64)>, f64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let seen = loop {
        let stacks = folded_window(dir, from, now_secs() + 1.0, &["--comm", comm]).unwrap_or_default();
        if stacks.iter().any(|(s, _)| first(s)) {
            break now_secs();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {what} of {comm} in 60 s; the most common: {:?}",
            stacks.iter().max_by_key(|(_, n)| *n)
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let n = (SECS * 99.0 * 0.5) as u64;
    let stacks = wait_for(&format!("{n} samples of {comm}"), Duration::from_secs(60), || {
        let stacks = folded_window(dir, seen, now_secs() + 1.0, &["--comm", comm]).ok()?;
        (stacks.iter().map(|(_, n)| n).sum::<u64>() >= n).then_some(stacks)
    });
    (stacks, seen - from)
}

/// A copy of the C workload, started and deleted at once (the file is gone, its mappings say
/// "(deleted)"; describe() stats and opens them through /proc/PID/map_files, which still reach
/// the inode): its stacks must reach main, whether the daemon saw the process start (it is
/// described at exec, maybe before the deletion, and again after it) or the process predates the
/// daemon (described at its first sample, after the deletion).
#[test]
fn a_binary_deleted_while_it_runs_keeps_complete_stacks() {
    if !privileged("a_binary_deleted_while_it_runs_keeps_complete_stacks") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let src = format!("{WORKLOADS}/libc_callback.c");
    let built = build(tmp.path(), "gcc", &["-O2", "-fomit-frame-pointer", &src], "built");
    let start_deleted = |name: &str| {
        let bin = tmp.path().join(name);
        std::fs::copy(&built, &bin).unwrap();
        let child = Kill(Command::new(&bin).arg("600").spawn().unwrap());
        // spawn returns once the exec passed its point of no return, which can be before the
        // kernel mapped the new binary.
        let maps = format!("/proc/{}/maps", child.0.id());
        wait_for("the binary mapped", Duration::from_secs(10), || {
            std::fs::read_to_string(&maps).ok()?.contains(bin.to_str().unwrap()).then_some(())
        });
        std::fs::remove_file(&bin).unwrap();
        let text = std::fs::read_to_string(&maps).unwrap();
        assert!(text.contains(&format!("{name} (deleted)")), "{text}");
        child
    };
    let check = |what: &str, (stacks, after): (Vec<(String, u64)>, f64)| {
        let (share, total, worst) = complete_share(&stacks, |_| true);
        eprintln!(
            "deleted, {what}: {:.1} % of {total} samples reach main from the first complete stack (seen {after:.2} s in); \
             e.g. incomplete: {worst}",
            share * 100.0
        );
        assert!(
            share >= 0.95,
            "deleted, {what}: only {:.1} % of {total} samples reach main; e.g. {worst}",
            share * 100.0
        );
    };

    // The daemon first.
    let (_data_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&["--listen", "off"]);
    let start = now_secs();
    let child = start_deleted("cfi-del-after");
    check("seen from its exec", samples_once_described(data.to_str().unwrap(), "cfi-del-after", start - 1.0));
    drop(child);
    assert!(daemon.stop().success(), "{}", daemon.log_text());

    // The process first: the daemon starts after the deletion.
    let child = start_deleted("cfi-del-before");
    let (_data_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&["--listen", "off"]);
    let ready = now_secs();
    check("started before the daemon", samples_once_described(data.to_str().unwrap(), "cfi-del-before", ready - 1.0));
    drop(child);
    assert!(daemon.stop().success(), "{}", daemon.log_text());
}

/// A thread whose innermost function is a library's assembly without unwind information (as
/// OpenBLAS's and cuBLAS's kernels are): the rules stop in it, the stack scan finds the return
/// address it pushed below two saved registers, and its samples reach the thread's start.
/// `/metrics` says why walks ended and counts the scanned frames.
#[test]
#[cfg(target_arch = "x86_64")]
fn assembly_without_unwind_information_in_a_library_is_crossed_by_the_stack_scan() {
    if !privileged("assembly_without_unwind_information_in_a_library_is_crossed_by_the_stack_scan") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let lib_src = format!("{WORKLOADS}/asm_leaf_lib.c");
    build(tmp.path(), "gcc", &["-O2", "-fomit-frame-pointer", "-shared", "-fPIC", &lib_src], "libasmleaf.so");
    let dir = tmp.path().to_str().unwrap();
    let (src, rpath) = (format!("{WORKLOADS}/asm_leaf.c"), format!("-Wl,-rpath,{dir}"));
    let bin = build(
        tmp.path(),
        "gcc",
        &["-O2", "-fomit-frame-pointer", &src, "-L", dir, "-lasmleaf", &rpath, "-lpthread"],
        "cfi-asm-leaf",
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let (_data_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&["--listen", &listen]);
    let metric = |name: &str| -> f64 {
        let (_, body) = integration_tests::http_get(&listen, "/metrics", "127.0.0.1", None);
        body.lines().filter(|l| l.starts_with(name)).filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok()).sum()
    };
    // The thread's entry, then the library's C caller, in order down to the assembly.
    let complete_in_asm = |s: &str| {
        let frames: Vec<&str> = s.split(';').collect();
        let at = |f: &str| frames.iter().position(|&x| x == f);
        matches!((at("asm_thread_main"), at("asm_lib_gemm"), at("spin_asm_kernel")), (Some(a), Some(b), Some(c)) if a < b && b < c)
    };
    // A run, from its first complete stack in the assembly on (see `profile`).
    let dir = data.to_str().unwrap();
    let run = || {
        let start = now_secs();
        let workload = Kill(Command::new(&bin).arg("600").spawn().unwrap());
        let (stacks, _) =
            samples_from_first(dir, "cfi-asm-leaf", start, "complete stack in the assembly", complete_in_asm);
        drop(workload);
        stacks
    };
    // (complete, total, the most common other) of the samples in the assembly.
    let judge = |stacks: Vec<(String, u64)>| {
        let in_kernel: Vec<(String, u64)> =
            stacks.into_iter().filter(|(s, _)| s.split(';').any(|f| f == "spin_asm_kernel")).collect();
        let total: u64 = in_kernel.iter().map(|(_, n)| n).sum();
        let complete: u64 = in_kernel.iter().filter(|(s, _)| complete_in_asm(s)).map(|(_, n)| n).sum();
        let worst = in_kernel.iter().filter(|(s, _)| !s.contains("asm_thread_main")).max_by_key(|(_, n)| *n).cloned();
        (complete, total, worst)
    };
    // Runs until the tables of the binary and the library are built (as in `profile`), then the
    // measured run.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (complete, total, worst) = judge(run());
        if total >= 10 && complete as f64 >= 0.95 * total as f64 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "warm-up: {complete} of {total} reach the entry; e.g. {worst:?}");
    }
    let scanned_before = metric("profiler_unwind_scanned_frames_total");
    let (complete, total, worst) = judge(run());
    eprintln!("{complete} of {total} samples in the assembly reach the thread's entry; most common other: {worst:?}");
    assert!(total >= 50, "only {total} samples in the assembly kernel");
    assert!(
        complete as f64 >= 0.95 * total as f64,
        "{complete} of {total} samples in the assembly reach the thread's entry; e.g. {worst:?}"
    );
    let scanned = metric("profiler_unwind_scanned_frames_total") - scanned_before;
    assert!(scanned >= complete as f64 * 0.9, "{scanned} frames scanned for {complete} complete stacks");
    assert!(metric("profiler_unwind_walk_ends_total{reason=\"outermost\"}") > 0.0, "walks counted by how they end");
    assert!(daemon.stop().success());
}
