//! The OTLP shipper: every `interval`, the next `interval` of completed seconds after the cursor
//! becomes one `ExportProfilesServiceRequest` (`export::otlp`), posted until the receiver takes
//! it (backoff with jitter, or the wait it asks for) or refuses it for good (logged, counted,
//! skipped); then the cursor moves past it and is saved. A receiver that is down holds the
//! cursor, not memory: the store keeps the samples, and the shipper catches up batch by batch
//! (back to back) when it returns, unless retention removed them first.

use std::{path::PathBuf, sync::Arc, time::Duration};

use hyper::body::Bytes;
use tokio::sync::watch;

pub mod config;
mod findings;
pub mod transport;

use config::Otlp;
use findings::{LOOKBACK_NS, Owed};
use transport::Outcome;

use super::{Cursor, Stats};
use crate::{
    export::otlp::{Builder, logs},
    model::SampleKind,
    query::{self, Filter, QueryError, Window},
    store::{Store, StoreError, format::SEGMENT_NS, reader::Need},
    timespec::now_ns,
};

const NS_PER_SEC: u64 = 1_000_000_000;
/// Most samples in one request: about 1.5 MB of protobuf before gzip, well under a
/// collector's default 20 MiB body limit, and ~20 MB of memory while it is built.
pub const MAX_BATCH_SAMPLES: u64 = 100_000;
/// How late a weighted row (CUDA counts, off-CPU time) may be written into a second: an
/// off-CPU wait is spread over its last 8 seconds when it ends, drained within a second.
const WEIGHTED_LATE_NS: u64 = 10 * NS_PER_SEC;
/// First wait after a failed attempt; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Longest `Retry-After` honoured: a receiver's mistake must not stop shipping for a day.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// What a request carries: profiles (with their samples), or findings' transitions as log
/// records (`findings`), sent to the logs signal's path of the same endpoint.
#[derive(Debug, Clone, Copy)]
enum Signal {
    Profiles {
        samples: u64,
    },
    /// One CUDA kind's rows (launches, time blocked or bytes per second, thread and stack).
    Cuda {
        rows: u64,
    },
    Logs {
        records: u64,
    },
}

/// Reads the store's current ring-to-disk latency (seconds), when known.
pub type RingToDisk = Arc<dyn Fn() -> Option<f64> + Send + Sync>;

pub struct Shipper {
    pub data_dir: PathBuf,
    pub config: Otlp,
    /// `host.name` of every request.
    pub host: String,
    /// The daemon's frequency, for samples whose segment does not record one.
    pub frequency_hz: u64,
    /// How long after its time a sample may still reach the store (the flush interval and
    /// the ring's drain, with a margin); the ring-to-disk latency /metrics reports, when longer.
    pub settle: Duration,
    /// Where the shipper's figures go for `/metrics`.
    pub stats: super::SharedStats,
    /// The store's ring-to-disk latency now (the worst of the last flushes, seconds), when
    /// known: a sample may reach the store that late, so the shipper waits at least as long.
    pub ring_to_disk_max: RingToDisk,
    /// Becomes true when the daemon stops.
    pub stop: watch::Receiver<bool>,
}

impl super::Shipper for Shipper {
    const NAME: &'static str = "otlp";

    /// Runs at nice 10, with its own small runtime.
    fn run(self) {
        crate::threads::lower_this_thread();
        match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt.block_on(self.follow()),
            Err(e) => tracing::error!(error = %e, "the OTLP shipper could not start"),
        }
    }
}

impl Shipper {
    async fn follow(mut self) {
        let cursor_file = match Cursor::open(&self.data_dir, <Self as super::Shipper>::NAME) {
            Ok(c) => c,
            Err(e) => return tracing::error!(error = %e, "the OTLP shipper cannot keep its cursor; nothing is pushed"),
        };
        let mut cursor = match cursor_file.load() {
            Some(c) => c,
            // A first start ships from now on, not the whole store.
            None => now_ns() / NS_PER_SEC * NS_PER_SEC,
        };
        tracing::info!(
            endpoint = %self.config.url,
            protocol = %self.config.protocol,
            interval_s = self.config.interval.as_secs(),
            from = %crate::timespec::format(cursor),
            "pushing profiles over OTLP"
        );
        let mut stats = Stats::default();
        let mut owed = Owed::default();
        let interval = self.config.interval.as_secs() * NS_PER_SEC;
        // The weighted stores go [`WEIGHTED_LATE_NS`] behind the samples: an off-CPU wait is
        // written when it ends, into the seconds it covered, and a receiver takes a row sent
        // again as more time, so each second is sent once, once no more can come.
        let mut weighted_from = cursor.saturating_sub(WEIGHTED_LATE_NS);
        loop {
            self.publish(&stats, cursor);
            let ready = self.ready();
            if ready < cursor.saturating_add(interval) {
                let wait = cursor.saturating_add(interval).saturating_sub(ready).min(interval);
                if self.sleep(Duration::from_nanos(wait)).await {
                    break;
                }
                continue;
            }
            let batch = self
                .batch_end(cursor, cursor + interval)
                .map_err(QueryError::from)
                .and_then(|end| Ok((end, self.read(cursor, end)?)));
            let (end, (body, samples)) = match batch {
                Ok(b) => b,
                Err(e) => {
                    *stats.errors.entry("store").or_default() += 1;
                    tracing::error!(error = %e, "the OTLP shipper cannot read the store; trying again");
                    if self.sleep(self.config.interval).await {
                        break;
                    }
                    continue;
                }
            };
            if samples > 0 && !self.deliver(Signal::Profiles { samples }, body, &mut stats, cursor).await {
                break; // stopped: the batch goes again after a restart
            }
            let weighted_to = end.saturating_sub(WEIGHTED_LATE_NS);
            if weighted_to > weighted_from {
                if !self.send_cuda(weighted_from, weighted_to, &mut stats).await {
                    break;
                }
                weighted_from = weighted_to;
            }
            if !self.send_findings(&mut owed, cursor, end, &mut stats).await {
                break;
            }
            cursor = self.skip_gap(end);
            if let Err(e) = cursor_file.save(cursor) {
                *stats.errors.entry("store").or_default() += 1;
                tracing::error!(error = %e, "the OTLP shipper cannot save its cursor");
            }
        }
        self.publish(&stats, cursor);
    }

