use profiler_common::unwind::{Row, kind};

use super::*;
use crate::unwind::table::Load;

#[derive(Default)]
struct Fake {
    rows: Vec<u32>,
    rules: Vec<profiler_common::unwind::Rule>,
    processes: HashMap<u32, ProcessTable>,
    /// Processes the kernel's table holds, as a BPF hash map of that size (0: unbounded).
    max_processes: usize,
}

impl Tables for Fake {
    fn capacity(&self) -> usize {
        self.rows.len()
    }
    fn write_rows(&mut self, start: usize, rows: &[u32]) -> bool {
        self.rows[start..start + rows.len()].copy_from_slice(rows);
        true
    }
    fn set_rule(&mut self, index: u16, rule: &profiler_common::unwind::Rule) -> bool {
        if self.rules.len() <= index as usize {
            self.rules.resize(index as usize + 1, Default::default());
        }
        self.rules[index as usize] = *rule;
        true
    }
    fn set_process(&mut self, pid: u32, table: &ProcessTable) -> Result<(), String> {
        if self.max_processes > 0 && !self.processes.contains_key(&pid) && self.processes.len() >= self.max_processes {
            return Err("Argument list too long (os error 7)".into());
        }
        self.processes.insert(pid, *table);
        Ok(())
    }
    fn remove_process(&mut self, pid: u32) {
        self.processes.remove(&pid);
    }
    fn set_python(&mut self, _: u32, _: Option<&profiler_common::python::PyProc>) {}
}

/// Words a one-page table takes beyond its rows: its page index (`packed`).
const W: usize = 2;

fn registry(capacity: usize) -> Registry<Fake> {
    Registry::new(Fake { rows: vec![0; capacity], ..Default::default() })
}

fn key(ino: u64) -> FileKey {
    FileKey { dev: 1, ino, size: 100, mtime_ns: 0, owner: 0 }
}

/// A table of `n` rows whose file is loaded at vaddr 0x1000 from offset 0x1000.
fn table(n: usize, tag: u16) -> Table {
    Table {
        base: 0x1000,
        rows: (0..n).map(|i| Row { pc: i as u32 * 4, cfa_offset: tag, kind: kind::CFA_SP, fp_offset: 0 }).collect(),
        loads: vec![Load { offset: 0x1000, vaddr: 0x1000, size: 0x10000, exec: true }],
    }
}

fn mapping(ino: u64, start: u64) -> MappedFile {
    MappedFile { start, end: start + 0x10000, offset: 0x1000, key: key(ino), preferred: false }
}

#[test]
fn one_table_serves_every_process_mapping_the_file() {
    let mut r = registry(100);
    let mut compiled = 0;
    let mut compile = |_: &MappedFile, _| {
        compiled += 1;
        Build::Done(Ok(table(10, 7)))
    };
    r.set_process(1, &[mapping(5, 0x7000_0000)], &mut compile).unwrap();
    r.set_process(2, &[mapping(5, 0x5000_0000)], &mut compile).unwrap();
    assert_eq!(compiled, 1);
    let (a, b) = (r.kernel().processes[&1].mappings[0], r.kernel().processes[&2].mappings[0]);
    assert_eq!((a.table_start, a.table_len), (b.table_start, b.table_len));
    // The row key of the mapping's first byte is the file's vaddr 0x1000 minus the table base.
    assert_eq!(0x7000_0000 - a.bias, 0);
    assert_eq!(0x5000_0000 - b.bias, 0);
    assert_eq!(r.stats(), Stats { tables: 1, rows: 10 + W as u64, processes: 2, ..Default::default() });
}

#[test]
fn a_table_that_does_not_fit_is_counted_and_walked_with_frame_pointers() {
    let mut r = registry(25);
    r.set_process(1, &[mapping(1, 0x1000_0000)], |_, _| Build::Done(Ok(table(20, 1)))).unwrap();
    r.set_process(2, &[mapping(2, 0x2000_0000)], |_, _| Build::Done(Ok(table(20, 2)))).unwrap();
    assert_eq!(r.kernel().processes[&2].len, 0, "no place in the description: frame pointers");
    assert_eq!(r.stats().did_not_fit, 1);
}

