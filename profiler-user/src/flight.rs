//! The flight recorder: when a detector opens a finding on a CPU, that CPU is sampled at a
//! higher frequency (999 Hz by default) for a bounded time (30 s), and every one of those
//! samples goes to a recording of its own, `DATA_DIR/flight/<finding>/`, a store like the main
//! one that any query command reads with `--data-dir`. Rollup and retention never touch it
//! (they work on `DATA_DIR/segments`), so that window keeps its full detail; `keep` recordings
//! are kept, shared fairly among the kinds of finding: a new one replaces the oldest of the
//! kind that holds the most, so that a user who triggers one kind again and again (spinning in
//! the kernel every half minute) replaces only recordings of that kind, never a real incident's
//! of another. And a process owner other than root causes at most [`PER_OWNER_PER_HOUR`]
//! recordings an hour (the owner of the first process the finding names; a finding that
//! names none is the kernel's, root's): past it the finding opens as always, without a
//! recording, said once an hour in the log. A user's recordings (named `…-uUID`, or `…-gone`
//! when the process had exited) make room only by replacing users' recordings, never root's;
//! root's replace users' first: however many users there are, root's stay.
//!
//! The main store, the detectors and the exports keep seeing the base frequency: of a boosted
//! CPU's samples, the first of each base-frequency period goes on to them ([`Flight::route`]),
//! the rest only to the recording. So a CPU-time share, a heatmap cell or a flamegraph over a
//! window with a recording in it reads the same as without.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use crate::{
    detect::Finding,
    model::Sample,
    store::{StoreError, StoreWriter, format::NS_PER_SEC, identity::Identity, meta::Meta},
};

/// The `[flight]` table of the config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Sampling frequency of a recording, Hz; 0 turns the flight recorder off.
    pub hz: u64,
    /// How long a recording lasts from the finding's opening, seconds.
    pub secs: u64,
    /// Recordings kept; the oldest go when a new one starts.
    pub keep: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self { hz: 999, secs: 30, keep: 10 }
    }
}

/// The directory of all recordings.
pub fn flight_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("flight")
}

struct Recording {
    name: String,
    cpu: u32,
    until_ns: u64,
    writer: StoreWriter,
}

/// A recording that just started: the CPU to sample faster, and the link for its finding.
pub struct Started {
    pub cpu: u32,
    pub link: serde_json::Value,
}

pub struct Flight {
    settings: Settings,
    base_hz: u64,
    data_dir: PathBuf,
    /// By CPU: at most one recording a CPU at a time.
    recordings: BTreeMap<u32, Recording>,
    /// By CPU: the base-frequency period of the last sample passed on to the main store.
    last_period: HashMap<u32, u64>,
    /// Links of findings to recordings, by finding id, until their findings close.
    links: HashMap<String, serde_json::Value>,
    /// By CPU whose recording ended: samples stamped before this time (wall-clock ns) may still
    /// be at the recording's frequency, and are thinned to the base frequency as during it.
    /// They are still in the ring and the queue when the recording ends (up to a flush interval
    /// of them, more when the pipeline lags): passed on whole, they made the main store's
    /// seconds hold ten times the base frequency's samples (false red streaks on the heatmap).
    winding_down: HashMap<u32, u64>,
    /// By process owner (not root): when its last recordings started, wall-clock ns.
    by_owner: HashMap<u32, VecDeque<u64>>,
    /// By owner held back: the oldest start it was held back for (said once).
    warned: HashMap<u32, Option<u64>>,
}

/// Recordings one process owner other than root causes in an hour.
pub const PER_OWNER_PER_HOUR: usize = 3;

/// The owner of a process whose pid was not found (it exited): rate-limited like a user.
const GONE: u32 = u32::MAX;

/// After a recording ends its CPU's sampler is set back to the base frequency at once; the
/// sample already timed at the recording's frequency fires within a millisecond. Margin.
const SWITCH_BACK_NS: u64 = 50_000_000;

