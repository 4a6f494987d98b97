//! `cargo xtask gpu-check`: the profiler on a real GPU node (issue 26), where there is no cargo:
//! only python3 with PyTorch and nvidia-smi. The logic is `gpu_check.py` (embedded here): it
//! runs the daemon and a PyTorch job in an input-bound and a GPU-bound phase and prints the
//! daemon's GPU utilisation beside nvidia-smi's, the findings per phase, the daemon's CPU and
//! peak RSS; and (issue 41) the GPM and PCIe tracks beside `nvidia-smi dmon`, two processes
//! sharing GPU 0 beside `nvidia-smi pmon`, the share of a PyTorch loop's launches named beside
//! torch.profiler's kernels. Its parsing is tested here on canned outputs (`gpu_check_test.py`).
//!
//!   cargo xtask gpu-check --write-script DIR [--binary PATH]
//!       DIR/gpu_check.py and DIR/profiler (the release build, stripped): copy DIR to the node
//!       and run `python3 DIR/gpu_check.py --profiler DIR/profiler --out RESULTS` as root.
//!   cargo xtask gpu-check [--out DIR]           on a GPU node with cargo: build and run it.
//!   cargo xtask gpu-check --standin [--out DIR] without a GPU: the same check against the
//!       tests' stand-in NVML (tests/nvml/standin.c), CPU-heavy Python workers for the job.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

const SCRIPT: &str = include_str!("gpu_check.py");

pub struct Options {
    pub write_script: Option<PathBuf>,
    pub binary: Option<PathBuf>,
    pub standin: bool,
    pub out: PathBuf,
    pub seconds: u64,
}

/// Copies `bin` to `dir/profiler`, stripped when `strip` is there (about 14 MB instead of 200).
fn place_binary(bin: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    let dest = dir.join("profiler");
    let stripped = Command::new("strip").arg("-o").arg(&dest).arg(bin).status().is_ok_and(|s| s.success());
    if !stripped {
        std::fs::copy(bin, &dest).with_context(|| format!("cannot copy {} to {}", bin.display(), dest.display()))?;
    }
    Ok(dest)
}

fn write_script(dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let script = dir.join("gpu_check.py");
    std::fs::write(&script, SCRIPT).with_context(|| format!("cannot write {}", script.display()))?;
    Ok(script)
}

pub fn run(o: Options, build_release: impl FnOnce() -> anyhow::Result<PathBuf>) -> anyhow::Result<()> {
    let bin = match &o.binary {
        Some(b) if b.is_file() => b.clone(),
        Some(b) => bail!("--binary {}: no such file", b.display()),
        None => build_release()?,
    };
    if let Some(dir) = &o.write_script {
        let script = write_script(dir)?;
        let placed = place_binary(&bin, dir)?;
        println!(
            "wrote {} and {}; on the GPU node, as root:\n  python3 {} --profiler {} --out gpu-check-results",
            script.display(),
            placed.display(),
            script.display(),
            placed.display()
        );
        return Ok(());
    }
    let work = o.out.join("kit");
    let script = write_script(&work)?;
    let mut cmd = Command::new("python3");
    cmd.arg(&script).arg("--profiler").arg(&bin).arg("--out").arg(&o.out).arg("--seconds").arg(o.seconds.to_string());
    if o.standin {
        let facts = std::path::absolute(work.join("standin-facts.txt"))?;
        let lib = std::path::absolute(work.join("libnvidia-ml.so.1"))?;
        let source = super::workspace_root().join("tests/nvml/standin.c");
        let mut gcc = Command::new("gcc");
        gcc.args(["-shared", "-fPIC", "-O1", "-o"]).arg(&lib).arg(format!("-DSTANDIN_FILE=\"{}\"", facts.display()));
        gcc.arg(source);
        super::status(gcc).context("building the NVML stand-in (gcc)")?;
        cmd.arg("--standin").arg(&lib).arg("--standin-facts").arg(&facts);
    }
    super::status(cmd)
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    /// The script cannot run here (no GPU, no torch): it is compiled, and its parsing parts run on
    /// canned nvidia-smi tables and folded launches (`gpu_check_test.py`). No bytecode is left in
    /// the tree (`-B`, and the compiled file written to a temporary directory).
    #[test]
    fn gpu_check_script_compiles_and_parses_canned_outputs() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let pyc = std::env::temp_dir().join(format!("gpu_check-{}.pyc", std::process::id()));
        let compile = Command::new("python3")
            .args([
                "-B",
                "-c",
                "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)",
            ])
            .arg(dir.join("gpu_check.py"))
            .arg(&pyc)
            .output()
            .expect("run python3");
        let _ = std::fs::remove_file(&pyc);
        assert!(compile.status.success(), "{}", String::from_utf8_lossy(&compile.stderr));
        let test = Command::new("python3").arg("-B").arg(dir.join("gpu_check_test.py")).output().expect("run python3");
        assert!(
            test.status.success(),
            "{}{}",
            String::from_utf8_lossy(&test.stdout),
            String::from_utf8_lossy(&test.stderr)
        );
    }
}
