//! The format's round trips, bounds and checks.

use super::*;

fn segment_with(blocks: &[Vec<u8>]) -> Vec<u8> {
    let mut file = SegmentHeader { version: FORMAT_VERSION, start_ns: 0 }.encode().to_vec();
    for b in blocks {
        file.extend(b);
    }
    file
}

fn block(a: &[u8], b: &[u8], c: &[u8]) -> Vec<u8> {
    encode_block(&BlockHeader { start_ns: 1, end_ns: 2, samples: 3, idle: 4, ..Default::default() }, a, b, c)
}

#[test]
fn summaries_without_softirq_counts_still_read() {
    let cpus = vec![CpuCounts { cpu: 1, busy: 5, kernel: 2, idle: 3, lost: 0 }];
    let old = pack(&SummaryV4 { cpus: cpus.clone(), buckets: vec![1, 2] });
    let read = unpack_summary(&old).unwrap();
    assert_eq!(read, Summary { cpus: cpus.clone(), buckets: vec![1, 2], softirq: Vec::new() });
    let new = Summary { cpus, buckets: vec![], softirq: vec![(1, 4)] };
    let read = unpack_summary(&pack(&new)).unwrap();
    assert_eq!((read.softirq(1), read.softirq(0)), (4, 0));
    assert_eq!(read, new);
    assert!(unpack_summary(b"not zstd").is_err());
}

#[test]
fn blocks_round_trip_and_torn_tail_is_incomplete() {
    let file = segment_with(&[block(b"d", b"su", b"sam"), block(b"", b"x", b"")]);
    let mut it = Blocks::new(&file);
    let (h, s) = it.next().unwrap();
    assert_eq!((s.dict, s.summary, s.samples), (&b"d"[..], &b"su"[..], &b"sam"[..]));
    assert_eq!((h.samples, h.idle, h.dict_len), (3, 4, 1));
    assert_eq!(it.next().unwrap().1.summary, b"x");
    assert!(it.next().is_none());
    assert_eq!(it.tail(), Some(&Tail::Clean));

    let boundary = SEGMENT_HEADER_LEN + BLOCK_HEADER_LEN + 6;
    for cut in SEGMENT_HEADER_LEN + 1..file.len() {
        let mut it = Blocks::new(&file[..cut]);
        assert_eq!(it.by_ref().count(), usize::from(cut >= boundary));
        let want = if cut == boundary {
            Tail::Clean
        } else {
            Tail::Incomplete { offset: if cut < boundary { 24 } else { boundary } }
        };
        assert_eq!(it.tail(), Some(&want), "cut {cut}");
    }
}

#[test]
fn any_flipped_byte_is_detected() {
    let file = segment_with(&[block(b"dict", b"summary", b"samples")]);
    for i in SEGMENT_HEADER_LEN..file.len() {
        let mut bad = file.clone();
        bad[i] ^= 0x40;
        let mut it = Blocks::new(&bad);
        assert_eq!(it.by_ref().count(), 0, "byte {i} flipped still decoded");
        assert!(it.tail().is_some_and(|t| *t != Tail::Clean));
    }
}

/// Crafted sections cannot make a reader allocate beyond what the header announces, and a
/// chain of a million nodes does not fold into a million-frame stack.
#[test]
fn crafted_sections_are_bounded_by_their_header() {
    let huge = SampleColumns { cpu: vec![0; 1_000_000], ..Default::default() };
    let packed = pack(&huge);
    assert!(packed.len() < 64 << 10, "compresses well: {}", packed.len());
    let h = BlockHeader { samples: 1, ..Default::default() };
    assert!(unpack_bounded::<SampleColumns>(&packed, samples_bound(&h)).is_err());
    let h = BlockHeader { samples: 1_000_000, ..Default::default() };
    assert!(unpack_bounded::<SampleColumns>(&packed, samples_bound(&h)).is_ok());
    let mut dict = Dict::default();
    let n = 100_000;
    let chain = DictDelta { strings: vec!["f".into()], parent_delta: vec![1; n], frame: vec![0; n] };
    dict.apply(&BlockHeader::default(), &pack(&chain)).unwrap();
    let mut frames = Vec::new();
    dict.frames(n as u32, &mut frames);
    assert_eq!(frames.len(), MAX_STACK_FRAMES);
}

#[test]
fn segment_header_checks() {
    let h = SegmentHeader { version: FORMAT_VERSION, start_ns: 42 };
    assert_eq!(SegmentHeader::decode(&h.encode()).unwrap(), h);
    assert!(matches!(SegmentHeader::decode(b"short"), Err(FormatError::Short)));
    let mut v9 = h.encode();
    v9[8] = 9;
    assert!(matches!(SegmentHeader::decode(&v9), Err(FormatError::Version(9))));
    let mut bad = h.encode();
    bad[0] = b'X';
    assert!(matches!(SegmentHeader::decode(&bad), Err(FormatError::BadMagic)));
}

