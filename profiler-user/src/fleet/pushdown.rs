//! Window answers computed by ClickHouse: the server sums the samples of any set of nodes by
//! (process, stack, workload), and only those sums travel, whatever the window's size (an hour
//! of a 192-CPU node is 34 M samples; its fold is a few thousand rows). The rows become the
//! folded lines the node's own store gives ([`query::fold_names_with`]), kept within the same
//! budget ([`Folded::within`]), so where a copy of the node's window answers, this answers the
//! same, byte for byte (tests/tests/fleet.rs).
//!
//! Filters: CPU, pid, process and workload are `WHERE` clauses; a workload filter's identities
//! are matched here, by the rules the store uses, among the few distinct ones of the window
//! (the server first keeps those containing the asked value). Context and `--function` depend
//! on the stack alone, so they are applied to each distinct stack after the sum.

use std::collections::HashMap;

use super::{
    Fleet, FleetError, MISSING_STACK, Node,
    rollup::{self, Coverage, Piece, Source},
    select::Selection,
    stack_text::{Cond, Sources},
};
use crate::{
    exec_context::Context,
    model::SampleKind,
    query::{
        Buckets, CpuTime, Filter, FoldBudget, Folded, Grid, IDLE_FRAME, QueryError, Window, fold_names_with,
        folded_piece,
    },
    ship::clickhouse::schema::{self, col::*, quote_str},
    timespec,
};

const SEC: u64 = 1_000_000_000;
/// Most distinct workload identities a workload filter looks through (a node runs ~110 pods).
const MAX_WORKLOADS: usize = 200_000;

/// The `WHERE` of the chosen nodes' rows of `kind` in `window`.
pub(super) fn scope(fleet: &Fleet, sel: &Selection, kind: SampleKind, window: Window) -> (String, String) {
    let range = format!("{} AND {TS} >= {} AND {TS} < {}", sel.predicate(), window.from_ns, window.to_ns);
    match kind {
        SampleKind::Cpu => (fleet.table(schema::SAMPLES), range),
        kind => (fleet.table(schema::CUDA_SAMPLES), format!("{range} AND {KIND} = {}", quote_str(kind.name()))),
    }
}

/// The filters that are columns, for a `WHERE` over (`cpu`, `pid`, `comm`, `workload`) named
/// by `cols`; `None` when the workload filter keeps no identity of the window (nothing matches).
pub(super) fn column_filters(filter: &Filter, cols: [&str; 4], workloads: Option<&[String]>) -> Option<String> {
    let [cpu, pid, comm, workload] = cols;
    let mut w = String::new();
    if !filter.cpus.is_empty() {
        let cpus: Vec<String> = filter.cpus.iter().map(u32::to_string).collect();
        w.push_str(&format!(" AND {cpu} IN ({})", cpus.join(", ")));
    }
    if let Some(p) = filter.pid {
        w.push_str(&format!(" AND {pid} = {p}"));
    }
    if let Some(c) = &filter.comm {
        w.push_str(&format!(" AND {comm} = {}", quote_str(c)));
    }
    if let Some(ids) = workloads {
        if ids.is_empty() {
            return None;
        }
        let ids: Vec<String> = ids.iter().map(|s| quote_str(s)).collect();
        w.push_str(&format!(" AND {workload} IN ({})", ids.join(", ")));
    }
    Some(w)
}

/// A value the workload filter asks for, as it appears inside the stored identity (JSON): a
/// pod's `namespace/name` is stored as two fields. `None` where JSON would escape it.
fn stored_fragment(value: &str) -> Option<&str> {
    let v = value.rsplit('/').next().unwrap_or(value);
    (!v.is_empty() && !v.contains(['"', '\\']) && !v.chars().any(char::is_control)).then_some(v)
}

