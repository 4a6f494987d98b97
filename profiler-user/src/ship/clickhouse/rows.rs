//! Rows in ClickHouse's `RowBinary` format, the most compact input 18.16 takes: integers
//! little-endian at their width, strings as a LEB128 length and bytes, arrays as a LEB128
//! length and elements. Batches go gzipped on the wire (18.16 reads `Content-Encoding: gzip`).

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{
    binary::{put_len, put_str},
    frames::{self, NewFrames, Shipped},
    schema::col,
};
use crate::{model::SampleKind, query::SampleRef, store::format::CpuCounts};

/// The id of a stack: XXH3-64 of its frames, root first, each as its kernel flag (one byte), its
/// name and a 0xff byte (never in UTF-8, so names cannot run into each other), then, for a frame
/// whose file is known, 0xfe, the file, 0xff and its address. The same stack has the same id on
/// every node and in every run, so `stack_frames` holds each once fleet-wide; one without locations
/// keeps the id it had before they were stored.
pub fn stack_id(frames: &[(&str, bool)], locations: &[(&str, u64)]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for (i, (name, kernel)) in frames.iter().enumerate() {
        h.update(&[u8::from(*kernel)]);
        h.update(name.as_bytes());
        h.update(&[0xff]);
        if let Some((file, addr)) = locations.get(i).filter(|l| !l.0.is_empty()) {
            h.update(&[0xfe]);
            h.update(file.as_bytes());
            h.update(&[0xff]);
            h.update(&addr.to_le_bytes());
        }
    }
    h.digest()
}

/// The samples of one insert, as columns: sent in ClickHouse's `Native` format (a column after
/// another), which gzip shrinks far better than rows: a column of ascending timestamps or of a
/// few stack ids repeats itself, a row does not. 18 bytes per sample on the wire became 4.5 for
/// a replayed 192-CPU node (`shipping_cost_of_a_192_cpu_node`).
#[derive(Debug, Default)]
pub struct Batch {
    ts: Vec<u64>,
    cpu: Vec<u16>,
    pid: Vec<u32>,
    tid: Vec<u32>,
    comm: Vec<u32>,
    stack: Vec<u64>,
    workload: Vec<u32>,
    count: Vec<u32>,
    /// Comms and workloads, each once (ids in `comm` and `workload`).
    names: Vec<String>,
    name_ids: HashMap<String, u32>,
    /// `stack_frames` rows (RowBinary) not shipped before.
    pub stacks: Vec<u8>,
    pub new_stacks: usize,
    /// `frames` rows: the frames of the new stacks not shipped before.
    pub frames: NewFrames,
    /// `stack_locations` rows (RowBinary) of those with a known file.
    pub locations: Vec<u8>,
    /// Per new stack: its id, where its row starts in `stacks`, and in `locations` if it has one.
    stack_rows: Vec<(u64, usize, Option<usize>)>,
    /// Samples the rows stand for (more than rows in rolled-up data).
    pub samples_count: u64,
    /// The CUDA stores' rows (`cuda_samples`), one per kind, second, thread, stack and comm
    /// (this batch's name id): rows the store split at `u32::MAX` (bytes copied) are one again,
    /// so the table's key is the row's identity and a row sent twice collapses in merges. The
    /// comm is in the key as the store keeps it apart: a thread renamed in a second, or whose
    /// process exited between two drains of it (its name no longer readable), has two rows.
    cuda: BTreeMap<(SampleKind, u64, u32, u64, u32), CudaRow>,
}

#[derive(Debug)]
struct CudaRow {
    cpu: u16,
    pid: u32,
    workload: u32,
    value: u64,
}

impl Batch {
    pub fn rows(&self) -> usize {
        self.ts.len()
    }

    fn name(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.name_ids.get(s) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(s.to_string());
        self.name_ids.insert(s.to_string(), id);
        id
    }

