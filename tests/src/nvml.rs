//! The stand-in for NVIDIA's management library (`tests/nvml/standin.c`), built with gcc into
//! a test's directory: the daemon loads it through `--nvml-library`, the path the real library
//! takes, and it answers from a file the test writes (see the C file for the format).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

pub struct StandIn {
    /// The library to give `--nvml-library`.
    pub lib: PathBuf,
    /// The file it answers from.
    pub facts: PathBuf,
}

/// A GPU as the stand-in describes it: an H100 on bus 3B, `util` % busy, held by `holders`.
pub fn h100(util: u32, holders: &[u32], reasons: u64) -> String {
    let procs: Vec<String> = holders.iter().map(|p| format!("{p}:1073741824")).collect();
    let proc_util: Vec<String> = holders.iter().map(|p| format!("{p}:{util}")).collect();
    format!(
        "gpus 1\ndriver 580.159.04\n0 name NVIDIA H100 80GB HBM3\n0 uuid GPU-8e3c1f0a-stand-in\n\
         0 bus 00000000:3B:00.0\n0 util {util}\n0 mem_util 12\n0 sm_clock 1980\n0 mem_clock 2619\n\
         0 reasons {reasons}\n0 power_mw 350000\n0 temp 55\n0 mem_total 85899345920\n0 mem_used 1073741824\n\
         0 pcie_rx 1000\n0 pcie_tx 2000\n0 ecc_corrected 3\n0 ecc_uncorrected 0\n0 remap 2,1,1,0\n\
         0 procs {}\n0 proc_util {}\n\
         0 affinity 3\n",
        procs.join(","),
        proc_util.join(",")
    )
}

/// GPUs as the stand-in describes them: GPU `i` an H100 `gpus[i].0` % busy, held by the pids of
/// `gpus[i].1` (one process tree's ranks, one GPU each, as a data-parallel job holds a node).
pub fn h100s(gpus: &[(u32, &[u32])]) -> String {
    let mut facts = format!("gpus {}\ndriver 580.159.04\n", gpus.len());
    for (i, (util, holders)) in gpus.iter().enumerate() {
        let procs: Vec<String> = holders.iter().map(|p| format!("{p}:1073741824")).collect();
        let proc_util: Vec<String> = holders.iter().map(|p| format!("{p}:{util}")).collect();
        facts.push_str(&format!(
            "{i} name NVIDIA H100 80GB HBM3\n{i} uuid GPU-8e3c1f0a-stand-in-{i}\n{i} bus 00000000:{:02X}:00.0\n\
             {i} util {util}\n{i} mem_util 12\n{i} sm_clock 1980\n{i} reasons 0\n{i} procs {}\n{i} proc_util {}\n",
            0x1b + 0x10 * i,
            procs.join(","),
            proc_util.join(",")
        ));
    }
    facts
}

impl StandIn {
    /// Builds the stand-in into `dir` (`half`: without about half the functions); `Err` says why
    /// it could not be built (no gcc).
    pub fn build(dir: &Path, half: bool) -> Result<Self, String> {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("nvml/standin.c");
        let facts = dir.join("gpu-facts.txt");
        let lib = dir.join(if half { "half" } else { "full" }).join("libnvidia-ml.so.1");
        std::fs::create_dir_all(lib.parent().unwrap()).map_err(|e| e.to_string())?;
        let mut cmd = Command::new("gcc");
        cmd.args(["-shared", "-fPIC", "-O1", "-o"]).arg(&lib).arg(format!("-DSTANDIN_FILE=\"{}\"", facts.display()));
        if half {
            cmd.arg("-DHALF");
        }
        let out = cmd.arg(&source).output().map_err(|e| format!("cannot run gcc: {e}"))?;
        if !out.status.success() {
            return Err(format!("gcc failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(Self { lib, facts })
    }

    /// Builds it, or says why not (a failure under CI=true, `crate::skip`) and gives `None`.
    pub fn build_or_skip(dir: &Path, half: bool, test: &str) -> Option<Self> {
        match Self::build(dir, half) {
            Ok(s) => Some(s),
            Err(why) => {
                crate::skip(&format!("{test}: cannot build the NVML stand-in: {why}"));
                None
            }
        }
    }

    /// Replaces what the stand-in says (a rename: a call never reads half a file).
    pub fn say(&self, facts: &str) {
        let tmp = self.facts.with_extension("tmp");
        std::fs::write(&tmp, facts).expect("write the stand-in's facts");
        std::fs::rename(&tmp, &self.facts).expect("rename the stand-in's facts");
    }

    pub fn lib_str(&self) -> &str {
        self.lib.to_str().expect("a UTF-8 path")
    }
}