/// The identities of the window that the workload filter keeps (`None`: no workload filter).
pub(super) fn workloads(
    fleet: &Fleet,
    table: &str,
    range: &str,
    filter: &Filter,
) -> Result<Option<Vec<String>>, FleetError> {
    let w = &filter.workload;
    if w.is_empty() {
        return Ok(None);
    }
    let mut sql = format!("SELECT DISTINCT {WORKLOAD} FROM {table} WHERE {range}");
    for v in [&w.pod, &w.namespace, &w.container, &w.unit].into_iter().flatten() {
        if let Some(f) = stored_fragment(v) {
            sql.push_str(&format!(" AND position({WORKLOAD}, {}) > 0", quote_str(f)));
        }
    }
    sql.push_str(&format!(" LIMIT {MAX_WORKLOADS}"));
    let all = fleet.rows(&sql, |r| Ok(r.string()?.to_string()))?;
    let keeps = |s: &String| crate::identity::workloads::decode(s).is_some_and(|id| id.matches(w));
    Ok(Some(all.into_iter().filter(keeps).collect()))
}

/// A `--cpu` that no chosen node has (a node that did not say its CPUs is not judged).
pub(super) fn check_cpus(sel: &Selection, filter: &Filter) -> Result<(), FleetError> {
    let cpus = sel.cpus();
    match filter.cpus.iter().find(|&&c| cpus > 0 && c >= cpus) {
        Some(&cpu) => Err(QueryError::UnknownCpu { cpu, last: cpus - 1 }.into()),
        None => Ok(()),
    }
}

/// One summed row: (comm, stack id, workload, weight).
type Row = (String, u64, String, u64);

pub(super) use super::stack_text::Frames;

/// `(name, kernel)` per frame, root first: kernel frames follow the user ones, as the copy
/// reads them (a frame past the flags is a kernel frame).
pub(super) fn named(stack: &Frames) -> impl Iterator<Item = (&str, bool)> + Clone {
    named_in(&stack.0, &stack.1)
}

/// [`named`] of a stack's names and kernel flags, borrowed.
fn named_in<'a, S: AsRef<str>>(frames: &'a [S], kernel: &[u8]) -> impl Iterator<Item = (&'a str, bool)> + Clone {
    let user_len = kernel.iter().take_while(|&&k| k == 0).count().min(frames.len());
    frames.iter().enumerate().map(move |(i, f)| (f.as_ref(), i >= user_len))
}

/// Whether a stack passes the filters that depend on the stack alone (context, --function).
pub(super) fn stack_keeps(filter: &Filter, stack: &Frames) -> bool {
    keeps_in(filter, &stack.0, &stack.1)
}

/// [`stack_keeps`] of a stack's names and kernel flags, borrowed.
fn keeps_in<S: AsRef<str>>(filter: &Filter, frames: &[S], kernel: &[u8]) -> bool {
    filter.context.is_none_or(|c| c.keeps(Context::of_frames(named_in(frames, kernel))))
        && filter.function.as_deref().is_none_or(|f| frames.iter().any(|x| x.as_ref() == f))
}

/// A fold and where it was read from ([`rollup::describe`]: the tables and how much of the
/// window each answered).
pub struct Fold {
    pub folded: Folded,
    pub read_from: String,
    /// Why the fold is not every stack of the window: the server sent only the heaviest rows
    /// ([`MAX_FOLD_ROWS`]), the rest are summed as [`OTHER_STACKS`].
    pub note: Option<String>,
}

/// Most (process, stack, workload) rows a fold reads from the server, heaviest first: a
/// fleet's day can hold millions of distinct ones. With their stacks' text (read
/// [`STACK_BATCH`] rows at a time, [`stack_texts`]) this bounds what a read holds in the reader's
/// process, whatever the window: about 40 MB of rows, the distinct stacks' text (~3 KB each for
/// deep Python stacks), plus the fold's own budget ([`FoldBudget`]).
pub const MAX_FOLD_ROWS: usize = 200_000;
/// Rows read per distinct stack kept: the rarer rows fold into their parents within the fold's
/// budget, as the store's fold does, and only rows past this go to [`OTHER_STACKS`].
const ROWS_PER_STACK: usize = 5;
/// Rows folded between two checks of the fold's budget.
const STACK_BATCH: usize = 4_000;
/// The line that sums the rows a fold did not read.
pub const OTHER_STACKS: &str = "[other stacks]";