#[test]
fn tables_nobody_uses_make_room_least_recently_used_first() {
    let mut r = registry(3 * (10 + W));
    r.set_process(1, &[mapping(1, 0x1000_0000)], |_, _| Build::Done(Ok(table(10, 1)))).unwrap();
    r.set_process(2, &[mapping(2, 0x2000_0000)], |_, _| Build::Done(Ok(table(10, 2)))).unwrap();
    r.set_process(3, &[mapping(3, 0x3000_0000)], |_, _| Build::Done(Ok(table(10, 3)))).unwrap();
    r.remove_process(1);
    r.remove_process(2);
    assert!(!r.kernel().processes.contains_key(&1));
    // 15 rows: needs both freed ranges, which merge.
    r.set_process(4, &[mapping(4, 0x4000_0000)], |_, _| Build::Done(Ok(table(15, 4)))).unwrap();
    let m = r.kernel().processes[&4].mappings[0];
    assert_eq!((m.table_start, m.table_len), (0, 15));
    let k = r.kernel();
    let rule = |w: &u32| k.rules[profiler_common::unwind::packed::rule(*w) as usize].cfa_offset;
    assert!(k.rows[..15].iter().all(|w| rule(w) == 4));
    assert!(k.rows[2 * (10 + W)..][..10].iter().all(|w| rule(w) == 3), "the used table is untouched");
    assert_eq!(r.stats().tables, 2);
}

#[test]
fn a_file_without_frame_information_is_tried_once() {
    let mut r = registry(10);
    let mut tries = 0;
    for pid in 1..4 {
        r.set_process(pid, &[mapping(9, 0x1000_0000)], |_, _| {
            tries += 1;
            Build::Done(Err(TableError::NoCfi))
        })
        .unwrap();
    }
    assert_eq!(tries, 1);
    assert_eq!(r.stats().without, 1);
}

#[test]
fn mappings_are_sorted_and_bounded() {
    let mut r = registry(1000);
    let maps: Vec<_> = (0..MAX_MAPPINGS as u64 + 50).rev().map(|i| mapping(i, 0x1000_0000 + i * 0x10000)).collect();
    r.set_process(1, &maps, |_, _| Build::Done(Ok(table(1, 0)))).unwrap();
    let t = &r.kernel().processes[&1];
    assert_eq!(t.len as usize, MAX_MAPPINGS);
    assert!(t.mappings.windows(2).all(|w| w[0].start < w[1].start));
    assert_eq!(r.stats().mappings_left_out, 50);
}

#[test]
fn over_the_bound_the_executable_and_the_loaders_libraries_are_kept() {
    let mut r = registry(10_000);
    // The executable lowest, libc at the top, 300 files with tables mapped later below it.
    let exe = MappedFile { preferred: true, ..mapping(1, 0x5000_0000) };
    let libc = mapping(2, 0x7f00_0000_0000);
    let later: Vec<MappedFile> = (0..300u64).map(|i| mapping(100 + i, 0x7e00_0000_0000 + i * 0x10_0000)).collect();
    let mut all = vec![exe, libc];
    all.extend(later.iter().cloned());
    // And 1,000 data files below them all, past the bound: checked, not counted.
    all.extend((0..1_000u64).map(|i| mapping(10_000 + i, 0x10_0000_0000 + i * 0x10_0000)));
    let mut built = Vec::new();
    r.set_process(1, &all, |m, queue| {
        if m.key.ino >= 10_000 {
            return Build::Done(Err(TableError::Refused("not ELF".into())));
        }
        if !queue {
            return Build::Checked;
        }
        built.push(m.key.ino);
        Build::Done(Ok(table(2, 0)))
    })
    .unwrap();
    assert_eq!(built.len(), MAX_MAPPINGS, "past the bound, files are checked, not built");
    let t = &r.kernel().processes[&1];
    assert_eq!(t.len as usize, MAX_MAPPINGS);
    assert!(t.mappings.iter().all(|m| m.table_len == 2));
    let described = |start: u64| t.mappings.iter().any(|m| m.start == start);
    assert!(described(0x5000_0000) && described(0x7f00_0000_0000), "the executable and libc");
    assert!(described(later[299].start) && !described(later[0].start), "the last mapped are left out");
    assert_eq!(r.stats().mappings_left_out, 302 - MAX_MAPPINGS as u64);
    // Described again with the same mappings: the count stays (it is not a running total).
    r.set_process(1, &all, |_, _| panic!("built or checked already")).unwrap();
    assert_eq!(r.stats().mappings_left_out, 302 - MAX_MAPPINGS as u64);
    r.remove_process(1);
    assert_eq!(r.stats().mappings_left_out, 0);
}

