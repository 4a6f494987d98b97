//! Which process a pid is (issue 14 B6), on the real kernel with the real daemon: a process
//! that exits is forgotten, and a fork-only child that gets its pid (same comm, no exec) is
//! named from its own mappings, not from those cached for the process that had the pid.
//!
//! Pid reuse is forced with `clone3`'s `set_tid` (root, kernel 5.5+). Both processes are
//! fork-only children of this test that map a one-page file of code at the same address and
//! spin in it: nothing names such a file, so each frame is named by its module (`alpha.bin+0x0`,
//! `beta.bin+0x0`), and the module tells which mappings named it.

use std::{ffi::CStr, os::fd::AsRawFd, path::Path, time::Duration};

use integration_tests::{Daemon, folded_window, now_secs, privileged, skip, wait_for};

/// Where both children map their code (free in this test's address space: nothing maps there).
const ADDR: usize = 0x5a5a_0000_0000;
const COMM: &CStr = c"pidreuse";

/// An endless loop: `jmp .` / `b .`.
#[cfg(target_arch = "x86_64")]
const SPIN: [u8; 2] = [0xeb, 0xfe];
#[cfg(target_arch = "aarch64")]
const SPIN: [u8; 4] = 0x1400_0000u32.to_le_bytes();

/// `struct clone_args` (linux/sched.h), up to `set_tid_size`.
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
}

/// A fork-only child of this process (pid `pid`, or the kernel's choice) named `COMM` that maps
/// `code` executable at `ADDR` and runs it. Only system calls happen in the child: this
/// process has threads, and after a fork only the calling one exists.
fn spawn_spinner(code: &Path, pid: Option<i32>) -> std::io::Result<i32> {
    let file = std::fs::File::open(code)?;
    let mut set_tid = [pid.unwrap_or(0)];
    let args = CloneArgs {
        exit_signal: libc::SIGCHLD as u64,
        set_tid: if pid.is_some() { set_tid.as_mut_ptr() as u64 } else { 0 },
        set_tid_size: u64::from(pid.is_some()),
        ..CloneArgs::default()
    };
    // SAFETY: clone3 with no stack given: the child runs on a copy of this stack, like fork.
    let ret = unsafe { libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, size_of::<CloneArgs>()) };
    if ret == 0 {
        // SAFETY: system calls only; the jump lands on the loop just mapped, which never returns.
        unsafe {
            libc::prctl(libc::PR_SET_NAME, COMM.as_ptr());
            let at = libc::mmap(
                ADDR as *mut libc::c_void,
                4096,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_FIXED_NOREPLACE,
                file.as_raw_fd(),
                0,
            );
            if at as usize != ADDR {
                libc::_exit(3);
            }
            let spin: extern "C" fn() -> ! = std::mem::transmute(ADDR);
            spin();
        }
    }
    if ret < 0 { Err(std::io::Error::last_os_error()) } else { Ok(ret as i32) }
}

fn kill_and_reap(pid: i32) {
    // SAFETY: our own child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
}

/// Kills the spinner when the test ends, however it ends.
struct Spinner(i32);

impl Drop for Spinner {
    fn drop(&mut self) {
        kill_and_reap(self.0);
    }
}

/// Samples of `pid` between `from` and now by module: (alpha.bin, beta.bin).
fn by_module(data: &Path, pid: i32, from: f64) -> (u64, u64) {
    let stacks =
        folded_window(data.to_str().unwrap(), from, now_secs(), &["--pid", &pid.to_string()]).unwrap_or_default();
    let count = |module: &str| stacks.iter().filter(|(s, _)| s.contains(module)).map(|(_, n)| n).sum::<u64>();
    (count("alpha.bin"), count("beta.bin"))
}

/// True when this test runs in the kernel's first pid namespace (the daemon sees those pids).
fn in_root_pid_namespace() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("NSpid:")).is_some_and(|v| v.split_whitespace().count() == 1)
}

