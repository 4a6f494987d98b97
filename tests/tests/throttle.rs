//! Detector 5 on this kernel: a busy process in a cgroup whose CPU quota (0.2 CPU) holds it back
//! is reported with the cgroup, the process and what it ran; a busy process under a quota it
//! never reaches (2 CPUs) is not. The cgroups are made in the cgroup v1 `cpu` hierarchy (or a
//! cgroup v2 one with the cpu controller) and removed at the end, also when the test fails.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use integration_tests::{Daemon, Kill, helper_bin, now_secs, privileged, profiler, skip, status_json, wait_for};
use serde_json::Value;

/// The hierarchy with the cpu controller: (mount point, is v2).
fn cpu_hierarchy() -> Option<(PathBuf, bool)> {
    let v1 = PathBuf::from("/sys/fs/cgroup/cpu");
    if v1.join("cpu.cfs_period_us").exists() {
        return Some((v1, false));
    }
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let dir = PathBuf::from(f.get(1)?);
        let controllers = std::fs::read_to_string(dir.join("cgroup.controllers")).ok()?;
        (f.get(2) == Some(&"cgroup2") && controllers.split_whitespace().any(|c| c == "cpu")).then_some((dir, true))
    })
}

/// A cpu cgroup with a quota, removed on drop (its processes, killed by then, moved out first).
struct CpuCgroup {
    dir: PathBuf,
    root: PathBuf,
}

impl CpuCgroup {
    fn new(root: &Path, v2: bool, name: &str, quota_us: u64, period_us: u64) -> Self {
        let dir = root.join(name);
        if v2 {
            // The children of the root get the cpu controller only if the root hands it down.
            let _ = std::fs::write(root.join("cgroup.subtree_control"), "+cpu");
        }
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let cg = CpuCgroup { dir, root: root.to_path_buf() };
        if v2 {
            cg.write("cpu.max", &format!("{quota_us} {period_us}"));
        } else {
            cg.write("cpu.cfs_period_us", &period_us.to_string());
            cg.write("cpu.cfs_quota_us", &quota_us.to_string());
        }
        cg
    }

    fn write(&self, file: &str, value: &str) {
        std::fs::write(self.dir.join(file), value).unwrap_or_else(|e| panic!("{}/{file}: {e}", self.dir.display()));
    }

    fn name(&self) -> String {
        format!("/{}", self.dir.file_name().unwrap().to_string_lossy())
    }

    /// `busy-helper CPU SECONDS`, in this cgroup from its first instruction (the shell moves
    /// itself in, then execs the helper).
    fn spawn_busy(&self, cpu: u32, secs: u32) -> Kill {
        let procs = self.dir.join("cgroup.procs");
        let script = format!("echo $$ > '{}' && exec '{}' {cpu} {secs}", procs.display(), helper_bin().display());
        Kill(Command::new("sh").args(["-c", &script]).stdout(Stdio::null()).spawn().expect("spawn"))
    }

    fn stat(&self, key: &str) -> u64 {
        let text = std::fs::read_to_string(self.dir.join("cpu.stat")).unwrap_or_default();
        text.lines().find_map(|l| l.strip_prefix(key)?.trim().parse().ok()).unwrap_or(0)
    }
}