/// The rows a fold of `budget` reads.
fn row_limit(budget: FoldBudget) -> usize {
    budget.max_stacks.saturating_mul(ROWS_PER_STACK).clamp(1, MAX_FOLD_ROWS)
}

/// The table and `WHERE` of one part of a window.
fn piece_scope(fleet: &Fleet, sel: &Selection, kind: SampleKind, piece: Piece) -> (String, String) {
    match piece.source {
        Source::Raw => scope(fleet, sel, kind, piece.window),
        rolled => {
            // The fleet-wide tables have no node: they answer for the whole fleet only.
            let nodes = if rolled.fleet_wide() { "1".to_string() } else { sel.predicate() };
            let range = format!("{nodes} AND {TS} >= {} AND {TS} < {}", piece.window.from_ns, piece.window.to_ns);
            (fleet.table(rolled.table()), range)
        }
    }
}

/// The summed rows of one part of a window from its table, heaviest first, at most `limit`;
/// and the part's total weight (what the rows not sent weigh too).
fn piece_rows(
    fleet: &Fleet,
    sel: &Selection,
    kind: SampleKind,
    piece: Piece,
    filter: &Filter,
    limit: usize,
) -> Result<(Vec<Row>, u64), FleetError> {
    let (table, range) = piece_scope(fleet, sel, kind, piece);
    let ids = workloads(fleet, &table, &range, filter)?;
    let read = |r: &mut super::rowbinary::Reader<'_>| {
        Ok((r.string()?.to_string(), r.u64()?, r.string()?.to_string(), r.u64()?))
    };
    // The grouped rows and the column that sums them.
    let (grouped, keys, n) = match kind {
        SampleKind::Cpu => {
            let Some(w) = column_filters(filter, [CPU, PID, COMM, WORKLOAD], ids.as_deref()) else {
                return Ok((Vec::new(), 0));
            };
            (format!("{table} WHERE {range}{w}"), format!("{COMM}, {STACK_ID}, {WORKLOAD}"), COUNT)
        }
        // A row sent twice is there twice until a merge: one per key, as the copy reads them.
        _ => {
            let Some(w) = column_filters(filter, ["k", "p", "c", "w"], ids.as_deref()) else {
                return Ok((Vec::new(), 0));
            };
            (
                format!(
                    "(SELECT {COMM} AS c, {STACK_ID} AS sid, any({WORKLOAD}) AS w, any({CPU}) AS k, any({PID}) AS p, \
                     max({VALUE}) AS v FROM {table} WHERE {range} GROUP BY {NODE}, {TS}, {TID}, {STACK_ID}, {COMM}) WHERE 1{w}"
                ),
                "c, sid, w".to_string(),
                "v",
            )
        }
    };
    let rows = fleet.rows(
        &format!(
            "SELECT {keys}, toUInt64(sum({n})) AS weight FROM {grouped} GROUP BY {keys} \
             ORDER BY weight DESC, {keys} LIMIT {limit}"
        ),
        read,
    )?;
    let total = if rows.len() < limit {
        rows.iter().map(|r| r.3).sum()
    } else {
        let sum = fleet.rows(&format!("SELECT toUInt64(sum({n})) FROM {grouped}"), |r| r.u64())?;
        sum.first().copied().unwrap_or(0)
    };
    Ok((rows, total))
}

