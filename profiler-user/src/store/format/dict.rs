//! The dictionary section of a block: the strings and stack nodes first used in it, as the
//! writer emits them ([`DictDelta`], [`NodeLocations`]), and the segment's dictionary a reader
//! rebuilds from them block by block ([`Dict`]), bounded against crafted input.

use serde::{Deserialize, Serialize};

use super::{
    BlockHeader, FLAG_RESET_DICT, FormatError, MAX_DECOMPRESSED, MAX_NAME_BYTES, MAX_STACK_FRAMES, StrId,
    decompress_bounded,
};

/// Stacks are nodes of a call tree (a trie of frames): node `i` is the stack of its parent
/// plus one frame. Node 0 is the empty stack, implicit in every dictionary; stored nodes count
/// from 1. Stacks that share a prefix share its nodes, which is most of a deep stack's bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DictDelta {
    pub strings: Vec<String>,
    /// Per new node: its id minus its parent's id (ids are assigned in order, so children
    /// created with their parent are 1 apart and compress well).
    pub parent_delta: Vec<u32>,
    /// Per new node: string id of its frame, times two, plus one for a kernel frame.
    pub frame: Vec<u32>,
}

/// Where the user frames of new nodes live (`model::Location`), in a dictionary section after
/// its [`DictDelta`]. Optional: readers that predate it stop after the delta and never see it,
/// and a section without it (written before it existed) has no locations.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLocations {
    /// Per new node: 0 when unknown (and for kernel frames), else the file's string id + 1.
    pub file: Vec<u32>,
    /// Per new node: the function's address in that file.
    pub addr: Vec<u64>,
}

/// A node's location as a reader holds it: the file's string id + 1 (0: unknown) and address.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeLocation {
    pub file: u32,
    pub addr: u64,
}

/// A stack node as a reader holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Node {
    pub parent: u32,
    pub frame: StrId,
    pub kernel: bool,
}

/// A dictionary section: its delta, then the nodes' locations when the writer recorded them.
pub fn unpack_dict(bytes: &[u8]) -> Result<(DictDelta, NodeLocations), FormatError> {
    let raw = decompress_bounded(bytes, MAX_DECOMPRESSED)?;
    let bad = |e: postcard::Error| FormatError::Section(e.to_string());
    let (delta, rest) = postcard::take_from_bytes::<DictDelta>(&raw).map_err(bad)?;
    let locations = if rest.is_empty() { NodeLocations::default() } else { postcard::from_bytes(rest).map_err(bad)? };
    Ok((delta, locations))
}

/// A segment's dictionary as a reader rebuilds it block by block.
#[derive(Debug)]
pub struct Dict {
    pub strings: Vec<String>,
    /// Stack nodes; `nodes[0]` is the empty stack.
    pub nodes: Vec<Node>,
    /// Per node, where its frame lives; may be shorter than `nodes` (unknown past its end).
    pub locations: Vec<NodeLocation>,
}

impl Default for Dict {
    fn default() -> Self {
        Self {
            strings: Vec::new(),
            nodes: vec![Node { parent: 0, frame: 0, kernel: false }],
            locations: vec![NodeLocation::default()],
        }
    }
}

impl Dict {
    /// Applies a block's dictionary section.
    pub fn apply(&mut self, header: &BlockHeader, section: &[u8]) -> Result<(), FormatError> {
        if header.flags & FLAG_RESET_DICT != 0 {
            *self = Self::default();
        }
        let (delta, locations) = unpack_dict(section)?;
        if delta.parent_delta.len() != delta.frame.len() {
            return Err(FormatError::Section("node columns differ in length".into()));
        }
        let located = !locations.file.is_empty();
        if located && (locations.file.len() != delta.frame.len() || locations.addr.len() != delta.frame.len()) {
            return Err(FormatError::Section("location columns differ in length from the nodes".into()));
        }
        let strings = self.strings.len() + delta.strings.len();
        self.strings.extend(delta.strings.into_iter().map(|s| crate::untrusted::cut(s, MAX_NAME_BYTES)));
        self.nodes.reserve(delta.frame.len());
        for (&d, &f) in delta.parent_delta.iter().zip(&delta.frame) {
            let id = self.nodes.len() as u32;
            if d == 0 || d > id || (f / 2) as usize >= strings {
                return Err(FormatError::DanglingId);
            }
            self.nodes.push(Node { parent: id - d, frame: f / 2, kernel: f % 2 == 1 });
        }
        if located {
            self.locations.resize(self.nodes.len() - delta.frame.len(), NodeLocation::default());
            for (&file, &addr) in locations.file.iter().zip(&locations.addr) {
                if file as usize > strings {
                    return Err(FormatError::DanglingId);
                }
                self.locations.push(NodeLocation { file, addr });
            }
        }
        Ok(())
    }

    /// The locations of a stack node's frames, root first, as [`Self::frames`] lists them.
    pub fn locations(&self, node: u32, out: &mut Vec<NodeLocation>) {
        out.clear();
        let mut n = node as usize;
        while n != 0 && n < self.nodes.len() && out.len() < MAX_STACK_FRAMES {
            out.push(self.locations.get(n).copied().unwrap_or_default());
            n = self.nodes[n].parent as usize;
        }
        out.reverse();
    }

    /// The file of a location, or "" when unknown.
    pub fn file(&self, l: NodeLocation) -> &str {
        l.file.checked_sub(1).and_then(|i| self.strings.get(i as usize)).map_or("", String::as_str)
    }

    /// The frames of a stack node, root first, with their kernel flags.
    pub fn frames(&self, node: u32, out: &mut Vec<(StrId, bool)>) {
        out.clear();
        let mut n = node as usize;
        while n != 0 && n < self.nodes.len() && out.len() < MAX_STACK_FRAMES {
            let node = self.nodes[n];
            out.push((node.frame, node.kernel));
            n = node.parent as usize;
        }
        out.reverse();
    }
}
