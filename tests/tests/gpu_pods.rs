//! The processes holding a GPU carry their pod and container (issue 26), through the identity
//! module as samples do: a real process in a real kubepods cgroup (cgroup v1, made by the test),
//! named by a kubelet log layout in a temporary directory (`--kubelet-logs`), holds the GPU of
//! the NVML stand-in; `profiler status` lists it with its pod and container, and `/metrics`'
//! per-process gauges carry them as labels.

use std::{
    io::Read,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use integration_tests::{
    Daemon, helper_bin, http_get,
    nvml::{StandIn, h100},
    privileged, profiler, skip, wait_for,
};

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf)).unwrap();
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Kills the holder and removes the cgroups made, deepest first, however the test ends.
#[derive(Default)]
struct Cleanup {
    child: Option<Child>,
    made: Vec<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
        for dir in self.made.iter().rev() {
            // A cgroup whose last task just exited stays busy for a moment.
            let deadline = std::time::Instant::now() + Duration::from_secs(2);
            while std::fs::remove_dir(dir).is_err() && dir.exists() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

#[test]
fn a_gpus_holder_is_listed_with_its_pod_and_container() {
    let test = "a_gpus_holder_is_listed_with_its_pod_and_container";
    if !privileged(test) {
        return;
    }
    let Some(hierarchy) = ["/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/pids"]
        .into_iter()
        .map(PathBuf::from)
        .find(|dir| dir.join("cgroup.procs").exists())
    else {
        skip(&format!("{test}: no cgroup v1 hierarchy to move a process into"));
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let Some(nvml) = StandIn::build_or_skip(tmp.path(), false, test) else { return };
    let r = random_hex(16);
    let uid = format!("{}-{}-{}-{}-{}", &r[..8], &r[8..12], &r[12..16], &r[16..20], &r[20..]);
    let id = random_hex(32);
    let mut cleanup = Cleanup::default();
    let container_dir = hierarchy.join(format!("kubepods/burstable/pod{uid}/{id}"));
    for dir in container_dir.ancestors().take(4).collect::<Vec<_>>().into_iter().rev() {
        match std::fs::create_dir(dir) {
            Ok(()) => cleanup.made.push(dir.to_path_buf()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => panic!("mkdir {}: {e}", dir.display()),
        }
    }
    // The kubelet's log layout for the pod and its container.
    let logs = tmp.path().join("logs");
    let log = logs.join(format!("pods/ml_trainer-7_{uid}/main/0.log"));
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    std::fs::write(&log, b"").unwrap();
    std::fs::create_dir(logs.join("containers")).unwrap();
    std::os::unix::fs::symlink(&log, logs.join(format!("containers/trainer-7_ml_main-{id}.log"))).unwrap();
    // The holder enters its container's cgroup and then execs, as runc does.
    let procs = container_dir.join("cgroup.procs");
    let script = format!("echo $$ > {} && exec {} 1 120", procs.display(), helper_bin().display());
    let child = Command::new("sh").args(["-c", &script]).stdout(Stdio::null()).spawn().unwrap();
    let pid = child.id();
    cleanup.child = Some(child);
    wait_for("the holder in its cgroup", Duration::from_secs(5), || {
        std::fs::read_to_string(&procs).ok()?.lines().any(|l| l == pid.to_string()).then_some(())
    });
    nvml.say(&h100(40, &[pid], 0));

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let data = tmp.path().join("data");
    let args = ["--nvml-library", nvml.lib_str(), "--listen", &listen, "--kubelet-logs", logs.to_str().unwrap()];
    let mut daemon = Daemon::start(&data, &args);
    daemon.wait_ready();
    let want = format!("0 held by {pid} busy-helper (pod ml/trainer-7 container main)");
    let status = wait_for("the holder in profiler status", Duration::from_secs(15), || {
        let out = profiler(&["status", "--data-dir", data.to_str().unwrap()]);
        let text = String::from_utf8(out.stdout).ok()?;
        text.contains(&want).then_some(text)
    });
    assert!(status.contains("pod ml/trainer-7"), "{status}");
    let (code, metrics) = http_get(&listen, "/metrics", "127.0.0.1", None);
    assert_eq!(code, 200);
    let line = metrics
        .lines()
        .find(|l| l.starts_with("profiler_gpu_process_sm_utilization_ratio{"))
        .unwrap_or_else(|| panic!("no per-process gauge: {metrics}"));
    for label in [
        format!("pid=\"{pid}\""),
        "comm=\"busy-helper\"".into(),
        "namespace=\"ml\"".into(),
        "pod=\"trainer-7\"".into(),
        "container=\"main\"".into(),
    ] {
        assert!(line.contains(&label), "{label} in {line}");
    }
    assert!(line.ends_with(" 0.4"), "{line}");
    // The holder lets go: status follows.
    nvml.say(&h100(40, &[], 0));
    wait_for("the holder gone from status", Duration::from_secs(10), || {
        let out = profiler(&["status", "--data-dir", data.to_str().unwrap()]);
        (!String::from_utf8_lossy(&out.stdout).contains(" held by ")).then_some(())
    });
    assert!(daemon.stop().success());
}