#[test]
fn mappings_without_tables_take_no_place_and_are_looked_at_once() {
    // 10,000 data files mapped executable between the executable and libc.
    let mut r = registry(1000);
    let mut all = vec![MappedFile { preferred: true, ..mapping(1, 0x5000_0000) }, mapping(2, 0x7f00_0000_0000)];
    all.extend((0..10_000u64).map(|i| mapping(1000 + i, 0x6000_0000 + i * 0x10_0000)));
    let mut looked_at = 0;
    for pid in [1, 1, 2] {
        r.set_process(pid, &all, |m, _| {
            looked_at += 1;
            Build::Done(if m.key.ino < 1000 { Ok(table(3, 0)) } else { Err(TableError::Refused("not ELF".into())) })
        })
        .unwrap();
    }
    assert_eq!(looked_at, 10_002, "each file once");
    let t = &r.kernel().processes[&2];
    let described: Vec<(u64, u32)> = t.mappings[..t.len as usize].iter().map(|m| (m.start, m.table_len)).collect();
    assert_eq!(described, [(0x5000_0000, 3), (0x7f00_0000_0000, 3)]);
    assert_eq!((r.stats().mappings_left_out, r.stats().without), (0, 10_000));
}

#[test]
fn files_without_tables_are_forgotten_past_their_bound() {
    let mut r = registry(10);
    let many: Vec<MappedFile> =
        (0..MAX_FILES_WITHOUT as u64 + 1).map(|i| mapping(i + 1, 0x1000_0000 + i * 0x10_0000)).collect();
    let refuse = |_: &MappedFile, _| Build::Done(Err(TableError::Refused("not ELF".into())));
    r.set_process(1, &many, refuse).unwrap();
    assert_eq!(r.stats().without, MAX_FILES_WITHOUT as u64 + 1);
    r.set_process(2, &many[..1], refuse).unwrap();
    assert_eq!(r.stats().without, 1, "forgotten, then the one described looked at again");
}

#[test]
fn this_process_is_described_with_tables() {
    let read = crate::symbolize::maps::read(std::process::id(), None);
    let mut mapped = Vec::new();
    for m in read.maps.iter().filter(|m| m.is_file()) {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(&*m.path).unwrap();
        let key =
            FileKey { dev: meta.dev(), ino: meta.ino(), size: meta.size(), mtime_ns: meta.mtime(), owner: meta.uid() };
        mapped
            .push((MappedFile { start: m.start, end: m.end, offset: m.offset, key, preferred: false }, m.path.clone()));
    }
    let mut r = registry(4 << 20);
    let files: Vec<_> = mapped.iter().map(|(m, _)| m.clone()).collect();
    r.set_process(1, &files, |m, _| {
        let path = &mapped.iter().find(|(x, _)| x.start == m.start).unwrap().1;
        Build::Done(crate::unwind::table::compile(&*std::fs::read(&**path).unwrap()))
    })
    .unwrap();
    let t = &r.kernel().processes[&1];
    for (m, (_, path)) in t.mappings[..t.len as usize].iter().zip(&mapped) {
        eprintln!("{path} {:x} len {}", m.start, m.table_len);
    }
    assert!(t.mappings[..t.len as usize].iter().all(|m| m.table_len > 0));
}

