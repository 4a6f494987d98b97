//! The shipping loop: read settled seconds after the cursor, insert them, move the cursor.
//!
//! No duplicates without server-side deduplication (18.16 deduplicates inserts only into
//! replicated tables): a batch never crosses a UTC day and holds at most `batch_rows` plus one
//! read step of rows, so it is one part of one partition and lands whole or not at all. After a
//! start or a failed request the outcome of the last insert is unknown; the next batch is then
//! first counted on the server (`node` and `ts` are the table's key, so this reads a few
//! granules): all there, it is skipped, and so is every next batch the server has whole; none,
//! it is sent; some (a batch the store answers differently now, e.g. rolled up), only the rows
//! after the server's latest are sent.
//!
//! In a sharded cluster every insert goes into the node's own server's `_local` tables, stacks
//! and frames included: an insert through a `Distributed` table made synchronous fails while any shard is
//! down, which would stop every node of the fleet whenever one shard stops. A stack may then be
//! on several shards; readers take one row per id. Catching up is paced (`pace`).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use super::{
    config::Config,
    counters::CounterRows,
    error::ShipError,
    frames::Shipped,
    http::Client,
    notes, pace,
    rows::{Batch, CpuSeconds},
    schema::{
        self,
        col::{CPUS, FRAME_ID, HOST, HZ, NODE, ONLINE, STACK_ID, TS, VERSION},
    },
};
use crate::{
    model::SampleKind,
    query::{Filter, Window, for_each_sample},
    ship::{Cursor, SharedStats, Stats},
    store::{
        Meta, Store,
        identity::Identity,
        reader::{BlockView, Need},
    },
};

const SEC: u64 = 1_000_000_000;
/// The name of its cursor (`DATA_DIR/ship/clickhouse.cursor`), bound to the target.
pub(super) const CURSOR: &str = "clickhouse";
/// A second is shipped once it ended this long ago: the daemon writes a second's samples within
/// a flush interval (at most 1 s) of its end, plus the pipeline's queue. A sample written later
/// than this is in the store but not in ClickHouse.
const SETTLE_NS: u64 = 5 * SEC;
/// How late a weighted row (CUDA counts, off-CPU time) may be written into a second already
/// shipped: an off-CPU wait is spread over its last 8 seconds when it ends, drained within a
/// second.
const WEIGHTED_LATE_NS: u64 = 10 * SEC;
/// Ship when this much is pending (fewer, larger inserts: ClickHouse prefers about one per
/// second per table across the fleet, not one per node per second).
const MIN_PENDING_NS: u64 = 5 * SEC;
/// Seconds read from the store at a time (the memory bound beyond `batch_rows`).
const STEP_NS: u64 = 10 * SEC;
/// Stack ids (and frame ids, each) remembered as shipped (~4 MiB of set); past this the set
/// starts over (a re-sent stack or frame collapses in merges).
const SHIPPED_STACKS_MAX: usize = 1 << 18;
const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How often partitions past the retention are dropped on servers without `TTL`.
const RETENTION_EVERY: Duration = Duration::from_secs(3600);

/// The shipper's state while it runs.
pub struct Follower {
    config: Config,
    client: Client,
    cursor: Cursor,
    stats: SharedStats,
    stop: watch::Receiver<bool>,
    /// Stacks and frames sent (or in the batch being built).
    shipped: Shipped,
    /// The last insert may or may not have landed.
    uncertain: bool,
    /// Server version, once the schema is in place.
    version: Option<(u32, u32)>,
    next_ns: Option<u64>,
    retention_done: Option<Instant>,
    /// Findings were shipped from the start of the store in this run (see `ship_notes`).
    findings_rescanned: bool,
    /// The `nodes` row this run sent last.
    node_shipped: Option<NodeRow>,
    /// The counter tracks of the batch being built (kept: it remembers what it said).
    counters: CounterRows,
}

