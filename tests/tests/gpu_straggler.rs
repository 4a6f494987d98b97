//! `gpu-straggler` (issue 41, part 4) with the real daemon, real processes and uprobes, and the
//! two stand-ins only (NVML: four GPUs, one per rank; libcuda: launches return at once,
//! synchronisations sleep): a job of four Python ranks in one systemd scope (a cgroup the test
//! makes, as `torchrun` under systemd-run would be), each holding a GPU.
//!
//! - one rank computes and launches while the other three wait in `cuStreamSynchronize` (about
//!   95 % of their time) on GPUs at 25 %, its own at 99 %: `gpu-straggler` names that rank's
//!   process, its busiest thread and its Python line;
//! - a balanced job (every rank waiting alike on its busy GPU) raises none, while the detectors
//!   were judging the same threads: when the GPUs then idle, `gpu-sync-stall` comes, and still no
//!   straggler.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use integration_tests::{
    Daemon,
    cuda::{self, App, wait_probed},
    now_secs,
    nvml::{StandIn, h100s},
    privileged, profiler, skip, wait_for_every,
};
use serde_json::Value;

/// A job's systemd scope, made in the first cgroup hierarchy that takes processes; its ranks are
/// killed and the cgroups removed (deepest first) however the test ends.
struct Job {
    ranks: Vec<App>,
    made: Vec<PathBuf>,
    procs: PathBuf,
}

