//! CPython processes whose frames are not read, counted by reason for `/metrics`
//! (`profiler_python_unread_processes_total`): an unknown version, a free-threaded build, a
//! published layout that fails its checks or cannot be read. Each such process is still
//! sampled, with its native frames.

use std::sync::atomic::{AtomicU64, Ordering};

use super::Refused;

const REASONS: [&str; 4] = ["unknown_version", "free_threaded", "bad_layout", "unreadable"];

static COUNTS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

/// Counts a process refused for `why` (once per process: the caller remembers it).
pub fn note_unread(why: &Refused) {
    if let Some(i) = REASONS.iter().position(|r| *r == why.reason()) {
        COUNTS[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// Processes refused so far, by reason (every reason, zeros included).
pub fn unread_counts() -> Vec<(&'static str, u64)> {
    REASONS.iter().zip(&COUNTS).map(|(r, c)| (*r, c.load(Ordering::Relaxed))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_series() {
        for why in [Refused::UnknownVersion(15), Refused::FreeThreaded, Refused::Bad("x".into()), Refused::Unreadable] {
            let before = unread_counts().into_iter().find(|(r, _)| *r == why.reason()).expect("a series").1;
            note_unread(&why);
            let after = unread_counts().into_iter().find(|(r, _)| *r == why.reason()).expect("a series").1;
            assert!(after > before, "{why}");
        }
    }
}
