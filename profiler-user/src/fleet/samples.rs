//! Each sample of a window read from ClickHouse, for the exports that keep samples one by one
//! (perf-script, pprof, speedscope, OTLP: each sample's time is in them). They are streamed in
//! time order, a chunk of at most about [`CHUNK_ROWS`] rows at a time, so the reader holds one
//! chunk and the stacks it names whatever the window's length: no copy, no cap (an hour of a
//! 192-CPU node is 34 M samples). They are the samples a scan of the node's store hands over
//! (`query::for_each_sample`): the same window and filters, order, counts and frequencies, so
//! an export of one node is byte-equal to the node's own (tests/tests/fleet.rs). Several
//! nodes' samples come merged in time order.

use std::collections::{BTreeMap, HashMap};

use super::{
    Fleet, FleetError, MISSING_STACK, Node,
    pushdown::{self, Frames},
    rowbinary::Reader,
    select::Selection,
};
use crate::{
    model::SampleKind,
    query::{Filter, SampleRef, Window},
    ship::clickhouse::schema::{self, col::*},
    timespec,
};

const SEC: u64 = 1_000_000_000;
const MINUTE: u64 = 60 * SEC;
/// Rows asked per request: a few tens of megabytes of `RowBinary` at most (a workload's JSON
/// is the longest column).
pub const CHUNK_ROWS: u64 = 100_000;
/// Stacks kept between chunks; past it the cache starts again (a chunk refetches its own).
const MAX_CACHED_STACKS: usize = 50_000;
/// Longest span of a stored block (a rolled-up one): a block starting this long before a
/// sample may hold it.
const MAX_BLOCK_NS: u64 = 60 * SEC;

/// Files and addresses of a stack's user frames, as `stack_locations` holds them.
type Places = (Vec<String>, Vec<u64>);

/// A stack as the exports read it: `(name, kernel)` root first, and per frame its file and
/// address (`""`, 0 for a kernel frame or one nothing is known of), as a store's dictionary
/// gives them.
struct Stack {
    frames: Vec<(String, bool)>,
    locations: Vec<(String, u64)>,
}

impl Stack {
    fn new(stack: &Frames, places: Option<&Places>) -> Self {
        let frames: Vec<(String, bool)> = pushdown::named(stack).map(|(n, k)| (n.to_string(), k)).collect();
        let locations = frames
            .iter()
            .enumerate()
            .map(|(i, &(_, kernel))| match places {
                Some((files, addrs)) if !kernel && i < files.len() && i < addrs.len() => (files[i].clone(), addrs[i]),
                _ => (String::new(), 0),
            })
            .collect();
        Self { frames, locations }
    }
}

/// The parts of `window` that hold about [`CHUNK_ROWS`] rows each, in time order: a minute's
/// rows counted by the server, a busy minute cut into equal spans.
fn chunks(fleet: &Fleet, table: &str, range: &str) -> Result<Vec<Window>, FleetError> {
    Ok(minutes(fleet, table, range)?.into_iter().flat_map(|(span, rows)| split(span, rows)).collect())
}

/// Rows per minute of the window (minutes without any left out).
fn minutes(fleet: &Fleet, table: &str, range: &str) -> Result<Vec<(u64, u64)>, FleetError> {
    fleet.rows(
        &format!(
            "SELECT toUInt64(intDiv({TS}, {MINUTE})) AS m, count() FROM {table} WHERE {range} GROUP BY m ORDER BY m"
        ),
        |r| Ok((r.u64()?, r.u64()?)),
    )
}

/// Minute `m` of the window, cut into spans of about [`CHUNK_ROWS`] of its `rows` each.
fn split(m: u64, rows: u64) -> Vec<Window> {
    let (a, b) = (m * MINUTE, (m + 1) * MINUTE);
    let parts = rows.div_ceil(CHUNK_ROWS).clamp(1, MINUTE);
    let step = (b - a).div_ceil(parts);
    (0..parts)
        .map(|i| (a + i * step, (a + (i + 1) * step).min(b)))
        .filter(|(x, y)| x < y)
        .map(|(from_ns, to_ns)| Window { from_ns, to_ns })
        .collect()
}

/// Per node, the frequency of each stored block by its start: a sample is read at the
/// frequency of the block that holds it, as a scan of the store reads it.
#[derive(Default)]
struct Frequencies {
    /// The span read so far.
    read: Option<Window>,
    blocks: HashMap<String, BTreeMap<u64, u32>>,
}