/// The rows of every part of a window, the same key from several parts summed, heaviest first
/// and at most `limit`; and what the rows left out weigh.
fn merged(parts: Vec<(Vec<Row>, u64)>, limit: usize) -> (Vec<Row>, u64) {
    let total: u64 = parts.iter().map(|p| p.1).sum();
    let rows: Vec<Row> = if parts.len() == 1 {
        parts.into_iter().next().map(|p| p.0).unwrap_or_default()
    } else {
        let mut sums: rustc_hash::FxHashMap<(String, u64, String), u64> = Default::default();
        for (comm, id, workload, n) in parts.into_iter().flat_map(|p| p.0) {
            *sums.entry((comm, id, workload)).or_default() += n;
        }
        let mut rows: Vec<Row> = sums.into_iter().map(|((c, id, w), n)| (c, id, w, n)).collect();
        rows.sort_unstable_by(|a, b| b.3.cmp(&a.3).then_with(|| (&a.0, a.1, &a.2).cmp(&(&b.0, b.1, &b.2))));
        rows.truncate(limit);
        rows
    };
    let kept: u64 = rows.iter().map(|r| r.3).sum();
    (rows, total.saturating_sub(kept))
}

/// Folds the chosen nodes' `kind` samples in `window` that pass `filter`, within `budget`:
/// from the rollups where they resolve the window ([`rollup::plan`]), raw rows elsewhere.
/// Reads at most [`ROWS_PER_STACK`] rows per stack the budget keeps ([`MAX_FOLD_ROWS`] at most).
pub fn fold(
    fleet: &Fleet,
    sel: &Selection,
    kind: SampleKind,
    window: Window,
    filter: &Filter,
    budget: FoldBudget,
) -> Result<Fold, FleetError> {
    fold_reading(fleet, sel, kind, window, filter, budget, row_limit(budget))
}

/// [`fold`], reading at most `limit` (process, stack, workload) rows from the server.
pub fn fold_reading(
    fleet: &Fleet,
    sel: &Selection,
    kind: SampleKind,
    window: Window,
    filter: &Filter,
    budget: FoldBudget,
    limit: usize,
) -> Result<Fold, FleetError> {
    check_cpus(sel, filter)?;
    let limit = limit.max(1);
    // The CUDA counts have no rollup.
    let plan = match kind {
        SampleKind::Cpu => rollup::plan(window, filter, sel, Coverage::read(fleet, window)?),
        _ => vec![Piece { source: Source::Raw, window }],
    };
    // The parts at once: each is a request the servers answer in 10-100 ms.
    let parts = std::thread::scope(|s| {
        let asked: Vec<_> =
            plan.iter().map(|&piece| s.spawn(move || piece_rows(fleet, sel, kind, piece, filter, limit))).collect();
        asked.into_iter().map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect::<Vec<_>>()
    })
    .into_iter()
    .collect::<Result<Vec<_>, _>>()?;
    // For the whole fleet, the stacks of the window's parts that had rows, for the server to
    // name the stacks' rows by (`stack_text::each_named_by`): those parts are the fleet's
    // rollups, cheap to read again, where a node's raw hour costs more than lists of ids.
    let ids_sql = sel.whole_fleet.then(|| {
        let of = |(&piece, _): (&Piece, _)| {
            let (table, range) = piece_scope(fleet, sel, kind, piece);
            format!("SELECT {STACK_ID} FROM {table} WHERE {range}")
        };
        plan.iter().zip(&parts).filter(|(_, p)| !p.0.is_empty()).map(of).collect::<Vec<_>>().join(" UNION ALL ")
    });
    let (rows, rest) = merged(parts, limit);
    // Not when only the heaviest rows came: the window's stacks may then be many more.
    let ids_sql = ids_sql.filter(|sql| rows.len() < limit && !sql.is_empty());
    let mut folded = Folded::default();
    let missing: Frames = (vec![MISSING_STACK.to_string()], vec![0u8]);
    // Bytes of the lines held: folded down as the store's scan folds, so that many distinct
    // stacks never hold more than half again the budget.
    let mut bytes = 0usize;
    let (texts, missing) = (stack_texts(fleet, &rows, ids_sql.as_deref(), filter)?, stack_text(&missing, filter));
    // Each process's name as the line's head, made once.
    let mut heads: rustc_hash::FxHashMap<&str, String> = Default::default();
    for batch in rows.chunks(STACK_BATCH) {
        for (comm, id, workload, n) in batch {
            let Some(text) = texts.get(id).unwrap_or(&missing) else { continue };
            let head = heads.entry(comm).or_insert_with(|| fold_names_with(comm, std::iter::empty(), filter.lines));
            let mut line = String::with_capacity(head.len() + text.len());
            line.push_str(head);
            line.push_str(text);
            let len = line.len();
            *folded.stacks.entry(line).or_insert_with(|| {
                bytes += len;
                0
            }) += n;
            if let Some(pod) = crate::identity::workloads::decode(workload).and_then(|w| w.pod()) {
                folded.add_pod(comm, pod, *n);
            }
        }
        if folded.stacks.len() > budget.max_stacks * 3 / 2 || bytes > budget.max_bytes * 3 / 2 {
            bytes = folded.fold_rarest(budget.max_stacks, budget.max_bytes);
        }
    }
    // What the rows not read weigh: known, unless a filter of the stack's own decides it.
    let by_stack = filter.context.is_some() || filter.function.is_some();
    let note = (rest > 0).then(|| {
        let what = if by_stack {
            "the rarer ones were not read (--context and --function need each stack)".to_string()
        } else {
            *folded.stacks.entry(OTHER_STACKS.to_string()).or_default() += rest;
            format!("the rarer ones' {rest} {} are summed as {OTHER_STACKS}", kind.unit())
        };
        format!("ClickHouse sent the window's {} heaviest (process, stack, workload) rows; {what}", rows.len())
    });
    if filter.include_idle && kind == SampleKind::Cpu {
        for (cpu, idle) in idle(fleet, sel, window)? {
            if idle > 0 && filter.idle_ok(cpu) {
                folded.per_cpu.entry(cpu).or_default().1 += idle;
                *folded.stacks.entry(IDLE_FRAME.to_string()).or_default() += idle;
            }
        }
    }
    if folded.stacks.is_empty() {
        return Err(nothing(fleet, sel, kind, window, filter)?);
    }
    Ok(Fold { folded: folded.within(budget), read_from: rollup::describe(&plan), note })
}