/// How the node records, as `nodes` holds it.
#[derive(Debug, Clone, PartialEq)]
struct NodeRow {
    cpus: u32,
    hz: u64,
    online: String,
    host: String,
}

enum Progress {
    /// The cursor moved; `rows` rows were sent (0: the server had them).
    Shipped {
        rows: usize,
    },
    Idle,
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

impl Follower {
    pub fn new(config: Config, stats: SharedStats, stop: watch::Receiver<bool>) -> Result<Self, ShipError> {
        let client = Client::new(&config.url, config.user.as_deref(), config.password.as_deref());
        let cursor = Cursor::open(&config.data_dir, CURSOR)?.for_target(config.target());
        let next_ns = cursor.load();
        if let Some(n) = next_ns {
            stats.lock().unwrap_or_else(|p| p.into_inner()).cursor_ns = n;
        }
        Ok(Self {
            config,
            client,
            cursor,
            stats,
            stop,
            shipped: Shipped::default(),
            uncertain: true,
            version: None,
            next_ns,
            retention_done: None,
            findings_rescanned: false,
            node_shipped: None,
            counters: CounterRows::default(),
        })
    }

    pub fn run(mut self) {
        tracing::info!(database = %self.config.database, "shipping samples to ClickHouse");
        let mut backoff = BACKOFF_MIN;
        while !*self.stop.borrow() {
            let started = Instant::now();
            match self.step() {
                Ok(Progress::Shipped { rows }) => {
                    backoff = BACKOFF_MIN;
                    // However far behind: at most `max_rows_per_sec` (a live node never waits).
                    self.wait(pace::pause(rows, self.config.max_rows_per_sec, started.elapsed()));
                }
                Ok(Progress::Idle) => self.wait(Duration::from_secs(1)),
                Err(e) => {
                    self.figures(|s| *s.errors.entry("request").or_default() += 1);
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "shipping to ClickHouse failed; the store keeps the samples");
                    self.uncertain = true;
                    // The server may be a new one, without our tables.
                    self.version = None;
                    // The failed batch's new stacks and frames were marked shipped when it was
                    // built.
                    self.shipped.clear();
                    self.node_shipped = None;
                    self.wait(backoff);
                    self.figures(|s| s.retries += 1);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
        // The daemon is stopping: the findings it closed on the way out, once (samples wait for
        // the next run, from the cursor).
        if let Some(from) = self.next_ns
            && let Err(e) = self.ship_notes(from, now_ns())
        {
            tracing::warn!(error = %e, "the last findings did not reach ClickHouse; the next run sends them");
        }
    }

    /// Updates the figures `/metrics` shows.
    fn figures(&self, update: impl FnOnce(&mut Stats)) {
        update(&mut self.stats.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// Sleeps `d`, or less if the daemon stops.
    fn wait(&self, d: Duration) {
        let deadline = Instant::now() + d;
        while !*self.stop.borrow() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100).min(deadline - Instant::now()));
        }
    }

    fn table(&self, name: &str) -> String {
        let local = if self.config.cluster.is_some() {
            // Inserting into a shard's local table keeps an insert one part and needs no other
            // shard up (see the module doc); the Distributed table is for reading.
            format!("{name}_local")
        } else {
            name.to_string()
        };
        format!("{}.{}", schema::quote_ident(&self.config.database), schema::quote_ident(&local))
    }

    fn ensure_schema(&mut self) -> Result<(u32, u32), ShipError> {
        if let Some(v) = self.version {
            return Ok(v);
        }
        let answer = self.client.query("SELECT version()")?;
        let version = schema::parse_version(&answer).ok_or_else(|| ShipError::Answer(answer.clone()))?;
        let layout = schema::Layout {
            database: &self.config.database,
            cluster: self.config.cluster.as_deref(),
            ttl_secs: schema::supports_ttl(version).then_some(self.config.max_age_secs),
            codecs: schema::supports_codecs(version),
        };
        // The per-minute CPU and GPU rollups (`track_rollups`) after the tables their views read.
        let rollups = super::track_rollups::definitions(&layout, self.config.rollups.minutes_secs);
        let mut ours =
            schema::statements_with(&layout, self.config.rollups, schema::supports_stack_dictionary(version));
        ours.extend(rollups);
        super::views::ensure(&self.client, &self.config.database, ours)?;
        self.version = Some(version);
        Ok(version)
    }

    fn count(&self, sql: &str) -> Result<u64, ShipError> {
        let a = self.client.query(sql)?;
        a.trim().parse().map_err(|_| ShipError::Answer(a))
    }

    fn step(&mut self) -> Result<Progress, ShipError> {
        let version = self.ensure_schema()?;
        if !schema::supports_ttl(version) {
            self.drop_old_partitions()?;
        }
        let mut store = Store::open(&self.config.data_dir).map_err(crate::query::QueryError::from)?;
        let settled = (now_ns().saturating_sub(SETTLE_NS)) / SEC * SEC;
        let from = match self.next_ns {
            Some(n) => n,
            None => match store.span().map_err(crate::query::QueryError::from)? {
                // Everything the store holds, from the second its data starts.
                Some((start, _)) => start / SEC * SEC,
                None => return Ok(Progress::Idle),
            },
        };
        if from + MIN_PENDING_NS > settled {
            return Ok(Progress::Idle);
        }
        let day_end = (from / schema::DAY_NS + 1) * schema::DAY_NS;
        let mut batch = Batch::default();
        let mut to = from;
        self.counters.clear();
        let mut cuda = self.cuda_stores()?;
        // Weighted rows may be written after their second was shipped: an off-CPU wait is
        // counted when it ends, in the seconds it covered (its last 8), and a drain is up to a
        // second late. So the seconds just before `from` are sent again, each key's row summed
        // as the store holds it now: a row sent again replaces the one sent (read as
        // `max(value)` per key), a late one lands.
        if let Ok(late) = Window::new(from.saturating_sub(WEIGHTED_LATE_NS), from) {
            let shipped = &mut self.shipped;
            for (kind, store) in &mut cuda {
                for_each_sample(store, late, &Filter::default(), |s| batch.push_cuda(*kind, s, shipped))?;
            }
        }
        // The counter tracks and CUDA rows of the same seconds count toward the batch's bound.
        while to < settled.min(day_end)
            && batch.rows() + batch.cuda_rows() + self.counters.rows < self.config.batch_rows
        {
            let next = (to + STEP_NS).min(settled).min(day_end);
            let window = Window::new(to, next)?;
            let shipped = &mut self.shipped;
            for_each_sample(&mut store, window, &Filter::default(), |s| batch.push(s, shipped))?;
            for (kind, store) in &mut cuda {
                for_each_sample(store, window, &Filter::default(), |s| batch.push_cuda(*kind, s, shipped))?;
            }
            self.counters.read(&self.config.data_dir, &self.config.node, to, next);
            to = next;
        }
        if batch.rows() == 0 {
            // Retention may have removed what a long outage left unshipped: jump to the data.
            if let Some((start, _)) = store.span().map_err(crate::query::QueryError::from)? {
                to = to.max(start / SEC * SEC).min(settled);
            }
        }
        let cpu_seconds = self.cpu_seconds(&mut store, from, to)?;
        self.ship_notes(from, to)?;
        if self.uncertain && batch.rows() > 0 && self.reconcile(&mut batch, from, to)? {
            // Stay uncertain: a cursor lost or rewound (a restored data directory) may be more
            // than one batch behind, and every batch until the server's end is then skipped.
            return self.advance(to);
        }
        if batch.new_stacks > 0 {
            // Only those the server lacks (`known`): a shard's nodes share most of their stacks.
            let table = self.table(schema::STACK_FRAMES);
            batch.drop_known_stacks(&super::known::known(&self.client, &table, STACK_ID, batch.new_stack_ids())?);
        }
        if !batch.frames.is_empty() {
            // And of their frames, those it lacks (frames of other stacks it has, mostly).
            let table = self.table(schema::FRAME_DICT);
            batch.frames.drop_known(&super::known::known(&self.client, &table, FRAME_ID, batch.frames.ids())?);
        }
        if !batch.frames.is_empty() {
            // Before the stacks that name them: a reader that sees a stack finds its frames.
            let bytes = self.client.insert(&self.table(schema::FRAME_DICT), "RowBinary", &batch.frames.encode())?;
            self.figures(|s| s.stack_bytes += bytes as u64);
        }
        if batch.new_stacks > 0 {
            // Into the server the samples go to, before them: a reader never sees a sample whose
            // stack is not there yet.
            if !batch.locations.is_empty() {
                // Before the stacks: a reader that sees a stack sees where it lives.
                self.client.insert(&self.table(schema::STACK_LOCATIONS), "RowBinary", &batch.locations)?;
            }
            let bytes = self.client.insert(&self.table(schema::STACK_FRAMES), "RowBinary", &batch.stacks)?;
            self.figures(|s| s.stacks += batch.new_stacks as u64);
            self.figures(|s| s.stack_bytes += bytes as u64);
        }
        if !cpu_seconds.is_empty() {
            let rows = cpu_seconds.encode(&self.config.node);
            self.client.insert(&self.table(schema::CPU_SECONDS), "RowBinary", &rows)?;
        }
        if !self.counters.is_empty() {
            // Before the samples: a batch found whole on the server had its counters sent too.
            self.client.insert(&self.table(schema::COUNTERS), "RowBinary", &self.counters.bytes)?;
            self.figures(|s| s.counter_rows += self.counters.rows as u64);
        }
        if batch.cuda_rows() > 0 {
            // Before the samples too; rows sent again with a partly landed batch collapse.
            self.client.insert(&self.table(schema::CUDA_SAMPLES), "RowBinary", &batch.cuda(&self.config.node))?;
            self.figures(|s| s.cuda_samples += batch.cuda_rows() as u64);
        }
        if batch.rows() > 0 {
            let native = batch.native(&self.config.node);
            let bytes = self.client.insert(&self.table(schema::SAMPLES), "Native", &native)?;
            self.figures(|s| s.sample_rows += batch.rows() as u64);
            self.figures(|s| s.samples += batch.samples_count);
            self.figures(|s| s.bytes += bytes as u64);
        }
        if batch.rows() > 0 {
            self.uncertain = false;
        }
        let sent = batch.rows() + batch.cuda_rows() + self.counters.rows;
        self.advance(to).map(|_| Progress::Shipped { rows: sent })
    }

    /// The weighted stores the daemon has written (CUDA counts, off-CPU time; none on a node
    /// without them).
    fn cuda_stores(&self) -> Result<Vec<(SampleKind, Store)>, ShipError> {
        let mut out = Vec::new();
        for kind in SampleKind::WEIGHTED {
            let dir = kind.store_dir(&self.config.data_dir);
            if crate::store::segments_dir(&dir).is_dir() {
                out.push((kind, Store::open(&dir).map_err(crate::query::QueryError::from)?));
            }
        }
        Ok(out)
    }

    fn advance(&mut self, to: u64) -> Result<Progress, ShipError> {
        self.cursor.save(to)?;
        self.next_ns = Some(to);
        self.figures(|s| s.cursor_ns = to);
        if self.shipped.stacks.len() > SHIPPED_STACKS_MAX || self.shipped.frames.len() > SHIPPED_STACKS_MAX {
            self.shipped.clear();
        }
        Ok(Progress::Shipped { rows: 0 })
    }

    /// The per-CPU counts of the blocks starting in `[from, to)`; the `nodes` row first when how
    /// the node records (CPUs, frequency) is new to this run.
    fn cpu_seconds(&mut self, store: &mut Store, from: u64, to: u64) -> Result<CpuSeconds, ShipError> {
        let (cpus, meta_hz) = Meta::cpus_and_frequency(&self.config.data_dir);
        let mut rows = CpuSeconds::default();
        let mut latest: Option<Identity> = None;
        store
            .scan(from, to, Need::Summary, &mut |b: BlockView<'_>| {
                let (Some(summary), true) = (b.summary, (from..to).contains(&b.header.start_ns)) else { return };
                let hz = b.frequency_hz(meta_hz);
                for c in &summary.cpus {
                    rows.add(b.header.start_ns, b.header.end_ns - b.header.start_ns, c, hz);
                }
                latest = b.identity.cloned();
            })
            .map_err(crate::query::QueryError::from)?;
        let node = NodeRow {
            cpus,
            hz: latest.as_ref().map_or(meta_hz, |i| i.frequency_hz),
            online: latest.as_ref().map(|i| i.online_cpus.clone()).unwrap_or_default(),
            host: latest.map(|i| i.host).unwrap_or_default(),
        };
        if self.node_shipped.as_ref() != Some(&node) && !rows.is_empty() {
            let row = serde_json::json!({
                NODE: self.config.node, CPUS: node.cpus, HZ: node.hz, ONLINE: node.online,
                HOST: node.host, VERSION: now_ns(),
            });
            self.client.insert(&self.table(schema::NODES), "JSONEachRow", format!("{row}\n").as_bytes())?;
            self.node_shipped = Some(node);
        }
        Ok(rows)
    }