impl Flight {
    pub fn new(settings: Settings, base_hz: u64, data_dir: &Path) -> Self {
        Self {
            settings,
            base_hz: base_hz.max(1),
            data_dir: data_dir.to_path_buf(),
            recordings: BTreeMap::new(),
            last_period: HashMap::new(),
            links: HashMap::new(),
            winding_down: HashMap::new(),
            by_owner: HashMap::new(),
            warned: HashMap::new(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.settings.hz > self.base_hz && self.settings.secs > 0 && self.settings.keep > 0
    }

    /// Starts a recording for a finding that just opened on a CPU not being recorded yet.
    /// `cpus` and `node` go into the recording's meta.json, which queries read.
    pub fn start(&mut self, f: &Finding, now_ns: u64, cpus: u32, node: &str) -> Result<Option<Started>, StoreError> {
        self.start_for(f, owner_of(f), now_ns, cpus, node)
    }

    /// [`Self::start`] for a finding whose first process belongs to `owner`.
    fn start_for(
        &mut self,
        f: &Finding,
        owner: u32,
        now_ns: u64,
        cpus: u32,
        node: &str,
    ) -> Result<Option<Started>, StoreError> {
        let Some(cpu) = f.cpu.filter(|_| self.enabled()) else { return Ok(None) };
        if let Some(r) = self.recordings.get(&cpu) {
            // Already recording this CPU: the finding links to that recording.
            let link = self.link(&r.name, cpu, r.until_ns - self.settings.secs * NS_PER_SEC, r.until_ns);
            self.links.insert(f.id.clone(), link);
            return Ok(None);
        }
        if !self.owner_may_record(owner, now_ns) {
            return Ok(None);
        }
        // A name of our own (finding ids carry a cgroup path for some kinds), with its owner
        // when not root: what pruning goes by.
        let by = match owner {
            0 => String::new(),
            GONE => "-gone".to_string(),
            uid => format!("-u{uid}"),
        };
        let name = format!("{}-cpu{cpu}-{}{by}", f.kind.name(), f.start_ns / NS_PER_SEC);
        let dir = flight_dir(&self.data_dir).join(&name);
        if !self.prune(f.kind.name(), owner == 0)? {
            tracing::info!(
                finding = %f.id,
                "no flight recording for a finding about a user's process: the {} recordings kept are root's, \
                 which a user's never replace",
                self.settings.keep
            );
            return Ok(None);
        }
        // Root's alone, checked like the data directory (no links, no other owner).
        crate::store::files::prepare_private_dir(&dir)?;
        let segments = crate::store::segments_dir(&dir);
        Meta {
            format_version: crate::store::format::FORMAT_VERSION,
            hostname: node.to_string(),
            node: node.to_string(),
            cpus,
            frequency_hz: self.settings.hz,
            started_ns: now_ns,
        }
        .write(&dir)?;
        let until_ns = now_ns + self.settings.secs * NS_PER_SEC;
        let writer = StoreWriter::new(&segments).with_identity(Identity::current(self.settings.hz));
        let link = self.link(&name, cpu, now_ns, until_ns);
        self.links.insert(f.id.clone(), link.clone());
        self.recordings.insert(cpu, Recording { name, cpu, until_ns, writer });
        Ok(Some(Started { cpu, link }))
    }

    /// Whether `owner` may cause one more recording now (counted when it may).
    fn owner_may_record(&mut self, owner: u32, now_ns: u64) -> bool {
        if owner == 0 {
            return true;
        }
        let hour = 3_600 * NS_PER_SEC;
        let started = self.by_owner.entry(owner).or_default();
        while started.front().is_some_and(|&t| t + hour <= now_ns) {
            started.pop_front();
        }
        if started.len() >= PER_OWNER_PER_HOUR {
            // Said once for each time the owner reaches its bound: its oldest recording's
            // start tells the times apart.
            let oldest = started.front().copied();
            if self.warned.insert(owner, oldest) != Some(oldest) {
                tracing::warn!(
                    owner = (owner != GONE).then_some(owner),
                    "findings about one user's processes caused {PER_OWNER_PER_HOUR} flight recordings in the last hour: \
                     the next ones open without a recording, so that a user cannot replace the recordings of real incidents"
                );
            }
            return false;
        }
        started.push_back(now_ns);
        true
    }

    fn link(&self, name: &str, cpu: u32, from_ns: u64, until_ns: u64) -> serde_json::Value {
        let dir = flight_dir(&self.data_dir).join(name);
        serde_json::json!({
            "dir": dir.display().to_string(),
            "cpu": cpu,
            "hz": self.settings.hz,
            "from_ns": from_ns,
            "to_ns": until_ns,
            "command": format!(
                "profiler flamegraph --data-dir {} --cpu {cpu} --from {} --to {}",
                dir.display(),
                crate::timespec::format(from_ns),
                crate::timespec::format(until_ns)
            ),
        })
    }

    /// Adds the recording's link to the evidence of a finding that has one.
    pub fn annotate(&self, f: &mut Finding) {
        if let (Some(link), Some(e)) = (self.links.get(&f.id), f.evidence.as_object_mut()) {
            e.insert("flight_recording".into(), link.clone());
        }
    }

    /// A closed finding needs its link no more.
    pub fn forget(&mut self, id: &str) {
        self.links.remove(id);
    }

    /// Where a sample of `cpu` at `ts_ns` goes: `(to the recording, to the main store)`.
    pub fn route(&mut self, cpu: u32, ts_ns: u64) -> (bool, bool) {
        if !self.recordings.contains_key(&cpu) {
            match self.winding_down.get(&cpu) {
                Some(&until) if ts_ns < until => return (false, self.first_of_period(cpu, ts_ns)),
                Some(_) => {
                    // Past the switch back (a CPU's samples arrive in order): base frequency.
                    self.winding_down.remove(&cpu);
                    self.last_period.remove(&cpu);
                }
                None => {}
            }
            return (false, true);
        }
        (true, self.first_of_period(cpu, ts_ns))
    }

    /// Whether `ts_ns` is the first sample of `cpu` in its base-frequency period.
    fn first_of_period(&mut self, cpu: u32, ts_ns: u64) -> bool {
        let period = (ts_ns as u128 * self.base_hz as u128 / NS_PER_SEC as u128) as u64;
        self.last_period.insert(cpu, period) != Some(period)
    }

    pub fn push(&mut self, s: &Sample) {
        if let Some(r) = self.recordings.get_mut(&s.cpu) {
            r.writer.push(s);
        }
    }

    pub fn push_idle(&mut self, ts_ns: u64, cpu: u32) {
        if let Some(r) = self.recordings.get_mut(&cpu) {
            r.writer.push_idle(ts_ns, cpu);
        }
    }

    /// Writes what the recordings hold; ends those past their time. Returns the CPUs whose
    /// recording ended (their sampling goes back to the base frequency).
    pub fn flush(&mut self, now_ns: u64, hold_from: u64) -> Vec<u32> {
        let mut ended = Vec::new();
        for r in self.recordings.values_mut() {
            let done = now_ns >= r.until_ns;
            let result = if done { r.writer.flush(now_ns) } else { r.writer.flush_before(now_ns, hold_from) };
            if let Err(e) = result {
                tracing::warn!(recording = %r.name, error = %e, "flight recording not written");
            }
            if done {
                ended.push(r.cpu);
            }
        }
        for cpu in &ended {
            if let Some(r) = self.recordings.remove(cpu) {
                tracing::info!(recording = %r.name, cpu, "flight recording ended");
            }
            // The caller sets the CPU back to the base frequency now.
            self.winding_down.insert(*cpu, now_ns + SWITCH_BACK_NS);
        }
        ended
    }

    /// Removes recordings so that a new one of `kind` leaves at most `keep`: each time the
    /// oldest of the kind with the most (the new one counted; on a tie, the new one's kind),
    /// users' recordings first; root's only for a new one of root's (`by_root`). Whether there
    /// is room now: a user's finding finds none when every recording kept is root's.
    fn prune(&self, kind: &str, by_root: bool) -> Result<bool, StoreError> {
        let dir = flight_dir(&self.data_dir);
        let Ok(entries) = std::fs::read_dir(&dir) else { return Ok(true) };
        // Users' recordings, then root's: by kind, (modified, path).
        type ByKind = HashMap<String, Vec<(std::time::SystemTime, PathBuf)>>;
        let (mut users, mut roots) = (ByKind::new(), ByKind::new());
        for e in entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
            let Some(modified) = e.metadata().ok().and_then(|m| m.modified().ok()) else { continue };
            let name = e.file_name().to_string_lossy().into_owned();
            let of = if by_user(&name) { &mut users } else { &mut roots };
            of.entry(kind_of(&name).to_string()).or_default().push((modified, e.path()));
        }
        let held = |m: &ByKind| m.values().map(Vec::len).sum::<usize>();
        let mut total = held(&users) + held(&roots) + 1;
        let keep = self.settings.keep.max(1);
        for (pool, may) in [(&mut users, true), (&mut roots, by_root)] {
            while may && total > keep {
                let count = |k: &str, v: &Vec<_>| v.len() + usize::from(k == kind);
                let Some((_, oldest)) = pool
                    .iter_mut()
                    .filter(|(_, v)| !v.is_empty())
                    .max_by_key(|(k, v)| (count(k, v), *k == kind))
                    .map(|(k, v)| (k.clone(), v))
                else {
                    break;
                };
                oldest.sort();
                let (_, path) = oldest.remove(0);
                std::fs::remove_dir_all(&path).map_err(|e| StoreError::Io(path.clone(), e))?;
                total -= 1;
            }
        }
        Ok(total <= keep)
    }
}

/// The owner of the first process a finding names (`GONE` when it exited); root's (the
/// kernel's) when it names none.
fn owner_of(f: &Finding) -> u32 {
    let e = &f.evidence;
    let first = ["top_processes", "processes", "held_by", "staller"]
        .iter()
        .find_map(|k| e[*k].get(0).or_else(|| e[*k].as_object().map(|_| &e[*k])));
    let Some(pid) = first.and_then(|p| p["pid"].as_u64()) else { return 0 };
    std::fs::metadata(format!("/proc/{pid}")).map_or(GONE, |m| m.uid())
}

/// The kind of finding a recording is of: its name is `KIND-cpuN-START[-uUID|-gone]`.
fn kind_of(name: &str) -> &str {
    name.rsplit_once("-cpu").map_or(name, |(kind, _)| kind)
}

/// Whether a recording was caused by a user's process (not root's, not the kernel's).
fn by_user(name: &str) -> bool {
    let last = name.rsplit_once('-').map_or("", |(_, l)| l);
    last == "gone"
        || last.strip_prefix('u').is_some_and(|uid| !uid.is_empty() && uid.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::{Kind, Severity};

    fn finding(cpu: Option<u32>, start_s: u64) -> Finding {
        Finding {
            id: format!("saturated-core-{start_s}"),
            kind: Kind::SaturatedCore,
            start_ns: start_s * NS_PER_SEC,
            end_ns: None,
            cpu,
            severity: Severity::Warning,
            summary: String::new(),
            evidence: serde_json::json!({}),
        }
    }

    #[test]
    fn a_boosted_cpu_passes_one_sample_a_base_period_to_the_main_store() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = Flight::new(Settings { hz: 999, secs: 30, keep: 3 }, 99, dir.path());
        assert_eq!(f.route(1, 0), (false, true));
        let started = f.start(&finding(Some(1), 1_800_000_000), 1_800_000_000 * NS_PER_SEC, 2, "n").unwrap();
        assert_eq!(started.map(|s| s.cpu), Some(1));
        // One second at 999 Hz on CPU 1: 99 or 100 go on (periods of 1/99 s), all are recorded.
        let t0 = 1_800_000_001 * NS_PER_SEC;
        let (mut recorded, mut main) = (0, 0);
        for i in 0..999u64 {
            let (r, m) = f.route(1, t0 + i * NS_PER_SEC / 999);
            recorded += r as u32;
            main += m as u32;
        }
        assert_eq!(recorded, 999);
        assert!((99..=100).contains(&main), "{main}");
        // Other CPUs are untouched.
        assert_eq!(f.route(0, t0), (false, true));
        // A second finding on CPU 1 links to the same recording.
        let mut other = finding(Some(1), 1_800_000_005);
        assert!(f.start(&other, 1_800_000_005 * NS_PER_SEC, 2, "n").unwrap().is_none());
        f.annotate(&mut other);
        assert!(
            other.evidence["flight_recording"]["dir"].as_str().unwrap().ends_with("saturated-core-cpu1-1800000000")
        );
        // The recording ends after its time; the CPU goes back to the base frequency.
        assert!(f.flush(1_800_000_010 * NS_PER_SEC, u64::MAX).is_empty());
        assert_eq!(f.flush(1_800_000_031 * NS_PER_SEC, u64::MAX), vec![1]);
        assert_eq!(f.route(1, 1_800_000_032 * NS_PER_SEC), (false, true));
        assert!(Meta::read(&flight_dir(dir.path()).join("saturated-core-cpu1-1800000000")).is_some());
    }

    /// The recording's last samples are still in the ring and the queue when it ends (up to a
    /// flush interval of them; seconds when the pipeline lags): they reach the main store at
    /// the base frequency, not ten times it.
    #[test]
    fn samples_at_the_recordings_frequency_still_on_their_way_when_it_ends_are_thinned() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = Flight::new(Settings { hz: 999, secs: 30, keep: 3 }, 99, dir.path());
        let t0 = 1_800_000_000 * NS_PER_SEC;
        f.start(&finding(Some(1), 1_800_000_000), t0, 2, "n").unwrap();
        let end = t0 + 31 * NS_PER_SEC;
        assert_eq!(f.flush(end, u64::MAX), vec![1]);
        // The last 0.9 s at 999 Hz, handled after the end, and the switch's few milliseconds.
        let main: u32 = (0..950u64).map(|i| f.route(1, end - 900_000_000 + i * NS_PER_SEC / 999).1 as u32).sum();
        assert!((90..=97).contains(&main), "{main} of 950 samples at 999 Hz reached the main store");
        // Then the base frequency: every sample goes on, as on any CPU.
        let after = end + SWITCH_BACK_NS;
        assert!((0..99u64).all(|i| f.route(1, after + i * NS_PER_SEC / 99) == (false, true)));
    }