impl Drop for CpuCgroup {
    fn drop(&mut self) {
        // The processes are killed and reaped by now (their guards were made later); a
        // cgroup is removable once the kernel has let go of them.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            for pid in std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default().lines() {
                let _ = std::fs::write(self.root.join("cgroup.procs"), pid);
            }
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn findings(dir: &str) -> Vec<Value> {
    let out = profiler(&["findings", "--data-dir", dir, "--from", "-15m", "--format", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("findings json")
}

#[test]
fn a_cgroup_held_by_its_cpu_quota_is_found_with_what_it_ran_and_one_under_its_quota_is_not() {
    if !privileged("a_cgroup_held_by_its_cpu_quota_is_found_with_what_it_ran_and_one_under_its_quota_is_not") {
        return;
    }
    let Some((root, v2)) = cpu_hierarchy() else {
        skip("no cgroup hierarchy here has the cpu controller (v1 /sys/fs/cgroup/cpu, or cgroup2 with cpu)");
        return;
    };
    let id = std::process::id();
    // 20 ms of CPU per 100 ms: a spinning process is throttled in nearly every period.
    let held = CpuCgroup::new(&root, v2, &format!("profiler-test-held-{id}"), 20_000, 100_000);
    // 2 CPUs' worth: one spinning process never reaches it.
    let roomy = CpuCgroup::new(&root, v2, &format!("profiler-test-roomy-{id}"), 200_000, 100_000);
    let (_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&[]);
    let dir = data.to_str().unwrap();

    let start = now_secs();
    let spinner = held.spawn_busy(1, 120);
    let _healthy = roomy.spawn_busy(0, 120);
    let pid = spinner.0.id();
    let (f, seen) = wait_for("a cfs-throttling finding on the held cgroup", Duration::from_secs(40), || {
        findings(dir)
            .into_iter()
            .find(|f| f["kind"] == "cfs-throttling" && f["evidence"]["path"] == held.name())
            .map(|f| (f, now_secs()))
    });
    let summary = f["summary"].as_str().unwrap_or_default().to_string();
    eprintln!("cfs-throttling after {:.1} s: {summary}", seen - start);
    assert!(summary.contains(&format!("cgroup {}{}", if v2 { "" } else { "v1 cpu:" }, held.name())), "{f:#}");
    assert!(summary.contains(&format!("busy-helper (pid {pid})")), "the process in it: {f:#}");
    assert!(summary.contains("by its quota of 0.20 CPU (20 ms per 100 ms)"), "{f:#}");
    assert!(summary.contains("next: ") && summary.contains(&format!("--pid {pid}")), "what to look at next: {f:#}");
    let ev = &f["evidence"];
    assert!(ev["throttled_share"].as_f64().unwrap() >= 0.25, "{f:#}");
    assert!(ev["pids"].as_array().unwrap().iter().any(|p| p == pid), "{f:#}");
    assert_eq!(ev["top_processes"][0]["pid"], pid, "{f:#}");
    // What it ran while it hit the quota: the helper's loop, from the samples of the cgroup.
    let functions: Vec<&str> =
        ev["top_functions"].as_array().unwrap().iter().filter_map(|f| f["function"].as_str()).collect();
    assert!(
        functions.contains(&"profiler_test_hot_loop"),
        "the helper spins in profiler_test_hot_loop, the finding says {functions:?}: {f:#}"
    );
    // The command the finding suggests shows that loop.
    let id = f["id"].as_str().unwrap();
    let stacks = integration_tests::folded(dir, &["--around", id, "--pid", &pid.to_string()]).expect("flamegraph");
    assert!(stacks.iter().any(|(s, _)| s.contains("profiler_test_hot_loop")), "{stacks:?}");

    // The roomy cgroup's process ran as long as a window or more, under a quota it never met...
    wait_for("15 s of periods in the roomy cgroup", Duration::from_secs(40), || {
        (roomy.stat("nr_periods") >= 150).then_some(())
    });
    assert_eq!(roomy.stat("nr_throttled"), 0, "the roomy cgroup was throttled: the test's premise is off");
    // ...and the daemon scanned it twice more since (every 5 s) with samples in the store.
    let judged = now_secs() + 11.0;
    wait_for("the daemon to run past two more scans", Duration::from_secs(30), || {
        let end = status_json(&data)?["summary"]["span"][1].as_u64()? as f64 / 1e9;
        (end > judged).then_some(())
    });
    let roomy_findings: Vec<Value> = findings(dir)
        .into_iter()
        .filter(|f| f["kind"] == "cfs-throttling" && f["evidence"]["path"] == roomy.name())
        .collect();
    assert!(roomy_findings.is_empty(), "a busy cgroup under its quota raised: {roomy_findings:#?}");
    assert!(daemon.stop().success());
}
