//! Who a process belongs to, read from the text of `/proc/PID/cgroup` alone: container runtime
//! and id, Kubernetes pod uid and QoS class, or the systemd unit of a process outside containers.
//!
//! Formats covered (each checked against the code or test data of a project that meets it):
//!
//! * kubelet, cgroupfs driver: `/kubepods/<qos>/pod<uid>/<id>`, with `<qos>` `burstable` or
//!   `besteffort` and no QoS level for Guaranteed pods (`/kubepods/pod<uid>/<id>`)
//!   (OpenTelemetry eBPF profiler `containermetadata/testdata/cgroupv1kubernetes`, Falco
//!   `libsinsp/cri.cpp` "non-systemd containerd", cAdvisor `container/containerd/factory.go`).
//!   Docker and containerd name the leaf alike, so the runtime is unknown there; CRI-O keeps its
//!   prefix, `.../pod<uid>/crio-<id>` (Falco `cri.cpp` "non-systemd cri-o").
//! * kubelet, systemd driver: `/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid>.slice/`
//!   then `cri-containerd-<id>.scope`, `crio-<id>.scope` or `docker-<id>.scope` (cri-dockerd), the
//!   uid's `-` escaped to `_` by the kubelet (OpenTelemetry `testdata/cgroupv1crikubernetes3`,
//!   `cgroupv2altkubernetes`; Falco `cri.cpp`). crun puts the processes one level down on
//!   cgroup v2, `crio-<id>.scope/container` (crun's `run.oci.systemd.subgroup`, default
//!   `container`).
//! * CRI-O's `crio-conmon-<id>.scope` (and podman's `libpod-conmon-<id>.scope`) holds the
//!   container's monitor, not the container: it is never taken for one (coroot-node-agent
//!   `cgroup/cgroup.go`, CRI-O `internal/config/cgmgr`).
//! * containerd without `SystemdCgroup = true` handed a systemd-style path: the whole
//!   `slice:prefix:id` as one name, `/kubepods-burstable-pod<uid>.slice:cri-containerd:<id>`, with
//!   the uid's dashes left in (OpenTelemetry `testdata/cgroupv1crikubernetes`, Falco `cri.cpp`).
//! * static pods: the uid is 32 hex digits (the md5 the kubelet computes in
//!   `pkg/kubelet/config/common.go`), not a UUID.
//! * Docker alone: `/docker/<id>` (cgroupfs), `/system.slice/docker-<id>.scope` (systemd) (Falco
//!   `docker.cpp`, neuvector `share/system/cgroup_test.go`).
//! * containerd alone: `/default/<id>` (the `default` namespace of `ctr` and nerdctl; Falco
//!   `containerd.cpp`), `/system.slice/nerdctl-<id>.scope` (nerdctl with systemd:
//!   `system.slice:nerdctl:<id>`). Podman: `/machine.slice/libpod-<id>.scope`.
//! * nesting (Kubernetes in a container: kind, minikube): the Kubernetes layout under a prefix,
//!   `/system.slice/docker-<node>.scope/kubepods.slice/...` (OpenTelemetry
//!   `testdata/cgroupv2minikube-docker`), or a kubelet with its own cgroup root (kind's
//!   `/kubelet`): `/docker/<node>/kubelet/kubepods/...` with cgroupfs, and with systemd, which
//!   writes the parent slices into each name, `/kubelet.slice/kubelet-kubepods.slice/
//!   kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod<uid>.slice/...`. The
//!   innermost container and pod are the ones reported.
//! * what a user can create is never a workload: below a systemd user manager
//!   (`user@UID.service`, which systemd delegates to the user, so that
//!   `…/user@1000.service/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope` is a name
//!   anyone can make) only units are reported, never a pod or container; and the resolver reports no
//!   container or pod for a process whose cgroup directory is not root's ([`owned_by_others`]).
//! * systemd units outside containers: `/system.slice/foo.service` → `foo.service`,
//!   `/user.slice/user-0.slice/session-3.scope` → `session-3.scope`; the user manager's own
//!   `user@0.service/init.scope` → `user@0.service`.

use serde::{Deserialize, Serialize};

/// The container runtime, as far as the cgroup name tells. New variants go at the end: the
/// variant index is what compact encodings store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Runtime {
    /// Not in a container, or in one whose name does not say (the kubelet's cgroupfs driver names
    /// docker and containerd containers alike: `<pod>/<id>`).
    #[default]
    Unknown,
    Docker,
    Containerd,
    CriO,
    Podman,
}

impl Runtime {
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Unknown => "unknown",
            Runtime::Docker => "docker",
            Runtime::Containerd => "containerd",
            Runtime::CriO => "cri-o",
            Runtime::Podman => "podman",
        }
    }
}

