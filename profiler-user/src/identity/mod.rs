//! Who a process belongs to, without a Kubernetes API server: its container (runtime and id) and
//! pod on a Kubernetes node, or its systemd unit outside containers. The cgroup file says which
//! container and pod (`cgroup`).

pub mod cgroup;

pub use cgroup::Runtime;
