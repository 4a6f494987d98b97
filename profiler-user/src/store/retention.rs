//! Keeps the store within its bounds: the oldest segments go first, by size and by age.

use std::path::{Path, PathBuf};

use super::{StoreError, format::SEGMENT_NS, reader::list_segments};

/// The store's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Total size of all segments.
    pub max_bytes: u64,
    /// Segments that ended longer ago than this are removed.
    pub max_age_ns: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Self { max_bytes: 1 << 30, max_age_ns: 7 * 24 * 3600 * 1_000_000_000 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    Size,
    Age,
}

/// A segment retention removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removed {
    pub path: PathBuf,
    pub start_ns: u64,
    pub bytes: u64,
    pub why: Why,
}

/// Removes segments, oldest first, until the store is within `r`. The newest segment is never
/// removed (the daemon is writing it), so the store exceeds `max_bytes` by at most one segment.
/// `before_remove` runs before each removal (the index lets go of the segment first).
///
/// A minute's kernel counters (`store::counters`) count with its segment and go with it, so
/// they are kept exactly as long as the samples beside them; counters of minutes older than
/// every segment left (their segment went before, or never was) go too.
pub fn enforce(
    data_dir: &Path,
    r: &Retention,
    now_ns: u64,
    before_remove: &mut dyn FnMut(u64, &Path) -> Result<(), StoreError>,
) -> Result<Vec<Removed>, StoreError> {
    let mut segments: Vec<(u64, PathBuf, u64)> = list_segments(data_dir)?
        .into_iter()
        .map(|(start, path)| {
            let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            (start, path, bytes)
        })
        .collect();
    // Leftovers that are not segments: a rollup interrupted mid-write (stale), files set aside
    // as corrupt (kept for inspection until they are as old as the age limit).
    if let Ok(entries) = std::fs::read_dir(super::segments_dir(data_dir)) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let age = e.metadata().ok().and_then(|m| m.modified().ok()).and_then(|t| t.elapsed().ok());
            let stale_tmp = name.ends_with(".rollup.tmp") && age.is_some_and(|a| a.as_secs() > 600);
            let old_corrupt = name.ends_with(".corrupt") && age.is_some_and(|a| a.as_nanos() as u64 > r.max_age_ns);
            if stale_tmp || old_corrupt {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    // A minute may have several counters files (kernel, GPU) and CUDA segments: their bytes
    // add up, and they go with the minute's samples.
    let mut counters: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    for (start, path) in super::counters::list(data_dir).unwrap_or_default() {
        *counters.entry(start).or_default() += std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    }
    let cuda: Vec<(u64, PathBuf)> = crate::model::SampleKind::WEIGHTED
        .iter()
        .flat_map(|k| list_segments(&k.store_dir(data_dir)).unwrap_or_default())
        .collect();
    for (start, path) in &cuda {
        *counters.entry(*start).or_default() += std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    }
    let counters_bytes = |start: u64| counters.get(&start).copied().unwrap_or(0);
    for s in &mut segments {
        s.2 += counters_bytes(s.0);
    }
    let mut total: u64 = segments.iter().map(|s| s.2).sum();
    let mut removed = Vec::new();
    while segments.len() > 1 {
        let (start, _, bytes) = segments[0];
        let why = if start.saturating_add(SEGMENT_NS).saturating_add(r.max_age_ns) <= now_ns {
            Why::Age
        } else if total > r.max_bytes {
            Why::Size
        } else {
            break;
        };
        let (start, path, _) = segments.remove(0);
        before_remove(start, &path)?;
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StoreError::Io(path, e)),
        }
        total -= bytes;
        removed.push(Removed { path, start_ns: start, bytes, why });
    }
    // Counters whose samples are gone: older than the oldest segment left (with no segment,
    // older than the age limit).
    let keep_from = segments.first().map_or(now_ns.saturating_sub(r.max_age_ns).saturating_sub(SEGMENT_NS), |s| s.0);
    if let Err(e) = super::counters::prune(data_dir, keep_from) {
        tracing::warn!(error = %e, "kernel counters of removed minutes could not be removed");
    }
    for (start, path) in cuda {
        if start < keep_from {
            match std::fs::remove_file(&path) {
                Ok(()) => removed.push(Removed { path, start_ns: start, bytes: 0, why: Why::Age }),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(file = %path.display(), error = %e, "a CUDA segment could not be removed"),
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{format::NS_PER_SEC, segment_path, segments_dir};

    fn store_with(sizes: &[(u64, usize)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(segments_dir(dir.path())).unwrap();
        for &(minute, size) in sizes {
            std::fs::write(segment_path(&segments_dir(dir.path()), minute * SEGMENT_NS), vec![0u8; size]).unwrap();
        }
        dir
    }

    #[test]
    fn oldest_go_first_until_within_size() {
        let dir = store_with(&[(10, 100), (11, 100), (12, 100), (13, 100)]);
        let r = Retention { max_bytes: 250, max_age_ns: u64::MAX / 2 };
        let removed = enforce(dir.path(), &r, 14 * SEGMENT_NS, &mut |_, _| Ok(())).unwrap();
        assert_eq!(removed.iter().map(|r| r.start_ns / SEGMENT_NS).collect::<Vec<_>>(), vec![10, 11]);
        assert!(removed.iter().all(|r| r.why == Why::Size));
        assert_eq!(list_segments(dir.path()).unwrap().len(), 2);
    }

    #[test]
    fn the_newest_segment_stays_even_when_too_big() {
        let dir = store_with(&[(10, 100), (11, 1000)]);
        let r = Retention { max_bytes: 10, max_age_ns: 0 };
        enforce(dir.path(), &r, 100 * SEGMENT_NS, &mut |_, _| Ok(())).unwrap();
        let left = list_segments(dir.path()).unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].0, 11 * SEGMENT_NS);
    }

    #[test]
    fn counters_count_with_their_minute_and_go_with_it() {
        let dir = store_with(&[(10, 100), (11, 100), (12, 100)]);
        let cdir = crate::store::counters::counters_dir(dir.path());
        std::fs::create_dir_all(&cdir).unwrap();
        // Minute 9 has counters but no segment; 10 and 12 have both.
        for (minute, size) in [(9, 10), (10, 200), (12, 50)] {
            std::fs::write(cdir.join(format!("{}.cnt", minute * 60)), vec![b'x'; size]).unwrap();
        }
        // 100 + 200 for minute 10 put the store over 500: minute 10 goes, its counters with it.
        let r = Retention { max_bytes: 400, max_age_ns: u64::MAX / 2 };
        let removed = enforce(dir.path(), &r, 13 * SEGMENT_NS, &mut |_, _| Ok(())).unwrap();
        assert_eq!(removed.iter().map(|r| (r.start_ns / SEGMENT_NS, r.bytes)).collect::<Vec<_>>(), vec![(10, 300)]);
        let left: Vec<u64> =
            crate::store::counters::list(dir.path()).unwrap().iter().map(|(s, _)| s / SEGMENT_NS).collect();
        assert_eq!(left, vec![12], "minute 9's counters (no segment, older than all) went too");
    }

    #[test]
    fn cuda_segments_count_with_their_minute_and_go_with_it() {
        let dir = store_with(&[(10, 100), (11, 100), (12, 100)]);
        let launches = crate::model::SampleKind::CudaLaunches.store_dir(dir.path());
        std::fs::create_dir_all(segments_dir(&launches)).unwrap();
        for (minute, size) in [(9, 10), (10, 200), (12, 50)] {
            std::fs::write(segment_path(&segments_dir(&launches), minute * SEGMENT_NS), vec![0u8; size]).unwrap();
        }
        let r = Retention { max_bytes: 400, max_age_ns: u64::MAX / 2 };
        let removed = enforce(dir.path(), &r, 13 * SEGMENT_NS, &mut |_, _| Ok(())).unwrap();
        // Minute 10 (100 + 200 bytes) goes for size, and its CUDA segment; minute 9's CUDA
        // segment is older than every sample left.
        assert!(removed.iter().any(|r| r.start_ns == 10 * SEGMENT_NS && r.bytes == 300), "{removed:?}");
        let left: Vec<u64> =
            crate::store::reader::list_segments(&launches).unwrap().iter().map(|(s, _)| s / SEGMENT_NS).collect();
        assert_eq!(left, vec![12]);
    }

    #[test]
    fn old_segments_go_by_age() {
        let dir = store_with(&[(10, 1), (11, 1), (20, 1)]);
        let r = Retention { max_bytes: u64::MAX, max_age_ns: 5 * 60 * NS_PER_SEC };
        let removed = enforce(dir.path(), &r, 17 * SEGMENT_NS, &mut |_, _| Ok(())).unwrap();
        assert_eq!(removed.len(), 2);
        assert!(removed.iter().all(|r| r.why == Why::Age));
    }
}

#[cfg(test)]
mod bound_tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        model::{Sample, Stack},
        store::{StoreWriter, format::NS_PER_SEC, segments_dir},
    };

    /// The daemon's loop in fast-forward: 30 minutes of samples, flushed every half second,
    /// retention after every flush. The store never exceeds its limit by more than a segment.
    #[test]
    fn a_small_size_limit_is_exceeded_by_at_most_one_segment() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(segments_dir(dir.path())).unwrap();
        let mut w = StoreWriter::new(&segments_dir(dir.path()));
        let limit = 64 * 1024;
        let r = Retention { max_bytes: limit, max_age_ns: u64::MAX / 2 };
        let stacks: Vec<Arc<Stack>> =
            (0..500).map(|i| Arc::new(Stack::new(vec![Arc::from(format!("f{i}")), Arc::from("main")], 2))).collect();
        let comm: Arc<str> = Arc::from("app");
        let t0 = 1_795_000_000 * NS_PER_SEC;
        let (mut largest, mut removed) = (0u64, 0);
        for tick in 0..3600u64 {
            let now = t0 + tick * NS_PER_SEC / 2;
            for k in 0..100u64 {
                let x = (tick * 100 + k).wrapping_mul(2654435761);
                w.push(&Sample {
                    ts_ns: now + k * 5_000_000,
                    cpu: (x % 4) as u32,
                    pid: 1,
                    tid: 1,
                    cgroup_id: 0,
                    comm: comm.clone(),
                    stack: stacks[(x % 500) as usize].clone(),
                    workload: Default::default(),
                });
            }
            w.flush(now).unwrap();
            removed += enforce(dir.path(), &r, now, &mut |_, _| Ok(())).unwrap().len();
            let sizes: Vec<u64> =
                list_segments(dir.path()).unwrap().iter().map(|(_, p)| std::fs::metadata(p).unwrap().len()).collect();
            largest = largest.max(*sizes.iter().max().unwrap());
            let total: u64 = sizes.iter().sum();
            assert!(total <= limit + largest, "tick {tick}: {total} bytes > {limit} + one segment ({largest})");
        }
        assert!(removed > 10, "retention never had to act ({removed} removals)");
    }
}