/// A pod's Kubernetes QoS class, from the kubelet's cgroup hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// What one cgroup path says about its processes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupIdentity {
    pub runtime: Runtime,
    /// 64 lowercase hex digits.
    pub container_id: Option<String>,
    /// With dashes (`0b3c6d1e-...`), as the API server and `/var/log/pods` write it; or the 32
    /// hex digits of a static pod.
    pub pod_uid: Option<String>,
    /// Set whenever `pod_uid` is.
    pub qos: Option<QosClass>,
    /// Only for processes in neither a container nor a pod.
    pub unit: Option<String>,
}

/// Reads the text of `/proc/PID/cgroup` (v1, v2 or both) and picks the line that identifies the
/// workload: the first, in order of preference (the v2 line unless it is `/`, then v1
/// `name=systemd`, `cpu`/`cpuacct`, `memory`, `pids`, the rest), that names a container; else
/// a pod; else a unit. Preference alone is not enough: on a v1 host a process can sit in a
/// container's `cpu` cgroup while its `name=systemd` cgroup is still a login session.
pub fn parse_proc_cgroup(text: &str) -> CgroupIdentity {
    let mut candidates: Vec<(u8, &str)> = text
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            let rank = if id == "0" && controllers.is_empty() {
                0
            } else {
                controllers.split(',').map(controller_rank).min().unwrap_or(5)
            };
            Some((rank, path.trim_end()))
        })
        .filter(|(_, path)| *path != "/")
        .collect();
    candidates.sort_by_key(|&(rank, _)| rank);
    let parsed: Vec<CgroupIdentity> = candidates.iter().map(|&(_, path)| parse_path(path)).collect();
    let pick = parsed
        .iter()
        .position(|c| c.container_id.is_some())
        .or_else(|| parsed.iter().position(|c| c.pod_uid.is_some()))
        .or_else(|| parsed.iter().position(|c| c.unit.is_some()));
    pick.map(|i| parsed[i].clone()).unwrap_or_default()
}

fn controller_rank(controller: &str) -> u8 {
    match controller {
        "name=systemd" => 1,
        "cpu" | "cpuacct" => 2,
        "memory" => 3,
        "pids" => 4,
        _ => 5,
    }
}

/// Parses one cgroup path (`/kubepods/burstable/pod<uid>/<id>`, ...) into what it identifies.
pub fn parse_path(path: &str) -> CgroupIdentity {
    // cgroup v2 marks a removed cgroup that still has (exiting) processes.
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    let mut out = CgroupIdentity::default();
    let mut walk = Walk::default();
    for segment in path.split('/').filter(|s| !s.is_empty() && *s != "." && *s != "..") {
        // containerd handed a systemd `slice:prefix:name` without a systemd driver names the
        // cgroup after the whole triple: read it as the slice, then `prefix-name`.
        let mut parts = segment.splitn(3, ':');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(slice), Some(prefix), Some(name)) => {
                walk.visit(slice, &mut out);
                walk.visit(&format!("{prefix}-{name}"), &mut out);
            }
            _ => walk.visit(segment, &mut out),
        }
    }
    if out.container_id.is_none() && out.pod_uid.is_none() {
        out.unit = walk.unit;
    }
    out
}

#[derive(Default)]
struct Walk {
    parent: String,
    qos: Option<QosClass>,
    unit: Option<String>,
    /// Below a user manager: the user names what follows.
    delegated: bool,
}

impl Walk {
    fn visit(&mut self, segment: &str, out: &mut CgroupIdentity) {
        if segment.starts_with("user@") && segment.ends_with(".service") {
            self.delegated = true;
            *out = CgroupIdentity::default();
        }
        if self.delegated {
            // The user's own units are theirs to name; pods and containers are not.
            if is_unit(segment) && !(segment == "init.scope" && self.unit.is_some()) {
                self.unit = Some(segment.to_string());
            }
            return;
        }
        if let Some(qos) = qos_of(segment) {
            self.qos = Some(qos);
        }
        if let Some(uid) = pod_uid_of(segment) {
            out.pod_uid = Some(uid);
            // A container above the pod is the node's (kind, minikube), not one of the pod's.
            (out.runtime, out.container_id) = (Runtime::Unknown, None);
            // The kubelet puts Guaranteed pods straight under `kubepods`, with no QoS level.
            out.qos = Some(self.qos.take().unwrap_or(QosClass::Guaranteed));
        }
        if let Some((runtime, id)) = container_of(segment, &self.parent) {
            out.runtime = runtime;
            out.container_id = Some(id.to_string());
        }
        if is_unit(segment) {
            // `user@0.service/init.scope` is the user manager itself: report the service.
            if !(segment == "init.scope" && self.unit.is_some()) {
                self.unit = Some(segment.to_string());
            }
        }
        segment.clone_into(&mut self.parent);
    }
}

