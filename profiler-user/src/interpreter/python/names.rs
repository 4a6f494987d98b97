//! The cache of Python frame names: per (pid, code object), what the object says of itself
//! (read once from the process) and the names made of it so far, one per line the frame was
//! seen at. Within the Python pool of the memory budget.
//!
//! Why two tiers with their own bounds: a training node runs tens of thousands of code
//! objects × lines. When one table for both started over, the code objects went with the names
//! and were read again from the process (five `process_vm_readv` calls each): on the replay
//! bench's training node, half the daemon's CPU. Names are now dropped first (making one again
//! is a `format!`), code objects only when they alone fill their share of the pool.
//!
//! Why entries are shared: a training script's DataLoader workers are forks of it, and
//! processes started from one program read the same files, so the same code object (name,
//! file, line table) is in every one of them. One entry per content, and one `Arc` per name,
//! hold what seven processes would otherwise hold seven times; the store's dictionary and the
//! stack cache then find a frame's name by its pointer.

use std::sync::Arc;

use std::hash::BuildHasher;

use rustc_hash::{FxBuildHasher, FxHashMap, FxHashSet};

use super::{
    code::{Code, read_code},
    layout::Layout,
    lines::Lines,
};
use crate::memory;

/// Code objects and names cached before that tier starts over (besides the byte bound).
const MAX_CODES: usize = 65_536;
const MAX_NAMES: usize = 262_144;
/// What an entry costs besides its strings and line table: its slot, `Code`, list.
const ENTRY_BYTES: u64 = 96;
/// A (pid, code object) that leads to an entry: its map slot.
const KEY_BYTES: u64 = 32;
/// A distinct name: its `Arc` header and its slot in the interning set.
const NAME_BYTES: u64 = 40;
/// An entry's reference to one of its names: (line, `Arc`).
const SLOT_BYTES: u64 = 24;
/// Code objects' share of the Python pool, in percent: past it they start over; the names get
/// the rest, and what the code objects leave.
const CODES_SHARE: u64 = 60;

/// What a code object says of itself, and the names made of it.
struct Cached {
    code: Code,
    /// (line, `qualname (file:line)`): a frame runs a handful of lines, so a short list.
    named: Vec<(i64, Arc<str>)>,
    /// The (pid, code object) keys that lead here, and the hash of `code` (`by_content`).
    users: u32,
    content: u64,
}

impl Cached {
    /// The line the frame at code unit `unit` runs (`None`: not started, the function's line).
    fn line_at(&self, unit: Option<u64>) -> i64 {
        let c = &self.code;
        unit.and_then(|u| c.lines.as_ref()?.at(u)).unwrap_or(c.first_line)
    }

    fn bytes(&self) -> u64 {
        entry_bytes(&self.code)
    }
}

/// What an entry for `c` costs.
fn entry_bytes(c: &Code) -> u64 {
    (c.name.len() + c.file.len() + c.lines.as_ref().map_or(0, Lines::bytes)) as u64 + ENTRY_BYTES
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
    /// (pid, code object) → its entry. Fx: keys are addresses, hashed once per frame.
    codes: FxHashMap<(u32, u64), u32>,
    /// One per content (`None`: free, listed in `free`).
    entries: Vec<Option<Cached>>,
    free: Vec<u32>,
    /// An entry by the hash of its code object (compared whole before it is shared).
    by_content: FxHashMap<u64, u32>,
    /// Every name made, by its text: one `Arc` per name.
    interned: FxHashSet<Arc<str>>,
    code_bytes: u64,
    names: usize,
    name_bytes: u64,
}

impl PyNames {
    /// The frame's name: `qualname (file:line)`, at the line the frame is running (the
    /// function's first line where the table says nothing). `instr` is the sampler's
    /// instruction word without its flag (`Layout::unit`).
    pub fn name(&mut self, pid: u32, layout: &Layout, code: u64, instr: u64) -> Arc<str> {
        let unit = layout.unit(code, instr);
        let slot = match self.codes.get(&(pid, code)) {
            Some(&slot) => {
                let info = self.entry(slot);
                let line = info.line_at(unit);
                if let Some((_, n)) = info.named.iter().find(|(l, _)| *l == line) {
                    return n.clone();
                }
                slot
            }
            None => {
                // Not cached when unreadable: the object may be readable next time (or was freed).
                let Some(c) = read_code(pid, layout, code) else { return Arc::from("[python]") };
                self.add_code(pid, code, c)
            }
        };
        let info = self.entry(slot);
        let line = info.line_at(unit);
        let made = make_name(&info.code.name, &info.code.file, line);
        let name = match self.interned.get(&*made) {
            Some(shared) => shared.clone(),
            None => {
                let cost = name_bytes(&made);
                if self.names >= MAX_NAMES || !memory::PYTHON.fits_total(self.code_bytes + self.name_bytes + cost) {
                    self.drop_names();
                }
                self.names += 1;
                self.name_bytes += cost;
                self.interned.insert(made.clone());
                made
            }
        };
        self.name_bytes += SLOT_BYTES;
        self.publish();
        if let Some(Some(info)) = self.entries.get_mut(slot as usize) {
            info.named.push((line, name.clone()));
        }
        name
    }

