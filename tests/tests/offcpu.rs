//! Off-CPU time on this kernel (issue 42): a reader blocked on a slow pipe is credited the time
//! it measured itself (± 5 %) under its function, in the `sleep` state, waiting on a pipe, with
//! the kernel's pipe read; a reader throttled by a block I/O limit (blkio/io.max on a loop device
//! of the test's own, read with O_DIRECT: uninterruptible sleep in the block layer, a real I/O wait) raises
//! `io-stall`; two threads ping-ponging through pipes (hundreds of thousands of waits a second,
//! each microseconds long) stay under the rate limit and raise nothing.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::{Daemon, Kill, bin, now_secs, privileged, profiler, skip, wait_for_every};
use serde_json::Value;

/// `profiler flamegraph --samples off-cpu --format folded` over `[from, to)` (unix seconds).
fn off_cpu(dir: &str, from: f64, to: f64, extra: &[&str]) -> Vec<(String, u64)> {
    integration_tests::folded_window(dir, from, to, &[&["--samples", "off-cpu"], extra].concat()).unwrap_or_default()
}

fn findings(dir: &str, kind: &str) -> Vec<Value> {
    let out = profiler(&["findings", "--data-dir", dir, "--from", "-15m", "--format", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let all: Vec<Value> = serde_json::from_slice(&out.stdout).expect("findings json");
    all.into_iter().filter(|f| f["kind"] == kind).collect()
}

fn field(text: &str, name: &str) -> u128 {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in {text:?}"))
}

#[test]
fn a_reader_blocked_on_a_slow_pipe_is_credited_the_time_it_waited_under_its_function() {
    if !privileged("a_reader_blocked_on_a_slow_pipe_is_credited_the_time_it_waited_under_its_function") {
        return;
    }
    let (_tmp, data, _daemon) = Daemon::ready_in_tempdir(&[]);
    let dir = data.to_str().unwrap();
    // 25 warm-up reads from the measured reads' place (the thread's first long wait has no
    // stack, its first walk there is within a budget a loaded machine spends early each second,
    // and the daemon reads the process's unwind tables once it waits), a pause of 2.5 s outside
    // the function, then 100 reads of a byte written every 20 ms.
    let out = Command::new(bin("slow-pipe")).args(["25", "100", "20", "2500"]).output().expect("slow-pipe");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (blocked, from, to) = (field(&text, "blocked_ns"), field(&text, "from_ns"), field(&text, "to_ns"));
    let blocked_us = (blocked / 1_000) as f64;
    let (from, to) = ((from / 1_000_000_000) as f64 - 1.0, (to / 1_000_000_000) as f64 + 2.0);
    let under = |stacks: &[(String, u64)]| -> u64 {
        stacks.iter().filter(|(s, _)| s.contains(";offcpu_slow_reader")).map(|(_, n)| n).sum()
    };
    // Counts are drained once a second and read a drain late: wait until all of it is there
    // (it only grows), then judge.
    let (credited, stacks) = wait_for_every(
        "the reader's waits in the off-CPU store",
        Duration::from_secs(30),
        Duration::from_millis(500),
        || {
            let stacks = off_cpu(dir, from, to, &["--comm", "slow-pipe"]);
            let n = under(&stacks);
            (n as f64 >= 0.95 * blocked_us && now_secs() > to + 3.0).then_some((n, stacks))
        },
    );
    let share = credited as f64 / blocked_us;
    eprintln!("slow-pipe: {credited} µs credited under offcpu_slow_reader of {blocked_us} µs measured ({share:.4})");
    assert!((0.95..=1.05).contains(&share), "credited {credited} µs of {blocked_us} µs: {stacks:#?}");
    // In interruptible sleep, in the kernel's pipe read.
    let top = stacks.iter().filter(|(s, _)| s.contains(";offcpu_slow_reader")).max_by_key(|(_, n)| *n).unwrap();
    assert!(top.0.starts_with("slow-pipe;[off-cpu: sleep];[wait: pipe];"), "{top:?}");
    assert!(top.0.contains("pipe_read_[k]"), "the kernel's pipe read names the wait: {top:?}");
    // `--state` selects by that frame: none of it is I/O.
    assert_eq!(under(&off_cpu(dir, from, to, &["--comm", "slow-pipe", "--state", "io"])), 0);
    let sleeping = under(&off_cpu(dir, from, to, &["--comm", "slow-pipe", "--state", "sleep"]));
    assert_eq!(sleeping, credited);
    // And by what it waited on: a pipe, not a lock.
    assert_eq!(under(&off_cpu(dir, from, to, &["--comm", "slow-pipe", "--state", "pipe"])), credited);
    assert_eq!(under(&off_cpu(dir, from, to, &["--comm", "slow-pipe", "--state", "lock"])), 0);
}

/// A loop device over a file of the test's own, detached when dropped.
struct Loop(String);

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// A block I/O cgroup limiting reads of one device, removed when dropped.
struct Throttle(PathBuf);

impl Drop for Throttle {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Limits reads of device `dev` (`MAJ:MIN`) to `bps` in a new cgroup: v1's blkio, else v2's io.
fn throttle(dev: &str, bps: u64) -> Result<Throttle, String> {
    let name = format!("offcpu-test-{}", std::process::id());
    let v1 = Path::new("/sys/fs/cgroup/blkio");
    let (dir, file, line) = if v1.join("blkio.throttle.read_bps_device").exists() {
        (v1.join(&name), "blkio.throttle.read_bps_device", format!("{dev} {bps}"))
    } else {
        let root = Path::new("/sys/fs/cgroup");
        let enabled = std::fs::read_to_string(root.join("cgroup.subtree_control")).unwrap_or_default();
        if !enabled.split_whitespace().any(|c| c == "io") {
            std::fs::write(root.join("cgroup.subtree_control"), "+io")
                .map_err(|e| format!("cannot enable cgroup v2's io controller: {e}"))?;
        }
        (root.join(&name), "io.max", format!("{dev} rbps={bps}"))
    };
    std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let t = Throttle(dir.clone());
    std::fs::write(dir.join(file), line).map_err(|e| format!("cannot limit {dev}'s reads: {e}"))?;
    Ok(t)
}

#[test]
fn a_reader_throttled_by_a_block_io_limit_raises_io_stall() {
    if !privileged("a_reader_throttled_by_a_block_io_limit_raises_io_stall") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let image = tmp.path().join("disk.img");
    std::fs::File::create(&image).and_then(|f| f.set_len(64 << 20)).expect("disk image");
    let out = Command::new("losetup").args(["-f", "--show"]).arg(&image).output();
    let device = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        other => {
            skip(&format!("no loop device for the throttled reader: {other:?}"));
            return;
        }
    };
    let _loop = Loop(device.clone());
    let dev_name = device.trim_start_matches("/dev/");
    let dev = std::fs::read_to_string(format!("/sys/block/{dev_name}/dev")).expect("device number");
    let limit = match throttle(dev.trim(), 1 << 20) {
        Ok(t) => t,
        Err(e) => {
            skip(&format!("no block I/O limit: {e}"));
            return;
        }
    };
    let (_tmp, data, _daemon) = Daemon::ready_in_tempdir(&[]);
    let dir = data.to_str().unwrap();
    // 20 MiB at 1 MiB/s with O_DIRECT: dd waits in the block layer ~all of 20 s.
    let procs = limit.0.join("cgroup.procs");
    let script = format!("echo $$ > {}; exec dd if={device} of=/dev/null bs=1M iflag=direct count=20", procs.display());
    let _reader = Kill(Command::new("sh").args(["-c", &script]).stderr(Stdio::null()).spawn().expect("dd"));
    let start = now_secs();
    let (f, seen) = wait_for_every("an io-stall finding", Duration::from_secs(25), Duration::from_millis(500), || {
        findings(dir, "io-stall").into_iter().find(|f| f["evidence"]["comm"] == "dd").map(|f| (f, now_secs()))
    });
    let summary = f["summary"].as_str().unwrap_or_default();
    eprintln!("io-stall after {:.1} s: {summary}", seen - start);
    assert!(summary.starts_with("dd (pid "), "{f}");
    assert!(summary.contains("blocked in I/O"), "{f}");
    assert!(f["evidence"]["io_share"].as_f64().unwrap() >= 0.5, "{f}");
    assert!(f["evidence"]["waits_in"].as_str().is_some_and(|w| !w.is_empty()), "the kernel function: {f}");
    // The same waits as off-CPU time in the io state, under dd.
    let io = off_cpu(dir, start - 1.0, now_secs() + 1.0, &["--comm", "dd", "--state", "io"]);
    let us: u64 = io.iter().map(|(_, n)| n).sum();
    assert!(us >= 5_000_000, "dd's I/O wait as off-CPU time: {us} µs: {io:#?}");
    // On a block device, under `[wait: file]`: what `--state file` selects.
    let walked: u64 = io.iter().filter(|(s, _)| !s.contains("[stack not walked")).map(|(_, n)| n).sum();
    let file: u64 = io.iter().filter(|(s, _)| s.contains(";[off-cpu: io];[wait: file];")).map(|(_, n)| n).sum();
    eprintln!("dd: {us} µs in io, {walked} with a stack, {file} under [wait: file]");
    assert!(walked > 0 && file as f64 >= 0.9 * walked as f64, "{io:#?}");
    let selected = off_cpu(dir, start - 1.0, now_secs() + 1.0, &["--comm", "dd", "--state", "file"]);
    assert!(selected.iter().map(|(_, n)| n).sum::<u64>() >= file, "{selected:#?}");
}

#[test]
fn many_short_waits_stay_under_the_rate_limit_and_raise_nothing() {
    if !privileged("many_short_waits_stay_under_the_rate_limit_and_raise_nothing") {
        return;
    }
    let (_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&[]);
    let dir = data.to_str().unwrap();
    let out = Command::new(bin("pingpong")).arg("8").output().expect("pingpong");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rate = field(&String::from_utf8_lossy(&out.stdout), "switches_per_sec");
    eprintln!("pingpong: {rate} passes a second");
    assert!(rate > 10_000, "the ping-pong ran: {rate} a second");
    // Drained a drain late: past it, the daemon stops and says its totals.
    std::thread::sleep(Duration::from_secs(3));
    daemon.stop();
    let log = daemon.log_text();
    let totals = log.lines().rev().find(|l| l.contains("off-CPU counts so far")).expect("the daemon's off-CPU totals");
    eprintln!("{totals}");
    assert_eq!(field(totals, "sampled_out"), 0, "under the rate limit: {totals}");
    assert_eq!(field(totals, "dropped"), 0, "{totals}");
    // Its waits are microseconds, under the threshold: of its millions of waits, those
    // recorded are the few a loaded machine stretched past a millisecond (every wait on the
    // machine counts in the totals; the ping-pong's passes are most of them).
    let passes = rate as f64 * 8.0;
    let recorded = field(totals, "recorded_waits") as f64;
    assert!(recorded < 0.01 * passes, "{recorded} waits recorded of {passes} passes: {totals}");
    assert!(findings(dir, "io-stall").is_empty(), "{:#?}", findings(dir, "io-stall"));
}
