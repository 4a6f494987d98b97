//! Memory cgroups as cgroupfs shows them: how many are live and how many dying (removed but
//! still pinned by page cache), which the zombie detector and the counters' tracks share; and
//! the memory cgroup a stalled task was charged to, with its limit and usage: by the id the
//! kernel read at the stall (its cgroupfs directory's inode number: `kn->id` is the inode of a
//! kernfs directory), found by walking the memory hierarchy; or, when the kernel could not say,
//! from `/proc/PID/cgroup` while the task lives.

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// Dying and live memory cgroups at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemcgCount {
    pub ts_ns: u64,
    pub live: u64,
    pub dying: u64,
    /// CPU time of one read of the hierarchy root's `memory.stat`, ns, when it was timed
    /// (once a minute: see `detect::zombies::outlook`).
    pub stat_read_ns: Option<u64>,
}

/// Where the memory controller lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    V1 { id: i32, mount: String },
    V2 { mount: String },
}

pub fn find_hierarchy() -> Option<Hierarchy> {
    let cgroups = std::fs::read_to_string("/proc/cgroups").ok()?;
    let id: i32 = cgroups.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.first() == Some(&"memory")).then(|| f.get(1)?.parse().ok())?
    })?;
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    let mount_of = |fstype: &str, opt: Option<&str>| {
        mounts.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&fstype)
                && opt.is_none_or(|o| f.get(3).is_some_and(|opts| opts.split(',').any(|x| x == o))))
            .then(|| f[1].to_string())
        })
    };
    if id != 0 {
        Some(Hierarchy::V1 { id, mount: mount_of("cgroup", Some("memory"))? })
    } else {
        Some(Hierarchy::V2 { mount: mount_of("cgroup2", None)? })
    }
}

fn count_dirs(path: &std::path::Path) -> u64 {
    let mut n = 1;
    if let Ok(entries) = std::fs::read_dir(path) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                n += count_dirs(&e.path());
            }
        }
    }
    n
}

/// The live and dying memory cgroups of hierarchy `h` now (`None`: unreadable, never zero).
pub fn count(h: &Hierarchy, ts_ns: u64) -> Option<MemcgCount> {
    match h {
        Hierarchy::V1 { mount, .. } => {
            let cgroups = std::fs::read_to_string("/proc/cgroups").ok()?;
            let total: u64 = cgroups.lines().find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.first() == Some(&"memory")).then(|| f.get(2)?.parse().ok())?
            })?;
            let live = count_dirs(std::path::Path::new(mount));
            Some(MemcgCount { ts_ns, live, dying: total.saturating_sub(live), stat_read_ns: None })
        }
        Hierarchy::V2 { mount } => {
            let stat = std::fs::read_to_string(format!("{mount}/cgroup.stat")).ok()?;
            let get = |k: &str| stat.lines().find_map(|l| l.strip_prefix(k)?.trim().parse::<u64>().ok());
            let (live, dying) = (get("nr_descendants ")? + 1, get("nr_dying_descendants ")?);
            Some(MemcgCount { ts_ns, live, dying, stat_read_ns: None })
        }
    }
}

/// Reads the memory cgroup counts (under v1 a walk of the whole hierarchy): the daemon's upkeep
/// stage calls it and hands the count to the zombie detector (`detect::zombies`), so the walk never delays
/// the pipeline.
#[derive(Debug, Default)]
pub struct MemcgCounter {
    hierarchy: Option<Option<Hierarchy>>,
    timed_at: Option<u64>,
}

/// How often a `memory.stat` read is timed: the read costs what it measures.
const TIME_READ_EVERY_NS: u64 = 60 * 1_000_000_000;

impl MemcgCounter {
    pub fn read(&mut self, ts_ns: u64) -> Option<MemcgCount> {
        let h = self.hierarchy.get_or_insert_with(find_hierarchy).as_ref()?;
        let mut c = count(h, ts_ns)?;
        if self.timed_at.is_none_or(|t| ts_ns.saturating_sub(t) >= TIME_READ_EVERY_NS) {
            self.timed_at = Some(ts_ns);
            let mount = match h {
                Hierarchy::V1 { mount, .. } | Hierarchy::V2 { mount } => mount,
            };
            c.stat_read_ns = time_read(&std::path::Path::new(mount).join("memory.stat"));
        }
        Some(c)
    }
}

