//! pid → [`Identity`], cached per pid.

use std::{
    io,
    num::NonZeroUsize,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use lru::LruCache;

use super::{Identity, cgroup, kubelet::KubeletIndex};

/// At most one listing of the kubelet's log directories per interval, however many lookups miss.
const MIN_REBUILD: Duration = Duration::from_secs(2);
/// The kubelet links a container's log after starting it, so the first samples can come before
/// its name exists: a pod's process lacking names is looked up again for this long.
const RETRY_NAMES_FOR: Duration = Duration::from_secs(30);
/// A pid not asked about for this long is forgotten (as the OpenTelemetry eBPF profiler's
/// `containerIDCacheTimeout`): it has likely exited, and its number may come back as another
/// process.
const IDLE_TTL: Duration = Duration::from_secs(60);
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// Bound on cached pids whatever the churn (a few hundred bytes each).
const MAX_PIDS: usize = 65_536;

/// Answers who a pid belongs to, from `<proc_root>/PID/cgroup` and the kubelet's log directories.
pub struct Resolver {
    proc_root: PathBuf,
    kubelet: KubeletIndex,
    /// Least recently asked first, so idle pids are swept from the front.
    cache: LruCache<u32, Cached>,
    last_sweep: Option<Instant>,
}

struct Cached {
    identity: Identity,
    asked: Instant,
    /// Until when missing pod or container names are looked up again.
    retry_until: Option<Instant>,
}

/// Where the cgroup hierarchies are mounted.
const SYS_CGROUP: &str = "/sys/fs/cgroup";

impl Default for Resolver {
    /// The host's `/proc`, `/var/log/containers` and `/var/log/pods`.
    fn default() -> Self {
        Self::new("/proc", "/var/log/containers", "/var/log/pods")
    }
}

impl Resolver {
    pub fn new(
        proc_root: impl Into<PathBuf>,
        containers_log_dir: impl Into<PathBuf>,
        pods_log_dir: impl Into<PathBuf>,
    ) -> Self {
        Resolver {
            proc_root: proc_root.into(),
            kubelet: KubeletIndex::new(containers_log_dir.into(), pods_log_dir.into(), MIN_REBUILD),
            cache: LruCache::new(NonZeroUsize::new(MAX_PIDS).expect("nonzero")),
            last_sweep: None,
        }
    }

    /// Who `pid` belongs to: cached after the first call, except that a pod's process whose names
    /// were not yet on disk gets them on a later call (for up to 30 s). An exited pid resolves
    /// to the empty identity.
    pub fn resolve(&mut self, pid: u32) -> Identity {
        self.resolve_at(pid, Instant::now())
    }

    /// Drops what is known of `pid`, for a caller that saw it exit: its number may be reused.
    pub fn forget(&mut self, pid: u32) {
        self.cache.pop(&pid);
    }

    fn resolve_at(&mut self, pid: u32, now: Instant) -> Identity {
        self.sweep(now);
        if let Some(cached) = self.cache.get_mut(&pid) {
            cached.asked = now;
            if let Some(until) = cached.retry_until {
                cached.retry_until = None;
                if now < until && !name(&mut self.kubelet, &mut cached.identity, now) {
                    cached.retry_until = Some(until);
                }
            }
            return cached.identity.clone();
        }
        let mut identity = self.read_cgroup(pid);
        let complete = name(&mut self.kubelet, &mut identity, now);
        let retry_until = (!complete).then(|| now + RETRY_NAMES_FOR);
        self.cache.put(pid, Cached { identity: identity.clone(), asked: now, retry_until });
        identity
    }

    fn read_cgroup(&self, pid: u32) -> Identity {
        let path = self.proc_root.join(pid.to_string()).join("cgroup");
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) => {
                // ENOENT / ESRCH: the process is gone. Anything else is worth a line.
                if !matches!(e.kind(), io::ErrorKind::NotFound) && e.raw_os_error() != Some(libc::ESRCH) {
                    tracing::debug!("cannot read {}: {e}", path.display());
                }
                return Identity::default();
            }
        };
        let mut parsed = cgroup::parse_proc_cgroup(&text);
        // A container or pod named by a directory a user made is theirs to name: not reported.
        if (parsed.container_id.is_some() || parsed.pod_uid.is_some())
            && cgroup::owned_by_others(&text, std::path::Path::new(SYS_CGROUP))
        {
            parsed = cgroup::CgroupIdentity::default();
        }
        let arc = |s: Option<String>| s.map(Arc::<str>::from);
        Identity {
            container_id: arc(parsed.container_id),
            runtime: parsed.runtime,
            pod_uid: arc(parsed.pod_uid),
            unit: arc(parsed.unit),
            ..Default::default()
        }
    }

    /// Forgets pids not asked about for `IDLE_TTL`. The cache is in order of last asking, so this
    /// stops at the first pid asked recently.
    fn sweep(&mut self, now: Instant) {
        if self.last_sweep.is_some_and(|at| now.saturating_duration_since(at) < SWEEP_EVERY) {
            return;
        }
        self.last_sweep = Some(now);
        while let Some((_, oldest)) = self.cache.peek_lru() {
            if now.saturating_duration_since(oldest.asked) < IDLE_TTL {
                break;
            }
            self.cache.pop_lru();
        }
    }
}

/// Fills in the names the kubelet's files give; true when nothing more can come. Only a pod's
/// process waits for names: a container outside Kubernetes has none to wait for.
fn name(kubelet: &mut KubeletIndex, identity: &mut Identity, now: Instant) -> bool {
    if let Some(id) = identity.container_id.as_deref()
        && identity.container_name.is_none()
        && let Some(names) = kubelet.container(id, now)
    {
        identity.pod_namespace = Some(names.namespace);
        identity.pod_name = Some(names.pod);
        identity.container_name = Some(names.container);
    }
    if let Some(uid) = identity.pod_uid.as_deref()
        && identity.pod_name.is_none()
        && let Some(names) = kubelet.pod(uid, now)
    {
        identity.pod_namespace = Some(names.namespace);
        identity.pod_name = Some(names.pod);
    }
    identity.pod_uid.is_none()
        || (identity.pod_name.is_some() && (identity.container_id.is_none() || identity.container_name.is_some()))
}

#[cfg(test)]
#[path = "resolver_tests.rs"]
mod tests;
