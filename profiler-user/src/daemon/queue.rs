//! The bounded queue between the ring reader and the pipeline stage: batches of raw ring
//! records, bounded in bytes (memory is what a stalled pipeline must not grow without end).
//!
//! One producer (the reader) and one consumer (the pipeline). The bound is enforced here, not
//! by the channel: a batch that does not fit is handed back to the reader, which counts its
//! records as lost (per CPU and second) instead of blocking; blocking would leave the kernel's
//! ring undrained and lose samples there, uncounted by second.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
    mpsc,
};
use std::time::Duration;

/// Which ring a batch came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Samples,
    Events,
}

/// Raw records, copied out of a ring back to back.
#[derive(Debug)]
pub struct Batch {
    pub source: Source,
    /// The last batch of a drain on the reader's flush timer (it may be empty): once it is
    /// handled, everything sampled before that drain has been, so the stage flushes then.
    pub flush: bool,
    /// On a flush batch: the wall-clock time (unix ns) at which its drain began. Every sample
    /// stamped before it was in the ring by then, so once this batch is handled the pipeline
    /// has seen every sample of the seconds that ended before it (see `detect::Engine::tick`).
    pub drained_at_ns: Option<u64>,
    bytes: Vec<u8>,
    ends: Vec<u32>,
}

impl Batch {
    pub fn new(source: Source) -> Self {
        Self { source, flush: false, drained_at_ns: None, bytes: Vec::new(), ends: Vec::new() }
    }

    pub fn push(&mut self, record: &[u8]) {
        self.bytes.extend_from_slice(record);
        self.ends.push(self.bytes.len() as u32);
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn byte_len(&self) -> usize {
        self.bytes.len()
    }

    pub fn records(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(self.ends.iter().copied()).map(|(s, e)| &self.bytes[s as usize..e as usize])
    }
}

/// The queue's figures, shared with /metrics and the self report.
#[derive(Debug, Default)]
pub struct QueueStats {
    pub capacity_bytes: u64,
    records: AtomicU64,
    bytes: AtomicU64,
    max_records: AtomicU64,
    max_bytes: AtomicU64,
}

// A reading of [`QueueStats`], as /metrics shows it (defined there).
pub use crate::serve::metrics::Depth;

impl QueueStats {
    pub fn depth(&self) -> Depth {
        Depth {
            records: self.records.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            max_records: self.max_records.load(Ordering::Relaxed),
            max_bytes: self.max_bytes.load(Ordering::Relaxed),
            capacity_bytes: self.capacity_bytes,
        }
    }
}

pub struct Intake {
    tx: mpsc::Sender<Batch>,
    stats: Arc<QueueStats>,
}

pub struct Outlet {
    rx: mpsc::Receiver<Batch>,
    stats: Arc<QueueStats>,
}

/// Why a batch was not queued.
#[derive(Debug)]
pub enum Refused {
    /// No room: the batch is handed back for counting.
    Full(Batch),
    /// The pipeline stage is gone.
    Closed,
}

pub fn bounded(capacity_bytes: u64) -> (Intake, Outlet, Arc<QueueStats>) {
    let stats = Arc::new(QueueStats { capacity_bytes, ..Default::default() });
    let (tx, rx) = mpsc::channel();
    (Intake { tx, stats: stats.clone() }, Outlet { rx, stats: stats.clone() }, stats)
}

impl Intake {
    pub fn offer(&self, batch: Batch) -> Result<(), Refused> {
        let s = &self.stats;
        let (n, b) = (batch.len() as u64, batch.byte_len() as u64);
        // Only this producer adds, so room seen here cannot shrink before the add below.
        if s.bytes.load(Ordering::Acquire) + b > s.capacity_bytes {
            return Err(Refused::Full(batch));
        }
        let bytes = s.bytes.fetch_add(b, Ordering::AcqRel) + b;
        let records = s.records.fetch_add(n, Ordering::AcqRel) + n;
        s.max_bytes.fetch_max(bytes, Ordering::Relaxed);
        s.max_records.fetch_max(records, Ordering::Relaxed);
        self.tx.send(batch).map_err(|_| Refused::Closed)
    }
}

impl Outlet {
    /// The next batch. It still counts against the bound until [`Self::release`]d, so batches a
    /// consumer holds aside (see the pipeline stage's event priority) stay bounded too.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Batch, mpsc::RecvTimeoutError> {
        self.rx.recv_timeout(timeout)
    }

    /// The next batch if one is waiting (see [`Self::recv_timeout`]).
    pub fn try_recv(&self) -> Result<Batch, mpsc::TryRecvError> {
        self.rx.try_recv()
    }

    /// A batch is handled: its room is free again.
    pub fn release(&self, batch: &Batch) {
        self.stats.bytes.fetch_sub(batch.byte_len() as u64, Ordering::AcqRel);
        self.stats.records.fetch_sub(batch.len() as u64, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(records: &[&[u8]]) -> Batch {
        let mut b = Batch::new(Source::Samples);
        for r in records {
            b.push(r);
        }
        b
    }

    #[test]
    fn records_come_out_as_they_went_in() {
        let b = batch(&[b"abc", b"", b"defg"]);
        assert_eq!(b.records().collect::<Vec<_>>(), vec![&b"abc"[..], b"", b"defg"]);
        assert_eq!((b.len(), b.byte_len()), (3, 7));
    }

    #[test]
    fn bounded_in_bytes_and_depth_follows_the_consumer() {
        let (intake, outlet, stats) = bounded(10);
        intake.offer(batch(&[b"1234", b"56"])).unwrap();
        intake.offer(batch(&[b"7890"])).unwrap();
        assert!(matches!(intake.offer(batch(&[b"x"])), Err(Refused::Full(b)) if b.len() == 1));
        assert_eq!(stats.depth(), Depth { records: 3, bytes: 10, max_records: 3, max_bytes: 10, capacity_bytes: 10 });
        let b = outlet.recv_timeout(Duration::ZERO).unwrap();
        assert_eq!(stats.depth().records, 3, "held by the consumer: still counted");
        outlet.release(&b);
        assert_eq!((stats.depth().records, stats.depth().bytes, stats.depth().max_records), (1, 4, 3));
        intake.offer(batch(&[b"x"])).unwrap();
        drop(outlet);
        assert!(matches!(intake.offer(batch(&[b"y"])), Err(Refused::Closed)));
    }
}