    /// The name [`Self::name`] would hand out for this frame when it is made already; nothing
    /// changes (no count taken: see `CPython::name_frames`, which prefetches the counts).
    #[cfg(test)]
    pub fn cached(&self, pid: u32, layout: &Layout, code: u64, instr: u64) -> Option<&Arc<str>> {
        self.cached_all(pid, layout, &[(code, instr, false)]).pop().flatten()
    }

    /// The names [`Self::name`] would hand out, made already, for each of a stack's frames
    /// (`(code, instr, _)`, as `merge::frames` gives them), in stages: the entries, then the
    /// lines, then the names. Each frame's look-up is a chain of cache misses (map, entry, line
    /// table, names); frame after frame, each chain waited for the one before (11 % of the
    /// daemon's CPU per Python sample), where stage by stage the misses of a whole stack overlap.
    pub fn cached_all(&self, pid: u32, layout: &Layout, frames: &[(u64, u64, bool)]) -> Vec<Option<&Arc<str>>> {
        let entries: Vec<Option<&Cached>> =
            frames.iter().map(|&(code, _, _)| self.codes.get(&(pid, code)).map(|&slot| self.entry(slot))).collect();
        let lines: Vec<Option<i64>> = entries
            .iter()
            .zip(frames)
            .map(|(e, &(code, instr, _))| e.map(|info| info.line_at(layout.unit(code, instr))))
            .collect();
        entries
            .iter()
            .zip(lines)
            .map(|(e, line)| {
                let (info, line) = ((*e)?, line?);
                info.named.iter().find(|(l, _)| *l == line).map(|(_, n)| n)
            })
            .collect()
    }

    fn entry(&self, slot: u32) -> &Cached {
        self.entries[slot as usize].as_ref().expect("a key leads to a live entry")
    }

    /// Caches what `code` of `pid` says, sharing the entry of the same content; its slot.
    fn add_code(&mut self, pid: u32, code: u64, c: Code) -> u32 {
        let content = FxBuildHasher.hash_one(&c);
        let same = self.by_content.get(&content).copied().filter(|&s| self.entry(s).code == c);
        let cost = KEY_BYTES + if same.is_some() { 0 } else { entry_bytes(&c) };
        let share = memory::PYTHON.limit() * CODES_SHARE / 100;
        let same = if self.codes.len() >= MAX_CODES || self.code_bytes + cost > share {
            self.start_over(self.codes.len() >= MAX_CODES);
            None
        } else {
            if !memory::PYTHON.fits_total(self.code_bytes + self.name_bytes + cost) {
                self.drop_names();
            }
            same
        };
        let slot = match same {
            Some(slot) => {
                self.code_bytes += KEY_BYTES;
                slot
            }
            None => {
                let entry = Cached { code: c, named: Vec::new(), users: 0, content };
                self.code_bytes += KEY_BYTES + entry.bytes();
                let slot = match self.free.pop() {
                    Some(slot) => {
                        self.entries[slot as usize] = Some(entry);
                        slot
                    }
                    None => {
                        self.entries.push(Some(entry));
                        self.entries.len() as u32 - 1
                    }
                };
                self.by_content.entry(content).or_insert(slot);
                slot
            }
        };
        if let Some(Some(e)) = self.entries.get_mut(slot as usize) {
            e.users += 1;
        }
        self.codes.insert((pid, code), slot);
        self.publish();
        slot
    }

    /// Forgets the names made so far, keeping the code objects they are made of.
    fn drop_names(&mut self) {
        for c in self.entries.iter_mut().flatten() {
            c.named = Vec::new();
        }
        self.interned = FxHashSet::default();
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
        *self = Self::default();
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
        let (entries, free, by_content) = (&mut self.entries, &mut self.free, &mut self.by_content);
        let before = self.codes.len();
        self.codes.retain(|&(pid, _), &mut slot| {
            if live(pid) {
                return true;
            }
            if let Some(e) = entries[slot as usize].as_mut() {
                e.users -= 1;
                if e.users == 0 {
                    if by_content.get(&e.content) == Some(&slot) {
                        by_content.remove(&e.content);
                    }
                    entries[slot as usize] = None;
                    free.push(slot);
                }
            }
            false
        });
        // Every live process kept: nothing to recount. (The recount hashes every name's text:
        // run at each sweep, it was a tenth of the daemon's CPU on a Python training node.)
        if self.codes.len() != before {
            self.recount();
        }
    }

    /// Counts the interned names and the bytes again from the entries (the names of the
    /// entries just freed leave the interning set).
    fn recount(&mut self) {
        let live_entries = || self.entries.iter().flatten();
        self.code_bytes = live_entries().map(Cached::bytes).sum::<u64>() + self.codes.len() as u64 * KEY_BYTES;
        self.interned = live_entries().flat_map(|c| c.named.iter()).map(|(_, n)| n.clone()).collect();
        self.names = self.interned.len();
        let slots: usize = live_entries().map(|c| c.named.len()).sum();
        self.name_bytes = self.interned.iter().map(|n| name_bytes(n)).sum::<u64>() + slots as u64 * SLOT_BYTES;
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
        let lines = table.map(|t| Lines::decode(crate::interpreter::python::layout::LineFormat::Locations, &t, 2));
        n.insert(1, CODE, Code { name: "Model.forward".into(), file: "/srv/m.py".into(), first_line: 2, lines });
        n
    }

