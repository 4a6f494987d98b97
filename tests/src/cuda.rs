//! The stand-in for CUDA's driver library (`tests/cuda/standin.c`), built with gcc into a
//! test's directory under the real library's name (the daemon finds `libcuda.so*` in a
//! process's maps), and the Python program that launches through it
//! (`tests/workloads/cuda_app.py`), driven line by line.

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
};

/// Builds the stand-in as `dir/libcuda.so.1`. Its functions start with `push %rbp` (built
/// without optimisation), an instruction the kernel emulates at a uprobe: the probe then costs
/// one trap, not a trap and a single step.
pub fn build(dir: &Path) -> Result<PathBuf, String> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda/standin.c");
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let lib = dir.join("libcuda.so.1");
    let out = Command::new("gcc")
        .args(["-shared", "-fPIC", "-O0", "-o"])
        .arg(&lib)
        .arg(&source)
        .output()
        .map_err(|e| format!("cannot run gcc: {e}"))?;
    if !out.status.success() {
        return Err(format!("gcc failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
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
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/cuda_app.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg(lib)
            .args(args)
            .env("STANDIN_SYNC_US", sync_us.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start python3 cuda_app.py");
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
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(b"go\n").and_then(|()| stdin.flush()).expect("tell the app to go");
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
