//! The cache of Python frame names: per (pid, code object), what the object says of itself
//! (read once from the process) and the names made of it so far, one per line the frame was
//! seen at. Within the Python pool of the memory budget.
//!
//! Why two tiers with their own bounds: a training node runs tens of thousands of code
//! objects × lines. When one table for both started over, the code objects went with the names
//! and were read again from the process (five `process_vm_readv` calls each): on the replay
//! bench's training node, half the daemon's CPU. Names are now dropped first (making one again
//! is a `format!`), code objects only when they alone fill their share of the pool.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::{
    code::{Code, read_code},
    layout::Layout,
    lines,
};
use crate::memory;

/// Code objects and names cached before that tier starts over (besides the byte bound).
const MAX_CODES: usize = 65_536;
const MAX_NAMES: usize = 262_144;
/// What a cached entry costs besides its strings and line table: map slot, `Code`, `Arc`.
const ENTRY_BYTES: u64 = 96;
const NAME_BYTES: u64 = 40;
/// Code objects' share of the Python pool, in percent: past it they start over; the names get
/// the rest, and what the code objects leave.
const CODES_SHARE: u64 = 60;

/// What a code object says of itself, and the names made of it.
struct Cached {
    code: Code,
    /// (line, `qualname (file:line)`): a frame runs a handful of lines, so a short list.
    named: Vec<(i64, Arc<str>)>,
}

impl Cached {
    fn bytes(&self) -> u64 {
        let c = &self.code;
        (c.name.len() + c.file.len() + c.lines.as_ref().map_or(0, |l| l.len())) as u64 + ENTRY_BYTES
    }
}

fn name_bytes(name: &str) -> u64 {
    name.len() as u64 + NAME_BYTES
}

/// `qualname (file:line)`, allocated once at its length (`format!` grew it several times: a
/// tenth of the daemon's CPU on the replay bench's training node, whose names are remade as
/// they pass their bound).
fn make_name(name: &str, file: &str, line: i64) -> Arc<str> {
    let mut digits = [0u8; 24];
    let mut at = digits.len();
    let mut n = line.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if line < 0 {
        at -= 1;
        digits[at] = b'-';
    }
    let digits = std::str::from_utf8(&digits[at..]).expect("ASCII digits");
    let mut s = String::with_capacity(name.len() + file.len() + digits.len() + 4);
    s.push_str(name);
    s.push_str(" (");
    s.push_str(file);
    s.push(':');
    s.push_str(digits);
    s.push(')');
    Arc::from(s)
}

#[derive(Default)]
pub struct PyNames {
    /// (pid, code object) → what it says. Fx: keys are addresses, hashed once per frame.
    codes: FxHashMap<(u32, u64), Cached>,
    code_bytes: u64,
    names: usize,
    name_bytes: u64,
}

impl PyNames {
    /// The frame's name: `qualname (file:line)`, at the line the frame is running (3.11+; the
    /// function's first line before that, or where the table says nothing). `instr` is the
    /// sampler's instruction address, 0 when it sent none.
    pub fn name(&mut self, pid: u32, layout: &Layout, code: u64, instr: u64) -> Arc<str> {
        if !self.codes.contains_key(&(pid, code)) {
            // Not cached when unreadable: the object may be readable next time (or was freed).
            let Some(c) = read_code(pid, layout, code) else { return Arc::from("[python]") };
            self.add_code(pid, code, c);
        }
        let info = self.codes.get_mut(&(pid, code)).expect("cached above");
        let start = code.wrapping_add(layout.code_adaptive);
        let line = info
            .code
            .lines
            .as_deref()
            .filter(|_| instr >= start)
            .and_then(|t| lines::line_at(t, info.code.first_line, (instr - start) / 2))
            .unwrap_or(info.code.first_line);
        if let Some((_, n)) = info.named.iter().find(|(l, _)| *l == line) {
            return n.clone();
        }
        let name = make_name(&info.code.name, &info.code.file, line);
        let cost = name_bytes(&name);
        if self.names >= MAX_NAMES || !memory::PYTHON.fits_total(self.code_bytes + self.name_bytes + cost) {
            self.drop_names();
        }
        self.names += 1;
        self.name_bytes += cost;
        self.publish();
        if let Some(info) = self.codes.get_mut(&(pid, code)) {
            info.named.push((line, name.clone()));
        }
        name
    }

