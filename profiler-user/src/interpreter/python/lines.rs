//! The line a CPython 3.11+ frame is at, from its code object's location table
//! (`co_linetable`, format in CPython's `Objects/locations.md`): entries of one start byte
//! (`1 code:4 length-1:3`, length in 2-byte code units) and a few varints; the line moves by a
//! delta at each entry.

/// The line of the code unit `unit` (its byte offset / 2), or `None` when the table gives it
/// no location or ends first.
pub fn line_at(table: &[u8], first_line: i64, unit: u64) -> Option<i64> {
    let mut r = Reader { table, at: 0 };
    let (mut line, mut start) = (first_line, 0u64);
    while let Some(b) = r.byte() {
        if b & 0x80 == 0 {
            return None; // not at an entry's start: a table we do not understand
        }
        let (code, len) = ((b >> 3) & 15, u64::from(b & 7) + 1);
        let here = match code {
            15 => None,
            14 => {
                line = line.checked_add(r.svarint()?)?;
                r.varint()?; // end line
                r.varint()?; // column
                r.varint()?; // end column
                Some(line)
            }
            13 => {
                line = line.checked_add(r.svarint()?)?;
                Some(line)
            }
            10..=12 => {
                line = line.checked_add(i64::from(code - 10))?;
                r.byte()?;
                r.byte()?;
                Some(line)
            }
            _ => {
                r.byte()?;
                Some(line)
            }
        };
        if unit < start + len {
            return here;
        }
        start += len;
    }
    None
}

struct Reader<'a> {
    table: &'a [u8],
    at: usize,
}

impl Reader<'_> {
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