/// CPU time this thread spends reading `path` whole, ns (other load does not count).
fn time_read(path: &std::path::Path) -> Option<u64> {
    let cpu_ns = || {
        let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a valid timespec to fill.
        (unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } == 0)
            .then(|| t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64)
    };
    let before = cpu_ns()?;
    std::fs::read(path).ok()?;
    Some(cpu_ns()?.saturating_sub(before))
}

/// The memory cgroup a task is charged to, with its limit and usage when readable.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Memcg {
    pub path: String,
    pub limit_bytes: Option<u64>,
    pub usage_bytes: Option<u64>,
}

/// Directories a walk visits at most: it runs on the pipeline's thread (when a stall is read),
/// so it must stay short (a few ms per thousand cgroups); a node with more memory cgroups gets
/// the /proc answer for those past it.
const WALK_MAX: usize = 20_000;
/// An id not found is looked for again (a new walk) at most this often: a cgroup made since
/// the last walk is found within this, and a dying one (no directory) costs one walk each time.
const REWALK_AFTER: Duration = Duration::from_secs(2);

/// Memory cgroup paths by id, from a walk of the hierarchy.
#[derive(Debug)]
pub struct Index {
    /// Where cgroupfs is mounted (`/sys/fs/cgroup`; a directory laid out like it in tests).
    cgroupfs: PathBuf,
    by_id: HashMap<u64, String>,
    walked: Option<Instant>,
}

impl Default for Index {
    fn default() -> Self {
        Self::new("/sys/fs/cgroup")
    }
}

impl Index {
    pub fn new(cgroupfs: impl Into<PathBuf>) -> Self {
        Self { cgroupfs: cgroupfs.into(), by_id: HashMap::new(), walked: None }
    }

    /// The memory hierarchy's root and whether it is v1: `memory/` under cgroupfs (v1 or
    /// hybrid), else cgroupfs itself when it is v2 with the memory controller.
    fn hierarchy(&self) -> Option<(PathBuf, bool)> {
        let v1 = self.cgroupfs.join("memory");
        if v1.join("memory.limit_in_bytes").exists() {
            return Some((v1, true));
        }
        let controllers = std::fs::read_to_string(self.cgroupfs.join("cgroup.controllers")).ok()?;
        controllers.split_whitespace().any(|c| c == "memory").then(|| (self.cgroupfs.clone(), false))
    }

    /// The memory cgroup with this id, with its limit and usage now (`None`: id 0, or no
    /// directory has it: the cgroup was removed).
    pub fn by_id(&mut self, id: u64) -> Option<Memcg> {
        if id == 0 {
            return None;
        }
        let (root, v1) = self.hierarchy()?;
        if !self.by_id.contains_key(&id) && self.walked.is_none_or(|t| t.elapsed() >= REWALK_AFTER) {
            self.by_id.clear();
            let mut budget = WALK_MAX;
            walk(&root, "/", &mut self.by_id, &mut budget);
            self.walked = Some(Instant::now());
        }
        let path = self.by_id.get(&id)?.clone();
        Some(read(&root, path, v1))
    }
}

fn walk(dir: &Path, rel: &str, out: &mut HashMap<u64, String>, budget: &mut usize) {
    if *budget == 0 {
        return;
    }
    *budget -= 1;
    let Ok(meta) = std::fs::metadata(dir) else { return };
    out.insert(meta.ino(), rel.to_string());
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        // cgroupfs directories are cgroups; files are their knobs. No symlinks there.
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            let name = e.file_name();
            let name = name.to_string_lossy();
            let child = if rel == "/" { format!("/{name}") } else { format!("{rel}/{name}") };
            walk(&e.path(), &child, out, budget);
        }
    }
}

/// A memory cgroup's limit and usage, `path` relative to the hierarchy's `root`.
fn read(root: &Path, path: String, v1: bool) -> Memcg {
    let dir = root.join(path.trim_start_matches('/'));
    let value = |file: &str| std::fs::read_to_string(dir.join(file)).ok()?.trim().parse::<u64>().ok();
    let (limit, usage) =
        if v1 { ("memory.limit_in_bytes", "memory.usage_in_bytes") } else { ("memory.max", "memory.current") };
    // v1 says "no limit" with a huge number, v2 with "max" (which does not parse).
    let limit_bytes = value(limit).filter(|&l| l < 1 << 60);
    Memcg { path, limit_bytes, usage_bytes: value(usage) }
}