    /// The end of the completed seconds: no sample older than it can still reach the store.
    fn ready(&self) -> u64 {
        let latency = (self.ring_to_disk_max)().unwrap_or(0.0);
        let settle = self.settle.max(Duration::from_secs_f64(latency.clamp(0.0, 3600.0) + 1.0));
        now_ns().saturating_sub(settle.as_nanos() as u64) / NS_PER_SEC * NS_PER_SEC
    }

    /// Where a batch from `from` ends: `to`, or an earlier second so that it holds at most
    /// [`MAX_BATCH_SAMPLES`] (but at least one second), counted from block headers.
    fn batch_end(&self, from: u64, to: u64) -> Result<u64, StoreError> {
        let mut per_second = std::collections::BTreeMap::<u64, u64>::new();
        Store::open(&self.data_dir)?.scan(from, to, Need::Headers, &mut |b: crate::store::reader::BlockView<'_>| {
            *per_second.entry(b.header.start_ns / NS_PER_SEC * NS_PER_SEC).or_default() += u64::from(b.header.samples);
        })?;
        let mut total = 0;
        for (&second, &n) in &per_second {
            total += n;
            if total > MAX_BATCH_SAMPLES && second > from {
                return Ok(second);
            }
        }
        Ok(to)
    }

    /// The request for `[from, to)`, encoded for the wire, and the samples it holds.
    fn read(&self, from: u64, to: u64) -> Result<(Bytes, u64), QueryError> {
        let window = Window::new(from, to)?;
        let mut store = Store::open(&self.data_dir)?;
        let mut b = Builder::new(window, &self.host, self.frequency_hz);
        query::for_each_sample(&mut store, window, &Filter::default(), |s| b.add(s))?;
        let samples = b.samples();
        let message = prost::Message::encode_to_vec(&b.finish());
        Ok((transport::body(&self.config, &message), samples))
    }

    /// Sends the CUDA stores' rows of `[from, to)`, a request per kind (a request's profiles
    /// share one sample type); false if the daemon stopped first. A store that cannot be read
    /// is said and skipped: it must not hold the CPU samples back.
    async fn send_cuda(&mut self, from: u64, to: u64, stats: &mut Stats) -> bool {
        for kind in SampleKind::WEIGHTED {
            let dir = kind.store_dir(&self.data_dir);
            if !crate::store::segments_dir(&dir).is_dir() {
                continue;
            }
            let request = Window::new(from, to).and_then(|window| {
                let mut store = Store::open(&dir)?;
                let mut b = Builder::new(window, &self.host, self.frequency_hz).with_kind(kind);
                let mut rows = 0;
                query::for_each_sample(&mut store, window, &Filter::default(), |s| {
                    b.add(s);
                    rows += 1;
                })?;
                Ok((transport::body(&self.config, &prost::Message::encode_to_vec(&b.finish())), rows))
            });
            match request {
                Ok((_, 0)) => {}
                Ok((body, rows)) => {
                    if !self.deliver(Signal::Cuda { rows }, body, stats, from).await {
                        return false;
                    }
                }
                Err(e) => {
                    *stats.errors.entry("store").or_default() += 1;
                    tracing::error!(samples = kind.name(), error = %e, "the OTLP shipper cannot read a CUDA store; its rows of this batch are not sent");
                }
            }
        }
        true
    }

    /// Where the cursor goes after `end`: past a stretch without segments (the daemon was off,
    /// or retention removed it) to the next data, or to the completed seconds' end when no data
    /// follows, so a gap costs one step, not one per interval.
    fn skip_gap(&self, end: u64) -> u64 {
        let segments = crate::store::reader::list_segments(&self.data_dir).unwrap_or_default();
        let next = match segments.iter().find(|(start, _)| start + SEGMENT_NS > end) {
            Some(&(start, _)) => start / NS_PER_SEC * NS_PER_SEC,
            None => u64::MAX,
        };
        next.min(self.ready()).max(end)
    }

    /// Sends the findings that opened or closed up to `end` and were not sent yet, as log
    /// records; false if the daemon stopped first.
    async fn send_findings(&mut self, owed: &mut Owed, cursor: u64, end: u64, stats: &mut Stats) -> bool {
        let from = cursor.saturating_sub(LOOKBACK_NS);
        let findings = match crate::detect::journal::findings_in(&self.data_dir, from, end) {
            Ok(f) => f,
            Err(e) => {
                *stats.errors.entry("store").or_default() += 1;
                tracing::error!(error = %e, "the OTLP shipper cannot read the findings; they go with the next batch");
                return true;
            }
        };
        let (records, keys) = owed.due(&findings, from, end, now_ns());
        if !records.is_empty() {
            let signal = Signal::Logs { records: records.len() as u64 };
            let config = self.config.for_logs();
            let body = transport::body(&config, &prost::Message::encode_to_vec(&logs::request(&self.host, records)));
            if !self.deliver(signal, body, stats, cursor).await {
                return false;
            }
        }
        owed.sent(keys, from);
        true
    }

    /// Posts `body` until it is taken or refused for good; false if the daemon stopped first.
    async fn deliver(&mut self, signal: Signal, body: Bytes, stats: &mut Stats, cursor: u64) -> bool {
        let config = match signal {
            Signal::Profiles { .. } | Signal::Cuda { .. } => self.config.clone(),
            Signal::Logs { .. } => self.config.for_logs(),
        };
        let mut backoff = FIRST_BACKOFF;
        for attempt in 1.. {
            let send = tokio::time::timeout(config.timeout, transport::send(&config, body.clone()));
            let outcome = tokio::select! {
                answer = send => answer.unwrap_or_else(|_| Outcome::Retry {
                    why: format!("no answer within {} s", config.timeout.as_secs_f64()),
                    after: None,
                }),
                _ = self.stop.changed() => return false,
            };
            let window = crate::timespec::format(cursor);
            match outcome {
                Outcome::Accepted { rejected, message } => {
                    match signal {
                        Signal::Profiles { samples } => {
                            stats.batches += 1;
                            stats.samples += samples;
                        }
                        Signal::Cuda { rows } => {
                            stats.batches += 1;
                            stats.cuda_samples += rows;
                        }
                        Signal::Logs { records } => stats.log_records += records,
                    }
                    stats.bytes += body.len() as u64;
                    if rejected > 0 {
                        *stats.errors.entry("partial").or_default() += 1;
                        tracing::warn!(from = %window, rejected, message, "the OTLP receiver dropped profiles of a batch");
                    } else if !message.is_empty() {
                        tracing::info!(from = %window, message, "the OTLP receiver took a batch, with a remark");
                    }
                    if attempt > 1 {
                        tracing::info!(from = %window, attempts = attempt, "OTLP batch delivered after retries");
                    }
                    return true;
                }
                Outcome::Rejected { why } => {
                    *stats.errors.entry("rejected").or_default() += 1;
                    tracing::error!(from = %window, ?signal, error = %why, "the OTLP receiver refused a batch; it is skipped");
                    return true;
                }
                Outcome::Retry { why, after } => {
                    stats.retries += 1;
                    let wait = after.map_or_else(|| jitter(backoff), |a| a.min(MAX_RETRY_AFTER));
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    tracing::warn!(
                        from = %window,
                        attempt,
                        retry_in_ms = wait.as_millis() as u64,
                        error = %why,
                        "OTLP export failed; retrying"
                    );
                    self.publish(stats, cursor);
                    if self.sleep(wait).await {
                        return false;
                    }
                }
            }
        }
        unreachable!("the attempts never run out")
    }

    /// Waits `d`; true if the daemon stopped meanwhile.
    async fn sleep(&mut self, d: Duration) -> bool {
        if *self.stop.borrow() {
            return true;
        }
        tokio::select! {
            _ = tokio::time::sleep(d) => false,
            _ = self.stop.changed() => true,
        }
    }

    fn publish(&self, stats: &Stats, cursor: u64) {
        let lag = now_ns().saturating_sub(cursor) as f64 / 1e9;
        *self.stats.lock().unwrap_or_else(|p| p.into_inner()) =
            Stats { lag_seconds: lag, cursor_ns: cursor, ..stats.clone() };
    }
}

/// Half of `d` plus a random part of the other half, so a fleet that lost its collector at
/// once does not come back in step.
fn jitter(d: Duration) -> Duration {
    d / 2 + d.mul_f64(fastrand::f64() / 2.0)
}

#[cfg(test)]
mod tests;
