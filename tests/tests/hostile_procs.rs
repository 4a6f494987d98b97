//! Processes an unprivileged user could run against the symbolizer (issue 14: E5, E6, E10), on
//! the real kernel with the real daemon: it keeps sampling and naming, and its memory stays
//! bounded.

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::{Daemon, Kill, bin, folded_window, now_secs, privileged, skip, status_json, wait_for};

/// A copy of the helper named `name` (its comm), in `dir`: the helper renames or deletes it.
fn helper_copy(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::copy(bin("hostile-proc"), &path).expect("copy hostile-proc");
    path
}

fn spawn(path: &Path, args: &[&str]) -> (Kill, BufReader<std::process::ChildStdout>) {
    let mut child =
        Command::new(path).args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("start hostile-proc");
    let out = BufReader::new(child.stdout.take().expect("stdout"));
    (Kill(child), out)
}

fn read_line(out: &mut BufReader<std::process::ChildStdout>) -> String {
    let mut line = String::new();
    out.read_line(&mut line).expect("helper output");
    line
}

/// Samples of `comm` since `from` whose stack names `function`, once there are some.
fn wait_named(data: &Path, comm: &str, function: &str, from: f64, timeout: Duration) -> u64 {
    wait_frame(data, comm, function, from, timeout, |f| f == function)
}

/// Samples of `comm` since `from` with a frame that `is` accepts, once there are some.
fn wait_frame(data: &Path, comm: &str, what: &str, from: f64, timeout: Duration, is: impl Fn(&str) -> bool) -> u64 {
    let dir = data.to_str().unwrap();
    wait_for(&format!("{what} named in {comm}'s samples"), timeout, || {
        let stacks = folded_window(dir, from, now_secs(), &["--comm", comm]).ok()?;
        let n: u64 = stacks.iter().filter(|(s, _)| s.split(';').any(&is)).map(|(_, c)| c).sum();
        (n > 0).then_some(n)
    })
}

fn lost(data: &Path) -> u64 {
    let status = status_json(data).expect("status");
    let cpus = status["summary"]["cpus"].as_object().cloned().unwrap_or_default();
    cpus.values().map(|c| c["lost"].as_u64().unwrap_or(0)).sum()
}

#[test]
fn a_fifo_at_the_executable_path_does_not_hang_the_daemon() {
    if !privileged("a_fifo_at_the_executable_path_does_not_hang_the_daemon") {
        return;
    }
    let (tmp, data, mut daemon) = Daemon::ready_in_tempdir(&["--frequency", "99"]);
    let exe = helper_copy(tmp.path(), "hostile-fifo");
    let started = now_secs();
    let (mut helper, mut out) = spawn(&exe, &["fifo"]);
    assert_eq!(read_line(&mut out), "spinning\n");
    // The daemon has opened the binary (by whatever path it uses) and named a function in it.
    wait_named(&data, "hostile-fifo", "hostile_before_swap", started, Duration::from_secs(30));
    let lost_before = lost(&data);

    writeln!(helper.0.stdin.as_mut().unwrap()).unwrap();
    assert_eq!(read_line(&mut out), "swapped\n");
    let swapped = now_secs();
    // A new function in the same file: a lookup the daemon makes after the path became a FIFO.
    // Before the fix, blazesym re-opened the path and blocked in fifo_open: nothing more was
    // stored, and this waited in vain.
    let n = wait_named(&data, "hostile-fifo", "hostile_after_swap", swapped, Duration::from_secs(30));
    eprintln!("hostile_after_swap named in {n} samples after the swap");
    // And it keeps storing: data newer than the swap by 2 s arrives.
    daemon.wait_ready_since(swapped + 2.0);
    let lost_after = lost(&data);
    assert!(lost_after - lost_before <= 10, "{} samples lost after the swap", lost_after - lost_before);
    drop(helper);
    assert!(daemon.stop().success(), "{}", daemon.log_text());
}

#[test]
fn a_deleted_binary_is_named() {
    if !privileged("a_deleted_binary_is_named") {
        return;
    }
    let (tmp, data, mut daemon) = Daemon::ready_in_tempdir(&["--frequency", "99"]);
    let exe = helper_copy(tmp.path(), "hostile-del");
    let started = now_secs();
    let (_helper, mut out) = spawn(&exe, &["deleted"]);
    assert_eq!(read_line(&mut out), "deleted\n");
    assert!(!exe.exists());
    let n = wait_named(&data, "hostile-del", "hostile_deleted_spin", started, Duration::from_secs(30));
    eprintln!("hostile_deleted_spin named in {n} samples of a deleted binary");
    assert!(daemon.stop().success(), "{}", daemon.log_text());
}

