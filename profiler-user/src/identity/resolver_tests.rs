use std::path::Path;

use super::*;
use crate::identity::Runtime;

const ID: &str = "5dab0ec4aebed0b17e8b783c11b859f43da98335fd4973a396ed7bbdab6659f3";
const UID: &str = "d8559883-9d60-478a-8cb5-cc238a63d908";
const UID_: &str = "d8559883_9d60_478a_8cb5_cc238a63d908";

/// A fake `/proc` and kubelet log layout in one temp dir.
struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["proc", "containers", "pods"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        Node { dir }
    }

    fn path(&self, sub: &str) -> std::path::PathBuf {
        self.dir.path().join(sub)
    }

    fn process(&self, pid: u32, cgroup: &str) {
        let dir = self.path(&format!("proc/{pid}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup"), cgroup).unwrap();
    }

    fn exit(&self, pid: u32) {
        std::fs::remove_dir_all(self.path(&format!("proc/{pid}"))).unwrap();
    }

    fn pod_dir(&self) {
        std::fs::create_dir_all(self.path(&format!("pods/shop_web-1_{UID}/nginx"))).unwrap();
    }

    fn container_link(&self) {
        let target = self.path(&format!("pods/shop_web-1_{UID}/nginx/0.log"));
        std::fs::write(&target, b"").unwrap();
        std::os::unix::fs::symlink(target, self.path(&format!("containers/web-1_shop_nginx-{ID}.log"))).unwrap();
    }

    fn resolver(&self) -> Resolver {
        Resolver::new(self.path("proc"), self.path("containers"), self.path("pods"))
    }
}

fn systemd_pod_cgroup() -> String {
    format!(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope\n"
    )
}

fn assert_named(identity: &Identity) {
    assert_eq!(identity.container_id.as_deref(), Some(ID));
    assert_eq!(identity.runtime, Runtime::Containerd);
    assert_eq!(identity.pod_uid.as_deref(), Some(UID));
    assert_eq!(identity.pod_namespace.as_deref(), Some("shop"));
    assert_eq!(identity.pod_name.as_deref(), Some("web-1"));
    assert_eq!(identity.container_name.as_deref(), Some("nginx"));
    assert_eq!(identity.unit, None);
}

#[test]
fn names_a_pod_process_and_the_answer_outlives_the_container() {
    let node = Node::new();
    node.pod_dir();
    node.container_link();
    node.process(42, &systemd_pod_cgroup());
    let mut resolver = node.resolver();
    assert_named(&resolver.resolve(42));
    // The container is gone: process, symlink and pod directory. The answer stays.
    node.exit(42);
    std::fs::remove_dir_all(node.path("containers")).unwrap();
    std::fs::remove_dir_all(node.path("pods")).unwrap();
    assert_named(&resolver.resolve(42));
}

#[test]
fn host_processes_get_their_unit_or_nothing() {
    let node = Node::new();
    node.process(1, "0::/init.scope\n");
    node.process(7, "0::/system.slice/sshd.service\n");
    node.process(2, "0::/\n");
    let mut resolver = node.resolver();
    assert_eq!(resolver.resolve(7).unit.as_deref(), Some("sshd.service"));
    assert_eq!(resolver.resolve(1).unit.as_deref(), Some("init.scope"));
    assert_eq!(resolver.resolve(2), Identity::default());
    assert_eq!(resolver.resolve(99), Identity::default(), "no such process");
}

#[test]
fn names_that_come_after_the_first_sample_are_picked_up() {
    let node = Node::new();
    node.process(42, &systemd_pod_cgroup());
    let mut resolver = node.resolver();
    let t0 = Instant::now();
    let first = resolver.resolve_at(42, t0);
    assert_eq!(first.container_id.as_deref(), Some(ID));
    assert_eq!(first.pod_name, None);
    // The pod's directory appears, then the kubelet links the container's log.
    node.pod_dir();
    let second = resolver.resolve_at(42, t0 + MIN_REBUILD);
    assert_eq!(second.pod_name.as_deref(), Some("web-1"));
    assert_eq!(second.container_name, None);
    node.container_link();
    assert_named(&resolver.resolve_at(42, t0 + 2 * MIN_REBUILD));
}

#[test]
fn names_are_not_waited_for_beyond_the_retry_window() {
    let node = Node::new();
    node.process(42, &systemd_pod_cgroup());
    let mut resolver = node.resolver();
    let t0 = Instant::now();
    assert_eq!(resolver.resolve_at(42, t0).pod_name, None);
    node.pod_dir();
    node.container_link();
    // Asked often enough to stay cached, but past the window: the answer is final.
    let late = t0 + RETRY_NAMES_FOR + Duration::from_secs(1);
    assert_eq!(resolver.resolve_at(42, late).pod_name, None);
    // A new pid of the same container is looked up afresh.
    node.process(43, &systemd_pod_cgroup());
    assert_named(&resolver.resolve_at(43, late));
}

#[test]
fn containers_outside_kubernetes_wait_for_no_names() {
    let node = Node::new();
    node.process(5, &format!("0::/system.slice/docker-{ID}.scope\n"));
    let mut resolver = node.resolver();
    let t0 = Instant::now();
    resolver.resolve_at(5, t0);
    assert!(resolver.cache.peek(&5).unwrap().retry_until.is_none());
    node.process(6, &systemd_pod_cgroup());
    resolver.resolve_at(6, t0);
    assert!(resolver.cache.peek(&6).unwrap().retry_until.is_some(), "a pod's names are waited for");
}

#[test]
fn idle_pids_are_forgotten_and_busy_ones_kept() {
    let node = Node::new();
    node.process(10, "0::/system.slice/a.service\n");
    node.process(11, "0::/system.slice/b.service\n");
    let mut resolver = node.resolver();
    let t0 = Instant::now();
    resolver.resolve_at(10, t0);
    resolver.resolve_at(11, t0);
    // Both pids get new processes (new cgroups): only a forgotten pid sees it.
    node.process(10, "0::/system.slice/c.service\n");
    node.process(11, "0::/system.slice/d.service\n");
    let mut t = t0;
    while t < t0 + IDLE_TTL + SWEEP_EVERY {
        t += Duration::from_secs(5);
        assert_eq!(resolver.resolve_at(11, t).unit.as_deref(), Some("b.service"), "busy pid kept");
    }
    assert_eq!(resolver.resolve_at(10, t).unit.as_deref(), Some("c.service"), "idle pid forgotten");
    assert_eq!(resolver.cache.len(), 2);
}

#[test]
fn forget_drops_a_pid_at_once() {
    let node = Node::new();
    node.process(10, "0::/system.slice/a.service\n");
    let mut resolver = node.resolver();
    assert_eq!(resolver.resolve(10).unit.as_deref(), Some("a.service"));
    node.process(10, "0::/system.slice/b.service\n");
    assert_eq!(resolver.resolve(10).unit.as_deref(), Some("a.service"));
    resolver.forget(10);
    assert_eq!(resolver.resolve(10).unit.as_deref(), Some("b.service"));
}

#[test]
fn default_reads_the_host() {
    let mut resolver = Resolver::default();
    assert_eq!(resolver.proc_root, Path::new("/proc"));
    // This test's own process exists, whatever it belongs to.
    let _ = resolver.resolve(std::process::id());
    assert!(resolver.cache.contains(&std::process::id()));
}
