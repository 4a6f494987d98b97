//! Detector 8 on this kernel: two writers rewriting 256 MB files from a memory cgroup limited
//! to 16 MiB keep charging page cache over the limit, so the kernel reclaims the cgroup on
//! almost every write (memory-cgroup reclaim): a reclaim-stall finding names the CPU, the writer, the
//! cgroup with its usage and limit, the median and p99 of the stalls, and what to look at next;
//! the stalls are on the time axis as a kernel-counter track. The same writers without the
//! limit (their page cache fits in memory) raise nothing.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use integration_tests::{Daemon, Kill, now_secs, privileged, profiler, status_json, wait_for_every};
use serde_json::Value;

const MEMCG_ROOT: &str = "/sys/fs/cgroup/memory";

fn reclaim_findings(dir: &str) -> Vec<Value> {
    let out = profiler(&["findings", "--data-dir", dir, "--from", "-15m", "--format", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let all: Vec<Value> = serde_json::from_slice(&out.stdout).expect("findings json");
    all.into_iter().filter(|f| f["kind"] == "reclaim-stall").collect()
}

/// A memory cgroup for the test, removed (its tasks killed first) when dropped.
struct Memcg(PathBuf);

impl Drop for Memcg {
    fn drop(&mut self) {
        if let Ok(pids) = std::fs::read_to_string(self.0.join("cgroup.procs")) {
            for pid in pids.lines().filter_map(|p| p.parse::<i32>().ok()) {
                // SAFETY: killing the test's own writers.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::fs::remove_dir(&self.0).is_err() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A process rewriting a 256 MB file in place, forever; in `cgroup` when given. One long-lived
/// process (not a dd per pass), so that the summary names one pid. (The memory cgroup no longer
/// depends on it: the kernel reads it at the stall, below; a dd that exited before the daemon's
/// read once left the finding without one.)
fn writer(file: &Path, cgroup: Option<&Path>) -> Kill {
    let join = cgroup.map_or(String::new(), |c| format!("echo $$ > {}/cgroup.procs; ", c.display()));
    let script = format!(
        "{join}exec python3 -c 'import os\nf = os.open(\"{}\", os.O_WRONLY | os.O_CREAT)\nb = bytes(1 << 20)\nwhile True:\n    os.lseek(f, 0, 0)\n    for _ in range(256): os.write(f, b)\n'",
        file.display()
    );
    Kill(Command::new("sh").args(["-c", &script]).spawn().expect("spawn a writer"))
}

#[test]
fn writers_held_at_a_memory_cgroup_limit_stall_in_reclaim_and_unlimited_ones_do_not() {
    if !privileged("writers_held_at_a_memory_cgroup_limit_stall_in_reclaim_and_unlimited_ones_do_not") {
        return;
    }
    if !Path::new(MEMCG_ROOT).join("memory.limit_in_bytes").exists() {
        integration_tests::skip(
            "no cgroup v1 memory hierarchy at /sys/fs/cgroup/memory (the scenario sets a v1 limit)",
        );
        return;
    }
    let files = tempfile::tempdir_in("/var/tmp").expect("tempdir on disk");
    let (_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&[]);
    let dir = data.to_str().unwrap();

    // Healthy: the same writes with room for their page cache.
    let start = now_secs();
    let healthy: Vec<Kill> = (0..2).map(|i| writer(&files.path().join(format!("free{i}")), None)).collect();
    std::thread::sleep(Duration::from_secs(10));
    drop(healthy);
    let judged = start + 10.0;
    wait_for_every("the store to pass the unlimited run", Duration::from_secs(30), Duration::from_millis(250), || {
        let end = status_json(&data)?["summary"]["span"][1].as_u64()? as f64 / 1e9;
        (end > judged + 3.0).then_some(())
    });
    let quiet = reclaim_findings(dir);
    assert!(quiet.is_empty(), "writers with room for their page cache raised: {quiet:#?}");

    // Held at 16 MiB.
    let name = format!("profiler-test-reclaim-{}", std::process::id());
    let cgroup = Memcg(Path::new(MEMCG_ROOT).join(&name));
    std::fs::create_dir(&cgroup.0).expect("create the memory cgroup");
    std::fs::write(cgroup.0.join("memory.limit_in_bytes"), (16u64 << 20).to_string()).expect("set its limit");
    let start = now_secs();
    let _writers: Vec<Kill> = (0..2).map(|i| writer(&files.path().join(format!("held{i}")), Some(&cgroup.0))).collect();
    let (f, seen) =
        wait_for_every("a reclaim-stall finding", Duration::from_secs(30), Duration::from_millis(250), || {
            reclaim_findings(dir).into_iter().next().map(|f| (f, now_secs()))
        });
    // Its figures are rewritten while it lasts: wait for the samples to show what allocated.
    let sampled = wait_for_every(
        "a reclaim-stall finding with the sampled allocating paths",
        Duration::from_secs(30),
        Duration::from_millis(500),
        || {
            reclaim_findings(dir)
                .into_iter()
                .find(|f| f["evidence"]["allocating_paths"].as_array().is_some_and(|p| !p.is_empty()))
        },
    );
    let summary = f["summary"].as_str().unwrap_or_default();
    eprintln!("reclaim-stall after {:.1} s: {summary}", seen - start);
    assert!(summary.contains(" ms in memory-cgroup reclaim in one second ("), "{f}");
    assert!(summary.contains("python3 (pid"), "{f}");
    assert!(
        summary.contains(&format!("in memory cgroup /{name} (")) && summary.contains("of its 16.0 MiB limit"),
        "{f}"
    );
    assert!(summary.contains(&format!("look next: the limit of /{name}")), "{f}");
    // Named by the id the kernel read at the stall (its directory's inode), not from /proc: the
    // task that stalled longest may have exited by the time the daemon reads the stall.
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(&cgroup.0).expect("the cgroup's directory").ino();
    assert_eq!(f["evidence"]["memcg"]["id"].as_u64(), Some(ino), "{f}");
    assert!(f["cpu"].is_u64(), "{f}");
    // What allocated is named past the allocator's own frames (a write path, here).
    let paths = sampled["evidence"]["allocating_paths"].to_string();
    assert!(!paths.contains("charge_memcg") && paths.contains("write"), "{paths}");
    assert!(f["evidence"]["stalled_ms_per_second"].as_f64().unwrap() >= 100.0, "{f}");
    // The median and p99 stall from the kernel's histogram of their durations, never over the
    // longest (the sentence has them when there were enough stalls to say something).
    let e = &sampled["evidence"];
    let (p50, p99) = (e["stall_p50_ms"].as_f64(), e["stall_p99_ms"].as_f64());
    let (p50, p99) = p50.zip(p99).unwrap_or_else(|| panic!("no stall quantiles: {sampled}"));
    assert!(0.0 < p50 && p50 <= p99 && p99 <= e["longest_ms"].as_f64().unwrap(), "{sampled}");
    // The stalls on the time axis: a kernel-counter track of the finding's CPU (written each second).
    let cpu = f["cpu"].as_u64().unwrap().to_string();
    let stalled = || {
        let args = ["counters", "--data-dir", dir, "--from", "-2m", "--name", "reclaim.stall", "--cpu", &cpu];
        let out = profiler(&[&args[..], &["--format", "json"]].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let tracks: Value = serde_json::from_slice(&out.stdout).expect("counters JSON");
        tracks["tracks"][0]["points"]
            .as_array()
            .map(|p| p.iter().filter_map(|p| p[1].as_f64()).fold(0.0, f64::max))
            .unwrap_or(0.0)
    };
    wait_for_every(
        "the reclaim.stall track to show 100 ms/s",
        Duration::from_secs(15),
        Duration::from_millis(500),
        || (stalled() >= 100.0).then_some(()),
    );
    drop(_writers);
    drop(cgroup);
    assert!(daemon.stop().success());
}
