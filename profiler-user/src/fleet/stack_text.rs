//! The stacks' text, for every read that shows or filters by frames: through the frames
//! dictionary (`stack_frames`: a stack as frame ids; `frames`: each frame's text once,
//! `ship::clickhouse::frames`), assembled here. A read fetches 8 bytes a frame, then only the
//! distinct frames its stacks name: a Python training fleet's stacks share most of their
//! frames, so the text travels once, not once per stack.
//!
//! Servers that daemons of earlier versions shipped to hold stacks as text in `stacks`: a stack
//! id the dictionary lacks is looked up there, and the conditions the server evaluates on a
//! stack's frames (kernel-ending, softirq) read both while `stacks` has rows.

use std::{
    collections::{BTreeSet, HashMap},
    sync::atomic::Ordering::Relaxed,
};

use rustc_hash::{FxHashMap, FxHashSet};

use super::{Fleet, FleetError};
use crate::ship::clickhouse::schema::{self, col::*, quote_str};

/// The frame shown where a stack names a frame id `frames` lacks (a frame's insert comes before
/// its stacks', so only a table damaged or cut by hand shows it).
pub(crate) const MISSING_FRAME: &str = "[frame not in ClickHouse]";
/// Ids per request: 20 bytes of SQL each, well under the server's 256 KiB `max_query_size`.
const BATCH: usize = 4_000;
/// Fewest stacks read through a server-side query of their ids ([`each_named_by`]): below, a
/// list of ids costs the server little, and a filtered read's few stacks are not worth the
/// window's others that the query may name too.
const NAMED_BY_MIN: usize = 256;
/// List requests in flight at once ([`batched`]).
const IN_FLIGHT: usize = 4;

/// A stack's text: frame names root first, and a kernel flag per frame.
pub(super) type Frames = (Vec<String>, Vec<u8>);

/// A stack as `stack_frames` holds it: frame ids root first, a kernel flag per frame.
type IdStack = (Vec<u64>, Vec<u8>);

/// Each frame id's text (`frames`). Keys are ids the servers made (hashes): no hasher that
/// resists chosen keys is needed, and a fold looks up every frame of every stack.
type Names = FxHashMap<u64, String>;

/// The tables a server holds stacks in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sources {
    /// `stack_frames` and `frames` exist (a shipper of this version made them).
    pub dictionary: bool,
    /// `stacks` holds rows (shipped by daemons from before the dictionary).
    pub text: bool,
}

impl Sources {
    /// What the server holds now (`stacks` checked at each call: an older daemon may still ship).
    pub fn of(fleet: &Fleet) -> Result<Self, FleetError> {
        let text =
            !fleet.rows(&format!("SELECT 1 FROM {} LIMIT 1", fleet.table(schema::STACKS)), |r| r.u8())?.is_empty();
        Ok(Self { dictionary: dictionary(fleet)?, text })
    }

    /// ` AND stack_id` among the stacks named by `ids` (a subquery of stack ids) whose frames
    /// meet `cond`, on the server.
    pub fn only(&self, fleet: &Fleet, ids: &str, cond: Cond) -> String {
        let mut parts = Vec::new();
        if self.dictionary {
            parts.push(format!(
                "{STACK_ID} GLOBAL IN (SELECT {STACK_ID} FROM {} WHERE {STACK_ID} GLOBAL IN ({ids}) AND {})",
                fleet.table(schema::STACK_FRAMES),
                cond.on_ids(fleet)
            ));
        }
        if self.text || !self.dictionary {
            parts.push(format!(
                "{STACK_ID} GLOBAL IN (SELECT {STACK_ID} FROM {} WHERE {STACK_ID} GLOBAL IN ({ids}) AND {})",
                fleet.table(schema::STACKS),
                cond.on_text()
            ));
        }
        format!(" AND ({})", parts.join(" OR "))
    }
}

/// A condition on a stack's frames that the server evaluates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cond {
    /// The leaf is a kernel frame.
    KernelLeaf,
    /// The first kernel frame is a `[softirq:NAME]` marker (`exec_context`).
    Softirq,
}

impl Cond {
    fn on_text(self) -> String {
        match self {
            Cond::KernelLeaf => format!("{KERNEL}[length({KERNEL})] = 1"),
            Cond::Softirq => format!(
                "startsWith({FRAMES}[indexOf({KERNEL}, 1)], '[softirq:') AND endsWith({FRAMES}[indexOf({KERNEL}, 1)], ']')"
            ),
        }
    }