/// Whether the cgroup directory of a process (the lines of its `/proc/PID/cgroup`, looked up
/// under `sys_cgroup`, normally `/sys/fs/cgroup`) belongs to someone other than root: a
/// directory a user created, so a name they chose. Directories not found say nothing.
pub fn owned_by_others(text: &str, sys_cgroup: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    text.lines().any(|line| {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            return false;
        };
        let path = path.trim_end().strip_suffix(" (deleted)").unwrap_or(path.trim_end());
        if path == "/" || path.split('/').any(|s| s == "..") {
            return false;
        }
        let rel = path.trim_start_matches('/');
        let roots: Vec<std::path::PathBuf> = if controllers.is_empty() {
            vec![sys_cgroup.to_path_buf(), sys_cgroup.join("unified")]
        } else {
            vec![sys_cgroup.join(controllers.strip_prefix("name=").unwrap_or(controllers))]
        };
        roots.iter().filter_map(|root| std::fs::metadata(root.join(rel)).ok()).any(|m| m.is_dir() && m.uid() != 0)
    })
}

/// The runtimes' systemd scope (and cgroupfs) prefixes.
const PREFIXES: [(&str, Runtime); 5] = [
    ("cri-containerd-", Runtime::Containerd),
    ("crio-", Runtime::CriO),
    ("docker-", Runtime::Docker),
    ("libpod-", Runtime::Podman),
    ("nerdctl-", Runtime::Containerd),
];

fn container_of<'a>(segment: &'a str, parent: &str) -> Option<(Runtime, &'a str)> {
    let stem = segment.strip_suffix(".scope").unwrap_or(segment);
    for (prefix, runtime) in PREFIXES {
        if let Some(rest) = stem.strip_prefix(prefix) {
            // `crio-conmon-<id>` / `libpod-conmon-<id>`: the monitor beside the container. The
            // hex check below already refuses it; said here so a looser id check never lets it in.
            if rest.starts_with("conmon-") {
                return None;
            }
            return is_container_id(rest).then_some((runtime, rest));
        }
    }
    if stem.len() != segment.len() || !is_container_id(stem) {
        return None;
    }
    let runtime = match parent {
        "docker" => Runtime::Docker,
        // containerd's default cgroup is `/<namespace>/<id>`; `ctr` and nerdctl use `default`.
        "default" => Runtime::Containerd,
        _ => Runtime::Unknown,
    };
    Some((runtime, stem))
}

fn qos_of(segment: &str) -> Option<QosClass> {
    let qos = |word: &str| match word {
        "burstable" => Some(QosClass::Burstable),
        "besteffort" => Some(QosClass::BestEffort),
        _ => None,
    };
    match segment.strip_suffix(".slice") {
        // `kubepods-burstable.slice`, `kubelet-kubepods-besteffort.slice`, and the pod slices.
        Some(stem) => stem.split('-').find_map(qos),
        None => qos(segment),
    }
}

/// `pod<uid>` (cgroupfs) or `...-pod<uid>.slice` (systemd, `_` for `-`), returned with dashes.
fn pod_uid_of(segment: &str) -> Option<String> {
    let stem = segment.strip_suffix(".slice").unwrap_or(segment);
    // The uid is the tail: 36 characters (a UUID) or 32 (a static pod's md5).
    [36, 32].into_iter().find_map(|len| {
        let split = stem.len().checked_sub(len)?;
        let (head, uid) = (stem.get(..split)?, stem.get(split..)?);
        let head = head.strip_suffix("pod")?;
        if !(head.is_empty() || head.ends_with('-')) {
            return None;
        }
        normalize_pod_uid(uid)
    })
}

/// A pod uid as the kubelet writes it in cgroup names: a UUID with `-` or `_` (systemd escapes
/// `-`) or 32 hex digits; returned with `-`.
fn normalize_pod_uid(uid: &str) -> Option<String> {
    let b = uid.as_bytes();
    match b.len() {
        32 if b.iter().all(is_lower_hex) => Some(uid.to_string()),
        36 => {
            let sep = b[8];
            let ok = (sep == b'-' || sep == b'_')
                && b.iter().enumerate().all(|(i, c)| match i {
                    8 | 13 | 18 | 23 => *c == sep,
                    _ => is_lower_hex(c),
                });
            ok.then(|| uid.replace('_', "-"))
        }
        _ => None,
    }
}

/// A pod uid as `/var/log/pods` writes it: a dashed UUID or a static pod's 32 hex digits.
pub(super) fn is_pod_uid(uid: &str) -> bool {
    !uid.contains('_') && normalize_pod_uid(uid).is_some()
}

pub(super) fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.as_bytes().iter().all(is_lower_hex)
}

fn is_lower_hex(c: &u8) -> bool {
    c.is_ascii_digit() || (b'a'..=b'f').contains(c)
}

/// Units that hold processes; slices only group other units.
fn is_unit(segment: &str) -> bool {
    [".service", ".scope", ".socket", ".mount", ".swap"].iter().any(|suffix| segment.ends_with(suffix))
}

#[cfg(test)]
#[path = "cgroup_tests.rs"]
mod tests;