/// Each distinct stack of `rows` as its folded text after the process name (`;frame;...`), or
/// `None` where a filter of the stack's own drops it. Fetched once per stack, in id order
/// (`stack_text::each`: each request reads one range of the key, so a fold goes through the
/// tables once, whatever its rows' order; fetched per batch of the heaviest rows, every request
/// named ids all over the key and read the whole table: 50 passes for 200,000 rows, 9 GB on a
/// 100-node run), each distinct frame's text once. Held as text (what the fold's lines are
/// made of), not as frame lists. `ids_sql`: a server-side query naming at least the rows'
/// stacks, which then go in two requests (`stack_text::each_named_by`).
fn stack_texts(
    fleet: &Fleet,
    rows: &[Row],
    ids_sql: Option<&str>,
    filter: &Filter,
) -> Result<HashMap<u64, Option<String>>, FleetError> {
    let mut out = HashMap::new();
    let ids = rows.iter().map(|r| r.1);
    // Each distinct frame as the fold writes it, made once (a fleet's stacks share most of
    // their frames: 43,000 stacks of 1 M frames name 9,000): by the frame's id where the
    // dictionary gave one (hashing and comparing 8 bytes, not the name: half the reader's
    // CPU went to names), by name for stacks stored as text.
    let mut pieces: Vec<String> = Vec::new();
    let mut by_id: rustc_hash::FxHashMap<(u64, bool), u32> = Default::default();
    let mut by_name: [rustc_hash::FxHashMap<String, u32>; 2] = Default::default();
    let mut of_stack: Vec<u32> = Vec::new();
    let lines = filter.lines;
    let keep = |id, frames: &[&str], frame_ids: Option<&[u64]>, kernel: &[u8]| {
        let text = keeps_in(filter, frames, kernel).then(|| {
            of_stack.clear();
            for (i, (name, k)) in named_in(frames, kernel).enumerate() {
                let mut made = || {
                    pieces.push(folded_piece(name, k, lines));
                    (pieces.len() - 1) as u32
                };
                of_stack.push(match frame_ids.and_then(|f| f.get(i)) {
                    Some(&f) => *by_id.entry((f, k)).or_insert_with(made),
                    None => match by_name[usize::from(k)].get(name) {
                        Some(&p) => p,
                        None => {
                            let p = made();
                            by_name[usize::from(k)].insert(name.to_string(), p);
                            p
                        }
                    },
                });
            }
            // Sized once: a deep stack's text is kilobytes, grown piece by piece it was copied
            // again at each doubling.
            let len: usize = of_stack.iter().map(|&p| pieces[p as usize].len() + 1).sum();
            let mut text = String::with_capacity(len);
            for &p in &of_stack {
                text.push(';');
                text.push_str(&pieces[p as usize]);
            }
            text
        });
        out.insert(id, text);
    };
    match ids_sql {
        Some(sql) => super::stack_text::each_named_by(fleet, sql, ids, keep)?,
        None => super::stack_text::each(fleet, ids, keep)?,
    }
    Ok(out)
}

