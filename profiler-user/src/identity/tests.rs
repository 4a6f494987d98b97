use std::{
    io::Read,
    path::{Path, PathBuf},
    process::{Child, Command},
};

use profiler_common::test_skip::skip;

use super::*;

const ID: &str = "5dab0ec4aebed0b17e8b783c11b859f43da98335fd4973a396ed7bbdab6659f3";
const UID: &str = "d8559883-9d60-478a-8cb5-cc238a63d908";

fn nginx() -> Identity {
    Identity {
        container_id: Some(ID.into()),
        runtime: Runtime::Containerd,
        pod_uid: Some(UID.into()),
        pod_namespace: Some("shop".into()),
        pod_name: Some("web-7d4b9c-x2x7k".into()),
        container_name: Some("nginx".into()),
        unit: None,
    }
}

fn sshd() -> Identity {
    Identity { unit: Some("sshd.service".into()), ..Default::default() }
}

fn filter(pod: Option<&str>, namespace: Option<&str>, container: Option<&str>, unit: Option<&str>) -> Filter {
    let own = |s: Option<&str>| s.map(String::from);
    Filter { pod: own(pod), namespace: own(namespace), container: own(container), unit: own(unit) }
}

#[test]
fn an_empty_filter_matches_everything() {
    assert!(nginx().matches(&Filter::default()));
    assert!(Identity::default().matches(&Filter::default()));
}

#[test]
fn pods_by_name_namespaced_name_or_uid() {
    assert!(nginx().matches(&filter(Some("web-7d4b9c-x2x7k"), None, None, None)));
    assert!(nginx().matches(&filter(Some("shop/web-7d4b9c-x2x7k"), None, None, None)));
    assert!(nginx().matches(&filter(Some(UID), None, None, None)));
    assert!(!nginx().matches(&filter(Some("default/web-7d4b9c-x2x7k"), None, None, None)));
    assert!(!nginx().matches(&filter(Some("web"), None, None, None)), "exact, not a prefix");
    assert!(!sshd().matches(&filter(Some("web-7d4b9c-x2x7k"), None, None, None)));
}

#[test]
fn a_pod_is_named_as_the_pod_filter_takes_it_back() {
    let pod = nginx().pod().unwrap();
    assert_eq!(pod, "shop/web-7d4b9c-x2x7k");
    assert!(nginx().matches(&filter(Some(&pod), None, None, None)));
    let uid_only = Identity { pod_uid: Some(UID.into()), ..Default::default() };
    assert_eq!(uid_only.pod().as_deref(), Some(UID));
    assert_eq!(sshd().pod(), None);
}

#[test]
fn every_given_field_must_match() {
    assert!(nginx().matches(&filter(None, Some("shop"), Some("nginx"), None)));
    assert!(!nginx().matches(&filter(None, Some("shop"), Some("php"), None)));
    assert!(!nginx().matches(&filter(None, Some("kube-system"), Some("nginx"), None)));
    assert!(!nginx().matches(&filter(None, None, None, Some("sshd"))));
}

#[test]
fn containers_by_name_or_id() {
    assert!(nginx().matches(&filter(None, None, Some("nginx"), None)));
    assert!(nginx().matches(&filter(None, None, Some(ID), None)));
    assert!(nginx().matches(&filter(None, None, Some(&ID[..12]), None)), "docker ps's short id");
    assert!(nginx().matches(&filter(None, None, Some(&ID[..13]), None)), "crictl ps's short id");
    assert!(!nginx().matches(&filter(None, None, Some(&ID[..6]), None)), "too short to be an id");
    assert!(!nginx().matches(&filter(None, None, Some("ngin"), None)));
}

#[test]
fn units_as_systemctl_takes_them() {
    assert!(sshd().matches(&filter(None, None, None, Some("sshd.service"))));
    assert!(sshd().matches(&filter(None, None, None, Some("sshd"))));
    let session = Identity { unit: Some("session-3.scope".into()), ..Default::default() };
    assert!(session.matches(&filter(None, None, None, Some("session-3.scope"))));
    assert!(!session.matches(&filter(None, None, None, Some("session-3"))), "a bare name means .service");
    assert!(!Identity::default().matches(&filter(None, None, None, Some("sshd"))));
}

