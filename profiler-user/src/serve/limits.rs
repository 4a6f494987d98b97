//! What the HTTP server may take from the daemon, in total. One request's cost is bounded by
//! [`crate::budget`]; here: how many heavy requests run at once (the rest wait briefly, then get
//! 503 with Retry-After), how often `/metrics` is rendered (once a second, cached) and answered
//! (a global rate, 429 beyond it), and the file descriptors connections may hold.

use std::{
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Heavy requests (anything that reads the store) running at once. Each is held to the
/// per-query budget (tens of MB at most), so two keep the total well under the 256 MiB cap.
pub const HEAVY_AT_ONCE: usize = 2;
/// What one heavy request may hold at its peak (a fold at its stack and byte budgets, its
/// dictionaries and its answer; a month's fold of 127-frame stacks measured ~100 MiB before the
/// budgets): requests queue on the queries' pool of the memory budget, this much a turn.
pub const HEAVY_BYTES: u64 = 32 << 20;

/// Heavy requests at once: as many as the queries' pool holds at [`HEAVY_BYTES`] each, at least
/// one, at most [`HEAVY_AT_ONCE`] (at the unit's 256 MiB: one).
pub fn heavy_at_once() -> usize {
    (crate::memory::QUERIES.limit() / HEAVY_BYTES).clamp(1, HEAVY_AT_ONCE as u64) as usize
}

/// Heavy requests that may wait for a turn; beyond it the answer is an immediate 503.
pub const HEAVY_QUEUE: usize = 8;
/// How long a heavy request waits for a turn before a 503 (they queue on memory: at the
/// unit's limit one runs at a time, a few seconds each on a large store).
pub const HEAVY_WAIT: Duration = Duration::from_secs(15);
/// Seconds a client is told to wait after a 503 or 429.
pub const RETRY_AFTER_SECS: u64 = 2;
/// `/metrics` answers per second, all clients together (Prometheus scrapes every 15-60 s).
pub const METRICS_PER_SEC: u32 = 50;
/// How long a request over the `/metrics` rate waits for its 429: with at most
/// [`MAX_CONNECTIONS`] connections, refusals cost at most MAX_CONNECTIONS / 0.2 s answers a second.
pub const REFUSAL_DELAY: Duration = Duration::from_millis(200);
/// How long a rendered `/metrics` text is served again.
pub const METRICS_CACHE: Duration = Duration::from_secs(1);

/// Descriptors left to the rest of the daemon (store segments, BPF maps and links, /proc
/// reads of the symbolizer, logs) whatever the connections take.
pub const RESERVED_FDS: u64 = 256;
/// Connections at once, at most (loopback UI, an API client, a Prometheus scraper).
pub const MAX_CONNECTIONS: usize = 128;

/// Why a request was not served now.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Too many heavy requests already waiting or running past the wait.
    Busy,
}

/// Admission of heavy requests: a semaphore, a bounded queue, a bounded wait.
pub struct Heavy {
    running: std::sync::Arc<Semaphore>,
    waiting: AtomicUsize,
    wait: Duration,
}

impl Heavy {
    pub fn new(at_once: usize, wait: Duration) -> Self {
        Self { running: std::sync::Arc::new(Semaphore::new(at_once)), waiting: AtomicUsize::new(0), wait }
    }

    /// A turn to run, or [`Refusal::Busy`] when the queue is full or the wait ran out.
    pub async fn enter(&self) -> Result<OwnedSemaphorePermit, Refusal> {
        if let Ok(p) = self.running.clone().try_acquire_owned() {
            return Ok(p);
        }
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= HEAVY_QUEUE {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(Refusal::Busy);
        }
        let turn = tokio::time::timeout(self.wait, self.running.clone().acquire_owned()).await;
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        match turn {
            Ok(Ok(p)) => Ok(p),
            _ => Err(Refusal::Busy),
        }
    }
}

/// A token bucket: `per_sec` answers a second, bursts up to `per_sec`.
pub struct Rate {
    per_sec: f64,
    state: Mutex<(f64, Instant)>,
}

impl Rate {
    pub fn new(per_sec: u32) -> Self {
        Self { per_sec: f64::from(per_sec), state: Mutex::new((f64::from(per_sec), Instant::now())) }
    }

    pub fn allow(&self) -> bool {
        self.allow_at(Instant::now())
    }

    fn allow_at(&self, now: Instant) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let refill = now.saturating_duration_since(s.1).as_secs_f64() * self.per_sec;
        *s = ((s.0 + refill).min(self.per_sec), now.max(s.1));
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The last rendered text of `/metrics` and when it was rendered.
#[derive(Default)]
pub struct Cached {
    text: Mutex<Option<(Instant, std::sync::Arc<str>)>>,
}

impl Cached {
    /// The cached text if younger than `max_age`, else `render()`'s (stored for the next ones).
    pub fn get(&self, max_age: Duration, render: impl FnOnce() -> String) -> std::sync::Arc<str> {
        let mut t = self.text.lock().unwrap_or_else(|e| e.into_inner());
        match &*t {
            Some((at, text)) if at.elapsed() < max_age => text.clone(),
            _ => {
                let text: std::sync::Arc<str> = render().into();
                *t = Some((Instant::now(), text.clone()));
                text
            }
        }
    }
}

/// Raises the soft limit of open files to the hard one (systemd's default soft limit is 1024
/// whatever `LimitNOFILE=` allows) and returns the soft limit now in force.
pub fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit write/read the struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    lim.rlim_cur
}

/// Connections allowed with `nofile` descriptors: at most half of what the reserve leaves, so
/// that the store can always open its files, and never more than [`MAX_CONNECTIONS`].
pub fn connection_cap(nofile: u64) -> usize {
    let spare = nofile.saturating_sub(RESERVED_FDS) / 2;
    (spare.min(MAX_CONNECTIONS as u64) as usize).max(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_leave_the_reserve_alone() {
        assert_eq!(connection_cap(1024), MAX_CONNECTIONS);
        assert_eq!(connection_cap(65_536), MAX_CONNECTIONS);
        assert_eq!(connection_cap(400), 72);
        assert_eq!(connection_cap(100), 4);
    }

    #[test]
    fn the_rate_refills_with_time_and_never_beyond_a_second() {
        let r = Rate::new(5);
        let t0 = Instant::now();
        assert_eq!((0..10).filter(|_| r.allow_at(t0)).count(), 5);
        assert!(!r.allow_at(t0 + Duration::from_millis(100)));
        assert!(r.allow_at(t0 + Duration::from_millis(250)));
        assert_eq!((0..10).filter(|_| r.allow_at(t0 + Duration::from_secs(60))).count(), 5);
    }

    #[test]
    fn metrics_render_once_per_period() {
        let c = Cached::default();
        let mut renders = 0;
        for _ in 0..100 {
            c.get(Duration::from_secs(60), || {
                renders += 1;
                "x".into()
            });
        }
        assert_eq!(renders, 1);
        assert_eq!(&*c.get(Duration::ZERO, || "y".into()), "y");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn heavy_requests_wait_then_are_refused() {
        let h = Heavy::new(1, Duration::from_millis(50));
        let first = h.enter().await.unwrap();
        let t = Instant::now();
        assert_eq!(h.enter().await.unwrap_err(), Refusal::Busy);
        assert!(t.elapsed() >= Duration::from_millis(50), "it waited its turn first");
        drop(first);
        assert!(h.enter().await.is_ok());
    }
}
