//! Fuzzes the segment reader: whatever the bytes, reading a segment and folding its samples
//! must end in values or warnings, never a panic, a hang or an out-of-memory.
//!
//! The first byte picks how the rest is used:
//! - even: as a whole segment file (header, blocks, CRCs and all);
//! - odd: as three raw (uncompressed) sections, which the target compresses and wraps in a
//!   valid block, so the fuzzer reaches the decoders behind the CRC.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use profiler::{
    query::fold_line,
    store::{
        format::{BlockHeader, FORMAT_VERSION, SegmentHeader, encode_block},
        reader::{BlockView, Need, scan_segment},
    },
};

fn read(data: &[u8]) {
    let mut warnings = Vec::new();
    let mut visit = |b: BlockView<'_>| {
        if let Some(s) = b.samples {
            let _ = s.timestamps(b.header.start_ns).count();
            for i in 0..s.len() {
                let _ = fold_line(b.dict, s.comm[i], s.stack[i]);
                let _ = s.count(i);
            }
        }
    };
    if SegmentHeader::decode(data).is_ok() {
        scan_segment(Path::new("fuzz.seg"), data, 0, u64::MAX, Need::Samples, &mut visit, &mut warnings);
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else { return };
    if mode % 2 == 0 {
        read(rest);
        return;
    }
    // Three sections, split at two positions taken from the next two bytes.
    let [a, b, body @ ..] = rest else { return };
    let (i, j) = (usize::from(*a).min(body.len()), usize::from(*b).min(body.len()));
    let (i, j) = (i.min(j), i.max(j));
    let pack = |raw: &[u8]| zstd::bulk::compress(raw, 1).unwrap();
    let mut file = SegmentHeader { version: FORMAT_VERSION, start_ns: 0 }.encode().to_vec();
    let header = BlockHeader { flags: u32::from(mode >> 1) & 3, start_ns: 0, end_ns: 1_000_000_000, ..Default::default() };
    let block = encode_block(&header, &pack(&body[..i]), &pack(&body[i..j]), &pack(&body[j..]));
    file.extend_from_slice(&block);
    file.extend_from_slice(&block);
    read(&file);
});