    /// Findings and events of `[from, to)`. Both tables are ReplacingMergeTrees keyed by node,
    /// time and id, so sending them again (a retried batch, an open finding in every batch it
    /// overlaps) only adds copies that merges collapse; a closed finding (higher version) wins.
    fn ship_notes(&mut self, from: u64, to: u64) -> Result<(), ShipError> {
        let dir = &self.config.data_dir;
        let node = &self.config.node;
        let store = |e| ShipError::Query(crate::query::QueryError::Store(e));
        let events = crate::detect::journal::events_in(dir, from, to).map_err(store)?;
        // A daemon closes the findings a crashed one left open when it starts, with an end in
        // the past, maybe in windows already shipped: the first batch of a run sends every
        // finding kept up to its end, so those closes reach ClickHouse too.
        let findings_from = if self.findings_rescanned { from } else { 0 };
        let findings = crate::detect::journal::findings_in(dir, findings_from, to).map_err(store)?;
        if !events.is_empty() {
            let rows = notes::events(node, &events);
            self.client.insert(&self.table(schema::EVENTS), "JSONEachRow", rows.as_bytes())?;
            self.figures(|s| s.events += events.len() as u64);
        }
        if !findings.is_empty() {
            let rows = notes::findings(node, &findings);
            self.client.insert(&self.table(schema::FINDINGS), "JSONEachRow", rows.as_bytes())?;
            self.figures(|s| s.findings += findings.len() as u64);
        }
        self.findings_rescanned = true;
        Ok(())
    }