impl Frequencies {
    /// Makes sure the blocks that may hold samples of `chunk` are known: read a minute ahead.
    fn cover(&mut self, fleet: &Fleet, sel: &Selection, chunk: Window) -> Result<(), FleetError> {
        if self.read.is_some_and(|r| r.from_ns <= chunk.from_ns.saturating_sub(MAX_BLOCK_NS) && chunk.to_ns <= r.to_ns)
        {
            return Ok(());
        }
        let span = Window {
            from_ns: chunk.from_ns.saturating_sub(MAX_BLOCK_NS),
            to_ns: chunk.to_ns.max(chunk.from_ns + MINUTE),
        };
        let rows = fleet.rows(
            &format!(
                "SELECT {NODE}, {TS}, max({HZ}) FROM {} WHERE {} AND {TS} >= {} AND {TS} < {} GROUP BY {NODE}, {TS}",
                fleet.table(schema::CPU_SECONDS),
                sel.predicate(),
                span.from_ns,
                span.to_ns
            ),
            |r| Ok((r.string()?.to_string(), r.u64()?, r.u32()?)),
        )?;
        self.blocks.clear();
        for (node, ts, hz) in rows {
            self.blocks.entry(node).or_default().insert(ts, hz);
        }
        self.read = Some(span);
        Ok(())
    }

    /// The frequency of `node`'s block holding `ts`; the node's own where none says (rows
    /// shipped before `cpu_seconds` existed).
    fn at(&self, node: &str, ts: u64, own: u32) -> u64 {
        let hz = self.blocks.get(node).and_then(|b| b.range(..=ts).next_back()).map_or(0, |(_, &hz)| hz);
        u64::from(if hz == 0 { own.max(1) } else { hz })
    }
}

/// One row as the server sends it: (ts, node, cpu, pid, tid, comm, stack id, workload, count).
type Row<'a> = (u64, &'a str, u16, u32, u32, &'a str, u64, &'a str, u64);

fn row<'a>(r: &mut Reader<'a>) -> Result<Row<'a>, FleetError> {
    Ok((r.u64()?, r.string()?, r.u16()?, r.u32()?, r.u32()?, r.string()?, r.u64()?, r.string()?, r.u64()?))
}