#[test]
fn a_frame_seen_before_the_loader_mapped_its_library_is_named_later() {
    if !privileged("a_frame_seen_before_the_loader_mapped_its_library_is_named_later") {
        return;
    }
    let (tmp, data, mut daemon) = Daemon::ready_in_tempdir(&["--frequency", "99"]);
    let exe = helper_copy(tmp.path(), "hostile-early");
    let started = now_secs();
    let status = Command::new(&exe).args(["early", "4"]).status().expect("run hostile-proc early");
    assert!(status.success());
    let ended = now_secs();
    daemon.wait_ready_since(ended);
    // From 2 s after exec on (past the 1 s re-read limit and the unnamed stack's time to live),
    // the same call path is named as it is from then on: the root frame (libc's start code) is
    // never the bare `[unknown]` the maps read at exec gave. Before the fix, that first answer
    // was cached for the process's life: every sample said `hostile-early;[unknown];main;...`.
    let stacks = folded_window(data.to_str().unwrap(), started + 2.0, ended, &["--comm", "hostile-early"])
        .expect("samples of hostile-early");
    let spins: Vec<&(String, u64)> = stacks.iter().filter(|(s, _)| s.contains(";hostile_early_spin")).collect();
    assert!(!spins.is_empty(), "hostile_early_spin never named: {stacks:?}");
    let bare: u64 = spins.iter().filter(|(s, _)| s.split(';').nth(1) == Some("[unknown]")).map(|(_, c)| c).sum();
    let all: u64 = spins.iter().map(|(_, c)| c).sum();
    eprintln!("{bare} of {all} samples in hostile_early_spin have a bare [unknown] root frame");
    assert_eq!(bare, 0, "{spins:#?}");
    assert!(daemon.stop().success(), "{}", daemon.log_text());
}

/// A cgroup v1 memory group holding one process, removed when dropped.
struct MemoryCgroup(PathBuf);

impl MemoryCgroup {
    fn new(name: &str, limit: u64, pid: u32) -> Option<Self> {
        let root = Path::new("/sys/fs/cgroup/memory");
        if !root.join("cgroup.procs").exists() {
            return None;
        }
        let dir = root.join(name);
        let _ = std::fs::create_dir(&dir);
        std::fs::write(dir.join("memory.limit_in_bytes"), limit.to_string()).ok()?;
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).ok()?;
        Some(Self(dir))
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // The daemon has exited by now (or moves back to the root): then the group can go.
        if let Ok(procs) = std::fs::read_to_string(self.0.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = std::fs::write("/sys/fs/cgroup/memory/cgroup.procs", pid);
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn many_mappings_and_a_huge_symbol_table_stay_within_256_mib() {
    if !privileged("many_mappings_and_a_huge_symbol_table_stay_within_256_mib") {
        return;
    }
    if !cfg!(target_arch = "x86_64") {
        skip("many_mappings_and_a_huge_symbol_table_stay_within_256_mib: the helper spins in mapped x86-64 code");
        return;
    }
    let (tmp, data, mut daemon) = Daemon::ready_in_tempdir(&["--frequency", "99"]);
    let pid = daemon.child.as_ref().unwrap().id();
    let group = format!("profiler-hostile-{}", std::process::id());
    let Some(_cgroup) = MemoryCgroup::new(&group, 256 << 20, pid) else {
        skip("many_mappings_and_a_huge_symbol_table_stay_within_256_mib: no cgroup v1 memory controller");
        return;
    };
    let hwm_before = vm_hwm_kib(pid).unwrap_or(0);
    let exe_maps = helper_copy(tmp.path(), "hostile-maps");
    let exe_sym = helper_copy(tmp.path(), "hostile-bigsym");
    let started = now_secs();
    let (_maps, mut out) = spawn(&exe_maps, &["mappings", "60000", tmp.path().to_str().unwrap()]);
    assert_eq!(read_line(&mut out), "mapped 60000\n");
    let (_sym, mut out) = spawn(&exe_sym, &["bigsym", tmp.path().to_str().unwrap()]);
    assert_eq!(read_line(&mut out), "mapped 1\n");
    // Both are sampled and stored. The first inside its mapped file, which is past the maps'
    // budgets (so `[unknown]` or `hostile-lib.so+0x…`), called from its named `main`; the
    // second inside its refused file, named by module and offset.
    let a = wait_named(&data, "hostile-maps", "hostile_proc::main", started, Duration::from_secs(30));
    let b = wait_frame(&data, "hostile-bigsym", "bigsym.so+0x…", started, Duration::from_secs(30), |f| {
        f.starts_with("bigsym.so+0x")
    });
    // Some more seconds of maps re-reads (at most one a second per process) and lookups.
    let later = now_secs() + 3.0;
    daemon.wait_ready_since(later);
    let child = daemon.child.as_mut().unwrap();
    assert!(child.try_wait().unwrap().is_none(), "the daemon died:\n{}", daemon.log_text());
    let hwm = vm_hwm_kib(pid).expect("daemon alive");
    eprintln!("samples in the hostile files: {a} and {b}; daemon VmHWM {hwm_before} KiB before, {hwm} KiB after");
    assert!(hwm < 160 << 10, "the daemon's peak RSS reached {hwm} KiB");
    assert!(daemon.stop().success(), "{}", daemon.log_text());
}
