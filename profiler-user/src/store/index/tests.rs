use std::sync::Arc;

use super::*;
use crate::{
    model::{Sample, Stack},
    store::{StoreWriter, segments_dir},
};

const T0: u64 = 1_795_000_000 * NS_PER_SEC - 1_795_000_000 % 3600 * NS_PER_SEC; // an hour boundary

/// Samples every 7 s on 3 CPUs from `from_ns` for `secs`, idle ones on CPU 2, some lost.
fn write(dir: &Path, from_ns: u64, secs: u64) {
    let stack = Arc::new(Stack::new(vec![Arc::from("main"), Arc::from("spin")], 2));
    let mut w = StoreWriter::new(&segments_dir(dir));
    for (i, t) in (0..secs).step_by(7).enumerate() {
        let ts_ns = from_ns + t * NS_PER_SEC;
        for cpu in 0..2 {
            let comm: Arc<str> = Arc::from("app");
            w.push(&Sample {
                ts_ns,
                cpu,
                pid: 10,
                tid: 10,
                cgroup_id: 0,
                comm,
                stack: stack.clone(),
                workload: "".into(),
            });
        }
        w.push_idle(ts_ns, 2);
        if i % 5 == 0 {
            w.add_lost_at(ts_ns / NS_PER_SEC, 1, 3);
        }
        w.flush(ts_ns).unwrap();
    }
}

/// The answer without any index: every segment read.
fn from_segments(dir: &Path) -> StoreSummary {
    let hidden = dir.join("index.hidden");
    let had = std::fs::rename(index_dir(dir), &hidden).is_ok();
    let s = summarize(dir, &mut Vec::new()).unwrap();
    if had {
        std::fs::rename(&hidden, index_dir(dir)).unwrap();
    }
    s
}

fn store() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    crate::store::create_and_lock(dir.path()).unwrap();
    write(dir.path(), T0 + 50 * 60 * NS_PER_SEC, 40 * 60); // 40 minutes across two hours
    dir
}

const LATER: u64 = T0 + 10 * HOUR_NS;

#[test]
fn the_index_answers_as_the_segments_do() {
    let dir = store();
    let truth = from_segments(dir.path());
    assert!(truth.segments >= 40 && truth.cpus.len() == 3 && truth.cpus[&1].lost > 0, "{truth:?}");
    let mut ix = Indexer::new(dir.path());
    let done = ix.refresh(LATER).unwrap();
    assert_eq!(done, Refreshed { added: truth.segments, rebuilt: 0 });
    assert_eq!(std::fs::read_dir(index_dir(dir.path())).unwrap().count(), 2, "one index per hour");
    assert_eq!(summarize(dir.path(), &mut Vec::new()).unwrap(), truth);
    assert_eq!(ix.refresh(LATER).unwrap(), Refreshed::default(), "nothing new, nothing written");
}

#[test]
fn an_index_is_used_while_its_files_are_unchanged_and_ignored_once_one_changed() {
    let dir = store();
    let truth = from_segments(dir.path());
    Indexer::new(dir.path()).refresh(LATER).unwrap();
    // Doctor the first hour's counts: a reader that uses the index shows them.
    let mut doctored = load(dir.path(), T0).unwrap();
    doctored.cpus.get_mut(&0).unwrap().samples += 1_000_000;
    super::store(dir.path(), T0, &doctored).unwrap();
    let seen = summarize(dir.path(), &mut Vec::new()).unwrap();
    assert_eq!(seen.cpus[&0].samples, truth.cpus[&0].samples + 1_000_000);
    // One of its segments appended to: that hour's index no longer holds and is not used.
    let (_, path) = crate::store::reader::list_segments(dir.path()).unwrap().remove(0);
    let f = std::fs::File::options().write(true).open(&path).unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5)).unwrap();
    assert_eq!(summarize(dir.path(), &mut Vec::new()).unwrap(), truth);
}

#[test]
fn segments_newer_than_the_index_and_removed_ones_are_counted_right() {
    let dir = store();
    let mut ix = Indexer::new(dir.path());
    ix.refresh(LATER).unwrap();
    // Newer data the index does not name yet.
    write(dir.path(), T0 + 2 * HOUR_NS, 5 * 60);
    assert_eq!(summarize(dir.path(), &mut Vec::new()).unwrap(), from_segments(dir.path()));
    // Retention's way: out of the index first, then removed.
    let segments = crate::store::reader::list_segments(dir.path()).unwrap();
    for (start, path) in &segments[..3] {
        ix.forget(*start, path).unwrap();
        std::fs::remove_file(path).unwrap();
    }
    let truth = from_segments(dir.path());
    assert_eq!(summarize(dir.path(), &mut Vec::new()).unwrap(), truth);
    // Removed behind the index's back (by hand): the answer still holds, and a refresh
    // rebuilds that hour.
    std::fs::remove_file(&segments[4].1).unwrap();
    let truth = from_segments(dir.path());
    assert_eq!(summarize(dir.path(), &mut Vec::new()).unwrap(), truth);
    let done = ix.refresh(LATER).unwrap();
    assert_eq!(done.rebuilt, 1);
    assert_eq!(summarize(dir.path(), &mut Vec::new()).unwrap(), truth);
}

#[test]
fn a_corrupt_or_foreign_index_is_ignored() {
    let dir = store();
    let truth = from_segments(dir.path());
    Indexer::new(dir.path()).refresh(LATER).unwrap();
    let path = index_path(dir.path(), T0);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(summarize(dir.path(), &mut Vec::new()).unwrap(), truth, "checksum mismatch");
    std::fs::write(&path, b"PRFIDX1\n\0\0\0\0garbage").unwrap();
    assert_eq!(summarize(dir.path(), &mut Vec::new()).unwrap(), truth, "not ours");
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
    assert_eq!(summarize(dir.path(), &mut Vec::new()).unwrap(), truth, "a link to /dev/zero");
}

#[test]
fn the_segment_being_written_is_not_indexed() {
    let dir = store();
    let segments = crate::store::reader::list_segments(dir.path()).unwrap();
    let (last, _) = *segments.last().unwrap();
    let done = Indexer::new(dir.path()).refresh(last + SEGMENT_NS).unwrap();
    assert_eq!(done.added, segments.len() - 1, "the newest minute is still open");
    assert_eq!(summarize(dir.path(), &mut Vec::new()).unwrap(), from_segments(dir.path()));
}
