//! The processes a GPU's holders started, once a second: their children and theirs, down
//! [`GENERATIONS`] generations (a DataLoader's workers, workers of workers). `detect::gpu`'s
//! `gpu-starved` counts them among the holder's feeders, beside the processes of its pod.
//!
//! Read from `/proc/PID/task/TID/children` (the children each thread of a process started), so
//! the cost follows the holders' families, not the node's processes; a kernel built without
//! `CONFIG_PROC_CHILDREN` has no such file, and every process's parent is then read from
//! `/proc/PID/stat` instead (once a second, while a GPU idles).
//!
//! Read, like `demand`, only for the holders of a GPU that idled over the second (what the
//! detectors judge): about 3.6 µs a thread (a 150-thread holder with 8 workers of 21 threads:
//! 1.15 ms of the poller's CPU a second; the fallback's scan of 106 processes: 0.75 ms; release
//! build, 2-CPU VM). Bounded: at most [`MAX_THREADS`] threads a process, [`MAX_DESCENDANTS`]
//! processes a holder, [`MAX_SCANNED`] processes in the fallback's scan. Init (or pid 0) holding a
//! GPU starts nobody: every process descends from it, and none of them feeds the GPU for that.

use std::{
    collections::{HashMap, HashSet},
    io::ErrorKind,
    path::{Path, PathBuf},
};

use super::demand::MAX_THREADS;

/// Generations below a holder that count as its feeders.
pub const GENERATIONS: usize = 8;
/// Processes kept per holder at most.
pub const MAX_DESCENDANTS: usize = 4096;
/// Processes whose parent the fallback reads at most.
pub const MAX_SCANNED: usize = 65_536;

pub struct Family {
    proc_root: PathBuf,
    /// Whether the kernel keeps `children` files (`None`: not known yet).
    children_files: Option<bool>,
}

/// The parent pid from `/proc/PID/stat` (the field after the parenthesised comm).
fn ppid(stat: &str) -> Option<u32> {
    stat.get(stat.rfind(')')? + 2..)?.split(' ').nth(1)?.parse().ok()
}

/// The pids of a `children` file (`"901 902 "`).
fn pids(text: &str) -> impl Iterator<Item = u32> + '_ {
    text.split_ascii_whitespace().filter_map(|p| p.parse().ok())
}

/// The processes below `root`, breadth first, sorted; `None` when `children_of` says the kernel
/// cannot tell.
fn walk(root: u32, mut children_of: impl FnMut(u32) -> Option<Vec<u32>>) -> Option<Vec<u32>> {
    let mut seen = HashSet::from([root]);
    let mut out = Vec::new();
    let mut generation = vec![root];
    for _ in 0..GENERATIONS {
        let mut next = Vec::new();
        for pid in generation {
            for child in children_of(pid)? {
                if out.len() < MAX_DESCENDANTS && child > 1 && seen.insert(child) {
                    out.push(child);
                    next.push(child);
                }
            }
        }
        if next.is_empty() {
            break;
        }
        generation = next;
    }
    out.sort_unstable();
    Some(out)
}

impl Family {
    pub fn new(proc_root: &Path) -> Self {
        Self { proc_root: proc_root.to_path_buf(), children_files: None }
    }

    /// Per holder in `holders`, the processes it started, down [`GENERATIONS`] generations
    /// (holders it started included). A holder gone, or init, has none.
    pub fn read(&mut self, holders: &[u32]) -> HashMap<u32, Vec<u32>> {
        let roots: Vec<u32> = holders.iter().copied().filter(|&h| h > 1).collect();
        if roots.is_empty() {
            return HashMap::new();
        }
        if self.children_files != Some(false) {
            let mut cache = HashMap::new();
            let mut out = HashMap::new();
            for &root in &roots {
                let Some(family) = walk(root, |pid| self.children(pid, &mut cache)) else { break };
                out.insert(root, family);
            }
            if self.children_files != Some(false) {
                return out;
            }
            tracing::debug!("no /proc/PID/task/TID/children here: the GPU holders' children read from every stat");
        }
        let tree = self.scan();
        let children_of = |pid: u32| Some(tree.get(&pid).cloned().unwrap_or_default());
        roots.into_iter().filter_map(|root| Some((root, walk(root, children_of)?))).collect()
    }

