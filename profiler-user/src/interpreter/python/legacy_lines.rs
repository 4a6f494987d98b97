//! The line tables of CPython before 3.11, into the same runs of code units as 3.11+'s
//! (`lines`). A frame object keeps `f_lasti`, the instruction it ran last: a byte offset in
//! 3.9, an instruction index in 3.10 (`Layout::unit` makes either a code unit).
//!
//! - 3.9's `co_lnotab` (`Objects/lnotab_notes.txt`): pairs (unsigned byte offset delta, signed
//!   line delta); the line of an offset is the first line plus the deltas of every pair whose
//!   offset is at or before it (`PyCode_Addr2Line`).
//! - 3.10's `co_linetable` (PEP 626): pairs (unsigned byte length, signed line delta, -128: no
//!   line), each a range of bytes at the line so far (`PyLineTable_NextAddressRange`).

use super::lines::{Lines, NO_LINE, push_run};

/// A line as a run holds it (past `i32`: no line).
fn line32(line: i64) -> i32 {
    i32::try_from(line).ok().filter(|&l| l != NO_LINE).unwrap_or(NO_LINE)
}

/// A byte offset as the end of a run of code units (an odd one ends mid-instruction: only the
/// 255-byte steps of a long jump in the table do, before the pair that moves the line).
fn units(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(2)).unwrap_or(u32::MAX)
}

/// 3.9's `co_lnotab`.
pub(super) fn lnotab(table: &[u8], first_line: i64) -> Lines {
    let mut runs = Vec::new();
    let (mut at, mut line) = (0u64, first_line);
    for pair in table.chunks_exact(2) {
        let next = at + u64::from(pair[0]);
        if next > at {
            push_run(&mut runs, units(next), line32(line));
        }
        at = next;
        line = line.saturating_add(i64::from(pair[1] as i8));
    }
    // The last line runs to the end of the code.
    push_run(&mut runs, u32::MAX, line32(line));
    Lines::from_runs(runs)
}

/// 3.10's `co_linetable`.
pub(super) fn pairs(table: &[u8], first_line: i64) -> Lines {
    let mut runs = Vec::new();
    let (mut at, mut line) = (0u64, first_line);
    for pair in table.chunks_exact(2) {
        let delta = pair[1] as i8;
        let here = if delta == -128 {
            NO_LINE
        } else {
            line = line.saturating_add(i64::from(delta));
            line32(line)
        };
        let next = at + u64::from(pair[0]);
        if next > at {
            push_run(&mut runs, units(next), here);
        }
        at = next;
    }
    Lines::from_runs(runs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interpreter::python::layout::LineFormat;

    // The function of `lines`' test, compiled by bullseye's 3.9.2 and jammy's 3.10.4
    // (`co_lnotab`, `co_linetable`, and where each says lines start):
    // def f(x):            # line 2
    //     total = 0
    //     for i in range(x):
    //         if i % 3 == 0:
    //             total += i
    //         else:
    //             total -= 1
    //     return total
    const LNOTAB_39: [u8; 12] = [0, 1, 4, 1, 12, 1, 12, 1, 10, 2, 10, 1];
    /// `dis.findlinestarts` of 3.9.2: (byte offset, line); 52 bytes of code.
    const STARTS_39: [(u64, i64); 6] = [(0, 3), (4, 4), (16, 5), (28, 6), (38, 8), (48, 9)];
    const LINETABLE_310: [u8; 12] = [4, 1, 12, 1, 12, 1, 10, 1, 10, 2, 4, 1];
    /// `co_lines()` of 3.10.4: (start byte, end byte, line).
    const LINES_310: [(u64, u64, i64); 6] = [(0, 4, 3), (4, 16, 4), (16, 28, 5), (28, 38, 6), (38, 48, 8), (48, 52, 9)];

    #[test]
    fn every_instruction_of_39_gets_the_line_cpython_gives_it() {
        let lines = Lines::decode(LineFormat::Lnotab, &LNOTAB_39, 2);
        for byte in (0..52u64).step_by(2) {
            let want = STARTS_39.iter().rev().find(|(at, _)| *at <= byte).expect("a start").1;
            assert_eq!(lines.at(byte / 2), Some(want), "byte {byte}");
        }
    }

    #[test]
    fn every_instruction_of_310_gets_the_line_cpython_gives_it() {
        let lines = Lines::decode(LineFormat::Pairs, &LINETABLE_310, 2);
        for (start, end, line) in LINES_310 {
            for byte in (start..end).step_by(2) {
                assert_eq!(lines.at(byte / 2), Some(line), "byte {byte}");
            }
        }
        assert_eq!(lines.at(26), None, "past the end");
        // -128: no line for that range; the line goes on from where it was.
        let lines = pairs(&[2, 1, 2, 0x80, 2, 1], 10);
        assert_eq!((lines.at(0), lines.at(1), lines.at(2)), (Some(11), None, Some(12)));
    }

    #[test]
    fn long_jumps_and_garbled_tables_never_panic() {
        // A 300-byte stretch at one line: (255, 0), (45, +1).
        let lines = lnotab(&[255, 0, 45, 1], 1);
        assert_eq!((lines.at(0), lines.at(149), lines.at(150)), (Some(1), Some(1), Some(2)));
        for table in [&[][..], &[7], &[255; 9], &[0, 0x80, 0, 0x80, 0, 0x80]] {
            for unit in [0, 1, 1000] {
                let _ = lnotab(table, i64::MAX).at(unit);
                let _ = pairs(table, i64::MIN).at(unit);
            }
        }
    }
}
