//! The frames dictionary: `frames` holds each frame's text once fleet-wide, keyed by a 64-bit
//! id of the text, and `stack_frames` each stack as the ids of its frames (and its kernel
//! flags). A training fleet's Python stacks repeat the same frames across thousands of stacks:
//! as text, a fleet flamegraph fetched ~10 KB per stack (1.2-1.5 GB read per shard, hundreds of
//! MB sent; BENCHMARKS.md, issue 39); as ids, 8 bytes a frame, then each distinct frame once.
//! A node sends a frame only once (what it sent is remembered, what its shard has is asked),
//! as it sends stacks.

use std::collections::HashSet;

use super::binary::{put_len, put_str};

/// The id of a frame: XXH3-64 of its text (the name as stacks hold it). The same frame has the
/// same id on every node and in every run. Two names that collide would show one name for the
/// other; at 64 bits, a fleet's millions of distinct frames make that a ~1e-7 chance.
pub fn frame_id(name: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(name.as_bytes())
}

/// What this run has sent (or is sending in the batch being built): stack ids and frame ids.
#[derive(Debug, Default)]
pub struct Shipped {
    pub stacks: HashSet<u64>,
    pub frames: HashSet<u64>,
}

impl Shipped {
    pub fn clear(&mut self) {
        self.stacks.clear();
        self.frames.clear();
    }
}

/// The `frames` rows of one batch (RowBinary: `frame_id UInt64, name String`): the frames its
/// new stacks name that this run had not sent.
#[derive(Debug, Default)]
pub struct NewFrames {
    rows: Vec<(u64, String)>,
}

impl NewFrames {
    /// The id of `name`, its row added when `shipped` does not hold it yet.
    pub fn add(&mut self, name: &str, shipped: &mut HashSet<u64>) -> u64 {
        let id = frame_id(name);
        if shipped.insert(id) {
            self.rows.push((id, name.to_string()));
        }
        id
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.rows.iter().map(|r| r.0)
    }

    /// Leaves out the frames in `known` (the server has them: another node of its shard sent
    /// them).
    pub fn drop_known(&mut self, known: &HashSet<u64>) {
        self.rows.retain(|r| !known.contains(&r.0));
    }

    /// Bytes of the frames' text (what `frames` grows by, before compression).
    pub fn text_bytes(&self) -> usize {
        self.rows.iter().map(|r| r.1.len()).sum()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::with_capacity(self.rows.iter().map(|r| r.1.len() + 10).sum());
        for (id, name) in &self.rows {
            o.extend_from_slice(&id.to_le_bytes());
            put_str(&mut o, name);
        }
        o
    }
}

/// A `stack_frames` row (RowBinary: `stack_id UInt64, frame_ids Array(UInt64), kernel
/// Array(UInt8)`), the frames new to this run added to `frames`.
pub fn stack_row(
    out: &mut Vec<u8>,
    id: u64,
    stack: &[(&str, bool)],
    frames: &mut NewFrames,
    shipped: &mut HashSet<u64>,
) {
    out.extend_from_slice(&id.to_le_bytes());
    put_len(out, stack.len());
    for (name, _) in stack {
        out.extend_from_slice(&frames.add(name, shipped).to_le_bytes());
    }
    put_len(out, stack.len());
    out.extend(stack.iter().map(|(_, k)| u8::from(*k)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_sent_once_and_a_stack_is_its_frames_ids() {
        let (mut frames, mut shipped, mut out) = (NewFrames::default(), HashSet::new(), Vec::new());
        let stack = [("main", false), ("work", false), ("main", false), ("read_zero", true)];
        stack_row(&mut out, 7, &stack, &mut frames, &mut shipped);
        assert_eq!(frames.len(), 3, "main once");
        let mut expect = 7u64.to_le_bytes().to_vec();
        expect.push(4);
        for n in ["main", "work", "main", "read_zero"] {
            expect.extend_from_slice(&frame_id(n).to_le_bytes());
        }
        expect.extend_from_slice(&[4, 0, 0, 0, 1]);
        assert_eq!(out, expect);
        // A second stack through the same frames adds none.
        stack_row(&mut Vec::new(), 8, &stack[..2], &mut frames, &mut shipped);
        assert_eq!(frames.len(), 3);
        let rows = frames.encode();
        assert_eq!(&rows[..8], frame_id("main").to_le_bytes());
        assert_eq!(&rows[8..13], b"\x04main");
        assert_eq!(rows.len(), 3 * 8 + 5 + 5 + 10);
        assert_eq!(frames.text_bytes(), 4 + 4 + 9);
        frames.drop_known(&HashSet::from([frame_id("work")]));
        assert_eq!(frames.ids().collect::<Vec<_>>(), [frame_id("main"), frame_id("read_zero")]);
    }

    #[test]
    fn frame_ids_are_of_the_text_alone() {
        assert_eq!(frame_id("a"), frame_id("a"));
        assert_ne!(frame_id("a"), frame_id("b"));
        assert_ne!(frame_id("ab"), frame_id("a"));
    }
}