    /// Adds a sample; its stack (and its frames) too when `shipped` does not hold it yet.
    pub fn push(&mut self, s: &SampleRef<'_>, shipped: &mut Shipped) {
        let id = self.stack(s, shipped);
        self.ts.push(s.ts_ns);
        // CPU numbers above 65535 do not exist on Linux today (NR_CPUS is at most 8192).
        self.cpu.push(s.cpu.min(u16::MAX as u32) as u16);
        self.pid.push(s.pid);
        self.tid.push(s.tid);
        let comm = self.name(s.comm);
        self.comm.push(comm);
        self.stack.push(id);
        let workload = self.name(s.workload);
        self.workload.push(workload);
        self.count.push(s.count.min(u32::MAX as u64) as u32);
        self.samples_count += s.count;
    }

    /// Adds a row of a CUDA store (its weight: launches, microseconds blocked, bytes).
    pub fn push_cuda(&mut self, kind: SampleKind, s: &SampleRef<'_>, shipped: &mut Shipped) {
        let id = self.stack(s, shipped);
        let (comm, workload) = (self.name(s.comm), self.name(s.workload));
        let row = self.cuda.entry((kind, s.ts_ns, s.tid, id, comm)).or_insert(CudaRow {
            cpu: s.cpu.min(u16::MAX as u32) as u16,
            pid: s.pid,
            workload,
            value: 0,
        });
        row.value = row.value.saturating_add(s.count);
    }