/// A stack's folded text after the process name, `None` when the filter drops it.
fn stack_text(stack: &Frames, filter: &Filter) -> Option<String> {
    let head = fold_names_with("", std::iter::empty(), filter.lines).len();
    stack_keeps(filter, stack).then(|| fold_names_with("", named(stack), filter.lines)[head..].to_string())
}

/// The subsecond heatmap of the chosen nodes' CPU samples in `window`: per cell, the sum over
/// the nodes. The server groups by (column, row), so a day costs what a minute does.
pub fn grid(fleet: &Fleet, sel: &Selection, window: Window, rows: usize, filter: &Filter) -> Result<Grid, FleetError> {
    check_cpus(sel, filter)?;
    let mut grid = Grid::empty(window, rows);
    let (first, k, r) = (grid.first_second, grid.seconds_per_column, grid.rows);
    // Seconds some block of a node covers: a column of none is a gap (the daemon was down).
    let recorded = fleet.rows(
        &format!(
            "SELECT DISTINCT toUInt64(intDiv({TS}, {SEC})) FROM {} WHERE {} AND {TS} >= {} AND {TS} < {}",
            fleet.table(schema::CPU_SECONDS),
            sel.predicate(),
            first * SEC,
            window.to_ns
        ),
        |r| r.u64(),
    )?;
    for second in recorded {
        grid.record(second * SEC, (second + 1) * SEC);
    }
    let (table, range) = scope(fleet, sel, SampleKind::Cpu, window);
    let ids = workloads(fleet, &table, &range, filter)?;
    let Some(w) = column_filters(filter, [CPU, PID, COMM, WORKLOAD], ids.as_deref()) else { return Ok(grid) };
    let cell = format!(
        "toUInt64(intDiv(intDiv({TS}, {SEC}) - {first}, {k})) AS col, toUInt64(intDiv(({TS} % {SEC}) * {r}, {SEC})) AS rw"
    );
    let by_stack = filter.context.is_some() || filter.function.is_some();
    let cells = if by_stack {
        let stacks = stacks(fleet, &table, &range)?;
        let missing: Frames = (vec![MISSING_STACK.to_string()], vec![0u8]);
        let keeps = |id: u64| stack_keeps(filter, stacks.get(&id).unwrap_or(&missing));
        let mut passes: HashMap<u64, bool> = HashMap::new();
        let rows = fleet.rows(
            &format!(
                "SELECT {cell}, {STACK_ID}, toUInt64(sum({COUNT})) FROM {table} WHERE {range}{w} \
                 GROUP BY col, rw, {STACK_ID}"
            ),
            |r| Ok((r.u64()?, r.u64()?, r.u64()?, r.u64()?)),
        )?;
        rows.into_iter()
            .filter(|&(_, _, id, _)| *passes.entry(id).or_insert_with(|| keeps(id)))
            .map(|(c, rw, _, n)| (c, rw, n))
            .collect::<Vec<_>>()
    } else {
        fleet.rows(
            &format!("SELECT {cell}, toUInt64(sum({COUNT})) FROM {table} WHERE {range}{w} GROUP BY col, rw"),
            |r| Ok((r.u64()?, r.u64()?, r.u64()?)),
        )?
    };
    for (col, row, n) in cells {
        grid.add(first + col * k, row as usize, n);
    }
    Ok(grid)
}

