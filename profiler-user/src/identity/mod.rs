//! Who a process belongs to, without a Kubernetes API server: its container (runtime and id) and
//! pod (uid, namespace, name, container name) on a Kubernetes node, or its systemd unit outside
//! containers. The cgroup file says which container and pod (`cgroup`); the kubelet's log
//! directories say what they are called (`kubelet`).
//!
//! Use: [`Resolver::resolve`] a pid when it is first seen and keep the answer: once the container
//! is gone, its cgroup and log files are too. [`Workloads`] does so for the pipeline and gives
//! each sample the stored form of its identity (JSON, interned in the store's dictionary like
//! every string).

pub mod cgroup;
mod kubelet;
mod resolver;
#[cfg(test)]
mod tests;
pub mod workloads;

use std::{path::PathBuf, sync::Arc};

use serde::{Deserialize, Serialize};

pub use cgroup::Runtime;
pub use resolver::Resolver;
pub use workloads::Workloads;

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("cannot list {path}: {source} (mount the host's /var/log into the profiler's container)")]
    ListDir { path: PathBuf, source: std::io::Error },
}

/// Who a process belongs to. All `None` (the default) for a host process nothing is known of.
/// Strings are shared: a node's thousands of processes hold a few dozen distinct names.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct Identity {
    /// 64 hex digits.
    pub container_id: Option<Arc<str>>,
    pub runtime: Runtime,
    /// With dashes, as `kubectl get pod -o jsonpath='{.metadata.uid}'` prints it.
    pub pod_uid: Option<Arc<str>>,
    pub pod_namespace: Option<Arc<str>>,
    pub pod_name: Option<Arc<str>>,
    pub container_name: Option<Arc<str>>,
    /// The systemd unit (`nginx.service`, `session-3.scope`), only outside containers and pods.
    pub unit: Option<Arc<str>>,
}

/// Which identities a user asks for: every given field must match. Each accepts what people
/// copy from `kubectl`, `docker ps`, `crictl ps` or `systemctl`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Filter {
    /// A pod name, `namespace/name`, or a pod uid.
    pub pod: Option<String>,
    pub namespace: Option<String>,
    /// A container name, or a container id: whole, or the short prefix (12 or more hex digits)
    /// that `docker ps` and `crictl ps` print.
    pub container: Option<String>,
    /// A unit name; without a suffix it means `.service`, as in `systemctl status nginx`.
    pub unit: Option<String>,
}

impl Filter {
    /// No field given: every identity (and none) matches.
    pub fn is_empty(&self) -> bool {
        self.pod.is_none() && self.namespace.is_none() && self.container.is_none() && self.unit.is_none()
    }
}

impl Identity {
    /// The known fields under the names the CLI's filters use (`pod`, `namespace`,
    /// `container`, ...), for labels in exports and findings.
    pub fn fields(&self) -> Vec<(&'static str, &str)> {
        let runtime = (self.runtime != Runtime::Unknown).then(|| self.runtime.as_str());
        [
            ("namespace", self.pod_namespace.as_deref()),
            ("pod", self.pod_name.as_deref()),
            ("pod_uid", self.pod_uid.as_deref()),
            ("container", self.container_name.as_deref()),
            ("container_id", self.container_id.as_deref()),
            ("runtime", runtime),
            ("unit", self.unit.as_deref()),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect()
    }

    /// A few words for logs and findings: `pod ml/trainer-0 container main`, `unit
    /// kubelet.service`, `container 3f2a9c01b7d4`; empty when nothing is known.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        match (self.pod_namespace.as_deref(), self.pod_name.as_deref()) {
            (Some(ns), Some(pod)) => parts.push(format!("pod {ns}/{pod}")),
            (None, Some(pod)) => parts.push(format!("pod {pod}")),
            _ => {
                if let Some(uid) = self.pod_uid.as_deref() {
                    parts.push(format!("pod uid {uid}"));
                }
            }
        }
        match (self.container_name.as_deref(), self.container_id.as_deref()) {
            (Some(name), _) => parts.push(format!("container {name}")),
            (None, Some(id)) => parts.push(format!("container {}", &id[..id.len().min(12)])),
            _ => {}
        }
        if let Some(unit) = self.unit.as_deref() {
            parts.push(format!("unit {unit}"));
        }
        parts.join(" ")
    }

    /// The pod as the `pod` filter takes it back: `namespace/name`, else its name or uid.
    pub fn pod(&self) -> Option<String> {
        match (self.pod_namespace.as_deref(), self.pod_name.as_deref()) {
            (Some(ns), Some(pod)) => Some(format!("{ns}/{pod}")),
            (None, Some(pod)) => Some(pod.to_string()),
            _ => self.pod_uid.as_deref().map(str::to_string),
        }
    }

    pub fn matches(&self, filter: &Filter) -> bool {
        let is = |field: &Option<Arc<str>>, want: &str| field.as_deref() == Some(want);
        let pod = |want: &str| match want.split_once('/') {
            Some((namespace, name)) => is(&self.pod_namespace, namespace) && is(&self.pod_name, name),
            None => is(&self.pod_name, want) || is(&self.pod_uid, want),
        };
        let container = |want: &str| {
            let short_id = want.len() >= 12 && want.bytes().all(|c| c.is_ascii_hexdigit());
            is(&self.container_name, want)
                || self.container_id.as_deref().is_some_and(|id| id == want || (short_id && id.starts_with(want)))
        };
        let unit = |want: &str| {
            if want.contains('.') {
                is(&self.unit, want)
            } else {
                self.unit.as_deref().and_then(|u| u.strip_suffix(".service")) == Some(want)
            }
        };
        filter.pod.as_deref().is_none_or(pod)
            && filter.namespace.as_deref().is_none_or(|want| is(&self.pod_namespace, want))
            && filter.container.as_deref().is_none_or(container)
            && filter.unit.as_deref().is_none_or(unit)
    }
}