    /// The ids of the stacks whose rows this batch holds.
    pub fn new_stack_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.stack_rows.iter().map(|r| r.0)
    }

    /// Leaves out the rows of the new stacks in `known` (the server has them: another node of
    /// its shard sent them), their locations with them.
    pub fn drop_known_stacks(&mut self, known: &HashSet<u64>) {
        if known.is_empty() {
            return;
        }
        let (mut stacks, mut locations, mut rows) = (Vec::new(), Vec::new(), Vec::new());
        for (i, &(id, at, loc)) in self.stack_rows.iter().enumerate() {
            if known.contains(&id) {
                continue;
            }
            let next = &self.stack_rows[i + 1..];
            let end = next.first().map_or(self.stacks.len(), |r| r.1);
            let new_loc = loc.map(|l| {
                let end = next.iter().find_map(|r| r.2).unwrap_or(self.locations.len());
                locations.extend_from_slice(&self.locations[l..end]);
                locations.len() - (end - l)
            });
            rows.push((id, stacks.len(), new_loc));
            stacks.extend_from_slice(&self.stacks[at..end]);
        }
        self.new_stacks = rows.len();
        (self.stacks, self.locations, self.stack_rows) = (stacks, locations, rows);
    }

    /// `cuda_samples` rows in this batch.
    pub fn cuda_rows(&self) -> usize {
        self.cuda.len()
    }

    /// `cuda_samples` rows (RowBinary): `node, ts, kind, cpu, pid, tid, comm, stack_id,
    /// workload, value`.
    pub fn cuda(&self, node: &str) -> Vec<u8> {
        let mut o = Vec::with_capacity(self.cuda.len() * (node.len() + 64));
        for (&(kind, ts, tid, stack, comm), r) in &self.cuda {
            put_str(&mut o, node);
            o.extend_from_slice(&ts.to_le_bytes());
            put_str(&mut o, kind.name());
            o.extend_from_slice(&r.cpu.to_le_bytes());
            o.extend_from_slice(&r.pid.to_le_bytes());
            o.extend_from_slice(&tid.to_le_bytes());
            put_str(&mut o, &self.names[comm as usize]);
            o.extend_from_slice(&stack.to_le_bytes());
            put_str(&mut o, &self.names[r.workload as usize]);
            o.extend_from_slice(&r.value.to_le_bytes());
        }
        o
    }

    /// The id of `s`'s stack, its rows (and its new frames') added when `shipped` does not hold
    /// it yet.
    fn stack(&mut self, s: &SampleRef<'_>, shipped: &mut Shipped) -> u64 {
        let id = stack_id(s.frames, s.locations);
        if shipped.stacks.insert(id) {
            let has_locations = s.locations.iter().any(|l| !l.0.is_empty());
            self.stack_rows.push((id, self.stacks.len(), has_locations.then_some(self.locations.len())));
            frames::stack_row(&mut self.stacks, id, s.frames, &mut self.frames, &mut shipped.frames);
            self.new_stacks += 1;
            if has_locations {
                let o = &mut self.locations;
                o.extend_from_slice(&id.to_le_bytes());
                put_len(o, s.locations.len());
                for (file, _) in s.locations {
                    put_str(o, file);
                }
                put_len(o, s.locations.len());
                for (_, addr) in s.locations {
                    o.extend_from_slice(&addr.to_le_bytes());
                }
            }
        }
        id
    }

    /// Keeps only the samples after `ts_ns` (what a server that already holds part of the
    /// batch lacks).
    pub fn keep_after(&mut self, ts_ns: u64) {
        let keep: Vec<bool> = self.ts.iter().map(|&t| t > ts_ns).collect();
        fn filter<T: Copy>(v: &mut Vec<T>, keep: &[bool]) {
            let mut i = 0;
            v.retain(|_| {
                i += 1;
                keep[i - 1]
            });
        }
        filter(&mut self.ts, &keep);
        filter(&mut self.cpu, &keep);
        filter(&mut self.pid, &keep);
        filter(&mut self.tid, &keep);
        filter(&mut self.comm, &keep);
        filter(&mut self.stack, &keep);
        filter(&mut self.workload, &keep);
        filter(&mut self.count, &keep);
    }

    /// One `Native` block: the number of columns and of rows (LEB128), then each column as its
    /// name, its type and its values (integers little-endian, strings as for RowBinary).
    pub fn native(&self, node: &str) -> Vec<u8> {
        // Rows per CPU in time order, `samples`' key (`(node, cpu, ts)`; one node an insert): the
        // server finds the block sorted instead of sorting it: on 18.16, ~0.5 us less server CPU
        // a row, a third of the insert into `samples` alone (BENCHMARKS.md, ingest; the views'
        // work, two thirds of the whole, is unchanged).
        let mut order: Vec<u32> = (0..self.rows() as u32).collect();
        order.sort_by_key(|&i| (self.cpu[i as usize], self.ts[i as usize]));
        let mut o = Vec::with_capacity(self.rows() * 40);
        put_len(&mut o, 9);
        put_len(&mut o, self.rows());
        let column = |o: &mut Vec<u8>, name: &str, ty: &str| {
            put_str(o, name);
            put_str(o, ty);
        };
        let each = order.iter().map(|&i| i as usize);
        column(&mut o, col::NODE, "String");
        for _ in 0..self.rows() {
            put_str(&mut o, node);
        }
        column(&mut o, col::TS, "UInt64");
        each.clone().for_each(|i| o.extend_from_slice(&self.ts[i].to_le_bytes()));
        column(&mut o, col::CPU, "UInt16");
        each.clone().for_each(|i| o.extend_from_slice(&self.cpu[i].to_le_bytes()));
        column(&mut o, col::PID, "UInt32");
        each.clone().for_each(|i| o.extend_from_slice(&self.pid[i].to_le_bytes()));
        column(&mut o, col::TID, "UInt32");
        each.clone().for_each(|i| o.extend_from_slice(&self.tid[i].to_le_bytes()));
        column(&mut o, col::COMM, "String");
        each.clone().for_each(|i| put_str(&mut o, &self.names[self.comm[i] as usize]));
        column(&mut o, col::STACK_ID, "UInt64");
        each.clone().for_each(|i| o.extend_from_slice(&self.stack[i].to_le_bytes()));
        column(&mut o, col::WORKLOAD, "String");
        each.clone().for_each(|i| put_str(&mut o, &self.names[self.workload[i] as usize]));
        column(&mut o, col::COUNT, "UInt32");
        each.for_each(|i| o.extend_from_slice(&self.count[i].to_le_bytes()));
        o
    }
}