/// CPU x time of one node, summed by the server: per (CPU, bucket) its samples, those whose
/// stack ends in the kernel, and those in a softirq (the first kernel frame a
/// `[softirq:NAME]` marker, `exec_context`). Buckets of whole seconds read the window's whole
/// seconds, as the store's per-second summaries give them; finer ones (10 ms and up) the
/// samples inside the window, each in the bucket of its own time, as a scan of the store
/// does. A node's frequency is taken as its latest.
pub fn cpu_time(fleet: &Fleet, node: &Node, window: Window, bucket_ns: u64) -> Result<CpuTime, FleetError> {
    let b = Buckets::of(window, bucket_ns, node.cpus.max(1));
    let (first, width) = (b.first_ns, b.bucket_ns);
    let (from, to) = (window.from_ns / SEC * SEC, window.to_ns.div_ceil(SEC) * SEC);
    let seconds = format!("{NODE} = {} AND {TS} >= {from} AND {TS} < {to}", quote_str(&node.name));
    // A node down all the window has no per-CPU counts in it (an idle one has).
    let blocks = fleet
        .rows(&format!("SELECT count() FROM {} WHERE {seconds}", fleet.table(schema::CPU_SECONDS)), |r| r.u64())?;
    if blocks.first().is_none_or(|&n| n == 0) {
        let (from, to) = (timespec::format(window.from_ns), timespec::format(window.to_ns));
        return Err(FleetError::NoSamples { what: "samples".into(), from, to, nodes: format!("node {}", node.name) });
    }
    let range = if width.is_multiple_of(SEC) {
        seconds
    } else {
        format!("{NODE} = {} AND {TS} >= {} AND {TS} < {}", quote_str(&node.name), window.from_ns, window.to_ns)
    };
    let samples = fleet.table(schema::SAMPLES);
    // Which tables hold the stacks (the kernel and softirq cells ask the server about frames).
    let sources = Sources::of(fleet)?;
    let cells = |stacks: Option<Cond>| -> Result<Vec<(u16, u64, u64)>, FleetError> {
        let ids = format!("SELECT {STACK_ID} FROM {samples} WHERE {range}");
        let only = stacks.map_or(String::new(), |cond| sources.only(fleet, &ids, cond));
        fleet.rows(
            &format!(
                "SELECT {CPU}, toUInt64(intDiv({TS} - {first}, {width})) AS col, toUInt64(sum({COUNT})) FROM {samples} \
                 WHERE {range}{only} GROUP BY {CPU}, col"
            ),
            |r| Ok((r.u16()?, r.u64()?, r.u64()?)),
        )
    };
    let rows = node.cpus.max(1) as usize;
    let grid = |cells: Vec<(u16, u64, u64)>| {
        let mut v = vec![vec![0f64; b.n]; rows];
        for (cpu, col, n) in cells {
            if let Some(cell) = v.get_mut(usize::from(cpu)).and_then(|r| r.get_mut(col as usize)) {
                *cell += n as f64;
            }
        }
        v
    };
    let busy = grid(cells(None)?);
    let kernel = grid(cells(Some(Cond::KernelLeaf))?);
    let softirq = grid(cells(Some(Cond::Softirq))?);
    let ticks = (f64::from(node.hz.max(1)) * width as f64 / SEC as f64).max(1e-9);
    Ok(b.shares(busy, kernel, softirq, ticks))
}

