//! The store writer's unit tests (`writer.rs`).

use super::*;

fn sample(ts_ns: u64) -> Sample {
    Sample {
        ts_ns,
        cpu: 0,
        pid: 7,
        tid: 7,
        cgroup_id: 0,
        comm: Arc::from("spin"),
        stack: Arc::new(Stack::new(vec![Arc::from("main")], 1)),
        workload: Arc::from(""),
    }
}

fn blocks_in(dir: &Path, start_ns: u64) -> Vec<BlockHeader> {
    let file = fs::read(segment_path(dir, start_ns)).unwrap();
    Blocks::new(&file).map(|(h, _)| h).collect()
}

/// A stack with user frames in files, and a kernel frame; `fresh`: every name a new `Arc`.
fn located(names: &[&str], shared: &[Arc<str>], fresh: bool) -> Arc<Stack> {
    let name = |i: usize, n: &str| if fresh { Arc::from(n) } else { shared[i].clone() };
    let file: Arc<str> = if fresh { Arc::from("/usr/bin/python3.11") } else { shared[shared.len() - 1].clone() };
    let user = names.len() - 1;
    Arc::new(Stack {
        frames: names.iter().enumerate().map(|(i, n)| name(i, n)).collect(),
        user_len: user,
        locations: (0..user).map(|i| crate::model::Location { file: file.clone(), addr: 0x1000 + i as u64 }).collect(),
    })
}

/// The writer finds a name or stack it met before by its allocation: what it writes must be
/// what a writer that meets every name and stack anew (nothing shared) writes, byte for byte,
/// whether the same stack comes back, an equal one in a new allocation, or one sharing a
/// prefix; and a stack the symbolizer dropped meanwhile must not be taken for a new one
/// that happens to land at its address.
#[test]
fn names_and_stacks_found_by_allocation_encode_as_a_fresh_writer_does() {
    let names = ["main", "f (/a.py:3)", "g (/a.py:9)", "do_syscall_64"];
    let other = ["main", "f (/a.py:3)", "h (/b.py:1)", "do_syscall_64"];
    let shared: Vec<Arc<str>> =
        names.iter().chain(&other).map(|n| Arc::from(*n)).chain([Arc::from("/usr/bin/python3.11")]).collect();
    let shared_other: Vec<Arc<str>> = shared[4..].to_vec();
    let s = 1_800_000_000;
    let write = |fresh: bool| {
        let dir = tempfile::tempdir().unwrap();
        let mut w = StoreWriter::new(dir.path());
        let a = located(&names, &shared, fresh);
        let mut t = s * NS_PER_SEC;
        for (i, stack) in [
            a.clone(),
            a.clone(),
            located(&names, &shared, fresh),
            located(&other, &shared_other, fresh),
            located(&names, &shared, true),
        ]
        .into_iter()
        .enumerate()
        {
            t += NS_PER_SEC / 2;
            w.push(&Sample { stack, ..sample(t) });
            if i % 2 == 1 {
                w.flush(t).unwrap();
            }
            // A dropped stack; the next allocation may land where it was.
            drop(Arc::new(Stack::new(vec![Arc::from("gone")], 1)));
        }
        w.flush(t).unwrap();
        fs::read(segment_path(dir.path(), s * NS_PER_SEC)).unwrap()
    };
    let (by_allocation, fresh) = (write(false), write(true));
    assert!(Blocks::new(&fresh).count() >= 3);
    assert_eq!(by_allocation, fresh);
    // And the stacks read back whole.
    let mut dict = super::super::format::Dict::default();
    let mut frames = Vec::new();
    let mut read = Vec::new();
    for (h, sec) in Blocks::new(&by_allocation) {
        dict.apply(&h, sec.dict).unwrap();
        let cols = super::super::format::unpack_samples(sec.samples, 1 << 20).unwrap();
        for &node in &cols.stack {
            dict.frames(node, &mut frames);
            read.push(frames.iter().map(|(id, _)| dict.strings[*id as usize].clone()).collect::<Vec<_>>().join(";"));
        }
    }
    let line = |n: &[&str]| n.join(";");
    assert_eq!(read, [line(&names), line(&names), line(&names), line(&other), line(&names)]);
}

/// What the writer packs is what readers unpack as a `DictDelta`, byte for byte.
#[test]
fn new_entries_pack_as_the_readers_delta() {
    use super::super::format::{DictDelta, unpack};
    let names = ["main", "", "f (/a.py:3)", "é ☃"];
    let entries = NewEntries {
        strings: names.iter().map(|n| Arc::from(*n)).collect(),
        parent_delta: vec![1, 1, 300],
        frame: vec![0, 4, 7],
    };
    let delta = DictDelta {
        strings: names.iter().map(|n| n.to_string()).collect(),
        parent_delta: entries.parent_delta.clone(),
        frame: entries.frame.clone(),
    };
    assert_eq!(pack(&entries), pack(&delta));
    let locations = NodeLocations { file: vec![0, 2, 1], addr: vec![0, 0x1000, u64::MAX] };
    assert_eq!(pack(&(&entries, &locations)), pack(&(&delta, &locations)));
    assert_eq!(unpack::<DictDelta>(&pack(&entries)).unwrap(), delta);
}

#[test]
fn a_held_second_is_written_whole_by_the_next_flush() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = StoreWriter::new(dir.path());
    let s = 1_800_000_000; // a minute boundary: both seconds in one segment
    w.push(&sample(s * NS_PER_SEC + 100));
    w.push(&sample((s + 1) * NS_PER_SEC + 100));
    // Just after second s ended: it is written, s + 1 (in progress) is held.
    w.flush_before((s + 1) * NS_PER_SEC + 30_000_000, s + 1).unwrap();
    let blocks = blocks_in(dir.path(), s * NS_PER_SEC);
    assert_eq!(blocks.iter().map(|b| (b.start_ns / NS_PER_SEC, b.samples)).collect::<Vec<_>>(), [(s, 1)]);
    assert_eq!(w.pending_samples(), 1);
    assert_eq!(w.oldest_pending_ns(), Some((s + 1) * NS_PER_SEC + 100));
    w.push(&sample((s + 1) * NS_PER_SEC + 900_000_000));
    w.flush_before((s + 2) * NS_PER_SEC + 30_000_000, s + 2).unwrap();
    let blocks = blocks_in(dir.path(), s * NS_PER_SEC);
    assert_eq!(
        blocks.iter().map(|b| (b.start_ns / NS_PER_SEC, b.samples)).collect::<Vec<_>>(),
        [(s, 1), (s + 1, 2)],
        "second s + 1 as one block"
    );
    assert_eq!(w.pending_samples(), 0);
}

/// Bytes copied are one number a row, however many (issue 38: a row a `u32` turned a flood of
/// 1 TiB copies into millions of rows held in memory).
#[test]
fn a_weight_past_32_bits_is_one_row_with_its_whole_count() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = StoreWriter::new(dir.path());
    let s = 1_800_000_000;
    w.push_weighted(&sample(s * NS_PER_SEC + 100), 5 << 40);
    assert_eq!(w.pending_samples(), 1);
    w.flush_before((s + 1) * NS_PER_SEC + 30_000_000, s + 1).unwrap();
    let file = fs::read(segment_path(dir.path(), s * NS_PER_SEC)).unwrap();
    let (_, block) = Blocks::new(&file).last().unwrap();
    let cols = crate::store::format::unpack_samples(block.samples, 1 << 20).unwrap();
    assert_eq!(cols.count, vec![5 << 40]);
}
