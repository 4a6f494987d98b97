//! Pod and container names from what the kubelet leaves on the node, so no API server is needed:
//!
//! * `/var/log/containers/<pod>_<namespace>_<container>-<container id>.log` (kubelet
//!   `kuberuntime/legacy.go`, `logSymlink`): one symlink per container, named after the pod, its
//!   namespace and the container. None of these names can hold `_` (DNS labels and subdomains),
//!   and the id is the last `-` field. Names longer than 255 bytes are cut at 251 + `.log`, which
//!   eats the id's tail first: a cut id still names its container by prefix.
//! * `/var/log/pods/<namespace>_<pod>_<uid>/` (kubelet `kuberuntime/helpers.go`,
//!   `BuildPodLogsDirectory`): one directory per pod, made when its sandbox starts, before any
//!   container's symlink. It maps a pod uid (from the cgroup) to its namespace and name.
//!
//! The index is rebuilt by listing both directories when a lookup misses, at most once per
//! `min_rebuild`: new pods appear without a watch, and a node's worth of misses (pause
//! containers, plain docker containers) costs one listing per interval.

use std::{
    collections::HashSet,
    io,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use rustc_hash::FxHashMap;

use super::{
    IdentityError,
    cgroup::{is_container_id, is_pod_uid},
};

/// Where a container runs, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ContainerNames {
    pub namespace: Arc<str>,
    pub pod: Arc<str>,
    pub container: Arc<str>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PodNames {
    pub namespace: Arc<str>,
    pub pod: Arc<str>,
}

/// Shortest id prefix a cut file name may leave and still be trusted (docker's short id).
const MIN_ID_PREFIX: usize = 12;
/// The kubelet's cut-off for a file name (ext4's limit), `.log` included.
const MAX_FILE_NAME: usize = 255;

pub(super) struct KubeletIndex {
    containers_dir: PathBuf,
    pods_dir: PathBuf,
    min_rebuild: Duration,
    built_at: Option<Instant>,
    containers: FxHashMap<Arc<str>, ContainerNames>,
    /// Containers whose file name was cut inside the id: (id prefix, names).
    cut: Vec<(Arc<str>, ContainerNames)>,
    pods: FxHashMap<Arc<str>, PodNames>,
    /// A listing failed and was reported.
    warned: bool,
}

impl KubeletIndex {
    pub fn new(containers_dir: PathBuf, pods_dir: PathBuf, min_rebuild: Duration) -> Self {
        KubeletIndex {
            containers_dir,
            pods_dir,
            min_rebuild,
            built_at: None,
            containers: FxHashMap::default(),
            cut: Vec::new(),
            pods: FxHashMap::default(),
            warned: false,
        }
    }

    /// The names of container `id` (64 hex digits), rebuilding the index on a miss if due.
    pub fn container(&mut self, id: &str, now: Instant) -> Option<ContainerNames> {
        if let Some(names) = self.find_container(id) {
            return Some(names.clone());
        }
        self.rebuild_if_due(now).then(|| self.find_container(id).cloned()).flatten()
    }

    fn find_container(&self, id: &str) -> Option<&ContainerNames> {
        let by_prefix = || self.cut.iter().find(|(prefix, _)| id.starts_with(&**prefix)).map(|(_, names)| names);
        self.containers.get(id).or_else(by_prefix)
    }

    /// The namespace and name of the pod with `uid`, rebuilding the index on a miss if due.
    pub fn pod(&mut self, uid: &str, now: Instant) -> Option<PodNames> {
        if let Some(names) = self.pods.get(uid) {
            return Some(names.clone());
        }
        self.rebuild_if_due(now).then(|| self.pods.get(uid).cloned()).flatten()
    }

    fn rebuild_if_due(&mut self, now: Instant) -> bool {
        if self.built_at.is_some_and(|at| now.saturating_duration_since(at) < self.min_rebuild) {
            return false;
        }
        self.built_at = Some(now);
        if let Err(e) = self.rebuild() {
            // Once: the same error would come back with every rebuild.
            if std::mem::replace(&mut self.warned, true) {
                tracing::debug!("pod and container names may be missing: {e}");
            } else {
                tracing::warn!("pod and container names may be missing: {e}");
            }
        }
        true
    }

    /// Replaces the index with what the two directories hold now. A missing directory is an
    /// empty one: not every host is a Kubernetes node.
    fn rebuild(&mut self) -> Result<(), IdentityError> {
        self.containers.clear();
        self.cut.clear();
        self.pods.clear();
        // One Arc per distinct name: a namespace is shared by all its pods' entries.
        let mut names: HashSet<Arc<str>> = HashSet::new();
        let mut intern = |s: &str| match names.get(s) {
            Some(name) => name.clone(),
            None => {
                let name: Arc<str> = s.into();
                names.insert(name.clone());
                name
            }
        };
        // Each directory on its own: one unreadable one still leaves the other's names.
        let (pods, containers) = (list(&self.pods_dir), list(&self.containers_dir));
        for name in pods.as_deref().unwrap_or_default() {
            if let Some((namespace, pod, uid)) = parse_pod_dir(name) {
                let names = PodNames { namespace: intern(namespace), pod: intern(pod) };
                self.pods.insert(uid.into(), names);
            }
        }
        for name in containers.as_deref().unwrap_or_default() {
            let Some(file) = parse_container_log(name) else { continue };
            let names = ContainerNames {
                namespace: intern(file.namespace),
                pod: intern(file.pod),
                container: intern(file.container),
            };
            if file.cut {
                self.cut.push((file.id.into(), names));
            } else {
                self.containers.insert(file.id.into(), names);
            }
        }
        pods.and(containers).map(drop)
    }
}

/// The entry names of `dir`; none when it does not exist.
fn list(dir: &Path) -> Result<Vec<String>, IdentityError> {
    let read = |source: io::Error| IdentityError::ListDir { path: dir.to_path_buf(), source };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(read(e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        // Names that are not UTF-8 are no kubelet's.
        if let Ok(name) = entry.map_err(read)?.file_name().into_string() {
            names.push(name);
        }
    }
    Ok(names)
}

/// `<namespace>_<pod>_<uid>` → (namespace, pod, uid).
fn parse_pod_dir(name: &str) -> Option<(&str, &str, &str)> {
    let mut fields = name.split('_');
    let (namespace, pod, uid) = (fields.next()?, fields.next()?, fields.next()?);
    let valid = fields.next().is_none() && !namespace.is_empty() && !pod.is_empty() && is_pod_uid(uid);
    valid.then_some((namespace, pod, uid))
}

#[derive(Debug, PartialEq, Eq)]
struct ContainerLog<'a> {
    pod: &'a str,
    namespace: &'a str,
    container: &'a str,
    id: &'a str,
    /// The kubelet cut the name: `id` is only a prefix.
    cut: bool,
}

/// `<pod>_<namespace>_<container>-<id>.log`.
fn parse_container_log(name: &str) -> Option<ContainerLog<'_>> {
    let (head, id) = name.strip_suffix(".log")?.rsplit_once('-')?;
    let mut fields = head.split('_');
    let (pod, namespace, container) = (fields.next()?, fields.next()?, fields.next()?);
    if fields.next().is_some() || [pod, namespace, container].iter().any(|s| s.is_empty()) {
        return None;
    }
    // A cut name is exactly the limit long; a cut any shorter than a short id could have gone
    // through the container name, and its last `-` would split the wrong field.
    let cut = name.len() == MAX_FILE_NAME
        && (MIN_ID_PREFIX..64).contains(&id.len())
        && id.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c));
    (cut || is_container_id(id)).then_some(ContainerLog { pod, namespace, container, id, cut })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "5dab0ec4aebed0b17e8b783c11b859f43da98335fd4973a396ed7bbdab6659f3";
    const UID: &str = "d8559883-9d60-478a-8cb5-cc238a63d908";

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"").unwrap();
    }

    /// A kubelet's log layout in a temp dir: `containers/` and `pods/`.
    struct Layout {
        dir: tempfile::TempDir,
    }

    impl Layout {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir(dir.path().join("containers")).unwrap();
            std::fs::create_dir(dir.path().join("pods")).unwrap();
            Layout { dir }
        }

        fn pod(&self, namespace: &str, pod: &str, uid: &str) {
            std::fs::create_dir_all(self.dir.path().join(format!("pods/{namespace}_{pod}_{uid}"))).unwrap();
        }

        /// The symlink, pointing where the kubelet points it.
        fn container(&self, namespace: &str, pod: &str, uid: &str, container: &str, id: &str) {
            let target = self.dir.path().join(format!("pods/{namespace}_{pod}_{uid}/{container}/0.log"));
            touch(&target);
            let link = self.dir.path().join(format!("containers/{pod}_{namespace}_{container}-{id}.log"));
            std::os::unix::fs::symlink(target, link).unwrap();
        }

        fn index(&self, min_rebuild: Duration) -> KubeletIndex {
            KubeletIndex::new(self.dir.path().join("containers"), self.dir.path().join("pods"), min_rebuild)
        }
    }

    #[test]
    fn container_log_names() {
        let name = format!("web-7d4b9c-x2x7k_shop_nginx-proxy-{ID}.log");
        let got = parse_container_log(&name).unwrap();
        let want =
            ContainerLog { pod: "web-7d4b9c-x2x7k", namespace: "shop", container: "nginx-proxy", id: ID, cut: false };
        assert_eq!(got, want);
        assert_eq!(parse_container_log(&format!("a_b_c-{ID}.txt")), None);
        assert_eq!(parse_container_log(&format!("a_b-{ID}.log")), None, "no container field");
        assert_eq!(parse_container_log(&format!("a_b_c_d-{ID}.log")), None, "names hold no `_`");
        assert_eq!(parse_container_log(&format!("_b_c-{ID}.log")), None);
        assert_eq!(parse_container_log("a_b_c-1234.log"), None, "a short id in a short name is no id");
    }

    #[test]
    fn a_name_cut_at_255_bytes_keeps_an_id_prefix() {
        let pod = "p".repeat(200);
        let full = format!("{pod}_ns_app-{ID}");
        let name = format!("{}.log", &full[..MAX_FILE_NAME - 4]);
        assert_eq!(name.len(), MAX_FILE_NAME);
        let got = parse_container_log(&name).unwrap();
        assert!(got.cut);
        assert!(ID.starts_with(got.id) && got.id.len() >= MIN_ID_PREFIX);
        assert_eq!((got.pod, got.namespace, got.container), (pod.as_str(), "ns", "app"));
        // Cut inside the container name: not trusted.
        let long = "p".repeat(242);
        let name = format!("{}.log", &format!("{long}_ns_my-app-{ID}")[..MAX_FILE_NAME - 4]);
        assert!(name.ends_with("_ns_my-ap.log"));
        assert_eq!(parse_container_log(&name), None);
    }

    #[test]
    fn pod_dir_names() {
        assert_eq!(parse_pod_dir(&format!("shop_web-1_{UID}")), Some(("shop", "web-1", UID)));
        assert_eq!(
            parse_pod_dir(&format!("kube-system_etcd-node1_{}", "a".repeat(32))).map(|p| p.1),
            Some("etcd-node1")
        );
        assert_eq!(parse_pod_dir(UID), None, "the pre-1.14 layout, uid alone, names nothing");
        assert_eq!(parse_pod_dir("shop_web-1_notauid"), None);
        assert_eq!(parse_pod_dir(&format!("shop_web_1_{UID}")), None);
    }

    #[test]
    fn finds_containers_and_pods_in_a_kubelet_layout() {
        let layout = Layout::new();
        layout.pod("shop", "web-1", UID);
        layout.container("shop", "web-1", UID, "nginx", ID);
        let mut index = layout.index(Duration::from_secs(2));
        let now = Instant::now();
        let names = index.container(ID, now).unwrap();
        assert_eq!((&*names.namespace, &*names.pod, &*names.container), ("shop", "web-1", "nginx"));
        let pod = index.pod(UID, now).unwrap();
        assert_eq!((&*pod.namespace, &*pod.pod), ("shop", "web-1"));
        // Both entries share the pod's strings.
        assert!(Arc::ptr_eq(&names.pod, &pod.pod));
        assert_eq!(index.container(&"0".repeat(64), now), None);
    }

    #[test]
    fn a_miss_rebuilds_at_most_once_per_interval() {
        let layout = Layout::new();
        let mut index = layout.index(Duration::from_secs(2));
        let t0 = Instant::now();
        assert_eq!(index.container(ID, t0), None);
        layout.pod("shop", "web-1", UID);
        layout.container("shop", "web-1", UID, "nginx", ID);
        assert_eq!(index.container(ID, t0 + Duration::from_millis(1999)), None, "rebuilt too soon");
        assert_eq!(index.pod(UID, t0 + Duration::from_millis(1999)), None, "rebuilt too soon");
        assert!(index.container(ID, t0 + Duration::from_secs(2)).is_some());
        // Gone from disk, but a hit does not rebuild: the answer stays until a miss is due.
        std::fs::remove_dir_all(layout.dir.path().join("containers")).unwrap();
        assert!(index.container(ID, t0 + Duration::from_secs(10)).is_some());
        // The next due miss rebuilds and forgets it (a missing directory is an empty one).
        assert_eq!(index.pod("11111111-2222-3333-4444-555555555555", t0 + Duration::from_secs(10)), None);
        assert_eq!(index.container(ID, t0 + Duration::from_secs(10)), None);
    }

    #[test]
    fn a_cut_name_is_found_by_the_full_id() {
        let layout = Layout::new();
        let full = format!("{}_ns_app-{ID}", "p".repeat(200));
        let name = format!("{}.log", &full[..MAX_FILE_NAME - 4]);
        touch(&layout.dir.path().join("containers").join(name));
        let mut index = layout.index(Duration::from_secs(2));
        let names = index.container(ID, Instant::now()).unwrap();
        assert_eq!(&*names.container, "app");
        assert_eq!(index.container(&"f".repeat(64), Instant::now()), None);
    }

    #[test]
    fn an_unreadable_directory_leaves_the_others_names() {
        let layout = Layout::new();
        layout.container("shop", "web-1", UID, "nginx", ID);
        // Not a directory: listing fails with something other than "not found".
        let pods = layout.dir.path().join("pods-file");
        std::fs::write(&pods, b"").unwrap();
        let mut index = KubeletIndex::new(layout.dir.path().join("containers"), pods, Duration::ZERO);
        assert_eq!(index.pod(UID, Instant::now()), None);
        assert!(index.warned);
        assert_eq!(index.container(ID, Instant::now()).map(|n| n.container), Some("nginx".into()));
    }

    #[test]
    fn missing_directories_are_empty() {
        let mut index = KubeletIndex::new("/nonexistent/c".into(), "/nonexistent/p".into(), Duration::ZERO);
        assert_eq!(index.container(ID, Instant::now()), None);
        assert_eq!(index.pod(UID, Instant::now()), None);
        assert!(!index.warned, "no kubelet here is not worth a warning");
    }
}