#[test]
fn a_file_that_could_not_be_read_now_is_tried_again() {
    let mut r = registry(100);
    r.set_process(1, &[mapping(7, 0x1000_0000)], |_, _| Build::Done(Err(TableError::Unreadable("gone".into()))))
        .unwrap();
    let m = r.kernel().processes[&1].mappings[0];
    assert_eq!((m.start, m.table_len), (0x1000_0000, 0), "keeps its place, without a table for now");
    r.set_process(2, &[mapping(7, 0x1000_0000)], |_, _| Build::Done(Ok(table(10, 1)))).unwrap();
    assert_eq!(r.kernel().processes[&2].mappings[0].table_len, 10);
}

#[test]
fn a_table_built_elsewhere_reaches_the_processes_that_wait_for_it() {
    let mut r = registry(100);
    r.set_process(1, &[mapping(3, 0x1000_0000)], |_, _| Build::Queued).unwrap();
    r.set_process(2, &[mapping(3, 0x2000_0000)], |_, _| panic!("queued once")).unwrap();
    assert_eq!(r.kernel().processes[&1].mappings[0].table_len, 0, "frame pointers meanwhile");
    r.remove_process(2);
    r.built(key(3), Ok(table(10, 1)));
    // Patched into the waiting process's description, without describing it again.
    let m = r.kernel().processes[&1].mappings[0];
    assert_eq!((m.start, m.table_len, 0x1000_0000 - m.bias), (0x1000_0000, 10, 0));
    assert!(!r.kernel().processes.contains_key(&2));
    r.set_process(1, &[mapping(3, 0x1000_0000)], |_, _| panic!("built already")).unwrap();
    assert_eq!(r.kernel().processes[&1].mappings[0].table_len, 10);
    r.built(key(3), Ok(table(10, 2)));
    assert_eq!(r.stats().tables, 1, "a result nobody asked for is ignored");
    assert_eq!(r.allocate(95, 0), None, "a table in use is not evicted");
    r.remove_process(1);
    assert_eq!(r.allocate(95, 0), Some(0), "its one user gone, it is");
}

#[test]
fn a_description_opens_a_bounded_number_of_new_files_the_first_in_rank() {
    let mut r = registry(1000);
    let mut all = vec![MappedFile { preferred: true, ..mapping(1, 0x5000_0000) }, mapping(2, 0x7f00_0000_0000)];
    all.extend((0..100u64).map(|i| mapping(1000 + i, 0x6000_0000 + i * 0x10_0000)));
    let mut looked_at = Vec::new();
    let unchecked = r
        .set_process_within(1, &all, 2, |m, _| {
            looked_at.push(m.key.ino);
            Build::Done(Ok(table(3, 0)))
        })
        .unwrap();
    assert_eq!((looked_at, unchecked), (vec![1, 2], 100), "the executable, then the highest address");
    assert_eq!(r.kernel().processes[&1].len, 2);
    let unchecked = r.set_process_within(1, &all, usize::MAX, |_, _| Build::Done(Ok(table(3, 0)))).unwrap();
    assert_eq!((unchecked, r.kernel().processes[&1].len), (0, 102));
}

