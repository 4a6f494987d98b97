//! The backstop: a thread reads the daemon's anonymous memory (`RssAnon`) a few times a second
//! and, past the plan's target, asks the caches that can be rebuilt to drop what they hold
//! ([`shed_requested`]); the pipeline, which owns them, looks at each batch. Counted and logged.

use std::{
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::{Duration, Instant},
};

/// How often the daemon's memory is read (a 1 KiB read of /proc/self/status: ~15 µs).
const EVERY: Duration = Duration::from_millis(200);
/// At most one shed this often: dropping the caches costs the next seconds' samples a lookup.
const SHED_AT_MOST_EVERY: Duration = Duration::from_secs(2);

/// Incremented at each request to shed; each owner of caches remembers the last it served.
static SHEDS: AtomicU64 = AtomicU64::new(0);
/// The most anonymous memory seen, in bytes.
static PEAK_ANON: AtomicU64 = AtomicU64::new(0);
static LAST_ANON: AtomicU64 = AtomicU64::new(0);

/// Requests to shed so far (a counter for /metrics).
pub fn sheds() -> u64 {
    SHEDS.load(Relaxed)
}

pub fn anon_bytes() -> u64 {
    LAST_ANON.load(Relaxed)
}

pub fn peak_anon_bytes() -> u64 {
    PEAK_ANON.load(Relaxed)
}

/// Whether a shed was asked for since `seen` (which is then brought up to date).
pub fn shed_requested(seen: &mut u64) -> bool {
    let now = SHEDS.load(Relaxed);
    let asked = now != *seen;
    *seen = now;
    asked
}

/// Starts the watcher for a daemon whose anonymous memory should stay under `target` bytes.
pub fn spawn(target: u64) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("memory-watch".into()).spawn(move || {
        let mut last_shed: Option<Instant> = None;
        loop {
            std::thread::sleep(EVERY);
            let Some(anon) = own_anon_bytes() else { continue };
            LAST_ANON.store(anon, Relaxed);
            PEAK_ANON.fetch_max(anon, Relaxed);
            if anon > target && last_shed.is_none_or(|t| t.elapsed() >= SHED_AT_MOST_EVERY) {
                last_shed = Some(Instant::now());
                SHEDS.fetch_add(1, Relaxed);
                tracing::warn!(
                    anon_mib = anon >> 20,
                    target_mib = target >> 20,
                    "the daemon's memory passed its budget: dropping the symbol and stack caches (they are rebuilt as samples need them; see profiler_memory_* on /metrics)"
                );
                #[cfg(target_env = "gnu")]
                // SAFETY: malloc_trim only releases free memory.
                unsafe {
                    libc::malloc_trim(0);
                }
            }
        }
    })
}

/// `RssAnon` of this process, in bytes.
pub fn own_anon_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_anon(&status)
}

fn parse_anon(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_memory_is_read_from_status() {
        assert_eq!(parse_anon("Name:\tx\nRssAnon:\t    2048 kB\nRssFile: 1 kB\n"), Some(2 << 20));
        assert!(own_anon_bytes().is_some_and(|b| b > 0));
        let mut seen = sheds();
        assert!(!shed_requested(&mut seen));
        SHEDS.fetch_add(1, Relaxed);
        assert!(shed_requested(&mut seen));
        assert!(!shed_requested(&mut seen));
    }
}
