//! The reader stage: a thread that waits on the ring buffers and copies their records into the
//! bounded queue, and does nothing else, so that no slow work (symbolizing, writing, a query)
//! ever delays draining the kernel's ring. What does not fit in the queue is counted in
//! [`Drops`] (per CPU and second) and dropped.

use std::{
    os::fd::{AsFd, AsRawFd},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};

use super::{
    drops::Drops,
    queue::{Batch, Intake, Refused, Source},
};
use crate::collect::Rings;

/// A batch is handed on once it holds this many bytes (or the ring is empty): large enough that
/// the channel's cost is per many records, small enough that the pipeline starts early.
const BATCH_BYTES: usize = 64 * 1024;

pub struct Reader {
    pub intake: Intake,
    pub drops: Arc<Mutex<Drops>>,
    pub stop: Arc<AtomicBool>,
    /// The ring is drained on this period, and the stage flushes after each such drain (see
    /// [`Batch::flush`]). Between two, the kernel wakes the reader only when a quarter of the
    /// ring is used (`WAKEUP_BYTES`) and the events ring (execs) has a record.
    pub flush_every: Duration,
}

impl Reader {
    pub fn spawn(self, rings: Rings) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new().name("ring-reader".into()).spawn(move || self.run(rings))
    }

    fn run(self, mut rings: Rings) {
        // Edge-triggered: a ring buffer's fd polls readable for as long as it holds any data, so
        // a level-triggered wait would return at once whenever one record arrived since the
        // drain, and under load the thread would spin. The kernel wakes the fd when a quarter of
        // the ring is used (`WAKEUP_BYTES`); the timer drains the rest.
        let epoll = Epoll::new(
            std::iter::once(rings.samples.as_fd().as_raw_fd())
                .chain(rings.events.as_ref().map(|e| e.as_fd().as_raw_fd())),
        );
        if let Err(e) = &epoll {
            tracing::warn!(error = %e, "cannot wait on the ring buffers; draining them on a timer instead");
        }
        // Fixed deadlines, not a wait after each drain: early wakeups (an exec) do not move
        // them, so the stage's flushes keep one pace. They fall just after the wall clock's
        // multiples of the period, so that a 1 s flush finds a whole second to write.
        let mut next_flush = first_deadline(self.flush_every);
        loop {
            let stopping = self.stop.load(Ordering::Acquire);
            let mut timed = false;
            if !stopping {
                let wait = next_flush.saturating_duration_since(Instant::now());
                match &epoll {
                    // Rounded up: waking before the deadline would only wait again.
                    Ok(ep) => ep.wait(wait.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32),
                    Err(_) => std::thread::sleep(wait),
                }
                let now = Instant::now();
                if now >= next_flush {
                    timed = true;
                    next_flush += self.flush_every;
                    if next_flush <= now {
                        // Overslept by a whole period (a stopped VM): start the pace afresh.
                        next_flush = now + self.flush_every;
                    }
                }
            }
            // Events first: an exec read before the samples behind it lets the pipeline read
            // the new program's mappings before its first samples need them.
            if let Some(e) = rings.events.as_mut()
                && !self.drain(e, Source::Events, None)
            {
                return;
            }
            // Read before the drain: every sample stamped earlier is in the ring now.
            let drained_at = timed.then(crate::timespec::now_ns);
            if !self.drain(&mut rings.samples, Source::Samples, drained_at) || stopping {
                return;
            }
        }
    }

    /// Moves every record in the ring into the queue; `drained_at`: mark the last batch as a
    /// flush that began then (sent even when empty). False once the pipeline is gone.
    fn drain(&self, ring: &mut RingBuf<MapData>, source: Source, drained_at: Option<u64>) -> bool {
        let mut batch = Batch::new(source);
        while let Some(record) = ring.next() {
            batch.push(&record);
            drop(record);
            if batch.byte_len() >= BATCH_BYTES && !self.hand_on(std::mem::replace(&mut batch, Batch::new(source))) {
                return false;
            }
        }
        batch.flush = drained_at.is_some();
        batch.drained_at_ns = drained_at;
        (batch.is_empty() && !batch.flush) || self.hand_on(batch)
    }

    fn hand_on(&self, batch: Batch) -> bool {
        queue_or_count(&self.intake, &self.drops, batch)
    }
}

/// How long after a second ends its last samples can still be on their way: through the ring
/// (the reader is woken early only for a quarter-full ring) to the reader.
const SECOND_SETTLES: Duration = Duration::from_millis(30);

/// The first drain deadline: `SECOND_SETTLES` after the next wall-clock multiple of `period`.
fn first_deadline(period: Duration) -> Instant {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let period_ns = period.as_nanos().max(1);
    let into = Duration::from_nanos((now.as_nanos() % period_ns) as u64);
    let mut wait = period.saturating_sub(into) + SECOND_SETTLES;
    if wait > period {
        wait -= period;
    }
    Instant::now() + wait
}

/// Queues a batch, or counts its records as dropped when the queue is full. False once the
/// pipeline is gone.
pub fn queue_or_count(intake: &Intake, drops: &Mutex<Drops>, batch: Batch) -> bool {
    match intake.offer(batch) {
        Ok(()) => true,
        Err(Refused::Full(batch)) => {
            let offset = super::clock::boot_to_unix_offset();
            if let Ok(mut d) = drops.lock() {
                d.count(&batch, offset);
            }
            true
        }
        Err(Refused::Closed) => false,
    }
}

/// An edge-triggered epoll instance over the ring buffers' fds.
struct Epoll(std::os::fd::OwnedFd);

impl Epoll {
    fn new(fds: impl Iterator<Item = std::os::fd::RawFd>) -> std::io::Result<Self> {
        use std::os::fd::FromRawFd;
        // SAFETY: no preconditions; the fd is checked before use.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a new fd that nothing else owns.
        let ep = Self(unsafe { std::os::fd::OwnedFd::from_raw_fd(ep) });
        for fd in fds {
            let mut event = libc::epoll_event { events: (libc::EPOLLIN | libc::EPOLLET) as u32, u64: fd as u64 };
            // SAFETY: valid epoll fd, fd and event.
            if unsafe { libc::epoll_ctl(ep.0.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut event) } < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(ep)
    }

    /// Waits for a wakeup or `timeout_ms`; an error (EINTR) only means an early drain.
    fn wait(&self, timeout_ms: i32) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 2];
        // SAFETY: valid epoll fd and a buffer of 2 events.
        unsafe { libc::epoll_wait(self.0.as_raw_fd(), events.as_mut_ptr(), 2, timeout_ms) };
    }
}