/// The memory cgroup of `pid` (the v1 `memory` hierarchy, or the v2 one), from /proc.
pub fn of_pid(pid: u32) -> Option<Memcg> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let (path, v1) = parse(&text)?;
    let root = if v1 { "/sys/fs/cgroup/memory" } else { "/sys/fs/cgroup" };
    Some(read(Path::new(root), path, v1))
}

/// `(path, is_v1)` of the memory cgroup in a `/proc/PID/cgroup` text.
pub fn parse(text: &str) -> Option<(String, bool)> {
    let mut v2 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            return Some((path.to_string(), true));
        }
        if controllers.is_empty() {
            v2 = Some((path.to_string(), false));
        }
    }
    v2
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cgroup v2 counts come from the root's `cgroup.stat` (the incident's node: 240 live memory
    /// cgroups, 70,000 dying).
    #[test]
    fn v2_counts_live_and_dying_from_cgroup_stat() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup.stat"), "nr_descendants 239\nnr_dying_descendants 70000\n").unwrap();
        let h = Hierarchy::V2 { mount: dir.path().to_str().unwrap().to_string() };
        assert_eq!(count(&h, 7), Some(MemcgCount { ts_ns: 7, live: 240, dying: 70_000, stat_read_ns: None }));
        std::fs::write(dir.path().join("cgroup.stat"), "nr_descendants x\n").unwrap();
        assert_eq!(count(&h, 7), None, "an unreadable count is no count, not zero");
    }

    #[test]
    fn the_memory_cgroup_is_read_from_v1_and_v2_lines() {
        let v1 = "12:memory:/kubepods/pod1/abc\n11:cpu,cpuacct:/kubepods/pod1/abc\n0::/init.scope\n";
        assert_eq!(parse(v1), Some(("/kubepods/pod1/abc".into(), true)));
        assert_eq!(parse("0::/system.slice/x.service\n"), Some(("/system.slice/x.service".into(), false)));
        assert_eq!(parse("3:cpu:/a\n"), None);
    }

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn ino(path: &Path) -> u64 {
        std::fs::metadata(path).unwrap().ino()
    }

    #[test]
    fn an_id_is_the_directory_with_that_inode_found_again_after_the_cgroup_is_made() {
        let fs = tempfile::tempdir().unwrap();
        let memory = fs.path().join("memory");
        write(&memory.join("memory.limit_in_bytes"), "9223372036854771712\n");
        write(&memory.join("kubepods/pod1/memory.limit_in_bytes"), "16777216\n");
        write(&memory.join("kubepods/pod1/memory.usage_in_bytes"), "16510976\n");
        let mut index = Index::new(fs.path());
        let pod = index.by_id(ino(&memory.join("kubepods/pod1"))).unwrap();
        assert_eq!(
            pod,
            Memcg { path: "/kubepods/pod1".into(), limit_bytes: Some(16 << 20), usage_bytes: Some(16_510_976) }
        );
        // The root: "no limit" is a huge number on v1.
        assert_eq!(index.by_id(ino(&memory)).unwrap(), Memcg { path: "/".into(), ..Default::default() });
        assert_eq!(index.by_id(0), None);
        // A cgroup made after the walk is found once the walk may run again.
        write(&memory.join("new/memory.usage_in_bytes"), "1\n");
        let new = ino(&memory.join("new"));
        index.walked = Some(Instant::now() - REWALK_AFTER);
        assert_eq!(index.by_id(new).map(|m| m.path), Some("/new".into()));
    }

    #[test]
    fn v2_is_used_when_there_is_no_v1_memory_hierarchy() {
        let fs = tempfile::tempdir().unwrap();
        write(&fs.path().join("cgroup.controllers"), "cpuset cpu io memory pids\n");
        write(&fs.path().join("system.slice/x.service/memory.max"), "max\n");
        write(&fs.path().join("system.slice/x.service/memory.current"), "4096\n");
        let mut index = Index::new(fs.path());
        let m = index.by_id(ino(&fs.path().join("system.slice/x.service"))).unwrap();
        assert_eq!(m, Memcg { path: "/system.slice/x.service".into(), limit_bytes: None, usage_bytes: Some(4096) });
        // Without the memory controller anywhere: nothing to find.
        let bare = tempfile::tempdir().unwrap();
        write(&bare.path().join("cgroup.controllers"), "cpu io\n");
        assert_eq!(Index::new(bare.path()).by_id(ino(bare.path())), None);
    }
}
