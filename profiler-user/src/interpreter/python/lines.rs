//! The line a CPython frame is at, from its code object's line table, decoded once per code
//! object into runs of code units at one line. 3.11+'s location table (`co_linetable`, format
//! in CPython's `Objects/locations.md`) here: entries of one start byte (`1 code:4 length-1:3`,
//! length in 2-byte code units) and a few varints; the line moves by a delta at each entry.
//! The older versions' tables: `legacy_lines`.

use super::{layout::LineFormat, legacy_lines};

/// A code object's lines, decoded once when it is read: runs of code units at one line, as
/// (end unit, exclusive; line, or [`NO_LINE`]). A frame is named by a binary search; decoding
/// the table at every frame was a tenth of the daemon's CPU on the replay bench's Python node.
#[derive(Hash, PartialEq, Eq)]
pub struct Lines(Box<[(u32, i32)]>);

/// A run of code units the table gives no location (or a line past `i32`).
pub(super) const NO_LINE: i32 = i32::MIN;

impl Lines {
    /// The runs of `table`, a table in `format`, up to where it ends or stops making sense (a
    /// table we do not understand names the units after that point by the function's first
    /// line).
    pub fn decode(format: LineFormat, table: &[u8], first_line: i64) -> Self {
        match format {
            LineFormat::Locations => Self::locations(table, first_line),
            LineFormat::Lnotab => legacy_lines::lnotab(table, first_line),
            LineFormat::Pairs => legacy_lines::pairs(table, first_line),
        }
    }

    /// Runs of units, as (end unit, exclusive; line, or [`NO_LINE`]), in order.
    pub(super) fn from_runs(runs: Vec<(u32, i32)>) -> Self {
        Self(runs.into_boxed_slice())
    }

    fn locations(table: &[u8], first_line: i64) -> Self {
        let mut runs: Vec<(u32, i32)> = Vec::new();
        let mut r = Reader { table, at: 0 };
        let (mut line, mut end) = (first_line, 0u32);
        while let Some(entry) = r.entry(&mut line) {
            let (here, len) = entry;
            let here = here.and_then(|l| i32::try_from(l).ok()).filter(|&l| l != NO_LINE).unwrap_or(NO_LINE);
            let Some(next) = end.checked_add(len) else { break };
            end = next;
            push_run(&mut runs, end, here);
        }
        Self(runs.into_boxed_slice())
    }

    /// The line of the code unit `unit` (its byte offset / 2), or `None` when the table gives
    /// it no location or ends first.
    pub fn at(&self, unit: u64) -> Option<i64> {
        let i = self.0.partition_point(|&(end, _)| u64::from(end) <= unit);
        let &(_, line) = self.0.get(i)?;
        (line != NO_LINE).then_some(i64::from(line))
    }

    /// Bytes it holds.
    pub fn bytes(&self) -> usize {
        self.0.len() * std::mem::size_of::<(u32, i32)>()
    }
}

/// Adds the units up to `end` at `line` (a line past `i32` as none), merged into the last run
/// when it is at the same line.
pub(super) fn push_run(runs: &mut Vec<(u32, i32)>, end: u32, line: i32) {
    match runs.last_mut() {
        Some(last) if last.1 == line => last.0 = end,
        _ => runs.push((end, line)),
    }
}

struct Reader<'a> {
    table: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    /// The next entry: its line (`None`: no location) and its length in code units; `None` at
    /// the table's end or where it stops making sense. `line` moves by the entry's delta.
    fn entry(&mut self, line: &mut i64) -> Option<(Option<i64>, u32)> {
        let b = self.byte()?;
        if b & 0x80 == 0 {
            return None; // not at an entry's start: a table we do not understand
        }
        let (code, len) = ((b >> 3) & 15, u32::from(b & 7) + 1);
        let here = match code {
            15 => None,
            14 => {
                *line = line.checked_add(self.svarint()?)?;
                self.varint()?; // end line
                self.varint()?; // column
                self.varint()?; // end column
                Some(*line)
            }
            13 => {
                *line = line.checked_add(self.svarint()?)?;
                Some(*line)
            }
            10..=12 => {
                *line = line.checked_add(i64::from(code - 10))?;
                self.byte()?;
                self.byte()?;
                Some(*line)
            }
            _ => {
                self.byte()?;
                Some(*line)
            }
        };
        Some((here, len))
    }

    fn byte(&mut self) -> Option<u8> {
        let b = *self.table.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    /// Six bits per byte, least significant first; bit 6 says another byte follows.
    fn varint(&mut self) -> Option<u64> {
        let mut b = self.byte()?;
        let mut v = u64::from(b & 63);
        let mut shift = 0;
        while b & 64 != 0 {
            b = self.byte()?;
            shift += 6;
            if shift > 60 {
                return None;
            }
            v |= u64::from(b & 63) << shift;
        }
        Some(v)
    }

    fn svarint(&mut self) -> Option<i64> {
        let v = self.varint()?;
        let magnitude = (v >> 1) as i64;
        Some(if v & 1 == 1 { -magnitude } else { magnitude })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line_at(table: &[u8], first_line: i64, unit: u64) -> Option<i64> {
        Lines::decode(LineFormat::Locations, table, first_line).at(unit)
    }

    /// `co_linetable` and `co_lines()` of a small function, from CPython 3.11.7:
    /// def f(x):            # line 2
    ///     total = 0
    ///     for i in range(x):
    ///         if i % 3 == 0:
    ///             total += i
    ///         else:
    ///             total -= 1
    ///     return total
    const TABLE: [u8; 68] = [
        128, 0, 216, 12, 13, 128, 69, 221, 13, 18, 144, 49, 137, 88, 140, 88, 240, 0, 4, 5, 23, 240, 0, 4, 5, 23, 136,
        1, 216, 11, 12, 136, 113, 137, 53, 144, 65, 138, 58, 136, 58, 216, 12, 17, 144, 81, 137, 74, 136, 69, 136, 69,
        224, 12, 17, 144, 81, 137, 74, 136, 69, 136, 69, 216, 11, 16, 128, 76,
    ];
    /// (start byte, end byte, line) as `co_lines()` gives them.
    const LINES: [(u64, u64, i64); 12] = [
        (0, 2, 2),
        (2, 6, 3),
        (6, 20, 4),
        (20, 40, 4),
        (40, 44, 5),
        (44, 58, 5),
        (58, 62, 6),
        (62, 70, 6),
        (70, 74, 8),
        (74, 82, 8),
        (82, 84, 9),
        (84, 86, 9),
    ];

    #[test]
    fn every_code_unit_gets_the_line_cpython_gives_it() {
        for (start, end, line) in LINES {
            for byte in (start..end).step_by(2) {
                assert_eq!(line_at(&TABLE, 2, byte / 2), Some(line), "byte {byte}");
            }
        }
        assert_eq!(line_at(&TABLE, 2, 43), None, "past the end");
        // One run per line change: 2, 3, 4, 5, 6, 8, 9.
        assert_eq!(Lines::decode(LineFormat::Locations, &TABLE, 2).bytes(), 7 * 8, "runs of one line are merged");
    }

    #[test]
    fn a_truncated_or_garbled_table_gives_no_line_and_never_panics() {
        for cut in 0..TABLE.len() {
            for unit in [0, 5, 20, 42] {
                let _ = line_at(&TABLE[..cut], 2, unit);
            }
        }
        assert_eq!(line_at(&[0x05, 0x80], 1, 0), None);
        assert_eq!(
            line_at(&[0xf0 | 0x7, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], 1, 0),
            None
        );
    }
}