    /// An address no process of ours holds: were the code object read again, the frame would
    /// come back `[python]`.
    #[test]
    fn names_go_before_the_code_objects_they_are_made_of() {
        let layout = crate::interpreter::python::layout::table(11).expect("3.11");
        let mut n = cached(None);
        let first = n.name(1, layout, CODE, 0);
        assert_eq!(&*first, "Model.forward (/srv/m.py:2)");
        assert!(Arc::ptr_eq(&first, &n.name(1, layout, CODE, 0)), "made once");
        n.drop_names();
        assert_eq!(n.len(), (1, 0));
        assert_eq!(&*n.name(1, layout, CODE, 0), "Model.forward (/srv/m.py:2)", "named without a read");
        assert_eq!(n.len(), (1, 1));
    }

    /// Forked workers run the same code: one entry and one `Arc` per name serve them all, and
    /// the entry lives as long as one of them does.
    #[test]
    fn processes_running_the_same_code_share_its_entry_and_its_names() {
        let layout = crate::interpreter::python::layout::table(11).expect("3.11");
        let code = |file: &str| Code { name: "Model.forward".into(), file: file.into(), first_line: 2, lines: None };
        let mut n = PyNames::default();
        for pid in 1..=7 {
            n.insert(pid, CODE + u64::from(pid), code("/srv/m.py"));
        }
        n.insert(8, CODE, code("/srv/other.py"));
        assert_eq!((n.codes.len(), n.entries.iter().flatten().count()), (8, 2), "one entry per content");
        let first = n.name(1, layout, CODE + 1, 0);
        for pid in 2..=7 {
            assert!(Arc::ptr_eq(&first, &n.name(pid, layout, CODE + u64::from(pid), 0)), "pid {pid} shares the name");
        }
        assert_eq!(&*n.name(8, layout, CODE, 0), "Model.forward (/srv/other.py:2)");
        assert_eq!(n.len(), (8, 2));
        // A sweep that keeps every process changes nothing, and counts kept as names were
        // made agree with counting them again.
        let counts = |n: &PyNames| (n.code_bytes, n.name_bytes, n.names, n.interned.len());
        let kept = counts(&n);
        n.retain(|_| true);
        assert_eq!(counts(&n), kept);
        n.recount();
        assert_eq!(counts(&n), kept, "the counts kept as names are made are the recount's");
        let shared_bytes = n.code_bytes;
        n.retain(|pid| pid != 1 && pid != 8);
        assert_eq!((n.codes.len(), n.entries.iter().flatten().count()), (6, 1));
        assert!(n.code_bytes < shared_bytes, "the other file's entry is freed");
        assert!(Arc::ptr_eq(&first, &n.name(7, layout, CODE + 7, 0)), "the name outlives the process that made it");
        n.retain(|_| false);
        assert_eq!((n.codes.len(), n.entries.iter().flatten().count(), n.code_bytes), (0, 0, 0));
        // A freed slot is taken again, and the content found again is a new entry.
        n.insert(9, CODE, code("/srv/m.py"));
        assert_eq!((n.entries.len(), n.free.len()), (2, 1));
        assert_eq!(&*n.name(9, layout, CODE, 0), "Model.forward (/srv/m.py:2)");
    }

    /// `cached` (the look-up `name_frames` prefetches by) finds what `name` made, the same
    /// `Arc`, and nothing it has not made yet.
    #[test]
    fn a_cached_name_is_the_one_made_and_only_once_made() {
        let layout = crate::interpreter::python::layout::table(11).expect("3.11");
        let mut n = cached(Some(vec![0x80 | (10 << 3), 0, 0, 0x80 | (11 << 3), 0, 0]));
        let start = CODE + layout.code_adaptive;
        assert!(n.cached(1, layout, CODE, start).is_none(), "not made yet");
        let made = n.name(1, layout, CODE, start);
        assert!(Arc::ptr_eq(n.cached(1, layout, CODE, start).expect("made"), &made));
        assert!(n.cached(1, layout, CODE, start + 2).is_none(), "another line: another name");
        assert!(n.cached(2, layout, CODE, start).is_none(), "another process");
        n.drop_names();
        assert!(n.cached(1, layout, CODE, start).is_none(), "dropped with the names");
    }

    #[test]
    fn a_name_is_what_format_makes() {
        for line in [0, 7, 10, 99, 12_345, -1, -40, i64::MAX, i64::MIN] {
            assert_eq!(&*make_name("A.f", "/x.py", line), format!("A.f (/x.py:{line})"));
        }
    }

    #[test]
    fn one_name_per_line_and_the_instruction_picks_the_line() {
        let layout = crate::interpreter::python::layout::table(11).expect("3.11");
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
