//! Pod and container identity (issue 13): a process in a kubepods cgroup, named by a kubelet log
//! layout, is stored with its pod, namespace and container; `--pod`, `--namespace`,
//! `--container` and `--unit` select it, a process beside it stays out, and pprof exports carry
//! the labels. The cgroup is real (cgroup v1 here, made by the test); the kubelet's log
//! directory is a temporary one given with `--kubelet-logs`. On the page (headless Chromium),
//! the process's frame offers "only pod X", which filters every chart by the pod.

use std::{
    io::Read,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use integration_tests::{
    Daemon, folded_window, helper_bin, now_secs, privileged, profiler, skip, status_json, wait_for,
};

mod browser;

const SECS: f64 = 3.0;

/// A cgroup v1 hierarchy a process can be moved into (`cpu,cpuacct` or `cpu` here).
fn cpu_hierarchy() -> Option<PathBuf> {
    ["/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/pids"]
        .into_iter()
        .map(PathBuf::from)
        .find(|dir| dir.join("cgroup.procs").exists())
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf)).unwrap();
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Kills the children and removes the cgroups made, deepest first, however the test ends.
#[derive(Default)]
struct Cleanup {
    children: Vec<Child>,
    made: Vec<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for dir in self.made.iter().rev() {
            // A cgroup whose last task just exited stays busy for a moment.
            let _ = wait_for_quietly(|| std::fs::remove_dir(dir).is_ok() || !dir.exists());
        }
    }
}