    fn on_ids(self, fleet: &Fleet) -> String {
        match self {
            Cond::KernelLeaf => format!("{KERNEL}[length({KERNEL})] = 1"),
            // No kernel frame: index 0, id 0, which no frame has.
            Cond::Softirq => format!(
                "{FRAME_IDS}[indexOf({KERNEL}, 1)] GLOBAL IN (SELECT {FRAME_ID} FROM {} \
                 WHERE startsWith({NAME}, '[softirq:') AND endsWith({NAME}, ']'))",
                fleet.table(schema::FRAME_DICT)
            ),
        }
    }
}

/// Whether the server has the dictionary's tables; once seen, remembered (they are not dropped).
fn dictionary(fleet: &Fleet) -> Result<bool, FleetError> {
    if fleet.dictionary.load(Relaxed) {
        return Ok(true);
    }
    let sql = format!(
        "SELECT toUInt64(count()) FROM system.tables WHERE database = {} AND name IN ({}, {})",
        quote_str(&fleet.database),
        quote_str(schema::STACK_FRAMES),
        quote_str(schema::FRAME_DICT)
    );
    let there = fleet.rows(&sql, |r| r.u64())?.first().copied() == Some(2);
    fleet.dictionary.store(there, Relaxed);
    Ok(there)
}

/// Frames and kernel flags of the stacks `ids` name (those ClickHouse has; [`each`]).
pub(super) fn by_id(fleet: &Fleet, ids: impl IntoIterator<Item = u64>) -> Result<HashMap<u64, Frames>, FleetError> {
    let mut out = HashMap::new();
    each(fleet, ids, |id, frames, _, kernel| {
        out.insert(id, (frames.iter().map(|f| f.to_string()).collect(), kernel.to_vec()));
    })?;
    Ok(out)
}

/// Calls `f` with the frames and kernel flags of each stack of `ids` that ClickHouse has: from
/// the dictionary, then `stacks` for the ids it lacks. Requests go in id order, [`BATCH`] ids
/// each ([`batched`]), so that together they read each table's key once; each distinct
/// frame's text is fetched once. `f` takes a stack's frames' names, root first, their ids in the
/// dictionary (`None` for a stack stored as text), and kernel flags, borrowed: a fold of 40,000
/// deep stacks makes each frame's text once, not 40,000 lists of names.
pub(super) fn each(
    fleet: &Fleet,
    ids: impl IntoIterator<Item = u64>,
    f: impl FnMut(u64, &[&str], Option<&[u64]>, &[u8]),
) -> Result<(), FleetError> {
    let ids: Vec<u64> = ids.into_iter().collect::<BTreeSet<u64>>().into_iter().collect();
    if ids.is_empty() {
        return Ok(());
    }
    if !dictionary(fleet)? {
        return from_text(fleet, ids, f);
    }
    let table = fleet.table(schema::STACK_FRAMES);
    let stacks = batched(
        fleet,
        &ids,
        |list| format!("SELECT {STACK_ID}, {FRAME_IDS}, {KERNEL} FROM {table} WHERE {STACK_ID} IN ({list})"),
        |r| Ok((r.u64()?, (r.u64s()?, r.bytes()?.to_vec()))),
    )?;
    assembled(fleet, ids.iter().copied().collect(), stacks, None, f)
}