#[test]
fn what_a_cut_read_missed_is_taken_from_the_last_description() {
    let mut r = registry(1000);
    let all = [mapping(1, 0x5000_0000), mapping(2, 0x7e00_0000_0000), mapping(3, 0x7f00_0000_0000)];
    r.set_process(1, &all, |_, _| Build::Done(Ok(table(3, 0)))).unwrap();
    let kept = r.described_from(1, 0x7e00_0000_0000);
    let kept: Vec<(u64, u64, FileKey)> = kept.iter().map(|m| (m.start, m.offset, m.key)).collect();
    assert_eq!(kept, [(0x7e00_0000_0000, 0x1000, key(2)), (0x7f00_0000_0000, 0x1000, key(3))]);
    assert!(r.described_from(2, 0).is_empty());
}

#[test]
fn a_full_process_table_makes_room_by_evicting_the_least_recently_sampled() {
    let mut r = Registry::new(Fake { rows: vec![0; 1000], max_processes: 3, ..Default::default() });
    let mut compile = |_: &MappedFile, _| Build::Done(Ok(table(10, 7)));
    for pid in 1..=3 {
        r.set_process(pid, &[mapping(5, 0x7000_0000)], &mut compile).unwrap();
    }
    // 1 and 3 keep running; 2 sleeps.
    r.touch(1);
    r.touch(3);
    r.set_process(4, &[mapping(5, 0x7000_0000)], &mut compile).unwrap();
    let mut held: Vec<u32> = r.kernel().processes.keys().copied().collect();
    held.sort();
    assert_eq!(held, [1, 3, 4], "the sleeper gave up its place");
    assert!(!r.is_known(2));
    let s = r.stats();
    assert_eq!((s.processes_evicted, s.processes_refused, s.processes), (1, 0, 3));
}

#[test]
fn a_running_program_keeps_its_place_while_new_sleepers_are_described_again_and_again() {
    let mut r = Registry::new(Fake { rows: vec![0; 1000], max_processes: 3, ..Default::default() });
    let mut compile = |_: &MappedFile, _| Build::Done(Ok(table(10, 7)));
    r.set_process(1, &[mapping(5, 0x7000_0000)], &mut compile).unwrap();
    r.touch(1);
    // Root's program is described again (its maps re-read) and stays sampled.
    r.set_process(1, &[mapping(5, 0x7000_0000)], &mut compile).unwrap();
    // A user's sleepers: each described at its exec and again after it, never sampled.
    for round in 0..3 {
        for pid in 10..20 {
            r.set_process(pid, &[mapping(5, 0x7000_0000)], &mut compile).unwrap();
            assert!(r.is_known(1), "root's running program lost its place to sleeper {pid} (round {round})");
        }
    }
    assert!(r.kernel().processes.contains_key(&1));
    assert!(r.stats().processes_evicted > 0);
    // A program sampled before its description (its exec still queued) counts as sampled.
    r.touch(2);
    r.set_process(2, &[mapping(5, 0x7000_0000)], &mut compile).unwrap();
    for pid in 20..30 {
        r.set_process(pid, &[mapping(5, 0x7000_0000)], &mut compile).unwrap();
    }
    assert!(r.is_known(1) && r.is_known(2), "a sampled program lost its place to a sleeper");
    // Once it exited, its pid's next process starts unsampled.
    r.exited(2);
    r.set_process(2, &[mapping(5, 0x7000_0000)], &mut compile).unwrap();
    for pid in 30..32 {
        r.set_process(pid, &[mapping(5, 0x7000_0000)], &mut compile).unwrap();
    }
    assert!(!r.is_known(2), "a new process under an exited one's pid inherited its place");
}

