//! Helpers for the integration tests: running the real `profiler` binary, waiting for
//! conditions with deadlines, and the privilege check that skips (or, under CI, fails).

pub mod big_node;
pub mod chdb;
pub mod clickhouse;
pub mod cuda;
pub mod memcg;
pub mod netlab;
pub mod nvml;
pub mod otlp;

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

pub fn pin_to_cpu(cpu: usize) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET bounds-checks through the libc macro.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Runs `cmd` in a session of its own, whose scheduling autogroup gets `nice`.
///
/// With `kernel.sched_autogroup_enabled` (Debian's default) the scheduler first shares the CPUs
/// evenly among sessions and only then by nice within each: a workload at nice -10 started by a
/// test still gets a third of the CPUs when two other sessions run builds or test suites, and
/// a test that needs its workload to hold the CPUs (lock contention on two CPUs at once) fails
/// at random. Where autogroups are off the session's nice is ignored and the process's own nice
/// (set by the caller) decides.
pub fn in_own_autogroup(cmd: &mut Command, nice: i32) -> &mut Command {
    use std::os::unix::process::CommandExt;
    let value = format!("{nice}\n").into_bytes();
    // SAFETY: only async-signal-safe calls (setsid, open, write, close) between fork and exec,
    // on a path and buffer built before the fork.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            let fd = libc::open(c"/proc/self/autogroup".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd >= 0 {
                libc::write(fd, value.as_ptr().cast(), value.len());
                libc::close(fd);
            }
            Ok(())
        })
    }
}

/// True when the tests may load BPF programs. Otherwise says why, and under CI panics: CI
/// must run them, never skip them silently.
pub fn privileged(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root || skip(&format!("{test}: needs root to load BPF programs and open perf events"))
}

/// Says why a test cannot run here and returns false; under CI (`CI=true` or `CI=1`) panics
/// instead. The suite's one rule, shared with profiler-user's unit tests (see its module).
pub use profiler_common::test_skip::skip;

/// A child killed (and reaped) when the test ends, however it ends.
pub struct Kill(pub Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A child started in a process group of its own ([`spawn_group`]), killed with everything it
/// started: chromedriver's Chromium outlived a driver killed alone (found left running after
/// a suite).
pub struct KillGroup(pub Child);

/// Starts `cmd` as the leader of a new process group, for [`KillGroup`].
pub fn spawn_group(cmd: &mut Command) -> KillGroup {
    use std::os::unix::process::CommandExt;
    KillGroup(cmd.process_group(0).spawn().unwrap_or_else(|e| panic!("start {:?}: {e}", cmd.get_program())))
}

/// The live (not zombie) processes of process group `pgid`.
pub fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // After the `(comm)`: state, ppid, pgrp.
            let rest: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, r)| r).split_whitespace().collect();
            rest.first() != Some(&"Z") && rest.get(2) == Some(&pgid.to_string().as_str())
        })
        .collect()
}

impl Drop for KillGroup {
    fn drop(&mut self) {
        // SAFETY: a signal to the group our own child leads.
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// The `profiler` binary under test: `PROFILER_BIN` (set by `cargo xtask test`), else the
/// workspace's debug build.
pub fn profiler_bin() -> PathBuf {
    let bin = std::env::var_os("PROFILER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/profiler"));
    assert!(bin.exists(), "{} does not exist: run the tests with `cargo xtask test`", bin.display());
    bin
}

pub fn helper_bin() -> PathBuf {
    bin("busy-helper")
}

/// One of this package's helper programs (src/bin/).
pub fn bin(name: &str) -> PathBuf {
    // Built with this package: cargo puts it next to the test binary's parent directory.
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join(name);
    assert!(bin.exists(), "{} does not exist", bin.display());
    bin
}

pub fn now_secs() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// Polls `check` until it returns `Some`, or panics with `what` after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, check: impl FnMut() -> Option<T>) -> T {
    wait_for_every(what, timeout, Duration::from_millis(50), check)
}

/// `wait_for`, polling every `interval`: for checks that cost CPU (each runs a `profiler`
/// query) while the test measures how busy the machine is.
pub fn wait_for_every<T>(what: &str, timeout: Duration, interval: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(interval);
    }
}

/// A daemon started for one test, killed (SIGTERM, then SIGKILL) if the test panics.
pub struct Daemon {
    pub child: Option<Child>,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    /// Where this run's lines start in the (shared, appended) log.
    log_start: usize,
}

impl Daemon {
    pub fn start(data_dir: &Path, extra: &[&str]) -> Self {
        Self::start_with_flush(data_dir, extra, 200)
    }