/// [`each`] for the stacks `wanted`, which the server-side query `ids_sql` (a `SELECT` of stack
/// ids: the window's rows; for the whole fleet's rollups, as re-reading a node's raw rows costs
/// more than lists) names with others maybe. Many stacks ([`NAMED_BY_MIN`]) are asked in one
/// request naming them by `ids_sql` rather than in lists of ids: 18.16 parses a list of
/// 4,000 ids in 50-100 ms a request (twice through a `Distributed` table), and a fleet
/// flamegraph of 30,000 stacks spent ~0.7 s of its 1.7 s listing them; their frames' text is
/// asked at the same time, named by the same query. Fewer go by [`each`].
pub(super) fn each_named_by(
    fleet: &Fleet,
    ids_sql: &str,
    wanted: impl IntoIterator<Item = u64>,
    f: impl FnMut(u64, &[&str], Option<&[u64]>, &[u8]),
) -> Result<(), FleetError> {
    let wanted: FxHashSet<u64> = wanted.into_iter().collect();
    if wanted.len() <= NAMED_BY_MIN || !dictionary(fleet)? {
        return each(fleet, wanted, f);
    }
    let table = fleet.table(schema::STACK_FRAMES);
    let named = format!("{STACK_ID} GLOBAL IN ({ids_sql})");
    // Rows as stored (a stack shipped to both shards is there twice): no `GROUP BY` of arrays,
    // which costs 18.16 more than the bytes. The frames' text at the same time, named by the
    // same query.
    let stacks_sql = format!("SELECT {STACK_ID}, {FRAME_IDS}, {KERNEL} FROM {table} WHERE {named}");
    let names_sql = format!(
        "SELECT {FRAME_ID}, {NAME} FROM {} WHERE {FRAME_ID} GLOBAL IN (SELECT arrayJoin({FRAME_IDS}) FROM {table} \
         WHERE {named})",
        fleet.table(schema::FRAME_DICT)
    );
    let (stacks, names) = std::thread::scope(|s| {
        let names = s.spawn(|| fleet.rows(&names_sql, |r| Ok((r.u64()?, r.string()?.to_string()))));
        let stacks = fleet.rows(&stacks_sql, |r| Ok((r.u64()?, (r.u64s()?, r.bytes()?.to_vec()))));
        (stacks, names.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    });
    assembled(fleet, wanted, stacks?, Some(names?.into_iter().collect()), f)
}

/// Calls `f` with each of `stacks` that `wanted` holds (once: a stack is stored on each shard
/// that was sent it), its frames named by `names` (fetched here when `None`); then with those
/// of `wanted` that `stacks` lacks, from `stacks` as text.
fn assembled(
    fleet: &Fleet,
    wanted: FxHashSet<u64>,
    stacks: Vec<(u64, IdStack)>,
    names: Option<Names>,
    mut f: impl FnMut(u64, &[&str], Option<&[u64]>, &[u8]),
) -> Result<(), FleetError> {
    let mut kept: FxHashMap<u64, IdStack> = FxHashMap::with_capacity_and_hasher(wanted.len(), Default::default());
    for (id, stack) in stacks {
        if wanted.contains(&id) {
            kept.entry(id).or_insert(stack);
        }
    }
    let names = match names {
        Some(n) => n,
        None => frame_names(fleet, kept.values().flat_map(|s| s.0.iter().copied()))?,
    };
    let missing: Vec<u64> = wanted.into_iter().filter(|id| !kept.contains_key(id)).collect();
    let mut frames = Vec::new();
    for (id, (ids, kernel)) in kept {
        frames.clear();
        frames.extend(texts(&ids, &names));
        f(id, &frames, Some(&ids), &kernel);
    }
    from_text(fleet, missing, f)
}

/// Rows of the requests `sql` makes of `ids` (sorted, distinct), [`BATCH`] ids each, up to
/// [`IN_FLIGHT`] at once: the server parses one list while it reads for another.
fn batched<T: Send>(
    fleet: &Fleet,
    ids: &[u64],
    sql: impl Fn(&str) -> String + Sync,
    row: impl Fn(&mut super::rowbinary::Reader<'_>) -> Result<T, FleetError> + Sync,
) -> Result<Vec<T>, FleetError> {
    debug_assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids sorted and distinct");
    let chunks: Vec<&[u64]> = ids.chunks(BATCH).collect();
    if chunks.len() <= 1 {
        return chunks.first().map_or(Ok(Vec::new()), |c| fleet.rows(&sql(&list(c)), &row));
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let work = || -> Result<Vec<T>, FleetError> {
        let mut out = Vec::new();
        while let Some(chunk) = chunks.get(next.fetch_add(1, Relaxed)) {
            out.extend(fleet.rows(&sql(&list(chunk)), &row)?);
        }
        Ok(out)
    };
    std::thread::scope(|s| {
        let others: Vec<_> = (1..IN_FLIGHT.min(chunks.len())).map(|_| s.spawn(work)).collect();
        let mut out = work()?;
        for t in others {
            out.extend(t.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?);
        }
        Ok(out)
    })
}

/// Calls `f` with each stack of `ids` that `stacks` (stacks as text, from daemons before the
/// dictionary) holds.
fn from_text(
    fleet: &Fleet,
    ids: impl IntoIterator<Item = u64>,
    mut f: impl FnMut(u64, &[&str], Option<&[u64]>, &[u8]),
) -> Result<(), FleetError> {
    let missing: Vec<u64> = ids.into_iter().collect::<BTreeSet<u64>>().into_iter().collect();
    for chunk in missing.chunks(BATCH) {
        let rows = fleet.rows(
            &format!(
                "SELECT {STACK_ID}, any({FRAMES}), any({KERNEL}) FROM {} WHERE {STACK_ID} IN ({}) GROUP BY {STACK_ID}",
                fleet.table(schema::STACKS),
                list(chunk)
            ),
            |r| {
                let id = r.u64()?;
                let frames: Vec<String> = r.strings()?.into_iter().map(String::from).collect();
                Ok((id, (frames, r.bytes()?.to_vec())))
            },
        )?;
        for (id, (frames, kernel)) in rows {
            f(id, &frames.iter().map(String::as_str).collect::<Vec<_>>(), None, &kernel);
        }
    }
    Ok(())
}

/// Frames and kernel flags of the stacks the rows of `table` in `range` name.
pub(super) fn of_window(fleet: &Fleet, table: &str, range: &str) -> Result<HashMap<u64, Frames>, FleetError> {
    let ids = fleet.rows(&format!("SELECT DISTINCT {STACK_ID} FROM {table} WHERE {range}"), |r| r.u64())?;
    by_id(fleet, ids)
}

/// The text of each frame id of `ids` that `frames` holds ([`batched`]).
fn frame_names(fleet: &Fleet, ids: impl IntoIterator<Item = u64>) -> Result<Names, FleetError> {
    let ids: Vec<u64> = ids.into_iter().collect::<BTreeSet<u64>>().into_iter().collect();
    let table = fleet.table(schema::FRAME_DICT);
    let rows = batched(
        fleet,
        &ids,
        |list| format!("SELECT {FRAME_ID}, {NAME} FROM {table} WHERE {FRAME_ID} IN ({list})"),
        |r| Ok((r.u64()?, r.string()?.to_string())),
    )?;
    Ok(rows.into_iter().collect())
}

fn list(ids: &[u64]) -> String {
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
}

/// A stack's frames as text: each frame id replaced by its name ([`MISSING_FRAME`] where
/// `names` lacks it).
fn texts<'a, 'b>(frame_ids: &'b [u64], names: &'a Names) -> impl Iterator<Item = &'a str> + use<'a, 'b> {
    frame_ids.iter().map(|f| names.get(f).map_or(MISSING_FRAME, String::as_str))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ship::clickhouse::frames::frame_id;

    #[test]
    fn stacks_are_assembled_from_their_frames_ids() {
        let names: Names = ["main", "work", "read_zero"].iter().map(|n| (frame_id(n), n.to_string())).collect();
        let ids = |ns: &[&str]| ns.iter().map(|n| frame_id(n)).collect::<Vec<_>>();
        let stacks = vec![
            (1, (ids(&["main", "work", "read_zero"]), vec![0, 0, 1])),
            (2, (ids(&["main", "main"]), vec![0, 0])),
            (3, (ids(&["main", "gone"]), vec![0, 1])),
            (4, (Vec::new(), Vec::new())),
            (9, (ids(&["not", "wanted"]), vec![0, 0])),
            (1, (ids(&["a", "copy", "from", "another", "shard"]), vec![0, 0])),
        ];
        let fleet = Fleet::new("http://127.0.0.1:1", "p").unwrap();
        let mut out: HashMap<u64, (Vec<String>, Vec<u8>)> = HashMap::new();
        assembled(&fleet, FxHashSet::from_iter([1, 2, 3, 4]), stacks, Some(names), |id, frames, frame_ids, kernel| {
            assert_eq!(frame_ids.map(<[u64]>::len), Some(frames.len()), "each frame's id with its name");
            let old = out.insert(id, (frames.iter().map(|f| f.to_string()).collect(), kernel.to_vec()));
            assert!(old.is_none(), "stack {id} given twice");
        })
        .unwrap();
        let text = |id: u64| out[&id].0.iter().map(String::as_str).collect::<Vec<_>>();
        assert_eq!(text(1), ["main", "work", "read_zero"], "the first copy of a stack");
        assert_eq!(out[&1].1, [0, 0, 1], "the kernel flags as stored");
        assert_eq!(text(2), ["main", "main"], "a frame the stack repeats");
        assert_eq!(text(3), ["main", MISSING_FRAME], "a frame the dictionary lacks is said, not dropped");
        assert_eq!(out[&3].1, [0, 1]);
        assert!(out[&4].0.is_empty());
        assert_eq!(out.len(), 4, "only the stacks wanted");
    }

    #[test]
    fn conditions_read_the_dictionary_and_old_stacks_while_those_hold_rows() {
        let fleet = Fleet::new("http://127.0.0.1:1", "p").unwrap();
        let both = Sources { dictionary: true, text: true };
        let q = both.only(&fleet, "SELECT stack_id FROM x", Cond::Softirq);
        assert!(q.starts_with(" AND (stack_id GLOBAL IN (SELECT stack_id FROM `p`.`stack_frames` WHERE"), "{q}");
        assert!(q.contains("frame_ids[indexOf(kernel, 1)] GLOBAL IN (SELECT frame_id FROM `p`.`frames`"), "{q}");
        assert!(q.contains(" OR stack_id GLOBAL IN (SELECT stack_id FROM `p`.`stacks` WHERE"), "{q}");
        assert!(q.contains("startsWith(frames[indexOf(kernel, 1)], '[softirq:')"), "{q}");
        let new = Sources { dictionary: true, text: false };
        let q = new.only(&fleet, "S", Cond::KernelLeaf);
        assert!(!q.contains("`stacks`") && q.contains("kernel[length(kernel)] = 1"), "{q}");
        let old = Sources { dictionary: false, text: false };
        assert!(!old.only(&fleet, "S", Cond::KernelLeaf).contains("stack_frames"));
    }
}