#[test]
fn dictionary_and_columns_are_validated() {
    let mut dict = Dict::default();
    let h = BlockHeader::default();
    // main -> spin_[k]: nodes 1 and 2.
    let delta = DictDelta { strings: vec!["main".into(), "spin".into()], parent_delta: vec![1, 1], frame: vec![0, 3] };
    dict.apply(&h, &pack(&delta)).unwrap();
    let mut frames = Vec::new();
    dict.frames(2, &mut frames);
    assert_eq!(frames, vec![(0, false), (1, true)]);
    for dangling in [
        DictDelta { strings: vec![], parent_delta: vec![1], frame: vec![10] },
        DictDelta { strings: vec![], parent_delta: vec![9], frame: vec![0] },
        DictDelta { strings: vec![], parent_delta: vec![0], frame: vec![0] },
    ] {
        assert!(matches!(dict.apply(&h, &pack(&dangling)), Err(FormatError::DanglingId)), "{dangling:?}");
    }
    let reset = BlockHeader { flags: FLAG_RESET_DICT, ..h };
    dict.apply(&reset, &pack(&DictDelta::default())).unwrap();
    assert!(dict.strings.is_empty() && dict.nodes.len() == 1);

    let cols = SampleColumns {
        ts_delta_us: vec![5, 10, 7],
        cpu: vec![0, 0, 1],
        pid: vec![1; 3],
        tid: vec![1; 3],
        comm: vec![0; 3],
        cgroup: vec![0; 3],
        stack: vec![0; 3],
        count: vec![],
        workload: vec![],
    };
    cols.validate(1, 1).unwrap();
    assert_eq!(cols.timestamps(1000).collect::<Vec<_>>(), vec![6000, 16000, 8000]);
    assert!(cols.validate(0, 1).is_err());
    let short = SampleColumns { pid: vec![1], ..cols.clone() };
    assert!(short.validate(1, 1).is_err());
    assert_eq!(unpack::<SampleColumns>(&pack(&cols)).unwrap(), cols);
    assert!(unpack::<SampleColumns>(b"not zstd").is_err());
}

#[test]
fn blocks_written_before_the_workload_column_read_without_workloads() {
    let old = SampleColumnsV4 {
        ts_delta_us: vec![1, 2],
        cpu: vec![0, 1],
        pid: vec![5, 6],
        tid: vec![5, 6],
        comm: vec![0, 0],
        cgroup: vec![9, 9],
        stack: vec![1, 1],
        count: vec![],
    };
    let cols = unpack_samples(&pack(&old), 1 << 20).unwrap();
    assert_eq!((cols.pid, cols.cgroup, cols.workload), (vec![5, 6], vec![9, 9], vec![]));
    let new = SampleColumns { workload: vec![3, 4], ..cols_of(&old) };
    assert_eq!(unpack_samples(&pack(&new), 1 << 20).unwrap().workload, vec![3, 4]);
}

fn cols_of(v: &SampleColumnsV4) -> SampleColumns {
    SampleColumns {
        ts_delta_us: v.ts_delta_us.clone(),
        cpu: v.cpu.clone(),
        pid: v.pid.clone(),
        tid: v.tid.clone(),
        comm: v.comm.clone(),
        cgroup: v.cgroup.clone(),
        stack: v.stack.clone(),
        count: v.count.clone(),
        workload: vec![],
    }
}

/// The count column as blocks wrote it while it was 32-bit.
#[derive(serde::Serialize)]
struct SampleColumnsU32Count {
    ts_delta_us: Vec<u64>,
    cpu: Vec<u32>,
    pid: Vec<u32>,
    tid: Vec<u32>,
    comm: Vec<StrId>,
    cgroup: Vec<u64>,
    stack: Vec<u32>,
    count: Vec<u32>,
    workload: Vec<StrId>,
}

#[test]
fn counts_written_as_32_bits_read_the_same_and_a_count_past_them_is_one_row() {
    let old = SampleColumnsU32Count {
        ts_delta_us: vec![1, 2],
        cpu: vec![0, 1],
        pid: vec![5, 6],
        tid: vec![5, 6],
        comm: vec![0, 0],
        cgroup: vec![9, 9],
        stack: vec![1, 1],
        count: vec![7, u32::MAX],
        workload: vec![],
    };
    let cols = unpack_samples(&pack(&old), 1 << 20).unwrap();
    assert_eq!(cols.count, vec![7, u64::from(u32::MAX)]);
    // 5 TiB copied from one stack in a second: one row, its count a number.
    let big = SampleColumns { count: vec![5 << 40, 1], ..cols };
    assert_eq!(unpack_samples(&pack(&big), 1 << 20).unwrap().count, vec![5 << 40, 1]);
}
