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
    time::Duration,
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
    /// Longest wait between two drains when the kernel does not wake us (it wakes the reader
    /// only when a quarter of the ring is used, see `WAKEUP_BYTES`).
    pub poll_every: Duration,
}

impl Reader {
    pub fn spawn(self, rings: Rings) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new().name("ring-reader".into()).spawn(move || self.run(rings))
    }

    fn run(self, mut rings: Rings) {
        let timeout = self.poll_every.as_millis().clamp(1, i32::MAX as u128) as i32;
        // Edge-triggered: a ring buffer's fd polls readable for as long as it holds any data, so
        // a level-triggered wait would return at once whenever one record arrived since the
        // drain, and under load the thread would spin. The kernel wakes the fd when a quarter of
        // the ring is used (`WAKEUP_BYTES`); the timeout drains the rest.
        let epoll = Epoll::new(
            std::iter::once(rings.samples.as_fd().as_raw_fd())
                .chain(rings.events.as_ref().map(|e| e.as_fd().as_raw_fd())),
        );
        if let Err(e) = &epoll {
            tracing::warn!(error = %e, "cannot wait on the ring buffers; draining them on a timer instead");
        }
        loop {
            let stopping = self.stop.load(Ordering::Acquire);
            if !stopping {
                match &epoll {
                    Ok(ep) => ep.wait(timeout),
                    Err(_) => std::thread::sleep(self.poll_every),
                }
            }
            // Events first: an exec read before the samples behind it lets the pipeline read
            // the new program's mappings before its first samples need them.
            if let Some(e) = rings.events.as_mut()
                && !self.drain(e, Source::Events)
            {
                return;
            }
            if !self.drain(&mut rings.samples, Source::Samples) || stopping {
                return;
            }
        }
    }

    /// Moves every record in the ring into the queue. False once the pipeline is gone.
    fn drain(&self, ring: &mut RingBuf<MapData>, source: Source) -> bool {
        let mut batch = Batch::new(source);
        while let Some(record) = ring.next() {
            batch.push(&record);
            drop(record);
            if batch.byte_len() >= BATCH_BYTES && !self.hand_on(std::mem::replace(&mut batch, Batch::new(source))) {
                return false;
            }
        }
        batch.is_empty() || self.hand_on(batch)
    }

    fn hand_on(&self, batch: Batch) -> bool {
        queue_or_count(&self.intake, &self.drops, batch)
    }
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