fn wait_for_quietly(mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn labels_of_pprof(data: &Path, from: f64, to: f64) -> String {
    let out = tempfile::NamedTempFile::new().unwrap();
    let (from, to) = (format!("{from:.3}"), format!("{to:.3}"));
    let o = profiler(&[
        "export",
        "--data-dir",
        data.to_str().unwrap(),
        "--from",
        &from,
        "--to",
        &to,
        "--pod",
        "shop/web-7d4b9c-x2x7k",
        "--format",
        "pprof",
        "-o",
        out.path().to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The string table of the gzipped profile holds every label key and value.
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(out.path()).unwrap()).read_to_end(&mut raw).unwrap();
    String::from_utf8_lossy(&raw).into_owned()
}

#[test]
fn a_pods_samples_are_stored_with_its_identity_and_selected_by_it() {
    if !privileged("a_pods_samples_are_stored_with_its_identity_and_selected_by_it") {
        return;
    }
    let hierarchy = cpu_hierarchy().expect("a cgroup v1 hierarchy to move a process into");
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
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join(format!("pods/shop_web-7d4b9c-x2x7k_{uid}/nginx/0.log"));
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    std::fs::write(&log, b"").unwrap();
    std::fs::create_dir(logs.path().join("containers")).unwrap();
    let link = logs.path().join(format!("containers/web-7d4b9c-x2x7k_shop_nginx-{id}.log"));
    std::os::unix::fs::symlink(&log, link).unwrap();

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let (_tmp, data, mut daemon) =
        Daemon::ready_in_tempdir(&["--listen", &listen, "--kubelet-logs", logs.path().to_str().unwrap()]);
    let dir = data.to_str().unwrap();
    let start = now_secs();
    // The pod's process enters its container's cgroup and then execs, as runc does.
    let procs = container_dir.join("cgroup.procs");
    let script = format!("echo $$ > {} && exec {} 1 {SECS}", procs.display(), helper_bin().display());
    cleanup.children.push(Command::new("sh").args(["-c", &script]).stdout(Stdio::null()).spawn().unwrap());
    // A host process beside it, on the other CPU.
    cleanup
        .children
        .push(Command::new(helper_bin()).args(["0", &SECS.to_string()]).stdout(Stdio::null()).spawn().unwrap());
    for c in &mut cleanup.children {
        assert!(c.wait().unwrap().success());
    }
    let end = now_secs();
    // Every count below reads the same window: all of it written first.
    wait_for("the store to pass the window", Duration::from_secs(30), || {
        let written = status_json(&data)?["summary"]["span"][1].as_u64()? as f64 / 1e9;
        (written > end + 1.0).then_some(())
    });
    let all = wait_for("both processes' samples", Duration::from_secs(30), || {
        let stacks = folded_window(dir, start, end + 0.5, &["--comm", "busy-helper"]).ok()?;
        let total: u64 = stacks.iter().map(|(_, n)| n).sum();
        (total as f64 >= 2.0 * SECS * 99.0 * 0.7).then_some(total)
    });
    let count = |filter: &[&str]| -> Result<u64, String> {
        let mut args = vec!["--comm", "busy-helper"];
        args.extend_from_slice(filter);
        Ok(folded_window(dir, start, end + 0.5, &args)?.iter().map(|(_, n)| n).sum())
    };
    let pod = count(&["--pod", "shop/web-7d4b9c-x2x7k"]).unwrap();
    eprintln!("busy-helper: {all} samples, {pod} of them in the pod");
    // One of the two processes: about half, never all and never none.
    assert!(pod as f64 >= SECS * 99.0 * 0.7 && pod < all, "{pod} of {all}");
    for filter in [
        &["--pod", "web-7d4b9c-x2x7k"][..],
        &["--pod", &uid],
        &["--namespace", "shop"],
        &["--container", "nginx"],
        &["--container", &id[..12]],
        &["--namespace", "shop", "--container", "nginx"],
    ] {
        assert_eq!(count(filter), Ok(pod), "{filter:?}");
    }
    for filter in
        [&["--pod", "web"][..], &["--namespace", "kube-system"], &["--container", "nginx", "--unit", "kubelet"]]
    {
        let got = count(filter);
        assert!(got.as_ref().is_err_and(|e| e.contains("no samples match")), "{filter:?}: {got:?}");
    }
    let strings = labels_of_pprof(&data, start, end + 0.5);
    for want in ["namespace", "shop", "pod", "web-7d4b9c-x2x7k", "container", "nginx", id.as_str()] {
        assert!(strings.contains(want), "pprof export lacks {want}");
    }
    only_the_pod_on_the_page(&data, start, end + 0.5, pod);
    assert!(daemon.stop().success());
}

/// The page of the window, the busy-helper's frame clicked: it offers its pod (with its share of
/// the process), and taking the offer filters the charts by the pod: `pod` samples are left.
fn only_the_pod_on_the_page(data: &Path, from: f64, to: f64, pod: u64) {
    if !browser::installed() {
        skip("the page check needs Debian's chromium and chromium-driver (cargo xtask test installs them)");
        return;
    }
    let out = profiler(&["ui", "--data-dir", data.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (base, token) = String::from_utf8_lossy(&out.stdout)
        .trim()
        .split_once("/#token=")
        .map(|(b, t)| (b.to_string(), t.to_string()))
        .unwrap();
    let url = format!("{base}/?from={from:.3}&to={to:.3}&comm=busy-helper&sel={from:.3},{to:.3}#token={token}");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        let (_driver, client) = browser::open("1400,1000").await;
        client.goto(&url).await.unwrap();
        let offered = browser::until(
            &client,
            "the pod offered on the process's frame",
            "const f = document.querySelector('#flamegraph [data-name=busy-helper]'); if (!f) return null; f.click(); \
             const b = [...document.querySelectorAll('#picked button')].map((b) => b.textContent); \
             return b.some((t) => t.startsWith('only pod')) ? b : null",
        )
        .await;
        let text = offered.to_string();
        assert!(text.contains("only pod shop/web-7d4b9c-x2x7k (") && text.contains("% of busy-helper)"), "{text}");
        client
            .execute(
                "[...document.querySelectorAll('#picked button')].find((b) => b.textContent.startsWith('only pod')).click()",
                vec![],
            )
            .await
            .unwrap();
        let filtered = browser::until(
            &client,
            "the charts filtered by the pod",
            "const f = document.getElementById('flamegraph'), S = window.profilerUI.state, q = f.dataset.drawn || ''; \
             return q.includes('pod=shop%2Fweb-7d4b9c-x2x7k') && (document.getElementById('heatmap').dataset.query || '').includes('pod=shop') \
                 && S.tree && f.querySelector('[data-name=busy-helper]') ? [S.tree.value, location.search] : null",
        )
        .await;
        assert_eq!(filtered[0].as_u64(), Some(pod), "the pod's samples only: {filtered}");
        assert!(filtered[1].as_str().unwrap().contains("pod=shop%2Fweb-7d4b9c-x2x7k"), "{filtered}");
        eprintln!("page: the process's frame offered {offered}; the pod's flamegraph holds {} samples", filtered[0]);
        let _ = client.close().await;
    });
}

/// Issue 25: a user names cgroups like a pod's where it may create them (below its systemd
/// user manager, which systemd delegates to it, or in a directory it owns) and runs there,
/// with the kubelet's log layout naming the pod: its samples are stored with no pod and no
/// container, while they are stored (so the test sees the processes were sampled).
#[test]
fn cgroups_a_user_can_create_make_no_pod() {
    if !privileged("cgroups_a_user_can_create_make_no_pod") {
        return;
    }
    let hierarchy = cpu_hierarchy().expect("a cgroup v1 hierarchy to move a process into");
    let mut cleanup = Cleanup::default();
    let logs = tempfile::tempdir().unwrap();
    std::fs::create_dir(logs.path().join("containers")).unwrap();
    let mut forged = Vec::new();
    // (below the user manager: systemd's names; a directory the user owns: cgroupfs names;
    // how many of the path's directories the user owns)
    for (i, (layout, owned)) in [
        ("user.slice/user-65534.slice/user@65534.service/kubepods-burstable-pod{uid}.slice/cri-containerd-{id}.scope", 3),
        ("kubepods/besteffort/pod{uid}/{id}", 2),
    ]
    .into_iter()
    .enumerate()
    {
        let r = random_hex(16);
        let uid = format!("{}-{}-{}-{}-{}", &r[..8], &r[8..12], &r[12..16], &r[16..20], &r[20..]);
        let id = random_hex(32);
        let dir = hierarchy.join(layout.replace("{uid}", &uid).replace("{id}", &id));
        let depth = dir.strip_prefix(&hierarchy).unwrap().components().count();
        for (n, d) in dir.ancestors().take(depth).collect::<Vec<_>>().into_iter().rev().enumerate() {
            match std::fs::create_dir(d) {
                Ok(()) => cleanup.made.push(d.to_path_buf()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => panic!("mkdir {}: {e}", d.display()),
            }
            if n >= depth - owned {
                std::os::unix::fs::chown(d, Some(65534), Some(65534)).unwrap();
            }
        }
        let pod = format!("victim-{i}");
        let log = logs.path().join(format!("pods/payments_{pod}_{uid}/api/0.log"));
        std::fs::create_dir_all(log.parent().unwrap()).unwrap();
        std::fs::write(&log, b"").unwrap();
        let link = logs.path().join(format!("containers/{pod}_payments_api-{id}.log"));
        std::os::unix::fs::symlink(&log, link).unwrap();
        forged.push((dir, pod));
    }
    let (_tmp, data, mut daemon) =
        Daemon::ready_in_tempdir(&["--listen", "off", "--kubelet-logs", logs.path().to_str().unwrap()]);
    let dir = data.to_str().unwrap();
    let start = now_secs();
    let mut pids = Vec::new();
    for (i, (cgroup, _)) in forged.iter().enumerate() {
        // Root moves the shell there (as the user's manager would); the user's program runs.
        let script = format!(
            "echo $$ > {} && exec setpriv --reuid 65534 --regid 65534 --clear-groups -- {} {i} {SECS}",
            cgroup.join("cgroup.procs").display(),
            helper_bin().display()
        );
        let child = Command::new("sh").args(["-c", &script]).stdout(Stdio::null()).spawn().unwrap();
        pids.push(child.id());
        cleanup.children.push(child);
    }
    for c in &mut cleanup.children {
        assert!(c.wait().unwrap().success());
    }
    let end = now_secs();
    wait_for("the store to pass the window", Duration::from_secs(30), || {
        let written = status_json(&data)?["summary"]["span"][1].as_u64()? as f64 / 1e9;
        (written > end + 1.0).then_some(())
    });
    for (pid, (cgroup, pod)) in pids.iter().zip(&forged) {
        let pid = pid.to_string();
        let total: u64 = folded_window(dir, start, end + 0.5, &["--pid", &pid]).unwrap().iter().map(|(_, n)| n).sum();
        // (A loaded machine gives the user's spinner less than its CPU: what matters is that it
        // was sampled.)
        assert!(total >= 30, "only {total} samples of the process in {}", cgroup.display());
        for filter in [&["--pod", pod.as_str()][..], &["--namespace", "payments"], &["--container", "api"]] {
            let mut args = vec!["--pid", pid.as_str()];
            args.extend_from_slice(filter);
            let got = folded_window(dir, start, end + 0.5, &args);
            assert!(
                got.as_ref().is_err_and(|e| e.contains("no samples match")),
                "a user's cgroup {} gave its samples {filter:?}: {got:?}",
                cgroup.display()
            );
        }
    }
    assert!(daemon.stop().success());
}