    /// Leaves in `batch` only what the server lacks of `[from, to)`; true when it has it all.
    fn reconcile(&mut self, batch: &mut Batch, from: u64, to: u64) -> Result<bool, ShipError> {
        let node = schema::quote_str(&self.config.node);
        let table = self.table(schema::SAMPLES);
        let there = self
            .count(&format!("SELECT count() FROM {table} WHERE {NODE} = {node} AND {TS} >= {from} AND {TS} < {to}"))?;
        if there == 0 {
            return Ok(false);
        }
        if there == batch.rows() as u64 {
            self.figures(|s| s.batches_already_there += 1);
            tracing::info!(rows = there, "this batch had reached ClickHouse already; not sending it again");
            return Ok(true);
        }
        tracing::warn!(
            server_rows = there,
            store_rows = batch.rows(),
            "ClickHouse holds part of this batch: sending only the rows after its latest"
        );
        let latest = self.count(&format!(
            "SELECT max({TS}) FROM {table} WHERE {NODE} = {node} AND {TS} >= {from} AND {TS} < {to}"
        ))?;
        batch.keep_after(latest);
        // Stacks are re-sent anyway: they may be what the failed request was carrying.
        Ok(false)
    }

    /// Servers without `TTL`: drops the partitions that ended before each table's retention
    /// (days; 30-day periods for `samples_1h`).
    fn drop_old_partitions(&mut self) -> Result<(), ShipError> {
        if self.config.cluster.is_some() || self.retention_done.is_some_and(|t| t.elapsed() < RETENTION_EVERY) {
            return Ok(());
        }
        let raw = self.config.max_age_secs;
        let rollups = self.config.rollups;
        let tables = [
            (schema::SAMPLES, raw, schema::DAY_NS),
            (schema::FINDINGS, raw, schema::DAY_NS),
            (schema::EVENTS, raw, schema::DAY_NS),
            (schema::CPU_SECONDS, raw, schema::DAY_NS),
            (schema::COUNTERS, raw, schema::DAY_NS),
            (schema::CUDA_SAMPLES, raw, schema::DAY_NS),
            (schema::SAMPLES_FLEET_1S, raw, schema::DAY_NS),
            (super::track_rollups::CPU_1M, rollups.minutes_secs, super::track_rollups::PARTITION_NS),
            (super::track_rollups::GPU_UTIL_1M, rollups.minutes_secs, super::track_rollups::PARTITION_NS),
            (super::track_rollups::CPU_1H, rollups.minutes_secs, super::track_rollups::PARTITION_NS),
            (super::track_rollups::GPU_UTIL_1H, rollups.minutes_secs, super::track_rollups::PARTITION_NS),
            (super::track_rollups::CPU_NODE_1M, rollups.minutes_secs, super::track_rollups::PARTITION_NS),
            (super::track_rollups::CPU_5M, rollups.minutes_secs, super::track_rollups::PARTITION_NS),
            (schema::SAMPLES_1M, rollups.minutes_secs, schema::DAY_NS),
            (schema::SAMPLES_FLEET_1M, rollups.minutes_secs, schema::DAY_NS),
            (schema::SAMPLES_FLEET_10M, rollups.minutes_secs, schema::DAY_NS),
            (schema::SAMPLES_1H, rollups.hours_secs, schema::HOUR_PARTITION_NS),
            (schema::SAMPLES_1D, rollups.hours_secs, schema::HOUR_PARTITION_NS),
            (schema::STACK_NODES_1H, rollups.minutes_secs, schema::HOUR_PARTITION_NS),
        ];
        for (table, keep_secs, partition_ns) in tables {
            // Partition `p` holds [p, p + 1) * partition_ns: it goes once that ended before the
            // retention's start.
            let keep_from = now_ns().saturating_sub(keep_secs.saturating_mul(SEC)) / partition_ns;
            let parts = self.client.query(&format!(
                "SELECT DISTINCT partition FROM system.parts WHERE active AND database = {} AND table = {}",
                schema::quote_str(&self.config.database),
                schema::quote_str(table)
            ))?;
            for p in parts.lines().filter_map(|l| l.trim().parse::<u64>().ok()).filter(|&p| p < keep_from) {
                let days = partition_ns / schema::DAY_NS;
                tracing::info!(
                    table,
                    partition = p,
                    days,
                    "dropping a partition of ClickHouse rows past the retention"
                );
                self.client.query(&format!("ALTER TABLE {} DROP PARTITION {p}", self.table(table)))?;
            }
        }
        self.retention_done = Some(Instant::now());
        Ok(())
    }
}