/// Calls `f` for every sample of the chosen nodes' `kind` in `window` that passes `filter`, in
/// time order; returns the samples handed over. A CUDA kind's rows carry their weight as the
/// count, as its store does.
pub fn for_each_sample(
    fleet: &Fleet,
    sel: &Selection,
    kind: SampleKind,
    window: Window,
    filter: &Filter,
    mut f: impl FnMut(&SampleRef<'_>),
) -> Result<u64, FleetError> {
    pushdown::check_cpus(sel, filter)?;
    let (table, range) = pushdown::scope(fleet, sel, kind, window);
    let ids = pushdown::workloads(fleet, &table, &range, filter)?;
    let Some(w) = pushdown::column_filters(filter, [CPU, PID, COMM, WORKLOAD], ids.as_deref()) else { return Ok(0) };
    let nodes: HashMap<&str, &Node> = sel.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let mut hz = Frequencies::default();
    let mut stacks: HashMap<u64, Option<Stack>> = HashMap::new();
    let mut keeps: HashMap<u64, bool> = HashMap::new();
    let missing = Stack::new(&(vec![MISSING_STACK.to_string()], vec![0]), None);
    let mut n = 0;
    for chunk in chunks(fleet, &table, &format!("{range}{w}"))? {
        let within = format!(
            "{range}{w} AND {TS} >= {} AND {TS} < {}",
            chunk.from_ns.max(window.from_ns),
            chunk.to_ns.min(window.to_ns)
        );
        let sql = match kind {
            SampleKind::Cpu => format!(
                "SELECT {TS}, {NODE}, {CPU}, {PID}, {TID}, {COMM}, {STACK_ID}, {WORKLOAD}, toUInt64({COUNT}) FROM {table} \
                 WHERE {within} ORDER BY {TS}, {NODE}, {CPU}, {TID}, {STACK_ID}"
            ),
            // A row sent twice is there twice until a merge: one per key.
            _ => format!(
                "SELECT {TS}, {NODE}, any({CPU}), any({PID}), {TID}, {COMM}, {STACK_ID}, any({WORKLOAD}), \
                 max({VALUE}) FROM {table} WHERE {within} GROUP BY {NODE}, {TS}, {TID}, {STACK_ID}, {COMM} \
                 ORDER BY {TS}, {NODE}, {TID}, {STACK_ID}, {COMM}"
            ),
        };
        let bytes = fleet.row_binary(&sql)?;
        // First the stacks the chunk names that are not known yet.
        let mut wanted = Vec::new();
        let mut r = Reader::new(&bytes);
        while !r.at_end() {
            let id = row(&mut r)?.6;
            if !stacks.contains_key(&id) {
                wanted.push(id);
            }
        }
        if stacks.len() + wanted.len() > MAX_CACHED_STACKS {
            stacks.clear();
            keeps.clear();
            r = Reader::new(&bytes);
            wanted.clear();
            while !r.at_end() {
                wanted.push(row(&mut r)?.6);
            }
        }
        wanted.sort_unstable();
        wanted.dedup();
        if !wanted.is_empty() {
            let frames = pushdown::stacks_by_id(fleet, wanted.iter().copied())?;
            let mut places = locations(fleet, &wanted)?;
            for id in wanted {
                let stack = frames.get(&id).map(|s| Stack::new(s, places.remove(&id).as_ref()));
                let passes = frames.get(&id).map_or_else(
                    || pushdown::stack_keeps(filter, &(vec![MISSING_STACK.to_string()], vec![0])),
                    |s| pushdown::stack_keeps(filter, s),
                );
                keeps.insert(id, passes);
                stacks.insert(id, stack);
            }
        }
        if kind == SampleKind::Cpu {
            hz.cover(fleet, sel, chunk)?;
        }
        let mut r = Reader::new(&bytes);
        while !r.at_end() {
            let (ts_ns, node, cpu, pid, tid, comm, id, workload, count) = row(&mut r)?;
            if !keeps.get(&id).copied().unwrap_or(false) {
                continue;
            }
            let stack = stacks.get(&id).and_then(Option::as_ref).unwrap_or(&missing);
            let frames: Vec<(&str, bool)> = stack.frames.iter().map(|(n, k)| (n.as_str(), *k)).collect();
            let locations: Vec<(&str, u64)> = stack.locations.iter().map(|(f, a)| (f.as_str(), *a)).collect();
            let own = nodes.get(node).map_or(0, |n| n.hz);
            let frequency_hz = match kind {
                SampleKind::Cpu => hz.at(node, ts_ns, own),
                _ => u64::from(own.max(1)),
            };
            n += count;
            f(&SampleRef {
                ts_ns,
                cpu: u32::from(cpu),
                pid,
                tid,
                comm,
                frames: &frames,
                locations: &locations,
                count,
                frequency_hz: Some(frequency_hz),
                workload,
            });
        }
    }
    Ok(n)
}

/// Where the user frames of stacks `ids` live (files and addresses), for those that know it.
fn locations(fleet: &Fleet, ids: &[u64]) -> Result<HashMap<u64, Places>, FleetError> {
    let mut out = HashMap::new();
    for batch in ids.chunks(4_000) {
        let list: Vec<String> = batch.iter().map(u64::to_string).collect();
        let rows = fleet.rows(
            &format!(
                "SELECT {STACK_ID}, any({FILES}), any({ADDRS}) FROM {} WHERE {STACK_ID} IN ({}) GROUP BY {STACK_ID}",
                fleet.table(schema::STACK_LOCATIONS),
                list.join(", ")
            ),
            |r| Ok((r.u64()?, (r.strings()?.into_iter().map(String::from).collect::<Vec<_>>(), r.u64s()?))),
        );
        // A server shipped to before locations were stored has no such table: no locations.
        match rows {
            Err(FleetError::NoNodes(_)) => return Ok(out),
            rows => out.extend(rows?),
        }
    }
    Ok(out)
}

/// Refuses a window the chosen nodes shipped nothing of (no stored block of the CPU samples
/// overlaps it; no row of a CUDA kind is in it), as a read of the node's store does.
pub fn require_data(fleet: &Fleet, sel: &Selection, kind: SampleKind, window: Window) -> Result<(), FleetError> {
    let sql = match kind {
        SampleKind::Cpu => format!(
            "SELECT count() FROM {} WHERE {} AND {TS} >= {} AND {TS} < {} AND {TS} + {SPAN} > {}",
            fleet.table(schema::CPU_SECONDS),
            sel.predicate(),
            window.from_ns.saturating_sub(MAX_BLOCK_NS),
            window.to_ns,
            window.from_ns
        ),
        kind => {
            let (table, range) = pushdown::scope(fleet, sel, kind, window);
            format!("SELECT count() FROM {table} WHERE {range}")
        }
    };
    if fleet.rows(&sql, |r| r.u64())?.first().is_some_and(|&n| n > 0) {
        return Ok(());
    }
    Err(FleetError::NoSamples {
        what: if kind == SampleKind::Cpu { "samples".into() } else { kind.unit().into() },
        from: timespec::format(window.from_ns),
        to: timespec::format(window.to_ns),
        nodes: sel.describe(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_minute_is_cut_into_equal_spans_that_cover_it_once() {
        assert_eq!(split(2, 10), vec![Window { from_ns: 2 * MINUTE, to_ns: 3 * MINUTE }]);
        let parts = split(5, 3 * CHUNK_ROWS + 1);
        assert_eq!(parts.len(), 4);
        assert_eq!(parts[0].from_ns, 5 * MINUTE);
        assert_eq!(parts[3].to_ns, 6 * MINUTE);
        assert!(parts.windows(2).all(|p| p[0].to_ns == p[1].from_ns));
    }

    #[test]
    fn a_stack_reads_as_a_store_gives_it_kernel_frames_without_a_place() {
        let frames: Frames = (vec!["main".into(), "work".into(), "read_zero".into()], vec![0, 0, 1]);
        let places = (vec!["/bin/app".to_string(), "/bin/app".to_string()], vec![0x10, 0x20]);
        let s = Stack::new(&frames, Some(&places));
        assert_eq!(s.frames, [("main".into(), false), ("work".into(), false), ("read_zero".into(), true)]);
        assert_eq!(s.locations, [("/bin/app".into(), 0x10), ("/bin/app".into(), 0x20), (String::new(), 0)]);
        let none = Stack::new(&frames, None);
        assert!(none.locations.iter().all(|l| l == &(String::new(), 0)) && none.locations.len() == 3);
    }
}