    /// A daemon writing to `data` in a fresh temporary directory, ready (first block written).
    pub fn ready_in_tempdir(extra: &[&str]) -> (tempfile::TempDir, PathBuf, Self) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("data");
        let mut daemon = Self::start(&data, extra);
        daemon.wait_ready();
        (tmp, data, daemon)
    }

    pub fn start_with_flush(data_dir: &Path, extra: &[&str], flush_ms: u64) -> Self {
        Self::start_wrapped(&[], data_dir, extra, flush_ms)
    }

    /// Starts the daemon under `wrapper` (e.g. `setpriv ... --`), if not empty.
    pub fn start_wrapped(wrapper: &[&str], data_dir: &Path, extra: &[&str], flush_ms: u64) -> Self {
        Self::start_configured(wrapper, data_dir, extra, flush_ms, |_| {})
    }

    /// A daemon in a session of its own whose scheduling autogroup gets `nice` (see
    /// [`in_own_autogroup`]), ready: for tests whose workload is made to hold the CPUs, so that
    /// the daemon still gets the CPU time it needs beside it.
    pub fn ready_in_own_autogroup(data_dir: &Path, extra: &[&str], nice: i32) -> Self {
        let mut daemon = Self::start_configured(&[], data_dir, extra, 200, |c| {
            in_own_autogroup(c, nice);
        });
        daemon.wait_ready();
        daemon
    }

    fn start_configured(
        wrapper: &[&str],
        data_dir: &Path,
        extra: &[&str],
        flush_ms: u64,
        configure: impl FnOnce(&mut Command),
    ) -> Self {
        let log = data_dir.with_extension("log");
        let log_file = std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("daemon log");
        let log_start = log_file.metadata().map_or(0, |m| m.len() as usize);
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(profiler_bin());
                c
            }
            None => Command::new(profiler_bin()),
        };
        configure(&mut cmd);
        let child = cmd
            .args(["run", "--data-dir"])
            .arg(data_dir)
            .args(["--flush-ms", &flush_ms.to_string()])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("start profiler run");
        Self { child: Some(child), data_dir: data_dir.to_path_buf(), log, log_start }
    }

    /// This run's log lines.
    pub fn log_text(&self) -> String {
        let all = std::fs::read_to_string(&self.log).unwrap_or_default();
        all.get(self.log_start..).unwrap_or_default().to_string()
    }

    /// Waits until the daemon has written its first block.
    pub fn wait_ready(&mut self) {
        self.wait_ready_since(0.0);
    }

    /// Waits until the store holds a block that ends after `since` (unix seconds).
    pub fn wait_ready_since(&mut self, since: f64) {
        let dir = self.data_dir.clone();
        wait_for("the daemon's first block", Duration::from_secs(30), || {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(st)) = child.try_wait()
            {
                panic!("the daemon exited ({st}) before writing anything:\n{}", self.log_text());
            }
            // This run is up (signal handlers in place, BPF attached) once it says so.
            if !self.log_text().contains("profiling") {
                return None;
            }
            let end = status_json(&dir)?["summary"]["span"][1].as_u64()?;
            (end as f64 / 1e9 > since).then_some(())
        });
    }

    /// SIGKILL: no chance to flush.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("daemon running");
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
    }

    /// SIGTERM, then waits for a clean exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("daemon running");
        // SAFETY: sending a signal to our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        // Detaching its programs waits for RCU grace periods, one per link: a second here, but
        // more than ten seconds was seen on a machine at load 15.
        wait_for("the daemon to exit after SIGTERM", Duration::from_secs(30), || child.try_wait().ok().flatten())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs `profiler ARGS`.
pub fn profiler(args: &[&str]) -> Output {
    Command::new(profiler_bin()).args(args).output().expect("run profiler")
}

pub fn status_json(data_dir: &Path) -> Option<serde_json::Value> {
    let out = profiler(&["status", "--format", "json", "--data-dir", data_dir.to_str()?]);
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// `profiler flamegraph --format folded` on a data directory: the stacks, or stderr.
pub fn folded(dir: &str, args: &[&str]) -> Result<Vec<(String, u64)>, String> {
    let mut all = vec!["flamegraph", "--data-dir", dir, "--format", "folded"];
    all.extend_from_slice(args);
    let out = profiler(&all);
    if out.status.success() {
        Ok(parse_folded(&String::from_utf8_lossy(&out.stdout)))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// [`folded`] for `[from, to)` in unix seconds, plus `extra` arguments.
pub fn folded_window(dir: &str, from: f64, to: f64, extra: &[&str]) -> Result<Vec<(String, u64)>, String> {
    let (from, to) = (format!("{from:.3}"), format!("{to:.3}"));
    let mut args = vec!["--from", &from, "--to", &to];
    args.extend_from_slice(extra);
    folded(dir, &args)
}

/// Parses folded output into (stack, count) pairs.
pub fn parse_folded(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|l| {
            let (stack, count) = l.rsplit_once(' ')?;
            Some((stack.to_string(), count.parse().ok()?))
        })
        .collect()
}

/// A plain HTTP/1.1 GET to `addr` (`host:port`) with this `Host` header and, if given, the
/// API token: (status, body).
pub fn http_get(addr: &str, path: &str, host: &str, token: Option<&str>) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    let auth = token.map_or(String::new(), |t| format!("X-Profiler-Token: {t}\r\n"));
    write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    (status, body)
}

/// A loopback port free a moment ago (the daemon binds it next).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