impl Job {
    /// `None` (a failure under CI=true) where no hierarchy can be written.
    fn make(test: &str) -> Option<Self> {
        // pids (cgroup v1) moves no CPU share: a `cpu` group would compete as one task with the
        // builds on this 2-CPU machine. Else the unified hierarchy.
        let root = ["/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .into_iter()
            .map(PathBuf::from)
            .find(|d| d.join("cgroup.procs").exists());
        let Some(root) = root else {
            skip(&format!("{test}: no cgroup hierarchy to put the job's ranks into"));
            return None;
        };
        let scope = root.join(format!("system.slice/torchrun-straggler-{}.scope", std::process::id()));
        let mut made = Vec::new();
        for dir in [scope.parent().unwrap(), &scope] {
            match std::fs::create_dir(dir) {
                Ok(()) => made.push(dir.to_path_buf()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    skip(&format!("{test}: mkdir {}: {e}", dir.display()));
                    return None;
                }
            }
        }
        Some(Self { ranks: Vec::new(), made, procs: scope.join("cgroup.procs") })
    }

    /// Starts a rank in the scope (`--stall S` or `--busy S`), a synchronisation sleeping 20 ms.
    fn rank(&mut self, lib: &Path, args: &[&str]) -> u32 {
        let app = App::start_in(lib, args, 20_000, Some(&self.procs));
        let pid = app.pid();
        self.ranks.push(app);
        pid
    }

    fn go(&mut self) {
        for r in &mut self.ranks {
            r.start_work();
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.ranks.clear();
        for dir in self.made.iter().rev() {
            // A cgroup whose last task just exited stays busy for a moment.
            let deadline = std::time::Instant::now() + Duration::from_secs(2);
            while std::fs::remove_dir(dir).is_err() && dir.exists() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Root, both stand-ins built, the job's scope made, a daemon reading the four-GPU stand-in:
/// `None` where the test cannot run (a failure under CI=true).
fn setup(test: &str) -> Option<(tempfile::TempDir, PathBuf, StandIn, Job, PathBuf, Daemon)> {
    if !privileged(test) {
        return None;
    }
    let tmp = tempfile::tempdir().unwrap();
    let lib = cuda::build_or_skip(&tmp.path().join("lib"), test)?;
    let nvml = StandIn::build_or_skip(tmp.path(), false, test)?;
    let job = Job::make(test)?;
    nvml.say(&h100s(&[(0, &[]), (0, &[]), (0, &[]), (0, &[])]));
    let data = tmp.path().join("data");
    let daemon = Daemon::start(&data, &["--listen", "off", "--nvml-library", nvml.lib_str()]);
    Some((tmp, lib, nvml, job, data, daemon))
}

fn findings(data: &Path, kind: &str) -> Vec<Value> {
    let out = profiler(&["findings", "--data-dir", data.to_str().unwrap(), "--from", "-10m", "--format", "json"]);
    let all: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
    all.into_iter().filter(|f| f["kind"] == kind).collect()
}

/// The first finding of `kind` within `secs`; on timeout, what the daemon found and logged.
fn wait_finding(data: &Path, kind: &str, secs: u64, daemon: &Daemon) -> Value {
    let found = std::cell::RefCell::new(None);
    let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for_every(&format!("a {kind} finding"), Duration::from_secs(secs), Duration::from_millis(500), || {
            *found.borrow_mut() = Some(findings(data, kind).into_iter().next()?);
            Some(())
        })
    }));
    if ok.is_err() {
        let all = profiler(&["findings", "--data-dir", data.to_str().unwrap(), "--from", "-10m"]);
        let status = profiler(&["status", "--data-dir", data.to_str().unwrap()]);
        panic!(
            "no {kind} finding in {secs} s; findings:\n{}\nstatus:\n{}\nlog:\n{}",
            String::from_utf8_lossy(&all.stdout),
            String::from_utf8_lossy(&status.stdout),
            daemon.log_text()
        );
    }
    found.into_inner().expect("found")
}

#[test]
fn one_busy_rank_while_the_others_wait_is_the_straggler() {
    let test = "one_busy_rank_while_the_others_wait_is_the_straggler";
    let Some((_tmp, lib, nvml, mut job, data, mut daemon)) = setup(test) else { return };
    daemon.wait_ready();
    let waiting: Vec<u32> = (0..3).map(|_| job.rank(&lib, &["--stall", "60"])).collect();
    let slow = job.rank(&lib, &["--busy", "60"]);
    // GPUs 0-2 held by the waiting ranks, GPU 3 by the slow one.
    let (w0, w1, w2) = ([waiting[0]], [waiting[1]], [waiting[2]]);
    nvml.say(&h100s(&[(25, &w0), (25, &w1), (25, &w2), (99, &[slow])]));
    wait_probed(&data, 1);
    job.go();
    let started = now_secs();
    // The window is 10 s, judged at each drain; the GPU seconds come up to 3 s late. A rank
    // whose window is not covered yet is not judged: the finding may first name fewer waiting
    // ranks (seen once under load: two of three) and is updated as the others come in.
    wait_finding(&data, "gpu-straggler", 60, &daemon);
    let all_three = |f: &Value| f["evidence"]["waiting_ranks"].as_array().is_some_and(|r| r.len() == 3);
    let found = std::panic::catch_unwind(|| {
        wait_for_every(
            "the finding with all three waiting ranks",
            Duration::from_secs(30),
            Duration::from_millis(500),
            || findings(&data, "gpu-straggler").into_iter().find(|f| all_three(f)),
        )
    });
    let f = found
        .unwrap_or_else(|_| panic!("no finding with three waiting ranks: {:#?}", findings(&data, "gpu-straggler")));
    let summary = f["summary"].as_str().unwrap();
    eprintln!("after {:.1} s: {summary}", now_secs() - started);
    let e = &f["evidence"];
    assert_eq!(e["pid"], slow, "{f}");
    assert_eq!(e["gpu"], 3, "{f}");
    // Python's main thread launches: the busiest thread is the process's own.
    assert_eq!(e["busiest_tid"], slow, "{f}");
    let line = e["python_line"].as_str().unwrap_or_default();
    assert!(line.starts_with("forward (") && line.contains("cuda_app.py:"), "the slow rank's line: {f}");
    assert!(summary.starts_with(&format!("python3 (pid {slow}")), "{summary}");
    assert!(summary.contains("is the job's slow rank: its GPU 3 (NVIDIA H100 80GB HBM3) was 99 % busy"), "{summary}");
    assert!(summary.contains(&format!("its busiest thread {slow}, ")), "{summary}");
    assert!(summary.contains(&format!("of its launches from {line}")), "{summary}");
    let others = e["waiting_ranks"].as_array().unwrap();
    let mut pids: Vec<u64> = others.iter().map(|r| r["pid"].as_u64().unwrap()).collect();
    pids.sort_unstable();
    let mut want: Vec<u64> = waiting.iter().map(|p| u64::from(*p)).collect();
    want.sort_unstable();
    assert_eq!(pids, want, "the waiting ranks: {f}");
    assert!(others.iter().all(|r| r["sync_share"].as_f64().unwrap() >= 0.5), "{f}");
    // Never another rank named.
    for s in findings(&data, "gpu-straggler") {
        assert_eq!(s["evidence"]["pid"], slow, "{s}");
    }
    daemon.stop();
}

#[test]
fn a_balanced_job_raises_no_straggler() {
    let test = "a_balanced_job_raises_no_straggler";
    let Some((_tmp, lib, nvml, mut job, data, mut daemon)) = setup(test) else { return };
    daemon.wait_ready();
    // Every rank waits alike on its own busy GPU: the GPUs set the pace, no rank lags.
    let ranks: Vec<u32> = (0..4).map(|_| job.rank(&lib, &["--stall", "60"])).collect();
    let held: Vec<[u32; 1]> = ranks.iter().map(|p| [*p]).collect();
    let gpus = |util: u32| h100s(&held.iter().map(|h| (util, &h[..])).collect::<Vec<_>>());
    nvml.say(&gpus(95));
    wait_probed(&data, 1);
    job.go();
    let go = now_secs();
    // Judged: each rank's waits stored for 14 s past the start (the 10 s window covered, then
    // drained and its GPU seconds in), every drain meanwhile finding nothing.
    let dir = data.to_str().unwrap().to_string();
    wait_for_every("14 s of every rank's waits judged", Duration::from_secs(60), Duration::from_millis(500), || {
        for kind in ["gpu-straggler", "gpu-sync-stall"] {
            let f = findings(&data, kind);
            assert!(f.is_empty(), "a balanced job on busy GPUs raised {kind}: {f:?}");
        }
        let from = format!("{:.0}", go + 14.0);
        let judged = ranks.iter().all(|pid| {
            let pid = pid.to_string();
            let args = ["--samples", "cuda-sync", "--from", &from, "--to", "now", "--pid", &pid];
            integration_tests::folded(&dir, &args).is_ok_and(|l| !l.is_empty())
        });
        (judged && now_secs() > go + 18.0).then_some(())
    });
    // The detectors were judging these threads: with the GPUs idle, each rank's wait is a stall.
    nvml.say(&gpus(10));
    let stall = wait_finding(&data, "gpu-sync-stall", 40, &daemon);
    assert!(ranks.iter().any(|p| stall["evidence"]["pid"] == *p), "{stall}");
    assert!(findings(&data, "gpu-straggler").is_empty(), "all ranks waiting: no one lags");
    daemon.stop();
}