/// Frames and kernel flags of the stacks `ids` name (`stack_text`: through the frames
/// dictionary, old `stacks` rows for the ids it lacks).
pub(super) fn stacks_by_id(
    fleet: &Fleet,
    ids: impl IntoIterator<Item = u64>,
) -> Result<HashMap<u64, Frames>, FleetError> {
    super::stack_text::by_id(fleet, ids)
}

/// Frames and kernel flags of the stacks the window's rows name.
pub(super) fn stacks(fleet: &Fleet, table: &str, range: &str) -> Result<HashMap<u64, Frames>, FleetError> {
    super::stack_text::of_window(fleet, table, range)
}

/// Idle samples per CPU (summed over the nodes) of the stored blocks inside `window`: a block
/// the window cuts in two is left out, as a scan of the store leaves it.
fn idle(fleet: &Fleet, sel: &Selection, window: Window) -> Result<Vec<(u32, u64)>, FleetError> {
    // A retried batch sends a block's row again: one per (node, ts, cpu).
    let sql = format!(
        "SELECT {CPU}, toUInt64(sum(i)) FROM (SELECT {CPU}, max({IDLE}) AS i, max({SPAN}) AS sp, {TS} AS t \
         FROM {} WHERE {} AND {TS} >= {} AND {TS} < {} GROUP BY {NODE}, {TS}, {CPU}) WHERE t + sp <= {} \
         GROUP BY {CPU} ORDER BY {CPU}",
        fleet.table(schema::CPU_SECONDS),
        sel.predicate(),
        window.from_ns,
        window.to_ns,
        window.to_ns,
    );
    fleet.rows(&sql, |r| Ok((u32::from(r.u16()?), r.u64()?)))
}

/// Why a fold is empty: nothing in the window at all, or nothing that passes the filters.
fn nothing(
    fleet: &Fleet,
    sel: &Selection,
    kind: SampleKind,
    window: Window,
    filter: &Filter,
) -> Result<FleetError, FleetError> {
    let (table, range) = scope(fleet, sel, kind, window);
    let weight = if kind == SampleKind::Cpu { COUNT } else { VALUE };
    let total = fleet
        .rows(&format!("SELECT toUInt64(sum({weight})) FROM {table} WHERE {range}"), |r| r.u64())?
        .first()
        .copied()
        .unwrap_or(0);
    let (from, to) = (timespec::format(window.from_ns), timespec::format(window.to_ns));
    if total == 0 {
        return Ok(FleetError::NoSamples { what: kind.unit().into(), from, to, nodes: sel.describe() });
    }
    Ok(QueryError::NoMatch { filter: filter.describe(), from, to, total }.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_filters_are_quoted_sql_and_an_empty_workload_set_matches_nothing() {
        let f = Filter { cpus: vec![1, 3], pid: Some(7), comm: Some("it's".into()), ..Default::default() };
        let cols = [CPU, PID, COMM, WORKLOAD];
        assert_eq!(
            column_filters(&f, cols, Some(&["{\"pod_name\":\"a\"}".to_string()])).unwrap(),
            " AND cpu IN (1, 3) AND pid = 7 AND comm = 'it\\'s' AND workload IN ('{\"pod_name\":\"a\"}')"
        );
        assert_eq!(column_filters(&Filter::default(), cols, None).unwrap(), "");
        assert!(column_filters(&Filter::default(), cols, Some(&[])).is_none());
    }

    #[test]
    fn a_workload_value_is_looked_for_as_json_stores_it() {
        assert_eq!(stored_fragment("kube-system/coredns-5d78"), Some("coredns-5d78"));
        assert_eq!(stored_fragment("nginx"), Some("nginx"));
        assert_eq!(stored_fragment("a\"b"), None);
        assert_eq!(stored_fragment("ns/"), None);
    }
}