#[test]
fn tables_of_processes_not_sampled_for_a_while_give_way_to_a_running_programs() {
    let mut r = registry(100);
    // Three sleepers, each with a table of 30 rows of its own: 90 of 100 rows.
    for pid in 1..=3u32 {
        let mut compile = |_: &MappedFile, _| Build::Done(Ok(table(30, pid as u16)));
        r.set_process(pid, &[mapping(u64::from(pid), 0x7000_0000)], &mut compile).unwrap();
    }
    assert_eq!(r.stats().rows, 3 * (30 + W as u64));
    // Recent sleepers keep their tables: the new one does not fit.
    let mut compile = |_: &MappedFile, _| Build::Done(Ok(table(30, 9)));
    r.set_process(4, &[mapping(4, 0x7000_0000)], &mut compile).unwrap();
    assert_eq!(r.stats().did_not_fit, 1);
    r.remove_process(4);
    // Once not sampled for a while, the least recently used table's process gives way.
    for pid in 1..=3 {
        r.age(pid, STALE * 2);
    }
    r.touch(3);
    let mut compile = |_: &MappedFile, _| Build::Done(Ok(table(30, 9)));
    r.set_process(5, &[mapping(5, 0x7000_0000)], &mut compile).unwrap();
    assert!(r.is_known(5) && r.is_known(3) && r.is_known(2));
    assert!(!r.is_known(1), "the least recently used table's process gave way");
    assert_eq!(r.stats().did_not_fit, 1);
    let described = r.kernel().processes[&5];
    assert!(described.mappings[..described.len as usize].iter().any(|m| m.table_len == 30));
}

fn owned(ino: u64, owner: u32) -> MappedFile {
    MappedFile { key: FileKey { owner, ..key(ino) }, ..mapping(ino, 0x7000_0000) }
}

#[test]
fn one_owners_busy_processes_take_free_rows_but_give_way_past_their_share() {
    let mut r = registry(100);
    // A user's three running programs, each with a library of its own: 90 of 100 rows, taken
    // while nobody else needed them.
    for pid in 1..=3u32 {
        let mut compile = |_: &MappedFile, _| Build::Done(Ok(table(30, pid as u16)));
        r.set_process(pid, &[owned(u64::from(pid), 1000)], &mut compile).unwrap();
        r.touch(pid);
    }
    assert_eq!((r.stats().rows, r.stats().did_not_fit), (3 * (30 + W as u64), 0));
    // The same user's fourth does not push its own tables out.
    let mut compile = |_: &MappedFile, _| Build::Done(Ok(table(30, 4)));
    r.set_process(4, &[owned(4, 1000)], &mut compile).unwrap();
    assert_eq!(r.stats().did_not_fit, 1);
    r.remove_process(4);
    r.touch(2);
    r.touch(3);
    // Root's new program: the user's least recently used table gives way, and only that one
    // (the user is then back to 60 rows, and root's 30 fit beside them).
    let mut compile = |_: &MappedFile, _| Build::Done(Ok(table(30, 9)));
    r.set_process(5, &[owned(5, 0)], &mut compile).unwrap();
    assert!(!r.is_known(1), "the user's least recently sampled program gave way");
    assert!(r.is_known(2) && r.is_known(3) && r.is_known(5));
    let s = r.stats();
    assert_eq!((s.rows, s.did_not_fit, s.processes_evicted), (3 * (30 + W as u64), 1, 1));
    let described = r.kernel().processes[&5];
    assert!(described.mappings[..described.len as usize].iter().any(|m| m.table_len == 30));
    // Another table of root's: the user holds 60 of 100 rows, past its share, and gives way
    // again.
    let mut compile = |_: &MappedFile, _| Build::Done(Ok(table(30, 10)));
    r.set_process(6, &[owned(6, 0)], &mut compile).unwrap();
    assert!(r.is_known(6) && r.is_known(5) && !r.is_known(2));
    assert_eq!((r.stats().rows, r.stats().did_not_fit), (3 * (30 + W as u64), 1));
    // The share works both ways, but only where it makes room: root's 60 rows are 10 past its
    // share, which with 10 free rows cannot hold the user's 50; nothing of root's is evicted
    // for nothing.
    let mut compile = |_: &MappedFile, _| Build::Done(Ok(table(50, 11)));
    r.set_process(7, &[owned(7, 1000)], &mut compile).unwrap();
    assert!(r.is_known(5) && r.is_known(6));
    assert_eq!(r.stats().did_not_fit, 2);
}