#[test]
fn identities_round_trip_through_json_and_postcard() {
    let json = serde_json::to_string(&nginx()).unwrap();
    let back: Identity = serde_json::from_str(&json).unwrap();
    assert_eq!(back, nginx());
    let bytes = postcard::to_allocvec(&sshd()).unwrap();
    assert_eq!(postcard::from_bytes::<Identity>(&bytes).unwrap(), sshd());
}

// --- On the real kernel: a process moved into a kubepods cgroup (cgroupfs driver layout). ---

/// The cgroup v1 hierarchy with the cpu controller: `cpu,cpuacct` where the two are co-mounted,
/// else `cpu`.
fn cpu_hierarchy() -> Option<PathBuf> {
    ["/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"]
        .into_iter()
        .map(PathBuf::from)
        .find(|dir| dir.join("cgroup.procs").exists() && dir.join("cpu.shares").exists())
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf)).expect("read /dev/urandom");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Kills the child and removes the cgroups it made, deepest first, however the test ends.
struct Cleanup {
    child: Option<Child>,
    made: Vec<PathBuf>,
}

impl Cleanup {
    fn mkdir(&mut self, dir: &Path) {
        match std::fs::create_dir(dir) {
            Ok(()) => self.made.push(dir.to_path_buf()),
            // A real node's `kubepods` is left as found.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => panic!("mkdir {}: {e}", dir.display()),
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
        for dir in self.made.iter().rev() {
            // A cgroup whose last task just exited can stay busy for a moment.
            for _ in 0..50 {
                match std::fs::remove_dir(dir) {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(std::time::Duration::from_millis(20))
                    }
                    Err(e) => {
                        eprintln!("cannot remove {}: {e}", dir.display());
                        break;
                    }
                    Ok(()) => break,
                }
            }
        }
    }
}

#[test]
fn resolves_a_process_in_a_real_kubepods_cgroup() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip("resolves_a_process_in_a_real_kubepods_cgroup: needs root to create cgroups");
        return;
    }
    let Some(hierarchy) = cpu_hierarchy() else {
        skip("resolves_a_process_in_a_real_kubepods_cgroup: no cgroup v1 cpu hierarchy under /sys/fs/cgroup");
        return;
    };
    let r = random_hex(16);
    let uid = format!("{}-{}-{}-{}-{}", &r[..8], &r[8..12], &r[12..16], &r[16..20], &r[20..]);
    let id = random_hex(32);
    let mut cleanup = Cleanup { child: None, made: Vec::new() };
    let container_dir = hierarchy.join(format!("kubepods/burstable/pod{uid}/{id}"));
    for dir in container_dir.ancestors().take(4).collect::<Vec<_>>().into_iter().rev() {
        cleanup.mkdir(dir);
    }
    let child = Command::new("sleep").arg("30").spawn().expect("spawn sleep");
    let pid = child.id();
    cleanup.child = Some(child);
    std::fs::write(container_dir.join("cgroup.procs"), pid.to_string()).expect("move the child into the cgroup");

    // The kubelet's log layout for that pod and container.
    let logs = tempfile::tempdir().unwrap();
    let (containers, pods) = (logs.path().join("containers"), logs.path().join("pods"));
    let log = pods.join(format!("shop_web-7d4b9c-x2x7k_{uid}/nginx/0.log"));
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    std::fs::write(&log, b"").unwrap();
    std::fs::create_dir(&containers).unwrap();
    std::os::unix::fs::symlink(&log, containers.join(format!("web-7d4b9c-x2x7k_shop_nginx-{id}.log"))).unwrap();

    let mut resolver = Resolver::new("/proc", &containers, &pods);
    let got = resolver.resolve(pid);
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert_eq!(got.container_id.as_deref(), Some(id.as_str()), "/proc/{pid}/cgroup:\n{text}");
    assert_eq!(got.pod_uid.as_deref(), Some(uid.as_str()));
    assert_eq!(got.pod_namespace.as_deref(), Some("shop"));
    assert_eq!(got.pod_name.as_deref(), Some("web-7d4b9c-x2x7k"));
    assert_eq!(got.container_name.as_deref(), Some("nginx"));
    // The cgroupfs driver names docker's and containerd's containers alike: no runtime to report.
    assert_eq!(got.runtime, Runtime::Unknown);
    assert_eq!(got.unit, None);
    assert_eq!(cgroup::parse_proc_cgroup(&text).qos, Some(cgroup::QosClass::Burstable));
}