#[test]
fn a_reused_pid_is_a_new_process_and_an_exited_one_is_forgotten() {
    if !privileged("a_reused_pid_is_a_new_process_and_an_exited_one_is_forgotten") {
        return;
    }
    if !in_root_pid_namespace() {
        skip("pid_reuse: the test runs in a child pid namespace, so its pids are not the daemon's");
        return;
    }
    // The symbolizer says when it forgets a process (debug): the daemon inherits this.
    // SAFETY: set before any thread of this test reads the environment.
    unsafe { std::env::set_var("RUST_LOG", "info,profiler::symbolize::lifecycle=debug") };
    let (tmp, data, daemon) = Daemon::ready_in_tempdir(&["--frequency", "199", "--listen", "off"]);
    for name in ["alpha.bin", "beta.bin"] {
        let mut page = vec![0u8; 4096];
        page[..SPIN.len()].copy_from_slice(&SPIN);
        std::fs::write(tmp.path().join(name), page).expect("code file");
    }

    // 1. The first process: sampled and cached, its frame named by alpha.bin.
    let from = now_secs();
    let a = spawn_spinner(&tmp.path().join("alpha.bin"), None).expect("clone3");
    let first = Spinner(a);
    wait_for("the first process named by alpha.bin", Duration::from_secs(60), || {
        (by_module(&data, a, from).0 >= 5).then_some(())
    });

    // 2. It exits: the daemon forgets it (the fork and exit tracepoints say so).
    drop(first);
    let forgot = format!("pid={a}");
    wait_for("the daemon to forget the exited process", Duration::from_secs(20), || {
        daemon
            .log_text()
            .lines()
            .any(|l| l.contains("cached mappings are forgotten") && l.contains(&forgot))
            .then_some(())
    });

    // 3. A fork-only child gets its pid at once: same comm, same address, another file.
    let reused = match spawn_spinner(&tmp.path().join("beta.bin"), Some(a)) {
        Ok(pid) => pid,
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) || e.raw_os_error() == Some(libc::EPERM) => {
            skip(&format!("pid_reuse: clone3 with set_tid is not available here ({e})"));
            return;
        }
        Err(e) => panic!("clone3 with pid {a}: {e}"),
    };
    let _second = Spinner(reused);
    assert_eq!(reused, a);
    let since = now_secs();
    // Its samples a second on (the first few may be read before the exit event): beta.bin only.
    let (alpha, beta) = wait_for("the reused pid's samples named by beta.bin", Duration::from_secs(60), || {
        let (alpha, beta) = by_module(&data, a, since + 1.0);
        (alpha + beta >= 20).then_some((alpha, beta))
    });
    eprintln!("pid {a} reused: {beta} samples named by beta.bin, {alpha} by alpha.bin");
    assert_eq!(alpha, 0, "the new process under pid {a} was named with the mappings of the one that exited");
    drop(daemon);
}

/// A process that starts and ends threads for 2 s (each thread's exit fires the exit
/// tracepoint), prints how many and when it stopped, then spins 3 s more.
const THREADS: &str = r#"
import threading, time
n, end = 0, time.time() + 2
while time.time() < end:
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()
    n += 1
print(n, time.time(), flush=True)
end = time.time() + 3
while time.time() < end:
    pass
"#;

#[test]
fn a_thread_exit_does_not_end_its_process() {
    if !privileged("a_thread_exit_does_not_end_its_process") {
        return;
    }
    // SAFETY: set before any thread of this test reads the environment.
    unsafe { std::env::set_var("RUST_LOG", "info,profiler::symbolize::lifecycle=debug") };
    let (_tmp, data, daemon) = Daemon::ready_in_tempdir(&["--frequency", "199", "--listen", "off"]);
    let mut child = std::process::Command::new("python3")
        .args(["-c", THREADS])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let pid = child.id();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    let _child = integration_tests::Kill(child);
    let mut words = line.split_whitespace();
    let threads: u64 = words.next().and_then(|w| w.parse().ok()).expect("thread count");
    let ended: f64 = words.next().and_then(|w| w.parse().ok()).expect("time");
    assert!(threads > 100, "only {threads} threads started and ended");
    // The daemon has read samples 1.5 s past the last thread exit (past the time an exited
    // process is kept for its late samples): had a thread's exit ended the process, it is
    // forgotten by now.
    wait_for("samples of the process after its threads ended", Duration::from_secs(30), || {
        let stacks =
            folded_window(data.to_str().unwrap(), ended + 1.5, now_secs(), &["--pid", &pid.to_string()]).ok()?;
        (stacks.iter().map(|(_, n)| n).sum::<u64>() >= 5).then_some(())
    });
    let forgot = format!("pid={pid}");
    let log = daemon.log_text();
    assert!(
        !log.lines().any(|l| l.contains("cached mappings are forgotten") && l.contains(&forgot)),
        "{threads} thread exits made the daemon forget the living process {pid}"
    );
    drop(daemon);
}
