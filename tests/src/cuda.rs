//! The stand-in for CUDA's driver library (`tests/cuda/standin.c`), built with gcc into a
//! test's directory under the real library's name (the daemon finds `libcuda.so*` in a
//! process's maps), with a stand-in runtime and host stubs beside it, and the Python program
//! that launches through them (`tests/workloads/cuda_app.py`), driven line by line.

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::Duration,
};

use crate::{folded, wait_for_every};

/// Builds the stand-in as `dir/libcuda.so.1`, beside it the stand-in runtime
/// (`dir/libcudart.so.12`, tests/cuda/runtime.c, which loads it when it starts) and host stubs of kernels
/// (`dir/libkernels.so`, tests/cuda/kernels.c); root's, mode 0755, as the daemon wants the
/// libraries it probes. Their functions start with `push %rbp` (built without optimisation),
/// an instruction the kernel emulates at a uprobe: the probe then costs one trap, not a trap
/// and a single step.
pub fn build(dir: &Path) -> Result<PathBuf, String> {
    let source = |name: &str| Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda").join(name);
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let lib = dir.join("libcuda.so.1");
    let gcc = |out: &Path, src: &str, link: &[&str]| -> Result<(), String> {
        let o = Command::new("gcc")
            .args(["-shared", "-fPIC", "-O0", "-o"])
            .arg(out)
            .arg(source(src))
            .arg(format!("-L{}", dir.display()))
            .args(link)
            .arg("-Wl,-rpath,$ORIGIN")
            .output()
            .map_err(|e| format!("cannot run gcc: {e}"))?;
        if !o.status.success() {
            return Err(format!("gcc {src} failed: {}", String::from_utf8_lossy(&o.stderr)));
        }
        Ok(())
    };
    gcc(&lib, "standin.c", &[])?;
    gcc(&dir.join("libcudart.so.12"), "runtime.c", &["-ldl"])?;
    gcc(&dir.join("libkernels.so"), "kernels.c", &["-l:libcudart.so.12"])?;
    Ok(lib)
}

/// Builds it or says why not (a failure under CI=true) and gives `None`.
pub fn build_or_skip(dir: &Path, test: &str) -> Option<PathBuf> {
    match build(dir) {
        Ok(lib) => Some(lib),
        Err(why) => {
            crate::skip(&format!("{test}: cannot build the CUDA stand-in: {why}"));
            None
        }
    }
}

/// A running `cuda_app.py`.
pub struct App {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl App {
    /// Starts it on `lib` with `args` (`--late`, `--rate N`) and waits for its "ready".
    pub fn start(lib: &Path, args: &[&str], sync_us: u32) -> Self {
        Self::start_in(lib, args, sync_us, None)
    }