    #[test]
    fn only_cpu_findings_record_and_the_newest_recordings_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = Flight::new(Settings { hz: 999, secs: 1, keep: 2 }, 99, dir.path());
        assert!(f.start(&finding(None, 1_800_000_000), 0, 2, "n").unwrap().is_none());
        for (i, s) in [1_800_000_000u64, 1_800_000_100, 1_800_000_200].iter().enumerate() {
            assert!(f.start(&finding(Some(0), *s), s * NS_PER_SEC, 2, "n").unwrap().is_some());
            f.flush((s + 2) * NS_PER_SEC, u64::MAX);
            // Distinct modification times for the pruning order.
            std::thread::sleep(std::time::Duration::from_millis(20 * (i as u64 + 1)));
        }
        let mut left: Vec<String> = std::fs::read_dir(flight_dir(dir.path()))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["saturated-core-cpu0-1800000100", "saturated-core-cpu0-1800000200"]);
        // A flood of one kind replaces only its own: another kind's recording stays.
        let mut spin = finding(Some(1), 1_800_000_300);
        spin.kind = Kind::HotKernelFunction;
        assert!(f.start(&spin, 1_800_000_300 * NS_PER_SEC, 2, "n").unwrap().is_some());
        f.flush(1_800_000_302 * NS_PER_SEC, u64::MAX);
        for s in [1_800_000_400u64, 1_800_000_500, 1_800_000_600] {
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(f.start(&finding(Some(0), s), s * NS_PER_SEC, 2, "n").unwrap().is_some());
            f.flush((s + 2) * NS_PER_SEC, u64::MAX);
        }
        let mut left: Vec<String> = std::fs::read_dir(flight_dir(dir.path()))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["hot-kernel-function-cpu1-1800000300", "saturated-core-cpu0-1800000600"]);
        assert_eq!(kind_of("hot-kernel-function-cpu1-1800000300"), "hot-kernel-function");
        // Off: nothing records.
        let mut off = Flight::new(Settings { hz: 0, ..Settings::default() }, 99, dir.path());
        assert!(off.start(&finding(Some(1), 1), 0, 2, "n").unwrap().is_none());
    }

    #[test]
    fn one_user_causes_at_most_a_few_recordings_an_hour_and_root_is_not_held_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = Flight::new(Settings { hz: 999, secs: 1, keep: 10 }, 99, dir.path());
        let t0 = 1_800_000_000u64;
        // A user spinning in the kernel every 39 s.
        let mut recorded = 0;
        for i in 0..10u64 {
            let s = t0 + 39 * i;
            recorded += f.start_for(&finding(Some(0), s), 1000, s * NS_PER_SEC, 2, "n").unwrap().is_some() as usize;
            f.flush((s + 2) * NS_PER_SEC, u64::MAX);
        }
        assert_eq!(recorded, PER_OWNER_PER_HOUR);
        // Root's (or the kernel's) finding meanwhile records.
        let s = t0 + 400;
        assert!(f.start_for(&finding(Some(1), s), 0, s * NS_PER_SEC, 2, "n").unwrap().is_some());
        f.flush((s + 2) * NS_PER_SEC, u64::MAX);
        // So does another user's, and the first user's again an hour after its first.
        let s = t0 + 500;
        assert!(f.start_for(&finding(Some(0), s), 1001, s * NS_PER_SEC, 2, "n").unwrap().is_some());
        f.flush((s + 2) * NS_PER_SEC, u64::MAX);
        let s = t0 + 3_600;
        assert!(f.start_for(&finding(Some(0), s), 1000, s * NS_PER_SEC, 2, "n").unwrap().is_some());
    }

    /// Many users (or processes gone before their owner was read) each within their bound: their
    /// recordings replace one another's, never root's; root's replace theirs first.
    #[test]
    fn users_recordings_never_replace_roots_and_roots_replace_users_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = Flight::new(Settings { hz: 999, secs: 1, keep: 3 }, 99, dir.path());
        let left = || {
            let mut v: Vec<String> = std::fs::read_dir(flight_dir(dir.path()))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        let at = |owner: u32, s: u64, f: &mut Flight| {
            // Distinct modification times for the pruning order.
            std::thread::sleep(std::time::Duration::from_millis(20));
            let started = f.start_for(&finding(Some(0), s), owner, s * NS_PER_SEC, 2, "n").unwrap().is_some();
            f.flush((s + 2) * NS_PER_SEC, u64::MAX);
            started
        };
        assert!(at(0, 1_800_000_000, &mut f));
        // Ten users and a process gone, one finding each: every one records, replacing users'.
        for (i, owner) in (1000..1010).chain([GONE]).enumerate() {
            assert!(at(owner, 1_800_000_100 + i as u64, &mut f), "owner {owner}");
        }
        assert_eq!(
            left(),
            [
                "saturated-core-cpu0-1800000000",
                "saturated-core-cpu0-1800000109-u1009",
                "saturated-core-cpu0-1800000110-gone"
            ]
        );
        // Root's replace users' first.
        assert!(at(0, 1_800_000_200, &mut f));
        assert!(at(0, 1_800_000_300, &mut f));
        assert_eq!(
            left(),
            ["saturated-core-cpu0-1800000000", "saturated-core-cpu0-1800000200", "saturated-core-cpu0-1800000300"]
        );
        // All root's: a user's finding opens without a recording, and root's stay.
        assert!(!at(2000, 1_800_000_400, &mut f));
        assert_eq!(left().len(), 3);
        assert!(left().iter().all(|n| !by_user(n)));
        // Root's own go oldest first, as before.
        assert!(at(0, 1_800_000_500, &mut f));
        assert_eq!(left()[0], "saturated-core-cpu0-1800000200");
        assert!(
            by_user("hot-kernel-function-cpu1-7-u0")
                && !by_user("hot-kernel-function-cpu1-7")
                && !by_user("x-cpu1-7-u")
        );
    }

    #[test]
    fn a_findings_owner_is_that_of_the_first_process_it_names() {
        let mut f = finding(Some(0), 1);
        assert_eq!(owner_of(&f), 0, "no process: the kernel's");
        let me = std::process::id();
        let uid = std::fs::metadata("/proc/self").unwrap().uid();
        f.evidence = serde_json::json!({"top_processes": [{"pid": me, "comm": "x"}]});
        assert_eq!(owner_of(&f), uid);
        f.evidence = serde_json::json!({"staller": {"pid": me}});
        assert_eq!(owner_of(&f), uid);
        // pid_max is at most 2^22: this one cannot exist.
        f.evidence = serde_json::json!({"processes": [{"pid": 1u64 << 23}]});
        assert_eq!(owner_of(&f), GONE);
    }
}