    fn add_code(&mut self, pid: u32, code: u64, c: Code) {
        let c = Cached { code: c, named: Vec::new() };
        let cost = c.bytes();
        let share = memory::PYTHON.limit() * CODES_SHARE / 100;
        if self.codes.len() >= MAX_CODES || self.code_bytes + cost > share {
            self.start_over(self.codes.len() >= MAX_CODES);
        } else if !memory::PYTHON.fits_total(self.code_bytes + self.name_bytes + cost) {
            self.drop_names();
        }
        self.code_bytes += cost;
        self.codes.insert((pid, code), c);
        self.publish();
    }

    /// Forgets the names made so far, keeping the code objects they are made of.
    fn drop_names(&mut self) {
        for c in self.codes.values_mut() {
            c.named = Vec::new();
        }
        self.names = 0;
        self.name_bytes = 0;
        self.publish();
    }

    /// Forgets everything (read again as samples need it); `by_count`: the count bound, else
    /// the byte budget, was reached (counted as a refusal of the pool).
    fn start_over(&mut self, by_count: bool) {
        if !by_count {
            memory::PYTHON.note_refused();
        }
        self.codes.clear();
        self.code_bytes = 0;
        self.names = 0;
        self.name_bytes = 0;
        self.publish();
    }

    fn publish(&self) {
        memory::PYTHON.set_used(self.code_bytes + self.name_bytes);
    }

    /// Drops everything (the daemon's memory passed its budget).
    pub fn shed(&mut self) {
        self.start_over(true);
    }

    /// Forgets the code objects and names of processes no longer known.
    pub fn retain(&mut self, live: impl Fn(u32) -> bool) {
        self.codes.retain(|(pid, _), _| live(*pid));
        self.code_bytes = self.codes.values().map(Cached::bytes).sum();
        self.names = self.codes.values().map(|c| c.named.len()).sum();
        self.name_bytes = self.codes.values().flat_map(|c| c.named.iter()).map(|(_, n)| name_bytes(n)).sum();
        self.publish();
    }

    /// Code objects and names cached now.
    #[cfg(test)]
    pub(super) fn len(&self) -> (usize, usize) {
        (self.codes.len(), self.names)
    }

    /// Puts a code object in the cache as if read from `pid` (tests: no process to read).
    #[cfg(test)]
    pub(super) fn insert(&mut self, pid: u32, code: u64, c: Code) {
        self.add_code(pid, code, c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CODE: u64 = 0x7f00_0000_1000;

    fn cached(table: Option<Vec<u8>>) -> PyNames {
        let mut n = PyNames::default();
        n.insert(1, CODE, Code { name: "Model.forward".into(), file: "/srv/m.py".into(), first_line: 2, lines: table });
        n
    }

    /// An address no process of ours holds: were the code object read again, the frame would
    /// come back `[python]`.
    #[test]
    fn names_go_before_the_code_objects_they_are_made_of() {
        let layout = crate::interpreter::python::layout::of(11).expect("3.11");
        let mut n = cached(None);
        let first = n.name(1, layout, CODE, 0);
        assert_eq!(&*first, "Model.forward (/srv/m.py:2)");
        assert!(Arc::ptr_eq(&first, &n.name(1, layout, CODE, 0)), "made once");
        n.drop_names();
        assert_eq!(n.len(), (1, 0));
        assert_eq!(&*n.name(1, layout, CODE, 0), "Model.forward (/srv/m.py:2)", "named without a read");
        assert_eq!(n.len(), (1, 1));
    }

    #[test]
    fn a_name_is_what_format_makes() {
        for line in [0, 7, 10, 99, 12_345, -1, -40, i64::MAX, i64::MIN] {
            assert_eq!(&*make_name("A.f", "/x.py", line), format!("A.f (/x.py:{line})"));
        }
    }

    #[test]
    fn one_name_per_line_and_the_instruction_picks_the_line() {
        let layout = crate::interpreter::python::layout::of(11).expect("3.11");
        // Two entries of one code unit each: line 2 (no change), then line 3 (+1).
        let mut n = cached(Some(vec![0x80 | (10 << 3), 0, 0, 0x80 | (11 << 3), 0, 0]));
        let start = CODE + layout.code_adaptive;
        assert_eq!(&*n.name(1, layout, CODE, start), "Model.forward (/srv/m.py:2)");
        assert_eq!(&*n.name(1, layout, CODE, start + 2), "Model.forward (/srv/m.py:3)");
        assert_eq!(&*n.name(1, layout, CODE, start + 2), "Model.forward (/srv/m.py:3)");
        assert_eq!(&*n.name(1, layout, CODE, 0), "Model.forward (/srv/m.py:2)", "before the code: first line");
        assert_eq!(n.len(), (1, 2));
        n.retain(|pid| pid != 1);
        assert_eq!(n.len(), (0, 0));
    }
}
