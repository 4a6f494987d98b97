//! Segments crafted to make a reader spend (issue 14 E11): a few hundred bytes on disk that
//! decompress to the deepest stack of the longest names. What a query makes of them is bounded
//! by the budget, whatever the file claims.

use super::*;
use crate::store::{
    Store,
    format::{
        BlockHeader, DictDelta, FLAG_RESET_DICT, FORMAT_VERSION, NS_PER_SEC, SampleColumns, SegmentHeader, Summary,
        encode_block, pack,
    },
    segment_path, segments_dir,
};

const T0: u64 = 1_795_000_000 * NS_PER_SEC;

/// One segment: a dictionary of `names` names of `name_len` bytes, each the frame of a chain of
/// `depth` nodes (the deepest stacks), and one sample on each leaf.
fn crafted(dir: &std::path::Path, names: usize, name_len: usize, depth: usize) -> u64 {
    let mut delta = DictDelta { strings: vec!["comm".into()], ..Default::default() };
    let mut leaves = Vec::new();
    for n in 0..names {
        delta.strings.push(format!("{n:08}{}", "x".repeat(name_len)));
        for d in 0..depth {
            // The chain's first node hangs off the empty stack (node 0), the others off the one
            // before: the delta is the node's id minus its parent's.
            let id = delta.frame.len() as u32 + 1;
            delta.parent_delta.push(if d == 0 { id } else { 1 });
            delta.frame.push((n as u32 + 1) * 2);
        }
        leaves.push(delta.frame.len() as u32);
    }
    let k = leaves.len();
    let cols = SampleColumns {
        ts_delta_us: vec![0; k],
        cpu: vec![0; k],
        pid: vec![1; k],
        tid: vec![1; k],
        comm: vec![0; k],
        cgroup: vec![0; k],
        stack: leaves,
        count: Vec::new(),
        workload: Vec::new(),
    };
    let header = BlockHeader {
        flags: FLAG_RESET_DICT,
        start_ns: T0,
        end_ns: T0 + NS_PER_SEC,
        samples: k as u32,
        ..Default::default()
    };
    let mut file = SegmentHeader { version: FORMAT_VERSION, start_ns: T0 }.encode().to_vec();
    file.extend(encode_block(&header, &pack(&delta), &pack(&Summary::default()), &pack(&cols)));
    std::fs::create_dir_all(segments_dir(dir)).unwrap();
    std::fs::write(segment_path(&segments_dir(dir), T0), &file).unwrap();
    file.len() as u64
}

#[test]
fn deep_stacks_of_long_names_stay_within_the_fold_budget() {
    let dir = tempfile::tempdir().unwrap();
    // 64 stacks 512 frames deep of 64 KiB names: 2 GiB of folded text if nothing stopped it.
    let bytes = crafted(dir.path(), 64, 64 << 10, 512);
    assert!(bytes < 64 << 10, "a small file: {bytes} bytes");
    let mut store = Store::open(dir.path()).unwrap();
    let w = Window::new(T0, T0 + NS_PER_SEC).unwrap();
    // Names are cut where the dictionary is read, before any query builds text from them:
    // uncut, a fold built 2 GiB of lines (for a minute) only to merge them into `[truncated]`.
    let mut longest_name = 0;
    store
        .scan(w.from_ns, w.to_ns, crate::store::reader::Need::Samples, &mut |b: crate::store::reader::BlockView<'_>| {
            longest_name = longest_name.max(b.dict.strings.iter().map(String::len).max().unwrap_or(0));
        })
        .unwrap();
    assert!(longest_name <= crate::store::format::MAX_NAME_BYTES, "a name of {longest_name} bytes was kept");
    let f = fold(&mut store, w, &Filter::default()).unwrap();
    // So no line grows past the deepest stack of the longest names a reader keeps.
    let longest = f.stacks.keys().map(String::len).max().unwrap();
    let bound = (crate::store::format::MAX_STACK_FRAMES + 1) * (crate::store::format::MAX_NAME_BYTES + 8);
    assert!(longest <= bound, "a folded line of {longest} bytes");
    assert!(f.stacks.keys().map(String::len).sum::<usize>() <= 2 * crate::budget::MAX_FOLDED_BYTES);
}
