use profiler_common::unwind::{Row, kind};

use super::*;
use crate::unwind::table::Load;

#[derive(Default)]
struct Fake {
    rows: Vec<Row>,
    processes: HashMap<u32, ProcessTable>,
}

impl Tables for Fake {
    fn capacity(&self) -> usize {
        self.rows.len()
    }
    fn write_rows(&mut self, start: usize, rows: &[Row]) -> bool {
        self.rows[start..start + rows.len()].copy_from_slice(rows);
        true
    }
    fn set_process(&mut self, pid: u32, table: &ProcessTable) -> Result<(), String> {
        self.processes.insert(pid, *table);
        Ok(())
    }
    fn remove_process(&mut self, pid: u32) {
        self.processes.remove(&pid);
    }
    fn set_python(&mut self, _: u32, _: Option<&profiler_common::python::PyProc>) {}
}

fn registry(capacity: usize) -> Registry<Fake> {
    Registry::new(Fake { rows: vec![Row::default(); capacity], ..Default::default() })
}

fn key(ino: u64) -> FileKey {
    FileKey { dev: 1, ino, size: 100, mtime_ns: 0 }
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
    MappedFile { start, end: start + 0x10000, offset: 0x1000, key: key(ino) }
}

#[test]
fn one_table_serves_every_process_mapping_the_file() {
    let mut r = registry(100);
    let mut compiled = 0;
    let mut compile = |_: &MappedFile| {
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
    assert_eq!(r.stats(), Stats { tables: 1, rows: 10, processes: 2, without: 0, did_not_fit: 0 });
}

#[test]
fn a_table_that_does_not_fit_is_counted_and_walked_with_frame_pointers() {
    let mut r = registry(25);
    r.set_process(1, &[mapping(1, 0x1000_0000)], |_| Build::Done(Ok(table(20, 1)))).unwrap();
    r.set_process(2, &[mapping(2, 0x2000_0000)], |_| Build::Done(Ok(table(20, 2)))).unwrap();
    let m = r.kernel().processes[&2].mappings[0];
    assert_eq!((m.start, m.table_len), (0x2000_0000, 0), "described, without a table");
    assert_eq!(r.stats().did_not_fit, 1);
}

#[test]
fn tables_nobody_uses_make_room_least_recently_used_first() {
    let mut r = registry(30);
    r.set_process(1, &[mapping(1, 0x1000_0000)], |_| Build::Done(Ok(table(10, 1)))).unwrap();
    r.set_process(2, &[mapping(2, 0x2000_0000)], |_| Build::Done(Ok(table(10, 2)))).unwrap();
    r.set_process(3, &[mapping(3, 0x3000_0000)], |_| Build::Done(Ok(table(10, 3)))).unwrap();
    r.remove_process(1);
    r.remove_process(2);
    assert!(!r.kernel().processes.contains_key(&1));
    // 15 rows: needs both freed ranges, which merge.
    r.set_process(4, &[mapping(4, 0x4000_0000)], |_| Build::Done(Ok(table(15, 4)))).unwrap();
    let m = r.kernel().processes[&4].mappings[0];
    assert_eq!((m.table_start, m.table_len), (0, 15));
    assert!(r.kernel().rows[..15].iter().all(|row| row.cfa_offset == 4));
    assert!(r.kernel().rows[20..30].iter().all(|row| row.cfa_offset == 3), "the used table is untouched");
    assert_eq!(r.stats().tables, 2);
}

#[test]
fn a_file_without_frame_information_is_tried_once() {
    let mut r = registry(10);
    let mut tries = 0;
    for pid in 1..4 {
        r.set_process(pid, &[mapping(9, 0x1000_0000)], |_| {
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
    r.set_process(1, &maps, |_| Build::Done(Ok(table(1, 0)))).unwrap();
    let t = &r.kernel().processes[&1];
    assert_eq!(t.len as usize, MAX_MAPPINGS);
    assert!(t.mappings.windows(2).all(|w| w[0].start < w[1].start));
}

#[test]
fn this_process_is_described_with_tables() {
    let read = crate::symbolize::maps::read(std::process::id(), None);
    let mut mapped = Vec::new();
    for m in read.maps.iter().filter(|m| m.is_file()) {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(&*m.path).unwrap();
        let key = FileKey { dev: meta.dev(), ino: meta.ino(), size: meta.size(), mtime_ns: meta.mtime() };
        mapped.push((MappedFile { start: m.start, end: m.end, offset: m.offset, key }, m.path.clone()));
    }
    let mut r = registry(4 << 20);
    let files: Vec<_> = mapped.iter().map(|(m, _)| m.clone()).collect();
    r.set_process(1, &files, |m| {
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
    r.set_process(1, &[mapping(7, 0x1000_0000)], |_| Build::Done(Err(TableError::Unreadable("gone".into())))).unwrap();
    assert_eq!(r.kernel().processes[&1].mappings[0].table_len, 0);
    r.set_process(2, &[mapping(7, 0x1000_0000)], |_| Build::Done(Ok(table(10, 1)))).unwrap();
    assert_eq!(r.kernel().processes[&2].mappings[0].table_len, 10);
}

#[test]
fn a_table_built_elsewhere_reaches_the_processes_that_wait_for_it() {
    let mut r = registry(100);
    r.set_process(1, &[mapping(3, 0x1000_0000)], |_| Build::Queued).unwrap();
    r.set_process(2, &[mapping(3, 0x2000_0000)], |_| panic!("queued once")).unwrap();
    assert_eq!(r.kernel().processes[&1].mappings[0].table_len, 0, "frame pointers meanwhile");
    r.remove_process(2);
    let again = r.built(key(3), Ok(table(10, 1)));
    assert_eq!(again, [1], "the processes still there, to be described again");
    r.set_process(1, &[mapping(3, 0x1000_0000)], |_| panic!("built already")).unwrap();
    assert_eq!(r.kernel().processes[&1].mappings[0].table_len, 10);
    assert!(r.built(key(3), Ok(table(10, 1))).is_empty(), "a result nobody asked for is ignored");
}