/// `cpu_seconds` rows: a block's per-CPU counts, summed over the blocks of one start (a second
/// written in two flushes is two blocks).
#[derive(Debug, Default)]
pub struct CpuSeconds {
    /// (block start, CPU) → (span, counts, frequency).
    rows: std::collections::BTreeMap<(u64, u32), (u64, CpuCounts, u64)>,
}

impl CpuSeconds {
    pub fn add(&mut self, start_ns: u64, span_ns: u64, counts: &CpuCounts, hz: u64) {
        let (span, sum, freq) = self.rows.entry((start_ns, counts.cpu)).or_insert((span_ns, CpuCounts::default(), hz));
        *span = (*span).max(span_ns);
        *freq = hz;
        sum.busy += counts.busy;
        sum.kernel += counts.kernel;
        sum.idle += counts.idle;
        sum.lost += counts.lost;
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// `node, ts, span, cpu, busy, kernel, idle, lost, hz` per row.
    pub fn encode(&self, node: &str) -> Vec<u8> {
        let mut o = Vec::with_capacity(self.rows.len() * (node.len() + 40));
        let u32_of = |v: u64| (v.min(u32::MAX as u64) as u32).to_le_bytes();
        for (&(ts, cpu), (span, c, hz)) in &self.rows {
            put_str(&mut o, node);
            o.extend_from_slice(&ts.to_le_bytes());
            o.extend_from_slice(&span.to_le_bytes());
            o.extend_from_slice(&(cpu.min(u16::MAX as u32) as u16).to_le_bytes());
            for v in [c.busy, c.kernel, c.idle, c.lost, *hz] {
                o.extend_from_slice(&u32_of(v));
            }
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample<'a>(ts_ns: u64, frames: &'a [(&'a str, bool)]) -> SampleRef<'a> {
        SampleRef {
            ts_ns,
            cpu: 3,
            pid: 7,
            tid: 8,
            comm: "bash",
            frames,
            locations: &[],
            count: 1,
            frequency_hz: Some(99),
            workload: "",
        }
    }

    #[test]
    fn stack_ids_depend_on_every_name_boundary_and_flag() {
        let a = stack_id(&[("ab", false), ("c", false)], &[]);
        assert_ne!(a, stack_id(&[("a", false), ("bc", false)], &[]));
        assert_ne!(a, stack_id(&[("ab", true), ("c", false)], &[]));
        assert_ne!(a, stack_id(&[("c", false), ("ab", false)], &[]));
        assert_eq!(a, stack_id(&[("ab", false), ("c", false)], &[]));
        // Locations count where known: the same names in another file are another stack.
        assert_eq!(a, stack_id(&[("ab", false), ("c", false)], &[("", 0), ("", 0)]));
        let located = stack_id(&[("ab", false), ("c", false)], &[("/bin/x", 0x10)]);
        assert_ne!(a, located);
        assert_ne!(located, stack_id(&[("ab", false), ("c", false)], &[("/bin/y", 0x10)]));
        assert_ne!(located, stack_id(&[("ab", false), ("c", false)], &[("/bin/x", 0x11)]));
    }

    #[test]
    fn native_layout() {
        let frames = [("main", false), ("do_syscall_64", true)];
        let mut b = Batch::default();
        let mut shipped = Shipped::default();
        b.push(&sample(5, &frames), &mut shipped);
        b.push(&sample(6, &frames), &mut shipped);
        assert_eq!((b.rows(), b.new_stacks, b.samples_count), (2, 1, 2));
        let n = b.native("n1");
        assert_eq!(&n[..2], [9, 2], "columns, rows");
        assert_eq!(&n[2..17], b"\x04node\x06String\x02n1", "the node column's header and first value");
        let ts = n.windows(7).position(|w| w == b"\x06UInt64").unwrap() + 7;
        assert_eq!(&n[ts..ts + 16], [5u64.to_le_bytes(), 6u64.to_le_bytes()].concat());
        assert!(n.ends_with(&[1, 0, 0, 0, 1, 0, 0, 0]), "count column last");
        // `stack_frames`: the id, the frames' ids, the kernel flags; `frames` each name once.
        assert_eq!(b.stacks[8], 2);
        assert_eq!(&b.stacks[9..17], frames::frame_id("main").to_le_bytes());
        assert_eq!(&b.stacks[b.stacks.len() - 3..], &[2, 0, 1]);
        assert_eq!(b.stacks.len(), 8 + 1 + 16 + 3);
        assert_eq!(b.frames.len(), 2);
        b.keep_after(5);
        assert_eq!(b.rows(), 1);
        assert_eq!(b.ts, [6]);
        assert_eq!(b.native("n1").len(), n.len() - (3 + 8 + 2 + 4 + 4 + 5 + 8 + 1 + 4));
    }

    #[test]
    fn native_rows_are_per_cpu_in_time_order() {
        let frames = [("main", false)];
        let mut b = Batch::default();
        let mut shipped = Shipped::default();
        // Time order across CPUs, as the store gives them: (ts, cpu) 5/3, 6/1, 7/3, 8/1.
        for (ts, cpu) in [(5, 3), (6, 1), (7, 3), (8, 1)] {
            b.push(&SampleRef { cpu, ..sample(ts, &frames) }, &mut shipped);
        }
        let n = b.native("n1");
        let at = |ty: &[u8]| n.windows(ty.len()).position(|w| w == ty).unwrap() + ty.len();
        let ts = at(b"\x06UInt64");
        let got: Vec<u64> = n[ts..ts + 32].chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(got, [6, 8, 5, 7], "CPU 1's rows, then CPU 3's");
        let cpu = at(b"\x03cpu\x06UInt16");
        assert_eq!(&n[cpu..cpu + 8], [1u16, 1, 3, 3].map(u16::to_le_bytes).concat());
        assert_eq!(b.ts, [5, 6, 7, 8], "the batch itself keeps the store's order (keep_after)");
    }

    #[test]
    fn stacks_the_server_has_are_left_out_with_their_locations() {
        let (a, b, c) = ([("a", false)], [("b", false), ("b2", false)], [("c", true)]);
        let located = [("/bin/b", 0x10u64), ("/bin/b", 0x20)];
        let with_b = |batch: &mut Batch, shipped: &mut Shipped| {
            batch.push(&SampleRef { locations: &located, ..sample(2, &b) }, shipped);
        };
        let (mut all, mut shipped) = (Batch::default(), Shipped::default());
        all.push(&sample(1, &a), &mut shipped);
        with_b(&mut all, &mut shipped);
        all.push(&sample(3, &c), &mut shipped);
        let ids: Vec<u64> = all.new_stack_ids().collect();
        assert_eq!((ids.len(), all.new_stacks), (3, 3));
        let (mut fresh, mut shipped) = (Batch::default(), Shipped::default());
        with_b(&mut fresh, &mut shipped);
        all.drop_known_stacks(&HashSet::from([ids[0], ids[2]]));
        assert_eq!((all.new_stacks, &all.stacks, &all.locations), (1, &fresh.stacks, &fresh.locations));
        assert!(!fresh.locations.is_empty());
        assert_eq!(all.new_stack_ids().collect::<Vec<_>>(), [ids[1]]);
        assert_eq!(all.rows(), 3, "the samples stay");
        // Dropping the located one keeps the others' rows whole, and no location.
        let (mut again, mut shipped) = (Batch::default(), Shipped::default());
        again.push(&sample(1, &a), &mut shipped);
        with_b(&mut again, &mut shipped);
        again.push(&sample(3, &c), &mut shipped);
        again.drop_known_stacks(&HashSet::from([ids[1]]));
        let (mut only, mut shipped) = (Batch::default(), Shipped::default());
        only.push(&sample(1, &a), &mut shipped);
        only.push(&sample(3, &c), &mut shipped);
        assert_eq!((again.new_stacks, &again.stacks), (2, &only.stacks));
        assert!(again.locations.is_empty());
    }

    #[test]
    fn cuda_rows_split_by_the_store_are_one_row_again() {
        let frames = [("launch", false)];
        let (mut b, mut shipped) = (Batch::default(), Shipped::default());
        let big = SampleRef { count: u64::from(u32::MAX), ..sample(5, &frames) };
        b.push_cuda(SampleKind::CudaCopies, &big, &mut shipped);
        b.push_cuda(SampleKind::CudaCopies, &SampleRef { count: 7, ..big }, &mut shipped);
        b.push_cuda(SampleKind::CudaLaunches, &SampleRef { count: 3, ..big }, &mut shipped);
        assert_eq!((b.rows(), b.cuda_rows(), b.new_stacks), (0, 2, 1), "one stack shipped once, two kinds");
        let rows = b.cuda("n");
        // node, ts, kind, cpu, pid, tid, comm, stack_id, workload, value.
        let launches = 2 + 8 + 14 + 2 + 4 + 4 + 5 + 8 + 1 + 8;
        assert_eq!(rows.len(), launches + launches - 2, "cuda-copies is two bytes shorter than cuda-launches");
        assert_eq!(&rows[10..24], b"\x0dcuda-launches");
        assert_eq!(&rows[launches - 8..launches], 3u64.to_le_bytes());
        assert_eq!(&rows[rows.len() - 8..], (u64::from(u32::MAX) + 7).to_le_bytes());
    }

    #[test]
    fn a_threads_two_names_in_a_second_are_two_cuda_rows() {
        // A thread whose process exited between two drains: its name unreadable in the second.
        let frames = [("[off-cpu: runnable]", false)];
        let (mut b, mut shipped) = (Batch::default(), Shipped::default());
        let named = SampleRef { count: 5, ..sample(5, &frames) };
        b.push_cuda(SampleKind::OffCpu, &named, &mut shipped);
        b.push_cuda(SampleKind::OffCpu, &SampleRef { comm: "", count: 7, ..named }, &mut shipped);
        b.push_cuda(SampleKind::OffCpu, &SampleRef { count: 1, ..named }, &mut shipped);
        assert_eq!(b.cuda_rows(), 2, "one row per name, summed");
        let rows = b.cuda("n");
        // "bash" first (its name's id is the batch's first), four bytes longer than "".
        let first = (rows.len() + 4) / 2;
        let value = |end: usize| u64::from_le_bytes(rows[end - 8..end].try_into().unwrap());
        assert_eq!((value(first), value(rows.len())), (6, 7));
        assert_eq!(&rows[first - 8 - 1 - 8 - 5..first - 8 - 1 - 8], b"\x04bash");
    }

    #[test]
    fn cpu_seconds_sum_the_blocks_of_one_second() {
        let mut c = CpuSeconds::default();
        let counts = |busy, idle| CpuCounts { cpu: 1, busy, kernel: 1, idle, lost: 0 };
        c.add(7, 1_000, &counts(3, 5), 99);
        c.add(7, 1_000, &counts(2, 1), 99);
        let rows = c.encode("n");
        // node, ts, span, cpu, busy, kernel, idle, lost, hz.
        assert_eq!(rows.len(), 2 + 8 + 8 + 2 + 5 * 4);
        assert_eq!(&rows[20..40], [5u32, 2, 6, 0, 99].map(u32::to_le_bytes).concat());
    }

    #[test]
    fn long_lengths_are_leb128() {
        let mut out = Vec::new();
        put_len(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
    }
}