    /// [`App::start`], the process put into the cgroup whose `cgroup.procs` is `procs` before
    /// it runs (so the daemon never sees it elsewhere: a process's workload is read once).
    pub fn start_in(lib: &Path, args: &[&str], sync_us: u32, procs: Option<&Path>) -> Self {
        use std::os::{fd::AsRawFd, unix::process::CommandExt};
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/cuda_app.py");
        let mut cmd = Command::new("python3");
        cmd.arg(script)
            .arg(lib)
            .args(args)
            .env("STANDIN_SYNC_US", sync_us.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        // Opened here, written in the child between fork and exec: nothing allocates there.
        let file = procs.map(|p| {
            std::fs::OpenOptions::new().write(true).open(p).unwrap_or_else(|e| panic!("open {}: {e}", p.display()))
        });
        if let Some(fd) = file.as_ref().map(|f| f.as_raw_fd()) {
            // SAFETY: write(2) on a descriptor the parent keeps open until the spawn returns.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::write(fd, b"0\n".as_ptr().cast(), 2) == 2 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        let mut child = cmd.spawn().expect("start python3 cuda_app.py");
        drop(file);
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut app = Self { child, stdin, stdout };
        assert_eq!(app.line(), "ready");
        app
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read the app's output");
        line.trim().to_string()
    }

    /// Tells it to launch; returns its report.
    pub fn go(&mut self) -> serde_json::Value {
        self.start_work();
        self.report()
    }

    /// Tells it to launch, without waiting for it to finish.
    pub fn start_work(&mut self) {
        self.tell("go");
    }

    /// Writes `word` on a line of its stdin.
    pub fn tell(&mut self, word: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(format!("{word}\n").as_bytes()).and_then(|()| stdin.flush()).expect("tell the app");
    }

    /// Its report, when it finished.
    pub fn report(&mut self) -> serde_json::Value {
        let line = self.line();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("the app's report {line:?}: {e}"))
    }

    /// Lets it exit (stdin closed) and waits.
    pub fn finish(mut self) {
        self.stdin.take();
        let _ = self.child.wait();
    }
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The daemon's view of the CUDA probes (`DATA_DIR/cuda.json`).
pub fn status(data: &Path) -> serde_json::Value {
    std::fs::read(data.join("cuda.json")).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
}

/// Waits until the daemon has probed `n` library files.
pub fn wait_probed(data: &Path, n: usize) {
    wait_for_every("the CUDA library probed", Duration::from_secs(20), Duration::from_millis(100), || {
        let s = status(data);
        let libs = s["libraries"].as_array()?;
        let probed = libs.iter().filter(|l| l["error"].is_null() && l["probes"].as_u64().unwrap_or(0) > 0).count();
        (probed == n).then_some(())
    });
}

/// The total of `kind`'s folded counts for `pid` in stacks through `function`.
pub fn total(data: &Path, kind: &str, pid: u32, function: &str) -> u64 {
    let dir = data.to_str().unwrap();
    let pid = pid.to_string();
    folded(dir, &["--samples", kind, "--from", "-5m", "--pid", &pid])
        .unwrap_or_default()
        .iter()
        .filter(|(stack, _)| function.is_empty() || stack.split(';').any(|f| f.starts_with(&format!("{function} ("))))
        .map(|(_, n)| n)
        .sum()
}

/// Waits until `kind`'s count through `function` reaches `want` (drained once a second), then
/// gives the count as it stands a drain later (so a count past `want` shows).
pub fn settled(data: &Path, kind: &str, pid: u32, function: &str, want: u64) -> u64 {
    settle(
        want,
        || total(data, kind, pid, function),
        |n| format!("{kind} in {function}: {n} after 20 s, {want} wanted"),
    )
}

/// Waits up to 20 s until `count` reaches `want`, then gives it a drain later (so a count past
/// `want` shows); past 20 s, panics with `say` of the count reached.
fn settle(want: u64, count: impl Fn() -> u64, say: impl FnOnce(u64) -> String) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let n = count();
        if n >= want {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{}", say(n));
        std::thread::sleep(Duration::from_millis(250));
    }
    std::thread::sleep(Duration::from_millis(1500));
    count()
}

/// Every launch and copy of the app counted, whatever the stacks (the first calls of a process
/// the daemon had not described yet have no Python frames).
pub fn check_totals(data: &Path, app: &mut App) {
    let pid = app.pid();
    app.go();
    let all = |kind: &str, want: u64| {
        wait_for_every(&format!("{want} {kind}"), Duration::from_secs(20), Duration::from_millis(250), || {
            (total(data, kind, pid, "") >= want).then_some(())
        });
        std::thread::sleep(Duration::from_millis(1500));
        total(data, kind, pid, "")
    };
    assert_eq!(all("cuda-launches", 5000), 5000, "launches");
    assert_eq!(all("cuda-copies", 100 << 20), 100 << 20, "bytes copied");
}

pub fn check_exact(data: &Path, app: &mut App) {
    let pid = app.pid();
    let report = app.go();
    assert_eq!(settled(data, "cuda-launches", pid, "launch_direct", 3000), 3000, "cuLaunchKernelEx calls");
    // One launch passes through cuLaunchKernel and cuLaunchKernelEx: counted once.
    assert_eq!(settled(data, "cuda-launches", pid, "launch_nested", 2000), 2000, "cuLaunchKernel calls");
    assert_eq!(settled(data, "cuda-copies", pid, "copy_up", 100 << 20), 100 << 20, "bytes copied");
    let measured = report["blocked_us"].as_f64().unwrap();
    let blocked = settled(data, "cuda-sync", pid, "wait_gpu", (measured * 0.95) as u64) as f64;
    assert!(
        (blocked - measured).abs() <= measured * 0.05,
        "blocked {blocked} µs counted against {measured} µs measured by the program"
    );
    let measured = report["ctx_blocked_us"].as_f64().unwrap();
    let blocked = settled(data, "cuda-sync", pid, "wait_context", (measured * 0.95) as u64) as f64;
    assert!((blocked - measured).abs() <= measured * 0.05, "cuCtxSynchronize_v2: {blocked} µs against {measured} µs");
}

/// Builds the flood (`tests/cuda/flood.c`: many threads calling the library through many
/// distinct stacks) as `dir/flood`, runnable by any user.
pub fn build_flood(dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda/flood.c");
    let exe = dir.join("flood");
    let out = Command::new("gcc")
        .args(["-O0", "-fno-omit-frame-pointer", "-pthread", "-o"])
        .arg(&exe)
        .arg(&source)
        .output()
        .expect("run gcc");
    assert!(out.status.success(), "gcc flood.c: {}", String::from_utf8_lossy(&out.stderr));
    exe
}

/// A running flood: waits for its "ready" (the library loaded).
pub struct Flood(pub Child);

impl Flood {
    pub fn ready(mut child: Child) -> Self {
        let mut line = String::new();
        let stdout = child.stdout.as_mut().expect("piped stdout");
        BufReader::new(stdout).read_line(&mut line).expect("the flood's first line");
        if line.trim() != "ready" {
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(child.stderr.as_mut().expect("piped stderr"), &mut err);
            panic!("the flood did not start: {line:?} {err}");
        }
        Self(child)
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `kind`'s folded counts for `pid` whose leaf frame is `leaf` and, unless empty, that pass
/// through Python function `function`.
pub fn by_leaf(data: &Path, pid: u32, function: &str, leaf: &str) -> u64 {
    let dir = data.to_str().unwrap();
    let pid = pid.to_string();
    folded(dir, &["--samples", "cuda-launches", "--from", "-5m", "--pid", &pid])
        .unwrap_or_default()
        .iter()
        .filter(|(stack, _)| stack.rsplit(';').next() == Some(leaf))
        .filter(|(stack, _)| function.is_empty() || stack.split(';').any(|f| f.starts_with(&format!("{function} ("))))
        .map(|(_, n)| n)
        .sum()
}

/// Waits until the launches of `pid` whose leaf is `leaf` (through `function`) reach `want`,
/// then gives their count a drain later (so a count past `want` shows).
pub fn settled_leaf(data: &Path, pid: u32, function: &str, leaf: &str, want: u64) -> u64 {
    settle(
        want,
        || by_leaf(data, pid, function, leaf),
        |n| {
            let dir = data.to_str().unwrap();
            let all = folded(dir, &["--samples", "cuda-launches", "--from", "-5m", "--pid", &pid.to_string()]);
            format!("{n} of {want} launches named {leaf:?} in {function} after 20 s; the store has: {all:#?}")
        },
    )
}