    /// The children every thread of `pid` started (none when it is gone); `None`, and noted,
    /// when the kernel keeps no `children` files.
    fn children(&mut self, pid: u32, cache: &mut HashMap<u32, Vec<u32>>) -> Option<Vec<u32>> {
        if let Some(c) = cache.get(&pid) {
            return Some(c.clone());
        }
        let tasks = self.proc_root.join(pid.to_string()).join("task");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(tasks).into_iter().flatten().flatten().take(MAX_THREADS) {
            match std::fs::read_to_string(entry.path().join("children")) {
                Ok(text) => {
                    self.children_files = Some(true);
                    out.extend(pids(&text));
                }
                // The thread is there but not the file: the kernel does not keep them.
                Err(e) if e.kind() == ErrorKind::NotFound && entry.path().is_dir() && self.children_files.is_none() => {
                    self.children_files = Some(false);
                    return None;
                }
                // The thread ended meanwhile.
                Err(_) => {}
            }
        }
        cache.insert(pid, out.clone());
        Some(out)
    }

    /// Every process's children, from each one's parent in `/proc/PID/stat`.
    fn scan(&self) -> HashMap<u32, Vec<u32>> {
        let mut tree: HashMap<u32, Vec<u32>> = HashMap::new();
        let entries = std::fs::read_dir(&self.proc_root).into_iter().flatten().flatten();
        let numbered = entries.filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()).take(MAX_SCANNED);
        for pid in numbered {
            let stat = std::fs::read_to_string(self.proc_root.join(pid.to_string()).join("stat"));
            if let Some(parent) = stat.ok().as_deref().and_then(ppid) {
                tree.entry(parent).or_default().push(pid);
            }
        }
        tree
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `/proc` with `children` files: each `(pid, parent)` a process with one thread.
    fn with_children(tree: &[(u32, u32)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
        for &(pid, parent) in tree {
            children.entry(parent).or_default().push(pid);
            children.entry(pid).or_default();
        }
        for (pid, kids) in children {
            let task = dir.path().join(format!("{pid}/task/{pid}"));
            std::fs::create_dir_all(&task).unwrap();
            let text: String = kids.iter().map(|k| format!("{k} ")).collect();
            std::fs::write(task.join("children"), text).unwrap();
        }
        dir
    }

    /// A `/proc` without them: only `stat` files saying who each process's parent is.
    fn with_stats(tree: &[(u32, u32)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for &(pid, parent) in tree {
            let d = dir.path().join(pid.to_string());
            std::fs::create_dir_all(d.join(format!("task/{pid}"))).unwrap();
            std::fs::write(d.join("stat"), format!("{pid} (pt_data_worker) R {parent} {pid} {pid} 0 -1")).unwrap();
        }
        dir
    }

    const TREE: &[(u32, u32)] = &[(812, 700), (901, 812), (902, 812), (903, 901), (777, 1), (778, 777)];

    #[test]
    fn a_holders_children_and_theirs_are_its_family_from_either_file() {
        for dir in [with_children(TREE), with_stats(TREE)] {
            let mut f = Family::new(dir.path());
            let got = f.read(&[812, 500]);
            assert_eq!(got[&812], [901, 902, 903]);
            assert!(got.get(&500).is_none_or(|f| f.is_empty()), "a holder gone starts nobody");
            // Read again: the kernel's answer is remembered.
            assert_eq!(f.read(&[812])[&812], [901, 902, 903]);
        }
    }

    #[test]
    fn init_holding_a_gpu_starts_nobody() {
        for dir in [with_children(TREE), with_stats(TREE)] {
            assert!(Family::new(dir.path()).read(&[1, 0]).is_empty());
        }
    }

    #[test]
    fn generations_past_the_eighth_are_not_family() {
        // 812 → 1001 → 1002 → … → 1010: ten generations.
        let mut tree = vec![(1001, 812)];
        tree.extend((1002..=1010).map(|p| (p, p - 1)));
        let dir = with_children(&tree);
        let got = Family::new(dir.path()).read(&[812]);
        assert_eq!(got[&812], (1001..=1008).collect::<Vec<_>>());
    }

    #[test]
    fn this_kernels_proc_names_a_child_this_process_started() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let got = Family::new(Path::new("/proc")).read(&[std::process::id()]);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(got[&std::process::id()].contains(&child.id()), "{got:?}");
    }

    #[test]
    fn a_stat_names_its_parent_after_the_comm_whatever_the_comm_holds() {
        assert_eq!(ppid("901 (pt_data_worker) R 812 901 901 0 -1"), Some(812));
        assert_eq!(ppid("901 (a) b) (c) S 812 1"), Some(812));
        assert_eq!(ppid("901 (cut"), None);
    }
}
